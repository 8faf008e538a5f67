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
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import logging
import os
import select
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from watchdog.events import (
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.polling import PollingObserver

from kvwatch.jsontypes import JsonObject, JsonValue
from kvwatch.sources.lines import LineSplitter

log = logging.getLogger(__name__)

# How many bytes identify a position in a file: the last bytes before the offset (and the first
# bytes of the file) are compared to notice truncation and to find a copytruncate copy.
_FINGERPRINT = 64
_CHUNK = 1 << 16
_DRAIN_BUDGET = 128  # chunks (8 MiB) read from one file before the loop looks at the others
# What watchdog must report; with append polling on, IN_MODIFY is not even requested from the kernel.
_STRUCTURAL_EVENTS = [FileCreatedEvent, FileMovedEvent, FileDeletedEvent]
_ALL_EVENTS = [FileModifiedEvent, *_STRUCTURAL_EVENTS]

LineCallback = Callable[[str, str], None]
PathCallback = Callable[[str], None]
ErrorCallback = Callable[[str, BaseException], None]


@dataclass(frozen=True, slots=True)
class FilePosition:
    """Where reading of one followed path stopped: the start of the first line not yet delivered.

    ``fingerprint`` (hex of up to 64 bytes before ``offset``; empty when unknown) guards against an
    inode number reused by a new file of sufficient size while kvwatch was down.
    """

    path: str
    dev: int
    inode: int
    offset: int
    fingerprint: str = ""

    def to_dict(self) -> JsonObject:
        """Plain JSON-able form for the state file."""
        return {
            "path": self.path,
            "dev": self.dev,
            "inode": self.inode,
            "offset": self.offset,
            "fingerprint": self.fingerprint,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, JsonValue]) -> FilePosition:
        """Inverse of ``to_dict``; raises KeyError/TypeError/ValueError on a malformed entry."""
        return cls(
            path=str(data["path"]),
            dev=_as_int(data["dev"]),
            inode=_as_int(data["inode"]),
            offset=_as_int(data["offset"]),
            fingerprint=str(data.get("fingerprint", "")),
        )


def _as_int(value: JsonValue) -> int:
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"expected a number, got {type(value).__name__}")


@dataclass(eq=False)
class _Reader:
    """One open file (one inode) and how far it has been read."""

    fd: int
    dev: int
    ino: int
    offset: int
    splitter: LineSplitter
    # First bytes of the current generation of this file (reset by a truncation) and the last
    # bytes before ``offset``: together they identify the data we have read.
    head: bytes = b""
    tail: bytes = b""
    last_growth: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class _Stream:
    """A followed path: its current file and the rotated-away files still being drained."""

    path: str
    reader: _Reader | None = None
    retired: list[_Reader] = field(default_factory=list)
    opened_once: bool = False
    # Error episodes, each counted once: the path cannot be opened (missing with nothing open,
    # unreadable, not a regular file), or reading the open file fails.
    failing: bool = False
    read_failing: bool = False
    resume: FilePosition | None = None


class _Bell:
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


