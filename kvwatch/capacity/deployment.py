"""Deployment: how a model is served (engine, GPU, parallelism, dtypes, memory knobs).

Every field is optional except the engine; ``None`` means "the engine's default, or kvwatch's
documented estimate" and the prediction says which. ``deployment_from_settings`` turns what the
sidecar read from an engine's log (kvwatch.events EngineSettings / MemoryBudget fields) into a
Deployment, so the prediction for a running engine uses every figure the engine printed itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from kvwatch.capacity.geometry import ModelGeometry
from kvwatch.engines.kinds import DEFAULT_ENGINE, ENGINE_NAMES, EngineName
from kvwatch.errors import ConfigError

# KV cache dtype names both engines accept, and their bytes per element ('auto' = model dtype).
KV_DTYPE_BYTES: dict[str, int] = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


@dataclass(frozen=True)
class Deployment:
    """One serving configuration. Sizes are bytes per GPU (rank); None = default or estimate."""

    engine: EngineName = DEFAULT_ENGINE
    engine_version: str | None = None
    gpu_memory_bytes: int | None = None
    gpu_name: str | None = None
    tp: int = 1
    pp: int = 1
    dcp: int = 1
    kv_cache_dtype: str = "auto"
    # vLLM tokens per block / SGLang tokens per page.
    block_size: int | None = None
    page_size: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    mem_fraction_static: float | None = None
    weights_dtype: str | None = None
    weights_bytes: int | None = None
    activation_bytes: int | None = None
    non_torch_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    available_kv_bytes: int | None = None
    # SGLang: free memory right after loading weights ('Load weight end. avail mem='); with the
    # weights it gives the free memory before them, which mem_fraction_static is a fraction of.
    free_after_weights_bytes: int | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    max_num_batched_tokens: int | None = None
    hybrid_kv_cache_manager: bool = True

    def with_(self, **changes: Any) -> Deployment:
        """A copy with some fields changed (None values are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def kv_elem_bytes(model: ModelGeometry, kv_cache_dtype: str) -> int:
    """Bytes per stored KV element for a cache dtype name ('auto' = the model's dtype)."""
    name = kv_cache_dtype.lower().removeprefix("torch.")
    if name == "auto":
        return model.dtype_bytes
    if name not in KV_DTYPE_BYTES:
        raise ConfigError(
            f"unknown kv cache dtype {kv_cache_dtype!r} (use auto, bf16, fp16, fp8, fp8_e4m3, fp8_e5m2)"
        )
    return KV_DTYPE_BYTES[name]


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """'0.11.0rc2+cu130' -> (0, 11, 0); None or unparsable -> None (= newest)."""
    if not version:
        return None
    out: list[int] = []
    for part in version.lstrip("v").split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(out) if out else None


def validate(model: ModelGeometry, d: Deployment) -> None:
    """Refuse what the engine itself would refuse, and sizes that make no sense, as ConfigError."""
    if d.engine not in ENGINE_NAMES:
        raise ConfigError(f"unknown engine {d.engine!r} (use {' or '.join(ENGINE_NAMES)})")
    for name in ("tp", "pp", "dcp"):
        value = getattr(d, name)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    for name in (
        "block_size",
        "page_size",
        "max_model_len",
        "chunked_prefill_size",
        "cuda_graph_max_bs",
        "max_num_batched_tokens",
    ):
        value = getattr(d, name)
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be positive, got {value}")
    # available_kv_bytes may be zero or negative: engines print such budgets (vLLM V0 '-1.05GiB')
    # and then allocate no blocks, which is what the prediction should say.
    for name in ("gpu_memory_bytes", "weights_bytes", "free_after_weights_bytes"):
        value = getattr(d, name)
        if value is not None and value <= 0:
            raise ConfigError(f"{name.replace('_bytes', '')} memory must be positive, got {value} bytes")
    for name in ("activation_bytes", "non_torch_bytes", "cuda_graph_bytes"):
        value = getattr(d, name)
        if value is not None and value < 0:
            raise ConfigError(f"{name.replace('_bytes', '')} memory cannot be negative, got {value} bytes")
    if d.gpu_memory_utilization is not None and not 0 < d.gpu_memory_utilization <= 1:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {d.gpu_memory_utilization}")
    if d.mem_fraction_static is not None and not 0 < d.mem_fraction_static < 1:
        raise ConfigError(f"mem_fraction_static must be in (0, 1), got {d.mem_fraction_static}")
    kv_elem_bytes(model, d.kv_cache_dtype)
    heads = model.num_attention_heads
    if heads % d.tp:
        raise ConfigError(
            f"total number of attention heads ({heads}) must be divisible by tensor parallel size ({d.tp}); "
            f"{d.engine} refuses to start"
        )
    for layer in model.layers:
        if layer.is_paged and layer.kind != "mla":
            h = layer.num_kv_heads
            if (h >= d.tp and h % d.tp) or (h < d.tp and d.tp % h):
                raise ConfigError(
                    f"{h} KV heads cannot be split or replicated evenly over tensor parallel size {d.tp}"
                )
    if d.tp % d.dcp:
        raise ConfigError(
            f"tensor parallel size ({d.tp}) must be divisible by decode context parallel size ({d.dcp})"
        )
    if d.pp > model.num_layers:
        raise ConfigError(f"pipeline parallel size ({d.pp}) exceeds the model's {model.num_layers} layers")


_SETTINGS_MAP: dict[str, str] = {
    "version": "engine_version",
    "tensor_parallel_size": "tp",
    "pipeline_parallel_size": "pp",
    "decode_context_parallel_size": "dcp",
    "kv_cache_dtype": "kv_cache_dtype",
    "block_size": "block_size",
    "page_size": "page_size",
    "max_model_len": "max_model_len",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "mem_fraction_static": "mem_fraction_static",
    "chunked_prefill_size": "chunked_prefill_size",
    "cuda_graph_max_bs": "cuda_graph_max_bs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "quantization": "weights_dtype",
}
_MEMORY_MAP: dict[str, str] = {
    "total_bytes": "gpu_memory_bytes",
    "gpu_memory_utilization": "gpu_memory_utilization",
    "mem_fraction_static": "mem_fraction_static",
    "weights_bytes": "weights_bytes",
    "activation_bytes": "activation_bytes",
    "non_torch_bytes": "non_torch_bytes",
    "cuda_graph_bytes": "cuda_graph_bytes",
    "available_kv_bytes": "available_kv_bytes",
    "avail_after_weights_bytes": "free_after_weights_bytes",
}
_QUANT_TO_WEIGHTS: dict[str, str] = {
    "fp8": "fp8",
    "fbgemm_fp8": "fp8",
    "awq": "int4",
    "awq_marlin": "int4",
    "gptq": "int4",
    "gptq_marlin": "int4",
    "mxfp4": "mxfp4",
    "modelopt_fp4": "nvfp4",
}


def deployment_from_settings(
    engine: str,
    settings: Mapping[str, Any],
    memory: Mapping[str, Any],
    gpu_memory_bytes: int | None = None,
    **overrides: Any,
) -> Deployment:
    """A Deployment from an engine's printed settings and memory budget (kvwatch.state snapshot dicts).

    ``gpu_memory_bytes`` is used when the log did not print the card's total; ``overrides`` are
    Deployment fields that win over both (None values are ignored).
    """
    if engine not in ENGINE_NAMES:
        raise ConfigError(f"unknown engine {engine!r} (use {' or '.join(ENGINE_NAMES)})")
    values: dict[str, Any] = {"engine": engine}
    for key, target in _SETTINGS_MAP.items():
        value = settings.get(key)
        if value is None:
            continue
        if key == "quantization":
            value = _QUANT_TO_WEIGHTS.get(str(value).lower())
            if value is None:
                continue
        values[target] = value
    for key, target in _MEMORY_MAP.items():
        value = memory.get(key)
        if value is not None:
            values[target] = value
    if "gpu_memory_bytes" not in values and gpu_memory_bytes is not None:
        values["gpu_memory_bytes"] = gpu_memory_bytes
    known = {f.name for f in fields(Deployment)}
    for key, value in overrides.items():
        if key not in known:
            raise ConfigError(f"unknown deployment field {key!r}")
        if value is not None:
            values[key] = value
    if isinstance(values.get("kv_cache_dtype"), str):
        values["kv_cache_dtype"] = values["kv_cache_dtype"].removeprefix("torch.")
    return Deployment(**values)
