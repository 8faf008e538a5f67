"""A real Prometheus scrapes `kvwatch run` while real log lines are appended and the log is rotated.

Everything binds 127.0.0.1, every wait is bounded, and both processes are stopped by the test.
The values are read back through Prometheus' HTTP API, the way a dashboard or an alert sees them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
SAMPLES = TESTS / "log_samples"
LLAMA_8B = TESTS / "model_configs" / "meta-llama--Meta-Llama-3.1-8B.json"
# Llama-3.1-8B on an RTX 3090: memory profile (kv_cache_size=3.81GiB), '# GPU blocks: 1952', 20,000-token
# requests; V0 stats lines ending at 2.3% usage; a V0 preemption warning with cumulative total 51.
STARTUP = (SAMPLES / "vllm/001-llama31-8b-rtx3090-profiling-20k.log").read_text().splitlines()
STATS = (SAMPLES / "vllm/012-v0-metrics449-low-usage-2025-01.log").read_text().splitlines()
PREEMPTION = (SAMPLES / "vllm/026-v0-preemption-lighteval-suffix-location.log").read_text().splitlines()

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _append(path: Path, lines: list[str]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class _Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def query(self, promql: str) -> float | None:
        """The single value of an instant query, None when it has no result (yet)."""
        url = f"{self.base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                data = json.loads(resp.read())
        except OSError:
            return None
        result = data.get("data", {}).get("result", [])
        if data.get("status") != "success" or len(result) != 1:
            return None
        return float(result[0]["value"][1])

    def wait_for(self, promql: str, expected: float, timeout: float = 40.0, rel: float = 1e-9) -> float:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.query(promql)
            if last is not None and last == pytest.approx(expected, rel=rel):
                return last
            time.sleep(0.25)
        raise AssertionError(f"{promql}: expected {expected}, last seen {last}")


@pytest.fixture
def stack(tmp_path: Path, prometheus_server: str) -> Iterator[tuple[_Prometheus, Path, str]]:
    log = tmp_path / "logs" / "vllm.log"
    log.parent.mkdir()
    log.touch()
    kv_port, prom_port = _free_port(), _free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
        "scrape_configs:\n  - job_name: kvwatch\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{kv_port}']\n",
        encoding="utf-8",
    )
    with (
        (tmp_path / "kvwatch.stderr").open("wb") as kv_err,
        (tmp_path / "prometheus.stderr").open("wb") as p_err,
    ):
        kvwatch = subprocess.Popen(
            [sys.executable, "-m", "kvwatch", "run", "--log", f"vllm={log}", "--model-config", str(LLAMA_8B),
             "--listen", f"127.0.0.1:{kv_port}", "--state-dir", str(tmp_path / "state")],
            stdout=subprocess.DEVNULL, stderr=kv_err,
        )  # fmt: skip
        prometheus = subprocess.Popen(
            [prometheus_server, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=p_err,
        )  # fmt: skip
    try:
        yield _Prometheus(prom_port), log, f"http://127.0.0.1:{kv_port}/metrics"
    finally:
        _stop(prometheus)
        _stop(kvwatch)
    assert kvwatch.returncode == 0, (tmp_path / "kvwatch.stderr").read_text()


def test_prometheus_reads_pool_gap_headroom_and_preemptions(
    stack: tuple[_Prometheus, Path, str], promtool: str
) -> None:
    prom, log, kvwatch_url = stack
    sel = '{source="vllm",dp_rank="0"}'
    _append(log, STARTUP)
    prom.wait_for("up{job='kvwatch'}", 1)
    pool = 1952 * 16  # blocks x vLLM's default block size
    prom.wait_for(f"kvwatch_kv_pool_tokens{sel}", pool)

    # Rotate the way logrotate does (rename, the engine opens a new file), then keep writing.
    os.replace(log, log.with_name("vllm.log.1"))
    _append(log, STATS)
    _append(log, PREEMPTION)

    used = round(0.023 * pool)  # the last stats line: 'GPU KV cache usage: 2.3%'
    prom.wait_for(f"kvwatch_kv_headroom_tokens{sel}", pool - used)
    prom.wait_for(f"kvwatch_kv_headroom_requests{sel}", (pool - used) // 20000)
    prom.wait_for(f"kvwatch_preemptions_total{sel}", 51)
    # Engine budget: 'kv_cache_size=3.81GiB' cut into 16-token pages of 128 KiB per token.
    budget = round(3.81 * 2**30) // (16 * 131072) * 16
    prom.wait_for(
        'kvwatch_kv_pool_gap_ratio{source="vllm",basis="engine_budget"}', pool / budget - 1, rel=1e-6
    )
    assert prom.query('kvwatch_kv_pool_predicted_tokens{source="vllm",basis="config"}') is not None
    prom.wait_for('kvwatch_log_rotations_total{source="vllm"}', 1)
    prom.wait_for('kvwatch_lines_read_total{source="vllm"}', len(STARTUP) + len(STATS) + len(PREEMPTION))
    assert prom.query('kvwatch_prediction_available{source="vllm",state="ok"}') == 1

    # The exposition itself passes Prometheus' own linter.
    with urllib.request.urlopen(kvwatch_url, timeout=5) as resp:
        exposition = resp.read()
    done = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
