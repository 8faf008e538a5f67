"""The building blocks of kvwatch's Grafana dashboards: units, selectors, panels, variables.

The two dashboards (dashboard_kv_cache.py, dashboard_kv_fleet.py) are data -- a ``Board`` of
``Row``s of ``Panel``s -- and ``build`` here is the one place that turns that data into the SDK's
builders, so every panel of a kind is built alike and a spec is written once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import prometheus as prom
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


def rate(series: str) -> str:
    """Per-second rate over Grafana's scrape-aware interval."""
    return f"rate({series}[$__rate_interval])"


def increase(series: str) -> str:
    """Increase over Grafana's scrape-aware interval (counts of rare events: restarts, failures)."""
    return f"increase({series}[$__rate_interval])"


# --- Panels as data -------------------------------------------------------------------------------

# Threshold steps (value, colour), lowest first; value None is the base step.
Steps = tuple[tuple[float | None, str], ...]
# (PromQL expression, legend format) of one query.
Query = tuple[str, str]
Kind = Literal["timeseries", "stat", "table", "bargauge"]

GREEN_ONLY: Steps = ((None, "green"),)
# Shared by the panels that colour the same figure (a stat and its time series, on both dashboards).
USAGE_STEPS: Steps = ((None, "green"), (0.9, "orange"), (0.98, "red"))
HEADROOM_STEPS: Steps = ((None, "red"), (config.HEADROOM_REQUESTS_MIN, "green"))
# A 0/1 health series: red at 0, green at 1.
UP_STEPS: Steps = ((None, "red"), (1, "green"))


def _gap_steps() -> Steps:
    """Both tolerance bands of the drift alert (config ±10 %, engine_budget ±2 %), below and above 0:
    green inside the tight band, orange inside the loose one, red outside both."""
    tight, loose = sorted(config.GAP_RATIO.values())
    return ((None, "red"), (-loose, "orange"), (-tight, "green"), (tight, "orange"), (loose, "red"))


GAP_STEPS = _gap_steps()
# How the gap panels of both dashboards read (their descriptions end with it).
GAP_READING = (
    "negative: a smaller pool than predicted. Dashed lines: the drift alert's tolerances, "
    "±2 % (engine_budget) and ±10 % (config)."
)

# Grid size (width in 24ths, height in rows) of each kind unless a panel says otherwise.
_SIZE: dict[Kind, tuple[int, int]] = {
    "timeseries": (12, 8),
    "stat": (4, 4),
    "table": (12, 8),
    "bargauge": (12, 8),
}
_TIMESERIES_ONLY = ("stacked", "bars", "signed")


@dataclass(frozen=True)
class Panel:
    """One panel as data; ``build_panel`` turns it into the SDK builder of its kind.

    ``thresholds`` colour a stat, and on a time series also draw as dashed lines; ``axis_min`` and
    ``axis_max`` bound the axis (unsigned ratios start at 0 anyway); ``hide`` names a table's
    columns to drop.
    """

    kind: Kind
    title: str
    description: str
    unit: str
    queries: tuple[Query, ...]
    thresholds: Steps | None = None
    width: int | None = None
    height: int | None = None
    decimals: float | None = None
    axis_min: float | None = None
    axis_max: float | None = None
    stacked: bool = False
    bars: bool = False
    signed: bool = False
    hide: tuple[str, ...] = ("Time", "__name__")

    def __post_init__(self) -> None:
        # An option the kind's builder would ignore is a mistake in the spec, not a silent no-op.
        if self.kind != "timeseries" and any(getattr(self, name) for name in _TIMESERIES_ONLY):
            raise ValueError(f"{self.title}: {', '.join(_TIMESERIES_ONLY)} apply to time series only")
        if self.kind == "table" and self.thresholds is not None:
            raise ValueError(f"{self.title}: a table takes no thresholds")


@dataclass(frozen=True)
class Row:
    """A collapsible row title and the panels under it, left to right, top to bottom."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    """A label_values template variable (see ``variable``)."""

    name: str
    label: str
    query: str


@dataclass(frozen=True)
class Annotation:
    """An annotation drawn where ``expr`` is non-empty."""

    name: str
    expr: str
    color: str


@dataclass(frozen=True)
class Board:
    """One dashboard as data: ``build`` gives ids in order (each row, then its panels)."""

    title: str
    uid: str
    description: str
    variables: tuple[Variable, ...]
    annotations: tuple[Annotation, ...]
    rows: tuple[Row, ...]


def steps(*steps: tuple[float | None, str]) -> dash.ThresholdsConfig:
    return (
        dash.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


def _axis_min(spec: Panel) -> float | None:
    """The axis floor: the spec's own, else 0 for a time series of an unsigned ratio."""
    if spec.axis_min is not None:
        return spec.axis_min
    if spec.kind == "timeseries" and spec.unit == PERCENT and not spec.signed:
        return 0
    return None


