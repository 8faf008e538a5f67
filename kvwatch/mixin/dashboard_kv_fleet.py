"""The "KV fleet" dashboard: every model across pods -- totals, the limiting rank, ranks that drift
or shrink -- from the recording rules of kvwatch.mixin.rules.

Pure data (``KV_FLEET``): ``panels.build`` turns it into the Grafana dashboard.
"""

from __future__ import annotations

from kvwatch.export import names
from kvwatch.mixin import config, rules
from kvwatch.mixin.panels import (
    COUNT,
    FLEET,
    FLEET_LEGEND,
    GAP_READING,
    GAP_STEPS,
    HEADROOM_STEPS,
    KV_FLEET_UID,
    OPS,
    PERCENT,
    RANK_LEGEND,
    REQUESTS,
    TOKENS,
    USAGE_STEPS,
    Annotation,
    Board,
    Panel,
    Row,
    Variable,
    sel,
)

_F = FLEET
_RANK = "{{model_name}} " + RANK_LEGEND


def _drifting() -> str:
    """Ranks past the drift alert's tolerance on either basis (the alert's own condition)."""
    parts = []
    for basis, limit in config.GAP_RATIO.items():
        gap = sel(names.KV_POOL_GAP_RATIO, _F, f'basis="{basis}"')
        parts.append(f"({gap} > {limit:g} or {gap} < -{limit:g})")
    return "\nor\n".join(parts)


_POOL = sel(names.KV_POOL_TOKENS, _F)
_SHRUNK = f"{_POOL}\n/\n(max_over_time({_POOL}[{config.SHRINK_LOOKBACK}]) > 0)\n< {1 - config.SHRINK_RATIO:g}"
_RELATIVE_TO_MEDIAN = (
    f"{sel(rules.RANK_POOL_BY_CARD, _F)}\n/ on ({', '.join(config.SIBLING_LABELS)}) group_left()\n"
    f"({sel(rules.SIBLING_POOL_MEDIAN, _F)} > 0)"
)

_VARIABLES = (
    Variable("cluster", "Cluster", f"label_values({rules.FLEET_POOL}, cluster)"),
    Variable("namespace", "Namespace", f'label_values({rules.FLEET_POOL}{{cluster=~"$cluster"}}, namespace)'),
    Variable(
        "model",
        "Model",
        f'label_values({rules.FLEET_POOL}{{cluster=~"$cluster", namespace=~"$namespace"}}, {config.MODEL})',
    ),
)

_ANNOTATIONS = (
    Annotation(
        "Engine restarts", f"sum by ({config.MODEL}) (increase({sel(names.RESTARTS, _F)}[2m])) > 0", "orange"
    ),
)

_NOW = (
    Panel(
        "stat",
        "Total KV pool",
        "Tokens of KV cache across every rank of the selected models.",
        TOKENS,
        ((f"sum({sel(rules.FLEET_POOL, _F)})", ""),),
        decimals=0,
    ),
    Panel(
        "stat",
        "Total headroom",
        "Free tokens across every rank.",
        TOKENS,
        ((f"sum({sel(rules.FLEET_HEADROOM_TOKENS, _F)})", ""),),
        decimals=0,
    ),
    Panel(
        "stat",
        "Fleet KV usage",
        "Tokens used over tokens allocated, across the fleet.",
        PERCENT,
        ((f"sum({sel(rules.FLEET_USED, _F)}) / (sum({sel(rules.FLEET_POOL, _F)}) > 0)", ""),),
        thresholds=USAGE_STEPS,
        decimals=1,
    ),
    Panel(
        "stat",
        "Limiting rank headroom",
        "Requests of max_model_len the fullest rank still holds: the fleet's real margin.",
        REQUESTS,
        ((f"min({sel(rules.LIMITING_HEADROOM_REQUESTS, _F)})", ""),),
        thresholds=HEADROOM_STEPS,
        decimals=2,
    ),
    Panel(
        "stat",
        "Ranks",
        "Engine instances (pod x DP rank) reporting a pool.",
        COUNT,
        ((f"sum({sel(rules.FLEET_RANKS, _F)})", ""),),
        decimals=0,
    ),
    Panel(
        "stat",
        "Preemptions",
        "Requests evicted from the KV cache per second, fleet-wide.",
        OPS,
        ((f"sum({sel(rules.FLEET_PREEMPTIONS, _F)})", ""),),
        thresholds=((None, "green"), (config.PREEMPTION_RATE, "orange")),
    ),
)

