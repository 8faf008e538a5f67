"""/metrics text -> events: every fixture version, every name variant, counter resets, bad input.

The expected facts below were read off the fixture texts by hand (see tests/metrics_fixtures/README.md);
the golden files hold the complete event lists and are checked beside them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import examples

from kvwatch.core.errors import ConfigError
from kvwatch.core.events import (
    CounterReset,
    Disagreement,
    EngineSettings,
    Event,
    PoolSized,
    Preemption,
    UsageSample,
    event_from_json,
    event_to_json,
)
from kvwatch.parsers.base import ParseError
from kvwatch.sources.metrics_reader import MetricsReader
from kvwatch.state.facts import LastDisagreement
from kvwatch.state.fleet import Fleet

FIXTURES = Path(__file__).parent / "metrics_fixtures"
ALL = sorted(p.stem for p in FIXTURES.glob("*.txt"))


def _text(stem: str) -> str:
    return (FIXTURES / f"{stem}.txt").read_text()


def _read(stem: str) -> tuple[Event, ...]:
    return MetricsReader().read(_text(stem))


def _facts(event: Event) -> dict[str, Any]:
    return event.model_dump(exclude_none=True)


def _one(events: tuple[Event, ...], kind: str, instance: str = "0", pool: str = "full") -> dict[str, Any]:
    found = [
        _facts(e)
        for e in events
        if e.kind == kind and e.instance == instance and (kind != "pool" or getattr(e, "pool", None) == pool)
    ]
    assert len(found) == 1, f"{len(found)} {kind} events for instance {instance}"
    return found[0]


def _kinds(events: tuple[Event, ...], kind: str) -> list[Event]:
    return [e for e in events if e.kind == kind]


# --- every fixture: golden file + the facts read off the text by hand --------------------------------


@pytest.mark.parametrize("stem", ALL)
def test_fixture_golden(stem: str, update_golden: bool) -> None:
    events = _read(stem)
    observed = "".join(event_to_json(e) + "\n" for e in events)
    golden = FIXTURES / f"{stem}.events.jsonl"
    if update_golden:
        golden.write_text(observed)
    expected = golden.read_text()
    assert expected == observed
    # The golden format round-trips.
    assert tuple(event_from_json(line) for line in expected.splitlines()) == events


@pytest.mark.parametrize("stem", ALL)
def test_every_event_is_marked_metrics(stem: str) -> None:
    events = _read(stem)
    assert events
    assert {e.origin for e in events} == {"metrics"}
    assert {e.engine for e in events} == {stem.split("-")[0]}


# (fixture, kind, instance, pool) -> facts that must be present with these values.
EXPECTED: dict[str, list[tuple[str, str, dict[str, Any]]]] = {
    "vllm-0.6.6-v0": [
        (
            "settings",
            "0",
            {
                "served_model_name": "meta-llama/Llama-3.1-8B-Instruct",
                "block_size": 16,
                "gpu_memory_utilization": 0.9,
                "kv_cache_dtype": "auto",
                "enable_prefix_caching": False,
            },
        ),
        ("pool", "0", {"blocks": 27895, "cpu_blocks": 2048, "block_size": 16}),
        (
            "usage",
            "0",
            {"kv_usage_ratio": 0.6834, "cpu_kv_usage_ratio": 0.0, "running": 18, "waiting": 3, "swapped": 0},
        ),
        ("preemption", "0", {"mechanism": "preempt", "total": 51}),
    ],
    "vllm-0.8.5-v1": [
        ("settings", "0", {"block_size": 16, "gpu_memory_utilization": 0.9, "enable_prefix_caching": True}),
        ("pool", "0", {"block_size": 16}),
        (
            "usage",
            "0",
            {"kv_usage_ratio": 0.1532, "running": 7, "waiting": 0, "prefix_cache_hit_ratio": 310976 / 482113},
        ),
        ("preemption", "0", {"total": 0}),
    ],
    "vllm-0.10.1-v1": [
        ("pool", "0", {"blocks": 27153, "cpu_blocks": 0, "block_size": 16}),
        ("usage", "0", {"kv_usage_ratio": 0.412, "running": 24, "prefix_cache_hit_ratio": 154240 / 1234000}),
        ("preemption", "0", {"total": 7}),
    ],
    "vllm-0.11.0-v1-dp2": [
        ("pool", "0", {"block_size": 16}),
        ("pool", "1", {"block_size": 16}),
        (
            "usage",
            "0",
            {"kv_usage_ratio": 0.9312, "running": 31, "waiting": 4, "prefix_cache_hit_ratio": 0.5},
        ),
        (
            "usage",
            "1",
            {"kv_usage_ratio": 0.8877, "running": 29, "waiting": 0, "prefix_cache_hit_ratio": 0.5},
        ),
        ("preemption", "0", {"total": 12}),
        ("preemption", "1", {"total": 3}),
    ],
    "vllm-0.28.0-v1-fp8": [
        ("settings", "0", {"kv_cache_dtype": "fp8", "gpu_memory_utilization": 0.92, "block_size": 16}),
        (
            "pool",
            "0",
            {"tokens": 903168, "blocks": 56448, "block_size": 16, "max_concurrency": 27.56, "cpu_blocks": 0},
        ),
        (
            "usage",
            "0",
            {"kv_usage_ratio": 0.9871, "running": 64, "waiting": 9, "prefix_cache_hit_ratio": 0.25},
        ),
        ("preemption", "0", {"total": 418}),
    ],
    "vllm-0.11.0-ray-serve": [
        ("usage", "0", {"kv_usage_ratio": 0.27, "running": 12, "waiting": 1}),
        ("preemption", "0", {"total": 2}),
    ],
    "sglang-0.4.3": [
        (
            "usage",
            "0",
            {
                "kv_usage_ratio": 0.35,
                "used_tokens": 154763,
                "running": 24,
                "waiting": 2,
                "prefix_cache_hit_ratio": 0.4571,
                "generation_throughput": 1876.21,
            },
        ),
    ],
    "sglang-0.4.10-dp2-attention": [
        ("usage", "0", {"kv_usage_ratio": 0.71, "used_tokens": 201330, "rank": 0}),
        ("usage", "1", {"kv_usage_ratio": 0.66, "used_tokens": 188002, "rank": 1}),
        ("preemption", "0", {"mechanism": "retract", "total": 17}),
        ("preemption", "1", {"mechanism": "retract", "total": 9}),
    ],
    "sglang-0.5.2-tp4-all-schedulers": [
        # tp_rank 0 speaks for the instance (its gen_throughput, not rank 1-3's).
        (
            "usage",
            "0",
            {"rank": 0, "used_tokens": 612004, "swa_usage_ratio": 0.58, "generation_throughput": 4120.55},
        ),
        # The cumulative gauge wins over the per-interval one.
        ("preemption", "0", {"mechanism": "retract", "total": 12}),
    ],
    "sglang-0.5.5-mamba": [
        ("usage", "0", {"kv_usage_ratio": 0.81, "mamba_usage_ratio": 0.81, "running": 48, "waiting": 11}),
        ("preemption", "0", {"mechanism": "retract", "count": 2}),
    ],
    "sglang-0.5.7": [
        ("pool", "0", {"tokens": 442181}),
        (
            "usage",
            "0",
            {"kv_usage_ratio": 0.05, "used_tokens": 23110, "running": 12, "prefix_cache_hit_ratio": 0.69},
        ),
        ("preemption", "0", {"mechanism": "retract", "total": 3}),
    ],
    "sglang-0.5.10-swa": [
        ("settings", "0", {"page_size": 1, "served_model_name": "openai/gpt-oss-20b"}),
        ("pool", "0", {"tokens": 468112, "blocks": 468112, "block_size": 1}),
        # full_token_usage (0.21), not token_usage (0.43, the max over pools).
        ("usage", "0", {"kv_usage_ratio": 0.21, "swa_usage_ratio": 0.43}),
        ("preemption", "0", {"total": 0}),
    ],
    "sglang-0.5.19-swa": [
        ("settings", "0", {"page_size": 1, "max_model_len": 131072}),
        ("pool", "0", {"tokens": 324400, "blocks": 324400, "block_size": 1}),
        ("pool:swa", "0", {"tokens": 81920}),
        ("usage", "0", {"kv_usage_ratio": 0.37, "used_tokens": 120032, "swa_used_tokens": 50790}),
        ("preemption", "0", {"total": 41}),
    ],
}


def test_expected_table_covers_every_fixture() -> None:
    assert sorted(EXPECTED) == ALL


@pytest.mark.parametrize("stem", ALL)
def test_fixture_facts(stem: str) -> None:
    events = _read(stem)
    for kind, instance, facts in EXPECTED[stem]:
        kind, _, pool = kind.partition(":")
        got = _one(events, kind, instance, pool or "full")
        for key, value in facts.items():
            assert key in got, f"{kind}[{instance}] lacks {key}"
            if isinstance(value, float):
                assert got[key] == pytest.approx(value), key
            else:
                assert got[key] == value, key


def test_tp_ranks_repeat_one_pool() -> None:
    events = _read("sglang-0.5.2-tp4-all-schedulers")
    assert {e.instance for e in events} == {"0"}
    assert len(_kinds(events, "usage")) == 1
    assert len(_kinds(events, "preemption")) == 1


def test_dp_summed_blocks_are_not_an_instance_pool() -> None:
    """0.11 DP front end: cache_config_info repeats 62414 (= 2 x 31207) for each engine."""
    events = _read("vllm-0.11.0-v1-dp2")
    pools = [e for e in events if isinstance(e, PoolSized)]
    assert [p.instance for p in pools] == ["0", "1"]
    assert all(p.blocks is None for p in pools)
    # The same text with one engine: the figure is that engine's own.
    single = "\n".join(line for line in _text("vllm-0.11.0-v1-dp2").splitlines() if 'engine="1"' not in line)
    pools = [e for e in MetricsReader().read(single + "\n") if isinstance(e, PoolSized)]
    assert [(p.instance, p.blocks) for p in pools] == [("0", 62414)]


def test_blocks_unknown_before_the_engine_sized_its_cache() -> None:
    pool = _one(_read("vllm-0.8.5-v1"), "pool")
    assert "blocks" not in pool and "cpu_blocks" not in pool


def test_prefix_caching_off_is_not_a_hit_ratio() -> None:
    """V0 exports -1 when prefix caching is disabled; that is 'not applicable', not bad data."""
    reader = MetricsReader()
    usage = _one(reader.read(_text("vllm-0.6.6-v0")), "usage")
    assert "prefix_cache_hit_ratio" not in usage
    assert reader.bad_values == 0


# --- name variants -----------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["vllm_", "ray_vllm_"])
def test_vllm_prefix_variants_read_the_same(prefix: str) -> None:
    for stem in ("vllm-0.6.6-v0", "vllm-0.10.1-v1", "vllm-0.28.0-v1-fp8"):
        text = _text(stem)
        assert MetricsReader().read(text.replace("vllm:", prefix)) == MetricsReader().read(text)


def test_ray_prefix_detected() -> None:
    reader = MetricsReader()
    reader.read(_text("vllm-0.11.0-ray-serve"))
    assert reader.engine == "vllm"


def test_new_usage_name_preferred_over_old() -> None:
    text = (
        'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    )
    assert _one(MetricsReader().read(text), "usage")["kv_usage_ratio"] == 0.5
    old_only = 'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
    assert _one(MetricsReader().read(old_only), "usage")["kv_usage_ratio"] == 0.25


def test_new_prefix_cache_counters_preferred_over_old() -> None:
    text = (
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        'vllm:prefix_cache_queries_total{engine="0"} 100.0\n'
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        'vllm:prefix_cache_hits_total{engine="0"} 80.0\n'
        "# TYPE vllm:gpu_prefix_cache_queries_total counter\n"
        'vllm:gpu_prefix_cache_queries_total{engine="0"} 100.0\n'
        "# TYPE vllm:gpu_prefix_cache_hits_total counter\n"
        'vllm:gpu_prefix_cache_hits_total{engine="0"} 10.0\n'
    )
    assert _one(MetricsReader().read(text), "usage")["prefix_cache_hit_ratio"] == 0.8


def test_sglang_used_tokens_fallback_and_precedence() -> None:
    both = 'sglang:num_used_tokens{tp_rank="0"} 100.0\nsglang:kv_used_tokens{tp_rank="0"} 90.0\n'
    assert _one(MetricsReader().read(both), "usage")["used_tokens"] == 100
    new_only = 'sglang:kv_used_tokens{tp_rank="0"} 90.0\n'
    assert _one(MetricsReader().read(new_only), "usage")["used_tokens"] == 90


def test_sglang_mamba_slots() -> None:
    text = 'sglang:mamba_usage{tp_rank="0"} 0.5\nsglang:mamba_used_tokens{tp_rank="0"} 64.0\n'
    usage = _one(MetricsReader().read(text), "usage")
    assert (usage["mamba_usage_ratio"], usage["mamba_used_slots"]) == (0.5, 64)


def test_untyped_counters_still_counted() -> None:
    """Text without TYPE lines (some re-exporters drop them): `_total` names are still counters."""
    reader = MetricsReader()
    reader.read('vllm:num_preemptions_total{engine="0"} 9.0\n')
    events = reader.read('vllm:num_preemptions_total{engine="0"} 1.0\n')
    assert isinstance(events[0], CounterReset)


# --- engine detection --------------------------------------------------------------------------------


def test_auto_detects_engine_once() -> None:
    reader = MetricsReader()
    assert reader.engine is None
    assert reader.read("process_cpu_seconds_total 1.5\n") == ()
    assert reader.engine is None
    reader.read(_text("sglang-0.5.7"))
    assert reader.engine == "sglang"


def test_fixed_engine_ignores_the_other_engines_names() -> None:
    assert MetricsReader("sglang").read(_text("vllm-0.10.1-v1")) == ()
    assert MetricsReader("vllm").read(_text("vllm-0.10.1-v1")) == _read("vllm-0.10.1-v1")


def test_bad_engine_choice_is_config_error() -> None:
    with pytest.raises(ConfigError):
        MetricsReader("tgi")  # type: ignore[arg-type]


# --- counter resets ----------------------------------------------------------------------------------


def _restarted(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


def test_counter_going_back_is_a_reset_event() -> None:
    reader = MetricsReader()
    text = _text("vllm-0.6.6-v0")
    reader.read(text)
    after = _restarted(
        text,
        'vllm:num_preemptions_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 51.0',
        'vllm:num_preemptions_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0',
    )
    events = reader.read(after)
    reset = events[0]
    assert isinstance(reset, CounterReset)
    assert (reset.metric, reset.previous, reset.current, reset.instance) == (
        "vllm:num_preemptions_total",
        51.0,
        2.0,
        "0",
    )
    # Facts of the new engine come after the reset, so the state files them in the new epoch.
    assert [type(e) for e in events[1:]] == [EngineSettings, PoolSized, UsageSample, Preemption]
    assert _one(events, "preemption")["total"] == 2
    # Growing again from the new value is no reset.
    again = after.replace('"} 2.0', '"} 5.0')
    assert not _kinds(reader.read(again), "counter_reset")


def test_one_reset_per_instance_even_when_every_counter_went_back() -> None:
    reader = MetricsReader()
    reader.read(_text("sglang-0.5.7"))
    zeroed = "\n".join(
        line.rsplit(" ", 1)[0] + " 0.0" if "_total{" in line else line
        for line in _text("sglang-0.5.7").splitlines()
    )
    events = reader.read(zeroed + "\n")
    assert len(_kinds(events, "counter_reset")) == 1


def test_created_timestamp_change_is_a_reset() -> None:
    """A restart whose counters already grew past the old values: `_created` still tells."""
    reader = MetricsReader()
    text = _text("vllm-0.10.1-v1")
    reader.read(text)
    later = text.replace("1.7644896e+09", "1.7644999e+09").replace(
        'vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 7.0',
        'vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 9.0',
    )
    events = reader.read(later)
    reset = events[0]
    assert isinstance(reset, CounterReset)
    assert reset.metric.endswith("_created")


def test_reset_of_one_dp_engine_only() -> None:
    reader = MetricsReader()
    text = _text("vllm-0.11.0-v1-dp2")
    reader.read(text)
    after = _restarted(
        text,
        'vllm:num_preemptions_total{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 3.0',
        'vllm:num_preemptions_total{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.0',
    )
    resets = _kinds(reader.read(after), "counter_reset")
    assert [r.instance for r in resets] == ["1"]


def test_cumulative_retraction_gauge_reset() -> None:
    reader = MetricsReader()
    text = _text("sglang-0.4.10-dp2-attention")
    reader.read(text)
    after = text.replace('tp_rank="0"} 17.0', 'tp_rank="0"} 1.0')
    events = reader.read(after)
    assert isinstance(events[0], CounterReset)
    assert events[0].metric == "sglang:total_retracted_reqs"


def test_gauges_going_down_are_not_resets() -> None:
    reader = MetricsReader()
    text = _text("sglang-0.5.7")
    reader.read(text)
    assert not _kinds(reader.read(text.replace("23110.0", "100.0")), "counter_reset")


def test_fleet_never_sees_a_negative_rate() -> None:
    """Scrapes across an engine restart: the exported preemption counter only goes up."""
    reader, fleet = MetricsReader(), Fleet(clock=lambda: 1000.0)
    text = _text("vllm-0.6.6-v0")
    series = ["51.0", "60.0", "2.0", "4.0"]
    totals = []
    for value in series:
        fleet.apply_all("vllm-a", reader.read(text.replace('"} 51.0', f'"}} {value}')))
        totals.append(fleet.snapshot()[0].preemptions_total)
    assert totals == [51, 60, 62, 64]
    snap = fleet.snapshot()[0]
    assert (snap.counter_resets, snap.restarts, snap.epoch) == (1, 1, 2)
    # The new epoch holds the pool again (re-read on every scrape).
    assert snap.pool.blocks == 27895


# --- rates from counters -----------------------------------------------------------------------------


def _prefix_text(hits: float, queries: float) -> str:
    return (
        "# TYPE vllm:prefix_cache_queries_total counter\n"
        f'vllm:prefix_cache_queries_total{{engine="0"}} {queries}\n'
        "# TYPE vllm:prefix_cache_hits_total counter\n"
        f'vllm:prefix_cache_hits_total{{engine="0"}} {hits}\n'
    )


def test_prefix_hit_ratio_between_scrapes() -> None:
    reader = MetricsReader()
    first = _one(reader.read(_prefix_text(10, 100)), "usage")
    assert first["prefix_cache_hit_ratio"] == 0.1  # since engine start
    second = _one(reader.read(_prefix_text(60, 200)), "usage")
    assert second["prefix_cache_hit_ratio"] == 0.5  # 50 of the last 100
    # Idle: no query between scrapes -> no new ratio (the last one stands in the state).
    assert not _kinds(reader.read(_prefix_text(60, 200)), "usage")
    # Restart: back to the ratio since the (new) start.
    events = reader.read(_prefix_text(3, 4))
    assert isinstance(events[0], CounterReset)
    assert _one(events, "usage")["prefix_cache_hit_ratio"] == 0.75


def test_sglang_per_interval_retractions() -> None:
    """0.5.3-0.5.6: only the per-interval gauge; a repeated value is the same (stale) report."""
    reader = MetricsReader()
    text = _text("sglang-0.5.5-mamba")
    counts = []
    for value in ["2.0", "2.0", "3.0", "0.0", "3.0"]:
        events = reader.read(
            text.replace(
                'pid="7310",pp_rank="0",tp_rank="0"} 2.0', f'pid="7310",pp_rank="0",tp_rank="0"}} {value}'
            )
        )
        counts.append(_one(events, "preemption")["count"])
    assert counts == [2, 0, 3, 0, 3]


def test_sglang_counter_wins_over_interval_gauge() -> None:
    text = _text("sglang-0.5.7").replace(
        'pid="4242",pp_rank="0",tp_rank="0"} 0.0', 'pid="4242",pp_rank="0",tp_rank="0"} 5.0'
    )
    preemption = _one(MetricsReader().read(text), "preemption")
    assert preemption == {
        "engine": "sglang",
        "instance": "0",
        "rank": 0,
        "origin": "metrics",
        "kind": "preemption",
        "mechanism": "retract",
        "total": 3,
    }


# --- bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>Not Found</body></html>\n",
        "garbage here\n",
        "vllm:kv_cache_usage_perc{engine=0} 0.5\n",
        "vllm:kv_cache_usage_perc{} \n",
        "\x00\x01\x02\n",
    ],
)
def test_not_exposition_text_is_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        MetricsReader().read(text)


def test_unusable_values_are_skipped_and_counted() -> None:
    reader = MetricsReader()
    text = (
        'vllm:kv_cache_usage_perc{engine="0"} NaN\n'
        'vllm:num_requests_running{engine="0"} -3.0\n'
        'vllm:num_requests_waiting{engine="0"} 4.0\n'
        'vllm:cache_config_info{block_size="1e309",engine="0",num_gpu_blocks="lots",gpu_memory_utilization="0.9"} 1.0\n'
    )
    events = reader.read(text)
    assert _one(events, "usage") == {
        "engine": "vllm",
        "instance": "0",
        "origin": "metrics",
        "kind": "usage",
        "waiting": 4,
    }
    assert not _kinds(events, "pool")  # neither blocks nor block_size was usable
    assert _one(events, "settings")["gpu_memory_utilization"] == 0.9
    assert "block_size" not in _one(events, "settings")
    assert reader.bad_values == 4


def test_empty_text_is_no_events() -> None:
    assert MetricsReader().read("") == ()
    assert MetricsReader("vllm").read("") == ()


_LINE = st.one_of(
    st.text(max_size=80),
    st.builds(
        lambda name, key, val, num: f'{name}{{{key}="{val}"}} {num}',
        st.sampled_from(
            [
                "vllm:kv_cache_usage_perc",
                "vllm:num_preemptions_total",
                "vllm:cache_config_info",
                "sglang:token_usage",
                "sglang:num_retracted_reqs",
                "sglang:max_total_num_tokens",
                "ray_vllm_num_requests_running",
            ]
        ),
        st.sampled_from(["engine", "tp_rank", "dp_rank", "num_gpu_blocks", "block_size", "pid"]),
        st.one_of(
            st.text(alphabet="0123456789abN.-e+²", max_size=8), st.sampled_from(["1e309", "inf", "nan"])
        ),
        st.one_of(st.floats(allow_nan=True), st.sampled_from(["NaN", "+Inf", "-1", "1e309", "x"])),
    ),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.lists(_LINE, max_size=8).map("\n".join), min_size=1, max_size=3))
def test_anything_is_events_or_parse_error(texts: list[str]) -> None:
    """Arbitrary text, several scrapes in a row: a tuple of valid events or ParseError, nothing else."""
    reader = MetricsReader()
    for text in texts:
        try:
            events = reader.read(text)
        except ParseError:
            continue
        for event in events:
            assert event.origin == "metrics"
            for value in _facts(event).values():
                assert not (isinstance(value, float) and math.isnan(value))
            assert event_from_json(event_to_json(event)) == event


# --- the log / metrics cross-check (kvwatch.state.fleet) ---------------------------------------------------


def _log_pool(**facts: Any) -> PoolSized:
    return PoolSized(engine="vllm", origin="log", **facts)


def test_cross_check_agreeing_pool() -> None:
    fleet = Fleet(clock=lambda: 1.0)
    fleet.apply("a", _log_pool(blocks=27895, block_size=16))
    fleet.apply_all("a", _read("vllm-0.6.6-v0"))
    snap = fleet.snapshot()[0]
    assert snap.disagreements == {}
    assert snap.pool.blocks == 27895


def test_cross_check_pool_blocks_disagree() -> None:
    fleet = Fleet(clock=lambda: 1.0)
    fleet.apply("a", _log_pool(blocks=27000, block_size=16))
    fleet.apply_all("a", _read("vllm-0.6.6-v0"))
    snap = fleet.snapshot()[0]
    assert snap.disagreements == {"pool_blocks": 1}
    assert snap.last_disagreement == LastDisagreement("pool_blocks", 27000.0, 27895.0)


def test_cross_check_pool_tokens_from_either_side_first() -> None:
    """SGLang: the log's max_total_num_tokens vs sglang:max_total_num_tokens, metrics read first."""
    fleet = Fleet(clock=lambda: 1.0)
    fleet.apply_all("s", _read("sglang-0.5.7"))
    fleet.apply("s", PoolSized(engine="sglang", origin="log", tokens=442181))
    assert fleet.snapshot()[0].disagreements == {}
    fleet.apply("s", PoolSized(engine="sglang", origin="log", tokens=440000))
    snap = fleet.snapshot()[0]
    assert snap.disagreements == {"pool_tokens": 1}
    assert snap.last_disagreement == LastDisagreement("pool_tokens", 440000.0, 442181.0)


