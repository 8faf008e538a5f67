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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from kvwatch.errors import ModelConfigError, UnsupportedModelError

LayerKind = Literal["full", "sliding", "chunked", "mla", "linear", "mamba", "none"]

# Layers whose cache grows with every token of context.
GROWING_KINDS: frozenset[str] = frozenset({"full", "mla"})
# Layers that keep a per-token cache (growing or windowed) the engines page in blocks.
PAGED_KINDS: frozenset[str] = frozenset({"full", "mla", "sliding", "chunked"})

# transformers' defaults for Gemma-family configs that omit them (Gemma3TextConfig).
_GEMMA3_SLIDING_WINDOW_PATTERN = 6
_GEMMA3_SLIDING_WINDOW = 4096
_GEMMA2_SLIDING_WINDOW = 4096

# Far above any real model; guards against a corrupt file asking for billions of layer records.
_MAX_LAYERS = 100_000

# DeepSeek sparse-attention indexer key: fp8 values plus one fp32 scale per 128 (both engines).
_DSA_QUANT_BLOCK = 128

_DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bf16": 2,
}


@dataclass(frozen=True)
class LayerSpec:
    """The KV state of one decoder layer, before tensor parallelism.

    ``num_kv_heads`` is the model's total (MLA: 1, the latent is not per head); ``head_size_k`` and
    ``head_size_v`` are the stored widths (MLA: the latent width and 0, as vLLM's MLAAttentionSpec
    and SGLang's MLA pool do). ``extra_bytes_per_token`` is per-token state stored outside K/V in
    bytes (the DeepSeek sparse-attention indexer key).
    """

    kind: LayerKind
    num_kv_heads: int = 0
    head_size_k: int = 0
    head_size_v: int = 0
    window: int | None = None
    extra_bytes_per_token: int = 0

    @property
    def is_paged(self) -> bool:
        return self.kind in PAGED_KINDS

    @property
    def grows(self) -> bool:
        return self.kind in GROWING_KINDS

    def heads_per_rank(self, tp: int) -> int:
        """KV heads one tensor-parallel rank stores: max(1, h_kv // tp); MLA latents are not split."""
        if self.kind == "mla":
            return 1
        return max(1, self.num_kv_heads // tp)

    def bytes_per_token(self, tp: int, elem_bytes: float) -> int:
        """Cache bytes this layer stores per token on one rank (0 for fixed-state layers)."""
        if not self.is_paged:
            return 0
        return (
            int(self.heads_per_rank(tp) * (self.head_size_k + self.head_size_v) * elem_bytes)
            + self.extra_bytes_per_token
        )


@dataclass(frozen=True)
class ModelGeometry:
    """What the capacity model needs to know about a checkpoint."""

    name: str
    architecture: str
    model_type: str
    dtype: str
    dtype_bytes: int
    layers: tuple[LayerSpec, ...]
    hidden_size: int
    num_attention_heads: int
    vocab_size: int | None
    max_position_embeddings: int | None
    params: Mapping[str, int]
    quantization: Mapping[str, Any] | None
    safetensors_total_size: int | None = None
    # rope_scaling that extends the context beyond max_position_embeddings (yarn, dynamic, linear).
    rope_scaled: bool = False
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def is_mla(self) -> bool:
        return any(layer.kind == "mla" for layer in self.layers)

    @property
    def param_count(self) -> int:
        """Parameters recomputed from the shapes (decoder, embeddings, head; no MTP/vision towers)."""
        return sum(self.params.values())

    def count(self, *kinds: str) -> int:
        return sum(1 for layer in self.layers if layer.kind in kinds)

    def bytes_per_token(self, tp: int = 1, elem_bytes: float | None = None, growing_only: bool = True) -> int:
        """Per-rank bytes one token of context costs across the layers whose cache grows with it."""
        eb = float(self.dtype_bytes) if elem_bytes is None else elem_bytes
        return sum(layer.bytes_per_token(tp, eb) for layer in self.layers if layer.grows or not growing_only)


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


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON object; a malformed file is a one-line ModelConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        # Python's json accepts Infinity/NaN, which real configs contain (Nemotron-H time_step_limit).
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
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


# transformers' class defaults for fields minimal hub files omit (Gemma3TextConfig).
_LIBRARY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "sliding_window": _GEMMA3_SLIDING_WINDOW,
        "sliding_window_pattern": _GEMMA3_SLIDING_WINDOW_PATTERN,
    },
}


