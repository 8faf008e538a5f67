"""Export: the only module that builds Prometheus metric families.

``KvwatchCollector.collect`` runs on every scrape of kvwatch's /metrics: it takes one
``Fleet.snapshot()`` (a consistent, frozen view), derives what the engine did not print (used tokens,
headroom, gap to the prediction) and yields one family per entry of ``kvwatch.export.names.METRICS``.
Nothing here mutates state; predictions are cached per (instance, epoch, settings) by ``Predictor``
so a scrape costs a dictionary look-up; the sidecar's (``prepared=True``) only looks up what its
consumer made, never reads a config.json, and shows no prediction rows for one not made yet.
"""

from __future__ import annotations

import logging
import math
import platform
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.exposition import generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import (
    Metric,
)
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from kvwatch import __version__
from kvwatch.analysis.attribution import gap_ratio
from kvwatch.analysis.predictor import PredictionResult, Predictor
from kvwatch.core.events import Origin
from kvwatch.core.labels import ConcurrencyBasis, MemoryBasis, MemoryTerm
from kvwatch.export import names
from kvwatch.export.exposition import Groups as _Groups
from kvwatch.export.exposition import Rows as _Rows
from kvwatch.export.exposition import escape as _escape
from kvwatch.export.exposition import series_prefix as _series_prefix
from kvwatch.export.figures import observed_terms, pool_figures, predicted_terms, usage_figures
from kvwatch.state.facts import MemoryFacts, PoolFacts, SettingsFacts, UsageFacts
from kvwatch.state.fleet import DISAGREEMENT_FACTS, InstanceSnapshot
from kvwatch.state.usage_values import BAD_VALUE_FACTS

log = logging.getLogger(__name__)
_NOT_MADE = PredictionResult(state="ok")  # no prediction's figures (its state is never exported)

# Longest label value kvwatch exports (model paths can be long; labels must stay small).
_MAX_LABEL = 128


@dataclass(frozen=True)
class SourceStatus:
    """Self-metrics of one configured source (a log or a /metrics URL), read at scrape time."""

    name: str
    kind: Origin  # the origin of the events the source feeds: a log or a /metrics URL
    up: bool
    lines_read: int = 0
    lines_matched: int = 0
    parse_errors: int = 0
    lines_truncated: int = 0
    rotations: int = 0
    read_errors: int = 0
    scrape_duration_seconds: float | None = None
    scrape_errors: Mapping[str, int] = field(default_factory=dict)
    series_dropped: int = 0
    unusable_values: int = 0
    # '--log -' only: lines read from stdin and not yet parsed.
    stdin_backlog: int | None = None


def _number(value: float | None) -> float | None:
    """A state value as a sample value, or None: unset, NaN, infinite, or an int past any float
    (the state bounds every fact, kvwatch.core.events.PLAUSIBLE; this is the second guard, so a
    value that slipped past them is one missing sample, never a failed scrape)."""
    if type(value) is float:  # most values: no conversion to try
        return value if math.isfinite(value) else None
    if value is None:
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError, TypeError):
        _unexported.add(1)
        return None
    return number if math.isfinite(number) else None


