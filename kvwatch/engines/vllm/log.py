"""vLLM log bodies (0.3 -> 0.33, V0 and V1 engines) -> typed KV-cache events.

Input is a message body with every prefix already removed (see kvwatch/parsers/prefix.py). Formats
and the versions that print them are catalogued in docs/parse.md and the vLLM formats reference;
each pattern quotes one real line. ``parse`` walks one table of (anchor, handler): the first row
whose anchor is in the body and whose handler answers (a handler answers None for a line that is
not its own) decides; each row's anchor is a word of anchors.py (``ANCHORS``, the pipeline's cheap
pre-filter, declared once there). Settings lines live in settings.py, the periodic stats lines in
stats.py (their byte-level fast path in fastpath.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import ValidationError

from kvwatch.core.events import (
    EngineSettings,
    Event,
    MemoryBudget,
    PoolSized,
    Preemption,
    StartupFailure,
)
from kvwatch.engines.vllm import failures, settings, stats
from kvwatch.engines.vllm.anchors import ANCHORS as ANCHORS  # (re-exported: the table's words)
from kvwatch.engines.vllm.anchors import Anchor
from kvwatch.engines.vllm.common import INT, NUM, gib, ident, ratio, to_int
from kvwatch.parsers.base import NO_EVENTS, LineMeta, ParseError

# --- pool size ---------------------------------------------------------------------------------

# 0.4.3-0.6.x: '# GPU blocks: 27153, # CPU blocks: 2048'; 0.7+ V0: '# CUDA blocks: 0, # CPU blocks: 4681'
# (seen lower-case '# cuda blocks'); user pastes lose the '# ' ('GPU blocks: 1952, # CPU blocks: 2048').
# V1 0.6.6-0.7.x: '# GPU blocks: 27153'; CPU/OpenVINO executors: '# CPU blocks: 4096' (the pool itself).
_BLOCKS = re.compile(r"^(?:# ?)?(?P<dev>[A-Za-z]+) blocks: (?P<n>\d+)(?:, # ?CPU blocks: (?P<cpu>\d+))?\s*$")

# V1 0.8.0-0.27: 'GPU KV cache size: 434,448 tokens'; 0.28+: '..., Maximum concurrency for 32,768
# tokens per request: 13.26x' on the same line; 0.30+: 'XPU KV cache size', 'GPU + host KV cache size'.
_KV_SIZE = re.compile(r"^(?:(?P<dev>[A-Za-z]+)(?: \+ host)? )?KV cache size: (?P<tokens>" + INT + r") tokens")

# 'Maximum concurrency for 32768 tokens per request: 13.26x' (V0 raw int, V1 0.8+ '32,768').
_CONCURRENCY = re.compile(
    r"Maximum concurrency for (?P<len>" + INT + r") tokens per request: (?P<x>" + NUM + r")x"
)

# V1 0.9.2+ hybrid models (sliding window + full): the KV groups of a layer type filled up to the
# group size with padding layers, once per padded type (v1/core/kv_cache_utils.py:982-986 in
# 0.11.0, _get_kv_cache_groups_uniform_page_size): 'Add 1 padding layers, may waste at most 3.45% KV
# cache memory' (0.11.0 and 0.19.0 Gemma-3-4B), 'Add 3 padding layers, may waste at most 10.00% KV
# cache memory' (0.25.1). The share is the padding over that type's own layer count.
_PADDING = re.compile(
    r"^Add (?P<n>\d+) padding layers, may waste at most (?P<pct>" + NUM + r")% KV cache memory"
)

# 'Overriding num_gpu_blocks=27153 with num_gpu_blocks_override=512'
_OVERRIDE = re.compile(r"num_gpu_blocks_override=(?P<n>\d+)")

# 0.9.0-0.11.0: 'Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 27153'
_CACHE_CONFIG_INFO = re.compile(
    r"^(?:Engine (?P<engine>\d+): )?vllm cache_config_info with initialization after num_gpu_blocks is: (?P<n>\d+)"
)

# --- memory budget -----------------------------------------------------------------------------

# 0.3.3-0.7.3: 'Loading model weights took 14.9888 GB'; 0.8.0: 'Model loading took 7.1206 GB and 4.5 seconds';
# 0.8.5+: '... GiB and ...'; 0.11.2+: 'Model loading took 7.5 GiB memory and 12.345678 seconds'.
_WEIGHTS = re.compile(r"^(?:Loading model weights|Model loading) took (?P<v>" + NUM + r") ?(?P<u>GiB|GB)\b")

# 0.9.2+ V1 worker: 'Available KV cache memory: 53.27 GiB' (0.14+: '53.3 GiB').
_AVAILABLE = re.compile(r"^Available KV cache memory: (?P<v>" + NUM + r") ?(?P<u>GiB|GB)")

# 0.6.4: 'Memory profiling results: total_gpu_memory=23.58GiB initial_memory_usage=15.34GiB
# peak_torch_memory=17.06GiB memory_usage_post_profile=15.35GiB non_torch_memory=0.35GiB
# kv_cache_size=3.81GiB gpu_memory_utilization=0.90'
_PROFILE_RESULTS = re.compile(r"(?<![a-z_])(?P<key>[a-z_]++)=(?P<v>" + NUM + r")(?P<u>GiB|GB)?")

# 0.6.5-0.10.2 V0, 2nd physical line of the breakdown: 'the current vLLM instance can use
# total_gpu_memory (79.11GiB) x gpu_memory_utilization (0.90) = 71.20GiB'
_CAN_USE = re.compile(
    r"total_gpu_memory \((?P<total>" + NUM + r")(?P<u>GiB|GB)\) x gpu_memory_utilization "
    r"\((?P<util>" + NUM + r")\) = (?P<req>" + NUM + r")(?:GiB|GB)"
)

# 3rd physical line: 'model weights take 14.99GiB; non_torch_memory takes 0.20GiB; PyTorch activation
# peak memory takes 1.92GiB; the rest of the memory reserved for KV Cache is 54.09GiB.'
_BREAKDOWN = re.compile(
    r"model weights take (?P<w>" + NUM + r")GiB; non_torch_memory takes (?P<nt>" + NUM + r")GiB; "
    r"PyTorch activation peak memory takes (?P<act>" + NUM + r")GiB; "
    r"the rest of the memory reserved for KV Cache is (?P<kv>" + NUM + r")GiB"
)

# DEBUG repr of the V1 profile result: 'Memory profiling takes 3.10 seconds. Total non KV cache memory:
# 16.40GiB; torch peak memory increase: 1.41GiB; non-torch forward increase memory: 0.03GiB;
# weights memory: 14.96GiB.'
_PROFILE_DEBUG = re.compile(
    r"torch peak memory increase: (?P<act>" + NUM + r")GiB; non-torch forward increase memory: "
    r"(?P<nt>" + NUM + r")GiB; weights memory: (?P<w>" + NUM + r")GiB"
)

# 0.6.4+: 'Graph capturing finished in 12 secs, took 0.62 GiB'
_GRAPHS = re.compile(r"^Graph capturing finished in \d+ secs?, took (?P<v>" + NUM + r") ?(?P<u>GiB|GB)")

# 0.18+: 'Estimated CUDA graph memory: 0.85 GiB total'
_GRAPH_ESTIMATE = re.compile(r"^Estimated CUDA graph memory: (?P<v>" + NUM + r") ?(?P<u>GiB|MiB) total")

# 0.18+: 'CUDA graph memory profiling is enabled (default since v0.21.0). The current
# --gpu-memory-utilization=0.9200 is equivalent to --gpu-memory-utilization=0.9047 without ...'
_CURRENT_UTIL = re.compile(r"The current --gpu-memory-utilization=(?P<u>\d+(?:\.\d+)?)")

# DEBUG 0.9.2-0.13: 'Initial free memory: 78.50 GiB, free memory: 60.12 GiB, requested GPU memory: 71.20 GiB';
# 0.14+: 'Initial free memory: 78.5 GiB; Requested memory: 0.900000 (util), 71.2 GiB'.
_REQUESTED = re.compile(
    r"(?:requested GPU memory: (?P<a>" + NUM + r") ?GiB"
    r"|Requested memory: (?P<util>" + NUM + r") \(util\), (?P<b>" + NUM + r") ?GiB)"
)

# After the pool is allocated, each worker's account of the startup (DEBUG in 0.19-0.26, INFO from
# 0.27; v1/worker/gpu_worker.py:639-661 in 0.19.0, :775-789 in 0.27.1, :1052-1066 in 0.33.0):
# 'Free memory on device (78.68/79.19 GiB) on startup. Desired GPU memory utilization is (0.95, 75.23
# GiB). Actual usage is 8.49 GiB for weight, ...' (0.27+: '... for consumed memory (weights +
# non-torch), ...'). Only the card's total and the fraction are read: every rank prints its own
# usage and pool (a PP stage's weights are not rank 0's), which rank 0's own lines already give.
_STARTUP_USAGE = re.compile(
    r"^Free memory on device \(" + NUM + r"/(?P<total>" + NUM + r") GiB\) on startup\. "
    r"Desired GPU memory utilization is \((?P<util>" + NUM + r"), (?P<req>" + NUM + r") GiB\)\. "
    r"Actual usage is "
)

# 0.33: 'Auto-fit max_model_len: reduced from 131072 to 77536 to fit in available KV cache memory (9.47 GiB)',
# 'Auto-fit max_model_len: full model context length 32768 fits in available KV cache memory (9.47 GiB)'.
_AUTO_FIT = re.compile(
    r"^Auto-fit max_model_len: (?:reduced from \d+ to (?P<to>\d+)|full model context length (?P<full>\d+) fits)"
)

# --- sampler -----------------------------------------------------------------------------------

# V1 0.8.0-0.11.0 on CUDA, once as the sampler is built (TopKTopPSampler.__init__ in
# v1/sample/ops/topk_topp_sampler.py), when top-p/top-k sampling falls back from FlashInfer to
# vLLM's own implementation; the profile run then sorts the whole vocabulary (memory.sampler_path).
# - FlashInfer not installed (a bare `pip install vllm`: it is an extra), :63 in 0.8.0, :69 in
#   0.8.5, :59 in 0.9.2, :69 in 0.10.2, :66 in 0.11.0: 'FlashInfer is not available. Falling back
#   to the PyTorch-native implementation of top-p & top-k sampling. For the best performance,
#   please install FlashInfer.'
# - installed, VLLM_USE_FLASHINFER_SAMPLER=0, :56 in 0.8.0, :62 0.8.5, :52 0.9.2, :62 0.10.2, :59
#   0.11.0: 'FlashInfer is available, but it is not enabled. Falling back to the PyTorch-native
#   implementation of top-p & top-k sampling. For the best performance, please set
#   VLLM_USE_FLASHINFER_SAMPLER=1.'
# - 0.8.x with FlashInfer >= 0.2.3 installed, :38 in 0.8.0, :44 in 0.8.5: 'Currently, FlashInfer
#   top-p & top-k sampling sampler is disabled because FlashInfer>=v0.2.3 is not backward
#   compatible. Falling back to the PyTorch-native implementation of top-p & top-k sampling.'
# (0.7.3's rejection sampler prints the first two ending '... of rejection sampling'
# (v1/sample/rejection_sampler.py:40-51): speculative decoding's, not the profile's: not matched.)
_NO_FLASHINFER = re.compile(
    r"^(?:FlashInfer is not available\. |FlashInfer is available, but it is not enabled\. |"
    r"Currently, FlashInfer top-p & top-k sampling sampler is disabled because FlashInfer>=v0\.2\.3 "
    r"is not backward compatible\. )Falling back to the PyTorch-native implementation of "
    r"top-p & top-k sampling"
)

# --- preemption --------------------------------------------------------------------------------

# V0 0.4.3-0.10.2 (every 50th): 'Sequence group 224 is preempted by PreemptionMode.RECOMPUTE mode because
# there is not enough KV cache space. ... total_num_cumulative_preemption=51'
_PREEMPTED = re.compile(
    r"Sequence group \S+ is preempted by PreemptionMode\.\w+ mode because there is not enough KV cache "
    r"space\..*?total_num_cumulative_preemption=(?P<n>\d+)"
)


def _pool(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    m = _BLOCKS.match(body)
    if m is not None:
        dev = m.group("dev")
        n = int(m.group("n"))
        cpu = m.group("cpu")
        if dev.upper() == "CPU" and cpu is None:
            return (PoolSized(**ident(meta), blocks=n),)
        return (PoolSized(**ident(meta), blocks=n, cpu_blocks=int(cpu) if cpu is not None else None),)
    return None


# The handlers of the table below: each answers None for a line that is not its own, so the next
# row is tried; () only for a line it owns that carries no fact.
def _kv_size(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    m = _KV_SIZE.match(body) if "KV cache size" in body else None
    if m is None:
        return None
    c = _CONCURRENCY.search(body, m.end())
    return (
        PoolSized(
            **ident(meta),
            tokens=to_int(m.group("tokens")),
            max_concurrency_tokens=to_int(c.group("len")) if c is not None else None,
            max_concurrency=float(c.group("x")) if c is not None else None,
        ),
    )


def _auto_fit(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    a = _AUTO_FIT.match(body) if body.startswith("Auto-fit") else None
    return (
        (EngineSettings(**ident(meta), max_model_len=int(a.group("to") or a.group("full"))),) if a else None
    )


def _available(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    m = _AVAILABLE.match(body) if body.startswith("Available") else None
    if m is None:
        return None
    return _budget(MemoryBudget(**ident(meta), available_kv_bytes=gib(m.group("v"), m.group("u"))), meta)


def _padding(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    m = _PADDING.match(body) if body.startswith("Add ") else None
    if m is None:
        return None
    return (
        PoolSized(**ident(meta), padding_layers=int(m.group("n")), padding_waste_ratio=ratio(m.group("pct"))),
    )


def _profile_debug(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    d = _PROFILE_DEBUG.search(body) if "weights memory" in body else None
    if d is None:
        return None
    return (
        MemoryBudget(
            **ident(meta),
            activation_bytes=gib(d.group("act")),
            non_torch_bytes=gib(d.group("nt")),
            weights_bytes=gib(d.group("w")),
        ),
    )


def _preempted(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    p = _PREEMPTED.search(body) if "preempted" in body else None
    return (Preemption(**ident(meta), mechanism="preempt", total=int(p.group("n"))),) if p else None


def _failure(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    return failures.failure(body, meta) or None


def _startup_usage(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    """A worker's account after the pool is allocated (_STARTUP_USAGE): the card and the fraction;
    None for the startup check's failure, which shares its opening words."""
    m = _STARTUP_USAGE.match(body)
    if m is None:
        return None
    return (
        MemoryBudget(
            **ident(meta),
            total_bytes=gib(m.group("total")),
            gpu_memory_utilization=float(m.group("util")),
            requested_bytes=gib(m.group("req")),
        ),
    )


