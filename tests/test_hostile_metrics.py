"""A large engine /metrics (issue 14, item 5): bounded memory and CPU, only the families read kept,
and a stop within a second whatever a scrape is doing.

The process-level checks run the real `kvwatch run` in a subprocess against an engine stand-in on
127.0.0.1 and read its peak resident memory (VmHWM) and CPU time from /proc.
"""

from __future__ import annotations

import functools
import gzip
import http.server
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from big_exposition import exposition
from hypothesis import given, settings
from hypothesis import strategies as st
from waiting import wait_until

from kvwatch.core.events import CounterReset, event_to_json
from kvwatch.engines import registry
from kvwatch.parsers.base import ParseError
from kvwatch.parsers.prom_stream import MAX_KEPT_SERIES, MAX_LINE_CHARS
from kvwatch.parsers.samples import Sample
from kvwatch.sources.metrics_reader import MetricsReader
from kvwatch.sources.scrape import Scraper, ScrapeResult

FIXTURES = Path(__file__).parent / "metrics_fixtures"
RSS_LIMIT_KIB = 128 * 1024
BIG = exposition()


class _Engine:
    """An engine's /metrics on 127.0.0.1: the body, optionally gzip'd, or a stall half way."""

    def __init__(self, body: bytes, *, stall: bool = False, gzipped: bool = False) -> None:
        self.served = 0
        self.stalled = threading.Event()
        release = threading.Event()
        self._release = release
        engine = self
        data = gzip.compress(body, 1) if gzipped else body

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                if gzipped:
                    self.send_header("Content-Encoding", "gzip")
                self.end_headers()
                if stall:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    engine.stalled.set()
                    release.wait(30)
                    return
                self.wfile.write(data)
                engine.served += 1

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/metrics"

    def __enter__(self) -> _Engine:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


_wait = functools.partial(wait_until, timeout=60.0)


