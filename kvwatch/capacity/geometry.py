"""Model geometry: what one token costs in each layer's KV cache, read from a Hugging Face config.json.

This is the first stage of the capacity model. It turns the checkpoint's config (a file, a model
directory or a hub-cache directory) into one ``LayerSpec`` per decoder layer, with the shapes the
engines actually allocate -- not the logical attention shapes (MLA stores one latent, not per-head K
and V; linear-attention and Mamba layers keep a fixed state; no-op layers keep nothing). Anything
kvwatch cannot size raises ModelConfigError naming the missing field: a silent guess here would
mis-state every gap and headroom figure downstream.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvwatch.capacity.architectures import (
    HYBRID_PATTERN_KINDS,
    layer_kinds,
    nemotron_pattern,
    nested_defaults,
    normalise,
    sliding_window,
    unread_layout,
    wrapper_text_model_type,
)
from kvwatch.capacity.dims import dims_from_config
from kvwatch.capacity.dtypes import served_dtype
from kvwatch.capacity.model import LayerKind, LayerSpec, ModelGeometry
from kvwatch.capacity.states import state_layer
from kvwatch.capacity.towers import prefix_lm_image_tokens, tower_params, vision_grid, vision_shape
from kvwatch.capacity.weights import count_params
from kvwatch.core.errors import ModelConfigError, UnmodelledError, UnsupportedModelError
from kvwatch.core.jsontypes import JsonObject, JsonValue

# Far above any real model; guards against a corrupt file asking for billions of layer records.
_MAX_LAYERS = 100_000
# config.json and model.safetensors.index.json are kilobytes to a few MiB.
MAX_JSON_BYTES = 64 * 2**20

# Plausibility bounds of config.json fields, far above any real model: a value past one is a corrupt
# or hostile file, refused with the bound named (the arithmetic downstream stays finite and exact).
_WIDTH = 1 << 20  # hidden and intermediate widths: 1,048,576
_HEADS = 1 << 14  # attention heads: 16,384
_HEAD_DIM = 1 << 16  # per-head and latent widths: 65,536
_POSITIONS = 1 << 30  # context lengths and windows: 1,073,741,824
_EXPERTS = 1 << 16
_BOUNDS: dict[str, int] = {
    **dict.fromkeys(
        ("hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"),
        _WIDTH,
    ),
    **dict.fromkeys(
        ("num_attention_heads", "num_key_value_heads", "num_kv_heads", "num_global_key_value_heads"), _HEADS
    ),
    **dict.fromkeys(
        (
            "head_dim",
            "v_head_dim",
            "attention_head_dim",
            "global_head_dim",
            "qk_rope_head_dim",
            "qk_nope_head_dim",
            "kv_lora_rank",
            "q_lora_rank",
            "index_head_dim",
        ),
        _HEAD_DIM,
    ),
    "vocab_size": 1 << 24,
    **dict.fromkeys(
        (
            "max_position_embeddings",
            "sliding_window",
            "attention_chunk_size",
            "original_max_position_embeddings",
        ),
        _POSITIONS,
    ),
    **dict.fromkeys(
        ("num_experts", "num_local_experts", "n_routed_experts", "n_shared_experts", "num_experts_per_tok"),
        _EXPERTS,
    ),
    "num_hidden_layers": _MAX_LAYERS,
}
# rope_scaling / rope_parameters ``factor``: real ones are 2-64.
_MAX_ROPE_FACTOR = 1 << 16

# DeepSeek sparse-attention indexer key: fp8 values plus one fp32 scale per 128 (both engines).
_DSA_QUANT_BLOCK = 128


def find_config(path: str | Path) -> tuple[Path, Path | None]:
    """Resolve a config.json from a file, a model directory or a hub-cache ``models--ORG--NAME`` dir.

    Returns the config path and the directory that may hold model.safetensors.index.json.
    """
    p = Path(path).expanduser()
    if p.is_file():
        return p, p.parent if p.name == "config.json" else None
    if not p.exists():
        raise ModelConfigError(f"model config not found: {p}")
    if (p / "config.json").is_file():
        return p / "config.json", p
    snapshots = p / "snapshots"
    if snapshots.is_dir():
        # Newest revision first (refs/main names it when present).
        ref = p / "refs" / "main"
        candidates: list[Path] = []
        if ref.is_file():
            candidates.append(snapshots / ref.read_text().strip())
        candidates += sorted(snapshots.iterdir(), key=lambda d: d.stat().st_mtime, reverse=True)
        for snap in candidates:
            if (snap / "config.json").is_file():
                return snap / "config.json", snap
    raise ModelConfigError(f"no config.json in {p} (expected a file, a model dir or a hub-cache dir)")


def read_json(path: Path) -> JsonObject:
    """Parse a JSON object; a malformed file is a one-line ModelConfigError."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise ModelConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_JSON_BYTES:
        raise ModelConfigError(f"{path} is over {MAX_JSON_BYTES // 2**20} MiB, not a model config")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"{path} is not UTF-8 text (byte {exc.start}): not a JSON config") from None
    try:
        # Python's json accepts Infinity/NaN, which real configs contain (Nemotron-H time_step_limit).
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise ModelConfigError(f"{path} nests too deeply to be a model config") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{path} is not a JSON object")
    return data


