"""Recording and alerting rules, rendered to the YAML Prometheus loads and to a PrometheusRule.

Every series name comes from ``kvwatch.export.names`` (``Metric.sample_name``), every threshold and
duration from ``kvwatch.mixin.config``. Output is deterministic (fixed order, no timestamps) so
the committed files can be checked by regenerating them. Needs only PyYAML.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kvwatch.core.jsontypes import JsonObject, JsonValue
from kvwatch.core.labels import Severity
from kvwatch.export import names
from kvwatch.mixin import config
from kvwatch.state.fleet import STALE_FACTS

RULES_FILE = "kvwatch.rules.yaml"
ALERTS_FILE = "kvwatch.alerts.yaml"
RULES_GROUP = "kvwatch.rules"
ALERTS_GROUP = "kvwatch.alerts"

# Series names, from the single metric-name module.
POOL = names.KV_POOL_TOKENS.sample_name
PREDICTED = names.KV_POOL_PREDICTED_TOKENS.sample_name
GAP = names.KV_POOL_GAP_RATIO.sample_name
GAP_ERROR = names.KV_POOL_PREDICTION_ERROR_RATIO.sample_name
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
STALE = names.FACTS_STALE.sample_name
LINES_READ = names.LINES_READ.sample_name
MEMORY = names.MEMORY_BYTES.sample_name
ENGINE_INFO = names.ENGINE_INFO.sample_name


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
# The card of each rank (GPU memory the engine logged, in GiB, as a label) and the pool of each rank
# with that label, so sibling comparisons stay within one model and one card type.
RANK_CARD = f"rank:{MEMORY}:gpu_card"
RANK_POOL_BY_CARD = f"rank:{POOL}:by_card"
SIBLING_POOL_MEDIAN = f"siblings:{POOL}:median"
SIBLING_RANKS = f"siblings:{POOL}:count"


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
    severity: Severity
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


def named(metric: str) -> str:
    """The series of ranks whose engine named its model: only those belong to a fleet."""
    return f'{metric}{{{config.MODEL}!=""}}'


def recording_rules() -> list[Record]:
    """Fleet aggregates by (cluster, namespace, model_name, engine_kind), the limiting rank of each
    fleet, and the per-card sibling median."""
    fleet = by(config.FLEET_LABELS)
    rank = on(config.RANK_LABELS)
    gib = 2**30
    return [
        Record(FLEET_POOL, f"sum {fleet} ({named(POOL)})"),
        Record(FLEET_RANKS, f"count {fleet} ({named(POOL)})"),
        Record(FLEET_USED, f"sum {fleet} ({named(USED)})"),
        Record(FLEET_USAGE, f"sum {fleet} ({named(USED)})\n/\n(sum {fleet} ({named(POOL)}) > 0)"),
        Record(FLEET_HEADROOM_TOKENS, f"sum {fleet} ({named(HEADROOM_TOKENS)})"),
        Record(FLEET_HEADROOM_REQUESTS, f"sum {fleet} ({named(HEADROOM_REQUESTS)})"),
        Record(
            FLEET_CONCURRENCY,
            f'sum {fleet} ({CONCURRENCY}{{{config.MODEL}!="", basis="observed"}})',
        ),
        Record(FLEET_RUNNING, f"sum {fleet} ({named(RUNNING)})"),
        Record(FLEET_WAITING, f"sum {fleet} ({named(WAITING)})"),
        Record(FLEET_PREEMPTIONS, f"sum {fleet} (rate({named(PREEMPTIONS)}[5m]))"),
        # The limiting rank: a fleet can take only as many long requests as its fullest rank allows
        # before that rank preempts, whatever the sum says.
        Record(LIMITING_HEADROOM_REQUESTS, f"min {fleet} ({named(HEADROOM_REQUESTS)})"),
        Record(LIMITING_HEADROOM_TOKENS, f"min {fleet} ({named(HEADROOM_TOKENS)})"),
        Record(LIMITING_RANK, f"bottomk {fleet} (1, {named(HEADROOM_REQUESTS)})"),
        Record(REPLICA_POOL_MAX, f"max {by(config.REPLICA_LABELS)} ({named(POOL)})"),
        # The card type as a label: the total GPU memory the engine logged, rounded to GiB.
        Record(
            RANK_CARD,
            f'count_values without (term, basis) ("{config.CARD_LABEL}",\n'
            f'  round({MEMORY}{{basis="observed", term="total"}} / {gib})\n)',
        ),
        Record(
            RANK_POOL_BY_CARD,
            f"{named(POOL)}\n* {rank} group_left({config.CARD_LABEL})\n{RANK_CARD}\nor {rank}\n{named(POOL)}",
        ),
        Record(SIBLING_POOL_MEDIAN, f"quantile {by(config.SIBLING_LABELS)} (0.5, {RANK_POOL_BY_CARD})"),
        Record(SIBLING_RANKS, f"count {by(config.SIBLING_LABELS)} ({RANK_POOL_BY_CARD})"),
    ]


def _label(name: str) -> str:
    return "{{ $labels." + name + " }}"


def _lookup(metric: str, labels: tuple[str, ...], fmt: str = "%.0f", close: str = "") -> str:
    """A template that queries one more value for the alert's own series (shown in the description);
    ``metric`` may open a function call that ``close`` ends after the selector."""
    matchers = ",".join(f"{label}=%q" for label in labels)
    args = " ".join(f"$labels.{label}" for label in labels)
    query = f'printf "{metric}{{{matchers}}}{close}" {args}'
    return (
        "{{ with " + query + ' | query }}{{ . | first | value | printf "' + fmt + '" }}{{ else }}?{{ end }}'
    )


def _label_lookup(query: str, labels: tuple[str, ...], label: str, missing: str) -> str:
    """A template that reads one label of the first series a query returns (`missing` when none)."""
    args = " ".join(f"$labels.{name}" for name in labels)
    return (
        "{{ with printf "
        + f'"{query}" {args}'
        + " | query }}{{ . | first | label "
        + f'"{label}"'
        + " }}{{ else }}"
        + missing
        + "{{ end }}"
    )


# Who is in trouble, for every summary and description: the pod (namespace/pod from the target
# labels; the kvwatch target address where Prometheus attaches no pod) and the model it serves.
POD = "{{ if $labels.pod }}{{ $labels.namespace }}/{{ $labels.pod }}{{ else }}{{ $labels.instance }}{{ end }}"
MODEL_NAME = "{{ with $labels." + config.MODEL + " }}{{ . }}{{ else }}(model not named){{ end }}"


def _model_of(labels: tuple[str, ...]) -> str:
    """The model an alert without a model_name label is about, looked up from kvwatch's engine info
    (over the last day, so a target that is down still names the model it served)."""
    matchers = ",".join(f"{label}=%q" for label in labels)
    query = f"last_over_time({ENGINE_INFO}{{{matchers}}}[1d])"
    return _label_lookup(query, labels, config.MODEL, "(model unknown)")


# Where an instance-level alert happened, for summaries and descriptions.
_WHO = f"{POD} ({MODEL_NAME})"
_WHERE = (
    f"{POD} (model {MODEL_NAME}, {_label(config.ENGINE_KIND)} rank {_label('dp_rank')}, "
    f"source {_label('source')}" + "{{ if $labels.pod }}, kvwatch at {{ $labels.instance }}{{ end }})"
)
_SERIES = config.RANK_LABELS


def _gap_expr() -> str:
    """Outside the tolerance of its basis: a multiple of the prediction's own expected error where
    kvwatch exports one (never under the floor), else the fixed GAP_RATIO."""
    parts = []
    for basis, limit in config.GAP_RATIO.items():
        sel = f'{GAP}{{basis="{basis}"}}'
        fixed = f"({sel} > {limit:g} or {sel} < -{limit:g})"
        floor = config.GAP_RATIO_FLOOR.get(basis)
        if floor is None:
            parts.append(fixed)
            continue
        err = f'{GAP_ERROR}{{basis="{basis}"}}'
        tol = f"clamp_min({config.GAP_ERROR_MULTIPLE:g} * {err}, {floor:g})"
        parts.append(f"({sel} > {tol} or {sel} < -{tol})")
        parts.append(f"({fixed} unless {err})")
    return "\nor\n".join(parts)


# The stale flags the alert reads: periodic facts only (kvwatch/state/facts.py), so that the flag a
# startup fact carried in older kvwatch releases (fact="pool_tokens") cannot page during an upgrade.
WATCHED = f'fact=~"{"|".join(STALE_FACTS)}"'


def _stale_expr() -> str:
    """A source whose periodic facts froze: /metrics answers but one vanished from it (or nothing at
    all is recognised any more), or the log keeps growing without the stats lines it carried."""
    target = on(config.TARGET_LABELS)

    def stale(origin: str) -> str:
        return f'max without (fact) ({STALE}{{origin="{origin}", {WATCHED}}})'

    return (
        f"({stale('metrics')} == 1\nunless {target} ({SOURCE_UP} == 0))\n"
        f"or\n({stale('log')} == 1\n"
        f"and {target} (increase({LINES_READ}[{config.LOG_GROWTH_WINDOW}]) > 0))\n"
        f'or\n(time() - {LAST_UPDATE}{{origin="metrics"}} > {config.STALE_SECONDS}\n'
        f"unless {target} ({SOURCE_UP} == 0))"
    )


def alerts() -> list[Alert]:
    """Every alert, in the order of docs/runbook.md."""
    replica = config.REPLICA_LABELS
    siblings = config.SIBLING_LABELS
    gap_limits = ", ".join(
        (
            f"for basis {basis} {config.GAP_ERROR_MULTIPLE:g} x the prediction's expected error, at least "
            f"±{config.GAP_RATIO_FLOOR[basis]:.0%} (±{limit:.0%} without one)"
        )
        if basis in config.GAP_RATIO_FLOOR
        else f"±{limit:.0%} for basis {basis}"
        for basis, limit in config.GAP_RATIO.items()
    )
    failure_window = config.STARTUP_FAILURE_WINDOW
    return [
        Alert(
            "KVPoolDriftsFromPrediction",
            _gap_expr(),
            "warning",
            f"KV pool of {_WHO} differs from kvwatch's prediction.",
            f"The KV pool of {_WHERE} is {{{{ $value | humanizePercentage }}}} off the "
            f"{_label('basis')} prediction: observed {_lookup(POOL, _SERIES)} tokens, predicted "
            + _lookup(PREDICTED, (*_SERIES, "basis"))
            + f" tokens (tolerance {gap_limits}).",
        ),
        Alert(
            "KVCacheNearlyFull",
            f"{USAGE} > {config.USAGE_RATIO_FULL:g}",
            "warning",
            f"KV cache of {_WHO} is nearly full.",
            f"{_WHERE} has used {{{{ $value | humanizePercentage }}}} of its KV pool "
            f"({_lookup(POOL, _SERIES)} tokens) for {config.FOR['KVCacheNearlyFull']}; "
            f"{_lookup(WAITING, _SERIES)} requests are waiting.",
        ),
        Alert(
            "KVHeadroomBelowOneRequest",
            f"{HEADROOM_REQUESTS} < {config.HEADROOM_REQUESTS_MIN:g}",
            "warning",
            f"{_WHO} cannot fit one more max-length request in its KV cache.",
            f"The free KV pool of {_WHERE} holds {{{{ $value }}}} requests of "
            f"max_model_len ({_lookup(HEADROOM_TOKENS, _SERIES)} free tokens); a long request now "
            "waits or preempts another.",
        ),
        Alert(
            "KVPreemptionsRising",
            f"rate({PREEMPTIONS}[{config.PREEMPTION_WINDOW}]) > {config.PREEMPTION_RATE:g}",
            "warning",
            f"{_WHO} is evicting requests from its KV cache.",
            f'{_WHERE} preempts (vLLM) or retracts (SGLang) {{{{ $value | printf "%.3g" }}}} requests per '
            f"second over {config.PREEMPTION_WINDOW}; evicted requests are recomputed, which costs "
            "latency and throughput.",
        ),
        Alert(
            "KVEngineStartupFailed",
            f"increase({STARTUP_FAILURES}[{failure_window}]) > 0\n"
            f"or\n({STARTUP_FAILURES} > 0 unless {STARTUP_FAILURES} offset {failure_window})",
            "critical",
            f"{_WHO} failed to start: not enough memory for the KV cache.",
            f"The engine of {_WHERE} failed to start in the last {failure_window} for lack of KV-cache "
            f"memory (reason {_label('reason')}; failed starts counted so far: "
            f"{_lookup(STARTUP_FAILURES, (*_SERIES, 'reason'))}); it is not serving.",
        ),
        Alert(
            "KVPoolShrankSinceLastStart",
            f"{POOL}\n/\n(max_over_time({POOL}[{config.SHRINK_LOOKBACK}]) > 0)\n< {1 - config.SHRINK_RATIO:g}",
            "warning",
            f"KV pool of {_WHO} came back smaller after a restart.",
            f"The KV pool of {_WHERE} is {{{{ $value | humanizePercentage }}}} of the largest pool the "
            f"same engine had in the last {config.SHRINK_LOOKBACK} (now {_lookup(POOL, _SERIES)} tokens).",
        ),
        Alert(
            "KVPoolBelowSiblingReplicas",
            f"{RANK_POOL_BY_CARD}\n/ {on(siblings)} group_left()\n({SIBLING_POOL_MEDIAN} > 0)\n"
            f"< {1 - config.SIBLING_RATIO:g}",
            "warning",
            f"KV pool of {_WHO} is smaller than its sibling replicas'.",
            f"The KV pool of {_WHERE} is {{{{ $value | humanizePercentage }}}} of the median pool of "
            f"the ranks serving the same model on the same card ({_label(config.CARD_LABEL)} GiB) in "
            f"namespace {_label('namespace')}.",
        ),
        Alert(
            "KVRankBelowSiblings",
            # The largest rank inline, not the recorded replica max: that lags one evaluation, so a
            # restart to another pool size would compare the new pool with the old one.
            f"{named(POOL)}\n/ {on(replica)} group_left()\n(max {by(replica)} ({named(POOL)}) > 0)\n"
            f"< {1 - config.SIBLING_RATIO:g}",
            "warning",
            f"A rank of {_WHO} has a much smaller KV pool than the others.",
            f"Rank {_label('dp_rank')} of {_WHERE} has "
            f"{{{{ $value | humanizePercentage }}}} of the KV pool of the largest rank of the same engine; "
            "the fleet's headroom is bounded by this rank.",
        ),
        Alert(
            "KVWatchSourceDown",
            f"{SOURCE_UP} == 0",
            "warning",
            f"kvwatch cannot read {_label('source')} of {POD} ({_model_of(config.TARGET_LABELS)}).",
            f"kvwatch in {POD} could not read source {_label('source')} (log file "
            f"or /metrics URL) of the engine serving {_model_of(config.TARGET_LABELS)} for "
            f"{config.FOR['KVWatchSourceDown']}; its KV metrics are stale or absent.",
        ),
        Alert(
            "KVWatchStale",
            _stale_expr(),
            "warning",
            f"kvwatch's usage facts from {_label('origin')} of {_WHO} froze.",
            f"{_WHERE}: the periodic facts kvwatch takes from the engine's {_label('origin')} (KV usage, "
            "running and waiting requests) stopped arriving although the source is still read (a series "
            "vanished from /metrics, e.g. renamed, or the log grows without its stats lines); kvwatch no "
            "longer exports them, so usage, headroom and the fleet sums leave this rank out (facts stale: "
            + _lookup(f"count({STALE}", (*_SERIES, "origin"), close=" == 1) or vector(0)")
            + "; last fact of any kind from it "
            + _lookup(f"time() - {LAST_UPDATE}", (*_SERIES, "origin"))
            + " s ago).",
        ),
        Alert(
            "KVWatchTargetDown",
            f"up{{{config.KVWATCH_JOB}}} == 0",
            "warning",
            f"Prometheus cannot scrape kvwatch in {POD} ({_model_of(('job', 'instance'))}).",
            f"Scrapes of kvwatch at {_label('instance')} (job {_label('job')}, pod {POD}) failed for "
            f"{config.FOR['KVWatchTargetDown']}; nothing is known about the KV cache of the engine "
            f"serving {_model_of(('job', 'instance'))} and its KV alerts cannot fire.",
        ),
        Alert(
            "KVWatchAbsent",
            f"absent(up{{{config.KVWATCH_JOB}}})",
            "warning",
            "No kvwatch target is scraped by Prometheus (model: none known).",
            f"Prometheus has no target in a job matching {config.KVWATCH_JOB} for "
            f"{config.FOR['KVWatchAbsent']} (value {{{{ $value }}}}): the sidecars, the PodMonitor or the "
            "scrape config are gone, so no KV alert can fire for any pod or model_name.",
        ),
        Alert(
            "KVWatchParseErrors",
            f"increase({PARSE_ERRORS}[{config.PARSE_ERROR_WINDOW}]) > 0",
            "info",
            f"kvwatch skips log lines of {_label('source')} in {POD} ({_model_of(config.TARGET_LABELS)}).",
            f'kvwatch in {POD} skipped {{{{ $value | printf "%.0f" }}}} lines of '
            f"{_label('source')} (model {_model_of(config.TARGET_LABELS)}) in {config.PARSE_ERROR_WINDOW} "
            "that matched a pattern but did not convert; the engine's log format may have changed.",
        ),
        Alert(
            "KVPredictionUnavailable",
            # Only where no basis predicts: an SGLang log prints no card memory, so without --gpu the
            # state is no_gpu_memory, yet the engine_budget basis still predicts and is checked.
            f'({PREDICTION}{{state!="ok"}}\nunless {on(_SERIES)} {PREDICTED})\n== 1',
            "info",
            f"kvwatch cannot predict the KV pool of {_WHO}.",
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
