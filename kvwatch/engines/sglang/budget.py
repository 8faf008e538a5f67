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
from kvwatch.capacity.dims import ATTENTION, EMBED
from kvwatch.capacity.model import LayerSpec, ModelGeometry, stage_layers
from kvwatch.capacity.weights import weight_bytes_of
from kvwatch.core.units import MiB
from kvwatch.core.versions import version_tuple

DEFAULT_PAGE_SIZE = 1
DSA_PAGE_SIZE = 64
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
# State slots a hybrid GDN model keeps up to 0.5.3 when --max-running-requests is not set.
FIXED_MAMBA_SLOTS = 512
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


def gpu_defaults(gpu_mem_mb: float, tp: int, version: str | None = None) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) SGLang picks for a card of this size: < 35 GiB
    cards get 2048 and 16 / 80 (tp < 4 / tp >= 4) up to 0.5.4 (0.5.3 server_args.py:575-585, 0.5.4
    :685-695), 24 / 80 from 0.5.6 (0.5.6 :745-753; 0.5.9 :911-975; 0.5.5, not read, taken as 0.5.6)
    to 0.5.19, 4096 and 48 / 160 from 0.5.20 (0.5.20 arg_groups/memory_hook.py:100-117)."""
    v = version_tuple(version)
    if gpu_mem_mb < 20 * 1024:
        return 2048, 8
    if gpu_mem_mb < 35 * 1024:
        if v is not None and v < (0, 5, 5):
            return 2048, 16 if tp < 4 else 80
        if v is not None and v < (0, 5, 20):
            return 2048, 24 if tp < 4 else 80
        return 4096, 48 if tp < 4 else 160
    if gpu_mem_mb < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem_mb < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def prefill_graph_sizes(chunked_prefill_size: int) -> int:
    """How many piecewise/prefill CUDA-graph sizes SGLang captures: 4..32 step 4, 48..256 step 16,
    288..512 step 32, 576..1024 step 64, 1280..4096 step 256, 4608.. step 512, up to the chunk
    (0.5.12.post1 server_args.py:1657-1675; 0.5.23 arg_groups/cuda_graph_hook.py:480-497)."""
    steps = ((4, 32, 4), (48, 256, 16), (288, 512, 32), (576, 1024, 64), (1280, 4096, 256))
    sizes = [n for lo, hi, step in steps for n in range(lo, hi + 1, step)]
    sizes += list(range(4608, max(chunked_prefill_size, 4608) + 1, 512))
    return sum(1 for n in sizes if n <= chunked_prefill_size)


def _prefill_graph_reserve(d: Deployment, model: ModelGeometry | None, chunked: int) -> float:
    """MiB the default fraction keeps for the piecewise/prefill CUDA graphs: 8 per capture size, 1536
    for MLA models; on by default from 0.5.10 (0.5.10.post1 server_args.py:637, :1308-1311), and none
    where SGLang turns them off first -- DP attention (up to 0.5.22; 0.5.23 only on ROCm), PP > 1, a
    vision tower, Qwen3-Next, DeepSeek sparse attention up to 0.5.14 (0.5.12.post1
    server_args.py:1301-1370; 0.5.23 arg_groups/cuda_graph_hook.py)."""
    v = version_tuple(d.engine_version)
    if v is not None and v < (0, 5, 10):
        return 0.0
    dims = model.dims if model is not None else None
    mla = model is not None and model.is_mla
    dsa = model is not None and any(is_dsa(layer) for layer in model.layers)
    off = (
        (d.dp_attention and d.dp > 1 and (v is not None and v < (0, 5, 23)))
        or d.pp > 1
        or (dims is not None and dims.has_vision_tower)
        or (model is not None and model.model_type.startswith(("qwen3_next", "deepseek_v4")))
        or (dsa and v is not None and v < (0, 5, 15))
    )
    if off:
        return 0.0
    return 1536.0 if mla else prefill_graph_sizes(chunked) * 8.0


def _vision_factor(model: ModelGeometry | None) -> float:
    """The default fraction's multiplier for a vision model: 0.95 x clamp(1 - 0.1 x (L H^2 /
    (24 x 1024^2) - 1), 0.8, 1.05), L and H of its vision_config (0.5.3 server_args.py:3105-3140;
    0.5.9 :5483; 0.5.23 arg_groups/memory_hook.py:417-462)."""
    dims = model.dims if model is not None else None
    if dims is None or not dims.has_vision_tower:
        return 1.0
    layers, hidden = dims.vision_layers or 24, dims.vision_hidden or 1024
    return 0.95 * min(max(1 - 0.1 * (layers * hidden**2 / (24 * 1024**2) - 1), 0.8), 1.05)


def _table(parallel: int, v: tuple[int, ...]) -> float:
    """0.2.15 - 0.4.7's fraction by parallel size (0.81 at 8 ranks from 0.4, 0.83 before)."""
    table = ((16, 0.79), (8, 0.81 if v >= (0, 4) else 0.83), (4, 0.85), (2, 0.87), (1, 0.88))
    return next(f for size, f in table if parallel >= size)


