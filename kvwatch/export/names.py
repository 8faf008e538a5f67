"""Every metric kvwatch exports: name, type, help and labels, in one place.

The collector builds its families from these constants; dashboards, alert rules, the README table
and the tests are checked against ``METRICS``. Renaming a metric here is the only way to rename it.
Names follow Prometheus practice: ``kvwatch_`` prefix, base units in the name, counters end in
``_total`` (the constant holds the name without ``_total``, as prometheus_client wants it; use
``Metric.sample_name`` for the name that appears in PromQL).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvwatch.core import labels

MetricType = Literal["gauge", "counter", "info"]

# Labels of every per-instance metric. `dp_rank` is the engine instance inside one source
# (data-parallel rank / V1 engine index); `instance` is avoided because Prometheus owns it.
# The engine kind (vllm, sglang) is `engine_kind`, not `engine`: vLLM's own series use `engine` for
# the DP engine index, so one label name would mean two things in a join. The served model is
# `model_name`, the label both vLLM and SGLang put on their own series (docs/monitoring.md).
ENGINE_KIND_LABEL = "engine_kind"
MODEL_LABEL = "model_name"
INSTANCE_LABELS: tuple[str, ...] = ("source", ENGINE_KIND_LABEL, MODEL_LABEL, "dp_rank")
SOURCE_LABELS: tuple[str, ...] = ("source",)
# Node mode (`kvwatch run --node-logs`): the engine's own pod, read from its log's path in the
# kubelet's tree, on every per-instance series. They carry the names of the target labels
# Prometheus gives a sidecar's pod, so the rules and dashboards read both modes alike; the node
# agent's PodMonitor keeps kvwatch's values with honorLabels (deploy/kubernetes/node/).
WORKLOAD_LABELS: tuple[str, ...] = ("namespace", "pod", "container")

# Bounded label values: one Literal each, in kvwatch.core.labels.
PREDICTION_BASES = labels.PREDICTION_BASES
CONCURRENCY_BASES = labels.CONCURRENCY_BASES
MEMORY_TERMS = labels.MEMORY_TERMS
MEMORY_BASES = labels.MEMORY_BASES
FAILURE_REASONS = labels.FAILURE_REASONS
PREDICTION_STATES = labels.PREDICTION_STATES
SCRAPE_ERROR_REASONS = labels.SCRAPE_ERROR_REASONS
NODE_CONTAINER_STATES = labels.NODE_CONTAINER_STATES
ENGINE_INFO_LABELS: tuple[str, ...] = (
    "version",
    "tp",
    "pp",
    "dp",
    "kv_cache_dtype",
    "block_size",
    "max_model_len",
    "gpu_memory_utilization",
)


@dataclass(frozen=True)
class Metric:
    """One exported metric family."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...]

    @property
    def sample_name(self) -> str:
        """The series name as it appears in PromQL (counters gain `_total`, info `_info`)."""
        if self.type == "counter":
            return f"{self.name}_total"
        if self.type == "info":
            return f"{self.name}_info"
        return self.name


def _m(
    name: str, type_: MetricType, help_: str, *extra: str, base: tuple[str, ...] = INSTANCE_LABELS
) -> Metric:
    return Metric(name, type_, help_, base + extra)


