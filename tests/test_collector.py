"""The collector: every family from names.py, derived figures, prediction states, cached predictions."""

from __future__ import annotations

import json
import platform
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import kvwatch
from kvwatch.analysis.predictor import Predictor
from kvwatch.core.events import EngineSettings, PoolSized, UsageSample
from kvwatch.core.labels import ORIGINS, PREDICTION_STATES, Origin
from kvwatch.export import names
from kvwatch.export.collector import KvwatchCollector, SourceStatus
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.state.fleet import Fleet

TESTS = Path(__file__).parent
LOG_SAMPLES = TESTS / "log_samples"
MODEL_CONFIGS = TESTS / "model_configs"
LLAMA_8B = MODEL_CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json"
# Llama-3.1-8B on an RTX 3090: memory profile, '# GPU blocks: 1952', 20,000-token requests; then
# V0 stats lines (last: 2.3% usage) and a V0 preemption warning (cumulative total 51).
VLLM_LINES = [
    *(LOG_SAMPLES / "vllm/001-llama31-8b-rtx3090-profiling-20k.log").read_text().splitlines(),
    *(LOG_SAMPLES / "vllm/012-v0-metrics449-low-usage-2025-01.log").read_text().splitlines(),
    *(LOG_SAMPLES / "vllm/026-v0-preemption-lighteval-suffix-location.log").read_text().splitlines(),
]
LAB = {"source": "v", "engine_kind": "vllm", "model_name": "", "dp_rank": "0"}


def _registry(
    fleet: Fleet, model_config: Path | None = LLAMA_8B, sources: tuple[SourceStatus, ...] = ()
) -> tuple[CollectorRegistry, Predictor]:
    registry, predictor, _ = _setup(fleet, model_config, sources)
    return registry, predictor


def _setup(
    fleet: Fleet, model_config: Path | None = LLAMA_8B, sources: tuple[SourceStatus, ...] = ()
) -> tuple[CollectorRegistry, Predictor, KvwatchCollector]:
    registry = CollectorRegistry()
    predictor = Predictor(model_config=lambda source: model_config)
    collector = KvwatchCollector(fleet.snapshot, predictor, lambda: sources, lambda: fleet.dropped_events)
    registry.register(collector)
    return registry, predictor, collector


def _feed(fleet: Fleet, source: str, lines: list[str]) -> None:
    pipeline = LinePipeline(source, fleet, "auto")
    for line in lines:
        pipeline.feed(line)


def test_observed_pool_usage_headroom_and_prediction() -> None:
    fleet = Fleet(clock=lambda: 1700000000.0)
    _feed(fleet, "v", VLLM_LINES)
    reg, _ = _registry(fleet)

    def get(metric: names.Metric, **extra: str) -> float | None:
        return reg.get_sample_value(metric.sample_name, {**LAB, **extra})

    block = 16  # vLLM's default block size on CUDA (the log does not print it)
    assert get(names.KV_POOL_BLOCKS) == 1952
    assert get(names.KV_POOL_TOKENS) == 1952 * block
    assert get(names.KV_BLOCK_SIZE) == block
    per_token = 2 * 32 * 8 * 128 * 2  # K and V x 32 layers x 8 KV heads x 128 dims x bf16
    assert get(names.KV_BYTES_PER_TOKEN) == per_token
    # The engine's own figure: 'kv_cache_size=3.81GiB' divided into pages of 16 tokens.
    available = round(3.81 * 2**30)
    budget_tokens = available // (per_token * block) * block
    assert get(names.KV_POOL_PREDICTED_TOKENS, basis="engine_budget") == budget_tokens
    assert get(names.KV_POOL_GAP_RATIO, basis="engine_budget") == pytest.approx(
        1952 * block / budget_tokens - 1
    )
    assert get(names.KV_POOL_PREDICTED_TOKENS, basis="config") is not None
    assert get(names.PREDICTION_AVAILABLE, state="ok") == 1
    assert get(names.PREDICTION_AVAILABLE, state="no_model_config") == 0
    used = round(0.023 * 1952 * block)
    assert get(names.KV_USAGE_RATIO) == pytest.approx(0.023)
    assert get(names.KV_USED_TOKENS) == used
    assert get(names.KV_HEADROOM_TOKENS) == 1952 * block - used
    assert get(names.KV_HEADROOM_REQUESTS) == (1952 * block - used) // 20000
    assert get(names.MAX_CONCURRENCY, basis="observed") == pytest.approx(1.56)
    assert get(names.PREEMPTIONS) == 51
    assert get(names.REQUESTS_RUNNING) == 1
    assert get(names.MEMORY_BYTES, term="total", basis="observed") == round(23.58 * 2**30)
    assert get(names.MEMORY_BYTES, term="kv", basis="observed") == available
    assert get(names.EPOCH_START) == 1700000000.0
    assert get(names.STARTUP_FAILURES, reason="no_memory_for_cache") == 0
    assert reg.get_sample_value("kvwatch_instances") == 1