def test_cross_check_usage_beyond_rounding() -> None:
    fleet = Fleet(clock=lambda: 1.0)
    # SGLang prints token usage with 2 decimals: 0.05 vs an exact 0.0523 is rounding, not a disagreement.
    fleet.apply("s", UsageSample(engine="sglang", origin="log", kv_usage_ratio=0.0523))
    fleet.apply_all("s", _read("sglang-0.5.7"))
    assert fleet.snapshot()[0].disagreements == {}
    fleet.apply("s", UsageSample(engine="sglang", origin="log", kv_usage_ratio=0.31))
    snap = fleet.snapshot()[0]
    assert snap.disagreements == {"kv_usage_ratio": 1}
    assert snap.last_disagreement == LastDisagreement("kv_usage_ratio", 0.31, 0.05)


def test_disagreement_event_from_elsewhere_is_recorded() -> None:
    fleet = Fleet(clock=lambda: 1.0)
    fleet.apply(
        "a",
        Disagreement(engine="vllm", origin="metrics", fact="block_size", log_value=16.0, metrics_value=32.0),
    )
    assert fleet.snapshot()[0].disagreements == {"block_size": 1}


# --- one restart, two witnesses (kvwatch.state.fleet) ------------------------------------------------------

_BANNER = EngineSettings(engine="vllm", origin="log", starts_engine=True, version="0.6.6")
_LOG_POOL = PoolSized(engine="vllm", origin="log", blocks=27895, block_size=16, tokens=446320)


