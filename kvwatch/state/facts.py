"""Typed facts: what the state keeps of the events, one frozen dataclass per fact group.

Each group takes its fact fields from the event's fact-field class (kvwatch/core/events.py), where
every fact is declared once: ``SettingsFacts`` <- SettingsFields (EngineSettings), ``MemoryFacts``
<- MemoryFields (MemoryBudget), ``PoolFacts`` <- PoolFields (PoolSized, one per pool kind),
``UsageFacts`` <- UsageFields (UsageSample), ``Failure`` <- FailureFields (StartupFailure). The
state builds them with one generic merge (``merged``: the event's set, non-None fields replace the
group's), and every later layer reads them as attributes.

``updated_at`` is the state clock of the last event that set a field of the group (None: never, or
restored from a state file); it is not part of a group's value (equality, hashing, the state file).

Staleness is decided here, by kind of fact, and nowhere else. A group's ``CADENCE`` says how often
the engine reports it: ``"startup"`` facts (settings, memory budget, pools, a failure) are printed
once per start and stay true for the whole epoch, so they never go stale while their source is
alive; ``"periodic"`` facts (usage: stats lines and every scrape) go stale when they stop arriving
for the fact TTL. Of the periodic facts, those a group names in ``WATCHED`` are levels that every stats line
and every scrape carries whatever the model; only their staleness is exported
(kvwatch_source_facts_stale), since the others (rates from counter deltas, hybrid-model pools) are
absent from an idle or a plain engine without anything being wrong (``watched_facts``).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from pydantic import BaseModel

from kvwatch.core.events import (
    DisagreementFact,
    FailureFields,
    MemoryFields,
    PoolFields,
    SettingsFields,
    StartupFailure,
    UsageFields,
)
from kvwatch.core.jsontypes import JsonObject, JsonValue

# How often the engine reports a group: once per start, or over and over while it runs.
Cadence = Literal["startup", "periodic"]


@dataclass(frozen=True, kw_only=True)
class _Facts:
    """Fields every fact group has."""

    CADENCE: ClassVar[Cadence] = "startup"
    # The periodic facts whose staleness is exported (see the module docstring).
    WATCHED: ClassVar[tuple[str, ...]] = ()
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
class SettingsFacts(SettingsFields, _Facts):
    """What the engine printed about its settings (EngineSettings)."""


@dataclass(frozen=True, kw_only=True)
class MemoryFacts(MemoryFields, _Facts):
    """The terms of the startup memory budget (MemoryBudget)."""


@dataclass(frozen=True, kw_only=True)
class PoolFacts(PoolFields, _Facts):
    """One KV pool the engine allocated (PoolSized, without its kind)."""


@dataclass(frozen=True, kw_only=True)
class UsageFacts(UsageFields, _Facts):
    """How full the pool is and how busy the engine is, as last sampled (UsageSample): the one
    periodic group. The watched facts are levels every stats line and scrape carries."""

    CADENCE: ClassVar[Cadence] = "periodic"
    WATCHED: ClassVar[tuple[str, ...]] = ("kv_usage_ratio", "used_tokens", "running", "waiting")


@dataclass(frozen=True, kw_only=True)
class Failure(FailureFields, _Facts):
    """The last startup failure of an epoch (StartupFailure)."""

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
    return tuple(name for name in fact_names(cls) if name in periodic and name in cls.WATCHED)


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
    # The group is frozen: a merge makes a new one, through its own constructor (the changes are
    # fields of the group with values the event validated; dataclasses.replace would check that
    # again, field by field, at more than the rest of applying a stats line costs).
    values: dict[str, Any] = {**current.__dict__, **changed, "updated_at": now}
    return type(current)(**values)


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


# Checked at import: a watched fact is a periodic fact of its group.
for _group in (SettingsFacts, MemoryFacts, PoolFacts, UsageFacts, Failure):
    if not set(_group.WATCHED) <= set(periodic_facts(_group)):
        raise TypeError(f"{_group.__name__}.WATCHED names what is not a periodic fact of the group")
