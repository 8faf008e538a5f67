"""SGLang log bodies -> KV-cache events (SGLang 0.1, Jan 2024, to 0.5.23).

Stage: the pipeline strips the line's prefixes (kvwatch.parsers.prefix), checks the body for one of
``ANCHORS`` and only then calls ``parse(body, meta)``. Every pattern here is searched, never anchored
at the line start, because users paste lines with half of the prefix left on. Formats and versions
are in docs/sglang-formats.md; the source of truth is shared/reference/sglang-formats.md.

SGLang prints sizes as 'GB' but means GiB (``GB = 1 << 30`` in its code); events carry integer bytes.
Batch lines are read as ``key: value`` pairs, never by position: the set of fields changed in almost
every release, and pasted lines lose columns. A value that is not a clean number is left out rather
than guessed, so a terminal-damaged field ('#cached-tounning-req: 45') never becomes a reading.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pydantic import ValidationError

from kvwatch.core.events import (
    EngineSettings,
    Event,
    MemoryBudget,
    PoolKind,
    PoolSized,
    StartupFailure,
)
from kvwatch.engines.sglang import settings, stats
from kvwatch.engines.sglang.anchors import ANCHORS as ANCHORS  # (re-exported: the table's words)
from kvwatch.engines.sglang.anchors import Anchor
from kvwatch.engines.sglang.common import gib as _gib
from kvwatch.engines.sglang.common import ident as _ident
from kvwatch.engines.sglang.common import opt_gib as _opt_gib
from kvwatch.engines.sglang.common import opt_int as _opt_int
from kvwatch.parsers.base import NO_EVENTS, LineMeta, ParseError

Handler = Callable[[str, LineMeta], tuple[Event, ...]]


# --- helpers -------------------------------------------------------------------------------------


# --- pool sizing ---------------------------------------------------------------------------------

# 0.4.4-0.5.12 "KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB"  (sglang/001)
# MLA          "[2025-10-07 22:29:11 DP0 TP0] KV Cache is allocated. #tokens: 1462784, KV size: 54.52 GB"
# 0.4.3        "KV Cache is allocated. K size: 26.99 GB, V size: 26.99 GB."
# 0.5.15+      "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 442181, K size: 26.99 GB, V size: ..."
# 0.5.23       "SWA KV Cache is allocated. dtype: ..." / "Full KV Cache is allocated. ..." (hybrid sub-pools)
# ('... KV Cache VA upper bound. ...' is a reservation, not the pool: the post-capture line below is.)
_KV_ALLOC = re.compile(
    r"""
    KV\ Cache\ is\ allocated\.
    (?:\ dtype:\ [\w.]+,)?
    (?:\ \#tokens:\ (?P<tokens>\d+),)?
    \ (?:
        K\ size:\ (?P<k>\d+(?:\.\d+)?)\ GB,\ V\ size:\ (?P<v>\d+(?:\.\d+)?)\ GB
      | KV\ size:\ (?P<kv>\d+(?:\.\d+)?)\ GB
    )
    """,
    re.VERBOSE,
)
# The word just before 'KV Cache' names a 0.5.23 sub-pool ('Full', 'SWA', '... index').
# (search: the lookbehind keeps an attempt from starting again inside the run an earlier one read.)
_LABEL = re.compile(r"(?<![\w.\-])(?P<label>[\w.\-]++)\ $")


def _parse_kv_alloc(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _KV_ALLOC.search(body)
    if m is None:
        return NO_EVENTS
    before = _LABEL.search(body, max(0, m.start() - 64), m.start())
    label = before.group("label").lower() if before is not None else ""
    if label == "index":
        # 0.5.23 MiniMax sparse-attention index cache: a side buffer, not the token pool.
        return NO_EVENTS
    if m.group("kv") is not None:
        size = _gib(m.group("kv"))
    else:
        size = _gib(m.group("k")) + _gib(m.group("v"))
    pool: PoolKind = "swa" if label == "swa" else "full"
    return (PoolSized(**_ident(meta), pool=pool, tokens=_opt_int(m.group("tokens")), bytes=size),)


# 0.5.19+ "Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 442181, KV size: 53.98 GB, avail mem=9.50 GB"
_POST_CAPTURE_ALLOC = re.compile(
    r"""
    Post-capture\ KV\ sizing:\ KV\ cache\ allocated\.
    (?:\ dtype:\ [\w.]+,)?
    \ \#tokens:\ (?P<tokens>\d+),
    \ KV\ size:\ (?P<kv>\d+(?:\.\d+)?)\ GB
    (?:,\ avail\ mem=(?P<avail>\d+(?:\.\d+)?)\ GB)?
    """,
    re.VERBOSE,
)


def _parse_post_capture(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _POST_CAPTURE_ALLOC.search(body)
    if m is None:
        return NO_EVENTS
    pool = PoolSized(**_ident(meta), tokens=int(m.group("tokens")), bytes=_gib(m.group("kv")))
    if m.group("avail") is None:
        return (pool,)
    return (pool, MemoryBudget(**_ident(meta), avail_after_pool_bytes=_gib(m.group("avail"))))


# 0.5.4+ "Mamba Cache is allocated. max_mamba_cache_size: 656, conv_state size: 0.53GB, ssm_state size: 37.64GB "
# (no space before 'GB'; with speculative decoding also 'intermediate_..._cache size: x.xxGB ').
_MAMBA_ALLOC = re.compile(
    r"""
    Mamba\ Cache\ is\ allocated\.\ max_mamba_cache_size:\ (?P<slots>\d+)
    """,
    re.VERBOSE,
)
_MAMBA_PART = re.compile(r"\b\w+\ size:\ (?P<gb>\d+(?:\.\d+)?)\ ?GB", re.VERBOSE)


def _parse_mamba_alloc(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _MAMBA_ALLOC.search(body)
    if m is None:
        return NO_EVENTS
    parts = [_gib(p.group("gb")) for p in _MAMBA_PART.finditer(body, m.end())]
    return (
        PoolSized(
            **_ident(meta),
            pool="mamba",
            state_slots=int(m.group("slots")),
            bytes=sum(parts) if parts else None,
        ),
    )


def _parse_cache_allocated(body: str, meta: LineMeta) -> tuple[Event, ...]:
    if "Mamba Cache is allocated" in body:
        return _parse_mamba_alloc(body, meta)
    return _parse_kv_alloc(body, meta)


# 0.4.7+ "[Bug] [2026-06-28 15:16:45] max_total_num_tokens=2086558, chunked_prefill_size=8192,
#         max_prefill_tokens=16384, max_running_requests=33, context_len=256000, available_gpu_mem=17.22 GB"
# 0.1.x  " UserWarning: Warning: available_size=35244, max_total_num_token=42308"   (singular, sglang/021)
# 0.4+   "Mem Leak Detected! total_tokens=... vs self.max_total_num_tokens=442181" (same figure, other wording)
_MAX_TOTAL = re.compile(r"(?<![\w])max_total_num_tokens?=(?P<tokens>\d+)")
_SCHED_FIELD = re.compile(
    r"""
    \b(?P<key>chunked_prefill_size|max_running_requests|context_len|available_(?:gpu|cpu)_mem)
    =(?P<value>-?\d+(?:\.\d+)?)
    """,
    re.VERBOSE,
)


def _parse_max_total(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _MAX_TOTAL.search(body)
    if m is None:
        return NO_EVENTS
    events: list[Event] = [PoolSized(**_ident(meta), tokens=int(m.group("tokens")))]
    found = {f.group("key"): f.group("value") for f in _SCHED_FIELD.finditer(body, m.end())}
    settings = EngineSettings(
        **_ident(meta),
        chunked_prefill_size=_opt_int(found.get("chunked_prefill_size")),
        max_num_seqs=_opt_int(found.get("max_running_requests")),
        max_model_len=_opt_int(found.get("context_len")),
    )
    if (
        settings.chunked_prefill_size is not None
        or settings.max_num_seqs is not None
        or settings.max_model_len is not None
    ):
        events.append(settings)
    avail = found.get("available_gpu_mem", found.get("available_cpu_mem"))
    if avail is not None:
        events.append(MemoryBudget(**_ident(meta), avail_after_startup_bytes=_gib(avail)))
    return tuple(events)


# 0.4.10-0.5.6 "Use Sliding window memory pool. full_layer_tokens=1138460, swa_layer_tokens=910768"
# 0.5.7+       "Use sliding window memory pool. full_layer_tokens=..., swa_layer_tokens=..."
# 0.5.19+      "Post-capture KV sizing: full_layer_tokens=..., swa_layer_tokens=..." (swa 0 when not hybrid)
# 0.5.9+       "Use sliding window memory pool (all SWA). swa_layer_tokens=262144"
_SWA_SPLIT = re.compile(
    r"""
    (?:full_layer_tokens=(?P<full>\d+),\ )?swa_layer_tokens=(?P<swa>\d+)
    """,
    re.VERBOSE,
)


def _parse_swa_split(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _SWA_SPLIT.search(body)
    if m is None:
        return NO_EVENTS
    events: list[Event] = []
    if m.group("full") is not None:
        events.append(PoolSized(**_ident(meta), pool="full", tokens=int(m.group("full"))))
    swa = int(m.group("swa"))
    if swa > 0:
        events.append(PoolSized(**_ident(meta), pool="swa", tokens=swa))
    return tuple(events)


# 0.5.23 "SWA ring: swa_max_total_num_tokens 910768 -> 65536 (fixed per-request SWA ring capacity)."
_SWA_RING = re.compile(r"SWA\ ring:\ swa_max_total_num_tokens\ \d+\ ->\ (?P<swa>\d+)", re.VERBOSE)


def _parse_swa_ring(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _SWA_RING.search(body)
    if m is None:
        return NO_EVENTS
    return (PoolSized(**_ident(meta), pool="swa", tokens=int(m.group("swa"))),)


# --- memory budget -------------------------------------------------------------------------------

# all      "[2025-06-01 10:00:05 TP0] Load weight begin. avail mem=78.58 GB"
# 0.4.6    "[2025-05-04 01:05:35 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16,
#           avail mem=103.67 GB, mem usage=81.66 GB."                                   (sglang/010)
# 0.5.10+  "Load weight end. elapsed=6.91 s, type=LlamaForCausalLM, quant=fp8, fmt=e4m3, avail mem=63.48 GB, mem usage=15.10 GB."
# <=0.4.5  "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.48 GB"
_LOAD_WEIGHT = re.compile(
    r"""
    Load\ weight\ (?P<phase>begin|end)\.
    (?:\ [^,]{0,200}?,){0,16}?                        # elapsed=, type=, dtype=, quant=, fmt= ...
    \ avail\ mem=(?P<avail>\d+(?:\.\d+)?)\ ?GB
    (?:,\ mem\ usage=(?P<usage>\d+(?:\.\d+)?)\ ?GB)?
    """,
    re.VERBOSE,
)
# Speculative-decoding draft models load after the target and would overwrite its figures.
_MODEL_TYPE = re.compile(r"type=(?P<type>\w+)")
_DRAFT_TYPES = ("NextN", "Eagle", "EAGLE", "MTP", "Draft", "Medusa")


def _parse_load_weight(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _LOAD_WEIGHT.search(body)
    if m is None:
        return NO_EVENTS
    model_type = _MODEL_TYPE.search(m.group())
    if model_type is not None and any(d in model_type.group("type") for d in _DRAFT_TYPES):
        return NO_EVENTS
    avail = _gib(m.group("avail"))
    if m.group("phase") == "begin":
        return (MemoryBudget(**_ident(meta), avail_before_weights_bytes=avail),)
    return (
        MemoryBudget(
            **_ident(meta),
            avail_after_weights_bytes=avail,
            weights_bytes=_opt_gib(m.group("usage")),
        ),
    )


# all "[2025-10-07 22:29:11 DP0 TP0] Memory pool end. avail mem=15.38 GB"   (sglang/017)
_POOL_END = re.compile(r"Memory\ pool\ end\.\ avail\ mem=(?P<avail>\d+(?:\.\d+)?)\ ?GB", re.VERBOSE)


def _parse_pool_end(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _POOL_END.search(body)
    if m is None:
        return NO_EVENTS
    return (MemoryBudget(**_ident(meta), avail_after_pool_bytes=_gib(m.group("avail"))),)


# 0.4.4-0.4.6  "Capture cuda graph end. Time elapsed: 16.85 s. avail mem=8.78 GB. mem usage=0.52 GB."
# 0.4.7-0.5.12 "[2025-06-01 10:00:31 TP0] Capture cuda graph end. Time elapsed: 16.85 s. mem usage=0.52 GB. avail mem=8.78 GB."
# 0.5.23       "Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed=16.85 s, mem usage=0.52 GB, avail mem=8.78 GB."
# ('Capture draft ... graph end' belongs to the speculative draft model and is skipped.)
_GRAPH_END = re.compile(
    r"""
    Capture\ (?P<what>[\w\ ]{0,60}?)\ ?graph\ end\.
    .{0,400}?mem\ usage=(?P<usage>\d+(?:\.\d+)?)\ ?GB
    """,
    re.VERBOSE | re.IGNORECASE,
)


def _parse_graph_end(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _GRAPH_END.search(body)
    if m is None or "draft" in m.group("what").lower():
        return NO_EVENTS
    return (MemoryBudget(**_ident(meta), cuda_graph_bytes=_gib(m.group("usage"))),)


# 0.4.x "Automatically reduce --mem-fraction-static to 0.735 because this is a multimodal model."
_MFS_REDUCED = re.compile(r"reduce\ --mem-fraction-static\ to\ (?P<mfs>\d+(?:\.\d+)?)", re.VERBOSE)


def _parse_mfs_reduced(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _MFS_REDUCED.search(body)
    if m is None:
        return NO_EVENTS
    return (MemoryBudget(**_ident(meta), mem_fraction_static=float(m.group("mfs"))),)


# --- startup failures ----------------------------------------------------------------------------

# <=0.5.2  "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
# 0.5.3-9  "... --mem-fraction-static. Current value: self.server_args.mem_fraction_static=0.835"
# 0.5.10+  "... --mem-fraction-static. Current value: mem_fraction_static=0.835"
# (A quote before it is a traceback's source line, not the error.)
_NOT_ENOUGH = re.compile(
    r"""
    (?<!['"])Not\ enough\ memory\.\ Please\ try\ to\ increase\ --mem-fraction-static
    (?:\.\ Current\ value:\ (?:self\.server_args\.)?mem_fraction_static=(?P<mfs>\d+(?:\.\d+)?))?
    """,
    re.VERBOSE,
)
# 0.5.15+ "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed
#          max_mamba_cache_size=-3 (total_rest_memory=-1.25 GB, mamba_cache_per_req=45.00 MB). Try: ..."
_NOT_ENOUGH_MAMBA = re.compile(
    r"""
    (?<!['"])Not\ enough\ GPU\ memory\ for\ hybrid\b
    .{0,300}?total_rest_memory=(?P<rest>-?\d+(?:\.\d+)?)\ GB
    """,
    re.VERBOSE,
)
# 0.3.6+   "AssertionError: Memory pool size is too small"
# 0.5.15+  "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. ..."
# 0.5.23   "ValueError: SWA pool (4096 tokens) cannot hold even one request: the prefill admission floor ..."
_POOL_TOO_SMALL = re.compile(
    r"""
    (?<!['"])(?:
        Memory\ pool\ size\ is\ too\ small
      | state\ cache\ is\ too\ small\ to\ serve\ any\ requests
      | SWA\ pool\ \((?P<swa>\d+)\ tokens\)\ cannot\ hold\ even\ one\ request
    )
    """,
    re.VERBOSE,
)


def _parse_not_enough(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _NOT_ENOUGH.search(body)
    if m is not None:
        failure = StartupFailure(**_ident(meta), reason="not_enough_memory")
        if m.group("mfs") is None:
            return (failure,)
        return (failure, MemoryBudget(**_ident(meta), mem_fraction_static=float(m.group("mfs"))))
    m = _NOT_ENOUGH_MAMBA.search(body)
    if m is not None:
        return (
            StartupFailure(
                **_ident(meta), reason="not_enough_memory", available_kv_bytes=_gib(m.group("rest"))
            ),
        )
    return NO_EVENTS


def _parse_too_small(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _POOL_TOO_SMALL.search(body)
    if m is None:
        return NO_EVENTS
    return (
        StartupFailure(
            **_ident(meta), reason="not_enough_memory", max_tokens_in_cache=_opt_int(m.group("swa"))
        ),
    )


# --- dispatch ------------------------------------------------------------------------------------

# (anchor, handlers) in order of frequency on a busy server; the first handler that returns events
# wins. Few, distinctive anchors: the pipeline tests every line of the log against all of them.
_HANDLERS: tuple[tuple[Anchor, tuple[Handler, ...]], ...] = (
    ("Decode batch", (stats.parse_batch,)),
    ("Prefill batch", (stats.parse_batch,)),
    ("#retracted_reqs", (stats.parse_retract,)),
    ("Cache is allocated", (_parse_cache_allocated,)),
    ("KV cache allocated", (_parse_post_capture,)),
    ("swa_layer_tokens=", (_parse_swa_split,)),
    ("max_total_num_token", (_parse_max_total, _parse_swa_ring)),
    ("Load weight ", (_parse_load_weight,)),
    ("Memory pool end", (_parse_pool_end,)),
    ("graph end", (_parse_graph_end,)),
    ("server_args=", (settings.parse_server_args,)),
    ("Not enough ", (_parse_not_enough,)),
    ("is too small", (_parse_too_small,)),
    ("cannot hold even one request", (_parse_too_small,)),
    ("reduce --mem-fraction-static", (_parse_mfs_reduced,)),
    ("sglang: ", (settings.parse_version,)),
)

# Each row's anchor is an ``Anchor`` (anchors.py, the one declaration; mypy refuses another word);
# a declared word no row uses is refused here, so ``ANCHORS`` is exactly the table's words.
if set(ANCHORS) != {anchor for anchor, _ in _HANDLERS}:  # pragma: no cover - fails every test at import
    raise RuntimeError(f"anchors.py declares words no row uses: {set(ANCHORS) - {a for a, _ in _HANDLERS}}")


def parse(body: str, meta: LineMeta) -> tuple[Event, ...]:
    """Events in one SGLang log message (prefix removed); () when it says nothing about the KV cache.

    Raises ParseError (only) when a pattern claims the line but a value cannot be converted.
    """
    try:
        for anchor, handlers in _HANDLERS:
            if anchor in body:
                for handler in handlers:
                    events = handler(body, meta)
                    if events:
                        return events
    except ParseError:
        raise
    except (ValidationError, ValueError, ArithmeticError) as exc:
        raise ParseError(f"sglang line claimed but not convertible: {exc}") from exc
    return NO_EVENTS