def _scrape(value: str) -> str:
    return _text("vllm-0.6.6-v0").replace('"} 51.0', f'"}} {value}')


def test_restart_seen_by_the_log_first_keeps_the_log_pool() -> None:
    """The banner opens the new epoch; the counter reset /metrics shows next is the same restart."""
    reader, fleet = MetricsReader(), Fleet(clock=lambda: 1.0)
    fleet.apply_all("a", [_BANNER, _LOG_POOL])
    fleet.apply_all("a", reader.read(_scrape("51.0")))
    fleet.apply_all("a", [_BANNER, _LOG_POOL])  # the engine restarts; its log says so first
    fleet.apply_all("a", reader.read(_scrape("0.0")))  # /metrics is back, counters from zero
    snap = fleet.snapshot()[0]
    assert (snap.restarts, snap.epoch, snap.counter_resets) == (1, 2, 1)
    assert snap.pool.tokens == 446320  # printed once, in the log; not dropped by the reset
    assert snap.preemptions_total == 51


def test_restart_seen_by_metrics_first_opens_one_epoch() -> None:
    reader, fleet = MetricsReader(), Fleet(clock=lambda: 1.0)
    fleet.apply_all("a", [_BANNER, _LOG_POOL])
    fleet.apply_all("a", reader.read(_scrape("51.0")))
    fleet.apply_all("a", reader.read(_scrape("1.0")))  # the scrape wins the race
    fleet.apply_all("a", [_BANNER, _LOG_POOL])  # the log of the same restart arrives later
    snap = fleet.snapshot()[0]
    assert (snap.restarts, snap.epoch, snap.counter_resets) == (1, 2, 1)
    assert snap.pool.blocks == 27895 and snap.pool.tokens == 446320
    assert snap.preemptions_total == 52


