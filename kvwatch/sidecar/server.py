"""A bounded HTTP/1.1 server on the stdlib: one selector thread does all socket I/O, a few workers
compute responses.

Why hand-written: ``ThreadingHTTPServer`` gives every connection a thread and no read timeout, so
idle or slow clients (slow loris) could hold threads and file descriptors until /metrics and
/healthz stopped answering. Here a connection costs an fd and a small buffer, never a thread:

* the selector thread accepts, does TLS handshakes, reads request heads and writes responses, all
  non-blocking and each under a deadline (``HEADER_TIMEOUT`` from accept or from the first byte of
  a request to the end of its head, ``IDLE_TIMEOUT`` between keep-alive requests, ``WRITE_TIMEOUT``
  for the client to take a response); a client that misses one is disconnected and counted;
* what the ``immediate`` handler answers (/healthz: a constant) the selector thread answers
  itself, so probes never queue behind /metrics renders;
* any other request goes to one of ``WORKERS`` threads (kvwatch.sidecar.workers), which only
  compute, so a client that does not read cannot hold a worker; a waiting request's socket is
  still watched: a client that hangs up is closed at once and its request dropped unrun;
* at most ``MAX_CONNECTIONS`` connections are open, at most ``MAX_PER_CLIENT`` from one client
  address (an IPv6 /64 counts as one), so one address cannot take the port from the others. A
  new connection from an address at its cap closes that address's oldest connection waiting for a
  request (idle or mid-head: often one its client has closed already), so a scraper sharing an
  address with a flood still gets in; with none waiting, or at the whole cap, the new one is
  refused (503 on plain HTTP, closed on TLS); both count as refused. Heads over ``MAX_HEAD_BYTES``
  get 431; request bodies are never read (such a request is answered, its connection closed);
* ``stop_serving`` closes every connection and workers drop what is still queued: a stop waits
  for at most the handler calls running, whatever the backlog.

An idle server sleeps in ``select()`` with no timeout: no wake-ups while nobody connects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import heapq
import itertools
import logging
import selectors
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvwatch.sidecar.netlimits import ClientSlots, ServerStats, client_key, raise_fd_limit
from kvwatch.sidecar.wire import REASONS, Request, Response, drop_empty_lines, head_end, parse_head, serialize
from kvwatch.sidecar.workers import WorkerPool

if TYPE_CHECKING:
    import ssl

log = logging.getLogger("kvwatch")

MAX_CONNECTIONS = 1024
# Far above what scrapers and probes from one address use (Prometheus keeps one connection per
# target; an HA pair, or a mesh proxy in front of every client, a few), far below the whole cap.
MAX_PER_CLIENT = 64
HEADER_TIMEOUT = 10.0
IDLE_TIMEOUT = 30.0
WRITE_TIMEOUT = 10.0
MAX_HEAD_BYTES = 16 * 1024
WORKERS = 4
BACKLOG = 512
# File descriptors kept free for everything but client connections (logs, state file, scrapes).
FD_RESERVE = 64
_RECV = 64 * 1024
# Bytes one connection may send per turn of the loop: a big /metrics to many scrapers at once is
# sent round-robin, so the loop comes back to new connections (probes) between slices.
_WRITE_SLICE = 64 * 1024
_ACCEPT_BATCH = 64
_ACCEPT_PAUSE = 0.1
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 22\r\nConnection: close\r\n\r\ntoo many connections\r\n"
)


Handler = Callable[[Request], Response]
# Answers in the selector thread (None: a worker's); only for answers that cost nothing.
Immediate = Callable[[Request], Response | None]


@dataclasses.dataclass(eq=False)
class _Conn:
    sock: socket.socket
    client: str
    key: str  # what the per-address cap counts by (client_key)
    state: str  # handshake | read | busy | write
    deadline: float
    buf: bytearray = dataclasses.field(default_factory=bytearray)
    out: memoryview | None = None
    keep_alive: bool = False
    events: int = 0
    closed: bool = False  # set by the selector thread; workers skip a closed connection's request


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
        max_per_client: int | None = None,
        immediate: Immediate | None = None,
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
        self.tls = tls
        cap = MAX_CONNECTIONS if max_connections is None else max_connections
        limit = raise_fd_limit(cap + FD_RESERVE)
        self.max_connections = max(1, min(cap, limit - FD_RESERVE))
        self.max_per_client = MAX_PER_CLIENT if max_per_client is None else max_per_client
        self.immediate = immediate
        self.header_timeout = HEADER_TIMEOUT if header_timeout is None else header_timeout
        self.idle_timeout = IDLE_TIMEOUT if idle_timeout is None else idle_timeout
        self.write_timeout = WRITE_TIMEOUT if write_timeout is None else write_timeout
        self.stats = ServerStats()
        self._closing = False
        self._bell_r, self._bell_w = socket.socketpair()
        self._bell_r.setblocking(False)
        self._bell_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._conns: set[_Conn] = set()
        self._slots: ClientSlots[_Conn] = ClientSlots()
        self._deadlines: list[tuple[float, int, _Conn]] = []
        self._seq = itertools.count()
        self._pool: WorkerPool[_Conn] = WorkerPool(
            handler, WORKERS if workers is None else workers, self._ring, self._wanted
        )
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
            self._closing = True  # workers drop what is still queued (every connection is closed)
            for conn in list(self._conns):
                self._close(conn)
            self._pool.stop()

    def stop_serving(self) -> None:
        """Make serve() return (from another thread); then server_close()."""
        self._closing = True
        self._ring()

    def server_close(self) -> None:
        """Close the listening socket and the loop's own resources (after serve() returned)."""
        self._pool.join(timeout=5)
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
        if conn.closed:
            return
        conn.closed = True
        self._conns.discard(conn)
        self._slots.remove(conn.key, conn)
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
            client = str(addr[0])
            key = client_key(client)
            if self._slots.count(key) >= self.max_per_client:
                self._make_room(key)
            if len(self._conns) >= self.max_connections or self._slots.count(key) >= self.max_per_client:
                self.stats.refused += 1
                with contextlib.suppress(OSError):
                    if self.tls is None:
                        sock.setblocking(False)
                        sock.send(_REFUSED)
                    sock.close()
                continue
            self._add(sock, client, key)

    def _make_room(self, key: str) -> None:
        """Free a slot of an address at its cap: its oldest waiting connection is read first (it
        may hold a request, or the client's hang-up, not seen yet), and closed if still waiting."""
        # Each turn takes one out of waiting (at most the address's cap in all).
        while (conn := self._slots.oldest_waiting(key)) is not None:
            self._io(conn, selectors.EVENT_READ)
            if conn.closed:
                return  # its client had gone: a slot is free
            if conn.state in ("read", "handshake"):
                self.stats.refused += 1
                self._close(conn)
                return

    def _add(self, sock: socket.socket, client: str, key: str) -> None:
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
        conn = _Conn(sock, client, key, state, 0.0)
        self._conns.add(conn)
        self._slots.add(key, conn)
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
        elif conn.state == "busy":
            self._check_gone(conn)

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
        while self._read_some(conn) and self._parse(conn):
            pass  # answered everything read, and TLS holds more decrypted bytes: read on

    def _read_some(self, conn: _Conn) -> bool:
        """Read until a head is complete or nothing more is there; False when the client left."""
        import ssl

        while len(conn.buf) <= MAX_HEAD_BYTES and head_end(conn.buf)[0] < 0:
            try:
                chunk = conn.sock.recv(_RECV)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except (OSError, ValueError):
                self._close(conn)
                return False
            if not chunk:
                self._close(conn)
                return False
            if not conn.buf and conn.keep_alive:
                # The next request has begun: its head must arrive in HEADER_TIMEOUT from now.
                self._set_deadline(conn, min(conn.deadline, time.monotonic() + self.header_timeout))
            conn.buf += chunk
        return True

    def _check_gone(self, conn: _Conn) -> None:
        """A busy connection is readable: its client hung up (close it: the worker drops the
        request), or sent its next request early (kept for after this response)."""
        import ssl

        try:
            chunk = conn.sock.recv(_RECV)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except (OSError, ValueError):
            chunk = b""
        conn.buf += chunk
        if not chunk:
            self.stats.abandoned += 1
            self._close(conn)
        elif len(conn.buf) > MAX_HEAD_BYTES:
            self._watch(conn, 0)  # enough read ahead; the rest waits for this response

    def _parse(self, conn: _Conn) -> bool:
        """Take the requests in ``conn.buf`` one by one: the immediate ones are answered here, in a
        loop (not by recursion: a client may pipeline hundreds), up to one that needs a worker.

        True when all were answered and TLS holds decrypted bytes the selector cannot see.
        """
        buf = conn.buf
        while True:
            drop_empty_lines(buf)
            if buf and not 65 <= buf[0] <= 90 and buf != b"\r":
                # Not an HTTP method (e.g. a TLS ClientHello on the plain port): say so at once.
                self._reply_error(conn, 400)
                return False
            end, after = head_end(buf)
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    self._reply_error(conn, 431)
                return False
            head = bytes(buf[:end])
            del buf[:after]
            request, keep_alive = parse_head(head, conn.client)
            if request is None:
                self._reply_error(conn, 400)
                return False
            quick = self.immediate(request) if self.immediate is not None else None
            if quick is None:
                break
            conn.keep_alive = keep_alive and not self._closing
            self._start_write(conn, serialize(quick, conn.keep_alive, with_body=request.method != "HEAD"))
            if not self._flush(conn):
                return False  # the rest goes out when the socket is writable
            if not conn.keep_alive:
                self._close(conn)
                return False
            self._await_request(conn)
            if head_end(buf)[0] < 0 and self.tls is not None and conn.sock.pending():  # type: ignore[attr-defined]
                return True
        conn.keep_alive = keep_alive
        conn.state = "busy"
        self._slots.busy(conn.key, conn)
        # Still watched for reading: a client that hangs up while waiting is noticed (_check_gone).
        self._watch(conn, selectors.EVENT_READ if len(buf) <= MAX_HEAD_BYTES else 0)
        self._pool.submit(conn, request, keep_alive)
        return False

    def _reply_error(self, conn: _Conn, status: int) -> None:
        conn.buf.clear()
        self._respond(conn, serialize(Response(status, f"{REASONS[status].lower()}\n".encode()), False))

    def _respond(self, conn: _Conn, data: bytes, keep_alive: bool = False) -> None:
        conn.keep_alive = keep_alive
        self._start_write(conn, data)
        self._write(conn)

    def _start_write(self, conn: _Conn, data: bytes) -> None:
        conn.out = memoryview(data)
        conn.state = "write"
        self._slots.busy(conn.key, conn)
        self._set_deadline(conn, time.monotonic() + self.write_timeout)

    def _flush(self, conn: _Conn) -> bool:
        """Send what the socket takes; True when the response is out, False while some is left
        (then the connection waits to be writable) or when the connection failed (closed)."""
        import ssl

        out, budget = conn.out, _WRITE_SLICE
        while out is not None and len(out):
            try:
                if budget <= 0:
                    raise BlockingIOError  # this turn's slice is sent; the socket is asked again
                sent = conn.sock.send(out[:_RECV])
                budget -= sent
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
                self._watch(conn, selectors.EVENT_WRITE)
                conn.out = out
                return False
            except ssl.SSLWantReadError:
                self._watch(conn, selectors.EVENT_READ)
                conn.out = out
                return False
            except (OSError, ValueError):
                self._close(conn)
                return False
            out = out[sent:]
        conn.out = None
        return True

    def _write(self, conn: _Conn) -> None:
        if not self._flush(conn):
            return
        if not conn.keep_alive or self._closing:
            self._close(conn)
            return
        self._await_request(conn)
        # A pipelined request may be read already: in our buffer, or decrypted inside the TLS
        # layer, where the selector cannot see it.
        if conn.buf or (self.tls is not None and conn.sock.pending()):  # type: ignore[attr-defined]
            self._read(conn)

    def _await_request(self, conn: _Conn) -> None:
        conn.state = "read"
        self._slots.waiting(conn.key, conn)
        self._set_deadline(conn, time.monotonic() + self.idle_timeout)
        self._watch(conn, selectors.EVENT_READ)

    # --- workers ---------------------------------------------------------------------------------
    def _wanted(self, conn: _Conn) -> bool:
        """Whether a queued request is still worth running (asked by a worker)."""
        return not conn.closed and not self._closing

    def _finish_jobs(self) -> None:
        for conn, data, keep in self._pool.finished():
            if data is not None and not conn.closed:
                self._respond(conn, data, keep)
