"""V0's multimodal profile run (engines/vllm/multimodal.py): the dummy image and video of a Qwen2-VL-style
tower, derived from vLLM 0.8.4's source (model_executor/models/qwen2_vl.py:821-975,
worker/model_runner.py:1268-1345) and transformers 4.51.3's smart_resize, checked figure by figure."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvwatch.analysis.predict import predict
from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import load_model
from kvwatch.engines.vllm import memory, multimodal

CONFIG = Path(__file__).parent / "apriori" / "public" / "configs" / "Qwen--Qwen2.5-VL-7B-Instruct.json"
# Qwen2.5-VL-7B-Instruct's preprocessor_config.json (gpustack1800's settings.image_max_pixels_source).
MAX_PIXELS = 12845056
# 3 channels x 2 frames x 14 x 14 pixels a patch.
PATCH_DIM = 1176
RTX3090 = gpus.lookup("rtx3090")


def gpustack1800(**changes: object) -> Deployment:
    """gpustack#1800: vLLM 0.8.4, VLLM_USE_V1=0 (GPUStack 6de0e9c), --max-model-len 8192, RTX 3090."""
    d = Deployment(
        engine="vllm",
        engine_version="0.8.4",
        gpu_name=RTX3090.name,
        gpu_memory_bytes=RTX3090.total_bytes,
        max_model_len=8192,
        v0_engine=True,
        image_max_pixels=MAX_PIXELS,
    )
    return replace(d, **changes)  # type: ignore[arg-type]


def test_the_largest_image_is_3584_square() -> None:
    """smart_resize of the 9999999 x 9999999 request: beta = 9999999 / 3584, so 128 x 28 a side."""
    assert multimodal.smart_resize(9999999, 9999999, 28, MAX_PIXELS) == (3584, 3584)


def test_the_config_gives_the_patch_grid() -> None:
    dims = load_model(CONFIG).dims
    assert dims is not None and dims.vision_grid is not None
    g = dims.vision_grid
    assert (g.patch_size, g.merge_size, g.temporal_patch_size, g.in_channels) == (14, 2, 2, 3)
    assert (g.hidden_size, g.intermediate_size) == (1280, 3420)


@pytest.mark.parametrize(
    ("seq_len", "video_tokens"),
    [
        # 8192 - 16384 < 0 leaves no frame: the floor of 1, padded to 2 -> grid_t 1.
        (8192, 16384),
        # 98304 - 16384 = 81920 holds 10 frames (grid_t 5, 5 x 16384); 11 would need 98304.
        (98304, 81920),
        # 16 frames at most (qwen2_vl.py:84): grid_t 8.
        (10**6, 8 * 16384),
    ],
)
def test_the_video_takes_the_frames_left_beside_the_image(seq_len: int, video_tokens: int) -> None:
    dims = load_model(CONFIG).dims
    assert dims is not None and dims.vision_grid is not None
    image, video = multimodal.dummy_items(dims.vision_grid, MAX_PIXELS, seq_len)
    assert (image.patches, image.tokens) == (256 * 256, 16384)
    assert video.tokens == video_tokens
    assert video.patches == 4 * video_tokens


def test_one_sequence_runs_the_untruncated_prompt_of_an_image_and_a_video() -> None:
    """max_mm_tokens 32768 > 8192: min(256, 8192 // 32768) = 0 -> 1 sequence, whose dummy prompt of
    32768 placeholders is longer than its 8192-token share and is run whole (profiling.py:243-259)."""
    dims = load_model(CONFIG).dims
    assert dims is not None
    p = multimodal.v0_profile(dims, MAX_PIXELS, 256, 8192, 8192, 2)
    assert p is not None
    assert (p.mm_tokens, p.seqs, p.forward_tokens) == (32768, 1, 32768)
    assert p.pixel_bytes == 2 * 65536 * PATCH_DIM * 4
    assert p.encoder_bytes == 65536 * (PATCH_DIM + 2 * 1280 + 3 * 3420) * 2


def test_a_budget_that_holds_several_prompts_clamps_max_num_seqs() -> None:
    """max_num_batched_tokens 65536 at max_model_len 8192: 65536 // 32768 = 2 sequences of 32768."""
    dims = load_model(CONFIG).dims
    assert dims is not None
    p = multimodal.v0_profile(dims, MAX_PIXELS, 256, 65536, 8192, 2)
    assert p is not None
    assert (p.seqs, p.forward_tokens) == (2, 65536)


def test_the_forward_over_32768_tokens_moves_the_activation_peak() -> None:
    """V0's forward is 3H + 3I elements a token (memory.FORWARD_H_V0): the text-only profile runs
    8192 tokens, this one 32768, so the peak grows by 3 x 8192 x (3 x 3584 + 3 x 18944) x 2 B of
    forward and the float32 pixel values (2 x 65536 patches x 1176 x 4 B) held beside it."""
    m = load_model(CONFIG)
    assert m.dims is not None
    with_mm = memory.activation(m.dims, gpustack1800(), None, 256, 8192, 8192)[0]
    text_only = memory.activation(m.dims, gpustack1800(image_max_pixels=None), None, 256, 8192, 8192)[0]
    assert with_mm.note == text_only.note == "forward"
    grown = 3 * 8192 * (3 * 3584 + 3 * 18944) * 2 + 2 * 65536 * PATCH_DIM * 4
    assert with_mm.bytes - text_only.bytes == grown


def test_v1_and_an_unknown_max_pixels_leave_the_profile_alone() -> None:
    m = load_model(CONFIG)
    assert m.dims is not None
    assert memory.v0_multimodal(m.dims, gpustack1800(v0_engine=False), 256, 2048, 8192) is None
    assert (
        memory.v0_multimodal(
            m.dims, Deployment(engine="vllm", engine_version="0.8.4", v0_engine=True), 256, 8192, 8192
        )
        is None
    )
    p = predict(m, gpustack1800(image_max_pixels=None))
    assert any("V0 multimodal profile not sized" in a for a in p.assumptions)


def test_gpustack1800_leaves_under_a_seventh_of_its_text_only_pool() -> None:
    """The observed pool was 2400 tokens; the text-only V0 profile left 79,664, this one ~11K."""
    m = load_model(CONFIG)
    with_mm = predict(m, gpustack1800())
    text_only = predict(m, gpustack1800(image_max_pixels=None))
    assert with_mm.kv_pool_tokens is not None and text_only.kv_pool_tokens is not None
    assert with_mm.kv_pool_tokens < text_only.kv_pool_tokens / 7
    assert any("max_mm_tokens 32,768" in a for a in with_mm.assumptions)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvwatch", "predict", str(CONFIG), "--json", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_mm_processor_kwargs_gives_max_pixels_on_the_command_line() -> None:
    base = ("--engine-version", "0.8.4", "--gpu", "rtx3090", "--max-model-len", "8192", "--v0-engine")
    r = _cli(*base, "--", "--mm-processor-kwargs", json.dumps({"max_pixels": MAX_PIXELS, "fps": 1}))
    assert r.returncode == 0, r.stderr
    assert any("max_mm_tokens 32,768" in a for a in json.loads(r.stdout)["assumptions"])
    bad = _cli(*base, "--", "--mm-processor-kwargs", '{"max_pixels": -1}')
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
