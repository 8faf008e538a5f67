"""SGLang's arithmetic: the default mem_fraction_static, the cell size and max_total_num_tokens.

Mirrors python/sglang/srt/arg_groups/memory_hook.py (0.5.19+; server_args.py before) for the
default static fraction, and pool_configurator.py / model_runner.py ``profile_max_num_token`` for
the pool: ``rest = free_before_weights x mem_fraction_static - weights``,
``tokens = rest // cell_size``, rounded down to whole pages. Hybrid sliding-window models split the
tokens between a full and a window pool (swa_full_tokens_ratio); hybrid Mamba models set part of
the rest aside for state first (mamba_full_memory_ratio).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.model import LayerSpec, ModelGeometry, stage_layers
from kvwatch.core.units import MiB
from kvwatch.core.versions import version_tuple
from kvwatch.engines.sglang import releases, states

DEFAULT_PAGE_SIZE = 1
DSA_PAGE_SIZE = 64
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8
# The rope part of the MLA latent (qk_rope_head_dim) in DeepSeek sparse-attention models.
_DSA_ROPE_DIM = 64


@dataclass(frozen=True)
class StaticFraction:
    """The default mem_fraction_static and the terms it came from (MB as SGLang counts them)."""

    value: float
    reserved_mb: float
    chunked_prefill_size: int | None
    cuda_graph_max_bs: int | None
    rule: str


def attention_tp(d: Deployment) -> int:
    """The attention tensor-parallel size: tp / dp under --enable-dp-attention, else tp
    (compute_dp_attention_world_info, 0.5.4 layers/dp_attention.py:208-214; 0.5.9 :230-244).
    KV heads, the attention weights and (DeepSeek) the embedding are split over this group only."""
    if d.dp_attention and d.dp > 1:
        return max(1, d.tp // d.dp)
    return d.tp


def heads_tp(d: Deployment) -> int:
    """The TP size the KV heads of one rank are divided by: attention TP, over DCP (0.5.18
    get_num_kv_heads(attn_tp, dcp), pool_configurator.py:327)."""
    return max(1, attention_tp(d) // d.dcp)


def gpu_mem_mib(d: Deployment) -> float | None:
    """The card size SGLang's heuristic reads: nvidia-smi's memory.total (get_device_memory_capacity,
    0.5.8 utils/common.py:1663-1698), which is the catalogue's nvidia-smi figure, not torch's total."""
    card = gpus.find(d.gpu_name)
    if card is not None:
        return card.memory_bytes / MiB
    return d.gpu_memory_bytes / MiB if d.gpu_memory_bytes is not None else None


def gpu_defaults(gpu_mem_mb: float, tp: int, version: str | None = None) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) SGLang picks for a card of this size.

    Cards under 35 GiB: chunk 2048 and graphs up to 16 (tp < 4) / 80 in 0.5.3-0.5.4 (0.5.4
    server_args.py:685-697), 24 / 80 in 0.5.5-0.5.19 (0.5.9 server_args.py:953-955), 4096 and
    48 / 160 from 0.5.20 (arg_groups/memory_hook.py:100-117 @0.5.20).
    """
    if gpu_mem_mb < 20 * 1024:
        return 2048, 8
    if gpu_mem_mb < 35 * 1024:
        chunked, small_tp, large_tp = releases.SMALL_CARD_DEFAULTS.at(version)
        return chunked, small_tp if tp < 4 else large_tp
    if gpu_mem_mb < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem_mb < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def piecewise_capture_sizes(max_tokens: int) -> int:
    """How many prefill (piecewise) CUDA-graph sizes SGLang captures up to ``max_tokens``: 4..32 by
    4, 48..256 by 16, 288..512 by 32, 576..1024 by 64, 1280..4096 by 256, then by 512
    (0.5.12 server_args.py:1657-1675; 0.5.23 arg_groups/cuda_graph_hook.py:480-497)."""
    steps = (
        (4, 32, 4),
        (48, 256, 16),
        (288, 512, 32),
        (576, 1024, 64),
        (1280, 4096, 256),
        (4608, max_tokens, 512),
    )
    return sum(1 for lo, hi, step in steps for n in range(lo, hi + 1, step) if n <= max_tokens)


