"""The building blocks of kvwatch's Grafana dashboards: units, selectors, panels, variables.

Shared by the two dashboards (dashboard_kv_cache.py, dashboard_kv_fleet.py) so both read alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom
from grafana_foundation_sdk.builders import stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as prom_model

from kvwatch.export import names
from kvwatch.mixin import config

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
INSTANCE = f'job=~"$job", namespace=~"$namespace", pod=~"$pod", source=~"$source", {config.MODEL}=~"$model"'
SOURCE = 'job=~"$job", namespace=~"$namespace", pod=~"$pod", source=~"$source"'
TARGET = 'job=~"$job", namespace=~"$namespace", pod=~"$pod"'
# The engine's own series: scraped by their own job (the PodMonitor's `http` endpoint), so not $job.
ENGINE = f'namespace=~"$namespace", pod=~"$pod", {config.MODEL}=~"$model"'
FLEET = f'cluster=~"$cluster", namespace=~"$namespace", {config.MODEL}=~"$model"'
RANK_LEGEND = "{{source}} r{{dp_rank}} {{pod}}"
FLEET_LEGEND = "{{model_name}} ({{engine_kind}}) {{namespace}}"


def sel(metric: names.Metric | str, matchers: str, extra: str = "") -> str:
    """``metric{matchers, extra}`` for a names.py metric (its PromQL series name) or a recorded series."""
    name = metric.sample_name if isinstance(metric, names.Metric) else metric
    inner = f"{matchers}, {extra}" if extra else matchers
    return f"{name}{{{inner}}}"


class Ids:
    """Hands out panel ids in build order, so ids are stable across runs."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self) -> int:
        self._next += 1
        return self._next


def query(expr: str, legend: str, ref: str = "A", instant: bool = False) -> prom.Dataquery:
    q = prom.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    if instant:
        q = q.instant().format(prom_model.PromQueryFormat.TABLE)
    return q


def targets(panel: Any, queries: Sequence[tuple[str, str]], instant: bool = False) -> Any:
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(query(expr, legend, ref=chr(ord("A") + i), instant=instant))
    return panel


def steps(*steps: tuple[float | None, str]) -> dash.ThresholdsConfig:
    return (
        dash.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


GREEN_ONLY = steps((None, "green"))


def timeseries_panel(
    ids: Ids,
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
        .thresholds(thresholds or GREEN_ONLY)
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
    result: timeseries.Panel = targets(panel, queries)
    return result


def gap_thresholds() -> dash.ThresholdsConfig:
    """Both tolerance bands of the drift alert (config ±10 %, engine_budget ±2 %), below and above 0:
    green inside the tight band, orange inside the loose one, red outside both."""
    tight, loose = sorted(config.GAP_RATIO.values())
    return steps((None, "red"), (-loose, "orange"), (-tight, "green"), (tight, "orange"), (loose, "red"))


def stat_panel(
    ids: Ids,
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
        .thresholds(thresholds or GREEN_ONLY)
        .color_mode(common.BigValueColorMode.VALUE)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .no_value("no data")
    )
    if decimals is not None:
        panel = panel.decimals(decimals)
    result: stat.Panel = targets(panel, queries)
    return result


def table_panel(
    ids: Ids,
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
    result: table.Panel = targets(panel, queries, instant=True)
    return result


def variable(name: str, label: str, query: str) -> dash.QueryVariable:
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


def datasource_variable() -> dash.DatasourceVariable:
    return dash.DatasourceVariable("datasource").id("datasource").label("Data source").type("prometheus")


def base(title: str, uid: str, description: str) -> dash.Dashboard:
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


def with_panels(board: dash.Dashboard, panels: Sequence[cogbuilder.Builder[model.Panel]]) -> dash.Dashboard:
    for panel in panels:
        board = board.with_panel(panel)
    return board


def annotation(name: str, expr: str, color: str) -> dash.AnnotationQuery:
    return dash.AnnotationQuery().name(name).datasource(DATASOURCE).enable(True).icon_color(color).expr(expr)
