"""promtool checks of the shipped rules: `promtool check rules` on rules/*.yaml and
`promtool test rules` on tests/rules/*_test.yaml (every alert: a case that fires, one that must not),
plus `promtool check config` on the compose stack's Prometheus configuration.

promtool comes from the `promtool` fixture (conftest.py): missing fails in CI, skips elsewhere.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from waiting import stop

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = sorted((ROOT / "rules").glob("*.yaml"))
RULE_TESTS = sorted((ROOT / "tests" / "rules").glob("*_test.yaml"))

pytestmark = pytest.mark.integration


def _promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, check=False)


def test_there_are_rules_and_rule_tests() -> None:
    assert [p.name for p in RULE_FILES] == ["kvwatch.alerts.yaml", "kvwatch.rules.yaml"]
    assert RULE_TESTS


def test_promtool_check_rules(promtool: str) -> None:
    result = _promtool(promtool, "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=[p.name for p in RULE_TESTS])
def test_promtool_test_rules(promtool: str, test_file: Path) -> None:
    result = _promtool(promtool, "test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules_fails_when_an_alert_threshold_moves(promtool: str, tmp_path: Path) -> None:
    """The unit tests pin behaviour: the same tests against a loosened alert must fail."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests" / "rules").mkdir(parents=True)
    for path in RULE_FILES:
        text = path.read_text(encoding="utf-8")
        if path.name == "kvwatch.alerts.yaml":
            assert "kvwatch_kv_usage_ratio > 0.95" in text
            text = text.replace("kvwatch_kv_usage_ratio > 0.95", "kvwatch_kv_usage_ratio > 0.99")
        (tmp_path / "rules" / path.name).write_text(text, encoding="utf-8")
    test_copy = tmp_path / "tests" / "rules" / "alerts_test.yaml"
    test_copy.write_text((ROOT / "tests" / "rules" / "kvwatch_alerts_test.yaml").read_text(encoding="utf-8"))
    result = _promtool(promtool, "test", "rules", str(test_copy))
    assert result.returncode != 0
    assert "KVCacheNearlyFull" in result.stdout + result.stderr


