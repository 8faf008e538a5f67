"""SGLang's prediction: the static fraction of the free memory before weights, less the weights.

The division into tokens (cell size, pages, SWA/Mamba splits) is budget.py; this module puts the
budget together from what was measured, given or estimated and records which.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.envelope import conditions, label, not_calibrated_note
from kvwatch.capacity.model import ModelGeometry
from kvwatch.capacity.prediction import Basis, Prediction
from kvwatch.capacity.weights import load_oom
from kvwatch.core.units import format_bytes
from kvwatch.engines.sglang import budget, calibration, request_table, weight_extras
from kvwatch.engines.sglang.envelope import CURRENT


@dataclass(frozen=True)
class BandTerms:
    """The error band of SGLang's KV budget, per estimated term, as fractions.

    ``weights``: of the weights when estimated from config.json; ``pre_load``: of the free memory
    before weights when the CUDA context and torch.distributed are estimated (the error reaches the
    budget x mem_fraction_static); ``fraction``: the absolute error of a default mem_fraction_static
    (terms of the heuristic kvwatch does not see: speculative decoding, the vision tower's size,
    a card shared with another process), times the free memory before weights. Each is the 80th
    percentile of that term's error over the real startups of tests/apriori/public/sglang and
    sglang-repos, fitted by bench/accuracy_sglang.py (which refits them per held-out source for its
    leave-one-source-out figures) and written here by ``python -m bench.bench_accuracy --write``.
    """

    weights: float
    pre_load: float
    fraction: float


# --- band: begin
BAND = BandTerms(weights=0.053, pre_load=0.01, fraction=0.0)
# --- band: end
_band = [BAND]


@contextmanager
def band_terms(terms: BandTerms) -> Iterator[None]:
    """Predict with other band terms (the accuracy report's leave-one-source-out folds)."""
    _band.append(terms)
    try:
        yield
    finally:
        _band.pop()


def _band_bytes(weights: int, pre_load: int, mfs: float, inputs: Mapping[str, str]) -> int:
    t = _band[-1]
    parts = [
        t.weights * weights if inputs.get("weights") in ("estimated", "derived") else 0.0,
        t.pre_load * pre_load * mfs if inputs.get("non_torch") == "estimated" else 0.0,
        t.fraction * pre_load if inputs.get("mem_fraction_static") == "engine_default" else 0.0,
    ]
    return int(math.sqrt(sum(x * x for x in parts)))


def predict(model: ModelGeometry, d: Deployment, basis: Basis) -> Prediction:
    """SGLang's budget: (free before weights) x mem_fraction_static - weights, divided by the cell."""
    elem, max_model_len = basis.kv_elem_bytes, basis.max_model_len
    per_rank = basis.bytes_per_token
    weights_rank = basis.weights_bytes
    inputs, assumptions = basis.inputs, basis.assumptions
    dsa_elem = budget.dsa_kv_elem_bytes(model, d, elem)
    if dsa_elem != elem:
        # SGLang's own default for DeepSeek sparse attention (budget.dsa_kv_elem_bytes).
        elem = basis.kv_elem_bytes = dsa_elem
        per_rank = basis.bytes_per_token = budget.cell_size(model, d, elem)
        basis.bytes_per_token_all_ranks = per_rank * d.tp * d.pp
        assumptions.append(
            "kv_cache_dtype auto: SGLang runs DeepSeek sparse attention with an fp8 KV cache "
            "(bf16 only on cards before SM 10)"
        )
    total = d.gpu_memory_bytes
    mfs = d.mem_fraction_static
    usable = activation = non_torch = band = pre_load = None
    load_failure = None
    envelope = CURRENT.get()
    if weights_rank is not None and d.weights_bytes is None and d.dp_attention and d.dp > 1:
        extra = weight_extras.dp_attention_weights_extra(model, d)
        if extra:
            weights_rank = basis.weights_bytes = weights_rank + extra
            assumptions.append(
                f"DP attention: attention TP {budget.attention_tp(d)}; the embedding"
                + (" and the attention" if weight_extras.attention_over_attn_tp(model) else "")
                + f" are not split over all {d.tp} ranks (+{format_bytes(extra)} per rank)"
            )
    if d.language_model_only and model.dims is not None and model.dims.has_vision_tower:
        if not budget.served_as_text(d):
            assumptions.append(
                "--language-model-only: SGLang takes it from 0.5.18; this release serves the model as multimodal"
            )
        else:
            towerless = weight_extras.tower_not_built(model, d)
            if weights_rank is not None and d.weights_bytes is None and towerless:
                weights_rank = basis.weights_bytes = weights_rank - towerless
            assumptions.append(
                "--language-model-only: served as text, no vision factor on mem_fraction_static"
                + (
                    f"; no vision tower loaded (-{format_bytes(towerless)} per rank)"
                    if towerless
                    else "; this architecture still loads its vision tower"
                )
                + ("" if budget.multimodal(model, d) else "; not a multimodal model to SGLang (0.5.20+)")
            )
    if weights_rank is not None and d.weights_bytes is None:
        # What a rank holds beyond the checkpoint's even split, each with the note that names it.
        extras = (
            (
                weight_extras.router_replicas(model, d),
                f"MoE routers are replicated on every rank, not split over tp={d.tp}",
            ),
            (
                weight_extras.dsa_indexer_replicas(model, d),
                "sparse-attention indexer: wq_b and wk whole on every rank, weights_proj in fp32",
            ),
            (
                weight_extras.rope_cache(model, d),
                f"rotary cos/sin cache: {model.dims.rope_positions if model.dims else 0:,} positions, "
                "built beside the weights on every rank",
            ),
            (
                weight_extras.mla_up_proj_copies(model, d),
                "MLA: SGLang keeps per-head copies of kv_b_proj (w_kc, w_vc) beside it",
            ),
        )
        for extra_bytes, note in extras:
            if extra_bytes:
                weights_rank = basis.weights_bytes = weights_rank + extra_bytes
                assumptions.append(f"{note} (+{format_bytes(extra_bytes)} per rank)")
    if d.available_kv_bytes is not None:
        available = d.available_kv_bytes
        inputs["available_kv"] = "given"
        assumptions.append("available KV memory given: the bytes SGLang gives the pool, no subtraction")
    else:
        assert weights_rank is not None
        if total is not None:
            inputs["gpu_memory"] = "given"
        if mfs is None:
            frac = budget.default_mem_fraction_static(d, model)
            mfs = frac.value
            inputs["mem_fraction_static"] = "engine_default"
            assumptions.append(
                f"mem_fraction_static = {round(mfs, 4):g} (SGLang default: reserve {frac.reserved_mb:.0f} MB = {frac.rule}"
                + (
                    f"; chunked_prefill_size {frac.chunked_prefill_size}, cuda_graph_max_bs {frac.cuda_graph_max_bs}"
                    if frac.chunked_prefill_size
                    else ""
                )
                + ")"
            )
        else:
            inputs["mem_fraction_static"] = "given"
        # A fraction SGLang printed (server_args) is already the adjusted one.
        aiter = (
            1.0
            if d.fraction_printed and d.mem_fraction_static is not None
            else budget.aiter_factor(model, d, max_model_len)
        )
        if aiter != 1.0:
            mfs = round(mfs * aiter, 6)
            assumptions.append(
                f"ROCm, attention backend aiter (SGLang's default), context {max_model_len:,} > 8192: "
                f"SGLang scales mem_fraction_static by {aiter} to {round(mfs, 4):g}"
            )
        runtime = budget.vlm_runtime_factor(model, d)
        if runtime != 1.0:
            mfs = round(mfs * runtime, 6)
            assumptions.append(
                f"multimodal model: this release's model runner scales mem_fraction_static by {runtime}"
            )
        if d.free_after_weights_bytes is not None:
            # SGLang's own figures: free before weights = free after weights + weights loaded.
            pre_load = d.free_after_weights_bytes + weights_rank
            non_torch = total - pre_load if total is not None else None
            inputs["free_after_weights"] = "given"
            assumptions.append("free memory before weights = 'Load weight end' avail mem + weights")
        else:
            assert total is not None
            if d.non_torch_bytes is not None:
                non_torch = d.non_torch_bytes
                inputs["non_torch"] = "given"
            else:
                # Before the weights load (calibration.py: FITTED on the startups that print it).
                non_torch = calibration.context_bytes(calibration.current(), d.tp, d.gpu_name)
                inputs["non_torch"] = "estimated"
                assumptions.append(
                    f"CUDA context + torch.distributed before weights = {format_bytes(non_torch)} (estimate)"
                )
            pre_load = total - non_torch
            if d.memory_in_use_bytes:
                # SGLang sizes from the free memory it measures before the weights (get_available_gpu_memory
                # at dist init: 0.4.5 model_executor/model_runner.py init_torch_distributed; 0.5.23
                # distributed/bootstrap.py:207), so what other processes hold is simply not there.
                pre_load -= d.memory_in_use_bytes
                assumptions.append(
                    f"free memory before weights: less the {format_bytes(d.memory_in_use_bytes)} other processes "
                    "hold (SGLang measures the free memory, so its pool and its reserve shrink with it)"
                )
            if total is not None:
                load_failure = load_oom(
                    "SGLang", weights_rank, basis.weights_scheme, total, pre_load, d.tp, d.pp
                )
        usable = int(pre_load * mfs)
        activation = pre_load - usable
        available = usable - weights_rank
        reservation = budget.multimodal_reservation(model, d)
        if reservation:
            available -= reservation
            assumptions.append(
                f"multimodal model: {format_bytes(reservation)} of the budget kept for the encoder cache"
            )
        band = _band_bytes(weights_rank, pre_load, mfs, inputs)
    uncovered = envelope.uncovered(conditions(model, d, envelope.newest_read))
    if band is not None and usable is not None:
        # The conditions no calibration case covers widen the band (capacity/envelope.py).
        # The terms _band_bytes sizes: with none of them modelled, the floor does not apply.
        modelled = (
            inputs.get("weights") in ("estimated", "derived")
            or inputs.get("non_torch") == "estimated"
            or inputs.get("mem_fraction_static") == "engine_default"
        )
        band = envelope.widen(band, usable, uncovered, modelled)
        if uncovered:
            assumptions.append(
                not_calibrated_note(uncovered, "SGLang", d.engine_version, envelope.newest_read)
            )
    sg, pool_bytes, failure = _pool_outcome(
        model, d, elem, available, max_model_len, pre_load, weights_rank, assumptions
    )
    # The loader runs out of memory before the pool is sized.
    failure = load_failure or failure
    if d.page_size is None and d.block_size is None:
        inputs["page_size"] = "engine_default"
    tokens = sg.tokens
    others_limit = None
    if failure is None and pre_load is not None and usable is not None and mfs is not None:
        others_limit = _others_limit(
            model, d, elem, max_model_len, pre_load, mfs, usable - available, weights_rank
        )
    fits = tokens >= max_model_len and load_failure is None
    estimated = None if fits else max(tokens, 0)
    if tokens > 0 and not fits and failure is None:
        assumptions.append("SGLang starts anyway; a request longer than the pool cannot be admitted")
    return Prediction(
        **basis.identity(model, d),
        total_bytes=total,
        usable_bytes=usable,
        activation_bytes=activation,
        non_torch_bytes=non_torch,
        cuda_graph_bytes=None,
        available_kv_bytes=available,
        kv_pool_tokens=max(tokens, 0),
        kv_pool_blocks=None,
        # What SGLang prints as the pool's size: its buffers, which for DSA differ from the cell.
        kv_pool_bytes=pool_bytes,
        block_size=sg.page_size,
        page_bytes=None,
        kv_groups=None,
        swa_pool_tokens=sg.swa_tokens,
        max_concurrency=max(tokens, 0) / max_model_len,
        fits=fits,
        estimated_max_model_len=estimated,
        needed_kv_bytes=per_rank * max_model_len,
        gpu_memory_utilization=None,
        mem_fraction_static=mfs,
        exact=sg.exact,
        failure=failure,
        available_kv_band_bytes=band,
        not_calibrated=tuple(label(axis, value) for axis, value in uncovered) if band is not None else (),
        others_limit_bytes=others_limit,
        others_limit_note=(
            f"SGLang {d.engine_version or 'newest'} sizes from the free memory it measures: the pool "
            f"shrinks by {mfs} of what they hold, the reserve beside it by the rest"
            if others_limit is not None
            else None
        ),
    )


def _pool_outcome(
    model: ModelGeometry,
    d: Deployment,
    elem: int,
    available: int,
    context_len: int,
    pre_load: int | None,
    weights: int | None,
    notes: list[str],
) -> tuple[budget.SglangPool, int, str | None]:
    """The pool a KV budget gives, the bytes SGLang allocates for it, and the start's failure if any:
    no token left ('Not enough memory'), or the request table beyond what is left beside the pool."""
    sg = budget.pool(model, d, elem, available)
    notes.extend(sg.notes)
    pool_bytes = max(sg.tokens, 0) * (
        sg.cell_bytes + budget.buffer_cell_size(model, d, elem) - budget.cell_size(model, d, elem)
    )
    if sg.tokens <= 0:
        return sg, pool_bytes, "Not enough memory. Please try to increase --mem-fraction-static."
    return (
        sg,
        pool_bytes,
        _request_table_check(model, d, sg.tokens, context_len, pre_load, weights, pool_bytes, notes),
    )


def _others_limit(
    model: ModelGeometry,
    d: Deployment,
    elem: int,
    context_len: int,
    pre_load: int,
    mfs: float,
    off_budget: int,
    weights: int | None,
) -> int:
    """The most memory other processes may hold at launch before this start fails: the free memory
    SGLang measures shrinks by it, the budget by mfs of it, and the first of _pool_outcome's failures
    bounds it. Bisected to a MiB over that same arithmetic (the page floor and the request table make
    it a step function, not a line), from a bracket around where the budget reaches zero, which is
    where it ends unless the request table fails first. The caller has the start starting at 0."""

    def fails(in_use: int) -> bool:
        free = pre_load - in_use
        budget_bytes = int(free * mfs) - off_budget
        return _pool_outcome(model, d, elem, budget_bytes, context_len, free, weights, [])[2] is not None

    low, high = 0, max(pre_load, 0)
    step = 2**21
    zero = int(pre_load - off_budget / mfs)
    if low < zero - step < high:
        if fails(zero - step):
            high = zero - step
        else:
            low = zero - step
            if zero + step < high and fails(zero + step):
                high = zero + step
    while high - low > 2**20:
        mid = (low + high) // 2
        low, high = (mid, high) if not fails(mid) else (low, mid)
    return low


def _request_table_check(
    model: ModelGeometry,
    d: Deployment,
    tokens: int,
    context_len: int,
    pre_load: int | None,
    weights: int | None,
    pool_bytes: int,
    assumptions: list[str],
) -> str | None:
    """The req_to_token table against the memory left beside the pool (request_table.RequestTable): the
    startup's CUDA out of memory when the table and the pool together exceed the free memory after
    the weights, None otherwise. Notes the table's size either way."""
    table = request_table.request_table(d, tokens, context_len)
    shape = f"{table.rows:,} rows x {table.positions:,} positions x int32 = {format_bytes(table.bytes)}"
    if pre_load is None or weights is None:
        assumptions.append(f"req_to_token table (ReqToTokenPool): {shape}, allocated after the pool is sized")
        return None
    left = pre_load - weights - pool_bytes
    hybrid = model.count("linear", "mamba") > 0
    assumptions.append(
        f"req_to_token table (ReqToTokenPool): {shape}, allocated after the pool is sized, "
        f"from the {format_bytes(left)} left beside it"
        + (" (at most: a hybrid model's state slots cap its requests, not modelled)" if hybrid else "")
    )
    if table.bytes <= left or hybrid:
        return None
    return (
        f"CUDA out of memory: SGLang's req_to_token table ({shape}, max_running_requests "
        f"{table.requests:,} at context_len {context_len:,}) does not fit the {format_bytes(left)} "
        "left beside the KV pool"
    )
