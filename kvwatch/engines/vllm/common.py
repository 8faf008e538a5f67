"""Number and event helpers every vLLM log pattern shares.

Units: vLLM prints GiB values; before 0.8.5 it called them 'GB', so both are read as GiB.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from kvwatch.core.events import EventIdentity
from kvwatch.core.units import GiB, MiB
from kvwatch.parsers.base import LineMeta, ParseError

NUM = r"-?\d+(?:\.\d+)?"
INT = r"\d[\d,]*"
ERROR_HEAD = re.compile(r"^(?:[\w.]*(?:Error|Exception): )?")


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


def ident(meta: LineMeta) -> EventIdentity:
    """Identity fields every event of this line carries (``Event(**ident(meta), ...)``; the log
    parser turns a value pydantic rejects into a ParseError)."""
    return {"engine": "vllm", "instance": meta.instance, "rank": meta.rank, "ts": meta.ts}
