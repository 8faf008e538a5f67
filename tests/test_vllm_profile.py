"""vLLM's profile-run peak by release and install: which sampler the dummy run takes, and whether
the fused-MoE scratch is still alive when it runs (engines/vllm/memory.py, releases.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.analysis.predict import predict
from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import load_model
from kvwatch.core.units import GiB
from kvwatch.engines.vllm import memory

CONFIGS = Path(__file__).parent / "model_configs"
QWEN3_MOE = CONFIGS / "Qwen--Qwen3-30B-A3B.json"
H100 = gpus.lookup("h100")


@pytest.mark.parametrize(
    ("version", "flashinfer", "path"),
    [
        ("0.10.2", None, "flashinfer"),
        ("0.11.0", None, "flashinfer"),
        # 'FlashInfer is not available' (a pip install without the extra): the PyTorch sort.
        ("0.10.2", False, "sort"),
        ("0.11.0", False, "sort"),
        # From 0.11.1 FlashInfer is opt-in (VLLM_USE_FLASHINFER_SAMPLER): installed or not, it sorts.
        ("0.11.1", None, "sort"),
        ("0.11.2", None, "sort"),
        ("0.16.0", False, "sort"),
        ("0.19.0", False, "triton"),
    ],
)
def test_sampler_path_by_release_and_install(version: str, flashinfer: bool | None, path: str) -> None:
    assert memory.sampler_path(version, flashinfer) == path


def _qwen3_moe(version: str, flashinfer: bool | None = False) -> Deployment:
    return Deployment(
        engine="vllm",
        engine_version=version,
        gpu_memory_bytes=H100.total_bytes,
        gpu_name=H100.name,
        max_model_len=6144,
        dtype="bfloat16",
        flashinfer_sampler=flashinfer,
    )


def _peak(d: Deployment) -> int:
    dims = load_model(QWEN3_MOE).dims
    assert dims is not None
    seqs, tokens = memory.batch_limits(d, 6144)
    return memory.activation(dims, d, H100, seqs, tokens)[0].bytes


def test_moe_scratch_outlives_the_forward_from_014() -> None:
    """0.13 allocates the fused-MoE scratch per call (freed before the sampler runs); 0.14's
    workspace manager keeps it, so the sampler-bound peak grows by exactly the scratch."""
    dims = load_model(QWEN3_MOE).dims
    assert dims is not None
    scratch = memory._moe_workspace(dims, 1, 8192, 2)
    assert scratch > 0
    assert _peak(_qwen3_moe("0.14.0")) - _peak(_qwen3_moe("0.13.0")) == scratch


def test_qwen3_moe_profile_peak_on_010_matches_its_log() -> None:
    """kolyangg/mlops-assignment logs/vllm.log (vLLM 0.10.2, H100, 'FlashInfer is not available'):
    'Actual usage is 56.93 GiB for weight, 5.58 GiB for peak activation'."""
    assert abs(_peak(_qwen3_moe("0.10.2")) / GiB - 5.58) < 0.02
    # With FlashInfer installed the sampler holds far less: the forward decides.
    assert _peak(_qwen3_moe("0.10.2", None)) / GiB < 3.0


def test_v0_forward_holds_three_hidden_rows_per_token() -> None:
    """vllm#10517's 0.6.4 startup (Llama-3.1-8B, RTX 3090, 20,000 tokens): 'peak_torch_memory=17.06GiB'
    with 14.99 GiB of weights is a 2.07 GiB profile peak: 3 x H + 3 x I per token (the model loop
    still holds each layer's input), not 2 x H + 3 x I (1.92 GiB)."""
    dims = load_model(CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json").dims
    assert dims is not None
    d = Deployment(engine="vllm", engine_version="0.6.4", gpu_name="RTX-3090-24GB", max_model_len=20000)
    seqs, tokens = memory.batch_limits(d, 20000)
    assert (seqs, tokens) == (256, 20000)
    peak = memory.activation(dims, d, gpus.lookup("rtx3090"), seqs, tokens)[0]
    assert peak.note == "forward"
    assert abs(peak.bytes / GiB - (17.06 - 14.99)) < 0.02


@pytest.mark.parametrize(
    ("version", "flashinfer", "noted"),
    [("0.11.0", None, True), ("0.11.0", False, False), ("0.11.2", None, False), ("0.19.0", None, False)],
)
def test_the_prediction_says_when_it_assumes_flashinfer(
    version: str, flashinfer: bool | None, noted: bool
) -> None:
    p = predict(load_model(QWEN3_MOE), _qwen3_moe(version, flashinfer))
    assert any(a.startswith("sampler: FlashInfer taken as installed") for a in p.assumptions) is noted
