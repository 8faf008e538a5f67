"""Issue 22, case 2 and the state file: no value a log line or a /metrics body carries breaks /metrics
or a restart.

'GPU KV cache size: 1' + 309 zeros made every scrape a 500 (OverflowError in the collector), again
after a restart; a pool above 2^63 was saved into a state file its own loader set aside. Every
number of every event now has a plausibility bound (kvwatch.core.events.PLAUSIBLE) that the state
applies before the value enters, counted per fact; the collector skips and counts what it cannot
format; and any state the fleet accepts saves and loads back equal.
"""

from __future__ import annotations

import functools
import math
import types
from typing import Any, Literal, Union, get_args, get_origin
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvwatch.analysis.predictor import Predictor
from kvwatch.core import events as ev
from kvwatch.export import names
from kvwatch.export.collector import KvwatchCollector
from kvwatch.sources.metrics_reader import MetricsReader
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.state import persist
from kvwatch.state.facts import PoolFacts
from kvwatch.state.fleet import Fleet, InstanceState
from kvwatch.state.persist import StateStore

_EVENTS = (ev.EngineSettings, ev.MemoryBudget, ev.PoolSized, ev.UsageSample, ev.Preemption, ev.StartupFailure)


def _render(fleet: Fleet) -> str:
    return KvwatchCollector(fleet.snapshot, Predictor()).render().decode()


def _sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.split("{", 1)[0].split(" ", 1)[0] == name and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_pool_of_a_309_digit_log_line_is_refused_counted_and_metrics_still_answers() -> None:
    fleet = Fleet(clock=lambda: 1000.0)
    pipeline = LinePipeline("v", fleet, engine="vllm")
    pipeline.feed("GPU KV cache size: 1" + "0" * 309 + " tokens")
    assert _sample(_render(fleet), names.KV_POOL_TOKENS.sample_name) is None  # was: OverflowError
    pipeline.feed("GPU KV cache size: 1" + "0" * 30 + " tokens")  # was: a pool of 1e30 exported
    text = _render(fleet)
    assert _sample(text, names.KV_POOL_TOKENS.sample_name) is None
    assert _sample(text, names.BAD_VALUES.sample_name, fact="tokens") == 2.0
    pipeline.feed("GPU KV cache size: 434,448 tokens")  # a real pool still enters
    assert _sample(_render(fleet), names.KV_POOL_TOKENS.sample_name) == 434448.0


def test_implausible_numbers_on_an_engines_metrics_are_refused_counted_and_metrics_still_answers() -> None:
    body = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="1e300",engine="0"} 1.0\n'
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 1e300\n'
        "# TYPE vllm:num_preemptions_total counter\n"
        'vllm:num_preemptions_total{engine="0",model_name="m"} 1e300\n'
    )
    fleet = Fleet(clock=lambda: 1000.0)
    fleet.apply_all("m", MetricsReader("vllm").read(body))
    (snap,) = fleet.snapshot()
    assert dict(snap.bad_values) == {"blocks": 1, "running": 1, "total": 1}  # was: running only
    text = _render(fleet)  # was: a pool of 1e300 blocks exported, and saved into an unloadable file
    assert _sample(text, names.KV_POOL_BLOCKS.sample_name) is None
    assert _sample(text, names.PREEMPTIONS.sample_name) == 0.0
    StateStore._decode(StateStore.encode(fleet, {}).encode())


def test_a_refused_fact_leaves_the_rest_of_its_event() -> None:
    fleet = Fleet(clock=lambda: 1000.0)
    fleet.apply("v", ev.EngineSettings(engine="vllm", tensor_parallel_size=10**6, max_model_len=8192))
    fleet.apply("v", ev.MemoryBudget(engine="vllm", total_bytes=2**70, weights_bytes=2**34))
    fleet.apply("v", ev.EngineSettings(engine="vllm", model="m" * 5000, gpu_memory_utilization=0.9))
    (snap,) = fleet.snapshot()
    assert snap.settings.tensor_parallel_size is None and snap.settings.max_model_len == 8192
    assert snap.memory.total_bytes is None and snap.memory.weights_bytes == 2**34
    assert snap.settings.model is None and snap.settings.gpu_memory_utilization == 0.9
    assert dict(snap.bad_values) == {"model": 1, "tensor_parallel_size": 1, "total_bytes": 1}


def _numeric(annotation: Any) -> bool:
    args = set(get_args(annotation)) if get_origin(annotation) in (Union, types.UnionType) else {annotation}
    return bool(args & {int, float})