def test_promtool_check_config_of_the_compose_prometheus(promtool: str, tmp_path: Path) -> None:
    """The compose Prometheus config, with its in-container rule path pointed at rules/."""
    config = yaml.safe_load((ROOT / "deploy" / "compose" / "prometheus" / "prometheus.yml").read_text())
    config["rule_files"] = [str(ROOT / "rules" / "*.yaml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = _promtool(promtool, "check", "config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


# One real stats line (tests/log_samples/vllm/007-v1-apiserver-loggers259-waiting-2026.log).
_STATS_LINE = (
    "(APIServer pid=11574) INFO 03-17 15:38:30 [loggers.py:259] Engine 000: Avg prompt throughput: "
    "23999.8 tokens/s, Avg generation throughput: 52.6 tokens/s, Running: 22 reqs, Waiting: 78 reqs, "
    "GPU KV cache usage: 42.5%, Prefix cache hit rate: 0.0%\n"
)
_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
_TARGET = {"job": "kvwatch", "instance": "10.0.0.1:9477", "namespace": "serving", "source": "vllm"}


def _selector(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items())) + "}"


def test_rules_on_the_sidecars_own_exposition(promtool: str, tmp_path: Path) -> None:
    """The rules evaluated on what kvwatch itself exports for a healthy vLLM start (the compose
    replayer's startup block plus one real stats line): the fleet aggregates and the limiting rank
    come out with the collector's real labels, and no alert fires."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from kvwatch.analysis.predictor import Predictor
    from kvwatch.core.units import MiB
    from kvwatch.export.collector import KvwatchCollector
    from kvwatch.mixin import config
    from kvwatch.sources.pipeline import replay

    startup = ROOT / "deploy" / "compose" / "replay" / "vllm-llama31-8b-h100-startup.log"
    log = tmp_path / "vllm.log"
    log.write_text(startup.read_text(encoding="utf-8") + _STATS_LINE, encoding="utf-8")
    model_config = ROOT / "tests" / "model_configs" / "meta-llama--Meta-Llama-3.1-8B.json"
    registry = CollectorRegistry()
    registry.register(
        KvwatchCollector(
            replay([str(log)]).fleet.snapshot,
            Predictor(model_config=lambda source: model_config, gpu_memory_bytes=81559 * MiB),
        )
    )
    series = []
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if sample.name.endswith("_created") or not sample.name.startswith("kvwatch_"):
                continue
            labels = {**sample.labels, **_TARGET} if "dp_rank" in sample.labels else dict(sample.labels)
            series.append({"series": _selector(sample.name, labels), "values": f"{sample.value:.6f}x70"})
    # Prometheus' own `up` of the sidecar's target (KVWatchTargetDown, KVWatchAbsent read it).
    target = {k: v for k, v in _TARGET.items() if k != "source"}
    series.append({"series": _selector("up", target), "values": "1x70"})
    fleet = {"namespace": "serving", "engine_kind": "vllm", "model_name": _MODEL}
    rank = {**fleet, **_TARGET, "dp_rank": "0"}
    # A real 0.19.0 start (476,016 tokens); 42.5 % in use leaves 273,709 free: 33 requests of 8,192.
    # Its config-basis prediction lands within 0.1 %, so the drift alert stays quiet.
    document = {
        "rule_files": [str(p) for p in RULE_FILES],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": "fleet:kvwatch_kv_pool_tokens:sum",
                        "eval_time": "30m",
                        "exp_samples": [
                            {"labels": _selector("fleet:kvwatch_kv_pool_tokens:sum", fleet), "value": 476016}
                        ],
                    },
                    {
                        "expr": "fleet:kvwatch_kv_headroom_requests:limiting_rank",
                        "eval_time": "30m",
                        "exp_samples": [
                            {
                                "labels": _selector("fleet:kvwatch_kv_headroom_requests:limiting_rank", rank),
                                "value": 33,
                            }
                        ],
                    },
                ],
                "alert_rule_test": [{"eval_time": "60m", "alertname": name} for name in sorted(config.FOR)],
            }
        ],
    }
    assert any("kvwatch_kv_pool_gap_ratio" in s["series"] for s in series)
    test_file = tmp_path / "exposition_test.yaml"
    test_file.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    result = _promtool(promtool, "test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


# --- Alertmanager: the shipped configuration and its inhibitions ----------------------------------

ALERTMANAGER_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"


def test_amtool_check_config(amtool: str) -> None:
    result = _promtool(amtool, "check-config", str(ALERTMANAGER_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        ("alertname=KVEngineStartupFailed severity=critical namespace=serving pod=p", "kvwatch-page"),
        ("alertname=KVCacheNearlyFull severity=warning namespace=serving pod=p", "kvwatch-queue"),
        ("alertname=KVPredictionUnavailable severity=info", "kvwatch-null"),
    ],
)
def test_amtool_routes_each_severity_to_its_receiver(amtool: str, labels: str, receiver: str) -> None:
    result = _promtool(
        amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER_CONFIG}", f"--verify.receivers={receiver}",
        *labels.split(),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_inhibits_the_alerts_one_cause_explains(
    alertmanager_server: str, tmp_path: Path
) -> None:
    """A live Alertmanager loaded with the shipped file: alerts posted for one rank below its siblings
    and one pod whose engine failed to start leave one notifying alert per cause; the same alerts on
    another pod are untouched."""
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        cluster_port = int(s.getsockname()[1])
    base = f"http://127.0.0.1:{port}"
    with (tmp_path / "am.stderr").open("wb") as err:
        proc = subprocess.Popen(
            [alertmanager_server, f"--config.file={ALERTMANAGER_CONFIG}",
             f"--storage.path={tmp_path / 'am'}", f"--web.listen-address=127.0.0.1:{port}",
             f"--cluster.listen-address=127.0.0.1:{cluster_port}"],
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        rank = {"namespace": "serving", "instance": "10.0.0.1:9477", "source": "a", "dp_rank": "1"}
        other = {**rank, "instance": "10.0.0.2:9477", "source": "b"}
        failed = {"namespace": "serving", "instance": "10.0.0.3:9477", "source": "c", "dp_rank": "0"}
        posted = [
            ({**rank, "alertname": "KVRankBelowSiblings", "severity": "warning"}, "active"),
            ({**rank, "alertname": "KVPoolBelowSiblingReplicas", "severity": "warning"}, "suppressed"),
            ({**rank, "alertname": "KVPoolDriftsFromPrediction", "severity": "warning", "basis": "config"}, "suppressed"),
            ({**other, "alertname": "KVPoolDriftsFromPrediction", "severity": "warning", "basis": "config"}, "active"),
            ({**failed, "alertname": "KVEngineStartupFailed", "severity": "critical", "reason": "x"}, "active"),
            ({**failed, "alertname": "KVPoolShrankSinceLastStart", "severity": "warning"}, "suppressed"),
            ({**failed, "alertname": "KVPredictionUnavailable", "severity": "info", "state": "x"}, "suppressed"),
        ]  # fmt: skip
        body = json.dumps([{"labels": labels} for labels, _ in posted]).encode()
        deadline = time.monotonic() + 30
        while True:
            try:
                request = urllib.request.Request(
                    f"{base}/api/v2/alerts", data=body, headers={"Content-Type": "application/json"}
                )
                urllib.request.urlopen(request, timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        expected = {labels["alertname"] + "@" + labels["source"]: state for labels, state in posted}
        seen: dict[str, str] = {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{base}/api/v2/alerts", timeout=5) as resp:
                alerts = json.loads(resp.read())
            seen = {
                a["labels"]["alertname"] + "@" + a["labels"]["source"]: a["status"]["state"] for a in alerts
            }
            if seen == expected:
                break
            time.sleep(0.2)
        assert seen == expected
    finally:
        stop(proc)


# --- Issue 21: a quiet fleet over simulated hours, then one fault each -----------------------------
#
# Three sidecars are simulated on one clock that starts at promtool's time 0: the real pipeline,
# state and collector read real lines (two vLLM 0.19 H100 starts with a real stats line every 10 s,
# the demo's SGLang start with its decode lines), and each sidecar's exposition is taken once a minute
# as Prometheus would scrape it. The shipped rules then run over those series with their shipped
# `for:`, TTL (60 s) and windows.

_SIM_STEP = 10  # seconds between the engines' stats lines
_ACCESS = '(APIServer pid=4801) INFO:     10.0.0.9:40312 - "POST /v1/completions HTTP/1.1" 200 OK'


class _SimPod:
    """One sidecar on the simulated clock: its pipeline, the lines it reads, its exposition."""

    def __init__(self, name: str, address: str, startup: list[str], stats: list[str], model: Path,
                 gpu_memory: int | None, clock: list[float]) -> None:  # fmt: skip
        from kvwatch.analysis.predictor import Predictor
        from kvwatch.export.collector import KvwatchCollector, SourceStatus
        from kvwatch.sources.pipeline import LinePipeline
        from kvwatch.state.fleet import Fleet

        self.name, self.stats, self.sent = name, stats, 0
        self.target = {"job": "kvwatch", "instance": address, "namespace": "serving", "pod": name}
        fleet = Fleet(clock=lambda: clock[0])
        self.pipeline = pipe = LinePipeline(name, fleet)

        def status() -> list[SourceStatus]:
            return [SourceStatus(name, "log", True, pipe.lines_read, pipe.lines_matched, pipe.parse_errors)]

        predictor = Predictor(model_config=lambda source: model, gpu_memory_bytes=gpu_memory)
        self.collector = KvwatchCollector(fleet.snapshot, predictor, status)
        self.feed(startup)

    def feed(self, lines: list[str]) -> None:
        for line in lines:
            self.pipeline.feed(line)

    def tick(self) -> None:
        """One stats interval: the next stats line (an access line when the stats are gone)."""
        self.feed([self.stats[self.sent % len(self.stats)]] if self.stats else [_ACCESS])
        self.sent += 1

    def scrape(self) -> dict[str, float]:
        from prometheus_client.parser import text_string_to_metric_families

        out = {_selector("up", self.target): 1.0}
        for family in text_string_to_metric_families(self.collector.render().decode()):
            for sample in family.samples:
                if sample.name.startswith("kvwatch_") and not sample.name.endswith("_created"):
                    out[_selector(sample.name, {**sample.labels, **self.target})] = float(sample.value)
        return out


def _sim_pods(clock: list[float]) -> dict[str, _SimPod]:
    from kvwatch.core.units import MiB
    from kvwatch.sidecar.demo import _demo_files, _sections

    h100 = (
        (ROOT / "deploy" / "compose" / "replay" / "vllm-llama31-8b-h100-startup.log").read_text().splitlines()
    )
    llama = ROOT / "tests" / "model_configs" / "meta-llama--Meta-Llama-3.1-8B.json"
    data = _demo_files()
    sglang = _sections((data / "sglang.log").read_text(encoding="utf-8").split("\n"))
    stats = [_STATS_LINE.rstrip("\n")]
    return {
        "vllm-1": _SimPod("vllm-1", "10.0.0.1:9477", h100, stats, llama, 81559 * MiB, clock),
        "vllm-2": _SimPod("vllm-2", "10.0.0.2:9477", h100, stats, llama, 81559 * MiB, clock),
        # No --gpu: SGLang prints no card memory; its engine_budget basis still predicts.
        "sglang-3": _SimPod("sglang-3", "10.0.0.3:9477", sglang[0][2], sglang[1][2],
                            data / "models" / "deepseek-ai--DeepSeek-V3.2.json", None, clock),
    }  # fmt: skip


def _values(points: list[float | None]) -> str:
    """promtool's series notation, runs of one value folded ('5x3' is four 5s, '_' a missing one)."""
    out: list[str] = []
    i = 0
    while i < len(points):
        j = i
        while j + 1 < len(points) and points[j + 1] == points[i]:
            j += 1
        value = "_" if points[i] is None else repr(points[i])
        out.append(value if j == i else f"{value}x{j - i}")
        i = j + 1
    return " ".join(out)


def _simulate(minutes: int, faults: dict[int, Callable[[dict[str, _SimPod]], None]]) -> list[dict[str, str]]:
    """Every series the three sidecars export, once a minute for ``minutes``; ``faults`` run at
    their minute, before that minute's lines."""
    clock = [0.0]
    pods = _sim_pods(clock)
    scrapes: list[dict[str, float]] = []
    for minute in range(minutes + 1):
        if minute in faults:
            faults[minute](pods)
        if minute:
            for _ in range(60 // _SIM_STEP):
                clock[0] += _SIM_STEP
                for pod in pods.values():
                    pod.tick()
        scrapes.append({k: v for pod in pods.values() for k, v in pod.scrape().items()})
    keys = sorted({k for scrape in scrapes for k in scrape})
    return [{"series": k, "values": _values([s.get(k) for s in scrapes])} for k in keys]


def _run_sim(promtool: str, tmp_path: Path, series: list[dict[str, str]], test: dict[str, object]) -> None:
    document = {
        "rule_files": [str(p) for p in RULE_FILES],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, **test}],
    }
    path = tmp_path / "simulated_test.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    result = _promtool(promtool, "test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_healthy_fleet_raises_no_alert_in_six_simulated_hours(promtool: str, tmp_path: Path) -> None:
    """Six hours is far past every shipped `for:` (30m at most), the fact TTL and every window
    but the shrink alert's day: no alert is ever pending or firing, at any evaluation."""
    from kvwatch.mixin import config

    hours = 6
    series = _simulate(hours * 60, {})
    # The sidecars export what a healthy fleet has: pools, usage, a prediction per basis, stale flags at 0.
    assert any(s["series"].startswith("kvwatch_source_facts_stale{") for s in series)
    assert not any("pool_tokens" in s["series"] and "facts_stale" in s["series"] for s in series)
    checks = [
        {"eval_time": f"{h}h", "alertname": name} for h in range(1, hours + 1) for name in sorted(config.FOR)
    ]
    _run_sim(promtool, tmp_path, series, {
        "alert_rule_test": checks,
        # ALERTS holds every pending and firing alert the rules produced: none, ever.
        "promql_expr_test": [{"expr": f"count_over_time(ALERTS[{hours}h])", "eval_time": f"{hours}h", "exp_samples": []}],
    })  # fmt: skip


