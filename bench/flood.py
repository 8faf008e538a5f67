"""A hostile client of kvwatch's HTTP port, as its own process (so it does not share the interpreter
lock of whatever it measures); used by tests/test_hostile_floods.py and bench/bench_sidecar.py.

Usage: ``python -m bench.flood MODE N PORT SECONDS SOURCES`` (SOURCES: comma-separated local
addresses the connections are spread over, e.g. 127.0.0.2,127.0.0.3). Prints "ready" once its
N connections are open; at the end, the responses it completed and the reconnects it made.

* ``idle``: N sockets that never send; each one the server closes is opened again at once.
* ``keepalive``: N clients that GET /metrics over and over, one connection each.
* ``fire``: N GET /metrics whose clients hang up as soon as the request is sent; then it exits.

It stops after SECONDS, or once the server refuses every reconnect (it has stopped).
"""

from __future__ import annotations

import resource
import selectors
import socket
import sys
import time

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: kvwatch\r\n\r\n"


def _raise_fd_limit(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard)
        )


def _connect(port: int, source: str, timeout: float = 5.0) -> socket.socket | None:
    sock = socket.socket()
    try:
        sock.settimeout(timeout)
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    return sock


def _complete_responses(buf: bytearray) -> int:
    """Remove the whole responses at the start of ``buf``; how many there were."""
    done = 0
    while (end := buf.find(b"\r\n\r\n")) >= 0:
        head = bytes(buf[:end]).lower()
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0]) if b"content-length:" in head else 0
        if len(buf) < end + 4 + length:
            break
        del buf[: end + 4 + length]
        done += 1
    return done


def flood(mode: str, n: int, port: int, seconds: float, sources: list[str]) -> tuple[int, int]:
    """Run one flood; (responses completed, reconnects made)."""
    _raise_fd_limit(n)
    if mode == "fire":
        for i in range(n):
            sock = _connect(port, sources[i % len(sources)])
            if sock is not None:
                with sock:
                    sock.sendall(REQUEST)
        print("ready", flush=True)
        return 0, 0
    sel = selectors.DefaultSelector()

    def open_one(i: int) -> bool:
        sock = _connect(port, sources[i % len(sources)])
        if sock is None:
            return False
        sock.setblocking(False)
        if mode == "keepalive":
            sock.send(REQUEST)
        sel.register(sock, selectors.EVENT_READ, (i, bytearray()))
        return True

    lost = [i for i in range(n) if not open_one(i)]
    print("ready", flush=True)
    answers = reconnects = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end and len(lost) < n:
        lost = [i for i in lost if not open_one(i)]
        for key, _ in sel.select(0.2):
            conn, (i, buf) = key.fileobj, key.data
            assert isinstance(conn, socket.socket)
            try:
                data = conn.recv(1 << 20)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(conn)
                conn.close()
                reconnects += 1
                if not open_one(i):
                    lost.append(i)
            elif mode == "keepalive":
                buf += data
                done = _complete_responses(buf)
                answers += done
                if done:
                    conn.send(REQUEST)
    return answers, reconnects


def main(argv: list[str]) -> int:
    mode, n, port, seconds, sources = argv[0], int(argv[1]), int(argv[2]), float(argv[3]), argv[4].split(",")
    if mode not in ("idle", "keepalive", "fire"):
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    answers, reconnects = flood(mode, n, port, seconds, sources)
    print(answers, reconnects, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