def test_every_number_of_every_event_has_a_plausibility_bound() -> None:
    for cls in _EVENTS:
        for name, info in cls.model_fields.items():
            if _numeric(info.annotation):
                assert name in ev.PLAUSIBLE, f"{cls.__name__}.{name} has no bound in PLAUSIBLE"
    for low, high in ev.PLAUSIBLE.values():
        assert math.isfinite(low) and math.isfinite(high) and -(2**53) <= low < high <= 2**53


def test_the_collector_skips_and_counts_a_value_past_every_float() -> None:
    """Defence in depth: a state value that slipped past the bounds costs its sample, not the scrape."""
    fleet = Fleet(clock=lambda: 1000.0)
    state = InstanceState(source="v", engine="vllm", instance="0")
    state.pools["full"] = PoolFacts(tokens=10**400, blocks=7)
    # Printed by the log: a startup fact, exported for the whole epoch.
    state.pools_by_origin[("log", "full")] = state.pools["full"]
    fleet.restore([state], {})
    before = _sample(_render(Fleet()), names.VALUES_UNEXPORTED.sample_name) or 0.0
    text = _render(fleet)  # was: OverflowError
    assert _sample(text, names.VALUES_UNEXPORTED.sample_name) == before + 1
    assert _sample(text, names.INSTANCES.sample_name) == 1.0


# --- the state file round-trips whatever the fleet accepts ----------------------------------------

_HUGE = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**63, 2**64, 10**30, 10**309, -(2**63) - 1, 2**40 + 1]),
)
_FLOAT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([2.0**64, 1e30, -1e30, 2.0**40])
)
_TEXT = st.one_of(st.text(max_size=12), st.just("m" * 5000))


def _field(annotation: Any) -> st.SearchStrategy[Any]:
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    options: list[st.SearchStrategy[Any]] = [st.none()] if type(None) in args else []
    for arg in args:
        if arg is bool:
            options.append(st.booleans())
        elif arg is int:
            options.append(_HUGE)
        elif arg is float:
            options.append(_FLOAT)
        elif arg is str:
            options.append(_TEXT)
        elif get_origin(arg) is Literal:
            options.append(st.sampled_from(get_args(arg)))
    return st.one_of(*options)


def _event(cls: type[ev._Event]) -> st.SearchStrategy[ev._Event]:
    skip = {"engine", "kind", "instance", "origin"}
    fields = {n: _field(i.annotation) for n, i in cls.model_fields.items() if n not in skip}
    return st.builds(
        cls,
        engine=st.just("vllm"),
        instance=st.sampled_from(["0", "1", "i" * 300]),
        origin=st.sampled_from(["log", "metrics"]),
        **fields,
    )


_ANY_EVENT = st.one_of(*(_event(cls) for cls in _EVENTS))
_STATE_SCHEMA = functools.cache(persist._schema)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ANY_EVENT, max_size=12))
def test_any_state_the_fleet_accepts_saves_and_loads_back_equal(events: list[ev._Event]) -> None:
    fleet = Fleet(clock=lambda: 1000.0)
    for event in events:
        fleet.apply("v", event)  # type: ignore[arg-type]
    text = StateStore.encode(fleet, {})
    # _decode builds the state file's model at each load (a running sidecar keeps no validator);
    # it is the same model every time, so the examples share one built once (most of their time).
    with mock.patch.object(persist, "_schema", _STATE_SCHEMA):
        saved = StateStore._decode(text.encode())  # was: '_Unusable: invalid at ...' for a pool of 2^64
    again = Fleet(clock=lambda: 1000.0)
    again.restore(saved.instances, saved.source_settings)
    assert StateStore.encode(again, {}) == text
    _render(again)


def test_preemptions_stop_at_the_largest_count_the_state_file_holds() -> None:
    """Millions of 'Preemptions: 2^40' lines pass 2^63: the counter stops there, the file stays loadable."""
    fleet = Fleet(clock=lambda: 1000.0)
    state = InstanceState(source="v", engine="vllm", instance="0")
    state.preemptions_total = 2**63 - 10
    state.preemption_epoch["log"] = 2**63 - 10
    fleet.restore([state], {})
    fleet.apply("v", ev.Preemption(engine="vllm", count=2**40))
    (snap,) = fleet.snapshot()
    assert snap.preemptions_total == 2**63 - 1
    StateStore._decode(StateStore.encode(fleet, {}).encode())