# --- Observed pool -------------------------------------------------------------------------------
KV_POOL_TOKENS = _m(
    "kvwatch_kv_pool_tokens", "gauge", "KV-cache pool size in tokens, as the engine reported it."
)
KV_POOL_BLOCKS = _m(
    "kvwatch_kv_pool_blocks", "gauge", "KV-cache pool size in blocks (vLLM), as the engine reported it."
)
KV_POOL_BYTES = _m(
    "kvwatch_kv_pool_bytes", "gauge", "KV-cache pool size in bytes on one rank, as the engine reported it."
)
KV_BLOCK_SIZE = _m(
    "kvwatch_kv_block_size_tokens", "gauge", "Tokens per KV-cache block (vLLM block_size, SGLang page_size)."
)
KV_POOL_PADDING_WASTE_RATIO = _m(
    "kvwatch_kv_pool_padding_waste_ratio",
    "gauge",
    "Share of the KV-cache memory the engine said its padding layers may waste at most (vLLM hybrid-model KV groups filled up with padding; absent when none was printed).",
)
# --- Prediction ----------------------------------------------------------------------------------
KV_POOL_PREDICTED_TOKENS = _m(
    "kvwatch_kv_pool_predicted_tokens",
    "gauge",
    "KV-cache pool size kvwatch predicts, in tokens; basis=config (a priori) or engine_budget (from the engine's logged memory terms).",
    "basis",
)
KV_POOL_PREDICTED_BYTES = _m(
    "kvwatch_kv_pool_predicted_bytes",
    "gauge",
    "KV-cache pool size kvwatch predicts, in bytes on one rank.",
    "basis",
)
KV_POOL_GAP_RATIO = _m(
    "kvwatch_kv_pool_gap_ratio",
    "gauge",
    "Observed pool tokens / predicted pool tokens - 1 (negative: smaller than predicted).",
    "basis",
)
KV_POOL_PREDICTION_ERROR_RATIO = _m(
    "kvwatch_kv_pool_prediction_error_ratio",
    "gauge",
    "The band of the predicted pool as a share of it (sized so that at least 80 % of real startups land inside it out of sample, widened for every condition outside the calibration set); the drift alert's config-basis tolerance follows it.",
    "basis",
)
KV_BYTES_PER_TOKEN = _m(
    "kvwatch_kv_bytes_per_token",
    "gauge",
    "KV-cache bytes one token costs on one rank (layers whose cache grows with context).",
)
PREDICTION_AVAILABLE = _m(
    "kvwatch_prediction_available",
    "gauge",
    "1 for the state of the prediction (state=ok when kvwatch could predict the pool, else why not).",
    "state",
)
# --- Usage and headroom --------------------------------------------------------------------------
KV_USAGE_RATIO = _m("kvwatch_kv_usage_ratio", "gauge", "Fraction of the KV-cache pool in use (0-1).")
KV_USED_TOKENS = _m("kvwatch_kv_used_tokens", "gauge", "Tokens held in the KV-cache pool.")
KV_HEADROOM_TOKENS = _m(
    "kvwatch_kv_headroom_tokens", "gauge", "Free tokens in the KV-cache pool (pool - used)."
)
KV_HEADROOM_REQUESTS = _m(
    "kvwatch_kv_headroom_requests",
    "gauge",
    "How many more requests of max_model_len tokens the free pool holds.",
)
MAX_CONCURRENCY = _m(
    "kvwatch_max_concurrency_requests",
    "gauge",
    "Requests of max_model_len tokens the whole pool holds; basis=observed (engine), config or engine_budget (kvwatch).",
    "basis",
)
PREFIX_CACHE_HIT_RATIO = _m(
    "kvwatch_prefix_cache_hit_ratio", "gauge", "Prefix-cache hit rate the engine reported (0-1)."
)
REQUESTS_RUNNING = _m("kvwatch_requests_running", "gauge", "Requests the engine is running.")
REQUESTS_WAITING = _m("kvwatch_requests_waiting", "gauge", "Requests waiting in the engine's queue.")
PREEMPTIONS = _m(
    "kvwatch_preemptions",
    "counter",
    "Requests evicted from the KV cache: vLLM preemptions and SGLang retractions.",
)
# --- Memory budget -------------------------------------------------------------------------------
MEMORY_BYTES = _m(
    "kvwatch_memory_bytes",
    "gauge",
    "GPU memory budget of one rank by term (total, usable, weights, activation, non_torch, cuda_graphs, kv); basis=observed or predicted.",
    "term",
    "basis",
)
# --- Engine lifecycle ----------------------------------------------------------------------------
ENGINE_INFO = _m(
    "kvwatch_engine", "info", "Engine settings read from its log or /metrics.", *ENGINE_INFO_LABELS
)
EPOCH_START = _m(
    "kvwatch_epoch_start_time_seconds", "gauge", "When kvwatch saw the current engine start (Unix time)."
)
RESTARTS = _m("kvwatch_engine_restarts", "counter", "Engine starts after the first one kvwatch saw.")
STARTUP_FAILURES = _m(
    "kvwatch_startup_failures",
    "counter",
    "Engine starts that failed for lack of KV-cache memory, by reason.",
    "reason",
)
LAST_UPDATE = _m(
    "kvwatch_last_update_timestamp_seconds",
    "gauge",
    "When kvwatch last received a fact from this origin (log or metrics).",
    "origin",
)
FACTS_STALE = _m(
    "kvwatch_source_facts_stale",
    "gauge",
    "1 when a periodic fact (KV usage, used tokens, running or waiting requests: what stats lines and every scrape carry) that arrived from this origin (log or metrics) stopped arriving for longer than the fact TTL; its value is no longer exported. Facts printed once per start (pool, memory budget, settings) are never stale while their source is alive, and have no series here.",
    "origin",
    "fact",
)
DISAGREEMENTS = _m(
    "kvwatch_log_metrics_disagreements",
    "counter",
    "Times the log and /metrics gave different values for the same fact.",
    "fact",
)
BAD_VALUES = _m(
    "kvwatch_bad_values",
    "counter",
    "Values the engine reported outside the fact's meaning or plausibility (a ratio outside 0-1, a negative "
    "count, a pool past 2^40 tokens), rejected.",
    "fact",
)
# --- Self-metrics --------------------------------------------------------------------------------
LINES_READ = _m("kvwatch_lines_read", "counter", "Log lines read.", base=SOURCE_LABELS)
LINES_MATCHED = _m(
    "kvwatch_lines_matched", "counter", "Log lines that produced an event.", base=SOURCE_LABELS
)
PARSE_ERRORS = _m(
    "kvwatch_parse_errors",
    "counter",
    "Lines a pattern claimed but could not convert (skipped).",
    base=SOURCE_LABELS,
)
LOG_ROTATIONS = _m(
    "kvwatch_log_rotations", "counter", "Log rotations and truncations followed.", base=SOURCE_LABELS
)
LOG_READ_ERRORS = _m(
    "kvwatch_log_read_errors",
    "counter",
    "Failed attempts to open or read a log (missing, unreadable).",
    base=SOURCE_LABELS,
)
STDIN_BACKLOG = _m(
    "kvwatch_stdin_backlog_lines",
    "gauge",
    "'--log -' only: lines read from standard input and not yet parsed (reading pauses at 10,000).",
    base=SOURCE_LABELS,
)
LINES_TRUNCATED = _m(
    "kvwatch_log_lines_truncated",
    "counter",
    "Log lines cut at the line-length cap (65,536 characters) before parsing.",
    base=SOURCE_LABELS,
)
SOURCE_UP = _m(
    "kvwatch_source_up",
    "gauge",
    "1 when the source (log file or /metrics URL) was readable on the last attempt.",
    base=SOURCE_LABELS,
)
SCRAPE_DURATION = _m(
    "kvwatch_scrape_duration_seconds",
    "gauge",
    "Duration of the last /metrics scrape of the engine.",
    base=SOURCE_LABELS,
)
SCRAPE_ERRORS = _m(
    "kvwatch_scrape_errors", "counter", "Failed /metrics scrapes by reason.", "reason", base=SOURCE_LABELS
)
SERIES_DROPPED = _m(
    "kvwatch_metrics_series_dropped",
    "counter",
    "Series of the engine's /metrics that kvwatch reads, left out past the per-scrape cap (10,000).",
    base=SOURCE_LABELS,
)
UNUSABLE_VALUES = _m(
    "kvwatch_metrics_unusable_values",
    "counter",
    "Samples of the engine's /metrics that kvwatch reads, skipped for a value it cannot use "
    "(NaN, negative, not a number).",
    base=SOURCE_LABELS,
)
INSTANCES = _m("kvwatch_instances", "gauge", "Engine instances tracked.", base=())
INSTANCES_DROPPED = _m(
    "kvwatch_dropped_events", "counter", "Events dropped because the instance cap was reached.", base=()
)
VALUES_UNEXPORTED = _m(
    "kvwatch_values_unexported",
    "counter",
    "State values left out of a /metrics answer because no sample can hold them (never a failed scrape).",
    base=(),
)
HTTP_CONNECTIONS_OPEN = _m(
    "kvwatch_http_open_connections", "gauge", "Client connections open to kvwatch's HTTP port.", base=()
)
HTTP_CONNECTIONS_REFUSED = _m(
    "kvwatch_http_connections_refused",
    "counter",
    "Connections to kvwatch's HTTP port refused, or closed to make room, at a cap on open connections "
    "(in all, or per client address).",
    base=(),
)
HTTP_CONNECTION_TIMEOUTS = _m(
    "kvwatch_http_connection_timeouts",
    "counter",
    "Connections to kvwatch's HTTP port closed because a request or response did not complete in time.",
    base=(),
)
HTTP_AUTH_THROTTLED = _m(
    "kvwatch_http_auth_throttled",
    "counter",
    "Requests answered 429 without a password check: too many failed logins from that client just now.",
    base=(),
)
STATE_SAVE_ERRORS = _m(
    "kvwatch_state_save_errors",
    "counter",
    "Saves of the state file that failed (disk full, dir gone, read-only); the next save retries.",
    base=(),
)
STATE_FILE_INVALID = _m(
    "kvwatch_state_file_invalid",
    "counter",
    "State files found unusable at start and moved aside (kvwatch then started fresh).",
    base=(),
)
BUILD_INFO = _m(
    "kvwatch_build", "info", "kvwatch version and Python version.", "version", "python_version", base=()
)

