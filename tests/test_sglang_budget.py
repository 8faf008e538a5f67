"""SGLang's sizing rules, one release at a time, as its source writes them (file:line in budget.py).

Each figure is the engine's own arithmetic worked by hand from the release's source; the real
startups that exercise them are tests/test_accuracy_sglang.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvwatch.analysis.predict import predict
from kvwatch.capacity.deployment import Deployment, deployment_from_settings
from kvwatch.capacity.geometry import load_model
from kvwatch.capacity.model import LayerSpec, ModelGeometry
from kvwatch.capacity.weights import weights_per_rank
from kvwatch.core.units import GiB, MiB
from kvwatch.engines.sglang import budget, calibration, request_table, states, weight_extras
from kvwatch.state.facts import MemoryFacts, SettingsFacts

CONFIGS = Path(__file__).parent / "model_configs"
H100_MIB, H20_MIB, B200_MIB = 81559, 97871, 183359


def _model(stem: str) -> ModelGeometry:
    return load_model(CONFIGS / f"{stem}.json")


def _sglang(version: str, gpu: str | None = None, mib: int = H100_MIB, **kw: object) -> Deployment:
    return Deployment(
        engine="sglang", engine_version=version, gpu_name=gpu, gpu_memory_bytes=mib * MiB
    ).with_(**kw)  # type: ignore[arg-type]


def test_dp_attention_splits_kv_heads_over_tp_over_dp() -> None:
    m = _model("meta-llama--Meta-Llama-3.1-70B")  # 8 KV heads x 128, 80 layers
    plain = _sglang("0.5.9", tp=8)
    dp = _sglang("0.5.9", tp=8, dp=8, dp_attention=True)
    assert budget.attention_tp(dp) == 1
    assert budget.cell_size(m, plain, 2) == 1 * 128 * 2 * 80 * 2
    assert budget.cell_size(m, dp, 2) == 8 * 128 * 2 * 80 * 2
    # --dp-size without DP attention replicates whole engines: the attention group stays tp.
    assert budget.attention_tp(_sglang("0.5.9", tp=8, dp=8)) == 8


def test_dp_attention_reserve_in_the_default_fraction() -> None:
    # 0.5.4 server_args.py:764-799 on a B200 (>= 160 GiB: chunk 16384, graphs 512), tp 8, dp 8.
    d = _sglang("0.5.4", "B200-180GB", B200_MIB, tp=8, dp=8, dp_attention=True)
    frac = budget.default_mem_fraction_static(d)
    assert frac.reserved_mb == 512 + 16384 * 1.5 + 512 * 2 + 8 / 8 * 1024 + 512 * 8 * 3 + 512 * 8 * 1.5
    assert frac.value == round((B200_MIB - frac.reserved_mb) / B200_MIB, 3) == 0.751
    # 0.4.8 - 0.5.2: a flat 4 GiB more.
    old = budget.default_mem_fraction_static(
        _sglang("0.5.2", "B200-180GB", B200_MIB, tp=8, dp=8, dp_attention=True)
    )
    assert old.reserved_mb == 36 * 1024


def test_reserve_table_from_0_4_8() -> None:
    # 0.4.8.post1 server_args.py:287-314: the reserve by card size replaces the table by tp.
    assert budget.default_mem_fraction_static(
        _sglang("0.4.8.post1", "H20-96GB", H20_MIB, tp=4)
    ).value == round((H20_MIB - 14 * 1024) / H20_MIB, 3)
    # 0.4.7 (server_args.py:253-283): above 96 GiB, 48 GiB x (1 - f) more, 18 GiB reserve at most.
    h200 = budget.default_mem_fraction_static(_sglang("0.4.7", "H200-SXM-141GB", 143771, tp=4)).value
    assert h200 == min(0.88 + 48 * 1024 * 0.12 / 143771, (143771 - 18 * 1024) / 143771)
    # Over 80 GiB but under 96 GiB: 0.88 whatever the TP.
    assert budget.default_mem_fraction_static(_sglang("0.4.7", "H20-96GB", H20_MIB, tp=4)).value == 0.88
    assert budget.default_mem_fraction_static(_sglang("0.4.7", "B200-180GB", B200_MIB, tp=8)).value == 0.79
    # 0.4.6 (server_args.py:224-238): above 80 GiB a 13 GiB reserve; the table by tp below.
    assert (
        budget.default_mem_fraction_static(_sglang("0.4.6", "H20-96GB", H20_MIB)).value
        == (H20_MIB - 13312) / H20_MIB
    )
    assert budget.default_mem_fraction_static(_sglang("0.4.6", "H100-SXM-80GB", tp=4)).value == 0.85


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.5.4", (2048, 16)),  # 0.5.4 server_args.py:685-697
        ("0.5.5", (2048, 24)),  # 0.5.5 server_args.py:707-719: the first release with 24
        ("0.5.9", (2048, 24)),
        ("0.5.19", (2048, 24)),
        ("0.5.20", (4096, 48)),
    ],
)
def test_small_card_tiers_per_release(version: str, expected: tuple[int, int]) -> None:
    assert budget.gpu_defaults(24564, 1, version) == expected


def test_prefill_graph_reserve_from_0_5_10() -> None:
    assert [budget.piecewise_capture_sizes(n) for n in (2048, 4096, 8192, 16384)] == [42, 50, 58, 74]
    qwen = load_model(Path(__file__).parent / "apriori" / "configs" / "Qwen--Qwen3-0.6B.json")
    new = budget.default_mem_fraction_static(_sglang("0.5.23", "H100-SXM-80GB"), qwen)
    # 512 + 8192 x 1.5 + 128 + 256 x 2 + 58 x 8: the 0.83 SGLang printed (sglang PR #39713, a
    # build of 2026-09-16 between 0.5.19 and 0.5.20, whose memory_hook.py has the same terms).
    assert new.reserved_mb == 13904 and new.value == 0.83
    assert budget.default_mem_fraction_static(_sglang("0.5.9", "H100-SXM-80GB"), qwen).value == 0.835
    # MLA reserves 1.5 GiB; DP attention turns the graphs off before sizing (0.5.10 - 0.5.22).
    v3 = _model("deepseek-ai--DeepSeek-V3")
    assert budget.piecewise_reserved(v3, _sglang("0.5.15", "H200-SXM-141GB", tp=8), 8192) == 1536
    assert (
        budget.piecewise_reserved(
            v3, _sglang("0.5.15", "H200-SXM-141GB", tp=8, dp=8, dp_attention=True), 8192
        )
        == 0
    )


def test_card_size_is_nvidia_smi_s() -> None:
    # The heuristic reads nvidia-smi's total (81559 MiB on an H100), not torch's (79.19 GiB).
    d = Deployment(
        engine="sglang", engine_version="0.5.9", gpu_name="H100-SXM-80GB", gpu_memory_bytes=int(79.19 * GiB)
    )
    assert budget.gpu_mem_mib(d) == H100_MIB


def test_vision_tower_scales_the_default_fraction() -> None:
    kimi = _model("moonshotai--Kimi-K2.5")
    d = _sglang("0.5.8.post1", mib=288 * 1024, tp=8)
    # 512 + 16384 x 1.5 + 1024 + 512 x 2 = 27136 -> 0.908, x 0.95 x (1 - 0.1 x (27 x 1152^2 /
    # (24 x 1024^2) - 1)) for MoonViT's 27 layers of width 1152: the 0.8260405859375 that SGLang's
    # server_args dump printed for this deployment (tests/apriori/public/sglang, sgl-ajith-kimi-k25).
    assert budget.vlm_factor(kimi) == pytest.approx(0.95 * (1 - 0.1 * (27 * 1152**2 / (24 * 1024**2) - 1)))
    assert budget.default_mem_fraction_static(d, kimi).value == pytest.approx(0.8260405859375)
    assert budget.default_mem_fraction_static(d).value == 0.908
    # 0.4.8's model runner scales any fraction by 0.90; 0.4.3's by 0.95.
    assert budget.vlm_runtime_factor(kimi, _sglang("0.4.8.post1")) == 0.90
    assert budget.vlm_runtime_factor(kimi, _sglang("0.4.6")) == 0.90
    assert budget.vlm_runtime_factor(kimi, _sglang("0.4.3.post4")) == 0.95
    assert budget.vlm_runtime_factor(kimi, _sglang("0.4.4")) == 0.95  # 0.4.4 model_runner.py:243
    assert budget.vlm_runtime_factor(kimi, _sglang("0.4.5")) == 0.90  # 0.4.5 model_runner.py:273-274
    assert budget.vlm_runtime_factor(kimi, _sglang("0.5.2")) == 1.0


def test_dp_attention_weights_not_split() -> None:
    v3 = _model("deepseek-ai--DeepSeek-V3")
    d = _sglang("0.5.6", mib=288 * 1024, tp=8, dp=8, dp_attention=True)
    embed = v3.params["embeddings"] * 2  # bf16
    attention = v3.params["attention"] * 1  # fp8
    assert weight_extras.dp_attention_weights_extra(v3, d) == pytest.approx(
        embed * 7 / 8 + attention * 7 / 8, rel=1e-6
    )
    assert weight_extras.dp_attention_weights_extra(v3, _sglang("0.5.6", tp=8)) == 0
    # Llama keeps its QKV over the full TP group (layers/linear.py:809-812): the embedding only;
    # Qwen3's attention is built over attn_tp (models/qwen3.py:102-111).
    llama = _model("meta-llama--Meta-Llama-3.1-70B")
    qwen = _model("Qwen--Qwen3-32B")
    dp = _sglang("0.5.6", tp=8, dp=8, dp_attention=True)
    assert weight_extras.dp_attention_weights_extra(llama, dp) == pytest.approx(
        llama.params["embeddings"] * 2 * 7 / 8, rel=1e-6
    )
    q_embed, q_attn = qwen.params["embeddings"] * 2, qwen.params["attention"] * 2
    assert weight_extras.dp_attention_weights_extra(qwen, dp) == pytest.approx(
        (q_embed + q_attn) * 7 / 8, rel=1e-6
    )


# DeepSeek-V3's kv_b_proj: kv_lora_rank 512 x 128 heads x (qk_nope 128 + v_head 128), 61 layers.
V3_KV_B = 512 * 128 * (128 + 128) * 61


@pytest.mark.parametrize(
    ("version", "gpu", "tp", "dp", "expected"),
    [
        # 0.5.6 deepseek_v2.py:3584-3602: CUDA dequantises the fp8 128 x 128 blocks to bf16 for
        # w_kc / w_vc (:3653-3657), split over attention TP: 1 under DP attention, 8 without.
        ("0.5.6", "B200-180GB", 8, 8, V3_KV_B * 2),
        ("0.5.6", "B200-180GB", 8, 1, V3_KV_B * 2 // 8),
        # 0.4.6 :1553-1566 kept them fp8 (block_quant_to_tensor_quant); so does ROCm in every release.
        ("0.4.6", "H200-SXM-141GB", 8, 1, V3_KV_B // 8),
        ("0.4.8.post1", "MI300X-192GB", 8, 8, V3_KV_B),
    ],
)
def test_mla_keeps_per_head_copies_of_kv_b_proj(
    version: str, gpu: str, tp: int, dp: int, expected: int
) -> None:
    v3 = _model("deepseek-ai--DeepSeek-V3")
    d = _sglang(version, gpu, tp=tp, dp=dp, dp_attention=dp > 1)
    assert weight_extras.mla_up_proj_copies(v3, d) == expected
    # No MLA, no copies.
    assert weight_extras.mla_up_proj_copies(_model("meta-llama--Meta-Llama-3.1-70B"), d) == 0


def test_mla_copies_of_an_unquantised_kv_b_are_bf16() -> None:
    # Kimi-K2.5 quantises only its routed experts (int4): kv_b_proj is bf16, copied as it is
    # (0.5.6 deepseek_v2.py:3542, :3653-3657); 64 heads.
    kimi = _model("moonshotai--Kimi-K2.5")
    d = _sglang("0.5.8", tp=8)
    assert weight_extras.mla_up_proj_copies(kimi, d) == 512 * 64 * (128 + 128) * 61 * 2 // 8


# DeepSeek-V3.2's indexer per layer: wq_b 1536 x 64 x 128, wk 7168 x 128 (fp8), weights_proj 7168 x 64.
V32_INDEXER = 1536 * 64 * 128 + 7168 * 128
V32_GATE = 7168 * 64


@pytest.mark.parametrize(
    ("version", "dp", "expected"),
    [
        # TP 8 without DP attention: the count splits the indexer by 8, nsa_indexer.py:133-156 keeps it
        # whole; weights_proj in bf16 up to 0.5.5, fp32 from 0.5.6 (:148-155).
        ("0.5.4", 1, (V32_INDEXER * 7 / 8 + V32_GATE * (2 - 1 / 8)) * 61),
        ("0.5.6", 1, (V32_INDEXER * 7 / 8 + V32_GATE * (4 - 1 / 8)) * 61),
        # DP attention (attention TP 1): the count already holds it whole, only the gate's width is off.
        ("0.5.6", 8, V32_GATE * (4 - 1) * 61),
    ],
)
def test_dsa_indexer_is_replicated(version: str, dp: int, expected: float) -> None:
    v32 = _model("deepseek-ai--DeepSeek-V3.2")
    d = _sglang(version, "B200-180GB", tp=8, dp=dp, dp_attention=dp > 1)
    assert weight_extras.dsa_indexer_replicas(v32, d) == int(expected)
    assert weight_extras.dsa_indexer_replicas(_model("deepseek-ai--DeepSeek-V3"), d) == 0


def test_moe_routers_are_replicated() -> None:
    # MoEGate's weight is a plain Parameter on every rank (0.5.6 deepseek_v2.py:523-525), bf16.
    v3 = _model("deepseek-ai--DeepSeek-V3")
    router = 58 * 256 * 7168 * 2
    assert v3.params["router"] == 58 * 256 * 7168
    assert weight_extras.router_replicas(v3, _sglang("0.5.6", tp=8)) == int(router * 7 / 8)
    assert weight_extras.router_replicas(v3, _sglang("0.5.6", tp=1)) == 0
    assert (
        weight_extras.router_replicas(_model("meta-llama--Meta-Llama-3.1-70B"), _sglang("0.5.6", tp=8)) == 0
    )


def test_predicted_weights_carry_what_sglang_holds_beyond_the_checkpoint() -> None:
    # DeepSeek-V3.2 on 8 x B200, DP attention (PR#11309's deployment): the weights SGLang's budget
    # subtracts are the even split plus the unsplit embedding and attention, the routers, the
    # indexer and the w_kc / w_vc copies -- each its own rule above.
    v32 = _model("deepseek-ai--DeepSeek-V3.2")
    d = _sglang("0.5.4", "B200-180GB", B200_MIB, tp=8, dp=8, dp_attention=True)
    p = predict(v32, d)
    split = weights_per_rank(v32, 8, 1).per_rank_bytes
    extras = (
        weight_extras.dp_attention_weights_extra(v32, d)
        + weight_extras.router_replicas(v32, d)
        + weight_extras.dsa_indexer_replicas(v32, d)
        + weight_extras.mla_up_proj_copies(v32, d)
        + weight_extras.rope_cache(v32, d)
    )
    assert weight_extras.mla_up_proj_copies(v32, d) == 512 * 128 * 256 * 61 * 2
    assert p.weights_bytes == split + extras
    assert any("w_kc" in a for a in p.assumptions)


def _hybrid(full: LayerSpec, sliding: LayerSpec, n: int) -> ModelGeometry:
    return ModelGeometry(
        name="hybrid",
        architecture="TestForCausalLM",
        model_type="test",
        dtype="bfloat16",
        dtype_bytes=2,
        layers=(full, sliding) * n,
        hidden_size=1024,
        num_attention_heads=8,
        vocab_size=1000,
        max_position_embeddings=4096,
        params={},
        quantization=None,
    )


def test_swa_split_per_release() -> None:
    # Full layers 8 KV heads, window layers 2 (F = 4 S): only the memory-based split of 0.5.9+
    # gives the window pool its bytes' worth.
    m = _hybrid(LayerSpec("full", 8, 128, 128), LayerSpec("sliding", 2, 128, 128, window=1024), 4)
    f, s = 4 * 8 * 128 * 2 * 2, 4 * 2 * 128 * 2 * 2
    available = 10 * GiB
    old = budget.pool(m, _sglang("0.5.8"), 2, available).tokens
    mid = budget.pool(m, _sglang("0.5.9"), 2, available).tokens
    new = budget.pool(m, _sglang("0.5.11"), 2, available).tokens
    base = available // (f + s)
    assert old == int(base * 8 / (0.8 * 4 + 4))
    assert mid == int(base * (f + s) / (f + 0.8 * s))
    assert new == int(available // (f + 0.8 * s))
    assert old > new >= mid


def test_gdn_state_slots_divided_by_dp_in_0_5_4_to_0_5_8_only() -> None:
    """0.5.4-0.5.6 divide a GDN model's slot count by dp under DP attention (0.5.4
    model_runner.py:1470-1473); 0.5.9's ratio branch does not (model_runner_kv_cache_mixin.py:186-203)."""
    m = _model("Qwen--Qwen3-Next-80B-A3B-Thinking")
    available = 38 * GiB
    for version, divided in (("0.5.6", True), ("0.5.9", False)):
        plain = budget.pool(m, _sglang(version, tp=4), 2, available)
        d = _sglang(version, tp=4, dp=4, dp_attention=True)
        dp = budget.pool(m, d, 2, available)
        per_req = states.state_bytes_per_request(m, d)
        slots = int(available * 0.9 / 1.9 // per_req)
        assert plain.tokens == (available - slots * per_req) // plain.cell_bytes
        kept = slots // 4 if divided else slots
        assert dp.tokens == (available - kept * per_req) // dp.cell_bytes


def test_multimodal_reservation_from_0_5_18() -> None:
    kimi = _model("moonshotai--Kimi-K2.5")
    assert budget.multimodal_reservation(kimi, _sglang("0.5.18")) == 100 * MiB
    assert budget.multimodal_reservation(kimi, _sglang("0.5.17")) == 0
    assert budget.multimodal_reservation(_model("deepseek-ai--DeepSeek-V3"), _sglang("0.5.23")) == 0


@pytest.mark.parametrize(
    ("version", "tokens", "context_len", "printed"),
    [
        # max_running_requests as the real startups print it: min(tokens // 2, the table's
        # ReqToTokenPool.size) (0.4.5 managers/tp_worker.py:109-117), its rows before 0.4.7.
        ("0.3.4.post2", 442913, 131072, 2049),  # sgl-docsci-llama31-8b-h100-20241102
        ("0.4.0", 2193171, 131072, 4097),  # sgl-docsci-llama32-1b-h100-20241206
        ("0.4.2", 444372, 131072, 2049),  # sgl-docsci-llama31-8b-h100-20250128
        ("0.4.2", 87056, 4096, 4097),  # sgl-docsci-llama2-7b-eagle-h100-mfs07-20250128
        ("0.4.3.post4", 46611, 131072, 2049),  # sgl-llmsinclouds-qwq32b-4xL4-tp4
        ("0.5.7", 25169, 35000, 2048),  # sgl-udbhav-llama32-3b-l40s-v057-mfs02-hicache
    ],
)
def test_request_table_rows_are_the_printed_max_running_requests(
    version: str, tokens: int, context_len: int, printed: int
) -> None:
    """clamp(tokens / context_len x 512, 2048, 4096) requests (0.4.5 model_runner.py:699-708), one
    more row before 0.4.7 (size=max_num_reqs + 1, :758-760), none in 0.4.7-0.5.10 (0.4.7 :933-935)."""
    table = request_table.request_table(_sglang(version), tokens, context_len)
    assert table.rows == printed
    assert table.positions == context_len + 4


@pytest.mark.parametrize(
    ("version", "given", "slots", "rows"),
    [
        ("0.5.9", None, 2048, 2048),  # the estimate's floor, no cap (0.5.9 mixin :340-352)
        ("0.5.10", None, 1500, 1500),  # min(estimate, tokens // 2) (0.5.10 mixin :844-851)
        ("0.5.11", None, 1500, 1501),  # + the padding row 0 (0.5.11 mem_cache/memory_pool.py:140-152)
        ("0.4.5", 8192, 8192, 8193),  # a given one as it is
        ("0.5.12", 8192, 2048, 2049),  # a given one capped at the estimate (0.5.12 mixin :824-828)
        ("0.5.14", 8192, 1500, 1501),  # ... at tokens // 2 from 0.5.14 (mixin :988-991)
        ("0.5.23", 8192, 1500, 1501),  # kv_cache_configurator.py:3123-3132, memory_pool.py:399-407
    ],
)
def test_request_table_per_release(version: str, given: int | None, slots: int, rows: int) -> None:
    # 3,000 tokens at a 1,000-token context: an estimate of 1,536, clamped up to 2,048.
    table = request_table.request_table(_sglang(version, max_num_seqs=given), 3000, 1000)
    assert (table.requests, table.rows) == (slots, rows)
    assert table.bytes == rows * 1004 * 4


def test_a_request_table_larger_than_the_reserve_fails_the_start() -> None:
    """Llama-4-Scout's 10,485,760-token default context: 2,049 rows x 10,485,764 x int32 = 80.04 GiB,
    allocated after the pool is sized (0.4.5 model_runner.py:697-770), beside it; at a 131,072-token
    context its 1,761,248-token pool gives 4,096 requests (the clamp's ceiling), a 2.00 GiB table, which
    fits the 14.96 GiB mem_fraction_static leaves."""
    m = load_model(
        Path(__file__).parent / "apriori/public/configs/meta-llama--Llama-4-Scout-17B-16E-Instruct.json"
    )
    d = Deployment(engine="sglang", engine_version="0.4.5", tp=8, gpu_memory_bytes=int(79.10 * GiB))
    p = predict(m, d)
    assert p.kv_pool_tokens > 0
    assert p.failure is not None and "req_to_token" in p.failure and "80.04 GiB" in p.failure
    assert not any("starts anyway" in a for a in p.assumptions)
    short = predict(m, d.with_(max_model_len=131072))
    assert short.failure is None
    assert any("4,097 rows x 131,076 positions x int32 = 2.00 GiB" in a for a in short.assumptions)


def _pool_end_cases() -> list[dict[str, object]]:
    """The real startups that print the free memory after the weights, the pool's K and V sizes, the
    free memory at 'Memory pool end', the pool's tokens and context_len (tests/apriori/public/sglang)."""
    cases = json.loads(
        (Path(__file__).parent / "apriori/public/sglang/cases.json").read_text(encoding="utf-8")
    )
    keys = ("load_weight_end_avail_gib", "k_size_gib", "v_size_gib", "memory_pool_end_avail_gib")
    return [
        c
        for c in cases
        if not c["scoring"].get("excluded")
        and all(
            isinstance(c["observed"].get(k), float | int)
            for k in (*keys, "max_total_num_tokens", "context_len")
        )
    ]


@pytest.mark.parametrize("case", _pool_end_cases(), ids=lambda c: str(c["id"]))
def test_the_request_table_is_what_goes_between_the_weights_and_memory_pool_end(case: dict[str, Any]) -> None:
    """'Load weight end' avail - the pool's K + V - 'Memory pool end' avail is the req_to_token table
    (1.00 GiB for 2,049 rows at 131,072 positions, 2.00 GiB for 4,097): it is allocated beside the pool,
    after the profile, from what mem_fraction_static leaves. The printed figures round to 0.01 GiB; what
    else the model runner allocates there (the allocator's free list, EAGLE's draft) stays under 0.3 GiB."""
    o = case["observed"]
    drop = o["load_weight_end_avail_gib"] - o["k_size_gib"] - o["v_size_gib"] - o["memory_pool_end_avail_gib"]
    d = _sglang(case["scoring"]["engine_version"])
    table = request_table.request_table(d, o["max_total_num_tokens"], o["context_len"]).bytes / GiB
    assert table <= drop + 0.03
    assert drop - table < 0.3


def test_weights_carry_the_fp32_rotary_cache_on_cuda() -> None:
    # Llama 3.1 8B's 131,072 x 128 cos/sin table, fp32 on CUDA (0.4.7 layers/rotary_embedding.py:82-93):
    # MaxUhl98/Thesis's RTX 4090 loads 15.02 GiB, the checkpoint's split 14.96.
    m = _model("meta-llama--Meta-Llama-3.1-8B")
    d = _sglang("0.4.7", "RTX-4090-24GB", 24564)
    assert weight_extras.rope_cache(m, d) == 131072 * 128 * 4
    p = predict(m, d)
    assert p.weights_bytes == weights_per_rank(m, 1, 1).per_rank_bytes + 131072 * 128 * 4
    assert p.weights_bytes is not None and abs(p.weights_bytes / GiB - 15.02) < 0.005
    # Off CUDA the table is cast to the model dtype (bf16).
    assert weight_extras.rope_cache(m, _sglang("0.5.4", "MI300X-192GB", 196592)) == 131072 * 128 * 2


def test_memory_before_weights_follows_the_communication_set_up_not_the_release() -> None:
    # One rank keeps the one-rank figure in 0.4 and 0.5 alike; TP 4 over NVSwitch takes the fabric
    # figure (NCCL, custom all-reduce); TP 4 on PCIe-only L4s (custom all-reduce off) one rank's.
    cal = calibration.current()
    assert cal.context_gib < cal.context_gib_fabric
    one = int(cal.context_gib * GiB)
    fabric = int(cal.context_gib_fabric * GiB)
    assert calibration.context_bytes(cal, 1, "H100-SXM-80GB") == one
    assert calibration.context_bytes(cal, 1, "L40S-48GB") == one
    assert calibration.context_bytes(cal, 4, "H100-SXM-80GB") == fabric
    assert calibration.context_bytes(cal, 4, "L4-24GB") == one
    assert calibration.context_bytes(cal, 2, None) == fabric
    m = _model("meta-llama--Meta-Llama-3.1-8B")
    assert predict(m, _sglang("0.4.2", "H100-SXM-80GB", tp=1)).non_torch_bytes == one
    assert predict(m, _sglang("0.5.7", "H100-SXM-80GB", tp=1)).non_torch_bytes == one
    assert predict(m, _sglang("0.4.9", "H100-SXM-80GB", tp=4)).non_torch_bytes == fabric


@pytest.mark.parametrize("version", ["0.5.19", "0.5.20", "0.5.23"])
def test_pr39713_pool_is_sglangs_arithmetic(version: str) -> None:
    """sglang PR #39713's Qwen3-0.6B on an H100 (a build between 0.5.19 and 0.5.20): the default
    fraction (arg_groups/memory_hook.py:281-327, :357-399 @0.5.23), the cell and the page floor
    (model_executor/pool_configurator.py:491-498, :637-647 @0.5.23: budget // cell, no fixed overhead
    without page sharding) turn the budget its printed pool implies back into its 556,202 tokens. What
    kvwatch gets wrong there is the free memory at the profile (the case's notes), not this arithmetic."""
    qwen = load_model(Path(__file__).parent / "apriori" / "configs" / "Qwen--Qwen3-0.6B.json")
    d = _sglang(version, "H100-SXM-80GB")
    frac = budget.default_mem_fraction_static(d, qwen)
    assert (frac.reserved_mb, frac.value) == (13904, 0.83)
    assert budget.page_size(qwen, d) == 1
    cell = budget.cell_size(qwen, d, 2)
    assert cell == 28 * 8 * (128 + 128) * 2 == 114688
    budget_bytes = 556202 * cell  # 59.41 GiB; the log's K 29.70 GB + V 29.70 GB
    assert budget.pool(qwen, d, 2, budget_bytes).tokens == 556202
    assert budget.pool(qwen, d, 2, budget_bytes - 1).tokens == 556201
    assert round(budget.buffer_cell_size(qwen, d, 2) * (556202 + 1) / 2 / GiB, 2) == 29.70


def test_aiter_scales_the_fraction_above_8192_context_on_rocm_from_0_5_5() -> None:
    # 0.5.6 server_args.py:1301-1302 (aiter is ROCm's default for MHA) and :1420-1422 (x 0.85 above
    # 8192 context, on the fraction given or defaulted); farbodtavakkoli/OTel's Qwen3-0.6B on an
    # MI355X at 0.5.17 with --mem-fraction-static 0.6 printed the pool of 0.51.
    m = _model("Qwen--Qwen3-8B")
    rocm = Deployment(
        engine="sglang", engine_version="0.5.17", gpu_name="MI355X-288GB", gpu_memory_bytes=288 * GiB
    )
    assert budget.aiter_factor(m, rocm, 40960) == 0.85
    assert budget.aiter_factor(m, rocm, 8192) == 1.0  # not above 8192
    assert budget.aiter_factor(m, rocm.with_(engine_version="0.5.4"), 40960) == 1.0  # before the rule
    assert budget.aiter_factor(m, _sglang("0.5.17", "H100-SXM-80GB"), 40960) == 1.0  # CUDA
    # MLA takes aiter only at 16 or 128 heads a rank, which kvwatch does not count: not applied.
    assert budget.aiter_factor(_model("deepseek-ai--DeepSeek-V3"), rocm, 40960) == 1.0
    given = predict(m, rocm.with_(mem_fraction_static=0.6, max_model_len=40960))
    assert given.mem_fraction_static == pytest.approx(0.51)
    assert any("aiter" in a for a in given.assumptions)


def test_a_fraction_sglang_printed_is_not_scaled_again() -> None:
    # server_args is logged after SGLang's own adjustments: its mem_fraction_static already carries
    # the aiter factor, so the sidecar's config basis takes it as it stands.
    m = _model("Qwen--Qwen3-8B")
    settings = SettingsFacts(version="0.5.17", mem_fraction_static=0.51, max_model_len=40960)
    d = deployment_from_settings(
        "sglang", settings, MemoryFacts(), gpu_memory_bytes=288 * GiB, gpu_name="MI355X-288GB"
    )
    assert d.fraction_printed
    assert predict(m, d).mem_fraction_static == 0.51
    typed = deployment_from_settings(
        "sglang",
        settings,
        MemoryFacts(),
        gpu_memory_bytes=288 * GiB,
        gpu_name="MI355X-288GB",
        mem_fraction_static=0.6,
    )
    assert not typed.fraction_printed and predict(m, typed).mem_fraction_static == pytest.approx(0.51)
