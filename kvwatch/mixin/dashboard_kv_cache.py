"""The "KV cache" dashboard: one engine at a time -- pool observed against prediction, usage,
headroom, scheduler pressure, memory budget, engine settings, the engine's own latency and queue
series, and kvwatch's own health."""

from __future__ import annotations

from collections.abc import Callable

from grafana_foundation_sdk.builders import bargauge
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model

from kvwatch.export import names
from kvwatch.mixin import config
from kvwatch.mixin.panels import (
    BYTES,
    COUNT,
    DATASOURCE,
    DATE,
    ENGINE,
    GREEN_ONLY,
    INSTANCE,
    KV_CACHE_UID,
    OPS,
    PERCENT,
    RANK_LEGEND,
    REQUESTS,
    SECONDS,
    SOURCE,
    TARGET,
    TOKENS,
    Ids,
    annotation,
    base,
    datasource_variable,
    gap_thresholds,
    query,
    sel,
    stat_panel,
    steps,
    table_panel,
    timeseries_panel,
    variable,
    with_panels,
)

_Panels = list[cogbuilder.Builder[model.Panel]]


# Shared by the panels that colour the same figure (a stat and its time series).
def _usage_steps() -> dash.ThresholdsConfig:
    return steps((None, "green"), (0.9, "orange"), (0.98, "red"))


def _headroom_steps() -> dash.ThresholdsConfig:
    return steps((None, "red"), (config.HEADROOM_REQUESTS_MIN, "green"))


def kv_cache() -> dash.Dashboard:
    """The per-engine dashboard: the header, then one row per panel group, ids in build order."""
    ids = Ids()
    board = _header()
    for title, group in _ROWS:
        board = board.with_row(dash.Row(title).id(ids()))
        board = with_panels(board, group(ids))
    return board


def _header() -> dash.Dashboard:
    """Title, variables (job, namespace, pod, source, model) and the restart/failure annotations."""
    i = INSTANCE
    return (
        base(
            "kvwatch / KV cache",
            KV_CACHE_UID,
            "KV-cache pool of one vLLM or SGLang engine: observed against kvwatch's prediction, usage, "
            "headroom, scheduler pressure and the GPU memory budget behind the pool.",
        )
        .with_variable(datasource_variable())
        # Job, namespace and pod come from `up`, which every target has, so a pod whose kvwatch is
        # down (and exports nothing) can still be picked; source from kvwatch_source_up, which
        # kvwatch exports for every configured source, readable or not.
        .with_variable(variable("job", "Job", f"label_values(up{{{config.KVWATCH_JOB}}}, job)"))
        .with_variable(variable("namespace", "Namespace", 'label_values(up{job=~"$job"}, namespace)'))
        .with_variable(variable("pod", "Pod", 'label_values(up{job=~"$job", namespace=~"$namespace"}, pod)'))
        .with_variable(
            variable(
                "source",
                "Source",
                f"label_values({sel(names.SOURCE_UP, TARGET)}, source)",
            )
        )
        .with_variable(
            variable(
                "model",
                "Model",
                f"label_values({sel(names.ENGINE_INFO, SOURCE)}, {config.MODEL})",
            )
        )
        .annotation(annotation("Engine restarts", f"increase({sel(names.RESTARTS, i)}[2m]) > 0", "orange"))
        .annotation(
            annotation(
                "Startup failures (KV memory)", f"increase({sel(names.STARTUP_FAILURES, i)}[2m]) > 0", "red"
            )
        )
    )


def _now(ids: Ids) -> _Panels:
    """The stats row: the pool, its gap, usage, headroom and concurrency at a glance."""
    i = INSTANCE
    gap_steps = gap_thresholds()
    return [
        stat_panel(
            ids,
            "KV pool",
            "Pool size in tokens, as the engine reported it.",
            TOKENS,
            [(sel(names.KV_POOL_TOKENS, i), RANK_LEGEND)],
            decimals=0,
        ),
        stat_panel(
            ids,
            "Gap to prediction",
            "Observed / predicted pool - 1 (config basis). Red beyond the drift alert's tolerance.",
            PERCENT,
            [(sel(names.KV_POOL_GAP_RATIO, i, 'basis="config"'), RANK_LEGEND)],
            thresholds=gap_steps,
            decimals=1,
        ),
        stat_panel(
            ids,
            "KV usage",
            "Fraction of the pool in use.",
            PERCENT,
            [(sel(names.KV_USAGE_RATIO, i), RANK_LEGEND)],
            thresholds=_usage_steps(),
            decimals=1,
        ),
        stat_panel(
            ids,
            "Headroom",
            "Requests of max_model_len the free pool still holds.",
            REQUESTS,
            [(sel(names.KV_HEADROOM_REQUESTS, i), RANK_LEGEND)],
            thresholds=_headroom_steps(),
            decimals=2,
        ),
        stat_panel(
            ids,
            "Max concurrency",
            "Requests of max_model_len the whole pool holds (the engine's own figure).",
            REQUESTS,
            [(sel(names.MAX_CONCURRENCY, i, 'basis="observed"'), RANK_LEGEND)],
            decimals=2,
        ),
        stat_panel(
            ids,
            "Engine started",
            "When kvwatch saw the current engine start.",
            DATE,
            [(f"{sel(names.EPOCH_START, i)} * 1000", RANK_LEGEND)],
        ),
    ]