def test_no_model_config_and_bad_model_config(tmp_path: Path) -> None:
    fleet = Fleet()
    _feed(fleet, "v", VLLM_LINES)
    reg, _ = _registry(fleet, model_config=None)
    assert reg.get_sample_value(names.PREDICTION_AVAILABLE.name, {**LAB, "state": "no_model_config"}) == 1
    assert reg.get_sample_value(names.KV_POOL_PREDICTED_TOKENS.name, {**LAB, "basis": "config"}) is None
    # Observed metrics keep flowing.
    assert reg.get_sample_value(names.PREEMPTIONS.sample_name, LAB) == 51

    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}), encoding="utf-8")
    reg, _ = _registry(fleet, model_config=bad)
    assert reg.get_sample_value(names.PREDICTION_AVAILABLE.name, {**LAB, "state": "bad_model_config"}) == 1
    assert reg.get_sample_value(names.KV_USAGE_RATIO.name, LAB) == pytest.approx(0.023)


def test_prediction_is_cached_per_epoch_and_settings() -> None:
    fleet = Fleet()
    _feed(fleet, "v", VLLM_LINES)
    reg, predictor = _registry(fleet)
    for _ in range(5):
        generate_latest(reg)
    assert predictor.computations == 1
    _feed(fleet, "v", VLLM_LINES[:2])  # the same memory profile again: same settings, same memory
    generate_latest(reg)
    assert predictor.computations == 1


def test_self_metrics_merge_sources_sharing_a_name() -> None:
    fleet = Fleet()
    sources = (
        SourceStatus(
            "e",
            "log",
            up=True,
            lines_read=10,
            lines_matched=4,
            parse_errors=1,
            lines_truncated=5,
            rotations=2,
        ),
        SourceStatus(
            "e",
            "metrics",
            up=False,
            scrape_duration_seconds=0.5,
            scrape_errors={"timeout": 3},
            series_dropped=7,
            unusable_values=2,
        ),
    )
    reg, _ = _registry(fleet, sources=sources)
    src = {"source": "e"}
    assert reg.get_sample_value("kvwatch_lines_read_total", src) == 10
    assert reg.get_sample_value("kvwatch_log_lines_truncated_total", src) == 5
    assert reg.get_sample_value("kvwatch_metrics_series_dropped_total", src) == 7
    assert reg.get_sample_value("kvwatch_metrics_unusable_values_total", src) == 2
    assert reg.get_sample_value("kvwatch_log_rotations_total", src) == 2
    assert reg.get_sample_value("kvwatch_source_up", src) == 0
    assert reg.get_sample_value("kvwatch_scrape_errors_total", {**src, "reason": "timeout"}) == 3
    assert reg.get_sample_value("kvwatch_scrape_errors_total", {**src, "reason": "parse"}) == 0
    assert reg.get_sample_value("kvwatch_scrape_duration_seconds", src) == 0.5
    build = {"version": kvwatch.__version__, "python_version": platform.python_version()}
    assert reg.get_sample_value("kvwatch_build_info", build) == 1


def test_every_family_is_exposed_with_its_help() -> None:
    fleet = Fleet()
    _feed(fleet, "v", VLLM_LINES)
    reg, _ = _registry(fleet, sources=(SourceStatus("v", "log", up=True),))
    text = generate_latest(reg).decode()
    for metric in names.METRICS:
        assert f"# HELP {metric.sample_name} {metric.help}\n" in text, metric.name


