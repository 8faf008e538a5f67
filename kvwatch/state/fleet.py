"""State: one record per engine instance (source x DP rank), fed by events, read at scrape time.

This is the only mutable object in the pipeline. ``Fleet.apply`` may be called from several threads
(in the sidecar: tailers, HTTP workers and the consumer, see kvwatch/sidecar/__init__.py; offline:
the replay loop alone); the fleet's lock makes each call atomic, and the callers keep each source's
events in order. ``Fleet.snapshot`` may be called from any thread and returns frozen copies.

Epochs: an engine prints its settings, memory budget and pool once per start. A new start in the
log (an event with ``starts_engine``) or a counter reset on /metrics opens a new epoch: the facts of
the old epoch are dropped (the pool is replaced, never summed), ``restarts`` goes up, and the
preemption counter keeps counting so it stays monotonic for Prometheus.

Staleness follows the kind of fact (``CADENCE`` in kvwatch/state/facts.py). Periodic facts (usage)
that no origin delivered within the fact TTL are left out of snapshots. Startup facts hold for their
epoch while their source is alive: a pool the log printed stays (a log has no heartbeat: an idle
engine prints nothing, and a restart prints a new start, which opens a new epoch); a pool only
/metrics reported stays while /metrics keeps delivering anything for the instance (every scrape is
a heartbeat), and is left out once it delivered nothing for the TTL (the engine or its endpoint is
gone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, replace
from operator import itemgetter
from typing import get_args

from kvwatch.core.events import (
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
from kvwatch.state.facts import (
    EMPTY_POOL,
    EMPTY_SETTINGS,
    EMPTY_USAGE,
    Failure,
    LastDisagreement,
    PoolFacts,
    SettingsFacts,
    UsageFacts,
    changes,
    fact_names,
    merged,
    periodic_facts,
    updated,
    watched_facts,
    without,
)
from kvwatch.state.instance import InstanceSnapshot, InstanceState
from kvwatch.state.usage_values import BAD_VALUE_FACTS, fold_columns, implausible, is_refused, refused_facts

# Relative tolerance under which log and /metrics usage values are the same fact (rounding, 2 decimals).
_USAGE_TOLERANCE = 0.02
# Usage moves within seconds, so a log value and a scrape are compared only when both are this
# recent: three of vLLM's 10 s stats intervals. vLLM V1 stops logging stats when idle, and a
# stale log figure against every later scrape would count a disagreement per scrape.
_USAGE_PAIR_SECONDS = 30.0
# Counters stop here, the largest the state file holds (a signed 64-bit integer): a hostile log's
# millions of 'Preemptions: 2^40' lines must not make a state kvwatch itself cannot load again.
_MAX_COUNT = 2**63 - 1
_MAX_INSTANCE_CHARS = 256

DEFAULT_MAX_INSTANCES = 256

__all__ = ["DISAGREEMENT_FACTS", "STALE_FACTS", "Fleet", "InstanceSnapshot", "InstanceState"]

# Seconds after which a periodic fact that stopped arriving is stale: no longer in snapshots (so no
# longer exported) and, when watched, flagged in InstanceSnapshot.stale. vLLM logs stats every 10 s
# while busy, and the sidecar scrapes /metrics every 5 s, so a minute is six missed log intervals and
# twelve scrapes.
DEFAULT_FACT_TTL = 60.0

# The facts whose staleness is exported (kvwatch_source_facts_stale): the watched periodic facts of
# kvwatch/state/facts.py. Startup facts (pool, budget, settings) are never among them.
STALE_FACTS: tuple[str, ...] = watched_facts(UsageFacts)
# Facts the log and /metrics are cross-checked on (names of InstanceState.disagreements).
DISAGREEMENT_FACTS: tuple[str, ...] = ("pool_tokens", "pool_blocks", "block_size", "kv_usage_ratio")
if not set(BAD_VALUE_FACTS) <= {f.name for f in fields(UsageFacts)}:
    raise TypeError("state: a checked usage fact is not a UsageFacts field")
if set(DISAGREEMENT_FACTS) != set(get_args(DisagreementFact)):
    raise TypeError("state: DISAGREEMENT_FACTS does not match events.DisagreementFact")


# fact_seen's keys ('log:kv_usage_ratio'), made once rather than per fact of every stats line.
_SEEN_KEYS: dict[str, dict[str, str]] = {
    origin: {f.name: f"{origin}:{f.name}" for f in fields(UsageFacts)} for origin in get_args(Origin)
}


# The usage facts in field order, and a getter of their values from a UsageSample's __dict__.
_USAGE_FACTS = fact_names(UsageFacts)
# Only periodic facts are timed for staleness (fact_seen); the usage group is the periodic one.
if set(periodic_facts(UsageFacts)) != set(_USAGE_FACTS):
    raise TypeError("state: usage facts are timed for staleness but UsageFacts is not periodic")
_PERIODIC = frozenset(_USAGE_FACTS)
# fact_seen's keys of the periodic facts -> (origin, fact), the fact, whether its staleness is
# exported: split once, not at every snapshot.
_TIMED: dict[str, tuple[tuple[str, str], str, bool]] = {
    key: ((origin, fact), fact, fact in STALE_FACTS)
    for origin, keys in _SEEN_KEYS.items()
    for fact, key in keys.items()
    if fact in _PERIODIC
}
_USAGE_VALUES = itemgetter(*_USAGE_FACTS)
if any(UsageSample.model_fields[f].default is not None for f in _USAGE_FACTS):
    raise TypeError("state: a usage fact whose UsageSample default is not None (unset must read as None)")


def _other(origin: Origin) -> Origin:
    return "metrics" if origin == "log" else "log"


class Fleet:
    """All instances kvwatch tracks, keyed by (source, instance); capped to bound memory and labels."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        max_instances: int = DEFAULT_MAX_INSTANCES,
        fact_ttl: float = DEFAULT_FACT_TTL,
    ) -> None:
        self._clock = clock
        self._max = max_instances
        self.fact_ttl = fact_ttl
        self._lock = threading.Lock()
        self._instances: dict[tuple[str, str], InstanceState] = {}
        # Settings printed by a process that is not an engine instance (API server) apply to all.
        self._source_settings: dict[str, SettingsFacts] = {}
        self.dropped_events = 0
        # Bumped by every change a prediction may depend on (a new instance, any event but a usage
        # sample or a preemption, a restore, a forget): the sidecar's consumer prepares predictions when it
        # moved, so a scrape finds them made (kvwatch/sidecar/consumer.py).
        self.startup_changes = 0

    def apply(self, source: str, event: Event) -> None:
        """Fold one event into the state of its instance."""
        with self._lock:
            self._apply(source, event, self._clock())

    def apply_all(self, source: str, events: Iterable[Event]) -> None:
        """Fold several events in order under one lock, as of one moment (one clock reading).

        A busy log's block is mostly stats lines: their usage samples are merged per instance
        into one update (the same facts, counts and times as folding them one by one, since they
        share the moment), and preemption counts, which touch nothing a usage sample does, fold
        as they come. Any other event first applies the usage gathered so far, so order holds.
        """
        with self._lock:
            now = self._clock()
            pending: list[UsageSample] = []
            for event in events:
                if isinstance(event, UsageSample):
                    pending.append(event)
                    continue
                if pending and not isinstance(event, Preemption):
                    self._apply_usage(source, pending, now)
                    pending = []
                self._apply(source, event, now)
            if pending:
                self._apply_usage(source, pending, now)

    def _apply_usage(self, source: str, samples: list[UsageSample], now: float) -> None:
        """Usage samples of one moment: one merge per (instance, origin) where nothing compares
        them one by one (a log/metrics cross-check needs each sample), else each in turn."""
        if len(samples) == 1:
            self._apply(source, samples[0], now)
            return
        groups: dict[tuple[str, Origin], list[UsageSample]] = {}
        for sample in samples:
            groups.setdefault((sample.instance, sample.origin), []).append(sample)
        for (instance, origin), group in groups.items():
            state = self._instances.get((source, instance))
            if state is None or len(group) == 1 or state.usage_seen.get(_other(origin)) is not None:
                for sample in group:
                    self._apply(source, sample, now)
                continue
            state.events += len(group)
            state.last_update[origin] = now
            # Column by column: an unset usage field holds its default None (checked at import),
            # so a sample's values are its __dict__'s, None where it has none.
            columns = zip(*[_USAGE_VALUES(sample.__dict__) for sample in group], strict=True)
            changed, refused = fold_columns(_USAGE_FACTS, columns)
            for fact in sorted(refused):
                state.bad_values[fact] = state.bad_values.get(fact, 0) + refused[fact]
            self._fold_usage(state, origin, changed, now)

    def _get(self, source: str, event: Event) -> InstanceState | None:
        key = (source, event.instance)
        state = self._instances.get(key)
        if state is None:
            # (An instance name longer than a state file holds is no engine's: dropped, as past the cap.)
            if len(self._instances) >= self._max or len(event.instance) > _MAX_INSTANCE_CHARS:
                self.dropped_events += 1
                return None
            state = InstanceState(source=source, engine=event.engine, instance=event.instance)
            state.epoch_started = self._clock()
            self._instances[key] = state
            self.startup_changes += 1
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
            # In the facts' own order, whatever order the event's fields were set in (the fast paths
            # build events from templates): the counts read the same either way.
            refused = refused_facts(changed)
            for fact in sorted(refused or ()):
                del changed[fact]
                state.bad_values[fact] = state.bad_values.get(fact, 0) + 1
            self._fold_usage(state, origin, changed, now)
            # Only a sample the other origin has matched recently is compared (log-only: never).
            if "kv_usage_ratio" in changed and state.usage_seen.get(_other(origin)) is not None:
                self._cross_check_usage(state, event, now)
            return
        if not isinstance(event, Preemption):
            self.startup_changes += 1
        implausible_facts = implausible(event)
        if implausible_facts:
            # Refused and counted; the rest of the event is kept (kvwatch.core.events.PLAUSIBLE).
            for fact in implausible_facts:
                state.bad_values[fact] = state.bad_values.get(fact, 0) + 1
            event = event.model_copy(update=dict.fromkeys(implausible_facts))
        if isinstance(event, EngineSettings):
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

    @staticmethod
    def _fold_usage(state: InstanceState, origin: Origin, changed: dict[str, object], now: float) -> None:
        """Usage facts (refused ones already out) into the merged and per-origin groups."""
        seen, keys = state.fact_seen, _SEEN_KEYS[origin]
        for fact in changed:
            seen[keys[fact]] = now
        before, own = state.usage, state.usage_by_origin.get(origin, EMPTY_USAGE)
        state.usage = updated(before, changed, now)
        # While one origin reports usage its group is the merged one: one merge, not two.
        state.usage_by_origin[origin] = state.usage if own is before else updated(own, changed, now)
        if "kv_usage_ratio" in changed:
            state.usage_seen[origin] = now

    def _cross_check_usage(self, state: InstanceState, event: UsageSample, now: float) -> None:
        if event.kv_usage_ratio is None or is_refused("kv_usage_ratio", event.kv_usage_ratio):
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
        epoch = state.preemption_epoch[event.origin] = min(
            state.preemption_epoch.get(event.origin, 0) + delta, _MAX_COUNT
        )
        state.preemptions_total = min(state.preemptions_total + max(epoch, before) - before, _MAX_COUNT)

    def _stale(self, st: InstanceState, now: float) -> tuple[dict[tuple[str, str], bool], set[str]]:
        """Per (origin, watched fact): stale or not; and the periodic facts no origin keeps fresh."""
        stale: dict[tuple[str, str], bool] = {}
        fresh: set[str] = set()
        seen_facts: set[str] = set()
        limit = now - self.fact_ttl
        for key, ts in st.fact_seen.items():
            timed = _TIMED.get(key)
            if timed is None:  # a key of a state file that kvwatch would not write now
                origin, _, fact = key.partition(":")
                if fact not in _PERIODIC:
                    continue  # a startup fact timed by an older kvwatch: never stale
                timed = ((origin, fact), fact, fact in STALE_FACTS)
            pair, fact, watched = timed
            seen_facts.add(fact)
            if ts >= limit:
                fresh.add(fact)
            if watched:
                stale[pair] = ts < limit
        return dict(sorted(stale.items())), seen_facts - fresh

    def _pools(self, st: InstanceState, now: float) -> dict[PoolKind, PoolFacts]:
        """The pools whose source is alive: any the log printed; one only /metrics reported while
        /metrics delivered something for the instance within the TTL."""
        pools = dict(st.pools)
        metrics_seen = st.last_update.get("metrics")
        if metrics_seen is not None and metrics_seen >= now - self.fact_ttl:
            return pools
        for kind in list(pools):
            printed = st.pools_by_origin.get(("log", kind))
            if printed is None or printed.empty():
                del pools[kind]
        return pools

    def snapshot(self) -> list[InstanceSnapshot]:
        """Frozen copies of every instance, sorted by (source, instance).

        Periodic facts that no origin delivered within ``fact_ttl`` are left out (a frozen value must
        not be exported as if current); startup facts stay while their source is alive (``_pools``).
        """
        with self._lock:
            out = []
            now = self._clock()
            for (source, _), st in sorted(self._instances.items()):
                settings = self._source_settings.get(source, EMPTY_SETTINGS).overlaid(st.settings)
                stale, gone = self._stale(st, now) if st.fact_seen else ({}, set())
                usage = without(st.usage, gone) if gone else st.usage
                pools = self._pools(st, now)
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
                        pools=pools,
                        usage=usage,
                        preemptions_total=st.preemptions_total,
                        retractions=st.retractions,
                        startup_failures=dict(st.startup_failures),
                        last_failure=st.last_failure,
                        disagreements=dict(st.disagreements),
                        last_disagreement=st.last_disagreement,
                        counter_resets=st.counter_resets,
                        last_update=dict(st.last_update),
                        events=st.events,
                        stale=stale,
                        # Sorted: the same however the refusals came.
                        bad_values=dict(sorted(st.bad_values.items())),
                    )
                )
            return out

    def instances(self) -> list[InstanceState]:
        """Shallow copies of the records, for persistence (taken under the lock: a consistent set)."""
        with self._lock:
            return [replace(st) for st in self._instances.values()]

    def restore(self, states: Iterable[InstanceState], source_settings: Mapping[str, SettingsFacts]) -> int:
        """Load records saved by a previous kvwatch process (state file), within the instance cap.

        Beyond the cap the least recently updated records are left out (a cap lowered between runs,
        or a file someone else wrote); returns how many.
        """
        records = list(states)
        total = len(records)
        with self._lock:
            room = max(0, self._max - len(self._instances))
            if len(records) > room:
                newest = sorted(
                    range(len(records)),
                    key=lambda i: max(records[i].last_update.values(), default=records[i].epoch_started),
                    reverse=True,
                )
                keep = set(newest[:room])
                records = [st for i, st in enumerate(records) if i in keep]
            for st in records:
                self._instances[(st.source, st.instance)] = st
            for source, settings in source_settings.items():
                self._source_settings[source] = self._source_settings.get(source, EMPTY_SETTINGS).overlaid(
                    settings
                )
            self.startup_changes += 1
        return total - len(records)

    def source_settings(self) -> dict[str, SettingsFacts]:
        """Settings printed by a source's non-instance processes, for persistence."""
        with self._lock:
            return dict(self._source_settings)

    def forget(self, source: str) -> int:
        """Drop every instance of a source and its settings (node mode: a deleted pod's container,
        once its instances expired); returns how many instances went."""
        with self._lock:
            gone = [key for key in self._instances if key[0] == source]
            for key in gone:
                del self._instances[key]
            self._source_settings.pop(source, None)
            self.startup_changes += 1
        return len(gone)
