"""HTTP/1.1 messages as kvwatch's server reads and writes them: request heads in, whole responses out."""

from __future__ import annotations

import dataclasses
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
    """One parsed request head; header names are lower case."""

    method: str
    target: str
    headers: dict[str, str]
    client: str

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


def parse_head(head: bytes, client: str) -> tuple[Request | None, bool]:
    """(request, keep-alive) of one request head; (None, False) when it is not HTTP/1.x."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        return None, False
    line, *lines = text.split("\r\n")
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
