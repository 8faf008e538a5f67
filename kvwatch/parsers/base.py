"""The contract between line sources, prefix stripping and the per-engine parsers.

A parser is a pure function ``(body, meta) -> tuple[Event, ...]``: ``body`` is the log message with
every wrapper (container timestamps, process prefixes, the engine's own level/time/file prefix)
removed, ``meta`` is what those wrappers said about who printed it. An empty tuple means the line
is not about the KV cache (almost every line). A pattern that claims a line but cannot convert it
raises ``ParseError``; the pipeline counts it and goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvwatch.core.events import Event


@dataclass(frozen=True, slots=True)
class LineMeta:
    """Who printed a line, read from its prefixes."""

    # Engine instance: DP rank / V1 engine index ("0" when not data-parallel or not printed).
    instance: str = "0"
    # TP (or PP/worker) rank that printed it, when the prefix names one.
    rank: int | None = None
    # The timestamp as printed (no year, no clock reads).
    ts: str | None = None
    # Ray's '[repeated Nx across cluster]': the same line came from N processes.
    repeated: int = 1


class ParseError(ValueError):
    """A pattern matched the line but a value could not be converted."""


ParseFn = Callable[[str, LineMeta], tuple[Event, ...]]

NO_EVENTS: tuple[Event, ...] = ()
