"""Sizes bounded at both ends, every output bounded: a unit-less '80' is 80 bytes, which no GPU is;
kvwatch says so in one line (exit 2) instead of drawing a bar of 15 GiB / 80 B x 60 characters."""

from __future__ import annotations

import dataclasses
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvwatch.analysis.predict import predict
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import load_model
from kvwatch.cli import main
from kvwatch.commands.predict import BAR_WIDTH, budget_bar
from kvwatch.commands.render import stacked_bar
from kvwatch.core.errors import ConfigError
from kvwatch.core.units import GiB, MiB, parse_size
from kvwatch.sidecar.config import Settings

TESTS = Path(__file__).parent
LLAMA = TESTS / "model_configs" / "meta-llama--Meta-Llama-3.1-8B.json"
VLLM_LOG = TESTS.parent / "kvwatch" / "data" / "demo" / "vllm.log"
# Enough address space for the interpreter and a prediction, far too little for a bar of gigabytes.
MEMORY_LIMIT = 1 << 30


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def test_gpu_memory_80_is_one_line_and_exit_2_under_a_memory_limit() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvwatch", "predict", str(LLAMA), "--gpu-memory", "80"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert "80 bytes" in proc.stderr and "did you mean 80GiB?" in proc.stderr


@pytest.mark.parametrize(
    ("argv", "bound"),
    [
        (["predict", str(LLAMA), "--gpu-memory", "80"], "256 MiB"),
        (["predict", str(LLAMA), "--gpu-memory", "255MiB"], "256 MiB"),
        (["predict", str(LLAMA), "--gpu", "H100", "--weights-memory", "15"], "1 MiB"),
        (["predict", str(LLAMA), "--available-kv-memory", "52"], "1 MiB"),
        (["predict", str(LLAMA), "--gpu", "H100", "--activation-memory", "3"], "1 MiB"),
        (["explain", str(VLLM_LOG), "--gpu-memory", "80"], "256 MiB"),
        (["plan", str(LLAMA), "--workload", "4x8192", "--gpu-memory", "80"], "256 MiB"),
        (["plan", str(LLAMA), "--workload", "4x8192", "--available-kv-memory", "2x52"], "1 MiB"),
    ],
)
def test_every_size_flag_has_a_lower_bound_it_names(
    argv: list[str], bound: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and f"plausible minimum of {bound}" in err, err


def test_rank_count_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", str(LLAMA), "--workload", "4x8192", "--available-kv-memory", "99999999999x1GiB"]
    assert main(argv) == 2
    assert "over the plausible maximum 4,096" in capsys.readouterr().err


def test_the_bounds_keep_what_users_type() -> None:
    assert parse_size("256MiB", minimum=256 * MiB) == 256 * MiB
    assert parse_size("0", allow_zero=True, minimum=MiB) == 0
    with pytest.raises(ConfigError, match="did you mean 80GiB"):
        parse_size("80", minimum=256 * MiB)
    with pytest.raises(ConfigError) as exc:
        parse_size("80KB", minimum=256 * MiB)
    assert "did you mean" not in str(exc.value)  # a unit was given: no guess


def test_the_sidecar_bounds_gpu_memory_too() -> None:
    for value in ("80", 80):
        with pytest.raises(ValueError, match="did you mean 80GiB"):
            Settings.model_validate({"log": ["/dev/null"], "gpu_memory": value})
    assert Settings.model_validate({"log": ["/dev/null"], "gpu_memory": "80GiB"}).gpu_memory == 80 * GiB


@given(
    st.lists(st.tuples(st.sampled_from("WA.K"), st.floats(0, 1e30)), max_size=8),
    st.floats(1e-30, 1e30),
    st.integers(1, 200),
)
def test_stacked_bar_is_exactly_its_width(parts: list[tuple[str, float]], whole: float, width: int) -> None:
    assert len(stacked_bar(parts, whole, width)) == width


def test_budget_bar_is_bounded_whatever_the_card() -> None:
    p = predict(load_model(LLAMA), Deployment(engine="vllm", gpu_memory_bytes=80 * GiB))
    for total in (1, 80, 80 * GiB, 16 * 2**40):
        bar = budget_bar(dataclasses.replace(p, total_bytes=total))
        assert bar is not None and bar.index("]") == BAR_WIDTH + 1