def load_model(path: str | Path) -> ModelGeometry:
    """Read a config.json (file, model dir or hub-cache dir) into a ModelGeometry."""
    config_path, model_dir = find_config(path)
    raw = read_json(config_path)
    total_size = None
    note = None
    index_path = model_dir / "model.safetensors.index.json" if model_dir is not None else None
    if index_path is not None and index_path.is_file():
        # The index only refines the weights; a broken one falls back to the estimate.
        try:
            index = read_json(index_path)
        except ModelConfigError as exc:
            index, note = {}, f"ignored {index_path.name}: {exc}"
        meta = index.get("metadata")
        size = meta.get("total_size") if isinstance(meta, dict) else None
        if isinstance(size, int | float) and not isinstance(size, bool) and size > 0:
            total_size = int(size)
        elif note is None:
            note = f"ignored {index_path.name}: no positive metadata.total_size"
    geometry = geometry_from_config(
        raw, name=_model_name(config_path, raw), source=str(config_path), safetensors_total_size=total_size
    )
    return replace(geometry, notes=(*geometry.notes, note)) if note else geometry


def _model_name(config_path: Path, raw: Mapping[str, Any]) -> str:
    parts = config_path.parts
    for part in parts:
        if part.startswith("models--"):
            return part[len("models--") :].replace("--", "/")
    if config_path.name == "config.json":
        return config_path.parent.name
    # Files saved as ORG--NAME.json (the hub's cache naming) name the repository.
    return config_path.stem.replace("--", "/", 1)


def text_config(raw: Mapping[str, JsonValue]) -> JsonObject:
    """The language model's config: ``text_config`` of a multimodal wrapper, else the file itself.

    Keys only the wrapper carries (dtype, quantization_config, architectures) are inherited, the
    fields transformers leaves out of a nested text_config (its class defaults) are filled in, and
    so are the fields a minimal file leaves to the library's defaults.
    """
    inner = raw.get("text_config")
    if isinstance(inner, dict):
        merged = dict(inner)
        implied = wrapper_text_model_type(str(raw.get("model_type") or ""))
        if implied is not None and "model_type" not in merged:
            merged["model_type"] = implied
        for key in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings"):
            if key not in merged and key in raw:
                merged[key] = raw[key]
        for key, value in nested_defaults(str(merged.get("model_type") or "")).items():
            merged.setdefault(key, value)
        merged["_wrapper_architectures"] = raw.get("architectures")
    else:
        merged = dict(raw)
    return normalise(merged)


def _require_int(cfg: Mapping[str, Any], key: str, *, positive: bool = True) -> int:
    value = cfg.get(key)
    if value is None:
        raise ModelConfigError(f"config.json has no {key!r}; kvwatch cannot size this model")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ModelConfigError(f"config.json field {key!r} must be an integer, got {value!r}")
    if positive and value <= 0:
        raise ModelConfigError(f"config.json field {key!r} must be positive, got {value!r}")
    return int(value)


