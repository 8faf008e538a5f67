"""The sidecar's HTTP port under floods from one address or many (issue 22, the second hostile round):
idle sockets that reconnect as they are closed, fire-and-forget scrapes, keep-alive scrapers.

The attackers come from other loopback addresses (127.0.0.2 and up, bench/flood.py in a process of
their own so they do not share the sidecar's interpreter lock); the probes from 127.0.0.1, as the kubelet's
would from the node. Renders are made slow (a busy loop holding the interpreter lock, as a big
fleet's render does) so that every queued render shows. What is asserted is behaviour: every probe
and scrape answered 200, renders not made for clients that left, a stop that ends; the waits carry
hang detectors (5 s), not the issue's timing targets, which bench/bench_sidecar.py measures.
"""

from __future__ import annotations

import gzip
import http.client
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from waiting import stop as stop_process
from waiting import wait_until

from kvwatch.sidecar.app import Sidecar
from kvwatch.sidecar.config import load_settings
from kvwatch.sidecar.http import SharedRender
from kvwatch.sidecar.netlimits import client_key

ROOT = Path(__file__).resolve().parent.parent
LOG_SAMPLES = Path(__file__).parent / "log_samples"
VLLM_STARTUP = (LOG_SAMPLES / "vllm/001-llama31-8b-rtx3090-profiling-20k.log").read_text().splitlines()
RENDER_SECONDS = 0.2  # about what 256 busy instances cost (issue 22: 211 ms)
# Hang detectors, not timing targets: before the fixes a probe got 503 or waited > 30 s and a stop
# took 22.6 s. The targets (/healthz within 2 s, p99 1 s; SIGTERM to exit under 2 s) are
# measured by `make bench` (bench/bench_sidecar.py, the flood section), where load cannot fail a test.
PROBE_TIMEOUT = 5.0
STOP_BOUND = 5.0


class _Car:
    """An in-process sidecar on 127.0.0.1 whose /metrics render takes RENDER_SECONDS of CPU."""

    def __init__(self, tmp_path: Path) -> None:
        log = tmp_path / "vllm.log"
        log.write_text("".join(line + "\n" for line in VLLM_STARTUP), encoding="utf-8")
        settings = load_settings({"listen": "127.0.0.1:0", "log": [f"v={log}"]}, environ={})
        self.car = Sidecar(settings, environ={"HOME": str(tmp_path)})
        self.renders = 0
        # When set, a render first waits for it: the test decides when renders may happen, so what
        # it counts does not depend on how fast the selector saw hang-ups on a loaded machine.
        self.gate: threading.Event | None = None
        real = self.car.render_metrics

        def slow_render(accept: str) -> tuple[bytes, str]:
            self.renders += 1
            if self.gate is not None:
                assert self.gate.wait(30)
            end = time.perf_counter() + RENDER_SECONDS
            while time.perf_counter() < end:
                pass
            return real(accept)

        self.car.render_metrics = slow_render  # type: ignore[method-assign]
        self.car.start()
        self.port = self.car.port
        self.stopped = False

    def stop(self) -> float:
        """Stop the sidecar; the seconds it took."""
        started = time.monotonic()
        self.stopped = True
        self.car.stop()
        return time.monotonic() - started


@pytest.fixture
def slow_car(tmp_path: Path) -> Iterator[Callable[[], _Car]]:
    made: list[_Car] = []

    def make() -> _Car:
        made.append(_Car(tmp_path))
        return made[-1]

    yield make
    for car in made:
        if not car.stopped:
            car.stop()


def _get(port: int, path: str, timeout: float) -> int:
    """Status of one GET from 127.0.0.1 on a fresh connection; raises when it takes over ``timeout``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        started = time.monotonic()
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        assert time.monotonic() - started < timeout
        return resp.status
    finally:
        conn.close()


def _attack(mode: str, n: int, port: int, sources: list[str], seconds: float = 60.0) -> subprocess.Popen[str]:
    """An attacker process (bench/flood.py), once its connections are open."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.flood", mode, str(n), str(port), str(seconds), ",".join(sources)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _end(proc: subprocess.Popen[str]) -> None:
    stop_process(proc)
    if proc.stdout is not None:
        proc.stdout.close()


