"""SGLang's release rules: what one release does differently, one named row each.

Every row is a ``Rule`` (core/versions.py) of sides oldest first: ``Side(since, value, source)``,
``since`` the first release with that value (None: every release before the next side) and
``source`` the engine file:line it was read from (``pip download sglang==X --no-deps``; paths under
python/sglang/srt/). ``RULE.at(version)`` is the value for a release; None -- no release given or
printed -- and any release newer than the last side take the newest. budget.py, weight_extras.py,
request_table.py and states.py read these rows instead of comparing versions
themselves; tests/test_releases.py checks every row cites its source and that its sides run in
release order inside the releases kvwatch knows.
"""

from __future__ import annotations

from typing import Any, Literal

from kvwatch.core.versions import Rule, Side

FractionFormula = Literal["table", "reserve_by_card", "activation_reserve"]
LargeCardFraction = Literal["table", "minus_13_gib", "share_48_gib"]
SwaSplit = Literal["layer_counts", "byte_shares", "configurator"]
RequestSlots = Literal["given_or_estimate", "estimate_half_pool", "half_pool"]

# --- the default mem_fraction_static (budget.py) -------------------------------------------------

FRACTION_FORMULA: Rule[FractionFormula] = Rule(
    "fraction_formula",
    "how the default mem_fraction_static is worked out when the card size is known",
    Side(None, "table", "0.4.3.post4 server_args.py:203-214 (by TP)"),
    Side("0.4.8", "reserve_by_card", "0.4.8.post1 server_args.py:287-314; 0.5.2 :452-497"),
    Side(
        "0.5.3",
        "activation_reserve",
        "0.5.4 server_args.py:764-799; 0.5.23 arg_groups/memory_hook.py:281-327",
    ),
)
NO_GPU_FRACTION: Rule[float] = Rule(
    "no_gpu_fraction",
    "the default mem_fraction_static when no GPU memory is known",
    Side(None, 0.88, "0.5.19 arg_groups/memory_hook.py:266"),
    Side("0.5.20", 0.95, "0.5.20 arg_groups/memory_hook.py:320"),
)
TABLE_8_RANKS: Rule[float] = Rule(
    "table_8_ranks",
    "the table's fraction at 8 ranks (before 0.4.8)",
    Side(None, 0.83, "0.2.15 server_args.py (the table by TP)"),
    Side("0.4", 0.81, "0.4.3.post4 server_args.py:203-214"),
)
TABLE_COUNTS_PP: Rule[bool] = Rule(
    "table_counts_pp",
    "the table is read at TP x PP ranks, not TP (before 0.4.8)",
    Side(None, False, "0.4.6 server_args.py:224-237"),
    Side("0.4.7", True, "0.4.7 server_args.py:253-283"),
)
LARGE_CARD_FRACTION: Rule[LargeCardFraction] = Rule(
    "large_card_fraction",
    "the fraction on a card above 80 GiB before 0.4.8: the table, card - 13 GiB, or a 48 GiB share above 96 GiB",
    Side(None, "table", "0.4.3.post4 server_args.py:203-214"),
    Side("0.4.6", "minus_13_gib", "0.4.6 server_args.py:224-237"),
    Side("0.4.7", "share_48_gib", "0.4.7 server_args.py:253-283"),
)
RESERVE_VLM_FACTOR: Rule[bool] = Rule(
    "reserve_vlm_factor",
    "the reserve-by-card fraction (0.4.8-0.5.2) is scaled by adjust_mem_fraction_for_vlm",
    Side(None, False, "0.4.8.post1 server_args.py:287-314"),
    Side("0.5", True, "0.5.2 server_args.py:506"),
)
VLM_RUNTIME_FACTOR: Rule[float] = Rule(
    "vlm_runtime_factor",
    "the model runner's factor on any mem_fraction_static of a multimodal model (1: none)",
    Side(None, 0.95, "0.4.3.post4 model_executor/model_runner.py:235-236"),
    Side(
        "0.4.5",
        0.90,
        "0.4.5 model_executor/model_runner.py:273-274 (0.4.4 :243 x 0.95); 0.4.6 :307-308; 0.4.8.post1 :414-415",
    ),
    Side("0.5", 1.0, "0.5.2 server_args.py:2513-2549 (the server-args default does it instead)"),
)
SMALL_CARD_DEFAULTS: Rule[tuple[int, int, int]] = Rule(
    "small_card_defaults",
    "(chunked_prefill_size, cuda_graph_max_bs at tp < 4, at tp >= 4) on a 20-35 GiB card",
    Side(None, (2048, 16, 80), "0.5.4 server_args.py:685-697"),
    Side("0.5.5", (2048, 24, 80), "0.5.5 server_args.py:707-719; 0.5.9 :953-955"),
    Side("0.5.20", (4096, 48, 160), "0.5.20 arg_groups/memory_hook.py:100-117"),
)

