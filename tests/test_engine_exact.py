"""Engine-exact rules (issue 12, build item 3): each test derives its figures from the engine's own
arithmetic, read in the release's source (cited per test), and checks kvwatch against them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from kvwatch.analysis.predict import pool_from_available, predict
from kvwatch.analysis.predictor import Predictor
from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import geometry_from_config, load_model
from kvwatch.core.events import EngineSettings, PoolSized
from kvwatch.core.jsontypes import JsonObject
from kvwatch.core.units import GiB
from kvwatch.engines.vllm import memory
from kvwatch.export import names
from kvwatch.export.collector import KvwatchCollector
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.state.fleet import Fleet

TESTS = Path(__file__).parent
CONFIGS = TESTS / "model_configs"

# mistralai/Mistral-7B-v0.1 config.json as published on the Hugging Face hub (transformers
# 4.34.0.dev0): one global 4096-token window on all 32 layers -- the "Mistral-style" SWA model.
MISTRAL_7B: JsonObject = {
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- a) vLLM's 'GPU KV cache size' of sliding-window models, per release ------------------------
#
# vLLM, written out here from its source rather than from kvwatch:
#   num_blocks = available // page_size // num_layers        (kv_cache_utils.py, uniform spec; for
#                                                             hybrids // group_size)
#   SlidingWindowSpec.max_admission_blocks_per_request =
#       cdiv(min(sliding_window - 1 + max_num_batched_tokens, max_model_len), block_size) + 1
#                                                             (0.21.0 v1/kv_cache_interface.py:443-463)
#   max_concurrency = num_blocks / blocks one max-length request takes, summed over groups
#                                                             (0.21.0 kv_cache_utils.py:872-890)
#   'GPU KV cache size: N tokens':
#       <= 0.20.0: N = num_blocks // len(groups) * block_size  (0.20.0 kv_cache_utils.py:1694-1711)
#       >= 0.20.1: N = int(max_concurrency * max_model_len)   (0.20.1 kv_cache_utils.py:1699-1708,
#                                                              0.21.0 :1701-1710)

MISTRAL_PAGE = 16 * 2 * 8 * 128 * 2  # block x (K, V) x 8 KV heads x 128 dims x bf16, per layer
# Mistral-7B at max_model_len 32768, max_num_batched_tokens 8192: cdiv(4095 + 8192, 16) + 1 blocks.
MISTRAL_REQUEST_BLOCKS = cdiv(min(4096 - 1 + 8192, 32768), 16) + 1
AVAILABLE_GIB = "62.01"  # 'Available KV cache memory: 62.01 GiB', as the log prints it
AVAILABLE = round(float(AVAILABLE_GIB) * GiB)
MISTRAL_BLOCKS = AVAILABLE // MISTRAL_PAGE // 32


def _vllm_logged_tokens(version: str, blocks: int, groups: int, request_blocks: int, max_len: int) -> int:
    if version in ("0.19.0", "0.20.0"):
        return blocks // groups * 16
    return int(blocks / request_blocks * max_len)


def test_mistral_geometry_is_one_window_on_every_layer() -> None:
    m = geometry_from_config(MISTRAL_7B, name="mistralai/Mistral-7B-v0.1")
    assert m.count("sliding") == 32
    assert {layer.window for layer in m.layers} == {4096}


@pytest.mark.parametrize("version", ["0.19.0", "0.20.0", "0.20.1", "0.21.0"])
def test_vllm_kv_cache_size_of_a_sliding_window_model_by_release(version: str) -> None:
    m = geometry_from_config(MISTRAL_7B, name="mistralai/Mistral-7B-v0.1")
    d = Deployment(engine="vllm", engine_version=version, max_model_len=32768, max_num_batched_tokens=8192)
    tokens, blocks = pool_from_available(m, d, AVAILABLE)
    assert blocks == MISTRAL_BLOCKS == 31749
    assert MISTRAL_REQUEST_BLOCKS == 769
    expected = _vllm_logged_tokens(version, MISTRAL_BLOCKS, 1, MISTRAL_REQUEST_BLOCKS, 32768)
    assert tokens == expected
    # 0.20.0 still prints blocks x 16 = 507,984; 0.20.1 on prints 41.29 x 32,768 = 1,352,862
    assert expected == (507_984 if version in ("0.19.0", "0.20.0") else 1_352_862)
    p = predict(m, d.with_(available_kv_bytes=AVAILABLE))
    assert f"{p.max_concurrency:.2f}" == "41.29"


@pytest.mark.parametrize("version", ["0.10.1", "0.20.0", "0.21.0"])
def test_gpt_oss_hybrid_tokens_by_release(version: str) -> None:
    """gpt-oss-120b: 18 sliding (window 128) + 18 full layers, two groups of 18 sharing 18 tensors.

    hf-mem #60 (vLLM 0.10.1) printed 78,384 tokens = num_blocks // 2 x 16 at max_model_len 131072:
    num_blocks 9798 (or 9799). The same pool on 0.20.1+ prints int(9798 / (521 + 8192) x 131072) = 147,393.
    """
    m = load_model(CONFIGS / "openai--gpt-oss-120b.json")
    page = 16 * 2 * 8 * 64 * 2
    available = 9798 * page * 18
    d = Deployment(engine="vllm", engine_version=version, max_model_len=131072, max_num_batched_tokens=8192)
    tokens, blocks = pool_from_available(m, d, available)
    assert blocks == 9798
    # sliding group: cdiv(min(127 + 8192, 131072), 16) + 1 = 521; full group: 131072 / 16 = 8192
    request_blocks = (cdiv(127 + 8192, 16) + 1) + 131072 // 16
    assert request_blocks == 8713
    old = version in ("0.10.1", "0.20.0")
    assert tokens == _vllm_logged_tokens("0.20.0" if old else version, 9798, 2, request_blocks, 131072)
    assert tokens == (78_384 if old else 147_393)


@pytest.mark.parametrize(("version", "sliding_blocks"), [("0.25.1", 521), ("0.26.0", 1033), ("0.33.0", 1033)])
def test_gpt_oss_counts_the_tokens_async_scheduling_keeps_in_flight_from_026(
    version: str, sliding_blocks: int
) -> None:
    """From 0.26 a sliding-window request holds window - 1 + max_in_flight_tokens, 2 x 8192 at PP 1
    with async scheduling (0.26.0 v1/kv_cache_interface.py:584, config/vllm.py:525-534; 0.33.0
    :916-940): the sliding group takes cdiv(127 + 16384, 16) + 1 = 1033 blocks per request, the
    pool is unchanged and the logged tokens and concurrency drop by 5.5 %."""
    m = load_model(CONFIGS / "openai--gpt-oss-120b.json")
    page = 16 * 2 * 8 * 64 * 2
    available = 9798 * page * 18
    d = Deployment(engine="vllm", engine_version=version, max_model_len=131072, max_num_batched_tokens=8192)
    tokens, blocks = pool_from_available(m, d, available)
    assert blocks == 9798
    request_blocks = sliding_blocks + 131072 // 16
    assert tokens == int(9798 / request_blocks * 131072)
    p = predict(m, d.with_(available_kv_bytes=available))
    assert p.max_concurrency == pytest.approx(9798 / request_blocks)


@pytest.mark.parametrize(("pp", "version", "batches"), [(1, "0.33.0", 2), (2, "0.29.0", 3), (2, "0.31.0", 2)])
def test_mistral_window_per_request_by_batches_in_flight(pp: int, version: str, batches: int) -> None:
    """All layers windowed (4096): cdiv(min(4095 + batches x 8192, 32768), 16) + 1 blocks a request."""
    m = geometry_from_config(MISTRAL_7B, name="mistralai/Mistral-7B-v0.1")
    d = Deployment(
        engine="vllm", engine_version=version, max_model_len=32768, max_num_batched_tokens=8192, pp=pp
    )
    p = predict(m, d.with_(available_kv_bytes=AVAILABLE))
    per_request = cdiv(min(4095 + batches * 8192, 32768), 16) + 1
    assert p.max_concurrency == pytest.approx(p.kv_pool_blocks / per_request)  # type: ignore[operator]


def _mistral_startup(version: str) -> list[str]:
    """A vLLM V1 startup of Mistral-7B-v0.1, in the line formats of the real 0.19.0 H100 startup in
    tests/apriori/logs/google-gemma-2-9b-it--h100-80gb--tp1pp1dp1--8192.log.gz (logo line, non-default
    args, chunked prefill, budget, size and concurrency lines), its figures from vLLM's arithmetic."""
    tokens = _vllm_logged_tokens(version, MISTRAL_BLOCKS, 1, MISTRAL_REQUEST_BLOCKS, 32768)
    concurrency = MISTRAL_BLOCKS / MISTRAL_REQUEST_BLOCKS
    return [
        f"(APIServer pid=1) INFO 04-22 15:56:27 [entrypoints/utils.py:299]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}",
        "(APIServer pid=1) INFO 04-22 15:56:27 [entrypoints/utils.py:233] non-default args: {'model_tag': "
        "'mistralai/Mistral-7B-v0.1', 'model': 'mistralai/Mistral-7B-v0.1', 'max_model_len': 32768}",
        "(APIServer pid=1) INFO 04-22 15:56:27 [config/scheduler.py:238] Chunked prefill is enabled with "
        "max_num_batched_tokens=8192.",
        f"(EngineCore pid=285) INFO 04-22 15:57:45 [v1/worker/gpu_worker.py:436] Available KV cache memory: {AVAILABLE_GIB} GiB",
        f"(EngineCore pid=285) INFO 04-22 15:57:45 [v1/core/kv_cache_utils.py:1319] GPU KV cache size: {tokens:,} tokens",
        "(EngineCore pid=285) INFO 04-22 15:57:45 [v1/core/kv_cache_utils.py:1324] Maximum concurrency for "
        f"32,768 tokens per request: {concurrency:.2f}x",
    ]


