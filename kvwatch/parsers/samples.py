"""One engine series of a /metrics text, and the value readers every engine's metrics map uses.

The generic reader (kvwatch.sources.metrics_reader.MetricsReader) turns exposition text into ``Sample`` groups per engine
instance; each engine's ``MetricsDialect.facts`` (kvwatch/engines/*/metrics.py) reads its names out
of them through a ``SampleReader``, which counts every value it cannot use in ``bad_values`` and
remembers per-instance figures between scrapes (``remembered``) for rates and per-interval gauges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvwatch.core.events import EventValue


@dataclass(frozen=True, slots=True)
class Sample:
    """One series of a recognised engine, its prefix stripped."""

    name: str  # without the engine prefix, e.g. 'num_preemptions_total'
    exposed: str  # as the engine exposed it, e.g. 'vllm:num_preemptions_total'
    labels: dict[str, str]
    value: float
    instance: str
    # (tp_rank, pp_rank, moe_ep_rank) for series that name a rank; None otherwise.
    rank: tuple[int, int, int] | None
    series: tuple[tuple[str, str], ...]
    counter: bool


@dataclass
class InstanceFacts:
    """Event fields of one instance, by event kind (None values are dropped when events are built).

    Gathered by name from /metrics series and validated when the events are built: a name no event
    has is a ValidationError there (counted in ``bad_values``), not a type error here.
    """

    settings: dict[str, EventValue] = field(default_factory=dict)
    pools: dict[str, dict[str, EventValue]] = field(default_factory=dict)
    usage: dict[str, EventValue] = field(default_factory=dict)
    preemption: dict[str, EventValue] = field(default_factory=dict)


def finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


def label_int(labels: dict[str, str], key: str) -> int:
    text = labels.get(key, "0")
    return int(text) if text.isascii() and text.isdigit() else 0


def present(facts: Mapping[str, EventValue]) -> dict[str, EventValue]:
    """The facts that have a value."""
    return {k: v for k, v in facts.items() if v is not None}


class SampleReader:
    """Reads typed values out of sample groups; counts the unusable ones."""

    def __init__(self) -> None:
        # Values seen but unusable (NaN counts, negative counters, label strings that are no number).
        self.bad_values = 0
        # (instance, what, series key) -> figures remembered from the previous read of that instance.
        self.remembered: dict[tuple[str, str, tuple[tuple[str, str], ...]], tuple[float, ...]] = {}

    def forget(self, instance: str) -> None:
        """Drop what was remembered of ``instance`` (its engine restarted)."""
        for key in [k for k in self.remembered if k[0] == instance]:
            del self.remembered[key]

    def value(self, by_name: dict[str, list[Sample]], *names: str) -> float | None:
        """The first finite value among the name variants, newest name first."""
        for name in names:
            for s in by_name.get(name, ()):
                if finite(s.value):
                    return s.value
                self.bad_values += 1
        return None

    def count(self, by_name: dict[str, list[Sample]], *names: str) -> int | None:
        """A value that must be a non-negative whole number (requests, tokens, blocks)."""
        value = self.value(by_name, *names)
        if value is None:
            return None
        if value < 0:
            self.bad_values += 1
            return None
        return int(value)

    def ratio(self, by_name: dict[str, list[Sample]], *names: str) -> float | None:
        """A 0-1 ratio; negative means 'not applicable' (V0 reports -1 when prefix caching is off)."""
        value = self.value(by_name, *names)
        return None if value is None or value < 0 else value

    @staticmethod
    def label(by_name: dict[str, list[Sample]], key: str) -> str | None:
        for group in by_name.values():
            for s in group:
                value = s.labels.get(key)
                if value:
                    return value
        return None

    @staticmethod
    def info_labels(by_name: dict[str, list[Sample]], name: str) -> dict[str, str]:
        group = by_name.get(name)
        if not group:
            return {}
        # Several series only when the config changed in a multiprocess registry; the value-1 one is live.
        live = [s for s in group if s.value == 1.0] or group
        return dict(live[-1].labels)

    def label_number(self, labels: dict[str, str], key: str, kind: type[int] | type[float]) -> Any:
        """A number an engine wrote into a label with str(); 'None' means unset."""
        text = labels.get(key)
        if text is None or text in ("None", ""):
            return None
        try:
            number = float(text)
        except ValueError:
            self.bad_values += 1
            return None
        if not finite(number) or number < 0:
            self.bad_values += 1
            return None
        return number if kind is float else int(number)
