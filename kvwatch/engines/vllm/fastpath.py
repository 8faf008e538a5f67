"""vLLM's whole-line fast path: the periodic stats line, prefixes included, in one stdlib match.

On a busy server the stats line is nearly every line that carries a fact. The pipeline hands every
claimed line to ``parse_lines`` (the engine's ``LogDialect.fast_path``) before the general path
(prefix peeling + ``log.parse``), the sidecar one line at a time and replay a block's lines at once;
tests hold the two paths equal event for event.
"""

from __future__ import annotations

import re
from functools import lru_cache

from kvwatch.core.events import Event, Preemption, UsageSample
from kvwatch.engines.vllm.common import ident
from kvwatch.engines.vllm.stats import usage_sample
from kvwatch.parsers.base import LineMeta
from kvwatch.parsers.prefix import VLLM_LEVEL, fast_identity, fast_prefix

# The periodic stats line in the shapes vLLM prints it (V0 0.4.3+ and V1, their optional fields in
# vLLM's order) behind the prefixes strip_prefixes reads most often (container stamps, CRI, ANSI,
# Ray and vLLM process prefixes, vLLM's level prefix: prefix.fast_prefix, built from the same
# layer definitions strip_prefixes compiles), as one stdlib bytes pattern over the raw lines: this
# single match replaces prefix stripping, the key/value split and pydantic validation. Only ASCII
# lines can match, so a raw line needs no decoding. Every value group admits only ASCII digits in
# the shape the converters accept, so a match cannot fail to convert; fields the general parser
# ignores (Deferred, Corrupted, External/MM hit rates) are matched and ignored here. Anything else
# is left to the general path.
_N = r"[0-9]+(?:\.[0-9]+)?"
_STATS_BODY = (
    r"(?:Engine (?P<engine>[0-9]+): |(?P<agg>[0-9]+) Engines Aggregated: )?"
    rf"Avg prompt throughput: (?P<prompt>{_N}) tokens/s, Avg generation throughput: (?P<gen>{_N}) tokens/s, "
    r"Running: (?P<running>[0-9]+) reqs, (?:Swapped: (?P<swapped>[0-9]+) reqs, )?"
    r"(?:Pending|Waiting): (?P<waiting>[0-9]+) reqs, (?:Deferred: [0-9]+ reqs, )?"
    r"(?:Preemptions: (?P<preemptions>[0-9]+), )?"
    rf"GPU KV cache usage: (?P<kv>{_N})%(?:, CPU KV cache usage: (?P<cpu>{_N})%)?"
    rf"(?:, Prefix cache hit rate: (?P<hit>{_N})%)?(?:, Corrupted: [0-9]+ reqs)?"
    rf"(?:, External prefix cache hit rate: {_N}%)?(?:, MM cache hit rate: {_N}%)?"
    r"\.?\r*"
)
# Over many lines joined by b'\n', one findall row per line: the second alternative takes any other
# line (its groups are all empty), so the per-line match calls are made in C.
_FAST_STATS_LINES = re.compile(
    ("^(?:" + fast_prefix(VLLM_LEVEL) + _STATS_BODY + "|[^\n]*)$").encode("ascii"), re.MULTILINE
)
# The row of a match, in group order: _fast_stats_events unpacks it.
_ROW: tuple[str, ...] = (
    "cts",
    "p1name",
    "p2name",
    "level",
    "ts",
    "engine",
    "agg",
    "prompt",
    "gen",
    "running",
)
_ROW += ("swapped", "waiting", "preemptions", "kv", "cpu", "hit")
if tuple(sorted(_FAST_STATS_LINES.groupindex, key=_FAST_STATS_LINES.groupindex.__getitem__)) != _ROW:
    raise AssertionError("fast stats pattern: its groups are not in _ROW's order")
_TS = _ROW.index("ts")


@lru_cache(maxsize=256)
def _printer(p1name: bytes, p2name: bytes, engine: bytes, agg: bytes) -> tuple[UsageSample, Preemption]:
    """The events of one printer (its instance and rank) without a line's values (stats.usage_sample
    names every field _stats names): the fast path's events are copies of them with the line's values (``model_copy(update=...)``, pydantic's own
    constructor for values already in their field types: the pattern and converters gave them)."""
    instance, rank = _identity(p1name, p2name) if p1name or p2name else ("0", None)
    if engine:
        instance = engine.lstrip(b"0").decode() or "0"  # str(int(engine)) for ASCII digits
    elif agg:
        instance = "all"
    meta = LineMeta(instance=instance, rank=rank)
    return usage_sample(meta, {}, {}), Preemption(**ident(meta), mechanism="preempt")


@lru_cache(maxsize=256)
def _identity(p1name: bytes, p2name: bytes) -> tuple[str, int | None]:
    instance, rank = fast_identity(p1name.decode(), p2name.decode())
    return ("0" if instance is None else instance), rank


def parse_lines(lines: list[bytes]) -> list[tuple[Event, ...] | None]:
    """Per raw line (UTF-8, no b'\\n'), its events when it is a stats line in a common shape, else
    None (then prefix peeling + ``log.parse`` read it).

    Equal, event for event, to ``parse(*strip_prefixes(line))`` on every line it answers: the
    prefixes are read as strip_prefixes reads them, the instance and rank come from the same
    process-name reading, and the values go through the same conversions as ``_stats``. All lines
    are matched in one call. A line with b'\\n' in it (not a line) leaves every answer None.
    """
    if not lines:
        return []
    rows = _FAST_STATS_LINES.findall(b"\n".join(lines))
    if len(rows) != len(lines):
        return [None] * len(lines)
    return [_fast_stats_events(row) if row[_TS] else None for row in rows]


def _fast_stats_events(row: tuple[bytes, ...]) -> tuple[Event, ...]:
    """The events of one matched row (absent groups are b'': every group that takes part in a match
    is non-empty). All groups are ASCII: float() and int() take them as bytes."""
    (
        _,
        p1name,
        p2name,
        _,
        ts_b,
        engine,
        agg,
        prompt,
        gen,
        running,
        swapped,
        waiting,
        preemptions,
        kv,
        cpu,
        hit,
    ) = row
    usage, preemption = _printer(p1name, p2name, engine, agg)
    ts = ts_b.decode()
    values: dict[str, str | float | int] = {
        "ts": ts,
        "prompt_throughput": float(prompt),
        "generation_throughput": float(gen),
        "running": int(running),
        "waiting": int(waiting),
        "kv_usage_ratio": float(kv + b"e-2"),  # _ratio
    }
    if swapped:
        values["swapped"] = int(swapped)
    if cpu:
        values["cpu_kv_usage_ratio"] = float(cpu + b"e-2")
    if hit:
        values["prefix_cache_hit_ratio"] = float(hit + b"e-2")
    if not preemptions:
        return (usage.model_copy(update=values),)
    return (
        usage.model_copy(update=values),
        preemption.model_copy(update={"ts": ts, "count": int(preemptions)}),
    )