def _opt_int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value <= 0:
        raise ModelConfigError(f"config.json field {key!r} must be a positive integer, got {value!r}")
    return int(value)


def _dtype(cfg: Mapping[str, Any]) -> tuple[str, int]:
    value = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    # Engines serve float32 checkpoints in half precision by default (vLLM/SGLang dtype='auto').
    served = served_dtype(str(value).removeprefix("torch."))
    if served is None:
        raise UnsupportedModelError(
            f"config.json torch_dtype {value!r} is not one kvwatch knows (bfloat16, float16, float32)"
        )
    return served


def _attention_dims(cfg: Mapping[str, Any]) -> tuple[int, int, int]:
    """(total KV heads, K head size, V head size) of a standard attention layer."""
    heads = _require_int(cfg, "num_attention_heads")
    head_dim = _opt_int(cfg, "head_dim") or _opt_int(cfg, "attention_head_dim")
    if head_dim is None:
        hidden = _require_int(cfg, "hidden_size")
        if hidden % heads:
            raise ModelConfigError(
                f"config.json has no 'head_dim' and hidden_size {hidden} is not divisible by "
                f"num_attention_heads {heads}"
            )
        head_dim = hidden // heads
    if cfg.get("multi_query") is True:
        kv_heads = 1
    else:
        kv_heads = _opt_int(cfg, "num_key_value_heads") or _opt_int(cfg, "num_kv_heads") or heads
    # Grouped-query attention shares each KV head among a whole number of query heads.
    if kv_heads > heads:
        raise ModelConfigError(
            f"config.json has {kv_heads} KV heads for {heads} attention heads (at most one per attention head)"
        )
    if heads % kv_heads:
        raise ModelConfigError(
            f"config.json num_attention_heads {heads} is not a multiple of its {kv_heads} KV heads"
        )
    v_dim = _opt_int(cfg, "v_head_dim") or head_dim
    return kv_heads, head_dim, v_dim