class _Tally:
    """A thread-safe running count (scrapes render on several threads)."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


# State values the collector could not turn into a sample (kvwatch_values_unexported_total).
_unexported = _Tally()


def _label(value: str | float | None) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)[:_MAX_LABEL]


@dataclass(frozen=True)
class _Cached:
    """The rows of one instance as of one (epoch, events), split by how often they change."""

    version: _Version | None  # None: rows being built, or made before the prediction (see below)
    static_key: _StaticKey | None  # None: made without a prediction (rebuilt at the next scrape)
    static: _Groups
    dynamic: _Groups
    # The counters and staleness flags of the instance (rows that rarely change) and what they show.
    counts_key: _CountsKey | None
    counts: _Groups
    labels: tuple[str, ...]
    escaped: tuple[str, ...]
    pool_tokens: int | None
    max_len: int | None
    # The dynamic rows' series, by (metric name, extra label values): their label values and
    # series_prefix, kept while the static key holds, so a new value costs no template formatting.
    series: dict[tuple[str, tuple[str, ...]], tuple[tuple[str, ...], str]]


# What the counts rows of an instance show: its disagreements, refused values, stale facts.
_CountsKey = tuple[Mapping[str, int], Mapping[str, int], Mapping[tuple[str, str], bool]]
# What the static rows of an instance depend on: epoch, its start, model label, the startup facts.
_StaticKey = tuple[
    int,
    float,
    str,
    SettingsFacts,
    MemoryFacts,
    tuple[tuple[str, PoolFacts], ...],
    tuple[tuple[str, int], ...],
]
# One state of an instance: epoch, events applied, which watched facts are stale, which pools are
# exported (a pool only /metrics reported leaves when /metrics goes silent, without an event), and
# the usage facts exported (one no origin delivered within the fact TTL leaves without an event,
# watched or not: Fleet.snapshot).
_Version = tuple[int, int, tuple[tuple[tuple[str, str], bool], ...], tuple[str, ...], UsageFacts]


def _version(snap: InstanceSnapshot) -> _Version:
    return (snap.epoch, snap.events, tuple(snap.stale.items()), tuple(snap.pools), snap.usage)


@dataclass(frozen=True)
class SelfStats:
    """Counters of the sidecar itself that no source owns (its HTTP server, auth, state file)."""

    http_connections_open: int = 0
    http_connections_refused: int = 0
    http_connection_timeouts: int = 0
    http_auth_throttled: int = 0
    state_files_invalid: int = 0
    state_save_errors: int = 0


@dataclass(frozen=True)
class NodeStats:
    """Node mode's containers by state, and those left out past the cap."""

    containers: Mapping[str, int]
    dropped: int