def _common(panel: Any, panel_id: int, spec: Panel) -> Any:
    """What every kind sets the same way: id, texts, datasource, unit, size, axis bounds, queries."""
    width, height = _SIZE[spec.kind]
    panel = (
        panel.id(panel_id)
        .title(spec.title)
        .description(spec.description)
        .datasource(DATASOURCE)
        .unit(spec.unit)
        .span(spec.width or width)
        .height(spec.height or height)
    )
    if spec.decimals is not None:
        panel = panel.decimals(spec.decimals)
    axis_min = _axis_min(spec)
    if axis_min is not None:
        panel = panel.min(axis_min)
    if spec.axis_max is not None:
        panel = panel.max(spec.axis_max)
    instant = spec.kind == "table"
    for i, (expr, legend) in enumerate(spec.queries):
        panel = panel.with_target(query(expr, legend, ref=chr(ord("A") + i), instant=instant))
    return panel


def _timeseries(spec: Panel) -> timeseries.Panel:
    """A time series with a table legend (mean, max, last); thresholds also drawn as dashed lines."""
    panel = (
        timeseries.Panel()
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "max", "lastNotNull"])
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
        .fill_opacity(10)
        .thresholds(steps(*(spec.thresholds or GREEN_ONLY)))
    )
    if spec.thresholds is not None:
        panel = panel.thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphTresholdsStyleMode.DASHED)
        )
    if spec.stacked:
        panel = panel.stacking(
            common_builders.StackingConfig().mode(common.StackingMode.NORMAL)
        ).fill_opacity(60)
    if spec.bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS).fill_opacity(80)
    return panel


def _stat(spec: Panel) -> stat.Panel:
    """A single-value panel showing the last value of each series."""
    return (
        stat.Panel()
        .thresholds(steps(*(spec.thresholds or GREEN_ONLY)))
        .color_mode(common.BigValueColorMode.VALUE)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .no_value("no data")
    )


def _table(spec: Panel) -> table.Panel:
    """An instant-query table: one row per series, labels as columns, `Value` in the panel's unit."""
    return (
        table.Panel()
        .no_value("none")
        .show_header(True)
        .with_transformation(
            model.DataTransformerConfig(
                id_val="organize", options={"excludeByName": {name: True for name in spec.hide}}
            )
        )
    )


def _bargauge(spec: Panel) -> bargauge.Panel:
    """Horizontal bars of each series' last value."""
    return (
        bargauge.Panel()
        .orientation(common.VizOrientation.HORIZONTAL)
        .display_mode(common.BarGaugeDisplayMode.BASIC)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .thresholds(steps(*(spec.thresholds or GREEN_ONLY)))
    )


_KINDS: dict[Kind, Callable[[Panel], cogbuilder.Builder[model.Panel]]] = {
    "timeseries": _timeseries,
    "stat": _stat,
    "table": _table,
    "bargauge": _bargauge,
}


def build_panel(spec: Panel, panel_id: int) -> cogbuilder.Builder[model.Panel]:
    """The SDK builder of one panel spec."""
    built: cogbuilder.Builder[model.Panel] = _common(_KINDS[spec.kind](spec), panel_id, spec)
    return built


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


def annotation(name: str, expr: str, color: str) -> dash.AnnotationQuery:
    return dash.AnnotationQuery().name(name).datasource(DATASOURCE).enable(True).icon_color(color).expr(expr)


def build(spec: Board) -> dash.Dashboard:
    """The SDK dashboard of one spec: header, variables, annotations, then each row and its panels."""
    board = base(spec.title, spec.uid, spec.description).with_variable(datasource_variable())
    for var in spec.variables:
        board = board.with_variable(variable(var.name, var.label, var.query))
    for note in spec.annotations:
        board = board.annotation(annotation(note.name, note.expr, note.color))
    ids = Ids()
    for row in spec.rows:
        board = board.with_row(dash.Row(row.title).id(ids()))
        for panel in row.panels:
            board = board.with_panel(build_panel(panel, ids()))
    return board
