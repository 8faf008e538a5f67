"""The "KV cache" dashboard: one engine at a time -- pool observed against prediction, usage,
headroom, scheduler pressure, memory budget, engine settings, the engine's own latency and queue
series, and kvwatch's own health.

Pure data (``KV_CACHE``): ``panels.build`` turns it into the Grafana dashboard.
"""

from __future__ import annotations

from kvwatch.export import names
from kvwatch.mixin import config
from kvwatch.mixin.panels import (
    BYTES,
    COUNT,
    DATE,
    ENGINE,
    GAP_READING,
    GAP_STEPS,
    HEADROOM_STEPS,
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
    UP_STEPS,
    USAGE_STEPS,
    Annotation,
    Board,
    Panel,
    Row,
    Variable,
    increase,
    rate,
    sel,
)

_I = INSTANCE
_SRC = SOURCE

# Job, namespace and pod come from `up`, which every target has, so a pod whose kvwatch is down (and
# exports nothing) can still be picked; source from kvwatch_source_up, which kvwatch exports for
# every configured source, readable or not.
_VARIABLES = (
    Variable("job", "Job", f"label_values(up{{{config.KVWATCH_JOB}}}, job)"),
    Variable("namespace", "Namespace", 'label_values(up{job=~"$job"}, namespace)'),
    Variable("pod", "Pod", 'label_values(up{job=~"$job", namespace=~"$namespace"}, pod)'),
    Variable("source", "Source", f"label_values({sel(names.SOURCE_UP, TARGET)}, source)"),
    Variable("model", "Model", f"label_values({sel(names.ENGINE_INFO, SOURCE)}, {config.MODEL})"),
)

_ANNOTATIONS = (
    Annotation("Engine restarts", f"increase({sel(names.RESTARTS, _I)}[2m]) > 0", "orange"),
    Annotation("Startup failures (KV memory)", f"increase({sel(names.STARTUP_FAILURES, _I)}[2m]) > 0", "red"),
)

# The stats row: the pool, its gap, usage, headroom and concurrency at a glance.
_NOW = (
    Panel(
        "stat",
        "KV pool",
        "Pool size in tokens, as the engine reported it.",
        TOKENS,
        ((sel(names.KV_POOL_TOKENS, _I), RANK_LEGEND),),
        decimals=0,
    ),
    Panel(
        "stat",
        "Gap to prediction",
        "Observed / predicted pool - 1 (config basis). Red beyond the drift alert's tolerance.",
        PERCENT,
        ((sel(names.KV_POOL_GAP_RATIO, _I, 'basis="config"'), RANK_LEGEND),),
        thresholds=GAP_STEPS,
        decimals=1,
    ),
    Panel(
        "stat",
        "KV usage",
        "Fraction of the pool in use.",
        PERCENT,
        ((sel(names.KV_USAGE_RATIO, _I), RANK_LEGEND),),
        thresholds=USAGE_STEPS,
        decimals=1,
    ),
    Panel(
        "stat",
        "Headroom",
        "Requests of max_model_len the free pool still holds.",
        REQUESTS,
        ((sel(names.KV_HEADROOM_REQUESTS, _I), RANK_LEGEND),),
        thresholds=HEADROOM_STEPS,
        decimals=2,
    ),
    Panel(
        "stat",
        "Max concurrency",
        "Requests of max_model_len the whole pool holds (the engine's own figure).",
        REQUESTS,
        ((sel(names.MAX_CONCURRENCY, _I, 'basis="observed"'), RANK_LEGEND),),
        decimals=2,
    ),
    Panel(
        "stat",
        "Engine started",
        "When kvwatch saw the current engine start.",
        DATE,
        ((f"{sel(names.EPOCH_START, _I)} * 1000", RANK_LEGEND),),
    ),
)

