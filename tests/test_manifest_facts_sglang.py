"""Every fact a human read from each SGLang sample (tests/log_samples/manifest.json) against kvwatch.

Each sample is replayed through the same pipeline ``kvwatch parse`` and the sidecar use
(``kvwatch.sources.pipeline.replay``), with the engine auto-detected. A fact is checked against the
``parse --json`` summary where the summary has it, otherwise against the instance state or the
events the replay produced. A fact kvwatch does not keep is an explicit skip with its reason, and a
fact this file has never heard of fails, so a new manifest entry cannot pass silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kvwatch.commands.summary import summarize
from kvwatch.core.events import Event, MemoryBudget, Preemption, UsageSample
from kvwatch.sources.pipeline import replay
from kvwatch.state.fleet import InstanceSnapshot

LOG_SAMPLES = Path(__file__).parent / "log_samples"
GiB = 1 << 30


def _manifest() -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads((LOG_SAMPLES / "manifest.json").read_text(encoding="utf-8"))
    return [e for e in entries if e["file"].startswith("sglang/")]


@dataclass(frozen=True)
class Replayed:
    """One sample after replay: per-line event tuples, the summary and the single instance's state."""

    engine: str | None
    lines: list[tuple[Event, ...]]
    summary: dict[str, Any]
    instance: dict[str, Any]
    snapshot: InstanceSnapshot

    @property
    def usage(self) -> list[UsageSample]:
        return [e for line in self.lines for e in line if isinstance(e, UsageSample)]

    # SGLang prints 'gen throughput' on every Decode batch line of every release and never on a
    # Prefill batch line (reference section 2.2/2.3), so the sample says which line it came from.
    @property
    def decode(self) -> list[UsageSample]:
        return [u for u in self.usage if u.generation_throughput is not None]

    @property
    def prefill(self) -> list[UsageSample]:
        return [u for u in self.usage if u.generation_throughput is None]

    @property
    def retractions(self) -> list[Preemption]:
        return [e for line in self.lines for e in line if isinstance(e, Preemption)]


@cache
def replayed(file: str) -> Replayed:
    lines: list[tuple[Event, ...]] = []
    result = replay([str(LOG_SAMPLES / file)], on_events=lines.append)
    snapshots = result.snapshots()
    summary: Any = summarize(snapshots, result.engine)
    assert len(snapshots) == 1, f"{file}: one engine instance expected, got {len(snapshots)}"
    assert all(p.parse_errors == 0 for p in result.pipelines), f"{file}: parse errors"
    return Replayed(result.engine, lines, summary, summary["instances"][0], snapshots[0])


def gib(value: float) -> int:
    """A manifest size in SGLang's 'GB' (GiB) as bytes, rounded to the nearest byte like the log."""
    return int((Decimal(str(value)) * GiB).to_integral_value())


def _percent(ratio: float | None) -> float | None:
    return None if ratio is None else round(ratio * 100, 2)


def _last(values: list[Any]) -> Any:
    assert values, "no such reading in the replay"
    return values[-1]


Check = Callable[[Replayed, dict[str, Any]], Any]

# fact -> what kvwatch reports for it (compared with ==, sizes in bytes).
CHECKS: dict[str, Check] = {
    # capacity (summary)
    "sglang_kv_tokens": lambda r, f: r.instance["kv_pool_tokens"],
    "sglang_max_total_num_tokens": lambda r, f: r.instance["kv_pool_tokens"],
    "kv_size_gb": lambda r, f: r.instance["kv_pool_bytes"],
    "model_weights_gb": lambda r, f: r.instance["model_weights_bytes"],
    # settings printed on the max_total_num_tokens line (state)
    "chunked_prefill_size": lambda r, f: r.snapshot.settings.chunked_prefill_size,
    "max_running_requests": lambda r, f: r.snapshot.settings.max_num_seqs,
    "context_len": lambda r, f: r.snapshot.settings.max_model_len,
    # memory budget (state / events)
    "available_gpu_mem_gb": lambda r, f: r.snapshot.memory.avail_after_startup_bytes,
    "avail_mem_after_pool_gb": lambda r, f: r.snapshot.memory.avail_after_pool_bytes,
    "avail_mem_after_weights_gb_tp0": lambda r, f: _last(
        [
            e.avail_after_weights_bytes
            for line in r.lines
            for e in line
            if isinstance(e, MemoryBudget) and e.rank == 0 and e.avail_after_weights_bytes is not None
        ]
    ),
    # usage: last values (summary), extremes and per-phase values (events)
    "last_running_req": lambda r, f: r.instance["requests_running"],
    "last_queue_req": lambda r, f: r.instance["requests_waiting"],
    "last_token_usage": lambda r, f: r.instance["kv_usage_ratio"],
    "token_usage": lambda r, f: r.instance["kv_usage_ratio"],
    "last_num_tokens": lambda r, f: r.snapshot.usage.used_tokens,
    "max_running_req": lambda r, f: max(u.running for u in r.usage if u.running is not None),
    "max_token_usage": lambda r, f: max(u.kv_usage_ratio for u in r.usage if u.kv_usage_ratio is not None),
    "last_cache_hit_rate_pct": lambda r, f: _percent(r.snapshot.usage.prefix_cache_hit_ratio),
    "last_swa_token_usage": lambda r, f: r.snapshot.usage.swa_usage_ratio,
    "decode_lines": lambda r, f: len(r.decode),
    "prefill_lines": lambda r, f: len(r.prefill),
    "last_running_req_decode": lambda r, f: _last(r.decode).running,
    "last_num_tokens_decode": lambda r, f: _last(r.decode).used_tokens,
    "decode_running_req": lambda r, f: _last(r.decode).running,
    "decode_full_tokens": lambda r, f: _last(r.decode).used_tokens,
    "decode_full_token_usage": lambda r, f: _last(r.decode).kv_usage_ratio,
    "decode_swa_tokens": lambda r, f: _last(r.decode).swa_used_tokens,
    "decode_swa_token_usage": lambda r, f: _last(r.decode).swa_usage_ratio,
    "decode_mamba_num": lambda r, f: _last(r.decode).mamba_used_slots,
    "decode_mamba_usage": lambda r, f: _last(r.decode).mamba_usage_ratio,
    # retractions
    "retraction_lines": lambda r, f: len(r.retractions),
    "retracted_reqs_total": lambda r, f: r.instance["preemptions_total"],
    "new_token_ratio_after": lambda r, f: _last(r.retractions).new_token_ratio,
}

