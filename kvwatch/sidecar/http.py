"""The sidecar's endpoints on one port: /metrics (behind basic auth), /healthz (never behind auth,
so probes need no credentials; over TLS when TLS is on), and / (the status page, behind the same
auth as /metrics; a link to /metrics when no page renderer is given).

The sockets, timeouts and connection cap are kvwatch.sidecar.server's; this module only decides
what each request gets, in a worker thread.
"""

from __future__ import annotations

import gzip
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


class Endpoints:
    """The request handler of kvwatch's HTTP server (called from its worker threads)."""

    def __init__(
        self, render_metrics: RenderMetrics, auth: BasicAuth, render_status: RenderStatus | None = None
    ) -> None:
        self.render_metrics = render_metrics
        self.auth = auth
        self.render_status = render_status

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
            body, content_type = self.render_metrics(request.headers.get("accept", ""))
            headers = [("Content-Type", content_type)]
            if "gzip" in request.headers.get("accept-encoding", ""):
                body = gzip.compress(body, compresslevel=1)
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
