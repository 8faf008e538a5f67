"""vLLM's arithmetic: the memory budget, the per-layer page, blocks, tokens and max concurrency.

Mirrors vllm/v1/worker/gpu_worker.py (requested = total x gpu_memory_utilization, minus the
profiled non-KV memory and, from 0.21, the CUDA-graph estimate) and vllm/v1/core/kv_cache_utils.py
(KV cache groups, ``num_blocks = available // page_size // num_layers``, the token count and
max concurrency it logs, the 'To serve at least one request' check and estimate_max_model_len).
Version differences that change a number are rows of releases.py; None means newest.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.model import LayerSpec, ModelGeometry, ceil_div, stage_layers
from kvwatch.engines.vllm import releases
from kvwatch.engines.vllm.hybrid import (
    drafter_layers,
    mamba_cache_mode,
    prefix_caching,
    state_block,
    state_blocks_per_request,
    with_drafter,
)

DEFAULT_BLOCK_SIZE = 16
# MLA backends force their own block size (FlashMLA 64; vllm/platforms/cuda.py).
DEFAULT_MLA_BLOCK_SIZE = 64
# FP8 DeepSeek-sparse MLA cache entry (vllm MLAAttentionSpec with cache_dtype_str 'fp8_ds_mla').
FP8_DS_MLA_BYTES = 656


def logs_tokens_from_concurrency(version: str | None) -> bool:
    """Whether 'GPU KV cache size: N tokens' is int(max_concurrency x max_model_len).

    From 0.20.1 (0.20.1 v1/core/kv_cache_utils.py:1699-1708, 0.21.0 :1701-1710): N is the tokens of
    context the pool holds at max concurrency, so a sliding-window group counts its capped
    per-request blocks, and DCP/PCP is inside max_memory_usage_bytes. Up to 0.20.0 (0.20.0
    kv_cache_utils.py:1694-1711, 0.19.0 :1302-1319): num_blocks // len(groups) x min block size,
    times dcp x pcp. 0.20.0 still has the old formula: the change is not "0.20+".
    """
    return releases.TOKENS_FROM_CONCURRENCY.at(version)


def max_concurrent_batches(d: Deployment) -> int:
    """Batches in flight at once (VllmConfig.max_concurrent_batches, 0.26.0 config/vllm.py:512-522;
    0.33.0 :588-598): async scheduling (on by default) keeps 2 at PP 1; at PP > 1 the V1 runner
    keeps pp and the V2 runner pp + 1 -- V2 is the default for every model in 0.29-0.30 and PP with
    async scheduling falls back to V1 from 0.31 (0.31.0 config/vllm.py:3124). 0.26-0.28 run dense
    models on V2 too (pp + 1 there); taken as V1 (pp) here."""
    if d.pp <= 1:
        return 2
    if releases.V2_RUNNER_PP.at(d.engine_version):
        return d.pp + 1
    return d.pp


def in_flight_tokens(d: Deployment, max_num_batched_tokens: int) -> int:
    """The tokens a sliding-window or chunked-local layer keeps beyond its window per request.

    From 0.26.0 SlidingWindowSpec / ChunkedLocalAttentionSpec count max_in_flight_tokens =
    max_concurrent_batches x max_num_batched_tokens (0.26.0 config/vllm.py:525-534,
    v1/kv_cache_interface.py:584 and :517; 0.33.0 :916-940, :864-887): async scheduling's second
    batch in flight doubles it at PP 1. Up to 0.25.1 (0.25.1 kv_cache_interface.py:561) the
    max_num_batched_tokens alone. It changes the blocks one request takes (concurrency, the logged
    token count, the fit check), not the pool.
    """
    if not releases.IN_FLIGHT_BATCHES.at(d.engine_version):
        return max_num_batched_tokens
    return max_concurrent_batches(d) * max_num_batched_tokens


def _stages(model: ModelGeometry, d: Deployment) -> list[list[LayerSpec]]:
    """The target's layers per pipeline stage, the drafter's on the last."""
    stages = stage_layers(model.layers, d.pp)
    stages[-1] = stages[-1] + drafter_layers(model, d)
    return stages


def hybrid_manager(d: Deployment) -> bool:
    """Whether sliding-window layers get their own KV groups (the hybrid allocator, 0.9.2+, unless disabled)."""
    return d.hybrid_kv_cache_manager and releases.HYBRID_ALLOCATOR.at(d.engine_version)


def largest_type_ratio(version: str | None) -> float | None:
    """Hybrid groups take the larger type's layer count as group size when it is under this
    multiple of the smaller's (else the smaller's): none up to 0.11 (0.11.0 kv_cache_utils.py:977 takes
    the min), 1.25 in 0.12-0.17 (0.12.0 :1017, 0.17.0 :1043), 1.5 from 0.18 (0.18.0 :1043,
    0.21.0 :1139)."""
    return releases.LARGEST_TYPE_RATIO.at(version)


@dataclass(frozen=True)
class Spec:
    """vLLM's KVCacheSpec for one layer on one rank."""

    kind: str  # 'full' (FullAttention/MLA), 'sliding', 'chunked', 'state' (Mamba / linear attention)
    window: int | None
    page_bytes: int
    block_size: int
    # A state layer's blocks per request (MambaSpec.max_memory_usage_bytes, state_blocks_per_request):
    # fixed ones, and in mamba_cache_mode 'all' one more per block_size tokens of the request.
    state_blocks: int = 0
    state_per_token: bool = False

    def max_memory_usage(self, max_model_len: int, max_num_batched_tokens: int, dcp: int) -> int:
        """Bytes one request of max_model_len tokens needs in this layer (spec.max_memory_usage_bytes)."""
        if self.kind == "state":
            grown = ceil_div(max_model_len, self.block_size) if self.state_per_token else 0
            return (grown + self.state_blocks) * self.page_bytes
        if self.kind == "sliding" and self.window is not None:
            n = min(self.window - 1 + max_num_batched_tokens, max_model_len)
            return (ceil_div(n, self.block_size) + 1) * self.page_bytes
        if self.kind == "chunked" and self.window is not None:
            n = min(self.window + max_num_batched_tokens, max_model_len)
            return ceil_div(n, self.block_size) * self.page_bytes
        length = ceil_div(max_model_len, dcp) if dcp > 1 else max_model_len
        return ceil_div(length, self.block_size) * self.page_bytes


