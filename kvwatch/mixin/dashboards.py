"""Grafana dashboards, built with grafana-foundation-sdk and written as stable JSON.

Two dashboards: "KV cache" (one engine at a time: pool observed against prediction, usage, headroom,
scheduler pressure, memory budget, engine settings, kvwatch's own health) and "KV fleet" (every
model across pods: totals, the limiting rank, ranks that drift or shrink). Metric names come from
``kvwatch.names``, fleet series from the recording rules in ``kvwatch.mixin.rules``. The output is
sorted-key JSON with fixed uids and panel ids, so regenerating gives identical bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prom_model

from kvwatch import names
from kvwatch.mixin import config, rules

# Units (Grafana unit ids). Token and request counts are shown exactly, with their unit spelled out.
BYTES = "bytes"
TOKENS = "suffix: tokens"
REQUESTS = "suffix: requests"
PERCENT = "percentunit"
OPS = "ops"
SECONDS = "s"
COUNT = "short"
DATE = "dateTimeFromNow"

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")

KV_CACHE_UID = "kvwatch-kv-cache"
KV_FLEET_UID = "kvwatch-kv-fleet"

# Per-instance selector of the "KV cache" dashboard; self-metrics carry only `source`, not `model`.
_INSTANCE = f'job=~"$job", namespace=~"$namespace", pod=~"$pod", source=~"$source", {config.MODEL}=~"$model"'
_SOURCE = 'job=~"$job", namespace=~"$namespace", pod=~"$pod", source=~"$source"'
_TARGET = 'job=~"$job", namespace=~"$namespace", pod=~"$pod"'
# The engine's own series: scraped by their own job (the PodMonitor's `http` endpoint), so not $job.
_ENGINE = f'namespace=~"$namespace", pod=~"$pod", {config.MODEL}=~"$model"'
_FLEET = f'cluster=~"$cluster", namespace=~"$namespace", {config.MODEL}=~"$model"'
_RANK_LEGEND = "{{source}} r{{dp_rank}} {{pod}}"
_FLEET_LEGEND = "{{model_name}} ({{engine_kind}}) {{namespace}}"


def sel(metric: names.Metric | str, matchers: str, extra: str = "") -> str:
    """``metric{matchers, extra}`` for a names.py metric (its PromQL series name) or a recorded series."""
    name = metric.sample_name if isinstance(metric, names.Metric) else metric
    inner = f"{matchers}, {extra}" if extra else matchers
    return f"{name}{{{inner}}}"


class _Ids:
    """Hands out panel ids in build order, so ids are stable across runs."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self) -> int:
        self._next += 1
        return self._next


def _query(expr: str, legend: str, ref: str = "A", instant: bool = False) -> prom.Dataquery:
    q = prom.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    if instant:
        q = q.instant().format(prom_model.PromQueryFormat.TABLE)
    return q


def _targets(panel: Any, queries: Sequence[tuple[str, str]], instant: bool = False) -> Any:
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, ref=chr(ord("A") + i), instant=instant))
    return panel


def _steps(*steps: tuple[float | None, str]) -> dash.ThresholdsConfig:
    return (
        dash.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


_GREEN_ONLY = _steps((None, "green"))


def timeseries_panel(
    ids: _Ids,
    title: str,
    description: str,
    unit: str,
    queries: Sequence[tuple[str, str]],
    width: int = 12,
    height: int = 8,
    thresholds: dash.ThresholdsConfig | None = None,
    stacked: bool = False,
    bars: bool = False,
    signed: bool = False,
) -> timeseries.Panel:
    """A time series with a table legend (mean, max, last) and the unit set."""
    panel = (
        timeseries.Panel()
        .id(ids())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "max", "lastNotNull"])
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
        .fill_opacity(10)
        .thresholds(thresholds or _GREEN_ONLY)
    )
    if thresholds is not None:
        panel = panel.thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.DASHED)
        )
    if stacked:
        panel = panel.stacking(
            common_builders.StackingConfig().mode(common.StackingMode.NORMAL)
        ).fill_opacity(60)
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS).fill_opacity(80)
    if unit == PERCENT and not signed:
        panel = panel.min(0)
    result: timeseries.Panel = _targets(panel, queries)
    return result