# --- the prefill (piecewise) CUDA-graph reserve (budget.py) --------------------------------------

PIECEWISE_GRAPHS: Rule[bool] = Rule(
    "piecewise_graphs",
    "prefill (piecewise) CUDA graphs are on by default and their term joins the reserve",
    Side(None, False, "0.5.9 server_args.py:604 (enable_piecewise_cuda_graph False)"),
    Side(
        "0.5.10",
        True,
        "0.5.10.post1 server_args.py:637, term :1308; 0.5.23 arg_groups/memory_hook.py:383-390",
    ),
)
PIECEWISE_OFF_DP_ATTENTION: Rule[bool] = Rule(
    "piecewise_off_dp_attention",
    "DP attention turns the prefill graphs off on CUDA too (ROCm always)",
    Side(None, True, "0.5.12.post1 server_args.py:1301-1370"),
    Side("0.5.23", False, "0.5.23 arg_groups/cuda_graph_hook.py (ROCm only)"),
)
PIECEWISE_OFF_DCP: Rule[bool] = Rule(
    "piecewise_off_dcp",
    "DCP > 1 turns the prefill graphs off",
    Side(None, False, "0.5.12.post1 server_args.py:1301-1370 (no DCP condition)"),
    Side("0.5.23", True, "0.5.23 arg_groups/cuda_graph_hook.py:212-215"),
)
PIECEWISE_OFF_DSA: Rule[bool] = Rule(
    "piecewise_off_dsa",
    "DeepSeek sparse attention (DeepseekV32, GlmMoeDsa) is in piecewise_cuda_graph_disabled_model_archs",
    Side(None, True, "0.5.12.post1 configs/model_config.py:1558-1566"),
    Side("0.5.13", False, "0.5.13.post1 configs/model_config.py:1579-1585"),
)

AITER_LONG_CONTEXT_FACTOR: Rule[float] = Rule(
    "aiter_long_context_factor",
    "the aiter attention backend (ROCm's default for MHA) scales mem_fraction_static above 8192 context (1: none)",
    Side(None, 1.0, "0.5.4 server_args.py (no such rule)"),
    Side(
        "0.5.5",
        0.85,
        "0.5.5 server_args.py:1270-1272; 0.5.6 :1420-1422, the default :1301-1302; 0.5.17 :5817-5819;"
        " 0.5.23 arg_groups/attention_hook.py:243-268",
    ),
)

# --- a multimodal checkpoint served as text (--language-model-only; budget.py, weight_extras.py) ---

LM_ONLY_FLAG: Rule[bool] = Rule(
    "lm_only_flag",
    "--language-model-only exists: the vision factor is not applied to the default fraction",
    Side(None, False, "0.5.17 server_args.py (no language_model_only field)"),
    Side(
        "0.5.18",
        True,
        "0.5.18 server_args.py:3177-3183, :4990-4996; 0.5.23 arg_groups/memory_hook.py:283-288",
    ),
)
LM_ONLY_NOT_MULTIMODAL: Rule[bool] = Rule(
    "lm_only_not_multimodal",
    "--language-model-only makes the model config text-only (no encoder-cache reservation, prefill graphs)",
    Side(None, False, "0.5.19 configs/model_config.py:356 (is_lm_only reads the checkpoint's own flag only)"),
    Side("0.5.20", True, "0.5.20 configs/model_config.py:467-469; 0.5.23 :674-676"),
)
_QWEN3_VL_LINE = frozenset(
    {
        "Qwen3VLForConditionalGeneration",
        "Qwen3VLMoeForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
        "MuseGlimmerForConditionalGeneration",
    }
)
LM_ONLY_TOWERLESS: Rule[frozenset[str]] = Rule(
    "lm_only_towerless",
    "the architectures that build no vision tower under --language-model-only",
    Side(None, frozenset(), "0.5.17 server_args.py (no language_model_only field)"),
    Side(
        "0.5.18",
        _QWEN3_VL_LINE,
        "0.5.18 models/qwen3_vl.py:1243-1246 (Qwen3-VL, its MoE and Qwen3.5 subclass it:"
        " qwen3_vl_moe.py:173, qwen3_5.py:1775, :1936), muse_glimmer.py",
    ),
    Side(
        "0.5.20",
        _QWEN3_VL_LINE
        | {
            "Cosmos3ForConditionalGeneration",
            "Cosmos3EdgeForConditionalGeneration",
            "Qwen4ExpForConditionalGeneration",
        },
        "0.5.20 models/cosmos3.py, cosmos3_edge.py, qwen4_exp.py; 0.5.23 cosmos3_edge.py:185-210, cosmos3.py:95-106",
    ),
)