def test_promtool_check_metrics(promtool: str) -> None:
    import subprocess

    fleet = Fleet()
    _feed(fleet, "v", VLLM_LINES)
    reg, _ = _registry(fleet, sources=(SourceStatus("v", "log", up=True),))
    done = subprocess.run(
        [promtool, "check", "metrics"],
        input=generate_latest(reg),
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()


def test_instance_cap_counts_dropped_events() -> None:
    fleet = Fleet(max_instances=1)
    _feed(fleet, "a", VLLM_LINES[:1])
    _feed(fleet, "b", VLLM_LINES[:1])
    reg, _ = _registry(fleet)
    assert reg.get_sample_value("kvwatch_instances") == 1
    assert reg.get_sample_value("kvwatch_dropped_events_total") == 1


def test_fast_render_is_byte_identical_to_prometheus_client() -> None:
    fleet = Fleet(clock=lambda: 1700000000.5)
    _feed(fleet, "v", VLLM_LINES)
    # A model name with characters that need escaping, and a second instance.
    fleet.apply("w", EngineSettings(engine="sglang", model='/m/"odd"\\name\n', starts_engine=True))
    fleet.apply("w", PoolSized(engine="sglang", instance="1", tokens=10**22))
    sources = (SourceStatus("v", "log", up=True, lines_read=3), SourceStatus("w", "metrics", up=False))
    registry, _, collector = _setup(fleet, sources=sources)
    assert collector.render() == generate_latest(registry)
    _feed(fleet, "v", VLLM_LINES[-1:])  # a change after the per-instance cache was filled
    assert collector.render() == generate_latest(registry)


def test_unmodelled_model_state(tmp_path: Path) -> None:
    """A layer kind kvwatch has no rule for is said (state unmodelled), never sized as 0 B per token."""
    cfg = json.loads(LLAMA_8B.read_text())
    cfg["hybrid_override_pattern"] = "*X" * 16
    odd = tmp_path / "config.json"
    odd.write_text(json.dumps(cfg), encoding="utf-8")
    fleet = Fleet()
    _feed(fleet, "v", VLLM_LINES)
    reg, _ = _registry(fleet, model_config=odd)
    assert reg.get_sample_value(names.PREDICTION_AVAILABLE.name, {**LAB, "state": "unmodelled"}) == 1
    assert reg.get_sample_value(names.PREDICTION_AVAILABLE.name, {**LAB, "state": "ok"}) == 0


def test_the_cached_rows_render_what_a_fresh_collector_renders_after_any_events() -> None:
    """The per-instance row caches (startup facts, usage, counters and stale flags, each series'
    label text) never show what the state no longer holds: after every step of a seeded random mix
    of events from both origins, with the clock moving facts past their TTL, a collector that kept
    its caches renders the bytes of one that starts empty."""
    import random

    from kvwatch.core.events import Preemption, UsageSample

    clock = [1_796_172_900.0]
    fleet = Fleet(clock=lambda: clock[0], fact_ttl=30)
    for i, path in enumerate(sorted(LOG_SAMPLES.glob("*/*.log"))[:12]):
        pipeline = LinePipeline(f"s{i}", fleet, "auto")
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            pipeline.feed(line)
    predictor = Predictor(model_config=lambda source: LLAMA_8B)
    kept = KvwatchCollector(fleet.snapshot, predictor)
    engines = {snap.source: snap.engine for snap in fleet.snapshot()}
    rng = random.Random(7)
    for _ in range(120):
        for _ in range(rng.randint(1, 4)):
            source = rng.choice(sorted(engines))
            engine = engines[source]
            origin: Origin = rng.choice(ORIGINS)
            roll = rng.random()
            if roll < 0.6:
                fleet.apply(
                    source,
                    UsageSample(
                        engine=engine,
                        origin=origin,
                        kv_usage_ratio=rng.choice([None, 0.0, -0.0, rng.random()]),
                        running=rng.choice([None, 0, rng.randint(0, 50)]),
                        waiting=rng.choice([None, rng.randint(0, 5)]),
                        prefix_cache_hit_ratio=rng.choice([None, rng.random()]),
                    ),
                )
            elif roll < 0.8:
                tokens = rng.choice([None, 476_000, rng.randint(1, 10**6)])
                fleet.apply(
                    source,
                    PoolSized(engine=engine, origin=origin, tokens=tokens, block_size=rng.choice([None, 16])),
                )
            else:
                fleet.apply(source, Preemption(engine=engine, origin=origin, count=rng.randint(0, 3)))
        clock[0] += rng.choice([0, 1, 20, 40])
        assert kept.render() == KvwatchCollector(fleet.snapshot, predictor).render()


def _label_values(reg: CollectorRegistry, metric: names.Metric, label: str) -> set[str]:
    return {s.labels[label] for fam in reg.collect() for s in fam.samples if s.name == metric.sample_name}


def test_bounded_labels_export_exactly_their_literal() -> None:
    """An origin, a prediction state and a source kind are typed by a core.labels Literal; the
    series carry exactly its values, so a new one is exported once it is declared."""
    fleet = Fleet(clock=lambda: 1700000000.0)
    _feed(fleet, "v", VLLM_LINES)
    fleet.apply("v", UsageSample(engine="vllm", instance="0", origin="metrics", kv_usage_ratio=0.4))
    sources = tuple(SourceStatus(f"s-{kind}", kind, up=True) for kind in ORIGINS)
    reg, _ = _registry(fleet, sources=sources)
    assert _label_values(reg, names.LAST_UPDATE, "origin") == set(ORIGINS)
    assert _label_values(reg, names.PREDICTION_AVAILABLE, "state") == set(PREDICTION_STATES)
    # Each kind of source has self-metrics of its own (a log its lines read, a URL its scrape errors).
    assert _label_values(reg, names.LINES_READ, "source") == {"s-log"}
    assert _label_values(reg, names.SCRAPE_ERRORS, "source") == {"s-metrics"}
