"""What a fact may be: ratios in [0, 1], counts non-negative and finite, every number of every event
within its plausibility bound (kvwatch.core.events.PLAUSIBLE), texts within MAX_TEXT_CHARS.

A value outside its meaning (a logged 'GPU KV cache usage: 193.0%', a pool of 1e309 tokens) is
refused by the state layer, counted per fact (kvwatch_bad_values_total) and never exported; the
rest of its event is kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

from kvwatch.core.events import MAX_TEXT_CHARS, PLAUSIBLE, UNBOUNDED_EVENTS, Event, UsageSample

# Usage facts that must lie in [0, 1] (ratios), and those that must be non-negative (counts). A
# value outside its meaning (a logged 'GPU KV cache usage: 193.0%') is rejected and counted.
RATIO_FACTS = frozenset(
    {"kv_usage_ratio", "prefix_cache_hit_ratio", "swa_usage_ratio", "mamba_usage_ratio", "cpu_kv_usage_ratio"}
)
COUNT_FACTS = frozenset(
    {"used_tokens", "running", "waiting", "swapped", "swa_used_tokens", "mamba_used_slots", "retracted"}
)
BAD_VALUE_FACTS: tuple[str, ...] = tuple(sorted(RATIO_FACTS | COUNT_FACTS))


# Fact -> the closed range its values must lie in; a NaN fails both bounds, an infinity one.
# Every usage fact with a bound (the throughputs too), of which the ratios and counts are exported at 0.
_LIMITS: dict[str, tuple[float, float]] = {
    fact: PLAUSIBLE[fact] for fact in UsageSample.model_fields if fact in PLAUSIBLE and fact != "rank"
}
if any(_LIMITS[fact] != (0.0, 1.0) for fact in RATIO_FACTS):
    raise AssertionError("a ratio fact's plausible range is not [0, 1]")


def implausible(event: Event) -> list[str] | None:
    """The facts of a startup, pool, preemption or failure event outside their plausibility bound
    (a number past PLAUSIBLE, a text past MAX_TEXT_CHARS), or None. Usage samples are checked by
    ``refused_facts`` and ``fold_columns`` (the hot path)."""
    if isinstance(event, UsageSample) or event.kind in UNBOUNDED_EVENTS:
        return None
    bad: list[str] | None = None
    for fact, value in event.__dict__.items():
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, str):
            inside = len(value) <= MAX_TEXT_CHARS
        else:
            limits = PLAUSIBLE.get(fact)
            if limits is None:
                continue
            inside = _within(value, limits)
        if not inside:
            bad = [] if bad is None else bad
            bad.append(fact)
    return bad


def _within(value: object, limits: tuple[float, float]) -> bool:
    try:
        return limits[0] <= value <= limits[1]  # type: ignore[operator]
    except TypeError:
        return False


def refused_facts(changed: Mapping[str, object]) -> list[str] | None:
    """The usage facts of one sample outside their meaning, or None (every stats line pays this)."""
    bad: list[str] | None = None
    for fact, value in changed.items():
        limits = _LIMITS.get(fact)
        if limits is None:
            continue
        if not _within(value, limits):
            bad = [] if bad is None else bad
            bad.append(fact)
    return bad


def is_refused(fact: str, value: object) -> bool:
    """True when a usage value lies outside what the fact means."""
    limits = _LIMITS.get(fact)
    if limits is None:
        return False
    return not (isinstance(value, int | float) and math.isfinite(value) and _within(value, limits))


def fold_columns(
    facts: Sequence[str], columns: Iterable[Sequence[object]]
) -> tuple[dict[str, object], dict[str, int]]:
    """What a run of samples leaves, given their values column by column (one column per fact of
    ``facts``, one item per sample, None where a sample lacks the fact): each fact's last accepted
    value, and how many values of each fact were refused.

    The same as checking the samples one by one with ``refused_facts`` and merging what is left in
    order, but a busy log's block holds dozens of stats lines per instance and nearly every column
    is clean: a column is checked with min, max and sum (C loops; a NaN or a type that does not
    compare shows up in them) and only a column that fails is checked value by value.
    """
    changed: dict[str, object] = {}
    refused: dict[str, int] = {}
    for fact, column in zip(facts, columns, strict=True):
        missing = column.count(None)
        if missing == len(column):
            continue
        present = [v for v in column if v is not None] if missing else column
        last = present[-1]
        limits = _LIMITS.get(fact)
        if limits is not None:
            low, high = limits
            numbers = cast(Sequence[float], present)  # (if not, sum raises TypeError)
            try:
                total = sum(numbers)
                clean = total == total and low <= min(numbers) and max(numbers) <= high
            except (TypeError, ArithmeticError):  # (an int too large for a float beside floats)
                clean = False
            if not clean:
                kept = [v for v in present if not refused_facts({fact: v})]
                if len(kept) < len(present):
                    refused[fact] = len(present) - len(kept)
                if not kept:
                    continue
                last = kept[-1]
        changed[fact] = last
    return changed, refused
