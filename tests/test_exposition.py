"""kvwatch/export/exposition.py: its own text rendering equals prometheus_client's, byte for byte."""

from __future__ import annotations

from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import examples
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kvwatch.export import names
from kvwatch.export.exposition import Rows


class _Fixed(Collector):
    def __init__(self, rows: Rows) -> None:
        self.rows = rows

    def collect(self) -> Iterator[Metric]:
        return self.rows.families()


label = st.text(
    alphabet=st.sampled_from(["a", "Z", "0", '"', "\\", "\n", " ", "é", "/", "{", "}"]), max_size=8
)
value = st.one_of(
    st.floats(allow_nan=False),
    st.sampled_from([0.0, 1.0, -0.0, 1e21, 1e-7, 2.5, float("inf"), float("-inf"), 10.0**22]),
    st.integers(-(10**6), 10**12).map(float),
)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(names.METRICS), st.data()), max_size=12), st.data())
def test_text_equals_generate_latest(
    picks: list[tuple[names.Metric, st.DataObject]], data: st.DataObject
) -> None:
    rows = Rows()
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for metric, draw in picks:
        labels = tuple(draw.draw(label) for _ in metric.labels)
        if (metric.name, labels) in seen:
            continue  # one sample per series, as a scrape has
        seen.add((metric.name, labels))
        v = 1.0 if metric.type == "info" else data.draw(value)
        if metric.type == "counter":
            v = abs(v)
        rows.add(metric, labels, v)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(rows))
    assert rows.text() == generate_latest(registry)


def test_empty_scrape_lists_every_family() -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(Rows()))
    assert Rows().text() == generate_latest(registry)