def text_config(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's config: ``text_config`` of a multimodal wrapper, else the file itself.

    Keys only the wrapper carries (dtype, quantization_config, architectures) are inherited, and
    fields a minimal file leaves to the library's defaults are filled in.
    """
    inner = raw.get("text_config")
    if isinstance(inner, dict):
        merged = dict(inner)
        if raw.get("model_type") == "gemma3" and "model_type" not in merged:
            merged["model_type"] = "gemma3_text"
        for key in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings"):
            if key not in merged and key in raw:
                merged[key] = raw[key]
        merged["_wrapper_architectures"] = raw.get("architectures")
    else:
        merged = dict(raw)
    for key, value in _LIBRARY_DEFAULTS.get(str(merged.get("model_type")), {}).items():
        merged.setdefault(key, value)
    return merged


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
    name = str(value).removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise UnsupportedModelError(
            f"config.json torch_dtype {value!r} is not one kvwatch knows (bfloat16, float16, float32)"
        )
    # Engines serve float32 checkpoints in half precision by default (vLLM/SGLang dtype='auto').
    if name in ("float32", "float"):
        return "bfloat16", 2
    return name, _DTYPE_BYTES[name]


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
    v_dim = _opt_int(cfg, "v_head_dim") or head_dim
    return kv_heads, head_dim, v_dim


def _layer_kinds(cfg: Mapping[str, Any], n_layers: int) -> list[str]:
    """The attention kind of every layer, from whichever convention the config uses."""
    model_type = str(cfg.get("model_type") or "")
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != n_layers:
            raise ModelConfigError(
                f"config.json layer_types has {len(types)} entries but num_hidden_layers is {n_layers}"
            )
        mapping = {
            "full_attention": "full",
            "attention": "full",
            "global": "full",
            "sliding_attention": "sliding",
            "local": "sliding",
            "chunked_attention": "chunked",
            "linear_attention": "linear",
            "mamba": "mamba",
        }
        kinds = []
        for t in types:
            if t not in mapping:
                raise UnsupportedModelError(
                    f"config.json layer_types has {t!r}, a layer kind kvwatch cannot size"
                )
            kinds.append(mapping[t])
        return kinds
    interval = cfg.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0 and model_type.startswith("qwen3"):
        # Qwen3-Next: every interval-th layer is full attention, the rest Gated DeltaNet.
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(n_layers)]
    if model_type.startswith("gemma3"):
        pattern = cfg.get("sliding_window_pattern") or _GEMMA3_SLIDING_WINDOW_PATTERN
        return ["full" if (i + 1) % int(pattern) == 0 else "sliding" for i in range(n_layers)]
    if model_type.startswith("gemma2"):
        return ["sliding" if i % 2 == 0 else "full" for i in range(n_layers)]
    window = cfg.get("sliding_window")
    if window is not None and cfg.get("use_sliding_window") is not False:
        max_window_layers = cfg.get("max_window_layers")
        if model_type.startswith("qwen2") and isinstance(max_window_layers, int):
            # Qwen2-style: layers from max_window_layers on use the window.
            return ["sliding" if i >= max_window_layers else "full" for i in range(n_layers)]
        # Mistral-style: one global window on every layer.
        return ["sliding"] * n_layers
    return ["full"] * n_layers


def _window(cfg: Mapping[str, Any]) -> int:
    model_type = str(cfg.get("model_type") or "")
    window = cfg.get("sliding_window")
    if window is None:
        if model_type.startswith("gemma3"):
            return _GEMMA3_SLIDING_WINDOW
        if model_type.startswith("gemma2"):
            return _GEMMA2_SLIDING_WINDOW
        raise ModelConfigError("config.json has sliding-window layers but no 'sliding_window'")
    if not isinstance(window, int) or window <= 0:
        raise ModelConfigError(
            f"config.json field 'sliding_window' must be a positive integer, got {window!r}"
        )
    return window


def _layers(cfg: Mapping[str, Any]) -> tuple[list[LayerSpec], list[str]]:
    """One LayerSpec per decoder layer, plus notes on conventions applied."""
    notes: list[str] = []
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and len(pattern) > _MAX_LAYERS:
        raise ModelConfigError("config.json hybrid_override_pattern is not a plausible layer pattern")
    if isinstance(pattern, str) and pattern:
        # Nemotron-H: M = Mamba2, * = attention, - = MLP, E = MoE.
        kv_heads, hk, hv = _attention_dims(cfg)
        layers = []
        for ch in pattern:
            if ch == "*":
                layers.append(LayerSpec("full", kv_heads, hk, hv))
            elif ch == "M":
                layers.append(LayerSpec("mamba"))
            elif ch in "-E":
                layers.append(LayerSpec("none"))
            else:
                raise UnsupportedModelError(
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

    kinds = _layer_kinds(cfg, n_layers)
    kv_heads, hk, hv = _attention_dims(cfg)
    window = _window(cfg) if any(k == "sliding" for k in kinds) else None
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
            layers.append(LayerSpec("linear" if kind == "linear" else "mamba"))
    if g_heads or g_dim:
        notes.append("full-attention layers use num_global_key_value_heads / global_head_dim")
    if cfg.get("attention_k_eq_v"):
        notes.append("attention_k_eq_v: assumed the engines still store V beside K")
    return layers, notes


def geometry_from_config(
    raw: Mapping[str, Any],
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
        ZeroDivisionError,
        OverflowError,
    ) as exc:
        # A field of the wrong shape somewhere kvwatch did not check explicitly: still one line.
        raise ModelConfigError(
            f"config.json has a field kvwatch cannot read ({type(exc).__name__}: {exc})"
        ) from None


def _geometry(
    raw: Mapping[str, Any], name: str, source: str, safetensors_total_size: int | None
) -> ModelGeometry:
    from kvwatch.capacity.weights import count_params  # weights depends on geometry's helpers

    cfg = text_config(raw)
    layers, notes = _layers(cfg)
    if not layers:
        raise ModelConfigError("config.json describes no decoder layers")
    dtype, dtype_bytes = _dtype(cfg)
    archs = cfg.get("_wrapper_architectures") or cfg.get("architectures") or raw.get("architectures") or []
    architecture = (
        str(archs[0]) if isinstance(archs, list) and archs else str(cfg.get("model_type") or "unknown")
    )
    heads = _require_int(cfg, "num_attention_heads")
    hidden = _require_int(cfg, "hidden_size")
    quant = cfg.get("quantization_config") if isinstance(cfg.get("quantization_config"), dict) else None
    params = count_params(cfg, layers)
    return ModelGeometry(
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
    )


def _rope_extends_context(cfg: Mapping[str, Any]) -> bool:
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, dict):
        return False
    kind = str(rope.get("rope_type") or rope.get("type") or "")
    return kind in ("yarn", "dynamic", "linear") and isinstance(rope.get("factor"), int | float)


def ceil_div(a: int, b: int) -> int:
    """Integer ceiling division (vLLM's cdiv)."""
    return -(-a // b)


def stage_layers(layers: Sequence[LayerSpec], pp: int) -> list[list[LayerSpec]]:
    """Split layers into pp contiguous pipeline stages, the remainder going to the earlier stages."""
    base, extra = divmod(len(layers), pp)
    out, start = [], 0
    for i in range(pp):
        size = base + (1 if i < extra else 0)
        out.append(list(layers[start : start + size]))
        start += size
    return out