def aiter_factor(model: ModelGeometry, d: Deployment, context_len: int) -> float:
    """SGLang's factor on any mem_fraction_static, given or default, on a ROCm card whose default
    attention backend is aiter (every MHA model: 0.5.6 server_args.py:1301-1302) when the context
    is over 8192 tokens: x 0.85 from 0.5.5 (releases.AITER_LONG_CONTEXT_FACTOR). An MLA model takes
    aiter only at 16 or 128 heads a rank (:1315-1321), which kvwatch does not count: not applied.
    0.5.23 keeps a typed fraction under SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION (off by default)."""
    factor = releases.AITER_LONG_CONTEXT_FACTOR.at(d.engine_version)
    card = gpus.find(d.gpu_name)
    if factor == 1.0 or card is None or card.vendor != "amd" or model.is_mla or context_len <= 8192:
        return 1.0
    return factor


def served_as_text(d: Deployment) -> bool:
    """--language-model-only on a release that takes it (0.5.18+): SGLang skips the vision factor."""
    return bool(d.language_model_only) and releases.LM_ONLY_FLAG.at(d.engine_version)


def multimodal(model: ModelGeometry | None, d: Deployment) -> bool:
    """Whether SGLang's model config counts the model as multimodal (model_config.is_multimodal): a
    vision tower, unless --language-model-only makes it text-only (0.5.20+; before, only the
    checkpoint's own flag did)."""
    dims = model.dims if model is not None else None
    if dims is None or not dims.has_vision_tower:
        return False
    return not (served_as_text(d) and releases.LM_ONLY_NOT_MULTIMODAL.at(d.engine_version))


def piecewise_reserved(model: ModelGeometry | None, d: Deployment, chunked: int) -> float:
    """The prefill CUDA-graph term of the reserve (MB): on by default from 0.5.10
    (disable_piecewise_cuda_graph=False, 0.5.10.post1 server_args.py:637; term :1308, MLA 1.5 GiB
    :1311; 0.5.23 arg_groups/memory_hook.py:383-390), except where SGLang turns the graphs off before
    sizing: DP attention (0.5.10-0.5.22; 0.5.23 only on ROCm), PP > 1, DCP > 1 (0.5.23), multimodal,
    non-CUDA cards, and the architectures of piecewise_cuda_graph_disabled_model_archs
    (Qwen3-Next and DeepSeek-V4 in every release; DeepSeek sparse attention -- DeepseekV32,
    GlmMoeDsa -- up to 0.5.12: 0.5.12.post1 configs/model_config.py:1558-1566, gone from 0.5.13.post1
    :1579-1585) (0.5.12.post1 server_args.py:1301-1370; 0.5.23 arg_groups/cuda_graph_hook.py,
    configs/model_config.py:2475-2483)."""
    v = version_tuple(d.engine_version)
    if not releases.PIECEWISE_GRAPHS.at(v):
        return 0.0
    card = gpus.find(d.gpu_name)
    rocm = card is not None and card.vendor != "nvidia"
    if d.dp_attention and d.dp > 1 and (rocm or releases.PIECEWISE_OFF_DP_ATTENTION.at(v)):
        return 0.0
    if d.pp > 1 or rocm or (d.dcp > 1 and releases.PIECEWISE_OFF_DCP.at(v)):
        return 0.0
    if model is not None:
        if multimodal(model, d):
            return 0.0
        if model.architecture.startswith(("Qwen3Next", "DeepseekV4")):
            return 0.0
        if any(is_dsa(layer) for layer in model.layers) and releases.PIECEWISE_OFF_DSA.at(v):
            return 0.0
        if model.is_mla:
            return 1.5 * 1024
    return piecewise_capture_sizes(chunked) * 8.0


# SGLang's own vision_config classes (by architecture; model_type kimi_k25) whose defaults stand
# for a tower config.json describes under other names (KimiK25VisionConfig: num_hidden_layers 27,
# hidden_size 1152, 0.5.9 configs/kimi_k25.py:44-45; config.json's vt_* keys are not read).
_TOWER_DEFAULTS = {"KimiK25ForConditionalGeneration": (27, 1152)}


