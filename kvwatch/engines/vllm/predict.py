"""vLLM's prediction: the budget of gpu_worker.py subtracted, then divided by kv_cache_utils' rules.

The division (groups, blocks, tokens, concurrency, the 'To serve at least one request' check) is
budget.py; the non-KV terms before launch are memory.py and weights.py. This module puts the budget
together from what was measured, given or modelled, records which, and builds the Prediction with
the error band of its available-KV figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.envelope import conditions, label, not_calibrated_note
from kvwatch.capacity.model import ModelGeometry
from kvwatch.capacity.prediction import Basis, InputSource, Prediction
from kvwatch.capacity.weights import load_oom, weight_bytes
from kvwatch.core.units import GiB, format_bytes
from kvwatch.engines.vllm import budget, hybrid, memory, multimodal, releases, weights
from kvwatch.engines.vllm.envelope import CURRENT

# Error band of a card total: measured in a log, estimated from nvidia-smi, or given by the user.
_TOTAL_BAND_MEASURED = int(0.01 * GiB)
_TOTAL_BAND_ESTIMATED = int(0.15 * GiB)
# The logs print each term to 0.01 GiB.
_RESOLUTION = int(0.01 * GiB)


@dataclass
class _Budget:
    """The subtraction for one rank (stage 0, as logged) and the per-stage available bytes."""

    requested: int
    weights: int
    activation: int
    non_torch: int
    graphs: int
    graphs_applied: int
    stage_available: list[int]
    # The heaviest stage's weights and the memory free when they load (capacity.weights.load_oom).
    heaviest_weights: int = 0
    load_free: int = 0
    band: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def available(self) -> int:
        return self.stage_available[0]


def _terms(
    model: ModelGeometry, d: Deployment, basis: Basis, total: int, util: float, inputs: dict[str, InputSource]
) -> _Budget:
    """Each term as given, else modelled (memory.py / weights.py: the engine's loader and profile run).

    A given activation figure is --activation-memory's "activation + non-torch + CUDA graphs": the
    other two are then taken as inside it unless given too.
    """
    dims = model.dims
    card = gpus.find(d.gpu_name)
    requested = budget.requested_bytes(total, util)
    seqs, tokens = memory.batch_limits(d, basis.max_model_len, dims)
    notes: list[str] = []
    if d.weights_bytes is not None or dims is None:
        assert basis.weights_bytes is not None
        stage_weights = [basis.weights_bytes] * d.pp
    else:
        # The checkpoint-level estimate is replaced by vLLM's loader model.
        basis.assumptions[:] = [a for a in basis.assumptions if not a.startswith("weights:")]
        drafter = model.mtp_layers if hybrid.is_mtp(d.speculative_method) else 0
        stage_weights, quant = weights.weights_per_stage(dims, d, card, drafter)
        act_bytes = memory.activation_dtype_bytes(dims, d)
        index = model.safetensors_total_size
        if index is not None and d.weights_dtype is None and d.quantization is None and not d.dtype:
            # The checkpoint's own byte count (model.safetensors.index.json) holds what a count from
            # config.json misses (vision towers, extra heads); vLLM's placement rules stay.
            counted = weight_bytes(model)[0]
            if counted > 0:
                stage_weights = [round(w * index / counted) for w in stage_weights]
                notes.append(
                    f"weights: scaled to the checkpoint's {format_bytes(index)} "
                    "(model.safetensors.index.json)"
                )
        scheme_name = quant or ("float32" if act_bytes == 4 else model.dtype)
        basis.weights_bytes, basis.weights_scheme = stage_weights[0], scheme_name
        basis.weights_total_bytes = sum(stage_weights) * d.tp
        inputs["weights"] = "estimated"
        notes.append(
            f"weights: vLLM's loader modelled from config.json ({scheme_name}; vocabulary padded to 64 per "
            "rank, embedding on the first stage, head on the last)"
        )
    if d.speculative_method is not None or d.num_speculative_tokens is not None:
        notes.append(_drafter_note(model, d))
    inside = d.activation_bytes is not None
    if d.activation_bytes is not None or dims is None:
        stage_act = [memory.Term(d.activation_bytes or 0, "given")] * d.pp
        inputs["activation"] = "given" if d.activation_bytes is not None else "estimated"
    else:
        stage_act = memory.activation(dims, d, card, seqs, tokens, basis.max_model_len)
        inputs["activation"] = "estimated"
        mm = memory.v0_multimodal(dims, d, seqs, tokens, basis.max_model_len)
        v0 = memory.runs_v0(d)
        if (served := multimodal.served_note(dims, d, v0=v0)) is not None:
            notes.append(served)
        pooler = memory.profiles_pooler(d)
        if d.runner == "pooling":
            notes.append(
                "runner pooling: the profile run ends in the pooler (no sampler pass)"
                if pooler
                else "runner pooling: V0's pooling runner is not modelled, its profile is sized as a generator's"
            )
        if mm is not None:
            images, videos = (multimodal.limit(d, m, v0=True) for m in ("image", "video"))
            notes.append(
                f"V0 multimodal profile: max_mm_tokens {mm.mm_tokens:,} ({images} image(s) and {videos} "
                f"video(s) at max_pixels {d.image_max_pixels:,}) clamps the dummy batch to {mm.seqs} "
                f"sequence(s); the forward runs over {mm.forward_tokens:,} tokens, "
                f"{format_bytes(mm.pixel_bytes)} of float32 pixel values held"
            )
        elif v0 and dims.vision_grid is not None and multimodal.encoder_profiled(dims, d, v0=True):
            notes.append(
                "V0 multimodal profile not sized: the image processor's max_pixels is not known "
                "(preprocessor_config.json; give it as -- --mm-processor-kwargs '{\"max_pixels\": N}')"
            )
        path = "v0" if v0 else memory.sampler_path(d.engine_version, d.flashinfer_sampler)
        notes.append(
            f"activation peak: the profile run modelled ({stage_act[-1].note} pass; max_num_seqs {seqs}, "
            f"max_num_batched_tokens {tokens}" + (")" if pooler else f", sampler path {path})")
        )
        if not pooler and path == "flashinfer":
            notes.append(
                "sampler: FlashInfer taken as installed (the vllm/vllm-openai image); a pip install "
                "without it logs 'FlashInfer is not available' and sorts (--no-flashinfer)"
            )
    if d.non_torch_bytes is not None:
        nt = memory.Term(d.non_torch_bytes)
    else:
        nt = memory.Term(0) if inside or dims is None else memory.non_torch(d)
    if d.cuda_graph_bytes is not None:
        graphs = memory.Term(d.cuda_graph_bytes)
    elif inside or dims is None:
        graphs = memory.Term(0)
    else:
        graphs = memory.cuda_graphs(dims, d, seqs, tokens, weights.stage_layers(dims.num_layers, d.pp)[0])
    # Memory other processes hold, where the release counts it as its own non-torch memory; a given
    # non-torch or activation figure was measured with it.
    others = 0
    if (
        d.memory_in_use_bytes
        and d.non_torch_bytes is None
        and not inside
        and memory.others_memory(d) == "counted"
    ):
        others = d.memory_in_use_bytes
        notes.append(
            f"non-torch: includes the {format_bytes(others)} other processes hold on the card (vLLM "
            f"{d.engine_version or 'newest'} counts every byte in use on it as its own: total - free - torch)"
        )
    for name, value in (("non_torch", d.non_torch_bytes), ("cuda_graphs", d.cuda_graph_bytes)):
        inputs[name] = "given" if value is not None else "estimated"
    if d.non_torch_bytes is None and nt.note:
        notes.append(f"non-torch: {nt.note}")
    if d.cuda_graph_bytes is None and memory.NCCL_GRAPHS_NOTE in graphs.note:
        notes.append(f"CUDA graphs: {memory.NCCL_GRAPHS_NOTE}")
    if inside and (d.non_torch_bytes is None or d.cuda_graph_bytes is None):
        notes.append("terms not given (non-torch, CUDA graphs) taken as included in the activation figure")
    applied = graphs.bytes if memory.subtracts_cuda_graphs(d.engine_version) else 0
    available = [
        requested - w - a.bytes - nt.bytes - others - applied
        for w, a in zip(stage_weights, stage_act, strict=True)
    ]
    band = None
    if dims is not None and not (inside and d.weights_bytes is not None):
        # Each modelled term's band is the fraction of it the leave-one-source-out error gives
        # (envelope.py), plus the log's 0.01 GiB resolution; a given term has none.
        f = CURRENT.get().term_bands
        terms = [
            (f["weights"] * stage_weights[0] if inputs["weights"] == "estimated" else 0),
            (f["activation"] * stage_act[0].bytes if inputs["activation"] == "estimated" else 0),
            (f["non_torch"] * nt.bytes if d.non_torch_bytes is None and not inside else 0),
            (f["cuda_graphs"] * graphs.bytes if applied and d.cuda_graph_bytes is None else 0),
        ]
        card_band = 0
        if card is not None and card.total_bytes == total:
            card_band = _TOTAL_BAND_MEASURED if card.total_measured else _TOTAL_BAND_ESTIMATED
            if not card.total_measured:
                notes.append(
                    f"{card.name}: total = nvidia-smi's {card.memory_mib:,} MiB less "
                    f"{gpus.DEFAULT_RESERVED_MIB} MiB (no log has measured this card; --gpu-memory gives "
                    "the driver's figure)"
                )
        band = math.isqrt(sum(int(t + _RESOLUTION) ** 2 for t in terms if t) + int(card_band * util) ** 2)
    # Memory not free when the weights load: the non-torch allocations (CUDA context, NCCL) and what
    # other processes hold, which a 'counted' release's non-torch figure already includes.
    held = nt.bytes + others
    if not others and not (d.non_torch_bytes is not None and memory.others_memory(d) == "counted"):
        held += d.memory_in_use_bytes or 0
    return _Budget(
        requested,
        stage_weights[0],
        stage_act[0].bytes,
        nt.bytes + others,
        graphs.bytes,
        applied,
        available,
        max(stage_weights),
        total - held,
        band,
        notes,
    )


def _v0_max_seq_len(plan: budget.VllmPool, d: Deployment) -> int:
    """V0's own check (worker/worker.py raise_if_cache_size_invalid): no blocks is 'No available
    memory', and max_model_len must fit in block_size x the blocks of one virtual engine. From 0.8
    the check divides the blocks among the PP virtual engines as each scheduler does (0.8.5
    worker.py:554-569, core/scheduler.py:452); up to 0.7.3 it counts them all (0.7.3 worker.py:542)."""
    return v0_check_tokens(d, plan.num_blocks, plan.block_size)


def v0_check_tokens(d: Deployment, num_blocks: int, block_size: int) -> int:
    """The 'maximum number of tokens that can be stored in KV cache' V0's error prints for a pool of
    ``num_blocks``: one virtual engine's share from 0.8 (_v0_max_seq_len)."""
    engines = d.pp if releases.V0_BLOCKS_PER_VIRTUAL_ENGINE.at(d.engine_version) else 1
    return block_size * (num_blocks // engines)


def _others_failure(d: Deployment, total: int, util: float, in_use: int, activation: int) -> str | None:
    """The start that memory other processes hold makes fail, where the release does not count it.

    From 0.9.1 V1 refuses to start when the free memory is below utilisation x total (0.10.2
    v1/worker/gpu_worker.py:175-188; 0.16.0 v1/worker/utils.py:92-112); free is total less that
    memory and the engine's own CUDA context, which kvwatch does not size, so this is the least it
    needs. Where the profile subtracts it as baseline (V0 0.3.1-0.6.3, from 0.6.5), the cache is
    sized as if utilisation x total were free, less the activation peak the profile has freed by
    then, and its allocation runs out of memory."""
    wanted = budget.requested_bytes(total, util)
    free = total - in_use
    mode = memory.others_memory(d)
    if mode == "checked" and free < wanted:
        return (
            f"Free memory on device ({free / GiB:.2f}/{total / GiB:.2f} GiB) on startup is less than desired "
            f"GPU memory utilization ({util}, {wanted / GiB:.2f} GiB). Decrease GPU memory utilization or "
            f"reduce GPU memory used by other processes. (vLLM {d.engine_version or 'newest'} checks the free "
            "memory before it loads the model; its own CUDA context takes more)"
        )
    if mode == "baseline" and free < wanted - activation:
        return (
            f"CUDA out of memory allocating the KV cache: vLLM {d.engine_version} sizes it for "
            f"{wanted / GiB:.2f} GiB (utilisation {util}) but other processes hold {in_use / GiB:.2f} GiB of "
            f"the {total / GiB:.2f} GiB card (the profile subtracts their memory as baseline)"
        )
    return None


def _others_limit(
    d: Deployment, total: int, util: float, limiting: int, needed: int, activation: int
) -> tuple[int, str]:
    """The most memory other processes may hold on a GPU at launch before this start fails, and how
    it fails past that, by what the release does with it (memory.others_memory; _others_failure's
    rules): 'checked' refuses to start below utilisation x total free; 'counted' takes it out of the
    KV budget byte for byte until one request no longer fits; 'baseline' sizes the cache as if it
    were free and runs out of memory allocating it, less the activation peak the profile freed."""
    wanted = budget.requested_bytes(total, util)
    mode = memory.others_memory(d)
    release = f"vLLM {d.engine_version or 'newest'}"
    if mode == "checked":
        return total - wanted, (
            f"{release} refuses to start with less than {format_bytes(wanted)} free, "
            "and its own CUDA context takes a little more"
        )
    if mode == "counted":
        already = d.memory_in_use_bytes if d.non_torch_bytes is None else 0
        return max(limiting - needed, 0) + (already or 0), (
            f"{release} counts it as its own non-torch memory: the KV cache shrinks by as much, "
            "until one request of max_model_len no longer fits"
        )
    return max(total - wanted + activation, 0), (
        f"{release} sizes the cache as if {format_bytes(wanted)} were free: its allocation runs out of memory"
    )


def predict(model: ModelGeometry, d: Deployment, basis: Basis) -> Prediction:
    """vLLM's budget: requested = total x utilisation, minus weights, the profiled peak, non-torch and,
    from 0.20, the CUDA-graph estimate; then the KV groups and blocks of kv_cache_utils."""
    elem, max_model_len = basis.kv_elem_bytes, basis.max_model_len
    inputs, assumptions = basis.inputs, basis.assumptions
    util = d.gpu_memory_utilization
    total = d.gpu_memory_bytes
    requested = activation = non_torch = graphs = band = None
    stage_available: list[int] | None = None
    load_failure = None
    if d.available_kv_bytes is not None:
        available = d.available_kv_bytes
        inputs["available_kv"] = "given"
        assumptions.append("available KV memory given: the engine's own figure, no subtraction")
    else:
        assert total is not None
        inputs["gpu_memory"] = "given"
        if util is None:
            util = memory.default_utilization(d.engine_version)
            inputs["gpu_memory_utilization"] = "engine_default"
            assumptions.append(
                f"gpu_memory_utilization = {util} (vLLM {d.engine_version or 'newest'} default)"
            )
        else:
            inputs["gpu_memory_utilization"] = "given"
        terms = _terms(model, d, basis, total, util, inputs)
        assumptions.extend(terms.notes)
        if terms.graphs and not terms.graphs_applied:
            assumptions.append(
                "CUDA-graph memory estimated but not subtracted from the KV budget (subtracted from vLLM 0.20)"
            )
        requested, activation, non_torch, graphs = (
            terms.requested,
            terms.activation,
            terms.non_torch,
            terms.graphs,
        )
        available, stage_available, band = terms.available, terms.stage_available, terms.band
        load_failure = load_oom(
            "vLLM", terms.heaviest_weights, basis.weights_scheme, total, terms.load_free, d.tp, d.pp
        )
        if d.pp > 1 and min(stage_available) < available:
            assumptions.append(
                f"pipeline stages: the pool is sized from the smallest stage ({format_bytes(min(stage_available))}); "
                f"stage 0 logs {format_bytes(available)}"
            )
    mnbt = memory.batch_limits(d, max_model_len, model.dims)[1]
    if any(layer.kind in ("sliding", "chunked") for layer in model.layers):
        inputs["max_num_batched_tokens"] = "given" if d.max_num_batched_tokens else "engine_default"
    if d.block_size is None:
        inputs["block_size"] = "engine_default"
    plan = budget.plan(model, d, elem, available, max_model_len, mnbt, stage_available)
    assumptions.extend(plan.notes)
    if plan.padding_layers:
        assumptions.append(
            f"hybrid KV groups: {len(plan.groups)} groups, {plan.padding_layers} padding layer(s)"
        )
    needed = budget.needed_bytes(model, d, elem, max_model_len, mnbt)
    failure = None
    estimated = None
    # The pool is sized from the smallest stage's budget (all stages allocate the same blocks).
    limiting = min(stage_available) if stage_available else available
    # From 0.29 the check and the estimate hold back the null block (budget.check_bytes).
    limiting = budget.check_bytes(plan, limiting, d.engine_version) if limiting > 0 else limiting
    if memory.runs_v0(d) and memory.is_v1(d.engine_version):
        assumptions.append(
            f"engine: V0 (VLLM_USE_V1=0 on vLLM {d.engine_version})"
            if d.v0_engine
            else f"engine: V0 (vLLM {d.engine_version} falls back to V0 for PP {d.pp} with the default executor backend)"
        )
    v0_tokens = _v0_max_seq_len(plan, d) if memory.runs_v0(d) and limiting > 0 else None
    if limiting <= 0 or v0_tokens == 0:
        failure = "No available memory for the cache blocks. Try increasing `gpu_memory_utilization`."
        fits = False
        estimated = 0
    elif v0_tokens is not None:
        fits = max_model_len <= v0_tokens
        if not fits:
            estimated = v0_tokens
            failure = (
                f"The model's max seq len ({max_model_len}) is larger than the maximum number of tokens "
                f"that can be stored in KV cache ({v0_tokens})."
            )
    elif needed > limiting:
        fits = False
        estimated = budget.estimate_max_model_len(model, d, elem, limiting, max_model_len, mnbt)
        failure = (
            f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({needed / GiB:.2f} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({limiting / GiB:.2f} GiB)."
            + (
                f" Based on the available memory, the estimated maximum model length is {estimated}."
                if estimated
                else ""
            )
        )
        if d.pp > 1 and releases.GLOBAL_GROUPS_CHECK.at(d.engine_version):
            # 0.16.0 v1/core/kv_cache_utils.py:1514-1527: the check sums every stage's layers.
            failure += (
                f" (vLLM {d.engine_version} checks one request against the layers of all {d.pp} "
                "pipeline stages at once, against the smallest stage's memory)"
            )
    else:
        fits = True
    if load_failure is not None:
        # The loader runs out of memory before any budget is measured or checked.
        failure, fits, estimated = load_failure, False, None
    if d.memory_in_use_bytes and total is not None and util is not None:
        start_failure = _others_failure(d, total, util, d.memory_in_use_bytes, activation or 0)
        # The startup check runs before the model loads; the out-of-memory after every other check.
        if start_failure is not None and (failure is None or memory.others_memory(d) == "checked"):
            failure, fits, estimated = start_failure, False, None
    others_limit = others_note = None
    if fits and total is not None and util is not None and d.available_kv_bytes is None:
        others_limit, others_note = _others_limit(d, total, util, limiting, needed, activation or 0)
    pool_bytes = plan.num_blocks * plan.page_bytes * plan.tensors
    envelope = CURRENT.get()
    uncovered = envelope.uncovered(conditions(model, d, envelope.newest_read))
    if band is not None and requested is not None:
        # A band here always has a modelled term (_terms gives none once every term is given), so
        # the envelope's floor applies.
        band = envelope.widen(band, requested, uncovered)
        if uncovered:
            assumptions.append(not_calibrated_note(uncovered, "vLLM", d.engine_version, envelope.newest_read))
    return Prediction(
        **basis.identity(model, d),
        total_bytes=total,
        usable_bytes=requested,
        activation_bytes=activation,
        non_torch_bytes=non_torch,
        cuda_graph_bytes=graphs,
        available_kv_bytes=available,
        kv_pool_tokens=plan.tokens if available > 0 else 0,
        kv_pool_blocks=plan.num_blocks,
        kv_pool_bytes=pool_bytes,
        block_size=plan.block_size,
        page_bytes=plan.page_bytes,
        kv_groups=len(plan.groups),
        swa_pool_tokens=None,
        max_concurrency=plan.max_concurrency,
        fits=fits,
        estimated_max_model_len=estimated,
        needed_kv_bytes=needed,
        gpu_memory_utilization=util,
        mem_fraction_static=None,
        available_kv_band_bytes=band,
        cuda_graphs_subtracted=memory.subtracts_cuda_graphs(d.engine_version) if graphs else None,
        exact=plan.exact,
        failure=failure,
        not_calibrated=tuple(label(axis, value) for axis, value in uncovered) if band is not None else (),
        others_limit_bytes=others_limit,
        others_limit_note=others_note,
    )


def _drafter_note(model: ModelGeometry, d: Deployment) -> str:
    """What kvwatch counted of the speculative drafter (hybrid.with_drafter, weights_per_stage)."""
    spec = hybrid.speculative_tokens(model, d)
    if hybrid.is_mtp(d.speculative_method):
        return (
            f"speculative decoding (MTP, {spec} token(s) a step): the checkpoint's {model.mtp_layers} MTP "
            "layer(s) load with the model and join the KV groups; state layers keep a block more per token"
        )
    return (
        f"speculative decoding ({d.speculative_method or 'draft model'}, {spec} token(s) a step): state "
        "layers keep a block more per token; the draft model's own weights and layers are not modelled"
    )
