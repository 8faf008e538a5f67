"""The /metrics scraper against a real HTTP server on 127.0.0.1: fixtures, gzip, auth and every failure.

Each failure mode must come back as a ScrapeResult with the right reason (the sidecar counts it as
kvwatch_scrape_errors_total{reason}); nothing may escape ``fetch``.
"""

from __future__ import annotations

import gzip
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kvwatch.core.errors import ConfigError
from kvwatch.core.events import PoolSized, UsageSample
from kvwatch.export.names import SCRAPE_ERROR_REASONS
from kvwatch.parsers.base import ParseError
from kvwatch.sources.metrics_reader import MetricsReader
from kvwatch.sources.scrape import Scraper, ScrapeResult

FIXTURES = Path(__file__).parent / "metrics_fixtures"
TOKEN = "s3cret-token"
SLOW_SECONDS = 3.0  # how long the slow handlers stall; far above the test timeouts below
HUGE = 2 * 2**20  # bytes the 'huge' handlers send; the tests cap at 1 MiB

pytestmark = pytest.mark.integration


class _Handler(BaseHTTPRequestHandler):
    """Routes by path; each route is one behaviour of a real or broken /metrics endpoint."""

    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        """Keep pytest output clean."""

    def _send(self, body: bytes, *, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if "Transfer-Encoding" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.requests.append((self.path, dict(self.headers)))
        path = self.path
        stop = self.server.stop
        if path.startswith("/fixture/"):
            text = (FIXTURES / path.removeprefix("/fixture/")).read_bytes()
            if "gzip" in self.headers.get("Accept-Encoding", ""):
                self._send(gzip.compress(text), headers={"Content-Encoding": "gzip"})
            else:
                self._send(text)
        elif path == "/auth":
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._send(b"unauthorized\n", status=401)
            else:
                self._send((FIXTURES / "sglang-0.5.7.txt").read_bytes())
        elif path == "/slow-headers":
            stop.wait(SLOW_SECONDS)
            self._send(b"late 1\n")
        elif path == "/slow-body":
            # Headers at once, then one byte every 0.2 s: each recv is quick, the whole reply is not.
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(int(SLOW_SECONDS / 0.2)):
                if stop.wait(0.2):
                    return
                try:
                    self.wfile.write(b"#")
                    self.wfile.flush()
                except OSError:
                    return
        elif path in ("/trickle-headers", "/trickle-chunks"):
            # One byte every 0.1 s: each recv returns well within any timeout, the reply never ends
            # in time. Headers dripped; or headers at once and a chunked body whose size lines drip.
            self.close_connection = True
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
            if path == "/trickle-headers":
                drip = head + b"X-Pad: " + b"a" * 1000
            else:
                self.wfile.write(head + b"Transfer-Encoding: chunked\r\n\r\n")
                drip = b"0" * 1000
            for i in range(len(drip)):
                try:
                    self.wfile.write(drip[i : i + 1])
                    self.wfile.flush()
                except OSError:  # the client hung up before the drip's end
                    self.server.cut.set()
                    return
                if stop.wait(0.1):
                    return
        elif path == "/500":
            self._send(b"Internal Server Error\n", status=500)
        elif path == "/garbage":
            self._send(b"<html><body><h1>It works!</h1></body></html>\n")
        elif path == "/binary":
            self._send(b"\xff\xfe\x00garbage\x80\x81")
        elif path == "/huge":
            self._send(b"# " + b"x" * HUGE + b"\n")
        elif path == "/huge-chunked":
            # No Content-Length: the cap must hold while reading.
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            block = b"a_metric 1\n" * 6000
            try:
                for _ in range(HUGE // len(block) + 2):
                    self.wfile.write(f"{len(block):x}\r\n".encode() + block + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                return
        elif path == "/gzip-bomb":
            self._send(gzip.compress(b"\n" * (HUGE * 4)), headers={"Content-Encoding": "gzip"})
        elif path == "/bad-gzip":
            self._send(b"this is not gzip", headers={"Content-Encoding": "gzip"})
        elif path == "/brotli":
            self._send(b"\x0b\x02\x80hello", headers={"Content-Encoding": "br"})
        elif path == "/not-http":
            self.wfile.write(b"SSH-2.0-OpenSSH_9.6\r\n")
            self.close_connection = True
        elif path == "/redirect":
            self._send(b"", status=302, headers={"Location": "/fixture/sglang-0.5.7.txt"})
        else:
            self._send(b"not found\n", status=404)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.stop = threading.Event()
        self.cut = threading.Event()  # a trickle's client hung up before its end
        self.requests: list[tuple[str, dict[str, str]]] = []

    def handle_error(self, request: object, client_address: object) -> None:
        """The scraper hangs up on slow and huge replies by design; that is not a server error."""


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.stop.set()  # releases the slow handlers
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def _url(srv: _Server, path: str) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}{path}"


def _scraper(srv: _Server, path: str, **kwargs: object) -> Scraper:
    # Generous for the replies that should succeed (the machine may be busy); the slow tests pass 0.5 s.
    opts: dict[str, object] = {"connect_timeout": 2.0, "read_timeout": 5.0, "max_bytes": 2**20}
    opts.update(kwargs)
    return Scraper(_url(srv, path), **opts)  # type: ignore[arg-type]


def _assert_failed(result: ScrapeResult, reason: str) -> None:
    assert result.error in SCRAPE_ERROR_REASONS
    assert (result.ok, result.error, result.text) == (False, reason, None), result.detail


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.txt")))
def test_fixture_served_and_read(server: _Server, fixture: str) -> None:
    result = _scraper(server, f"/fixture/{fixture}").fetch()
    assert result.ok and result.error is None and result.status == 200
    assert result.text == (FIXTURES / fixture).read_text()
    assert result.duration_seconds > 0
    assert MetricsReader().read(result.text)


def test_gzip_requested_and_decoded(server: _Server) -> None:
    result = _scraper(server, "/fixture/vllm-0.6.6-v0.txt").fetch()
    assert result.ok
    path, headers = server.requests[-1]
    assert headers["Accept-Encoding"] == "gzip"
    assert headers["Accept"].startswith("text/plain")
    events = MetricsReader().read(result.text or "")
    assert any(isinstance(e, PoolSized) and e.blocks == 27895 for e in events)


def test_bearer_token_sent(server: _Server) -> None:
    result = _scraper(server, "/auth", bearer_token=TOKEN).fetch()
    assert result.ok and result.status == 200
    assert server.requests[-1][1]["Authorization"] == f"Bearer {TOKEN}"


def test_missing_token_is_http_status(server: _Server) -> None:
    result = _scraper(server, "/auth").fetch()
    _assert_failed(result, "http_status")
    assert result.status == 401


def test_server_error_is_http_status(server: _Server) -> None:
    result = _scraper(server, "/500").fetch()
    _assert_failed(result, "http_status")
    assert result.status == 500


def test_redirect_is_not_followed(server: _Server) -> None:
    result = _scraper(server, "/redirect").fetch()
    _assert_failed(result, "http_status")
    assert result.status == 302


@pytest.mark.parametrize("path", ["/slow-headers", "/slow-body"])
def test_slow_server_times_out(server: _Server, path: str) -> None:
    result = _scraper(server, path, read_timeout=0.5).fetch()
    # The read budget covers the whole reply, not each recv: the slow body sends a byte every 0.2 s,
    # inside any one recv's 0.5 s, so only a budget for the whole reply ends it as a timeout.
    _assert_failed(result, "timeout")


@pytest.mark.parametrize("path", ["/trickle-headers", "/trickle-chunks"])
def test_a_trickle_ends_at_the_deadline_not_at_its_end(server: _Server, path: str) -> None:
    # One byte every 0.1 s: every recv returns within any timeout, and the whole reply would take
    # 100 s. Only a deadline for the whole reply ends it; the scraper then hangs up mid-drip.
    result = _scraper(server, path, read_timeout=0.5).fetch()
    _assert_failed(result, "timeout")
    assert server.cut.wait(10)


def test_one_deadline_bounds_the_whole_fetch(server: _Server) -> None:
    # timeout is the whole fetch: shorter than connect_timeout + read_timeout, it is what ends it.
    result = _scraper(
        server, "/trickle-headers", connect_timeout=30.0, read_timeout=30.0, timeout=0.5
    ).fetch()
    _assert_failed(result, "timeout")
    assert server.cut.wait(10)


def test_closed_port_is_connection_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = Scraper(f"http://127.0.0.1:{port}/metrics", connect_timeout=1.0).fetch()
    _assert_failed(result, "connection")
    assert "Refused" in (result.detail or "")


def test_reply_that_is_not_http_is_connection_error(server: _Server) -> None:
    _assert_failed(_scraper(server, "/not-http").fetch(), "connection")


@pytest.mark.parametrize("path", ["/huge", "/huge-chunked", "/gzip-bomb"])
def test_huge_body_is_too_large(server: _Server, path: str) -> None:
    _assert_failed(_scraper(server, path).fetch(), "too_large")


@pytest.mark.parametrize("path", ["/bad-gzip", "/brotli", "/binary"])
def test_undecodable_body_is_decode_error(server: _Server, path: str) -> None:
    _assert_failed(_scraper(server, path).fetch(), "decode")


def test_garbage_body_is_a_parse_error_for_the_reader(server: _Server) -> None:
    """HTTP 200 with an HTML page: the scrape succeeds, the reader refuses it (counted as 'parse')."""
    result = _scraper(server, "/garbage").fetch()
    assert result.ok
    with pytest.raises(ParseError):
        MetricsReader().read(result.text or "")
    assert "parse" in SCRAPE_ERROR_REASONS


def test_scraper_is_reusable(server: _Server) -> None:
    scraper = _scraper(server, "/fixture/sglang-0.5.7.txt")
    reader = MetricsReader()
    for _ in range(3):
        result = scraper.fetch()
        assert result.ok
        usage = [e for e in reader.read(result.text or "") if isinstance(e, UsageSample)]
        assert usage[0].used_tokens == 23110


@pytest.mark.parametrize(
    ("url", "kwargs"),
    [
        ("localhost:8000/metrics", {}),
        ("ftp://host/metrics", {}),
        ("http:///metrics", {}),
        ("http://host:99999/metrics", {}),
        ("http://[::1/metrics", {}),
        ("http://host/my metrics", {}),
        ("http://host/metrics", {"read_timeout": 0}),
        ("http://host/metrics", {"timeout": 0}),
        ("http://host/metrics", {"max_bytes": 0}),
        ("http://host/metrics", {"bearer_token": "a\nb"}),
        ("https://host/metrics", {"ca_file": "/nonexistent/ca.pem"}),
    ],
)
def test_bad_configuration_raises_config_error(url: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Scraper(url, **kwargs)  # type: ignore[arg-type]


# --- TLS -------------------------------------------------------------------------------------------


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[_Server, Path]]:
    """The same server behind TLS with a self-signed certificate for 127.0.0.1 (needs openssl)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    srv = _Server()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv, cert
    finally:
        srv.stop.set()
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=5)


def _https(srv: _Server, path: str) -> str:
    return f"https://127.0.0.1:{srv.server_address[1]}{path}"


def test_tls_with_ca_file(tls_server: tuple[_Server, Path]) -> None:
    srv, cert = tls_server
    result = Scraper(_https(srv, "/fixture/sglang-0.5.7.txt"), ca_file=str(cert)).fetch()
    assert result.ok, result.detail


def test_tls_unknown_ca_is_connection_error(tls_server: tuple[_Server, Path]) -> None:
    srv, _ = tls_server
    result = Scraper(_https(srv, "/fixture/sglang-0.5.7.txt"), connect_timeout=2.0).fetch()
    _assert_failed(result, "connection")
    assert "CERTIFICATE_VERIFY_FAILED" in (result.detail or "")


def test_tls_insecure_skip_verify(tls_server: tuple[_Server, Path]) -> None:
    srv, _ = tls_server
    result = Scraper(_https(srv, "/fixture/sglang-0.5.7.txt"), insecure_skip_verify=True).fetch()
    assert result.ok, result.detail
