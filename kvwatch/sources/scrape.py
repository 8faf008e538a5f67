"""HTTP GET of an engine's /metrics: the I/O half of the metrics source (MetricsReader is the other).

``Scraper.fetch`` never raises: every failure comes back as a ``ScrapeResult`` whose ``error`` is
one of ``kvwatch.export.names.SCRAPE_ERROR_REASONS``, so the sidecar counts it and tries again next
interval. The whole exchange is bounded by deadlines, not per-read timeouts: ``connect_timeout``
for the TCP connect and TLS handshake, ``read_timeout`` from then on for the request, the response
headers and the body, and ``timeout`` (when given) for all of it from the start; every send and
receive waits only for what is left of them, so a server that drips its headers or body one byte at
a time still stops there. ``max_bytes`` bounds the body on the wire and again after gzip decoding
(so a compressed bomb stops at the cap too). With a ``sink``, the body is never held whole: each piece is decoded
(UTF-8, incrementally) and handed over as it arrives, so a 16 MiB exposition costs the reader's
memory, not the body's. ``abort`` (from another thread) ends a fetch in progress at once. Only
configuration mistakes raise, at construction, as ConfigError.
Standard library only (http.client, ssl, zlib): the sidecar needs nothing a dependency would add.
"""

from __future__ import annotations

import codecs
import contextlib
import http.client
import io
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

from kvwatch import __version__
from kvwatch.core.errors import ConfigError

_CHUNK = 64 * 1024
# Prometheus' classic text format: what prometheus_client.parser reads (no OpenMetrics negotiation).
_ACCEPT = "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"


@dataclass(frozen=True)
class ScrapeResult:
    """One attempt: the decoded body when ok, else the reason (a SCRAPE_ERROR_REASONS value)."""

    ok: bool
    text: str | None
    duration_seconds: float
    error: str | None
    status: int | None
    # A short human-readable cause for the sidecar's log line (never used as a label).
    detail: str | None = None