def vlm_factor(model: ModelGeometry | None) -> float:
    """adjust_mem_fraction_for_vlm (0.5.2 server_args.py:2513-2549; 0.5.9 :5483-5520; 0.5.23
    arg_groups/memory_hook.py:417-462): 0.95 x clamp(1 - 0.1 x (L x H^2 / (24 x 1024^2) - 1), 0.8,
    1.05) for a model with a vision_config, L and H its num_hidden_layers and hidden_size
    (dims.vision_layers / vision_hidden), else its SGLang config class's defaults, else getattr's
    24 and 1024:
    ViT-L/14 gives 0.95, Kimi-K2.5's MoonViT (27 x 1152) 0.9097."""
    dims = model.dims if model is not None else None
    if dims is None or not dims.has_vision_tower:
        return 1.0
    default = _TOWER_DEFAULTS.get(model.architecture, (24, 1024)) if model is not None else (24, 1024)
    layers, hidden = dims.vision_layers or default[0], dims.vision_hidden or default[1]
    return 0.95 * min(max(1 - 0.1 * (layers * hidden**2 / (24 * 1024**2) - 1), 0.8), 1.05)


def _table(parallel: int, v: tuple[int, ...] | None) -> float:
    """0.2.15 - 0.4.7's fraction by parallel size (0.81 at 8 ranks from 0.4, 0.83 before)."""
    table = ((16, 0.79), (8, releases.TABLE_8_RANKS.at(v)), (4, 0.85), (2, 0.87), (1, 0.88))
    return next(f for size, f in table if parallel >= size)


def _old_fraction(d: Deployment, v: tuple[int, ...] | None, gpu_mb: float) -> StaticFraction:
    """Before 0.4.8: the table by TP (0.4.3.post4 server_args.py:203-214); 0.4.6 takes
    (card - 13 GiB) / card above 80 GiB (0.4.6 :224-237); 0.4.7 keeps the table up to 80 GiB, 0.79
    above 180 GB on CUDA and min(f + 48 GiB x (1 - f) / card, (card - 18 GiB) / card) above 96 GiB
    (0.4.7 :253-283; the table counts TP x PP from 0.4.7)."""
    parallel = d.tp * d.pp if releases.TABLE_COUNTS_PP.at(v) else d.tp
    value = _table(parallel, v)
    rule = "table by tp"
    large = releases.LARGE_CARD_FRACTION.at(v)
    if large == "share_48_gib":
        if gpu_mb > 81920:
            value = 0.88
        card = gpus.find(d.gpu_name)
        if gpu_mb > 180 * 1000 and (card is None or card.vendor == "nvidia"):
            value, rule = 0.79, "0.79 above 180 GB"
        elif gpu_mb > 96 * 1024:
            value = min(value + 48 * 1024 * (1 - value) / gpu_mb, (gpu_mb - 18 * 1024) / gpu_mb)
            rule = "48 GiB share above 96 GiB"
    elif large == "minus_13_gib" and gpu_mb > 81920:
        value, rule = (gpu_mb - 13 * 1024) / gpu_mb, "card - 13 GiB above 80 GiB"
    return StaticFraction(value, gpu_mb * (1 - value), d.chunked_prefill_size, d.cuda_graph_max_bs, rule)


