"""The shapes of a model that set its non-KV memory: what an engine's memory model reads.

Engine-neutral: widths, vocabulary, experts, the parameter groups by how a loader stores them
(decoder linears that quantisation covers, routed experts, embeddings, head, small tensors), the
checkpoint's quantisation and the rotary table. Built once from the text config and the itemised
parameter count (``dims_from_config``); kvwatch/engines/vllm/memory.py and weights.py turn it into
bytes the way vLLM's loader and profile run do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvwatch.core.errors import UnmodelledError
from kvwatch.core.jsontypes import JsonValue

# Parameter groups of the itemised count (kvwatch.capacity.weights.count_params).
EMBED = "embeddings"
LM_HEAD = "lm_head"
ATTENTION = "attention"
DENSE_MLP = "dense_mlp"
EXPERTS = "routed_experts"
SHARED = "shared_experts"
ROUTER = "router"
MIXER = "mamba_linear_mixers"
NORMS = "norms"


@dataclass(frozen=True)
class ModelDims:
    """Whole-model shapes (not per rank) of the text decoder; a vision tower only as a flag."""

    hidden_size: int
    intermediate_size: int  # dense MLP intermediate (0 when every layer is MoE)
    num_layers: int
    vocab_size: int
    embed_params: int
    lm_head_params: int  # 0 when tied
    # Decoder linears quantisation covers: attention, dense MLP, shared experts, mixers.
    linear_params: int
    expert_params: int  # routed experts
    other_params: int  # norms and routers, kept in the activation dtype
    tied_embeddings: bool
    n_experts: int
    top_k: int
    moe_intermediate_size: int
    dtype_bytes: int  # the checkpoint's torch_dtype
    # 'fp8' | 'int8' | 'w4a16' | 'mxfp4' | 'nvfp4' | None, from quantization_config; and its group size.
    checkpoint_quant: str | None
    quant_group: int
    has_vision_tower: bool
    # Parameters of the vision / audio towers and their projectors (estimated from vision_config /
    # audio_config: tower_params); the engines load them beside the text decoder, in the model dtype.
    vision_params: int
    # Length and width of the rotary cos/sin cache the loader builds.
    rope_positions: int
    rotary_dim: int
    # The vision tower's depth and width (0 without one): SGLang's default static fraction reads them.
    vision_layers: int = 0
    vision_hidden: int = 0
    # A vision tower that cuts images into a temporal x spatial patch grid (vision_config's
    # patch_size, spatial_merge_size, temporal_patch_size: Qwen2-VL and its successors); None else.
    vision_grid: VisionGrid | None = None
    # The checkpoint's class (config.json architectures[0], a wrapper's own): which modalities an
    # engine's multimodal processing takes for it (engines/vllm/multimodal.MODALITIES).
    architecture: str = ""
    # MLA only: the parameters of one layer's latent up-projection (kv_b_proj: kv_lora_rank x heads x
    # (qk_nope_head_dim + v_head_dim)), which an engine may keep a second copy of, split per head.
    mla_kv_up_params: int = 0
    # DeepSeek sparse attention only: one layer's indexer projections, wq_b + wk (q_lora_rank x
    # index_n_heads x index_head_dim + hidden x index_head_dim), and its weights_proj (hidden x
    # index_n_heads); the param count puts both inside the attention.
    dsa_indexer_linear_params: int = 0
    dsa_indexer_gate_params: int = 0
    # bitsandbytes only: per decoder layer, the (attention, dense MLP) linear params the checkpoint's
    # llm_int8_skip_modules leave in the model dtype (bnb_skipped_params); empty when none are.
    bnb_skipped: tuple[tuple[int, int], ...] = ()
    # ModelOpt MIXED_PRECISION only: each item group's scheme ((ATTENTION, 'fp8'), (LM_HEAD,
    # 'nvfp4'), ..., 'none' for a decoder linear group it leaves in the model dtype;
    # mixed_precision_groups), and the attention and mixer shares of linear_params, which such a
    # checkpoint may quantise apart from the MLPs.
    group_quant: tuple[tuple[str, str], ...] = ()
    attention_params: int = 0
    mixer_params: int = 0
    # quantization_config.quant_method as written, lower case ('' when none): the scheme above does
    # not tell a bitsandbytes 4-bit checkpoint, which dequantises per matmul, from AWQ / GPTQ.
    quant_method: str = ""
    # Vision tokens one image yields where the text decoder attends to them bidirectionally (a
    # multimodal prefix LM: Gemma-4's text_config use_bidirectional_attention 'vision'; its
    # vision_config.default_output_length); 0 for a causal decoder.
    prefix_lm_image_tokens: int = 0


def _int(cfg: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _ct_scheme(groups: object) -> tuple[str, int]:
    """(scheme, group size) of compressed-tensors ``config_groups``: one weight format in every group
    (vLLM compressed_tensors.py picks a scheme per target; several formats in one checkpoint are not
    weighed per tensor here, so they are refused rather than weighed as the first)."""
    formats: dict[tuple[int, str], int] = {}
    for group in groups.values() if isinstance(groups, Mapping) else ():
        found = group.get("weights") if isinstance(group, Mapping) else None
        weights: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        if not weights:
            continue
        key = (_int(weights, "num_bits") or 8, str(weights.get("type") or "int"))
        formats[key] = _int(weights, "group_size") or formats.get(key, 0)
    if not formats:
        raise UnmodelledError(
            "quantization_config compressed-tensors has no config_groups weights kvwatch can weigh"
        )
    if len(formats) > 1:
        named = ", ".join(f"{kind}{bits}" for bits, kind in formats)
        raise UnmodelledError(
            f"quantization_config mixes weight formats ({named}) across config_groups: per-tensor "
            "quantization of mixed checkpoints is not modelled"
        )
    ((bits, kind), group), *_ = formats.items()
    if bits == 4 and kind == "float":
        return "nvfp4", group or 16
    if bits <= 4 and kind == "int":
        return "w4a16", group or 128
    if bits == 8:
        return ("fp8" if kind == "float" else "int8"), 128
    raise UnmodelledError(f"quantization_config compressed-tensors {kind}{bits} weights are not modelled")


# ModelOpt's per-layer algorithms (vLLM 0.24.0 modelopt.py:110-118, quantized_layers :2269-2300): FP8,
# NVFP4 and its weight-only W4A16 form (the same 4-bit values and fp8 scale per 16 on disk).
_MODELOPT_ALGOS = {"FP8": "fp8", "NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4"}
# Where a module name puts a quantised linear (the checkpoint's own names, any model prefix).
_MIXED_GROUPS = (
    (re.compile(r"(?:^|\.)lm_head$"), LM_HEAD),
    (re.compile(r"\.shared_experts?\."), SHARED),
    (re.compile(r"\.experts(?:$|\.)"), EXPERTS),
    (re.compile(r"\.(?:self_attn|attention|attn)\."), ATTENTION),
    (re.compile(r"\.(?:linear_attn|mixer|mamba)\."), MIXER),
    (re.compile(r"\.mlp\.(?:gate_up_proj|gate_proj|up_proj|down_proj)$"), DENSE_MLP),
)


def mixed_precision_groups(quant: Mapping[str, JsonValue]) -> dict[str, str]:
    """A ModelOpt MIXED_PRECISION checkpoint's scheme per item group, from its quantized_layers
    (module name -> {'quant_algo': ...}). A name kvwatch cannot place, an algorithm it cannot weigh,
    or a group whose linears disagree raises UnmodelledError naming it; groups not listed stay in
    the model dtype."""
    layers = quant.get("quantized_layers")
    if not isinstance(layers, Mapping) or not layers:
        raise UnmodelledError("quantization_config modelopt MIXED_PRECISION lists no quantized_layers")
    out: dict[str, str] = {}
    for name, spec in layers.items():
        algo = str(spec.get("quant_algo") or "").upper() if isinstance(spec, Mapping) else ""
        scheme = _MODELOPT_ALGOS.get(algo)
        if scheme is None:
            raise UnmodelledError(
                f"quantization_config modelopt MIXED_PRECISION algo {algo or '(none)'!r} is not modelled"
            )
        group = next((g for pattern, g in _MIXED_GROUPS if pattern.search(str(name))), None)
        if group is None:
            raise UnmodelledError(
                f"quantization_config MIXED_PRECISION layer {str(name)[:80]!r} is not one kvwatch can place"
            )
        if out.setdefault(group, scheme) != scheme:
            raise UnmodelledError(f"quantization_config MIXED_PRECISION quantises {group} two ways")
    return out


def checkpoint_quant(config: JsonValue) -> tuple[str | None, int]:
    """(scheme, group size) a checkpoint's quantization_config declares (absent or not an object:
    none). A method or format kvwatch cannot weigh raises UnmodelledError naming it: weighing it as
    unquantised (the old silent default) puts the weights off by 2-4x."""
    if not isinstance(config, Mapping):
        return None, 128
    # A document of any shape: read dynamically here, each value checked.
    quant: Mapping[str, Any] = config
    method = str(quant.get("quant_method") or "").lower()
    if method == "mxfp4":
        return "mxfp4", 32
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", 128
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round", "auto_round"):
        bits = _int(quant, "bits", "w_bit") or 4
        if bits == 8:
            return "int8", 128
        if bits == 4:
            return "w4a16", _int(quant, "group_size", "q_group_size") or 128
        raise UnmodelledError(f"quantization_config {method} with {bits}-bit weights is not modelled")
    if method == "modelopt":
        quant = modelopt_fields(quant)  # FP8, NVFP4 (fp8 scale per 16), MIXED_PRECISION per layer
        algo = str(quant.get("quant_algo") or "").upper()
        if algo == "FP8":
            return "fp8", 128
        if algo == "NVFP4":
            return "nvfp4", _int(quant, "group_size") or 16
        if algo == "MIXED_PRECISION":
            groups = mixed_precision_groups(quant)
            main = groups.get(EXPERTS) or groups.get(DENSE_MLP) or next(iter(groups.values()))
            return main, 16 if main == "nvfp4" else 128
        raise UnmodelledError(f"quantization_config modelopt quant_algo {algo or '(none)'!r} is not modelled")
    if method == "compressed-tensors":
        return _ct_scheme(quant.get("config_groups"))
    if method == "bitsandbytes":
        return ("int8" if quant.get("load_in_8bit") else "w4a16"), 64
    if not method:
        raise UnmodelledError("config.json quantization_config has no quant_method: kvwatch cannot weigh it")
    raise UnmodelledError(f"quantization_config.quant_method {method!r} is not one kvwatch can weigh")


def modelopt_fields(quant: Mapping[str, JsonValue]) -> Mapping[str, JsonValue]:
    """A ModelOpt config's settings, or hf_quant_config.json's nested "quantization" (0.30.0 modelopt.py:316-319)."""
    return inner if isinstance(inner := quant.get("quantization"), Mapping) else quant


def _quant_method(config: object) -> str:
    return str(config.get("quant_method") or "").lower() if isinstance(config, Mapping) else ""


def _bnb_skipped_linear(prefix: str, skip: list[str]) -> bool:
    """vLLM's rule (0.8.5 quantization/bitsandbytes.py:123-145, is_layer_skipped_bnb; the same from
    0.7.3, vllm#12974): a linear whose prefix has a skip entry as one of its dot components, or as
    one of its leading dotted paths, gets UnquantizedLinearMethod and loads in the model dtype."""
    parts = prefix.split(".")
    heads = {".".join(parts[: k + 1]) for k in range(len(parts))}
    return any(entry in parts or entry in heads for entry in skip)


def bnb_skipped_params(
    cfg: Mapping[str, JsonValue], params: Mapping[str, int], num_layers: int
) -> tuple[tuple[int, int], ...]:
    """Per layer, the (attention, dense MLP) params a bitsandbytes checkpoint keeps unquantised.

    Unsloth's dynamic 4-bit checkpoints list whole modules ("model.layers.1.mlp", vllm#12974) or
    projections in llm_int8_skip_modules; vLLM matches them against its own linears' prefixes
    (model.layers.N.self_attn.qkv_proj / o_proj, model.layers.N.mlp.gate_up_proj / down_proj), so a
    name only the HF checkpoint has (q_proj, gate_proj) matches nothing there. Attention is costed as
    the average layer's, split qkv : o by the head counts, the gated MLP 2 : 1; MoE layers' experts
    are not matched (their names differ per model)."""
    quant = cfg.get("quantization_config")
    if not isinstance(quant, Mapping) or _quant_method(quant) != "bitsandbytes":
        return ()
    raw = quant.get("llm_int8_skip_modules")
    skip = [str(x) for x in raw] if isinstance(raw, list) else []
    if not skip or num_layers < 1:
        return ()
    heads = _int(cfg, "num_attention_heads") or 1
    kv = _int(cfg, "num_key_value_heads") or heads
    attn = params.get(ATTENTION, 0) // num_layers
    qkv = attn * (heads + 2 * kv) // (2 * heads + 2 * kv)
    mlp = 0 if _int(cfg, "n_routed_experts", "num_experts", "num_local_experts") else params.get(DENSE_MLP, 0)
    mlp //= num_layers
    out: list[tuple[int, int]] = []
    for i in range(num_layers):
        base = f"model.layers.{i}"
        a = sum(
            n
            for name, n in (("qkv_proj", qkv), ("o_proj", attn - qkv))
            if _bnb_skipped_linear(f"{base}.self_attn.{name}", skip)
        )
        m = sum(
            n
            for name, n in (("gate_up_proj", mlp * 2 // 3), ("down_proj", mlp - mlp * 2 // 3))
            if _bnb_skipped_linear(f"{base}.mlp.{name}", skip)
        )
        out.append((a, m))
    return tuple(out) if any(a or m for a, m in out) else ()


def _rope_positions(cfg: Mapping[str, Any], max_position: int) -> int:
    """Rows of the rotary cache (vllm rotary_embedding get_rope): YaRN builds original x factor,
    linear/dynamic scaling max_position x factor, the others max_position."""
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, Mapping):
        return max_position
    kind = str(rope.get("rope_type") or rope.get("type") or "")
    factor = rope.get("factor")
    if not isinstance(factor, int | float) or isinstance(factor, bool) or factor <= 0:
        return max_position
    if kind == "yarn":
        original = _int(rope, "original_max_position_embeddings") or max_position
        return int(original * factor)
    if kind in ("dynamic", "linear"):
        return int(max_position * factor)
    return max_position


@dataclass(frozen=True)
class VisionGrid:
    """The patch grid of a Qwen2-VL-style vision tower, as its config.json's vision_config names it."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    in_channels: int
    hidden_size: int
    intermediate_size: int
    # vision_config's model_type ('qwen3_5', 'qwen3_vl', ...; '' when absent): which tower an
    # engine's profile of the encoder (engines/vllm/multimodal.py) knows how to size.
    model_type: str = ""
    # The learned position table (num_position_embeddings, 0 without one), the merger's output width
    # (out_hidden_size: the text decoder's hidden) and the deepstack layers (deepstack_visual_indexes).
    position_embeddings: int = 0
    out_hidden_size: int = 0
    deepstack_layers: int = 0


