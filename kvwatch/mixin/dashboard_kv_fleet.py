"""The "KV fleet" dashboard: every model across pods -- totals, the limiting rank, ranks that drift
or shrink -- from the recording rules of kvwatch.mixin.rules."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as dash

from kvwatch.export import names
from kvwatch.mixin import config, rules
from kvwatch.mixin.panels import (
    COUNT,
    FLEET,
    FLEET_LEGEND,
    KV_FLEET_UID,
    OPS,
    PERCENT,
    RANK_LEGEND,
    REQUESTS,
    TOKENS,
    Ids,
    annotation,
    base,
    datasource_variable,
    gap_thresholds,
    sel,
    stat_panel,
    steps,
    table_panel,
    timeseries_panel,
    variable,
    with_panels,
)


def kv_fleet() -> dash.Dashboard:
    """The fleet dashboard: every model across pods, from the recording rules."""
    ids = Ids()
    f = FLEET
    fleet_pool = rules.FLEET_POOL
    headroom_steps = steps((None, "red"), (config.HEADROOM_REQUESTS_MIN, "green"))
    usage_steps = steps((None, "green"), (0.9, "orange"), (0.98, "red"))
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
        base(
            "kvwatch / KV fleet",
            KV_FLEET_UID,
            "KV-cache capacity of every model across pods: totals, the limiting rank, and the ranks whose "
            "pool drifts from prediction or shrank.",
        )
        .with_variable(datasource_variable())
        .with_variable(variable("cluster", "Cluster", f"label_values({fleet_pool}, cluster)"))
        .with_variable(
            variable(
                "namespace", "Namespace", f'label_values({fleet_pool}{{cluster=~"$cluster"}}, namespace)'
            )
        )
        .with_variable(
            variable(
                "model",
                "Model",
                f'label_values({fleet_pool}{{cluster=~"$cluster", namespace=~"$namespace"}}, {config.MODEL})',
            )
        )
        .annotation(
            annotation(
                "Engine restarts",
                f"sum by ({config.MODEL}) (increase({sel(names.RESTARTS, f)}[2m])) > 0",
                "orange",
            )
        )
    )

    board = board.with_row(dash.Row("Fleet now").id(ids()))
    board = with_panels(
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
                thresholds=steps((None, "green"), (config.PREEMPTION_RATE, "orange")),
            ),
        ],
    )

    board = board.with_row(dash.Row("Capacity by model").id(ids()))
    board = with_panels(
        board,
        [
            timeseries_panel(
                ids,
                "Total KV pool by model",
                "Sum of the pools of every rank serving the model.",
                TOKENS,
                [(sel(rules.FLEET_POOL, f), FLEET_LEGEND)],
            ),
            timeseries_panel(
                ids,
                "Total headroom by model",
                "Free tokens across every rank serving the model.",
                TOKENS,
                [(sel(rules.FLEET_HEADROOM_TOKENS, f), FLEET_LEGEND)],
            ),
            timeseries_panel(
                ids,
                "Headroom in requests: fleet total and limiting rank",
                "Requests of max_model_len the free pools hold in total, and on the fullest rank. A long "
                "request lands on one rank, so the limiting rank is the margin that matters.",
                REQUESTS,
                [
                    (sel(rules.FLEET_HEADROOM_REQUESTS, f), "total " + FLEET_LEGEND),
                    (sel(rules.LIMITING_HEADROOM_REQUESTS, f), "limiting rank " + FLEET_LEGEND),
                ],
                thresholds=headroom_steps,
            ).min(0),
            timeseries_panel(
                ids,
                "Fleet KV usage by model",
                "Tokens used over tokens allocated, per model.",
                PERCENT,
                [(sel(rules.FLEET_USAGE, f), FLEET_LEGEND)],
                thresholds=usage_steps,
            ).max(1),
            timeseries_panel(
                ids,
                "Running and waiting requests by model",
                "Requests running and queued across the model's ranks.",
                COUNT,
                [
                    (sel(rules.FLEET_RUNNING, f), "running " + FLEET_LEGEND),
                    (sel(rules.FLEET_WAITING, f), "waiting " + FLEET_LEGEND),
                ],
            ),
            timeseries_panel(
                ids,
                "Preemptions by model",
                "Requests evicted from the KV cache per second (5m rate), per model.",
                OPS,
                [(sel(rules.FLEET_PREEMPTIONS, f), FLEET_LEGEND)],
            ),
        ],
    )

    board = board.with_row(dash.Row("Limiting rank").id(ids()))
    board = with_panels(
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
                [(sel(names.KV_HEADROOM_REQUESTS, f), "{{model_name}} " + RANK_LEGEND)],
                thresholds=headroom_steps,
            ).min(0),
        ],
    )

    board = board.with_row(dash.Row("Drift and shrink").id(ids()))
    board = with_panels(
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
                [(sel(names.KV_POOL_GAP_RATIO, f, 'basis="config"'), "{{model_name}} " + RANK_LEGEND)],
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
                [(relative_to_median, "{{model_name}} " + RANK_LEGEND)],
                width=24,
            ),
        ],
    )
    return board
