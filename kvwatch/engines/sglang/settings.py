"""SGLang settings lines: the server_args repr of every release and check_env's version line.

``server_args=`` opens a new engine start; its dataclass repr (<=0.5.15) or dict repr (0.5.19+) is
read item by item at depth 0, so truncated pastes still give the fields they kept.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from pydantic import TypeAdapter

from kvwatch.core.events import EngineSettings, Event
from kvwatch.engines.sglang.common import ident as _ident
from kvwatch.parsers.base import NO_EVENTS, LineMeta

# --- settings ------------------------------------------------------------------------------------

# <=0.5.15 "[2025-10-01 10:00:00] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', ...,
#           mem_fraction_static=0.835, ..., tp_size=1, ...)"                  (dataclass repr)
# 0.5.19+  "[2026-03-01 10:00:00] server_args={'model_path': 'meta-llama/Llama-3.1-8B-Instruct', ...}"
_SERVER_ARGS = re.compile(r"server_args=(?:(?P<cls>\w+)\(|\{)", re.VERBOSE)
# Tokens of a Python repr: quoted strings (escapes allowed), brackets, commas, runs of anything else.
_REPR_TOKEN = re.compile(
    r"""
    '(?:[^'\\]|\\.)*' | "(?:[^"\\]|\\.)*" | [()\[\]{},] | [^'"()\[\]{},]+ | .
    """,
    re.VERBOSE | re.DOTALL,
)
_REPR_KEY = re.compile(r"""\s*(?:(?P<bare>\w+)=|'(?P<quoted>\w+)':\s*)(?P<value>.*)""", re.DOTALL)
_REPR_INT = re.compile(r"-?\d+")
_REPR_FLOAT = re.compile(r"-?\d+\.\d*(?:[eE][+-]?\d+)?|-?\d+[eE][+-]?\d+")

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
    "language_model_only": "language_model_only",
    "enable_dp_attention": "dp_attention",
}


# A server_args value as the EngineSettings field it fills takes it.
_COUNT: TypeAdapter[int | None] = TypeAdapter(int | None)
_SHARE: TypeAdapter[float | None] = TypeAdapter(float | None)
_TEXT: TypeAdapter[str | None] = TypeAdapter(str | None)
_FLAG: TypeAdapter[bool | None] = TypeAdapter(bool | None)

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


def parse_server_args(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _SERVER_ARGS.search(body)
    if m is None:
        return NO_EVENTS
    found: dict[str, object] = {}
    for item in _top_level_items(body, m.end()):
        kv = _REPR_KEY.fullmatch(item)
        if kv is None:
            continue
        key = kv.group("bare") or kv.group("quoted")
        value = _repr_value(kv.group("value"))
        if value is None:
            continue
        if key == "disable_radix_cache" and isinstance(value, bool):
            found.setdefault("enable_prefix_caching", not value)
        elif key == "disable_cuda_graph" and isinstance(value, bool):
            found.setdefault("enforce_eager", value)
        elif key in _SETTINGS_KEYS:
            found.setdefault(_SETTINGS_KEYS[key], value)
    # Each value as its field's type takes it (pydantic's rules, as the event's own validation: a
    # value it refuses is the line's ParseError); every field server_args gives, by name.
    count, share, text, flag = (
        _COUNT.validate_python,
        _SHARE.validate_python,
        _TEXT.validate_python,
        _FLAG.validate_python,
    )
    return (
        EngineSettings(
            **_ident(meta),
            starts_engine=True,
            model=text(found.get("model")),
            served_model_name=text(found.get("served_model_name")),
            tensor_parallel_size=count(found.get("tensor_parallel_size")),
            pipeline_parallel_size=count(found.get("pipeline_parallel_size")),
            data_parallel_size=count(found.get("data_parallel_size")),
            dtype=text(found.get("dtype")),
            kv_cache_dtype=text(found.get("kv_cache_dtype")),
            quantization=text(found.get("quantization")),
            page_size=count(found.get("page_size")),
            max_model_len=count(found.get("max_model_len")),
            max_num_seqs=count(found.get("max_num_seqs")),
            chunked_prefill_size=count(found.get("chunked_prefill_size")),
            cuda_graph_max_bs=count(found.get("cuda_graph_max_bs")),
            mem_fraction_static=share(found.get("mem_fraction_static")),
            enable_prefix_caching=flag(found.get("enable_prefix_caching")),
            enforce_eager=flag(found.get("enforce_eager")),
            language_model_only=flag(found.get("language_model_only")),
            dp_attention=flag(found.get("dp_attention")),
        ),
    )


# `python -m sglang.check_env`, pasted with the log (SGLang never logs its own version):
# "sglang: 0.4.6.post1"
_VERSION = re.compile(
    r"\s*+sglang:\ *+(?P<version>\d++\.\d++[\w.+\-]*+)\s*+", re.VERBOSE
)  # possessive: linear


def parse_version(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _VERSION.fullmatch(body)
    if m is None:
        return NO_EVENTS
    return (EngineSettings(**_ident(meta), version=m.group("version")),)
