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

import ast
from collections.abc import Callable, Iterator
from decimal import Decimal, InvalidOperation
from typing import Any

import regex
from pydantic import ValidationError

from kvwatch.events import (
    EngineSettings,
    Event,
    MemoryBudget,
    PoolSized,
    Preemption,
    StartupFailure,
    UsageSample,
)
from kvwatch.parsers.base import NO_EVENTS, LineMeta, ParseError
from kvwatch.units import GiB

Handler = Callable[[str, LineMeta], tuple[Event, ...]]


# --- helpers -------------------------------------------------------------------------------------


def _ident(meta: LineMeta) -> dict[str, Any]:
    """Identity fields every event of this line carries."""
    return {"engine": "sglang", "instance": meta.instance, "rank": meta.rank, "ts": meta.ts}


def _gib(text: str) -> int:
    """SGLang's 'GB' figure (GiB, 2 decimals) as integer bytes, exact decimal arithmetic."""
    try:
        return int((Decimal(text) * GiB).to_integral_value())
    except InvalidOperation as exc:
        raise ParseError(f"not a size in GB: {text!r}") from exc


def _opt_gib(text: str | None) -> int | None:
    return None if text is None else _gib(text)


def _opt_int(text: str | None) -> int | None:
    return None if text is None else int(text)


def _opt_float(text: str | None) -> float | None:
    return None if text is None else float(text)


# --- periodic batch lines ------------------------------------------------------------------------

# Head of every Prefill/Decode batch line; the key/value list follows. One sample per variant:
# 0.3.x        "[16:43:29 TP0] Prefill batch. #new-seq: 1, #new-token: 2062, ..."   (sglang/015, Oct 2024)
# 0.2-0.3.4    "Prefill batch(mixed #running-req: 3). #new-seq: 1, #new-token: 512, ..."
# 0.5.4        "[2025-10-01 10:00:41 TP0] Decode batch [1240], #running-req: 12, #token: 23110, ..."
# 0.5.5+       "[2026-07-21 15:00:13 TP0 EP0] Decode batch, #running-req: 24, #token: 233600, ..."
_BATCH_HEAD = regex.compile(
    r"""
    (?P<phase>Prefill|Decode)\ batch
    (?:
        \ ?\[\d+\]\ *,?                                  # ' [1240],' (0.5.4, SGLANG_LOG_FORWARD_ITERS)
      | \(mixed\ \#running-req:\ (?P<mixed>\d+)\)\.?     # mixed chunked prefill (0.2.x-0.3.4)
      | [.,]
    )?
    \ *(?=\#)                                            # the key/value list starts with '#new-seq' or '#running-req'
    """,
    regex.VERBOSE,
)

# A clean value: the whole item after ': ' must be this, else the field was damaged and is skipped.
_INT = regex.compile(r"\d+")
_DECIMAL = regex.compile(r"\d+(?:\.\d+)?")
_PERCENT = regex.compile(r"(?P<num>\d+(?:\.\d+)?)%")
# 0.4.9 hybrid SWA writes two pools in one item: '#token: full=1024, swa=512' (split on ',' here).
_SUBPOOL = regex.compile(r"(?P<pool>full|swa)=(?P<num>\d+(?:\.\d+)?)")

# Batch-line key -> (UsageSample field, kind). Keys as printed across 0.2.15-0.5.23 (section 2).
_USAGE_KEYS: dict[str, tuple[str, str]] = {
    "#running-req": ("running", "int"),
    "#queue-req": ("waiting", "int"),
    "#token": ("used_tokens", "int"),
    "#full token": ("used_tokens", "int"),
    "#swa token": ("swa_used_tokens", "int"),
    "mamba num": ("mamba_used_slots", "int"),
    "#retracted-req": ("retracted", "int"),
    "token usage": ("kv_usage_ratio", "ratio"),
    "full token usage": ("kv_usage_ratio", "ratio"),
    "swa token usage": ("swa_usage_ratio", "ratio"),
    "mamba usage": ("mamba_usage_ratio", "ratio"),
    "cpu token usage": ("cpu_kv_usage_ratio", "ratio"),
    "cache hit rate": ("prefix_cache_hit_ratio", "percent"),
    "gen throughput (token/s)": ("generation_throughput", "float"),
    "input throughput (token/s)": ("prompt_throughput", "float"),
}
# 0.4.9 hybrid '#token: full=.., swa=..' / 'token usage: full=.., swa=..': the swa half's field.
_SWA_TWIN = {"used_tokens": "swa_used_tokens", "kv_usage_ratio": "swa_usage_ratio"}


