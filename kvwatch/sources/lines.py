"""Turn a byte stream into whole lines, the unit every parser works on: the only splitter.

Reads arrive in arbitrary chunks (a write may be split across two reads), so the unfinished tail is
kept until its newline arrives. Logs are not trusted: bytes that are not UTF-8 become U+FFFD instead
of an exception, and a line longer than the cap is truncated (and counted) so that a runaway writer
without newlines cannot make the sidecar's memory grow without bound.

``LineSplitter`` gives either decoded lines (``feed``, the tailer and stdin) or blocks of raw
whole lines (``feed_raw``, replay's bulk path, which decodes only the lines it must);
``read_blocks`` drives the raw form over a binary stream.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

# Replay's read size: one reused buffer of this many bytes.
READ_BLOCK_BYTES = 1 << 20

# (block, pos, endpos): ``block[pos:endpos]`` is whole raw lines, each preceded by b"\n".
RawBlock = tuple["bytes | bytearray", int, int]

# Line ends as the splitter reads them (CRLF, a lone CR, LF), for the offsets of ``feed_ends``.
_LINE_END = re.compile(rb"\r\n?|\n")

# A UTF-8 character is at most 4 bytes, so keeping 4 bytes per allowed character is always enough
# to decode the first ``max_line_chars`` characters of a line.
_BYTES_PER_CHAR = 4


class LineSplitter:
    """Split byte chunks into lines, keeping the partial tail between calls.

    ``\\n``, ``\\r\\n`` and a lone ``\\r`` (what progress bars write between redraws) each end a
    line and are stripped; a ``\\r\\n`` split across two chunks is still one line end. Not
    thread-safe: one splitter per stream.
    """

    __slots__ = ("max_line_chars", "truncated", "_cap", "_buf", "_dropped", "_after_cr")

    def __init__(self, max_line_chars: int = 65536) -> None:
        if max_line_chars < 1:
            raise ValueError("max_line_chars must be at least 1")
        self.max_line_chars = max_line_chars
        # Lines cut to max_line_chars so far (the metric 'lines truncated').
        self.truncated = 0
        # Room for max_line_chars + 1 characters: enough to tell an over-long line (feed_raw hands
        # the pipeline that many, so it can see and count the line as over-long).
        self._cap = (max_line_chars + 1) * _BYTES_PER_CHAR
        self._buf = bytearray()
        # Bytes of the current partial line that were discarded because it passed the cap.
        self._dropped = 0
        # The last chunk ended in b"\r": a b"\n" opening the next one completes that CRLF.
        self._after_cr = False

    @property
    def pending_bytes(self) -> int:
        """Bytes received since the last newline (kept or dropped): the unfinished line's length.

        A reader's resumable offset is ``bytes read - pending_bytes``: the start of that line.
        """
        return len(self._buf) + self._dropped

    def _line_ends(self, data: bytes | bytearray, start: int, end: int) -> tuple[bytes | bytearray, int, int]:
        """``data[start:end]`` with every line end as b"\n" (a copy only when it holds a b"\r")."""
        if self._after_cr and start < end:
            self._after_cr = False
            if data[start] == 0x0A:
                start += 1
        if data.find(b"\r", start, end) < 0:
            return data, start, end
        part = bytes(data[start:end])
        self._after_cr = part.endswith(b"\r")
        part = part.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return part, 0, len(part)

    def feed(self, data: bytes) -> list[str]:
        """Return the lines completed by ``data``; keep what follows the last newline."""
        if not data:
            return []
        ended, start, end = self._line_ends(data, 0, len(data))
        pieces = bytes(ended[start:end] if start or end != len(ended) else ended).split(b"\n")
        tail = pieces.pop()
        out: list[str] = []
        if pieces:
            first = pieces[0]
            if self._buf or self._dropped:
                overflow = self._dropped > 0
                room = self._cap - len(self._buf)
                if len(first) > room:
                    self._buf += first[:room]
                    overflow = True
                else:
                    self._buf += first
                out.append(self._finish(bytes(self._buf), overflow))
                self._buf.clear()
                self._dropped = 0
            else:
                out.append(self._finish(first, False))
            rest = pieces[1:]
            if rest and max(map(len, rest)) <= self.max_line_chars:
                # No line here can be cut (its bytes are at most the cap, its characters fewer)
                # and none ends in b"\r" (_line_ends made every end b"\n"): one decode for all.
                # UTF-8 never uses the byte b"\n" inside a character, so this is the same text
                # as decoding each line on its own, invalid bytes replaced alike.
                out.extend(b"\n".join(rest).decode("utf-8", errors="replace").split("\n"))
            else:
                for piece in rest:
                    out.append(self._finish(piece, False))
        self._keep(tail)
        return out

    def feed_ends(self, data: bytes) -> list[tuple[str, int]]:
        """``feed``, with the offset in ``data`` just past each completed line's terminator (where
        a reader resumes to read the next line)."""
        skip = 1 if self._after_cr and data[:1] == b"\n" else 0
        lines = self.feed(data)
        return list(zip(lines, (m.end() for m in _LINE_END.finditer(data, skip)), strict=False))

    def feed_raw(self, data: bytes | bytearray, size: int | None = None) -> list[RawBlock]:
        """The lines completed by ``data[:size]`` as raw blocks (no decoding, no CR stripping).

        At most two blocks: the line the previous chunk left unfinished (kept to max_line_chars + 1
        characters), then the whole lines inside ``data``, handed on without copying ``data`` (read
        it before reusing the buffer). What follows the last newline is kept, as ``feed`` keeps it.
        """
        data, start, end = self._line_ends(data, 0, len(data) if size is None else size)
        first = data.find(b"\n", start, end)
        if first < 0:
            self._keep(data[start:end])
            return []
        self._keep(data[start:first])
        line = b"\n" + self._first_chars()
        self._clear()
        out: list[RawBlock] = [(line, 0, len(line))]
        last = data.rfind(b"\n", 0, end)
        if last > first:
            out.append((data, first, last))
        self._keep(data[last + 1 : end])
        return out

    def flush_raw(self) -> list[RawBlock]:
        """The unfinished line as a raw block (the stream ended without a newline), or none."""
        if not self._buf:
            self._clear()
            return []
        line = b"\n" + self._first_chars()
        self._clear()
        return [(line, 0, len(line))]

    def _first_chars(self) -> bytes:
        """The kept line's first max_line_chars + 1 characters (invalid bytes count as replaced), as UTF-8."""
        data = bytes(self._buf)
        keep = self.max_line_chars + 1
        if len(data) <= keep:
            return data
        return data.decode("utf-8", "replace")[:keep].encode("utf-8")

    def flush(self) -> str | None:
        """Return the unfinished line as a line (the stream ended without a newline), or None."""
        if not self._buf and not self._dropped:
            return None
        line = self._finish(bytes(self._buf), self._dropped > 0)
        self.reset()
        return line

    def reset(self) -> None:
        """Forget the unfinished line (the stream it belonged to is gone)."""
        self._clear()
        self._after_cr = False

    def _clear(self) -> None:
        self._buf.clear()
        self._dropped = 0

    def _keep(self, tail: bytes | bytearray) -> None:
        if not tail:
            return
        room = self._cap - len(self._buf)
        if len(tail) > room:
            if room > 0:
                self._buf += tail[:room]
            self._dropped += len(tail) - max(room, 0)
        else:
            self._buf += tail

    def _finish(self, raw: bytes, overflow: bool) -> str:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if len(raw) > self._cap:
            raw = raw[: self._cap]
            overflow = True
        text = raw.decode("utf-8", errors="replace")
        if overflow or len(text) > self.max_line_chars:
            self.truncated += 1
            text = text[: self.max_line_chars]
        return text


def read_blocks(
    stream: io.BufferedIOBase, max_line_chars: int, block_bytes: int = READ_BLOCK_BYTES
) -> Iterator[RawBlock]:
    """A binary stream read to EOF as raw blocks of whole lines (``LineSplitter.feed_raw``).

    Memory stays bounded by the block size: one buffer for the whole stream (a fresh object per
    read costs page faults and zeroing); each block is yielded before the next read overwrites it.
    """
    splitter = LineSplitter(max_line_chars)
    buffer = bytearray(block_bytes)
    while size := stream.readinto(buffer):
        yield from splitter.feed_raw(buffer, size)
    yield from splitter.flush_raw()
