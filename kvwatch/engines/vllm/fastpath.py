"""vLLM's whole-line fast path: the periodic stats line, prefixes included, in one stdlib match.

On a busy server the stats line is nearly every line that carries a fact; the sidecar's tailer and
replay both call ``parse_line`` / ``parse_lines`` (through the engine's ``LogDialect``) before the
general path (prefix peeling + ``log.parse``), and tests hold the two equal event for event.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from kvwatch.events import Event, Preemption, UsageSample
from kvwatch.parsers.prefix import process_identity

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