# --- cells and pools (budget.py) -----------------------------------------------------------------

MM_RESERVATION: Rule[bool] = Rule(
    "mm_reservation",
    "a multimodal model's KV budget keeps SGLANG_VLM_CACHE_SIZE_MB (100) back for later allocations",
    Side(None, False, "0.5.17 kv_cache_configurator.py (no runtime reservation)"),
    Side("0.5.18", True, "0.5.18 mem_cache/kv_cache_configurator.py:130-147; environ.py:1146"),
)
DSA_FP8_LATENT_CELL: Rule[bool] = Rule(
    "dsa_fp8_latent_cell",
    "a DSA layer's fp8 cell is calculate_mla_kv_cache_dim's 656 B latent, not the latent x 1 B",
    Side(None, False, "0.5.9 model_executor/model_runner_kv_cache_mixin.py:47-80"),
    Side("0.5.17", True, "0.5.17 model_executor/pool_configurator.py:205"),
)
DSA_INDEXER_CELL: Rule[bool] = Rule(
    "dsa_indexer_cell",
    "a DSA layer's cell counts the fp8 indexer key with its scales",
    Side(None, False, "0.5.3 model_executor/model_runner.py:1274-1279"),
    Side("0.5.4", True, "0.5.4 model_executor/model_runner.py:1406-1412"),
)
DSA_INDEXER_BUFFER: Rule[bool] = Rule(
    "dsa_indexer_buffer",
    "the printed 'KV size' of a DSA model includes the indexer buffer",
    Side(None, False, "0.5.3 mem_cache/memory_pool.py:1052-1058 (sgl-project/sglang#11309)"),
    Side("0.5.4", True, "0.5.4 mem_cache/memory_pool.py:1511-1515"),
)
SWA_SPLIT: Rule[SwaSplit] = Rule(
    "swa_split",
    "how a hybrid sliding-window model's tokens are split between the full and the window pool",
    Side(None, "layer_counts", "0.5.6 model_executor/model_runner.py:1587-1600"),
    Side("0.5.9", "byte_shares", "0.5.9 model_executor/model_runner_kv_cache_mixin.py:297-330"),
    Side("0.5.11", "configurator", "0.5.11 pool_configurator.py:184; 0.5.23 :656-920"),
)

# --- the per-request token table, ReqToTokenPool (request_table.py) ------------------------------

REQUEST_SLOTS: Rule[RequestSlots] = Rule(
    "request_slots",
    "max_running_requests the req_to_token table is sized for: the given one, else the estimate "
    "clamp(tokens / context_len x 512, 2048, 4096); from 0.5.10 the estimate is capped at tokens // 2 "
    "and a given one at the estimate, over the DP-attention ranks; from 0.5.14 a given one at tokens // 2",
    Side(
        None,
        "given_or_estimate",
        "0.4.5 model_executor/model_runner.py:699-708; 0.5.9 model_runner_kv_cache_mixin.py:340-352",
    ),
    Side("0.5.10", "estimate_half_pool", "0.5.10 model_executor/model_runner_kv_cache_mixin.py:844-851"),
    Side(
        "0.5.14",
        "half_pool",
        "0.5.14 model_executor/model_runner_kv_cache_mixin.py:988-991; 0.5.23 mem_cache/kv_cache_configurator.py:3123-3132",
    ),
)
REQUEST_TABLE_PADDING_ROW: Rule[int] = Rule(
    "request_table_padding_row",
    "rows the req_to_token table holds beyond max_running_requests",
    Side(None, 1, "0.4.5 model_executor/model_runner.py:758-760 (size=max_num_reqs + 1)"),
    Side("0.4.7", 0, "0.4.7 model_executor/model_runner.py:933-935; 0.5.10 mem_cache/memory_pool.py:140-145"),
    Side("0.5.11", 1, "0.5.11 mem_cache/memory_pool.py:140-152 (a padding slot 0); 0.5.23 :399-407"),
)

# --- weights beyond the checkpoint's (weight_extras.py) ------------------------------------------