def _collect(fleet: Fleet, config: Path) -> dict[tuple[str, str | None], float]:
    registry = CollectorRegistry()
    predictor = Predictor(model_config=lambda source: config, gpu_memory_bytes=int(79.19 * GiB))
    registry.register(KvwatchCollector(fleet.snapshot, predictor, lambda: (), lambda: 0))
    return {
        (sample.name, sample.labels.get("basis")): sample.value
        for family in registry.collect()
        for sample in family.samples
    }


@pytest.mark.parametrize("version", ["0.20.0", "0.20.1", "0.21.0"])
def test_healthy_mistral_swa_server_shows_no_gap(version: str, tmp_path: Path) -> None:
    """The issue's case: before, a healthy 0.20.0 server showed -62% (kvwatch used 0.20.1's
    definition from 0.20.0); the gap on the engine's own budget is now 0 on every release."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(MISTRAL_7B))
    fleet = Fleet(clock=lambda: 1.0)
    pipeline = LinePipeline("v", fleet, "auto")
    for line in _mistral_startup(version):
        pipeline.feed(line)
    got = _collect(fleet, config)
    gap = names.KV_POOL_GAP_RATIO.sample_name
    assert got[(gap, "engine_budget")] == 0.0
    # The a-priori basis is off only by its budget model (H100, util 0.92), not by a definition.
    assert abs(got[(gap, "config")]) < 0.15
    conc = names.MAX_CONCURRENCY.sample_name
    assert got[(conc, "engine_budget")] == pytest.approx(got[(conc, "observed")], abs=0.005)


def test_pool_known_only_in_blocks_is_compared_in_blocks(tmp_path: Path) -> None:
    """/metrics before 0.28 gives num_gpu_blocks and block_size only: blocks x 16 is not vLLM's
    token count for a sliding-window model, so the gap compares the blocks."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(MISTRAL_7B))
    fleet = Fleet(clock=lambda: 1.0)
    fleet.apply(
        "v",
        EngineSettings(
            engine="vllm",
            version="0.21.0",
            model="mistralai/Mistral-7B-v0.1",
            max_model_len=32768,
            max_num_batched_tokens=8192,
            starts_engine=True,
        ),
    )
    m = geometry_from_config(MISTRAL_7B)
    d = Deployment(
        engine="vllm",
        engine_version="0.21.0",
        max_model_len=32768,
        max_num_batched_tokens=8192,
        gpu_memory_bytes=int(79.19 * GiB),
    )
    predicted = predict(m, d)
    assert predicted.kv_pool_blocks is not None
    fleet.apply("v", PoolSized(engine="vllm", blocks=predicted.kv_pool_blocks, block_size=16))
    got = _collect(fleet, config)
    assert got[(names.KV_POOL_GAP_RATIO.sample_name, "config")] == 0.0
    assert not math.isclose(predicted.kv_pool_tokens, predicted.kv_pool_blocks * 16, rel_tol=0.1)


