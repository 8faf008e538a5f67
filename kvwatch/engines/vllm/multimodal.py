"""V0's multimodal profile run: the dummy images and videos ``profile_run`` feeds a Qwen2-VL-style model.

V0's ``_dummy_run`` (0.8.4 worker/model_runner.py:1268-1345) profiles the worst case for the
encoder: it takes the model's largest multimodal token count per prompt, max_mm_tokens (the sum over
modalities of limit_per_prompt x the most tokens one item can take, multimodal/registry.py:251-263 and
301-332), clamps the batch to ``min(max_num_seqs, max_num_batched_tokens // max_mm_tokens)``, at least 1
(:1302-1315), and gives each sequence the dummy prompt of its share of the token budget
(:1317-1335). When the dummy multimodal prompt is longer than that share, V0 only warns
(multimodal/profiling.py:243-256) -- the prompt is not cut -- so the language model's forward runs
over every placeholder token of one image and one video at the processor's largest size.

Only towers with a Qwen2-VL patch grid (dims.VisionGrid) are sized: their processing info
(0.8.4 model_executor/models/qwen2_vl.py:821-975) turns the image processor's max_pixels
(preprocessor_config.json, or --mm-processor-kwargs) into the largest image, and a video of as many
frames of that size as the sequence leaves room for (at least 1, at most 16).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Annotations only: the engine's flag table imports this module, and reading a log must not
    # load the capacity model (tests/test_pipeline.py).
    from kvwatch.capacity.dims import ModelDims, VisionGrid

# 0.8.4 config.py:2670-2675: get_default_limit_per_prompt is 1 item per modality under V0 (999 in V1).
V0_LIMIT_PER_PROMPT = 1
# qwen2_vl.py:818-819: Qwen2-VL's supported modalities (both profiled, one item each by default).
MODALITIES = ("image", "video")
# qwen2_vl.py:84: _MAX_FRAMES_PER_VIDEO.
MAX_FRAMES_PER_VIDEO = 16
# qwen2_vl.py:896-902: get_image_size_with_most_features asks smart_resize for a 9999999 x 9999999 image.
LARGEST_REQUEST = 9999999
# The HF processor's pixel values are float32 (transformers 4.51.3 image_processing_qwen2_vl.py
# returns numpy float32 patches); V0 moves them to the card as they are (MultiModalKwargs.as_kwargs
# with device only, 0.8.4 worker/model_runner.py:1774-1775) and holds them through the forward.
PIXEL_BYTES = 4


def smart_resize(height: int, width: int, factor: int, max_pixels: int) -> tuple[int, int]:
    """transformers 4.51.3 models/qwen2_vl/image_processing_qwen2_vl.py:57-85 (what vLLM imports,
    0.8.4 qwen2_vl.py:40), for an image above max_pixels (the only case the profile asks for)."""
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class Item:
    """One dummy item: its patches (the tower's input rows) and the placeholder tokens it takes."""

    patches: int
    tokens: int


def _item(grid: VisionGrid, max_pixels: int, frames: int) -> Item:
    """qwen2_vl.py:821-864 _get_vision_info: frames padded to the temporal patch, the grid of the
    resized size, tokens = patches // merge^2."""
    height, width = smart_resize(
        LARGEST_REQUEST, LARGEST_REQUEST, grid.patch_size * grid.merge_size, max_pixels
    )
    padded = frames + frames % grid.temporal_patch_size
    grid_t = max(padded // grid.temporal_patch_size, 1)
    patches = grid_t * (height // grid.patch_size) * (width // grid.patch_size)
    return Item(patches, patches // grid.merge_size**2)


def dummy_items(grid: VisionGrid, max_pixels: int, seq_len: int) -> tuple[Item, Item]:
    """The dummy image and video of one profile sequence of ``seq_len`` tokens (qwen2_vl.py:904-975):
    the video gets the frames that fit beside the image (_get_max_video_frames), at least 1."""
    image = _item(grid, max_pixels, 1)
    room = seq_len - image.tokens * V0_LIMIT_PER_PROMPT
    frames = 0
    while _item(grid, max_pixels, frames + 1).tokens <= room:
        frames += 1
    per_video = min(frames // V0_LIMIT_PER_PROMPT, MAX_FRAMES_PER_VIDEO)
    return image, _item(grid, max_pixels, max(per_video, 1))


@dataclass(frozen=True)
class Profile:
    """What V0's multimodal profile run puts through the model."""

    seqs: int  # sequences after the max_mm_tokens clamp
    forward_tokens: int  # tokens the language model's forward runs over
    pixel_bytes: int  # float32 pixel values on the card during the forward
    encoder_bytes: int  # the vision tower's transient for its largest item
    mm_tokens: int  # max_mm_tokens


def v0_profile(
    dims: ModelDims, max_pixels: int, max_num_seqs: int, tokens: int, max_model_len: int, act: int
) -> Profile | None:
    """V0's dummy batch for a Qwen2-VL-style tower, None for any other model.

    max_mm_tokens is counted at seq_len = max_model_len (registry.py:254-263); the dummy prompt of
    each sequence is its placeholders (the dummy text is one pad token per item, qwen2_vl.py:968-976,
    each expanded to the item's tokens), padded with zeros to its share when shorter
    (profiling.py:258-259). The tower's transient for one item: its bf16 pixel copy
    (qwen2_5_vl.py:925) and the MLP at ``x_gate * x_up`` (qwen2_5_vl.py:190-195) beside the block's
    residual and normed input: patch_dim + 2 x H + 3 x I elements a patch.
    """
    grid = dims.vision_grid
    if grid is None or max_pixels <= 0:
        return None
    image, video = dummy_items(grid, max_pixels, max_model_len)
    mm_tokens = (image.tokens + video.tokens) * V0_LIMIT_PER_PROMPT
    seqs = max(1, min(max_num_seqs, tokens // mm_tokens))
    forward = 0
    patches = 0
    largest = 0
    for group in range(seqs):
        seq_len = tokens // seqs + (group < tokens % seqs)
        img, vid = dummy_items(grid, max_pixels, seq_len)
        forward += max(seq_len, img.tokens + vid.tokens)
        patches += img.patches + vid.patches
        largest = max(largest, img.patches, vid.patches)
    patch_dim = grid.in_channels * grid.temporal_patch_size * grid.patch_size**2
    per_patch = patch_dim + 2 * grid.hidden_size + 3 * grid.intermediate_size
    return Profile(
        seqs=seqs,
        forward_tokens=forward,
        pixel_bytes=patches * patch_dim * PIXEL_BYTES,
        encoder_bytes=largest * per_patch * act,
        mm_tokens=mm_tokens,
    )


def max_pixels_flag(value: str) -> int | None:
    """--mm-processor-kwargs as vLLM takes it (a JSON object): its max_pixels, None without one."""
    try:
        kwargs = json.loads(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a JSON object") from None
    if not isinstance(kwargs, dict):
        raise ValueError(f"{value!r} is not a JSON object")
    pixels = kwargs.get("max_pixels")
    if pixels is None:
        return None
    if isinstance(pixels, bool) or not isinstance(pixels, int) or pixels <= 0:
        raise ValueError(f"max_pixels must be a positive integer, got {pixels!r}")
    return pixels
