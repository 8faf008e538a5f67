"""Weights: the parameter count recomputed from config shapes, and the bytes it takes per rank.

The count is itemised (embeddings, attention, dense MLP, routed experts, shared experts, Mamba /
linear-attention mixers, norms) because quantisation applies to some items and not others:
gpt-oss' MXFP4 and Kimi's int4 cover only the routed experts, DeepSeek's FP8 every decoder linear.
When the model directory has model.safetensors.index.json its ``total_size`` is the checkpoint's
own figure and wins over the estimate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvwatch.capacity.architectures import Architecture, architecture, nemotron_pattern
from kvwatch.capacity.dims import (
    ATTENTION,
    DENSE_MLP,
    EMBED,
    EXPERTS,
    LM_HEAD,
    MIXER,
    NORMS,
    ROUTER,
    SHARED,
    modelopt_fields,
)
from kvwatch.capacity.dtypes import WEIGHT_DTYPES
from kvwatch.capacity.model import LayerSpec, ModelGeometry
from kvwatch.core.errors import ConfigError, ModelConfigError
from kvwatch.core.jsontypes import JsonValue
from kvwatch.core.units import format_bytes

# Itemised parameter groups.


def _i(cfg: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        v = cfg.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            return int(v)
    return default


def _find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


def _attention_params(
    cfg: Mapping[str, Any], arch: Architecture, layer: LayerSpec, hidden: int, heads: int
) -> int:
    if layer.kind == "mla":
        q_lora = _i(cfg, "q_lora_rank")
        nope = _i(cfg, "qk_nope_head_dim")
        rope = _i(cfg, "qk_rope_head_dim")
        v_dim = _i(cfg, "v_head_dim")
        kv_lora = _i(cfg, "kv_lora_rank")
        q_out = heads * (nope + rope)
        q = hidden * q_lora + q_lora + q_lora * q_out if q_lora else hidden * q_out
        kv = hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
        o = heads * v_dim * hidden
        idx = 0
        index_dim = _i(cfg, "index_head_dim")
        if index_dim:
            index_heads = _i(cfg, "index_n_heads")
            idx = q_lora * index_heads * index_dim + hidden * index_dim + 2 * index_dim + hidden * index_heads
        return q + kv + o + idx
    hq = layer.head_size_k
    q_out = heads * hq
    if arch.gated_attention:
        q_out *= 2  # gated attention output: q_proj also produces the gate
    k_out = layer.num_kv_heads * layer.head_size_k
    v_out = 0 if cfg.get("attention_k_eq_v") else layer.num_kv_heads * layer.head_size_v
    total = hidden * (q_out + k_out + v_out) + heads * layer.head_size_v * hidden
    if cfg.get("attention_bias") is True or arch.linear_bias:
        total += heads * hq + k_out + v_out + hidden
    elif arch.qkv_bias:
        total += heads * hq + k_out + v_out  # q/k/v biases only (Qwen2)
    if arch.qk_norm:
        total += 2 * layer.head_size_k  # q_norm / k_norm
    return total


def _mixer_params(cfg: Mapping[str, Any], kind: str, hidden: int) -> int:
    if kind == "mamba":
        heads = _i(cfg, "mamba_num_heads")
        head_dim = _i(cfg, "mamba_head_dim")
        d_inner = heads * head_dim or _i(cfg, "expand", default=2) * hidden
        groups = _i(cfg, "n_groups", default=1)
        state = _i(cfg, "ssm_state_size", "state_size", default=128)
        conv = _i(cfg, "conv_kernel", default=4)
        heads = heads or d_inner // 64
        conv_dim = d_inner + 2 * groups * state
        in_proj = hidden * (2 * d_inner + 2 * groups * state + heads)
        return in_proj + conv_dim * (conv + 1) + 3 * heads + d_inner + d_inner * hidden
    # Gated DeltaNet (Qwen3-Next / Qwen3.5 linear attention).
    kh = _i(cfg, "linear_num_key_heads")
    vh = _i(cfg, "linear_num_value_heads")
    kd = _i(cfg, "linear_key_head_dim")
    vd = _i(cfg, "linear_value_head_dim")
    if not (kh and vh and kd and vd):
        raise ModelConfigError("config.json has linear-attention layers but no 'linear_num_key_heads'")
    key_dim, value_dim = kh * kd, vh * vd
    conv = _i(cfg, "linear_conv_kernel_dim", default=4)
    in_proj = hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * vh
    return in_proj + (2 * key_dim + value_dim) * conv + 2 * vh + vd + value_dim * hidden


def _is_moe_layer(cfg: Mapping[str, Any], i: int, n_experts: int) -> bool:
    if not n_experts:
        return False
    if "first_k_dense_replace" in cfg:
        freq = _i(cfg, "moe_layer_freq", default=1)
        return i >= int(cfg.get("first_k_dense_replace") or 0) and i % freq == 0
    mlp_only = cfg.get("mlp_only_layers")
    if isinstance(mlp_only, list) and i in mlp_only:
        return False
    step = _i(cfg, "decoder_sparse_step", default=1)
    return (i + 1) % step == 0


def count_params(cfg: Mapping[str, JsonValue], layers: Sequence[LayerSpec]) -> dict[str, int]:
    """Itemised parameter count from a (text) config and its layer specs."""
    return _count_params(cfg, layers)


def _count_params(cfg: Mapping[str, Any], layers: Sequence[LayerSpec]) -> dict[str, int]:
    # config.json is a document of any shape: the counting reads it dynamically (a key of an
    # unexpected type is a TypeError the geometry reports as an unusable config).
    hidden = int(cfg["hidden_size"])
    heads = int(cfg["num_attention_heads"])
    vocab = _i(cfg, "vocab_size")
    arch = architecture(str(cfg.get("model_type") or ""))
    tied = cfg.get("tie_word_embeddings", True)
    n_experts = _i(cfg, "n_routed_experts", "num_experts", "num_local_experts")
    moe_inter = _i(cfg, "moe_intermediate_size", "intermediate_size")
    inter = _i(cfg, "intermediate_size", "ffn_dim")
    # relu2 (Nemotron-H) and OPT/GPT-2-style MLPs have no gate projection.
    gated = arch.mlp_matrices
    # LayerNorm: weight and bias; RMSNorm: weight only.
    norm = 2 * hidden if arch.norm_bias else hidden
    out = dict.fromkeys((EMBED, LM_HEAD, ATTENTION, DENSE_MLP, EXPERTS, SHARED, ROUTER, MIXER, NORMS), 0)
    out[EMBED] = vocab * hidden
    if arch.learned_positions:
        out[EMBED] += _i(cfg, "max_position_embeddings") * hidden
    out[LM_HEAD] = 0 if tied else vocab * hidden
    out[NORMS] = norm  # final norm
    block_configs = cfg.get("block_configs") if isinstance(cfg.get("block_configs"), list) else None
    pattern = nemotron_pattern(cfg)
    for i, layer in enumerate(layers):
        out[NORMS] += 2 * norm
        if layer.kind in ("full", "sliding", "chunked", "mla"):
            if block_configs is not None:
                group = block_configs[i]["attention"]["n_heads_in_group"]
                out[ATTENTION] += _attention_params(cfg, arch, layer, hidden, heads) if group else 0
            else:
                out[ATTENTION] += _attention_params(cfg, arch, layer, hidden, heads)
        elif layer.kind in ("mamba", "linear"):
            out[MIXER] += _mixer_params(cfg, layer.kind, hidden)
        elif block_configs is not None:
            attn = block_configs[i].get("attention", {})
            if attn.get("replace_with_linear"):
                out[ATTENTION] += hidden * hidden
        # Feed-forward part of the layer.
        if block_configs is not None:
            ffn = block_configs[i].get("ffn", {})
            if ffn.get("no_op"):
                continue
            if ffn.get("replace_with_linear"):
                out[DENSE_MLP] += hidden * hidden
                continue
            mult = ffn.get("ffn_mult")
            if not isinstance(mult, int | float):
                raise ModelConfigError(f"config.json block_configs[{i}].ffn has no 'ffn_mult'")
            out[DENSE_MLP] += 3 * hidden * _find_multiple(int(2 * mult * hidden / 3), 256)
            continue
        if pattern is not None:
            ch = pattern[i]
            if ch == "-":
                out[DENSE_MLP] += gated * hidden * inter
            elif ch == "E":
                out[EXPERTS] += n_experts * gated * hidden * moe_inter
                # NemotronHMoE (vLLM 0.19.0 models/nemotron_h.py:143-190): the router (GateLinear,
                # hidden x experts) and the shared expert, a NemotronHMLP of
                # moe_shared_expert_intermediate_size x n_shared_experts.
                out[ROUTER] += hidden * n_experts
                shared = _i(cfg, "moe_shared_expert_intermediate_size") * _i(cfg, "n_shared_experts")
                out[SHARED] += gated * hidden * shared
            out[NORMS] -= norm  # Nemotron-H blocks have a single norm
            continue
        if _is_moe_layer(cfg, i, n_experts):
            if cfg.get("enable_moe_block") is True and inter:
                # Gemma-4: the routed experts run beside the layer's dense MLP, not instead of it.
                out[DENSE_MLP] += gated * hidden * inter
            out[EXPERTS] += n_experts * 3 * hidden * moe_inter
            out[ROUTER] += hidden * n_experts
            shared = _i(cfg, "n_shared_experts")
            if shared:
                out[SHARED] += shared * 3 * hidden * moe_inter
            shared_inter = _i(cfg, "shared_expert_intermediate_size")
            if shared_inter:
                out[SHARED] += 3 * hidden * shared_inter + hidden
        else:
            if not inter:
                raise ModelConfigError(
                    "config.json has no 'intermediate_size'; kvwatch cannot size the weights"
                )
            out[DENSE_MLP] += gated * hidden * inter
            if arch.linear_bias:
                out[DENSE_MLP] += (gated - 1) * inter + hidden
    return out


@dataclass(frozen=True)
class WeightsEstimate:
    """Weight bytes of the whole model and of one rank, with how they were derived."""

    total_bytes: int
    per_rank_bytes: int
    scheme: str
    source: str  # 'safetensors_index' | 'estimate'


# Bits per parameter of quantised linears (values + scales), by scheme.
_INT4_DEFAULT_GROUP = 128


# Bits a parameter of a MIXED_PRECISION group's scheme costs ('none': the model dtype).
_SCHEME_BITS = {"fp8": 8.0, "nvfp4": 4.5}


def _quant_scheme(quant: Mapping[str, Any] | None) -> tuple[str, float, frozenset[str]] | None:
    """(name, bits per quantised param, which item groups it covers) from quantization_config."""
    if not quant:
        return None
    method = str(quant.get("quant_method") or "").lower()
    linear_groups = frozenset({ATTENTION, DENSE_MLP, EXPERTS, SHARED, MIXER})
    ignored = " ".join(str(x) for x in (quant.get("ignore") or quant.get("modules_to_not_convert") or []))
    groups = set(linear_groups)
    if "self_attn" in ignored:
        groups.discard(ATTENTION)
    if "shared_expert" in ignored:
        groups.discard(SHARED)
    if "mlp.(gate|up" in ignored or "mlp.gate_proj" in ignored:
        groups.discard(DENSE_MLP)
    if method == "mxfp4":
        return "mxfp4", 4.25, frozenset({EXPERTS} & groups)
    if method in ("fp8", "fbgemm_fp8") or (
        method == "modelopt" and str(modelopt_fields(quant).get("quant_algo")).upper() == "FP8"
    ):
        return "fp8", 8.0, frozenset(groups)
    if method == "modelopt":
        # NVFP4: 4-bit values and an fp8 scale per 16 (the only other algo dims.checkpoint_quant admits).
        return "nvfp4", 4.5, frozenset(groups)
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round", "auto_round"):
        bits = int(quant.get("bits") or quant.get("w_bit") or 4)
        group = int(quant.get("group_size") or quant.get("q_group_size") or _INT4_DEFAULT_GROUP)
        group = group if group > 0 else 4096
        return f"int{bits} {method}", bits + 16 / group + bits / group, frozenset(groups)
    if method == "bitsandbytes":
        # 8-bit int8 rows, or 4-bit NF4/FP4 values with an fp32 absmax per 64 (bitsandbytes' default).
        if quant.get("load_in_8bit"):
            return "int8 bitsandbytes", 8.0, frozenset(groups)
        return "int4 bitsandbytes", 4.5, frozenset(groups)
    if method == "compressed-tensors":
        cg = quant.get("config_groups") or {}
        first: Mapping[str, Any] = next(iter(cg.values()), {}) if isinstance(cg, dict) else {}
        w = first.get("weights") or {}
        bits = int(w.get("num_bits") or 8)
        if bits == 4 and w.get("type") == "float":
            return "nvfp4 compressed-tensors", 4.5, frozenset(groups)
        if bits >= 8:
            return f"{w.get('type', 'int')}{bits} compressed-tensors", 8.0, frozenset(groups)
        group = int(w.get("group_size") or _INT4_DEFAULT_GROUP)
        return f"int{bits} compressed-tensors", bits + 16 / group, frozenset(groups)
    return None


def _family(name: str) -> str:
    """'int4 awq', 'awq', 'gptq', 'int4 compressed-tensors' -> 'int4'; 'fp8' -> 'fp8'; ..."""
    name = name.lower()
    if name.startswith("int4") or name in ("awq", "gptq"):
        return "int4"
    if name.startswith(("fp8", "float8", "int8")):
        return "8bit"
    return name


def weight_bytes(model: ModelGeometry, weights_dtype: str | None = None) -> tuple[int, str]:
    """Bytes of all weights and the scheme used.

    Without ``weights_dtype`` the checkpoint's own quantization_config decides, item by item (FP8
    covers every decoder linear, MXFP4 and Kimi's int4 only the routed experts; embeddings stay in
    the model dtype). With it, every parameter is counted at that width (see WEIGHT_DTYPES).
    """
    params = model.params
    scheme = _quant_scheme(model.quantization)
    if weights_dtype is not None:
        key = weights_dtype.lower()
        if key not in WEIGHT_DTYPES:
            raise ConfigError(
                f"unknown weights dtype {weights_dtype!r} (use one of {', '.join(sorted(WEIGHT_DTYPES))})"
            )
        if scheme is None or _family(scheme[0]) != _family(key):
            return int(sum(params.values()) * WEIGHT_DTYPES[key]), key
        # The checkpoint is already quantised this way (an engine log naming its own quantization):
        # count it item by item below.
    base_bits = model.dtype_bytes * 8
    total_bits = 0.0
    for group, count in params.items():
        total_bits += count * _group_bits(model, scheme, group)
    total_bits += _bnb_kept_bits(model, scheme, (ATTENTION, DENSE_MLP))
    # Vision / audio towers, in the model dtype (checkpoints keep them unquantised).
    total_bits += (model.dims.vision_params if model.dims is not None else 0) * base_bits
    return int(total_bits // 8), scheme[0] if scheme is not None else model.dtype


def _group_bits(model: ModelGeometry, scheme: tuple[str, float, frozenset[str]] | None, group: str) -> float:
    """Bits one parameter of ``group`` costs as the checkpoint stores it: its own scheme in a
    MIXED_PRECISION checkpoint (dims.group_quant, the head's too), else the checkpoint's scheme
    where it covers the group, else the model dtype."""
    base = float(model.dtype_bytes * 8)
    mixed = dict(model.dims.group_quant) if model.dims is not None else {}
    if group in mixed:
        return _SCHEME_BITS.get(mixed[group], base)
    return scheme[1] if scheme is not None and group in scheme[2] else base


def _bnb_kept_bits(
    model: ModelGeometry, scheme: tuple[str, float, frozenset[str]] | None, groups: tuple[str, ...]
) -> float:
    """The bits a bitsandbytes checkpoint's llm_int8_skip_modules add over quantising those linears:
    they stay in the model dtype (dims.bnb_skipped; vLLM quantization/bitsandbytes.py:123-145)."""
    if scheme is None or model.dims is None or not model.dims.bnb_skipped:
        return 0.0
    extra = model.dtype_bytes * 8 - scheme[1]
    kept = 0
    for a, m in model.dims.bnb_skipped:
        kept += (a if ATTENTION in groups and ATTENTION in scheme[2] else 0) + (
            m if DENSE_MLP in groups and DENSE_MLP in scheme[2] else 0
        )
    return kept * extra


def weight_bytes_of(model: ModelGeometry, group: str) -> int:
    """Bytes of one parameter group (dims.ATTENTION, ...) as the checkpoint stores it."""
    scheme = _quant_scheme(model.quantization)
    bits = _group_bits(model, scheme, group)
    return int((model.params.get(group, 0) * bits + _bnb_kept_bits(model, scheme, (group,))) // 8)


def weights_per_rank(
    model: ModelGeometry, tp: int, pp: int, weights_dtype: str | None = None
) -> WeightsEstimate:
    """Weight bytes on the most loaded rank: layers split over PP stages, every matrix split over TP."""
    if model.safetensors_total_size is not None and weights_dtype is None:
        total, scheme, source = model.safetensors_total_size, "checkpoint", "safetensors_index"
    else:
        total, scheme = weight_bytes(model, weights_dtype)
        source = "estimate"
    if pp <= 1:
        per_rank = total // tp
    else:
        params = model.params
        whole = sum(params.values()) or 1
        edge = max(params[EMBED], params[LM_HEAD]) / whole
        stage_layers = -(-model.num_layers // pp)
        layer_share = (1 - (params[EMBED] + params[LM_HEAD]) / whole) * stage_layers / model.num_layers
        per_rank = int(total * (layer_share + edge)) // tp
    return WeightsEstimate(total_bytes=total, per_rank_bytes=per_rank, scheme=scheme, source=source)


# How load_oom's failure begins, for the commands that say it in their own words (plan).
LOAD_OOM = "CUDA out of memory loading the weights"


def load_oom(
    engine: str, weights: int, scheme: str | None, total: int, free: int, tp: int, pp: int
) -> str | None:
    """The startup's failure when one rank's weights exceed the memory free when they load.

    Both engines load the weights before any budget is measured, so this is torch's CUDA out of
    memory in the loader, not the engine's own 'no memory for the KV cache' (whose remedy, a higher
    utilisation or static fraction, cannot help here): the weights must be spread over more GPUs or
    be smaller. None when they fit."""
    if weights <= free:
        return None
    held = f", {format_bytes(free)} of it free when they load" if free < total else ""
    return (
        f"{LOAD_OOM}: {engine} needs {format_bytes(weights)} per GPU "
        f"({scheme or 'checkpoint'}, tp={tp} pp={pp}) on a {format_bytes(total)} card{held}. No "
        "utilisation or static fraction helps; shard them over more GPUs (--tp, --pp) or serve a "
        "smaller (quantised) checkpoint."
    )