def test_first_scrape_before_the_log_banner_is_no_restart() -> None:
    """kvwatch starts, scrapes, then reads the engine's log from its beginning."""
    fleet = Fleet(clock=lambda: 1.0)
    fleet.apply_all("a", MetricsReader().read(_scrape("51.0")))
    fleet.apply_all("a", [_BANNER, _LOG_POOL])
    snap = fleet.snapshot()[0]
    assert (snap.restarts, snap.epoch) == (0, 1)
    assert snap.usage.kv_usage_ratio == 0.6834


def test_preemptions_reported_by_log_and_metrics_are_counted_once() -> None:
    """V1: the log's per-interval 'Preemptions: N' and /metrics' counter are the same evictions."""
    reader, fleet = MetricsReader(), Fleet(clock=lambda: 1.0)
    log = [Preemption(engine="vllm", origin="log", count=n) for n in (3, 2)]
    fleet.apply_all("a", reader.read(_scrape("0.0")))
    fleet.apply("a", log[0])
    fleet.apply_all("a", reader.read(_scrape("3.0")))
    assert fleet.snapshot()[0].preemptions_total == 3
    fleet.apply_all("a", reader.read(_scrape("5.0")))
    fleet.apply("a", log[1])
    assert fleet.snapshot()[0].preemptions_total == 5
    # Whichever witness is ahead sets the count; the other catching up adds nothing.
    fleet.apply("a", Preemption(engine="vllm", origin="log", count=4))
    assert fleet.snapshot()[0].preemptions_total == 9
    fleet.apply_all("a", reader.read(_scrape("9.0")))
    assert fleet.snapshot()[0].preemptions_total == 9


