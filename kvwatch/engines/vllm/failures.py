"""vLLM's startup failures: the max-seq-len error (V0 and V1 wording), no memory for the cache.

Found in the body itself, or after a serving framework's own prefix when it re-logs the engine's
error under its logger (Xinference's ``restful_api``), never inside a quoted traceback line.
"""

from __future__ import annotations

import re

from kvwatch.core.events import Event, PoolSized, StartupFailure
from kvwatch.engines.vllm.common import ERROR_HEAD, NUM, gib, ident
from kvwatch.parsers.base import NO_EVENTS, LineMeta

# --- startup failures --------------------------------------------------------------------------

# V0 0.4.0-0.10.2: 'The model's max seq len (131072) is larger than the maximum number of tokens that
# can be stored in KV cache (79392). Try increasing ...'
_V0_MAXLEN = re.compile(
    r"^The model's max seq len \((?P<len>\d+)\) is larger than the maximum number of tokens that can be "
    r"stored in KV cache \((?P<tokens>-?\d+)\)"
)

# V1 0.7.0+: 'To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is
# needed, which is larger than the available KV cache memory (9.47 GiB). Based on the available memory,
# the estimated maximum model length is 77536. Try ...' ('GB' before 0.8.5; 0.8.5/0.9.0 drop the number;
# 'model's' again from 0.22).
_V1_MAXLEN = re.compile(
    r"^To serve at least one request with the models?'s max seq len \((?P<len>\d+)\), \((?P<need>"
    + NUM
    + r") ?(?P<u1>GiB|GB) KV cache is needed, which is larger than the available KV cache memory \((?P<avail>"
    + NUM
    + r") ?(?P<u2>GiB|GB)\)\.(?:\s*Based on the available memory,\s*(?:the estimated maximum model length "
    r"is (?P<est>\d+)\.)?)?"
)

# All versions: 'No available memory for the cache blocks. Try increasing `gpu_memory_utilization` ...'
_NO_MEMORY = re.compile(r"^No available memory for the cache blocks\.")

# V1 from 0.9.1: 'Free memory on device (13.58/15.99 GiB) on startup is less than desired GPU memory
# utilization (0.85, 13.59 GiB). Decrease GPU memory utilization or reduce GPU memory used by other
# processes.' (0.10.2 v1/worker/gpu_worker.py:181-187); the device named from 0.16 ('on device cuda:0
# (...)', 0.19.0 v1/worker/utils.py:412-421). Sizes are round(bytes / GiB, 2).
_FREE_MEMORY = re.compile(
    r"^Free memory on device(?: [\w:.]{1,32})? \((?P<free>"
    + NUM
    + r")/(?P<total>"
    + NUM
    + r") GiB\) on startup is less than desired GPU memory utilization \((?P<util>"
    + NUM
    + r"), (?P<want>"
    + NUM
    + r") GiB\)"
)


_FAILURE_STARTS = (
    "The model's max seq len (",
    "To serve at least one request",
    "No available memory for",
    "Free memory on device",
)


def failure(body: str, meta: LineMeta) -> tuple[Event, ...]:
    head = ERROR_HEAD.match(body)
    text = body[head.end() :] if head is not None else body
    if not text.startswith(_FAILURE_STARTS):
        # Not at the start: the message re-logged behind a framework's own prefix, which ends in
        # '] ' or ': ' (not a quote: a traceback's source line quotes the message).
        starts = [
            i for i in (text.find(s) for s in _FAILURE_STARTS) if i > 1 and text[i - 2 : i] in ("] ", ": ")
        ]
        if starts:
            text = text[min(starts) :]
    m = _V1_MAXLEN.match(text)
    if m is not None:
        est = m.group("est")
        return (
            StartupFailure(
                **ident(meta),
                reason="max_model_len_too_large",
                max_model_len=int(m.group("len")),
                needed_kv_bytes=gib(m.group("need"), m.group("u1")),
                available_kv_bytes=gib(m.group("avail"), m.group("u2")),
                estimated_max_model_len=int(est) if est is not None else None,
            ),
        )
    m = _V0_MAXLEN.match(text)
    if m is not None:
        tokens = int(m.group("tokens"))
        return (
            StartupFailure(
                **ident(meta),
                reason="max_model_len_too_large",
                max_model_len=int(m.group("len")),
                max_tokens_in_cache=tokens,
            ),
            # block_size x num_gpu_blocks: the pool's token capacity, printed nowhere else by V0.
            PoolSized(**ident(meta), tokens=tokens),
        )
    if _NO_MEMORY.match(text) is not None:
        return (StartupFailure(**ident(meta), reason="no_memory_for_cache"),)
    m = _FREE_MEMORY.match(text)
    if m is not None:
        return (
            StartupFailure(
                **ident(meta),
                reason="free_memory_below_utilization",
                free_bytes=gib(m.group("free")),
                total_bytes=gib(m.group("total")),
                requested_bytes=gib(m.group("want")),
                gpu_memory_utilization=float(m.group("util")),
            ),
        )
    return NO_EVENTS