def test_one_fault_per_pod_raises_exactly_its_alert(promtool: str, tmp_path: Path) -> None:
    """After an hour of quiet, at once: vllm-1's stats lines stop while requests keep its log
    growing, vllm-2's load fills its KV cache to 97 % (the same real stats line at that usage), and
    sglang-3 restarts with a third less pool (the demo's labelled fault). Each pod fires its one alert
    and no other alert is ever pending or firing before the faults, or firing after them."""

    def faults(pods: dict[str, _SimPod]) -> None:
        from kvwatch.sidecar.demo import _demo_files, _sections

        pods["vllm-1"].stats = []
        pods["vllm-2"].stats = [_STATS_LINE.rstrip("\n").replace("usage: 42.5%", "usage: 97.0%")]
        restart = _sections((_demo_files() / "sglang.log").read_text(encoding="utf-8").split("\n"))
        pods["sglang-3"].feed(restart[2][2])
        pods["sglang-3"].stats, pods["sglang-3"].sent = restart[3][2], 0

    series = _simulate(120, {60: faults})
    expected = [
        ("KVCacheNearlyFull", "vllm-2"),
        ("KVPoolShrankSinceLastStart", "sglang-3"),
        ("KVWatchStale", "vllm-1"),
    ]
    firing = 'count by (alertname, pod) (ALERTS{alertstate="firing"})'
    ever = 'count by (alertname, pod) (count_over_time(ALERTS{alertstate="firing"}[2h]))'
    _run_sim(promtool, tmp_path, series, {"promql_expr_test": [
        {"expr": "count_over_time(ALERTS[59m])", "eval_time": "59m", "exp_samples": []},
        {"expr": firing, "eval_time": "80m", "exp_samples": [
            {"labels": _selector("", {"alertname": a, "pod": p}), "value": 1} for a, p in expected]},
        # Every alert that fired at any evaluation of the two hours: one series each, the three.
        {"expr": ever, "eval_time": "120m", "exp_samples": [
            {"labels": _selector("", {"alertname": a, "pod": p}), "value": 1} for a, p in expected]},
    ]})  # fmt: skip
