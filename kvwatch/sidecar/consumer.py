"""The consumer thread: the only reader of the sidecar's queue, and where predictions are made.

It applies what the scrape and stdin threads queue, reads the tailers' appends for a render
(``ReadAppends``), writes the state file (``SaveSchedule``), and makes the predictions: whenever the
fleet's startup facts moved (``Fleet.startup_changes``) it has the predictor compute every instance
it has no prediction for yet -- before it answers a render's ``ReadAppends``, so the render finds
them made. A render only looks them up (``Predictor.prepared``): no scrape reads, parses or fetches
a model's config.json. Threads and locks are written once, in kvwatch/sidecar/__init__.py.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Iterable

from kvwatch.analysis.predictor import Predictor
from kvwatch.export import names
from kvwatch.sidecar import messages as msg
from kvwatch.sidecar.appends import AppendRequests
from kvwatch.sidecar.saving import SaveSchedule
from kvwatch.sidecar.sources import LogSource
from kvwatch.state.fleet import Fleet

log = logging.getLogger("kvwatch")


class Consumer:
    """The body of the ``kvwatch-consumer`` thread (``run``)."""

    def __init__(
        self,
        items: queue.Queue[msg.Message],
        fleet: Fleet,
        predictor: Predictor,
        saves: SaveSchedule,
        appends: AppendRequests,
        logs: Iterable[LogSource],
    ) -> None:
        self._queue = items
        self._fleet = fleet
        self._predictor = predictor
        self._saves = saves
        self._appends = appends
        self._logs = logs
        # Fleet.startup_changes when the predictions were last made (-1: never).
        self._predicted_at = -1

    def run(self) -> None:
        """Take items until a Stop; apply each, then make the predictions and save when due."""
        while True:
            try:
                # Asleep until an item comes or a save is due: no wake-ups while nothing changes.
                item = self._queue.get(timeout=self._saves.due_in())
            except queue.Empty:
                self._saves.maybe_save()
                continue
            if isinstance(item, msg.Stop):
                self._drain()
                self._appends.close()
                self._drain()  # a render's request put before the close
                return
            if isinstance(item, msg.FinalSave):
                self._saves.final_save(self._drain)
                item.done.set()
                continue
            self._handle(item)
            if self._queue.empty():
                self.predict()
                self._saves.maybe_save()

    def predict(self) -> None:
        """Make the prediction of every instance that has none for its startup facts yet (nothing
        to do while those facts have not moved since the last time)."""
        changes = self._fleet.startup_changes
        if changes == self._predicted_at:
            return
        self._predicted_at = changes
        try:
            self._predictor.prepare(self._fleet.snapshot())
        except Exception:  # a prediction nobody foresaw failing must not stop the consumer
            log.exception("predictions not made")

    def _drain(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, msg.FinalSave):
                item.done.set()
            elif not isinstance(item, msg.Stop):
                self._handle(item)

    def _handle(self, item: msg.Message) -> None:
        match item:
            case msg.StdinLine(source=src, line=line):
                try:
                    self._saves.mark(src.on_line(line))
                finally:
                    if src.stdin_backlog is not None:
                        src.stdin_backlog.done(len(line))
            case msg.Scraped():
                self._handle_scrape(item)
            case msg.StdinClosed(source=src):
                src.stdin_up = False
            case msg.ReadAppends(done=done):
                try:
                    self._read_appends()
                    self.predict()  # what the appends started is predicted before the render
                finally:
                    done.set()
            case _:  # Dirty only wakes the consumer to plan its next save
                pass

    def _handle_scrape(self, item: msg.Scraped) -> None:
        src, result = item.source, item.result
        src.duration = result.duration_seconds
        if not result.ok:
            src.up = False
            # Bounded label values: a reason the collector does not export is a connection failure.
            reason = result.error if result.error in names.SCRAPE_ERROR_REASONS else "connection"
            src.errors[reason] = src.errors.get(reason, 0) + 1
            src.log_failure(reason, result.detail, time.monotonic())
            return
        src.log_recovery()
        if item.unreadable is not None:
            src.up = False
            src.errors["parse"] = src.errors.get("parse", 0) + 1
            log.debug("metrics unreadable source=%s err=%s", src.name, item.unreadable)
            return
        try:
            if item.events:
                self._fleet.apply_all(src.name, item.events)
                self._saves.mark(item.events)
        except Exception:
            # Input nobody foresaw must not stop the consumer: count it as unreadable and go on.
            src.up = False
            src.errors["parse"] = src.errors.get("parse", 0) + 1
            log.exception("metrics not applied source=%s", src.name)
            return
        src.up = True

    def _read_appends(self) -> None:
        """Every tailer's appends, read and applied now (for a render's request)."""
        for src in self._logs:
            if src.tailer is not None:
                try:
                    src.tailer.refresh()
                except Exception:  # a scrape must answer whatever reading the log ran into
                    log.exception("reading appends at scrape failed source=%s", src.name)
