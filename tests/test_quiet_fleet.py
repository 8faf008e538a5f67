"""A quiet fleet, live: three `kvwatch run` sidecars on engines that keep writing, a real Prometheus
with the shipped rules and a real Alertmanager with the shipped configuration (issue 21).

A healthy fleet must raise no alert at all, however long it runs: this runs it past every `for:`
and the fact TTL (both shrunk by one factor, as the demo shrinks its fault's `for:`; expressions,
windows and thresholds are the shipped ones) and asserts that Prometheus never held an alert,
pending or firing, and Alertmanager none. Then one fault per pod, all at once, and exactly each
fault's alert fires. Everything binds 127.0.0.1, every wait is bounded, every process is stopped.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_prometheus_integration import _EngineEndpoint, _get_json, start_alerting
from waiting import stop

from kvwatch.mixin import config, rules
from kvwatch.sidecar.demo import _demo_files, _sections

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
LLAMA_8B = ROOT / "tests" / "model_configs" / "meta-llama--Meta-Llama-3.1-8B.json"
H100_STARTUP = (ROOT / "deploy" / "compose" / "replay" / "vllm-llama31-8b-h100-startup.log").read_text()
# A real V1 stats line (tests/log_samples/vllm/007-...) and an access line: requests still come.
STATS = (
    "(APIServer pid=4801) INFO 10-03 09:16:30 [loggers.py:259] Engine 000: Avg prompt throughput: "
    "23999.8 tokens/s, Avg generation throughput: 52.6 tokens/s, Running: 22 reqs, Waiting: 78 reqs, "
    "GPU KV cache usage: 42.5%, Prefix cache hit rate: 0.0%"
)
ACCESS = '(APIServer pid=4801) INFO:     10.0.0.9:40312 - "POST /v1/completions HTTP/1.1" 200 OK'
DEMO = _demo_files()
SGLANG = _sections((DEMO / "sglang.log").read_text(encoding="utf-8").split("\n"))
# Shipped minutes become half-seconds: the longest `for:` (30m) is 15 s.
SCALE = 120
TTL = 3.0
STEP = 0.5  # seconds between an engine's lines

# The /metrics of the engine behind healthy-2: the figures its log prints (29,751 blocks of 16 =
# 476,016 tokens, 42.5 % used, 22 running, 78 waiting), in vLLM V1's names.
_L = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'
VLLM_METRICS = (
    f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{_L}}} 22.0\n"
    f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{_L}}} 78.0\n"
    f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{{_L}}} 0.425\n"
    f"# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{{{_L}}} 0.0\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="False",engine="0",'
    'gpu_memory_utilization="0.95",num_cpu_blocks="0",num_gpu_blocks="29751"} 1.0\n'
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scaled(duration: str) -> str:
    """A shipped `for:` (e.g. '15m') divided by SCALE, in milliseconds."""
    match = re.fullmatch(r"(\d+)([smh])", duration)
    assert match, duration
    seconds = int(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2]]
    return f"{seconds * 1000 // SCALE}ms"


def _rules(folder: Path) -> list[Path]:
    """The rules `kvwatch rules` writes, every `for:` scaled."""
    alerts: Any = rules.alerts_document()
    for group in alerts["groups"]:
        for rule in group["rules"]:
            rule["for"] = _scaled(config.FOR[rule["alert"]])
    out = []
    for name, doc in (("rules.yaml", rules.rules_document()), ("alerts.yaml", alerts)):
        (folder / name).write_text(rules.to_yaml(doc), encoding="utf-8")
        out.append(folder / name)
    return out


class _Writer:
    """The engines: each pod's log gets its next line every STEP seconds, on one thread."""

    def __init__(self, logs: dict[str, tuple[Path, list[str]]]) -> None:
        self.lines = {pod: lines for pod, (_, lines) in logs.items()}
        self.paths = {pod: path for pod, (path, _) in logs.items()}
        self.sent = dict.fromkeys(logs, 0)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def switch(self, pod: str, first: list[str], then: list[str]) -> None:
        """Append ``first`` at once, then write ``then`` instead of the pod's lines so far."""
        with self.lock:
            with self.paths[pod].open("a", encoding="utf-8") as fh:
                fh.write("".join(f"{line}\n" for line in first))
            self.lines[pod], self.sent[pod] = then, 0

    def _run(self) -> None:
        while not self._stop.wait(STEP):
            with self.lock:
                for pod, lines in self.lines.items():
                    with self.paths[pod].open("a", encoding="utf-8") as fh:
                        fh.write(lines[self.sent[pod] % len(lines)] + "\n")
                    self.sent[pod] += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _prom_alerts(base: str) -> set[tuple[str, str, str]]:
    """(pod, alertname, state) of every alert Prometheus holds, pending or firing."""
    try:
        data = _get_json(f"{base}/api/v1/alerts")
    except OSError:
        return set()
    return {
        (a["labels"].get("pod", ""), a["labels"]["alertname"], a["state"]) for a in data["data"]["alerts"]
    }


