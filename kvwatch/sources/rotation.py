"""How the tailer reads its files: each to its end, and across rotation (a path naming another
file, a saved position of a file renamed while kvwatch was down, a file truncated in place --
copytruncate, recovered from its copy --, a rotated-away file finished and closed, a glob match gone
for good).

``Files`` is one part of LogTailer (kvwatch/sources/logfile.py): it holds the tailer's followed
paths and hands what it reads to the tailer's ``Delivery``. Its methods are called with the
tailer's lock held, from its reader thread or a ``refresh()``.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import threading
import time
from collections.abc import Callable

from kvwatch.sources.delivery import Delivery
from kvwatch.sources.files import CHUNK, FINGERPRINT, FilePosition, Reader, Stream, fingerprint_before
from kvwatch.sources.lines import LineSplitter

_DRAIN_BUDGET = 128  # chunks (8 MiB) read from one file before the loop looks at the others
_SEEN = 8  # identities a stream remembers (see Stream.seen)
# Rotated generations kvwatch cannot read as text: a stall that long loses them (see _skipped).
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4", ".Z", ".zip")


class Files:
    """The followed paths (``streams``) and their reading; ``truncated_closed`` counts the cut
    lines of files already closed."""

    def __init__(
        self,
        out: Delivery,
        stop: threading.Event,
        *,
        is_glob: bool,
        pattern: str,
        retire_after: float,
        max_line_chars: int,
        come_back: Callable[[str], None],
        rescan: Callable[[bool], None],
    ) -> None:
        """``come_back(path)``: read this path again on the loop's next turn (a drain left it
        unfinished); ``rescan(wake)``: look for paths and re-route watches, now when ``wake``."""
        self.streams: dict[str, Stream] = {}
        self.truncated_closed = 0
        self._out = out
        self._stop = stop
        self._is_glob = is_glob
        self._pattern = pattern
        self._retire_after = retire_after
        self._max_line_chars = max_line_chars
        self._come_back = come_back
        self._rescan = rescan

    def drain(self, stream: Stream, reader: Reader, *, retired: bool) -> bool | None:
        """Read ``reader`` to its current end and deliver the lines.

        Returns whether it grew, or None when a retired file turned out truncated (give it up).
        """
        grew = False
        budget = _DRAIN_BUDGET
        while not self._stop.is_set():
            if budget <= 0 and not retired:
                # A writer faster than us must not starve the other files and the re-check:
                # come back to this one on the next turn of the loop.
                self._come_back(stream.path)
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
                    self._out.fail(stream, exc, reading=True)
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
        out = self._out
        if not publish or out.by_chunk:
            lines = reader.splitter.feed(body)
            end = max(body.rfind(b"\n"), body.rfind(b"\r")) + 1
            with out.lock:
                if publish and lines:
                    out.publish(stream.path, reader, start + end, fingerprint_before(body, before, end))
                out.deliver(stream.path, lines)
            return
        for line, end in reader.splitter.feed_ends(body):
            if self._stop.is_set():
                return  # the published position stays at the last line delivered
            fp = fingerprint_before(body, before, end)
            with out.lock:
                out.publish(stream.path, reader, start + end, fp)
                out.deliver(stream.path, (line,))

    def check_identity(self, stream: Stream) -> None:
        """Notice a rotation (the path names another file) or a file that appeared."""
        current = stream.reader
        try:
            st = os.stat(stream.path)
        except OSError as exc:
            # Between a rename and the new file's creation the path is missing: keep reading the
            # file we hold. Only a path with nothing open is an error; either way it is not up.
            stream.missing = True
            if current is None:
                self._out.fail(stream, exc)
            elif (
                self._is_glob
                and not stream.retired
                and time.monotonic() - current.last_growth >= self._retire_after
            ):
                self._forget(stream, current)
            return
        stream.missing = False
        if current is not None and (st.st_dev, st.st_ino) == (current.dev, current.ino):
            return
        if not stat.S_ISREG(st.st_mode):
            if current is None:
                self._out.fail(stream, IsADirectoryError(f"not a regular file: {stream.path}"))
            return
        try:
            # O_NONBLOCK: a FIFO swapped in after the stat must not block the thread in open().
            fd = os.open(stream.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            self._out.fail(stream, exc)
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise IsADirectoryError(f"not a regular file: {stream.path}")
        except OSError as exc:
            os.close(fd)
            if current is None:
                self._out.fail(stream, exc)
            return
        dev, ino = st.st_dev, st.st_ino
        if current is not None and (dev, ino) == (current.dev, current.ino):
            os.close(fd)  # the path flipped back between stat and open; nothing changed
            return
        reader = Reader(fd, dev, ino, 0, LineSplitter(self._max_line_chars))
        if stream.resume is not None and not stream.opened_once:
            self._apply_resume(stream, reader, stream.resume)
        stream.resume = None
        stream.failing = False
        if current is not None:
            # Rotation: finish the old file now, keep draining it a while (a writer that has not
            # reopened yet still appends to it), then any generation rotated aside before we
            # noticed, and read the new one from its start.
            self.drain(stream, current, retired=True)
            current.last_growth = time.monotonic()
            stream.retired.append(current)
            self._out.rotated(stream.path)
            self._read_skipped(stream, current, (dev, ino))
            self._rescan(True)
        elif stream.opened_once:
            self._out.rotated(stream.path)  # reappeared after being missing: delete-and-recreate
        stream.reader = reader
        stream.opened_once = True
        stream.seen = [*stream.seen, (dev, ino)][-_SEEN:]
        self._out.publish(stream.path, reader, reader.offset, reader.tail)
        self.drain(stream, reader, retired=False)

    def _apply_resume(self, stream: Stream, reader: Reader, pos: FilePosition) -> None:
        """Continue at a saved offset when it is the same file; else finish the old file first
        (renamed beside it while kvwatch was down) and read the new one from 0."""
        if _matches(reader.fd, reader.dev, reader.ino, pos):
            _seek(reader, pos.offset)
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
            if _matches(fd, st.st_dev, st.st_ino, pos):
                old = Reader(fd, st.st_dev, st.st_ino, 0, LineSplitter(self._max_line_chars))
                _seek(old, pos.offset)
                self.drain(stream, old, retired=True)
                stream.retired.append(old)
                stream.seen.append((old.dev, old.ino))
                self._read_skipped(stream, old, (reader.dev, reader.ino))
            else:
                os.close(fd)
            return

    def _read_skipped(self, stream: Stream, held: Reader, new: tuple[int, int]) -> None:
        """Read, oldest first, the generations rotated aside after ``held`` that kvwatch never
        opened: a second rotation came before it noticed the first (a stalled sidecar, a CPU
        limit, kvwatch down across two rotations). Each is read from its start and kept draining
        like the held file, before the new file; each counts as a rotation followed."""
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
        for path, identity in _skipped(stream, held, new, self._pattern if self._is_glob else None):
            try:
                fd = os.open(path, flags)
            except FileNotFoundError:
                continue  # compressed or removed since the scan (a third rotation): gone
            except OSError as exc:
                self._out.report(path, exc)
                continue
            try:
                st = os.fstat(fd)
            except OSError as exc:
                os.close(fd)
                self._out.report(path, exc)
                continue
            if (st.st_dev, st.st_ino) != identity or not stat.S_ISREG(st.st_mode):
                os.close(fd)  # swapped since the scan: not the generation it found
                continue
            skipped = Reader(fd, st.st_dev, st.st_ino, 0, LineSplitter(self._max_line_chars))
            self.drain(stream, skipped, retired=True)
            stream.retired.append(skipped)
            stream.seen = [*stream.seen, (st.st_dev, st.st_ino)][-_SEEN:]
            self._out.rotated(stream.path)

    def _truncated(self, stream: Stream, reader: Reader) -> None:
        """copytruncate: recover what we had not read from the copy, then read again from 0."""
        if not self._recover_from_copy(stream, reader):
            reader.splitter.reset()  # its continuation is gone; don't glue it to a new line
        reader.offset = 0
        reader.head = b""
        reader.tail = b""
        self._out.publish(stream.path, reader, 0, b"")
        self._out.rotated(stream.path)

    def _recover_from_copy(self, stream: Stream, reader: Reader) -> bool:
        if not reader.head:
            return False
        copy = _copy_of(stream, reader)
        if copy is None:
            return False
        try:
            with open(copy, "rb") as fh:
                fh.seek(reader.offset)
                while chunk := fh.read(CHUNK):
                    self._out.deliver(stream.path, reader.splitter.feed(chunk))
        except OSError as exc:
            self._out.report(copy, exc)
        return True

    def close(self, stream: Stream, reader: Reader) -> None:
        """A rotated-away file is finished: its last unterminated line is a line."""
        stream.retired.remove(reader)
        last = reader.splitter.flush()
        if last is not None:
            self._out.deliver(stream.path, [last])
        self.truncated_closed += reader.splitter.truncated
        os.close(reader.fd)

    def close_all(self) -> None:
        """Close every file (the tailer stopped); unfinished lines are not delivered."""
        for stream in list(self.streams.values()):
            for reader in [*stream.retired, *([stream.reader] if stream.reader else [])]:
                self.truncated_closed += reader.splitter.truncated
                os.close(reader.fd)
            stream.retired.clear()
            stream.reader = None

    def _forget(self, stream: Stream, current: Reader) -> None:
        """A glob match gone for good (say an old rank's file deleted): finish it, stop following it,
        so that files come and go under a glob without holding descriptors forever."""
        stream.reader = None
        stream.retired.append(current)
        self.close(stream, current)
        del self.streams[stream.path]
        self._out.forget(stream.path)
        self._rescan(False)


def _matches(fd: int, dev: int, ino: int, pos: FilePosition) -> bool:
    """Whether the open file is the saved one: same inode, long enough, same bytes before the offset."""
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


def _skipped(
    stream: Stream, held: Reader, new: tuple[int, int], glob: str | None
) -> list[tuple[str, tuple[int, int]]]:
    """The files beside the path named ``<name>.<anything>`` (logrotate's ``.1``, ``-DATE``; the
    kubelet's ``.TIMESTAMP``), plain text, last written no earlier than the file we held, and none
    we have read, the held file or the new one: generations rotated aside unseen, oldest first.

    The kubelet keeps only the newest rotated generation uncompressed (pkg/kubelet/logs/
    container_log_manager.go: rotateLog gzips every rotated file with compressLog, then
    rotateLatestLog renames the live one), so a stall across two rotations leaves exactly one such
    file; across three, the middle one is gzipped and its lines are lost.
    A name the tailer's own glob matches is followed as a path of its own, not here."""
    directory = os.path.dirname(os.path.realpath(stream.path))
    base = os.path.basename(stream.path) + "."
    try:
        floor = os.fstat(held.fd).st_mtime_ns
        entries = list(os.scandir(directory))
    except OSError:
        return []
    known = {*stream.seen, (held.dev, held.ino), new, *((r.dev, r.ino) for r in stream.retired)}
    found: list[tuple[int, str, tuple[int, int]]] = []
    for entry in entries:
        if not entry.name.startswith(base) or entry.name.endswith(_COMPRESSED):
            continue
        if glob is not None and fnmatch.fnmatchcase(entry.path, glob):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in known and st.st_mtime_ns >= floor:
            found.append((st.st_mtime_ns, entry.path, (st.st_dev, st.st_ino)))
    return [(path, identity) for _mtime, path, identity in sorted(found)]


def _seek(reader: Reader, offset: int) -> None:
    reader.offset = offset
    reader.head = os.pread(reader.fd, min(offset, FINGERPRINT), 0)
    k = min(offset, FINGERPRINT)
    reader.tail = os.pread(reader.fd, k, offset - k) if k else b""


def _copy_of(stream: Stream, reader: Reader) -> str | None:
    """The newest file beside ours that starts with what ours started with and holds what we read
    before our offset: the copy a copytruncate made."""
    directory, base = os.path.split(_where(stream, reader))
    best: tuple[float, str] | None = None
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return None
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
    return None if best is None else best[1]


def _where(stream: Stream, reader: Reader) -> str:
    """The file's current name: Linux knows it from the descriptor even after a symlink swap."""
    try:
        name = os.readlink(f"/proc/self/fd/{reader.fd}")
        if name.startswith("/") and not name.endswith(" (deleted)"):
            return name
    except OSError:
        pass
    return os.path.realpath(stream.path)