def gap_thresholds() -> dash.ThresholdsConfig:
    """Both tolerance bands of the drift alert (config ±10 %, engine_budget ±2 %), below and above 0:
    green inside the tight band, orange inside the loose one, red outside both."""
    tight, loose = sorted(config.GAP_RATIO.values())
    return _steps((None, "red"), (-loose, "orange"), (-tight, "green"), (tight, "orange"), (loose, "red"))


def stat_panel(
    ids: _Ids,
    title: str,
    description: str,
    unit: str,
    queries: Sequence[tuple[str, str]],
    thresholds: dash.ThresholdsConfig | None = None,
    width: int = 4,
    decimals: float | None = None,
) -> stat.Panel:
    """A single-value panel showing the last value of each series."""
    panel = (
        stat.Panel()
        .id(ids())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(4)
        .thresholds(thresholds or _GREEN_ONLY)
        .color_mode(common.BigValueColorMode.VALUE)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .no_value("no data")
    )
    if decimals is not None:
        panel = panel.decimals(decimals)
    result: stat.Panel = _targets(panel, queries)
    return result


def table_panel(
    ids: _Ids,
    title: str,
    description: str,
    unit: str,
    queries: Sequence[tuple[str, str]],
    hide: Sequence[str] = ("Time", "__name__"),
    width: int = 12,
    height: int = 8,
) -> table.Panel:
    """An instant-query table: one row per series, labels as columns, `Value` in the given unit."""
    panel = (
        table.Panel()
        .id(ids())
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .no_value("none")
        .show_header(True)
        .with_transformation(
            model.DataTransformerConfig(
                id_val="organize", options={"excludeByName": {name: True for name in hide}}
            )
        )
    )
    result: table.Panel = _targets(panel, queries, instant=True)
    return result


