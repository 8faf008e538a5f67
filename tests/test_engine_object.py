"""The engine as one object: resolved once by a command and carried down, its heavy parts built
on first use (engines/base.py Engine)."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

import pytest

from kvwatch.analysis import predict as analysis_predict
from kvwatch.capacity.deployment import Deployment, validate
from kvwatch.capacity.geometry import load_model
from kvwatch.cli import main
from kvwatch.engines import registry
from kvwatch.engines.base import Engine, EngineFlags, LogDialect
from kvwatch.engines.flags import FlagReading

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "model_configs" / "Qwen--Qwen3-32B.json"


P = ParamSpec("P")
R = TypeVar("R")


def _counting(calls: list[str], name: str, fn: Callable[P, R]) -> Callable[P, R]:
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        calls.append(name)
        return fn(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize(
    "args",
    [
        ["--gpu", "h100", "--json", "--", "--max-num-seqs", "128"],
        ["--json", "--", "--max-num-seqs", "128"],  # no card: the catalogue table
        ["--engine", "sglang", "--engine-version", "0.5.2", "--gpu", "h100", "--json"],
    ],
)
def test_predict_resolves_the_engine_once_reads_its_flags_once_validates_once(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(registry, "get", _counting(calls, "get", registry.get))
    monkeypatch.setattr(EngineFlags, "read", _counting(calls, "read", EngineFlags.read))
    monkeypatch.setattr(analysis_predict, "validate", _counting(calls, "validate", validate))
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["predict", str(CONFIG), *args]) == 0
    assert sorted(calls) == ["get", "read", "validate"]


def test_a_deployment_given_another_engine_is_refused() -> None:
    deployment = Deployment(engine="vllm", gpu_memory_bytes=80 * 2**30)
    with pytest.raises(ValueError, match="sglang engine"):
        analysis_predict.predict(load_model(CONFIG), deployment, registry.ENGINES["sglang"])


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_a_prediction_builds_no_log_metrics_or_observed_part(name: str) -> None:
    code = (
        "import sys, contextlib, io\n"
        "from kvwatch.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['predict', {str(CONFIG)!r}, '--engine', {name!r}, '--gpu', 'h100', '--json'])\n"
        "from kvwatch.engines.registry import ENGINES\n"
        "built = sorted(k for e in ENGINES.values() for k in ('log', 'metrics', 'capacity', 'observed') "
        "if k in vars(e))\n"
        "print(' '.join(built))\n"
        "print(' '.join(m for m in sys.modules if m.startswith('kvwatch.engines.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    built, modules = out.stdout.splitlines()
    assert built == "capacity"
    loaded = set(modules.split())
    assert f"kvwatch.engines.{name}.capacity" in loaded
    assert not {m for m in loaded if m.rsplit(".", 1)[-1] in ("log", "fastpath", "metrics", "observed")}


def test_an_engine_part_is_built_once_and_may_be_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[str] = []
    engine = registry.ENGINES["vllm"]
    fresh = Engine(
        name=engine.name,
        labels=engine.labels,
        known_versions=engine.known_versions,
        flags=engine.flags,
        anchors=engine.anchors,
        phrases=engine.phrases,
        build_log=_counting(builds, "log", engine.build_log),
        build_metrics=engine.build_metrics,
        build_capacity=engine.build_capacity,
        build_observed=engine.build_observed,
    )
    assert fresh.log is fresh.log
    assert builds == ["log"]
    replaced = LogDialect(parse=lambda body, meta: ())
    monkeypatch.setattr(fresh, "log", replaced)
    assert fresh.log is replaced and builds == ["log"]


def test_engine_flags_read_by_the_table() -> None:
    reading = registry.ENGINES["vllm"].flags.read(["--max-num-seqs", "64", "--seed", "1", "m/m"])
    assert reading == FlagReading(fields={"max_num_seqs": 64}, ignored=["--seed 1"], model="m/m")
