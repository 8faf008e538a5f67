"""Typed facts: what the state keeps of the events, one frozen dataclass per fact group.

Each group mirrors the fact fields of one event class (kvwatch/core/events.py) under the same names:
``SettingsFacts`` <- EngineSettings, ``MemoryFacts`` <- MemoryBudget, ``PoolFacts`` <- PoolSized
(one per pool kind), ``UsageFacts`` <- UsageSample, ``Failure`` <- StartupFailure. The state builds
them with one generic merge (``merged``: the event's set, non-None fields replace the group's), and
every later layer reads them as attributes. Two checks keep a group and its event in step:

- at import, ``_mirror`` fails unless the group's fields are exactly the event's fact fields, so a
  field added to or renamed in an event cannot be silently dropped by the merge;
- for mypy, ``_typed_mirror`` reads every event field by name into the group by name, so renaming
  an event field (``MemoryBudget.available_kv_bytes``) is a type error until the group follows,
  and renaming the group's field is a type error in every consumer that reads it.

``updated_at`` is the state clock of the last event that set a field of the group (None: never, or
restored from a state file); it is not part of a group's value (equality, hashing, the state file).

Staleness is decided here, by kind of fact, and nowhere else. A group's ``CADENCE`` says how often
the engine reports it: ``"startup"`` facts (settings, memory budget, pools, a failure) are printed
once per start and stay true for the whole epoch, so they never go stale while their source is
alive; ``"periodic"`` facts (usage: stats lines and every scrape) go stale when they stop arriving
for the fact TTL. Of the periodic facts, those marked ``WATCHED`` are levels that every stats line
and every scrape carries whatever the model; only their staleness is exported
(kvwatch_source_facts_stale), since the others (rates from counter deltas, hybrid-model pools) are
absent from an idle or a plain engine without anything being wrong (``watched_facts``).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel

from kvwatch.core.events import (
    DisagreementFact,
    EngineSettings,
    MemoryBudget,
    PoolSized,
    StartupFailure,
    UsageSample,
)
from kvwatch.core.jsontypes import JsonObject, JsonValue
from kvwatch.core.labels import FailureReason

# How often the engine reports a group: once per start, or over and over while it runs.
Cadence = Literal["startup", "periodic"]
# Field metadata of a periodic fact whose staleness is exported (see the module docstring).
WATCHED: Mapping[str, bool] = types.MappingProxyType({"watched": True})


@dataclass(frozen=True, kw_only=True)
class _Facts:
    """Fields every fact group has."""

    CADENCE: ClassVar[Cadence] = "startup"
    updated_at: float | None = field(default=None, compare=False)

    def empty(self) -> bool:
        """True when no fact of the group is known."""
        return all(getattr(self, name) is None for name in fact_names(type(self)))

    def overlaid(self: F, top: F) -> F:
        """This group with every known fact of ``top`` replacing its own."""
        known = {name: v for name in fact_names(type(self)) if (v := getattr(top, name)) is not None}
        at = max((t for t in (self.updated_at, top.updated_at) if t is not None), default=None)
        return updated(self, known, at)

    def to_json(self) -> JsonObject:
        """The known facts, by field name (the state file's form)."""
        return {name: v for name in fact_names(type(self)) if (v := getattr(self, name)) is not None}


F = TypeVar("F", bound=_Facts)


@dataclass(frozen=True, kw_only=True)
class SettingsFacts(_Facts):
    """What the engine printed about its settings (EngineSettings)."""

    version: str | None = None
    model: str | None = None
    served_model_name: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    decode_context_parallel_size: int | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    block_size: int | None = None
    page_size: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    gpu_memory_utilization: float | None = None
    mem_fraction_static: float | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    engine_generation: Literal["v0", "v1"] | None = None


@dataclass(frozen=True, kw_only=True)
class MemoryFacts(_Facts):
    """The terms of the startup memory budget (MemoryBudget)."""

    total_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    requested_bytes: int | None = None
    weights_bytes: int | None = None
    activation_bytes: int | None = None
    non_torch_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    available_kv_bytes: int | None = None
    avail_after_weights_bytes: int | None = None
    avail_after_pool_bytes: int | None = None
    avail_before_weights_bytes: int | None = None
    avail_after_startup_bytes: int | None = None
    mem_fraction_static: float | None = None


@dataclass(frozen=True, kw_only=True)
class PoolFacts(_Facts):
    """One KV pool the engine allocated (PoolSized, without its kind)."""

    tokens: int | None = None
    blocks: int | None = None
    cpu_blocks: int | None = None
    block_size: int | None = None
    bytes: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens: int | None = None
    state_slots: int | None = None


@dataclass(frozen=True, kw_only=True)
class UsageFacts(_Facts):
    """How full the pool is and how busy the engine is, as last sampled (UsageSample): the one
    periodic group. The watched facts are levels every stats line and scrape carries."""

    CADENCE: ClassVar[Cadence] = "periodic"
    kv_usage_ratio: float | None = field(default=None, metadata=WATCHED)
    used_tokens: int | None = field(default=None, metadata=WATCHED)
    running: int | None = field(default=None, metadata=WATCHED)
    waiting: int | None = field(default=None, metadata=WATCHED)
    swapped: int | None = None
    prefix_cache_hit_ratio: float | None = None
    swa_usage_ratio: float | None = None
    mamba_usage_ratio: float | None = None
    swa_used_tokens: int | None = None
    mamba_used_slots: int | None = None
    retracted: int | None = None
    cpu_kv_usage_ratio: float | None = None
    prompt_throughput: float | None = None
    generation_throughput: float | None = None


@dataclass(frozen=True, kw_only=True)
class Failure(_Facts):
    """The last startup failure of an epoch (StartupFailure)."""

    reason: FailureReason
    needed_kv_bytes: int | None = None
    available_kv_bytes: int | None = None
    max_model_len: int | None = None
    max_tokens_in_cache: int | None = None
    estimated_max_model_len: int | None = None

    @classmethod
    def of(cls, event: StartupFailure, now: float | None = None) -> Failure:
        """The failure an event reports."""
        return merged(cls(reason=event.reason), event, now)


@dataclass(frozen=True)
class LastDisagreement:
    """The last fact the log and /metrics disagreed on, with both values."""

    fact: DisagreementFact
    log_value: float
    metrics_value: float

    def to_json(self) -> JsonObject:
        return {"fact": self.fact, "log_value": self.log_value, "metrics_value": self.metrics_value}


EMPTY_SETTINGS = SettingsFacts()
EMPTY_MEMORY = MemoryFacts()
EMPTY_POOL = PoolFacts()
EMPTY_USAGE = UsageFacts()

_NAMES: dict[type, tuple[str, ...]] = {}
_NAME_SETS: dict[type, frozenset[str]] = {}


def fact_names(cls: type[_Facts]) -> tuple[str, ...]:
    """The fact fields of a group, in field order (``updated_at`` is bookkeeping, not a fact)."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.name != "updated_at")
        _NAME_SETS[cls] = frozenset(names)
    return names


def periodic_facts(cls: type[_Facts]) -> tuple[str, ...]:
    """The facts of a group that go stale when they stop arriving (none for a startup group)."""
    return fact_names(cls) if cls.CADENCE == "periodic" else ()


def watched_facts(cls: type[_Facts]) -> tuple[str, ...]:
    """The periodic facts of a group whose staleness is exported, in field order."""
    periodic = set(periodic_facts(cls))
    return tuple(f.name for f in dataclasses.fields(cls) if f.name in periodic and f.metadata.get("watched"))


def changes(event: BaseModel, group: type[_Facts]) -> dict[str, object]:
    """The event's set, non-None fields that are facts of ``group``, by name."""
    names = _NAME_SETS.get(group)
    if names is None:
        fact_names(group)
        names = _NAME_SETS[group]
    values = event.__dict__
    return {k: v for k in event.model_fields_set & names if (v := values[k]) is not None}


def updated(current: F, changed: Mapping[str, object], now: float | None = None) -> F:
    """``current`` with ``changed`` (from ``changes``) replacing its own facts."""
    if not changed:
        return current
    # The group is frozen: a merge makes a new one. This is dataclasses.replace without its
    # per-field checks (the changes are fields of the group, values the event validated), which
    # would cost more than the rest of applying a stats line.
    new = object.__new__(type(current))
    values = new.__dict__
    values.update(current.__dict__)
    values.update(changed)
    values["updated_at"] = now
    return new


def merged(current: F, event: BaseModel, now: float | None = None) -> F:
    """``current`` with the event's set, non-None fields of the same names replacing its own."""
    return updated(current, changes(event, type(current)), now)


def without(current: F, names: Iterable[str]) -> F:
    """``current`` with the named facts unknown (names that are not facts of the group are ignored)."""
    facts = _NAME_SETS.get(type(current)) or frozenset(fact_names(type(current)))
    drop = {n: None for n in names if n in facts and getattr(current, n) is not None}
    return updated(current, drop, current.updated_at)


# Per group and fact: the value types it holds (bool, int, float, str, None) and a Literal's words.
_KINDS: dict[type, dict[str, tuple[frozenset[type], frozenset[object]]]] = {}


def _kinds(cls: type[_Facts]) -> dict[str, tuple[frozenset[type], frozenset[object]]]:
    kinds = _KINDS.get(cls)
    if kinds is None:
        kinds = {}
        hints = get_type_hints(cls)
        for name in fact_names(cls):
            hint = hints[name]
            parts = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
            words = {w for p in parts if get_origin(p) is Literal for w in get_args(p)}
            plain = {p for p in parts if isinstance(p, type)}
            kinds[name] = (frozenset(plain), frozenset(words))
        _KINDS[cls] = kinds
    return kinds


def _checked(cls: type[_Facts], name: str, value: JsonValue) -> object:
    """A saved fact's value if the field can hold it (an int where a float goes: as a float)."""
    plain, words = _kinds(cls)[name]
    if value is None:
        if type(None) in plain:
            return None
    elif isinstance(value, str) and value in words:
        return value
    if isinstance(value, bool):
        if bool in plain:
            return value
    elif isinstance(value, int):
        if int in plain:
            return value
        if float in plain:
            return float(value)
    elif isinstance(value, float | str) and type(value) in plain:
        return value
    raise ValueError(f"{cls.__name__}.{name} cannot be {value!r}")


def from_json(cls: type[F], data: Mapping[str, JsonValue]) -> F:
    """A group from its state-file form; names this version does not know are ignored, a value
    its field cannot hold (a string for a count, a word outside a Literal) is a ValueError."""
    names = fact_names(cls)
    known: dict[str, Any] = {k: _checked(cls, k, v) for k, v in data.items() if k in names}
    return cls(**known)


def disagreement_from_json(data: Mapping[str, JsonValue]) -> LastDisagreement:
    """Inverse of LastDisagreement.to_json."""
    fact, log_v, met_v = data["fact"], data["log_value"], data["metrics_value"]
    if not isinstance(log_v, int | float) or not isinstance(met_v, int | float):
        raise TypeError("disagreement values must be numbers")
    for known in get_args(DisagreementFact):
        if known == fact:
            return LastDisagreement(known, float(log_v), float(met_v))
    raise ValueError(f"unknown disagreement fact {fact!r}")


# Fields of the base event that are identity, not facts, and per event what else is not a fact.
_IDENTITY = frozenset({"engine", "instance", "rank", "origin", "ts", "kind"})


def _mirror(group: type[_Facts], event: type[BaseModel], *not_facts: str) -> None:
    facts = set(event.model_fields) - _IDENTITY - set(not_facts)
    mine = set(fact_names(group))
    if facts != mine:
        raise TypeError(
            f"{group.__name__} does not mirror {event.__name__}: "
            f"missing {sorted(facts - mine)}, extra {sorted(mine - facts)}"
        )


_mirror(SettingsFacts, EngineSettings, "starts_engine")
_mirror(MemoryFacts, MemoryBudget)
_mirror(PoolFacts, PoolSized, "pool")
_mirror(UsageFacts, UsageSample)
_mirror(Failure, StartupFailure)


if TYPE_CHECKING:

    def _typed_mirror(
        s: EngineSettings, m: MemoryBudget, p: PoolSized, u: UsageSample, f: StartupFailure
    ) -> tuple[SettingsFacts, MemoryFacts, PoolFacts, UsageFacts, Failure]:
        """Never runs: mypy checks that every event field has a group field of the same type."""
        return (
            SettingsFacts(
                version=s.version,
                model=s.model,
                served_model_name=s.served_model_name,
                tensor_parallel_size=s.tensor_parallel_size,
                pipeline_parallel_size=s.pipeline_parallel_size,
                data_parallel_size=s.data_parallel_size,
                decode_context_parallel_size=s.decode_context_parallel_size,
                dtype=s.dtype,
                kv_cache_dtype=s.kv_cache_dtype,
                quantization=s.quantization,
                block_size=s.block_size,
                page_size=s.page_size,
                max_model_len=s.max_model_len,
                max_num_seqs=s.max_num_seqs,
                max_num_batched_tokens=s.max_num_batched_tokens,
                chunked_prefill_size=s.chunked_prefill_size,
                cuda_graph_max_bs=s.cuda_graph_max_bs,
                gpu_memory_utilization=s.gpu_memory_utilization,
                mem_fraction_static=s.mem_fraction_static,
                enable_prefix_caching=s.enable_prefix_caching,
                enforce_eager=s.enforce_eager,
                engine_generation=s.engine_generation,
            ),
            MemoryFacts(
                total_bytes=m.total_bytes,
                gpu_memory_utilization=m.gpu_memory_utilization,
                requested_bytes=m.requested_bytes,
                weights_bytes=m.weights_bytes,
                activation_bytes=m.activation_bytes,
                non_torch_bytes=m.non_torch_bytes,
                cuda_graph_bytes=m.cuda_graph_bytes,
                available_kv_bytes=m.available_kv_bytes,
                avail_after_weights_bytes=m.avail_after_weights_bytes,
                avail_after_pool_bytes=m.avail_after_pool_bytes,
                avail_before_weights_bytes=m.avail_before_weights_bytes,
                avail_after_startup_bytes=m.avail_after_startup_bytes,
                mem_fraction_static=m.mem_fraction_static,
            ),
            PoolFacts(
                tokens=p.tokens,
                blocks=p.blocks,
                cpu_blocks=p.cpu_blocks,
                block_size=p.block_size,
                bytes=p.bytes,
                max_concurrency=p.max_concurrency,
                max_concurrency_tokens=p.max_concurrency_tokens,
                state_slots=p.state_slots,
            ),
            UsageFacts(
                kv_usage_ratio=u.kv_usage_ratio,
                used_tokens=u.used_tokens,
                running=u.running,
                waiting=u.waiting,
                swapped=u.swapped,
                prefix_cache_hit_ratio=u.prefix_cache_hit_ratio,
                swa_usage_ratio=u.swa_usage_ratio,
                mamba_usage_ratio=u.mamba_usage_ratio,
                swa_used_tokens=u.swa_used_tokens,
                mamba_used_slots=u.mamba_used_slots,
                retracted=u.retracted,
                cpu_kv_usage_ratio=u.cpu_kv_usage_ratio,
                prompt_throughput=u.prompt_throughput,
                generation_throughput=u.generation_throughput,
            ),
            Failure(
                reason=f.reason,
                needed_kv_bytes=f.needed_kv_bytes,
                available_kv_bytes=f.available_kv_bytes,
                max_model_len=f.max_model_len,
                max_tokens_in_cache=f.max_tokens_in_cache,
                estimated_max_model_len=f.estimated_max_model_len,
            ),
        )