def _convert(kind: str, value: str) -> int | float | None:
    """A batch-line value, or None when it is not a clean number (damaged column)."""
    if kind == "int":
        return int(value) if _INT.fullmatch(value) else None
    if kind == "percent":
        m = _PERCENT.fullmatch(value)
        return float(Decimal(m.group("num")) / 100) if m else None
    return float(value) if _DECIMAL.fullmatch(value) else None


def _batch_fields(items: Iterator[str]) -> dict[str, Any]:
    """Fold 'key: value' items into UsageSample fields; unknown keys and damaged values are skipped."""
    fields: dict[str, Any] = {}
    last: tuple[str, str] | None = None
    for item in items:
        key, sep, raw = item.partition(":")
        if not sep:
            # The ', swa=..' half of a 0.4.9 hybrid item belongs to the key before it.
            sub = _SUBPOOL.fullmatch(item.strip())
            if last is not None and sub is not None and sub.group("pool") == "swa":
                twin = _SWA_TWIN.get(last[0])
                value = _convert(last[1], sub.group("num"))
                if twin is not None and value is not None:
                    fields[twin] = value
            last = None
            continue
        spec = _USAGE_KEYS.get(key.strip())
        last = spec
        if spec is None:
            continue
        value_text = raw.strip()
        sub = _SUBPOOL.fullmatch(value_text)
        if sub is not None and sub.group("pool") == "full":
            value_text = sub.group("num")
        value = _convert(spec[1], value_text)
        if value is not None:
            fields[spec[0]] = value
    return fields


