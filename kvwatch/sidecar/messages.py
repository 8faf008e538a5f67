"""What the sidecar's threads put on the consumer's queue: one small frozen dataclass per kind.

A tagged tuple (``("scrape", src, result)``) let a typo in a tag or a wrong arity through mypy; a
``match`` over these classes does not.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvwatch.core.events import Event
from kvwatch.sources.scrape import ScrapeResult

if TYPE_CHECKING:
    from kvwatch.sidecar.sources import LogSource, ScrapeSource


@dataclass(frozen=True, slots=True)
class StdinLine:
    """One line read from standard input (the consumer applies it: stdin has no delivery lock)."""

    source: LogSource
    line: str


@dataclass(frozen=True, slots=True)
class StdinClosed:
    """Standard input reached its end: that source is down from now on."""

    source: LogSource


@dataclass(frozen=True, slots=True)
class Scraped:
    """One fetch of an engine's /metrics, read as it arrived (by the scrape thread): its events,
    for the consumer to apply, or why the body could not be read (``unreadable``)."""

    source: ScrapeSource
    result: ScrapeResult
    events: tuple[Event, ...] = ()
    unreadable: str | None = None


@dataclass(frozen=True, slots=True)
class Dirty:
    """Wakes the consumer to plan its next save (a change came while it slept without a timeout)."""


@dataclass(frozen=True, slots=True)
class FinalSave:
    """Save now, whatever the schedule says; ``done`` is set when the save was tried."""

    done: threading.Event


@dataclass(frozen=True, slots=True)
class ReadAppends:
    """A render's request (kvwatch.sidecar.appends): read every tailer's appends now, then set
    ``done``, so the render's snapshot holds every line written before it asked."""

    done: threading.Event


@dataclass(frozen=True, slots=True)
class Stop:
    """Apply what is queued, then end the consumer thread."""


Message = StdinLine | StdinClosed | Scraped | Dirty | FinalSave | ReadAppends | Stop
