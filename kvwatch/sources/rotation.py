"""How the tailer follows a path across rotation: a path naming another file, a saved position of a
file renamed while kvwatch was down, a file truncated in place (copytruncate, recovered from its
copy), a rotated-away file finished and closed, a glob match gone for good.

``RotationHandling`` is a part of LogTailer (kvwatch/sources/logfile.py), which holds the state;
the methods here are called with its lock held, from its reader thread or a ``refresh()``.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable

from kvwatch.sources.files import CHUNK, FINGERPRINT, FilePosition, Reader, Stream
from kvwatch.sources.lines import LineSplitter
from kvwatch.sources.watch import Bell


class RotationHandling(ABC):
    """LogTailer's rotation and identity handling (a mixin: the attributes are the tailer's)."""

    is_glob: bool
    retire_after: float
    max_line_chars: int
    _rescan: bool
    _wake: Bell
    _streams: dict[str, Stream]
    _pub_lock: threading.RLock
    _published: dict[str, tuple[int, int, int, bytes]]
    _truncated_closed: int

    @abstractmethod
    def _drain(self, stream: Stream, reader: Reader, *, retired: bool) -> bool | None:
        """Provided by LogTailer."""

    @abstractmethod
    def _fail(self, stream: Stream, exc: BaseException, *, reading: bool = False) -> None:
        """Provided by LogTailer."""

    @abstractmethod
    def _rotated(self, path: str) -> None:
        """Provided by LogTailer."""

    @abstractmethod
    def _publish(self, path: str, reader: Reader, offset: int, fingerprint: bytes) -> None:
        """Provided by LogTailer."""

    @abstractmethod
    def _deliver(self, path: str, lines: Iterable[str]) -> None:
        """Provided by LogTailer."""

    @abstractmethod
    def _report(self, path: str, exc: BaseException) -> None:
        """Provided by LogTailer."""

    def _check_identity(self, stream: Stream) -> None:
        """Notice a rotation (the path names another file) or a file that appeared."""
        current = stream.reader
        try:
            st = os.stat(stream.path)
        except OSError as exc:
            # Between a rename and the new file's creation the path is missing: keep reading the
            # file we hold. Only a path with nothing open is an error; either way it is not up.
            stream.missing = True
            if current is None:
                self._fail(stream, exc)
            elif (
                self.is_glob
                and not stream.retired
                and time.monotonic() - current.last_growth >= self.retire_after
            ):
                self._forget(stream, current)
            return
        stream.missing = False
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
        reader = Reader(fd, dev, ino, 0, LineSplitter(self.max_line_chars))
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

    def _apply_resume(self, stream: Stream, reader: Reader, pos: FilePosition) -> None:
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
                old = Reader(fd, st.st_dev, st.st_ino, 0, LineSplitter(self.max_line_chars))
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
    def _seek(reader: Reader, offset: int) -> None:
        reader.offset = offset
        reader.head = os.pread(reader.fd, min(offset, FINGERPRINT), 0)
        k = min(offset, FINGERPRINT)
        reader.tail = os.pread(reader.fd, k, offset - k) if k else b""

    def _truncated(self, stream: Stream, reader: Reader) -> None:
        """copytruncate: recover what we had not read from the copy, then read again from 0."""
        if not self._recover_from_copy(stream, reader):
            reader.splitter.reset()  # its continuation is gone; don't glue it to a new line
        reader.offset = 0
        reader.head = b""
        reader.tail = b""
        self._publish(stream.path, reader, 0, b"")
        self._rotated(stream.path)

    def _recover_from_copy(self, stream: Stream, reader: Reader) -> bool:
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
                while chunk := fh.read(CHUNK):
                    self._deliver(stream.path, reader.splitter.feed(chunk))
        except OSError as exc:
            self._report(best[1], exc)
        return True

    @staticmethod
    def _where(stream: Stream, reader: Reader) -> str:
        """The file's current name: Linux knows it from the descriptor even after a symlink swap."""
        try:
            name = os.readlink(f"/proc/self/fd/{reader.fd}")
            if name.startswith("/") and not name.endswith(" (deleted)"):
                return name
        except OSError:
            pass
        return os.path.realpath(stream.path)

    def _close(self, stream: Stream, reader: Reader) -> None:
        """A rotated-away file is finished: its last unterminated line is a line."""
        stream.retired.remove(reader)
        last = reader.splitter.flush()
        if last is not None:
            self._deliver(stream.path, [last])
        self._truncated_closed += reader.splitter.truncated
        os.close(reader.fd)

    def _forget(self, stream: Stream, current: Reader) -> None:
        """A glob match gone for good (say an old rank's file deleted): finish it, stop following it,
        so that files come and go under a glob without holding descriptors forever."""
        stream.reader = None
        stream.retired.append(current)
        self._close(stream, current)
        del self._streams[stream.path]
        with self._pub_lock:
            self._published.pop(stream.path, None)
        self._rescan = True
