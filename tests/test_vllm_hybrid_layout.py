"""vLLM 0.30+'s division of a hybrid (Mamba2 / Gated DeltaNet + attention) pool, pinned on the three
hybrid startups of tests/apriori/public/vllm-newest/cases.json (builderOfTheWorlds/virtualTubers,
DGX Spark GB10, vLLM 0.30.0, --enable-prefix-caching, max_model_len 32768).

What 0.30.0 does on CUDA (read end to end):
- The KV cache layout is resolved once in the engine core (v1/engine/core.py:289-293,
  resolve_kv_cache_layout v1/attention/backends/utils.py:254-322) from the layouts the backends
  declare (get_supported_kv_cache_layouts :204-239). FLASH_ATTN (the first non-MLA backend on an
  SM 12.x card, platforms/cuda.py:167-179), TRITON_ATTN, FlashInfer off SM 10.x
  (v1/attention/backends/flashinfer.py:543-549) and every Mamba / GDN backend declare none
  (v1/attention/backend.py:367-370), so the default preference's first, LBNHC (utils.py:190-197),
  is taken; mixed HNC shapes keep only block-compact layouts, which LBNHC is (utils.py:289-298,
  v1/kv_cache_layout.py:50-53). LBNHC is not block-outermost (kv_cache_layout.py:55-58).
- _align_hybrid_block_size still runs for every hybrid model (platforms/interface.py:642-645,
  :778-962): the attention block is raised to 16 x cdiv(state, 16 x attention bytes per token)
  (FLASH_ATTN's MultipleOf(16), v1/attention/backends/flash_attn.py:314-318) and the state page
  is padded to the attention page, so every layer has one page size.
- get_kv_cache_groups (v1/core/kv_cache_utils.py:2252-2345) therefore skips the packed grouping
  twice over: _get_packed_kv_cache_groups returns None when the layout is not block-outermost or
  the page sizes are one (:1993-1996). The uniform-page-size grouping of 0.29 stands
  (_get_kv_cache_groups_uniform_page_size :1435-1575, group size the smaller type's count unless
  the larger is under 1.5x it), num_blocks = available // (group size x page)
  (get_kv_cache_config_from_groups :1745-1751, _get_kv_cache_bytes_per_block :1588-1611), the
  concurrency is num_blocks / the sum over groups of cdiv(max_memory_usage_bytes, page)
  (:1067-1100), a state group 2 blocks a request in 'align' (v1/kv_cache_interface.py:1034-1045),
  and the log reads int(concurrency x max_model_len) (:2373-2384).
- 0.31.0-0.33.0 are the same for these models: no default CUDA backend declares a layout
  (0.33.0 v1/attention/backends/utils.py:229-236), the grouping is unchanged (0.33.0
  v1/core/kv_cache_planning.py), the layer-outermost block stride is the page (0.33.0
  kv_cache_planning.py:569-586; no alignment for a MultipleOf backend, v1/worker/utils.py:484),
  and _align_hybrid_block_size only adds the lcm of the backends' smallest kernel blocks (16 here;
  0.32.0 platforms/interface.py:939) and, in 0.33, a MambaMixer2 checkpoint alignment of 1
  (0.33.0 model_executor/layers/mamba/mamba_mixer2.py:1108-1118).

So kvwatch's grouping is vLLM 0.30's, and the logged figures say so: each log's token count is
int(n / R x 32768) for an integer pool of n blocks only with R the blocks a request kvwatch counts
(the Qwen pair: 38 and 48). Their misses are in the pool bytes (the memory side), not the division.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import geometry_from_config
from kvwatch.capacity.model import ModelGeometry, ceil_div
from kvwatch.engines.vllm import budget

ROOT = Path(__file__).parent
NEMOTRON = ROOT / "apriori/public/configs/nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4.json"
QWEN36_35B = ROOT / "model_configs/Qwen--Qwen3.5-35B-A3B.json"  # stands for Qwen3.6-35B-A3B (cases.json)
QWEN38_27B = ROOT / "apriori/public/configs/Qwen--Qwen3.5-27B.json"  # stands for Qwen3.8-27B
MODEL_LEN = 32768
MNBT = 2048


def _model(path: Path) -> ModelGeometry:
    return geometry_from_config(json.loads(path.read_text(encoding="utf-8")))


def _deployment(version: str, kv_cache_dtype: str = "auto") -> Deployment:
    return Deployment(
        engine="vllm",
        engine_version=version,
        max_model_len=MODEL_LEN,
        enable_prefix_caching=True,
        max_num_seqs=16,
        kv_cache_dtype=kv_cache_dtype,
    )


def _blocks_a_request(pool: budget.VllmPool) -> int:
    """The divisor of get_max_concurrency_for_kv_cache_config (0.30.0 kv_cache_utils.py:1083-1095)."""
    return sum(ceil_div(g.spec.max_memory_usage(MODEL_LEN, MNBT, 1), g.spec.page_bytes) for g in pool.groups)


def _plan(path: Path, version: str, available: int, elem: int = 2, kv: str = "auto") -> budget.VllmPool:
    return budget.plan(_model(path), _deployment(version, kv), elem, available, MODEL_LEN, MNBT)


@pytest.mark.parametrize("version", ["0.29.0", "0.30.0", "0.33.0"])
def test_qwen36_35b_a3b_groups_as_vllm_030(version: str) -> None:
    """40 layers, full_attention_interval 4: 10 full attention, 30 Gated DeltaNet.
    Attention: 2 KV heads x 256 x 2 (K, V) x 2 B = 2,048 B a token. GDN state: conv
    (4 - 1) x (2 x 16 x 128 + 32 x 128 = 8,192) x 2 B = 49,152 B, recurrent 32 x 128 x 128 x 4 B
    (mamba_ssm_dtype float32) = 2,097,152 B: 2,146,304 B. Block 16 x cdiv(2,146,304, 16 x 2,048)
    = 16 x 66 = 1,056 tokens, page 1,056 x 2,048 = 2,162,688 B. Groups of 10: one attention, three
    GDN, no padding; a pool block is 10 pages. A request: cdiv(32,768, 1,056) = 32 + 3 x 2 = 38.
    The log's 1,468,523 tokens, 44.82x is int(1,703 / 38 x 32,768): 1,703 blocks =
    1,703 x 10 x 2,162,688 B = 34.30 GiB of KV (kvwatch's memory side gives 30.06 GiB)."""
    pool = _plan(QWEN36_35B, version, 1703 * 10 * 2_162_688)
    assert (pool.block_size, pool.page_bytes, pool.tensors) == (1056, 2_162_688, 10)
    assert [g.spec.kind for g in pool.groups] == ["state", "state", "state", "full"]
    assert pool.padding_layers == 0
    assert _blocks_a_request(pool) == 38
    assert pool.num_blocks == 1703
    assert (pool.tokens, f"{pool.max_concurrency:.2f}") == (1_468_523, "44.82")


@pytest.mark.parametrize("version", ["0.29.0", "0.30.0", "0.33.0"])
def test_qwen38_27b_groups_as_vllm_030(version: str) -> None:
    """64 layers: 16 full attention, 48 Gated DeltaNet. Attention: 4 KV heads x 256 x 2 x 2 B =
    4,096 B a token. GDN state: conv 3 x (2 x 16 x 128 + 48 x 128 = 10,240) x 2 B = 61,440 B,
    recurrent 48 x 128 x 128 x 4 B = 3,145,728 B: 3,207,168 B. Block 16 x cdiv(3,207,168, 16 x 4,096)
    = 16 x 49 = 784 tokens, page 3,211,264 B. Groups of 16: one attention, three GDN. A request:
    cdiv(32,768, 784) = 42 + 3 x 2 = 48. The log's 445,781 tokens, 13.60x is int(653 / 48 x 32,768):
    653 x 16 x 3,211,264 B = 31.25 GiB of KV (kvwatch's memory side gives 35.74 GiB)."""
    pool = _plan(QWEN38_27B, version, 653 * 16 * 3_211_264)
    assert (pool.block_size, pool.page_bytes, pool.tensors) == (784, 3_211_264, 16)
    assert len(pool.groups) == 4 and pool.padding_layers == 0
    assert _blocks_a_request(pool) == 48
    assert pool.num_blocks == 653
    assert (pool.tokens, f"{pool.max_concurrency:.2f}") == (445_781, "13.60")


def test_nemotron_h_bf16_groups_as_vllm_030() -> None:
    """52 layers: 6 attention, 23 Mamba2 (the 23 MoE layers hold nothing). Attention: 2 KV heads x
    128 x 2 x 2 B = 1,024 B a token. Mamba2 state: conv 3 x (64 x 64 + 2 x 8 x 128 = 6,144) x 2 B =
    36,864 B, recurrent 64 x 64 x 128 x 4 B (mamba_ssm_cache_dtype float32) = 2,097,152 B:
    2,134,016 B. Block 16 x cdiv(2,134,016, 16 x 1,024) = 16 x 131 = 2,096, page 2,146,304 B.
    23 >= 1.5 x 6, so groups of 6: one attention, cdiv(23, 6) = 4 Mamba (1 padding layer).
    A request: cdiv(32,768, 2,096) = 16 + 4 x 2 = 24 blocks. vLLM 0.29 and 0.30 agree."""
    budget_bytes = 4019 * 6 * 2_146_304
    pools = [_plan(NEMOTRON, v, budget_bytes) for v in ("0.29.0", "0.30.0")]
    assert pools[0] == pools[1]
    pool = pools[1]
    assert (pool.block_size, pool.page_bytes, pool.tensors) == (2096, 2_146_304, 6)
    assert (len(pool.groups), pool.padding_layers) == (5, 1)
    assert _blocks_a_request(pool) == 24
    assert pool.num_blocks == 4019


def test_nemotron_h_log_reads_an_fp8_kv_cache() -> None:
    """The log's 7,778,304 tokens, 237.38x is 237.375 = n / R for integers only with R a multiple
    of 8; R = 24 (the bf16 cache above) needs n = 5,697 blocks x 6 x 2,146,304 B = 68.3 GiB of KV,
    more than the whole 0.55 share of the 121 GiB card (66.6 GiB) before its 17.82 GiB of weights,
    so the startup did not run a bf16 cache. The
    checkpoint's hf_quant_config.json names kv_cache_quant_algo FP8 (tests/apriori/public/configs/
    manifest.json), and --kv-cache-dtype auto takes it (0.30.0 engine/arg_utils.py:2089-2092,
    utils/torch_utils.py:452-525). With fp8: 512 B a token, block 16 x cdiv(2,134,016, 16 x 512)
    = 16 x 261 = 4,176, page 2,138,112 B; a request cdiv(32,768, 4,176) = 8 + 4 x 2 = 16 blocks,
    and 3,798 blocks (45.38 GiB) read exactly the log's line. kvwatch does not read the KV dtype
    from the checkpoint's quantisation config: the case's prediction keeps the bf16 pool."""
    pool = _plan(NEMOTRON, "0.30.0", 3798 * 6 * 2_138_112, elem=1, kv="fp8")
    assert (pool.block_size, pool.page_bytes, pool.tensors, len(pool.groups)) == (4176, 2_138_112, 6, 5)
    assert _blocks_a_request(pool) == 16
    assert pool.num_blocks == 3798
    assert (pool.tokens, pool.max_concurrency) == (7_778_304, 237.375)
    # The same bytes as a bf16 cache: 3,783 blocks over 24 a request, nowhere near the log.
    bf16 = _plan(NEMOTRON, "0.30.0", 3798 * 6 * 2_138_112)
    assert (bf16.num_blocks, bf16.max_concurrency) == (3783, 157.625)
