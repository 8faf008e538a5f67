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


# --- figure by figure against the source (Qwen3.5-27B's tower: hidden 1152, MLP 4304, patch 16,
# merge 2, temporal 2, out_hidden 5120, no deepstack, a 2304-entry position table) ---------------

GRID = load_model(str(CONFIG)).dims.vision_grid  # type: ignore[union-attr]


def test_the_27b_tower_is_read_from_its_config() -> None:
    assert GRID is not None
    assert (GRID.model_type, GRID.hidden_size, GRID.intermediate_size) == ("qwen3_5", 1152, 4304)
    assert (GRID.patch_size, GRID.merge_size, GRID.temporal_patch_size) == (16, 2, 2)
    assert (GRID.out_hidden_size, GRID.deepstack_layers, GRID.position_embeddings) == (5120, 0, 2304)


def test_profile_figures_tp4_and_tp2() -> None:
    """One 16384-token image (128 x 128 tokens, 65536 patches of 3 x 2 x 16 x 16 = 1536 values).
    Per patch row, in elements: TP 4 -- position 1152 + the attention moment 3 x 1152 (input, normed,
    proj output) + 8 x 1152 / 4 (qkv 3, q-k copy 2, rotated copy 2, output 1) + 1152 (the all-reduce's
    new tensor) = 8064; TP 2 -- 1152 + 3456 + 4608 + 1152 = 10368 (the MLP moment, 4 x 1152 + 4304 / 2
    + 1152 = 7912, is below both). The cached output: 16384 rows of 5120."""
    assert GRID is not None
    four = multimodal.v1_profile(GRID, None, 1, 2048, 50000, 2, 4)
    two = multimodal.v1_profile(GRID, None, 2, 8192, 262144, 2, 2)
    assert four is not None and two is not None
    for p in (four, two):
        assert (p.modality, p.items, p.tokens, p.patches) == ("image", 1, 16384, 65536)
        assert p.pixel_bytes == 65536 * 1536 * 2
        assert p.cached_bytes == 16384 * 5120 * 2
    assert four.encoder_bytes == 65536 * 8064 * 2
    assert two.encoder_bytes == 65536 * 10368 * 2


def test_limits_choose_the_modality_and_cap_the_items() -> None:
    """encoder_budget.py (0.20.0 :73-77): a modality at 0 passes no tower, so image=0 profiles the
    2-frame video (12288 tokens, 49152 patches); both at 0 leave nothing to profile; image=1 caps a
    prompt at one item (max_num_seqs 1 x 1 where the 32768-token budget holds two)."""
    assert GRID is not None
    video = multimodal.v1_profile(GRID, None, 2, 8192, 262144, 2, 2, {"image": 0, "video": 999})
    assert video is not None
    assert (video.modality, video.items, video.tokens, video.patches) == ("video", 1, 12288, 49152)
    assert multimodal.v1_profile(GRID, None, 2, 8192, 262144, 2, 2, {"image": 0, "video": 0}) is None
    capped = multimodal.v1_profile(GRID, None, 1, 32768, 50000, 2, 4, {"image": 1})
    free = multimodal.v1_profile(GRID, None, 1, 32768, 50000, 2, 4)
    assert capped is not None and free is not None
    assert (capped.items, free.items) == (1, 2)


def test_the_flags_reach_the_profile() -> None:
    """--limit-mm-per-prompt image=0 and --skip-mm-profiling through memory.v1_multimodal."""
    from dataclasses import replace

    model = load_model(str(CONFIG))
    assert model.dims is not None
    d = lambo(1, 50000)
    image0 = memory.v1_multimodal(model.dims, replace(d, mm_limits="image=0"), 1, 2048, 50000)
    assert image0 is not None and image0.modality == "video"
    assert memory.v1_multimodal(model.dims, replace(d, mm_limits="image=0,video=0"), 1, 2048, 50000) is None
    assert memory.v1_multimodal(model.dims, replace(d, skip_mm_profiling=True), 1, 2048, 50000) is None