def _variable(name: str, label: str, query: str) -> dash.QueryVariable:
    """A multi-select label_values variable whose 'All' matches series that lack the label, too."""
    return (
        dash.QueryVariable(name)
        .id(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(model.VariableOption(text="All", value="$__all"))
    )


def _datasource_variable() -> dash.DatasourceVariable:
    return dash.DatasourceVariable("datasource").id("datasource").label("Data source").type("prometheus")


def _base(title: str, uid: str, description: str) -> dash.Dashboard:
    return (
        dash.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(list(config.DASHBOARD_TAGS))
        .refresh(config.DASHBOARD_REFRESH)
        .time(config.DASHBOARD_TIME_FROM, "now")
        .timezone(common.TimeZoneBrowser)
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .editable()
        .link(
            dash.DashboardLink("kvwatch dashboards")
            .type(model.DashboardLinkType.DASHBOARDS)
            .tags([config.DASHBOARD_TAGS[0]])
            .as_dropdown(True)
            .include_vars(False)
            .keep_time(True)
        )
    )


def _with_panels(board: dash.Dashboard, panels: Sequence[cogbuilder.Builder[model.Panel]]) -> dash.Dashboard:
    for panel in panels:
        board = board.with_panel(panel)
    return board


def _annotation(name: str, expr: str, color: str) -> dash.AnnotationQuery:
    return dash.AnnotationQuery().name(name).datasource(DATASOURCE).enable(True).icon_color(color).expr(expr)


def kv_cache() -> dash.Dashboard:
    """The per-engine dashboard."""
    ids = _Ids()
    i = _INSTANCE
    src = _SOURCE
    gap_steps = gap_thresholds()
    usage_steps = _steps((None, "green"), (0.9, "orange"), (0.98, "red"))
    headroom_steps = _steps((None, "red"), (config.HEADROOM_REQUESTS_MIN, "green"))
    budget_terms = "weights|activation|non_torch|cuda_graphs|kv"

    board = (
        _base(
            "kvwatch / KV cache",
            KV_CACHE_UID,
            "KV-cache pool of one vLLM or SGLang engine: observed against kvwatch's prediction, usage, "
            "headroom, scheduler pressure and the GPU memory budget behind the pool.",
        )
        .with_variable(_datasource_variable())
        # Job, namespace and pod come from `up`, which every target has, so a pod whose kvwatch is
        # down (and exports nothing) can still be picked; source from kvwatch_source_up, which
        # kvwatch exports for every configured source, readable or not.
        .with_variable(_variable("job", "Job", f"label_values(up{{{config.KVWATCH_JOB}}}, job)"))
        .with_variable(_variable("namespace", "Namespace", 'label_values(up{job=~"$job"}, namespace)'))
        .with_variable(_variable("pod", "Pod", 'label_values(up{job=~"$job", namespace=~"$namespace"}, pod)'))
        .with_variable(
            _variable(
                "source",
                "Source",
                f"label_values({sel(names.SOURCE_UP, _TARGET)}, source)",
            )
        )
        .with_variable(
            _variable(
                "model",
                "Model",
                f"label_values({sel(names.ENGINE_INFO, _SOURCE)}, {config.MODEL})",
            )
        )
        .annotation(_annotation("Engine restarts", f"increase({sel(names.RESTARTS, i)}[2m]) > 0", "orange"))
        .annotation(
            _annotation(
                "Startup failures (KV memory)", f"increase({sel(names.STARTUP_FAILURES, i)}[2m]) > 0", "red"
            )
        )
    )

    board = board.with_row(dash.Row("Now").id(ids()))
    board = _with_panels(
        board,
        [
            stat_panel(
                ids,
                "KV pool",
                "Pool size in tokens, as the engine reported it.",
                TOKENS,
                [(sel(names.KV_POOL_TOKENS, i), _RANK_LEGEND)],
                decimals=0,
            ),
            stat_panel(
                ids,
                "Gap to prediction",
                "Observed / predicted pool - 1 (config basis). Red beyond the drift alert's tolerance.",
                PERCENT,
                [(sel(names.KV_POOL_GAP_RATIO, i, 'basis="config"'), _RANK_LEGEND)],
                thresholds=gap_steps,
                decimals=1,
            ),
            stat_panel(
                ids,
                "KV usage",
                "Fraction of the pool in use.",
                PERCENT,
                [(sel(names.KV_USAGE_RATIO, i), _RANK_LEGEND)],
                thresholds=usage_steps,
                decimals=1,
            ),
            stat_panel(
                ids,
                "Headroom",
                "Requests of max_model_len the free pool still holds.",
                REQUESTS,
                [(sel(names.KV_HEADROOM_REQUESTS, i), _RANK_LEGEND)],
                thresholds=headroom_steps,
                decimals=2,
            ),
            stat_panel(
                ids,
                "Max concurrency",
                "Requests of max_model_len the whole pool holds (the engine's own figure).",
                REQUESTS,
                [(sel(names.MAX_CONCURRENCY, i, 'basis="observed"'), _RANK_LEGEND)],
                decimals=2,
            ),
            stat_panel(
                ids,
                "Engine started",
                "When kvwatch saw the current engine start.",
                DATE,
                [(f"{sel(names.EPOCH_START, i)} * 1000", _RANK_LEGEND)],
            ),
        ],
    )

    board = board.with_row(dash.Row("Pool: observed against predicted").id(ids()))
    board = _with_panels(
        board,
        [
            timeseries_panel(
                ids,
                "Pool size (tokens)",
                "The pool the engine allocated against kvwatch's predictions: `config` from config.json alone, "
                "`engine_budget` from the memory terms the engine logged.",
                TOKENS,
                [
                    (sel(names.KV_POOL_TOKENS, i), "observed " + _RANK_LEGEND),
                    (sel(names.KV_POOL_PREDICTED_TOKENS, i), "predicted ({{basis}}) " + _RANK_LEGEND),
                ],
            ),
            timeseries_panel(
                ids,
                "Gap to prediction",
                "Observed / predicted - 1, per basis; negative: a smaller pool than predicted. Dashed lines: "
                "the drift alert's tolerances, ±2 % (engine_budget) and ±10 % (config).",
                PERCENT,
                [(sel(names.KV_POOL_GAP_RATIO, i), "{{basis}} " + _RANK_LEGEND)],
                thresholds=gap_steps,
                signed=True,
            ),
            timeseries_panel(
                ids,
                "Pool size per rank (bytes)",
                "KV-cache bytes on one rank, observed and predicted.",
                BYTES,
                [
                    (sel(names.KV_POOL_BYTES, i), "observed " + _RANK_LEGEND),
                    (sel(names.KV_POOL_PREDICTED_BYTES, i), "predicted ({{basis}}) " + _RANK_LEGEND),
                ],
            ),
            timeseries_panel(
                ids,
                "Max concurrency",
                "Requests of max_model_len the whole pool holds: the engine's figure and kvwatch's per basis.",
                REQUESTS,
                [(sel(names.MAX_CONCURRENCY, i), "{{basis}} " + _RANK_LEGEND)],
            ),
        ],
    )

    board = board.with_row(dash.Row("Usage and headroom").id(ids()))
    board = _with_panels(
        board,
        [
            timeseries_panel(
                ids,
                "KV usage",
                "Fraction of the pool in use (vLLM counts whole blocks).",
                PERCENT,
                [(sel(names.KV_USAGE_RATIO, i), _RANK_LEGEND)],
                thresholds=usage_steps,
            ).max(1),
            timeseries_panel(
                ids,
                "Tokens used and free",
                "Tokens held in the pool and free tokens (headroom).",
                TOKENS,
                [
                    (sel(names.KV_USED_TOKENS, i), "used " + _RANK_LEGEND),
                    (sel(names.KV_HEADROOM_TOKENS, i), "free " + _RANK_LEGEND),
                ],
            ),
            timeseries_panel(
                ids,
                "Headroom in requests",
                "Requests of max_model_len the free pool holds. Below the dashed line a long request waits "
                "or preempts another.",
                REQUESTS,
                [(sel(names.KV_HEADROOM_REQUESTS, i), _RANK_LEGEND)],
                thresholds=headroom_steps,
            ).min(0),
            timeseries_panel(
                ids,
                "Prefix cache hit rate",
                "Prefix-cache hit rate the engine reported; shared prefixes are shared KV blocks.",
                PERCENT,
                [(sel(names.PREFIX_CACHE_HIT_RATIO, i), _RANK_LEGEND)],
            ).max(1),
        ],
    )

    board = board.with_row(dash.Row("Scheduler").id(ids()))
    board = _with_panels(
        board,
        [
            timeseries_panel(
                ids,
                "Running and waiting requests",
                "Requests the engine runs and requests queued for KV space or a batch slot.",
                COUNT,
                [
                    (sel(names.REQUESTS_RUNNING, i), "running " + _RANK_LEGEND),
                    (sel(names.REQUESTS_WAITING, i), "waiting " + _RANK_LEGEND),
                ],
            ),
            timeseries_panel(
                ids,
                "Preemptions and retractions",
                "Requests evicted from the KV cache per second (vLLM preemptions, SGLang retractions).",
                OPS,
                [(f"rate({sel(names.PREEMPTIONS, i)}[$__rate_interval])", _RANK_LEGEND)],
                bars=True,
            ),
        ],
    )

    board = board.with_row(dash.Row("GPU memory budget").id(ids()))
    board = _with_panels(
        board,
        [
            timeseries_panel(
                ids,
                "Memory budget by term (observed)",
                "Where one rank's GPU memory went, stacked: weights, activation peak, non-torch, CUDA graphs "
                "and the KV pool, as the engine logged them.",
                BYTES,
                [
                    (
                        sel(names.MEMORY_BYTES, i, f'basis="observed", term=~"{budget_terms}"'),
                        "{{term}} " + _RANK_LEGEND,
                    )
                ],
                stacked=True,
            ),
            bargauge.Panel()
            .id(ids())
            .title("Memory budget: observed and predicted")
            .description(
                "Each term of one rank's budget, as logged (observed) and as kvwatch expects (predicted)."
            )
            .datasource(DATASOURCE)
            .unit(BYTES)
            .span(12)
            .height(8)
            .orientation(common.VizOrientation.HORIZONTAL)
            .display_mode(common.BarGaugeDisplayMode.BASIC)
            .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
            .thresholds(_GREEN_ONLY)
            .with_target(
                _query(sel(names.MEMORY_BYTES, i), "{{term}} {{basis}} " + _RANK_LEGEND, instant=False)
            ),
        ],
    )

    # The engines' own series beside kvwatch's KV view (the PodMonitor scrapes the engine's /metrics).
    e = _ENGINE
    by_pod = f"le, namespace, pod, {config.MODEL}"
    engine_legend = "{{pod}} {{model_name}}"

    def p95(metric: str) -> str:
        return f"histogram_quantile(0.95, sum by ({by_pod}) (rate({metric}{{{e}}}[$__rate_interval])))"

    board = board.with_row(dash.Row("Engine's own metrics: latency and queue (vLLM, SGLang)").id(ids()))
    board = _with_panels(
        board,
        [
            timeseries_panel(
                ids,
                "Time to first token p95 (engine)",
                "The engine's own TTFT histogram: vllm:time_to_first_token_seconds, "
                "sglang:time_to_first_token_seconds. A full KV cache shows here as queueing before prefill.",
                SECONDS,
                [
                    (p95("vllm:time_to_first_token_seconds_bucket"), "vLLM " + engine_legend),
                    (p95("sglang:time_to_first_token_seconds_bucket"), "SGLang " + engine_legend),
                ],
            ),
            timeseries_panel(
                ids,
                "End-to-end request latency p95 (engine)",
                "The engine's own request latency histogram (vllm:/sglang:e2e_request_latency_seconds); "
                "preemptions and retractions recompute requests and stretch it.",
                SECONDS,
                [
                    (p95("vllm:e2e_request_latency_seconds_bucket"), "vLLM " + engine_legend),
                    (p95("sglang:e2e_request_latency_seconds_bucket"), "SGLang " + engine_legend),
                ],
            ),
            timeseries_panel(
                ids,
                "Queue: waiting and running (engine)",
                "Requests the engine reports waiting and running (vllm:num_requests_waiting/running, "
                "sglang:num_queue_reqs/num_running_reqs), per DP engine (vLLM's `engine` label).",
                COUNT,
                [
                    (f"vllm:num_requests_waiting{{{e}}}", "vLLM waiting {{pod}} engine {{engine}}"),
                    (f"vllm:num_requests_running{{{e}}}", "vLLM running {{pod}} engine {{engine}}"),
                    (f"sglang:num_queue_reqs{{{e}}}", "SGLang waiting {{pod}}"),
                    (f"sglang:num_running_reqs{{{e}}}", "SGLang running {{pod}}"),
                ],
            ),
            timeseries_panel(
                ids,
                "KV usage: engine against kvwatch",
                "The engine's own usage gauge (vllm:kv_cache_usage_perc, older vllm:gpu_cache_usage_perc, "
                "sglang:token_usage) beside kvwatch_kv_usage_ratio; they join on namespace, pod and "
                "model_name.",
                PERCENT,
                [
                    (f"vllm:kv_cache_usage_perc{{{e}}}", "vLLM {{pod}} engine {{engine}}"),
                    (f"vllm:gpu_cache_usage_perc{{{e}}}", "vLLM (old name) {{pod}} engine {{engine}}"),
                    (f"sglang:token_usage{{{e}}}", "SGLang {{pod}}"),
                    (sel(names.KV_USAGE_RATIO, i), "kvwatch " + _RANK_LEGEND),
                ],
            ).max(1),
        ],
    )

    board = board.with_row(dash.Row("Engine and kvwatch").id(ids()))
    board = _with_panels(
        board,
        [
            table_panel(
                ids,
                "Engine settings",
                "Settings read from the engine's log or /metrics (version, parallelism, KV dtype, block size, "
                "max_model_len, memory fraction).",
                COUNT,
                [(sel(names.ENGINE_INFO, i), "")],
                hide=("Time", "Value", "__name__"),
                width=24,
                height=6,
            ),
            timeseries_panel(
                ids,
                "Restarts and startup failures",
                "Engine starts after the first one, and starts that failed for lack of KV memory, by reason.",
                COUNT,
                [
                    (f"increase({sel(names.RESTARTS, i)}[$__rate_interval])", "restart " + _RANK_LEGEND),
                    (
                        f"increase({sel(names.STARTUP_FAILURES, i)}[$__rate_interval])",
                        "failed: {{reason}} " + _RANK_LEGEND,
                    ),
                ],
                bars=True,
            ),
            timeseries_panel(
                ids,
                "Age of the last fact",
                "Seconds since kvwatch last learnt something from the log or from /metrics.",
                SECONDS,
                [(f"time() - {sel(names.LAST_UPDATE, i)}", "{{origin}} " + _RANK_LEGEND)],
            ),
            timeseries_panel(
                ids,
                "Stale facts",
                "1 for each fact that stopped arriving from the log or /metrics (no longer exported; the "
                "KVWatchStale alert reads this).",
                COUNT,
                [(sel(names.FACTS_STALE, i), "{{origin}} {{fact}} " + _RANK_LEGEND)],
                thresholds=_steps((None, "green"), (1, "red")),
            )
            .min(0)
            .max(1),
            timeseries_panel(
                ids,
                "kvwatch scraped by Prometheus",
                "Prometheus' `up` for each kvwatch target: 0 when the sidecar cannot be scraped (it then "
                "exports nothing else; KVWatchTargetDown).",
                COUNT,
                [(f"up{{{config.KVWATCH_JOB}, {_TARGET}}}", "{{job}} {{pod}} {{instance}}")],
                thresholds=_steps((None, "red"), (1, "green")),
            )
            .min(0)
            .max(1),
            timeseries_panel(
                ids,
                "Sources readable",
                "1 when kvwatch could read the log file or /metrics URL on its last attempt.",
                COUNT,
                [(sel(names.SOURCE_UP, src), "{{source}} {{pod}}")],
                thresholds=_steps((None, "red"), (1, "green")),
            )
            .min(0)
            .max(1),
            timeseries_panel(
                ids,
                "Log lines",
                "Lines read, lines that produced an event, and lines a pattern claimed but could not convert.",
                OPS,
                [
                    (f"rate({sel(names.LINES_READ, src)}[$__rate_interval])", "read {{source}} {{pod}}"),
                    (
                        f"rate({sel(names.LINES_MATCHED, src)}[$__rate_interval])",
                        "matched {{source}} {{pod}}",
                    ),
                    (
                        f"rate({sel(names.PARSE_ERRORS, src)}[$__rate_interval])",
                        "parse errors {{source}} {{pod}}",
                    ),
                ],
            ),
            timeseries_panel(
                ids,
                "Engine /metrics scrape",
                "Duration of kvwatch's last scrape of the engine, and failed scrapes per second by reason.",
                SECONDS,
                [
                    (sel(names.SCRAPE_DURATION, src), "duration {{source}} {{pod}}"),
                    (
                        f"rate({sel(names.SCRAPE_ERRORS, src)}[$__rate_interval])",
                        "errors/s {{reason}} {{source}} {{pod}}",
                    ),
                ],
            ),
            timeseries_panel(
                ids,
                "Log and /metrics disagreements",
                "Times the log and /metrics gave different values for the same fact.",
                COUNT,
                [(f"increase({sel(names.DISAGREEMENTS, i)}[$__rate_interval])", "{{fact}} " + _RANK_LEGEND)],
                bars=True,
            ),
        ],
    )
    return board


def kv_fleet() -> dash.Dashboard:
    """The fleet dashboard: every model across pods, from the recording rules."""
    ids = _Ids()
    f = _FLEET
    fleet_pool = rules.FLEET_POOL
    headroom_steps = _steps((None, "red"), (config.HEADROOM_REQUESTS_MIN, "green"))
    usage_steps = _steps((None, "green"), (0.9, "orange"), (0.98, "red"))
    gap_parts = []
    for basis, limit in config.GAP_RATIO.items():
        gap = sel(names.KV_POOL_GAP_RATIO, f, f'basis="{basis}"')
        gap_parts.append(f"({gap} > {limit:g} or {gap} < -{limit:g})")
    gap_filters = "\nor\n".join(gap_parts)
    pool = sel(names.KV_POOL_TOKENS, f)
    relative_to_median = (
        f"{sel(rules.RANK_POOL_BY_CARD, f)}\n/ on ({', '.join(config.SIBLING_LABELS)}) group_left()\n"
        f"({sel(rules.SIBLING_POOL_MEDIAN, f)} > 0)"
    )

    board = (
        _base(
            "kvwatch / KV fleet",
            KV_FLEET_UID,
            "KV-cache capacity of every model across pods: totals, the limiting rank, and the ranks whose "
            "pool drifts from prediction or shrank.",
        )
        .with_variable(_datasource_variable())
        .with_variable(_variable("cluster", "Cluster", f"label_values({fleet_pool}, cluster)"))
        .with_variable(
            _variable(
                "namespace", "Namespace", f'label_values({fleet_pool}{{cluster=~"$cluster"}}, namespace)'
            )
        )
        .with_variable(
            _variable(
                "model",
                "Model",
                f'label_values({fleet_pool}{{cluster=~"$cluster", namespace=~"$namespace"}}, {config.MODEL})',
            )
        )
        .annotation(
            _annotation(
                "Engine restarts",
                f"sum by ({config.MODEL}) (increase({sel(names.RESTARTS, f)}[2m])) > 0",
                "orange",
            )
        )
    )

    board = board.with_row(dash.Row("Fleet now").id(ids()))
    board = _with_panels(
        board,
        [
            stat_panel(
                ids,
                "Total KV pool",
                "Tokens of KV cache across every rank of the selected models.",
                TOKENS,
                [(f"sum({sel(rules.FLEET_POOL, f)})", "")],
                decimals=0,
            ),
            stat_panel(
                ids,
                "Total headroom",
                "Free tokens across every rank.",
                TOKENS,
                [(f"sum({sel(rules.FLEET_HEADROOM_TOKENS, f)})", "")],
                decimals=0,
            ),
            stat_panel(
                ids,
                "Fleet KV usage",
                "Tokens used over tokens allocated, across the fleet.",
                PERCENT,
                [(f"sum({sel(rules.FLEET_USED, f)}) / (sum({sel(rules.FLEET_POOL, f)}) > 0)", "")],
                thresholds=usage_steps,
                decimals=1,
            ),
            stat_panel(
                ids,
                "Limiting rank headroom",
                "Requests of max_model_len the fullest rank still holds: the fleet's real margin.",
                REQUESTS,
                [(f"min({sel(rules.LIMITING_HEADROOM_REQUESTS, f)})", "")],
                thresholds=headroom_steps,
                decimals=2,
            ),
            stat_panel(
                ids,
                "Ranks",
                "Engine instances (pod x DP rank) reporting a pool.",
                COUNT,
                [(f"sum({sel(rules.FLEET_RANKS, f)})", "")],
                decimals=0,
            ),
            stat_panel(
                ids,
                "Preemptions",
                "Requests evicted from the KV cache per second, fleet-wide.",
                OPS,
                [(f"sum({sel(rules.FLEET_PREEMPTIONS, f)})", "")],
                thresholds=_steps((None, "green"), (config.PREEMPTION_RATE, "orange")),
            ),
        ],
    )

    board = board.with_row(dash.Row("Capacity by model").id(ids()))
    board = _with_panels(
        board,
        [
            timeseries_panel(
                ids,
                "Total KV pool by model",
                "Sum of the pools of every rank serving the model.",
                TOKENS,
                [(sel(rules.FLEET_POOL, f), _FLEET_LEGEND)],
            ),
            timeseries_panel(
                ids,
                "Total headroom by model",
                "Free tokens across every rank serving the model.",
                TOKENS,
                [(sel(rules.FLEET_HEADROOM_TOKENS, f), _FLEET_LEGEND)],
            ),
            timeseries_panel(
                ids,
                "Headroom in requests: fleet total and limiting rank",
                "Requests of max_model_len the free pools hold in total, and on the fullest rank. A long "
                "request lands on one rank, so the limiting rank is the margin that matters.",
                REQUESTS,
                [
                    (sel(rules.FLEET_HEADROOM_REQUESTS, f), "total " + _FLEET_LEGEND),
                    (sel(rules.LIMITING_HEADROOM_REQUESTS, f), "limiting rank " + _FLEET_LEGEND),
                ],
                thresholds=headroom_steps,
            ).min(0),
            timeseries_panel(
                ids,
                "Fleet KV usage by model",
                "Tokens used over tokens allocated, per model.",
                PERCENT,
                [(sel(rules.FLEET_USAGE, f), _FLEET_LEGEND)],
                thresholds=usage_steps,
            ).max(1),
            timeseries_panel(
                ids,
                "Running and waiting requests by model",
                "Requests running and queued across the model's ranks.",
                COUNT,
                [
                    (sel(rules.FLEET_RUNNING, f), "running " + _FLEET_LEGEND),
                    (sel(rules.FLEET_WAITING, f), "waiting " + _FLEET_LEGEND),
                ],
            ),
            timeseries_panel(
                ids,
                "Preemptions by model",
                "Requests evicted from the KV cache per second (5m rate), per model.",
                OPS,
                [(sel(rules.FLEET_PREEMPTIONS, f), _FLEET_LEGEND)],
            ),
        ],
    )

    board = board.with_row(dash.Row("Limiting rank").id(ids()))
    board = _with_panels(
        board,
        [
            table_panel(
                ids,
                "Limiting rank per model",
                "The rank with the least headroom (requests of max_model_len) in each model's fleet.",
                REQUESTS,
                [(sel(rules.LIMITING_RANK, f), "")],
            ),
            timeseries_panel(
                ids,
                "Headroom of every rank",
                "Requests of max_model_len each rank's free pool holds.",
                REQUESTS,
                [(sel(names.KV_HEADROOM_REQUESTS, f), "{{model_name}} " + _RANK_LEGEND)],
                thresholds=headroom_steps,
            ).min(0),
        ],
    )

    board = board.with_row(dash.Row("Drift and shrink").id(ids()))
    board = _with_panels(
        board,
        [
            table_panel(
                ids,
                "Ranks drifting from prediction",
                "Ranks whose pool is off kvwatch's prediction past the drift alert's tolerance "
                "(Value: observed / predicted - 1).",
                PERCENT,
                [(gap_filters, "")],
            ),
            timeseries_panel(
                ids,
                "Gap to prediction of every rank (config basis)",
                "Observed / predicted - 1 for each rank; negative: a smaller pool than predicted. Dashed "
                "lines: the drift alert's tolerances, ±2 % (engine_budget) and ±10 % (config).",
                PERCENT,
                [(sel(names.KV_POOL_GAP_RATIO, f, 'basis="config"'), "{{model_name}} " + _RANK_LEGEND)],
                thresholds=gap_thresholds(),
                signed=True,
            ),
            table_panel(
                ids,
                "Ranks whose pool shrank",
                f"Ranks whose pool is below {1 - config.SHRINK_RATIO:.0%} of the largest it had in the last "
                f"{config.SHRINK_LOOKBACK} (Value: now / largest).",
                PERCENT,
                [
                    (
                        f"{pool}\n/\n(max_over_time({pool}[{config.SHRINK_LOOKBACK}]) > 0)\n< {1 - config.SHRINK_RATIO:g}",
                        "",
                    )
                ],
            ),
            table_panel(
                ids,
                "Ranks below their sibling replicas",
                f"Ranks whose pool is below {1 - config.SIBLING_RATIO:.0%} of the median pool of the replicas "
                "serving the same model (Value: pool / median).",
                PERCENT,
                [(f"{relative_to_median}\n< {1 - config.SIBLING_RATIO:g}", "")],
            ),
            timeseries_panel(
                ids,
                "Pool relative to the fleet median",
                "Each rank's pool over the median pool of its model's fleet; 100 % is a typical replica.",
                PERCENT,
                [(relative_to_median, "{{model_name}} " + _RANK_LEGEND)],
                width=24,
            ),
        ],
    )
    return board


DASHBOARDS = {"kvwatch-kv-cache.json": kv_cache, "kvwatch-kv-fleet.json": kv_fleet}


def render(board: dash.Dashboard) -> str:
    """Stable JSON text of one dashboard (sorted keys, two-space indent, trailing newline)."""
    return JSONEncoder(sort_keys=True, indent=2).encode(board.build()) + "\n"


def rendered() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {name: render(build()) for name, build in DASHBOARDS.items()}


def configmap(texts: dict[str, str]) -> str:
    """A ConfigMap holding the dashboards, labelled for Grafana's dashboard sidecar."""
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "kvwatch-dashboards",
            "labels": {
                "app.kubernetes.io/name": "kvwatch",
                "app.kubernetes.io/component": "monitoring",
                "grafana_dashboard": "1",
            },
        },
        "data": dict(sorted(texts.items())),
    }
    header = "# Generated by `kvwatch dashboards` from kvwatch/mixin; edit the code, not this file.\n"
    return header + rules.to_yaml(document)


def write(out_dir: Path, configmap_path: Path | None = None) -> list[Path]:
    """Write every dashboard (and the ConfigMap when asked); return the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = rendered()
    written = []
    for name, text in texts.items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    if configmap_path is not None:
        configmap_path.parent.mkdir(parents=True, exist_ok=True)
        configmap_path.write_text(configmap(texts), encoding="utf-8")
        written.append(configmap_path)
    return written


def load(text: str) -> model.Dashboard:
    """Parse dashboard JSON back into the SDK's model (used to check what we generate)."""
    from grafana_foundation_sdk.cog.plugins import register_default_plugins

    register_default_plugins()
    data: dict[str, Any] = json.loads(text)
    board: model.Dashboard = model.Dashboard.from_json(data)
    return board
