"""A memory budget term by term, and where each figure came from (printed, derived, predicted...).

Engine-neutral types: each engine rebuilds its observed budget into these (kvwatch/engines/*/
observed.py), the prediction is turned into one, and kvwatch.analysis compares the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from kvwatch.capacity.prediction import Prediction
from kvwatch.core.labels import MEMORY_TERMS

TermSource = Literal["printed", "derived", "given", "engine_default", "predicted"]


@dataclass(frozen=True)
class Term:
    """One term of a memory budget (bytes per rank) and where the figure came from."""

    name: str
    bytes: int | None
    source: TermSource | None = None
    note: str = ""


class PutTerm(Protocol):
    """Record a term unless it is already known (printed figures first, derived ones after)."""

    def __call__(self, name: str, value: int | None, source: TermSource, note: str = "") -> None: ...


@dataclass(frozen=True)
class Budget:
    """A memory budget by MEMORY_TERMS term, with the fraction (utilisation) it used."""

    engine: str
    fraction: float | None
    fraction_source: TermSource | None
    terms: Mapping[str, Term]

    def get(self, name: str) -> int | None:
        term = self.terms.get(name)
        return None if term is None else term.bytes

    def as_bytes(self) -> dict[str, int | None]:
        return {name: self.get(name) for name in MEMORY_TERMS}


def predicted_budget(prediction: Prediction) -> Budget:
    """The prediction's budget as a Budget (every term 'predicted')."""
    terms = {
        name: Term(name, value, "predicted")
        for name, value in prediction.memory_terms().items()
        if value is not None
    }
    return Budget(prediction.engine, prediction.fraction, "predicted", terms)


def printed_fraction(*printed: float | None) -> tuple[float | None, TermSource | None]:
    """The memory fraction as the engine printed it: the first of ``printed`` it gave (pass the
    budget line's before the settings line's)."""
    for value in printed:
        if value is not None:
            return float(value), "printed"
    return None, None


def putter(terms: dict[str, Term]) -> PutTerm:
    """A PutTerm recording into ``terms``."""

    def put(name: str, value: int | None, source: TermSource, note: str = "") -> None:
        if value is not None and name not in terms:
            terms[name] = Term(name, value, source, note)

    return put


@dataclass(frozen=True)
class Contribution:
    """How much one term moved the KV budget: positive = the observed pool is larger for it."""

    term: str
    bytes: int
    observed: int | float | None = None
    predicted: int | float | None = None


def usable_and_weights(
    observed: Mapping[str, int | None], predicted: Mapping[str, int | None], usable_split: bool
) -> list[Contribution]:
    """The usable-budget difference (unless the engine already split it) and the weights difference."""
    out: list[Contribution] = []
    if not usable_split:
        uo, up = observed.get("usable"), predicted.get("usable")
        if uo is not None and up is not None:
            out.append(Contribution("usable", uo - up, uo, up))
    wo, wp = observed.get("weights"), predicted.get("weights")
    if wo is not None and wp is not None:
        out.append(Contribution("weights", -(wo - wp), wo, wp))
    return out
