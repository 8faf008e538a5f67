"""The replay benchmark's own machinery: the busy-log generator and the mtail program.

``make bench`` trusts the generator's record of what it wrote to check kvwatch's answer, and
compares against bench/kvwatch.mtail; both are checked here on a small log (no timing).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kvwatch.commands.summary import summarize
from kvwatch.engines.sglang import fastpath as sglang_fastpath
from kvwatch.engines.vllm import fastpath
from kvwatch.sources.pipeline import replay

ROOT = Path(__file__).resolve().parent.parent
LINES = 6000


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_busy_log", ROOT / "bench" / "gen_busy_log.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


@pytest.fixture(scope="module")
def busy_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    path = tmp_path_factory.mktemp("busy") / "busy.log"
    return path, gen.generate(path, LINES, seed=7)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "c.log"
    gen.generate(a, 3000, seed=1)
    gen.generate(b, 3000, seed=1)
    gen.generate(c, 3000, seed=2)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_log_is_startup_then_access_and_stats_lines(busy_log: tuple[Path, dict[str, object]]) -> None:
    path, facts = busy_log
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == LINES == facts["lines"]
    startup = int(str(facts["startup_lines"]))
    body = lines[startup:]
    access = [x for x in body if ' HTTP/1.1" ' in x]
    stats = [x for x in body if "] Engine 000: Avg prompt throughput" in x]
    assert len(access) + len(stats) == len(body)
    assert (len(access), len(stats)) == (facts["access_lines"], facts["stats_lines"])
    assert 0.015 < len(stats) / LINES < 0.017
    assert all(x.startswith("(APIServer pid=") for x in body)
    assert sum(1 for x in stats if "Preemptions: " in x) == facts["preemption_lines"]
    # The startup lines are the samples' own lines, verbatim.
    samples = {
        line
        for rel in (
            "vllm/032-v1-v014-pp3-apiserver-startup-config.log",
            "vllm/024-v1-2026-worker-tp0-engcore-prefix-qwen36-27b-2x3090.log",
        )
        for line in (ROOT / "tests" / "log_samples" / rel).read_text(encoding="utf-8").splitlines()
    }
    assert all(x in samples for x in lines[:startup])


def test_replay_finds_what_the_generator_put_in(busy_log: tuple[Path, dict[str, object]]) -> None:
    path, facts = busy_log
    result = replay([str(path)])
    summary: Any = summarize(result.snapshots(), result.engine)
    (inst,) = summary["instances"]
    last = facts["last_stats"]
    assert isinstance(last, dict)
    last = last["0"]
    assert inst["kv_pool_tokens"] == facts["kv_pool_tokens"] == 623873
    assert inst["preemptions_total"] == facts["preemptions_total"]
    assert (inst["requests_running"], inst["requests_waiting"]) == (last["running"], last["waiting"])
    assert inst["kv_usage_ratio"] == last["kv_usage_ratio"]
    assert result.pipelines[0].lines_read == LINES


@pytest.mark.parametrize("shape", gen.SHAPES)
def test_every_shape_replays_to_what_the_generator_put_in(tmp_path: Path, shape: str) -> None:
    path = tmp_path / f"{shape}.log"
    facts = gen.generate(path, LINES, seed=7, shape=shape)
    result = replay([str(path)])
    summary: Any = summarize(result.snapshots(), result.engine)
    assert summary["engine"] == ("sglang" if shape == "sglang" else "vllm")
    instances = {inst["instance"]: inst for inst in summary["instances"]}
    assert instances["0"]["kv_pool_tokens"] == facts["kv_pool_tokens"]
    assert (
        sum(inst["preemptions_total"] or 0 for inst in instances.values()) == facts["preemptions_total"] > 0
    )
    for name, last in facts["last_stats"].items():
        inst = instances[name]
        assert (inst["requests_running"], inst["requests_waiting"]) == (last["running"], last["waiting"])
        assert inst["kv_usage_ratio"] == last["kv_usage_ratio"]
    # (SGLang's retractions are lines of their own, beside the batch lines.)
    assert result.pipelines[0].lines_read == path.read_bytes().count(b"\n") >= LINES
    # The stats (vLLM) and batch (SGLang) lines are the fast path's to answer: the general path
    # must not see them.
    if shape != "sglang":
        stats = [x for x in path.read_bytes().split(b"\n") if b"Avg prompt throughput" in x]
        assert stats and all(row is not None for row in fastpath.parse_lines(stats))
    else:
        batch = [x for x in path.read_bytes().split(b"\n") if b" batch, #" in x]
        assert batch and all(row is not None for row in sglang_fastpath.parse_lines(batch))


def test_ensure_reuses_a_matching_file_and_rebuilds_a_changed_one(tmp_path: Path) -> None:
    path = tmp_path / "busy.log"
    gen.ensure(path, 3000, seed=3)
    before = path.stat().st_mtime_ns
    gen.ensure(path, 3000, seed=3)
    assert path.stat().st_mtime_ns == before
    with path.open("a", encoding="utf-8") as fh:
        fh.write("tampered\n")
    facts = gen.ensure(path, 3000, seed=3)
    assert path.stat().st_size == facts["bytes"]
    assert not path.read_text(encoding="utf-8").endswith("tampered\n")


@pytest.mark.integration
def test_mtail_program_extracts_the_same_facts(busy_log: tuple[Path, dict[str, object]], mtail: str) -> None:
    path, facts = busy_log
    out = subprocess.run(
        # -port 0: mtail serves HTTP even in one-shot mode; never collide with another mtail on :3903.
        [mtail, "-one_shot", "-one_shot_format", "json", "-logtostderr", "-port", "0"]
        + ["-progs", str(ROOT / "bench" / "kvwatch.mtail"), "-logs", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    values = {
        name: lv["Value"]["Value"]
        for name, metrics in json.loads(out.stdout).items()
        for metric in metrics
        for lv in metric.get("LabelValues", [])
    }
    last = facts["last_stats"]
    assert isinstance(last, dict)
    last = last["0"]
    assert values["kv_pool_tokens"] == facts["kv_pool_tokens"]
    assert values["preemptions_total"] == facts["preemptions_total"]
    assert (values["requests_running"], values["requests_waiting"]) == (last["running"], last["waiting"])
    assert values["kv_usage_ratio"] == pytest.approx(last["kv_usage_ratio"])