def _old_fraction(d: Deployment, v: tuple[int, ...], gpu_mb: float) -> StaticFraction:
    """Before 0.4.8: the table by TP (0.4.3.post4 server_args.py:203-214); 0.4.6 takes
    (card - 13 GiB) / card above 80 GiB (0.4.6 :224-237); 0.4.7 keeps the table up to 80 GiB, 0.79
    above 180 GB and min(f + 48 GiB x (1 - f) / card, (card - 18 GiB) / card) above 96 GiB
    (0.4.7 :253-283; the table counts TP x PP from 0.4.7)."""
    parallel = d.tp * d.pp if v >= (0, 4, 7) else d.tp
    value = _table(parallel, v)
    rule = "table by tp"
    if v >= (0, 4, 7):
        if gpu_mb > 81920:
            value = 0.88
        if gpu_mb > 180 * 1000:
            value, rule = 0.79, "0.79 above 180 GB"
        elif gpu_mb > 96 * 1024:
            value = min(value + 48 * 1024 * (1 - value) / gpu_mb, (gpu_mb - 18 * 1024) / gpu_mb)
            rule = "48 GiB share above 96 GiB"
    elif v >= (0, 4, 6) and gpu_mb > 81920:
        value, rule = (gpu_mb - 13 * 1024) / gpu_mb, "card - 13 GiB above 80 GiB"
    return StaticFraction(value, gpu_mb * (1 - value), d.chunked_prefill_size, d.cuda_graph_max_bs, rule)