def _has_magic(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


class _Doorbell(FileSystemEventHandler):
    """Hands watchdog events to the tailer; runs in watchdog's dispatcher thread."""

    def __init__(self, tailer: LogTailer) -> None:
        super().__init__()
        self._tailer = tailer

    def on_any_event(self, event: FileSystemEvent) -> None:
        self._tailer._on_fs_event(event)


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
        self.is_glob = _has_magic(self.pattern)
        self._on_line = on_line
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
        self._streams: dict[str, _Stream] = {}
        self._wake = _Bell()
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
        self._handler = _Doorbell(self)

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
            and not any(s.failing or s.read_failing for s in streams)
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

    @property
    def observer_kind(self) -> str:
        """'native' (inotify on Linux), 'polling', or 'native+polling' after an inotify limit was hit."""
        if self._observer is None:
            return "stopped"
        native = not isinstance(self._observer, PollingObserver)
        if native and self._fallback is not None:
            return "native+polling"
        return "native" if native else "polling"

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
                    self._streams[path] = _Stream(path, resume=self._resume.pop(path, None))

    def _sync_watches(self) -> None:
        """Watch the directories of the paths and of their symlink targets; route events to paths."""
        route: dict[str, str] = {}
        dirs: set[str] = set()
        for path in list(self._streams):
            for name in {path, os.path.realpath(path)}:
                parent = os.path.realpath(os.path.dirname(name))
                route[os.path.join(parent, os.path.basename(name))] = path
                route[name] = path
                dirs.add(parent)
        if self.is_glob:
            dirs.update(os.path.realpath(d) for d in glob.glob(os.path.dirname(self.pattern)))
        self._route = route
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

    def _poll(self, stream: _Stream, *, check_retired: bool, check_path: bool) -> None:
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

    def _check_identity(self, stream: _Stream) -> None:
        """Notice a rotation (the path names another file) or a file that appeared."""
        current = stream.reader
        try:
            st = os.stat(stream.path)
        except OSError as exc:
            # Between a rename and the new file's creation the path is missing: keep reading the
            # file we hold. Only a path with nothing open is an error.
            if current is None:
                self._fail(stream, exc)
            elif (
                self.is_glob
                and not stream.retired
                and time.monotonic() - current.last_growth >= self.retire_after
            ):
                self._forget(stream, current)
            return
        if current is not None and (st.st_dev, st.st_ino) == (current.dev, current.ino):
            return
        if not stat.S_ISREG(st.st_mode):
            if current is None:
                self._fail(stream, IsADirectoryError(f"not a regular file: {stream.path}"))
            return
        try:
            # O_NONBLOCK: a FIFO swapped in after the stat must not block the thread in open().
            fd = os.open(stream.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            self._fail(stream, exc)
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise IsADirectoryError(f"not a regular file: {stream.path}")
        except OSError as exc:
            os.close(fd)
            if current is None:
                self._fail(stream, exc)
            return
        dev, ino = st.st_dev, st.st_ino
        if current is not None and (dev, ino) == (current.dev, current.ino):
            os.close(fd)  # the path flipped back between stat and open; nothing changed
            return
        reader = _Reader(fd, dev, ino, 0, LineSplitter(self.max_line_chars))
        if stream.resume is not None and not stream.opened_once:
            self._apply_resume(stream, reader, stream.resume)
        stream.resume = None
        stream.failing = False
        if current is not None:
            # Rotation: finish the old file now, keep draining it a while (a writer that has not
            # reopened yet still appends to it), and read the new one from its start.
            self._drain(stream, current, retired=True)
            current.last_growth = time.monotonic()
            stream.retired.append(current)
            self._rotated(stream.path)
            self._rescan = True
            self._wake.set()
        elif stream.opened_once:
            self._rotated(stream.path)  # reappeared after being missing: delete-and-recreate
        stream.reader = reader
        stream.opened_once = True
        self._publish(stream.path, reader, reader.offset, reader.tail)
        self._drain(stream, reader, retired=False)

    def _apply_resume(self, stream: _Stream, reader: _Reader, pos: FilePosition) -> None:
        """Continue at a saved offset when it is the same file; else finish the old file first
        (renamed beside it while kvwatch was down) and read the new one from 0."""
        if self._matches(reader.fd, reader.dev, reader.ino, pos):
            self._seek(reader, pos.offset)
            return
        directory = os.path.dirname(os.path.realpath(stream.path))
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) != (pos.dev, pos.inode) or not stat.S_ISREG(st.st_mode):
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                return
            if self._matches(fd, st.st_dev, st.st_ino, pos):
                old = _Reader(fd, st.st_dev, st.st_ino, 0, LineSplitter(self.max_line_chars))
                self._seek(old, pos.offset)
                self._drain(stream, old, retired=True)
                stream.retired.append(old)
            else:
                os.close(fd)
            return

    @staticmethod
    def _matches(fd: int, dev: int, ino: int, pos: FilePosition) -> bool:
        if (dev, ino) != (pos.dev, pos.inode):
            return False
        try:
            if os.fstat(fd).st_size < pos.offset:
                return False
            if pos.fingerprint:
                want = bytes.fromhex(pos.fingerprint)
                return os.pread(fd, len(want), pos.offset - len(want)) == want
        except (OSError, ValueError):
            return False
        return True

    @staticmethod
    def _seek(reader: _Reader, offset: int) -> None:
        reader.offset = offset
        reader.head = os.pread(reader.fd, min(offset, _FINGERPRINT), 0)
        k = min(offset, _FINGERPRINT)
        reader.tail = os.pread(reader.fd, k, offset - k) if k else b""

    def _drain(self, stream: _Stream, reader: _Reader, *, retired: bool) -> bool | None:
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
                data = os.pread(reader.fd, k + _CHUNK, reader.offset - k)
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
            if len(reader.head) < _FINGERPRINT:
                reader.head = (reader.head + body)[:_FINGERPRINT]
            before = reader.tail
            reader.tail = (reader.tail + body[-_FINGERPRINT:])[-_FINGERPRINT:]
            self._feed(stream, reader, body, reader.offset - len(body), before, publish=not retired)
            if len(body) < _CHUNK:
                break
        return grew

    def _truncated(self, stream: _Stream, reader: _Reader) -> None:
        """copytruncate: recover what we had not read from the copy, then read again from 0."""
        if not self._recover_from_copy(stream, reader):
            reader.splitter.reset()  # its continuation is gone; don't glue it to a new line
        reader.offset = 0
        reader.head = b""
        reader.tail = b""
        self._publish(stream.path, reader, 0, b"")
        self._rotated(stream.path)

    def _recover_from_copy(self, stream: _Stream, reader: _Reader) -> bool:
        if not reader.head:
            return False
        directory, base = os.path.split(self._where(stream, reader))
        best: tuple[float, str] | None = None
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return False
        for entry in entries:
            if not entry.name.startswith(base) or entry.name == base:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(st.st_mode) or st.st_size < reader.offset:
                    continue
                if (st.st_dev, st.st_ino) == (reader.dev, reader.ino):
                    continue
                with open(entry.path, "rb") as fh:
                    if fh.read(len(reader.head)) != reader.head:
                        continue
                    fh.seek(reader.offset - len(reader.tail))
                    if fh.read(len(reader.tail)) != reader.tail:
                        continue
            except OSError:
                continue
            if best is None or st.st_mtime > best[0]:
                best = (st.st_mtime, entry.path)
        if best is None:
            return False
        try:
            with open(best[1], "rb") as fh:
                fh.seek(reader.offset)
                while chunk := fh.read(_CHUNK):
                    self._deliver(stream.path, reader.splitter.feed(chunk))
        except OSError as exc:
            self._report(best[1], exc)
        return True

    @staticmethod
    def _where(stream: _Stream, reader: _Reader) -> str:
        """The file's current name: Linux knows it from the descriptor even after a symlink swap."""
        try:
            name = os.readlink(f"/proc/self/fd/{reader.fd}")
            if name.startswith("/") and not name.endswith(" (deleted)"):
                return name
        except OSError:
            pass
        return os.path.realpath(stream.path)

    def _close(self, stream: _Stream, reader: _Reader) -> None:
        """A rotated-away file is finished: its last unterminated line is a line."""
        stream.retired.remove(reader)
        last = reader.splitter.flush()
        if last is not None:
            self._deliver(stream.path, [last])
        self._truncated_closed += reader.splitter.truncated
        os.close(reader.fd)

    def _forget(self, stream: _Stream, current: _Reader) -> None:
        """A glob match gone for good (say an old rank's file deleted): finish it, stop following it,
        so that files come and go under a glob without holding descriptors forever."""
        stream.reader = None
        stream.retired.append(current)
        self._close(stream, current)
        del self._streams[stream.path]
        with self._pub_lock:
            self._published.pop(stream.path, None)
        self._rescan = True

    def _feed(
        self, stream: _Stream, reader: _Reader, body: bytes, start: int, before: bytes, *, publish: bool
    ) -> None:
        """Deliver the lines that ``body`` (read at ``start``) completes.

        With ``publish``, the position after each line is published just before the line is handed
        to ``on_line``: inside the callback ``positions()`` includes that line, so a consumer can
        store exactly the position of the last line it applied.
        """
        if not publish:
            self._deliver(stream.path, reader.splitter.feed(body))
            return
        for line, end in reader.splitter.feed_ends(body):
            if self._stop.is_set():
                return  # the published position stays at the last line delivered
            fp = (
                body[end - _FINGERPRINT : end]
                if end >= _FINGERPRINT
                else (before + body[:end])[-_FINGERPRINT:]
            )
            with self._pub_lock:
                self._publish(stream.path, reader, start + end, fp)
                self._deliver(stream.path, (line,))

    def _publish(self, path: str, reader: _Reader, offset: int, fingerprint: bytes) -> None:
        with self._pub_lock:
            self._published[path] = (reader.dev, reader.ino, offset, fingerprint)

    def _deliver(self, path: str, lines: Iterable[str]) -> None:
        for line in lines:
            try:
                self._on_line(path, line)
            except Exception as exc:
                self.callback_errors += 1
                log.exception("on_line callback failed")
                self._report(path, exc)

    def _rotated(self, path: str) -> None:
        self.rotations += 1
        if self._on_rotate is not None:
            try:
                self._on_rotate(path)
            except Exception as exc:
                self.callback_errors += 1
                self._report(path, exc)

    def _fail(self, stream: _Stream, exc: BaseException, *, reading: bool = False) -> None:
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
