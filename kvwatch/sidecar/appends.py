"""A render's "read what the engines appended" handed to the consumer thread, and waited for (bounded).

A scrape of /metrics (or /) must hold every line appended before it, however rarely the tailers look
on their own (kvwatch.sidecar.app.TAIL_INTERVAL), yet the HTTP worker serving it must not read files
or parse lines: input is the input threads' work, and a read that blocks (a hung network file
system) must not block the scrape. So the worker puts a ``ReadAppends`` on the consumer's queue and
waits for it: the consumer reads every tailer's open files (``LogTailer.refresh``, under the tailer's
delivery lock, in file order) when it takes the request, so every line written before the request
is applied before the worker takes its snapshot. Past ``wait`` seconds the render goes on with the
state as it is; while that late request is still unanswered, later renders do not wait at all (the
reading thread is stuck; a new request would only queue behind the old one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kvwatch.sidecar import messages as msg


class AppendRequests:
    """Asks the consumer for a read of the appends and waits for it; open while the consumer runs."""

    def __init__(self, put: Callable[[msg.Message], None], wait: float) -> None:
        self._put = put
        self.wait = wait
        self._lock = threading.Lock()  # orders put() against close(): no request after the last drain
        self._open = False
        self._late: msg.ReadAppends | None = None
        # Requests that were not answered within ``wait`` (the render went on without them).
        self.late = 0

    def open(self) -> None:
        """The consumer runs: renders may ask."""
        with self._lock:
            self._open = True

    def close(self) -> None:
        """The consumer is ending: renders stop asking (it answers the requests queued before)."""
        with self._lock:
            self._open = False

    def ask(self) -> bool:
        """Have the consumer read every append made until now; True once it has, False when the
        consumer is not running, is still stuck in an earlier read, or took longer than ``wait``."""
        with self._lock:
            if not self._open or (self._late is not None and not self._late.done.is_set()):
                return False
            request = msg.ReadAppends(threading.Event())
            self._put(request)
        if request.done.wait(self.wait):
            return True
        with self._lock:
            self._late = request
            self.late += 1
        return False