def default_mem_fraction_static(d: Deployment, model: ModelGeometry | None = None) -> StaticFraction:
    """SGLang's default mem_fraction_static for this GPU, parallelism, version (and model, whose
    attention kind and vision tower change the reserve from 0.5.9/0.5.10)."""
    v = version_tuple(d.engine_version)
    parallel = d.tp * d.pp
    if d.gpu_memory_bytes is None:
        # No GPU information: 0.88 up to 0.5.19, 0.95 from 0.5.20 (memory_hook.py:320 @0.5.20).
        fallback = 0.88 if v is not None and v < (0, 5, 20) else 0.95
        return StaticFraction(
            fallback, 0.0, d.chunked_prefill_size, d.cuda_graph_max_bs, "no GPU memory known"
        )
    gpu_mb = d.gpu_memory_bytes / MiB
    if v is not None and v < (0, 4, 8):
        return _old_fraction(d, v, gpu_mb)
    if v is not None and v < (0, 5, 3):
        # 0.4.8 - 0.5.2: a reserve by card size (0.4.8.post1 server_args.py:287-313; 0.5.2 :452-497).
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
        return StaticFraction(
            value, reserved, d.chunked_prefill_size, d.cuda_graph_max_bs, "reserve by GPU size"
        )
    chunked, max_bs = gpu_defaults(gpu_mb, d.tp, d.engine_version)
    chunked = d.chunked_prefill_size or chunked
    max_bs = d.cuda_graph_max_bs or max_bs
    reserved = 512 + max(chunked, 2048) * 1.5 + d.tp * d.pp / 8 * 1024 + max_bs * 2
    rule = "512 + activation x 1.5 + tp*pp/8 GiB + graphs x 2"
    if d.dp_attention and d.dp > 1:
        # DP attention: + max_bs x dp x 3, and x 1.5 more past 300 (0.5.9 server_args.py:1040-1045).
        reserved += max_bs * d.dp * 3 + (max_bs * d.dp * 1.5 if max_bs > 300 else 0)
        rule += " + dp attention graphs"
    prefill = _prefill_graph_reserve(d, model, chunked)
    if prefill:
        reserved += prefill
        rule += " + prefill graphs"
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    value = round((gpu_mb - reserved) / gpu_mb, 3)
    if v is None or v >= (0, 5, 3):
        factor = _vision_factor(model)
        if factor != 1.0:
            value, rule = value * factor, rule + f", x {factor:.3f} for the vision tower"
    return StaticFraction(value, reserved, chunked, max_bs, rule)


