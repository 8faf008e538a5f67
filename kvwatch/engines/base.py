"""The ``Engine`` protocol: what the rest of kvwatch may ask of a serving engine.

Each package under kvwatch/engines implements it once (``engines/vllm/engine.py``,
``engines/sglang/engine.py``); the pipeline, the /metrics reader, the capacity model, the analysis
and the commands call these hooks and never test an engine's name. Everything an engine means
lives behind them: the log line table and its fast path (``log``), the /metrics map (``metrics``),
the budget arithmetic of each release (``predict``, ``pool_from_available``), the reconstruction
of the budget it printed (``observed_budget``), its defaults and its flag spelling.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kvwatch.core.kinds import EngineName
from kvwatch.engines.flags import Flag

if TYPE_CHECKING:
    # The capacity model is imported by the engines' methods that use it: reading a log needs
    # none of it.
    # Types only: a prediction (``kvwatch predict``) needs no log or /metrics parsing, and these
    # modules (kvwatch.state.facts: the events) import regex and pydantic.
    import re

    from kvwatch.capacity.budget import Budget, Contribution, Term
    from kvwatch.capacity.deployment import Deployment, DeploymentValue
    from kvwatch.capacity.model import LayerSpec, ModelGeometry
    from kvwatch.capacity.prediction import Basis, Prediction
    from kvwatch.core.events import Event
    from kvwatch.parsers.base import LineMeta
    from kvwatch.parsers.samples import InstanceFacts, Sample, SampleReader
    from kvwatch.state.facts import MemoryFacts, PoolFacts, SettingsFacts

# Whole-line fast path, over raw UTF-8 lines without b'\n': per line, its events when it is in the
# engine's most frequent shape (prefixes included), or None for any other line, which then goes
# through prefix peeling and ``parse``. The pipeline calls it for the sidecar's lines (one at a
# time) and replay's (a block's at once).
FastPathFn = Callable[[list[bytes]], "list[tuple[Event, ...] | None]"]


@dataclass(frozen=True)
class LogDialect:
    """How an engine's log reads: the body parser, its anchors, the fast path, detection phrases."""

    parse: Callable[[str, LineMeta], tuple[Event, ...]]
    # Substrings at least one of which every line ``parse`` claims contains (derived from its table).
    anchors: tuple[str, ...]
    # Phrases this engine prints in some release and the other engines never do.
    phrases: tuple[str, ...]
    fast_path: FastPathFn | None = None


class MetricsDialect(Protocol):
    """How an engine's /metrics reads: its name prefix, who exported a series, the facts per instance."""

    prefix: re.Pattern[str]
    # Labels that say who exported a series (instance, rank, model), left out of the series key.
    identity_labels: frozenset[str]
    # Gauges that hold a cumulative count: checked for resets like counters.
    cumulative_gauges: frozenset[str]
    # Every series name (prefix stripped) ``facts`` reads. A /metrics body materialises only these
    # (and their counters' ``_created``); every other line is checked for syntax and dropped.
    families: frozenset[str]

    def identity(self, labels: Mapping[str, str]) -> tuple[str, tuple[int, int, int] | None]:
        """(engine instance, (tp, pp, ep) rank or None) of one series."""
        ...

    def sums_pool_across_instances(self, samples: list[Sample]) -> bool:
        """Whether the pool figure is a sum over instances (then it is not one instance's pool)."""
        ...

    def facts(
        self,
        reader: SampleReader,
        instance: str,
        by_name: dict[str, list[Sample]],
        was_reset: bool,
        summed_pool: bool,
    ) -> InstanceFacts:
        """The settings, pools, usage and preemption facts of one instance's samples."""
        ...


@dataclass(frozen=True)
class FractionLever:
    """Raising the engine's memory fraction: the flag, the deployment change, the KV it adds."""

    change: str
    deployment: Deployment
    extra_kv_bytes: int
    note: str


class Engine(Protocol):
    """One serving engine, as the rest of kvwatch sees it."""

    @property
    def name(self) -> EngineName: ...

    @property
    def anchors(self) -> tuple[str, ...]:
        """``log.anchors``, known without building the dialect (the pre-filter of an undetected source)."""
        ...

    @property
    def phrases(self) -> tuple[str, ...]:
        """``log.phrases``: what only this engine prints (detection)."""
        ...

    @property
    def log(self) -> LogDialect: ...

    @property
    def metrics(self) -> MetricsDialect: ...

    @property
    def known_versions(self) -> tuple[str, str]:
        """The oldest and newest release kvwatch knows, e.g. ('0.3', '0.33')."""
        ...

    @property
    def fraction_setting(self) -> str:
        """The EngineSettings field of the memory fraction its budget uses."""
        ...

    @property
    def fraction_label(self) -> str:
        """How ``predict`` names the budget the fraction leaves (e.g. 'requested (util)')."""
        ...

    @property
    def overhead_label(self) -> str:
        """How ``predict`` names everything between the usable budget and weights + KV."""
        ...

    def default_block_size(self, model: ModelGeometry | None) -> int | None:
        """Tokens per block when the log did not print it (None: the engine has no fixed default)."""
        ...

    def layer_bytes(self, layer: LayerSpec, d: Deployment, elem_bytes: int) -> int:
        """KV bytes one token adds to one layer on one rank, as this engine lays the cache out."""
        ...

    def needs_gpu_memory(self, d: Deployment) -> bool:
        """Whether an a-priori prediction of ``d`` needs the card's memory."""
        ...

    def predict(self, model: ModelGeometry, d: Deployment, basis: Basis) -> Prediction:
        """The engine's KV pool, its budget subtracted and divided the engine's way."""
        ...

    def pool_from_available(
        self, model: ModelGeometry, d: Deployment, elem_bytes: int, available: int
    ) -> tuple[int, int | None]:
        """(tokens, blocks or None) the engine makes of ``available`` bytes on one rank."""
        ...

    def tokens_of_pool_bytes(
        self, model: ModelGeometry, d: Deployment, elem_bytes: int, pool_bytes: int
    ) -> int | None:
        """Tokens of a pool whose buffers the engine printed in bytes (None: it prints no such figure)."""
        ...

    def observed_budget(
        self,
        terms: dict[str, Term],
        memory: MemoryFacts,
        pool: PoolFacts,
        settings: SettingsFacts,
        total: int | None,
        kv: int | None,
    ) -> Budget:
        """The budget the engine printed, a missing term derived only from its own identity."""
        ...

    def budget_terms_for_gap(
        self, observed: Mapping[str, int | None], settings: SettingsFacts
    ) -> dict[str, int | None]:
        """The observed terms that are part of the KV budget (printed but not subtracted ones dropped)."""
        ...

    def attribute(
        self,
        observed: Mapping[str, int | None],
        predicted: Mapping[str, int | None],
        observed_fraction: float | None,
        predicted_fraction: float | None,
    ) -> list[Contribution]:
        """The KV-budget gap split into the terms this engine's identity weighs (no 'unattributed')."""
        ...

    def fraction_lever(
        self, d: Deployment, observed: Budget, fraction: float, new: float
    ) -> FractionLever | None:
        """What raising the memory fraction from ``fraction`` to ``new`` makes of the observed budget."""
        ...

    @property
    def flags(self) -> Sequence[Flag]:
        """The engine's own command-line flags that move the pool (``predict MODEL -- <flags>``)."""
        ...

    def deployment_flags(
        self, utilization: float | None, static_fraction: float | None, block_size: int | None
    ) -> dict[str, DeploymentValue]:
        """Deployment fields of ``predict``'s fraction and block flags; ConfigError for another engine's."""
        ...
