"""vLLM's release rules: what one release does differently, one named row each.

Every row is a ``Rule`` (core/versions.py) of sides oldest first: ``Side(since, value, source)``,
``since`` the first release with that value (None: every release before the next side) and
``source`` the engine file:line it was read from (``pip download vllm==X --no-deps --no-binary
:all:``). ``RULE.at(version)`` is the value for a release; None -- no release given or printed --
and any release newer than the last side take the newest. memory.py and budget.py read these rows
instead of comparing versions themselves; tests/test_releases.py checks every row cites its
source and that its sides run in release order inside the releases kvwatch knows.
"""

from __future__ import annotations

from typing import Any, Literal

from kvwatch.core.versions import Rule, Side

SamplerPath = Literal["v0", "flashinfer", "sort", "triton"]
NeededRule = Literal["layers", "first_group", "groups"]
# How a Mamba / linear-attention state layer counts blocks per request: one page (<= 0.11), the
# cdiv of max_model_len by mamba_block_size (0.12-0.14), by mamba_cache_mode (0.15+).
MambaStateBlocks = Literal["page", "mamba_block", "modes"]
# Memory other processes hold on the card at launch: counted as the engine's own non-torch memory,
# left in the baseline the profile subtracts, or left in the baseline after a startup check.
OthersMemory = Literal["counted", "baseline", "checked"]

# --- engine defaults (memory.py) -----------------------------------------------------------------

UTILIZATION_DEFAULT: Rule[float] = Rule(
    "utilization_default",
    "--gpu-memory-utilization when none is given",
    Side(None, 0.90, "0.19.0 config/cache.py:41"),
    Side("0.20", 0.92, "0.20.0 config/cache.py:66"),
)
V1_ENGINE: Rule[bool] = Rule(
    "v1_engine",
    "the V1 engine (scheduler, profile run, sampler) is the default (VLLM_USE_V1=0: V0_SELECTABLE)",
    Side(None, False, "0.7.3 envs.py VLLM_USE_V1 (default 0)"),
    Side("0.8", True, "0.8.0 envs.py VLLM_USE_V1 (default 1)"),
)
V0_SELECTABLE: Rule[bool] = Rule(
    "v0_selectable",
    "VLLM_USE_V1=0 starts the V0 engine (its worker/model_runner.py still ships)",
    Side(
        None,
        True,
        "V0 is the default before 0.8 (0.7.3 envs.py); 0.8.4 envs.py:527-528 and engine/arg_utils.py:1160-1162 "
        "('If VLLM_USE_V1=0, we disable V1'); 0.9.2 envs.py:637-638; 0.10.2 envs.py:745-746, arg_utils.py:1125-1127",
    ),
    Side("0.11", False, "0.11.0 wheel: vllm/worker/model_runner.py is gone (V0 removed)"),
)
V0_AT_PP: Rule[bool] = Rule(
    "v0_at_pp",
    "the V1 oracle falls back to V0 at PP >= 2 with the default executor backend (not among those it names)",
    Side(None, False, "0.7.3 envs.py VLLM_USE_V1 (V0 is the default anyway)"),
    Side("0.8", True, "0.8.5 engine/arg_utils.py:1476-1482 ('ray' only); 0.9.0 :1378-1384"),
    Side("0.9.1", False, "0.9.1 engine/arg_utils.py:1434-1440 (the default backend accepted)"),
)
V0_CHUNKED_PREFILL_TOKENS: Rule[int] = Rule(
    "v0_chunked_prefill_tokens",
    "max_num_batched_tokens of V0's chunked prefill when none is given (on by default past 32K tokens)",
    Side(None, 512, "0.6.4.post1 config.py:1103-1114 (SchedulerConfig: 512, 'best balance ... on A100')"),
    Side("0.6.5", 2048, "0.6.5 config.py:1344; 0.7.3 config.py:1532; 0.8.5 config.py:68"),
)
V0_BLOCKS_PER_VIRTUAL_ENGINE: Rule[bool] = Rule(
    "v0_blocks_per_virtual_engine",
    "V0's max-seq-len check counts the blocks of one PP virtual engine, not of them all",
    Side(None, False, "0.7.3 worker/worker.py:542"),
    Side("0.8", True, "0.8.5 worker/worker.py:554-569, core/scheduler.py:452"),
)
BIG_CARD_TOKENS: Rule[bool] = Rule(
    "big_card_tokens",
    "a card reporting >= 160 GiB gets max_num_batched_tokens 16384 by default (else 8192 / 2048)",
    Side(None, False, "0.19.0 engine/arg_utils.py:2053-2071"),
    Side("0.20", True, "0.20.0 engine/arg_utils.py"),
    Side("0.21", False, "0.21.0 engine/arg_utils.py:2217-2266; 0.27.1 :2515-2544"),
    Side("0.28", True, "0.28.0 engine/arg_utils.py:2582-2591; 0.33.0 :2973"),
)

