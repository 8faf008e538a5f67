"""``Engine``: what the rest of kvwatch may ask of a serving engine, as an object of parts.

Each package under kvwatch/engines declares one (``engines/vllm/engine.py``,
``engines/sglang/engine.py``), registry.py lists them by ``EngineName``, and a command resolves
its engine there once and carries the object down (``predict``, ``plan``, ``explain``, the
sidecar's predictor); nothing outside kvwatch/engines tests an engine's name. The light parts (its
name, labels, known releases, flag table, anchors and detection phrases) are plain values; the
heavy ones are built on first use, so reading a vLLM log never imports SGLang's line table and a
prediction imports no log or /metrics dialect:

- ``log``: the line table and its fast path (engines/<e>/log.py, fastpath.py)
- ``metrics``: the /metrics map (engines/<e>/metrics.py)
- ``capacity``: the budget arithmetic of each release before launch (engines/<e>/capacity.py)
- ``observed``: the budget the engine printed, read back (engines/<e>/observed.py)
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from kvwatch.core.errors import ConfigError
from kvwatch.core.kinds import EngineName
from kvwatch.core.versions import version_tuple
from kvwatch.engines.flags import Flag, FlagReading, read_flags

if TYPE_CHECKING:
    # Types only: a prediction (``kvwatch predict``) needs no log or /metrics parsing, and these
    # modules (kvwatch.state.facts: the events) import regex and pydantic.
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
    """How an engine's log reads: the body parser and the fast path (the anchors are ``Engine.anchors``)."""

    parse: Callable[[str, LineMeta], tuple[Event, ...]]
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


@dataclass(frozen=True)
class Labels:
    """How the commands name the engine, its memory fraction and its budget terms."""

    # In messages ('vLLM 0.34 is not a release kvwatch knows').
    display: str
    # The Deployment / EngineSettings field of the memory fraction its budget uses.
    fraction_setting: str
    # How ``predict`` names the budget the fraction leaves (e.g. 'requested (util)').
    fraction_label: str
    # How ``predict`` names everything between the usable budget and weights + KV.
    overhead_label: str


@dataclass(frozen=True)
class EngineFlags:
    """The engine's command line: its own flags (``predict MODEL -- <flags>``) and where kvwatch's
    fraction and block flags land."""

    table: tuple[Flag, ...]
    # (--gpu-memory-utilization, --mem-fraction-static, --block-size) -> Deployment fields;
    # ConfigError for the other engine's fraction flag.
    deployment_fields: Callable[[float | None, float | None, int | None], dict[str, DeploymentValue]]
    # kvwatch's --speculative-config (the engine's JSON as typed) -> Deployment fields; None where
    # the engine's drafter is not modelled.
    speculative_fields: Callable[[str], dict[str, DeploymentValue]] | None = None
    # The engine's own rewriting of its argv before its parser reads it (vLLM folds dotted keys,
    # ``--limit-mm-per-prompt.image 0``, into one JSON object); None where it has none.
    normalise: Callable[[Sequence[str]], list[str]] | None = None

    def read(self, argv: Sequence[str]) -> FlagReading:
        """Deployment fields of an argv in the engine's spelling, and the flags kvwatch ignores."""
        return read_flags(self.normalise(argv) if self.normalise else argv, self.table)


class Capacity(Protocol):
    """The engine's budget arithmetic before launch: bytes per token, the pool, the prediction."""

    def default_block_size(self, model: ModelGeometry | None) -> int | None:
        """Tokens per block when the log did not print it (None: the engine has no fixed default)."""
        ...

    def layer_bytes(self, layer: LayerSpec, d: Deployment, elem_bytes: int) -> int:
        """KV bytes one token adds to one layer on one rank, as this engine lays the cache out."""
        ...

    def needs_gpu_memory(self, d: Deployment) -> bool:
        """Whether an a-priori prediction of ``d`` needs the card's memory."""
        ...

    def kv_cache_dtype(self, model: ModelGeometry, d: Deployment) -> tuple[str, str | None]:
        """The cache dtype the engine stores for ``d.kv_cache_dtype`` (an 'auto' it resolves from the
        checkpoint), and a note when it is not the one given."""
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


class ObservedBudget(Protocol):
    """The budget the engine printed, read back: rebuilt, compared with a prediction, its lever."""

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


@dataclass(eq=False)
class Engine:
    """One serving engine: its parts, the heavy ones built on first use by the ``build_*`` loaders.

    Built parts are cached on the object (tests may replace one with ``monkeypatch.setattr``).
    """

    name: EngineName
    labels: Labels
    # The oldest and newest release kvwatch knows, e.g. ('0.3', '0.33').
    known_versions: tuple[str, str]
    flags: EngineFlags
    # The log table's anchor words (engines/<e>/anchors.py): the pre-filter of a source whose engine
    # is not known yet, known without building the log dialect.
    anchors: tuple[str, ...]
    # Phrases this engine prints in some release and the other engines never do (detection).
    phrases: tuple[str, ...]
    build_log: Callable[[], LogDialect] = field(repr=False)
    build_metrics: Callable[[], MetricsDialect] = field(repr=False)
    build_capacity: Callable[[], Capacity] = field(repr=False)
    build_observed: Callable[[], ObservedBudget] = field(repr=False)

    @functools.cached_property
    def log(self) -> LogDialect:
        return self.build_log()

    @functools.cached_property
    def metrics(self) -> MetricsDialect:
        return self.build_metrics()

    @functools.cached_property
    def capacity(self) -> Capacity:
        return self.build_capacity()

    @functools.cached_property
    def observed(self) -> ObservedBudget:
        return self.build_observed()

    def check_version(self, version: str | None) -> None:
        """ConfigError unless ``version`` (a user's --engine-version; None = newest) is a release
        of this engine kvwatch knows, naming the range it knows."""
        if version is None:
            return
        label = self.labels.display
        oldest, newest = self.known_versions
        known = f"kvwatch knows {label} {oldest} to {newest}"
        parsed = version_tuple(version)
        text = version.strip().lstrip("v")
        if (
            parsed is None
            or len(text) > 40  # (first: the pattern below is quadratic in a long near miss)
            or not re.fullmatch(r"[0-9]+(\.[0-9]+)*([.+-]?[A-Za-z0-9.+-]*)?", text)
        ):
            raise ConfigError(f"engine version {version!r} is not a version number ({known})")
        low, high = version_tuple(oldest), version_tuple(newest)
        assert low is not None and high is not None
        # A release newer than any kvwatch has read is predicted with the newest rules it knows,
        # and the prediction says so (capacity/envelope.py widens its band); a jump of two majors
        # is a typo.
        newer = parsed[: len(high)] > high and parsed[0] <= high[0] + 1
        if not newer and not low <= parsed[: len(high)] <= high and parsed[: len(low)] != low:
            raise ConfigError(
                f"{label} {version} is not a release kvwatch knows ({label} {oldest} to {newest}); "
                "omit --engine-version for the newest"
            )