# Facts in GB: the manifest's figure converted to bytes; K and V are one pool.
EXPECT: dict[str, Callable[[dict[str, Any]], Any]] = {
    "kv_size_gb": lambda f: gib(f["kv_size_gb"]),
    "model_weights_gb": lambda f: gib(f["model_weights_gb"]),
    "available_gpu_mem_gb": lambda f: gib(f["available_gpu_mem_gb"]),
    "avail_mem_after_pool_gb": lambda f: gib(f["avail_mem_after_pool_gb"]),
    "avail_mem_after_weights_gb_tp0": lambda f: gib(f["avail_mem_after_weights_gb_tp0"]),
}
POOL_BYTES_FROM_K_AND_V = ("k_size_gb", "v_size_gb")

SKIPPED: dict[str, str] = {
    "max_prefill_tokens": "a scheduler batch limit, not a KV-cache fact; kvwatch keeps no field for it",
    "last_pending_token": "#pending-token is the chunked-prefill backlog, not pool state; not kept",
    "last_cached_tokens": "per-batch #cached-token counts are not kept (0.4.4+ prints no hit rate to keep)",
    "prefill_cached_tokens": "per-batch #cached-token counts are not kept",
    "max_cached_token": "per-batch #cached-token counts are not kept",
    "new_token_ratio_before": "kvwatch keeps the ratio after a retraction (the scheduler's current estimate)",
    "available_size_tokens": "free slots at the 0.1.x leak check; kvwatch has no free-slot or leak event and "
    "does not derive used tokens the engine did not print",
    "pool_leak_detected": "the 0.1.x leak warning is not a KV-capacity fact kvwatch models",
}


# Where the manifest disagrees with its own excerpt: (file, fact) -> (manifest value, count in the
# file, phrase counted, why). The manifest is a byte-for-byte copy of the shared corpus, so it is not
# edited here; the test re-counts the phrase in the file so the correction cannot go stale silently.
CORRECTIONS: dict[tuple[str, str], tuple[int, int, str, str]] = {
    ("sglang/011-dsv4-flash-v0518-windows-path-glued-swa-spec.log", "prefill_lines"): (
        4,
        3,
        "Prefill batch",
        "the excerpt holds 3 'Prefill batch' lines; the fourth was in the thread, not the file",
    ),
}


def _cases() -> list[tuple[str, str]]:
    return [(e["file"], fact) for e in _manifest() for fact in e["facts"]]


def test_there_are_sglang_samples_with_facts() -> None:
    assert len(_manifest()) >= 16
    assert all(e["facts"] for e in _manifest())


@pytest.mark.parametrize(("file", "fact"), _cases(), ids=[f"{Path(f).stem}:{k}" for f, k in _cases()])
def test_manifest_fact(file: str, fact: str) -> None:
    entry = next(e for e in _manifest() if e["file"] == file)
    facts: dict[str, Any] = entry["facts"]
    if fact in SKIPPED:
        pytest.skip(SKIPPED[fact])
    r = replayed(file)
    if fact in POOL_BYTES_FROM_K_AND_V:
        assert r.instance["kv_pool_bytes"] == gib(facts["k_size_gb"]) + gib(facts["v_size_gb"])
        return
    assert fact in CHECKS, f"{file}: manifest fact {fact!r} has neither a check nor a reasoned skip"
    expected = EXPECT[fact](facts) if fact in EXPECT else facts[fact]
    correction = CORRECTIONS.get((file, fact))
    if correction is not None:
        in_manifest, in_file, phrase, why = correction
        assert expected == in_manifest, f"manifest changed; drop the correction ({why})"
        assert (LOG_SAMPLES / file).read_text(encoding="utf-8").count(phrase) == in_file, why
        expected = in_file
    assert CHECKS[fact](r, facts) == expected


@pytest.mark.parametrize("file", [e["file"] for e in _manifest()], ids=lambda f: Path(f).stem)
def test_engine_is_detected_as_sglang(file: str) -> None:
    entry = next(e for e in _manifest() if e["file"] == file)
    r = replayed(file)
    assert entry["engine"] == "sglang"
    assert r.engine == "sglang"
    assert r.summary["engine"] == "sglang"
    # The manifest's engine_version, model, gpu and tp_size come from the thread, not the excerpt:
    # none of these samples prints server_args or the check_env version line.
    assert r.summary["engine_version"] is None
