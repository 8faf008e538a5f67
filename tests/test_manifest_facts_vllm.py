"""Every fact a human read from a vLLM log sample (tests/log_samples/manifest.json) agrees with kvwatch.

Each fact name maps to where kvwatch keeps it (the ``parse --json`` summary, the instance state or
the events). A fact kvwatch does not record is listed in SKIPPED with the reason; an unknown fact
name fails, so a new manifest entry cannot pass unchecked.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvwatch.commands.summary import summarize
from kvwatch.core.events import Event, Preemption, StartupFailure, UsageSample
from kvwatch.core.units import GiB
from kvwatch.sources.pipeline import replay
from kvwatch.state.fleet import InstanceSnapshot

SAMPLES = Path(__file__).parent / "log_samples"
MANIFEST: list[dict[str, Any]] = json.loads((SAMPLES / "manifest.json").read_text(encoding="utf-8"))
VLLM = [entry for entry in MANIFEST if entry["engine"] == "vllm"]


@dataclass
class Observed:
    """What kvwatch made of one sample."""

    events: list[Event]
    summary: dict[str, Any]
    snapshot: InstanceSnapshot

    @property
    def instance(self) -> dict[str, Any]:
        inst: dict[str, Any] = self.summary["instances"][0]
        return inst

    @property
    def failure(self) -> dict[str, Any]:
        err: dict[str, Any] | None = self.instance["startup_error"]
        assert err is not None, "no startup error recorded"
        return err


def observe(path: Path) -> Observed:
    events: list[Event] = []
    result = replay([str(path)], on_events=events.extend)
    snaps = result.snapshots()
    assert len(snaps) == 1, "every vLLM sample is one engine instance"
    return Observed(events, summarize(snaps, result.engine), snaps[0])


def gib(n_bytes: int | None) -> float | None:
    return None if n_bytes is None else n_bytes / GiB


def pct(ratio: float | None) -> float | None:
    return None if ratio is None else 100 * ratio


# Fact name -> (observed value getter, tolerance). Tolerance covers the printed rounding: a size
# printed with 2 decimals by one line and 4 by another (5.20 vs 5.2032 GiB) is the same fact.
GETTERS: dict[str, tuple[Callable[[Observed], Any], float]] = {
    "model_weights_gib": (lambda o: gib(o.instance["model_weights_bytes"]), 0.006),
    "total_gpu_memory_gib": (lambda o: gib(o.snapshot.memory.total_bytes), 0.006),
    "kv_cache_size_gib": (lambda o: gib(o.snapshot.memory.available_kv_bytes), 0.006),
    "non_torch_memory_gib": (lambda o: gib(o.snapshot.memory.non_torch_bytes), 0.006),
    "activation_peak_gib": (lambda o: gib(o.snapshot.memory.activation_bytes), 0.006),
    "gpu_memory_utilization": (
        lambda o: (
            o.snapshot.memory.gpu_memory_utilization
            if o.snapshot.memory.gpu_memory_utilization is not None
            else o.snapshot.settings.gpu_memory_utilization
        ),
        1e-9,
    ),
    "gpu_blocks": (lambda o: o.instance["kv_pool_blocks"], 0),
    "cpu_blocks": (lambda o: o.snapshot.pool.cpu_blocks, 0),
    "max_concurrency": (lambda o: o.instance["max_concurrency"], 1e-9),
    "max_concurrency_tokens": (lambda o: o.instance["max_concurrency_tokens"], 0),
    "kv_cache_tokens": (lambda o: o.instance["kv_pool_tokens"], 0),
    "available_kv_gib": (
        lambda o: gib(
            o.snapshot.memory.available_kv_bytes
            if o.instance["startup_error"] is None
            else o.failure["available_kv_bytes"]
        ),
        0.006,
    ),
    "max_seq_len_error": (
        lambda o: o.snapshot.startup_failures.get("max_model_len_too_large", 0) == 1,
        0,
    ),
    "max_seq_len": (lambda o: o.failure["max_model_len"], 0),
    "needed_kv_gib": (lambda o: gib(o.failure["needed_kv_bytes"]), 0.006),
    "estimated_max_model_len": (lambda o: o.failure["estimated_max_model_len"], 0),
    "stats_lines": (
        lambda o: sum(isinstance(e, UsageSample) and e.kv_usage_ratio is not None for e in o.events),
        0,
    ),
    "last_gpu_kv_usage_pct": (lambda o: pct(o.instance["kv_usage_ratio"]), 1e-9),
    "last_cpu_kv_usage_pct": (lambda o: pct(o.snapshot.usage.cpu_kv_usage_ratio), 1e-9),
    "last_running": (lambda o: o.instance["requests_running"], 0),
    "last_waiting": (lambda o: o.instance["requests_waiting"], 0),
    # V0 calls the waiting queue 'Pending'; kvwatch reports it as waiting for both generations.
    "last_pending": (lambda o: o.instance["requests_waiting"], 0),
    "last_swapped": (lambda o: o.snapshot.usage.swapped, 0),
    "last_prefix_cache_hit_rate_pct": (lambda o: pct(o.snapshot.usage.prefix_cache_hit_ratio), 1e-9),
    "preemption_warnings": (lambda o: sum(isinstance(e, Preemption) for e in o.events), 0),
    # The cumulative count the (rate-limited) warning carries, not the number of warnings.
    "preemptions": (lambda o: o.instance["preemptions_total"], 0),
    "engine_version_in_log": (lambda o: o.summary["engine_version"], 0),
    "pipeline_parallel_size": (lambda o: o.snapshot.settings.pipeline_parallel_size, 0),
    "max_model_len": (lambda o: o.snapshot.settings.max_model_len, 0),
    "max_num_batched_tokens": (lambda o: o.snapshot.settings.max_num_batched_tokens, 0),
    # The hybrid KV groups' padding line ('may waste at most 3.45% KV cache memory'), kept on the pool.
    "padding_waste_pct_max": (lambda o: pct(o.snapshot.pool.padding_waste_ratio), 1e-9),
}

SKIPPED: dict[str, str] = {
    "model_weights_unit": "the unit label as printed; the GB-means-GiB reading is checked by model_weights_gib",
    "profiling_seconds": "profiling duration is not a KV-cache fact; kvwatch records no timings",
    "preemption_mode": "V0 only ever reports RECOMPUTE/SWAP in prose; kvwatch counts preemptions, not modes",
    "last_seq_group": "a request id: free text that must never become a metric or label",
    "startup_failed": (
        "the excerpt ends in a generic 'EngineCore failed to start' traceback whose cause (a plugin rejecting "
        "hybrid models) is not in the excerpt; kvwatch types only KV-memory failures"
    ),
    "kv_cache_dtype": "taken from the issue's command line, not printed in the excerpt",
}


def _cases() -> list[tuple[str, str, Any]]:
    return [(entry["file"], name, value) for entry in VLLM for name, value in entry["facts"].items()]


@pytest.mark.parametrize(("file", "fact", "expected"), _cases(), ids=lambda v: str(v))
def test_fact(file: str, fact: str, expected: Any) -> None:
    if fact in SKIPPED:
        pytest.skip(SKIPPED[fact])
    assert fact in GETTERS, f"no mapping for manifest fact {fact!r}: add a getter or a reasoned skip"
    getter, tolerance = GETTERS[fact]
    observed = getter(observe(SAMPLES / file))
    if isinstance(expected, float) and not isinstance(expected, bool):
        assert observed is not None
        assert math.isclose(observed, expected, rel_tol=0, abs_tol=max(tolerance, 1e-9)), (observed, expected)
    else:
        assert observed == expected


@pytest.mark.parametrize("entry", VLLM, ids=lambda e: str(e["file"]))
def test_manifest_engine_version(entry: dict[str, Any]) -> None:
    """A version the manifest names is the one kvwatch read (or the log does not print one)."""
    observed = observe(SAMPLES / entry["file"]).summary["engine_version"]
    assert observed in (None, entry["engine_version"])
    if entry["facts"].get("engine_version_in_log"):
        assert observed == entry["engine_version"]


def test_every_vllm_sample_has_facts() -> None:
    assert len(VLLM) >= 20
    assert all(entry["facts"] for entry in VLLM)


def test_failure_samples_record_failures() -> None:
    """Samples whose manifest records a max-seq-len error carry exactly that startup failure event."""
    for entry in VLLM:
        if not entry["facts"].get("max_seq_len_error"):
            continue
        obs = observe(SAMPLES / entry["file"])
        reasons = [e.reason for e in obs.events if isinstance(e, StartupFailure)]
        assert reasons == ["max_model_len_too_large"], entry["file"]