def _pool(ids: Ids) -> _Panels:
    """The pool over time against both predictions, in tokens and bytes."""
    i = INSTANCE
    gap_steps = gap_thresholds()
    return [
        timeseries_panel(
            ids,
            "Pool size (tokens)",
            "The pool the engine allocated against kvwatch's predictions: `config` from config.json alone, "
            "`engine_budget` from the memory terms the engine logged.",
            TOKENS,
            [
                (sel(names.KV_POOL_TOKENS, i), "observed " + RANK_LEGEND),
                (sel(names.KV_POOL_PREDICTED_TOKENS, i), "predicted ({{basis}}) " + RANK_LEGEND),
            ],
        ),
        timeseries_panel(
            ids,
            "Gap to prediction",
            "Observed / predicted - 1, per basis; negative: a smaller pool than predicted. Dashed lines: "
            "the drift alert's tolerances, ±2 % (engine_budget) and ±10 % (config).",
            PERCENT,
            [(sel(names.KV_POOL_GAP_RATIO, i), "{{basis}} " + RANK_LEGEND)],
            thresholds=gap_steps,
            signed=True,
        ),
        timeseries_panel(
            ids,
            "Pool size per rank (bytes)",
            "KV-cache bytes on one rank, observed and predicted.",
            BYTES,
            [
                (sel(names.KV_POOL_BYTES, i), "observed " + RANK_LEGEND),
                (sel(names.KV_POOL_PREDICTED_BYTES, i), "predicted ({{basis}}) " + RANK_LEGEND),
            ],
        ),
        timeseries_panel(
            ids,
            "Max concurrency",
            "Requests of max_model_len the whole pool holds: the engine's figure and kvwatch's per basis.",
            REQUESTS,
            [(sel(names.MAX_CONCURRENCY, i), "{{basis}} " + RANK_LEGEND)],
        ),
    ]


def _usage(ids: Ids) -> _Panels:
    """Usage, tokens used and free, headroom in requests, prefix-cache hits."""
    i = INSTANCE
    return [
        timeseries_panel(
            ids,
            "KV usage",
            "Fraction of the pool in use (vLLM counts whole blocks).",
            PERCENT,
            [(sel(names.KV_USAGE_RATIO, i), RANK_LEGEND)],
            thresholds=_usage_steps(),
        ).max(1),
        timeseries_panel(
            ids,
            "Tokens used and free",
            "Tokens held in the pool and free tokens (headroom).",
            TOKENS,
            [
                (sel(names.KV_USED_TOKENS, i), "used " + RANK_LEGEND),
                (sel(names.KV_HEADROOM_TOKENS, i), "free " + RANK_LEGEND),
            ],
        ),
        timeseries_panel(
            ids,
            "Headroom in requests",
            "Requests of max_model_len the free pool holds. Below the dashed line a long request waits "
            "or preempts another.",
            REQUESTS,
            [(sel(names.KV_HEADROOM_REQUESTS, i), RANK_LEGEND)],
            thresholds=_headroom_steps(),
        ).min(0),
        timeseries_panel(
            ids,
            "Prefix cache hit rate",
            "Prefix-cache hit rate the engine reported; shared prefixes are shared KV blocks.",
            PERCENT,
            [(sel(names.PREFIX_CACHE_HIT_RATIO, i), RANK_LEGEND)],
        ).max(1),
    ]


def _scheduler(ids: Ids) -> _Panels:
    """Running and waiting requests, preemptions and retractions."""
    i = INSTANCE
    return [
        timeseries_panel(
            ids,
            "Running and waiting requests",
            "Requests the engine runs and requests queued for KV space or a batch slot.",
            COUNT,
            [
                (sel(names.REQUESTS_RUNNING, i), "running " + RANK_LEGEND),
                (sel(names.REQUESTS_WAITING, i), "waiting " + RANK_LEGEND),
            ],
        ),
        timeseries_panel(
            ids,
            "Preemptions and retractions",
            "Requests evicted from the KV cache per second (vLLM preemptions, SGLang retractions).",
            OPS,
            [(f"rate({sel(names.PREEMPTIONS, i)}[$__rate_interval])", RANK_LEGEND)],
            bars=True,
        ),
    ]


