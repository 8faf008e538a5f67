"""The Prometheus text exposition (format 0.0.4) of one scrape, rendered without prometheus_client.

``Rows`` holds a scrape's samples grouped by metric, each with its text line rendered once when it is
added (the collector caches an instance's rows between scrapes, and each series' ``series_prefix``,
so a new value costs two concatenations), so ``Rows.text`` is a join in
``kvwatch.export.names.METRICS`` order. ``Rows.families`` gives the same samples as prometheus_client families
(the registry path: OpenMetrics negotiation, tests). tests/test_exposition.py holds ``text`` byte
for byte equal to prometheus_client's ``generate_latest`` over ``families``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import cast

from prometheus_client import utils as _prom_utils
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from kvwatch.export import names

# One sample: (metric name, label values in the metric's label order, value, its exposition line).
Row = tuple[str, tuple[str, ...], float, str]
# Samples grouped by metric name (Rows.groups), in any order: text() and families() go by names.METRICS.
Groups = tuple[tuple[str, list[Row]], ...]
_text_of = operator.itemgetter(3)


# prometheus_client's own float formatting (Go-style: +Inf, 1e+21), so both output paths agree.
_float_text = cast(Callable[[float], str], _prom_utils.floatToGoString)


def escape(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def _template(metric: names.Metric) -> str:
    """'name{a="{1}",b="{0}"} ' for str.format: labels sorted by name, as the text format lists them."""
    if not metric.labels:
        return metric.sample_name + " "
    order = sorted(range(len(metric.labels)), key=lambda i: metric.labels[i])
    pairs = ",".join(f'{metric.labels[i]}="{{{i}}}"' for i in order)
    return f"{metric.sample_name}{{{{{pairs}}}}} "


# Per metric, one look-up: its template, its own label count, and its template with the engine
# pod's labels too (node mode's per-instance rows, names.with_workload: a row with more label values
# than its metric's own labels is one of those).
_ENTRIES = {m.name: (_template(m), len(m.labels), _template(names.with_workload(m))) for m in names.METRICS}
_FLOATS: dict[float, str] = {}


def _float(value: float) -> str:
    if value == 0:
        # 0.0 and -0.0 are one key of the cache but two texts: the sign says which (most of a
        # scrape's values are a zero, so this answer costs no call).
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    text = _FLOATS.get(value)
    if text is None:
        if len(_FLOATS) > 4096:
            _FLOATS.clear()
        text = _FLOATS[value] = _float_text(value)
    return text


def series_prefix(metric: names.Metric, escaped: Sequence[str]) -> str:
    """'name{labels} ' of one series (label values already escaped): its line is this, the value's
    text and a newline, so a caller that keeps it renders a new value with two concatenations."""
    plain, count, workload = _ENTRIES[metric.name]
    return (plain if len(escaped) == count else workload).format(*escaped)


def _label_names(metric: names.Metric, values: tuple[str, ...]) -> tuple[str, ...]:
    """The label names of one row: its metric's, or with the workload labels (node mode)."""
    return metric.labels if len(values) == len(metric.labels) else names.with_workload(metric).labels


class Rows:
    """Samples of one scrape, grouped by metric (output in names.METRICS order)."""

    def __init__(self) -> None:
        # Filled as samples come (an instance's rows touch a few metrics of the ~75).
        self.by_metric: dict[str, list[Row]] = {}

    def add(
        self,
        metric: names.Metric,
        labels: tuple[str, ...],
        value: float,
        escaped: Sequence[str] | None = None,
    ) -> None:
        """One sample; ``escaped`` are the label values escaped for the text format, when the caller has them."""
        prefix = series_prefix(metric, escaped if escaped is not None else [escape(v) for v in labels])
        row = (metric.name, labels, value, prefix + _float(value) + "\n")
        rows = self.by_metric.get(metric.name)
        if rows is None:
            self.by_metric[metric.name] = [row]
        else:
            rows.append(row)

    def add_series(self, name: str, labels: tuple[str, ...], prefix: str, value: float) -> None:
        """One sample of a series whose ``series_prefix`` the caller kept (``name`` is its metric's)."""
        row = (name, labels, value, prefix + _float(value) + "\n")
        rows = self.by_metric.get(name)
        if rows is None:
            self.by_metric[name] = [row]
        else:
            rows.append(row)

    def groups(self) -> Groups:
        """The samples by metric, metrics without one left out: what a cache keeps of an instance."""
        return tuple(self.by_metric.items())

    def extend(self, groups: Groups) -> None:
        """Add the samples of ``groups()`` (one list extension per metric, none per sample)."""
        by_metric = self.by_metric
        for name, rows in groups:
            mine = by_metric.get(name)
            if mine is None:
                by_metric[name] = list(rows)
            else:
                mine.extend(rows)

    def families(self) -> Iterator[Metric]:
        """prometheus_client families (the registry path: tests, OpenMetrics negotiation)."""
        for m in names.METRICS:
            family: Metric
            rows = self.by_metric.get(m.name, [])
            if m.type == "gauge":
                family = GaugeMetricFamily(m.name, m.help, labels=list(m.labels))
                for _, labels, value, _line_text in rows:
                    family.add_sample(m.name, dict(zip(_label_names(m, labels), labels, strict=True)), value)
            elif m.type == "counter":
                family = CounterMetricFamily(m.name, m.help, labels=list(m.labels))
                for _, labels, value, _line_text in rows:
                    pairs = dict(zip(_label_names(m, labels), labels, strict=True))
                    family.add_sample(m.name + "_total", pairs, value)
            else:
                # An info metric's rows are all 1; its labels (identity and value alike) are the sample's.
                family = InfoMetricFamily(m.name, m.help)
                for _, labels, _value, _line_text in rows:
                    pairs = dict(zip(_label_names(m, labels), labels, strict=True))
                    family.add_sample(m.name + "_info", pairs, 1.0)
            yield family

    def text(self) -> bytes:
        """The whole exposition in text format 0.0.4, from the pre-rendered lines."""
        out: list[str] = []
        for m in names.METRICS:
            out.append(_HEADERS[m.name])
            rows = self.by_metric.get(m.name)
            if rows is not None:
                out.extend(map(_text_of, rows))
        return "".join(out).encode("utf-8")


_HEADERS = {
    m.name: f"# HELP {m.sample_name} {m.help.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}\n"
    f"# TYPE {m.sample_name} {'gauge' if m.type == 'info' else m.type}\n"
    for m in names.METRICS
}
