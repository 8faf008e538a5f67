"""vLLM's TP communication memory follows the card's interconnect (gpus.GpuSpec.interconnect).

From 0.18 the init snapshot follows the distributed set-up, so only what the collectives allocate
later lands in the non-torch increase: ~2 GiB on H100 SXM's NVSwitch fabric, TP 1's figure on
PCIe-only cards (engines/vllm/memory.fabric_non_torch). The LAMBO 4x RTX 3090 startups are the
evidence: their logged terms leave no room for the fabric class.
"""

from __future__ import annotations

import pytest

from bench.accuracy_cases import load_cases, predictable
from bench.accuracy_loso import Models, evaluate
from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.core.units import GiB
from kvwatch.engines.vllm import calibration, memory


def _non_torch_gib(gpu: str | None, tp: int, version: str = "0.19.0") -> float:
    d = Deployment(engine="vllm", engine_version=version, gpu_name=gpu, tp=tp, max_model_len=4096)
    return memory.non_torch(d).bytes / GiB


def test_sxm_boards_are_on_a_switch_and_geforce_cards_are_pcie_only() -> None:
    for spec in gpus.CATALOGUE:
        if "SXM" in spec.name and spec.name != "A100-SXM-40GB":
            assert spec.interconnect == "nvswitch", spec.name
        if spec.name.startswith(("RTX-3", "RTX-4", "RTX-5", "T4", "L4")):
            assert spec.interconnect == "pcie", spec.name
    # The 40 GB entry answers to the PCIe card's name too: not stated.
    assert gpus.lookup("a100-pcie-40gb").interconnect == ""


def test_pcie_only_cards_at_tp_ge_2_take_tp1_non_torch_from_018() -> None:
    cal = calibration.current()
    tp1 = _non_torch_gib("RTX-3090-24GB", 1)
    assert _non_torch_gib("RTX-3090-24GB", 4) == pytest.approx(tp1)
    assert _non_torch_gib("RTX-4090-24GB", 2) == pytest.approx(tp1)
    assert tp1 == pytest.approx(cal.non_torch_tp1_gib, abs=1e-6)
    # The switch keeps the fitted TP class, and so does a card kvwatch does not list.
    fabric = cal.non_torch_tp_gib + 2 * cal.non_torch_tp_slope_gib
    assert _non_torch_gib("H100-SXM-80GB", 4) == pytest.approx(fabric, abs=1e-6)
    assert _non_torch_gib(None, 4) == pytest.approx(fabric, abs=1e-6)
    assert _non_torch_gib("H100-SXM-80GB", 4) > _non_torch_gib("RTX-3090-24GB", 4) + 1.0
    # An A100's NVSwitch has no NVLink SHARP (NVLS needs SM 9.0): TP 1's class from 0.18, as the
    # SM 8.0 pair of souspilot/DiscoverPhysicsWIP logs (0.17 GiB at TP 2 on 0.27.1).
    assert gpus.lookup("A100-SXM-80GB").interconnect == "nvswitch"
    assert _non_torch_gib("A100-SXM-80GB", 2) == pytest.approx(tp1)
    assert _non_torch_gib("A100-SXM-80GB", 8, "0.15.0") == pytest.approx(
        cal.non_torch_tp_old_gib + 0 * cal.non_torch_tp_slope_gib, abs=1e-6
    )
    # Before 0.18 the release class is unchanged (its snapshot order is not read here).
    assert _non_torch_gib("RTX-3090-24GB", 2, "0.15.0") == pytest.approx(cal.non_torch_tp_old_gib, abs=1e-6)


@pytest.mark.parametrize(
    ("case_id", "tolerance"),
    [
        ("lambo-qwen3.5-27b-4xrtx3090-tp4-v0.19.0-32k-eager", 0.05),
        ("lambo-qwen3.5-27b-4xrtx3090-tp4-v0.19.0-32k-util0.92", 0.05),
        ("lambo-qwen2.5-32b-instruct-4xrtx3090-tp4-v0.18.1-32k-util0.88", 0.05),
        ("lambo-qwen3.5-9b-4xrtx3090-tp4-v0.19.0-32k-graphs-oom", 0.05),
    ],
)
def test_lambo_4x3090_tp4_startups_land_on_their_logged_kv(case_id: str, tolerance: float) -> None:
    """With the fabric class they came out 12-40 % under the logged budget."""
    case = next(c for c in load_cases() if c.id == case_id)
    row = evaluate(case, Models())
    assert row.kv_error is not None
    assert abs(row.kv_error) <= tolerance


def test_nccl_is_captured_in_the_graphs_only_where_no_custom_path_serves_the_all_reduce() -> None:
    def nccl(gpu: str, tp: int) -> bool:
        return memory.nccl_in_graphs(Deployment(engine="vllm", engine_version="0.19.0", gpu_name=gpu, tp=tp))

    assert nccl("RTX-3090-24GB", 4)
    assert not nccl("RTX-3090-24GB", 2)  # custom all-reduce at two GPUs, given P2P
    assert not nccl("H100-SXM-80GB", 4)  # the fabric: custom all-reduce
    assert not nccl("H100-PCIe-80GB", 4)  # capability 9.0: torch symmetric memory
    assert not nccl("RTX-3090-24GB", 1)


def test_the_nccl_graph_startup_no_longer_moves_the_shared_graph_base() -> None:
    """LAMBO's 4x RTX 3090 Qwen3.5-9B estimate (3.65 GiB) is NCCL in every graph, not a hybrid-model
    shift: fitted with or without it, the shared base and per-layer slope stay put."""
    from bench import accuracy_fit

    models = Models()
    cases = [c for c in load_cases() if predictable(c)]
    every = accuracy_fit.fit(cases, models)
    without = accuracy_fit.fit([c for c in cases if not c.id.startswith("lambo-qwen3.5-9b")], models)
    assert every.graphs_base_gib == pytest.approx(without.graphs_base_gib, abs=0.005)
    assert every.graphs_per_layer_gib == pytest.approx(without.graphs_per_layer_gib, abs=0.001)
    assert without.graphs_nccl_gib == 0.0 < every.graphs_nccl_gib


def test_predict_says_which_interconnect_rule_it_applied(capsys: pytest.CaptureFixture[str]) -> None:
    from pathlib import Path

    from kvwatch.cli import main

    config = Path(__file__).parent / "apriori" / "public" / "configs" / "Qwen--Qwen3.5-9B.json"
    argv = ["predict", str(config), "--max-model-len", "32768", "--engine-version", "0.19.0", "--tp", "4"]
    assert main([*argv, "--gpu", "RTX-3090"]) == 0
    out = capsys.readouterr().out
    assert "non-torch: TP 1's figure (a PCIe-only card" in out
    assert "CUDA graphs: every graph carries NCCL all-reduces" in out
    assert main([*argv, "--gpu", "H100-SXM-80GB"]) == 0
    out = capsys.readouterr().out
    assert "PCIe-only" not in out and "NCCL" not in out
