"""The sidecar's endpoints on one port: /metrics (behind basic auth), /healthz (never behind auth,
so probes need no credentials; over TLS when TLS is on), and / (the status page, behind the same
auth as /metrics; a link to /metrics when no page renderer is given).

The sockets, timeouts and connection caps are kvwatch.sidecar.server's; this module only decides
what each request gets: /healthz in the server's selector thread (``Endpoints.immediate``: a
constant, so probes never wait behind renders), everything else in a worker thread, where
concurrent scrapes of /metrics share one render (``SharedRender``).
"""

from __future__ import annotations

import dataclasses
import gzip
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvwatch.core.errors import ConfigError
from kvwatch.sidecar.auth import BasicAuth, Verdict
from kvwatch.sidecar.config import WebConfig
from kvwatch.sidecar.wire import Request, Response

if TYPE_CHECKING:
    import ssl

# Renders /metrics for an Accept header: (body, content type).
RenderMetrics = Callable[[str], tuple[bytes, str]]
# Renders the status page (HTML).
RenderStatus = Callable[[], bytes]

_TEXT = ("Content-Type", "text/plain; charset=utf-8")
_INDEX = b"<html><body><h1>kvwatch</h1><p><a href='/metrics'>/metrics</a></p></body></html>\n"
# Renders kept for reuse, by Accept header (Prometheus sends one; more only bounds the memory).
_KEPT_RENDERS = 4


@dataclasses.dataclass
class _Rendered:
    started: float
    body: bytes
    content_type: str
    gzipped: bytes | None = None


class SharedRender:
    """/metrics rendered once for every scrape waiting on it.

    A scrape may take a body whose render began after the scrape arrived (``Request.received``):
    that render began by reading every line appended before the scrape (``Sidecar.refresh``), so
    the body is as current as a render of its own -- a scrape is still never behind the log -- and
    a flood of concurrent scrapes costs one render (and one gzip), not one each. Renders run one
    at a time (they hold the GIL anyway); the scrapes that came during one share the next.
    """

    def __init__(self, render: RenderMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self._render = render
        self._clock = clock
        self._lock = threading.Lock()  # held while rendering: one render at a time
        self._last: dict[str, _Rendered] = {}  # the newest render per Accept header
        self.renders = 0

    def __call__(self, accept: str, received: float, gzipped: bool) -> tuple[bytes, str]:
        """The body (gzipped when asked) and content type of a render begun at or after ``received``."""
        with self._lock:
            last = self._last.get(accept)
            if last is None or last.started < received:
                started = self._clock()
                body, content_type = self._render(accept)
                self.renders += 1
                last = _Rendered(started, body, content_type)
                self._last.pop(accept, None)
                self._last[accept] = last
                while len(self._last) > _KEPT_RENDERS:
                    del self._last[next(iter(self._last))]
            if not gzipped:
                return last.body, last.content_type
            if last.gzipped is None:
                last.gzipped = gzip.compress(last.body, compresslevel=1)
            return last.gzipped, last.content_type


class Endpoints:
    """The request handler of kvwatch's HTTP server (called from its worker threads)."""

    def __init__(
        self, render_metrics: RenderMetrics, auth: BasicAuth, render_status: RenderStatus | None = None
    ) -> None:
        self.render_metrics = SharedRender(render_metrics)
        self.auth = auth
        self.render_status = render_status

    def immediate(self, request: Request) -> Response | None:
        """/healthz, answered by the server's selector thread (None: everything else, for a worker).

        It needs no auth, state or worker, so no queue of renders or password checks delays it.
        """
        if request.path == "/healthz" and request.method in ("GET", "HEAD"):
            return Response(200, b"ok\n", [_TEXT])
        return None

    def __call__(self, request: Request) -> Response:
        """The response to one request; HEAD gets GET's headers (the server drops the body)."""
        if request.method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", [_TEXT, ("Allow", "GET, HEAD")])
        path = request.path
        if path == "/healthz":
            return Response(200, b"ok\n", [_TEXT])
        verdict = self.auth.check(request.headers.get("authorization"), request.client)
        if verdict is Verdict.THROTTLED:
            retry = str(self.auth.limiter.retry_after(request.client))
            return Response(429, b"too many failed logins\n", [_TEXT, ("Retry-After", retry)])
        if verdict is Verdict.DENIED:
            return Response(401, b"", [("WWW-Authenticate", 'Basic realm="kvwatch"')])
        if path == "/metrics":
            gzipped = "gzip" in request.headers.get("accept-encoding", "")
            body, content_type = self.render_metrics(
                request.headers.get("accept", ""), request.received, gzipped
            )
            headers = [("Content-Type", content_type)]
            if gzipped:
                headers.append(("Content-Encoding", "gzip"))
            return Response(200, body, headers)
        if path == "/":
            page = _INDEX if self.render_status is None else self.render_status()
            return Response(200, page, [("Content-Type", "text/html; charset=utf-8")])
        return Response(404, b"not found\n", [_TEXT])


def tls_context(web: WebConfig) -> ssl.SSLContext:
    """The server-side TLS context of a web config (client certificates required when it names a CA)."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        assert web.cert_file is not None and web.key_file is not None
        ctx.load_cert_chain(web.cert_file, web.key_file)
        if web.client_ca_file is not None:
            ctx.load_verify_locations(web.client_ca_file)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS certificate/key: {exc}") from None
    return ctx
