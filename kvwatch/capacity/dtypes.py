"""Byte widths: the one table of every dtype name kvwatch reads, and where each name may appear.

A name can be a checkpoint's ``torch_dtype`` (config.json), a KV-cache dtype (``--kv-cache-dtype``,
both engines' spellings) or a weights what-if (``--weights-dtype``, the seed chapters' way of sizing
weights: parameter count x bytes per weight, scales and unquantised embeddings ignored). geometry.py,
weights.py and deployment.py read the views below; none keeps a width of its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    """One dtype name: bytes per element and the inputs it is accepted in."""

    bytes: float
    checkpoint: bool = False  # a torch_dtype a config.json may carry
    kv_cache: bool = False  # a KV-cache dtype both engines accept
    weights: bool = False  # a --weights-dtype what-if
    # What the engines serve a checkpoint of this dtype as (vLLM/SGLang dtype='auto' halves float32).
    served_as: str | None = None


DTYPES: dict[str, DType] = {
    "float32": DType(4, checkpoint=True, served_as="bfloat16"),
    "float": DType(4, checkpoint=True, served_as="bfloat16"),
    "bfloat16": DType(2, checkpoint=True, kv_cache=True, weights=True),
    "bf16": DType(2, checkpoint=True, kv_cache=True, weights=True),
    "float16": DType(2, checkpoint=True, kv_cache=True, weights=True),
    "fp16": DType(2, checkpoint=True, kv_cache=True, weights=True),
    "half": DType(2, checkpoint=True, kv_cache=True),
    "fp8": DType(1, kv_cache=True, weights=True),
    "fp8_e4m3": DType(1, kv_cache=True),
    "fp8_e5m2": DType(1, kv_cache=True),
    "fp8_inc": DType(1, kv_cache=True),
    "fp8_ds_mla": DType(1, kv_cache=True),
    "float8_e4m3fn": DType(1, kv_cache=True),
    "float8_e5m2": DType(1, kv_cache=True),
    "int8": DType(1, weights=True),
    "int4": DType(0.5, weights=True),
    "awq": DType(0.5, weights=True),
    "gptq": DType(0.5, weights=True),
    "mxfp4": DType(0.5, weights=True),
    "nvfp4": DType(0.5, weights=True),
}

# Bytes per element of a checkpoint's torch_dtype (before the engines' float32 -> half rule).
CHECKPOINT_DTYPE_BYTES: dict[str, int] = {n: int(d.bytes) for n, d in DTYPES.items() if d.checkpoint}
# KV cache dtype names both engines accept, and their bytes per element ('auto' = model dtype).
KV_DTYPE_BYTES: dict[str, int] = {n: int(d.bytes) for n, d in DTYPES.items() if d.kv_cache}
# Bytes per weight for a ``--weights-dtype`` what-if: every parameter at this width.
WEIGHT_DTYPES: dict[str, float] = {n: d.bytes for n, d in DTYPES.items() if d.weights}


def served_dtype(name: str) -> tuple[str, int] | None:
    """(dtype the engines serve, bytes per element) for a checkpoint torch_dtype; None if unknown."""
    entry = DTYPES.get(name)
    if entry is None or not entry.checkpoint:
        return None
    if entry.served_as is not None:
        return entry.served_as, int(DTYPES[entry.served_as].bytes)
    return name, int(entry.bytes)
