"""The monitoring mixin and deployment files: generated files are fresh, every PromQL name is one
kvwatch exports, dashboards load back into grafana-foundation-sdk, alerts link to the runbook, and
the Kubernetes, compose and Docker files parse and point at things that exist.

PromQL is parsed with promql-parser (the Rust parser's Python binding), never grepped.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from kvwatch import __version__
from kvwatch.core.labels import SEVERITIES
from kvwatch.export import names
from kvwatch.mixin import config, dashboards, panels, rules
from kvwatch.sidecar.config import DEFAULT_PORT

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "dashboards"
RULES = ROOT / "rules"
K8S = ROOT / "deploy" / "kubernetes"
COMPOSE = ROOT / "deploy" / "compose"
RUNBOOK = ROOT / "docs" / "runbook.md"
PROMETHEUS_RULE = K8S / "kvwatch-prometheusrule.yaml"
DASHBOARDS_CONFIGMAP = K8S / "kvwatch-dashboards.yaml"

# Labels Prometheus or prometheus-operator attach to every scraped series (target labels).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint", "service", "cluster"}
# Series kvwatch does not export that rules and dashboards may read: Prometheus' own `up`, and the
# engines' own series (the PodMonitor scrapes vLLM's /metrics; the dashboard's engine row reads it).
EXTERNAL_NAMES = {"up"}
EXTERNAL_PREFIXES = ("vllm:", "sglang:")
# Stand-ins for Grafana's built-in interval variables, so dashboard queries parse as PromQL.
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _yaml(path: Path) -> Any:
    return yaml.safe_load(_read(path))


def _yaml_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(_read(path)) if doc is not None]


# --- Generated files are fresh --------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(dashboards.DASHBOARDS))
def test_dashboards_regenerate_byte_identical(name: str) -> None:
    expected = dashboards.rendered()[name]
    assert expected == _read(DASHBOARDS / name), f"run `kvwatch dashboards` and commit {name}"


def test_dashboards_render_twice_to_the_same_bytes() -> None:
    assert dashboards.rendered() == dashboards.rendered()


def test_dashboard_configmap_is_fresh_and_carries_the_committed_json() -> None:
    assert dashboards.configmap(dashboards.rendered()) == _read(DASHBOARDS_CONFIGMAP)
    (doc,) = _yaml_all(DASHBOARDS_CONFIGMAP)
    assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert doc["data"] == {p.name: _read(p) for p in sorted(DASHBOARDS.glob("*.json"))}


def test_rules_regenerate_byte_identical() -> None:
    assert rules.HEADER + rules.to_yaml(rules.rules_document()) == _read(RULES / rules.RULES_FILE)
    assert rules.HEADER + rules.to_yaml(rules.alerts_document()) == _read(RULES / rules.ALERTS_FILE)
    assert rules.HEADER + rules.to_yaml(rules.prometheus_rule()) == _read(PROMETHEUS_RULE)


def test_prometheus_rule_groups_equal_the_rule_files() -> None:
    (doc,) = _yaml_all(PROMETHEUS_RULE)
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert doc["kind"] == "PrometheusRule"
    groups = [g for f in sorted(RULES.glob("*.yaml")) for g in _yaml(f)["groups"]]
    assert sorted(doc["spec"]["groups"], key=lambda g: g["name"]) == sorted(groups, key=lambda g: g["name"])


def test_cli_writes_the_same_files(tmp_path: Path) -> None:
    from kvwatch.cli import main

    assert main(["dashboards", "--out", str(tmp_path / "d"), "--configmap", str(tmp_path / "cm.yaml")]) == 0
    assert main(["rules", "--out", str(tmp_path / "r"), "--prometheus-rule", str(tmp_path / "pr.yaml")]) == 0
    for name in dashboards.DASHBOARDS:
        assert _read(tmp_path / "d" / name) == _read(DASHBOARDS / name)
    assert _read(tmp_path / "cm.yaml") == _read(DASHBOARDS_CONFIGMAP)
    for name in (rules.RULES_FILE, rules.ALERTS_FILE):
        assert _read(tmp_path / "r" / name) == _read(RULES / name)
    assert _read(tmp_path / "pr.yaml") == _read(PROMETHEUS_RULE)


def test_cli_runbook_url_changes_only_the_links(tmp_path: Path) -> None:
    from kvwatch.cli import main

    assert main(["rules", "--out", str(tmp_path), "--runbook-url", "https://wiki.example.org/kv"]) == 0
    doc = _yaml(tmp_path / rules.ALERTS_FILE)
    urls = [r["annotations"]["runbook_url"] for r in doc["groups"][0]["rules"]]
    assert urls == [f"https://wiki.example.org/kv#{a.alert.lower()}" for a in rules.alerts()]


def test_cli_rejects_a_runbook_url_that_is_not_a_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvwatch.cli import main

    assert main(["rules", "--out", str(tmp_path), "--runbook-url", "docs/runbook.md"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--runbook-url" in err
    assert not list(tmp_path.iterdir())


def test_cli_dashboards_without_the_sdk_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import kvwatch.mixin
    from kvwatch.cli import main

    for module in [m for m in sys.modules if m.split(".")[0] == "grafana_foundation_sdk"]:
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, "grafana_foundation_sdk", None)
    monkeypatch.delitem(sys.modules, "kvwatch.mixin.dashboards")
    monkeypatch.delattr(kvwatch.mixin, "dashboards")
    assert main(["dashboards", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'kvwatch[dashboards]'" in err
    assert not list(tmp_path.iterdir())


# --- Dashboards load back into the SDK and are complete --------------------------------------------


@pytest.mark.parametrize("name", sorted(dashboards.DASHBOARDS))
def test_dashboard_json_loads_back_into_the_sdk_models(name: str) -> None:
    text = _read(DASHBOARDS / name)
    board = dashboards.load(text)
    assert json.loads(JSONEncoder(sort_keys=True, indent=2).encode(board)) == json.loads(text)


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


@pytest.mark.parametrize(
    ("name", "variables"),
    [
        ("kvwatch-kv-cache.json", ["datasource", "job", "namespace", "pod", "source", "model"]),
        ("kvwatch-kv-fleet.json", ["datasource", "cluster", "namespace", "model"]),
    ],
)
def test_dashboard_variables_units_ids_and_datasource(name: str, variables: list[str]) -> None:
    board = json.loads(_read(DASHBOARDS / name))
    assert [v["name"] for v in board["templating"]["list"]] == variables
    assert board["uid"] in (panels.KV_CACHE_UID, panels.KV_FLEET_UID)
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in _panels(board):
        assert panel["fieldConfig"]["defaults"].get("unit"), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        assert panel["description"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"


@pytest.mark.parametrize("name", sorted(dashboards.DASHBOARDS))
def test_dashboard_grid_has_no_overlaps_and_fits_24_columns(name: str) -> None:
    board = json.loads(_read(DASHBOARDS / name))
    taken: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


@pytest.mark.parametrize("name", sorted(dashboards.DASHBOARDS))
def test_dashboard_rates_follow_the_scrape_interval(name: str) -> None:
    """Panel rates use $__rate_interval (Grafana picks a window of at least four scrapes)."""
    board = json.loads(_read(DASHBOARDS / name))
    for panel in _panels(board):
        for target in panel["targets"]:
            for window in re.findall(r"(?:rate|increase)\([^\[]*\[([^\]]+)\]", target["expr"]):
                assert window == "$__rate_interval", f"{panel['title']}: {target['expr']}"


def test_kv_cache_dashboard_covers_the_issue_panels() -> None:
    board = json.loads(_read(DASHBOARDS / "kvwatch-kv-cache.json"))
    exprs = " ".join(t["expr"] for p in _panels(board) for t in p["targets"])
    for metric in (
        names.KV_POOL_TOKENS,
        names.KV_POOL_PREDICTED_TOKENS,
        names.KV_POOL_GAP_RATIO,
        names.KV_USAGE_RATIO,
        names.KV_HEADROOM_TOKENS,
        names.KV_HEADROOM_REQUESTS,
        names.MAX_CONCURRENCY,
        names.PREEMPTIONS,
        names.REQUESTS_RUNNING,
        names.REQUESTS_WAITING,
        names.MEMORY_BYTES,
        names.ENGINE_INFO,
    ):
        assert metric.sample_name in exprs, metric.sample_name
    annotations = " ".join(a["expr"] for a in board["annotations"]["list"])
    assert names.RESTARTS.sample_name in annotations
    assert names.STARTUP_FAILURES.sample_name in annotations
    units = {p["fieldConfig"]["defaults"]["unit"] for p in _panels(board)}
    assert {panels.BYTES, panels.TOKENS, panels.PERCENT, panels.OPS} <= units
    stacked = [
        p
        for p in _panels(board)
        if p["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode") == "normal"
    ]
    assert any(names.MEMORY_BYTES.sample_name in t["expr"] for p in stacked for t in p["targets"])


def test_kv_fleet_dashboard_reads_the_recorded_aggregates() -> None:
    board = json.loads(_read(DASHBOARDS / "kvwatch-kv-fleet.json"))
    exprs = " ".join(t["expr"] for p in _panels(board) for t in p["targets"])
    for record in (
        rules.FLEET_POOL,
        rules.FLEET_HEADROOM_TOKENS,
        rules.LIMITING_RANK,
        rules.LIMITING_HEADROOM_REQUESTS,
        rules.SIBLING_POOL_MEDIAN,
        rules.RANK_POOL_BY_CARD,
    ):
        assert record in exprs, record
    titles = {p["title"] for p in _panels(board)}
    assert {"Ranks drifting from prediction", "Ranks whose pool shrank", "Limiting rank per model"} <= titles


# --- Every PromQL name is one kvwatch exports --------------------------------------------------------


def _selectors(expr: str) -> Iterator[promql_parser.VectorSelector]:
    """Every vector selector in a PromQL expression (plain and inside range selectors)."""
    found: list[promql_parser.VectorSelector] = []

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    yield from found


def _name(selector: promql_parser.VectorSelector) -> str:
    if selector.name:
        return str(selector.name)
    for m in selector.matchers.matchers:
        if m.name == "__name__":
            return str(m.value)
    raise AssertionError(f"selector without a metric name: {selector}")


def _grafana_to_promql(expr: str) -> str:
    for variable, value in GRAFANA_INTERVALS.items():
        expr = expr.replace(variable, value)
    return expr


_LABEL_VALUES = re.compile(r"^label_values\((?P<metric>.+),\s*(?P<label>\w+)\)$")
_TEMPLATE_QUERY = re.compile(r'\{\{ with printf "(?P<query>[^"]*)"[^|}]*\| query \}\}')


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every query in the dashboards: targets, annotations, variables."""
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(_read(path))
        for panel in _panels(board):
            for target in panel["targets"]:
                yield f"{path.name}: {panel['title']}", _grafana_to_promql(target["expr"])
        for annotation in board["annotations"]["list"]:
            yield f"{path.name}: annotation {annotation['name']}", _grafana_to_promql(annotation["expr"])
        for variable in board["templating"]["list"]:
            if variable["type"] == "query":
                m = _LABEL_VALUES.match(variable["query"])
                assert m, variable["query"]
                yield f"{path.name}: variable {variable['name']}", m["metric"]


