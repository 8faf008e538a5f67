"""vLLM log bodies (0.3 -> 0.33, V0 and V1 engines) -> typed KV-cache events.

Input is a message body with every prefix already removed (see prefix.py). Formats and the
versions that print them are catalogued in docs/parse.md and the vLLM formats reference; each
pattern below quotes one real line. The parser is pure and cheap on lines it does not want: it
looks for a handful of anchor substrings first and runs a pattern only when one is present.

Units: vLLM prints GiB values; before 0.8.5 it called them 'GB', so both are read as GiB.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

import regex
from pydantic import BaseModel, ValidationError

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
from kvwatch.parsers.prefix import process_identity
from kvwatch.units import GiB, MiB

# Substrings at least one of which every line this parser claims contains (cheap pre-filter).
ANCHORS: tuple[str, ...] = (
    "KV cache",
    "KV Cache",
    "blocks",
    "Maximum concurrency",
    "took",
    "total_gpu_memory",
    "CUDA graph memory",
    "version",
    "LLM engine",
    "args",
    "max model len",
    "max_num_batched_tokens",
    "block size",
    "█  model",
    "█  version",
    "Prefix cache hit rate",
    "requested GPU memory",
    "Requested memory",
    "headless",
)

_NUM = r"-?\d+(?:\.\d+)?"
_INT = r"\d[\d,]*"
_ERROR_HEAD = regex.compile(r"^(?:[\w.]*(?:Error|Exception): )?")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _gib(text: str, unit: str = "GiB") -> int:
    """Bytes from a printed size; vLLM's 'GB' is GiB, 'MiB' appears in CUDA-graph estimates."""
    try:
        value = Decimal(text)
    except InvalidOperation as exc:
        raise ParseError(f"not a number: {text!r}") from exc
    scale = MiB if unit.startswith("M") else GiB
    return int((value * scale).to_integral_value())


def _ratio(pct: str) -> float:
    """'82.1' (percent) -> 0.821, rounded once from the decimal text, as Decimal would."""
    return float(pct + "e-2")


def _make(cls: Callable[..., Event], meta: LineMeta, **fields: Any) -> Event:
    """Build one event with the line's identity; a value pydantic rejects is a ParseError."""
    base: dict[str, Any] = {"engine": "vllm", "instance": meta.instance, "rank": meta.rank, "ts": meta.ts}
    base.update(fields)
    try:
        return cls(**base)
    except ValidationError as exc:
        raise ParseError(str(exc).splitlines()[0]) from exc


# --- pool size ---------------------------------------------------------------------------------

# 0.4.3-0.6.x: '# GPU blocks: 27153, # CPU blocks: 2048'; 0.7+ V0: '# CUDA blocks: 0, # CPU blocks: 4681'
# (seen lower-case '# cuda blocks'); user pastes lose the '# ' ('GPU blocks: 1952, # CPU blocks: 2048').
# V1 0.6.6-0.7.x: '# GPU blocks: 27153'; CPU/OpenVINO executors: '# CPU blocks: 4096' (the pool itself).
_BLOCKS = regex.compile(
    r"^(?:# ?)?(?P<dev>[A-Za-z]+) blocks: (?P<n>\d+)(?:, # ?CPU blocks: (?P<cpu>\d+))?\s*$"
)

# V1 0.8.0-0.27: 'GPU KV cache size: 434,448 tokens'; 0.28+: '..., Maximum concurrency for 32,768
# tokens per request: 13.26x' on the same line; 0.30+: 'XPU KV cache size', 'GPU + host KV cache size'.
_KV_SIZE = regex.compile(
    r"^(?:(?P<dev>[A-Za-z]+)(?: \+ host)? )?KV cache size: (?P<tokens>" + _INT + r") tokens"
)

# 'Maximum concurrency for 32768 tokens per request: 13.26x' (V0 raw int, V1 0.8+ '32,768').
_CONCURRENCY = regex.compile(
    r"Maximum concurrency for (?P<len>" + _INT + r") tokens per request: (?P<x>" + _NUM + r")x"
)

# 'Overriding num_gpu_blocks=27153 with num_gpu_blocks_override=512'
_OVERRIDE = regex.compile(r"num_gpu_blocks_override=(?P<n>\d+)")

# 0.9.0-0.11.0: 'Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 27153'
_CACHE_CONFIG_INFO = regex.compile(
    r"^(?:Engine (?P<engine>\d+): )?vllm cache_config_info with initialization after num_gpu_blocks is: (?P<n>\d+)"
)

# --- memory budget -----------------------------------------------------------------------------

