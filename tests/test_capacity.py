"""The capacity model against the seeds' numbers, hand-worked bytes per token and the engines' logs.

Every expected value below is written as the arithmetic that produces it, from the config fields,
so a reader can check it against the model card without running anything.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvwatch.analysis.predict import pool_from_available, predict
from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment, deployment_from_settings
from kvwatch.capacity.dims import ATTENTION, EMBED, LM_HEAD
from kvwatch.capacity.geometry import geometry_from_config, load_model
from kvwatch.capacity.states import state_layer
from kvwatch.capacity.towers import tower_params
from kvwatch.capacity.weights import weight_bytes_of, weights_per_rank
from kvwatch.core.errors import ConfigError, ModelConfigError
from kvwatch.core.jsontypes import JsonObject
from kvwatch.core.units import GiB, KiB, MiB, parse_size
from kvwatch.engines.sglang import budget, states, weight_extras
from kvwatch.engines.sglang import budget as sglang_budget
from kvwatch.engines.sglang.budget import default_mem_fraction_static
from kvwatch.engines.vllm.weights import mxfp4_expert_bytes
from kvwatch.state.facts import MemoryFacts, SettingsFacts

CONFIGS = Path(__file__).parent / "model_configs"
H100 = 81559 * MiB


def model(stem: str) -> Any:
    return load_model(CONFIGS / f"{stem}.json")


def raw(stem: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / f"{stem}.json").read_text())
    return data


# Bytes per token (bf16/fp16 cache, TP=1, only the layers whose cache grows with context),
# worked out by hand from each config.json in tests/model_configs.
BYTES_PER_TOKEN = [
    # 80 layers x 8 KV heads x head_dim 8192/64=128, K+V, 2 bytes
    ("Qwen--Qwen2.5-72B", 2 * 80 * 8 * 128 * 2),
    # 28 layers x 4 KV heads x 3584/28=128
    ("Qwen--Qwen2.5-7B", 2 * 28 * 4 * 128 * 2),
    # explicit head_dim 128 (hidden/heads would be 2048/32=64)
    ("Qwen--Qwen3-30B-A3B", 2 * 48 * 4 * 128 * 2),
    # explicit head_dim 128 (hidden/heads would be 5120/64=80)
    ("Qwen--Qwen3-32B", 2 * 64 * 8 * 128 * 2),
    ("Qwen--Qwen3-8B", 2 * 36 * 8 * 128 * 2),
    # full_attention_interval=4: 48/4 = 12 full layers, 2 KV heads, head_dim 256; 36 Gated DeltaNet layers
    ("Qwen--Qwen3-Next-80B-A3B-Thinking", 2 * 12 * 2 * 256 * 2),
    # text_config.layer_types: 10 full_attention of 40, 2 KV heads, head_dim 256
    ("Qwen--Qwen3.5-35B-A3B", 2 * 10 * 2 * 256 * 2),
    # MLA latent (512 + 64) x 61 layers x 2 bytes, plus the DSA indexer key 128 fp8 + 4-byte scale per layer
    ("deepseek-ai--DeepSeek-V3.2", 61 * (512 + 64) * 2 + 61 * (128 + 4)),
    # MLA: 61 x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2, no factor 2, no head count
    ("deepseek-ai--DeepSeek-V3", 61 * (512 + 64) * 2),
    # Gemma3 default pattern 6: layers 6, 12, ..., 60 global = 10 of 62; 16 KV heads x head_dim 128
    ("google--gemma-3-27b-it", 2 * 10 * 16 * 128 * 2),
    # 5 full layers of 30 with num_global_key_value_heads 2 x global_head_dim 512
    ("google--gemma-4-26B-A4B", 2 * 5 * 2 * 512 * 2),
    # MHA: 32 KV heads x 4096/32=128, float16
    ("meta-llama--Llama-2-7b-hf", 2 * 32 * 32 * 128 * 2),
    ("meta-llama--Llama-3.3-70B-Instruct", 2 * 80 * 8 * 128 * 2),
    ("meta-llama--Meta-Llama-3.1-70B", 2 * 80 * 8 * 128 * 2),
    ("meta-llama--Meta-Llama-3.1-8B", 2 * 32 * 8 * 128 * 2),
    # 10 KV heads x 5120/40=128
    ("microsoft--phi-4", 2 * 40 * 10 * 128 * 2),
    ("mistralai--Mixtral-8x7B-v0.1", 2 * 32 * 8 * 128 * 2),
    # MLA inside text_config
    ("moonshotai--Kimi-K2.5", 61 * (512 + 64) * 2),
    # block_configs: 49 attention layers with n_heads_in_group 8 -> 64/8 = 8 KV heads; 31 no-op
    ("nvidia--Llama-3_3-Nemotron-Super-49B-v1", 2 * 49 * 8 * 128 * 2),
    # hybrid_override_pattern: 10 '*' attention layers, attention_head_dim 128
    ("nvidia--Nemotron-H-56B-Base-8K", 2 * 10 * 8 * 128 * 2),
    # layer_types: 18 full_attention of 36, 8 KV heads x head_dim 64 (2880/64=45 would be wrong)
    ("openai--gpt-oss-120b", 2 * 18 * 8 * 64 * 2),
    # GPT-2 field names: n_layer 12 x n_head 12 x n_embd 768/12=64, MHA; no torch_dtype = 2 bytes
    ("openai-community--gpt2", 2 * 12 * 12 * 64 * 2),
    # GPTBigCode multi_query: n_layer 40 x 1 KV head x n_embd 6144/n_head 48=128; float32 served at 2 bytes
    ("bigcode--starcoder", 2 * 40 * 1 * 128 * 2),
]


def test_every_bundled_config_has_a_case() -> None:
    bundled = {p.stem for p in CONFIGS.glob("*.json") if p.name != "manifest.json"}
    assert bundled == {stem for stem, _ in BYTES_PER_TOKEN}


@pytest.mark.parametrize(("stem", "expected"), BYTES_PER_TOKEN, ids=[s for s, _ in BYTES_PER_TOKEN])
def test_bytes_per_token(stem: str, expected: int) -> None:
    assert model(stem).bytes_per_token() == expected


@pytest.mark.parametrize(("stem", "expected"), BYTES_PER_TOKEN, ids=[s for s, _ in BYTES_PER_TOKEN])
def test_predict_reports_bytes_per_token(stem: str, expected: int) -> None:
    p = predict(model(stem), Deployment(available_kv_bytes=10 * GiB, max_model_len=4096))
    assert p.bytes_per_token == expected
    assert p.to_json_dict()["bytes_per_token"] == expected


# --- the seeds' numbers -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stem", "tokens", "expected_bytes"),
    [
        ("meta-llama--Meta-Llama-3.1-8B", 1, 128 * KiB),
        ("meta-llama--Meta-Llama-3.1-8B", 8192, 1 * GiB),
        ("meta-llama--Meta-Llama-3.1-70B", 1, 320 * KiB),
        ("meta-llama--Meta-Llama-3.1-70B", 8192, int(2.5 * GiB)),
        ("meta-llama--Meta-Llama-3.1-70B", 131072, 40 * GiB),
        ("Qwen--Qwen2.5-72B", 1, 320 * KiB),
        ("Qwen--Qwen3-32B", 1, 256 * KiB),
        ("Qwen--Qwen3-32B", 8192, 2 * GiB),
        ("Qwen--Qwen3-8B", 1, 144 * KiB),
        ("Qwen--Qwen3-8B", 32768, int(4.5 * GiB)),
        ("deepseek-ai--DeepSeek-V3", 1, 70272),
        ("openai--gpt-oss-120b", 1, 36864),
        ("openai--gpt-oss-120b", 131072, int(4.5 * GiB)),
    ],
)
def test_seed_kv_sizes(stem: str, tokens: int, expected_bytes: int) -> None:
    assert model(stem).bytes_per_token() * tokens == expected_bytes


def test_llama3_70b_equals_qwen25_72b() -> None:
    assert (
        model("meta-llama--Meta-Llama-3.1-70B").bytes_per_token()
        == model("Qwen--Qwen2.5-72B").bytes_per_token()
    )


def test_qwen3_32b_head_dim_from_hidden_undercounts_37_percent() -> None:
    cfg = raw("Qwen--Qwen3-32B")
    del cfg["head_dim"]  # what a calculator using hidden_size / num_attention_heads sees
    wrong = geometry_from_config(cfg).bytes_per_token()
    assert wrong == 2 * 64 * 8 * (5120 // 64) * 2
    assert 1 - wrong / (256 * KiB) == pytest.approx(0.375)


def test_deepseek_logical_shapes_overestimate_71x() -> None:
    cfg = raw("deepseek-ai--DeepSeek-V3")
    del cfg["kv_lora_rank"]  # read as plain attention: 128 KV heads, K 128+64, V 128
    cfg["head_dim"] = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    wrong = geometry_from_config(cfg).bytes_per_token()
    assert wrong == 61 * 128 * (192 + 128) * 2
    assert wrong / 70272 == pytest.approx(71.1, abs=0.05)


def test_qwen3_8b_with_hidden_size_is_576_kib() -> None:
    cfg = raw("Qwen--Qwen3-8B")
    cfg["num_key_value_heads"] = cfg["num_attention_heads"]  # NVIDIA guide: heads x head_dim = hidden
    assert geometry_from_config(cfg).bytes_per_token() == 2 * 36 * 4096 * 2 == 576 * KiB


def test_opt_13b_800_kb_per_token() -> None:
    # vLLM paper: 2 (K, V) x 5120 hidden x 40 layers x 2 bytes
    opt: JsonObject = {
        "model_type": "opt",
        "architectures": ["OPTForCausalLM"],
        "num_hidden_layers": 40,
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "ffn_dim": 20480,
        "vocab_size": 50272,
        "torch_dtype": "float16",
    }
    assert geometry_from_config(opt).bytes_per_token() == 2 * 5120 * 40 * 2 == 800 * KiB


@pytest.mark.parametrize(
    ("stem", "billions"),
    [
        ("meta-llama--Meta-Llama-3.1-8B", 8.03),
        ("meta-llama--Meta-Llama-3.1-70B", 70.6),
        ("Qwen--Qwen3-32B", 32.8),
        ("Qwen--Qwen2.5-72B", 72.7),
        ("Qwen--Qwen3-8B", 8.19),
        ("mistralai--Mixtral-8x7B-v0.1", 46.7),
        ("deepseek-ai--DeepSeek-V3", 671.0),
        ("openai--gpt-oss-120b", 116.8),
        ("microsoft--phi-4", 14.7),
        # model card: "15.5B parameter models"
        ("bigcode--starcoder", 15.5),
    ],
)
def test_param_count_lands_on_published_figure(stem: str, billions: float) -> None:
    digits = 2 if billions < 10 else 1
    assert round(model(stem).param_count / 1e9, digits) == billions


def test_llama3_8b_param_count_exact() -> None:
    embed = 128256 * 4096
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert model("meta-llama--Meta-Llama-3.1-8B").param_count == 2 * embed + 32 * layer + 4096


def test_gpt2_param_count_exact() -> None:
    # 124,439,808, what transformers counts for GPT2LMHeadModel: token and position tables (the
    # head is tied), Conv1D weights and biases, two LayerNorms per block and a final one.
    embed = 50257 * 768 + 1024 * 768
    attention = 768 * 3 * 768 + 3 * 768 + 768 * 768 + 768
    mlp = 768 * 3072 + 3072 + 3072 * 768 + 768
    layer = attention + mlp + 2 * 2 * 768
    assert model("openai-community--gpt2").param_count == embed + 12 * layer + 2 * 768 == 124_439_808


def test_starcoder_param_count_within_half_a_percent() -> None:
    # The model card's 15.5B is rounded to 0.1B (0.3%); the shapes give 15.517B.
    layer = 6144 * (6144 + 2 * 128) + 6400 + 6144 * 6144 + 6144 + 2 * 6144 * 24576 + 24576 + 6144 + 4 * 6144
    exact = 49152 * 6144 + 8192 * 6144 + 40 * layer + 2 * 6144
    m = model("bigcode--starcoder")
    assert m.param_count == exact
    assert abs(m.param_count / 15.5e9 - 1) < 0.005


def test_gpt2_style_fields_read_as_their_transformers_names() -> None:
    m = model("bigcode--starcoder")
    assert (m.num_layers, m.num_attention_heads, m.hidden_size) == (40, 48, 6144)
    assert m.max_position_embeddings == 8192
    # multi_query: one KV head, replicated across tensor-parallel ranks rather than split.
    assert {layer.num_kv_heads for layer in m.layers} == {1}
    assert m.bytes_per_token(tp=8) == m.bytes_per_token() == 20_480
    cfg = raw("bigcode--starcoder")
    cfg["multi_query"] = False  # SantaCoder-style MHA variant of the same config
    assert geometry_from_config(cfg).bytes_per_token() == 2 * 40 * 48 * 128 * 2
    del cfg["n_inner"]  # null/absent n_inner is 4 x n_embd, the same 24576 here
    assert geometry_from_config(cfg).params["dense_mlp"] == model("bigcode--starcoder").params["dense_mlp"]


def test_vllm_page_size_llama3_8b() -> None:
    p = predict(
        model("meta-llama--Meta-Llama-3.1-8B"), Deployment(available_kv_bytes=GiB, max_model_len=8192)
    )
    assert p.page_bytes == 8 * 16 * 256 * 2 == 65536


def test_vllm_52_31566_gib_pool() -> None:
    m = model("meta-llama--Meta-Llama-3.1-8B")
    available = parse_size("52.31566GiB")
    d = Deployment(engine="vllm", available_kv_bytes=available, max_model_len=8192)
    p = predict(m, d)
    assert p.kv_pool_blocks == available // 65536 // 32 == 26785
    assert p.kv_pool_tokens == 26785 * 16 == 428560
    assert f"{p.max_concurrency:.2f}" == "52.31"  # 26785 / ceil(8192 / 16)
    assert pool_from_available(m, d, available) == (428560, 26785)
    # The older token formula (num_blocks // groups * block_size) gives the same here.
    old = Deployment(engine="vllm", engine_version="0.11.0", max_model_len=8192)
    assert pool_from_available(m, old, available) == (428560, 26785)


def test_sglang_428569_tokens_same_pool() -> None:
    m = model("meta-llama--Meta-Llama-3.1-8B")
    d = Deployment(engine="sglang", max_model_len=8192)
    assert pool_from_available(m, d, parse_size("52.31566GiB")) == (parse_size("52.31566GiB") // 131072, None)
    assert pool_from_available(m, d, parse_size("52.31566GiB"))[0] == 428569


def test_sglang_mem_fraction_static_h100() -> None:
    frac = default_mem_fraction_static(
        Deployment(engine="sglang", engine_version="0.5.9", gpu_memory_bytes=H100)
    )
    # 512 + 8192 x 1.5 + 1 x 1 / 8 x 1024 + 256 x 2 = 13,440 MB, above the 10,240 floor
    assert frac.reserved_mb == 512 + 8192 * 1.5 + 1 * 1 / 8 * 1024 + 256 * 2 == 13440
    assert frac.value == round((81559 - 13440) / 81559, 3) == 0.835


def test_sglang_mem_fraction_static_h100_keeps_the_prefill_graphs_from_0510() -> None:
    """Piecewise CUDA graphs on by default from 0.5.10: 58 capture sizes up to 8192 x 8 MiB (the
    engine notes' worked example: 13,904 MiB, 0.830)."""
    frac = default_mem_fraction_static(
        Deployment(engine="sglang", engine_version="0.5.23", gpu_memory_bytes=H100)
    )
    assert frac.reserved_mb == 13440 + 58 * 8 == 13904
    assert frac.value == 0.830


def test_sglang_mem_fraction_static_h200_tp8() -> None:
    frac = default_mem_fraction_static(
        Deployment(engine="sglang", engine_version="0.5.9", gpu_memory_bytes=143771 * MiB, tp=8)
    )
    # chunked 8192, cuda_graph_max_bs 512 at tp >= 4
    assert frac.value == round((143771 - (512 + 8192 * 1.5 + 8 / 8 * 1024 + 512 * 2)) / 143771, 3)


def test_sglang_mem_fraction_static_old_versions() -> None:
    assert (
        default_mem_fraction_static(
            Deployment(engine="sglang", engine_version="0.3.0", gpu_memory_bytes=H100, tp=4)
        ).value
        == 0.85
    )
    # 0.4.9 - 0.5.2: H100 band reserves (9.5 + 1/2) GiB
    v = default_mem_fraction_static(
        Deployment(engine="sglang", engine_version="0.5.1", gpu_memory_bytes=H100)
    )
    assert v.value == round((81559 - 10 * 1024) / 81559, 3)


def test_tp8_divides_kv_heads() -> None:
    m = model("meta-llama--Meta-Llama-3.1-70B")
    p = predict(m, Deployment(tp=8, available_kv_bytes=GiB, max_model_len=8192))
    assert p.bytes_per_token == 320 * KiB // 8 == 40 * KiB
    assert p.bytes_per_token_all_ranks == 320 * KiB


def test_tp_beyond_kv_heads_replicates() -> None:
    m = model("Qwen--Qwen3-Next-80B-A3B-Thinking")  # 2 KV heads
    p = predict(m, Deployment(tp=4, available_kv_bytes=GiB, max_model_len=8192))
    assert p.bytes_per_token == 2 * 12 * max(1, 2 // 4) * 256 * 2


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_mla_not_divided_by_tp(engine: str) -> None:
    m = model("deepseek-ai--DeepSeek-V3")
    p = predict(m, Deployment(engine=engine, tp=16, available_kv_bytes=GiB, max_model_len=8192))  # type: ignore[arg-type]
    assert p.bytes_per_token == 61 * 576 * 2


def test_fp8_kv_halves_bytes() -> None:
    m = model("meta-llama--Meta-Llama-3.1-8B")
    for dtype in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        p = predict(m, Deployment(kv_cache_dtype=dtype, available_kv_bytes=GiB, max_model_len=8192))
        assert p.bytes_per_token == 2 * 32 * 8 * 128 * 1


def test_sglang_fp8_dsa_latent_has_scales() -> None:
    m = model("deepseek-ai--DeepSeek-V3.2")
    p = predict(
        m, Deployment(engine="sglang", kv_cache_dtype="fp8_e4m3", available_kv_bytes=GiB, max_model_len=8192)
    )
    # 512 fp8 + 512/128 x 4-byte scales + 64 rope in bf16, plus the indexer key
    assert p.bytes_per_token == 61 * (512 + 512 // 128 * 4 + 64 * 2) + 61 * (128 + 4)


# --- the seed chapter's H100 budget (0.92 x 81,559 MiB, 6.0 GiB for activations) --------------

# The release the seed's figures are checked against: pinned, so a newer release's defaults
# (docs/architecture.md, "Recipe: a new engine release's rule") do not move them.
SEED_RELEASE = "0.33.0"


def vllm_h100(stem: str, **kw: Any) -> Any:
    """The seed's inputs, given: its 6.0 GiB allowance and the weights as the checkpoint's files
    (kvwatch.capacity.weights; vLLM's loader model is checked on real startups in test_accuracy.py)."""
    m = model(stem)
    kw.setdefault("activation_bytes", 6 * GiB)
    kw.setdefault("engine_version", SEED_RELEASE)
    if "weights_bytes" not in kw:
        kw["weights_bytes"] = weights_per_rank(m, kw.get("tp", 1), 1, kw.get("weights_dtype")).per_rank_bytes
    return predict(m, Deployment(engine="vllm", gpu_memory_bytes=H100, max_model_len=8192, **kw))


def test_seed_budget_llama3_8b() -> None:
    p = vllm_h100("meta-llama--Meta-Llama-3.1-8B")
    assert p.usable_bytes == math.ceil(81559 * MiB * 0.92)
    assert round(p.usable_bytes / GiB, 2) == 73.28
    assert round(p.weights_bytes / GiB, 2) == 14.96
    assert round(p.available_kv_bytes / GiB, 2) == 52.32
    assert math.floor(p.max_concurrency) == 52


def test_seed_budget_qwen3_32b() -> None:
    p = vllm_h100("Qwen--Qwen3-32B")
    assert round(p.weights_bytes / GiB) == 61
    assert round(p.available_kv_bytes / GiB, 1) == 6.3
    assert round(p.kv_pool_tokens, -2) == 25600
    assert math.floor(p.max_concurrency) == 3
    # "Qwen3-32B goes from 3 concurrent requests to 18 by halving the weights alone."
    assert math.floor(vllm_h100("Qwen--Qwen3-32B", weights_dtype="fp8").max_concurrency) == 18


def test_seed_budget_llama3_70b() -> None:
    assert vllm_h100("meta-llama--Meta-Llama-3.1-70B").available_kv_bytes < 0  # bf16 does not fit
    p = vllm_h100("meta-llama--Meta-Llama-3.1-70B", weights_dtype="fp8")
    assert round(p.available_kv_bytes / GiB, 2) == 1.57
    assert not p.fits
    assert p.estimated_max_model_len is not None and 0 < p.estimated_max_model_len < 8192
    assert p.failure is not None and p.failure.startswith("To serve at least one request")
    # TP=8: 1.33M tokens per rank-set, 162 concurrent 8k requests
    p8 = vllm_h100("meta-llama--Meta-Llama-3.1-70B", tp=8)
    assert round(p8.kv_pool_tokens / 1e6, 2) == 1.33
    assert math.floor(p8.max_concurrency) == 162


def test_seed_budget_deepseek_16_gpus() -> None:
    p = vllm_h100("deepseek-ai--DeepSeek-V3", tp=16)
    assert round(p.bytes_per_token / KiB, 1) == 68.6
    assert math.floor(p.max_concurrency) == 52


def test_seed_qwen3_8b_a6000_formula_bound() -> None:
    """Seed: 26.1 GiB after the weights -> ~190,000 tokens; ~210,000 with ECC off (0.92, no activations)."""
    m = model("Qwen--Qwen3-8B")
    for gpu, tokens in (("a6000", 190_000), ("a6000-ecc-off", 210_000)):
        d = Deployment(
            gpu_memory_bytes=gpus.lookup(gpu).memory_bytes,
            max_model_len=32768,
            activation_bytes=0,
            engine_version=SEED_RELEASE,
        )
        p = predict(m, d)
        assert round(p.kv_pool_tokens, -4) == tokens
    a6000 = gpus.lookup("a6000").memory_bytes
    ecc_on = predict(m, Deployment(gpu_memory_bytes=a6000, activation_bytes=0, engine_version=SEED_RELEASE))
    assert round(ecc_on.available_kv_bytes / GiB, 1) == 26.1


def test_vllm_version_defaults() -> None:
    m = model("meta-llama--Meta-Llama-3.1-8B")
    old = predict(m, Deployment(engine_version="0.11.0", gpu_memory_bytes=H100, max_model_len=8192))
    new = predict(m, Deployment(engine_version="0.21.0", gpu_memory_bytes=H100, max_model_len=8192))
    assert old.gpu_memory_utilization == 0.9
    assert new.gpu_memory_utilization == 0.92
    graphs = GiB
    d = Deployment(
        gpu_memory_bytes=H100, max_model_len=8192, activation_bytes=4 * GiB, cuda_graph_bytes=graphs
    )
    # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to "0" in 0.19.0 (envs.py:1654), "1" in 0.20.0
    # (envs.py:1724): the estimate comes out of the budget from 0.20, whatever 0.21's log text says.
    before = predict(m, d.with_(engine_version="0.19.0", gpu_memory_utilization=0.92))
    after = predict(m, d.with_(engine_version="0.20.0"))
    assert before.available_kv_bytes - after.available_kv_bytes == graphs
    assert not before.cuda_graphs_subtracted and after.cuda_graphs_subtracted


# --- engines' own logs (tests/log_samples/manifest.json facts) -------------------------------


def _blocks_for_printed_gib(m: Any, d: Deployment, printed: float) -> range:
    """Blocks the engine can have made of a budget printed to two decimals."""
    lo = pool_from_available(m, d, int((printed - 0.005) * GiB))[1]
    hi = pool_from_available(m, d, int((printed + 0.005) * GiB))[1]
    assert lo is not None and hi is not None
    return range(lo, hi + 1)


@pytest.mark.parametrize(("printed_gib", "blocks"), [(3.81, 1952), (2.89, 1478)])
def test_vllm_v0_llama31_8b_rtx3090_blocks(printed_gib: float, blocks: int) -> None:
    """vllm/001 and /002: kv_cache_size printed in GiB -> # GPU blocks (V0, block 16)."""
    d = Deployment(engine="vllm", engine_version="0.6.4", max_model_len=20000)
    assert blocks in _blocks_for_printed_gib(model("meta-llama--Meta-Llama-3.1-8B"), d, printed_gib)


def test_vllm_gpt_oss_hybrid_groups_match_reported_tokens() -> None:
    """hf-mem #60: vLLM printed 5.38 GiB available and 78,384 tokens for gpt-oss-120b."""
    m = model("openai--gpt-oss-120b")
    d = Deployment(engine="vllm", engine_version="0.10.1", max_model_len=131072)
    # 18 sliding + 18 full layers, same page: 2 groups of 18; tokens = blocks // 2 x 16
    lo = pool_from_available(m, d, int(5.375 * GiB))[0]
    hi = pool_from_available(m, d, int(5.385 * GiB))[0]
    assert lo <= 78384 <= hi
    assert pool_from_available(m, d, int(5.38 * GiB))[1] == int(5.38 * GiB) // (16 * 8 * 128 * 2) // 18


GEMMA3_4B: JsonObject = {
    "model_type": "gemma3",
    "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 34,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
}


def test_vllm_gemma3_4b_groups_padding_and_concurrency() -> None:
    """vllm/021: Gemma-3-4B on an A100, max_model_len 3072: 1 padding layer (3.45%), 317,136 tokens, 102.78x."""
    m = geometry_from_config(GEMMA3_4B, name="google/gemma-3-4b-it")
    assert (m.count("sliding"), m.count("full")) == (29, 5)
    d = Deployment(engine="vllm", engine_version="0.11.0", max_model_len=3072, max_num_batched_tokens=2048)
    page = 16 * 4 * 256 * 2 * 2
    # group_size 5: 29 sliding -> 6 groups (1 padding layer), 5 full -> 1 group; 7 groups
    blocks = 19821 * 7 + 3  # one block count consistent with both logged figures
    p = predict(m, d.with_(available_kv_bytes=blocks * page * 5))
    assert p.kv_groups == 7
    assert p.kv_pool_blocks == blocks
    assert p.kv_pool_tokens == blocks // 7 * 16 == 317136
    # per request: 6 sliding groups x (ceil(3071 / 16) + 1) + 1 full group x ceil(3072 / 16) blocks
    assert f"{p.max_concurrency:.2f}" == f"{blocks / (6 * (192 + 1) + 192):.2f}" == "102.78"


# Real Hub configs whose text_config transformers saved as a diff against its class defaults
# (tests/apriori/public/configs), worked out with those defaults filled in.
NESTED_DEFAULTS = [
    # Gemma3TextConfig: 8 heads, 4 KV heads, head_dim 256; pattern 6 -> layers 6, 12, ..., 30 global = 5 of 34
    ("google--gemma-3-4b-it", 34, 5, 2 * 5 * 4 * 256 * 2),
    # LlamaConfig: 32 layers, 32 heads = 32 KV heads, head_dim 4096 / 32 = 128, float16
    ("llava-hf--llava-1.5-7b-hf", 32, 32, 2 * 32 * 32 * 128 * 2),
]


@pytest.mark.parametrize(
    ("stem", "layers", "full", "expected"), NESTED_DEFAULTS, ids=[n[0] for n in NESTED_DEFAULTS]
)
def test_a_nested_text_config_takes_its_class_defaults(
    stem: str, layers: int, full: int, expected: int
) -> None:
    m = load_model(Path(__file__).parent / "apriori" / "public" / "configs" / f"{stem}.json")
    assert (m.num_layers, m.count("full")) == (layers, full)
    assert m.bytes_per_token() == expected


def test_a_nested_mistral_text_config_has_its_own_head() -> None:
    """MistralConfig unties the head (transformers 5.24 configuration_mistral.py:77): Mistral-Small
    3.1's text_config leaves tie_word_embeddings out, so its 131,072 x 5,120 lm_head is counted --
    the llm-d logs load 44.76 GiB, not the 43.45 GiB of a tied head."""
    m = load_model(
        Path(__file__).parent
        / "apriori"
        / "public"
        / "configs"
        / "mistralai--Mistral-Small-3.1-24B-Instruct-2503.json"
    )
    assert m.params[LM_HEAD] == 131072 * 5120
    assert m.params[EMBED] == 131072 * 5120


def test_a_top_level_config_is_not_filled_with_class_defaults() -> None:
    """A top-level config.json keeps every model field: one without its heads is refused, not guessed."""
    cfg = {k: v for k, v in raw("meta-llama--Meta-Llama-3.1-8B").items() if k != "num_attention_heads"}
    with pytest.raises(ModelConfigError, match="num_attention_heads"):
        geometry_from_config(cfg, name="x")


def test_sglang_qwen3_235b_cell_matches_logged_k_size() -> None:
    """sglang/001: Qwen3-235B-A22B-FP8 at TP=4: 367,404 tokens, K size 8.23 GB (GiB) per rank."""
    cfg: JsonObject = {
        "model_type": "qwen3_moe",
        "num_hidden_layers": 94,
        "hidden_size": 4096,
        "num_attention_heads": 64,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "moe_intermediate_size": 1536,
        "num_experts": 128,
        "vocab_size": 151936,
        "torch_dtype": "bfloat16",
    }
    m = geometry_from_config(cfg)
    d = Deployment(engine="sglang", tp=4, max_model_len=40960)
    cell = 1 * (128 + 128) * 94 * 2  # 4 KV heads / TP 4 = 1 per rank
    p = predict(m, d.with_(available_kv_bytes=367404 * cell + cell - 1))
    assert p.bytes_per_token == cell
    assert p.kv_pool_tokens == 367404
    assert round(p.kv_pool_tokens * cell / 2 / GiB, 2) == 8.23


# --- structure, hybrids, parallelism -----------------------------------------------------------


def test_sglang_page_rounding() -> None:
    m = model("meta-llama--Meta-Llama-3.1-8B")
    d = Deployment(engine="sglang", page_size=64, max_model_len=8192)
    tokens, _ = pool_from_available(m, d, 1000 * 131072 + 5)
    assert tokens == 1000 // 64 * 64


def test_sglang_swa_split() -> None:
    m = model("openai--gpt-oss-120b")
    full = swa = 18 * 2 * 8 * 64 * 2  # 18 full and 18 sliding layers per token
    available = 100_000 * (full + swa) + 12_345
    p = predict(m, Deployment(engine="sglang", max_model_len=8192, available_kv_bytes=available))
    # newest: one full-pool token costs the full layers plus 0.8 x the sliding layers
    assert p.kv_pool_tokens == int(available // (full + 0.8 * swa))
    assert p.swa_pool_tokens == int(p.kv_pool_tokens * 0.8)
    old = predict(
        m,
        Deployment(engine="sglang", engine_version="0.5.4", max_model_len=8192, available_kv_bytes=available),
    )
    # 0.5.4 set_num_token_hybrid: all-layer tokens x 36 layers / (0.8 x 18 + 18)
    assert old.kv_pool_tokens == int(available // (full + swa) * 36 / (0.8 * 18 + 18))


@pytest.mark.parametrize(
    "d",
    [
        Deployment(engine="vllm", max_model_len=8192, hybrid_kv_cache_manager=False),
        Deployment(engine="vllm", engine_version="0.8.5", max_model_len=8192),  # before the hybrid allocator
    ],
)
def test_vllm_without_hybrid_manager_sliding_counts_as_full(d: Deployment) -> None:
    m = model("openai--gpt-oss-120b")
    # 36 layers x 16 tokens x 8 KV heads x (64 + 64) x 2 bytes per block
    tokens, blocks = pool_from_available(m, d, 36 * (16 * 8 * 128 * 2) * 1000)
    assert blocks == 1000
    assert tokens == 1000 * 16


def test_pipeline_parallel_splits_layers() -> None:
    m = model("meta-llama--Meta-Llama-3.1-8B")
    p = predict(m, Deployment(pp=3, available_kv_bytes=GiB, max_model_len=8192))
    # 32 layers over 3 stages: 11, 11, 10; the fullest stage bounds the pool
    assert p.bytes_per_token == 11 * 2 * 8 * 128 * 2
    assert p.kv_pool_blocks == GiB // (16 * 8 * 128 * 2 * 2) // 11


def test_dcp_multiplies_mla_tokens() -> None:
    m = model("deepseek-ai--DeepSeek-V3")
    one = pool_from_available(m, Deployment(tp=8, max_model_len=8192), 10 * GiB)
    two = pool_from_available(m, Deployment(tp=8, dcp=2, max_model_len=8192), 10 * GiB)
    assert two[1] == one[1]
    assert two[0] == 2 * one[0]


def test_mla_block_size_default_64() -> None:
    p = predict(model("deepseek-ai--DeepSeek-V3"), Deployment(available_kv_bytes=GiB, max_model_len=8192))
    assert p.block_size == 64
    assert p.page_bytes == 64 * 576 * 2


@pytest.mark.parametrize(
    ("name", "kv_dtype", "block"),
    [
        # Qwen3.5's recurrent state is fp32 (mamba_ssm_dtype): 2,146,304 B a layer at TP 1. Its
        # startups log 'Setting attention block size to 1056 tokens' (bf16 KV) and 2096 (fp8 KV).
        ("Qwen--Qwen3.5-35B-A3B", "auto", 1056),
        ("Qwen--Qwen3.5-35B-A3B", "fp8", 2096),
        # Qwen3-Next keeps it in bf16: 1,097,728 B, 16 x ceil(1097728 / (16 x 2048)) = 544.
        ("Qwen--Qwen3-Next-80B-A3B-Thinking", "auto", 544),
    ],
)
def test_vllm_raises_the_attention_block_to_hold_a_state_layer(name: str, kv_dtype: str, block: int) -> None:
    d = Deployment(
        available_kv_bytes=10 * GiB, max_model_len=32768, kv_cache_dtype=kv_dtype, engine_version="0.25.1"
    )
    p = predict(model(name), d)
    assert p.block_size == block
    assert p.exact
    # One full-attention layer in four: groups of n_full layers, one of attention and three of state.
    # 0.25.1 leaves prefix caching off for a hybrid model (config/model.py:1883-1888): mamba_cache_mode
    # 'none', one block a request per state group; --enable-prefix-caching: 'align', two.
    full = model(name).count("full")
    page = block * p.bytes_per_token // full
    assert p.kv_pool_blocks == 10 * GiB // (page * full)
    assert p.max_concurrency == pytest.approx(p.kv_pool_blocks / (-(-32768 // block) + 3 * 1))  # type: ignore[operator]
    on = predict(model(name), replace(d, enable_prefix_caching=True))
    assert on.kv_pool_blocks == p.kv_pool_blocks
    assert on.max_concurrency == pytest.approx(p.kv_pool_blocks / (-(-32768 // block) + 3 * 2))  # type: ignore[operator]


@pytest.mark.parametrize(
    ("version", "prefix", "per_request"),
    [
        # sostrowsk/dgx-spark-local-llm qwen36.log (vLLM 0.25.1, GB10): the engine config line says
        # enable_prefix_caching=False (not set by the user), 'Add 3 padding layers', 74.22 GiB ->
        # 'Maximum concurrency for 262,144 tokens per request: 12.84x' = 3300 blocks / 257: 245
        # attention blocks of 1072 tokens + 3 state groups x (1 + 3 MTP tokens).
        ("0.25.1", None, 245 + 3 * 4),
        # From 0.26 prefix caching is on for hybrid models (config/model.py:1895-1897): 'align'.
        ("0.26.0", None, 245 + 3 * 5),
        ("0.25.1", True, 245 + 3 * 5),
        ("0.26.0", False, 245 + 3 * 4),
    ],
)
def test_vllm_state_blocks_follow_prefix_caching_by_release(
    version: str, prefix: bool | None, per_request: int
) -> None:
    d = Deployment(
        available_kv_bytes=int(74.22 * GiB),
        max_model_len=262144,
        engine_version=version,
        speculative_method="mtp",
        num_speculative_tokens=3,
        enable_prefix_caching=prefix,
    )
    p = predict(model("Qwen--Qwen3.5-35B-A3B"), d)
    assert (p.block_size, p.kv_groups) == (1072, 4)
    assert p.kv_pool_blocks == 3299  # the log's 74.22 GiB is rounded: vLLM had 3300
    assert p.max_concurrency == pytest.approx(3299 / per_request)
    if version == "0.25.1" and prefix is None:
        assert f"{p.max_concurrency:.2f}" == "12.84"


def test_vllm_0201_prefix_caching_puts_gdn_state_in_align_mode() -> None:
    """noonghunna/club-3090#91 (vLLM 0.20.1, 2x RTX 3090, TP 2): --enable-prefix-caching, MTP 3,
    fp8_e5m2 KV, 262,144 tokens: 'GPU KV cache size: 619,479 tokens', '2.36x' = 423 blocks / 179:
    164 attention blocks of 1600 tokens + 3 state groups x (2 + 3) -- 'align', not 'none'."""
    cfg = json.loads((Path(__file__).parent / "apriori/public/configs/Qwen--Qwen3.5-27B.json").read_text())
    d = Deployment(
        engine_version="0.20.1",
        tp=2,
        max_model_len=262144,
        kv_cache_dtype="fp8_e5m2",
        enable_prefix_caching=True,
        speculative_method="mtp",
        num_speculative_tokens=3,
        available_kv_bytes=423 * 1600 * 1024 * 17,
    )
    p = predict(geometry_from_config(cfg), d)
    assert (p.block_size, p.kv_pool_blocks) == (1600, 423)
    assert p.kv_pool_tokens == 619479
    assert f"{p.max_concurrency:.2f}" == "2.36"


def test_vllm_mamba2_prefix_caching_all_mode_aligns_to_the_chunk() -> None:
    """Nemotron-H with prefix caching (0.26: on by default) takes mamba_cache_mode 'all': the block is
    a multiple of lcm(chunk_size 128, 16) holding a state layer, and each state group takes a block
    per block_size tokens (0.25.1 platforms/interface.py:869-877, v1/kv_cache_interface.py:689-693);
    from 0.28 every model takes 'align' (model_executor/models/config.py:602-609)."""
    m = model("nvidia--Nemotron-H-56B-Base-8K")
    mamba = next(layer for layer in m.layers if layer.kind == "mamba")
    # 0.26 keeps the recurrent state in float32 (NemotronHForCausalLMConfig, config.json names none).
    state = mamba.state_bytes(8, 2, ssm_fp32=True)
    d = Deployment(engine_version="0.26.0", tp=8, max_model_len=8192, available_kv_bytes=20 * GiB)
    p = predict(m, d)
    per_token = 1 * 128 * 2 * 2
    assert p.block_size == 128 * math.ceil(math.ceil(state / per_token) / 128)
    assert p.block_size % 128 == 0 and p.block_size * per_token >= state
    blocks = -(-8192 // p.block_size)
    n_mamba, n_full = m.count("mamba"), m.count("full")
    state_groups = -(-n_mamba // n_full) if n_mamba >= 1.5 * n_full else 1
    assert p.max_concurrency == pytest.approx(p.kv_pool_blocks / (blocks * (1 + state_groups)))  # type: ignore[operator]
    off = predict(m, replace(d, engine_version="0.28.0"))
    assert off.block_size == 16 * -(-state // (16 * per_token))
    assert off.kv_pool_blocks is not None
    assert off.max_concurrency == pytest.approx(
        off.kv_pool_blocks / (-(-8192 // off.block_size) + 2 * state_groups)
    )
    # From 0.32 a MambaMixer2 layer keeps a prefill-checkpoint block more in 'align' (0.32.0
    # layers/mamba/mamba_mixer2.py:1107, v1/kv_cache_interface.py:1079).
    late = predict(m, replace(d, engine_version="0.32.0"))
    assert late.kv_pool_blocks is not None
    assert late.max_concurrency == pytest.approx(
        late.kv_pool_blocks / (-(-8192 // late.block_size) + 3 * state_groups)
    )


def test_linear_attention_without_its_state_shape_is_refused_by_name() -> None:
    cfg = json.loads((CONFIGS / "Qwen--Qwen3-Next-80B-A3B-Thinking.json").read_text())
    del cfg["linear_num_value_heads"]
    with pytest.raises(ModelConfigError, match="linear_num"):
        geometry_from_config(cfg)


def test_a_mamba_layer_without_its_state_shape_is_flagged_estimate() -> None:
    cfg = json.loads((CONFIGS / "nvidia--Nemotron-H-56B-Base-8K.json").read_text())
    del cfg["mamba_num_heads"]
    p = predict(geometry_from_config(cfg), Deployment(available_kv_bytes=GiB, max_model_len=8192))
    assert not p.exact
    assert any("state shape is not in config.json" in a for a in p.assumptions)


def test_weights_mxfp4_only_experts() -> None:
    m = model("openai--gpt-oss-120b")
    p = predict(m, Deployment(gpu_memory_bytes=143771 * MiB, max_model_len=8192))
    assert p.weights_scheme == "mxfp4"
    # ~117B params of which the experts are at 4.25 bits: ~61 GiB, not 218 GiB of bf16
    assert 55 * GiB < p.weights_total_bytes < 66 * GiB  # type: ignore[operator]


def test_vllm_mxfp4_experts_in_the_backend_layout_of_each_card() -> None:
    """gpt-oss's routed experts as vLLM's MoE backend pads them (vllm weights.mxfp4_expert_bytes):
    the loader's own 'Model loading took' figures of gpt-oss-120b / -20b in tests/apriori/public."""
    m = model("openai--gpt-oss-120b")
    dims = m.dims
    assert dims is not None and (dims.hidden_size, dims.moe_intermediate_size) == (2880, 2880)
    # Marlin (SM 8.x, 12.x): intermediate per rank to 128, hidden to 256, values and scales alike.
    assert mxfp4_expert_bytes(dims, 1, 8) == pytest.approx(4.25 / 8 * (2944 / 2880) * (3072 / 2880))
    assert mxfp4_expert_bytes(dims, 4, 12) == pytest.approx(4.25 / 8 * (768 / 720) * (3072 / 2880))
    # Triton on Hopper: the intermediate to 64 (2880 stays, TP 2's 1440 -> 1472), the values' hidden to 256.
    assert mxfp4_expert_bytes(dims, 1, 9) == pytest.approx((4.0 * 3072 / 2880 + 0.25) / 8)
    assert mxfp4_expert_bytes(dims, 2, 9) == pytest.approx((4.0 * 3072 / 2880 + 0.25) * (1472 / 1440) / 8)
    assert mxfp4_expert_bytes(dims, 1, 10) == 4.25 / 8  # Blackwell's FlashInfer layouts: not modelled
    # The loader's figures: 32.98 GiB a rank at TP 2 on an H200 (0.15.1), 17.22 at TP 4 on an A100
    # (0.10.1.1, Marlin), each within 0.2 GiB.
    for gpu, tp, version, logged in (("h200", 2, "0.15.1", 32.98), ("a100-80gb", 4, "0.10.1", 17.22)):
        d = Deployment(engine="vllm", engine_version=version, gpu_name=gpu, tp=tp, max_model_len=8192)
        d = d.with_(gpu_memory_bytes=gpus.find(gpu).memory_bytes)  # type: ignore[union-attr]
        w = predict(m, d).weights_bytes
        assert w is not None and abs(w / GiB - logged) < 0.2


def test_safetensors_index_total_size_wins(tmp_path: Path) -> None:
    d = tmp_path / "Meta-Llama-3.1-8B"
    d.mkdir()
    (d / "config.json").write_text((CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 16060522496}}))
    m = load_model(d)
    assert m.safetensors_total_size == 16060522496
    # SGLang's prediction takes the checkpoint's bytes, split over the ranks, plus the fp32 rotary
    # cos/sin table each rank builds beside them.
    sd = Deployment(engine="sglang", gpu_memory_bytes=H100, tp=2, max_model_len=8192)
    p = predict(m, sd)
    assert weight_extras.rope_cache(m, sd) == 131072 * 128 * 4
    assert p.weights_bytes == 16060522496 // 2 + weight_extras.rope_cache(m, sd)
    assert p.inputs["weights"] == "derived"
    # vLLM's is its loader's: the same bytes plus the rotary cache both ranks build (tests/apriori:
    # 'Model loading took 7.51 GiB' for this model at TP=2).
    v = predict(m, Deployment(gpu_memory_bytes=H100, tp=2, max_model_len=8192))
    assert v.weights_bytes is not None
    assert round(v.weights_bytes / GiB, 2) == 7.51


def test_hub_cache_dir(tmp_path: Path) -> None:
    repo = tmp_path / "models--meta-llama--Meta-Llama-3.1-8B"
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (snap / "config.json").write_text((CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    m = load_model(repo)
    assert m.name == "meta-llama/Meta-Llama-3.1-8B"
    assert m.bytes_per_token() == 131072


def test_mistral_global_window_and_use_sliding_window_false() -> None:
    cfg = raw("meta-llama--Meta-Llama-3.1-8B")
    cfg.update(model_type="mistral", sliding_window=4096)
    m = geometry_from_config(cfg)
    assert m.count("sliding") == 32 and m.bytes_per_token() == 0
    cfg["use_sliding_window"] = False
    assert geometry_from_config(cfg).count("full") == 32


def test_no_kv_heads_field_is_mha() -> None:
    cfg = raw("meta-llama--Meta-Llama-3.1-8B")
    del cfg["num_key_value_heads"]
    assert geometry_from_config(cfg).bytes_per_token() == 2 * 32 * 32 * 128 * 2


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["num_hidden_layers", "num_attention_heads"])
def test_missing_field_named(missing: str) -> None:
    cfg = raw("meta-llama--Meta-Llama-3.1-8B")
    del cfg[missing]
    with pytest.raises(ModelConfigError, match=missing):
        geometry_from_config(cfg)


def test_mla_missing_rope_named() -> None:
    cfg = raw("deepseek-ai--DeepSeek-V3")
    del cfg["qk_rope_head_dim"]
    with pytest.raises(ModelConfigError, match="qk_rope_head_dim"):
        geometry_from_config(cfg)


def test_unknown_layer_type_named() -> None:
    cfg = raw("openai--gpt-oss-120b")
    cfg["layer_types"][0] = "mystery_attention"
    with pytest.raises(ModelConfigError, match="mystery_attention"):
        geometry_from_config(cfg)


@pytest.mark.parametrize(
    ("stem", "kw", "match"),
    [
        ("meta-llama--Meta-Llama-3.1-8B", {"tp": 3}, "divisible by tensor parallel size"),
        ("microsoft--phi-4", {"tp": 4}, "10 KV heads"),
        ("meta-llama--Meta-Llama-3.1-8B", {"tp": 4, "dcp": 3}, "decode context parallel"),
        ("meta-llama--Meta-Llama-3.1-8B", {"pp": 64}, "pipeline parallel size"),
        ("meta-llama--Meta-Llama-3.1-8B", {"gpu_memory_bytes": 0}, "positive"),
        ("meta-llama--Meta-Llama-3.1-8B", {"weights_bytes": 0}, "positive"),
        ("meta-llama--Meta-Llama-3.1-8B", {"activation_bytes": -1}, "negative"),
        ("meta-llama--Meta-Llama-3.1-8B", {"kv_cache_dtype": "int3"}, "kv cache dtype"),
    ],
)
def test_refused_deployments(stem: str, kw: dict[str, Any], match: str) -> None:
    d = Deployment(**{"gpu_memory_bytes": H100, "max_model_len": 8192, **kw})
    with pytest.raises(ConfigError, match=match):
        predict(model(stem), d)


def test_gpu_catalogue() -> None:
    assert gpus.lookup("H100-SXM-80GB").memory_bytes == 81559 * MiB
    assert gpus.lookup("h100") is gpus.lookup("H100 SXM 80GB")
    assert gpus.lookup("a6000-ecc-off").memory_bytes == 49140 * MiB
    assert gpus.lookup("A6000").memory_bytes < gpus.lookup("a6000-ecc-off").memory_bytes
    with pytest.raises(ConfigError, match="unknown GPU"):
        gpus.lookup("voodoo5")


# --- deployment from an engine's log ------------------------------------------------------------


def test_deployment_from_settings() -> None:
    settings = SettingsFacts(
        version="0.11.0",
        tensor_parallel_size=2,
        kv_cache_dtype="fp8",
        max_model_len=32768,
        block_size=16,
        gpu_memory_utilization=0.9,
        model="x",
        enable_prefix_caching=False,
    )
    memory = MemoryFacts(
        total_bytes=H100,
        weights_bytes=8 * GiB,
        activation_bytes=2 * GiB,
        available_kv_bytes=50 * GiB,
    )
    d = deployment_from_settings("vllm", settings, memory)
    assert (d.engine_version, d.tp, d.kv_cache_dtype, d.max_model_len) == ("0.11.0", 2, "fp8", 32768)
    assert d.available_kv_bytes == 50 * GiB and d.gpu_memory_bytes == H100
    assert d.enable_prefix_caching is False  # the engine config line's, for a hybrid model's state blocks
    p = predict(model("meta-llama--Meta-Llama-3.1-8B"), d)
    assert p.kv_pool_blocks == 50 * GiB // (16 * 4 * 128 * 2 * 1) // 32
    d2 = deployment_from_settings(
        "sglang", SettingsFacts(mem_fraction_static=0.8), MemoryFacts(), gpu_memory_bytes=H100, tp=2
    )
    assert (d2.engine, d2.mem_fraction_static, d2.gpu_memory_bytes, d2.tp) == ("sglang", 0.8, H100, 2)
    with pytest.raises(ConfigError):
        deployment_from_settings("tgi", SettingsFacts(), MemoryFacts())


# --- engine-exact division for any config and budget ---------------------------------------------

UNIFORM = [
    stem
    for stem, _ in BYTES_PER_TOKEN
    if stem.startswith(
        ("meta-llama", "Qwen--Qwen3-32B", "microsoft", "mistralai", "deepseek-ai--DeepSeek-V3")
    )
]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(UNIFORM), st.integers(min_value=1, max_value=200 * GiB), st.sampled_from([1, 2, 8]))
def test_vllm_blocks_are_floor_division(stem: str, available: int, tp: int) -> None:
    m = model(stem)
    assume(all(layer.num_kv_heads % tp == 0 or layer.kind == "mla" for layer in m.layers))
    d = Deployment(engine="vllm", tp=tp, max_model_len=4096)
    tokens, blocks = pool_from_available(m, d, available)
    assert blocks is not None
    per_block_all_layers = m.bytes_per_token(tp) * (64 if m.is_mla else 16)
    # the pool fits and one more block would not
    assert blocks * per_block_all_layers <= available < (blocks + 1) * per_block_all_layers
    assert tokens == blocks * (64 if m.is_mla else 16)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(UNIFORM), st.integers(min_value=1, max_value=200 * GiB), st.sampled_from([1, 16, 64]))
def test_sglang_tokens_are_whole_pages(stem: str, available: int, page: int) -> None:
    m = model(stem)
    d = Deployment(engine="sglang", page_size=page, max_model_len=4096)
    tokens, _ = pool_from_available(m, d, available)
    # SGLang's own cell: bf16 K/V, except DeepSeek-V3.2's fp8 DSA default (sglang.budget.dsa_kv_elem_bytes)
    cell = sglang_budget.cell_size(m, d, 2)
    assert tokens % page == 0
    assert tokens * cell <= available < (tokens + page) * cell


def _hybrid(sliding: int, full: int) -> dict[str, Any]:
    cfg = raw("meta-llama--Meta-Llama-3.1-8B")
    cfg.update(
        num_hidden_layers=sliding + full,
        layer_types=["sliding_attention"] * sliding + ["full_attention"] * full,
        sliding_window=128,
    )
    return cfg


@pytest.mark.parametrize(
    ("version", "groups", "padding"),
    [
        # 0.11: group_size = min(12, 13) = 12 -> 1 sliding group + ceil(13 / 12) = 2 full groups
        ("0.11.0", 1 + 2, 12 * 2 - 13),
        # 0.20+: 13 < 12 x 1.5, so group_size = 13 -> 1 + 1 groups, one padding sliding layer
        ("0.20.2", 1 + 1, 13 - 12),
    ],
)
def test_vllm_hybrid_group_size_by_version(version: str, groups: int, padding: int) -> None:
    m = geometry_from_config(_hybrid(12, 13))
    p = predict(m, Deployment(engine_version=version, available_kv_bytes=GiB, max_model_len=8192))
    assert p.kv_groups == groups
    assert any(f"{padding} padding layer" in a for a in p.assumptions)


def test_weights_dtype_naming_the_checkpoints_own_scheme_counts_items() -> None:
    m = model("openai--gpt-oss-120b")
    own = predict(m, Deployment(gpu_memory_bytes=H100, max_model_len=8192))
    named = predict(m, Deployment(gpu_memory_bytes=H100, max_model_len=8192, weights_dtype="mxfp4"))
    assert named.weights_bytes == own.weights_bytes
    # a different width is a what-if over every parameter
    fp8 = Deployment(engine="sglang", gpu_memory_bytes=H100, max_model_len=8192, weights_dtype="fp8")
    what_if = predict(m, fp8)
    assert what_if.weights_bytes == m.param_count * 1 + weight_extras.rope_cache(m, fp8)
    # vLLM's loader keeps the embeddings and head in 16 bits whatever the linears' width.
    vllm_fp8 = predict(m, Deployment(gpu_memory_bytes=H100, max_model_len=8192, weights_dtype="fp8"))
    assert m.param_count < vllm_fp8.weights_bytes < m.param_count * 1.1


def test_sglang_all_sliding_model_has_a_pool() -> None:
    cfg = raw("meta-llama--Meta-Llama-3.1-8B")
    cfg.update(model_type="mistral", sliding_window=4096)
    m = geometry_from_config(cfg)
    tokens, _ = pool_from_available(m, Deployment(engine="sglang", max_model_len=8192), 1000 * 131072)
    assert tokens == 1000


def test_vllm_mixed_page_sizes_unify_by_block_size() -> None:
    """Gemma-4-26B-A4B: a full layer's page (2 KV heads x 512) is half a sliding layer's (8 x 256),
    so vLLM gives the full layers 32-token blocks of the sliding page (unify_kv_cache_spec_page_size,
    0.25.1 v1/core/kv_cache_utils.py:1049-1094), not a padded 16-token one. sostrowsk/dgx-spark-local-llm's
    NVFP4 startup on a GB10 (tests/apriori/public/vllm): 'Available KV cache memory: 84.68 GiB',
    'GPU KV cache size: 3,912,140 tokens', 'Maximum concurrency for 262,144 tokens per request:
    14.92x', at the 2,496 batched tokens its log resolves."""
    d = Deployment(
        engine="vllm",
        engine_version="0.25.1",
        available_kv_bytes=int(84.68 * GiB),
        max_model_len=262144,
        max_num_batched_tokens=2496,
    )
    p = predict(model("google--gemma-4-26B-A4B"), d)
    assert p.exact and not any("page sizes" in a for a in p.assumptions)
    assert f"{p.max_concurrency:.2f}" == "14.92"
    assert abs(p.kv_pool_tokens - 3_912_140) / 3_912_140 < 0.0005  # the GiB figure's rounding
    # Its log's 2,496 batched tokens are the release's own default for this model: 0.22+ raise a
    # multimodal prefix LM's to its largest item, Gemma-4's 32-frame video (engine/arg_utils.py:2630-2650).
    defaults = {k: v for k, v in d.__dict__.items() if k != "max_num_batched_tokens"}
    resolved = predict(model("google--gemma-4-26B-A4B"), Deployment(**defaults))
    assert resolved.kv_pool_tokens == p.kv_pool_tokens
    older = predict(model("google--gemma-4-26B-A4B"), Deployment(**{**defaults, "engine_version": "0.21.0"}))
    assert older.max_concurrency > p.max_concurrency  # 2,048 tokens: fewer sliding-window blocks a request


def test_engine_printed_negative_budget_gives_no_blocks() -> None:
    p = predict(model("Qwen--Qwen2.5-7B"), Deployment(available_kv_bytes=-5, max_model_len=4096))
    assert (p.kv_pool_blocks, p.kv_pool_tokens, p.max_concurrency, p.fits) == (0, 0, 0.0, False)
    assert p.failure is not None and p.failure.startswith("No available memory")


def test_deployment_from_a_parsed_v0_log_reproduces_its_budget() -> None:
    """vllm/016: Qwen2.5-7B on an 8 GB RTX 4060 at 0.70: KV budget -1.05 GiB, 0 blocks, 0.00x."""
    from kvwatch.sources.pipeline import replay

    log = Path(__file__).parent / "log_samples" / "vllm" / "016-v0-rtx4060-cuda-blocks-zero-negative-kv.log"
    (snap,) = replay([str(log)]).snapshots()
    memory = replace(snap.memory, available_kv_bytes=None)
    d = deployment_from_settings("vllm", snap.settings, memory, engine_version="0.7.3", max_model_len=4096)
    p = predict(model("Qwen--Qwen2.5-7B"), d)
    # requested - weights - non-torch - activation peak, each as the log printed it
    assert snap.memory.available_kv_bytes is not None
    assert abs(p.available_kv_bytes - snap.memory.available_kv_bytes) <= 1
    assert round(p.available_kv_bytes / GiB, 2) == -1.05
    assert (p.kv_pool_blocks, f"{p.max_concurrency:.2f}") == (snap.pools["full"].blocks, "0.00")
    assert p.inputs["activation"] == "given"


BAD_VALUES = st.sampled_from([None, "x", -1, 0, 1.5, [], {}, True, 10**12, [1, "a"], {"no_op": 1}])


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([s for s, _ in BYTES_PER_TOKEN]), st.data(), BAD_VALUES)
def test_any_mangled_field_is_a_one_line_error_or_a_prediction(
    stem: str, data: st.DataObject, bad: Any
) -> None:
    cfg = raw(stem)
    target = cfg.get("text_config", cfg)
    key = data.draw(st.sampled_from(sorted(target)))
    target[key] = bad
    try:
        m = geometry_from_config(cfg)
        for engine in ("vllm", "sglang"):
            predict(m, Deployment(engine=engine, gpu_memory_bytes=H100, max_model_len=4096))
    except (ModelConfigError, ConfigError) as exc:
        assert "\n" not in str(exc)


def test_broken_safetensors_index_falls_back_to_estimate(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    m = load_model(tmp_path)
    assert m.safetensors_total_size is None
    assert any("model.safetensors.index.json" in n for n in m.notes)


def test_max_model_len_beyond_positions_is_noted() -> None:
    m = model("Qwen--Qwen3-8B")  # max_position_embeddings 40960, no rope scaling
    p = predict(m, Deployment(available_kv_bytes=GiB, max_model_len=131072))
    assert any("exceeds max_position_embeddings" in a for a in p.assumptions)


def test_sglang_budget_from_its_own_load_weight_figures() -> None:
    """rest = free_after_weights - free_before_weights x (1 - mem_fraction_static), as profile_max_num_token."""
    m = model("meta-llama--Meta-Llama-3.1-8B")
    memory = MemoryFacts(avail_after_weights_bytes=int(63.48 * GiB), weights_bytes=int(15.10 * GiB))
    d = deployment_from_settings(
        "sglang", SettingsFacts(mem_fraction_static=0.835, max_model_len=8192), memory
    )
    p = predict(m, d)
    before = int(63.48 * GiB) + int(15.10 * GiB)
    expected = int(63.48 * GiB) - (before - int(before * 0.835))
    assert p.available_kv_bytes == expected
    assert p.kv_pool_tokens == expected // (2 * 32 * 8 * 128 * 2)
    assert p.inputs["free_after_weights"] == "given"


@pytest.mark.parametrize("version", ["0.5.9", "0.5.10"])
def test_sglang_hybrid_swa_split_by_memory_from_059(version: str) -> None:
    """0.5.9 mixin:251-335: full = tokens x (F + S) / (F + r x S), by bytes, not layer counts; it
    differs from the old layer-count share where a full and a window layer cost different bytes
    (Gemma-4: 2 x 512 global heads against 8 x 256 window heads)."""
    m = model("google--gemma-4-26B-A4B")
    d = Deployment(engine="sglang", engine_version=version, max_model_len=8192)
    full = budget.cell_size(m, d, 2)
    swa = budget.all_layer_cell_size(m, d, 2) - full
    assert full != swa * m.count("full") / max(m.count("sliding"), 1)
    available = 40 * GiB
    base = available // (full + swa)
    assert budget.pool(m, d, 2, available).tokens == int(base * (full + swa) / (full + 0.8 * swa))


@pytest.mark.parametrize(("version", "padding_slot"), [("0.5.16", False), ("0.5.17", True)])
def test_sglang_keeps_whole_request_states_for_a_hybrid_model(version: str, padding_slot: bool) -> None:
    """Qwen3-Next at TP 4: 36 GDN layers of (8192 / 4 x 3 conv in bf16 + 8 x 128 x 128 recurrent in
    fp32) = 2,801,664 B a request; 0.9 / 1.9 of the budget holds whole slots (one more for the
    pool's padding from 0.5.17) and the KV cache gets the rest."""
    m = model("Qwen--Qwen3-Next-80B-A3B-Thinking")
    d = Deployment(engine="sglang", engine_version=version, tp=4, max_model_len=8192)
    per_req = states.state_bytes_per_request(m, d)
    assert per_req == 36 * (8192 // 4 * 3 * 2 + 8 * 128 * 128 * 4)
    available = 40 * GiB
    share = available * 0.9 / 1.9
    slots = int((share - per_req) // per_req) + 1 if padding_slot else int(share // per_req)
    cell = budget.cell_size(m, d, 2)
    assert budget.pool(m, d, 2, available).tokens == (available - slots * per_req) // cell


def test_sglang_dp_attention_weights_split_attention_over_attn_tp_and_keep_the_embedding_whole() -> None:
    """--enable-dp-attention --dp 8 at TP 8: attention over attn_tp = 1 and a whole embedding on
    every rank (VocabParallelEmbedding(enable_tp=not is_dp_attention_enabled())), experts still 1/8;
    the MLA up-projection's per-head copies (w_kc, w_vc) follow the attention split too."""
    m = model("deepseek-ai--DeepSeek-V3")
    d = Deployment(
        engine="sglang", engine_version="0.5.9", tp=8, gpu_memory_bytes=143771 * MiB, max_model_len=8192
    )
    plain = predict(m, d)
    dp = predict(m, d.with_(dp=8, dp_attention=True))
    attention, embed = weight_bytes_of(m, ATTENTION), weight_bytes_of(m, EMBED)
    extra = int(attention - attention / 8) + int(embed - embed / 8)
    dp_d = d.with_(dp=8, dp_attention=True)
    copies = weight_extras.mla_up_proj_copies(m, dp_d) - weight_extras.mla_up_proj_copies(m, d)
    assert copies == 7 * weight_extras.mla_up_proj_copies(m, d)  # attn_tp 8 -> 1: whole on each rank
    assert dp.weights_bytes - plain.weights_bytes == extra + copies  # type: ignore[operator]
    assert dp.bytes_per_token == plain.bytes_per_token  # an MLA latent is not split by heads


def test_sglang_up_to_053_keeps_512_fixed_state_slots_for_a_gdn_model() -> None:
    """0.5.2/0.5.3 (model_runner.py:308-325): radix cache off, max_mamba_cache_size 512 slots, the
    KV cache gets the rest -- the Qwen3-Next TP 4 startup on 0.5.2 (sglang#10407) logs 2,896,645
    tokens."""
    m = model("Qwen--Qwen3-Next-80B-A3B-Thinking")
    d = Deployment(engine="sglang", engine_version="0.5.2", tp=4, max_model_len=8192)
    per_req = states.state_bytes_per_request(m, d)
    available = 40 * GiB
    assert budget.pool(m, d, 2, available).tokens == (available - 512 * per_req) // budget.cell_size(m, d, 2)


@pytest.mark.parametrize(
    ("version", "gpu_mib", "tp", "dp_attention", "value"),
    [
        ("0.4.3", 81559, 8, False, 0.81),  # the table by TP (0.4.3.post4 server_args.py:203-214)
        ("0.4.6", 143771, 8, False, (143771 - 13 * 1024) / 143771),  # card - 13 GiB above 80 GiB
        ("0.4.7", 183359, 8, False, 0.79),  # above 180 GB
        ("0.4.7", 143771, 8, False, min(0.88 + 48 * 1024 * 0.12 / 143771, (143771 - 18 * 1024) / 143771)),
        (
            "0.5.2",
            143771,
            8,
            True,
            round((143771 - (12 + 4) * 1024 - 4 * 1024) / 143771, 3),
        ),  # DP attention +4 GiB
    ],
)
def test_sglang_default_fraction_before_053_per_release(
    version: str, gpu_mib: int, tp: int, dp_attention: bool, value: float
) -> None:
    d = Deployment(
        engine="sglang",
        engine_version=version,
        gpu_memory_bytes=gpu_mib * MiB,
        tp=tp,
        dp=8 if dp_attention else 1,
        dp_attention=dp_attention,
    )
    assert default_mem_fraction_static(d).value == pytest.approx(value)


@pytest.mark.parametrize(("version", "fixed"), [("0.5.6", True), ("0.5.9", False)])
def test_sglang_mamba2_models_keep_fixed_slots_while_the_radix_cache_is_off(
    version: str, fixed: bool
) -> None:
    """Nemotron-H (Mamba2): radix cache off and 512 state slots up to 0.5.6 (0.5.4 model_runner.py:402-405)."""
    m = model("nvidia--Nemotron-H-56B-Base-8K")
    d = Deployment(engine="sglang", engine_version=version, tp=4, max_model_len=8192)
    per_req = states.state_bytes_per_request(m, d)
    available = 40 * GiB
    tokens = budget.pool(m, d, 2, available).tokens
    assert (tokens == (available - 512 * per_req) // budget.cell_size(m, d, 2)) is fixed


def _bnb_qwen(skip: list[str] | None) -> Any:
    """Qwen2.5-7B as a bitsandbytes 4-bit checkpoint, with an Unsloth-style skip list."""
    cfg = raw("Qwen--Qwen2.5-7B")
    quant: dict[str, Any] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    if skip is not None:
        quant["llm_int8_skip_modules"] = skip
    cfg["quantization_config"] = quant
    return geometry_from_config(cfg)


def test_bnb_skip_modules_stay_16_bit_on_their_own_stage() -> None:
    """vLLM gives every linear llm_int8_skip_modules names UnquantizedLinearMethod (0.8.5
    quantization/bitsandbytes.py:123-145): the skipped layer's MLP loads in bf16 on the PP stage
    holding that layer; an HF-only projection name ('gate_proj', fused to gate_up_proj in vLLM)
    matches nothing."""
    from kvwatch.engines.vllm.weights import weights_per_stage

    d = Deployment(engine="vllm", engine_version="0.8.5", pp=2, max_model_len=4096)
    base = weights_per_stage(_bnb_qwen(None).dims, d, None)[0]
    # vllm#12974's example list (unsloth/DeepSeek-R1-Distill-Llama-8B-unsloth-bnb-4bit).
    pr = ["lm_head", "multi_modal_projector", "merger", "modality_projection", "model.layers.1.mlp"]
    one = weights_per_stage(_bnb_qwen(pr).dims, d, None)[0]
    mlp = 3 * 3584 * 18944  # gate, up, down of one Qwen2.5-7B layer, no biases
    assert one[1] == base[1]
    assert one[0] - base[0] == pytest.approx(mlp * (2 - (0.5 + 2 / 64)), abs=2)
    late = weights_per_stage(_bnb_qwen(["model.layers.20.mlp"]).dims, d, None)[0]
    assert late[0] == base[0] and late[1] - base[1] == one[0] - base[0]
    assert weights_per_stage(_bnb_qwen(["gate_proj"]).dims, d, None)[0] == base
    every = weights_per_stage(_bnb_qwen(["mlp"]).dims, d, None)[0]
    assert sum(every) - sum(base) == pytest.approx(28 * (one[0] - base[0]), abs=60)
    # The checkpoint-level count agrees.
    from kvwatch.capacity.weights import weight_bytes

    assert weight_bytes(_bnb_qwen(pr))[0] - weight_bytes(_bnb_qwen(None))[0] == pytest.approx(
        mlp * (16 - 4.5) / 8, abs=2
    )


def test_bnb_4bit_profile_holds_a_dequantised_shard() -> None:
    """bitsandbytes' matmul_4bit dequantises the shard's weight to bf16 for a multi-row input
    (0.45.5 autograd/_functions.py:462, :521-533); vLLM calls it per output shard and copies the
    result into the layer's output (0.8.5 quantization/bitsandbytes.py:320-375)."""
    from kvwatch.engines.vllm.memory import activation

    dims = _bnb_qwen(None).dims
    # The first of two PP stages runs the forward only (the last one's sampler can hide it).
    d = Deployment(engine="vllm", engine_version="0.8.5", pp=2, max_model_len=4096)
    bnb = activation(dims, d, None, 256, 2048)[0].bytes
    awq = activation(replace(dims, quant_method="awq"), d, None, 256, 2048)[0].bytes
    assert bnb - awq == (18944 * 3584 + 18944 * 2048) * 2


# --- vision towers: the patch merger(s) of Qwen2.5-VL / Qwen3-VL --------------------------------
PUBLIC_CONFIGS = Path(__file__).parent / "apriori" / "public" / "configs"


def test_qwen3_vl_tower_counts_its_mergers_patch_and_position_tables() -> None:
    # Qwen3-VL-30B-A3B's vision_config: 27 blocks of 1152 (GELU MLP of 4304), merge 2 -> the
    # merger's width 1152 x 4 = 4608, out 2048, 3 deepstack mergers beside the final one
    # (SGLang 0.5.5.post3 models/qwen3_vl.py:182-219, 251-293), Conv3d 3 x 2 x 16 x 16 x 1152,
    # 2304 learned positions.
    cfg = json.loads((PUBLIC_CONFIGS / "Qwen--Qwen3-VL-30B-A3B-Instruct.json").read_text())
    blocks = 27 * (4 * 1152 * 1152 + 2 * 1152 * 4304)
    mergers = 4 * (4608 * 4608 + 4608 * 2048)
    assert tower_params(cfg, 2048) == blocks + mergers + 3 * 2 * 16 * 16 * 1152 + 2304 * 1152


def test_qwen3_vl_30b_weights_land_on_sglangs_load_weight_end() -> None:
    # sglang-repos cases: 'Load weight end. ... mem usage=58.15 GB' (A100) and 58.22 GB (B200) for
    # Qwen3-VL-30B-A3B-Instruct at TP 1; a tower counted as blocks + one H x text-hidden projection
    # came to 57.77 GiB, 0.38 GiB (and 8 % of the A100's 2.8 GiB pool) short.
    m = load_model(PUBLIC_CONFIGS / "Qwen--Qwen3-VL-30B-A3B-Instruct.json")
    d = Deployment(
        engine="sglang", engine_version="0.5.5.post3", gpu_memory_bytes=80 * GiB, max_model_len=40960
    )
    weights_bytes = predict(m, d).weights_bytes
    assert weights_bytes is not None
    weights = weights_bytes / GiB
    assert 58.15 * 0.995 < weights < 58.22


def test_a_tower_without_a_patch_merger_keeps_one_projection() -> None:
    cfg: dict[str, Any] = {
        "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27}
    }
    assert tower_params(cfg, 2560) == 27 * (4 * 1152 * 1152 + 2 * 1152 * 4304) + 1152 * 2560


def test_mamba2_conv_state_widens_groups_tp_does_not_divide() -> None:
    """Granite-4-hybrid spellings (mamba_n_heads, mamba_d_head, mamba_d_state, mamba_n_groups) and
    one B/C group: at TP 2 both engines take tp - n_groups groups more so each head shard keeps its
    group (vLLM layers/mamba/mamba_utils.py:174-177 @0.25.1; SGLang configs/mamba_utils.py:219)."""
    cfg = {
        "mamba_n_heads": 128,
        "mamba_d_head": 64,
        "mamba_d_state": 128,
        "mamba_n_groups": 1,
        "mamba_d_conv": 4,
    }
    layer = state_layer(cfg, "mamba")
    d_inner = 128 * 64
    assert layer.conv_channels(1) == d_inner + 2 * 1 * 128
    assert layer.conv_channels(2) == (d_inner + 2 * 2 * 128) // 2
    assert layer.state_bytes(2, 2) == (d_inner + 4 * 128) // 2 * 3 * 2 + 64 * 64 * 128 * 2
    # Nemotron-H's 8 groups divide TP 8: nothing added.
    nemo = state_layer(raw("nvidia--Nemotron-H-56B-Base-8K"), "mamba")
    assert nemo.conv_channels(8) == nemo.state_conv_channels // 8


@pytest.mark.parametrize(("version", "fp32"), [("0.19.0", False), ("0.20.0", True), ("0.25.1", True)])
def test_vllm_nemotron_h_ssm_state_dtype_by_release(version: str, fp32: bool) -> None:
    """NemotronHForCausalLMConfig: config.json's mamba_ssm_cache_dtype, else float16 up to 0.19
    (0.19.0 model_executor/models/config.py:494) and float32 from 0.20 (0.20.0 :410)."""
    m = model("nvidia--Nemotron-H-56B-Base-8K")
    mamba = next(layer for layer in m.layers if layer.kind == "mamba")
    d = Deployment(engine_version=version, tp=8, max_model_len=8192, available_kv_bytes=20 * GiB)
    p = predict(m, d)
    state = mamba.state_bytes(8, 2, ssm_fp32=fp32)
    assert p.block_size == 16 * -(-state // (16 * 512))
    named = geometry_from_config(
        {**raw("nvidia--Nemotron-H-56B-Base-8K"), "mamba_ssm_cache_dtype": "float32"}
    )
    assert predict(named, replace(d, engine_version="0.19.0")).block_size == 16 * -(
        -mamba.state_bytes(8, 2, ssm_fp32=True) // (16 * 512)
    )


@pytest.mark.parametrize(("version", "fits"), [("0.18.0", True), ("0.19.0", False)])
def test_vllm_fit_check_reads_a_gdn_models_first_group_in_014_to_018(version: str, fits: bool) -> None:
    """Qwen3.5's layer 0 is Gated DeltaNet, so its first KV cache group is a state group (vLLM groups
    same-spec layers in order of first appearance, 0.18.0 v1/core/kv_cache_utils.py:956-1040): the
    0.14-0.18 check (group 0's blocks only, :1329-1362) asks one state block of 10 layers, which 2 GiB
    holds; 0.19 sums every group (0.19.0 :1332-1367): 249 attention blocks + 3 state groups x 1."""
    m = model("Qwen--Qwen3.5-35B-A3B")
    d = Deployment(engine_version=version, max_model_len=262144, available_kv_bytes=2 * GiB)
    p = predict(m, d)
    assert p.block_size == 1056
    assert p.fits is fits
    page = 1056 * 2 * 256 * 2 * 2
    assert p.needed_kv_bytes == 10 * page * (1 if fits else -(-262144 // 1056) + 3)