def _budget_breakdown(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    """V0 budget: the 3rd line of the 0.6.5+ breakdown ('KV Cache is N GiB')."""
    m = _BREAKDOWN.search(body)
    if m is None:
        return None
    budget = MemoryBudget(
        **ident(meta),
        weights_bytes=gib(m.group("w")),
        non_torch_bytes=gib(m.group("nt")),
        activation_bytes=gib(m.group("act")),
        available_kv_bytes=gib(m.group("kv")),
    )
    return _budget(budget, meta)


def _budget(budget: MemoryBudget, meta: LineMeta) -> tuple[Event, ...]:
    """A memory budget; one whose KV memory is negative is also the startup failure vLLM raises next."""
    kv = budget.available_kv_bytes
    if kv is None or kv >= 0:
        return (budget,)
    return (budget, StartupFailure(**ident(meta), reason="negative_kv_budget", available_kv_bytes=kv))


def _total_memory(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    m = _CAN_USE.search(body)
    if m is not None:
        return (
            MemoryBudget(
                **ident(meta),
                total_bytes=gib(m.group("total")),
                gpu_memory_utilization=float(m.group("util")),
                requested_bytes=gib(m.group("req")),
            ),
        )
    if body.startswith("Memory profiling results:"):
        values = {k.group("key"): k.group("v") for k in _PROFILE_RESULTS.finditer(body)}

        def size(key: str) -> int | None:
            return gib(values[key]) if key in values else None

        util = values.get("gpu_memory_utilization")
        budget = MemoryBudget(
            **ident(meta),
            total_bytes=size("total_gpu_memory"),
            non_torch_bytes=size("non_torch_memory"),
            available_kv_bytes=size("kv_cache_size"),
            gpu_memory_utilization=float(util) if util is not None else None,
        )
        return _budget(budget, meta)
    return None


def _cuda_graph(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    m = _GRAPH_ESTIMATE.match(body)
    if m is not None:
        return (MemoryBudget(**ident(meta), cuda_graph_bytes=gib(m.group("v"), m.group("u"))),)
    m = _CURRENT_UTIL.search(body)
    if m is not None and body.startswith("CUDA graph memory profiling is enabled"):
        return (EngineSettings(**ident(meta), gpu_memory_utilization=float(m.group("u"))),)
    return None


def _took(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    m = _WEIGHTS.match(body)
    if m is not None:
        return (MemoryBudget(**ident(meta), weights_bytes=gib(m.group("v"), m.group("u"))),)
    m = _GRAPHS.match(body)
    if m is not None:
        return (MemoryBudget(**ident(meta), cuda_graph_bytes=gib(m.group("v"), m.group("u"))),)
    return None


def _blocks_line(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    """Lines with 'blocks': the V0 pool, the no-memory failure, cache_config_info, the override."""
    if "No available memory" in body:
        return _failure(body, meta)
    if "num_gpu_blocks" in body:
        m = _CACHE_CONFIG_INFO.match(body)
        if m is not None:
            if m.group("engine") is not None:
                meta = LineMeta(instance=str(int(m.group("engine"))), rank=meta.rank, ts=meta.ts)
            return (PoolSized(**ident(meta), blocks=int(m.group("n"))),)
        o = _OVERRIDE.search(body)
        if o is not None and body.startswith("Overriding num_gpu_blocks=0 "):
            # 0.18+ sizes a minimal cache for CUDA-graph profiling with available_memory=0 and the
            # capture size as override (gpu_model_runner.py:5797 _init_minimal_kv_cache_for_profiling
            # in 0.19.0): not the pool, which is sized (and logged) after profiling.
            return NO_EVENTS
        if o is not None and body.startswith("Overriding num_gpu_blocks"):
            return (PoolSized(**ident(meta), blocks=int(o.group("n"))),)
        return None
    return _pool(body, meta)


# 0.11+ DEBUG (v1/worker/gpu_worker.py:284 in 0.19.0), the MemorySnapshot repr before weights load:
# 'worker init memory snapshot: torch_peak=0.0GiB, free_memory=78.68GiB, total_memory=79.19GiB,
# cuda_memory=0.51GiB, torch_memory=0.0GiB, non_torch_memory=0.51GiB, timestamp=..., auto_measure=True'.
# total_memory is the card as torch.cuda.mem_get_info reports it, the total the budget multiplies.
_INIT_SNAPSHOT = re.compile(r"^worker init memory snapshot: .*?\btotal_memory=(?P<v>" + NUM + r")GiB")


def _init_snapshot(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    m = _INIT_SNAPSHOT.match(body)
    return (MemoryBudget(**ident(meta), total_bytes=gib(m.group("v"))),) if m else None


def _no_flashinfer(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    m = _NO_FLASHINFER.match(body)
    return (EngineSettings(**ident(meta), flashinfer_sampler=False),) if m else None


def _concurrency(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    m = _CONCURRENCY.match(body)
    if m is None:
        return None
    return (
        PoolSized(
            **ident(meta),
            max_concurrency_tokens=to_int(m.group("len")),
            max_concurrency=float(m.group("x")),
        ),
    )


def _requested(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    m = _REQUESTED.search(body)
    if m is None:
        return None
    if m.group("a") is not None:
        return (MemoryBudget(**ident(meta), requested_bytes=gib(m.group("a"))),)
    return (
        MemoryBudget(
            **ident(meta),
            requested_bytes=gib(m.group("b")),
            gpu_memory_utilization=float(m.group("util")),
        ),
    )


Handler = Callable[[str, LineMeta], "tuple[Event, ...] | None"]

# (anchor, handler) in the order the rows are tried: of two rows that would both answer a line, the
# earlier wins ('KV cache' lines mention blocks; settings lines mention everything). A new line is
# one row (its anchor may repeat an earlier row's): every row before it answers None for it.
_TABLE: tuple[tuple[Anchor, Handler], ...] = (
    ("KV cache", stats.stats_line),
    ("KV cache", _kv_size),
    ("KV cache", _auto_fit),
    ("KV cache", _available),
    ("KV cache", _profile_debug),
    ("KV cache", _padding),
    ("KV cache", _preempted),
    ("KV cache", _failure),
    ("Free memory on device", _startup_usage),
    ("Free memory on device", _failure),
    ("KV Cache", _budget_breakdown),
    ("blocks", _blocks_line),
    ("Maximum concurrency", _concurrency),
    ("took", _took),
    ("total_gpu_memory", _total_memory),
    ("CUDA graph memory", _cuda_graph),
    ("equested", _requested),
    ("max model len", settings.max_model_len_line),
    ("max_num_batched_tokens", settings.chunked_prefill_line),
    ("Defaulting ", settings.defaulting_line),
    ("memory snapshot", _init_snapshot),
    ("FlashInfer", _no_flashinfer),
    ("block size", settings.forced_block_line),
    ("Prefix cache hit rate", stats.v0_hit_rate),
    ("█  model", settings.logo_line),
    ("█  version", settings.logo_line),
    ("version", settings.settings_line),
    ("LLM engine", settings.settings_line),
    ("args", settings.settings_line),
    ("headless", settings.settings_line),
)

# Each row's anchor is an ``Anchor`` (anchors.py, the one declaration; mypy refuses another word);
# a declared word no row uses is refused here, so ``ANCHORS`` is exactly the table's words.
if set(ANCHORS) != {anchor for anchor, _ in _TABLE}:  # pragma: no cover - fails every test at import
    raise RuntimeError(f"anchors.py declares words no row uses: {set(ANCHORS) - {a for a, _ in _TABLE}}")


def parse(body: str, meta: LineMeta) -> tuple[Event, ...]:
    """Events in one vLLM message body (prefixes removed); () for lines about something else.

    A value pydantic rejects (a negative count, a dtype it does not know) is a ParseError."""
    try:
        for anchor, handler in _TABLE:
            if anchor in body:
                events = handler(body, meta)
                if events is not None:
                    return events
    except ValidationError as exc:
        raise ParseError(str(exc).splitlines()[0]) from exc
    return NO_EVENTS