# 0.3.3-0.7.3: 'Loading model weights took 14.9888 GB'; 0.8.0: 'Model loading took 7.1206 GB and 4.5 seconds';
# 0.8.5+: '... GiB and ...'; 0.11.2+: 'Model loading took 7.5 GiB memory and 12.345678 seconds'.
_WEIGHTS = regex.compile(
    r"^(?:Loading model weights|Model loading) took (?P<v>" + _NUM + r") ?(?P<u>GiB|GB)\b"
)

# 0.9.2+ V1 worker: 'Available KV cache memory: 53.27 GiB' (0.14+: '53.3 GiB').
_AVAILABLE = regex.compile(r"^Available KV cache memory: (?P<v>" + _NUM + r") ?(?P<u>GiB|GB)")

# 0.6.4: 'Memory profiling results: total_gpu_memory=23.58GiB initial_memory_usage=15.34GiB
# peak_torch_memory=17.06GiB memory_usage_post_profile=15.35GiB non_torch_memory=0.35GiB
# kv_cache_size=3.81GiB gpu_memory_utilization=0.90'
_PROFILE_RESULTS = regex.compile(r"(?P<key>[a-z_]+)=(?P<v>" + _NUM + r")(?P<u>GiB|GB)?")

# 0.6.5-0.10.2 V0, 2nd physical line of the breakdown: 'the current vLLM instance can use
# total_gpu_memory (79.11GiB) x gpu_memory_utilization (0.90) = 71.20GiB'
_CAN_USE = regex.compile(
    r"total_gpu_memory \((?P<total>" + _NUM + r")(?P<u>GiB|GB)\) x gpu_memory_utilization "
    r"\((?P<util>" + _NUM + r")\) = (?P<req>" + _NUM + r")(?:GiB|GB)"
)

# 3rd physical line: 'model weights take 14.99GiB; non_torch_memory takes 0.20GiB; PyTorch activation
# peak memory takes 1.92GiB; the rest of the memory reserved for KV Cache is 54.09GiB.'
_BREAKDOWN = regex.compile(
    r"model weights take (?P<w>" + _NUM + r")GiB; non_torch_memory takes (?P<nt>" + _NUM + r")GiB; "
    r"PyTorch activation peak memory takes (?P<act>" + _NUM + r")GiB; "
    r"the rest of the memory reserved for KV Cache is (?P<kv>" + _NUM + r")GiB"
)

# DEBUG repr of the V1 profile result: 'Memory profiling takes 3.10 seconds. Total non KV cache memory:
# 16.40GiB; torch peak memory increase: 1.41GiB; non-torch forward increase memory: 0.03GiB;
# weights memory: 14.96GiB.'
_PROFILE_DEBUG = regex.compile(
    r"torch peak memory increase: (?P<act>" + _NUM + r")GiB; non-torch forward increase memory: "
    r"(?P<nt>" + _NUM + r")GiB; weights memory: (?P<w>" + _NUM + r")GiB"
)

# 0.6.4+: 'Graph capturing finished in 12 secs, took 0.62 GiB'
_GRAPHS = regex.compile(r"^Graph capturing finished in \d+ secs?, took (?P<v>" + _NUM + r") ?(?P<u>GiB|GB)")

# 0.18+: 'Estimated CUDA graph memory: 0.85 GiB total'
_GRAPH_ESTIMATE = regex.compile(r"^Estimated CUDA graph memory: (?P<v>" + _NUM + r") ?(?P<u>GiB|MiB) total")

# 0.18+: 'CUDA graph memory profiling is enabled (default since v0.21.0). The current
# --gpu-memory-utilization=0.9200 is equivalent to --gpu-memory-utilization=0.9047 without ...'
_CURRENT_UTIL = regex.compile(r"The current --gpu-memory-utilization=(?P<u>\d+(?:\.\d+)?)")

# DEBUG 0.9.2-0.13: 'Initial free memory: 78.50 GiB, free memory: 60.12 GiB, requested GPU memory: 71.20 GiB';
# 0.14+: 'Initial free memory: 78.5 GiB; Requested memory: 0.900000 (util), 71.2 GiB'.
_REQUESTED = regex.compile(
    r"(?:requested GPU memory: (?P<a>" + _NUM + r") ?GiB"
    r"|Requested memory: (?P<util>" + _NUM + r") \(util\), (?P<b>" + _NUM + r") ?GiB)"
)

# 0.33: 'Auto-fit max_model_len: reduced from 131072 to 77536 to fit in available KV cache memory (9.47 GiB)',
# 'Auto-fit max_model_len: full model context length 32768 fits in available KV cache memory (9.47 GiB)'.
_AUTO_FIT = regex.compile(
    r"^Auto-fit max_model_len: (?:reduced from \d+ to (?P<to>\d+)|full model context length (?P<full>\d+) fits)"
)

# --- usage -------------------------------------------------------------------------------------

