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

Modules, by concern: this one (the tailer: loop, reading, delivery), ``files`` (positions, open
files, followed paths), ``rotation`` (identity, rotation, copytruncate, resume), ``watch`` (watchdog
as a doorbell), ``lines`` (bytes -> lines), ``release`` (giving back what was read).
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from watchdog.events import (
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
)

from kvwatch.sources.files import CHUNK, FINGERPRINT, FilePosition, Reader, Stream, fingerprint_before
from kvwatch.sources.rotation import RotationHandling
from kvwatch.sources.watch import Bell, Doorbell, WatchHandling, has_magic

__all__ = ["ErrorCallback", "FilePosition", "LineCallback", "LogTailer", "PathCallback"]

log = logging.getLogger(__name__)

_DRAIN_BUDGET = 128  # chunks (8 MiB) read from one file before the loop looks at the others
# What watchdog must report; with append polling on, IN_MODIFY is not even requested from the kernel.
_STRUCTURAL_EVENTS = [FileCreatedEvent, FileMovedEvent, FileDeletedEvent]
_ALL_EVENTS = [FileModifiedEvent, *_STRUCTURAL_EVENTS]

LineCallback = Callable[[str, str], None]
LinesCallback = Callable[[str, list[str]], None]
PathCallback = Callable[[str], None]
ErrorCallback = Callable[[str, BaseException], None]


