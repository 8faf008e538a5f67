"""Every bounded label value kvwatch exports, each set one ``Literal``.

The metric table (``kvwatch.export.names``) exports exactly these values (its tuples are
``get_args`` of them), the events and predictions are typed with them, so a new value is added
here once and is then both accepted by the types and exported (tests/test_layout.py checks that
the collector's families carry no other value).
"""

from __future__ import annotations

from typing import Literal, get_args

# basis of kvwatch_kv_pool_predicted_* and the gap: a priori from config.json, or rebuilt from the
# engine's own logged memory terms.
PredictionBasis = Literal["config", "engine_budget"]
# basis of kvwatch_max_concurrency_requests: the engine's own figure, or one of kvwatch's.
ConcurrencyBasis = Literal["observed", "config", "engine_budget"]
# term of kvwatch_memory_bytes, in the order a budget is subtracted.
MemoryTerm = Literal["total", "usable", "weights", "activation", "non_torch", "cuda_graphs", "kv"]
MemoryBasis = Literal["observed", "predicted"]
# reason of kvwatch_startup_failures_total.
FailureReason = Literal[
    "max_model_len_too_large",
    "no_memory_for_cache",
    "negative_kv_budget",
    "not_enough_memory",
    # vLLM V1 from 0.9.1: less free memory at start than utilisation x total (other processes)
    "free_memory_below_utilization",
]
# state of kvwatch_prediction_available.
PredictionState = Literal[
    "ok",
    "no_model_config",
    "bad_model_config",
    "unsupported_model",
    # something in the config kvwatch has no rule for (named in the reason; never sized as zero)
    "unmodelled",
    "no_gpu_memory",
]
# reason of kvwatch_scrape_errors_total.
ScrapeErrorReason = Literal["timeout", "connection", "http_status", "too_large", "decode", "parse"]
# state of kvwatch_node_containers.
NodeContainerState = Literal["followed", "probing", "ignored", "gone"]
# origin of kvwatch_last_update_timestamp_seconds and kvwatch_facts_stale: where an event came from
# (a log line or a /metrics scrape), and the kind of a source in the self-metrics.
Origin = Literal["log", "metrics"]
# severity of the shipped alerting rules, which deploy/alertmanager routes (page, queue, drop).
Severity = Literal["critical", "warning", "info"]

PREDICTION_BASES: tuple[PredictionBasis, ...] = get_args(PredictionBasis)
CONCURRENCY_BASES: tuple[ConcurrencyBasis, ...] = get_args(ConcurrencyBasis)
MEMORY_TERMS: tuple[MemoryTerm, ...] = get_args(MemoryTerm)
MEMORY_BASES: tuple[MemoryBasis, ...] = get_args(MemoryBasis)
FAILURE_REASONS: tuple[FailureReason, ...] = get_args(FailureReason)
PREDICTION_STATES: tuple[PredictionState, ...] = get_args(PredictionState)
SCRAPE_ERROR_REASONS: tuple[ScrapeErrorReason, ...] = get_args(ScrapeErrorReason)
NODE_CONTAINER_STATES: tuple[NodeContainerState, ...] = get_args(NodeContainerState)
ORIGINS: tuple[Origin, ...] = get_args(Origin)
SEVERITIES: tuple[Severity, ...] = get_args(Severity)