# --- CUDA graphs (memory.py) ---------------------------------------------------------------------

SM100_CAPTURE_CAP: Rule[int] = Rule(
    "sm100_capture_cap",
    "the largest CUDA-graph capture size on an SM100 card (512 on every other card)",
    Side(None, 512, "0.19.0 config/vllm.py:1389-1403"),
    Side("0.28", 1024, "0.28.0 config/vllm.py:1936-1943"),
)
CAPTURES_BATCHED_TOKENS: Rule[bool] = Rule(
    "captures_batched_tokens",
    "max_num_batched_tokens is a capture size of its own when under the top size",
    Side(None, False, "0.19.0 config/vllm.py:1349-1353"),
    Side("0.21", True, "0.21.0 config/vllm.py:1580"),
)
CAPTURES_MAX_NUM_SEQS: Rule[bool] = Rule(
    "captures_max_num_seqs",
    "max_num_seqs is a capture size of its own when under the top size",
    Side(None, False, "0.21.0 config/vllm.py:1580 (max_num_batched_tokens only)"),
    Side("0.31", True, "0.31.0 config/vllm.py:2540"),
)
ESTIMATES_CUDA_GRAPHS: Rule[bool] = Rule(
    "estimates_cuda_graphs",
    "the worker profiles CUDA-graph memory before sizing the pool and logs the estimate",
    Side(None, False, "0.17 v1/worker/gpu_worker.py (no profile_cudagraph_memory)"),
    Side("0.18", True, "0.18.0 v1/worker/gpu_worker.py profile_cudagraph_memory"),
)
SUBTRACTS_CUDA_GRAPHS: Rule[bool] = Rule(
    "subtracts_cuda_graphs",
    "the CUDA-graph estimate comes out of the KV budget (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1)",
    Side(None, False, "0.19.0 envs.py:1654"),
    Side("0.20", True, "0.20.0 envs.py:1724"),
)

# --- the profile run's terms (memory.py) ---------------------------------------------------------

