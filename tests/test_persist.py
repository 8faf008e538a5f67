"""State file: round trip, atomic replacement, unusable files ignored, counters continue after restore."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvwatch.errors import ConfigError
from kvwatch.events import EngineSettings, PoolSized, Preemption
from kvwatch.persist import STATE_FILE, StateStore, restore
from kvwatch.state import Fleet


def _fleet() -> Fleet:
    fleet = Fleet(clock=lambda: 1000.0)
    fleet.apply("v", EngineSettings(engine="vllm", starts_engine=True, version="0.9.2", max_model_len=8192))
    fleet.apply("v", PoolSized(engine="vllm", tokens=428560, blocks=26785, block_size=16))
    fleet.apply("v", Preemption(engine="vllm", total=3))
    return fleet


def test_round_trip(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state")
    positions = {"v": {"/log/a.log": {"dev": 1, "inode": 2, "offset": 300}}}
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
    assert StateStore.encode(fleet, saved.positions) == old


def test_a_fact_this_version_does_not_know_is_ignored(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    text = StateStore.encode(_fleet(), {}).replace(
        '"max_model_len":8192', '"max_model_len":8192,"retired_fact":1'
    )
    (tmp_path / STATE_FILE).write_text(text)
    (st,) = store.load().instances
    assert st.settings.max_model_len == 8192