def _parse_batch(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _BATCH_HEAD.search(body)
    if m is None:
        return NO_EVENTS
    fields = _batch_fields(iter(body[m.end() :].split(",")))
    if m.group("mixed") is not None and "running" not in fields:
        fields["running"] = int(m.group("mixed"))
    if not fields:
        raise ParseError(f"{m.group('phase')} batch line without a readable field")
    return (UsageSample(**_ident(meta), **fields),)


# --- retraction (SGLang's preemption) ------------------------------------------------------------

# <=0.4.6  "[2025-05-28 08:25:50] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.8024 -> 0.9085"
# 0.4.7+   "KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.3317 -> 0.5012"
# 0.5.3-4  "... #retracted_reqs: 3, #aborted_retracted_reqs: 0, #new_token_ratio: 0.3317 -> 0.5012"
# 0.5.7+   "... #retracted_reqs: 3, #new_tokens_gained: 12288, #new_token_ratio: 0.3317 -> 0.5012"
# 0.5.12+  "... #new_tokens_gained: 8192, #mamba_num_gained: 2, #new_token_ratio: ..." ('Testing retraction.' too)
# The wording before '#retracted_reqs' is not required: every wording carries that key.
_RETRACT = regex.compile(
    r"""
    \#retracted_reqs:\ (?P<count>\d+)
    (?:,\ \#aborted_retracted_reqs:\ \d+)?
    (?:,\ \#new_tokens_gained:\ (?P<gained>-?\d+))?
    (?:,\ \#mamba_num_gained:\ -?\d+)?
    (?:,\ \#new_token_ratio:\ (?P<before>\d+(?:\.\d+)?)\ ->\ (?P<after>\d+(?:\.\d+)?))?
    """,
    regex.VERBOSE,
)


def _parse_retract(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _RETRACT.search(body)
    if m is None:
        return NO_EVENTS
    return (
        Preemption(
            **_ident(meta),
            mechanism="retract",
            count=int(m.group("count")),
            new_token_ratio=_opt_float(m.group("after")),
            new_tokens_gained=_opt_int(m.group("gained")),
        ),
    )


# --- pool sizing ---------------------------------------------------------------------------------

# 0.4.4-0.5.12 "KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB"  (sglang/001)
# MLA          "[2025-10-07 22:29:11 DP0 TP0] KV Cache is allocated. #tokens: 1462784, KV size: 54.52 GB"
# 0.4.3        "KV Cache is allocated. K size: 26.99 GB, V size: 26.99 GB."
# 0.5.15+      "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 442181, K size: 26.99 GB, V size: ..."
# 0.5.23       "SWA KV Cache is allocated. dtype: ..." / "Full KV Cache is allocated. ..." (hybrid sub-pools)
# ('... KV Cache VA upper bound. ...' is a reservation, not the pool: the post-capture line below is.)
_KV_ALLOC = regex.compile(
    r"""
    KV\ Cache\ is\ allocated\.
    (?:\ dtype:\ [\w.]+,)?
    (?:\ \#tokens:\ (?P<tokens>\d+),)?
    \ (?:
        K\ size:\ (?P<k>\d+(?:\.\d+)?)\ GB,\ V\ size:\ (?P<v>\d+(?:\.\d+)?)\ GB
      | KV\ size:\ (?P<kv>\d+(?:\.\d+)?)\ GB
    )
    """,
    regex.VERBOSE,
)
# The word just before 'KV Cache' names a 0.5.23 sub-pool ('Full', 'SWA', '... index').
_LABEL = regex.compile(r"(?P<label>[\w.\-]+)\ $")


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
    pool = "swa" if label == "swa" else "full"
    return (PoolSized(**_ident(meta), pool=pool, tokens=_opt_int(m.group("tokens")), bytes=size),)


# 0.5.19+ "Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 442181, KV size: 53.98 GB, avail mem=9.50 GB"
_POST_CAPTURE_ALLOC = regex.compile(
    r"""
    Post-capture\ KV\ sizing:\ KV\ cache\ allocated\.
    (?:\ dtype:\ [\w.]+,)?
    \ \#tokens:\ (?P<tokens>\d+),
    \ KV\ size:\ (?P<kv>\d+(?:\.\d+)?)\ GB
    (?:,\ avail\ mem=(?P<avail>\d+(?:\.\d+)?)\ GB)?
    """,
    regex.VERBOSE,
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
_MAMBA_ALLOC = regex.compile(
    r"""
    Mamba\ Cache\ is\ allocated\.\ max_mamba_cache_size:\ (?P<slots>\d+)
    """,
    regex.VERBOSE,
)
_MAMBA_PART = regex.compile(r"\b\w+\ size:\ (?P<gb>\d+(?:\.\d+)?)\ ?GB", regex.VERBOSE)


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
_MAX_TOTAL = regex.compile(r"(?<![\w])max_total_num_tokens?=(?P<tokens>\d+)")
_SCHED_FIELD = regex.compile(
    r"""
    \b(?P<key>chunked_prefill_size|max_running_requests|context_len|available_(?:gpu|cpu)_mem)
    =(?P<value>-?\d+(?:\.\d+)?)
    """,
    regex.VERBOSE,
)


def _parse_max_total(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _MAX_TOTAL.search(body)
    if m is None:
        return NO_EVENTS
    events: list[Event] = [PoolSized(**_ident(meta), tokens=int(m.group("tokens")))]
    found = {f.group("key"): f.group("value") for f in _SCHED_FIELD.finditer(body, m.end())}
    settings = {
        "chunked_prefill_size": _opt_int(found.get("chunked_prefill_size")),
        "max_num_seqs": _opt_int(found.get("max_running_requests")),
        "max_model_len": _opt_int(found.get("context_len")),
    }
    if any(v is not None for v in settings.values()):
        events.append(EngineSettings(**_ident(meta), **{k: v for k, v in settings.items() if v is not None}))
    avail = found.get("available_gpu_mem", found.get("available_cpu_mem"))
    if avail is not None:
        events.append(MemoryBudget(**_ident(meta), avail_after_startup_bytes=_gib(avail)))
    return tuple(events)


# 0.4.10-0.5.6 "Use Sliding window memory pool. full_layer_tokens=1138460, swa_layer_tokens=910768"
# 0.5.7+       "Use sliding window memory pool. full_layer_tokens=..., swa_layer_tokens=..."
# 0.5.19+      "Post-capture KV sizing: full_layer_tokens=..., swa_layer_tokens=..." (swa 0 when not hybrid)
# 0.5.9+       "Use sliding window memory pool (all SWA). swa_layer_tokens=262144"
_SWA_SPLIT = regex.compile(
    r"""
    (?:full_layer_tokens=(?P<full>\d+),\ )?swa_layer_tokens=(?P<swa>\d+)
    """,
    regex.VERBOSE,
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
_SWA_RING = regex.compile(r"SWA\ ring:\ swa_max_total_num_tokens\ \d+\ ->\ (?P<swa>\d+)", regex.VERBOSE)


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
_LOAD_WEIGHT = regex.compile(
    r"""
    Load\ weight\ (?P<phase>begin|end)\.
    (?:\ [^,]{0,200}?,){0,16}?                        # elapsed=, type=, dtype=, quant=, fmt= ...
    \ avail\ mem=(?P<avail>\d+(?:\.\d+)?)\ ?GB
    (?:,\ mem\ usage=(?P<usage>\d+(?:\.\d+)?)\ ?GB)?
    """,
    regex.VERBOSE,
)
# Speculative-decoding draft models load after the target and would overwrite its figures.
_MODEL_TYPE = regex.compile(r"type=(?P<type>\w+)")
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
_POOL_END = regex.compile(r"Memory\ pool\ end\.\ avail\ mem=(?P<avail>\d+(?:\.\d+)?)\ ?GB", regex.VERBOSE)


def _parse_pool_end(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _POOL_END.search(body)
    if m is None:
        return NO_EVENTS
    return (MemoryBudget(**_ident(meta), avail_after_pool_bytes=_gib(m.group("avail"))),)


# 0.4.4-0.4.6  "Capture cuda graph end. Time elapsed: 16.85 s. avail mem=8.78 GB. mem usage=0.52 GB."
# 0.4.7-0.5.12 "[2025-06-01 10:00:31 TP0] Capture cuda graph end. Time elapsed: 16.85 s. mem usage=0.52 GB. avail mem=8.78 GB."
# 0.5.23       "Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed=16.85 s, mem usage=0.52 GB, avail mem=8.78 GB."
# ('Capture draft ... graph end' belongs to the speculative draft model and is skipped.)
_GRAPH_END = regex.compile(
    r"""
    Capture\ (?P<what>[\w\ ]{0,60}?)\ ?graph\ end\.
    .{0,400}?mem\ usage=(?P<usage>\d+(?:\.\d+)?)\ ?GB
    """,
    regex.VERBOSE | regex.IGNORECASE,
)


def _parse_graph_end(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _GRAPH_END.search(body)
    if m is None or "draft" in m.group("what").lower():
        return NO_EVENTS
    return (MemoryBudget(**_ident(meta), cuda_graph_bytes=_gib(m.group("usage"))),)


# 0.4.x "Automatically reduce --mem-fraction-static to 0.735 because this is a multimodal model."
_MFS_REDUCED = regex.compile(r"reduce\ --mem-fraction-static\ to\ (?P<mfs>\d+(?:\.\d+)?)", regex.VERBOSE)


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
_NOT_ENOUGH = regex.compile(
    r"""
    (?<!['"])Not\ enough\ memory\.\ Please\ try\ to\ increase\ --mem-fraction-static
    (?:\.\ Current\ value:\ (?:self\.server_args\.)?mem_fraction_static=(?P<mfs>\d+(?:\.\d+)?))?
    """,
    regex.VERBOSE,
)
# 0.5.15+ "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed
#          max_mamba_cache_size=-3 (total_rest_memory=-1.25 GB, mamba_cache_per_req=45.00 MB). Try: ..."
_NOT_ENOUGH_MAMBA = regex.compile(
    r"""
    (?<!['"])Not\ enough\ GPU\ memory\ for\ hybrid\b
    .{0,300}?total_rest_memory=(?P<rest>-?\d+(?:\.\d+)?)\ GB
    """,
    regex.VERBOSE,
)
# 0.3.6+   "AssertionError: Memory pool size is too small"
# 0.5.15+  "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. ..."
# 0.5.23   "ValueError: SWA pool (4096 tokens) cannot hold even one request: the prefill admission floor ..."
_POOL_TOO_SMALL = regex.compile(
    r"""
    (?<!['"])(?:
        Memory\ pool\ size\ is\ too\ small
      | state\ cache\ is\ too\ small\ to\ serve\ any\ requests
      | SWA\ pool\ \((?P<swa>\d+)\ tokens\)\ cannot\ hold\ even\ one\ request
    )
    """,
    regex.VERBOSE,
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


# --- settings ------------------------------------------------------------------------------------

# <=0.5.15 "[2025-10-01 10:00:00] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', ...,
#           mem_fraction_static=0.835, ..., tp_size=1, ...)"                  (dataclass repr)
# 0.5.19+  "[2026-03-01 10:00:00] server_args={'model_path': 'meta-llama/Llama-3.1-8B-Instruct', ...}"
_SERVER_ARGS = regex.compile(r"server_args=(?:(?P<cls>\w+)\(|\{)", regex.VERBOSE)
# Tokens of a Python repr: quoted strings (escapes allowed), brackets, commas, runs of anything else.
_REPR_TOKEN = regex.compile(
    r"""
    '(?:[^'\\]|\\.)*' | "(?:[^"\\]|\\.)*" | [()\[\]{},] | [^'"()\[\]{},]+ | .
    """,
    regex.VERBOSE | regex.DOTALL,
)
_REPR_KEY = regex.compile(r"""\s*(?:(?P<bare>\w+)=|'(?P<quoted>\w+)':\s*)(?P<value>.*)""", regex.DOTALL)
_REPR_INT = regex.compile(r"-?\d+")
_REPR_FLOAT = regex.compile(r"-?\d+\.\d*(?:[eE][+-]?\d+)?|-?\d+[eE][+-]?\d+")

# server_args key -> EngineSettings field (first key present wins for a field).
_SETTINGS_KEYS: dict[str, str] = {
    "model_path": "model",
    "served_model_name": "served_model_name",
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "dp_size": "data_parallel_size",
    "dtype": "dtype",
    "kv_cache_dtype": "kv_cache_dtype",
    "quantization": "quantization",
    "page_size": "page_size",
    "context_length": "max_model_len",
    "chunked_prefill_size": "chunked_prefill_size",
    "cuda_graph_max_bs": "cuda_graph_max_bs",
    "cuda_graph_max_bs_decode": "cuda_graph_max_bs",
    "mem_fraction_static": "mem_fraction_static",
    "max_running_requests": "max_num_seqs",
}


_OPEN = frozenset("([{")
_CLOSE = frozenset(")]}")


def _top_level_items(text: str, start: int) -> Iterator[str]:
    """Comma-separated items at depth 0 of a repr that opens just before ``start`` (truncation tolerated)."""
    depth = 0
    item: list[str] = []
    for tok in _REPR_TOKEN.finditer(text, start):
        t = tok.group()
        if t in _OPEN:
            depth += 1
        elif t in _CLOSE:
            if depth == 0:
                break
            depth -= 1
        elif t == "," and depth == 0:
            yield "".join(item)
            item = []
            continue
        item.append(t)
    yield "".join(item)


def _repr_value(text: str) -> object:
    """A scalar from a Python repr; containers and objects stay as their text."""
    text = text.strip()
    if text in ("None", ""):
        return None
    if text in ("True", "False"):
        return text == "True"
    if _REPR_INT.fullmatch(text):
        return int(text)
    if _REPR_FLOAT.fullmatch(text):
        return float(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text[1:-1]
        return value if isinstance(value, str) else text[1:-1]
    return text


def _parse_server_args(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _SERVER_ARGS.search(body)
    if m is None:
        return NO_EVENTS
    fields: dict[str, Any] = {}
    for item in _top_level_items(body, m.end()):
        kv = _REPR_KEY.fullmatch(item)
        if kv is None:
            continue
        key = kv.group("bare") or kv.group("quoted")
        value = _repr_value(kv.group("value"))
        if value is None:
            continue
        if key == "disable_radix_cache" and isinstance(value, bool):
            fields.setdefault("enable_prefix_caching", not value)
        elif key == "disable_cuda_graph" and isinstance(value, bool):
            fields.setdefault("enforce_eager", value)
        elif key in _SETTINGS_KEYS:
            fields.setdefault(_SETTINGS_KEYS[key], value)
    return (EngineSettings(**_ident(meta), starts_engine=True, **fields),)


# `python -m sglang.check_env`, pasted with the log (SGLang never logs its own version):
# "sglang: 0.4.6.post1"
_VERSION = regex.compile(r"\s*sglang:\ *(?P<version>\d+\.\d+[\w.+\-]*)\s*", regex.VERBOSE)


def _parse_version(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _VERSION.fullmatch(body)
    if m is None:
        return NO_EVENTS
    return (EngineSettings(**_ident(meta), version=m.group("version")),)


# --- dispatch ------------------------------------------------------------------------------------

# (anchor, handlers) in order of frequency on a busy server; the first handler that returns events
# wins. Few, distinctive anchors: the pipeline tests every line of the log against all of them.
_HANDLERS: tuple[tuple[str, tuple[Handler, ...]], ...] = (
    ("Decode batch", (_parse_batch,)),
    ("Prefill batch", (_parse_batch,)),
    ("#retracted_reqs", (_parse_retract,)),
    ("Cache is allocated", (_parse_cache_allocated,)),
    ("KV cache allocated", (_parse_post_capture,)),
    ("swa_layer_tokens=", (_parse_swa_split,)),
    ("max_total_num_token", (_parse_max_total, _parse_swa_ring)),
    ("Load weight ", (_parse_load_weight,)),
    ("Memory pool end", (_parse_pool_end,)),
    ("graph end", (_parse_graph_end,)),
    ("server_args=", (_parse_server_args,)),
    ("Not enough ", (_parse_not_enough,)),
    ("is too small", (_parse_too_small,)),
    ("cannot hold even one request", (_parse_too_small,)),
    ("reduce --mem-fraction-static", (_parse_mfs_reduced,)),
    ("sglang: ", (_parse_version,)),
)

ANCHORS: tuple[str, ...] = tuple(anchor for anchor, _ in _HANDLERS)
"""Substrings of which every line a pattern here can claim contains at least one."""


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
