"""V1's encoder profile for a Qwen3-VL / Qwen3.5 tower (engines/vllm/multimodal.py v1_profile), read
from vLLM 0.19.0 v1/worker/gpu_model_runner.py:5721-5796 and multimodal/encoder_budget.py:140-186."""

from __future__ import annotations

from pathlib import Path

from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import load_model
from kvwatch.core.units import GiB
from kvwatch.engines.vllm import memory, multimodal

CONFIG = Path(__file__).parent / "apriori" / "public" / "configs" / "Qwen--Qwen3.5-27B.json"
RTX3090 = gpus.lookup("rtx3090")


def lambo(seqs: int | None, length: int) -> Deployment:
    return Deployment(
        engine="vllm",
        engine_version="0.19.0",
        gpu_name=RTX3090.name,
        gpu_memory_bytes=RTX3090.total_bytes,
        max_model_len=length,
        tp=4,
        max_num_seqs=seqs,
        enforce_eager=True,
    )


def test_the_largest_image_is_16384_tokens() -> None:
    """16777216 // 32^2 = 16384 = 128 x 128 tokens (a 4096 square image)."""
    assert multimodal.most_tokens(32, 16777216) == 16384
    # 25165824 // 2 // 32^2 = 12288 = 96 x 128: the 2-frame video is smaller, the image is profiled.
    assert multimodal.most_tokens(32, 25165824 // 2) == 12288


def test_items_per_batch() -> None:
    """One 16384-token item fills a 2048-token budget (raised to the item); 32768 holds two."""
    assert multimodal.v1_items(16384, 999, 256, 2048, 50000) == 1
    assert multimodal.v1_items(16384, 999, 256, 32768, 50000) == 2
    assert multimodal.v1_items(16384, 999, 1, 32768, 50000) == 2
    assert multimodal.v1_items(16384, 1, 1, 32768, 50000) == 1


def _act(d: Deployment) -> float:
    model = load_model(str(CONFIG))
    assert model.dims is not None
    seqs, tokens = memory.batch_limits(d, d.max_model_len or 0)
    return memory.activation(model.dims, d, RTX3090, seqs, tokens, d.max_model_len)[0].bytes / GiB


def test_one_sequence_no_longer_hides_the_tower() -> None:
    """lambo 50k (max_num_seqs 1): the encoder pass is the peak, about 1.2 GiB a rank, not the
    0.32 GiB of the old lump; the 256-sequence 32k start stays sampler-bound, 0.07 GiB above it (the
    logs: 7.56 - 7.47 = 0.09 GiB)."""
    one = _act(lambo(1, 50000))
    many = _act(lambo(None, 32768))
    assert 1.1 < one < 1.3
    assert 0.03 < many - one < 0.12


def test_language_model_only_runs_no_encoder() -> None:
    d = lambo(1, 50000)
    from dataclasses import replace

    assert _act(replace(d, language_model_only=True)) < 0.4


def test_before_015_the_lump_stays() -> None:
    from dataclasses import replace

    model = load_model(str(CONFIG))
    assert model.dims is not None
    d = replace(lambo(1, 50000), engine_version="0.13.0")
    assert memory.v1_multimodal(model.dims, d, 1, 2048, 50000) is None