def test_usage_compared_only_when_both_are_recent() -> None:
    """vLLM V1 stops logging stats when idle: its last usage line is not compared with later scrapes."""
    now = [0.0]
    fleet = Fleet(clock=lambda: now[0])
    fleet.apply("s", UsageSample(engine="sglang", origin="log", kv_usage_ratio=0.41))
    now[0] = 100.0
    fleet.apply_all("s", _read("sglang-0.5.7"))  # 0.05, but the log figure is 100 s old
    assert fleet.snapshot()[0].disagreements == {}
    now[0] = 110.0
    fleet.apply("s", UsageSample(engine="sglang", origin="log", kv_usage_ratio=0.41))  # scrape 10 s old
    assert fleet.snapshot()[0].disagreements == {"kv_usage_ratio": 1}


def test_sglang_priority_breakdown_uses_the_total() -> None:
    """0.5.10+ priority scheduling: the total under priority="", the breakdown under priority="N"."""
    text = (
        'sglang:num_queue_reqs{priority="1",tp_rank="0"} 3.0\n'
        'sglang:num_queue_reqs{priority="",tp_rank="0"} 5.0\n'
        'sglang:num_queue_reqs{priority="2",tp_rank="0"} 2.0\n'
    )
    assert _one(MetricsReader().read(text), "usage")["waiting"] == 5