def state_bytes_per_request(model: ModelGeometry, d: Deployment) -> int:
    """One request's Mamba / linear-attention state on one rank (configs/mamba_utils.py:116-125,
    :222-230 @0.5.23): the conv window in bf16 (SGLANG_MAMBA_CONV_DTYPE) and the recurrent state in
    fp32, SGLang's default ssm dtype (:47-107); 0 when a layer's shape is not in config.json."""
    total = 0
    for layer in model.layers:
        if layer.kind not in ("linear", "mamba"):
            continue
        if not layer.state_heads:
            return 0
        conv = layer.state_conv_channels // d.tp * layer.state_conv_width * 2
        total += conv + max(1, layer.state_heads // d.tp) * layer.state_head_elems * 4
    return total


def attention_tp(d: Deployment) -> int:
    """The ranks one attention layer is split over: tp / dp under DP attention (attn_tp, 0.5.9
    layers/dp_attention.py:230-244; 0.5.23 runtime_context.py:73-76), else tp."""
    if d.dp_attention and d.dp > 1:
        return max(1, d.tp // d.dp)
    return d.tp


def heads_tp(d: Deployment) -> int:
    """The divisor of the KV heads on one rank: attn_tp / dcp (0.5.18 pool_configurator.py:327)."""
    return max(1, attention_tp(d) // d.dcp)


def dp_attention_weights(model: ModelGeometry, d: Deployment) -> int:
    """Bytes per rank DP attention adds to the weights: each attention layer is split over attn_tp
    ranks, not tp, so a rank holds tp / attn_tp times its share; and the token embedding is not
    split at all (VocabParallelEmbedding(enable_tp=not is_dp_attention_enabled()), models/
    deepseek_v2.py, llama4.py, qwen2.py ...; the head stays vocabulary-parallel unless
    --enable-dp-lm-head)."""
    attn_tp = attention_tp(d)
    if attn_tp == d.tp:
        return 0
    attention = weight_bytes_of(model, ATTENTION)
    embed = weight_bytes_of(model, EMBED)
    return int(attention / attn_tp - attention / d.tp) // max(d.pp, 1) + int(embed - embed / d.tp)


def multimodal_reservation(model: ModelGeometry, d: Deployment) -> int:
    """From 0.5.18 a multimodal model's budget keeps SGLANG_VLM_CACHE_SIZE_MB (100) for the encoder
    cache (0.5.18 mem_cache/kv_cache_configurator.py:130, :1789; 0.5.23 :202-219)."""
    v = version_tuple(d.engine_version)
    dims = model.dims
    if dims is None or not dims.has_vision_tower or (v is not None and v < (0, 5, 18)):
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
    if elem_bytes == 1 and (v is None or v >= (0, 5, 17)):
        latent = _dsa_fp8_latent(layer)
    else:
        latent = layer.head_size_k * elem_bytes
    indexer = layer.extra_bytes_per_token if v is None or v >= (0, 5, 4) else 0
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
    v = version_tuple(version)
    latent = _dsa_fp8_latent(layer) if elem_bytes == 1 else layer.head_size_k * elem_bytes
    indexer = layer.extra_bytes_per_token if v is None or v >= (0, 5, 4) else 0
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
        ratio = DEFAULT_MAMBA_FULL_MEMORY_RATIO
        state_budget = available * ratio / (1 + ratio)
        per_req = state_bytes_per_request(model, d)
        v = version_tuple(d.engine_version)
        mamba2 = any(layer.kind == "mamba" for layer in model.layers)
        fixed = v is not None and (v < (0, 5, 4) or (mamba2 and v < (0, 5, 9)))
        if per_req and fixed:
            # Without the radix cache the state is a fixed max_mamba_cache_size of slots:
            # max_running_requests, else 512, / dp under DP attention. A GDN model runs so up to
            # 0.5.3 (0.5.2 model_executor/model_runner.py:308-325, :1125-1131; 0.5.3 :360-372); a
            # Mamba2 model (Nemotron-H, Falcon-H1) up to 0.5.6 as read (0.5.4 model_runner.py:402-405,
            # :1443-1452; 0.5.6 :450), 0.5.7-0.5.8 taken as 0.5.6.
            slots = FIXED_MAMBA_SLOTS // (d.dp if d.dp_attention and d.dp > 1 else 1)
            kv_bytes = available - slots * per_req
            notes.append(
                f"Mamba/linear-attention state: {slots} fixed request slots of {per_req:,} B (max_mamba_cache_size)"
            )
        elif per_req:
            # From 0.5.4 as many whole request states as mamba_full_memory_ratio's share holds
            # (0.5.4 model_runner.py:1443-1467); from 0.5.17 one more slot for the pool's padding
            # (0.5.9 model_runner_kv_cache_mixin.py:151-210; 0.5.17 kv_cache_configurator.py:1911/1978;
            # 0.5.23 :3368-3409). The KV cache gets the rest.
            if v is None or v >= (0, 5, 17):
                slots = max(int((state_budget - per_req) // per_req), 0) + 1
            else:
                slots = int(state_budget // per_req)
            kv_bytes = available - slots * per_req
            notes.append(
                f"Mamba/linear-attention state: {slots:,} request slots of {per_req:,} B "
                f"({ratio}/(1+{ratio}) of the budget, mamba_full_memory_ratio)"
            )
        else:
            kv_bytes = int(available / (1 + ratio))
            exact = False
            notes.append(
                f"Mamba/linear-attention state takes {ratio}/(1+{ratio}) of the budget (mamba_full_memory_ratio); "
                "its shape is not in config.json"
            )
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
        v = version_tuple(d.engine_version)
        if v is not None and v < (0, 5, 9):
            # set_num_token_hybrid (0.4.10-0.5.8): all-layer tokens shared out by layer counts.
            base = available // (cell + swa_cell)
            tokens = int(base * (n_sliding + n_full) / (ratio * n_sliding + n_full))
        elif v is not None and v < (0, 5, 11):
            # 0.5.9-0.5.10 (model_runner_kv_cache_mixin.py:251-335 @0.5.9): the all-layer tokens,
            # then shared out by memory: full = tokens x cell_all / (F + r x S).
            base = available // (cell + swa_cell)
            tokens = int(base * (cell + swa_cell) / (cell + ratio * swa_cell))
        else:
            # HybridSWAPoolConfigurator (0.5.11 pool_configurator.py:184; 0.5.23 :656-920): one token
            # costs the full layers plus ratio x the SWA layers.
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