def dims_from_config(
    config: Mapping[str, JsonValue],
    params: Mapping[str, int],
    *,
    num_layers: int,
    dtype_bytes: int,
    has_vision_tower: bool,
    vision_params: int = 0,
    vision_shape: tuple[int, int] = (0, 0),
    grid: VisionGrid | None = None,
    architecture: str = "",
    prefix_lm_tokens: int = 0,
) -> ModelDims:
    """The shapes of a text config (``params`` is its itemised count by the groups above)."""
    cfg: Mapping[str, Any] = config  # a document of any shape, read dynamically
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    heads = _int(cfg, "num_attention_heads", "n_head") or 1
    head_dim = _int(cfg, "head_dim") or hidden // heads
    n_experts = _int(cfg, "n_routed_experts", "num_experts", "num_local_experts")
    moe_inter = _int(cfg, "moe_intermediate_size") or (_int(cfg, "intermediate_size") if n_experts else 0)
    inter = _int(cfg, "intermediate_size", "ffn_dim", "n_inner")
    if n_experts and not params.get(DENSE_MLP):
        # Every layer is MoE: the dense intermediate is the shared expert's (if any).
        inter = _int(cfg, "shared_expert_intermediate_size") or _int(cfg, "n_shared_experts") * moe_inter
    quant, group = checkpoint_quant(cfg.get("quantization_config"))
    partial = cfg.get("partial_rotary_factor")
    rotary = int(head_dim * partial) if isinstance(partial, int | float) and 0 < partial <= 1 else head_dim
    max_position = _int(cfg, "max_position_embeddings", "n_positions", "max_sequence_length")
    return ModelDims(
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=num_layers,
        vocab_size=_int(cfg, "vocab_size"),
        embed_params=params.get(EMBED, 0),
        lm_head_params=params.get(LM_HEAD, 0),
        linear_params=sum(params.get(k, 0) for k in (ATTENTION, DENSE_MLP, SHARED, MIXER)),
        expert_params=params.get(EXPERTS, 0),
        other_params=params.get(NORMS, 0) + params.get(ROUTER, 0),
        tied_embeddings=params.get(LM_HEAD, 0) == 0,
        n_experts=n_experts,
        top_k=_int(cfg, "num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token"),
        moe_intermediate_size=moe_inter,
        dtype_bytes=dtype_bytes,
        checkpoint_quant=quant,
        quant_group=group,
        has_vision_tower=has_vision_tower,
        vision_params=vision_params,
        vision_layers=vision_shape[0],
        vision_hidden=vision_shape[1],
        vision_grid=grid,
        architecture=architecture,
        prefix_lm_image_tokens=prefix_lm_tokens,
        rope_positions=_rope_positions(cfg, max_position),
        rotary_dim=rotary,
        mla_kv_up_params=_int(cfg, "kv_lora_rank")
        * heads
        * (_int(cfg, "qk_nope_head_dim") + _int(cfg, "v_head_dim")),
        dsa_indexer_linear_params=(
            (_int(cfg, "q_lora_rank") * _int(cfg, "index_n_heads") + hidden) * _int(cfg, "index_head_dim")
            if _int(cfg, "index_head_dim")
            else 0
        ),
        dsa_indexer_gate_params=hidden * _int(cfg, "index_n_heads") if _int(cfg, "index_head_dim") else 0,
        bnb_skipped=bnb_skipped_params(cfg, params, num_layers),
        quant_method=_quant_method(cfg.get("quantization_config")),
        group_quant=_group_quant(cfg.get("quantization_config")),
        attention_params=params.get(ATTENTION, 0),
        mixer_params=params.get(MIXER, 0),
    )


def _group_quant(config: JsonValue) -> tuple[tuple[str, str], ...]:
    """ModelDims.group_quant: a MIXED_PRECISION checkpoint's groups, 'none' for those left unquantised."""
    fields = modelopt_fields(config) if isinstance(config, Mapping) else {}
    if str(fields.get("quant_algo") or "").upper() != "MIXED_PRECISION":
        return ()
    groups: dict[str, str] = dict.fromkeys((ATTENTION, MIXER, DENSE_MLP, SHARED, EXPERTS), "none")
    groups.update(mixed_precision_groups(fields))
    return tuple(sorted(groups.items()))
