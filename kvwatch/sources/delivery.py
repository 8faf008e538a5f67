"""Where the tailer's lines go: the callbacks, the position published with each line, the counters.

``Delivery`` is one part of LogTailer (kvwatch/sources/logfile.py), shared with the file reading
(kvwatch/sources/rotation.py): both hand lines on, publish positions and report errors through it,
so a line and its position are published under one lock wherever the line was read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from kvwatch.sources.files import FilePosition, Reader, Stream

log = logging.getLogger("kvwatch.sources.logfile")

LineCallback = Callable[[str, str], None]
LinesCallback = Callable[[str, list[str]], None]
PathCallback = Callable[[str], None]
ErrorCallback = Callable[[str, BaseException], None]


class Delivery:
    """The tailer's callbacks and what they were handed: positions, rotations, errors."""

    def __init__(
        self,
        on_line: LineCallback,
        on_lines: LinesCallback | None,
        on_rotate: PathCallback | None,
        on_error: ErrorCallback | None,
    ) -> None:
        self._on_line = on_line
        # Or lines by read chunk (a busy log's cost is per call): the position after a chunk's last
        # line is published before the chunk is handed on; a stop takes effect after it.
        self._on_lines = on_lines
        self._on_rotate = on_rotate
        self._on_error = on_error
        self.by_chunk = on_lines is not None
        # Position after the last line delivered per path: (dev, inode, offset, bytes before offset).
        # Held while a line is published and handed to on_line, so positions() never sees one
        # without the other (re-entrant: on_line may call positions()).
        self.lock = threading.RLock()
        self._published: dict[str, tuple[int, int, int, bytes]] = {}
        # Counters (monotonic) for kvwatch's self-metrics.
        self.rotations = 0
        self.read_errors = 0
        self.callback_errors = 0

    def positions(self) -> dict[str, FilePosition]:
        """The published position of every path (LogTailer.positions)."""
        with self.lock:
            items = list(self._published.items())
        return {
            path: FilePosition(path, dev, ino, offset, fingerprint.hex())
            for path, (dev, ino, offset, fingerprint) in items
        }

    def publish(self, path: str, reader: Reader, offset: int, fingerprint: bytes) -> None:
        with self.lock:
            self._published[path] = (reader.dev, reader.ino, offset, fingerprint)

    def forget(self, path: str) -> None:
        """A path no longer followed has no position."""
        with self.lock:
            self._published.pop(path, None)

    def deliver(self, path: str, lines: Iterable[str]) -> None:
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
            self.report(path, exc)

    def rotated(self, path: str) -> None:
        self.rotations += 1
        if self._on_rotate is not None:
            try:
                self._on_rotate(path)
            except Exception as exc:
                self.callback_errors += 1
                self.report(path, exc)

    def fail(self, stream: Stream, exc: BaseException, *, reading: bool = False) -> None:
        """Count and report an error episode of ``stream`` once (opening it, or reading it)."""
        if stream.read_failing if reading else stream.failing:
            return
        if reading:
            stream.read_failing = True
        else:
            stream.failing = True
        self.read_errors += 1
        log.warning("cannot read %s: %s (retrying)", stream.path, exc)
        self.report(stream.path, exc)

    def report(self, path: str, exc: BaseException) -> None:
        if self._on_error is None:
            return
        try:
            self._on_error(path, exc)
        except Exception:
            log.exception("on_error callback failed")
