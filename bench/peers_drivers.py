"""The code bench/peers.py runs inside each peer's own virtual environment (``python -c``).

Each driver reads a JSON list of requests (bench/peers_cases.py ``Case.peer_request``) on stdin and
prints one JSON list of answers on its last stdout line: ``kv_gib`` (available KV per GPU),
``tokens`` (the pool per GPU), ``bytes_per_token`` (per GPU) and ``error`` where the tool refused.
Each calls the peer's own public function for the figure, with nothing reaching the Hub.
"""

from __future__ import annotations

_PLANNER = r'''
import json, sys, types
import planner.capacity_planner as cp
from planner.data._resolver import data_path

def ns(d):
    """config.json as the attribute object the planner reads (transformers' AutoConfig fills
    num_key_value_heads from num_attention_heads when absent; so does this)."""
    out = types.SimpleNamespace()
    for k, v in d.items():
        setattr(out, k, ns(v) if isinstance(v, dict) and k != "quantization_config" else v)
    if hasattr(out, "num_attention_heads") and getattr(out, "num_key_value_heads", None) is None:
        out.num_key_value_heads = out.num_attention_heads
    return out

catalog = {g["gpu_type"]: g["memory_gb"] for g in json.load(open(data_path("configuration/gpu_catalog.json")))["gpu_types"]}
answers = []
for r in json.load(sys.stdin):
    a = {}
    try:
        if r["engine"] != "vllm":
            raise ValueError("vLLM only")
        gb = catalog.get(r["planner_gpu"]) or r["nominal_gb"]
        if gb is None:
            raise ValueError("card size unknown")
        if r["weights_total_gib"] is None:
            raise ValueError("weights come from the Hub's safetensors metadata; none logged to stand in")
        cfg = ns(r["config"])
        w = r["weights_total_gib"]
        # The Hub lookup (safetensors parameter counts) replaced by the weights vLLM logged.
        cp.model_memory_req = lambda *a_, **k_: w
        tp, pp, util = r["tp"], r["pp"], r["fraction"] if r["fraction"] is not None else 0.9
        mml = r["max_model_len"]
        total = cp.allocatable_kv_cache_memory(r["id"], cfg, int(gb), util, tp, pp, 1, max_model_len=mml)
        detail = cp.KVCacheDetail(r["id"], cfg, mml or 1, 1)
        per_token = detail.per_token_memory_bytes / (tp * pp)
        blocks = cp.total_kv_cache_blocks(r["id"], cfg, mml or 1, int(gb), util, 1, 16, tp, pp, 1)
        a = {"kv_gib": total / (tp * pp), "bytes_per_token": per_token,
             # total_kv_cache_blocks counts all tp x pp GPUs; vLLM logs one rank's pool.
             "tokens": blocks * 16 / (tp * pp)}
    except Exception as e:
        a = {"error": f"{type(e).__name__}: {e}"}
    answers.append(a)
print(json.dumps(answers))
'''

_AICONFIGURATOR = r"""
import json, logging, sys
logging.disable(logging.CRITICAL)
from aiconfigurator_core.sdk.memory import estimate_kv_cache
from aiconfigurator_core.sdk.perf_database import get_latest_database_version

answers = []
for r in json.load(sys.stdin):
    try:
        if r["aic_system"] is None:
            raise ValueError("card not among aiconfigurator's systems")
        if r["fraction"] is None:
            raise ValueError("needs the memory fraction; the case does not record the engine's")
        version = get_latest_database_version(r["aic_system"], r["engine"])
        if version is None:
            raise ValueError(f"no {r['engine']} perf database for {r['aic_system']}")
        est = estimate_kv_cache(
            r["config_dir"], r["aic_system"], r["engine"], version,
            max_num_tokens=r["max_num_tokens"], max_batch_size=r["max_num_seqs"],
            memory_fraction_kind="of_total", memory_fraction_value=r["fraction"],
            # Experts split like the engine's default (tensor-parallel, no EP); with SGLang's
            # DP attention the attention runs dp-wide at tp/dp.
            tp_size=r["tp"] // (r["dp_attention"] or 1), attention_dp_size=r["dp_attention"] or 1,
            moe_tp_size=r["tp"], pp_size=r["pp"],
            # --quantization fp8 covers the linears and the experts; --kv-cache-dtype auto is the
            # 16-bit model dtype (left unset, aiconfigurator takes an fp8 checkpoint's KV as fp8).
            gemm_quant_mode="fp8" if r["runtime_fp8"] else None,
            moe_quant_mode="fp8" if r["runtime_fp8"] else None,
            kvcache_quant_mode="fp8" if r["kv_fp8"] else "bfloat16",
        )
        a = {"kv_gib": est["total_kv_size_bytes"] / 2**30, "tokens": est["total_kv_size_tokens"],
             "bytes_per_token": est["kv_size_per_token_bytes"], "version": version}
    except Exception as e:
        a = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    answers.append(a)
print(json.dumps(answers))
"""

_HF_MEM = r"""
import json, sys, types, warnings
warnings.simplefilter("ignore")
from hf_mem.safetensors.kv_cache import compute_safetensors_kv_cache_size, resolve_kv_cache_dtype

answers = []
for r in json.load(sys.stdin):
    try:
        cfg = dict(r["config"])
        # hf-mem's own handling of ...ForConditionalGeneration wrappers (run.py): the text_config.
        if any("ForConditionalGeneration" in a for a in cfg.get("architectures", [])) and "text_config" in cfg:
            text = dict(cfg["text_config"])
            for key in ("dtype", "torch_dtype", "quantization_config"):
                if key in cfg and key not in text:
                    text[key] = cfg[key]
            cfg = text
        # The safetensors metadata is read only for an fp8 checkpoint without a format: none here.
        meta = types.SimpleNamespace(components={})
        dtype = resolve_kv_cache_dtype(cfg, "fp8" if r["kv_fp8"] else "auto", meta, r["id"])
        per_token = compute_safetensors_kv_cache_size(cfg, dtype, 1, 1)
        # hf-mem has no GPU, TP or utilisation: its figure is the whole model's cache per token.
        answers.append({"bytes_per_token": per_token / r["tp"] / r["pp"],
                        "error": None})
    except Exception as e:
        answers.append({"error": f"{type(e).__name__}: {str(e)[:200]}"})
print(json.dumps(answers))
"""

DRIVERS: dict[str, str] = {
    "llm-d-planner": _PLANNER,
    "aiconfigurator": _AICONFIGURATOR,
    "hf-mem": _HF_MEM,
}