def _memory_budget(ids: Ids) -> _Panels:
    """One rank's GPU memory by term, observed and predicted."""
    i = INSTANCE
    budget_terms = "weights|activation|non_torch|cuda_graphs|kv"
    return [
        timeseries_panel(
            ids,
            "Memory budget by term (observed)",
            "Where one rank's GPU memory went, stacked: weights, activation peak, non-torch, CUDA graphs "
            "and the KV pool, as the engine logged them.",
            BYTES,
            [
                (
                    sel(names.MEMORY_BYTES, i, f'basis="observed", term=~"{budget_terms}"'),
                    "{{term}} " + RANK_LEGEND,
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
        .thresholds(GREEN_ONLY)
        .with_target(query(sel(names.MEMORY_BYTES, i), "{{term}} {{basis}} " + RANK_LEGEND, instant=False)),
    ]


def _engine_metrics(ids: Ids) -> _Panels:
    """The engines' own latency, queue and usage series beside kvwatch's (the PodMonitor scrapes them)."""
    i = INSTANCE
    e = ENGINE
    by_pod = f"le, namespace, pod, {config.MODEL}"
    engine_legend = "{{pod}} {{model_name}}"

    def p95(metric: str) -> str:
        return f"histogram_quantile(0.95, sum by ({by_pod}) (rate({metric}{{{e}}}[$__rate_interval])))"

    return [
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
                (sel(names.KV_USAGE_RATIO, i), "kvwatch " + RANK_LEGEND),
            ],
        ).max(1),
    ]


def _health(ids: Ids) -> _Panels:
    """The engine's settings, restarts and failures, and kvwatch's own health: staleness, sources, lines, scrapes."""
    i = INSTANCE
    src = SOURCE
    return [
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
                (f"increase({sel(names.RESTARTS, i)}[$__rate_interval])", "restart " + RANK_LEGEND),
                (
                    f"increase({sel(names.STARTUP_FAILURES, i)}[$__rate_interval])",
                    "failed: {{reason}} " + RANK_LEGEND,
                ),
            ],
            bars=True,
        ),
        timeseries_panel(
            ids,
            "Age of the last fact",
            "Seconds since kvwatch last learnt something from the log or from /metrics.",
            SECONDS,
            [(f"time() - {sel(names.LAST_UPDATE, i)}", "{{origin}} " + RANK_LEGEND)],
        ),
        timeseries_panel(
            ids,
            "Stale facts",
            "1 for each fact that stopped arriving from the log or /metrics (no longer exported; the "
            "KVWatchStale alert reads this).",
            COUNT,
            [(sel(names.FACTS_STALE, i), "{{origin}} {{fact}} " + RANK_LEGEND)],
            thresholds=steps((None, "green"), (1, "red")),
        )
        .min(0)
        .max(1),
        timeseries_panel(
            ids,
            "kvwatch scraped by Prometheus",
            "Prometheus' `up` for each kvwatch target: 0 when the sidecar cannot be scraped (it then "
            "exports nothing else; KVWatchTargetDown).",
            COUNT,
            [(f"up{{{config.KVWATCH_JOB}, {TARGET}}}", "{{job}} {{pod}} {{instance}}")],
            thresholds=steps((None, "red"), (1, "green")),
        )
        .min(0)
        .max(1),
        timeseries_panel(
            ids,
            "Sources readable",
            "1 when kvwatch could read the log file or /metrics URL on its last attempt.",
            COUNT,
            [(sel(names.SOURCE_UP, src), "{{source}} {{pod}}")],
            thresholds=steps((None, "red"), (1, "green")),
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
            [(f"increase({sel(names.DISAGREEMENTS, i)}[$__rate_interval])", "{{fact}} " + RANK_LEGEND)],
            bars=True,
        ),
    ]


_ROWS: tuple[tuple[str, Callable[[Ids], _Panels]], ...] = (
    ("Now", _now),
    ("Pool: observed against predicted", _pool),
    ("Usage and headroom", _usage),
    ("Scheduler", _scheduler),
    ("GPU memory budget", _memory_budget),
    ("Engine's own metrics: latency and queue (vLLM, SGLang)", _engine_metrics),
    ("Engine and kvwatch", _health),
)
