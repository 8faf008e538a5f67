"""When the state file is written, and how a save gets a consistent cut of state and positions."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable

from kvwatch.core.events import Event, UsageSample
from kvwatch.core.jsontypes import JsonObject
from kvwatch.sidecar.sources import LogSource
from kvwatch.state.fleet import Fleet
from kvwatch.state.persist import StateStore

log = logging.getLogger("kvwatch")

# The consumer saves the state file at most this often (and at stop).
# Facts an engine prints once (pool, settings, budget) and counters are saved within a second;
# usage samples only move the read positions forward, which a restart can as well re-read, so a
# state that changed by usage alone is saved at a slower pace (each save costs a JSON dump + fsync).
SAVE_INTERVAL = 1.0
USAGE_SAVE_INTERVAL = 30.0
# With --release-read, a log that grew is saved this often, so its read bytes can be given back
# (kvwatch/sources/release.py): the file then holds at most what the engine writes in this time.
RELEASE_SAVE_INTERVAL = 0.5


class SaveSchedule:
    """What the state file is missing, when it is due, and the save itself.

    ``mark`` is called by every thread that applies events (tailers, HTTP workers, the consumer);
    everything else only by the consumer thread. The flags are behind a lock of their own so that
    marks from two tailers (which hold different delivery locks) cannot lose one another.
    """

    def __init__(
        self,
        store: StateStore | None,
        fleet: Fleet,
        logs: Iterable[LogSource],
        wake: Callable[[], None],
        *,
        release: bool = False,
    ) -> None:
        self.store = store
        # Give back the read part of each log after each save (--release-read).
        self.release = release
        self._moved = False
        self._fleet = fleet
        self._logs = logs
        self._wake = wake
        self._lock = threading.Lock()
        self._dirty = False
        self._facts_dirty = False
        self._last_save = 0.0
        self._dirty_since = self._facts_since = 0.0

    @property
    def dirty(self) -> bool:
        """True while the state holds changes the file does not."""
        return self._dirty

    def mark(self, events: tuple[Event, ...]) -> None:
        """Note what the state file is missing (called from the thread that applied the events).

        When that makes a save due sooner than the consumer planned to wake (it sleeps without a
        timeout while the state is saved), the consumer is woken to plan again.
        """
        if not events or self.store is None:
            return
        with self._lock:
            wake = not self._dirty
            if wake:
                self._dirty_since = time.monotonic()
            self._dirty = True
            if not self._facts_dirty and not all(isinstance(e, UsageSample) for e in events):
                self._facts_since = time.monotonic()
                self._facts_dirty = wake = True
        if wake:
            self._wake()

    def moved(self) -> None:
        """A tailer read further (called per line with --release-read): the next save lets the
        read bytes go. A plain flag: the first one after a save wakes the consumer to plan."""
        if not self._moved:
            self._moved = True
            self._wake()

    def due_in(self) -> float | None:
        """Seconds until the state file should be written; None when it holds everything.

        A save is due an interval after the first change it would hold (and after the last save),
        so a burst of lines -- an engine's startup, a log read from its start -- is one save.
        """
        with self._lock:
            if self.store is None or not (self._dirty or self._moved):
                return None
            if self._moved and not self._facts_dirty:
                due = self._last_save + RELEASE_SAVE_INTERVAL
                return max(0.0, due - time.monotonic())
            if self._facts_dirty:
                due = max(self._last_save, self._facts_since) + SAVE_INTERVAL
            else:
                due = max(self._last_save, self._dirty_since) + USAGE_SAVE_INTERVAL
        return max(0.0, due - time.monotonic())

    def maybe_save(self) -> None:
        """Save when due (the consumer calls this after each batch and on each timed wake-up)."""
        if self.due_in() == 0.0:
            self.save()

    def final_save(self, drain: Callable[[], None]) -> None:
        """At stop: apply what is queued and save, retrying while a tailer keeps the cut moving."""
        for _ in range(100):
            drain()
            if not self._dirty or self.save():
                return
            time.sleep(0.02)
        log.warning("could not save a consistent state at stop; the next start re-reads from the last save")

    def save(self) -> bool:
        """Write the state with the positions of exactly the lines it contains.

        Log lines are applied under their tailer's delivery lock (in its thread, or the consumer's
        for a scrape); holding every tailer's lock while the positions and the fleet are taken gives a consistent
        cut (stdin lines and engine-/metrics results are applied by the consumer, the thread that
        saves, so they cannot change the fleet meanwhile). The slow part, writing and fsyncing the
        file, happens after the tailers are released.
        """
        if self.store is None:
            return True
        tailers = [(src.name, src.tailer) for src in self._logs if src.tailer is not None]
        with contextlib.ExitStack() as paused:
            for _, tailer in tailers:
                paused.enter_context(tailer.delivery_paused())
            taken = {name: tailer.positions() for name, tailer in tailers}
            positions: JsonObject = {
                name: {path: pos.to_dict() for path, pos in taken[name].items()} for name, _ in tailers
            }
            text = self.store.encode(self._fleet, positions)
            # Cleared inside the cut: a line applied after it marks the state dirty again.
            with self._lock:
                self._dirty = self._facts_dirty = False
            self._moved = False
        self._last_save = time.monotonic()
        if not self.store.write(text):
            with self._lock:
                self._dirty = self._facts_dirty = True
            return False
        if self.release:
            # The file now holds these positions: what lies before them may go.
            for name, tailer in tailers:
                tailer.release(taken[name])
        return True
