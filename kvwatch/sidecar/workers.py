"""The HTTP server's worker threads: they run the handler for complete requests and never touch a
socket (the selector thread of kvwatch.sidecar.server does all I/O).

Threads start as needed, up to ``size``: one scraper at a time keeps one thread (and one malloc
arena) instead of ``size`` of them, which shows in an idle sidecar's RSS. A job nobody waits for
any more when its turn comes (``wanted`` says no: its client hung up, or the server is stopping)
is dropped unrun, so a flood of abandoned requests costs no handler calls and a stop waits for at
most the calls already running.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from kvwatch.sidecar.wire import Request, Response, serialize

log = logging.getLogger("kvwatch")

C = TypeVar("C")


class WorkerPool(Generic[C]):
    """Runs ``handler`` for (connection, request) jobs; results wait in ``finished()`` for the
    selector thread, which ``ring`` wakes."""

    def __init__(
        self,
        handler: Callable[[Request], Response],
        size: int,
        ring: Callable[[], None],
        wanted: Callable[[C], bool],
    ) -> None:
        self.handler = handler
        self.size = size
        self._ring = ring
        self._wanted = wanted
        self._jobs: queue.SimpleQueue[tuple[C, Request, bool] | None] = queue.SimpleQueue()
        self._done: deque[tuple[C, bytes | None, bool]] = deque()
        self.threads: list[threading.Thread] = []
        self.in_flight = 0  # submitted and not yet taken back by finished() (selector thread only)

    def submit(self, conn: C, request: Request, keep_alive: bool) -> None:
        """Queue one request (selector thread); start a worker if all are taken."""
        self._jobs.put((conn, request, keep_alive))
        self.in_flight += 1
        if self.in_flight > len(self.threads) and len(self.threads) < self.size:
            n = len(self.threads)
            thread = threading.Thread(target=self._work, name=f"kvwatch-http-worker-{n}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def finished(self) -> list[tuple[C, bytes | None, bool]]:
        """(connection, response bytes or None when dropped unrun, keep-alive) of the jobs done."""
        out = []
        while self._done:
            out.append(self._done.popleft())
        self.in_flight -= len(out)
        return out

    def stop(self) -> None:
        """Let every worker end once the jobs ahead of it are taken (those unwanted, unrun)."""
        for _ in self.threads:
            self._jobs.put(None)

    def join(self, timeout: float) -> None:
        """Wait for the workers to end (``timeout`` each)."""
        for thread in self.threads:
            thread.join(timeout=timeout)

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            conn, request, keep_alive = job
            if not self._wanted(conn):
                self._done.append((conn, None, False))
                self._ring()
                continue
            try:
                response = self.handler(request)
                keep = keep_alive and response.status < 500
                data = serialize(response, keep, with_body=request.method != "HEAD")
            except Exception:  # a bug in a handler answers 500, it does not end the worker
                log.exception("http handler failed path=%s", request.path)
                keep = False
                data = serialize(Response(500, b"internal error\n"), keep)
            self._done.append((conn, data, keep))
            self._ring()
