"""One engine instance's state (mutated only by ``kvwatch.state.fleet.Fleet``) and its frozen snapshot.

Types only: what kvwatch knows about an instance, by fact group (kvwatch/state/facts.py), its epoch, its
counters and its staleness. ``Fleet`` in state.py is the one place that changes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvwatch.core.events import (
    Origin,
    PoolKind,
)
from kvwatch.core.kinds import EngineName
from kvwatch.state.facts import (
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
)


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
    # "<origin>:<periodic fact>" -> when it last arrived from that origin (state clock), for staleness.
    fact_seen: dict[str, float] = field(default_factory=dict)
    # Values rejected because they lie outside the fact's meaning, per fact.
    bad_values: dict[str, int] = field(default_factory=dict)

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
        self.fact_seen = {}
        self.preemption_marks = {}
        self.preemption_epoch = {}
        self.last_failure = None


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
    # (origin, fact) of every watched periodic fact (STALE_FACTS) seen this epoch -> True when stale.
    stale: Mapping[tuple[str, str], bool] = field(default_factory=dict)
    bad_values: Mapping[str, int] = field(default_factory=dict)

    @property
    def pool(self) -> PoolFacts:
        """The full-attention pool (the one that bounds concurrency), empty when unknown."""
        return self.pools.get("full", EMPTY_POOL)
