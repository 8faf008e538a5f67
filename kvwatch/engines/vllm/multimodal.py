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

V1's profile_run (0.19.0 v1/worker/gpu_model_runner.py:5721-5796; the same sequence in 0.10.2
:2981-3041, 0.20.0 :5788-5862, 0.25.1 :6290-6363, 0.27.1 :6433-6505, 0.33.0 :6072-6144) runs the
encoder once over the largest items of one modality, caches the outputs, then runs the language
model's dummy forward and the sampler, and only then clears the cache: ``v1_profile`` sizes that for
a Qwen3-VL / Qwen3.5 tower (QWEN3_TOWERS), from 0.15 (releases.QWEN3_TOWER_PROFILE).

Read against 0.20.0, 0.22.0 and 0.24.0 for the club-3090 Qwen3.6-27B startups (TP 2, max_num_seqs 2,
MTP), which this profile puts 3-5 % below their logged pools: none of these changes the profile --
profile_run is line for line 0.19.0's (0.20.0 gpu_model_runner.py:5788-5862, 0.24.0 :6239-6312: the
dummy batch a local to the end, the cache cleared after the sampler); encoder_budget.py is the same
file in 0.20.0, 0.22.0 and 0.24.0 (:140-186), and so are the scheduler's encoder limits (0.24.0
config/scheduler.py:248-249) and compute_mm_encoder_budget (0.24.0 v1/core/encoder_cache_manager.py
:269-314): max_num_seqs 2 with 8192 batched tokens still profiles one 16384-token image; the
drafter's dummy_run (0.20.0 v1/spec_decode/llm_base_proposer.py:1566-1620) feeds its own
inputs_embeds, not the encoder; mm_encoder_tp_mode stays "weights" (0.20.0 config/multimodal.py:144);
the tower runs in the model dtype (fp16 is 2 bytes like bf16; qwen3_5.py casts nothing); the vision
attention is 0.20.0's in 0.24.0 (qwen2_5_vl.py Qwen2_5_VisionAttention.forward), its rotary out of
place (vllm_flash_attn apply_rotary_emb, inplace False), and the encoder's CUDA graphs and compile
are off by default (0.24.0 config/compilation.py:516, :524). 0.20's Triton position interpolation
(0.20.0 qwen3_vl.py:159-344) only drops a transient before the blocks. The miss is not traced.

Read again term by term (0.19.0, 0.22.0, 0.24.0, 0.27.1): the tower's linears are sharded at TP 2
(0.22.0 qwen3_vl.py:388-405 and qwen2_5_vl.py:324-355 take disable_tp only in "data" mode), the
vision attention on sm80+ is FLASH_ATTN for head_dim 72 (platforms/cuda.py:386-441,
v1/attention/backends/flash_attn.py:173-180) with no copy of q, k or v
(v1/attention/ops/vit_attn_wrappers.py:43-65), the pixel values and the encoder outputs stay
referenced by profile_run's locals until it returns (0.19.0 gpu_model_runner.py:5721-5795), and
the block input is held by the caller through the block: the count above stands. The LAMBO eager
startups' share of the miss was non-torch (graph_profile.py). The only startup that logs the
profile's transient, souspilot/DiscoverPhysicsWIP's Qwen3.6-27B at TP 2 on 0.27.1, logs 2.32 GiB
'peak activation' = transient headroom + the 0.96 GiB graph estimate (0.27.1
v1/worker/gpu_worker.py:527-529): 1.36 GiB beside this profile's 1.45 GiB of tower peak and
pixels -- a bound that a 0.1 GiB smaller tower would meet, not a mechanism.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvwatch.core.versions import version_tuple
from kvwatch.engines.flags import json_object
from kvwatch.engines.vllm.mm_limits import MODALITY, kept_form, read_kept

if TYPE_CHECKING:
    # Annotations only: the engine's flag table imports this module, and reading a log must not
    # load the capacity model (tests/test_pipeline.py).
    from kvwatch.capacity.deployment import Deployment
    from kvwatch.capacity.dims import ModelDims, VisionGrid

# 0.8.4 config.py:2670-2675: get_default_limit_per_prompt is 1 item per modality under V0 (999 in V1).
V0_LIMIT_PER_PROMPT = 1
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


