"""Number and event helpers every vLLM log pattern shares.

Units: vLLM prints GiB values; before 0.8.5 it called them 'GB', so both are read as GiB.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

import regex
from pydantic import ValidationError

from kvwatch.events import Event
from kvwatch.parsers.base import LineMeta, ParseError
from kvwatch.units import GiB, MiB

NUM = r"-?\d+(?:\.\d+)?"
INT = r"\d[\d,]*"
ERROR_HEAD = regex.compile(r"^(?:[\w.]*(?:Error|Exception): )?")


def to_int(text: str) -> int:
    return int(text.replace(",", ""))


def gib(text: str, unit: str = "GiB") -> int:
    """Bytes from a printed size; vLLM's 'GB' is GiB, 'MiB' appears in CUDA-graph estimates."""
    try:
        value = Decimal(text)
    except InvalidOperation as exc:
        raise ParseError(f"not a number: {text!r}") from exc
    scale = MiB if unit.startswith("M") else GiB
    return int((value * scale).to_integral_value())


def ratio(pct: str) -> float:
    """'82.1' (percent) -> 0.821, rounded once from the decimal text, as Decimal would."""
    return float(pct + "e-2")


def make(cls: Callable[..., Event], meta: LineMeta, **fields: Any) -> Event:
    """Build one event with the line's identity; a value pydantic rejects is a ParseError."""
    base: dict[str, Any] = {"engine": "vllm", "instance": meta.instance, "rank": meta.rank, "ts": meta.ts}
    base.update(fields)
    try:
        return cls(**base)
    except ValidationError as exc:
        raise ParseError(str(exc).splitlines()[0]) from exc