# V0 'Avg prompt throughput: 0.0 tokens/s, ..., Running: 2 reqs, Swapped: 0 reqs, Pending: 3 reqs,
# GPU KV cache usage: 82.1%, CPU KV cache usage: 0.0%' (0.4.3+ ends with '.'); V1 0.8.3+ starts with
# 'Engine 000: ' ('2 Engines Aggregated: ' for the aggregated DP logger), fields are dynamic.
_STATS_HEAD = regex.compile(
    r"^(?:Engine (?P<engine>\d+): |(?P<agg>\d+) Engines Aggregated: )?Avg prompt throughput"
)

# V0 0.5.5+ (prefix caching on): 'Prefix cache hit rate: GPU: 12.50%, CPU: 0.00%'
_V0_HIT_RATE = regex.compile(r"^Prefix cache hit rate: GPU: (?P<gpu>" + _NUM + r")%")

# --- preemption --------------------------------------------------------------------------------

# V0 0.4.3-0.10.2 (every 50th): 'Sequence group 224 is preempted by PreemptionMode.RECOMPUTE mode because
# there is not enough KV cache space. ... total_num_cumulative_preemption=51'
_PREEMPTED = regex.compile(
    r"Sequence group \S+ is preempted by PreemptionMode\.\w+ mode because there is not enough KV cache "
    r"space\..*?total_num_cumulative_preemption=(?P<n>\d+)"
)

# --- startup failures --------------------------------------------------------------------------

# V0 0.4.0-0.10.2: 'The model's max seq len (131072) is larger than the maximum number of tokens that
# can be stored in KV cache (79392). Try increasing ...'
_V0_MAXLEN = regex.compile(
    r"^The model's max seq len \((?P<len>\d+)\) is larger than the maximum number of tokens that can be "
    r"stored in KV cache \((?P<tokens>-?\d+)\)"
)

# V1 0.7.0+: 'To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is
# needed, which is larger than the available KV cache memory (9.47 GiB). Based on the available memory,
# the estimated maximum model length is 77536. Try ...' ('GB' before 0.8.5; 0.8.5/0.9.0 drop the number;
# 'model's' again from 0.22).
_V1_MAXLEN = regex.compile(
    r"^To serve at least one request with the models?'s max seq len \((?P<len>\d+)\), \((?P<need>"
    + _NUM
    + r") ?(?P<u1>GiB|GB) KV cache is needed, which is larger than the available KV cache memory \((?P<avail>"
    + _NUM
    + r") ?(?P<u2>GiB|GB)\)\.(?:\s*Based on the available memory,\s*(?:the estimated maximum model length "
    r"is (?P<est>\d+)\.)?)?"
)

# All versions: 'No available memory for the cache blocks. Try increasing `gpu_memory_utilization` ...'
_NO_MEMORY = regex.compile(r"^No available memory for the cache blocks\.")

# --- settings ----------------------------------------------------------------------------------

# 0.4.0-0.14: 'vLLM API server version 0.14.0rc2+cu130'; 0.15+ with VLLM_DISABLE_LOG_LOGO:
# 'vLLM server version 0.20.2, serving model Qwen/Qwen2.5-7B-Instruct'; batch runner 'vLLM batch processing
# API version 0.6.0'; 0.15+ logo line '  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.20.2'.
_VERSION = regex.compile(
    r"^(?:vLLM (?:API server|server|batch processing API) version (?P<v>\d+\.\d+[\w.+\-]*)"
    r"(?:, serving model (?P<model>\S+))?"
    r"|Launching vLLM \(v(?P<headless>\d+\.\d+[^)\s]*)\) headless)"
)
# The logo's text column: searched from the first '█' that starts it, then the part before it is checked
# to be logo art (a pattern with the art as a repeated class backtracks quadratically on long lines).
_LOGO_TEXT = regex.compile(r"█ +(?P<key>version|model) +(?P<value>\S+)\s*$")
_LOGO_ART = frozenset("█▄▀ ")

# 'Initializing an LLM engine (v0.4.3) with config: model=...', 'Initializing a V1 LLM engine (v0.9.2)
# with config: ...', 0.3.3 'Initializing an LLM engine with config: ...'.
_ENGINE_INIT = regex.compile(
    r"^Initializing an? (?:(?P<gen>V[01]) )?LLM engine(?: \(v(?P<v>[^)\s]+)\))? with config: (?P<cfg>.*)$"
)