def dummy_items(
    grid: VisionGrid, max_pixels: int, seq_len: int, images: int = 1, videos: int = 1
) -> tuple[Item, Item]:
    """The dummy image and video of one profile sequence of ``seq_len`` tokens carrying ``images``
    and ``videos`` items (0.8.4 qwen2_vl.py:913-948): each video gets its share of the frames that
    fit beside the images (_get_max_video_frames, split over max(videos, 1)), at least 1, at most 16."""
    image = _item(grid, max_pixels, 1)
    room = seq_len - image.tokens * images
    frames = 0
    while _item(grid, max_pixels, frames + 1).tokens <= room:
        frames += 1
    per_video = min(frames // max(videos, 1), MAX_FRAMES_PER_VIDEO)
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
    dims: ModelDims,
    max_pixels: int,
    max_num_seqs: int,
    tokens: int,
    max_model_len: int,
    act: int,
    counts: tuple[int, int] = (V0_LIMIT_PER_PROMPT, V0_LIMIT_PER_PROMPT),
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
    images, videos = counts  # items per prompt (--limit-mm-per-prompt; 1 each by default)
    if grid is None or max_pixels <= 0 or images + videos == 0:
        return None
    # The most tokens one item takes, each modality with a limit counted once (registry.py:251-263).
    image, video = dummy_items(grid, max_pixels, max_model_len, min(images, 1), 1)
    mm_tokens = image.tokens * images + video.tokens * videos
    seqs = max(1, min(max_num_seqs, tokens // mm_tokens))
    forward = 0
    patches = 0
    largest = 0
    for group in range(seqs):
        seq_len = tokens // seqs + (group < tokens % seqs)
        img, vid = dummy_items(grid, max_pixels, seq_len, images, videos)
        forward += max(seq_len, img.tokens * images + vid.tokens * videos)
        patches += img.patches * images + vid.patches * videos
        largest = max(largest, img.patches if images else 0, vid.patches if videos else 0)
    patch_dim = grid.in_channels * grid.temporal_patch_size * grid.patch_size**2
    per_patch = patch_dim + 2 * grid.hidden_size + 3 * grid.intermediate_size
    return Profile(
        seqs=seqs,
        forward_tokens=forward,
        pixel_bytes=patches * patch_dim * PIXEL_BYTES,
        encoder_bytes=largest * per_patch * act,
        mm_tokens=mm_tokens,
    )


# --- V1 ---------------------------------------------------------------------------------------------

# The towers v1_profile sizes: vision_config.model_type of Qwen3_VisionTransformer's checkpoints
# (0.19.0 qwen3_vl.py:321, used by qwen3_5.py:598 and :822 for Qwen3.5 and Qwen3.5-MoE).
QWEN3_TOWERS = frozenset({"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen3_5_moe_vision"})
# The image processor's size the processor reads from the checkpoint's preprocessor_config.json
# (ProcessorMixin.from_pretrained; vLLM 0.19.0 qwen2_vl.py:935-947 takes size["longest_edge"]): the
# Qwen3-VL / Qwen3.5 / Qwen3.6 checkpoints ship {"longest_edge": 16777216, "shortest_edge": 65536}
# with patch_size 16 (Qwen/Qwen3.5-2B-Base and Qwen/Qwen3.6-35B-A3B-FP8 preprocessor_config.json).
# transformers' own default (28 x 28 x 1280, image_processing_qwen2_vl_fast.py:80 in 4.57.1) is
# what a checkpoint without the file would get; the checkpoints all carry it. --mm-processor-kwargs
# max_pixels overrides it (qwen2_vl.py:944-945).
QWEN3_IMAGE_LONGEST_EDGE = 16777216
# The video processor's default size (transformers 4.57.1 video_processing_qwen3_vl.py:89,
# 32 x 32 x 768 x 32 in the Qwen3-VL checkpoints' video_preprocessor_config.json: 25165824).
QWEN3_VIDEO_LONGEST_EDGE = 25165824
# vLLM V1's default items per prompt for a modality the user does not limit (0.19.0
# config/multimodal.py:19 and :270-271).
V1_LIMIT_PER_PROMPT = 999
# qwen2_vl.py:958-962 (0.19.0): the factor pair of the most tokens may not pass 200:1.
MAX_ASPECT = 200


def most_tokens(unit: int, max_pixels: int) -> int:
    """Tokens of the largest image (0.19.0 qwen2_vl.py:914-965 get_image_size_with_most_features):
    max_pixels // unit^2 tokens, less until they factor into sides within 200:1; the image of
    unit x those factors passes smart_resize unchanged (a multiple of the factor, not above
    max_pixels), so its tokens are the factors' product (_get_vision_info, :829-877)."""
    for tokens in range(max_pixels // (unit * unit), 0, -1):
        side = math.isqrt(tokens)
        while tokens % side:
            side -= 1
        if tokens // side / side <= MAX_ASPECT:
            return tokens
    return 1


@dataclass(frozen=True)
class V1Profile:
    """What V1's profile run puts through a Qwen3-VL / Qwen3.5 tower, per rank."""

    modality: str  # get_modality_with_max_tokens: the modality of the most tokens an item
    items: int  # mm_max_items_per_batch of that modality
    tokens: int  # tokens one item takes (its encoder outputs' rows)
    patches: int  # the tower's rows for all items
    pixel_bytes: int  # pixel values on the card through the whole profile run
    encoder_bytes: int  # the tower's own peak beside them (block transient, position table)
    cached_bytes: int  # the encoder outputs kept in the encoder cache through the LM forward and sampler


def v1_items(
    tokens_per_item: int, limit: int, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int
) -> int:
    """mm_max_items_per_batch (0.19.0 multimodal/encoder_budget.py:140-180; 0.10.2
    v1/worker/utils.py:95-127): the encoder budget is max(max_num_batched_tokens, the item's tokens)
    for compute and for cache alike (v1/core/encoder_cache_manager.py:309-314, scheduler limits from
    config/scheduler.py:234-235), the items it holds capped by max_num_seqs x the items a prompt
    holds (chunked prefill on: V1's default, so max_num_reqs is max_num_seqs), at least one."""
    budget = max(max_num_batched_tokens, tokens_per_item)
    per_prompt = max(1, min(limit, max_model_len // tokens_per_item))
    return max(1, min(budget // tokens_per_item, max_num_seqs * per_prompt))


def v1_profile(
    grid: VisionGrid,
    max_pixels: int | None,
    max_num_seqs: int,
    tokens: int,
    max_model_len: int,
    act: int,
    tp: int,
    limits: Mapping[str, int] | None = None,
) -> V1Profile | None:
    """V1's encoder profile for a Qwen3-VL / Qwen3.5 tower; None for any other tower.

    The item: the modality with the most tokens an item (encoder_budget.py:182-186), the image of
    most_tokens at the processor's longest_edge, or the 2-frame dummy video at the video
    processor's longest_edge / temporal_patch_size (qwen3_vl.py:786-810, grid_t 1); a patch is
    merge^2 of a token's rows. Its batch is _get_mm_dummy_batch's (gpu_model_runner.py:5164-5191):
    the items stacked, pixel values in the model dtype (the processor's floating outputs are cast,
    multimodal/processing/context.py:229-236) held by profile_run's local until it returns.

    The tower's peak (qwen3_vl.py:616-660, per rank, the blocks tensor-parallel): the position table
    (pos_embeds, in encoder_metadata through the forward) and, in a block, the caller's input, the
    normed input, then the attention's qkv (3H/tp), the contiguous q-k copy (2H/tp), its rotated copy
    (2H/tp, out of place: layers/rotary_embedding/common.py:104-125), the attention output (H/tp; its
    ``rearrange(...).contiguous()`` only moves the batch axis of 1, no copy) (qwen2_5_vl.py
    Qwen2_5_VisionAttention.forward, 0.19.0 :362-419), and the projection's output (H), all-reduced
    out of place at TP >= 2 (one more H: every path of device_communicators/cuda_communicator.py:180-237
    returns a new tensor): 3H + 8H/tp (+H); the
    MLP after it (Qwen3_VisionBlock.forward :247-266: input, sum, normed sum, then fc1 and its act,
    or the act and fc2's output) is the larger of 3H + 2I/tp and 4H + I/tp (+H). Deepstack features (P/merge^2 x out_hidden each) stay in
    deepstack_feature_lists to the final cat, which holds them twice (:652-659).
    """
    if grid.model_type not in QWEN3_TOWERS or not grid.out_hidden_size:
        return None
    unit = grid.patch_size * grid.merge_size
    image = most_tokens(unit, max_pixels or QWEN3_IMAGE_LONGEST_EDGE)
    video = most_tokens(unit, QWEN3_VIDEO_LONGEST_EDGE // grid.temporal_patch_size)
    # Only the modalities whose limit is above 0 pass the tower (0.20.0 multimodal/encoder_budget.py:73-77,
    # the same in 0.22.0 and 0.24.0); max((tokens, name)): a tie goes to "video" (:182-186,
    # key=(x[1], x[0])).
    per_prompt = dict(limits or {})
    towers = [
        (n, m) for n, m in ((image, "image"), (video, "video")) if per_prompt.get(m, V1_LIMIT_PER_PROMPT) > 0
    ]
    if not towers:
        return None
    per_item, modality = max(towers)
    limit = per_prompt.get(modality, V1_LIMIT_PER_PROMPT)
    items = v1_items(per_item, limit, max_num_seqs, tokens, max_model_len)
    merge2 = grid.merge_size**2
    patches = items * per_item * merge2
    patch_dim = grid.in_channels * grid.temporal_patch_size * grid.patch_size**2
    h, inter = grid.hidden_size, grid.intermediate_size
    reduce = h if tp > 1 else 0
    attention = 3 * h + 8 * h / tp + reduce
    mlp = max(3 * h + 2 * inter / tp, 4 * h + inter / tp + reduce)
    out_rows = grid.out_hidden_size / merge2  # one patch's share of its token's output row
    deep = grid.deepstack_layers * out_rows
    block = max(attention, mlp) + deep
    cat = 2 * (1 + grid.deepstack_layers) * out_rows
    position = h if grid.position_embeddings else 0
    encoder = int(patches * (position + max(block, cat)) * act)
    cached = items * per_item * grid.out_hidden_size * (1 + grid.deepstack_layers) * act
    return V1Profile(
        modality=modality,
        items=items,
        tokens=per_item,
        patches=patches,
        pixel_bytes=patches * patch_dim * act,
        encoder_bytes=encoder,
        cached_bytes=cached,
    )


def max_pixels_flag(value: str) -> int | None:
    """--mm-processor-kwargs as vLLM takes it (a JSON object): its max_pixels, None without one."""
    pixels = json_object(value).get("max_pixels")
    if pixels is None:
        return None
    if isinstance(pixels, bool) or not isinstance(pixels, int) or pixels <= 0:
        raise ValueError(f"max_pixels must be a positive integer, got {pixels!r}")
    return pixels


# --- --limit-mm-per-prompt: a multimodal checkpoint served as text ---------------------------------
#
# Every modality a model takes limited to 0 runs it text-only: the profile feeds no encoder (V1:
# 0.8.4 v1/core/encoder_cache_manager.py:123-130, no encoder budget; 0.10.2-0.19
# multimodal/registry.py supports_multimodal_inputs, 0.19.0 :107-119; V0: the dummy data holds
# limit items of each modality, 0.8.4 qwen2_vl.py:978-1000), and from the release each class reads
# the limits it builds no tower either. A modality not given keeps vLLM's default (1 under V0, 999
# in V1: 0.8.4 arg_utils.py:670-680; 0.19.0 config/multimodal.py:259-273).

# The modalities each class takes (its processing info's get_supported_mm_limits, 0.19.0
# model_executor/models/<file>.py): all of them at 0 makes it text-only. A class not listed is
# never taken for text-only (its tower and encoder profile stay: the smaller pool, never the larger).
_IMAGE = frozenset({"image"})
_IMAGE_VIDEO = frozenset({"image", "video"})
MODALITIES: dict[str, frozenset[str]] = {
    # qwen2_vl.py (Qwen2VLProcessingInfo: image, video), inherited by qwen2_5_vl.py, qwen3_vl.py,
    # qwen3_vl_moe.py, qwen3_5.py
    "Qwen2VLForConditionalGeneration": _IMAGE_VIDEO,
    "Qwen2_5_VLForConditionalGeneration": _IMAGE_VIDEO,
    "Qwen3VLForConditionalGeneration": _IMAGE_VIDEO,
    "Qwen3VLMoeForConditionalGeneration": _IMAGE_VIDEO,
    "Qwen3_5ForConditionalGeneration": _IMAGE_VIDEO,
    "Qwen3_5MoeForConditionalGeneration": _IMAGE_VIDEO,
    "LlavaOnevisionForConditionalGeneration": _IMAGE_VIDEO,  # llava_onevision.py
    "Glm4vForConditionalGeneration": _IMAGE_VIDEO,  # glm4_1v.py
    "Glm4vMoeForConditionalGeneration": _IMAGE_VIDEO,
    "LlavaForConditionalGeneration": _IMAGE,  # llava.py
    "Gemma3ForConditionalGeneration": _IMAGE,  # gemma3_mm.py
    "Mistral3ForConditionalGeneration": _IMAGE,  # mistral3.py
    "PixtralForConditionalGeneration": _IMAGE,  # pixtral.py
    "PaliGemmaForConditionalGeneration": _IMAGE,  # paligemma.py
    "Llama4ForConditionalGeneration": _IMAGE,  # mllama4.py
    "Phi3VForCausalLM": _IMAGE,  # phi3v.py
    "AyaVisionForConditionalGeneration": _IMAGE,  # aya_vision.py
    "KimiVLForConditionalGeneration": _IMAGE,  # kimi_vl.py
    "Gemma3nForConditionalGeneration": frozenset({"image", "audio"}),  # gemma3n_mm.py
}

# The first release (of those read) whose class builds no tower when its modalities are all at 0,
# with where it says so; before it, and for a class not listed, the tower is loaded.
TOWER_SKIPPED_FROM: dict[str, tuple[str, str]] = {
    "Qwen2VLForConditionalGeneration": (
        "0.10.2",
        "0.10.2 qwen2_vl.py:1112-1119 (visual only with a limit); 0.9.2 qwen2_vl.py:1117 builds it always",
    ),
    "Qwen2_5_VLForConditionalGeneration": (
        "0.10.2",
        "0.10.2 qwen2_5_vl.py:930-931; 0.9.2 qwen2_5_vl.py:855 and 0.8.4 :795 build it always",
    ),
    "Qwen3VLForConditionalGeneration": ("0.11.0", "0.11.0 qwen3_vl.py:1129-1131 (visual = None)"),
    "Qwen3VLMoeForConditionalGeneration": ("0.11.0", "0.11.0 qwen3_vl_moe.py:322-323"),
    "Qwen3_5ForConditionalGeneration": ("0.17.0", "0.17.0 qwen3_5.py:652 _mark_tower_model"),
    "Qwen3_5MoeForConditionalGeneration": ("0.17.0", "0.17.0 qwen3_5.py:864 _mark_tower_model"),
    "LlavaForConditionalGeneration": ("0.10.2", "0.10.2 llava.py:538; 0.19.0 llava.py:562 _mark_tower_model"),
    "Gemma3ForConditionalGeneration": ("0.19.0", "0.19.0 gemma3_mm.py:515 _mark_tower_model"),
    "Mistral3ForConditionalGeneration": ("0.19.0", "0.19.0 mistral3.py:418 _mark_tower_model"),
    "PixtralForConditionalGeneration": ("0.19.0", "0.19.0 pixtral.py:327 _mark_tower_model"),
    "PaliGemmaForConditionalGeneration": ("0.19.0", "0.19.0 paligemma.py:295 _mark_tower_model"),
    "Llama4ForConditionalGeneration": ("0.19.0", "0.19.0 mllama4.py:758 _mark_tower_model"),
    "Phi3VForCausalLM": ("0.19.0", "0.19.0 phi3v.py:582 _mark_tower_model"),
    "AyaVisionForConditionalGeneration": ("0.19.0", "0.19.0 aya_vision.py:343 _mark_tower_model"),
    "KimiVLForConditionalGeneration": ("0.19.0", "0.19.0 kimi_vl.py:319 _mark_tower_model"),
    "Gemma3nForConditionalGeneration": ("0.19.0", "0.19.0 gemma3n_mm.py:508 _mark_tower_model"),
    "LlavaOnevisionForConditionalGeneration": ("0.19.0", "0.19.0 llava_onevision.py:511 _mark_tower_model"),
    "Glm4vForConditionalGeneration": ("0.19.0", "0.19.0 glm4_1v.py:1429 _mark_tower_model"),
    "Glm4vMoeForConditionalGeneration": ("0.19.0", "0.19.0 glm4_1v.py:1727 (Glm4v's __init__)"),
}
# interfaces.py:249-290 (0.19.0): _mark_tower_model puts StageMissingLayer in the tower's place when
# get_limit_per_prompt is 0 for every modality the tower serves.


def limits_flag(value: str) -> str:
    """--limit-mm-per-prompt as vLLM takes it -- a JSON object (0.10+; a modality's value a count, or
    from 0.11 an object with one) or ``image=16,video=2`` (0.8 arg_utils.py:57-80 nullable_kvs) --
    as kvwatch keeps it: ``image=0,video=0``, sorted (a fact the sidecar also reads from the log)."""
    pairs: dict[str, object]
    if value.lstrip().startswith("{"):
        pairs = json_object(value)
    else:
        pairs = {}
        for item in value.split(","):
            key, sep, count = item.partition("=")
            if not sep:
                raise ValueError(f"{item!r}: each item is MODALITY=COUNT")
            pairs[key.strip().lower()] = count.strip()
    out: dict[str, int] = {}
    for key, raw in pairs.items():
        if isinstance(raw, dict):
            raw = raw.get("count", 999)  # 0.19.0 config/multimodal.py:19 BaseDummyOptions.count
        if isinstance(raw, str) and raw.isdigit():
            raw = int(raw)
        if MODALITY.fullmatch(key) is None or isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise ValueError(f"{key!r}: {raw!r} is not a modality and a count of 0 or more")
        out[key] = raw
    if not out:
        raise ValueError(f"{value!r} limits no modality")
    return kept_form(out)


def limit(d: Deployment, modality: str, *, v0: bool) -> int:
    """Items a prompt may carry of ``modality``: the flag's, else vLLM's default (1 V0, 999 V1)."""
    given = read_kept(d.mm_limits).get(modality) if d.mm_limits else None
    return given if given is not None else (V0_LIMIT_PER_PROMPT if v0 else 999)


def text_only(dims: ModelDims, d: Deployment, *, v0: bool) -> bool:
    """Whether vLLM serves this multimodal checkpoint as text: --language-model-only, or every
    modality its class takes limited to 0 (a class kvwatch has not listed never is)."""
    if d.language_model_only:
        return True
    takes = MODALITIES.get(dims.architecture)
    return bool(d.mm_limits) and takes is not None and all(limit(d, m, v0=v0) == 0 for m in takes)


def tower_built(dims: ModelDims, d: Deployment, *, v0: bool) -> bool:
    """Whether the loader builds the vision/audio towers (their weights on the first stage)."""
    if d.language_model_only:
        # 0.19.0 config/multimodal.py:264-265: every limit reads 0, so _mark_tower_model skips them.
        return False
    if not text_only(dims, d, v0=v0):
        return True
    since = TOWER_SKIPPED_FROM.get(dims.architecture)
    release = version_tuple(d.engine_version)
    return since is None or (release is not None and release < (version_tuple(since[0]) or ()))


def encoder_profiled(dims: ModelDims, d: Deployment, *, v0: bool) -> bool:
    """Whether the profile run feeds the encoder its dummy items (the V1 encoder term, V0's dummy
    images): a tower, not served as text, and no --skip-mm-profiling (0.10.2
    v1/worker/gpu_model_runner.py:2984-2987)."""
    return dims.has_vision_tower and not text_only(dims, d, v0=v0) and not d.skip_mm_profiling


def served_note(dims: ModelDims, d: Deployment, *, v0: bool) -> str | None:
    """What predict's assumptions say of --limit-mm-per-prompt / --skip-mm-profiling, None without."""
    if not (dims.has_vision_tower or dims.vision_params) or not (
        d.mm_limits or d.skip_mm_profiling or d.language_model_only
    ):
        return None
    takes = MODALITIES.get(dims.architecture)
    if text_only(dims, d, v0=v0):
        how = "--language-model-only" if d.language_model_only else "every modality it takes at 0"
        since = TOWER_SKIPPED_FROM.get(dims.architecture)
        if not tower_built(dims, d, v0=v0):
            tower = "not loaded"
        elif since is not None:
            tower = f"still loaded (vLLM skips {dims.architecture}'s from {since[0]})"
        else:
            tower = f"still loaded (kvwatch has read no release that skips {dims.architecture}'s)"
        return f"served as text ({how}): the profile runs no encoder; the towers are {tower}"
    if d.mm_limits and takes is None:
        return (
            f"--limit-mm-per-prompt: which modalities {dims.architecture or 'this model'} takes is not "
            "listed (multimodal.MODALITIES), so its towers and encoder profile are kept (the smaller pool)"
        )
    if d.mm_limits and takes is not None:
        left = ", ".join(m for m in sorted(takes) if limit(d, m, v0=v0) != 0)
        note = f"--limit-mm-per-prompt leaves {left} above 0: the towers load and the encoder is profiled"
        return note if not d.skip_mm_profiling else note.replace("and the encoder is profiled", "")
    return "--skip-mm-profiling: the profile feeds no encoder (the towers still load)"
