"""vLLM settings lines: version banners and the logo, the engine config, the non-default args.

Each line is read into EngineSettings fields; a banner or 'Initializing ... engine' line marks a
new engine start (``starts_engine``). Patterns quote the real lines of the releases they name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from kvwatch.core.events import EngineSettings, Event
from kvwatch.engines.vllm.common import ident
from kvwatch.engines.vllm.mm_limits import kept_form
from kvwatch.engines.vllm.runner import runner_flag, task_flag
from kvwatch.parsers.base import NO_EVENTS, LineMeta, ParseError

# --- settings lines ----------------------------------------------------------------------------------

# 0.4.0-0.14: 'vLLM API server version 0.14.0rc2+cu130'; 0.15+ with VLLM_DISABLE_LOG_LOGO:
# 'vLLM server version 0.20.2, serving model Qwen/Qwen2.5-7B-Instruct'; batch runner 'vLLM batch processing
# API version 0.6.0'; 0.15+ logo line '  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.20.2'.
_VERSION = re.compile(
    r"^(?:vLLM (?:API server|server|batch processing API) version (?P<v>\d++\.\d++[\w.+\-]*+)"
    r"(?:, serving model (?P<model>\S+))?"
    r"|Launching vLLM \(v(?P<headless>\d++\.\d++[^)\s]*+)\) headless)"
)
# The logo's text column: searched from the first '█' that starts it, then the part before it is checked
# to be logo art (a pattern with the art as a repeated class backtracks quadratically on long lines).
_LOGO_TEXT = re.compile(r"█ +(?P<key>version|model) +(?P<value>\S+)\s*$")
_LOGO_ART = frozenset("█▄▀ ")

# 'Initializing an LLM engine (v0.4.3) with config: model=...', 'Initializing a V1 LLM engine (v0.9.2)
# with config: ...', 0.3.3 'Initializing an LLM engine with config: ...'.
_ENGINE_INIT = re.compile(
    r"^Initializing an? (?:(?P<gen>V[01]) )?LLM engine(?: \(v(?P<v>[^)\s]+)\))? with config: (?P<cfg>.*)$"
)

# Config fields 'key=value' in str(VllmConfig) / Namespace(...): value up to ', next_key=' or the end.
_KV_FIELD = re.compile(r"(?:^|[\s,(])(?P<key>[a-z_]+)=(?P<val>'[^']*'|\"[^\"]*\"|[^,\s()]+)")
# Python dict repr of 0.9+ 'non-default args: {...}'.
_DICT_FIELD = re.compile(r"'(?P<key>[a-z_]+)': (?P<val>'[^']*'|\"[^\"]*\"|\[[^\]]*\]|[^,{}\[\]]+)")

_NON_DEFAULT = re.compile(r"^(?:non-default args|args): (?P<body>.*)$")
# --limit-mm-per-prompt as the args line prints it: "'limit_mm_per_prompt': {'image': 0, 'video':
# {'count': 0}}" (0.9+ dict) or "limit_mm_per_prompt={'image': 0}" (Namespace); one level of nesting,
# possessive and first-character-disjoint, so linear on any line.
_MM_LIMITS = re.compile(r"limit_mm_per_prompt(?:': |=)\{(?P<body>(?:[^{}]|\{[^{}]*+\})*+)\}")
_MM_LIMIT = re.compile(
    r"'(?P<key>[a-z_]{1,32})': (?:(?P<n>\d{1,9})|\{[^{}]*?'count': (?P<c>\d{1,9})[^{}]*+\})"
)
# The compile ranges in the engine config's compilation_config (0.18+): their upper bound is
# max_num_batched_tokens and every other endpoint lies below it (0.18.0 config/vllm.py:1456-1459,
# :1526; 0.27.1 :1952-1955, :2046-2052; 0.33.0 :2664-2731), so the largest is the scheduler's budget
# where no 'Chunked prefill is enabled' line says it (0.27.1 logs can lack that line). Bounded.
_COMPILE_RANGES = re.compile(r"'compile_ranges_endpoints': \[(?P<ends>[\d, ]{1,200}+)\]")
_MAX_MODEL_LEN = re.compile(r"^Using max model len (?P<n>\d+)")
_CHUNKED = re.compile(r"max_num_batched_tokens=(?P<n>\d+)")
_FORCED_BLOCK = re.compile(r"^Forcing kv cache block size to (?P<n>\d+)")

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
    "runner": "runner",
    "task": "task",
}
_BOOL_SETTINGS = {
    "enable_prefix_caching": "enable_prefix_caching",
    "enforce_eager": "enforce_eager",
    "language_model_only": "language_model_only",
    "skip_mm_profiling": "skip_mm_profiling",
}


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    if value.startswith("[") and value.endswith("]"):
        # served_model_name=['name'] -> the first name.
        inner = value[1:-1].split(",")[0].strip()
        return _unquote(inner) if inner else ""
    return value


@dataclass
class _Found:
    """Typed EngineSettings values read from (key, raw value) pairs, by field; the first key wins."""

    counts: dict[str, int] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)  # also mm_limits, kept as limits_flag keeps it
    flags: dict[str, bool] = field(default_factory=dict)
    gpu_memory_utilization: float | None = None

    def __bool__(self) -> bool:
        return bool(self.counts or self.texts or self.flags) or self.gpu_memory_utilization is not None


def _settings_fields(pairs: list[tuple[str, str]]) -> _Found:
    """Typed EngineSettings fields from (key, raw value) pairs; first occurrence of a key wins."""
    out = _Found()
    for key, raw in pairs:
        value = _unquote(raw)
        if value in ("None", "", "null"):
            continue
        try:
            if key in _INT_SETTINGS:
                out.counts.setdefault(_INT_SETTINGS[key], int(value))
            elif key in _STR_SETTINGS:
                if key == "dtype":
                    value = value.removeprefix("torch.")
                out.texts.setdefault(_STR_SETTINGS[key], value)
            elif key in _BOOL_SETTINGS and value in ("True", "False"):
                out.flags.setdefault(_BOOL_SETTINGS[key], value == "True")
            elif key == "gpu_memory_utilization":
                share = float(value)
                if out.gpu_memory_utilization is None:
                    out.gpu_memory_utilization = share
        except ValueError as exc:
            raise ParseError(f"bad value for {key}: {value!r}") from exc
    return out


def _settings(
    meta: LineMeta,
    found: _Found,
    *,
    starts_engine: bool = False,
    version: str | None = None,
    generation: Literal["v0", "v1"] | None = None,
) -> EngineSettings:
    """The settings event of a config or args line: every field such a line can give, by name."""
    counts, texts, flags = found.counts, found.texts, found.flags
    return EngineSettings(
        **ident(meta),
        starts_engine=starts_engine,
        version=version,
        model=texts.get("model"),
        served_model_name=texts.get("served_model_name"),
        tensor_parallel_size=counts.get("tensor_parallel_size"),
        pipeline_parallel_size=counts.get("pipeline_parallel_size"),
        data_parallel_size=counts.get("data_parallel_size"),
        decode_context_parallel_size=counts.get("decode_context_parallel_size"),
        dtype=texts.get("dtype"),
        kv_cache_dtype=texts.get("kv_cache_dtype"),
        quantization=texts.get("quantization"),
        block_size=counts.get("block_size"),
        max_model_len=counts.get("max_model_len"),
        max_num_seqs=counts.get("max_num_seqs"),
        max_num_batched_tokens=counts.get("max_num_batched_tokens"),
        gpu_memory_utilization=found.gpu_memory_utilization,
        enable_prefix_caching=flags.get("enable_prefix_caching"),
        enforce_eager=flags.get("enforce_eager"),
        language_model_only=flags.get("language_model_only"),
        mm_limits=texts.get("mm_limits"),
        runner=_runner(texts),
        skip_mm_profiling=flags.get("skip_mm_profiling"),
        engine_generation=generation,
    )


def logo_line(body: str, meta: LineMeta) -> tuple[Event, ...]:
    """0.15+ startup logo: '  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.20.2' / '... █  model   Qwen/...'."""
    m = _LOGO_TEXT.search(body)
    if m is None or not _LOGO_ART.issuperset(body[: m.start()]):
        return NO_EVENTS
    if m.group("key") == "version":
        return (EngineSettings(**ident(meta), version=m.group("value"), starts_engine=True),)
    return (EngineSettings(**ident(meta), model=m.group("value")),)


def settings_line(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _VERSION.match(body)
    if m is not None:
        version = m.group("v") or m.group("headless")
        return (
            EngineSettings(
                **ident(meta), version=version, starts_engine=True, model=m.group("model") or None
            ),
        )
    m = _ENGINE_INIT.match(body)
    if m is not None:
        found = _settings_fields(
            [(f.group("key"), f.group("val")) for f in _KV_FIELD.finditer(m.group("cfg"))]
        )
        ranges = _COMPILE_RANGES.search(m.group("cfg"))
        ends = [int(e) for e in ranges.group("ends").split(",") if e.strip()] if ranges else []
        if ends:
            found.counts.setdefault("max_num_batched_tokens", max(ends))
        gen = m.group("gen")  # 'V0' or 'V1'
        generation: Literal["v0", "v1"] | None = None if gen is None else "v1" if gen == "V1" else "v0"
        return (
            _settings(meta, found, starts_engine=True, version=m.group("v") or None, generation=generation),
        )
    m = _NON_DEFAULT.match(body)
    if m is not None:
        args = m.group("body").strip()
        if args.startswith("{"):
            pairs = [(f.group("key"), f.group("val")) for f in _DICT_FIELD.finditer(args)]
        elif args.startswith("Namespace("):
            pairs = [(f.group("key"), f.group("val")) for f in _KV_FIELD.finditer(args)]
        else:
            return NO_EVENTS
        found = _settings_fields(pairs)
        if (limits := _mm_limits(args)) is not None:
            found.texts["mm_limits"] = limits
        return (_settings(meta, found),) if found else NO_EVENTS
    return NO_EVENTS


def _runner(texts: dict[str, str]) -> Literal["generate", "pooling"] | None:
    """The runner the args line names ('runner', or 0.7-0.12's 'task'); None for auto or unknown."""
    for key, read in (("runner", runner_flag), ("task", task_flag)):
        if key in texts:
            try:
                runner = read(texts[key])
            except ValueError:
                return None
            return "pooling" if runner == "pooling" else "generate" if runner == "generate" else None
    return None


def _mm_limits(args: str) -> str | None:
    """The args line's limit_mm_per_prompt as kvwatch keeps it ('image=0,video=0', sorted)."""
    m = _MM_LIMITS.search(args)
    if m is None:
        return None
    found = {f.group("key"): int(f.group("n") or f.group("c")) for f in _MM_LIMIT.finditer(m.group("body"))}
    return kept_form(found) or None


def max_model_len_line(body: str, meta: LineMeta) -> tuple[Event, ...]:
    """'Using max model len 32768'."""
    m = _MAX_MODEL_LEN.match(body)
    return (EngineSettings(**ident(meta), max_model_len=int(m.group("n"))),) if m else NO_EVENTS


def chunked_prefill_line(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    """'Chunked prefill is enabled with max_num_batched_tokens=8192.'; None for other lines."""
    if not body.startswith("Chunked prefill is enabled"):
        return None
    m = _CHUNKED.search(body)
    return (EngineSettings(**ident(meta), max_num_batched_tokens=int(m.group("n"))),) if m else NO_EVENTS


# 0.10+ (vllm/engine/arg_utils.py:2233 and :2243 in 0.19.0), DEBUG: the defaults the engine resolved for
# its entry point -- 'Defaulting max_num_batched_tokens to 8192 for OPENAI_API_SERVER usage context.',
# 'Defaulting max_num_seqs to 1024 for OPENAI_API_SERVER usage context.'
_DEFAULTING = re.compile(r"^Defaulting (?P<key>max_num_batched_tokens|max_num_seqs) to (?P<n>\d+) for ")


def defaulting_line(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    """An engine default resolved at startup; None for other 'Defaulting' lines."""
    m = _DEFAULTING.match(body)
    if m is None:
        return None
    n = int(m.group("n"))
    if m.group("key") == "max_num_seqs":
        return (EngineSettings(**ident(meta), max_num_seqs=n),)
    return (EngineSettings(**ident(meta), max_num_batched_tokens=n),)


def forced_block_line(body: str, meta: LineMeta) -> tuple[Event, ...]:
    """'Forcing kv cache block size to 64 for FlashMLA backend.'"""
    m = _FORCED_BLOCK.match(body)
    return (EngineSettings(**ident(meta), block_size=int(m.group("n"))),) if m else NO_EVENTS
