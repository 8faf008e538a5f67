"""Engine release numbers: '0.11.0rc2+cu130' read as (0, 11, 0), and the since-versioned rule rows
each engine's ``releases.py`` table is made of. A leaf, so the parse path can check a release
without importing the capacity model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Rule", "Side", "version_tuple"]

T_co = TypeVar("T_co", covariant=True)


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """'0.11.0rc2+cu130' -> (0, 11, 0); None or unparsable -> None (= newest)."""
    if not version:
        return None
    out: list[int] = []
    for part in version.lstrip("v").split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(out) if out else None


@dataclass(frozen=True)
class Side(Generic[T_co]):
    """One side of a rule: ``value`` from release ``since`` on (None: every release before the next
    side), and ``source``, the engine's file:line that says so, with the release it was read in."""

    since: str | None
    value: T_co
    source: str


class Rule(Generic[T_co]):
    """What one engine does differently by release: a named row of sides, oldest first.

    ``at(version)`` is the value of the last side whose ``since`` is at or before the release, so a
    release newer than the newest side takes the newest rule, and None (no release given or
    printed, or one that does not parse) means the newest release known.
    """

    __slots__ = ("_starts", "meaning", "name", "sides")

    def __init__(self, name: str, meaning: str, *sides: Side[T_co]) -> None:
        self.name = name
        self.meaning = meaning
        self.sides = sides
        # Parsed once: a rule is read inside the fit check's binary search.
        self._starts = tuple(version_tuple(side.since) or () for side in sides)

    def at(self, version: str | tuple[int, ...] | None) -> T_co:
        """The value for ``version`` (a release string or an already parsed tuple)."""
        v = version if isinstance(version, tuple) else version_tuple(version)
        if v is None:
            return self.sides[-1].value
        value = self.sides[0].value
        for start, side in zip(self._starts[1:], self.sides[1:], strict=True):
            if v < start:
                break
            value = side.value
        return value

    def __repr__(self) -> str:
        return f"Rule({self.name!r})"