class _Failure(Exception):
    def __init__(self, reason: str, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.status = status


class Scraper:
    """Fetches one /metrics URL; reusable, holds no connection between fetches."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float = 2.0,
        read_timeout: float = 5.0,
        timeout: float | None = None,
        bearer_token: str | None = None,
        ca_file: str | None = None,
        insecure_skip_verify: bool = False,
        max_bytes: int = 16 * 2**20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        try:
            parts = urlsplit(url)
            self._port = parts.port
        except ValueError as exc:
            raise ConfigError(f"bad metrics URL {url!r}: {exc}") from exc
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"metrics URL must be http:// or https:// with a host, got {url!r}")
        if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
            raise ConfigError(f"metrics URL contains spaces or control characters: {url!r}")
        if connect_timeout <= 0 or read_timeout <= 0 or (timeout is not None and timeout <= 0):
            raise ConfigError("scrape timeouts must be positive")
        if max_bytes <= 0:
            raise ConfigError("scrape max_bytes must be positive")
        if bearer_token is not None and (not bearer_token.strip() or any(c in bearer_token for c in "\r\n")):
            raise ConfigError("bearer token is empty or contains a line break")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._timeout = connect_timeout + read_timeout if timeout is None else timeout
        self._max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._aborted = False
        self._headers = {
            "Accept": _ACCEPT,
            "Accept-Encoding": "gzip",
            "User-Agent": f"kvwatch/{__version__}",
        }
        if bearer_token is not None:
            self._headers["Authorization"] = f"Bearer {bearer_token.strip()}"
        self._tls: ssl.SSLContext | None = None
        if self._https:
            try:
                self._tls = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"cannot load CA file {ca_file!r}: {exc}") from exc
            if insecure_skip_verify:
                self._tls.check_hostname = False
                self._tls.verify_mode = ssl.CERT_NONE

    def fetch(self, sink: Callable[[str], None] | None = None) -> ScrapeResult:
        """GET the URL once; never raises (``sink`` must not either).

        Without ``sink`` the decoded body is the result's ``text``; with it, the body goes to
        ``sink`` piece by piece as it arrives and ``text`` is None.
        """
        start = self._clock()
        try:
            status, text = self._get(sink, start + self._timeout)
        except _Failure as f:
            return ScrapeResult(False, None, self._clock() - start, f.reason, f.status, f.detail)
        except TimeoutError as exc:  # socket.timeout is TimeoutError since 3.10
            return ScrapeResult(False, None, self._clock() - start, "timeout", None, str(exc) or "timed out")
        except (OSError, http.client.HTTPException, ValueError) as exc:
            # Refused, reset, DNS, TLS handshake, a reply that is not HTTP.
            detail = f"{type(exc).__name__}: {exc}"
            return ScrapeResult(False, None, self._clock() - start, "connection", None, detail)
        return ScrapeResult(True, text, self._clock() - start, None, status)

    def _connection(self) -> http.client.HTTPConnection:
        # Only for writing the request (Host header, default port): the socket is _open()'s.
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, context=self._tls)
        return http.client.HTTPConnection(self._host, self._port)

    def abort(self) -> None:
        """End the fetch in progress now (it fails as a connection error), and every later one."""
        with self._lock:
            self._aborted = True
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _hold(self, sock: socket.socket | None) -> None:
        """Make ``sock`` the one ``abort`` shuts down; raises when abort came first."""
        with self._lock:
            self._sock = sock
            if self._aborted and sock is not None:
                raise _Failure("connection", "scraper stopped")

    def _open(self, deadline: float) -> socket.socket:
        """A connected socket (TLS handshake done) within ``connect_timeout`` and ``deadline``."""
        connect_by = min(deadline, self._clock() + self._connect_timeout)
        port = self._port or (443 if self._https else 80)
        error: OSError = OSError(f"no address for {self._host}")
        for family, kind, proto, _, address in socket.getaddrinfo(self._host, port, type=socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            try:
                self._hold(sock)
                sock.settimeout(_left(connect_by, self._clock(), self._connect_timeout))
                sock.connect(address)
            except OSError as exc:  # this address failed: the next one, while time is left
                sock.close()
                error = exc
                if isinstance(exc, TimeoutError):
                    raise
                continue
            except BaseException:
                sock.close()
                raise
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is None:
                return sock
            tls: ssl.SSLSocket | None = None
            try:
                tls = self._tls.wrap_socket(sock, server_hostname=self._host, do_handshake_on_connect=False)
                self._hold(tls)
                # One handshake, one deadline: CPython's ssl bounds the whole call by the timeout.
                tls.settimeout(_left(connect_by, self._clock(), self._connect_timeout))
                tls.do_handshake()
            except BaseException:
                (sock if tls is None else tls).close()
                raise
            return tls
        raise error

    def _get(self, sink: Callable[[str], None] | None, deadline: float) -> tuple[int, str | None]:
        if self._aborted:
            raise _Failure("connection", "scraper stopped")
        sock = self._open(deadline)
        conn = self._connection()
        conn.sock = sock
        try:
            reply_by = min(deadline, self._clock() + self._read_timeout)
            budget = min(self._timeout, self._read_timeout)
            sock.settimeout(_left(reply_by, self._clock(), budget))  # sendall: one bound for the request
            conn.request("GET", self._path, headers=self._headers)
            # The reply is read through a reader that gives each receive only what is left until
            # reply_by: http.client's own reads (status line, headers, chunk sizes) get a fresh
            # socket timeout each, which a server dripping a byte at a time would never reach.
            resp = http.client.HTTPResponse(
                cast(socket.socket, _DeadlineReader(sock, reply_by, budget, self._clock)), method="GET"
            )
            resp.begin()
            if resp.status != 200:
                raise _Failure("http_status", f"HTTP {resp.status} {resp.reason}", resp.status)
            length = resp.getheader("Content-Length")
            if length is not None and length.isascii() and length.isdigit() and int(length) > self._max_bytes:
                raise _Failure("too_large", f"Content-Length {length} > {self._max_bytes}", resp.status)
            encoding = (resp.getheader("Content-Encoding") or "identity").strip().lower()
            if encoding not in ("identity", "gzip"):
                raise _Failure("decode", f"unsupported Content-Encoding {encoding!r}", resp.status)
            decoder = codecs.getincrementaldecoder("utf-8")()
            pieces: list[str] = []
            give = sink if sink is not None else pieces.append
            try:
                for chunk in self._read_body(resp, gzip=encoding == "gzip"):
                    give(decoder.decode(chunk))
                give(decoder.decode(b"", final=True))
            except UnicodeDecodeError as exc:
                raise _Failure("decode", f"body is not UTF-8: {exc}", resp.status) from exc
            return resp.status, None if sink is not None else "".join(pieces)
        finally:
            self._hold(None)
            conn.close()

    def _read_body(self, resp: http.client.HTTPResponse, *, gzip: bool) -> Iterator[bytes]:
        """The body in pieces as they arrive (inflated), within the caps (the reader keeps the deadline)."""
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzip else None
        decoded = 0
        wire = 0
        while True:
            chunk = resp.read1(_CHUNK)
            if self._aborted:  # a body that a shutdown ended is not the whole body
                raise _Failure("connection", "scraper stopped", resp.status)
            if not chunk:
                break
            wire += len(chunk)
            if wire > self._max_bytes:
                raise _Failure("too_large", f"body over {self._max_bytes} bytes", resp.status)
            if inflater is not None:
                chunk = self._inflate(inflater, chunk, decoded, resp.status)
            decoded += len(chunk)
            if decoded > self._max_bytes:
                raise _Failure("too_large", f"decoded body over {self._max_bytes} bytes", resp.status)
            yield chunk
        if inflater is not None and not inflater.eof:
            raise _Failure("decode", "gzip stream ends early", resp.status)

    def _inflate(self, inflater: zlib._Decompress, chunk: bytes, have: int, status: int) -> bytes:
        # max_length stops a small compressed chunk from expanding past the cap in memory.
        room = self._max_bytes - have + 1
        try:
            data = inflater.decompress(chunk, room)
        except zlib.error as exc:
            raise _Failure("decode", f"bad gzip data: {exc}", status) from exc
        if inflater.unconsumed_tail:
            raise _Failure("too_large", f"decoded body over {self._max_bytes} bytes", status)
        return data


def _left(deadline: float, now: float, budget: float) -> float:
    """Seconds until ``deadline``; TimeoutError once it has passed (``budget``: for the message)."""
    left = deadline - now
    if left <= 0:
        raise TimeoutError(f"no complete reply within {budget:g}s")
    return left


class _DeadlineReader(io.RawIOBase):
    """The reply's socket as http.client reads it: every receive waits at most until one deadline.

    ``makefile`` is all http.client.HTTPResponse asks of a socket; closing the reader leaves the
    socket to its connection.
    """

    def __init__(
        self, sock: socket.socket, deadline: float, budget: float, clock: Callable[[], float]
    ) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline
        self._budget = budget
        self._clock = clock

    def makefile(self, mode: str = "rb") -> io.BufferedReader:
        """A buffered reader over this one (what HTTPResponse reads the reply from)."""
        return io.BufferedReader(self, _CHUNK)

    def readable(self) -> bool:
        """Always: this is a reader."""
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        """One receive, waiting only for what is left until the deadline."""
        self._sock.settimeout(_left(self._deadline, self._clock(), self._budget))
        return self._sock.recv_into(buffer)