# Config fields 'key=value' in str(VllmConfig) / Namespace(...): value up to ', next_key=' or the end.
_KV_FIELD = regex.compile(r"(?:^|[\s,(])(?P<key>[a-z_]+)=(?P<val>'[^']*'|\"[^\"]*\"|[^,\s()]+)")
# Python dict repr of 0.9+ 'non-default args: {...}'.
_DICT_FIELD = regex.compile(r"'(?P<key>[a-z_]+)': (?P<val>'[^']*'|\"[^\"]*\"|\[[^\]]*\]|[^,{}\[\]]+)")

_NON_DEFAULT = regex.compile(r"^(?:non-default args|args): (?P<body>.*)$")
_MAX_MODEL_LEN = regex.compile(r"^Using max model len (?P<n>\d+)")
_CHUNKED = regex.compile(r"max_num_batched_tokens=(?P<n>\d+)")
_FORCED_BLOCK = regex.compile(r"^Forcing kv cache block size to (?P<n>\d+)")

_INT_SETTINGS = {
    "tensor_parallel_size": "tensor_parallel_size",
    "pipeline_parallel_size": "pipeline_parallel_size",
    "data_parallel_size": "data_parallel_size",
    "decode_context_parallel_size": "decode_context_parallel_size",
    "block_size": "block_size",
    "max_model_len": "max_model_len",
    "max_seq_len": "max_model_len",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
}
_STR_SETTINGS = {
    "model": "model",
    "model_tag": "model",
    "served_model_name": "served_model_name",
    "dtype": "dtype",
    "kv_cache_dtype": "kv_cache_dtype",
    "cache_dtype": "kv_cache_dtype",
    "quantization": "quantization",
}
_BOOL_SETTINGS = {"enable_prefix_caching": "enable_prefix_caching", "enforce_eager": "enforce_eager"}


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    if value.startswith("[") and value.endswith("]"):
        # served_model_name=['name'] -> the first name.
        inner = value[1:-1].split(",")[0].strip()
        return _unquote(inner) if inner else ""
    return value