SAMPLER_PATH: Rule[SamplerPath] = Rule(
    "sampler_path",
    "the top-k/top-p implementation the profile's dummy sampler run takes on CUDA",
    Side(None, "v0", "V0 model_executor/layers/sampler.py (before the V1 engine)"),
    Side("0.8", "flashinfer", "0.11.0 v1/sample/ops/topk_topp_sampler.py:39-50"),
    Side(
        "0.11.1",
        "sort",
        "0.11.1 v1/sample/ops/topk_topp_sampler.py:34-46 (FlashInfer opt-in); 0.15.0 :262",
    ),
    Side("0.17", "triton", "0.19.0 v1/sample/ops/topk_topp_sampler.py:251, topk_topp_triton.py:1018"),
)
MOE_WORKSPACE_PERSISTENT: Rule[bool] = Rule(
    "moe_workspace_persistent",
    "the fused-MoE scratch outlives the forward (modular kernel + workspace manager), alive at the sampler",
    Side(None, False, "0.10.2 fused_moe/fused_moe.py:1580-1590; 0.13.0 :1838-1850 (torch.empty per call)"),
    Side("0.14", True, "0.14.0 fused_moe/unquantized_fused_moe_method.py:258-324, v1/worker/workspace.py"),
)
CUBLAS_IN_BASELINE: Rule[bool] = Rule(
    "cublas_in_baseline",
    "the cuBLAS/cuBLASLt handles and workspace exist before the init snapshot (baseline, not profile)",
    Side(None, False, "0.32.0 v1/worker/gpu_worker.py:534 (snapshot before any cuBLAS call)"),
    Side("0.33", True, "0.33.0 v1/worker/gpu_worker.py:520-529"),
)
UNIFIED_FREE_FROM_OS: Rule[bool] = Rule(
    "unified_free_from_os",
    "on a unified-memory card the free memory is the OS's available memory, so host memory the "
    "engine takes after the init snapshot counts as non-torch",
    Side(None, False, "0.11.0 utils/mem_utils.py MemorySnapshot.measure (cudaMemGetInfo only)"),
    Side(
        "0.11.1", True, "0.11.1 utils/mem_utils.py:86-102 (SM 8.7/11.0/12.1); 0.25.1 :147-154 (is_integrated)"
    ),
)
PREFIX_LM_BATCH_FLOOR: Rule[bool] = Rule(
    "prefix_lm_batch_floor",
    "a multimodal prefix LM's default max_num_batched_tokens is raised to its largest item's tokens",
    Side(None, False, "0.21.0 engine/arg_utils.py (no floor)"),
    Side("0.22", True, "0.22.0 engine/arg_utils.py:2528-2540; 0.25.1 :2630-2650; 0.33.0 :3204-3215"),
)
NON_TORCH_WITH_GRAPH_PROFILE: Rule[bool] = Rule(
    "non_torch_with_graph_profile",
    "the CUDA-graph profile runs inside memory_profiling, so the non-torch increase is the larger class",
    Side(None, False, "0.17 v1/worker/gpu_worker.py (no CUDA-graph profile)"),
    Side("0.18", True, "0.19.0 v1/worker/gpu_worker.py:366-381"),
)

# --- blocks, groups, tokens, concurrency (budget.py) ---------------------------------------------

