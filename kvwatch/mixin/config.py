"""Selectors, thresholds and durations of the mixin, in one place (the kubernetes-mixin's config.libsonnet).

Each value says when to change it. After a change run ``kvwatch rules`` and ``kvwatch dashboards``
(``make generate``) and commit the regenerated files; tests/rules/*_test.yaml pins the defaults.
"""

from __future__ import annotations

# --- Aggregation keys ------------------------------------------------------------------------------
# A "fleet" is every rank serving one model with one engine in one namespace of one cluster. `cluster`
# and `namespace` are target labels (PodMonitor adds `namespace`; `cluster` is usually an external
# label); where a label is absent it is empty and groups still work. Add a label here (e.g. `gpu`)
# when one fleet mixes GPU types, or sibling comparisons will flag the smaller cards.
FLEET_LABELS: tuple[str, ...] = ("cluster", "namespace", "model", "engine")
# One replica: one engine server watched by one kvwatch (its ranks differ only in `dp_rank`).
REPLICA_LABELS: tuple[str, ...] = (*FLEET_LABELS, "job", "instance", "source")
# Target labels that identify a kvwatch sidecar, for joining per-source self-metrics.
TARGET_LABELS: tuple[str, ...] = ("job", "instance", "source")

# --- Thresholds ------------------------------------------------------------------------------------
# Gap between the observed pool and kvwatch's prediction, by basis. `config` is the a-priori
# prediction (activation, non-torch and CUDA-graph terms are calibrated estimates), so it gets room;
# `engine_budget` redoes the engine's own division on the memory it logged and should match to a
# block, so anything past 2 % means the engine sized the pool differently than kvwatch thinks.
GAP_RATIO: dict[str, float] = {"config": 0.10, "engine_budget": 0.02}
# vLLM's usage is block-granular and runs high under load by design; only a sustained 95 % matters.
USAGE_RATIO_FULL = 0.95
# Requests of max_model_len the free pool must still hold; below this a long request waits or preempts.
HEADROOM_REQUESTS_MIN = 1.0
# Preemptions (vLLM) or retractions (SGLang) per second, averaged over PREEMPTION_WINDOW: 0.01/s is
# six evictions in ten minutes, past what a right-sized pool does under bursts.
PREEMPTION_RATE = 0.01
PREEMPTION_WINDOW = "10m"
# A pool this much smaller than the largest one the same series had within SHRINK_LOOKBACK means an
# engine restart came back smaller (new version, another process on the GPU, changed flags).
SHRINK_RATIO = 0.05
SHRINK_LOOKBACK = "1d"
# A replica or rank this much below its siblings (median of the fleet / largest rank of the replica).
SIBLING_RATIO = 0.10
# Startup failures are looked for in this window (the alert stays active this long after one).
STARTUP_FAILURE_WINDOW = "15m"
# The sidecar scrapes the engine every 5 s by default; five minutes without a fact from /metrics
# while the source is up means kvwatch reads the endpoint but recognises nothing in it.
STALE_SECONDS = 300
PARSE_ERROR_WINDOW = "15m"

# --- Alert durations (`for:`) ----------------------------------------------------------------------
FOR: dict[str, str] = {
    "KVPoolDriftsFromPrediction": "15m",
    "KVCacheNearlyFull": "15m",
    "KVHeadroomBelowOneRequest": "10m",
    "KVPreemptionsRising": "10m",
    "KVEngineStartupFailed": "1m",
    "KVPoolShrankSinceLastStart": "5m",
    "KVPoolBelowSiblingReplicas": "15m",
    "KVRankBelowSiblings": "15m",
    "KVWatchSourceDown": "5m",
    "KVWatchStale": "5m",
    "KVWatchParseErrors": "15m",
    "KVPredictionUnavailable": "30m",
}

# --- Links -----------------------------------------------------------------------------------------
# Where docs/runbook.md is published; alerts link to RUNBOOK_URL#<alertname in lower case>.
# Point it at your own copy with `kvwatch rules --runbook-url URL` if you mirror the runbook.
RUNBOOK_URL = "https://github.com/kvwatch/kvwatch/blob/main/docs/runbook.md"

# --- Dashboards ------------------------------------------------------------------------------------
DASHBOARD_TAGS: tuple[str, ...] = ("kvwatch", "kv-cache", "llm-serving")
DASHBOARD_REFRESH = "30s"
DASHBOARD_TIME_FROM = "now-6h"
