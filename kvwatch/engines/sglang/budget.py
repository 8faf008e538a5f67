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

from kvwatch.capacity.deployment import Deployment, version_tuple
from kvwatch.capacity.model import LayerSpec, ModelGeometry, stage_layers
from kvwatch.units import GiB, MiB

# Memory torch.distributed and the CUDA context take before weights load (the 'Init torch
# distributed ends. mem usage=' line, typically 0.5-0.7 GiB); an estimate when not measured.
DEFAULT_CONTEXT_BYTES = 6 * GiB // 10
DEFAULT_PAGE_SIZE = 1
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
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


def gpu_defaults(gpu_mem_mb: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) SGLang picks for a card of this size."""
    if gpu_mem_mb < 20 * 1024:
        return 2048, 8
    if gpu_mem_mb < 35 * 1024:
        return 4096, 48 if tp < 4 else 160
    if gpu_mem_mb < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem_mb < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def default_mem_fraction_static(d: Deployment) -> StaticFraction:
    """SGLang's default mem_fraction_static for this GPU, parallelism and version."""
    v = version_tuple(d.engine_version)
    parallel = d.tp * d.pp
    if d.gpu_memory_bytes is None:
        return StaticFraction(0.88, 0.0, d.chunked_prefill_size, d.cuda_graph_max_bs, "no GPU memory known")
    gpu_mb = d.gpu_memory_bytes / MiB
    if v is not None and v < (0, 4, 9):
        # 0.2.15 - 0.4.8: a table by parallel size.
        table = ((16, 0.79), (8, 0.81 if v >= (0, 4) else 0.83), (4, 0.85), (2, 0.87), (1, 0.88))
        value = next(f for size, f in table if parallel >= size)
        return StaticFraction(
            value, gpu_mb * (1 - value), d.chunked_prefill_size, d.cuda_graph_max_bs, "table by tp"
        )
    if v is not None and v < (0, 5, 3):
        if gpu_mb < 35 * 1024:
            reserved = (2.8 + parallel / 10) * 1024
        elif gpu_mb < 90 * 1024:
            reserved = (9.5 + parallel / 2) * 1024
        elif gpu_mb < 160 * 1024:
            reserved = (12 + parallel / 2) * 1024
        else:
            reserved = 32 * 1024
        value = round((gpu_mb - reserved) / gpu_mb, 3)
        return StaticFraction(
            value, reserved, d.chunked_prefill_size, d.cuda_graph_max_bs, "reserve by GPU size"
        )
    chunked, max_bs = gpu_defaults(gpu_mb, d.tp)
    chunked = d.chunked_prefill_size or chunked
    max_bs = d.cuda_graph_max_bs or max_bs
    reserved = 512 + max(chunked, 2048) * 1.5 + d.tp * d.pp / 8 * 1024 + max_bs * 2
    if gpu_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    value = round((gpu_mb - reserved) / gpu_mb, 3)
    return StaticFraction(
        value, reserved, chunked, max_bs, "512 + activation x 1.5 + tp*pp/8 GiB + graphs x 2"
    )


def layer_cell(layer: LayerSpec, tp_for_heads: int, elem_bytes: int) -> int:
    """Bytes per token one layer adds to SGLang's cell size on one rank."""
    if layer.kind != "mla":
        return layer.bytes_per_token(tp_for_heads, elem_bytes)
    if elem_bytes == 1 and layer.extra_bytes_per_token:
        # DSA models keep fp8 latents with a 4-byte scale per 128 and the rope part in bf16
        # (calculate_mla_kv_cache_dim), plus the indexer key.
        lora = layer.head_size_k - _DSA_ROPE_DIM
        return lora + lora // 128 * 4 + _DSA_ROPE_DIM * 2 + layer.extra_bytes_per_token
    return layer.head_size_k * elem_bytes + layer.extra_bytes_per_token


def cell_size(model: ModelGeometry, d: Deployment, elem_bytes: int) -> int:
    """Bytes per token over one rank's growing KV layers (largest pipeline stage)."""
    tp_for_heads = max(1, d.tp // d.dcp)
    return max(
        sum(layer_cell(layer, tp_for_heads, elem_bytes) for layer in stage if layer.grows)
        for stage in stage_layers(model.layers, d.pp)
    )


def all_layer_cell_size(model: ModelGeometry, d: Deployment, elem_bytes: int) -> int:
    """Cell size counting every attention layer, sliding ones included (hybrid SWA sizing)."""
    tp_for_heads = max(1, d.tp // d.dcp)
    return max(
        sum(layer_cell(layer, tp_for_heads, elem_bytes) for layer in stage if layer.is_paged)
        for stage in stage_layers(model.layers, d.pp)
    )


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
    page = d.page_size or d.block_size or DEFAULT_PAGE_SIZE
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
        kv_bytes = int(available / (1 + ratio))
        notes.append(
            f"Mamba/linear-attention state takes {ratio}/(1+{ratio}) of the budget (mamba_full_memory_ratio)"
        )
        tokens = kv_bytes // cell
        exact = False
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
        if v is not None and v < (0, 5, 19):
            # set_num_token_hybrid (0.4.10-0.5.x): all-layer tokens shared out by layer counts.
            base = available // (cell + swa_cell)
            tokens = int(base * (n_sliding + n_full) / (ratio * n_sliding + n_full))
        else:
            # HybridSWAPoolConfigurator: one token costs the full layers plus ratio x the SWA layers.
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