MLA_FP8_UP_PROJ_DEQUANT: Rule[bool] = Rule(
    "mla_fp8_up_proj_dequant",
    "on CUDA an MLA model's fp8 (128 x 128 block) kv_b_proj is dequantised to the model dtype for its "
    "per-head w_kc / w_vc copies (before: kept fp8, block_quant_to_tensor_quant)",
    Side(None, False, "0.4.6 models/deepseek_v2.py:1553-1566, :1594-1595"),
    Side("0.4.7", True, "0.4.7 models/deepseek_v2.py:1842-1862, :1903-1906; 0.5.6 :3584-3602, :3653-3657"),
)
DSA_INDEXER_GATE_FP32: Rule[bool] = Rule(
    "dsa_indexer_gate_fp32",
    "a DSA indexer's weights_proj is kept in fp32 (before: unquantised, in the model dtype)",
    Side(None, False, "0.5.3 layers/attention/nsa/nsa_indexer.py:148-154; 0.5.5 :141-147"),
    Side("0.5.6", True, "0.5.6 layers/attention/nsa/nsa_indexer.py:148-155"),
)

# --- request states of hybrid Mamba / linear-attention models (states.py) -------------------------

FIXED_STATE_SLOTS: Rule[bool] = Rule(
    "fixed_state_slots",
    "every hybrid model's state is a fixed max_mamba_cache_size of slots (no radix cache)",
    Side(None, True, "0.5.2 model_executor/model_runner.py:308-325, :1125-1131; 0.5.3 :360-372"),
    Side("0.5.4", False, "0.5.4 model_executor/model_runner.py:1443-1467"),
)
MAMBA2_FIXED_STATE_SLOTS: Rule[bool] = Rule(
    "mamba2_fixed_state_slots",
    "a Mamba2 model's (Nemotron-H, Falcon-H1) state stays fixed slots (0.5.7-0.5.8 taken as 0.5.6)",
    Side(None, True, "0.5.4 model_executor/model_runner.py:402-405, :1443-1452; 0.5.6 :450"),
    Side("0.5.9", False, "0.5.9 model_executor/model_runner_kv_cache_mixin.py:151-210"),
)
STATE_SLOTS_DP_DIVIDED: Rule[bool] = Rule(
    "state_slots_dp_divided",
    "a GDN model's default state-slot count is divided by dp under DP attention",
    Side(None, False, "0.5.2 model_executor/model_runner.py:308-325"),
    Side("0.5.4", True, "0.5.4 model_executor/model_runner.py:1470-1473; 0.5.6 :1487-1490"),
    Side("0.5.9", False, "0.5.9 model_executor/model_runner_kv_cache_mixin.py:172-203"),
)
STATE_PADDING_SLOT: Rule[bool] = Rule(
    "state_padding_slot",
    "the ratio's state slots count one more for the pool's padding",
    Side(None, False, "0.5.9 model_executor/model_runner_kv_cache_mixin.py:151-210"),
    Side("0.5.17", True, "0.5.17 kv_cache_configurator.py:1911, :1978; 0.5.23 :3368-3409"),
)

RULES: tuple[Rule[Any], ...] = (
    FRACTION_FORMULA,
    NO_GPU_FRACTION,
    TABLE_8_RANKS,
    TABLE_COUNTS_PP,
    LARGE_CARD_FRACTION,
    RESERVE_VLM_FACTOR,
    VLM_RUNTIME_FACTOR,
    SMALL_CARD_DEFAULTS,
    PIECEWISE_GRAPHS,
    PIECEWISE_OFF_DP_ATTENTION,
    PIECEWISE_OFF_DCP,
    PIECEWISE_OFF_DSA,
    AITER_LONG_CONTEXT_FACTOR,
    LM_ONLY_FLAG,
    LM_ONLY_NOT_MULTIMODAL,
    LM_ONLY_TOWERLESS,
    MM_RESERVATION,
    DSA_FP8_LATENT_CELL,
    DSA_INDEXER_CELL,
    DSA_INDEXER_BUFFER,
    SWA_SPLIT,
    REQUEST_SLOTS,
    REQUEST_TABLE_PADDING_ROW,
    MLA_FP8_UP_PROJ_DEQUANT,
    DSA_INDEXER_GATE_FP32,
    FIXED_STATE_SLOTS,
    MAMBA2_FIXED_STATE_SLOTS,
    STATE_SLOTS_DP_DIVIDED,
    STATE_PADDING_SLOT,
)