@dataclass(frozen=True)
class Group:
    """One KV cache group: a spec and how many layers share its block table."""

    spec: Spec
    layers: int
    page_bytes: int  # page of the whole group spec (sum over layers for a uniform-type group)


@dataclass(frozen=True)
class VllmPool:
    """What vLLM would allocate and log for one engine."""

    block_size: int
    page_bytes: int
    groups: tuple[Group, ...]
    tensors: int  # layers sharing one pool tensor (divisor of get_num_blocks)
    num_blocks: int
    tokens: int
    max_concurrency: float
    needed_bytes: int
    padding_layers: int
    exact: bool
    notes: tuple[str, ...]


def block_size_for(model: ModelGeometry, d: Deployment) -> int:
    if d.block_size is not None:
        return d.block_size
    return DEFAULT_MLA_BLOCK_SIZE if model.is_mla else DEFAULT_BLOCK_SIZE


def layer_spec(layer: LayerSpec, d: Deployment, elem_bytes: int, block: int, hybrid: bool) -> Spec:
    if layer.kind == "mla" and d.kv_cache_dtype == "fp8_ds_mla":
        per_token = FP8_DS_MLA_BYTES + layer.extra_bytes_per_token
    else:
        per_token = layer.bytes_per_token(d.tp, elem_bytes)
    kind = "full" if layer.kind in ("full", "mla") or not hybrid else layer.kind
    return Spec(
        kind=kind,
        window=layer.window if kind != "full" else None,
        page_bytes=per_token * block,
        block_size=block,
    )