def rule_queries() -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every rule expression and every query inside an alert's templates."""
    for path in sorted(RULES.glob("*.yaml")):
        for group in _yaml(path)["groups"]:
            for rule in group["rules"]:
                where = f"{path.name}: {rule.get('alert') or rule.get('record')}"
                yield where, rule["expr"]
                for text in rule.get("annotations", {}).values():
                    for m in _TEMPLATE_QUERY.finditer(text):
                        yield f"{where} (annotation)", m["query"].replace("%q", '"x"')


def recorded_names() -> set[str]:
    return {
        r["record"] for g in _yaml(RULES / rules.RULES_FILE)["groups"] for r in g["rules"] if "record" in r
    }


ALL_QUERIES = list(dashboard_queries()) + list(rule_queries())


@pytest.mark.parametrize(("where", "expr"), ALL_QUERIES, ids=[w for w, _ in ALL_QUERIES])
def test_every_metric_name_in_dashboards_and_rules_is_exported(where: str, expr: str) -> None:
    exported = set(names.by_sample_name())
    allowed = exported | recorded_names() | EXTERNAL_NAMES
    used = {_name(s) for s in _selectors(expr)}
    assert used, f"{where}: no metric in {expr!r}"
    if ".json:" in where:  # only dashboards read the engines' own series
        used = {u for u in used if not u.startswith(EXTERNAL_PREFIXES)}
    assert used <= allowed, f"{where}: not exported by kvwatch: {sorted(used - allowed)}"


