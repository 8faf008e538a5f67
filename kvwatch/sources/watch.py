"""The tailer's doorbell: watchdog watches directories and only wakes the reader thread.

``Bell`` is the wake-up flag the reader thread sleeps on; ``Doorbell`` hands watchdog's events to
the tailer; ``Watches`` (a part of LogTailer) keeps one watch per directory of the followed paths
and their symlink targets, falling back to polling a directory when inotify runs out.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import select
import socket
from collections.abc import Callable, Iterable
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers.polling import PollingObserver

log = logging.getLogger("kvwatch.sources.logfile")


class Bell:
    """A wake-up flag that one thread sleeps on with a timeout and others ring.

    Like ``threading.Event``, but the timed wait is a single ``select()`` on a socket pair: on the
    VMs this was measured on, an Event's timed wait costs about twice the CPU per wake-up, and the
    wake-ups for the timed re-check are most of an idle tailer's CPU (bench/bench_sidecar.py). Socket objects, unlike raw pipe descriptors, cannot write into an
    unrelated file that reused the number after ``close()``.
    """

    def __init__(self) -> None:
        self._flag = False
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._w.setblocking(False)

    def set(self) -> None:
        self._flag = True
        with contextlib.suppress(OSError):  # buffer full: a wake-up is pending anyway; closed: stopped
            self._w.send(b"\0")

    def is_set(self) -> bool:
        return self._flag

    def clear(self) -> None:
        self._flag = False
        with contextlib.suppress(OSError):
            while self._r.recv(4096):
                pass

    def wait(self, timeout: float) -> bool:
        if not self._flag:
            with contextlib.suppress(OSError, ValueError):
                select.select([self._r], [], [], max(0.0, timeout))
        return self._flag

    def close(self) -> None:
        self._r.close()
        self._w.close()


def has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


class Doorbell(FileSystemEventHandler):
    """Hands watchdog events on; runs in watchdog's dispatcher thread."""

    def __init__(self, on_event: Callable[[FileSystemEvent], None]) -> None:
        super().__init__()
        self._on_event = on_event

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._on_event(event)


class Watches:
    """The watches of one tailer: ``route`` maps an event's path to the followed path it concerns
    (replaced wholesale by ``sync`` in the reader thread, read by the doorbell's thread)."""

    def __init__(
        self,
        pattern: str,
        is_glob: bool,
        *,
        polling: bool,
        poll_interval: float,
        event_types: list[Any],
        on_event: Callable[[FileSystemEvent], None],
        report: Callable[[str, BaseException], None],
    ) -> None:
        self.pattern = pattern
        self.is_glob = is_glob
        self.polling = polling
        self.poll_interval = poll_interval
        self.route: dict[str, str] = {}
        self._event_types = event_types
        self._report = report
        self._watched: dict[str, tuple[Any, Any]] = {}
        self._observer: Any = None
        self._fallback: Any = None
        self._handler = Doorbell(on_event)

    @property
    def kind(self) -> str:
        """'native' (inotify on Linux), 'polling', or 'native+polling' after an inotify limit was hit."""
        if self._observer is None:
            return "stopped"
        native = not isinstance(self._observer, PollingObserver)
        if native and self._fallback is not None:
            return "native+polling"
        return "native" if native else "polling"

    def start(self) -> None:
        self._observer = self._make_observer()
        self._observer.start()

    def stop(self) -> None:
        """Ask the observers to stop (from any thread, the reader's too)."""
        for observer in (self._observer, self._fallback):
            if observer is not None:
                observer.stop()

    def join(self, timeout: float) -> None:
        for observer in (self._observer, self._fallback):
            if observer is not None and observer.is_alive():
                observer.join(timeout)

    def sync(self, paths: Iterable[str]) -> None:
        """Watch the directories of the paths and of their symlink targets; route events to paths."""
        route: dict[str, str] = {}
        dirs: set[str] = set()
        for path in list(paths):
            for name in {path, os.path.realpath(path)}:
                parent = os.path.realpath(os.path.dirname(name))
                route[os.path.join(parent, os.path.basename(name))] = path
                route[name] = path
                dirs.add(parent)
        if self.is_glob:
            dirs.update(os.path.realpath(d) for d in glob.glob(os.path.dirname(self.pattern)))
        self.route = route
        # A deleted directory's watch is dead; forget it so the directory is watched again if it returns.
        gone = {d for d in self._watched if d not in dirs or not os.path.isdir(d)}
        for directory in gone:
            observer, watch = self._watched.pop(directory)
            with contextlib.suppress(KeyError, OSError):
                observer.unschedule(watch)
        for directory in dirs - set(self._watched):
            if os.path.isdir(directory):
                self._watch(directory)

    def _make_observer(self) -> Any:
        if self.polling:
            return PollingObserver(timeout=self.poll_interval)
        try:
            from watchdog.observers import Observer

            return Observer()
        except Exception as exc:  # no native backend on this platform
            self._report("", exc)
            self.polling = True
            return PollingObserver(timeout=self.poll_interval)

    def _watch(self, directory: str) -> None:
        try:
            watch = self._observer.schedule(self._handler, directory, event_filter=self._event_types)
            self._watched[directory] = (self._observer, watch)
            return
        except OSError as exc:
            if isinstance(self._observer, PollingObserver):
                self._report(directory, exc)
                return
            # inotify instance or watch limit reached: poll this directory instead.
            log.warning("inotify unavailable for %s (%s); polling it", directory, exc)
        if self._fallback is None:
            self._fallback = PollingObserver(timeout=self.poll_interval)
            self._fallback.start()
        try:
            watch = self._fallback.schedule(self._handler, directory, event_filter=self._event_types)
            self._watched[directory] = (self._fallback, watch)
        except OSError as exc:
            self._report(directory, exc)
