"""vLLM as kvwatch sees it: its ``Engine`` (engines/base.py), declared once.

The light parts are values here; the log and /metrics dialects and the budget arithmetic are
built on first use by the loaders below (a prediction never parses a log or /metrics, and reading
this engine's log never imports another engine's table).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvwatch.engines.base import Engine, EngineFlags, Labels, LogDialect
from kvwatch.engines.vllm import flags
from kvwatch.engines.vllm.anchors import ANCHORS

if TYPE_CHECKING:
    from kvwatch.engines.base import Capacity, MetricsDialect, ObservedBudget

# Phrases that appear in vLLM output of some release and never in SGLang's (engine detection).
PHRASES: tuple[str, ...] = (
    "vLLM",
    "vllm",
    "GPU KV cache size",
    "KV cache size:",
    "# GPU blocks",
    "# CUDA blocks",
    "# cuda blocks",
    "CPU blocks:",
    "Maximum concurrency for",
    "Avg prompt throughput",
    "preempted by PreemptionMode",
    "Available KV cache memory",
    "Model loading took",
    "Loading model weights took",
    "max seq len",
    "No available memory for the cache blocks",
    "reserved for KV Cache",
    "Memory profiling results",
    "(EngineCore",
    "(APIServer pid=",
    "VllmWorker",
    "(Worker_",
    "LLM engine",
    # The API server's own first lines, before any engine process prints (an excerpt may start there):
    # 'non-default args: {...}' (0.9+ entrypoints/utils.py), 'Using max model len N' (config).
    "non-default args: {",
    "Using max model len",
)


def _log() -> LogDialect:
    # The line table and the fast path import regex and the event models (pydantic).
    from kvwatch.engines.vllm import fastpath, log

    return LogDialect(parse=log.parse, fast_path=fastpath.parse_lines)


def _metrics() -> MetricsDialect:
    from kvwatch.engines.vllm.metrics import VllmMetrics

    return VllmMetrics()


def _capacity() -> Capacity:
    from kvwatch.engines.vllm.capacity import CAPACITY

    return CAPACITY


def _observed() -> ObservedBudget:
    from kvwatch.engines.vllm.observed import OBSERVED

    return OBSERVED


ENGINE = Engine(
    name="vllm",
    labels=Labels(
        display="vLLM",
        fraction_setting="gpu_memory_utilization",
        fraction_label="requested (util)",
        overhead_label="activation peak",
    ),
    # The releases whose logs, /metrics and defaults kvwatch knows (oldest, newest).
    known_versions=("0.3", "0.33"),
    flags=EngineFlags(flags.FLAGS, flags.deployment_fields, flags.speculative_fields, flags.fold_dotted),
    anchors=ANCHORS,
    phrases=PHRASES,
    build_log=_log,
    build_metrics=_metrics,
    build_capacity=_capacity,
    build_observed=_observed,
)
