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
from typing import Any

import pytest
from waiting import stop

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
        stop(prometheus)
        stop(kvwatch)
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


# --- Issue 13: a fleet of sidecars, real Prometheus and Alertmanager, the shipped rules ------------
#
# Pods (static targets with namespace/pod target labels, as the PodMonitor would add):
#   healthy-1, healthy-2  vLLM 0.19 on H100 (the compose startup block, a real start, + a real stats line): no page.
#   small-3               the same engine with its pool edited down to 300,000 tokens: one page,
#                         KVPoolBelowSiblingReplicas; its KVPoolDriftsFromPrediction is inhibited.
#   failed-4              a real 'max_model_len too large' startup failure: KVEngineStartupFailed
#                         (critical); its warnings and infos are inhibited.
#   frozen-5              metrics-only, a fake vLLM /metrics (a real fixture); its KV series are then
#                         renamed: KVWatchStale within the staleness bound.
#   sglang-8              SGLang's real KV allocation line (pool in tokens and bytes), no model config.
#   down-6                a kvwatch target nothing listens on: KVWatchTargetDown, and still a pod
#                         the dashboard's pod variable offers.
# The engine endpoints are also scraped as jobs vllm and sglang, for the dashboard's engine row.
#
# Test copy of the rules: every `for:` is 3s (the shipped ones are minutes); expressions, windows
# and thresholds are the shipped ones. Prometheus scrapes and evaluates every second. Log-fed pods
# run with --fact-ttl 600 (their single stats line would otherwise go stale within the test; a busy
# engine logs every 10 s), frozen-5 with --fact-ttl 3.

H100_STARTUP = (
    TESTS.parent / "deploy" / "compose" / "replay" / "vllm-llama31-8b-h100-startup.log"
).read_text()
V1_STATS = (
    "(APIServer pid=4801) INFO 10-03 09:16:30 [loggers.py:259] Engine 000: Avg prompt throughput: "
    "23999.8 tokens/s, Avg generation throughput: 52.6 tokens/s, Running: 22 reqs, Waiting: 78 reqs, "
    "GPU KV cache usage: 42.5%, Prefix cache hit rate: 0.0%\n"
)
FAILED_START = (SAMPLES / "vllm/002-llama31-8b-rtx3090-maxlen-too-large-29k.log").read_text()
QWEN_7B = TESTS / "model_configs" / "Qwen--Qwen2.5-7B.json"
FIXTURES = TESTS / "metrics_fixtures"
TEST_FOR = "3s"
FROZEN_TTL = 3.0
# Panels whose scenario this test does not build, and why.
NO_SCENARIO = {
    "Ranks whose pool shrank": "needs a restart that came back smaller within a day",
}


def _histograms(prefix: str, labels: str, n: int) -> str:
    """Latency histograms an engine exports (TTFT, end-to-end), growing with n so rate() sees them."""
    out = []
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        out.append(f"# TYPE {prefix}{name} histogram")
        for le, share in (("0.1", 0.5), ("1.0", 0.9), ("+Inf", 1.0)):
            out.append(f'{prefix}{name}_bucket{{{labels},le="{le}"}} {int(n * share)}')
        out.append(f"{prefix}{name}_sum{{{labels}}} {n * 0.3}")
        out.append(f"{prefix}{name}_count{{{labels}}} {n}")
    return "\n".join(out) + "\n"