# The pool over time against both predictions, in tokens and bytes.
_POOL = (
    Panel(
        "timeseries",
        "Pool size (tokens)",
        "The pool the engine allocated against kvwatch's predictions: `config` from config.json alone, "
        "`engine_budget` from the memory terms the engine logged.",
        TOKENS,
        (
            (sel(names.KV_POOL_TOKENS, _I), "observed " + RANK_LEGEND),
            (sel(names.KV_POOL_PREDICTED_TOKENS, _I), "predicted ({{basis}}) " + RANK_LEGEND),
        ),
    ),
    Panel(
        "timeseries",
        "Gap to prediction",
        "Observed / predicted - 1, per basis; " + GAP_READING,
        PERCENT,
        ((sel(names.KV_POOL_GAP_RATIO, _I), "{{basis}} " + RANK_LEGEND),),
        thresholds=GAP_STEPS,
        signed=True,
    ),
    Panel(
        "timeseries",
        "Pool size per rank (bytes)",
        "KV-cache bytes on one rank, observed and predicted.",
        BYTES,
        (
            (sel(names.KV_POOL_BYTES, _I), "observed " + RANK_LEGEND),
            (sel(names.KV_POOL_PREDICTED_BYTES, _I), "predicted ({{basis}}) " + RANK_LEGEND),
        ),
    ),
    Panel(
        "timeseries",
        "Max concurrency",
        "Requests of max_model_len the whole pool holds: the engine's figure and kvwatch's per basis.",
        REQUESTS,
        ((sel(names.MAX_CONCURRENCY, _I), "{{basis}} " + RANK_LEGEND),),
    ),
)

# Usage, tokens used and free, headroom in requests, prefix-cache hits.
_USAGE = (
    Panel(
        "timeseries",
        "KV usage",
        "Fraction of the pool in use (vLLM counts whole blocks).",
        PERCENT,
        ((sel(names.KV_USAGE_RATIO, _I), RANK_LEGEND),),
        thresholds=USAGE_STEPS,
        axis_max=1,
    ),
    Panel(
        "timeseries",
        "Tokens used and free",
        "Tokens held in the pool and free tokens (headroom).",
        TOKENS,
        (
            (sel(names.KV_USED_TOKENS, _I), "used " + RANK_LEGEND),
            (sel(names.KV_HEADROOM_TOKENS, _I), "free " + RANK_LEGEND),
        ),
    ),
    Panel(
        "timeseries",
        "Headroom in requests",
        "Requests of max_model_len the free pool holds. Below the dashed line a long request waits "
        "or preempts another.",
        REQUESTS,
        ((sel(names.KV_HEADROOM_REQUESTS, _I), RANK_LEGEND),),
        thresholds=HEADROOM_STEPS,
        axis_min=0,
    ),
    Panel(
        "timeseries",
        "Prefix cache hit rate",
        "Prefix-cache hit rate the engine reported; shared prefixes are shared KV blocks.",
        PERCENT,
        ((sel(names.PREFIX_CACHE_HIT_RATIO, _I), RANK_LEGEND),),
        axis_max=1,
    ),
)

# Running and waiting requests, preemptions and retractions.
_SCHEDULER = (
    Panel(
        "timeseries",
        "Running and waiting requests",
        "Requests the engine runs and requests queued for KV space or a batch slot.",
        COUNT,
        (
            (sel(names.REQUESTS_RUNNING, _I), "running " + RANK_LEGEND),
            (sel(names.REQUESTS_WAITING, _I), "waiting " + RANK_LEGEND),
        ),
    ),
    Panel(
        "timeseries",
        "Preemptions and retractions",
        "Requests evicted from the KV cache per second (vLLM preemptions, SGLang retractions).",
        OPS,
        ((rate(sel(names.PREEMPTIONS, _I)), RANK_LEGEND),),
        bars=True,
    ),
)

_BUDGET_TERMS = "weights|activation|non_torch|cuda_graphs|kv"
# One rank's GPU memory by term, observed and predicted.
_MEMORY_BUDGET = (
    Panel(
        "timeseries",
        "Memory budget by term (observed)",
        "Where one rank's GPU memory went, stacked: weights, activation peak, non-torch, CUDA graphs "
        "and the KV pool, as the engine logged them.",
        BYTES,
        (
            (
                sel(names.MEMORY_BYTES, _I, f'basis="observed", term=~"{_BUDGET_TERMS}"'),
                "{{term}} " + RANK_LEGEND,
            ),
        ),
        stacked=True,
    ),
    Panel(
        "bargauge",
        "Memory budget: observed and predicted",
        "Each term of one rank's budget, as logged (observed) and as kvwatch expects (predicted).",
        BYTES,
        ((sel(names.MEMORY_BYTES, _I), "{{term}} {{basis}} " + RANK_LEGEND),),
    ),
)