def _settings_fields(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Typed EngineSettings fields from (key, raw value) pairs; first occurrence of a key wins."""
    out: dict[str, Any] = {}
    for key, raw in pairs:
        value = _unquote(raw)
        if value in ("None", "", "null"):
            continue
        try:
            if key in _INT_SETTINGS:
                out.setdefault(_INT_SETTINGS[key], int(value))
            elif key in _STR_SETTINGS:
                if key == "dtype":
                    value = value.removeprefix("torch.")
                out.setdefault(_STR_SETTINGS[key], value)
            elif key in _BOOL_SETTINGS and value in ("True", "False"):
                out.setdefault(_BOOL_SETTINGS[key], value == "True")
            elif key == "gpu_memory_utilization":
                out.setdefault("gpu_memory_utilization", float(value))
        except ValueError as exc:
            raise ParseError(f"bad value for {key}: {value!r}") from exc
    if out.get("model") is None:
        out.pop("model", None)
    return out


def _pool(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _BLOCKS.match(body)
    if m is not None:
        dev = m.group("dev")
        n = int(m.group("n"))
        cpu = m.group("cpu")
        if dev.upper() == "CPU" and cpu is None:
            return (_make(PoolSized, meta, blocks=n),)
        return (_make(PoolSized, meta, blocks=n, cpu_blocks=int(cpu) if cpu is not None else None),)
    return NO_EVENTS


def _kv_cache_line(body: str, meta: LineMeta) -> tuple[Event, ...]:
    """Lines containing 'KV cache': pool size, available memory, stats, preemption, errors."""
    if "throughput" in body:
        m = _STATS_HEAD.match(body)
        if m is not None:
            return _stats(body, m, meta)
    m = _KV_SIZE.match(body) if "KV cache size" in body else None
    if m is not None:
        fields: dict[str, Any] = {"tokens": _int(m.group("tokens"))}
        c = _CONCURRENCY.search(body, m.end())
        if c is not None:
            fields["max_concurrency_tokens"] = _int(c.group("len"))
            fields["max_concurrency"] = float(c.group("x"))
        return (_make(PoolSized, meta, **fields),)
    if body.startswith("Auto-fit"):
        a = _AUTO_FIT.match(body)
        if a is not None:
            return (_make(EngineSettings, meta, max_model_len=int(a.group("to") or a.group("full"))),)
    m = _AVAILABLE.match(body) if body.startswith("Available") else None
    if m is not None:
        return _budget(meta, available_kv_bytes=_gib(m.group("v"), m.group("u")))
    if "weights memory" in body:
        d = _PROFILE_DEBUG.search(body)
        if d is not None:
            return (
                _make(
                    MemoryBudget,
                    meta,
                    activation_bytes=_gib(d.group("act")),
                    non_torch_bytes=_gib(d.group("nt")),
                    weights_bytes=_gib(d.group("w")),
                ),
            )
    if body.startswith("CUDA graph memory"):
        return _cuda_graph(body, meta)
    if "preempted" in body:
        p = _PREEMPTED.search(body)
        if p is not None:
            return (_make(Preemption, meta, mechanism="preempt", total=int(p.group("n"))),)
    return _failure(body, meta)


def _failure(body: str, meta: LineMeta) -> tuple[Event, ...]:
    head = _ERROR_HEAD.match(body)
    text = body[head.end() :] if head is not None else body
    m = _V1_MAXLEN.match(text)
    if m is not None:
        est = m.group("est")
        return (
            _make(
                StartupFailure,
                meta,
                reason="max_model_len_too_large",
                max_model_len=int(m.group("len")),
                needed_kv_bytes=_gib(m.group("need"), m.group("u1")),
                available_kv_bytes=_gib(m.group("avail"), m.group("u2")),
                estimated_max_model_len=int(est) if est is not None else None,
            ),
        )
    m = _V0_MAXLEN.match(text)
    if m is not None:
        tokens = int(m.group("tokens"))
        return (
            _make(
                StartupFailure,
                meta,
                reason="max_model_len_too_large",
                max_model_len=int(m.group("len")),
                max_tokens_in_cache=tokens,
            ),
            # block_size x num_gpu_blocks: the pool's token capacity, printed nowhere else by V0.
            _make(PoolSized, meta, tokens=tokens),
        )
    if _NO_MEMORY.match(text) is not None:
        return (_make(StartupFailure, meta, reason="no_memory_for_cache"),)
    return NO_EVENTS


def _percent(val: str) -> float:
    return _ratio(val.removesuffix("%"))


# Stats keys with a fixed meaning -> (field, converter). V0's 'Pending' is the waiting queue.
_STAT_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "Avg prompt throughput": ("prompt_throughput", float),
    "Avg generation throughput": ("generation_throughput", float),
    "Running": ("running", int),
    "Waiting": ("waiting", int),
    "Pending": ("waiting", int),
    "Swapped": ("swapped", int),
    "Preemptions": ("preemptions", int),
    "Prefix cache hit rate": ("prefix_cache_hit_ratio", _percent),
}


def _stats(body: str, head: regex.Match[str], meta: LineMeta) -> tuple[Event, ...]:
    """The periodic stats line: split on ', ' into 'Key: value' pairs (the field set is dynamic)."""
    engine = head.group("engine")
    if engine is not None:
        instance = str(int(engine))
        if instance != meta.instance:
            meta = LineMeta(instance=instance, rank=meta.rank, ts=meta.ts)
    elif head.group("agg") is not None:
        # The aggregated DP logger sums every engine: not one instance's numbers.
        meta = LineMeta(instance="all", rank=meta.rank, ts=meta.ts)
    text = body[head.end() - len("Avg prompt throughput") :].rstrip().removesuffix(".")
    usage: dict[str, Any] = {}
    try:
        for part in text.split(", "):
            key, sep, rest = part.partition(": ")
            if not sep:
                continue
            val = rest.split(" ", 1)[0]
            known = _STAT_FIELDS.get(key)
            if known is not None:
                usage[known[0]] = known[1](val)
            elif key.endswith("KV cache usage") and not key.startswith(("External", "MM")):
                # '<DEV> KV cache usage' (0.30+); V0 prints GPU then CPU (its swap space).
                ratio = _ratio(val.removesuffix("%"))
                if "kv_usage_ratio" in usage and key == "CPU KV cache usage":
                    usage["cpu_kv_usage_ratio"] = ratio
                else:
                    usage.setdefault("kv_usage_ratio", ratio)
    except (ValueError, ArithmeticError) as exc:
        raise ParseError(f"bad stats value in {body[:80]!r}") from exc
    preemptions = usage.pop("preemptions", None)
    events: list[Event] = [_make(UsageSample, meta, **usage)]
    if preemptions is not None:
        events.append(_make(Preemption, meta, mechanism="preempt", count=preemptions))
    return tuple(events)


# --- whole-line fast path for the stats line ----------------------------------------------------

# The periodic stats line in the shapes vLLM prints it (V0 0.4.3+ and V1, their optional fields in
# vLLM's order), process and level prefix included, as one stdlib pattern over the raw line: on a
# busy server it is nearly every line that carries a fact, and this single match replaces prefix
# stripping, the key/value split and pydantic validation. The prefix part is strip_prefixes'
# _VLLM_COMMON pattern narrowed to ASCII classes (a sub-language of it: where this matches, that
# matches the same span with the same groups, since the process name cannot contain ')' and the
# location cannot contain ']'), so the whole pattern only matches ASCII lines without ANSI
# escapes. Every value group admits only ASCII digits in the shape the converters accept, so a
# match cannot fail to convert; fields the general parser ignores (Deferred, Corrupted,
# External/MM hit rates) are matched and ignored here. Anything else is left to the general path.
# It matches bytes: replay hands over the raw lines, which then need no decoding (a line with bytes
# outside ASCII cannot match, exactly as its decoded form could not).
_N = r"[0-9]+(?:\.[0-9]+)?"
_FAST_STATS_TEXT = (
    r"(?:\((?P<name>[A-Za-z_][A-Za-z0-9_.\-]*(?: [A-Za-z0-9_=]+)*) pid=[0-9]+\) )?"
    r"(?:INFO|DEBUG|WARNING|WARN|ERROR|CRITICAL) "
    r"(?P<ts>[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]) \[?[A-Za-z0-9_./\-]+:[0-9]+\] "
    r"(?:Engine (?P<engine>[0-9]+): |(?P<agg>[0-9]+) Engines Aggregated: )?"
    rf"Avg prompt throughput: (?P<prompt>{_N}) tokens/s, Avg generation throughput: (?P<gen>{_N}) tokens/s, "
    r"Running: (?P<running>[0-9]+) reqs, (?:Swapped: (?P<swapped>[0-9]+) reqs, )?"
    r"(?:Pending|Waiting): (?P<waiting>[0-9]+) reqs, (?:Deferred: [0-9]+ reqs, )?"
    r"(?:Preemptions: (?P<preemptions>[0-9]+), )?"
    rf"GPU KV cache usage: (?P<kv>{_N})%(?:, CPU KV cache usage: (?P<cpu>{_N})%)?"
    rf"(?:, Prefix cache hit rate: (?P<hit>{_N})%)?(?:, Corrupted: [0-9]+ reqs)?"
    rf"(?:, External prefix cache hit rate: {_N}%)?(?:, MM cache hit rate: {_N}%)?"
    r"\.?[\r\n]*\Z"
)
_FAST_STATS = re.compile(_FAST_STATS_TEXT.encode("ascii"))


_MODEL_SLOTS = ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__", "__pydantic_private__")


def _constructor(cls: type[UsageSample] | type[Preemption]) -> Callable[[dict[str, Any]], Event]:
    """A builder of ``cls`` events from values already in their validated types.

    What ``cls.model_construct(**values)`` produces (the same ``__dict__`` in field order, fields
    set, no extras, no private attributes), without its per-field Python loop, which costs more
    than validating. Only the fast path uses it, on values its pattern and converters have already
    given their final type (str, int, float); tests compare its events with validated ones.
    """
    template = dict(cls(engine="vllm").__dict__)
    new = object.__new__
    # The slots' own setters: what object.__setattr__ finds after looking the name up on the class.
    slots = {name: BaseModel.__dict__[name].__set__ for name in _MODEL_SLOTS}
    set_dict, set_fields_set = slots["__dict__"], slots["__pydantic_fields_set__"]
    set_extra, set_private = slots["__pydantic_extra__"], slots["__pydantic_private__"]

    def build(values: dict[str, Any]) -> Event:
        event: UsageSample | Preemption = new(cls)
        set_dict(event, {**template, **values})
        set_fields_set(event, set(values))
        set_extra(event, None)
        set_private(event, None)
        return event

    return build


_usage_sample = _constructor(UsageSample)
_preemption = _constructor(Preemption)


def parse_line(line: str) -> tuple[Event, ...] | None:
    """Events of a raw stats line in a common shape; None for any other line (use strip_prefixes + parse).

    Equal, event for event, to ``parse(*strip_prefixes(line))`` on every line it answers: the
    prefix is read as strip_prefixes reads it, the instance and rank come from the same
    process-name reading, and the values go through the same conversions as ``_stats``.
    """
    m = _FAST_STATS.match(line.encode("utf-8", "surrogatepass"))
    return None if m is None else _fast_stats_events(m.groups())


# The same pattern applied to many lines joined by '\n' in one findall: one row per line (the
# second alternative takes any other line), so the per-line match calls are made in C.
_FAST_STATS_LINES = re.compile(
    ("^(?:" + _FAST_STATS_TEXT.removesuffix(r"\.?[\r\n]*\Z") + r"\.?\r*$|[^\n]*)$").encode("ascii"),
    re.MULTILINE,
)


def parse_lines(lines: list[bytes]) -> list[tuple[Event, ...] | None]:
    """``parse_line`` over raw UTF-8 lines without a b'\\n' (a block's non-access lines, as read),
    matched in one call; a line's result is its decoded form's (invalid bytes replaced)."""
    if not lines:
        return []
    rows = _FAST_STATS_LINES.findall(b"\n".join(lines))
    if len(rows) != len(lines):  # a line with b'\n' in it: not this function's input
        return [parse_line(line.decode("utf-8", "replace")) for line in lines]
    return [_fast_stats_events(row) if row[1] else None for row in rows]


def _fast_stats_events(groups: tuple[bytes, ...]) -> tuple[Event, ...]:
    """The events of a _FAST_STATS match (absent groups are None or b'': every group that takes
    part in a match is non-empty). All groups are ASCII: float() and int() take them as bytes."""
    name, ts_b, engine, agg, prompt, gen, running, swapped, waiting, preemptions, kv, cpu, hit = groups
    instance, rank = process_identity(name.decode()) if name else ("0", None)
    if engine:
        instance = engine.lstrip(b"0").decode() or "0"  # str(int(engine)) for ASCII digits
    elif agg:
        instance = "all"
    ts = ts_b.decode()
    usage: dict[str, Any] = {
        "engine": "vllm",
        "instance": instance,
        "rank": rank,
        "ts": ts,
        "prompt_throughput": float(prompt),
        "generation_throughput": float(gen),
        "running": int(running),
        "waiting": int(waiting),
        "kv_usage_ratio": float(kv + b"e-2"),  # _ratio
    }
    if swapped:
        usage["swapped"] = int(swapped)
    if cpu:
        usage["cpu_kv_usage_ratio"] = float(cpu + b"e-2")
    if hit:
        usage["prefix_cache_hit_ratio"] = float(hit + b"e-2")
    if not preemptions:
        return (_usage_sample(usage),)
    preemption = {"engine": "vllm", "instance": instance, "rank": rank, "ts": ts}
    preemption["mechanism"] = "preempt"
    preemption["count"] = int(preemptions)
    return (_usage_sample(usage), _preemption(preemption))


def _budget_breakdown(body: str, meta: LineMeta) -> tuple[Event, ...]:
    """V0 budget: the 3rd line of the 0.6.5+ breakdown ('KV Cache is N GiB')."""
    m = _BREAKDOWN.search(body)
    if m is None:
        return NO_EVENTS
    return _budget(
        meta,
        weights_bytes=_gib(m.group("w")),
        non_torch_bytes=_gib(m.group("nt")),
        activation_bytes=_gib(m.group("act")),
        available_kv_bytes=_gib(m.group("kv")),
    )


def _budget(meta: LineMeta, **fields: Any) -> tuple[Event, ...]:
    """A memory budget; one whose KV memory is negative is also the startup failure vLLM raises next."""
    budget = _make(MemoryBudget, meta, **fields)
    kv = fields.get("available_kv_bytes")
    if kv is None or kv >= 0:
        return (budget,)
    return (budget, _make(StartupFailure, meta, reason="negative_kv_budget", available_kv_bytes=kv))


def _total_memory(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _CAN_USE.search(body)
    if m is not None:
        return (
            _make(
                MemoryBudget,
                meta,
                total_bytes=_gib(m.group("total")),
                gpu_memory_utilization=float(m.group("util")),
                requested_bytes=_gib(m.group("req")),
            ),
        )
    if body.startswith("Memory profiling results:"):
        values = {k.group("key"): k for k in _PROFILE_RESULTS.finditer(body)}
        fields: dict[str, Any] = {}
        for key, name in (
            ("total_gpu_memory", "total_bytes"),
            ("non_torch_memory", "non_torch_bytes"),
            ("kv_cache_size", "available_kv_bytes"),
        ):
            if key in values:
                fields[name] = _gib(values[key].group("v"))
        if "gpu_memory_utilization" in values:
            fields["gpu_memory_utilization"] = float(values["gpu_memory_utilization"].group("v"))
        return _budget(meta, **fields)
    return NO_EVENTS


def _cuda_graph(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _GRAPH_ESTIMATE.match(body)
    if m is not None:
        return (_make(MemoryBudget, meta, cuda_graph_bytes=_gib(m.group("v"), m.group("u"))),)
    m = _CURRENT_UTIL.search(body)
    if m is not None and body.startswith("CUDA graph memory profiling is enabled"):
        return (_make(EngineSettings, meta, gpu_memory_utilization=float(m.group("u"))),)
    return NO_EVENTS


def _took(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _WEIGHTS.match(body)
    if m is not None:
        return (_make(MemoryBudget, meta, weights_bytes=_gib(m.group("v"), m.group("u"))),)
    m = _GRAPHS.match(body)
    if m is not None:
        return (_make(MemoryBudget, meta, cuda_graph_bytes=_gib(m.group("v"), m.group("u"))),)
    return NO_EVENTS


def _logo(body: str, meta: LineMeta) -> tuple[Event, ...]:
    """0.15+ startup logo: '  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.20.2' / '... █  model   Qwen/...'."""
    m = _LOGO_TEXT.search(body)
    if m is None or not _LOGO_ART.issuperset(body[: m.start()]):
        return NO_EVENTS
    if m.group("key") == "version":
        return (_make(EngineSettings, meta, version=m.group("value"), starts_engine=True),)
    return (_make(EngineSettings, meta, model=m.group("value")),)


def _settings(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _VERSION.match(body)
    if m is not None:
        version = m.group("v") or m.group("headless")
        fields: dict[str, Any] = {"version": version, "starts_engine": True}
        if m.group("model"):
            fields["model"] = m.group("model")
        return (_make(EngineSettings, meta, **fields),)
    m = _ENGINE_INIT.match(body)
    if m is not None:
        fields = _settings_fields(
            [(f.group("key"), f.group("val")) for f in _KV_FIELD.finditer(m.group("cfg"))]
        )
        fields["starts_engine"] = True
        if m.group("v"):
            fields["version"] = m.group("v")
        gen = m.group("gen")
        if gen is not None:
            fields["engine_generation"] = gen.lower()
        return (_make(EngineSettings, meta, **fields),)
    m = _NON_DEFAULT.match(body)
    if m is not None:
        args = m.group("body").strip()
        if args.startswith("{"):
            pairs = [(f.group("key"), f.group("val")) for f in _DICT_FIELD.finditer(args)]
        elif args.startswith("Namespace("):
            pairs = [(f.group("key"), f.group("val")) for f in _KV_FIELD.finditer(args)]
        else:
            return NO_EVENTS
        fields = _settings_fields(pairs)
        return (_make(EngineSettings, meta, **fields),) if fields else NO_EVENTS
    return NO_EVENTS


def parse(body: str, meta: LineMeta) -> tuple[Event, ...]:
    """Events in one vLLM message body (prefixes removed); () for lines about something else."""
    if "KV cache" in body:
        return _kv_cache_line(body, meta)
    if "KV Cache" in body:
        return _budget_breakdown(body, meta)
    if "blocks" in body:
        if "No available memory" in body:
            return _failure(body, meta)
        if "num_gpu_blocks" in body:
            m = _CACHE_CONFIG_INFO.match(body)
            if m is not None:
                if m.group("engine") is not None:
                    meta = LineMeta(instance=str(int(m.group("engine"))), rank=meta.rank, ts=meta.ts)
                return (_make(PoolSized, meta, blocks=int(m.group("n"))),)
            o = _OVERRIDE.search(body)
            if o is not None and body.startswith("Overriding num_gpu_blocks"):
                return (_make(PoolSized, meta, blocks=int(o.group("n"))),)
            return NO_EVENTS
        return _pool(body, meta)
    if "Maximum concurrency" in body:
        m = _CONCURRENCY.match(body)
        if m is None:
            return NO_EVENTS
        return (
            _make(
                PoolSized,
                meta,
                max_concurrency_tokens=_int(m.group("len")),
                max_concurrency=float(m.group("x")),
            ),
        )
    if "took" in body:
        return _took(body, meta)
    if "total_gpu_memory" in body:
        return _total_memory(body, meta)
    if "CUDA graph memory" in body:
        return _cuda_graph(body, meta)
    if "equested" in body:
        m = _REQUESTED.search(body)
        if m is None:
            return NO_EVENTS
        if m.group("a") is not None:
            return (_make(MemoryBudget, meta, requested_bytes=_gib(m.group("a"))),)
        return (
            _make(
                MemoryBudget,
                meta,
                requested_bytes=_gib(m.group("b")),
                gpu_memory_utilization=float(m.group("util")),
            ),
        )
    if "max model len" in body:
        m = _MAX_MODEL_LEN.match(body)
        return (_make(EngineSettings, meta, max_model_len=int(m.group("n"))),) if m else NO_EVENTS
    if "max_num_batched_tokens" in body and body.startswith("Chunked prefill is enabled"):
        m = _CHUNKED.search(body)
        return (_make(EngineSettings, meta, max_num_batched_tokens=int(m.group("n"))),) if m else NO_EVENTS
    if "block size" in body:
        m = _FORCED_BLOCK.match(body)
        return (_make(EngineSettings, meta, block_size=int(m.group("n"))),) if m else NO_EVENTS
    if body.startswith("Prefix cache hit rate: GPU"):
        m = _V0_HIT_RATE.match(body)
        return (_make(UsageSample, meta, prefix_cache_hit_ratio=_ratio(m.group("gpu"))),) if m else NO_EVENTS
    if "█  model" in body or "█  version" in body:
        return _logo(body, meta)
    if "version" in body or "LLM engine" in body or "args" in body or "headless" in body:
        return _settings(body, meta)
    return NO_EVENTS
