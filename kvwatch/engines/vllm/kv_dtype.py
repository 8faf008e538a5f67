"""The cache dtype vLLM stores for ``--kv-cache-dtype auto``: from 0.14 a ModelOpt checkpoint's own KV
quantisation, else the model dtype (releases.CHECKPOINT_KV_DTYPE).

vLLM resolves 'auto' before it builds the cache config (0.30.0 engine/arg_utils.py:2090,
resolve_kv_cache_dtype_string, utils/torch_utils.py:507-525): a quantization_config whose quant_method
starts with 'modelopt' (config.json's, or the hf_quant_config.json vLLM merges into it,
transformers_utils/config.py:829-842) names the KV format in kv_cache_scheme or kv_cache_quant_algo,
of its 'quantization' object or its own (get_kv_cache_quant_algo_string, :452-505). A scheme of
8-bit static floats is fp8; a name maps through MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP (:67-70); an
unknown one falls back to 'auto'. The resolved dtype is what the engine's config line prints.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.model import ModelGeometry
from kvwatch.core.errors import UnmodelledError
from kvwatch.core.jsontypes import JsonValue
from kvwatch.engines.vllm import releases

# 0.30.0 utils/torch_utils.py:67-70 (0.14.0-0.19.0: fp8 only, releases.CHECKPOINT_NVFP4_KV).
_MODELOPT_KV = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}
_KEYS = ("kv_cache_scheme", "kv_cache_quant_algo")


def _algo(quant: Mapping[str, JsonValue]) -> str | None:
    """The KV format the config names (torch_utils.py:463-505), lower case; None when it names none."""
    inner = quant.get("quantization")
    scopes = [inner, quant] if isinstance(inner, Mapping) else [quant]
    found: JsonValue = None
    for key in _KEYS:  # kv_cache_scheme before kv_cache_quant_algo, the inner object first
        found = next((v for s in scopes if (v := s.get(key))), None)
        if found:
            break
    if isinstance(found, Mapping):
        if found.get("dynamic") is False and found.get("num_bits") == 8 and found.get("type") == "float":
            return "fp8"
        if found.get("num_bits") == 4 and found.get("type") == "float":
            return "nvfp4"
        return "auto"
    return str(found).lower() if isinstance(found, str) and found else None


def resolve(model: ModelGeometry, d: Deployment) -> tuple[str, str | None]:
    """(cache dtype vLLM stores, a note when the checkpoint chose it). A format kvwatch cannot size
    (nvfp4 KV) is refused by name rather than sized as the model dtype."""
    quant = model.quantization
    if d.kv_cache_dtype != "auto" or quant is None or not releases.CHECKPOINT_KV_DTYPE.at(d.engine_version):
        return d.kv_cache_dtype, None
    if not str(quant.get("quant_method") or "").lower().startswith("modelopt"):
        return d.kv_cache_dtype, None
    algo = _algo(quant)
    resolved = _MODELOPT_KV.get(algo) if algo else None
    if resolved is None:
        return d.kv_cache_dtype, None
    if resolved == "nvfp4" and not releases.CHECKPOINT_NVFP4_KV.at(d.engine_version):
        return d.kv_cache_dtype, None
    if resolved == "nvfp4":
        raise UnmodelledError("the checkpoint quantises its KV cache to nvfp4, which kvwatch does not size")
    return resolved, (
        f"kv cache dtype {resolved}: --kv-cache-dtype auto takes the checkpoint's ModelOpt KV quantisation "
        f"({algo}; vLLM {d.engine_version or 'newest'})"
    )