class _EngineEndpoint:
    """A fake engine /metrics on 127.0.0.1: a real fixture plus growing latency histograms."""

    def __init__(self, text: str, prefix: str, labels: str) -> None:
        import http.server
        import threading

        endpoint = self
        self.text, self.prefix, self.labels = text, prefix, labels
        self.started = time.monotonic()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                n = int((time.monotonic() - endpoint.started) * 10) + 1
                body = (endpoint.text + _histograms(endpoint.prefix, endpoint.labels, n)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _query_all(base: str, promql: str) -> list[dict[str, Any]]:
    data = _get_json(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    assert data["status"] == "success", (promql, data)
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def _test_rules(tmp_path: Path) -> list[Path]:
    """rules/ with every alert's `for:` set to TEST_FOR."""
    import yaml

    out = []
    for path in sorted((TESTS.parent / "rules").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rule["for"] = TEST_FOR
        copy = tmp_path / path.name
        copy.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        out.append(copy)
    return out


def _am_alerts(base: str) -> dict[tuple[str, str], str]:
    """(pod, alertname) -> 'active' or 'suppressed', for every alert Alertmanager holds."""
    return {
        (a["labels"].get("pod", ""), a["labels"]["alertname"]): a["status"]["state"]
        for a in _get_json(f"{base}/api/v2/alerts")
    }


def start_alerting(
    tmp_path: Path,
    config: dict[str, Any],
    ports: dict[str, int],
    prometheus_server: str,
    alertmanager_server: str,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    """Alertmanager (the shipped config) and Prometheus (``config`` as its prometheus.yml) on
    127.0.0.1, their stderr in tmp_path, appended to ``procs`` for the caller to stop."""
    import yaml

    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    with (
        (tmp_path / "prometheus.stderr").open("wb") as p_err,
        (tmp_path / "am.stderr").open("wb") as a_err,
    ):
        procs.append(subprocess.Popen(
            [alertmanager_server, f"--config.file={TESTS.parent / 'deploy/alertmanager/alertmanager.yml'}",
             f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{ports['am']}",
             f"--cluster.listen-address=127.0.0.1:{ports['am_cluster']}"],
            stdout=subprocess.DEVNULL, stderr=a_err))  # fmt: skip
        procs.append(subprocess.Popen(
            [prometheus_server, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{ports['prom']}"],
            stdout=subprocess.DEVNULL, stderr=p_err))  # fmt: skip


def _substitute(expr: str) -> str:
    """A dashboard query with its variables as 'All' (.*) and Grafana's intervals as values."""
    import re

    expr = expr.replace("$__rate_interval", "30s").replace("$__interval", "15s").replace("$__range", "1h")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def test_fleet_pages_name_the_pod_inhibit_per_cause_and_catch_a_frozen_source(
    tmp_path: Path, prometheus_server: str, alertmanager_server: str
) -> None:

    from kvwatch.mixin import dashboards as _dashboards  # noqa: F401  (the JSON is read below)

    ports = {name: _free_port() for name in ("prom", "am", "am_cluster", "down")}
    vllm = _EngineEndpoint(
        (FIXTURES / "vllm-0.10.1-v1.txt").read_text(),
        "vllm:",
        'engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"',
    )
    sglang_text = (FIXTURES / "sglang-0.5.7.txt").read_text()
    sglang = _EngineEndpoint(sglang_text, "sglang:", 'model_name="Qwen/Qwen3-8B"')
    logs = {
        "healthy-1": H100_STARTUP + V1_STATS,
        "healthy-2": H100_STARTUP + V1_STATS,
        "small-3": H100_STARTUP.replace("476,016 tokens", "300,000 tokens") + V1_STATS,
        "failed-4": FAILED_START,
        # SGLang's allocation line (pool tokens and bytes); no model config: prediction info only.
        "sglang-8": (SAMPLES / "sglang/001-qwen3-235b-fp8-tp4-kv-alloc.log").read_text(),
    }
    procs: list[subprocess.Popen[bytes]] = []
    targets: list[dict[str, Any]] = []
    try:
        with (tmp_path / "kvwatch.stderr").open("wb") as err:
            for pod in [*logs, "frozen-5"]:
                port = _free_port()
                args = [sys.executable, "-m", "kvwatch", "run", "--listen", f"127.0.0.1:{port}",
                        "--state-dir", str(tmp_path / pod / "state")]  # fmt: skip
                if pod in logs:
                    log = tmp_path / pod / "vllm.log"
                    log.parent.mkdir(parents=True)
                    log.write_text(logs[pod], encoding="utf-8")
                    args += [f"--log={pod}={log}", "--fact-ttl=600"]
                    if not pod.startswith("sglang"):
                        args += [f"--model-config={LLAMA_8B}", "--gpu-memory=81559MiB"]
                else:
                    args += [f"--metrics-url={pod}={vllm.url}", f"--model-config={QWEN_7B}",
                             "--scrape-interval=0.2", f"--fact-ttl={FROZEN_TTL}"]  # fmt: skip
                procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err))
                targets.append(
                    {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": "serving", "pod": pod}}
                )
        targets.append(
            {"targets": [f"127.0.0.1:{ports['down']}"], "labels": {"namespace": "serving", "pod": "down-6"}}
        )
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in _test_rules(tmp_path)],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports['am']}"]}]}]},
            "scrape_configs": [
                {"job_name": "kvwatch", "static_configs": targets},
                {"job_name": "vllm", "static_configs": [
                    {"targets": [f"127.0.0.1:{vllm.port}"], "labels": {"namespace": "serving", "pod": "frozen-5"}}]},
                {"job_name": "sglang", "static_configs": [
                    {"targets": [f"127.0.0.1:{sglang.port}"], "labels": {"namespace": "serving", "pod": "sglang-7"}}]},
            ],
        }  # fmt: skip
        start_alerting(tmp_path, config, ports, prometheus_server, alertmanager_server, procs)
        prom = _Prometheus(ports["prom"])
        am = f"http://127.0.0.1:{ports['am']}"

        expected = {
            ("small-3", "KVPoolBelowSiblingReplicas"): "active",
            ("small-3", "KVPoolDriftsFromPrediction"): "suppressed",
            ("failed-4", "KVEngineStartupFailed"): "active",
            ("down-6", "KVWatchTargetDown"): "active",
        }
        deadline = time.monotonic() + 90
        seen: dict[tuple[str, str], str] = {}
        while time.monotonic() < deadline:
            try:
                seen = _am_alerts(am)
            except OSError:
                seen = {}
            if expected.items() <= seen.items():
                break
            time.sleep(0.5)
        assert expected.items() <= seen.items(), seen
        time.sleep(4)  # another `for:` period: nothing else may have started firing meanwhile
        seen = _am_alerts(am)
        # No alert at all on the healthy pods; on frozen-5, before it freezes, only the info that
        # kvwatch cannot predict its pool (no GPU size given for a metrics-only source), which
        # routes to the null receiver: no page.
        assert not [k for k in seen if k[0] in ("healthy-1", "healthy-2")], seen
        assert {a for (p, a) in seen if p == "frozen-5"} <= {"KVPredictionUnavailable"}, seen
        assert {a for (p, a) in seen if p == "sglang-8"} <= {"KVPredictionUnavailable"}, seen
        # On failed-4, everything besides the critical page is inhibited.
        assert {a: s for (p, a), s in seen.items() if p == "failed-4" and s == "active"} == {
            "KVEngineStartupFailed": "active"
        }, seen
        assert {a for (p, a), s in seen.items() if p == "small-3" and s == "active"} == {
            "KVPoolBelowSiblingReplicas"
        }
        assert ("", "KVWatchAbsent") not in seen

        # The page names the pod and the model.
        firing = _get_json(f"{am}/api/v2/alerts")
        (small,) = [a for a in firing if a["labels"]["alertname"] == "KVPoolBelowSiblingReplicas"]
        assert "serving/small-3" in small["annotations"]["summary"]
        assert "meta-llama/Llama-3.1-8B-Instruct" in small["annotations"]["summary"]
        (failed,) = [a for a in firing if a["labels"]["alertname"] == "KVEngineStartupFailed"]
        assert "serving/failed-4" in failed["annotations"]["description"]
        (down,) = [a for a in firing if a["labels"]["alertname"] == "KVWatchTargetDown"]
        assert "serving/down-6" in down["annotations"]["summary"]

        # Dashboards against the live Prometheus: every query with its variables as "All" returns data.
        missing = []
        for path in sorted((TESTS.parent / "dashboards").glob("*.json")):
            board = json.loads(path.read_text(encoding="utf-8"))
            for panel in board["panels"]:
                if panel["type"] == "row" or panel["title"] in NO_SCENARIO:
                    continue
                for target in panel["targets"]:
                    if not _query_all(prom.base, _substitute(target["expr"])):
                        missing.append(f"{path.name}: {panel['title']}: {target['expr']}")
            for variable in board["templating"]["list"]:
                if variable["type"] == "query":
                    series = variable["query"][len("label_values(") :].rsplit(",", 1)[0]
                    if not _query_all(prom.base, _substitute(series)):
                        missing.append(f"{path.name}: variable {variable['name']}")
        assert not missing, "\n".join(missing)
        # The pod variable offers the pod whose kvwatch is down.
        pods = {r["metric"].get("pod") for r in _query_all(prom.base, 'up{job=~"kvwatch.*"}')}
        assert {"down-6", "failed-4", "frozen-5"} <= pods

        # frozen-5: /metrics renames its KV series and keeps the others.
        vllm.text = vllm.text.replace("vllm:gpu_cache_usage_perc", "vllm:kv_usage_renamed").replace(
            "vllm:kv_cache_usage_perc", "vllm:kv_usage_renamed2"
        )
        frozen_at = time.monotonic()
        # Bound: fact TTL + `for:` + scrape, evaluation and Alertmanager delivery (a few seconds).
        bound = FROZEN_TTL + 3 + 10
        while time.monotonic() < frozen_at + bound:
            if _am_alerts(am).get(("frozen-5", "KVWatchStale")) == "active":
                break
            time.sleep(0.25)
        took = time.monotonic() - frozen_at
        assert _am_alerts(am).get(("frozen-5", "KVWatchStale")) == "active", f"not within {bound}s"
        assert took >= FROZEN_TTL
        # The frozen usage is no longer exported, so the fleet sums leave it out.
        assert prom.query('kvwatch_kv_usage_ratio{pod="frozen-5"}') is None
        assert (
            prom.query('kvwatch_source_facts_stale{pod="frozen-5",origin="metrics",fact="kv_usage_ratio"}')
            == 1
        )
    finally:
        for proc in reversed(procs):
            stop(proc)
        vllm.close()
        sglang.close()