def default_mem_fraction_static(d: Deployment, model: ModelGeometry | None = None) -> StaticFraction:
    """SGLang's default mem_fraction_static for this GPU, parallelism, model and version."""
    v = version_tuple(d.engine_version)
    parallel = d.tp * d.pp
    gpu_mb = gpu_mem_mib(d)
    if gpu_mb is None:
        # No GPU information: 0.88 up to 0.5.19, 0.95 from 0.5.20 (memory_hook.py:320 @0.5.20).
        fallback = releases.NO_GPU_FRACTION.at(v)
        return StaticFraction(
            fallback, 0.0, d.chunked_prefill_size, d.cuda_graph_max_bs, "no GPU memory known"
        )
    formula = releases.FRACTION_FORMULA.at(v)
    if formula == "table":
        return _old_fraction(d, v, gpu_mb)
    if formula == "reserve_by_card":
        # 0.4.8 - 0.5.2: a reserve by card size, +4 GiB for DP attention (0.4.8.post1
        # server_args.py:287-314; 0.5.2 :452-497), the vision factor from 0.5 (0.5.2 :506).
        if gpu_mb < 35 * 1024:
            reserved = (2.8 + parallel / 10) * 1024
        elif gpu_mb < 90 * 1024:
            reserved = (9.5 + parallel / 2) * 1024
        elif gpu_mb < 160 * 1024:
            reserved = (12 + parallel / 2) * 1024
        else:
            reserved = 32 * 1024
        if d.dp_attention and d.dp > 1:
            reserved += 4 * 1024
        value = round((gpu_mb - reserved) / gpu_mb, 3)
        if releases.RESERVE_VLM_FACTOR.at(v):
            value *= vlm_factor(model)
        return StaticFraction(
            value, reserved, d.chunked_prefill_size, d.cuda_graph_max_bs, "reserve by GPU size"
        )
    chunked, max_bs = gpu_defaults(gpu_mb, d.tp, d.engine_version)
    chunked = d.chunked_prefill_size or chunked
    max_bs = d.cuda_graph_max_bs or max_bs
    # 0.5.4 server_args.py:764-799; 0.5.9 :1022-1062; 0.5.23 arg_groups/memory_hook.py:281-327.
    reserved = 512 + max(chunked, 2048) * 1.5 + d.tp * d.pp / 8 * 1024 + max_bs * 2
    rule = "512 + activation x 1.5 + tp*pp/8 GiB + graphs x 2"
    if d.dp_attention and d.dp > 1:
        reserved += max_bs * d.dp * 3 + (max_bs * d.dp * 1.5 if max_bs > 300 else 0)
        rule += " + DP-attention graphs x dp x 3"
    piecewise = piecewise_reserved(model, d, chunked)
    if piecewise:
        reserved += piecewise
        rule += " + prefill graphs"
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    value = round((gpu_mb - reserved) / gpu_mb, 3)
    factor = 1.0 if served_as_text(d) else vlm_factor(model)
    if factor != 1.0:
        value *= factor
        rule += f", x {round(factor, 4):g} (vision tower)"
    return StaticFraction(value, reserved, chunked, max_bs, rule)


def vlm_runtime_factor(model: ModelGeometry, d: Deployment) -> float:
    """0.4.x reduces any mem_fraction_static, given or not, for a multimodal model in the model
    runner: x 0.95 (0.4.3.post4 model_executor/model_runner.py:235-236; 0.4.4 :243), x 0.90 from
    0.4.5 (0.4.5 model_runner.py:273-274; 0.4.6 :307-308; 0.4.8.post1 :414-415); from 0.5 the
    server-args default does it instead."""
    dims = model.dims
    if dims is None or not dims.has_vision_tower:
        return 1.0
    return releases.VLM_RUNTIME_FACTOR.at(d.engine_version)


def multimodal_reservation(model: ModelGeometry, d: Deployment) -> int:
    """Bytes a multimodal model's KV budget keeps back from 0.5.18 for allocations made after the pool:
    SGLANG_VLM_CACHE_SIZE_MB, 100 by default (mm_runtime_reservation_gb, 0.5.18
    mem_cache/kv_cache_configurator.py:130-147; environ.py:1146), plus the feature-transport pools
    only when --mm-feature-transport is cuda_ipc / cuda_vmm (not the default)."""
    if not multimodal(model, d) or not releases.MM_RESERVATION.at(d.engine_version):
        return 0
    return 100 * MiB


def is_dsa(layer: LayerSpec) -> bool:
    """A DeepSeek sparse-attention (V3.2, NSA/DSA) MLA layer: the latent plus an indexer key."""
    return layer.kind == "mla" and layer.extra_bytes_per_token > 0


def dsa_kv_elem_bytes(model: ModelGeometry, d: Deployment, elem_bytes: int) -> int:
    """The KV element width SGLang runs a DSA model with when --kv-cache-dtype is 'auto'.

    SGLang sets fp8_e4m3 on SM >= 10 and keeps bf16 on Hopper (0.5.3 server_args.py:826-832;
    0.5.9 server_args.py:1142-1143; 0.5.23 arg_groups/overrides.py:532-535, bf16 also for learnable
    sinks). An unknown card is taken as fp8, the default SGLang names ("DeepSeek V3.2 defaults to
    FP8 KV cache", 0.5.9 server_args.py:1139).
    """
    if d.kv_cache_dtype != "auto" or not any(is_dsa(layer) for layer in model.layers):
        return elem_bytes
    card = gpus.find(d.gpu_name)
    if card is not None and card.sm_major < 10:
        return elem_bytes
    return 1


