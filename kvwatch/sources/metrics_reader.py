"""An engine's /metrics exposition text -> the same events the log parsers emit (origin="metrics").

vLLM and SGLang renamed their metrics across releases, hide the pool size in label strings
(``vllm:cache_config_info{num_gpu_blocks="27153",...} 1``) and repeat one pool once per TP rank.
``MetricsReader`` hides all of that: it parses the text with prometheus_client's parser, lets the
engine's ``MetricsDialect`` (kvwatch/engines/*/metrics.py) map every known name variant onto one
event field, keeps one fact per engine instance (the lowest TP/PP rank of an instance speaks for
it) and remembers the previous counter values so an engine restart becomes a ``CounterReset``
instead of a negative rate.

The reader is pure apart from that memory: no I/O, clock or logging. Values it cannot use (NaN,
negative counts, unreadable label strings) are skipped and counted in ``bad_values``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from kvwatch.core.errors import ConfigError
from kvwatch.core.events import (
    CounterReset,
    EngineSettings,
    Event,
    PoolSized,
    Preemption,
    UsageSample,
)
from kvwatch.core.kinds import ENGINE_CHOICES, EngineChoice, EngineName
from kvwatch.engines import registry
from kvwatch.engines.base import MetricsDialect
from kvwatch.parsers.base import ParseError
from kvwatch.parsers.prom_stream import MAX_KEPT_SERIES, Dialect, ExpositionStream, key_labels
from kvwatch.parsers.samples import Sample, SampleReader, finite

_EventClass = type[EngineSettings] | type[PoolSized] | type[UsageSample] | type[Preemption]

# Labels that say who exported a series, not what it measures, in any engine: they pick the instance
# and rank and are left out of the key that tells two series of one metric apart.
_IDENTITY_LABELS = frozenset().union(*(e.metrics.identity_labels for e in registry.ENGINES.values()))
_READ_CHUNK = 1 << 20
# Counter values and per-series figures remembered between reads, at most (see _bound_memory).
_REMEMBERED = 4 * MAX_KEPT_SERIES


def _wanted(dialect: MetricsDialect) -> frozenset[str]:
    """The series names (prefix stripped) kept of a body: what ``facts`` reads, the ``_created`` of
    its counters (a restart whose counters grew past the old values) and the cumulative gauges."""
    created = {f"{name[: -len('_total')]}_created" for name in dialect.families if name.endswith("_total")}
    return dialect.families | created | dialect.cumulative_gauges


def _instance_order(instance: str) -> tuple[int, int, str]:
    """Numeric instances in numeric order ('2' before '10'), others after."""
    return (0, int(instance), "") if instance.isascii() and instance.isdigit() else (1, 0, instance)


class MetricsReader(SampleReader):
    """Turns successive /metrics texts of one engine into events; keeps counters between calls."""

    def __init__(self, engine: EngineChoice = "auto") -> None:
        super().__init__()
        if engine not in ENGINE_CHOICES:
            raise ConfigError(f"metrics engine must be one of {', '.join(ENGINE_CHOICES)}, not {engine!r}")
        # None until the first text that names a known engine (engine='auto').
        self.engine: EngineName | None = None if engine == "auto" else engine
        # (instance, exposed name, series key) -> last value, for counters, `_created` and cumulative gauges.
        self._counters: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
        # Series of the families read that were over MAX_KEPT_SERIES in a body, left out.
        self.dropped_series = 0
        # The last body's counters of families kvwatch does not read (ExpositionStream.other_counters).
        self._other: dict[EngineName, dict[str, float]] = {}

    # --- parsing -----------------------------------------------------------------------------------

    def stream(self) -> MetricsRead:
        """Start reading one /metrics body that arrives in pieces (the scraper feeds it as it reads)."""
        engines = registry.ENGINES if self.engine is None else {self.engine: registry.get(self.engine)}
        dialects: dict[str, Dialect] = {
            name: Dialect(e.metrics.prefix, _wanted(e.metrics), _IDENTITY_LABELS, e.metrics.identity)
            for name, e in engines.items()
        }
        return MetricsRead(self, ExpositionStream(dialects))

    def read(self, text: str) -> tuple[Event, ...]:
        """Events for one scrape, ordered per instance: reset, settings, pools, usage, preemption.

        Raises ParseError when the text is not Prometheus exposition format.
        """
        body = self.stream()
        for start in range(0, len(text), _READ_CHUNK):
            body.feed(text[start : start + _READ_CHUNK])
        return body.finish()

    def _events(self, stream: ExpositionStream) -> tuple[Event, ...]:
        stream.close()
        if stream.error is not None:
            raise ParseError(f"not Prometheus exposition text: {stream.error}")
        self.dropped_series += stream.dropped
        engine = self._detect(stream.prefix_counts)
        if engine is None:
            return ()
        samples = stream.kept[engine]
        by_instance: dict[str, list[Sample]] = {}
        for sample in samples:
            by_instance.setdefault(sample.instance, []).append(sample)
        # vLLM's front end sums num_gpu_blocks over the DP engines it serves and repeats the sum in
        # every engine's cache_config_info (v1/engine/utils.py, 0.11): per instance only with one engine.
        dialect = registry.ENGINES[engine].metrics  # looked up once per body, carried to each instance
        summed = dialect.sums_pool_across_instances(samples)
        other = self._other_resets(engine, dialect, stream.other_counters[engine])
        events: list[Event] = []
        for instance in sorted(by_instance, key=_instance_order):
            chosen = self._one_rank(by_instance[instance])
            events.extend(
                self._instance_events(engine, dialect, instance, chosen, summed, other.get(instance))
            )
        self._bound_memory(samples)
        return tuple(events)

    def _bound_memory(self, samples: list[Sample]) -> None:
        """Series that come and go (label churn) must not grow what is remembered without end: past
        the bound, only the series of this body are kept."""
        if len(self._counters) > _REMEMBERED:
            now = {(s.instance, s.exposed, s.series) for s in samples}
            self._counters = {k: v for k, v in self._counters.items() if k in now}
        if len(self.remembered) > _REMEMBERED:
            self.remembered.clear()

    def _other_resets(
        self, engine: EngineName, dialect: MetricsDialect, current: dict[str, float]
    ) -> dict[str, CounterReset]:
        """Per instance, the first counter kvwatch does not read that went back since the last body."""
        previous, self._other = self._other.get(engine, {}), {engine: current}
        out: dict[str, CounterReset] = {}
        for key in sorted(current.keys() & previous.keys()):
            value, before = current[key], previous[key]
            name = key.split("{", 1)[0]
            if not (finite(value) and finite(before)):
                continue
            if value != before if name.endswith("_created") else value < before:
                try:
                    instance = dialect.identity(key_labels(key))[0]
                except ValueError:
                    continue
                if instance not in out:
                    out[instance] = CounterReset(
                        engine=engine,
                        instance=instance,
                        origin="metrics",
                        metric=name,
                        previous=before,
                        current=value,
                    )
        return out

    def _detect(self, counts: dict[str, int]) -> EngineName | None:
        if self.engine is not None:
            return self.engine
        best = max(registry.ENGINES, key=lambda e: counts.get(e, 0))
        if counts.get(best, 0) == 0:
            return None
        self.engine = best
        return best

    @staticmethod
    def _one_rank(samples: list[Sample]) -> dict[str, list[Sample]]:
        """Samples by name, keeping only the lowest rank of the instance (TP ranks repeat one pool)."""
        ranks = [s.rank for s in samples if s.rank is not None]
        lowest = min(ranks) if ranks else None
        out: dict[str, list[Sample]] = {}
        for s in samples:
            if s.rank is None or s.rank == lowest:
                out.setdefault(s.name, []).append(s)
        for group in out.values():
            group.sort(key=lambda s: s.series)
        return out

    # --- per instance ------------------------------------------------------------------------------

    def _instance_events(
        self,
        engine: EngineName,
        dialect: MetricsDialect,
        instance: str,
        by_name: dict[str, list[Sample]],
        summed_blocks: bool,
        other_reset: CounterReset | None,
    ) -> list[Event]:
        events: list[Event] = []
        reset = self._check_counters(engine, dialect, instance, by_name, other_reset)
        if reset is not None:
            events.append(reset)
        ident: dict[str, Any] = {"engine": engine, "instance": instance, "origin": "metrics"}
        rank = next((s.rank[0] for group in by_name.values() for s in group if s.rank is not None), None)
        if rank is not None:
            ident["rank"] = rank
        facts = dialect.facts(self, instance, by_name, reset is not None, summed_blocks)
        settings, pools, usage, preemption = facts.settings, facts.pools, facts.usage, facts.preemption
        model = self.label(by_name, "model_name")
        if model is not None:
            settings["served_model_name"] = model
        if settings:
            self._build(events, EngineSettings, ident, settings)
        for pool, pool_facts in pools.items():
            if pool_facts:
                self._build(events, PoolSized, ident, {"pool": pool, **pool_facts})
        if usage:
            self._build(events, UsageSample, ident, usage)
        if preemption:
            self._build(events, Preemption, ident, preemption)
        return events

    def _build(
        self, out: list[Event], cls: _EventClass, ident: dict[str, Any], facts: dict[str, Any]
    ) -> None:
        try:
            out.append(cls(**ident, **facts))
        except ValidationError:
            self.bad_values += 1

    def _check_counters(
        self,
        engine: EngineName,
        dialect: MetricsDialect,
        instance: str,
        by_name: dict[str, list[Sample]],
        other_reset: CounterReset | None,
    ) -> CounterReset | None:
        """Compare this read's counters with the last; the first that went back is the reset (one of
        the counters kvwatch does not read, ``other_reset``, when none of those it reads did)."""
        current: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
        totals = {name for name, group in by_name.items() if any(s.counter for s in group)}
        cumulative_gauges = dialect.cumulative_gauges
        for name, group in by_name.items():
            created = name.endswith("_created") and f"{name[: -len('_created')]}_total" in totals
            cumulative = name in cumulative_gauges
            for s in group:
                if (s.counter or created or cumulative) and finite(s.value):
                    current[(instance, s.exposed, s.series)] = s.value
        reset: CounterReset | None = None
        for key, value in sorted(current.items()):
            previous = self._counters.get(key)
            if previous is None or reset is not None:
                continue
            went_back = value != previous if key[1].endswith("_created") else value < previous
            if went_back:
                reset = CounterReset(
                    engine=engine,
                    instance=instance,
                    origin="metrics",
                    metric=key[1],
                    previous=previous,
                    current=value,
                )
        reset = reset if reset is not None else other_reset
        if reset is not None:
            # A new engine process: every remembered figure of this instance belongs to the old one.
            for old in [k for k in self._counters if k[0] == instance]:
                del self._counters[old]
            self.forget(instance)
        self._counters.update(current)
        return reset


class MetricsRead:
    """One /metrics body in progress: ``feed`` its pieces as they arrive, then ``finish``.

    Only the scrape that started it may use it; the reader's memory changes at ``finish`` alone, so
    a body that fails half way (timeout, cap) leaves the reader as it was.
    """

    def __init__(self, reader: MetricsReader, stream: ExpositionStream) -> None:
        self._reader = reader
        self._stream = stream

    def feed(self, chunk: str) -> None:
        """The next piece of the body; never raises (a syntax error is kept for ``finish``)."""
        self._stream.feed(chunk)

    def finish(self) -> tuple[Event, ...]:
        """The body's events (as ``MetricsReader.read``); ParseError when it is not exposition text."""
        return self._reader._events(self._stream)