NODE_CONTAINERS = _m(
    "kvwatch_node_containers",
    "gauge",
    "Containers node mode found under the log root, by state: followed (an engine's log), probing "
    "(no engine line yet), ignored (none in its first lines), gone (pod deleted, instances expiring).",
    "state",
    base=(),
)
NODE_CONTAINERS_DROPPED = _m(
    "kvwatch_node_containers_dropped",
    "counter",
    "Containers node mode found but did not follow because --max-containers were already followed.",
    base=(),
)

METRICS: tuple[Metric, ...] = tuple(v for v in globals().copy().values() if isinstance(v, Metric))


def with_workload(metric: Metric) -> Metric:
    """A per-instance metric with the engine pod's WORKLOAD_LABELS after its instance labels
    (node mode); any other metric as it is."""
    n = len(INSTANCE_LABELS)
    if metric.labels[:n] != INSTANCE_LABELS:
        return metric
    return Metric(
        metric.name, metric.type, metric.help, INSTANCE_LABELS + WORKLOAD_LABELS + metric.labels[n:]
    )


def by_sample_name() -> dict[str, Metric]:
    """Every series name that can appear in PromQL, mapped to its metric (incl. `_created` of counters)."""
    out: dict[str, Metric] = {}
    for metric in METRICS:
        out[metric.sample_name] = metric
        if metric.type == "counter":
            out[f"{metric.name}_created"] = metric
    return out


def markdown_table() -> str:
    """The README's metric table, generated so it cannot drift."""
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for metric in METRICS:
        labels = ", ".join(metric.labels) or "-"
        rows.append(f"| `{metric.sample_name}` | {metric.type} | {labels} | {metric.help} |")
    return "\n".join(rows)