_CAPACITY = (
    Panel(
        "timeseries",
        "Total KV pool by model",
        "Sum of the pools of every rank serving the model.",
        TOKENS,
        ((sel(rules.FLEET_POOL, _F), FLEET_LEGEND),),
    ),
    Panel(
        "timeseries",
        "Total headroom by model",
        "Free tokens across every rank serving the model.",
        TOKENS,
        ((sel(rules.FLEET_HEADROOM_TOKENS, _F), FLEET_LEGEND),),
    ),
    Panel(
        "timeseries",
        "Headroom in requests: fleet total and limiting rank",
        "Requests of max_model_len the free pools hold in total, and on the fullest rank. A long "
        "request lands on one rank, so the limiting rank is the margin that matters.",
        REQUESTS,
        (
            (sel(rules.FLEET_HEADROOM_REQUESTS, _F), "total " + FLEET_LEGEND),
            (sel(rules.LIMITING_HEADROOM_REQUESTS, _F), "limiting rank " + FLEET_LEGEND),
        ),
        thresholds=HEADROOM_STEPS,
        axis_min=0,
    ),
    Panel(
        "timeseries",
        "Fleet KV usage by model",
        "Tokens used over tokens allocated, per model.",
        PERCENT,
        ((sel(rules.FLEET_USAGE, _F), FLEET_LEGEND),),
        thresholds=USAGE_STEPS,
        axis_max=1,
    ),
    Panel(
        "timeseries",
        "Running and waiting requests by model",
        "Requests running and queued across the model's ranks.",
        COUNT,
        (
            (sel(rules.FLEET_RUNNING, _F), "running " + FLEET_LEGEND),
            (sel(rules.FLEET_WAITING, _F), "waiting " + FLEET_LEGEND),
        ),
    ),
    Panel(
        "timeseries",
        "Preemptions by model",
        "Requests evicted from the KV cache per second (5m rate), per model.",
        OPS,
        ((sel(rules.FLEET_PREEMPTIONS, _F), FLEET_LEGEND),),
    ),
)

_LIMITING_RANK = (
    Panel(
        "table",
        "Limiting rank per model",
        "The rank with the least headroom (requests of max_model_len) in each model's fleet.",
        REQUESTS,
        ((sel(rules.LIMITING_RANK, _F), ""),),
    ),
    Panel(
        "timeseries",
        "Headroom of every rank",
        "Requests of max_model_len each rank's free pool holds.",
        REQUESTS,
        ((sel(names.KV_HEADROOM_REQUESTS, _F), _RANK),),
        thresholds=HEADROOM_STEPS,
        axis_min=0,
    ),
)

_DRIFT = (
    Panel(
        "table",
        "Ranks drifting from prediction",
        "Ranks whose pool is off kvwatch's prediction past the drift alert's tolerance "
        "(Value: observed / predicted - 1).",
        PERCENT,
        ((_drifting(), ""),),
    ),
    Panel(
        "timeseries",
        "Gap to prediction of every rank (config basis)",
        "Observed / predicted - 1 for each rank; " + GAP_READING,
        PERCENT,
        ((sel(names.KV_POOL_GAP_RATIO, _F, 'basis="config"'), _RANK),),
        thresholds=GAP_STEPS,
        signed=True,
    ),
    Panel(
        "table",
        "Ranks whose pool shrank",
        f"Ranks whose pool is below {1 - config.SHRINK_RATIO:.0%} of the largest it had in the last "
        f"{config.SHRINK_LOOKBACK} (Value: now / largest).",
        PERCENT,
        ((_SHRUNK, ""),),
    ),
    Panel(
        "table",
        "Ranks below their sibling replicas",
        f"Ranks whose pool is below {1 - config.SIBLING_RATIO:.0%} of the median pool of the replicas "
        "serving the same model (Value: pool / median).",
        PERCENT,
        ((f"{_RELATIVE_TO_MEDIAN}\n< {1 - config.SIBLING_RATIO:g}", ""),),
    ),
    Panel(
        "timeseries",
        "Pool relative to the fleet median",
        "Each rank's pool over the median pool of its model's fleet; 100 % is a typical replica.",
        PERCENT,
        ((_RELATIVE_TO_MEDIAN, _RANK),),
        width=24,
    ),
)

KV_FLEET = Board(
    title="kvwatch / KV fleet",
    uid=KV_FLEET_UID,
    description="KV-cache capacity of every model across pods: totals, the limiting rank, and the ranks whose "
    "pool drifts from prediction or shrank.",
    variables=_VARIABLES,
    annotations=_ANNOTATIONS,
    rows=(
        Row("Fleet now", _NOW),
        Row("Capacity by model", _CAPACITY),
        Row("Limiting rank", _LIMITING_RANK),
        Row("Drift and shrink", _DRIFT),
    ),
)
