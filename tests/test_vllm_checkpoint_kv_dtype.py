"""vLLM's --kv-cache-dtype auto takes a ModelOpt checkpoint's own KV quantisation from 0.14
(engines/vllm/kv_dtype.py; 0.30.0 utils/torch_utils.py:452-525, engine/arg_utils.py:2090)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvwatch.analysis.predict import pool_from_available, predict
from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import geometry_from_config
from kvwatch.capacity.model import ModelGeometry
from kvwatch.capacity.weights import weight_bytes
from kvwatch.core.errors import UnmodelledError
from kvwatch.core.units import GiB
from kvwatch.engines.vllm import kv_dtype

CONFIGS = Path(__file__).parent / "model_configs"
H100 = gpus.lookup("h100")


def _llama(quant: dict[str, Any] | None) -> ModelGeometry:
    raw = json.loads((CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json").read_text(encoding="utf-8"))
    if quant is not None:
        raw["quantization_config"] = quant
    return geometry_from_config(raw, name="llama")


def _d(version: str | None = "0.30.0", kv: str = "auto") -> Deployment:
    return Deployment(
        engine="vllm",
        engine_version=version,
        gpu_name=H100.name,
        gpu_memory_bytes=H100.total_bytes,
        max_model_len=8192,
        kv_cache_dtype=kv,
    )


# The two shapes a ModelOpt checkpoint writes: config.json's (ModelOpt >= 0.31; Gemma-4-26B-A4B-NVFP4,
# Qwen3.6-27B-NVFP4) and hf_quant_config.json's, which vLLM merges in (its 'quantization' object).
SCHEME = {
    "quant_method": "modelopt",
    "quant_algo": "NVFP4",
    "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
}
LEGACY = {"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"}}


@pytest.mark.parametrize("quant", [SCHEME, LEGACY], ids=["kv_cache_scheme", "kv_cache_quant_algo"])
def test_auto_takes_the_checkpoint_fp8(quant: dict[str, Any]) -> None:
    dtype, note = kv_dtype.resolve(_llama(quant), _d())
    assert dtype == "fp8_e4m3"
    assert note is not None and "checkpoint" in note


def test_what_stays_auto() -> None:
    # Before 0.14 there is no resolution: auto is the model dtype.
    assert kv_dtype.resolve(_llama(LEGACY), _d("0.13.0")) == ("auto", None)
    # A dtype the user typed wins; a checkpoint that names no KV format, or is not ModelOpt, keeps auto.
    assert kv_dtype.resolve(_llama(LEGACY), _d(kv="bfloat16")) == ("bfloat16", None)
    assert kv_dtype.resolve(_llama({"quant_method": "modelopt", "quant_algo": "NVFP4"}), _d()) == (
        "auto",
        None,
    )
    assert kv_dtype.resolve(_llama({"quant_method": "fp8", "kv_cache_quant_algo": "FP8"}), _d()) == (
        "auto",
        None,
    )
    # An unknown name falls back to auto (torch_utils.py:489-503), as vLLM does with a warning.
    unknown = {"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "INT8"}
    assert kv_dtype.resolve(_llama(unknown), _d()) == ("auto", None)


def test_nvfp4_kv_is_refused_by_name() -> None:
    quant = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "kv_cache_scheme": {"num_bits": 4, "type": "float"},
    }
    with pytest.raises(UnmodelledError, match="nvfp4"):
        predict(_llama(quant), _d())
    # Before 0.20 vLLM knows no nvfp4 KV: the 4-bit scheme falls back to auto, the model dtype.
    assert kv_dtype.resolve(_llama(quant), _d("0.19.0")) == ("auto", None)


def test_the_pool_holds_twice_the_tokens_and_says_why() -> None:
    """8B Llama: 131,072 B a token in bf16, 65,536 in fp8 -- the same bytes, twice the tokens."""
    plain = predict(_llama({"quant_method": "modelopt", "quant_algo": "NVFP4"}), _d())
    fp8 = predict(_llama(LEGACY), _d())
    assert plain.kv_cache_dtype == "auto" and fp8.kv_cache_dtype == "fp8_e4m3"
    assert fp8.bytes_per_token * 2 == plain.bytes_per_token == 131072
    assert abs(fp8.available_kv_bytes - plain.available_kv_bytes) < 0.01 * GiB
    assert fp8.kv_pool_tokens > 1.99 * plain.kv_pool_tokens
    assert fp8.inputs["kv_cache_dtype"] == "derived" and plain.inputs["kv_cache_dtype"] == "engine_default"
    assert any("checkpoint's ModelOpt KV quantisation" in a for a in fp8.assumptions)
    # The tokens of an observed budget (explain, the sidecar) are counted in the same dtype.
    d = replace(_d(), max_model_len=8192)
    assert (
        pool_from_available(_llama(LEGACY), d, 10 * GiB)[0]
        == 2 * pool_from_available(_llama(None), d, 10 * GiB)[0]
    )


@pytest.mark.parametrize(
    "flat",
    [
        {"quant_method": "modelopt", "quant_algo": "FP8"},
        {
            "quant_method": "modelopt",
            "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {"model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"}},
        },
    ],
    ids=["fp8", "mixed"],
)
def test_the_nested_form_is_weighed_like_the_flat_one(flat: dict[str, Any]) -> None:
    """hf_quant_config.json's 'quantization' object: every reader (scheme, per-group schemes, bytes)
    sees the same settings as config.json's flat form (dims.modelopt_fields)."""
    body = {k: v for k, v in flat.items() if k != "quant_method"}
    nested = _llama({"quant_method": "modelopt", "quantization": body})
    plain = _llama(flat)
    assert nested.dims is not None and plain.dims is not None
    assert nested.dims.checkpoint_quant == plain.dims.checkpoint_quant
    assert nested.dims.group_quant == plain.dims.group_quant
    assert weight_bytes(nested) == weight_bytes(plain)
