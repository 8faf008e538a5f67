"""The sidecar's HTTP side: /metrics, /healthz and / on one port, optionally TLS and basic auth."""

from __future__ import annotations

import contextlib
import gzip
import logging
import selectors
import socket
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from kvwatch import __version__
from kvwatch.config import WebConfig
from kvwatch.errors import ConfigError
from kvwatch.sidecar.auth import BasicAuth

if TYPE_CHECKING:
    import ssl

log = logging.getLogger("kvwatch")

# Renders /metrics for an Accept header: (body, content type).
RenderMetrics = Callable[[str], tuple[bytes, str]]


class MetricsServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # handle_request() only after select() saw a connection: accept it or give up, never block.
    timeout = 0

    def __init__(
        self,
        address: tuple[str, int],
        render_metrics: RenderMetrics,
        auth: BasicAuth,
        tls: ssl.SSLContext | None,
    ) -> None:
        self.render_metrics = render_metrics
        self.auth = auth
        self.tls = tls
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self._closing = False
        self._bell_r, self._bell_w = socket.socketpair()

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self.server_address[1])

    def serve(self) -> None:
        """serve_forever() without its poll twice a second for shutdown(): sleep in select() until a
        client connects or stop_serving() rings. An idle sidecar then costs no CPU; on VMs each
        wake-up of a thread costs ~1 ms of CPU, a visible share of the sidecar's 1% budget."""
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._bell_r, selectors.EVENT_READ)
            while not self._closing:
                for key, _ in selector.select():
                    if key.fileobj is self and not self._closing:
                        self.handle_request()

    def stop_serving(self) -> None:
        """Make serve() return (from another thread); then server_close()."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._bell_w.send(b"\0")

    def server_close(self) -> None:
        super().server_close()
        self._bell_r.close()
        self._bell_w.close()

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake runs in the request's own thread so a slow client cannot stall accept().
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(10.0)
        try:
            wrapped = self.tls.wrap_socket(request, server_side=True)
        except (OSError, ValueError) as exc:
            log.debug("tls handshake failed peer=%s err=%s", client_address, exc)
            return
        try:
            super().finish_request(wrapped, client_address)
        finally:
            # The TLS socket took over the connection; the server only closes the raw one.
            wrapped.close()


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer
    server_version = f"kvwatch/{__version__}"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("http %s", format % args)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        server = self.server
        if not server.auth.authorized(self.headers.get("Authorization")):
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="kvwatch"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, content_type = server.render_metrics(self.headers.get("Accept", ""))
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            if "gzip" in self.headers.get("Accept-Encoding", ""):
                body = gzip.compress(body, compresslevel=1)
                self.send_header("Content-Encoding", "gzip")
        elif path == "/healthz":
            body = b"ok\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
        elif path == "/":
            body = b"<html><body><h1>kvwatch</h1><p><a href='/metrics'>/metrics</a></p></body></html>\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
        else:
            body = b"not found\n"
            self.send_response(404)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


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