# --- b) the null block in 'To serve at least one request' and its estimate ------------------------
#
# 0.29.0 (v1/core/kv_cache_utils.py:975-989, :2316-2336) checks against available - one pool block
# (_pool_bytes_per_block, :1082-1089: the largest group's page summed over its layers), the block
# BlockPool holds back as its null block; 0.28.0 (:2193) checks the whole budget. The check and the
# estimate's binary search (estimate_max_model_len / _estimate_max_model_len_from_groups) both see
# the reduced figure, and so does the message's 'available KV cache memory'.

LLAMA_BLOCK = 16 * 131072  # 16 tokens x 128 KiB per token (32 layers x 8 KV heads x 128 x 2 x bf16)


@pytest.mark.parametrize(("version", "estimate"), [("0.28.0", 65_536), ("0.29.0", 65_520), (None, 65_520)])
def test_estimated_max_model_len_holds_back_the_null_block(version: str | None, estimate: int) -> None:
    """Llama-3.1-8B with an 8 GiB KV budget: 4096 blocks of 2 MiB, one of them the null block."""
    m = load_model(CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json")
    d = Deployment(engine="vllm", engine_version=version, max_model_len=131072, available_kv_bytes=8 * GiB)
    p = predict(m, d)
    assert not p.fits
    assert p.needed_kv_bytes == 131072 // 16 * LLAMA_BLOCK == 16 * GiB
    # 0.28: cdiv(len, 16) x 2 MiB <= 8 GiB -> 4096 blocks; 0.29+: <= 8 GiB - 2 MiB -> 4095 blocks
    held_back = LLAMA_BLOCK if version != "0.28.0" else 0
    assert p.estimated_max_model_len == estimate == (8 * GiB - held_back) // LLAMA_BLOCK * 16
    assert p.failure is not None and f"the estimated maximum model length is {estimate}." in p.failure


@pytest.mark.parametrize(("version", "fits"), [("0.28.0", True), ("0.29.0", False)])
def test_a_budget_of_exactly_one_request_fails_from_0_29(version: str, fits: bool) -> None:
    m = load_model(CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json")
    d = Deployment(
        engine="vllm", engine_version=version, max_model_len=8192, available_kv_bytes=8192 // 16 * LLAMA_BLOCK
    )
    p = predict(m, d)
    assert p.fits is fits
    if not fits:
        assert p.estimated_max_model_len == 8192 - 16


@pytest.mark.parametrize(
    ("version", "fits"),
    [
        ("0.13.0", False),  # the layers' own sum: 18 x (521 + 8192) pages
        ("0.18.0", True),  # group 0 (sliding, layer 0) only: 18 x 521 pages
        ("0.19.0", False),  # every group: 18 x (521 + 8192) pages
    ],
)
def test_needed_bytes_of_a_hybrid_model_by_release(version: str, fits: bool) -> None:
    """gpt-oss-120b at 131072 tokens, 2 GiB of KV: 0.14-0.18 count only the first group's blocks
    (0.18.0 kv_cache_utils.py:1353-1360), so vLLM starts where 0.13 and 0.19 refuse."""
    m = load_model(CONFIGS / "openai--gpt-oss-120b.json")
    d = Deployment(
        engine="vllm",
        engine_version=version,
        max_model_len=131072,
        max_num_batched_tokens=8192,
        available_kv_bytes=2 * GiB,
    )
    p = predict(m, d)
    page = 16 * 2 * 8 * 64 * 2
    sliding = cdiv(127 + 8192, 16) + 1
    assert p.needed_kv_bytes == 18 * page * (sliding if version == "0.18.0" else sliding + 131072 // 16)
    assert p.fits is fits


@pytest.mark.parametrize(
    ("version", "groups", "padding"),
    [
        # 0.11.0 kv_cache_utils.py:977: group_size = min(12, 13) = 12 -> 1 + ceil(13 / 12) = 3 groups
        ("0.11.0", 3, 11),
        # 0.12-0.17: 13 < 12 x 1.25 -> group_size 13, one padding sliding layer (0.17.0 :1043)
        ("0.17.0", 2, 1),
        # 0.18+: 13 < 12 x 1.5 (0.18.0 :1043)
        ("0.18.0", 2, 1),
    ],
)
def test_hybrid_group_size_rule_by_release(version: str, groups: int, padding: int) -> None:
    cfg = json.loads((CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    cfg.update(
        num_hidden_layers=25,
        layer_types=["sliding_attention"] * 12 + ["full_attention"] * 13,
        sliding_window=128,
    )
    m = geometry_from_config(cfg)
    p = predict(m, Deployment(engine_version=version, available_kv_bytes=GiB, max_model_len=8192))
    assert p.kv_groups == groups
    assert any(f"{padding} padding layer" in a for a in p.assumptions)


@pytest.mark.parametrize(("version", "groups"), [("0.17.0", 3), ("0.18.0", 2)])
def test_hybrid_group_size_between_1_25_and_1_5(version: str, groups: int) -> None:
    """10 sliding + 14 full: 14 >= 10 x 1.25 keeps group_size 10 in 0.17 (1 + 2 groups); 14 < 15 in 0.18."""
    cfg = json.loads((CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    cfg.update(
        num_hidden_layers=24,
        layer_types=["sliding_attention"] * 10 + ["full_attention"] * 14,
        sliding_window=128,
    )
    p = predict(
        geometry_from_config(cfg),
        Deployment(engine_version=version, available_kv_bytes=GiB, max_model_len=8192),
    )
    assert p.kv_groups == groups


# --- c) DeepSeek-V3.2 (DSA) in SGLang: the fp8 latent layout, the indexer key, the default dtype -----

DSV32 = CONFIGS / "deepseek-ai--DeepSeek-V3.2.json"


@pytest.mark.parametrize(
    ("version", "cell", "buffer"),
    [
        # 0.5.3: the cell is 576 x 1 B (model_runner.py:1274-1279); the buffer 656 B (memory_pool.py:1054)
        ("0.5.3", 576, 656),
        # 0.5.4-0.5.16: + the indexer key 128 + 128 / 128 x 4 = 132 B in both
        ("0.5.4", 576 + 132, 656 + 132),
        ("0.5.16", 576 + 132, 656 + 132),
        # 0.5.17+: calculate_mla_kv_cache_dim's 512 + 512 / 128 x 4 + 64 x 2 = 656 in the cell too
        ("0.5.17", 656 + 132, 656 + 132),
        (None, 656 + 132, 656 + 132),
    ],
)
def test_sglang_dsa_fp8_cell_and_buffer_by_release(version: str | None, cell: int, buffer: int) -> None:
    from kvwatch.engines.sglang import budget

    m = load_model(DSV32)
    d = Deployment(engine="sglang", engine_version=version, tp=8, kv_cache_dtype="fp8_e4m3")
    assert budget.cell_size(m, d, 1) == cell * 61
    assert budget.buffer_cell_size(m, d, 1) == buffer * 61


def test_sglang_dsv32_logged_kv_size_is_656_bytes_per_layer() -> None:
    """sglang/017 (sgl-project/sglang#11309, 8x B200, before the fix): 'KV Cache is allocated.
    #tokens: 1462784, KV size: 54.52 GB'. The buffers hold #tokens + one page (page size 64 for
    DSA, 0.5.3 server_args.py:820-821): 656 B per layer per token; the PR's true size with the
    indexer, 65.49 GB, is the 0.5.4+ buffer of 788 B."""
    from kvwatch.engines.sglang import budget

    m = load_model(DSV32)
    tokens = 1_462_784
    # No server_args in the log: kv_cache_dtype 'auto' on a B200 is fp8 (SM 10).
    old = Deployment(engine="sglang", engine_version="0.5.3", tp=8, gpu_name="B200")
    assert budget.dsa_kv_elem_bytes(m, old, 2) == 1
    per_token = budget.buffer_cell_size(m, old, budget.dsa_kv_elem_bytes(m, old, 2))
    assert per_token == 61 * 656
    assert f"{(tokens + 64) * per_token / GiB:.2f}" == "54.52"
    new = old.with_(engine_version="0.5.4")
    assert f"{(tokens + 64) * budget.buffer_cell_size(m, new, 1) / GiB:.2f}" == "65.49"


@pytest.mark.parametrize(
    ("gpu", "per_layer"), [("B200", 656 + 132), ("H100", 576 * 2 + 132), (None, 656 + 132)]
)
def test_sglang_dsa_default_kv_dtype_follows_the_card(gpu: str | None, per_layer: int) -> None:
    """kv_cache_dtype auto: fp8 on SM >= 10, bf16 on Hopper (0.5.9 server_args.py:1142-1143)."""
    m = load_model(DSV32)
    d = Deployment(engine="sglang", tp=8, gpu_name=gpu, max_model_len=8192, available_kv_bytes=40 * GiB)
    p = predict(m, d)
    assert p.bytes_per_token == 61 * per_layer
    # pages of 64 tokens for DSA on CUDA (0.5.9 server_args.py:1256-1259)
    assert p.kv_pool_tokens == 40 * GiB // (61 * per_layer) // 64 * 64
    assert p.block_size == 64


@pytest.mark.parametrize(
    ("version", "tokens"),
    [("0.19.0", 8192), ("0.20.0", 16384), ("0.21.0", 8192), ("0.27.1", 8192), ("0.28.0", 16384)],
)
def test_batched_tokens_default_on_a_160_gib_card_by_release(version: str, tokens: int) -> None:
    """>= 160 GiB: 16384 tokens in 0.20 and from 0.28 (0.28.0 engine/arg_utils.py:2582-2591); 0.21-0.27 have no such branch."""
    assert memory.default_batch_limits(version, 180 * GiB, "B200-180GB", 8192) == (1024, tokens)


@pytest.mark.parametrize(
    ("version", "sm", "sizes"), [("0.27.1", 10, 51), ("0.28.0", 10, 83), ("0.28.0", 9, 51)]
)
def test_capture_sizes_reach_1024_on_sm100_from_028(version: str, sm: int, sizes: int) -> None:
    """0.28.0 config/vllm.py:1936-1943: the top capture size is 1024 on the SM100 family, 512 elsewhere."""
    assert memory.capture_sizes(1024, 8192, version, sm) == sizes


@pytest.mark.parametrize("version", ["0.13.0", "0.25.1"])
def test_a_card_nvml_reports_no_memory_of_gets_the_small_defaults(version: str) -> None:
    """vLLM reads the card's memory from NVML for its batch defaults (0.25.1 platforms/cuda.py:764-767)
    and takes 0 when that raises (0.25.1 engine/arg_utils.py:2415-2421, 0.13.0 :1786-1792). A DGX
    Spark's NVML answers NOT_SUPPORTED, so its 121.69 GiB still gets 256 / 2048 -- the
    TW-10519/VLLM-ROUTER log on GB10 (0.13.0): 'Chunked prefill is enabled with
    max_num_batched_tokens=2048'. A discrete 80 GB card keeps 1024 / 8192."""
    gb10 = gpus.lookup("gb10")
    assert not gb10.nvml_memory
    assert memory.default_batch_limits(version, gb10.total_bytes, gb10.name, 8192) == (256, 2048)
    h100 = gpus.lookup("h100")
    assert memory.default_batch_limits(version, h100.total_bytes, h100.name, 8192) == (1024, 8192)