def layer_cell(layer: LayerSpec, tp_for_heads: int, elem_bytes: int, version: str | None = None) -> int:
    """Bytes per token one layer adds to the cell SGLang divides its budget by, on one rank.

    DSA (DeepSeek-V3.2) layers, per release of profile_max_num_token / the pool configurator:
    up to 0.5.3 (kv_lora_rank + qk_rope_head_dim) x element size, no indexer (0.5.3
    model_executor/model_runner.py:1274-1279); 0.5.4-0.5.16 add the fp8 indexer key with its scales,
    index_head_dim + index_head_dim / 128 x 4 = 132 B (0.5.4 model_runner.py, 'Add indexer KV cache
    overhead'; 0.5.9 model_runner_kv_cache_mixin.py:47-80); from 0.5.17 the latent is
    calculate_mla_kv_cache_dim's, which for fp8 is kv_lora_rank + kv_lora_rank / 128 x 4 + the rope
    part in bf16 = 656 B (0.5.17 model_executor/pool_configurator.py:205; 0.5.9
    model_runner_kv_cache_mixin.py:212-250).
    """
    if layer.kind != "mla":
        return layer.bytes_per_token(tp_for_heads, elem_bytes)
    if not is_dsa(layer):
        return layer.head_size_k * elem_bytes + layer.extra_bytes_per_token
    v = version_tuple(version)
    if elem_bytes == 1 and releases.DSA_FP8_LATENT_CELL.at(v):
        latent = _dsa_fp8_latent(layer)
    else:
        latent = layer.head_size_k * elem_bytes
    indexer = layer.extra_bytes_per_token if releases.DSA_INDEXER_CELL.at(v) else 0
    return latent + indexer


def _dsa_fp8_latent(layer: LayerSpec) -> int:
    lora = layer.head_size_k - _DSA_ROPE_DIM
    return lora + lora // 128 * 4 + _DSA_ROPE_DIM * 2


def buffer_cell(layer: LayerSpec, tp_for_heads: int, elem_bytes: int, version: str | None = None) -> int:
    """Bytes per token one layer's pool buffers hold: what 'KV size' counts.

    For DSA layers the fp8 buffer is 656 B wide in every release (0.5.3 mem_cache/memory_pool.py:1052-1058
    a literal 656 there; later calculate_mla_kv_cache_dim), and the indexer buffer is in the
    printed size from 0.5.4 (0.5.4 memory_pool.py:1511-1515; 0.5.3 printed the latent buffer only,
    sgl-project/sglang#11309). Other layers: their cell.
    """
    if not is_dsa(layer):
        return layer_cell(layer, tp_for_heads, elem_bytes, version)
    latent = _dsa_fp8_latent(layer) if elem_bytes == 1 else layer.head_size_k * elem_bytes
    indexer = layer.extra_bytes_per_token if releases.DSA_INDEXER_BUFFER.at(version) else 0
    return latent + indexer


def cell_size(model: ModelGeometry, d: Deployment, elem_bytes: int) -> int:
    """Bytes per token over one rank's growing KV layers (largest pipeline stage)."""
    tp_for_heads = heads_tp(d)
    elem = dsa_kv_elem_bytes(model, d, elem_bytes)
    return max(
        sum(layer_cell(layer, tp_for_heads, elem, d.engine_version) for layer in stage if layer.grows)
        for stage in stage_layers(model.layers, d.pp)
    )


def buffer_cell_size(model: ModelGeometry, d: Deployment, elem_bytes: int) -> int:
    """Bytes per token of the pool's buffers on one rank (the printed 'KV size' / #tokens)."""
    tp_for_heads = heads_tp(d)
    elem = dsa_kv_elem_bytes(model, d, elem_bytes)
    return max(
        sum(buffer_cell(layer, tp_for_heads, elem, d.engine_version) for layer in stage if layer.grows)
        for stage in stage_layers(model.layers, d.pp)
    )


def all_layer_cell_size(model: ModelGeometry, d: Deployment, elem_bytes: int) -> int:
    """Cell size counting every attention layer, sliding ones included (hybrid SWA sizing)."""
    tp_for_heads = heads_tp(d)
    elem = dsa_kv_elem_bytes(model, d, elem_bytes)
    return max(
        sum(layer_cell(layer, tp_for_heads, elem, d.engine_version) for layer in stage if layer.is_paged)
        for stage in stage_layers(model.layers, d.pp)
    )


