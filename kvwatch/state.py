"""State: one record per engine instance (source x DP rank), fed by events, read at scrape time.

This is the only mutable object in the pipeline. ``Fleet.apply`` is called by a single consumer
(the sidecar's pipeline thread, or the replay loop of the offline commands); ``Fleet.snapshot``
may be called from any thread (the /metrics handler) and returns frozen copies.

Epochs: an engine prints its settings, memory budget and pool once per start. A new start in the
log (an event with ``starts_engine``) or a counter reset on /metrics opens a new epoch: the facts of
the old epoch are dropped (the pool is replaced, never summed), ``restarts`` goes up, and the
preemption counter keeps counting so it stays monotonic for Prometheus.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, get_args

from kvwatch.engines.kinds import EngineName
from kvwatch.events import (
    CounterReset,
    Disagreement,
    DisagreementFact,
    EngineSettings,
    Event,
    MemoryBudget,
    Origin,
    PoolKind,
    PoolSized,
    Preemption,
    StartupFailure,
    UsageSample,
)
from kvwatch.facts import (
    EMPTY_MEMORY,
    EMPTY_POOL,
    EMPTY_SETTINGS,
    EMPTY_USAGE,
    Failure,
    LastDisagreement,
    MemoryFacts,
    PoolFacts,
    SettingsFacts,
    UsageFacts,
    changes,
    disagreement_from_json,
    from_json,
    merged,
    updated,
)
from kvwatch.jsontypes import JsonObject, JsonValue

# Relative tolerance under which log and /metrics values are the same fact (rounding, 2 decimals).
_POOL_TOLERANCE = 0.0
_USAGE_TOLERANCE = 0.02
# Usage moves within seconds, so a log value and a scrape are compared only when both are this
# recent: three of vLLM's 10 s stats intervals. vLLM V1 stops logging stats when idle, and a
# stale log figure against every later scrape would count a disagreement per scrape.
_USAGE_PAIR_SECONDS = 30.0

DEFAULT_MAX_INSTANCES = 256

_POOL_KINDS: tuple[PoolKind, ...] = get_args(PoolKind)
_ORIGINS: tuple[Origin, ...] = get_args(Origin)


def _other(origin: Origin) -> Origin:
    return "metrics" if origin == "log" else "log"


def _plain(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else value


def _obj(value: JsonValue) -> Mapping[str, JsonValue]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def _pool_kind(name: str) -> PoolKind:
    for kind in _POOL_KINDS:
        if kind == name:
            return kind
    raise ValueError(f"unknown pool kind {name!r}")


def _origin(name: str) -> Origin:
    for origin in _ORIGINS:
        if origin == name:
            return origin
    raise ValueError(f"unknown origin {name!r}")


def _pools_by_origin_from_json(value: JsonValue) -> dict[tuple[Origin, PoolKind], PoolFacts]:
    out: dict[tuple[Origin, PoolKind], PoolFacts] = {}
    for key, facts in _obj(value).items():
        origin, _, kind = key.partition(":")
        out[(_origin(origin), _pool_kind(kind))] = from_json(PoolFacts, _obj(facts))
    return out


# State-file form per InstanceState field, where it is not the value itself. The form is the one
# kvwatch wrote when facts were dicts: fact groups as objects of their known facts, per-origin
# pools keyed 'origin:kind'.
_encoders: dict[str, Callable[[Any], JsonValue]] = {
    "settings": SettingsFacts.to_json,
    "memory": MemoryFacts.to_json,
    "usage": UsageFacts.to_json,
    "pools": lambda v: {k: p.to_json() for k, p in v.items()},
    "pools_by_origin": lambda v: {f"{o}:{k}": p.to_json() for (o, k), p in v.items()},
    "usage_by_origin": lambda v: {o: u.to_json() for o, u in v.items()},
    "last_failure": lambda v: None if v is None else v.to_json(),
    "last_disagreement": lambda v: None if v is None else v.to_json(),
}
_decoders: dict[str, Callable[[JsonValue], Any]] = {
    "settings": lambda v: from_json(SettingsFacts, _obj(v)),
    "memory": lambda v: from_json(MemoryFacts, _obj(v)),
    "usage": lambda v: from_json(UsageFacts, _obj(v)),
    "pools": lambda v: {_pool_kind(k): from_json(PoolFacts, _obj(p)) for k, p in _obj(v).items()},
    "pools_by_origin": _pools_by_origin_from_json,
    "usage_by_origin": lambda v: {_origin(o): from_json(UsageFacts, _obj(u)) for o, u in _obj(v).items()},
    "usage_seen": lambda v: {_origin(o): t for o, t in _obj(v).items()},
    "preemption_marks": lambda v: {_origin(o): n for o, n in _obj(v).items()},
    "preemption_epoch": lambda v: {_origin(o): n for o, n in _obj(v).items()},
    "last_failure": lambda v: None if v is None else from_json(Failure, _obj(v)),
    "last_disagreement": lambda v: None if v is None else disagreement_from_json(_obj(v)),
}


@dataclass
class InstanceState:
    """Everything kvwatch knows about one engine instance. Mutated only through Fleet.apply."""

    source: str
    engine: EngineName
    instance: str
    epoch: int = 1
    epoch_started: float = 0.0
    restarts: int = 0
    settings: SettingsFacts = EMPTY_SETTINGS
    memory: MemoryFacts = EMPTY_MEMORY
    # Pool kind -> merged PoolSized facts, and the same per origin.
    pools: dict[PoolKind, PoolFacts] = field(default_factory=dict)
    pools_by_origin: dict[tuple[Origin, PoolKind], PoolFacts] = field(default_factory=dict)
    usage: UsageFacts = EMPTY_USAGE
    usage_by_origin: dict[Origin, UsageFacts] = field(default_factory=dict)
    # When each origin last gave kv_usage_ratio (the state clock), for the log/metrics cross-check.
    usage_seen: dict[Origin, float] = field(default_factory=dict)
    preemptions_total: int = 0
    # Last cumulative total seen in this epoch, per origin (vLLM V0 warnings, /metrics counters).
    preemption_marks: dict[Origin, int] = field(default_factory=dict)
    # Preemptions counted in this epoch, per origin: the log and /metrics report the same evictions,
    # so preemptions_total follows the larger of the two, never their sum.
    preemption_epoch: dict[Origin, int] = field(default_factory=dict)
    retractions: bool = False
    startup_failures: dict[str, int] = field(default_factory=dict)
    last_failure: Failure | None = None
    disagreements: dict[str, int] = field(default_factory=dict)
    last_disagreement: LastDisagreement | None = None
    counter_resets: int = 0
    last_update: dict[str, float] = field(default_factory=dict)
    events: int = 0

    def has_epoch_facts(self, origin: Origin | None = None) -> bool:
        """True when this epoch already holds capacity facts a new start would replace.

        With ``origin``, only facts from that origin count: the log's banner and the counter reset
        /metrics shows for the same restart (in either order) open one epoch, not two.
        """
        if origin is None:
            return bool(
                self.pools
                or not self.memory.empty()
                or self.last_failure is not None
                or not self.usage.empty()
            )
        seen = (
            any(key[0] == origin for key in self.pools_by_origin)
            or origin in self.usage_by_origin
            or origin in self.preemption_marks
            or origin in self.preemption_epoch
        )
        if origin == "log":
            seen = seen or not self.memory.empty() or self.last_failure is not None
        return seen

    def new_epoch(self, now: float) -> None:
        """Drop the facts of one engine start; keep counters monotonic."""
        self.epoch += 1
        self.restarts += 1
        self.epoch_started = now
        self.settings = EMPTY_SETTINGS
        self.memory = EMPTY_MEMORY
        self.pools = {}
        self.pools_by_origin = {}
        self.usage = EMPTY_USAGE
        self.usage_by_origin = {}
        self.usage_seen = {}
        self.preemption_marks = {}
        self.preemption_epoch = {}
        self.last_failure = None

    def to_json(self) -> JsonObject:
        """The state file's form of this record (fact groups as their known facts)."""
        out: JsonObject = {}
        for f in fields(self):
            encode: Callable[[Any], JsonValue] = _encoders.get(f.name, _plain)
            out[f.name] = encode(getattr(self, f.name))
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, JsonValue]) -> InstanceState:
        """A record from its state-file form; unknown names are ignored (TypeError, ValueError,
        KeyError or AttributeError for a record this version cannot use)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in data:
                decode: Callable[[JsonValue], Any] = _decoders.get(f.name, _plain)
                values[f.name] = decode(data[f.name])
        return cls(**values)


@dataclass(frozen=True)
class InstanceSnapshot:
    """A read-only copy of one InstanceState, with source-level settings folded in.

    The fact groups are frozen and shared with the state, never copied.
    """

    source: str
    engine: EngineName
    instance: str
    epoch: int
    epoch_started: float
    restarts: int
    settings: SettingsFacts
    memory: MemoryFacts
    pools: Mapping[PoolKind, PoolFacts]
    usage: UsageFacts
    preemptions_total: int
    retractions: bool
    startup_failures: Mapping[str, int]
    last_failure: Failure | None
    disagreements: Mapping[str, int]
    last_disagreement: LastDisagreement | None
    counter_resets: int
    last_update: Mapping[str, float]
    events: int

    @property
    def pool(self) -> PoolFacts:
        """The full-attention pool (the one that bounds concurrency), empty when unknown."""
        return self.pools.get("full", EMPTY_POOL)


class Fleet:
    """All instances kvwatch tracks, keyed by (source, instance); capped to bound memory and labels."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        max_instances: int = DEFAULT_MAX_INSTANCES,
    ) -> None:
        self._clock = clock
        self._max = max_instances
        self._lock = threading.Lock()
        self._instances: dict[tuple[str, str], InstanceState] = {}
        # Settings printed by a process that is not an engine instance (API server) apply to all.
        self._source_settings: dict[str, SettingsFacts] = {}
        self.dropped_events = 0

    def apply(self, source: str, event: Event) -> None:
        """Fold one event into the state of its instance."""
        with self._lock:
            self._apply(source, event, self._clock())

    def apply_all(self, source: str, events: Iterable[Event]) -> None:
        """Fold several events in order under one lock, as of one moment (one clock reading)."""
        with self._lock:
            now = self._clock()
            for event in events:
                self._apply(source, event, now)

    def _get(self, source: str, event: Event) -> InstanceState | None:
        key = (source, event.instance)
        state = self._instances.get(key)
        if state is None:
            if len(self._instances) >= self._max:
                self.dropped_events += 1
                return None
            state = InstanceState(source=source, engine=event.engine, instance=event.instance)
            state.epoch_started = self._clock()
            self._instances[key] = state
        return state

    def _apply(self, source: str, event: Event, now: float) -> None:
        state = self._instances.get((source, event.instance)) or self._get(source, event)
        if state is None:
            return
        state.events += 1
        state.last_update[event.origin] = now
        # Usage first: a running engine's events are almost all periodic stats.
        if isinstance(event, UsageSample):
            origin = event.origin
            changed = changes(event, UsageFacts)
            before, own = state.usage, state.usage_by_origin.get(origin, EMPTY_USAGE)
            state.usage = updated(before, changed, now)
            # While one origin reports usage its group is the merged one: one merge, not two.
            state.usage_by_origin[origin] = state.usage if own is before else updated(own, changed, now)
            if event.kv_usage_ratio is not None:
                state.usage_seen[origin] = now
                # Only a sample the other origin has matched recently is compared (log-only: never).
                if state.usage_seen.get(_other(origin)) is not None:
                    self._cross_check_usage(state, event, now)
        elif isinstance(event, EngineSettings):
            if event.starts_engine and state.has_epoch_facts(event.origin):
                state.new_epoch(now)
            state.settings = merged(state.settings, event, now)
            self._source_settings[source] = merged(
                self._source_settings.get(source, EMPTY_SETTINGS), event, now
            )
        elif isinstance(event, MemoryBudget):
            state.memory = merged(state.memory, event, now)
        elif isinstance(event, PoolSized):
            self._apply_pool(state, event, now)
        elif isinstance(event, Preemption):
            self._apply_preemption(state, event)
        elif isinstance(event, StartupFailure):
            state.startup_failures[event.reason] = state.startup_failures.get(event.reason, 0) + 1
            state.last_failure = Failure.of(event, now)
        elif isinstance(event, CounterReset):
            state.counter_resets += 1
            # The log may already have opened this start's epoch (its banner precedes /metrics).
            if state.has_epoch_facts(event.origin):
                state.new_epoch(now)
        elif isinstance(event, Disagreement):
            self._record_disagreement(state, event.fact, event.log_value, event.metrics_value)

    def _apply_pool(self, state: InstanceState, event: PoolSized, now: float) -> None:
        state.pools[event.pool] = merged(state.pools.get(event.pool, EMPTY_POOL), event, now)
        key = (event.origin, event.pool)
        own = state.pools_by_origin[key] = merged(state.pools_by_origin.get(key, EMPTY_POOL), event, now)
        other = state.pools_by_origin.get((_other(event.origin), event.pool))
        if other is None or other.empty():
            return
        facts: tuple[tuple[int | None, int | None, DisagreementFact], ...] = (
            (own.tokens, other.tokens, "pool_tokens"),
            (own.blocks, other.blocks, "pool_blocks"),
            (own.block_size, other.block_size, "block_size"),
        )
        for mine, theirs, name in facts:
            if mine is None or theirs is None or mine == theirs:
                continue
            log_v, met_v = (mine, theirs) if event.origin == "log" else (theirs, mine)
            self._record_disagreement(state, name, float(log_v), float(met_v))

    def _cross_check_usage(self, state: InstanceState, event: UsageSample, now: float) -> None:
        if event.kv_usage_ratio is None:
            return
        state.usage_seen[event.origin] = now
        other_origin = _other(event.origin)
        seen = state.usage_seen.get(other_origin)
        if seen is None or now - seen > _USAGE_PAIR_SECONDS:
            return
        theirs = state.usage_by_origin.get(other_origin, EMPTY_USAGE).kv_usage_ratio
        if theirs is None or abs(float(theirs) - event.kv_usage_ratio) <= _USAGE_TOLERANCE:
            return
        # Usage moves between a log line and a scrape; only a fresh pair is comparable, so this is
        # recorded but not treated as a fault by itself (the pool facts above are the hard check).
        log_v, met_v = (
            (event.kv_usage_ratio, theirs) if event.origin == "log" else (theirs, event.kv_usage_ratio)
        )
        self._record_disagreement(state, "kv_usage_ratio", float(log_v), float(met_v))

    @staticmethod
    def _record_disagreement(
        state: InstanceState, fact: DisagreementFact, log_value: float, metrics_value: float
    ) -> None:
        state.disagreements[fact] = state.disagreements.get(fact, 0) + 1
        state.last_disagreement = LastDisagreement(fact, log_value, metrics_value)

    @staticmethod
    def _apply_preemption(state: InstanceState, event: Preemption) -> None:
        if event.mechanism == "retract":
            state.retractions = True
        if event.total is not None:
            mark = state.preemption_marks.get(event.origin)
            if mark is None:
                # First cumulative figure of this epoch: everything it counts happened in this epoch.
                delta = event.total
            elif event.total >= mark:
                delta = event.total - mark
            else:
                # Went backwards without a reset event: a new engine start we did not see.
                delta = event.total
            state.preemption_marks[event.origin] = event.total
        elif event.count is not None and event.count > 0:
            delta = event.count
        else:
            return
        before = max(state.preemption_epoch.values(), default=0)
        state.preemption_epoch[event.origin] = state.preemption_epoch.get(event.origin, 0) + delta
        state.preemptions_total += max(state.preemption_epoch.values()) - before

    def snapshot(self) -> list[InstanceSnapshot]:
        """Frozen copies of every instance, sorted by (source, instance)."""
        with self._lock:
            out = []
            for (source, _), st in sorted(self._instances.items()):
                settings = self._source_settings.get(source, EMPTY_SETTINGS).overlaid(st.settings)
                out.append(
                    InstanceSnapshot(
                        source=st.source,
                        engine=st.engine,
                        instance=st.instance,
                        epoch=st.epoch,
                        epoch_started=st.epoch_started,
                        restarts=st.restarts,
                        settings=settings,
                        memory=st.memory,
                        pools=dict(st.pools),
                        usage=st.usage,
                        preemptions_total=st.preemptions_total,
                        retractions=st.retractions,
                        startup_failures=dict(st.startup_failures),
                        last_failure=st.last_failure,
                        disagreements=dict(st.disagreements),
                        last_disagreement=st.last_disagreement,
                        counter_resets=st.counter_resets,
                        last_update=dict(st.last_update),
                        events=st.events,
                    )
                )
            return out

    def instances(self) -> list[InstanceState]:
        """The live records (for persistence by the single writer; do not mutate from elsewhere)."""
        with self._lock:
            return [replace(st) for st in self._instances.values()]

    def restore(self, states: Iterable[InstanceState], source_settings: Mapping[str, SettingsFacts]) -> None:
        """Load records saved by a previous kvwatch process (state file)."""
        with self._lock:
            for st in states:
                self._instances[(st.source, st.instance)] = st
            for source, settings in source_settings.items():
                self._source_settings[source] = self._source_settings.get(source, EMPTY_SETTINGS).overlaid(
                    settings
                )

    def source_settings(self) -> dict[str, SettingsFacts]:
        """Settings printed by a source's non-instance processes, for persistence."""
        with self._lock:
            return dict(self._source_settings)