def _am_alerts(base: str) -> set[tuple[str, str, str]]:
    return {
        (a["labels"].get("pod", ""), a["labels"]["alertname"], a["status"]["state"])
        for a in _get_json(f"{base}/api/v2/alerts")
    }


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    import urllib.parse

    data = _get_json(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def test_a_quiet_fleet_raises_nothing_then_each_fault_exactly_its_alert(
    tmp_path: Path, prometheus_server: str, alertmanager_server: str
) -> None:
    ports = {name: _free_port() for name in ("prom", "am", "am_cluster")}
    metrics = _EngineEndpoint(VLLM_METRICS, "vllm:", _L)
    logs: dict[str, tuple[Path, list[str]]] = {}
    procs: list[subprocess.Popen[bytes]] = []
    targets = []
    writer = None
    try:
        with (tmp_path / "kvwatch.stderr").open("wb") as err:
            for pod, startup, stats in (
                ("healthy-1", H100_STARTUP, [STATS]),
                ("healthy-2", H100_STARTUP, [STATS]),
                ("sglang-3", "".join(f"{x}\n" for x in SGLANG[0][2]), SGLANG[1][2]),
            ):
                log = tmp_path / pod / "engine.log"
                log.parent.mkdir()
                log.write_text(startup, encoding="utf-8")
                logs[pod] = (log, stats)
                port = _free_port()
                args = [sys.executable, "-m", "kvwatch", "run", "--listen", f"127.0.0.1:{port}",
                        f"--log={pod}={log}", f"--fact-ttl={TTL}"]  # fmt: skip
                if pod.startswith("healthy"):
                    args += [f"--model-config={LLAMA_8B}", "--gpu-memory=81559MiB"]
                else:  # SGLang prints no card memory: no --gpu, as the demo runs it
                    args += [f"--model-config={DEMO / 'models' / 'deepseek-ai--DeepSeek-V3.2.json'}"]
                if pod == "healthy-2":  # the same engine's /metrics too
                    args += [f"--metrics-url={pod}={metrics.url}", "--scrape-interval=0.5"]
                procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err))
                targets.append(
                    {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": "serving", "pod": pod}}
                )
        writer = _Writer(logs)
        settings = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in _rules(tmp_path)],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports['am']}"]}]}]},
            "scrape_configs": [{"job_name": "kvwatch", "static_configs": targets}],
        }
        start_alerting(tmp_path, settings, ports, prometheus_server, alertmanager_server, procs)
        prom, am = f"http://127.0.0.1:{ports['prom']}", f"http://127.0.0.1:{ports['am']}"

        # Every pod's pool and usage in Prometheus (bounded), then the quiet period.
        deadline = time.monotonic() + 60
        ready = 'count(kvwatch_kv_pool_tokens) == 3 and count(kvwatch_kv_usage_ratio) == 3 and min(up{job="kvwatch"}) == 1'
        while time.monotonic() < deadline:
            try:
                if _query(prom, ready):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert _query(prom, ready), "the three pods did not reach Prometheus"
        # The sidecars were down until they listened: the rules see them up from the next evaluation.
        time.sleep(2)
        longest = max(int(_scaled(d)[:-2]) for d in config.FOR.values()) / 1000
        quiet_until = time.monotonic() + longest + TTL + 5
        seen: set[tuple[str, str, str]] = set()
        while time.monotonic() < quiet_until:
            seen |= _prom_alerts(prom)
            time.sleep(0.5)
        assert not seen, seen
        assert not _am_alerts(am)
        # Startup facts are never stale; the periodic ones are flagged and fresh.
        flags = _query(prom, "kvwatch_source_facts_stale")
        assert flags and all(r["value"][1] == "0" for r in flags), flags
        assert {r["metric"]["fact"] for r in flags} == {"kv_usage_ratio", "running", "waiting", "used_tokens"}
        assert len(_query(prom, 'kvwatch_prediction_available{state="ok"} == 1')) == 2
        assert _query(prom, 'kvwatch_prediction_available{pod="sglang-3",state="no_gpu_memory"} == 1')

        # One fault per pod, at once.
        writer.switch("healthy-1", [], [ACCESS])  # its stats lines stop, requests go on
        metrics.text = VLLM_METRICS.replace("vllm:kv_cache_usage_perc", "vllm:kv_usage_renamed")
        writer.switch("sglang-3", SGLANG[2][2], SGLANG[3][2])  # the demo's labelled restart, a third smaller
        expected = {
            ("healthy-1", "KVWatchStale"),
            ("healthy-2", "KVWatchStale"),
            ("sglang-3", "KVPoolShrankSinceLastStart"),
        }
        deadline = time.monotonic() + TTL + 30
        after: set[tuple[str, str, str]] = set()
        while time.monotonic() < deadline:
            now = _prom_alerts(prom)
            after |= now
            if {(p, a) for p, a, s in now if s == "firing"} == expected:
                break
            time.sleep(0.5)
        time.sleep(2)  # two more evaluations: nothing else may start meanwhile
        after |= _prom_alerts(prom)
        assert {(p, a) for p, a, s in after if s == "firing"} == expected, after
        assert {(p, a) for p, a, _ in after} == expected, after  # nothing else even pending
        origins = {
            (r["metric"]["pod"], r["metric"]["origin"])
            for r in _query(prom, 'ALERTS{alertname="KVWatchStale",alertstate="firing"}')
        }
        assert origins == {("healthy-1", "log"), ("healthy-2", "metrics")}
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and {(p, a) for p, a, _ in _am_alerts(am)} != expected:
            time.sleep(0.5)
        assert _am_alerts(am) == {(p, a, "active") for p, a in expected}
    finally:
        if writer is not None:
            writer.stop()
        for proc in reversed(procs):
            stop(proc)
        metrics.close()