HYBRID_ALLOCATOR: Rule[bool] = Rule(
    "hybrid_allocator",
    "sliding-window layers get KV cache groups of their own (the hybrid allocator) unless disabled",
    Side(None, False, "0.9.1 v1/core/kv_cache_utils.py (one group of full-attention specs)"),
    Side("0.9.2", True, "0.9.2 v1/core/kv_cache_coordinator.py (HybridKVCacheCoordinator)"),
)
LARGEST_TYPE_RATIO: Rule[float | None] = Rule(
    "largest_type_ratio",
    "hybrid groups take the larger type's layer count as group size under this multiple of the smaller's",
    Side(None, None, "0.11.0 v1/core/kv_cache_utils.py:977 (the min)"),
    Side("0.12", 1.25, "0.12.0 v1/core/kv_cache_utils.py:1017; 0.17.0 :1043"),
    Side("0.18", 1.5, "0.18.0 v1/core/kv_cache_utils.py:1043; 0.21.0 :1139"),
)
TOKENS_FROM_CONCURRENCY: Rule[bool] = Rule(
    "tokens_from_concurrency",
    "'GPU KV cache size: N tokens' is int(max_concurrency x max_model_len), not blocks x block size",
    Side(None, False, "0.20.0 v1/core/kv_cache_utils.py:1694-1711; 0.19.0 :1302-1319"),
    Side("0.20.1", True, "0.20.1 v1/core/kv_cache_utils.py:1699-1708; 0.21.0 :1701-1710"),
)
V2_RUNNER_PP: Rule[bool] = Rule(
    "v2_runner_pp",
    "at PP > 1 the V2 model runner keeps pp + 1 batches in flight (V1: pp)",
    Side(None, False, "0.26.0 config/vllm.py:512-522 (dense models taken as V1)"),
    Side("0.29", True, "0.29.0 config/vllm.py:559-569, :645 (V2 the default for every model)"),
    Side("0.31", False, "0.31.0 config/vllm.py:3124 (PP with async scheduling falls back to V1)"),
)
IN_FLIGHT_BATCHES: Rule[bool] = Rule(
    "in_flight_batches",
    "a sliding-window / chunked layer keeps max_concurrent_batches x max_num_batched_tokens in flight",
    Side(None, False, "0.25.1 v1/kv_cache_interface.py:561"),
    Side("0.26", True, "0.26.0 config/vllm.py:525-534, v1/kv_cache_interface.py:584; 0.33.0 :916-940"),
)
HYBRID_PREFIX_CACHING: Rule[bool] = Rule(
    "hybrid_prefix_caching",
    "prefix caching is on by default for a hybrid (Mamba / linear-attention) model (is_prefix_caching_supported)",
    Side(
        None, False, "0.12.0 config/model.py:1839-1844; 0.19.0 :1785-1790; 0.25.1 :1883-1888 (hybrid: False)"
    ),
    Side("0.26", True, "0.26.0 config/model.py:1895-1897; 0.28.0 :2072-2074 (hybrid: True)"),
)
MAMBA_STATE_BLOCKS: Rule[MambaStateBlocks] = Rule(
    "mamba_state_blocks",
    "how MambaSpec.max_memory_usage_bytes counts a state layer's blocks per request",
    Side(
        None,
        "page",
        "0.11.0 v1/kv_cache_interface.py:235 (one page; prefix caching off, models/config.py:296)",
    ),
    Side(
        "0.12",
        "mamba_block",
        "0.12.0 v1/kv_cache_interface.py:262, 0.14.0 :292 (cdiv(max_model_len, mamba_block_size));"
        " 0.14.0 model_executor/models/config.py:332-352",
    ),
    Side(
        "0.15",
        "modes",
        "0.15.0 v1/kv_cache_interface.py:293; 0.25.1 :688-697 (mamba_cache_mode all/align/none)",
    ),
)
MAMBA_ALL_MODE_DEFAULT: Rule[bool] = Rule(
    "mamba_all_mode_default",
    "prefix caching puts a model with Mamba prefix caching support in mamba_cache_mode 'all' (else 'align')",
    Side(None, True, "0.15.0 model_executor/models/config.py:332; 0.19.0 :436-440; 0.25.1 :558-563"),
    Side("0.28", False, "0.28.0 model_executor/models/config.py:602-609; 0.33.0 :763-771 ('align' for all)"),
)
SPECULATIVE_ALIGN: Rule[bool] = Rule(
    "speculative_align",
    "with speculative decoding a model with Mamba prefix caching support takes 'align', not 'all'",
    Side(None, False, "0.19.0 model_executor/models/config.py:436-440"),
    Side("0.20", True, "0.20.0 model_executor/models/config.py:351-360; 0.21.0 :351-360"),
    Side("0.22", False, "0.22.0 model_executor/models/config.py:350-360"),
)
ALL_MODE_SPECULATIVE_BLOCKS: Rule[bool] = Rule(
    "all_mode_speculative_blocks",
    "mamba_cache_mode 'all' counts the speculative blocks beside cdiv(max_model_len, block_size)",
    Side(None, False, "0.21.0 v1/kv_cache_interface.py:562-566"),
    Side("0.22", True, "0.22.0 v1/kv_cache_interface.py:582-588; 0.28.0 :687-692"),
)
MAMBA2_PREFILL_CHECKPOINT: Rule[bool] = Rule(
    "mamba2_prefill_checkpoint",
    "a MambaMixer2 layer keeps one prefill-checkpoint block more a request in mamba_cache_mode 'align'",
    Side(None, False, "0.31.0 v1/kv_cache_interface.py:1083-1091 (the field, 0 for every layer)"),
    Side(
        "0.32",
        True,
        "0.32.0 model_executor/layers/mamba/mamba_mixer2.py:1107; 0.33.0 :1117, v1/kv_cache_interface.py:1135-1139",
    ),
)
NEMOTRON_H_SSM_FP32: Rule[bool] = Rule(
    "nemotron_h_ssm_fp32",
    "Nemotron-H keeps its Mamba2 recurrent state in float32 when neither the user nor config.json names a dtype",
    Side(None, False, "0.14.0 model_executor/models/config.py:541; 0.19.0 :494 (float16)"),
    Side("0.20", True, "0.20.0 model_executor/models/config.py:410; 0.25.1 :606, :618-625 (float32)"),
)
QWEN3_5_SSM_DTYPE: Rule[bool] = Rule(
    "qwen3_5_ssm_dtype",
    "a Qwen3.5 checkpoint's mamba_ssm_dtype sets the GDN recurrent state's dtype (else the model dtype)",
    Side(None, False, "0.16.0 model_executor/models/config.py (no Qwen3_5ForConditionalGenerationConfig)"),
    Side("0.17", True, "0.17.0 model_executor/models/config.py:625-640, :685-686; 0.19.0 :663-690, :746-747"),
)
NEEDED_RULE: Rule[NeededRule] = Rule(
    "needed_rule",
    "how the 'To serve at least one request' check counts the bytes one request needs",
    Side(None, "layers", "0.13.0 v1/core/kv_cache_utils.py:664, called at :1340"),
    Side("0.14", "first_group", "0.18.0 v1/core/kv_cache_utils.py:1329-1362"),
    Side("0.19", "groups", "0.19.0 v1/core/kv_cache_utils.py:1332-1367; 0.29.0 :2041-2070"),
)
GLOBAL_GROUPS_CHECK: Rule[bool] = Rule(
    "global_groups_check",
    "the fit check runs over the global (all-stage) groups against min(available), not per worker",
    Side(None, False, "0.13.0 v1/core/kv_cache_utils.py:1340"),
    Side("0.14", True, "0.16.0 v1/core/kv_cache_utils.py:1514-1527"),
    Side("0.17", False, "0.18.0 v1/core/kv_cache_utils.py:1570-1579"),
)
V0_OTHERS_MEMORY: Rule[OthersMemory] = Rule(
    "v0_others_memory",
    "whether V0's profile counts memory other processes hold at launch as its own, or subtracts it as baseline",
    Side(None, "counted", "0.2.7 worker/worker.py:101-102, 0.3.0 :122 (peak = total - free)"),
    Side(
        "0.3.1",
        "baseline",
        "0.3.1 worker/worker.py:89, :134 (peak = init free - free); 0.6.3.post1 :171, :231",
    ),
    Side(
        "0.6.4",
        "counted",
        "0.6.4 worker/worker.py:207-213, 0.6.4.post1 :207-213 (non-torch = total - free - torch)",
    ),
    Side(
        "0.6.5",
        "baseline",
        "0.6.5 worker/worker.py:198-200 (baseline = total - init free); 0.8.5 :181, :246-255",
    ),
)
V1_OTHERS_MEMORY: Rule[OthersMemory] = Rule(
    "v1_others_memory",
    "whether V1 counts memory other processes hold at launch as its own non-torch memory, or checks it at start",
    Side(
        None,
        "counted",
        "0.8.5 v1/worker/gpu_worker.py:195-210, 0.9.0 :200-209 (non-torch = total - free - torch)",
    ),
    Side(
        "0.9.1",
        "checked",
        "0.9.1 v1/worker/gpu_worker.py:135-148; 0.10.2 :175-188; 0.16.0 v1/worker/utils.py:92-112; 0.33.0 :716-771 (free >= util x total)",
    ),
)
QWEN3_TOWER_PROFILE: Rule[bool] = Rule(
    "qwen3_tower_profile",
    "a Qwen3-VL / Qwen3.5 tower's profile item is the factor-paired largest image (video: 2 frames)",
    Side(
        None,
        False,
        "0.13.0 model_executor/models/qwen3_vl.py get_max_video_tokens (frames up to the sequence; 0.11.0 "
        ":658-675 x 12.5 the tokens): the dummy video can outgrow the image, not modelled",
    ),
    Side(
        "0.15",
        True,
        "0.15.0 qwen3_vl.py:696-713 (video: 2 frames at longest_edge / temporal_patch_size), qwen2_vl.py:895; "
        "0.19.0 qwen3_vl.py:786-810, qwen2_vl.py:914-965; 0.25.1 qwen2_vl.py:948; 0.33.0 qwen3_vl.py:1064",
    ),
)
GRAPH_PROFILE_MEASURED: Rule[bool] = Rule(
    "graph_profile_measured",
    "the CUDA-graph memory profile runs inside memory_profiling (its memory is in the non-torch increase)",
    Side(None, False, "0.17 v1/worker/gpu_worker.py (no CUDA-graph profile)"),
    Side("0.18", True, "0.19.0 v1/worker/gpu_worker.py:366-381"),
    Side("0.27", False, "0.27.1 v1/worker/gpu_worker.py:500-517 (after the memory_profiling block)"),
)
ROCM_GRAPH_PROFILE: Rule[bool] = Rule(
    "rocm_graph_profile",
    "the CUDA-graph memory profile runs on ROCm",
    Side(None, False, "0.19.0 v1/worker/gpu_worker.py:380; 0.25.1 :479 (current_platform.is_cuda())"),
    Side("0.26", True, "0.26.0 v1/worker/gpu_worker.py:501-505 (is_cuda_alike(), vllm#44825)"),
)
CHECKPOINT_KV_DTYPE: Rule[bool] = Rule(
    "checkpoint_kv_dtype",
    "--kv-cache-dtype auto takes a ModelOpt checkpoint's own KV quantisation (kv_cache_scheme / kv_cache_quant_algo)",
    Side(
        None,
        False,
        "0.13.0 utils/torch_utils.py has no resolve_kv_cache_dtype_string: auto is the model dtype",
    ),
    Side(
        "0.14",
        True,
        "0.14.0 utils/torch_utils.py:239-320, engine/arg_utils.py:1398; 0.30.0 torch_utils.py:452-525, "
        "arg_utils.py:2090",
    ),
)
CHECKPOINT_NVFP4_KV: Rule[bool] = Rule(
    "checkpoint_nvfp4_kv",
    "a ModelOpt checkpoint's nvfp4 KV format is taken (before: unknown, 'auto' kept with a warning)",
    Side(
        None,
        False,
        "0.19.0 utils/torch_utils.py MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP (fp8 only; 4-bit schemes fall back)",
    ),
    Side(
        "0.20",
        True,
        "0.20.0 utils/torch_utils.py MODELOPT_TO_VLLM_KV_CACHE_DTYPE_MAP ('nvfp4'), num_bits 4 scheme",
    ),
)
NULL_BLOCK_HELD_BACK: Rule[bool] = Rule(
    "null_block_held_back",
    "the fit check and its estimate plan against the budget less the pool's null block",
    Side(None, False, "0.28.0 v1/core/kv_cache_utils.py:2193"),
    Side(
        "0.29",
        True,
        "0.29.0 v1/core/kv_cache_utils.py:975-989, :2316-2336; 0.33.0 kv_cache_planning.py:170-181",
    ),
)

