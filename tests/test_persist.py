"""State file: round trip, atomic replacement, unusable files ignored, counters continue after restore."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from kvwatch.core.errors import ConfigError
from kvwatch.core.events import EngineSettings, PoolSized, Preemption
from kvwatch.core.jsontypes import JsonObject
from kvwatch.state.fleet import Fleet, InstanceState
from kvwatch.state.persist import STATE_FILE, StateStore, restore


def _fleet() -> Fleet:
    fleet = Fleet(clock=lambda: 1000.0)
    fleet.apply("v", EngineSettings(engine="vllm", starts_engine=True, version="0.9.2", max_model_len=8192))
    fleet.apply("v", PoolSized(engine="vllm", tokens=428560, blocks=26785, block_size=16))
    fleet.apply("v", Preemption(engine="vllm", total=3))
    return fleet


def test_round_trip(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    positions: JsonObject = {"v": {"/log/a.log": {"dev": 1, "inode": 2, "offset": 300}}}
    assert store.save(_fleet(), positions)
    saved = StateStore(tmp_path / "state").load()
    assert saved.positions == positions
    fleet = Fleet()
    restore(fleet, saved)
    (snap,) = fleet.snapshot()
    assert snap.pool.tokens == 428560
    assert snap.settings.max_model_len == 8192
    assert snap.preemptions_total == 3
    # The cumulative mark survives: the same V0 total re-read is not counted again, a higher one adds.
    fleet.apply("v", Preemption(engine="vllm", total=3))
    fleet.apply("v", Preemption(engine="vllm", total=5))
    assert fleet.snapshot()[0].preemptions_total == 5


def test_replace_is_atomic_and_leaves_no_temp(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(_fleet(), {})
    first = (tmp_path / STATE_FILE).stat().st_ino
    store.save(_fleet(), {"x": 1})
    assert (tmp_path / STATE_FILE).stat().st_ino != first  # a new file renamed over, not rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == [STATE_FILE]
    assert store.writes == 2


@pytest.mark.parametrize("content", ["{not json", '{"version": 99, "instances": []}', '{"version": 1}', "[]"])
def test_unusable_file_starts_fresh(tmp_path: Path, content: str) -> None:
    (tmp_path / STATE_FILE).write_text(content, encoding="utf-8")
    saved = StateStore(tmp_path).load()
    assert saved.instances == [] and saved.positions == {}


def test_missing_file_is_empty(tmp_path: Path) -> None:
    assert StateStore(tmp_path).load().instances == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_dir_is_config_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(ConfigError, match="not writable"):
        StateStore(ro)


def test_state_dir_that_is_a_file_is_config_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match="cannot create state dir"):
        StateStore(tmp_path / "f")


def test_write_failure_is_counted(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s")
    (tmp_path / "s").rename(tmp_path / "gone")
    assert not store.save(_fleet(), {})
    assert store.write_errors == 1


def test_a_file_written_before_typed_state_loads_and_is_written_back_unchanged(tmp_path: Path) -> None:
    """The facts are typed dataclasses now; the file keeps the form kvwatch wrote when they were dicts."""
    old = (Path(__file__).parent / "state_files" / "format1-before-typed-state.json").read_text()
    (tmp_path / STATE_FILE).write_text(old)
    saved = StateStore(tmp_path).load()
    assert len(saved.instances) == 3
    fleet = Fleet(clock=lambda: 1000.0)
    restore(fleet, saved)
    snaps = fleet.snapshot()
    assert any(s.last_failure is not None and s.last_failure.reason for s in snaps)
    assert any(s.last_disagreement is not None for s in snaps)
    assert all(s.pool.tokens or s.pool.blocks or s.last_failure for s in snaps)
    # Written back unchanged, but for the two fields main added since (per-fact staleness, refused
    # values), which such a file does not have: they are saved empty.
    data = json.loads(old)
    for inst in data["instances"]:
        inst.update(fact_seen={}, bad_values={})
    assert StateStore.encode(fleet, saved.positions) == json.dumps(
        data, separators=(",", ":"), sort_keys=True
    )


def test_a_file_main_wrote_with_staleness_and_refused_values_loads_and_is_written_back_unchanged(
    tmp_path: Path,
) -> None:
    """Written by kvwatch at 8bd9b45 (dict facts; fact_seen and bad_values): the typed state loads
    every fact of it, and saving gives the same bytes."""
    old = (Path(__file__).parent / "state_files" / "format1-main-8bd9b45.json").read_text()
    (tmp_path / STATE_FILE).write_text(old)
    store = StateStore(tmp_path)
    saved = store.load()
    assert store.invalid_files == 0
    by_key = {(st.source, st.instance): st for st in saved.instances}
    v0, v1, s0 = by_key[("v", "0")], by_key[("v", "1")], by_key[("s", "0")]
    assert v0.bad_values == {"kv_usage_ratio": 1, "running": 1}
    assert v0.fact_seen["metrics:kv_usage_ratio"] == 1010.0
    assert v0.settings.enforce_eager is False and v0.settings.engine_generation == "v1"
    assert v0.settings.max_num_seqs == 256 and v0.memory.total_bytes == 85_000_000_000
    assert v0.usage.kv_usage_ratio == 0.41 and v0.usage.prompt_throughput == 1200.5
    assert v0.pools_by_origin[("metrics", "full")].blocks == 26785
    assert v0.last_disagreement is not None and v0.last_disagreement.fact == "kv_usage_ratio"
    assert v1.last_failure is not None and v1.last_failure.reason == "no_memory_for_cache"
    assert s0.restarts == 1 and s0.bad_values == {"mamba_usage_ratio": 1}
    fleet = Fleet(clock=lambda: 1030.0)
    restore(fleet, saved)
    snaps = {(s.source, s.instance): s for s in fleet.snapshot()}
    assert snaps[("v", "0")].stale[("metrics", "kv_usage_ratio")] is False
    assert StateStore.encode(fleet, saved.positions) == old
    # Much later every tracked fact is stale and the usage the log gave is no longer exported.
    late = Fleet(clock=lambda: 5000.0)
    restore(late, StateStore(tmp_path).load())
    snap = {(s.source, s.instance): s for s in late.snapshot()}[("v", "0")]
    assert all(snap.stale.values()) and snap.usage.kv_usage_ratio is None
    assert snap.pool.tokens == 428560  # printed once by the log at startup: kept


@pytest.mark.parametrize(
    ("group", "facts"),
    [
        ("settings", {"max_model_len": "8192"}),
        ("settings", {"enforce_eager": 1}),
        ("settings", {"engine_generation": "v9"}),
        ("memory", {"weights_bytes": 1.5}),
        ("memory", {"weights_bytes": True}),
        ("usage", {"running": 0.5}),
        ("pools", {"fourth": {"tokens": 1}}),
        ("usage_seen", {"stdin": 1.0}),
        ("last_failure", {"needed_kv_bytes": 1}),
        ("last_failure", {"reason": "bored"}),
        ("last_disagreement", {"fact": "weather", "log_value": 1, "metrics_value": 2}),
    ],
)
def test_a_value_the_typed_facts_cannot_hold_sets_the_file_aside(
    tmp_path: Path, group: str, facts: dict[str, object]
) -> None:
    """The schema checks JSON types and ranges; a value of the right JSON type that its fact cannot
    hold (a string count, a word outside a Literal, a pool kind or origin kvwatch does not know)
    fails when the typed record is built, and the file is set aside like any other unusable one."""
    (tmp_path / STATE_FILE).write_text(_with(group, facts), encoding="utf-8")
    store = StateStore(tmp_path)
    assert store.load().instances == []
    assert store.invalid_files == 1 and len(_set_aside(tmp_path)) == 1


def test_an_int_saved_for_a_float_fact_loads_as_a_float(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text(_with("settings", {"gpu_memory_utilization": 1}), encoding="utf-8")
    (st,) = StateStore(tmp_path).load().instances
    assert st.settings.gpu_memory_utilization == 1.0 and isinstance(st.settings.gpu_memory_utilization, float)


def test_a_fact_this_version_does_not_know_is_ignored(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    text = StateStore.encode(_fleet(), {}).replace(
        '"max_model_len":8192', '"max_model_len":8192,"retired_fact":1'
    )
    (tmp_path / STATE_FILE).write_text(text)
    (st,) = store.load().instances
    assert st.settings.max_model_len == 8192


# --- the state file as untrusted input ----------------------------------------------------------
def _valid_text() -> str:
    return StateStore.encode(_fleet(), {"v": {"/log/a.log": {"dev": 1, "inode": 2, "offset": 300}}})


def _with(field: str, value: object) -> str:
    import json

    data = json.loads(_valid_text())
    data["instances"][0][field] = value
    return json.dumps(data)


def _set_aside(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob(f"{STATE_FILE}.corrupt-*"))


@pytest.mark.parametrize(
    "content",
    [
        _with("epoch_started", "now"),
        _with("preemptions_total", "abc"),
        _with("preemptions_total", -5),
        _with("preemptions_total", 1e308),
        _with("restarts", 10**30),
        _with("epoch_started", -1.0),
        _with("engine", "banana"),
        _with("memory", {"weights_bytes": 10**400}),
        _with("settings", {"max_model_len": [1, 2, 3]}),
        _with("pools", {"full": "not a mapping"}),
        _with("startup_failures", {"no_memory_for_cache": -1}),
        _with("retractions", "yes"),
        _valid_text().replace('"offset":300', '"offset":{"deep":[1]}'),
        _valid_text().replace("1000.0", "NaN", 1),
        '{"version": 99, "instances": []}',
        '{"version": 1}',
        "[]",
        "{not json",
    ],
)
def test_wrong_state_file_is_moved_aside_counted_and_fresh(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / STATE_FILE).write_text(content, encoding="utf-8")
    store = StateStore(tmp_path)
    saved = store.load()
    assert saved.instances == [] and saved.positions == {} and saved.source_settings == {}
    assert store.invalid_files == 1
    (aside,) = _set_aside(tmp_path)
    assert aside.read_text(encoding="utf-8") == content  # kept for a person, unchanged
    assert not (tmp_path / STATE_FILE).exists()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "moved to" in warnings[0].getMessage()
    assert StateStore(tmp_path).load().instances == []  # nothing left to complain about
    assert len(_set_aside(tmp_path)) == 1


def test_binary_state_file_is_moved_aside(tmp_path: Path) -> None:
    raw = b'{"version": 1, "instances": [], "x": "\xff\xfe\x00\x81"}'
    (tmp_path / STATE_FILE).write_bytes(raw)
    store = StateStore(tmp_path)
    assert store.load().instances == []
    assert store.invalid_files == 1
    (aside,) = _set_aside(tmp_path)
    assert aside.read_bytes() == raw


@pytest.mark.parametrize("where", ["top", "settings"])
def test_deeply_nested_state_file_is_moved_aside(tmp_path: Path, where: str) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    if where == "top":
        content = '{"version": 1, "instances": ' + deep + "}"
    else:
        content = _with("settings", {"x": 0}).replace('{"x": 0}', '{"x": ' + deep + "}")
    (tmp_path / STATE_FILE).write_text(content, encoding="utf-8")
    store = StateStore(tmp_path)
    assert store.load().instances == []
    assert store.invalid_files == 1 and len(_set_aside(tmp_path)) == 1


def test_valid_file_passes_validation_unchanged(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text(_valid_text(), encoding="utf-8")
    store = StateStore(tmp_path)
    saved = store.load()
    assert store.invalid_files == 0 and not _set_aside(tmp_path)
    fleet = Fleet()
    restore(fleet, saved)
    assert StateStore.encode(fleet, saved.positions) == _valid_text()


def test_saved_schema_covers_every_instance_field() -> None:
    from kvwatch.state.persist import _schema

    instance = _schema().model_fields["instances"].annotation.__args__[0]  # type: ignore[union-attr]
    assert set(instance.model_fields) == {f.name for f in dataclasses.fields(InstanceState)}


def test_restore_keeps_at_most_the_cap_most_recent_first() -> None:
    big = Fleet(max_instances=10_000)
    for i in range(5000):
        big.apply("v", PoolSized(engine="vllm", instance=str(i), tokens=1000 + i))
    states = big.instances()
    for i, st in enumerate(states):
        st.last_update = {"log": float(i)}
    fleet = Fleet(max_instances=256)
    assert fleet.restore(states, {}) == 5000 - 256
    kept = fleet.snapshot()
    assert len(kept) == 256
    assert {s.instance for s in kept} == {st.instance for st in states[-256:]}
    # The cap still holds for new instances afterwards.
    fleet.apply("v", PoolSized(engine="vllm", instance="new", tokens=1))
    assert len(fleet.snapshot()) == 256 and fleet.dropped_events == 1


def test_kill_9_during_save_leaves_a_temp_file_that_the_next_start_removes(tmp_path: Path) -> None:
    import subprocess
    import sys

    state = tmp_path / "state"
    StateStore(state).save(_fleet(), {})
    before = (state / STATE_FILE).read_text(encoding="utf-8")
    # A save killed between writing its temporary file and renaming it over the state file.
    child = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from kvwatch.state.persist import StateStore\n"
        "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
        "StateStore(Path(sys.argv[1])).write('{\"half\": ')\n"
    )
    done = subprocess.run([sys.executable, "-c", child, str(state)], timeout=60, check=False)
    assert done.returncode == -9
    leftovers = list(state.glob(".kvwatch-state.*.tmp"))
    assert len(leftovers) == 1
    store = StateStore(state)
    assert not list(state.glob(".kvwatch-state.*.tmp"))
    assert (state / STATE_FILE).read_text(encoding="utf-8") == before
    assert store.load().instances[0].preemptions_total == 3
