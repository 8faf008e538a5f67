"""A bounded HTTP/1.1 server on the stdlib: one selector thread does all socket I/O, a few workers
compute responses.

Why hand-written: ``ThreadingHTTPServer`` gives every connection a thread and no read timeout, so
idle or slow clients (slow loris) could hold threads and file descriptors until /metrics and
/healthz stopped answering. Here a connection costs an fd and a small buffer, never a thread:

* the selector thread accepts, does TLS handshakes, reads request heads and writes responses, all
  non-blocking and each under a deadline (``HEADER_TIMEOUT`` from accept or from the first byte of
  a request to the end of its head, ``IDLE_TIMEOUT`` between keep-alive requests, ``WRITE_TIMEOUT``
  for the client to take a response); a client that misses one is disconnected and counted;
* a complete request head goes to one of ``WORKERS`` threads (started as needed), which only compute (the handler never
  touches the socket), so a client that does not read cannot hold a worker;
* at most ``MAX_CONNECTIONS`` connections are open; one more is refused (503 on plain HTTP, closed
  on TLS) and counted; heads over ``MAX_HEAD_BYTES`` get 431; request bodies are never read (a
  request announcing one is answered and the connection closed).

An idle server sleeps in ``select()`` with no timeout: no wake-ups while nobody connects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import heapq
import itertools
import logging
import queue
import resource
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvwatch.sidecar.wire import REASONS, Request, Response, parse_head, serialize

if TYPE_CHECKING:
    import ssl

log = logging.getLogger("kvwatch")

MAX_CONNECTIONS = 1024
HEADER_TIMEOUT = 10.0
IDLE_TIMEOUT = 30.0
WRITE_TIMEOUT = 10.0
MAX_HEAD_BYTES = 16 * 1024
WORKERS = 4
BACKLOG = 512
# File descriptors kept free for everything but client connections (logs, state file, scrapes).
FD_RESERVE = 64
_RECV = 64 * 1024
_ACCEPT_BATCH = 64
_ACCEPT_PAUSE = 0.1
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 22\r\nConnection: close\r\n\r\ntoo many connections\r\n"
)


Handler = Callable[[Request], Response]


@dataclasses.dataclass
class ServerStats:
    """Counters of the connections the server turned away (written by the selector thread only)."""

    refused: int = 0
    timed_out: int = 0
    bad_requests: int = 0
    open: int = 0


@dataclasses.dataclass(eq=False)
class _Conn:
    sock: socket.socket
    client: str
    state: str  # handshake | read | busy | write
    deadline: float
    buf: bytearray = dataclasses.field(default_factory=bytearray)
    out: memoryview | None = None
    keep_alive: bool = False
    events: int = 0


def raise_fd_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards ``wanted`` (within the hard limit); the soft limit after.

    Idle connections are cheap here, but each is an fd, and many systems start processes at 1024.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return int(soft) if soft != resource.RLIM_INFINITY else wanted


class BoundedHTTPServer:
    """Serves ``handler`` on ``address``; ``serve()`` runs the selector loop in the calling thread."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: Handler,
        tls: ssl.SSLContext | None = None,
        *,
        max_connections: int | None = None,
        header_timeout: float | None = None,
        idle_timeout: float | None = None,
        write_timeout: float | None = None,
        workers: int | None = None,
    ) -> None:
        """Bind and listen at once; an OSError here leaves nothing open behind it.

        Limits left None take the module's constants as they are at the call (tests change them).
        """
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self.handler = handler
        self.tls = tls
        cap = MAX_CONNECTIONS if max_connections is None else max_connections
        limit = raise_fd_limit(cap + FD_RESERVE)
        self.max_connections = max(1, min(cap, limit - FD_RESERVE))
        self.header_timeout = HEADER_TIMEOUT if header_timeout is None else header_timeout
        self.idle_timeout = IDLE_TIMEOUT if idle_timeout is None else idle_timeout
        self.write_timeout = WRITE_TIMEOUT if write_timeout is None else write_timeout
        self.stats = ServerStats()
        self._workers = WORKERS if workers is None else workers
        self._closing = False
        self._bell_r, self._bell_w = socket.socketpair()
        self._bell_r.setblocking(False)
        self._bell_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._conns: set[_Conn] = set()
        self._deadlines: list[tuple[float, int, _Conn]] = []
        self._seq = itertools.count()
        self._jobs: queue.SimpleQueue[tuple[_Conn, Request] | None] = queue.SimpleQueue()
        self._done: deque[tuple[_Conn, bytes, bool]] = deque()
        self._threads: list[threading.Thread] = []
        self._in_flight = 0
        self._accept_paused_until = 0.0

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._sock.getsockname()[1])

    # --- loop ------------------------------------------------------------------------------------
    def serve(self) -> None:
        """Run until ``stop_serving()``; then every client connection is closed."""
        sel = self._selector
        sel.register(self._sock, selectors.EVENT_READ, "listen")
        sel.register(self._bell_r, selectors.EVENT_READ, "bell")
        try:
            while not self._closing:
                for key, mask in sel.select(self._timeout()):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "bell":
                        with contextlib.suppress(OSError):
                            self._bell_r.recv(4096)
                    elif isinstance(key.data, _Conn) and key.data in self._conns:
                        self._io(key.data, mask)
                self._finish_jobs()
                self._expire()
        finally:
            for conn in list(self._conns):
                self._close(conn)
            for _ in self._threads:
                self._jobs.put(None)

    def stop_serving(self) -> None:
        """Make serve() return (from another thread); then server_close()."""
        self._closing = True
        self._ring()

    def server_close(self) -> None:
        """Close the listening socket and the loop's own resources (after serve() returned)."""
        for thread in self._threads:
            thread.join(timeout=5)
        for closable in (self._sock, self._bell_r, self._bell_w, self._selector):
            with contextlib.suppress(OSError):
                closable.close()

    def _ring(self) -> None:
        with contextlib.suppress(OSError):  # a full bell is ringing already
            self._bell_w.send(b"\0")

    def _timeout(self) -> float | None:
        deadlines = self._deadlines
        while deadlines and (
            deadlines[0][2] not in self._conns or deadlines[0][2].deadline != deadlines[0][0]
        ):
            heapq.heappop(deadlines)
        soonest = deadlines[0][0] if deadlines else None
        if self._accept_paused_until:
            soonest = min(soonest or self._accept_paused_until, self._accept_paused_until)
        return None if soonest is None else max(0.0, soonest - time.monotonic())

    def _set_deadline(self, conn: _Conn, deadline: float) -> None:
        conn.deadline = deadline
        heapq.heappush(self._deadlines, (deadline, next(self._seq), conn))

    def _expire(self) -> None:
        now = time.monotonic()
        if self._accept_paused_until and now >= self._accept_paused_until:
            self._accept_paused_until = 0.0
            with contextlib.suppress(KeyError, ValueError):
                self._selector.register(self._sock, selectors.EVENT_READ, "listen")
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            deadline, _, conn = heapq.heappop(deadlines)
            if conn in self._conns and conn.deadline == deadline and conn.state != "busy":
                self.stats.timed_out += 1
                self._close(conn)

    def _watch(self, conn: _Conn, events: int) -> None:
        if conn.events == events:
            return
        if conn.events == 0:
            self._selector.register(conn.sock, events, conn)
        elif events == 0:
            self._selector.unregister(conn.sock)
        else:
            self._selector.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn: _Conn) -> None:
        self._watch(conn, 0)
        self._conns.discard(conn)
        self.stats.open = len(self._conns)
        with contextlib.suppress(OSError):
            conn.sock.close()

    # --- accept ----------------------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of fds: stop accepting for a moment instead of spinning on a ready socket.
                    log.warning("cannot accept connections for now: %s", exc.strerror or exc)
                    self._selector.unregister(self._sock)
                    self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE
                return
            if len(self._conns) >= self.max_connections:
                self.stats.refused += 1
                with contextlib.suppress(OSError):
                    if self.tls is None:
                        sock.setblocking(False)
                        sock.send(_REFUSED)
                    sock.close()
                continue
            self._add(sock, str(addr[0]))

    def _add(self, sock: socket.socket, client: str) -> None:
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state = "read"
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            except (OSError, ValueError):
                sock.close()
                return
            state = "handshake"
        conn = _Conn(sock, client, state, 0.0)
        self._conns.add(conn)
        self.stats.open = len(self._conns)
        self._set_deadline(conn, time.monotonic() + self.header_timeout)
        self._watch(conn, selectors.EVENT_READ)

    # --- per-connection I/O ----------------------------------------------------------------------
    def _io(self, conn: _Conn, mask: int) -> None:
        if conn.state == "handshake":
            self._handshake(conn)
        elif conn.state == "read":
            self._read(conn)
        elif conn.state == "write":
            self._write(conn)

    def _handshake(self, conn: _Conn) -> None:
        import ssl

        try:
            conn.sock.do_handshake()  # type: ignore[attr-defined]
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
            return
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as exc:
            log.debug("tls handshake failed peer=%s err=%s", conn.client, exc)
            self._close(conn)
            return
        conn.state = "read"
        self._watch(conn, selectors.EVENT_READ)
        self._read(conn)

    def _read(self, conn: _Conn) -> None:
        import ssl

        while len(conn.buf) <= MAX_HEAD_BYTES and b"\r\n\r\n" not in conn.buf:
            try:
                chunk = conn.sock.recv(_RECV)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except (OSError, ValueError):
                self._close(conn)
                return
            if not chunk:
                self._close(conn)
                return
            if not conn.buf and conn.keep_alive:
                # The next request has begun: its head must arrive in HEADER_TIMEOUT from now.
                self._set_deadline(conn, min(conn.deadline, time.monotonic() + self.header_timeout))
            conn.buf += chunk
        self._parse(conn)

    def _parse(self, conn: _Conn) -> None:
        buf = conn.buf
        while buf[:2] == b"\r\n":  # empty lines before a request line are allowed (RFC 9112 2.2)
            del buf[:2]
        if buf and not 65 <= buf[0] <= 90:
            # Not an HTTP method (e.g. a TLS ClientHello on the plain port): say so at once.
            self._reply_error(conn, 400)
            return
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD_BYTES:
                self._reply_error(conn, 431)
            return
        head = bytes(buf[:end])
        del buf[: end + 4]
        request, keep_alive = parse_head(head, conn.client)
        if request is None:
            self._reply_error(conn, 400)
            return
        conn.keep_alive = keep_alive
        conn.state = "busy"
        self._watch(conn, 0)
        self._jobs.put((conn, request))
        self._in_flight += 1
        if self._in_flight > len(self._threads) and len(self._threads) < self._workers:
            # Workers start when first needed: one scraper at a time keeps one thread (and one
            # malloc arena) instead of WORKERS of them, which shows in an idle sidecar's RSS.
            n = len(self._threads)
            thread = threading.Thread(target=self._work, name=f"kvwatch-http-worker-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _reply_error(self, conn: _Conn, status: int) -> None:
        self.stats.bad_requests += 1
        conn.buf.clear()
        self._respond(conn, serialize(Response(status, f"{REASONS[status].lower()}\n".encode()), False))

    def _respond(self, conn: _Conn, data: bytes, keep_alive: bool = False) -> None:
        conn.keep_alive = keep_alive
        conn.out = memoryview(data)
        conn.state = "write"
        self._set_deadline(conn, time.monotonic() + self.write_timeout)
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        import ssl

        out = conn.out
        while out is not None and len(out):
            try:
                sent = conn.sock.send(out[:_RECV])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                self._watch(conn, selectors.EVENT_WRITE)
                conn.out = out
                return
            except ssl.SSLWantReadError:
                self._watch(conn, selectors.EVENT_READ)
                conn.out = out
                return
            except (OSError, ValueError):
                self._close(conn)
                return
            out = out[sent:]
        conn.out = None
        if not conn.keep_alive or self._closing:
            self._close(conn)
            return
        conn.state = "read"
        self._set_deadline(conn, time.monotonic() + self.idle_timeout)
        self._watch(conn, selectors.EVENT_READ)
        # A pipelined request may be read already: in our buffer, or decrypted inside the TLS
        # layer, where the selector cannot see it.
        if self.tls is not None and conn.sock.pending():  # type: ignore[attr-defined]
            self._read(conn)
        elif conn.buf:
            self._parse(conn)

    # --- workers ---------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            conn, request = job
            try:
                response = self.handler(request)
                keep = conn.keep_alive and response.status < 500
                data = serialize(response, keep, with_body=request.method != "HEAD")
            except Exception:  # a bug in a handler answers 500, it does not end the worker
                log.exception("http handler failed path=%s", request.path)
                keep = False
                data = serialize(Response(500, b"internal error\n"), keep)
            self._done.append((conn, data, keep))
            self._ring()

    def _finish_jobs(self) -> None:
        while self._done:
            conn, data, keep = self._done.popleft()
            self._in_flight -= 1
            if conn in self._conns:
                self._respond(conn, data, keep)
