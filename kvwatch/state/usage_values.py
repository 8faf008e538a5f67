"""What a usage value may be: ratios in [0, 1], counts non-negative and finite.

A value outside its meaning (a logged 'GPU KV cache usage: 193.0%') is refused by the state layer,
counted per fact (kvwatch_bad_values_total) and never exported; the rest of its sample is kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

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
_LIMITS: dict[str, tuple[float, float]] = {
    **dict.fromkeys(RATIO_FACTS, (0.0, 1.0)),
    **dict.fromkeys(COUNT_FACTS, (0.0, float(2**63))),
}


def refused_facts(changed: Mapping[str, object]) -> list[str] | None:
    """The usage facts of one sample outside their meaning, or None (every stats line pays this)."""
    bad: list[str] | None = None
    for fact, value in changed.items():
        limits = _LIMITS.get(fact)
        if limits is None:
            continue
        try:
            inside = limits[0] <= value <= limits[1]  # type: ignore[operator]
        except TypeError:
            inside = False
        if not inside:
            bad = [] if bad is None else bad
            bad.append(fact)
    return bad


def is_refused(fact: str, value: object) -> bool:
    """True when a usage value lies outside what the fact means."""
    if fact in RATIO_FACTS:
        return not (isinstance(value, int | float) and math.isfinite(value) and 0.0 <= value <= 1.0)
    if fact in COUNT_FACTS:
        return not (isinstance(value, int | float) and math.isfinite(value) and value >= 0)
    return False


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