def _p95(metric: str) -> str:
    """p95 of an engine histogram per pod and model (the engines' series, not kvwatch's)."""
    by_pod = f"le, namespace, pod, {config.MODEL}"
    return f"histogram_quantile(0.95, sum by ({by_pod}) (rate({metric}{{{ENGINE}}}[$__rate_interval])))"


_E = ENGINE
_ENGINE_LEGEND = "{{pod}} {{model_name}}"
# The engines' own latency, queue and usage series beside kvwatch's (the PodMonitor scrapes them).
_ENGINE_METRICS = (
    Panel(
        "timeseries",
        "Time to first token p95 (engine)",
        "The engine's own TTFT histogram: vllm:time_to_first_token_seconds, "
        "sglang:time_to_first_token_seconds. A full KV cache shows here as queueing before prefill.",
        SECONDS,
        (
            (_p95("vllm:time_to_first_token_seconds_bucket"), "vLLM " + _ENGINE_LEGEND),
            (_p95("sglang:time_to_first_token_seconds_bucket"), "SGLang " + _ENGINE_LEGEND),
        ),
    ),
    Panel(
        "timeseries",
        "End-to-end request latency p95 (engine)",
        "The engine's own request latency histogram (vllm:/sglang:e2e_request_latency_seconds); "
        "preemptions and retractions recompute requests and stretch it.",
        SECONDS,
        (
            (_p95("vllm:e2e_request_latency_seconds_bucket"), "vLLM " + _ENGINE_LEGEND),
            (_p95("sglang:e2e_request_latency_seconds_bucket"), "SGLang " + _ENGINE_LEGEND),
        ),
    ),
    Panel(
        "timeseries",
        "Queue: waiting and running (engine)",
        "Requests the engine reports waiting and running (vllm:num_requests_waiting/running, "
        "sglang:num_queue_reqs/num_running_reqs), per DP engine (vLLM's `engine` label).",
        COUNT,
        (
            (f"vllm:num_requests_waiting{{{_E}}}", "vLLM waiting {{pod}} engine {{engine}}"),
            (f"vllm:num_requests_running{{{_E}}}", "vLLM running {{pod}} engine {{engine}}"),
            (f"sglang:num_queue_reqs{{{_E}}}", "SGLang waiting {{pod}}"),
            (f"sglang:num_running_reqs{{{_E}}}", "SGLang running {{pod}}"),
        ),
    ),
    Panel(
        "timeseries",
        "KV usage: engine against kvwatch",
        "The engine's own usage gauge (vllm:kv_cache_usage_perc, older vllm:gpu_cache_usage_perc, "
        "sglang:token_usage) beside kvwatch_kv_usage_ratio; they join on namespace, pod and "
        "model_name.",
        PERCENT,
        (
            (f"vllm:kv_cache_usage_perc{{{_E}}}", "vLLM {{pod}} engine {{engine}}"),
            (f"vllm:gpu_cache_usage_perc{{{_E}}}", "vLLM (old name) {{pod}} engine {{engine}}"),
            (f"sglang:token_usage{{{_E}}}", "SGLang {{pod}}"),
            (sel(names.KV_USAGE_RATIO, _I), "kvwatch " + RANK_LEGEND),
        ),
        axis_max=1,
    ),
)

