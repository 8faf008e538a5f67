"""HTTP/1.1 messages as kvwatch's server reads and writes them: request heads in, whole responses out."""

from __future__ import annotations

import dataclasses
import time
from email.utils import formatdate

from kvwatch import __version__

REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclasses.dataclass(frozen=True)
class Request:
    """One parsed request head; header names are lower case; ``received``: when it was read
    (time.monotonic), so a response computed after it may be shared with it."""

    method: str
    target: str
    headers: dict[str, str]
    client: str
    received: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def path(self) -> str:
        """The target without its query string."""
        return self.target.split("?", 1)[0]


@dataclasses.dataclass
class Response:
    """What a handler answers; the server adds Content-Length, Date, Server and Connection."""

    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = dataclasses.field(default_factory=list)


def drop_empty_lines(buf: bytearray) -> None:
    """Drop the empty lines a request may follow (RFC 9112 2.2: a server should ignore them)."""
    while buf[:1] == b"\n" or buf[:2] == b"\r\n":
        del buf[: 1 if buf[0] == 10 else 2]


def head_end(buf: bytes | bytearray) -> tuple[int, int]:
    """Where the request head in ``buf`` ends and what follows it begins; (-1, -1) while incomplete.

    The head ends at its first empty line. Lines end in CRLF, or in a bare LF, which RFC 9112 2.2
    lets a server accept (some clients and hand-written probes send it).
    """
    lf = buf.find(b"\n\n")
    crlf = buf.find(b"\n\r\n")
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf, crlf + 3
    return (lf, lf + 2) if lf >= 0 else (-1, -1)


def parse_head(head: bytes, client: str) -> tuple[Request | None, bool]:
    """(request, keep-alive) of one request head (as ``head_end`` cut it, without its last line
    end); (None, False) when it is not HTTP/1.x."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        return None, False
    line, *lines = (raw.removesuffix("\r") for raw in text.split("\n"))
    if "\r" in line or any("\r" in raw for raw in lines):
        # A bare CR is no line end (RFC 9112 2.2): read as one, it could split a header in two.
        return None, False
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1]:
        return None, False
    method, target, version = parts
    headers: dict[str, str] = {}
    for raw in lines:
        name, sep, value = raw.partition(":")
        if not sep or not name or name != name.strip():
            return None, False
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    connection = headers.get("connection", "").lower()
    keep_alive = "keep-alive" in connection if version == "HTTP/1.0" else "close" not in connection
    # A body is never read: a request announcing one is answered, then its connection closed.
    if headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in headers:
        keep_alive = False
    return Request(method, target, headers, client), keep_alive


def serialize(response: Response, keep_alive: bool, *, with_body: bool = True) -> bytes:
    """Status line, headers and (unless HEAD) body of one response, as one buffer."""
    lines = [
        f"HTTP/1.1 {response.status} {REASONS.get(response.status, 'Unknown')}",
        f"Server: kvwatch/{__version__}",
        f"Date: {formatdate(usegmt=True)}",
        *(f"{name}: {value}" for name, value in response.headers),
        f"Content-Length: {len(response.body)}",
        f"Connection: {'keep-alive' if keep_alive else 'close'}",
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + response.body if with_body else head