@pytest.mark.parametrize(("where", "expr"), ALL_QUERIES, ids=[w for w, _ in ALL_QUERIES])
def test_matchers_only_use_labels_the_metric_has(where: str, expr: str) -> None:
    by_name = names.by_sample_name()
    for selector in _selectors(expr):
        metric = by_name.get(_name(selector))
        if metric is None:  # a recorded series; its own expression is checked here too
            continue
        labels = {m.name for m in selector.matchers.matchers} - {"__name__"}
        unknown = labels - set(metric.labels) - TARGET_LABELS
        assert not unknown, f"{where}: {metric.sample_name} has no label {sorted(unknown)}"


def test_the_name_check_rejects_an_unknown_metric() -> None:
    used = {_name(s) for s in _selectors('rate(vllm:num_preemptions_total{model_name="x"}[5m]) > 0')}
    assert used == {"vllm:num_preemptions_total"}
    assert not used <= set(names.by_sample_name()) | recorded_names()


# --- Rules ---------------------------------------------------------------------------------------


def _alert_rules() -> list[dict[str, Any]]:
    return [r for g in _yaml(RULES / rules.ALERTS_FILE)["groups"] for r in g["rules"]]


def _runbook_anchors() -> set[str]:
    """GitHub's anchors for the level-2 headings of docs/runbook.md."""
    anchors = set()
    for line in _read(RUNBOOK).splitlines():
        if line.startswith("## "):
            title = line[3:].strip().lower()
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