RULES: tuple[Rule[Any], ...] = (
    UTILIZATION_DEFAULT,
    V1_ENGINE,
    V0_SELECTABLE,
    V0_AT_PP,
    V0_CHUNKED_PREFILL_TOKENS,
    V0_BLOCKS_PER_VIRTUAL_ENGINE,
    BIG_CARD_TOKENS,
    SM100_CAPTURE_CAP,
    CAPTURES_BATCHED_TOKENS,
    CAPTURES_MAX_NUM_SEQS,
    ESTIMATES_CUDA_GRAPHS,
    SUBTRACTS_CUDA_GRAPHS,
    SAMPLER_PATH,
    MOE_WORKSPACE_PERSISTENT,
    CUBLAS_IN_BASELINE,
    NON_TORCH_WITH_GRAPH_PROFILE,
    UNIFIED_FREE_FROM_OS,
    PREFIX_LM_BATCH_FLOOR,
    HYBRID_ALLOCATOR,
    LARGEST_TYPE_RATIO,
    TOKENS_FROM_CONCURRENCY,
    V2_RUNNER_PP,
    IN_FLIGHT_BATCHES,
    HYBRID_PREFIX_CACHING,
    MAMBA_STATE_BLOCKS,
    MAMBA_ALL_MODE_DEFAULT,
    SPECULATIVE_ALIGN,
    ALL_MODE_SPECULATIVE_BLOCKS,
    MAMBA2_PREFILL_CHECKPOINT,
    NEMOTRON_H_SSM_FP32,
    QWEN3_5_SSM_DTYPE,
    NEEDED_RULE,
    GLOBAL_GROUPS_CHECK,
    V0_OTHERS_MEMORY,
    V1_OTHERS_MEMORY,
    QWEN3_TOWER_PROFILE,
    GRAPH_PROFILE_MEASURED,
    ROCM_GRAPH_PROFILE,
    CHECKPOINT_KV_DTYPE,
    CHECKPOINT_NVFP4_KV,
    NULL_BLOCK_HELD_BACK,
)
