"""The fixed per-request state of linear-attention and Mamba layers, read from config.json.

Engine-neutral: the shapes both engines allocate for one request in one layer (vLLM
model_executor/layers/mamba/mamba_utils.py; SGLang configs/mamba_utils.py); each engine's budget
decides the bytes and how they share the pool (kvwatch/engines/<engine>/budget.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvwatch.capacity.model import LayerKind, LayerSpec
from kvwatch.core.jsontypes import JsonValue


def _pos(cfg: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def state_layer(config: Mapping[str, JsonValue], kind: LayerKind) -> LayerSpec:
    """A linear-attention (Gated DeltaNet) or Mamba2 layer with its per-request state shape, as both
    engines allocate it (vLLM model_executor/layers/mamba/mamba_utils.py, 0.33.0 :186-211 Mamba2,
    :272-293 GDN; SGLang configs/mamba_utils.py:222-230 @0.5.23). A shape the config leaves out is 0:
    the engines' state is then not sized exactly (budget notes say so)."""
    cfg: Mapping[str, Any] = config  # a document of any shape, each value checked by _pos
    fp32 = str(cfg.get("mamba_ssm_dtype") or "").removeprefix("torch.") == "float32"
    cache_dtype = str(cfg.get("mamba_ssm_cache_dtype") or "").removeprefix("torch.")
    if kind == "linear":
        kh, kd = _pos(cfg, "linear_num_key_heads"), _pos(cfg, "linear_key_head_dim")
        vh, vd = _pos(cfg, "linear_num_value_heads"), _pos(cfg, "linear_value_head_dim")
        width = _pos(cfg, "linear_conv_kernel_dim", default=4) - 1
        return LayerSpec(
            kind,
            state_conv_channels=2 * kh * kd + vh * vd,
            state_conv_width=width,
            state_heads=vh,
            state_head_elems=vd * kd,
            state_ssm_fp32=fp32,
            state_ssm_cache_dtype=cache_dtype,
        )
    # Nemotron-H / Mamba2 spellings first, then Granite-4 hybrid's mamba_n_heads, mamba_d_head,
    # mamba_d_state, mamba_n_groups (vLLM granitemoehybrid.py:620-634 @0.25.1 reads those).
    heads, head_dim = (
        _pos(cfg, "mamba_num_heads", "mamba_n_heads"),
        _pos(cfg, "mamba_head_dim", "mamba_d_head"),
    )
    state = _pos(cfg, "ssm_state_size", "state_size", "mamba_d_state")
    groups = _pos(cfg, "n_groups", "mamba_n_groups", default=1)
    d_inner = heads * head_dim
    width = _pos(cfg, "conv_kernel", "mamba_d_conv", default=4) - 1
    return LayerSpec(
        kind,
        state_conv_channels=d_inner + 2 * groups * state if d_inner else 0,
        state_conv_width=width,
        state_heads=heads,
        state_head_elems=head_dim * state,
        state_ssm_fp32=fp32,
        state_groups=groups if d_inner else 0,
        state_size=state,
        # vLLM config/model.py get_mamba_chunk_size (0.25.1 :1422-1437): mamba_chunk_size, else chunk_size.
        state_chunk=_pos(cfg, "mamba_chunk_size", "chunk_size"),
        state_ssm_cache_dtype=cache_dtype,
    )