def test_rule_files_load_with_the_expected_groups() -> None:
    recording = _yaml(RULES / rules.RULES_FILE)["groups"]
    alerting = _yaml(RULES / rules.ALERTS_FILE)["groups"]
    assert [g["name"] for g in recording] == [rules.RULES_GROUP]
    assert [g["name"] for g in alerting] == [rules.ALERTS_GROUP]
    assert all(set(r) == {"record", "expr"} for r in recording[0]["rules"])
    for record in recording[0]["rules"]:
        assert record["record"].count(":") == 2, record["record"]


def test_every_alert_has_for_severity_summary_description_and_a_runbook_anchor() -> None:
    anchors = _runbook_anchors()
    alerts = _alert_rules()
    assert {a["alert"] for a in alerts} == set(config.FOR)
    # Every severity the Literal declares is used, and Alertmanager routes each (test below).
    assert {a["labels"]["severity"] for a in alerts} == set(SEVERITIES)
    for alert in alerts:
        assert alert["for"] == config.FOR[alert["alert"]]
        assert alert["labels"]["severity"] in SEVERITIES
        annotations = alert["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}
        if alert["alert"] != "KVWatchAbsent":  # absent(): no series, so no labels to show
            assert "$labels" in annotations["description"], alert["alert"]
        if not re.search(r"== [01]$", alert["expr"]):  # a 0/1 condition has no value worth showing
            assert "$value" in annotations["description"] or "| query" in annotations["description"]
        url, _, anchor = annotations["runbook_url"].partition("#")
        assert url == config.RUNBOOK_URL and url.endswith("docs/runbook.md")
        assert anchor == alert["alert"].lower() and anchor in anchors, alert["alert"]


def test_every_page_names_the_pod_and_the_model() -> None:
    """Summaries and descriptions say which pod (namespace/pod, else the kvwatch target) and which
    model: from the alert's own model_name label, or looked up from kvwatch_engine_info."""
    for alert in _alert_rules():
        if alert["alert"] == "KVWatchAbsent":  # no target at all: there is no pod or model to name
            continue
        for key in ("summary", "description"):
            text = alert["annotations"][key]
            assert rules.POD in text, (alert["alert"], key)
            assert "$labels.model_name" in text or 'label "model_name"' in text, (alert["alert"], key)


def test_runbook_links_resolve_to_this_repository() -> None:
    """The runbook URL is this repository's docs/runbook.md on GitHub (anchors: the test above)."""
    url = config.RUNBOOK_URL
    assert url.startswith("https://github.com/") and "/blob/main/" in url
    assert (ROOT / url.partition("/blob/main/")[2]).is_file()


def test_alertmanager_config_is_fresh_and_names_only_real_alerts() -> None:
    from kvwatch.mixin import alertmanager

    path = ROOT / "deploy" / "alertmanager" / alertmanager.ALERTMANAGER_FILE
    assert alertmanager.rendered() == _read(path), "run `make generate` and commit it"
    alerts = {a["alert"] for a in _alert_rules()}
    doc = _yaml(path)
    assert doc["inhibit_rules"]
    for rule in doc["inhibit_rules"]:
        for matcher in rule["source_matchers"] + rule["target_matchers"]:
            name, _, value = matcher.partition("=")
            value = value.lstrip("~").strip('"')
            if name == "alertname" and value != "KV.*":
                assert set(value.split("|")) <= alerts, matcher
            if name == "severity":
                assert set(value.split("|")) <= set(SEVERITIES), matcher
        assert {"namespace", "instance"} <= set(rule["equal"])
    severities = {r["matchers"][0] for r in doc["route"]["routes"]}
    assert severities == {f'severity="{s}"' for s in SEVERITIES}
    assert "pod" in doc["route"]["group_by"] and config.MODEL in doc["route"]["group_by"]


def test_sibling_comparisons_stay_within_one_named_model_and_one_card() -> None:
    records = {r.record: r.expr for r in rules.recording_rules()}
    assert config.MODEL in config.FLEET_LABELS and config.CARD_LABEL in config.SIBLING_LABELS
    assert f"by ({', '.join(config.SIBLING_LABELS)})" in records[rules.SIBLING_POOL_MEDIAN]
    (alert,) = [a for a in rules.alerts() if a.alert == "KVPoolBelowSiblingReplicas"]
    assert f"on ({', '.join(config.SIBLING_LABELS)})" in alert.expr
    # Every fleet aggregate leaves out ranks whose engine named no model.
    for record, expr in records.items():
        if record.startswith(("fleet:", "replica:")) or record == rules.RANK_POOL_BY_CARD:
            assert f'{config.MODEL}!=""' in expr, record


def test_gap_panels_show_negative_gaps_and_both_tolerance_bands() -> None:
    limits = sorted(config.GAP_RATIO.values())
    gap = names.KV_POOL_GAP_RATIO.sample_name
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(_read(path))
        gaps = [
            p
            for p in _panels(board)
            if p["type"] == "timeseries" and any(gap in t["expr"] for t in p["targets"])
        ]
        assert gaps, path.name
        for panel in gaps:
            defaults = panel["fieldConfig"]["defaults"]
            assert defaults.get("min") is None, f"{path.name}: {panel['title']} hides negative gaps"
            steps = {s["value"] for s in defaults["thresholds"]["steps"] if s["value"] is not None}
            assert steps == {-limits[1], -limits[0], limits[0], limits[1]}, panel["title"]


def test_kv_cache_pod_variable_comes_from_up_and_the_engine_row_is_there() -> None:
    board = json.loads(_read(DASHBOARDS / "kvwatch-kv-cache.json"))
    variables = {v["name"]: v["query"] for v in board["templating"]["list"] if v["type"] == "query"}
    for name in ("job", "namespace", "pod"):
        assert variables[name].startswith("label_values(up{"), name
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert [r for r in rows if "Engine's own metrics" in r]
    exprs = " ".join(t["expr"] for p in _panels(board) for t in p["targets"])
    for series in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:num_requests_waiting",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:num_queue_reqs",
    ):
        assert series in exprs, series


