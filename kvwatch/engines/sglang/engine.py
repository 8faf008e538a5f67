"""SGLang as kvwatch sees it: its ``Engine`` (engines/base.py), declared once.

The light parts are values here; the log and /metrics dialects and the budget arithmetic are
built on first use by the loaders below (a prediction never parses a log or /metrics, and reading
this engine's log never imports another engine's table).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvwatch.engines.base import Engine, EngineFlags, Labels, LogDialect
from kvwatch.engines.sglang import flags
from kvwatch.engines.sglang.anchors import ANCHORS

if TYPE_CHECKING:
    from kvwatch.engines.base import Capacity, MetricsDialect, ObservedBudget

# Phrases that appear in SGLang output of some release and never in vLLM's (engine detection).
PHRASES: tuple[str, ...] = (
    "sglang",
    "SGLang",
    "Decode batch",
    "Prefill batch",
    "KV Cache is allocated",
    "max_total_num_token",
    "Load weight end",
    "Load weight begin",
    "Memory pool end",
    "#running-req",
    "token usage:",
    "server_args=",
    "Retract requests",
    "Decode out of memory happened",
    "KV cache pool",
    "Not enough memory",
    "avail mem=",
)


def _log() -> LogDialect:
    # The line table and the fast path import regex and the event models (pydantic).
    from kvwatch.engines.sglang import fastpath, log

    return LogDialect(parse=log.parse, fast_path=fastpath.parse_lines)


def _metrics() -> MetricsDialect:
    from kvwatch.engines.sglang.metrics import SglangMetrics

    return SglangMetrics()


def _capacity() -> Capacity:
    from kvwatch.engines.sglang.capacity import CAPACITY

    return CAPACITY


def _observed() -> ObservedBudget:
    from kvwatch.engines.sglang.observed import OBSERVED

    return OBSERVED


ENGINE = Engine(
    name="sglang",
    labels=Labels(
        display="SGLang",
        fraction_setting="mem_fraction_static",
        fraction_label="static (mem_fraction)",
        overhead_label="reserved (1 - fraction)",
    ),
    # The releases whose logs, /metrics and defaults kvwatch knows (oldest, newest).
    known_versions=("0.1", "0.5.23"),
    flags=EngineFlags(flags.FLAGS, flags.deployment_fields),
    anchors=ANCHORS,
    phrases=PHRASES,
    build_log=_log,
    build_metrics=_metrics,
    build_capacity=_capacity,
    build_observed=_observed,
)
