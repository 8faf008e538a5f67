"""Recording and alerting rules, rendered to the YAML Prometheus loads and to a PrometheusRule.

Every series name comes from ``kvwatch.names`` (``Metric.sample_name``), every threshold and
duration from ``kvwatch.mixin.config``. Output is deterministic (fixed order, no timestamps) so
the committed files can be checked by regenerating them. Needs only PyYAML.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kvwatch import names
from kvwatch.jsontypes import JsonObject, JsonValue
from kvwatch.mixin import config

RULES_FILE = "kvwatch.rules.yaml"
ALERTS_FILE = "kvwatch.alerts.yaml"
RULES_GROUP = "kvwatch.rules"
ALERTS_GROUP = "kvwatch.alerts"

# Series names, from the single metric-name module.
POOL = names.KV_POOL_TOKENS.sample_name
PREDICTED = names.KV_POOL_PREDICTED_TOKENS.sample_name
GAP = names.KV_POOL_GAP_RATIO.sample_name
USAGE = names.KV_USAGE_RATIO.sample_name
USED = names.KV_USED_TOKENS.sample_name
HEADROOM_TOKENS = names.KV_HEADROOM_TOKENS.sample_name
HEADROOM_REQUESTS = names.KV_HEADROOM_REQUESTS.sample_name
CONCURRENCY = names.MAX_CONCURRENCY.sample_name
RUNNING = names.REQUESTS_RUNNING.sample_name
WAITING = names.REQUESTS_WAITING.sample_name
PREEMPTIONS = names.PREEMPTIONS.sample_name
STARTUP_FAILURES = names.STARTUP_FAILURES.sample_name
SOURCE_UP = names.SOURCE_UP.sample_name
LAST_UPDATE = names.LAST_UPDATE.sample_name
PARSE_ERRORS = names.PARSE_ERRORS.sample_name
PREDICTION = names.PREDICTION_AVAILABLE.sample_name


def by(labels: tuple[str, ...]) -> str:
    """``by (a, b)`` for an aggregation."""
    return f"by ({', '.join(labels)})"


def on(labels: tuple[str, ...]) -> str:
    """``on (a, b)`` for vector matching."""
    return f"on ({', '.join(labels)})"


def fleet_record(metric: str, aggregation: str) -> str:
    """Recording-rule name for a fleet aggregate, ``fleet:<metric>:<aggregation>`` (level:metric:ops)."""
    return f"fleet:{metric}:{aggregation}"


# Recorded series other modules (dashboards, alerts) read.
FLEET_POOL = fleet_record(POOL, "sum")
FLEET_POOL_MEDIAN = fleet_record(POOL, "median")
FLEET_USED = fleet_record(USED, "sum")
FLEET_USAGE = fleet_record(USAGE, "ratio")
FLEET_HEADROOM_TOKENS = fleet_record(HEADROOM_TOKENS, "sum")
FLEET_HEADROOM_REQUESTS = fleet_record(HEADROOM_REQUESTS, "sum")
FLEET_CONCURRENCY = fleet_record(CONCURRENCY, "sum")
FLEET_RUNNING = fleet_record(RUNNING, "sum")
FLEET_WAITING = fleet_record(WAITING, "sum")
FLEET_PREEMPTIONS = fleet_record(names.PREEMPTIONS.name, "rate5m")
FLEET_RANKS = fleet_record(POOL, "count")
LIMITING_HEADROOM_REQUESTS = fleet_record(HEADROOM_REQUESTS, "min")
LIMITING_HEADROOM_TOKENS = fleet_record(HEADROOM_TOKENS, "min")
LIMITING_RANK = fleet_record(HEADROOM_REQUESTS, "limiting_rank")
REPLICA_POOL_MAX = f"replica:{POOL}:max"


@dataclass(frozen=True)
class Record:
    """One recording rule."""

    record: str
    expr: str

    def as_dict(self) -> JsonObject:
        return {"record": self.record, "expr": self.expr}


@dataclass(frozen=True)
class Alert:
    """One alerting rule; `for` comes from config.FOR, runbook_url is added when rendered."""

    alert: str
    expr: str
    severity: str
    summary: str
    description: str

    def as_dict(self, runbook_url: str) -> JsonObject:
        return {
            "alert": self.alert,
            "expr": self.expr,
            "for": config.FOR[self.alert],
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": f"{runbook_url}#{self.alert.lower()}",
            },
        }


def recording_rules() -> list[Record]:
    """Fleet aggregates by (cluster, namespace, model, engine) and the limiting rank of each fleet."""
    fleet = by(config.FLEET_LABELS)
    return [
        Record(FLEET_POOL, f"sum {fleet} ({POOL})"),
        Record(FLEET_RANKS, f"count {fleet} ({POOL})"),
        Record(FLEET_POOL_MEDIAN, f"quantile {fleet} (0.5, {POOL})"),
        Record(FLEET_USED, f"sum {fleet} ({USED})"),
        Record(FLEET_USAGE, f"sum {fleet} ({USED})\n/\n(sum {fleet} ({POOL}) > 0)"),
        Record(FLEET_HEADROOM_TOKENS, f"sum {fleet} ({HEADROOM_TOKENS})"),
        Record(FLEET_HEADROOM_REQUESTS, f"sum {fleet} ({HEADROOM_REQUESTS})"),
        Record(FLEET_CONCURRENCY, f'sum {fleet} ({CONCURRENCY}{{basis="observed"}})'),
        Record(FLEET_RUNNING, f"sum {fleet} ({RUNNING})"),
        Record(FLEET_WAITING, f"sum {fleet} ({WAITING})"),
        Record(FLEET_PREEMPTIONS, f"sum {fleet} (rate({PREEMPTIONS}[5m]))"),
        # The limiting rank: a fleet can take only as many long requests as its fullest rank allows
        # before that rank preempts, whatever the sum says.
        Record(LIMITING_HEADROOM_REQUESTS, f"min {fleet} ({HEADROOM_REQUESTS})"),
        Record(LIMITING_HEADROOM_TOKENS, f"min {fleet} ({HEADROOM_TOKENS})"),
        Record(LIMITING_RANK, f"bottomk {fleet} (1, {HEADROOM_REQUESTS})"),
        Record(REPLICA_POOL_MAX, f"max {by(config.REPLICA_LABELS)} ({POOL})"),
    ]


def _label(name: str) -> str:
    return "{{ $labels." + name + " }}"


def _lookup(metric: str, labels: tuple[str, ...], fmt: str = "%.0f") -> str:
    """A template that queries one more value for the alert's own series (shown in the description)."""
    matchers = ",".join(f"{label}=%q" for label in labels)
    args = " ".join(f"$labels.{label}" for label in labels)
    query = f'printf "{metric}{{{matchers}}}" {args}'
    return (
        "{{ with " + query + ' | query }}{{ . | first | value | printf "' + fmt + '" }}{{ else }}?{{ end }}'
    )