def _stage_specs(
    model: ModelGeometry,
    d: Deployment,
    stage: Sequence[LayerSpec],
    elem_bytes: int,
    block: int,
    state: tuple[int, int] | None,
) -> list[Spec]:
    """The KVCacheSpecs of one stage's layers, in layer order: the paged ones, and with a known state
    shape one MambaSpec per state layer, its page padded to the attention page
    (mamba_page_size_padded) and MambaSpec.num_speculative_blocks = num_speculative_tokens (0.25.1
    model_executor/layers/mamba/abstract.py:44-60). The order is the groups' order: vLLM groups
    same-spec layers in order of first appearance (0.18.0 v1/core/kv_cache_utils.py:956-1040,
    defaultdict over kv_cache_spec), so a model whose first layer is Gated DeltaNet / Mamba has a
    state group first -- the group 0.14-0.18's fit check reads alone (needed_rule 'first_group')."""
    paged = [layer_spec(layer, d, elem_bytes, block, hybrid_manager(d)) for layer in stage if layer.is_paged]
    if state is None or not paged:
        return paged
    blocks, per_token = state_blocks_per_request(model, d)
    mamba = Spec("state", None, paged[0].page_bytes, block, blocks, per_token)
    attention = iter(paged)
    return [
        next(attention) if layer.is_paged else mamba
        for layer in stage
        if layer.is_paged or layer.kind in ("linear", "mamba")
    ]


def plan(
    model: ModelGeometry,
    d: Deployment,
    elem_bytes: int,
    available: int,
    max_model_len: int,
    max_num_batched_tokens: int,
    stage_available: Sequence[int] | None = None,
) -> VllmPool:
    """Group layers, divide the available bytes, and work out tokens and concurrency as vLLM does.

    ``stage_available`` gives each pipeline stage its own budget (else every stage has ``available``):
    every stage allocates the smallest stage's block count.
    """
    model = with_drafter(model, d)
    block = block_size_for(model, d)
    notes: list[str] = []
    exact = True
    max_num_batched_tokens = in_flight_tokens(d, max_num_batched_tokens)
    state = state_block(model, d, elem_bytes, block)
    if state is not None:
        block = state[0]
        blocks, per_token = state_blocks_per_request(model, d)
        taken = (
            f"a block per {block} tokens" + (f" + {blocks}" if blocks else "") if per_token else f"{blocks}"
        )
        notes.append(
            f"hybrid linear-attention/Mamba model: attention block raised to {block} tokens so a page "
            f"holds one layer's state ({state[1]:,} B); mamba_cache_mode '{mamba_cache_mode(model, d)}' "
            f"(prefix caching {'on' if prefix_caching(d) else 'off'}): state layers take {taken} block(s) a request"
        )
    elif any(layer.kind in ("linear", "mamba") for layer in model.layers):
        exact = False
        notes.append(
            "hybrid linear-attention/Mamba model: vLLM pads state pages into the KV pool; its state shape "
            "is not in config.json, so blocks are estimated from the attention layers only"
        )
    stages = _stages(model, d)
    best: VllmPool | None = None
    for i, stage in enumerate(stages):
        paged = [layer for layer in stage if layer.is_paged]
        if not paged:
            continue
        specs = _stage_specs(model, d, stage, elem_bytes, block, state)
        own = stage_available[i] if stage_available is not None else available
        pool = _plan_stage(specs, own, max_model_len, max_num_batched_tokens, d, block, notes)
        if best is None or pool.num_blocks < best.num_blocks:
            best = pool
    if best is None:
        return VllmPool(block, 0, (), 0, 0, 0, 0.0, 0, 0, exact, ("model has no KV cache layers",))
    if PADDED_PAGE_NOTE in notes:
        exact = False
    if notes:
        best = VllmPool(**{**best.__dict__, "exact": exact, "notes": tuple(dict.fromkeys(notes))})
    return best


