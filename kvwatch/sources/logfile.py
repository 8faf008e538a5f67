"""Follow an engine's log file(s) the way ``tail -F`` does, without losing or repeating lines.

Design (one reader thread, watchdog only as a doorbell):

* watchdog (inotify, or its polling observer when inotify is unavailable or asked for) watches the
  *directories* of the followed paths and of their symlink targets; an event only marks a path dirty
  and wakes the reader thread. Reads happen in that thread, or in a thread calling ``refresh()``,
  under one lock, so ``on_line`` is called by one thread at a time, in file order.
* Appends to the open files are read every ``append_interval`` seconds (a ``pread`` that returns at
  once when nothing was written), and whenever ``refresh()`` is called (a sidecar does at each scrape),
  instead of on inotify's IN_MODIFY: an engine writes one line per write, and passing each of those
  events through watchdog's threads costs more CPU than the whole rest of the sidecar (measured in
  bench/bench_sidecar.py). watchdog still rings for what a read cannot see: files created, moved and
  deleted. ``append_interval=0`` restores reading on every modify event (lowest latency, highest CPU).
* A stat every ``recheck_interval`` seconds re-checks everything, so a missed or coalesced event
  (NFS, overlay mounts, a full inotify queue) delays a line by at most that interval, never loses it.
* Each file is read from the beginning (an engine prints its KV pool once, at startup) unless a
  saved position says it was already read up to an offset (``resume``).
* Rotation: when the path names another file (rename-and-create, delete-and-recreate, a swapped
  Kubernetes symlink), the old file is kept open and read to its end, also later (``retire_after``)
  in case the writer had not reopened yet, and the new file is read from 0. When the file we hold
  is truncated in place (copytruncate), the bytes we had not read yet are recovered from the copy
  beside it (found by its first and last bytes) and the file is read again from 0.
* Truncation is seen by comparing the bytes just before our offset, and the first bytes of the file,
  with what we read there; a shrink alone would miss a file that grew past our offset again before
  we looked.

One class, of composed parts by concern: this module (the tailer: its thread, its loop, its
public API), ``rotation.Files`` (the followed paths and their reading: drain, identity, rotation,
copytruncate, resume), ``delivery.Delivery`` (callbacks, published positions, counters),
``watch.Watches`` (watchdog as a doorbell), ``files`` (positions, open files, followed paths as
data), ``lines`` (bytes -> lines), ``release`` (giving back what was read).
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from watchdog.events import (
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
)

from kvwatch.sources.delivery import Delivery, ErrorCallback, LineCallback, LinesCallback, PathCallback
from kvwatch.sources.files import FilePosition, Stream
from kvwatch.sources.rotation import Files
from kvwatch.sources.watch import Bell, Watches, has_magic

__all__ = ["ErrorCallback", "FilePosition", "LineCallback", "LogTailer", "PathCallback"]

log = logging.getLogger(__name__)

# What watchdog must report; with append polling on, IN_MODIFY is not even requested from the kernel.
_STRUCTURAL_EVENTS = [FileCreatedEvent, FileMovedEvent, FileDeletedEvent]
_ALL_EVENTS = [FileModifiedEvent, *_STRUCTURAL_EVENTS]


class LogTailer:
    """Follow one path or glob pattern and call ``on_line(path, line)`` for every line, once.

    ``on_line``, ``on_rotate`` and ``on_error`` are called from the tailer's own thread, or from the
    thread calling ``refresh()``; never from two threads at once.
    ``rotations``, ``read_errors``, ``truncated_lines`` and ``up`` feed the self-metrics.
    """

    def __init__(
        self,
        pattern: str,
        on_line: LineCallback,
        *,
        on_rotate: PathCallback | None = None,
        on_error: ErrorCallback | None = None,
        on_lines: LinesCallback | None = None,
        polling: bool = False,
        recheck_interval: float = 1.0,
        poll_interval: float = 0.25,
        append_interval: float = 0.04,
        retire_after: float = 5.0,
        max_line_chars: int = 65536,
        resume: Mapping[str, FilePosition] | None = None,
    ) -> None:
        if recheck_interval <= 0 or poll_interval <= 0 or retire_after < 0 or append_interval < 0:
            raise ValueError(
                "recheck_interval and poll_interval must be > 0, retire_after and append_interval >= 0"
            )
        self.pattern = os.path.abspath(os.path.expanduser(pattern))
        self.is_glob = has_magic(self.pattern)
        self.recheck_interval = recheck_interval
        self.append_interval = append_interval
        self.retire_after = retire_after
        self._resume = {os.path.abspath(k): v for k, v in (resume or {}).items()}

        self._lock = threading.RLock()
        self._wake = Bell()
        self._stop = threading.Event()
        self._out = Delivery(on_line, on_lines, on_rotate, on_error)
        self._files = Files(
            self._out,
            self._stop,
            is_glob=self.is_glob,
            pattern=self.pattern,
            retire_after=retire_after,
            max_line_chars=max_line_chars,
            come_back=self._come_back,
            rescan=self._request_rescan,
        )
        self._streams = self._files.streams  # the same dict: the loop adds paths, Files forgets them
        self._dirty_lock = threading.Lock()
        # Paths with news -> whether the news may be structural (created/moved/deleted), which needs a
        # stat of the path; a 'modified' event only needs a read of the file already open.
        self._dirty: dict[str, bool] = {}
        self._rescan = True
        # Looked up at each event (not bound once), so that a test can wrap _on_fs_event.
        self._watches = Watches(
            self.pattern,
            self.is_glob,
            polling=polling,
            poll_interval=poll_interval,
            event_types=_STRUCTURAL_EVENTS if append_interval > 0 else _ALL_EVENTS,
            on_event=lambda event: self._on_fs_event(event),
            report=self._out.report,
        )
        self._thread: threading.Thread | None = None
        self._running = False
        self._close_on_exit = False

    # ---- public API -------------------------------------------------------------------------

    def start(self) -> None:
        """Start watching and reading; returns at once (files are read in the tailer's thread)."""
        if self._thread is not None:
            raise RuntimeError("LogTailer already started")
        self._watches.start()
        self._running = True
        self._thread = threading.Thread(target=self._run, name=f"kvwatch-tail:{self.pattern}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and watchdog, close every file. Unfinished lines are not delivered:
        ``positions()`` points at their start, so a resumed tailer reads them whole."""
        self._stop.set()
        self._wake.set()
        if self._thread is threading.current_thread():
            # Called from on_line: the loop ends after this callback and closes the files itself.
            self._close_on_exit = True
            self._watches.stop()
            return
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            self._wake.close()
        self._watches.stop()
        self._watches.join(timeout)
        if not self._lock.acquire(timeout=timeout):
            log.warning(
                "log tailer for %s did not stop in %.0f s; leaving its files open", self.pattern, timeout
            )
            return
        try:
            self._close_files()
        finally:
            self._lock.release()

    def _close_files(self) -> None:
        self._running = False
        self._files.close_all()

    def positions(self) -> dict[str, FilePosition]:
        """Resumable position of every followed path opened so far (for the state file): just after
        the last line handed to ``on_line``. Still valid after ``stop()``.

        Lines from the open files are published and handed to ``on_line`` under one lock that this
        also takes, so a caller counting the lines its ``on_line`` received before and after this
        call knows whether the positions match the lines it has (it waits at most for one ``on_line``
        call, never for file reading)."""
        return self._out.positions()

    def refresh(self, timeout: float = 0.05) -> bool:
        """Read what was appended to the open files now, in the caller's thread; False when the
        tailer's own thread held the files for longer than ``timeout`` (say, a first read of a big
        log) or the tailer is stopped.

        A sidecar calls this when /metrics is scraped, so a line is visible at the next scrape however
        long ``append_interval`` is: the background reads then only need to keep state saves current,
        and can be rare. Lines go to ``on_line`` in the calling thread, still one caller at a time and
        in file order (both paths read under one lock). Only the files already open are read; new
        files and renamed paths are still found by the tailer's thread.
        """
        if self._thread is None or not self._lock.acquire(timeout=timeout):
            return False
        try:
            if self._stop.is_set() or not self._running:
                return False
            for stream in list(self._streams.values()):
                if stream.reader is not None:
                    self._files.drain(stream, stream.reader, retired=False)
            return True
        finally:
            self._lock.release()

    def release(self, saved: Mapping[str, FilePosition], timeout: float = 0.05) -> int:
        """Give back the disk blocks read before ``saved`` (positions a state file holds) in the
        files the paths name now, when they are the saved ones (sources/release.py); bytes freed."""
        from kvwatch.sources.release import release_saved

        if not self._lock.acquire(timeout=timeout):
            return 0
        try:
            return release_saved(self._streams, saved, self._out.report)
        finally:
            self._lock.release()

    def delivery_paused(self) -> contextlib.AbstractContextManager[Any]:
        """Hold back ``on_line`` calls while the caller saves its state with ``positions()``.

        A caller whose ``on_line`` applies each line at once gets a consistent cut this way: inside
        the block, what it has applied is exactly what ``positions()`` says was delivered."""
        return self._out.lock

    # The read-only views below take no lock (list() of a dict is atomic under the GIL), so a
    # scrape never waits for the reader thread, even during a long first read of a big log.

    def paths(self) -> list[str]:
        """Paths followed so far (the pattern itself, or every glob match seen)."""
        return sorted(list(self._streams))

    @property
    def rotations(self) -> int:
        """Rotations seen (the path naming another file, a truncation in place, a file recreated)."""
        return self._out.rotations

    @property
    def read_errors(self) -> int:
        """Error episodes opening or reading a followed path, each counted once."""
        return self._out.read_errors

    @property
    def callback_errors(self) -> int:
        """Calls of on_line, on_lines or on_rotate that raised."""
        return self._out.callback_errors

    @property
    def observer_kind(self) -> str:
        """'native' (inotify on Linux), 'polling', or 'native+polling' after an inotify limit was hit."""
        return self._watches.kind

    @property
    def up(self) -> bool:
        """Running, at least one file open, and no followed path currently missing or unreadable."""
        streams = list(self._streams.values())
        return (
            self._running
            and not self._stop.is_set()
            and any(s.reader is not None for s in streams)
            and not any(s.failing or s.read_failing or s.missing for s in streams)
        )

    @property
    def truncated_lines(self) -> int:
        """Lines cut at ``max_line_chars`` so far."""
        total = self._files.truncated_closed
        for stream in list(self._streams.values()):
            current = stream.reader
            for reader in [*list(stream.retired), *([current] if current else [])]:
                total += reader.splitter.truncated
        return total

    # ---- watchdog side (dispatcher thread) --------------------------------------------------

    def _on_fs_event(self, event: FileSystemEvent) -> None:
        route = self._watches.route
        structural = event.event_type != "modified"
        hit = False
        for raw in (event.src_path, event.dest_path):
            if not raw:
                continue
            path = os.fsdecode(raw)
            target = route.get(path)
            if target is not None:
                with self._dirty_lock:
                    self._dirty[target] = structural or self._dirty.get(target, False)
                hit = True
            elif self.is_glob and event.event_type in ("created", "moved"):
                if fnmatch.fnmatchcase(os.path.basename(path), os.path.basename(self.pattern)):
                    self._rescan = True
                    hit = True
        if hit:
            self._wake.set()

    # ---- reader thread ----------------------------------------------------------------------

    def _run(self) -> None:
        next_check = 0.0
        next_append = 0.0
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                full = now >= next_check
                appends = self.append_interval > 0 and now >= next_append
                if appends:
                    next_append = now + self.append_interval
                if full or self._rescan:
                    # A new glob match or a rotation (maybe to a file in another directory):
                    # re-route events, then look at every path once.
                    self._rescan = False
                    self._discover()
                    self._watches.sync(self._streams)
                    with self._dirty_lock:
                        self._dirty.clear()
                    targets = [(stream, True) for stream in list(self._streams.values())]
                    if full:
                        next_check = now + self.recheck_interval
                else:
                    with self._dirty_lock:
                        dirty, self._dirty = self._dirty, {}
                    if appends:
                        # Every open file gets a read; the ones watchdog rang for also a stat.
                        for path in self._streams:
                            dirty.setdefault(path, False)
                    targets = [(self._streams[p], news) for p, news in dirty.items() if p in self._streams]
                for stream, structural in targets:
                    if self._stop.is_set():
                        break
                    self._poll(stream, check_retired=full, check_path=structural)
            except Exception as exc:  # the tailer must outlive any bug or surprise
                log.exception("log tailer loop error")
                self._out.report("", exc)
                self._stop.wait(0.1)
            wake_at = min(next_check, next_append) if self.append_interval > 0 else next_check
            self._wake.wait(wake_at - time.monotonic())
            self._wake.clear()
        if self._close_on_exit:
            with self._lock:
                self._close_files()
            self._wake.close()

    def _discover(self) -> None:
        """Create streams for the literal path, or for glob matches not seen before."""
        if not self.is_glob:
            candidates: Iterable[str] = [self.pattern]
        else:
            candidates = (os.path.abspath(p) for p in glob.glob(self.pattern) if os.path.isfile(p))
        with self._lock:
            for path in candidates:
                if path not in self._streams:
                    # A saved position applies to the first file seen at that path, never again.
                    self._streams[path] = Stream(path, resume=self._resume.pop(path, None))

    def _poll(self, stream: Stream, *, check_retired: bool, check_path: bool) -> None:
        with self._lock:
            if check_retired and stream.retired:
                now = time.monotonic()
                for reader in list(stream.retired):
                    grew = self._files.drain(stream, reader, retired=True)
                    if grew is None or (not grew and now - reader.last_growth >= self.retire_after):
                        self._files.close(stream, reader)
            if stream.reader is not None:
                self._files.drain(stream, stream.reader, retired=False)
            if check_path or stream.reader is None:
                self._files.check_identity(stream)

    def _come_back(self, path: str) -> None:
        """A drain stopped at its budget: read ``path`` again on the loop's next turn."""
        with self._dirty_lock:
            self._dirty.setdefault(path, False)
        self._wake.set()

    def _request_rescan(self, wake: bool) -> None:
        """Look for paths and re-route the watches on the loop's next turn (at once when ``wake``)."""
        self._rescan = True
        if wake:
            self._wake.set()