class KvwatchCollector(Collector):
    """Yields every kvwatch metric family from a fleet snapshot and the sources' self-metrics."""

    def __init__(
        self,
        snapshot: Callable[[], Sequence[InstanceSnapshot]],
        predictor: Predictor,
        sources: Callable[[], Iterable[SourceStatus]] = tuple,
        dropped_events: Callable[[], int] = lambda: 0,
        self_stats: Callable[[], SelfStats] = SelfStats,
        runtime: bool = False,
        workload: Callable[[str], tuple[str, ...] | None] = lambda source: None,
        node_stats: Callable[[], NodeStats | None] = lambda: None,
        prepared: bool = False,
    ) -> None:
        self._snapshot = snapshot
        self._prepared = prepared  # the sidecar: only predictions made off the scrape path
        # Node mode: a source's engine pod (names.WORKLOAD_LABELS values), None for a plain source.
        self._workload = workload
        self._node_stats = node_stats
        # The sidecar's own process_* and python_* series (CPU, memory, fds, GC, version).
        self._runtime: CollectorRegistry | None = None
        if runtime:
            self._runtime = CollectorRegistry(auto_describe=False)
            ProcessCollector(registry=self._runtime)
            PlatformCollector(registry=self._runtime)
            GCCollector(registry=self._runtime)
        self._predictor = predictor
        self._sources = sources
        self._dropped = dropped_events
        self._self_stats = self_stats
        self._cache: dict[tuple[str, str], _Cached] = {}
        self._cache_lock = threading.Lock()
        self._source_series: dict[tuple[str, tuple[str, ...]], str] = {}

    def describe(self) -> Iterable[Metric]:
        """The families without samples, so registering does not take a snapshot."""
        return list(_Rows().families())

    def collect(self) -> Iterator[Metric]:
        """One scrape through the registry: every family, from one snapshot."""
        yield from self._gather().families()
        if self._runtime is not None:
            yield from self._runtime.collect()

    def render(self) -> bytes:
        """One scrape as text format 0.0.4, without the registry's per-sample formatting cost."""
        text = self._gather().text()
        if self._runtime is not None:
            text += generate_latest(self._runtime)
        return text

    def _gather(self) -> _Rows:
        rows = _Rows()
        snaps = self._snapshot()
        seen: dict[tuple[str, str], _Cached] = {}
        for snap in snaps:
            key = (snap.source, snap.instance)
            cached = self._cache.get(key)
            # Every applied event bumps `events`, so (epoch, events) names one state of an instance;
            # a fact going stale changes what is exported without an event, so it is part of it.
            if cached is None or cached.version != _version(snap):
                try:
                    cached = self._instance(snap, cached)
                except (ArithmeticError, ValueError):
                    # A state value no arithmetic can use (past the bounds): this instance's rows
                    # are left out of this scrape, counted; the others and the scrape go on.
                    log.warning("instance left out of /metrics: a value cannot be exported source=%s", key[0])
                    _unexported.add(1)
                    continue
            seen[key] = cached
            rows.extend(cached.static)
            rows.extend(cached.dynamic)
            rows.extend(cached.counts)
        with self._cache_lock:
            self._cache = seen
        self._self_metrics(rows, len(snaps))
        return rows

    def _instance(self, snap: InstanceSnapshot, cached: _Cached | None) -> _Cached:
        """Rows of one instance; the slow-changing part is reused while its inputs are unchanged."""
        settings = snap.settings
        model = _label(settings.served_model_name or settings.model)
        # The fact groups are frozen and compare by their facts (not by when they were updated).
        static_key: _StaticKey = (
            snap.epoch,
            snap.epoch_started,
            model,
            settings,
            snap.memory,
            tuple(sorted(snap.pools.items())),
            tuple(sorted(snap.startup_failures.items())),
        )
        if cached is None or cached.static_key != static_key:
            pred = self._predictor.prepared(snap) if self._prepared else self._predictor.predict(snap)
            static = _Rows()
            derived = self._static(static, snap, model, pred)
            made = static_key if pred is not None else None
            cached = _Cached(None, made, static.groups(), (), None, (), *derived, {})
        dynamic = _Rows()
        self._dynamic(dynamic, snap, cached)
        counts_key: _CountsKey = (snap.disagreements, snap.bad_values, snap.stale)
        counts = cached.counts
        if counts_key != cached.counts_key:
            counts_rows = _Rows()
            self._counts(counts_rows, snap, cached)
            counts = counts_rows.groups()
        return _Cached(
            _version(snap) if cached.static_key is not None else None,
            cached.static_key,
            cached.static,
            dynamic.groups(),
            counts_key,
            counts,
            cached.labels,
            cached.escaped,
            cached.pool_tokens,
            cached.max_len,
            cached.series,
        )

    def _static(
        self, fam: _Rows, snap: InstanceSnapshot, model: str, pred: PredictionResult | None
    ) -> tuple[tuple[str, ...], tuple[str, ...], int | None, int | None]:
        """Pool, prediction, memory budget, engine info: what changes only with a startup fact
        (``pred`` None: no prediction made yet, so no prediction rows)."""
        settings, pool = snap.settings, snap.pool
        lab: tuple[str, ...] = (snap.source, snap.engine, model, snap.instance)
        pod = self._workload(snap.source)
        if pod is not None:
            lab = (*lab, *(_label(v) for v in pod))
        # Escaped once per instance; the extra label values below are fixed words that need none.
        esc = tuple(_escape(v) for v in lab)

        def gauge(metric: names.Metric, value: float | None, *extra: str) -> None:
            if value is None:
                return  # most unset facts: no guard to run
            number = _number(value)
            if number is not None:
                fam.add(metric, (*lab, *extra), number, (*esc, *extra))

        fig = pool_figures(snap, pred)
        block_size, pool_tokens, blocks, in_blocks = fig.block_size, fig.tokens, fig.blocks, fig.in_blocks
        gauge(names.KV_POOL_TOKENS, pool_tokens)
        gauge(names.KV_POOL_BLOCKS, blocks)
        gauge(names.KV_POOL_BYTES, pool.bytes)
        gauge(names.KV_BLOCK_SIZE, block_size)
        gauge(names.KV_POOL_PADDING_WASTE_RATIO, pool.padding_waste_ratio)

        if pred is not None:
            for state in names.PREDICTION_STATES:
                gauge(names.PREDICTION_AVAILABLE, 1.0 if state == pred.state else 0.0, state)
        made = pred if pred is not None else _NOT_MADE
        for basis in names.PREDICTION_BASES:
            predicted = made.tokens.get(basis)
            gauge(names.KV_POOL_PREDICTED_TOKENS, predicted, basis)
            gauge(names.KV_POOL_PREDICTED_BYTES, made.bytes.get(basis), basis)
            predicted_blocks = made.blocks.get(basis)
            if in_blocks and predicted_blocks is not None:
                gauge(names.KV_POOL_GAP_RATIO, gap_ratio(blocks, predicted_blocks), basis)
            else:
                gauge(names.KV_POOL_GAP_RATIO, gap_ratio(pool_tokens, predicted), basis)
            gauge(names.KV_POOL_PREDICTION_ERROR_RATIO, made.error_ratio.get(basis), basis)
        bpt = made.bytes_per_token
        if bpt is None and pool_tokens and pool.bytes:
            bpt = pool.bytes // pool_tokens
        gauge(names.KV_BYTES_PER_TOKEN, bpt)

        max_len = fig.max_len
        observed_conc = pool.max_concurrency
        if observed_conc is None and pool_tokens is not None and max_len:
            observed_conc = pool_tokens / max_len
        concurrency: dict[ConcurrencyBasis, float | None] = {
            "observed": observed_conc,
            **made.max_concurrency,
        }
        for concurrency_basis in names.CONCURRENCY_BASES:
            gauge(names.MAX_CONCURRENCY, concurrency.get(concurrency_basis), concurrency_basis)

        terms: dict[MemoryBasis, tuple[tuple[MemoryTerm, int | None], ...]] = {
            "observed": observed_terms(snap.memory),
            "predicted": predicted_terms(pred),
        }
        for memory_basis in names.MEMORY_BASES:
            for term, value in terms[memory_basis]:
                gauge(names.MEMORY_BYTES, value, term, memory_basis)

        utilisation = settings.gpu_memory_utilization
        if utilisation is None:
            utilisation = settings.mem_fraction_static
        info = {
            "version": _label(settings.version),
            "tp": _label(settings.tensor_parallel_size),
            "pp": _label(settings.pipeline_parallel_size),
            "dp": _label(settings.data_parallel_size),
            "kv_cache_dtype": _label(settings.kv_cache_dtype),
            "block_size": _label(block_size),
            "max_model_len": _label(max_len),
            "gpu_memory_utilization": _label(utilisation),
        }
        values = tuple(info[k] for k in names.ENGINE_INFO_LABELS)
        fam.add(names.ENGINE_INFO, (*lab, *values), 1.0, (*esc, *(_escape(v) for v in values)))
        gauge(names.EPOCH_START, snap.epoch_started)
        gauge(names.RESTARTS, snap.restarts)
        for reason in names.FAILURE_REASONS:
            gauge(names.STARTUP_FAILURES, snap.startup_failures.get(reason, 0), reason)
        return lab, esc, pool_tokens, fig.request_len

    @staticmethod
    def _dynamic(fam: _Rows, snap: InstanceSnapshot, cached: _Cached) -> None:
        """Usage, headroom, queue, preemptions: what every stats line moves."""
        usage, gauge = snap.usage, _series_gauge(fam, cached)
        fig = usage_figures(usage, cached.pool_tokens, cached.max_len)
        gauge(names.KV_USAGE_RATIO, fig.ratio)
        gauge(names.KV_USED_TOKENS, fig.used)
        gauge(names.KV_HEADROOM_TOKENS, fig.headroom_tokens)
        gauge(names.KV_HEADROOM_REQUESTS, fig.headroom_requests)
        gauge(names.PREFIX_CACHE_HIT_RATIO, usage.prefix_cache_hit_ratio)
        gauge(names.REQUESTS_RUNNING, usage.running)
        gauge(names.REQUESTS_WAITING, usage.waiting)
        gauge(names.PREEMPTIONS, snap.preemptions_total)
        for origin, ts in sorted(snap.last_update.items()):
            gauge(names.LAST_UPDATE, ts, origin)

    @staticmethod
    def _counts(fam: _Rows, snap: InstanceSnapshot, cached: _Cached) -> None:
        """Disagreements, refused values, stale facts: rows a stats line rarely moves (reused while
        their three mappings are equal, cached.counts_key)."""
        gauge = _series_gauge(fam, cached)
        # Counters exist from the start at 0, so increase() sees the first one.
        for fact in DISAGREEMENT_FACTS:
            gauge(names.DISAGREEMENTS, snap.disagreements.get(fact, 0), fact)
        for fact, count in sorted(snap.disagreements.items()):
            if fact not in DISAGREEMENT_FACTS:
                gauge(names.DISAGREEMENTS, count, fact)
        for fact in BAD_VALUE_FACTS:
            gauge(names.BAD_VALUES, snap.bad_values.get(fact, 0), fact)
        # The startup facts' refusals (rare: a broken or hostile line) only once there is one.
        for fact, count in sorted(snap.bad_values.items()):
            if fact not in BAD_VALUE_FACTS:
                gauge(names.BAD_VALUES, count, fact)
        for (origin, fact), stale in snap.stale.items():
            gauge(names.FACTS_STALE, 1.0 if stale else 0.0, origin, fact)

    def _self_metrics(self, fam: _Rows, instances: int) -> None:
        # Each source's series prefixes, kept from the last render (sources come and go in node mode:
        # only this render's are kept for the next).
        kept, seen = self._source_series, {}

        def add(metric: names.Metric, lab: tuple[str, ...], value: float) -> None:
            key = (metric.name, lab)
            prefix = kept.get(key)
            if prefix is None:
                prefix = _series_prefix(metric, [_escape(v) for v in lab])
            seen[key] = prefix
            fam.add_series(metric.name, lab, prefix, value)

        merged: dict[str, list[SourceStatus]] = {}
        for status in self._sources():
            merged.setdefault(status.name, []).append(status)
        for name, parts in sorted(merged.items()):
            lab = (name,)
            logs = [p for p in parts if p.kind == "log"]
            scrapes = [p for p in parts if p.kind == "metrics"]
            # A log and a URL may share a name (same engine): up only when both are.
            add(names.SOURCE_UP, lab, float(1.0 if all(p.up for p in parts) else 0.0))
            if logs:
                add(names.LINES_READ, lab, float(sum(p.lines_read for p in logs)))
                add(names.LINES_MATCHED, lab, float(sum(p.lines_matched for p in logs)))
                add(names.PARSE_ERRORS, lab, float(sum(p.parse_errors for p in logs)))
                add(names.LINES_TRUNCATED, lab, float(sum(p.lines_truncated for p in logs)))
                add(names.LOG_ROTATIONS, lab, float(sum(p.rotations for p in logs)))
                add(names.LOG_READ_ERRORS, lab, float(sum(p.read_errors for p in logs)))
                backlog = [p.stdin_backlog for p in logs if p.stdin_backlog is not None]
                if backlog:
                    add(names.STDIN_BACKLOG, lab, float(sum(backlog)))
            for part in scrapes:
                if part.scrape_duration_seconds is not None:
                    add(names.SCRAPE_DURATION, lab, float(part.scrape_duration_seconds))
                for reason in names.SCRAPE_ERROR_REASONS:
                    add(names.SCRAPE_ERRORS, (name, reason), float(part.scrape_errors.get(reason, 0)))
                add(names.SERIES_DROPPED, lab, float(part.series_dropped))
                add(names.UNUSABLE_VALUES, lab, float(part.unusable_values))
        self._source_series = seen
        fam.add(names.INSTANCES, (), float(instances))
        fam.add(names.INSTANCES_DROPPED, (), float(self._dropped()))
        fam.add(names.VALUES_UNEXPORTED, (), float(_unexported.value))
        stats = self._self_stats()
        fam.add(names.HTTP_CONNECTIONS_OPEN, (), float(stats.http_connections_open))
        fam.add(names.HTTP_CONNECTIONS_REFUSED, (), float(stats.http_connections_refused))
        fam.add(names.HTTP_CONNECTION_TIMEOUTS, (), float(stats.http_connection_timeouts))
        fam.add(names.HTTP_AUTH_THROTTLED, (), float(stats.http_auth_throttled))
        fam.add(names.STATE_FILE_INVALID, (), float(stats.state_files_invalid))
        fam.add(names.STATE_SAVE_ERRORS, (), float(stats.state_save_errors))
        node = self._node_stats()
        if node is not None:
            for state in names.NODE_CONTAINER_STATES:
                fam.add(names.NODE_CONTAINERS, (state,), float(node.containers.get(state, 0)))
            fam.add(names.NODE_CONTAINERS_DROPPED, (), float(node.dropped))
        fam.add(names.BUILD_INFO, (__version__, platform.python_version()), 1.0)


class _Gauge(Protocol):
    def __call__(self, metric: names.Metric, value: float | None, *extra: str) -> None: ...


def _series_gauge(fam: _Rows, cached: _Cached) -> _Gauge:
    """``gauge(metric, value, *extra)`` adding one row of the instance to ``fam``, with the series'
    label values and prefix from ``cached.series`` (formatted once per series while the labels hold)."""
    lab, esc, series, add = cached.labels, cached.escaped, cached.series, fam.add_series

    def gauge(metric: names.Metric, value: float | None, *extra: str) -> None:
        if value is None:
            return  # most unset facts: no guard to run
        number = _number(value)
        if number is None:
            return
        key = (metric.name, extra)
        known = series.get(key)
        if known is None:
            # Concurrent renders may both add it: the same value, so either is right.
            known = series[key] = ((*lab, *extra), _series_prefix(metric, (*esc, *extra)))
        add(metric.name, known[0], known[1], number)

    return gauge