class LogTailer(RotationHandling, WatchHandling):
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
        self._on_line = on_line
        # Or lines by read chunk (a busy log's cost is per call): the position after a chunk's last
        # line is published before the chunk is handed on; a stop takes effect after it.
        self._on_lines = on_lines
        self._on_rotate = on_rotate
        self._on_error = on_error
        self.polling = polling
        self.recheck_interval = recheck_interval
        self.poll_interval = poll_interval
        self.append_interval = append_interval
        self._event_types = _STRUCTURAL_EVENTS if append_interval > 0 else _ALL_EVENTS
        self.retire_after = retire_after
        self.max_line_chars = max_line_chars
        self._resume = {os.path.abspath(k): v for k, v in (resume or {}).items()}

        # Counters (monotonic) for kvwatch's self-metrics.
        self.rotations = 0
        self.read_errors = 0
        self.callback_errors = 0
        self._truncated_closed = 0

        self._lock = threading.RLock()
        # Position after the last line delivered per path: (dev, inode, offset, bytes before offset).
        # Held while a line is published and handed to on_line, so positions() never sees one
        # without the other (re-entrant: on_line may call positions()).
        self._pub_lock = threading.RLock()
        self._published: dict[str, tuple[int, int, int, bytes]] = {}
        self._streams: dict[str, Stream] = {}
        self._wake = Bell()
        self._stop = threading.Event()
        self._dirty_lock = threading.Lock()
        # Paths with news -> whether the news may be structural (created/moved/deleted), which needs a
        # stat of the path; a 'modified' event only needs a read of the file already open.
        self._dirty: dict[str, bool] = {}
        self._rescan = True
        # Event path -> stream path; replaced wholesale by the reader thread, read by the doorbell.
        self._route: dict[str, str] = {}
        self._watched: dict[str, tuple[Any, Any]] = {}
        self._observer: Any = None
        self._fallback: Any = None
        self._thread: threading.Thread | None = None
        self._running = False
        self._close_on_exit = False
        self._handler = Doorbell(self)

    # ---- public API -------------------------------------------------------------------------

    def start(self) -> None:
        """Start watching and reading; returns at once (files are read in the tailer's thread)."""
        if self._thread is not None:
            raise RuntimeError("LogTailer already started")
        self._observer = self._make_observer()
        self._observer.start()
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
            for observer in (self._observer, self._fallback):
                if observer is not None:
                    observer.stop()
            return
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            self._wake.close()
        for observer in (self._observer, self._fallback):
            if observer is not None:
                observer.stop()
        for observer in (self._observer, self._fallback):
            if observer is not None and observer.is_alive():
                observer.join(timeout)
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
        for stream in list(self._streams.values()):
            for reader in [*stream.retired, *([stream.reader] if stream.reader else [])]:
                self._truncated_closed += reader.splitter.truncated
                os.close(reader.fd)
            stream.retired.clear()
            stream.reader = None

    def positions(self) -> dict[str, FilePosition]:
        """Resumable position of every followed path opened so far (for the state file): just after
        the last line handed to ``on_line``. Still valid after ``stop()``.

        Lines from the open files are published and handed to ``on_line`` under one lock that this
        also takes, so a caller counting the lines its ``on_line`` received before and after this
        call knows whether the positions match the lines it has (it waits at most for one ``on_line``
        call, never for file reading)."""
        with self._pub_lock:
            items = list(self._published.items())
        return {
            path: FilePosition(path, dev, ino, offset, fingerprint.hex())
            for path, (dev, ino, offset, fingerprint) in items
        }

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
                    self._drain(stream, stream.reader, retired=False)
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
            return release_saved(self._streams, saved, self._report)
        finally:
            self._lock.release()

    def delivery_paused(self) -> contextlib.AbstractContextManager[Any]:
        """Hold back ``on_line`` calls while the caller saves its state with ``positions()``.

        A caller whose ``on_line`` applies each line at once gets a consistent cut this way: inside
        the block, what it has applied is exactly what ``positions()`` says was delivered."""
        return self._pub_lock

    # The read-only views below take no lock (list() of a dict is atomic under the GIL), so a
    # scrape never waits for the reader thread, even during a long first read of a big log.

    def paths(self) -> list[str]:
        """Paths followed so far (the pattern itself, or every glob match seen)."""
        return sorted(list(self._streams))

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
        total = self._truncated_closed
        for stream in list(self._streams.values()):
            current = stream.reader
            for reader in [*list(stream.retired), *([current] if current else [])]:
                total += reader.splitter.truncated
        return total

    # ---- watchdog side (dispatcher thread) --------------------------------------------------

    def _on_fs_event(self, event: FileSystemEvent) -> None:
        route = self._route
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
                    self._sync_watches()
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
                self._report("", exc)
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
                    grew = self._drain(stream, reader, retired=True)
                    if grew is None or (not grew and now - reader.last_growth >= self.retire_after):
                        self._close(stream, reader)
            if stream.reader is not None:
                self._drain(stream, stream.reader, retired=False)
            if check_path or stream.reader is None:
                self._check_identity(stream)

    def _drain(self, stream: Stream, reader: Reader, *, retired: bool) -> bool | None:
        """Read ``reader`` to its current end and deliver the lines.

        Returns whether it grew, or None when a retired file turned out truncated (give it up).
        """
        grew = False
        budget = _DRAIN_BUDGET
        while not self._stop.is_set():
            if budget <= 0 and not retired:
                # A writer faster than us must not starve the other files and the re-check:
                # come back to this one on the next turn of the loop.
                with self._dirty_lock:
                    self._dirty.setdefault(stream.path, False)
                self._wake.set()
                break
            budget -= 1
            k = len(reader.tail)
            try:
                data = os.pread(reader.fd, k + CHUNK, reader.offset - k)
                # Past the first bytes, compare those too: a file truncated and refilled could
                # repeat the bytes before our offset (runs of '=' or spaces), not also its start.
                if len(data) > k and reader.offset > k and reader.head and data[:k] == reader.tail:
                    if os.pread(reader.fd, len(reader.head), 0) != reader.head:
                        data = b""
            except OSError as exc:
                if not retired:
                    self._fail(stream, exc, reading=True)
                return grew
            if not retired:
                stream.read_failing = False
            if data[:k] != reader.tail:
                if retired:
                    return None
                self._truncated(stream, reader)
                continue
            body = data[k:]
            if not body:
                break
            grew = True
            reader.offset += len(body)
            reader.last_growth = time.monotonic()
            if len(reader.head) < FINGERPRINT:
                reader.head = (reader.head + body)[:FINGERPRINT]
            before = reader.tail
            reader.tail = (reader.tail + body[-FINGERPRINT:])[-FINGERPRINT:]
            self._feed(stream, reader, body, reader.offset - len(body), before, publish=not retired)
            if len(body) < CHUNK:
                break
        return grew

    def _feed(
        self, stream: Stream, reader: Reader, body: bytes, start: int, before: bytes, *, publish: bool
    ) -> None:
        """Deliver the lines that ``body`` (read at ``start``) completes. With ``publish``, the
        position after each line (each chunk, with on_lines) is published just before it is handed
        on: inside the callback ``positions()`` includes it, so a consumer can store exactly the
        position of the last line it applied."""
        if not publish or self._on_lines is not None:
            lines = reader.splitter.feed(body)
            end = max(body.rfind(b"\n"), body.rfind(b"\r")) + 1
            with self._pub_lock:
                if publish and lines:
                    self._publish(stream.path, reader, start + end, fingerprint_before(body, before, end))
                self._deliver(stream.path, lines)
            return
        for line, end in reader.splitter.feed_ends(body):
            if self._stop.is_set():
                return  # the published position stays at the last line delivered
            fp = fingerprint_before(body, before, end)
            with self._pub_lock:
                self._publish(stream.path, reader, start + end, fp)
                self._deliver(stream.path, (line,))

    def _publish(self, path: str, reader: Reader, offset: int, fingerprint: bytes) -> None:
        with self._pub_lock:
            self._published[path] = (reader.dev, reader.ino, offset, fingerprint)

    def _deliver(self, path: str, lines: Iterable[str]) -> None:
        if self._on_lines is not None:
            self._call(self._on_lines, path, list(lines))
        else:
            for line in lines:
                self._call(self._on_line, path, line)

    def _call(self, callback: Callable[[str, Any], None], path: str, lines: str | list[str]) -> None:
        try:  # a failing callback costs that call's line(s), never the tailer
            callback(path, lines)
        except Exception as exc:
            self.callback_errors += 1
            log.exception("log line callback failed")
            self._report(path, exc)

    def _rotated(self, path: str) -> None:
        self.rotations += 1
        if self._on_rotate is not None:
            try:
                self._on_rotate(path)
            except Exception as exc:
                self.callback_errors += 1
                self._report(path, exc)

    def _fail(self, stream: Stream, exc: BaseException, *, reading: bool = False) -> None:
        if stream.read_failing if reading else stream.failing:
            return
        if reading:
            stream.read_failing = True
        else:
            stream.failing = True
        self.read_errors += 1
        log.warning("cannot read %s: %s (retrying)", stream.path, exc)
        self._report(stream.path, exc)

    def _report(self, path: str, exc: BaseException) -> None:
        if self._on_error is None:
            return
        try:
            self._on_error(path, exc)
        except Exception:
            log.exception("on_error callback failed")