def _fire_and_forget(port: int, n: int, sources: list[str]) -> None:
    """n GET /metrics whose clients hang up as soon as the request is sent."""
    for i in range(n):
        with socket.socket() as s:
            s.settimeout(5)
            s.bind((sources[i % len(sources)], 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")


def _sources(n: int) -> list[str]:
    return [f"127.0.0.{2 + i}" for i in range(n)]


def test_client_key_counts_an_address_or_an_ipv6_64() -> None:
    assert client_key("10.1.2.3") == "10.1.2.3"
    assert client_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::2") == "2001:db8:1:2::/64"
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("fe80::1%eth0") == "fe80::/64"


def test_a_shared_render_is_never_older_than_the_scrape_it_serves() -> None:
    began = threading.Event()
    release = threading.Event()
    bodies = iter([b"first", b"second"])

    def render(accept: str) -> tuple[bytes, str]:
        began.set()
        assert release.wait(10)
        return next(bodies), "text/plain"

    shared = SharedRender(render)
    early = time.monotonic()  # arrived before the first render began: it may share it
    out: dict[str, bytes] = {}
    first = threading.Thread(target=lambda: out.update(a=shared("", time.monotonic(), False)[0]))
    first.start()
    assert began.wait(10)
    late = time.monotonic()  # arrived while it ran: it may have missed this scrape's lines
    second = threading.Thread(target=lambda: out.update(b=shared("", late, False)[0]))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert out == {"a": b"first", "b": b"second"}
    assert shared("", early, False)[0] == b"second" and shared.renders == 2
    assert gzip.decompress(shared("", early, True)[0]) == b"second" and shared.renders == 2


def test_a_prometheus_scrape_is_rendered_from_the_cached_rows(tmp_path: Path) -> None:
    # Prometheus asks for text 0.0.4, which prometheus_client no longer calls "latest": the fast
    # render must still serve it, or every scrape costs the generic encoder's several times more.
    log = tmp_path / "vllm.log"
    log.write_text("".join(line + "\n" for line in VLLM_STARTUP), encoding="utf-8")
    car = Sidecar(load_settings({"listen": "127.0.0.1:0", "log": [f"v={log}"]}, environ={}))
    calls: list[bytes] = []
    real = car.collector.render

    def counted() -> bytes:
        calls.append(real())
        return calls[-1]

    car.collector.render = counted  # type: ignore[method-assign]
    car.start()
    try:
        for accept in ("", "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"):
            body, content_type = car.render_metrics(accept)
            assert content_type.startswith("text/plain; version=0.0.4")
            assert calls and body == calls[-1] and b"kvwatch_kv_pool_blocks" in body
            calls.clear()
    finally:
        car.stop()


@pytest.mark.integration
def test_one_address_with_1100_reconnecting_idle_sockets_takes_nothing_from_the_others(
    slow_car: Callable[[], _Car],
) -> None:
    car = slow_car()
    server = car.car._server
    assert server is not None
    attacker = _attack("idle", 1100, car.port, ["127.0.0.2"])
    try:
        # The attacker has every connection it may hold, and opens again each one it loses.
        wait_until(lambda: server.stats.refused > 100)
        for _ in range(20):
            assert _get(car.port, "/healthz", PROBE_TIMEOUT) == 200
        for _ in range(3):
            assert _get(car.port, "/metrics", 10.0) == 200
        assert server.stats.open <= server.max_per_client + 1
        assert attacker.poll() is None  # still flooding
        assert car.stop() < STOP_BOUND
    finally:
        _end(attacker)


def test_abandoned_scrapes_are_not_rendered_and_healthz_never_waits_for_them(
    slow_car: Callable[[], _Car],
) -> None:
    car = slow_car()
    server = car.car._server
    assert server is not None
    car.gate = threading.Event()  # the first render a worker takes waits here, holding the others
    _fire_and_forget(car.port, 200, _sources(4))
    # Every client has hung up and the selector has seen it; probes are answered meanwhile.
    wait_until(lambda: server.stats.open == 0, timeout=30)
    for _ in range(5):
        assert _get(car.port, "/healthz", PROBE_TIMEOUT) == 200
    car.gate.set()
    wait_until(lambda: server._pool.in_flight == 0, timeout=30)
    # 200 renders before (40 s of CPU). Now: the one a worker had begun, and at most one more for
    # the requests workers had taken after it began; everything still queued is dropped unrun.
    assert car.renders <= 2
    assert server.stats.abandoned >= 150
    assert _get(car.port, "/metrics", 10.0) == 200


def test_stop_is_prompt_with_1000_abandoned_scrapes_queued(slow_car: Callable[[], _Car]) -> None:
    car = slow_car()
    _fire_and_forget(car.port, 1000, _sources(16))
    assert _get(car.port, "/healthz", PROBE_TIMEOUT) == 200
    assert car.stop() < STOP_BOUND


@pytest.mark.integration
def test_200_keep_alive_scrapers_share_renders_and_do_not_delay_healthz(slow_car: Callable[[], _Car]) -> None:
    car = slow_car()
    attacker = _attack("keepalive", 200, car.port, _sources(8))
    try:
        wait_until(lambda: car.renders >= 2, timeout=30)
        for _ in range(10):
            assert _get(car.port, "/healthz", PROBE_TIMEOUT) == 200
            time.sleep(0.2)
        # A scrape from elsewhere waits for at most the render running and the next one.
        assert _get(car.port, "/metrics", 10.0) == 200
        assert car.stop() < STOP_BOUND
        out, _ = attacker.communicate(timeout=30)
    finally:
        _end(attacker)
    answers = int(out.split()[0])
    # Every render served many scrapers (one each before: 200 renders a round).
    assert answers >= 5 * car.renders, (answers, car.renders)
