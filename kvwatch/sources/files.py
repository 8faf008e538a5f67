"""What the log tailer knows of each followed file: saved positions, open files, followed paths.

``FilePosition`` is what the state file keeps (a path, its inode and how far it was read, with the
bytes before that offset as a fingerprint); ``Reader`` is one open file and ``Stream`` one followed
path with the rotated-away files still being drained (kvwatch/sources/logfile.py reads them).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvwatch.core.jsontypes import JsonObject, JsonValue
from kvwatch.sources.lines import LineSplitter

# How many bytes identify a position in a file: the last bytes before the offset (and the first
# bytes of the file) are compared to notice truncation and to find a copytruncate copy.
FINGERPRINT = 64
CHUNK = 1 << 16


def fingerprint_before(body: bytes, before: bytes, end: int) -> bytes:
    """The FINGERPRINT bytes before offset ``end`` of ``body`` (``before``: the bytes ahead of it)."""
    return body[end - FINGERPRINT : end] if end >= FINGERPRINT else (before + body[:end])[-FINGERPRINT:]


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
class Reader:
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
    # Bytes at the start of the file whose blocks kvwatch gave back (kvwatch/sources/release.py).
    released: int = 0


@dataclass(eq=False)
class Stream:
    """A followed path: its current file and the rotated-away files still being drained."""

    path: str
    reader: Reader | None = None
    retired: list[Reader] = field(default_factory=list)
    opened_once: bool = False
    # Error episodes, each counted once: the path cannot be opened (missing with nothing open,
    # unreadable, not a regular file), or reading the open file fails.
    failing: bool = False
    read_failing: bool = False
    # The path names no file while the file it named is still open (deleted, or mid-rotation):
    # that file is still read to its end, but the source is not up (kvwatch_source_up 0).
    missing: bool = False
    resume: FilePosition | None = None
    # (dev, inode) of the files this path has named while we read it, newest last: a rotated-aside
    # file among them was read already and is never taken for a generation we skipped.
    seen: list[tuple[int, int]] = field(default_factory=list)