# Where an instance-level alert happened, for summaries and descriptions.
_WHERE = (
    f"{_label('source')} rank {_label('dp_rank')} ({_label('engine')}, model {_label('model')}) "
    f"on {_label('instance')}"
)
_SERIES = ("job", "instance", "source", "dp_rank")


def _gap_expr() -> str:
    parts = []
    for basis, limit in config.GAP_RATIO.items():
        sel = f'{GAP}{{basis="{basis}"}}'
        parts.append(f"({sel} > {limit:g} or {sel} < -{limit:g})")
    return "\nor\n".join(parts)


def alerts() -> list[Alert]:
    """Every alert, in the order of docs/runbook.md."""
    fleet = config.FLEET_LABELS
    replica = config.REPLICA_LABELS
    gap_limits = ", ".join(f"±{limit:.0%} for basis {basis}" for basis, limit in config.GAP_RATIO.items())
    failure_window = config.STARTUP_FAILURE_WINDOW
    return [
        Alert(
            "KVPoolDriftsFromPrediction",
            _gap_expr(),
            "warning",
            f"KV pool of {_label('source')} differs from kvwatch's prediction.",
            f"The KV pool of {_WHERE} is {{{{ $value | humanizePercentage }}}} off the "
            f"{_label('basis')} prediction: observed {_lookup(POOL, _SERIES)} tokens, predicted "
            + _lookup(PREDICTED, (*_SERIES, "basis"))
            + f" tokens (tolerance {gap_limits}).",
        ),
        Alert(
            "KVCacheNearlyFull",
            f"{USAGE} > {config.USAGE_RATIO_FULL:g}",
            "warning",
            f"KV cache of {_label('source')} is nearly full.",
            f"{_WHERE} has used {{{{ $value | humanizePercentage }}}} of its KV pool "
            f"({_lookup(POOL, _SERIES)} tokens) for {config.FOR['KVCacheNearlyFull']}; "
            f"{_lookup(WAITING, _SERIES)} requests are waiting.",
        ),
        Alert(
            "KVHeadroomBelowOneRequest",
            f"{HEADROOM_REQUESTS} < {config.HEADROOM_REQUESTS_MIN:g}",
            "warning",
            f"{_label('source')} cannot fit one more max-length request in its KV cache.",
            f"The free KV pool of {_WHERE} holds {{{{ $value }}}} requests of "
            f"max_model_len ({_lookup(HEADROOM_TOKENS, _SERIES)} free tokens); a long request now "
            "waits or preempts another.",
        ),
        Alert(
            "KVPreemptionsRising",
            f"rate({PREEMPTIONS}[{config.PREEMPTION_WINDOW}]) > {config.PREEMPTION_RATE:g}",
            "warning",
            f"{_label('source')} is evicting requests from its KV cache.",
            f'{_WHERE} preempts (vLLM) or retracts (SGLang) {{{{ $value | printf "%.3g" }}}} requests per '
            f"second over {config.PREEMPTION_WINDOW}; evicted requests are recomputed, which costs "
            "latency and throughput.",
        ),
        Alert(
            "KVEngineStartupFailed",
            f"increase({STARTUP_FAILURES}[{failure_window}]) > 0\n"
            f"or\n({STARTUP_FAILURES} > 0 unless {STARTUP_FAILURES} offset {failure_window})",
            "critical",
            f"{_label('source')} failed to start: not enough memory for the KV cache.",
            f"The engine of {_WHERE} failed to start in the last {failure_window} for lack of KV-cache "
            f"memory (reason {_label('reason')}; failed starts counted so far: "
            f"{_lookup(STARTUP_FAILURES, (*_SERIES, 'reason'))}); it is not serving.",
        ),
        Alert(
            "KVPoolShrankSinceLastStart",
            f"{POOL}\n/\n(max_over_time({POOL}[{config.SHRINK_LOOKBACK}]) > 0)\n< {1 - config.SHRINK_RATIO:g}",
            "warning",
            f"KV pool of {_label('source')} came back smaller after a restart.",
            f"The KV pool of {_WHERE} is {{{{ $value | humanizePercentage }}}} of the largest pool the "
            f"same engine had in the last {config.SHRINK_LOOKBACK} (now {_lookup(POOL, _SERIES)} tokens).",
        ),
        Alert(
            "KVPoolBelowSiblingReplicas",
            f"{POOL}\n/ {on(fleet)} group_left()\n({FLEET_POOL_MEDIAN} > 0)\n< {1 - config.SIBLING_RATIO:g}",
            "warning",
            f"KV pool of {_label('source')} is smaller than its sibling replicas'.",
            f"The KV pool of {_WHERE} is {{{{ $value | humanizePercentage }}}} of the median pool of "
            f"the replicas serving {_label('model')} in namespace {_label('namespace')}.",
        ),
        Alert(
            "KVRankBelowSiblings",
            f"{POOL}\n/ {on(replica)} group_left()\n({REPLICA_POOL_MAX} > 0)\n< {1 - config.SIBLING_RATIO:g}",
            "warning",
            f"A rank of {_label('source')} has a much smaller KV pool than the others.",
            f"Rank {_label('dp_rank')} of {_label('source')} on {_label('instance')} has "
            f"{{{{ $value | humanizePercentage }}}} of the KV pool of the largest rank of the same engine; "
            "the fleet's headroom is bounded by this rank.",
        ),
        Alert(
            "KVWatchSourceDown",
            f"{SOURCE_UP} == 0",
            "warning",
            f"kvwatch cannot read {_label('source')}.",
            f"kvwatch on {_label('instance')} could not read source {_label('source')} (log file or "
            f"/metrics URL) for {config.FOR['KVWatchSourceDown']}; its KV metrics are frozen or absent.",
        ),
        Alert(
            "KVWatchStale",
            f'time() - {LAST_UPDATE}{{origin="metrics"}} > {config.STALE_SECONDS}\n'
            f"unless {on(config.TARGET_LABELS)}\n({SOURCE_UP} == 0)",
            "warning",
            f"kvwatch has learnt nothing from {_label('source')} /metrics for a while.",
            f"The last fact kvwatch took from the /metrics of {_WHERE} is {{{{ $value | humanizeDuration }}}} "
            "old although the endpoint answers: the engine's metric names may have changed.",
        ),
        Alert(
            "KVWatchParseErrors",
            f"increase({PARSE_ERRORS}[{config.PARSE_ERROR_WINDOW}]) > 0",
            "info",
            f"kvwatch skips log lines of {_label('source')} it cannot convert.",
            f'kvwatch on {_label("instance")} skipped {{{{ $value | printf "%.0f" }}}} lines of '
            f"{_label('source')} in {config.PARSE_ERROR_WINDOW} that matched a pattern but did not convert; "
            "the engine's log format may have changed.",
        ),
        Alert(
            "KVPredictionUnavailable",
            f'{PREDICTION}{{state!="ok"}} == 1',
            "info",
            f"kvwatch cannot predict the KV pool of {_label('source')}.",
            f"kvwatch has no prediction for {_WHERE}: {_label('state')}. Gap and drift alerts cannot "
            "fire for it.",
        ),
    ]


