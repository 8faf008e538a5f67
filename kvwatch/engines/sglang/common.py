"""Helpers every SGLang log pattern shares: identity fields, GiB figures, optional numbers."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from kvwatch.core.events import EventIdentity
from kvwatch.core.units import GiB
from kvwatch.parsers.base import LineMeta, ParseError


def ident(meta: LineMeta) -> EventIdentity:
    """Identity fields every event of this line carries."""
    return {"engine": "sglang", "instance": meta.instance, "rank": meta.rank, "ts": meta.ts}


def gib(text: str) -> int:
    """SGLang's 'GB' figure (GiB, 2 decimals) as integer bytes, exact decimal arithmetic."""
    try:
        return int((Decimal(text) * GiB).to_integral_value())
    except InvalidOperation as exc:
        raise ParseError(f"not a size in GB: {text!r}") from exc


def opt_gib(text: str | None) -> int | None:
    return None if text is None else gib(text)


def opt_int(text: str | None) -> int | None:
    return None if text is None else int(text)


def opt_float(text: str | None) -> float | None:
    return None if text is None else float(text)
