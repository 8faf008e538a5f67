"""Turn a byte stream into whole text lines, the unit every parser works on.

Reads arrive in arbitrary chunks (a write may be split across two reads), so the unfinished tail is
kept until its newline arrives. Logs are not trusted: bytes that are not UTF-8 become U+FFFD instead
of an exception, and a line longer than the cap is truncated (and counted) so that a runaway writer
without newlines cannot make the sidecar's memory grow without bound.
"""

from __future__ import annotations

# A UTF-8 character is at most 4 bytes, so keeping 4 bytes per allowed character is always enough
# to decode the first ``max_line_chars`` characters of a line.
_BYTES_PER_CHAR = 4


class LineSplitter:
    """Split byte chunks into lines, keeping the partial tail between calls.

    ``\\n`` and ``\\r\\n`` both end a line and are stripped. Not thread-safe: one splitter per stream.
    """

    __slots__ = ("max_line_chars", "truncated", "_cap", "_buf", "_dropped")

    def __init__(self, max_line_chars: int = 65536) -> None:
        if max_line_chars < 1:
            raise ValueError("max_line_chars must be at least 1")
        self.max_line_chars = max_line_chars
        # Lines cut to max_line_chars so far (the metric 'lines truncated').
        self.truncated = 0
        self._cap = max_line_chars * _BYTES_PER_CHAR
        self._buf = bytearray()
        # Bytes of the current partial line that were discarded because it passed the cap.
        self._dropped = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes received since the last newline (kept or dropped): the unfinished line's length.

        A reader's resumable offset is ``bytes read - pending_bytes``: the start of that line.
        """
        return len(self._buf) + self._dropped

    def feed(self, data: bytes) -> list[str]:
        """Return the lines completed by ``data``; keep what follows the last newline."""
        if not data:
            return []
        pieces = data.split(b"\n")
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
            for piece in pieces[1:]:
                out.append(self._finish(piece, False))
        self._keep(tail)
        return out

    def flush(self) -> str | None:
        """Return the unfinished line as a line (the stream ended without a newline), or None."""
        if not self._buf and not self._dropped:
            return None
        line = self._finish(bytes(self._buf), self._dropped > 0)
        self.reset()
        return line

    def reset(self) -> None:
        """Forget the unfinished line (the stream it belonged to is gone)."""
        self._buf.clear()
        self._dropped = 0

    def _keep(self, tail: bytes) -> None:
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