def _proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{key} not in /proc/{pid}/status")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def sidecar() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(url: str, interval: str, *extra: str) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "kvwatch", "run", "--metrics-url", url, "--listen", "127.0.0.1:0"]
        proc = subprocess.Popen(
            [*cmd, "--scrape-interval", interval, "--log-level", "warning", *extra],
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def _serving_url(proc: subprocess.Popen[str]) -> str:
    assert proc.stderr is not None
    line = proc.stderr.readline()
    found = re.search(r"serving (\S+)", line)
    assert found, line
    return found.group(1)


pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")


@pytest.mark.integration
def test_100k_series_keep_rss_bounded(
    sidecar: Callable[[str, str], subprocess.Popen[str]],
) -> None:
    """6.7+ MB, 100k series, scraped every second: peak RSS under 128 MiB, and the families kvwatch
    reads read out of it. (The CPU per scrape is a target of `make bench`: bench/bench_hostile.py.)"""
    assert BIG.count(b"\n") > 100_000
    with _Engine(BIG) as engine:
        proc = sidecar(engine.url, "1")
        own = _serving_url(proc)
        _wait(lambda: engine.served >= 2)
        served0 = engine.served
        _wait(lambda: engine.served >= served0 + 3)
        time.sleep(0.5)  # the last body is read
        exported = urllib.request.urlopen(own, timeout=10).read().decode()
        peak = _proc_status(proc.pid, "VmHWM")
    assert peak < RSS_LIMIT_KIB, f"peak RSS {peak} KiB"
    # The families kvwatch reads were read out of the big body.
    assert re.search(r"kvwatch_kv_pool_blocks\{[^}]*\} 27153\.0\n", exported), exported[:2000]


@pytest.mark.integration
def test_sigterm_during_a_stalled_scrape_ends_it(
    sidecar: Callable[..., subprocess.Popen[str]],
) -> None:
    """The stalled scrape would wait its 60 s timeout; SIGTERM ends it and the sidecar exits 0.
    (How fast is a target of `make bench`: bench/bench_hostile.py.)"""
    with _Engine(BIG, stall=True) as engine:
        proc = sidecar(engine.url, "5", "--scrape-timeout", "60")
        _serving_url(proc)
        assert engine.stalled.wait(30)
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(20)  # (less than the scrape's own timeout: the signal ended it)
    assert rc == 0


# --- the reader: in process --------------------------------------------------------------------


def test_scraper_streams_a_gzip_body_into_the_reader() -> None:
    reader = MetricsReader()
    body = reader.stream()
    with _Engine(BIG, gzipped=True) as engine:
        result = Scraper(engine.url).fetch(body.feed)
    assert result.ok and result.text is None
    events = body.finish()
    assert [e.kind for e in events] == ["settings", "pool", "usage", "preemption"]
    assert events == MetricsReader().read(BIG.decode())


def test_abort_ends_a_stalled_fetch_at_once() -> None:
    with _Engine(BIG, stall=True) as engine:
        scraper = Scraper(engine.url, read_timeout=20)
        out: list[ScrapeResult] = []
        thread = threading.Thread(target=lambda: out.append(scraper.fetch(lambda _: None)))
        thread.start()
        assert engine.stalled.wait(10)
        time.sleep(0.5)  # the client has read what was sent and waits in recv()
        scraper.abort()
        thread.join(10)  # (half the read timeout: only the abort ends it this soon)
        assert not thread.is_alive()
    assert not out[0].ok


class _Recording(dict[str, list[Sample]]):
    asked: set[str] = set()

    def get(self, key: str, default: object = None) -> object:  # type: ignore[override]
        _Recording.asked.add(key)
        return super().get(key, default)


@pytest.mark.parametrize("stem", sorted(p.stem for p in FIXTURES.glob("*.txt")))
def test_families_name_every_series_facts_read(stem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each dialect's `families` covers every name its `facts` looks up (else that fact is lost)."""
    one_rank = MetricsReader._one_rank
    monkeypatch.setattr(MetricsReader, "_one_rank", staticmethod(lambda s: _Recording(one_rank(s))))
    _Recording.asked = set()
    MetricsReader().read((FIXTURES / f"{stem}.txt").read_text())
    families = registry.get(stem.split("-")[0]).metrics.families
    assert _Recording.asked and _Recording.asked <= families, _Recording.asked - families


def test_only_read_families_are_materialised() -> None:
    body = MetricsReader().stream()
    body.feed(BIG.decode())
    stream = body._stream
    kept = stream.kept["vllm"]
    assert 0 < len(kept) < 20
    assert {s.name for s in kept} <= registry.get("vllm").metrics.families | {
        "prefix_cache_hits_created",
        "prefix_cache_queries_created",
        "gpu_prefix_cache_hits_created",
        "gpu_prefix_cache_queries_created",
        "num_preemptions_created",
    }


def test_series_over_the_cap_are_dropped_and_counted() -> None:
    lines = [f'vllm:num_requests_running{{engine="0",x="{i}"}} 1.0' for i in range(MAX_KEPT_SERIES + 5)]
    reader = MetricsReader()
    reader.read("\n".join(lines) + "\n")
    assert reader.dropped_series == 5


def test_a_line_over_the_length_cap_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="longer than"):
        MetricsReader().read('vllm:num_requests_running{x="' + "a" * MAX_LINE_CHARS + '"} 1\n')


def test_a_restart_shown_only_by_a_counter_kvwatch_does_not_read_is_a_reset() -> None:
    text = (FIXTURES / "sglang-0.4.3.txt").read_text()
    assert "sglang:prompt_tokens_total" in text
    reader = MetricsReader()
    reader.read(text)
    after = re.sub(r"(sglang:prompt_tokens_total\{[^}]*\}) \S+", r"\1 1.0", text)
    events = reader.read(after)
    assert isinstance(events[0], CounterReset)
    assert events[0].metric == "sglang:prompt_tokens_total"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=4000), min_size=1, max_size=8))
def test_any_split_of_the_body_reads_the_same(cuts: list[int]) -> None:
    text = (FIXTURES / "vllm-0.10.1-v1.txt").read_text()
    expected = [event_to_json(e) for e in MetricsReader().read(text)]
    body = MetricsReader().stream()
    at = 0
    for cut in sorted(cuts):
        body.feed(text[at:cut])
        at = max(at, cut)
    body.feed(text[at:])
    assert [event_to_json(e) for e in body.finish()] == expected


@pytest.mark.integration
def test_dropped_series_and_unusable_values_are_exported(
    sidecar: Callable[[str, str], subprocess.Popen[str]],
) -> None:
    """What the reader leaves out of an engine's body is counted on kvwatch's own /metrics."""
    lines = ['vllm:num_requests_waiting{engine="0"} NaN']  # (first: it must be within the cap)
    lines += [f'vllm:num_requests_running{{engine="0",x="{i}"}} 1.0' for i in range(MAX_KEPT_SERIES + 4)]
    with _Engine(("\n".join(lines) + "\n").encode()) as engine:
        proc = sidecar(engine.url, "1")
        own = _serving_url(proc)

        def exported(name: str) -> float:
            text = urllib.request.urlopen(own, timeout=10).read().decode()
            found = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
            return float(found.group(1)) if found else -1.0

        _wait(lambda: engine.served >= 2 and exported("kvwatch_metrics_series_dropped_total") >= 10)
        assert exported("kvwatch_metrics_unusable_values_total") >= 2
