"""Selectors, thresholds and durations of the mixin, in one place (the kubernetes-mixin's config.libsonnet).

Each value says when to change it. After a change run ``kvwatch rules`` and ``kvwatch dashboards``
(``make generate``) and commit the regenerated files; tests/rules/*_test.yaml pins the defaults.
"""

from __future__ import annotations

# --- Aggregation keys ------------------------------------------------------------------------------
# Label names kvwatch exports (kvwatch/export/names.py): the served model and the engine kind.
MODEL = "model_name"
ENGINE_KIND = "engine_kind"
# A "fleet" is every rank serving one model with one engine in one namespace of one cluster. `cluster`
# and `namespace` are target labels (PodMonitor adds `namespace`; `cluster` is usually an external
# label); where a label is absent it is empty and groups still work. Ranks whose engine named no model
# (model_name="") belong to no fleet: unrelated engines would otherwise be summed and compared.
FLEET_LABELS: tuple[str, ...] = ("cluster", "namespace", MODEL, ENGINE_KIND)
# Sibling comparisons (KVPoolBelowSiblingReplicas) also need one card type: ranks are grouped by the
# GPU memory the engine logged, rounded to GiB, recorded into this label. A rank whose engine logged
# no total memory (a metrics-only source) is compared only with others that logged none.
CARD_LABEL = "gpu_memory_gib"
SIBLING_LABELS: tuple[str, ...] = (*FLEET_LABELS, CARD_LABEL)
# One replica: one engine server watched by one kvwatch (its ranks differ only in `dp_rank`).
REPLICA_LABELS: tuple[str, ...] = (*FLEET_LABELS, "job", "instance", "source")
# Target labels that identify a kvwatch sidecar, for joining per-source self-metrics.
TARGET_LABELS: tuple[str, ...] = ("job", "instance", "source")
# One engine rank seen by one kvwatch.
RANK_LABELS: tuple[str, ...] = (*TARGET_LABELS, "dp_rank")
# Prometheus jobs that scrape kvwatch (the PodMonitor relabels its job to `kvwatch`; name yours
# kvwatch-<something> and they still match).
KVWATCH_JOB = 'job=~"kvwatch.*"'
# Labels an inhibition compares: the same sidecar target (and, where the alert has one, rank).
INHIBIT_TARGET: tuple[str, ...] = ("cluster", "namespace", "instance")
INHIBIT_SOURCE: tuple[str, ...] = (*INHIBIT_TARGET, "source")
INHIBIT_RANK: tuple[str, ...] = (*INHIBIT_SOURCE, "dp_rank")

# --- Thresholds ------------------------------------------------------------------------------------
# Gap between the observed pool and kvwatch's prediction, by basis. `config` is the a-priori
# prediction (activation, non-torch and CUDA-graph terms are calibrated estimates), so it gets room;
# `engine_budget` redoes the engine's own division on the memory it logged and should match to a
# block, so anything past 2 % means the engine sized the pool differently than kvwatch thinks.
GAP_RATIO: dict[str, float] = {"config": 0.10, "engine_budget": 0.02}
# Where kvwatch exports the prediction's expected error (kvwatch_kv_pool_prediction_error_ratio, the
# a-priori model's band), the config-basis tolerance is this many times it, never under the floor;
# GAP_RATIO is then the fallback for a prediction without a band. The band is already an ~85 %
# out-of-sample interval (bench/accuracy_loso.py QUANTILE, widened per uncovered condition), so the
# multiple only needs room past it. `make accuracy` (2026-12-02), 66 real startups predicted out of
# sample: |gap| / band is at most 0.89 on 65 of them (95th percentile 0.85) and 2.78 on one, a
# Gemma-4 on an A100 whose vision-tower band the GB10 Gemma-4 startups narrow to 1.4 %. 1.5 pages
# that one healthy startup (1 of 66) and leaves 1.7x room over the others; its median tolerance is
# 10.5 % of the pool. 3.0 paged none but tolerated 21 % at the median -- a real gap of 10-20 % (8 GiB
# of an 80 GiB card held by another process) went unpaged; 1.0 pages the same one with 12 % room.
GAP_ERROR_MULTIPLE = 1.5
GAP_RATIO_FLOOR: dict[str, float] = {"config": 0.02}
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
# A log whose stats went stale counts as frozen only while it still grows within this window (stats
# stop on an idle engine, and so does its log). Keep it no longer than the sidecar's --fact-ttl
# (60 s): then the last stats line of an engine that just went idle has left the window by the time
# its facts go stale, and an idle engine never pages.
LOG_GROWTH_WINDOW = "1m"
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
    "KVWatchStale": "2m",
    "KVWatchTargetDown": "5m",
    "KVWatchAbsent": "15m",
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