def test_the_issue_alerts_are_all_there() -> None:
    expected = {
        "KVPoolDriftsFromPrediction",
        "KVCacheNearlyFull",
        "KVHeadroomBelowOneRequest",
        "KVPreemptionsRising",
        "KVEngineStartupFailed",
        "KVPoolShrankSinceLastStart",
        "KVPoolBelowSiblingReplicas",
        "KVRankBelowSiblings",
        "KVWatchSourceDown",
        "KVWatchStale",
        "KVWatchTargetDown",
        "KVWatchAbsent",
    }
    assert expected <= {a["alert"] for a in _alert_rules()}


def test_runbook_names_the_levers_in_every_section_that_acts_on_capacity() -> None:
    text = _read(RUNBOOK)
    for lever in (
        "max-model-len",
        "gpu-memory-utilization",
        "mem-fraction-static",
        "fp8",
        "quantis",
        "tensor",
    ):
        assert lever in text, lever
    sections = re.split(r"^## ", text, flags=re.M)
    for alert in _alert_rules():
        (section,) = [s for s in sections if s.startswith(alert["alert"] + "\n")]
        assert "**Meaning.**" in section and "**Confirm.**" in section and "**Act.**" in section, alert[
            "alert"
        ]
        assert "```promql" in section, alert["alert"]


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    """Checks the promtool test files themselves; tests/test_promtool.py runs them."""
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in sorted((ROOT / "tests" / "rules").glob("*_test.yaml")):
        for case in _yaml(path)["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = {a["alert"] for a in _alert_rules()}
    assert alerts <= firing, f"no firing case: {sorted(alerts - firing)}"
    assert alerts <= quiet, f"no quiet case: {sorted(alerts - quiet)}"


# --- Kubernetes ----------------------------------------------------------------------------------


def _k8s_docs() -> dict[str, dict[str, Any]]:
    kustomization = _yaml(K8S / "kustomization.yaml")
    out: dict[str, dict[str, Any]] = {}
    for resource in kustomization["resources"]:
        path = K8S / resource
        assert path.is_file(), f"kustomization lists {resource}, which does not exist"
        for doc in _yaml_all(path):
            out[doc["kind"]] = doc
    return out


def test_kustomization_lists_every_manifest() -> None:
    listed = set(_yaml(K8S / "kustomization.yaml")["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert {"Deployment", "Service", "PodMonitor", "PrometheusRule", "ConfigMap"} <= set(_k8s_docs())


def _run_parser() -> argparse.ArgumentParser:
    from kvwatch.commands import run

    parser = argparse.ArgumentParser(prog="kvwatch run", exit_on_error=False)
    run.add_arguments(parser)
    return parser


def _kvwatch_container(pod: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = pod.get("initContainers", []) + pod["containers"]
    (container,) = [c for c in containers if c["name"] == "kvwatch"]
    return container


def test_deployment_runs_vllm_with_a_hardened_kvwatch_sidecar() -> None:
    deployment = _k8s_docs()["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert (
        deployment["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    kvwatch = _kvwatch_container(pod)
    # A native sidecar: starts before vLLM and outlives its restarts.
    assert kvwatch in pod["initContainers"] and kvwatch["restartPolicy"] == "Always"
    security = kvwatch["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert kvwatch["args"][0] == "run"
    args = _run_parser().parse_args(kvwatch["args"][1:])
    assert args.listen == f"0.0.0.0:{DEFAULT_PORT}"
    assert [p["containerPort"] for p in kvwatch["ports"]] == [DEFAULT_PORT]
    assert kvwatch["readinessProbe"]["httpGet"]["path"] == "/healthz"

    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in kvwatch["volumeMounts"]}
    assert set(mounts) <= set(volumes)
    (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    vllm_mounts = {m["name"]: m for m in vllm["volumeMounts"]}
    assert set(vllm_mounts) <= set(volumes)

    # The log: vLLM tees its output into the shared emptyDir, kvwatch reads that file.
    (log_arg,) = args.log
    log_path = log_arg.split("=", 1)[1]
    # Identity: the source is named after the pod, from the Downward API.
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in kvwatch["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert log_arg.split("=", 1)[0] == "$(POD_NAME)"
    assert all(arg.split("=", 1)[0] == "$(POD_NAME)" for arg in args.metrics_url)
    log_mount = next(m for m in mounts.values() if log_path.startswith(m["mountPath"] + "/"))
    assert "emptyDir" in volumes[log_mount["name"]]
    # kvwatch frees the read part of the shared file (--release-read), so the volume never fills.
    assert args.release_read is True and not log_mount.get("readOnly")
    assert (
        log_mount["name"] in vllm_mounts
        and vllm_mounts[log_mount["name"]]["mountPath"] == log_mount["mountPath"]
    )
    script = vllm["args"][0]
    assert f"tee -a {log_path}" in script and "pipefail" in script
    # The file is group-writable by kvwatch's group (fsGroup), which releasing it in place needs.
    assert "umask 0002" in script and pod["securityContext"]["fsGroup"] == security.get("runAsGroup")

    # The model: the same volume, read-only in kvwatch, holding the folder vLLM serves.
    (model_config,) = args.model_config
    model_mount = next(m for m in mounts.values() if model_config.startswith(m["mountPath"] + "/"))
    assert model_mount.get("readOnly") is True
    assert vllm_mounts[model_mount["name"]]["mountPath"] == model_mount["mountPath"]
    assert f"vllm serve {model_config} " in script
    # /metrics is scraped over localhost, from the port vLLM listens on.
    (url_arg,) = args.metrics_url
    assert url_arg.split("=", 1)[1] == f"http://localhost:{vllm['ports'][0]['containerPort']}/metrics"
    # State and /tmp are writable volumes, the root filesystem is not.
    assert {m["mountPath"] for m in mounts.values() if not m.get("readOnly")} == {
        args.state_dir,
        "/tmp",
        log_mount["mountPath"],
    }


def test_service_and_podmonitor_select_the_pods_and_the_kvwatch_port() -> None:
    docs = _k8s_docs()
    pod_labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    port_names = {p["name"] for c in pod["initContainers"] + pod["containers"] for p in c.get("ports", [])}
    service = docs["Service"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    monitor = docs["PodMonitor"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    endpoints = {e["port"]: e for e in monitor["spec"]["podMetricsEndpoints"]}
    # kvwatch and the engine's own /metrics, each with its own job (the alerts select job=~"kvwatch.*").
    assert set(endpoints) == {"kvwatch", "http"} and set(endpoints) <= port_names
    jobs = {}
    for port, endpoint in endpoints.items():
        assert endpoint["path"] == "/metrics"
        (relabel,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
        jobs[port] = relabel["replacement"]
    assert re.fullmatch("kvwatch.*", jobs["kvwatch"]) and not re.fullmatch("kvwatch.*", jobs["http"])


# --- Compose -------------------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = _yaml(COMPOSE / "docker-compose.yml")
    return doc


def _bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of a service's bind mounts (relative host paths start with '.')."""
    out = {}
    for volume in service.get("volumes", []):
        host, container = volume.split(":")[:2]
        if host.startswith("."):
            out[container] = (COMPOSE / host).resolve()
    return out


def test_compose_bind_mounts_and_build_context_exist() -> None:
    compose = _compose()
    named = set(compose.get("volumes", {}))
    for override in ("docker-compose.gpu.yml",):
        named |= set(_yaml(COMPOSE / override).get("volumes", {}))
        for name, service in _yaml(COMPOSE / override)["services"].items():
            assert name in compose["services"] or "image" in service
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            if host.startswith("."):
                assert (COMPOSE / host).exists(), f"{name}: {host} does not exist"
            else:
                assert host in named, f"{name}: volume {host} is not declared"
    build = compose["services"]["kvwatch"]["build"]
    assert (COMPOSE / build["context"] / build["dockerfile"]).resolve() == ROOT / "Dockerfile"


def test_compose_kvwatch_runs_read_only_as_non_root_with_valid_flags() -> None:
    service = _compose()["services"]["kvwatch"]
    assert service["read_only"] is True
    assert not service["user"].startswith("0")
    args = _run_parser().parse_args(service["command"][1:])
    assert service["command"][0] == "run"
    mounts = _bind_mounts(service)
    (model_config,) = args.model_config
    assert mounts[model_config] == ROOT / "tests" / "model_configs" / "meta-llama--Meta-Llama-3.1-8B.json"
    assert args.listen.endswith(f":{DEFAULT_PORT}")
    gpu = _yaml(COMPOSE / "docker-compose.gpu.yml")["services"]["kvwatch"]
    gpu_args = _run_parser().parse_args(gpu["command"][1:])
    assert gpu_args.metrics_url == ["vllm=http://vllm:8000/metrics"]


def test_compose_prometheus_loads_the_rules_and_scrapes_kvwatch() -> None:
    service = _compose()["services"]["prometheus"]
    mounts = _bind_mounts(service)
    config_file = mounts["/etc/prometheus/prometheus.yml"]
    prometheus = _yaml(config_file)
    for pattern in prometheus["rule_files"]:
        folder, _, glob = pattern.rpartition("/")
        matched = sorted(p.name for p in mounts[folder].glob(glob))
        assert matched == sorted(p.name for p in RULES.glob("*.yaml"))
    (job,) = prometheus["scrape_configs"]
    assert job["static_configs"][0]["targets"] == [f"kvwatch:{DEFAULT_PORT}"]


def test_compose_grafana_is_provisioned_with_the_datasource_and_dashboards() -> None:
    service = _compose()["services"]["grafana"]
    mounts = _bind_mounts(service)
    provisioning = mounts["/etc/grafana/provisioning"]
    (datasource,) = _yaml(provisioning / "datasources" / "prometheus.yaml")["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    (provider,) = _yaml(provisioning / "dashboards" / "kvwatch.yaml")["providers"]
    folder = mounts[provider["options"]["path"]]
    assert folder == DASHBOARDS
    home = service["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (folder / Path(home).name).is_file()


def test_compose_replayer_startup_log_is_one_kvwatch_understands() -> None:
    service = _compose()["services"]["replayer"]
    mounts = _bind_mounts(service)
    script, startup, _ = service["command"][1:]
    assert (mounts["/replay"] / Path(script).name).is_file()
    from kvwatch.sources.pipeline import replay

    (snapshot,) = replay([str(mounts["/replay"] / Path(startup).name)]).fleet.snapshot()
    assert snapshot.engine == "vllm"
    assert snapshot.pool.tokens == 476_016  # the real 0.19.0 start it replays


# --- Docker ---------------------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", _read(ROOT / "Dockerfile"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.append((instruction.upper(), rest.strip()))
    return out


def test_dockerfile_entrypoint_user_healthcheck_and_base() -> None:
    steps = _dockerfile()
    entrypoints = [json.loads(a) for i, a in steps if i == "ENTRYPOINT"]
    assert entrypoints[-1] == ["kvwatch"]
    users = [a for i, a in steps if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert any(i == "HEALTHCHECK" and "/healthz" in a for i, a in steps)
    bases = [a for i, a in steps if i == "FROM"]
    assert bases and all(b.startswith("python:${PYTHON_VERSION}-slim") for b in bases)
    assert any(i == "EXPOSE" and a == str(DEFAULT_PORT) for i, a in steps)
    cmd = json.loads(next(a for i, a in reversed(steps) if i == "CMD"))
    assert cmd[0] == "run"


def test_dockerfile_copies_only_files_the_dockerignore_lets_through() -> None:
    ignore = [line.strip() for line in _read(ROOT / ".dockerignore").splitlines()]
    allowed = {line[1:] for line in ignore if line.startswith("!")}
    assert "*" in ignore
    for instruction, arguments in _dockerfile():
        if instruction != "COPY" or arguments.startswith("--from"):
            continue
        *sources, _ = shlex.split(arguments)
        for source in sources:
            assert (ROOT / source).exists(), source
            assert source.rstrip("/") in allowed, f"{source} is excluded by .dockerignore"


def test_the_image_entry_point_runs_in_the_venv() -> None:
    """The console script the image's ENTRYPOINT names exists next to this interpreter and runs."""
    script = Path(sys.executable).parent / "kvwatch"
    assert script.is_file()
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"kvwatch {__version__}"