def _rules_group() -> JsonObject:
    return {"name": RULES_GROUP, "rules": [r.as_dict() for r in recording_rules()]}


def _alerts_group(runbook_url: str) -> JsonObject:
    return {"name": ALERTS_GROUP, "rules": [a.as_dict(runbook_url) for a in alerts()]}


def rules_document() -> JsonObject:
    """The recording rules file as a Prometheus rule-file document."""
    return {"groups": [_rules_group()]}


def alerts_document(runbook_url: str = config.RUNBOOK_URL) -> JsonObject:
    """The alerting rules file as a Prometheus rule-file document."""
    return {"groups": [_alerts_group(runbook_url)]}


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line PromQL as literal blocks, list items indented like kubectl output."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(document: Any) -> str:
    """Deterministic YAML: insertion order kept, long lines not folded."""
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=10_000, allow_unicode=True)


HEADER = "# Generated by `kvwatch rules` from kvwatch/mixin; edit the code, not this file.\n"


def prometheus_rule(runbook_url: str = config.RUNBOOK_URL) -> JsonObject:
    """A prometheus-operator PrometheusRule carrying exactly the groups of both rule files."""
    groups: list[JsonValue] = [_rules_group(), _alerts_group(runbook_url)]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "kvwatch",
            "labels": {"app.kubernetes.io/name": "kvwatch", "app.kubernetes.io/component": "monitoring"},
        },
        "spec": {"groups": groups},
    }


def write(
    out_dir: Path, prometheus_rule_path: Path | None = None, runbook_url: str = config.RUNBOOK_URL
) -> list[Path]:
    """Write both rule files (and the PrometheusRule when asked); return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    outputs = {
        out_dir / RULES_FILE: rules_document(),
        out_dir / ALERTS_FILE: alerts_document(runbook_url),
    }
    if prometheus_rule_path is not None:
        prometheus_rule_path.parent.mkdir(parents=True, exist_ok=True)
        outputs[prometheus_rule_path] = prometheus_rule(runbook_url)
    for path, document in outputs.items():
        path.write_text(HEADER + to_yaml(document), encoding="utf-8")
    return list(outputs)