def _layers(cfg: Mapping[str, Any]) -> tuple[list[LayerSpec], list[str]]:
    """One LayerSpec per decoder layer, plus notes on conventions applied."""
    notes: list[str] = []
    pattern = nemotron_pattern(cfg)
    if isinstance(pattern, str) and len(pattern) > _MAX_LAYERS:
        raise ModelConfigError("config.json hybrid_override_pattern is not a plausible layer pattern")
    if isinstance(pattern, str) and pattern:
        # Nemotron-H: M = Mamba2, * = attention, - = MLP, E = MoE.
        kv_heads, hk, hv = _attention_dims(cfg)
        layers = []
        for ch in pattern:
            kind = HYBRID_PATTERN_KINDS.get(ch)
            if kind == "full":
                layers.append(LayerSpec("full", kv_heads, hk, hv))
            elif kind == "mamba":
                layers.append(state_layer(cfg, "mamba"))
            elif kind == "none":
                layers.append(LayerSpec("none"))
            else:
                raise UnmodelledError(
                    f"config.json hybrid_override_pattern has {ch!r}, a layer kvwatch cannot size"
                )
        notes.append("hybrid_override_pattern: only '*' layers hold a KV cache; 'M' layers keep Mamba state")
        return layers, notes

    n_layers = _require_int(cfg, "num_hidden_layers")
    if n_layers > _MAX_LAYERS:
        raise ModelConfigError(f"config.json num_hidden_layers {n_layers} is not a plausible layer count")

    block_configs = cfg.get("block_configs")
    if isinstance(block_configs, list) and block_configs:
        # DeciLM / Nemotron-NAS: heterogeneous layers, some with no attention at all.
        if len(block_configs) != n_layers:
            raise ModelConfigError(
                f"config.json block_configs has {len(block_configs)} entries but num_hidden_layers is {n_layers}"
            )
        heads = _require_int(cfg, "num_attention_heads")
        head_dim = _opt_int(cfg, "head_dim") or _require_int(cfg, "hidden_size") // heads
        if head_dim == 0:
            raise ModelConfigError("config.json has no 'head_dim' and hidden_size < num_attention_heads")
        layers = []
        for i, block in enumerate(block_configs):
            attn = block.get("attention", {}) if isinstance(block, dict) else {}
            if attn.get("no_op") or attn.get("replace_with_linear"):
                layers.append(LayerSpec("none"))
                continue
            group = attn.get("n_heads_in_group")
            if not isinstance(group, int) or group <= 0:
                raise ModelConfigError(f"config.json block_configs[{i}].attention has no 'n_heads_in_group'")
            window = attn.get("window_length")
            block_kind: LayerKind = "sliding" if window else "full"
            layers.append(LayerSpec(block_kind, heads // group, head_dim, head_dim, window=window or None))
        notes.append("block_configs: no-op and linear-replaced attention layers hold no KV cache")
        return layers, notes

    if cfg.get("kv_lora_rank") is not None:
        # MLA: one latent of kv_lora_rank + qk_rope_head_dim per token per layer.
        rank = _require_int(cfg, "kv_lora_rank")
        rope = _require_int(cfg, "qk_rope_head_dim")
        extra = 0
        index_dim = cfg.get("index_head_dim")
        if isinstance(index_dim, int) and index_dim > 0:
            extra = index_dim + index_dim // _DSA_QUANT_BLOCK * 4
            notes.append(f"sparse-attention indexer key: {extra} B per token per layer (fp8 + scales)")
        return [
            LayerSpec("mla", 1, rank + rope, 0, extra_bytes_per_token=extra) for _ in range(n_layers)
        ], notes

    kinds = layer_kinds(cfg, n_layers)
    kv_heads, hk, hv = _attention_dims(cfg)
    window = sliding_window(cfg) if any(k == "sliding" for k in kinds) else None
    chunk = cfg.get("attention_chunk_size") if any(k == "chunked" for k in kinds) else None
    # Gemma-4 style: global layers have their own head settings.
    g_heads = _opt_int(cfg, "num_global_key_value_heads")
    g_dim = _opt_int(cfg, "global_head_dim")
    layers = []
    for kind in kinds:
        if kind == "full":
            heads, k, v = (g_heads or kv_heads), (g_dim or hk), (g_dim or hv)
            layers.append(LayerSpec("full", heads, k, v))
        elif kind == "sliding":
            layers.append(LayerSpec("sliding", kv_heads, hk, hv, window=window))
        elif kind == "chunked":
            layers.append(LayerSpec("chunked", kv_heads, hk, hv, window=int(chunk) if chunk else None))
        elif kind in ("linear", "mamba"):
            layers.append(state_layer(cfg, "linear" if kind == "linear" else "mamba"))
    if g_heads or g_dim:
        notes.append("full-attention layers use num_global_key_value_heads / global_head_dim")
    if cfg.get("attention_k_eq_v"):
        notes.append("attention_k_eq_v: assumed the engines still store V beside K")
    return layers, notes


def geometry_from_config(
    raw: Mapping[str, JsonValue],
    *,
    name: str = "model",
    source: str = "",
    safetensors_total_size: int | None = None,
) -> ModelGeometry:
    """Build the geometry from an already-parsed config.json object."""
    try:
        return _geometry(raw, name, source, safetensors_total_size)
    except (
        TypeError,
        ValueError,
        KeyError,
        IndexError,
        AttributeError,
        ArithmeticError,
        RecursionError,
    ) as exc:
        # A field of the wrong shape somewhere kvwatch did not check explicitly: still one line.
        raise ModelConfigError(
            f"config.json has a field kvwatch cannot read ({type(exc).__name__}: {exc})"
        ) from None


def _check_bounds(cfg: Mapping[str, Any]) -> None:
    """Refuse numbers no real model has (ModelConfigError naming the field and its bound)."""
    for key, bound in _BOUNDS.items():
        value = cfg.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and not -bound <= value <= bound:
            raise ModelConfigError(
                f"config.json field {key!r} is {value!r}, over the plausible maximum {bound:,}"
            )
    for key in ("rope_scaling", "rope_parameters"):
        rope = cfg.get(key)
        factor = rope.get("factor") if isinstance(rope, Mapping) else None
        if (
            isinstance(factor, int | float)
            and not isinstance(factor, bool)
            and not factor <= _MAX_ROPE_FACTOR
        ):
            raise ModelConfigError(
                f"config.json {key}.factor is {factor!r}, over the plausible maximum {_MAX_ROPE_FACTOR:,}"
            )


def _geometry(
    raw: Mapping[str, Any], name: str, source: str, safetensors_total_size: int | None
) -> ModelGeometry:
    # config.json is a document of any shape: read dynamically here, checked by the helpers.
    cfg: Mapping[str, Any] = text_config(raw)
    _check_bounds(cfg)
    model_type = str(cfg.get("model_type") or "")
    unread = unread_layout(cfg)
    if unread is not None:
        raise UnmodelledError(
            f"model_type {model_type or '(none)'!r}: config.json field {unread!r} describes layers kvwatch "
            "cannot size (it would be read as plain attention on every layer)"
        )
    layers, notes = _layers(cfg)
    if not layers:
        raise ModelConfigError("config.json describes no decoder layers")
    if not any(layer.is_paged for layer in layers):
        kinds = sorted({layer.kind for layer in layers})
        raise UnmodelledError(
            f"model_type {model_type or '(none)'!r}: no layer keeps a per-token KV cache ({', '.join(kinds)} "
            "only); kvwatch does not size state-only models"
        )
    dtype, dtype_bytes = _dtype(cfg)
    archs = cfg.get("_wrapper_architectures") or cfg.get("architectures") or raw.get("architectures") or []
    architecture = (
        str(archs[0]) if isinstance(archs, list) and archs else str(cfg.get("model_type") or "unknown")
    )
    heads = _require_int(cfg, "num_attention_heads")
    hidden = _require_int(cfg, "hidden_size")
    quant_config = cfg.get("quantization_config")
    quant: JsonObject | None = quant_config if isinstance(quant_config, dict) else None
    params = count_params(cfg, layers)
    dims = dims_from_config(
        cfg,
        params,
        num_layers=len(layers),
        dtype_bytes=dtype_bytes,
        has_vision_tower=isinstance(raw.get("vision_config"), dict),
        vision_params=tower_params(raw, hidden),
        vision_shape=vision_shape(raw),
        grid=vision_grid(raw),
        architecture=architecture,
        prefix_lm_tokens=prefix_lm_image_tokens(raw, cfg),
    )
    return ModelGeometry(
        dims=dims,
        name=name,
        architecture=architecture,
        model_type=str(cfg.get("model_type") or ""),
        dtype=dtype,
        dtype_bytes=dtype_bytes,
        layers=tuple(layers),
        hidden_size=hidden,
        num_attention_heads=heads,
        vocab_size=_opt_int(cfg, "vocab_size"),
        max_position_embeddings=_opt_int(cfg, "max_position_embeddings"),
        params=params,
        quantization=quant,
        safetensors_total_size=safetensors_total_size,
        rope_scaled=_rope_extends_context(cfg),
        source=source,
        notes=tuple(notes),
        mtp_layers=_mtp_layers(cfg),
    )


def _mtp_layers(cfg: Mapping[str, Any]) -> int:
    """The checkpoint's multi-token-prediction layers: mtp_num_hidden_layers (Qwen3.5/3.6),
    num_nextn_predict_layers (DeepSeek-V3, GLM-4.5, Qwen3-Next); 0 when the config names none."""
    for key in ("mtp_num_hidden_layers", "num_nextn_predict_layers"):
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _MAX_MTP_LAYERS:
            return value
    return 0


# No checkpoint ships more than a few MTP layers; a larger count is not a drafter kvwatch sizes.
_MAX_MTP_LAYERS = 16


def _rope_extends_context(cfg: Mapping[str, Any]) -> bool:
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, dict):
        return False
    kind = str(rope.get("rope_type") or rope.get("type") or "")
    return kind in ("yarn", "dynamic", "linear") and isinstance(rope.get("factor"), int | float)
