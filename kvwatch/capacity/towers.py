"""Readers of a multimodal config's towers: their parameters, patch grid and depth, for ModelDims.

The towers are loaded beside the text decoder (their weights), profiled by the engines (the grid),
and read by SGLang's default static fraction (the depth); a prefix-LM decoder also sets vLLM's
default batch (prefix_lm_image_tokens).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvwatch.capacity.dims import VisionGrid, _int
from kvwatch.core.jsontypes import JsonValue

_TOWER_KEYS = {
    "hidden": ("hidden_size", "embed_dim", "vt_hidden_size", "d_model", "width"),
    "inter": ("intermediate_size", "vt_intermediate_size", "encoder_ffn_dim", "mlp_dim"),
    "layers": (
        "num_hidden_layers",
        "depth",
        "vt_num_hidden_layers",
        "encoder_layers",
        "num_layers",
        "layers",
    ),
}


def tower_params(config: Mapping[str, JsonValue], text_hidden: int) -> int:
    """Parameters of the encoder towers a multimodal config carries (vision_config, audio_config).

    A transformer encoder: layers x (4 H^2 attention + 2 or 3 (gated) H x I MLP), plus the
    projector into the text model (H x text hidden). What a checkpoint without its
    model.safetensors.index.json at hand would otherwise leave out of the weights (SigLIP-400M:
    27 x (4 x 1152^2 + 2 x 1152 x 4304) = 411M; Qwen2.5-VL-7B's 32-layer SwiGLU tower 630M).
    ``text_hidden`` is the text model's width as geometry.py read it (a nested text_config may
    leave it to its class default).
    """
    cfg: Mapping[str, Any] = config
    total = 0
    for key in ("vision_config", "audio_config"):
        tower = cfg.get(key)
        if not isinstance(tower, Mapping):
            continue
        hidden = _int(tower, *_TOWER_KEYS["hidden"])
        layers = _int(tower, *_TOWER_KEYS["layers"])
        inter = _int(tower, *_TOWER_KEYS["inter"])
        ratio = tower.get("mlp_ratio")
        if not inter and isinstance(ratio, int | float) and not isinstance(ratio, bool) and ratio > 0:
            inter = int(hidden * ratio)
        inter = inter or 4 * hidden
        act = str(tower.get("hidden_act") or tower.get("hidden_activation") or "")
        matrices = 3 if "silu" in act or "swiglu" in act else 2
        total += layers * (4 * hidden * hidden + matrices * hidden * inter)
        total += _tower_projector(tower, hidden, text_hidden)
    return total


def _tower_projector(tower: Mapping[str, Any], hidden: int, text_hidden: int) -> int:
    """Parameters of a tower's projector into the text model, with its patch and position tables.

    A Qwen2.5-VL / Qwen3-VL tower (``spatial_merge_size`` m and ``out_hidden_size`` D in its
    config) projects through a patch merger of two linears, (H m^2)^2 + (H m^2) x D (SGLang
    0.5.5.post3 models/qwen2_5_vl.py:174-200, models/qwen3_vl.py:182-219), one more per
    ``deepstack_visual_indexes`` entry (qwen3_vl.py:280-293), beside a Conv3d patch embedding of
    in_channels x temporal_patch_size x patch_size^2 x H and Qwen3-VL's learned position table
    of num_position_embeddings x H (qwen3_vl.py:92-107, 251-252). Qwen3-VL-30B-A3B's tower:
    411M in its blocks and 127M here, the Hub's 31.1B with the 30.5B text model. Any other
    tower: one H x text hidden projection.
    """
    merge = _int(tower, "spatial_merge_size")
    out = _int(tower, "out_hidden_size")
    if not (merge and out):
        return hidden * text_hidden
    wide = hidden * merge * merge
    deepstack = tower.get("deepstack_visual_indexes")
    mergers = 1 + (len(deepstack) if isinstance(deepstack, list) else 0)
    patch = _int(tower, "patch_size", "spatial_patch_size")
    patch_embed = (
        (_int(tower, "in_chans", "in_channels") or 3)
        * (_int(tower, "temporal_patch_size") or 1)
        * patch
        * patch
        * hidden
    )
    return (
        mergers * (wide * wide + wide * out) + patch_embed + _int(tower, "num_position_embeddings") * hidden
    )


def vision_grid(config: Mapping[str, JsonValue]) -> VisionGrid | None:
    """The tower's patch grid where vision_config gives patch_size, spatial_merge_size and
    temporal_patch_size (the three attributes vLLM's Qwen2-VL processing info reads, 0.8.4
    model_executor/models/qwen2_vl.py:833-837); None for any other tower."""
    tower = config.get("vision_config")
    if not isinstance(tower, Mapping):
        return None
    patch = _int(tower, "patch_size", "spatial_patch_size")
    merge = _int(tower, "spatial_merge_size")
    temporal = _int(tower, "temporal_patch_size")
    if not (patch and merge and temporal):
        return None
    hidden = _int(tower, *_TOWER_KEYS["hidden"])
    return VisionGrid(
        patch_size=patch,
        merge_size=merge,
        temporal_patch_size=temporal,
        in_channels=_int(tower, "in_chans", "in_channels") or 3,
        hidden_size=hidden,
        intermediate_size=_int(tower, *_TOWER_KEYS["inter"]) or 4 * hidden,
        model_type=str(tower.get("model_type") or ""),
        position_embeddings=_int(tower, "num_position_embeddings"),
        out_hidden_size=_int(tower, "out_hidden_size"),
        deepstack_layers=len(deep) if isinstance(deep := tower.get("deepstack_visual_indexes"), list) else 0,
    )


def vision_shape(config: Mapping[str, JsonValue]) -> tuple[int, int]:
    """(num_hidden_layers, hidden_size) of the vision_config, 0 where absent: the two attributes
    SGLang's adjust_mem_fraction_for_vlm reads by these names only (0.5.3 server_args.py:3115-3116),
    so a tower that names its depth 'depth' counts as the 24-layer default there."""
    tower = config.get("vision_config")
    if not isinstance(tower, Mapping):
        return 0, 0
    return _int(tower, "num_hidden_layers"), _int(tower, "hidden_size")


def prefix_lm_image_tokens(raw: Mapping[str, JsonValue], text: Mapping[str, JsonValue]) -> int:
    """The image tokens of a multimodal prefix LM (ModelDims.prefix_lm_image_tokens), 0 otherwise."""
    tower = raw.get("vision_config")
    if text.get("use_bidirectional_attention") != "vision" or not isinstance(tower, Mapping):
        return 0
    return _int(tower, "default_output_length") or 1