def page_size(model: ModelGeometry, d: Deployment) -> int:
    """Tokens per page: as given, else 1 -- except DeepSeek sparse attention, which runs with pages
    of 64 on CUDA (0.5.3 server_args.py:820-821; 0.5.9 server_args.py:1256-1259; 1 on ROCm, not
    modelled)."""
    if d.page_size is not None or d.block_size is not None:
        return d.page_size or d.block_size or DEFAULT_PAGE_SIZE
    return DSA_PAGE_SIZE if any(is_dsa(layer) for layer in model.layers) else DEFAULT_PAGE_SIZE


def tokens_of_pool_bytes(model: ModelGeometry, d: Deployment, elem_bytes: int, pool_bytes: int) -> int:
    """The tokens a pool of ``pool_bytes`` printed buffer bytes holds ('KV Cache is allocated. K size:
    … V size: …'): the buffers' own bytes per token (buffer_cell_size, not the budget's cell, which
    differs for DeepSeek sparse attention), less the one padding page the pool allocates."""
    cell = buffer_cell_size(model, d, elem_bytes) or all_layer_cell_size(model, d, elem_bytes)
    if cell <= 0 or pool_bytes <= 0:
        return 0
    page = page_size(model, d)
    return max(pool_bytes // cell // page * page - page, 0)


@dataclass(frozen=True)
class SglangPool:
    page_size: int
    cell_bytes: int
    tokens: int
    swa_tokens: int | None
    notes: tuple[str, ...]
    exact: bool


def pool(model: ModelGeometry, d: Deployment, elem_bytes: int, available: int) -> SglangPool:
    """max_total_num_tokens for ``available`` bytes of KV budget on one rank."""
    page = page_size(model, d)
    notes: list[str] = []
    exact = True
    n_sliding = model.count("sliding", "chunked")
    n_full = model.count("full", "mla")
    n_state = model.count("linear", "mamba")
    swa_tokens: int | None = None
    cell = cell_size(model, d, elem_bytes) or all_layer_cell_size(model, d, elem_bytes)
    if available <= 0 or cell == 0:
        return SglangPool(page, cell, 0, None, ("no KV budget left",) if available <= 0 else (), exact)
    if n_state:
        kv_bytes, exact, note = states.kv_bytes_beside_states(model, d, available)
        notes.append(note)
        tokens = kv_bytes // cell
    elif n_sliding and not n_full:
        # Every layer windowed (Mistral-style): one pool sized over all layers.
        cell = all_layer_cell_size(model, d, elem_bytes)
        tokens = available // cell
        notes.append("every layer has a sliding window: pool sized over all layers")
    elif n_sliding:
        ratio = DEFAULT_SWA_FULL_TOKENS_RATIO
        swa_cell = all_layer_cell_size(model, d, elem_bytes) - cell
        notes.append(f"sliding-window pool holds swa_full_tokens_ratio={ratio} of the full pool's tokens")
        split = releases.SWA_SPLIT.at(d.engine_version)
        base = available // (cell + swa_cell)
        if split == "layer_counts":
            # set_num_token_hybrid (0.4.10-0.5.8): all-layer tokens shared out by layer counts
            # (0.5.6 model_executor/model_runner.py:1587-1600).
            tokens = int(base * (n_sliding + n_full) / (ratio * n_sliding + n_full))
        elif split == "byte_shares":
            # 0.5.9-0.5.10: the profiled tokens' bytes shared out by bytes per token
            # (0.5.9 model_executor/model_runner_kv_cache_mixin.py:297-330).
            tokens = int(base * (cell + swa_cell) / (cell + ratio * swa_cell))
        else:
            # HybridSWAPoolConfigurator (0.5.11 pool_configurator.py:184; 0.5.23 :656-920): one
            # token costs the full layers plus ratio x the SWA layers.
            tokens = int(available // (cell + ratio * swa_cell))
        tokens = tokens // page * page
        swa_tokens = int(tokens * ratio) // page * page
        cell = int(cell + ratio * swa_cell)
    else:
        tokens = available // cell
    tokens = tokens // page * page
    if d.dcp > 1 and model.is_mla:
        tokens *= d.dcp
    return SglangPool(page, cell, tokens, swa_tokens, tuple(notes), exact)