def _plan_stage(
    specs: list[Spec],
    available: int,
    max_model_len: int,
    mnbt: int,
    d: Deployment,
    block: int,
    notes: list[str],
) -> VllmPool:
    kinds = Counter((s.kind, s.window) for s in specs)
    pages = {s.page_bytes for s in specs}
    padding = 0
    groups: tuple[Group, ...]
    if len(set(specs)) == 1:
        # Every layer identical (most models): one group, one tensor per layer.
        spec = specs[0]
        groups = (Group(spec, len(specs), spec.page_bytes),)
        tensors = len(specs)
        num_blocks = max(int(available // spec.page_bytes // tensors), 0) if available > 0 else 0
        page = spec.page_bytes
    elif len(kinds) == 1:
        # One attention type, different widths (e.g. MLA + indexer, heterogeneous heads): one group,
        # each layer its own tensor of page x num_blocks (UniformTypeKVCacheSpecs).
        page = sum(s.page_bytes for s in specs)
        groups = (Group(specs[0], len(specs), page),)
        tensors = 1
        num_blocks = max(available // page, 0) if available > 0 else 0
    else:
        # Hybrid (sliding + full, state + full): groups of group_size layers sharing tensors
        # (uniform page size). 0.29-0.33 try a packed grouping first, but only for a block-outermost
        # layout with mixed page sizes (0.30.0 v1/core/kv_cache_utils.py:1993-1996; 0.33.0
        # kv_cache_planning.py:931): no default CUDA backend declares a layout, so LBNHC is
        # resolved (0.30.0 v1/attention/backends/utils.py:190-197, :204-239), and a state page is
        # already padded to the attention page (platforms/interface.py:942-962).
        # tests/test_vllm_hybrid_layout.py pins this on three 0.30.0 startups.
        page = max(pages)
        by_type: dict[tuple[str, int | None], list[Spec]] = {}
        for s in specs:
            by_type.setdefault((s.kind, s.window), []).append(s)
        group_size = min(len(v) for v in by_type.values())
        largest = max(len(v) for v in by_type.values())
        ratio = largest_type_ratio(d.engine_version)
        if ratio is not None and largest < group_size * ratio:
            group_size = largest
        group_list: list[Group] = []
        for members in by_type.values():
            n_groups = ceil_div(len(members), group_size)
            padding += n_groups * group_size - len(members)
            unified = _unified_spec(members[0], page, notes)
            group_list += [Group(unified, group_size, page)] * n_groups
        groups = tuple(group_list)
        tensors = group_size
        num_blocks = max(int(available // page // group_size), 0) if available > 0 else 0
    # Blocks one max-length request takes: the sum over groups of each group's pages.
    per_request = sum(
        ceil_div(g.spec.max_memory_usage(max_model_len, mnbt, d.dcp), g.spec.page_bytes) for g in groups
    )
    max_concurrency = num_blocks / per_request if per_request else 0.0
    if logs_tokens_from_concurrency(d.engine_version):
        tokens = int(max_concurrency * max_model_len)
    else:
        tokens = num_blocks // len(groups) * block
    if d.dcp > 1 and not logs_tokens_from_concurrency(d.engine_version):
        tokens *= d.dcp
    needed = sum(s.max_memory_usage(max_model_len, mnbt, d.dcp) for s in specs)
    return VllmPool(
        block, page, groups, tensors, num_blocks, tokens, max_concurrency, needed, padding, True, ()
    )


PADDED_PAGE_NOTE = (
    "layer types have different page sizes and a smaller one does not divide the largest: vLLM pads it "
    "to the largest page (or refuses, on backends that cannot read a padded page); estimated padded"
)


def _unified_spec(spec: Spec, page: int, notes: list[str]) -> Spec:
    """A layer's spec once vLLM gives every layer the largest page (unify_kv_cache_spec_page_size):
    an attention layer whose page divides it keeps its bytes per token and raises its block size by
    the ratio (0.13.0 v1/core/kv_cache_utils.py:897-925; 0.25.1 :1049-1094; 0.33.0
    kv_cache_planning.py:346-400), so a Gemma-4 full layer of half the sliding page holds 32
    tokens a block; a state page is padded (it does not scale with tokens), as is, from 0.25, an
    attention page that does not divide it."""
    if spec.page_bytes == page:
        return spec
    if spec.kind != "state" and page % spec.page_bytes == 0:
        return replace(spec, page_bytes=page, block_size=spec.block_size * (page // spec.page_bytes))
    if spec.kind != "state":
        notes.append(PADDED_PAGE_NOTE)
    return replace(spec, page_bytes=page)


def needed_rule(version: str | None) -> str:
    """How the 'To serve at least one request' check counts the bytes one request needs.

    'layers' (0.11-0.13): the sum over the layers' specs, per worker (0.13.0
    v1/core/kv_cache_utils.py:664 check_enough_kv_cache_memory, called at :1340).
    'first_group' (0.14-0.18): _max_memory_usage_bytes_from_groups, group_size x page x the blocks
    of group 0 only (0.18.0 kv_cache_utils.py:1329-1362), over the global (all-stage) groups
    against min(available) in 0.14-0.16 (0.16.0 :1514-1527), per worker from 0.17 (0.18.0 :1570-1579).
    'groups' (0.19+): group_size x page x the blocks summed over the groups, padding included, per
    worker (0.19.0 :1332-1367; 0.29.0 :2041-2070 is the same sum over bytes_per_block).
    """
    return releases.NEEDED_RULE.at(version)


def _stage_needed(specs: list[Spec], d: Deployment, block: int, model_len: int, mnbt: int, rule: str) -> int:
    layers = sum(s.max_memory_usage(model_len, mnbt, d.dcp) for s in specs)
    if rule == "layers" or len({(s.kind, s.window) for s in specs}) < 2:
        # One attention type: group_size x page x blocks is the layers' own sum (one group of all
        # layers, or a UniformTypeKVCacheSpecs group whose sum runs over its layers).
        return layers
    pool = _plan_stage(specs, 0, model_len, mnbt, d, block, [])
    if rule == "first_group":
        first = pool.groups[0].spec
        blocks = ceil_div(first.max_memory_usage(model_len, mnbt, d.dcp), first.page_bytes)
    else:
        blocks = sum(
            ceil_div(g.spec.max_memory_usage(model_len, mnbt, d.dcp), g.spec.page_bytes) for g in pool.groups
        )
    return pool.tensors * pool.page_bytes * blocks


def needed_bytes(model: ModelGeometry, d: Deployment, elem_bytes: int, model_len: int, mnbt: int) -> int:
    """KV bytes one request of model_len tokens needs on the most loaded rank, as the release's
    check counts them (needed_rule); 0.14-0.16 check the global groups, every stage at once."""
    model = with_drafter(model, d)
    block = block_size_for(model, d)
    # A hybrid model checks at the raised block and counts its state groups too (the check sums
    # every group, 0.25.1 v1/core/kv_cache_utils.py:1801-1860).
    state = state_block(model, d, elem_bytes, block)
    block = state[0] if state is not None else block
    rule = needed_rule(d.engine_version)
    mnbt = in_flight_tokens(d, mnbt)
    global_groups = releases.GLOBAL_GROUPS_CHECK.at(d.engine_version)
    stages = (
        [[layer for stage in _stages(model, d) for layer in stage]] if global_groups else _stages(model, d)
    )
    worst = 0
    for stage in stages:
        specs = _stage_specs(model, d, stage, elem_bytes, block, state)
        if specs:
            worst = max(worst, _stage_needed(specs, d, block, model_len, mnbt, rule))
    return worst


def estimate_max_model_len(
    model: ModelGeometry, d: Deployment, elem_bytes: int, available: int, max_model_len: int, mnbt: int
) -> int:
    """vLLM's binary search for the longest request that fits (0 when not even one token does)."""
    if needed_bytes(model, d, elem_bytes, 1, mnbt) > available:
        return 0
    left, right, result = 1, max_model_len, 1
    while left <= right:
        mid = (left + right) // 2
        if needed_bytes(model, d, elem_bytes, mid, mnbt) <= available:
            result, left = mid, mid + 1
        else:
            right = mid - 1
    return result


def holds_back_null_block(version: str | None) -> bool:
    """From 0.29.0 the 'To serve at least one request' check and its estimate plan against the
    available memory less one block of the pool, the null block BlockPool keeps for itself
    (0.29.0 v1/core/kv_cache_utils.py:975-989 check_enough_kv_cache_memory, :2316-2336
    get_kv_cache_configs; 0.33.0 v1/core/kv_cache_planning.py:170-181, :1533-1555). 0.28.0
    (kv_cache_utils.py:2193) checks the whole budget."""
    return releases.NULL_BLOCK_HELD_BACK.at(version)


def check_bytes(pool: VllmPool, available: int, version: str | None) -> int:
    """The bytes the fit check, its message and estimate_max_model_len use: the budget, less from
    0.29 one pool block (_pool_bytes_per_block, 0.29.0 kv_cache_utils.py:1082-1089 and :1358-1370:
    the largest group's page summed over its layers = page x tensors sharing it)."""
    if holds_back_null_block(version) and pool.groups:
        return available - pool.page_bytes * pool.tensors
    return available


def requested_bytes(total: int, utilization: float) -> int:
    """ceil(total x gpu_memory_utilization), as vLLM's request_memory computes it."""
    return math.ceil(total * utilization)