# The engine's settings, restarts and failures, and kvwatch's own health: staleness, sources,
# lines, scrapes.
_HEALTH = (
    Panel(
        "table",
        "Engine settings",
        "Settings read from the engine's log or /metrics (version, parallelism, KV dtype, block size, "
        "max_model_len, memory fraction).",
        COUNT,
        ((sel(names.ENGINE_INFO, _I), ""),),
        hide=("Time", "Value", "__name__"),
        width=24,
        height=6,
    ),
    Panel(
        "timeseries",
        "Restarts and startup failures",
        "Engine starts after the first one, and starts that failed for lack of KV memory, by reason.",
        COUNT,
        (
            (increase(sel(names.RESTARTS, _I)), "restart " + RANK_LEGEND),
            (increase(sel(names.STARTUP_FAILURES, _I)), "failed: {{reason}} " + RANK_LEGEND),
        ),
        bars=True,
    ),
    Panel(
        "timeseries",
        "Age of the last fact",
        "Seconds since kvwatch last learnt something from the log or from /metrics.",
        SECONDS,
        ((f"time() - {sel(names.LAST_UPDATE, _I)}", "{{origin}} " + RANK_LEGEND),),
    ),
    Panel(
        "timeseries",
        "Stale facts",
        "1 for each fact that stopped arriving from the log or /metrics (no longer exported; the "
        "KVWatchStale alert reads this).",
        COUNT,
        ((sel(names.FACTS_STALE, _I), "{{origin}} {{fact}} " + RANK_LEGEND),),
        thresholds=((None, "green"), (1, "red")),
        axis_min=0,
        axis_max=1,
    ),
    Panel(
        "timeseries",
        "kvwatch scraped by Prometheus",
        "Prometheus' `up` for each kvwatch target: 0 when the sidecar cannot be scraped (it then "
        "exports nothing else; KVWatchTargetDown).",
        COUNT,
        ((f"up{{{config.KVWATCH_JOB}, {TARGET}}}", "{{job}} {{pod}} {{instance}}"),),
        thresholds=UP_STEPS,
        axis_min=0,
        axis_max=1,
    ),
    Panel(
        "timeseries",
        "Sources readable",
        "1 when kvwatch could read the log file or /metrics URL on its last attempt.",
        COUNT,
        ((sel(names.SOURCE_UP, _SRC), "{{source}} {{pod}}"),),
        thresholds=UP_STEPS,
        axis_min=0,
        axis_max=1,
    ),
    Panel(
        "timeseries",
        "Log lines",
        "Lines read, lines that produced an event, and lines a pattern claimed but could not convert.",
        OPS,
        (
            (rate(sel(names.LINES_READ, _SRC)), "read {{source}} {{pod}}"),
            (rate(sel(names.LINES_MATCHED, _SRC)), "matched {{source}} {{pod}}"),
            (rate(sel(names.PARSE_ERRORS, _SRC)), "parse errors {{source}} {{pod}}"),
        ),
    ),
    Panel(
        "timeseries",
        "Engine /metrics scrape",
        "Duration of kvwatch's last scrape of the engine, and failed scrapes per second by reason.",
        SECONDS,
        (
            (sel(names.SCRAPE_DURATION, _SRC), "duration {{source}} {{pod}}"),
            (rate(sel(names.SCRAPE_ERRORS, _SRC)), "errors/s {{reason}} {{source}} {{pod}}"),
        ),
    ),
    Panel(
        "timeseries",
        "Log and /metrics disagreements",
        "Times the log and /metrics gave different values for the same fact.",
        COUNT,
        ((increase(sel(names.DISAGREEMENTS, _I)), "{{fact}} " + RANK_LEGEND),),
        bars=True,
    ),
)

KV_CACHE = Board(
    title="kvwatch / KV cache",
    uid=KV_CACHE_UID,
    description="KV-cache pool of one vLLM or SGLang engine: observed against kvwatch's prediction, usage, "
    "headroom, scheduler pressure and the GPU memory budget behind the pool.",
    variables=_VARIABLES,
    annotations=_ANNOTATIONS,
    rows=(
        Row("Now", _NOW),
        Row("Pool: observed against predicted", _POOL),
        Row("Usage and headroom", _USAGE),
        Row("Scheduler", _SCHEDULER),
        Row("GPU memory budget", _MEMORY_BUDGET),
        Row("Engine's own metrics: latency and queue (vLLM, SGLang)", _ENGINE_METRICS),
        Row("Engine and kvwatch", _HEALTH),
    ),
)
