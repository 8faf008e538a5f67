"""Prediction: a model and a deployment in, the engine's KV pool (and the budget behind it) out.

``predict`` runs the chosen engine's own arithmetic end to end and records, for every input, whether
it was given, taken from the engine's default, or estimated by kvwatch; ``pool_from_available``
is the engine-exact division alone, for when the engine has already printed its KV budget (the
sidecar's 'engine_budget' basis).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kvwatch.capacity import sglang_budget, vllm_budget
from kvwatch.capacity.deployment import Deployment, kv_elem_bytes, validate
from kvwatch.capacity.geometry import LayerSpec, ModelGeometry, stage_layers
from kvwatch.capacity.weights import weights_per_rank
from kvwatch.errors import ConfigError
from kvwatch.units import GiB, format_bytes

InputSource = Literal["given", "engine_default", "estimated", "derived"]


@dataclass(frozen=True)
class Prediction:
    """The predicted KV pool of one engine instance (sizes in bytes per rank unless named otherwise)."""

    engine: str
    engine_version: str | None
    model: str
    gpu_name: str | None
    tp: int
    pp: int
    dcp: int
    kv_cache_dtype: str
    kv_elem_bytes: int
    bytes_per_token: int
    bytes_per_token_all_ranks: int
    weights_bytes: int | None
    weights_total_bytes: int | None
    weights_scheme: str | None
    param_count: int
    total_bytes: int | None
    usable_bytes: int | None
    activation_bytes: int | None
    non_torch_bytes: int | None
    cuda_graph_bytes: int | None
    available_kv_bytes: int
    kv_pool_tokens: int
    kv_pool_blocks: int | None
    kv_pool_bytes: int
    block_size: int
    page_bytes: int | None
    kv_groups: int | None
    swa_pool_tokens: int | None
    max_model_len: int
    max_concurrency: float
    fits: bool
    estimated_max_model_len: int | None
    needed_kv_bytes: int | None
    gpu_memory_utilization: float | None
    mem_fraction_static: float | None
    exact: bool
    failure: str | None
    inputs: dict[str, InputSource] = field(default_factory=dict)
    assumptions: tuple[str, ...] = ()

    def memory_terms(self) -> dict[str, int | None]:
        """The budget by kvwatch.names.MEMORY_TERMS term (bytes per rank; None = not part of this budget)."""
        return {
            "total": self.total_bytes,
            "usable": self.usable_bytes,
            "weights": self.weights_bytes,
            "activation": self.activation_bytes,
            "non_torch": self.non_torch_bytes,
            "cuda_graphs": self.cuda_graph_bytes,
            "kv": self.available_kv_bytes,
        }

    @property
    def memory(self) -> dict[str, int | None]:
        """Alias of memory_terms() for the collector."""
        return self.memory_terms()

    def to_json_dict(self) -> dict[str, Any]:
        """The ``kvwatch predict --json`` object: integers of bytes, floats for ratios."""
        return {
            "engine": self.engine,
            "engine_version": self.engine_version,
            "model": self.model,
            "gpu": self.gpu_name,
            "tp": self.tp,
            "pp": self.pp,
            "dcp": self.dcp,
            "kv_cache_dtype": self.kv_cache_dtype,
            "bytes_per_token": self.bytes_per_token,
            "bytes_per_token_all_ranks": self.bytes_per_token_all_ranks,
            "param_count": self.param_count,
            "weights_bytes": self.weights_bytes,
            "weights_total_bytes": self.weights_total_bytes,
            "weights_scheme": self.weights_scheme,
            "available_kv_bytes": self.available_kv_bytes,
            "kv_pool_tokens": self.kv_pool_tokens,
            "kv_pool_blocks": self.kv_pool_blocks,
            "kv_pool_bytes": self.kv_pool_bytes,
            "swa_pool_tokens": self.swa_pool_tokens,
            "block_size": self.block_size,
            "page_bytes": self.page_bytes,
            "kv_groups": self.kv_groups,
            "max_model_len": self.max_model_len,
            "max_concurrency": round(self.max_concurrency, 4),
            "fits": self.fits,
            "estimated_max_model_len": self.estimated_max_model_len,
            "needed_kv_bytes": self.needed_kv_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "mem_fraction_static": self.mem_fraction_static,
            "memory": self.memory_terms(),
            "exact": self.exact,
            "failure": self.failure,
            "inputs": dict(self.inputs),
            "assumptions": list(self.assumptions),
        }


def _bytes_per_token(model: ModelGeometry, d: Deployment, elem: int) -> tuple[int, int]:
    """(per rank on the fullest pipeline stage, summed over every rank) for the growing layers."""

    def layer_bytes(layer: LayerSpec) -> int:
        if d.engine == "sglang":
            return sglang_budget.layer_cell(layer, max(1, d.tp // d.dcp), elem)
        if layer.kind == "mla" and d.kv_cache_dtype == "fp8_ds_mla":
            return vllm_budget.FP8_DS_MLA_BYTES + layer.extra_bytes_per_token
        return layer.bytes_per_token(d.tp, elem)

    stages = [
        sum(layer_bytes(layer) for layer in stage if layer.grows)
        for stage in stage_layers(model.layers, d.pp)
    ]
    return max(stages), sum(stages) * d.tp


def pool_from_available(
    model: ModelGeometry, deployment: Deployment, available_kv_bytes: int
) -> tuple[int, int | None]:
    """(tokens, blocks) the engine makes of ``available_kv_bytes`` on one rank; blocks None for SGLang."""
    validate(model, deployment)
    elem = kv_elem_bytes(model, deployment.kv_cache_dtype)
    if deployment.engine == "sglang":
        return sglang_budget.pool(model, deployment, elem, available_kv_bytes).tokens, None
    max_model_len = _max_model_len(model, deployment)
    mnbt = deployment.max_num_batched_tokens or vllm_budget.default_max_num_batched_tokens(
        deployment.gpu_memory_bytes, deployment.gpu_name
    )
    p = vllm_budget.plan(model, deployment, elem, available_kv_bytes, max_model_len, mnbt)
    return p.tokens, p.num_blocks


def _max_model_len(model: ModelGeometry, d: Deployment) -> int:
    if d.max_model_len is not None:
        return d.max_model_len
    if model.max_position_embeddings is None:
        raise ConfigError("config.json has no max_position_embeddings; pass --max-model-len")
    return model.max_position_embeddings


def predict(model: ModelGeometry, deployment: Deployment) -> Prediction:
    """The engine's KV pool for this model and deployment, with every assumption listed."""
    d = deployment
    validate(model, d)
    sglang_measured = d.engine == "sglang" and d.free_after_weights_bytes is not None
    if d.available_kv_bytes is None and d.gpu_memory_bytes is None and not sglang_measured:
        raise ConfigError("need the GPU's memory (--gpu NAME or --gpu-memory SIZE) or --available-kv-memory")
    elem = kv_elem_bytes(model, d.kv_cache_dtype)
    inputs: dict[str, InputSource] = {}
    assumptions: list[str] = list(model.notes)
    max_model_len = _max_model_len(model, d)
    inputs["max_model_len"] = "given" if d.max_model_len is not None else "derived"
    if d.max_model_len is None:
        assumptions.append(f"max_model_len = max_position_embeddings = {max_model_len}")
    elif (
        model.max_position_embeddings
        and max_model_len > model.max_position_embeddings
        and not model.rope_scaled
    ):
        assumptions.append(
            f"max_model_len {max_model_len} exceeds max_position_embeddings {model.max_position_embeddings}: "
            "the engines refuse it unless told to allow long contexts"
        )
    inputs["kv_cache_dtype"] = "given" if d.kv_cache_dtype != "auto" else "engine_default"
    per_rank, all_ranks = _bytes_per_token(model, d, elem)

    weights = None
    weights_rank: int | None
    weights_total: int | None
    scheme: str | None
    if d.available_kv_bytes is None or d.weights_bytes is not None:
        if d.weights_bytes is not None:
            weights_rank, weights_total, scheme = d.weights_bytes, d.weights_bytes * d.tp * d.pp, "measured"
            inputs["weights"] = "given"
        else:
            weights = weights_per_rank(model, d.tp, d.pp, d.weights_dtype)
            weights_rank, weights_total, scheme = weights.per_rank_bytes, weights.total_bytes, weights.scheme
            if weights.source == "safetensors_index":
                inputs["weights"] = "derived"
                assumptions.append(
                    "weights: total_size of model.safetensors.index.json, split evenly over ranks"
                )
            else:
                inputs["weights"] = "estimated"
                assumptions.append(
                    f"weights: {model.param_count / 1e9:.2f}B parameters recomputed from config.json at {scheme}"
                    + (f", split over tp={d.tp}" if d.tp > 1 else "")
                    + (f" and pp={d.pp} stages" if d.pp > 1 else "")
                )
    else:
        weights_rank = weights_total = None
        scheme = None

    if d.engine == "vllm":
        return _predict_vllm(
            model,
            d,
            elem,
            max_model_len,
            per_rank,
            all_ranks,
            weights_rank,
            weights_total,
            scheme,
            inputs,
            assumptions,
        )
    return _predict_sglang(
        model,
        d,
        elem,
        max_model_len,
        per_rank,
        all_ranks,
        weights_rank,
        weights_total,
        scheme,
        inputs,
        assumptions,
    )


def _predict_vllm(
    model: ModelGeometry,
    d: Deployment,
    elem: int,
    max_model_len: int,
    per_rank: int,
    all_ranks: int,
    weights_rank: int | None,
    weights_total: int | None,
    scheme: str | None,
    inputs: dict[str, InputSource],
    assumptions: list[str],
) -> Prediction:
    util = d.gpu_memory_utilization
    total = d.gpu_memory_bytes
    requested = activation = non_torch = graphs = None
    if d.available_kv_bytes is not None:
        available = d.available_kv_bytes
        inputs["available_kv"] = "given"
        assumptions.append("available KV memory given: the engine's own figure, no subtraction")
    else:
        assert total is not None and weights_rank is not None
        inputs["gpu_memory"] = "given"
        if util is None:
            util = vllm_budget.default_utilization(d.engine_version)
            inputs["gpu_memory_utilization"] = "engine_default"
            assumptions.append(
                f"gpu_memory_utilization = {util} (vLLM {d.engine_version or 'newest'} default)"
            )
        else:
            inputs["gpu_memory_utilization"] = "given"
        requested = vllm_budget.requested_bytes(total, util)
        measured = [x for x in (d.activation_bytes, d.non_torch_bytes, d.cuda_graph_bytes) if x is not None]
        if not measured:
            activation = vllm_budget.DEFAULT_OVERHEAD_BYTES
            non_torch = graphs = 0
            inputs["activation"] = "estimated"
            assumptions.append(
                f"activation peak + non-torch + CUDA graphs = {format_bytes(activation)} "
                "(kvwatch's default allowance; vLLM measures it by profiling)"
            )
        else:
            activation = d.activation_bytes or 0
            non_torch = d.non_torch_bytes or 0
            graphs = d.cuda_graph_bytes or 0
            inputs["activation"] = "given" if d.activation_bytes is not None else "estimated"
            for name, value in (("non_torch", d.non_torch_bytes), ("cuda_graphs", d.cuda_graph_bytes)):
                inputs[name] = "given" if value is not None else "estimated"
            if d.non_torch_bytes is None or d.cuda_graph_bytes is None:
                assumptions.append(
                    "terms not given (non-torch, CUDA graphs) taken as included in the activation figure"
                )
        graphs_applied = graphs if vllm_budget.subtracts_cuda_graphs(d.engine_version) else 0
        if graphs and not graphs_applied:
            assumptions.append("CUDA-graph memory not subtracted from the KV budget before vLLM 0.21")
        available = requested - weights_rank - activation - non_torch - graphs_applied
    mnbt = d.max_num_batched_tokens or vllm_budget.default_max_num_batched_tokens(total, d.gpu_name)
    if any(layer.kind in ("sliding", "chunked") for layer in model.layers):
        inputs["max_num_batched_tokens"] = "given" if d.max_num_batched_tokens else "engine_default"
    if d.block_size is None:
        inputs["block_size"] = "engine_default"
    plan = vllm_budget.plan(model, d, elem, available, max_model_len, mnbt)
    assumptions.extend(plan.notes)
    if plan.padding_layers:
        assumptions.append(
            f"hybrid KV groups: {len(plan.groups)} groups, {plan.padding_layers} padding layer(s)"
        )
    needed = vllm_budget.needed_bytes(model, d, elem, max_model_len, mnbt)
    failure = None
    estimated = None
    if available <= 0:
        failure = "No available memory for the cache blocks. Try increasing `gpu_memory_utilization`."
        fits = False
        estimated = 0
    elif needed > available:
        fits = False
        estimated = vllm_budget.estimate_max_model_len(model, d, elem, available, max_model_len, mnbt)
        failure = (
            f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({needed / GiB:.2f} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({available / GiB:.2f} GiB)."
            + (
                f" Based on the available memory, the estimated maximum model length is {estimated}."
                if estimated
                else ""
            )
        )
    else:
        fits = True
    pool_bytes = plan.num_blocks * plan.page_bytes * plan.tensors
    return Prediction(
        engine="vllm",
        engine_version=d.engine_version,
        model=model.name,
        gpu_name=d.gpu_name,
        tp=d.tp,
        pp=d.pp,
        dcp=d.dcp,
        kv_cache_dtype=d.kv_cache_dtype,
        kv_elem_bytes=elem,
        bytes_per_token=per_rank,
        bytes_per_token_all_ranks=all_ranks,
        weights_bytes=weights_rank,
        weights_total_bytes=weights_total,
        weights_scheme=scheme,
        param_count=model.param_count,
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
        max_model_len=max_model_len,
        max_concurrency=plan.max_concurrency,
        fits=fits,
        estimated_max_model_len=estimated,
        needed_kv_bytes=needed,
        gpu_memory_utilization=util,
        mem_fraction_static=None,
        exact=plan.exact,
        failure=failure,
        inputs=inputs,
        assumptions=tuple(assumptions),
    )


def _predict_sglang(
    model: ModelGeometry,
    d: Deployment,
    elem: int,
    max_model_len: int,
    per_rank: int,
    all_ranks: int,
    weights_rank: int | None,
    weights_total: int | None,
    scheme: str | None,
    inputs: dict[str, InputSource],
    assumptions: list[str],
) -> Prediction:
    total = d.gpu_memory_bytes
    mfs = d.mem_fraction_static
    usable = activation = non_torch = None
    if d.available_kv_bytes is not None:
        available = d.available_kv_bytes
        inputs["available_kv"] = "given"
        assumptions.append("available KV memory given: the bytes SGLang gives the pool, no subtraction")
    else:
        assert weights_rank is not None
        if total is not None:
            inputs["gpu_memory"] = "given"
        if mfs is None:
            frac = sglang_budget.default_mem_fraction_static(d)
            mfs = frac.value
            inputs["mem_fraction_static"] = "engine_default"
            assumptions.append(
                f"mem_fraction_static = {mfs} (SGLang default: reserve {frac.reserved_mb:.0f} MB = {frac.rule}"
                + (
                    f"; chunked_prefill_size {frac.chunked_prefill_size}, cuda_graph_max_bs {frac.cuda_graph_max_bs}"
                    if frac.chunked_prefill_size
                    else ""
                )
                + ")"
            )
        else:
            inputs["mem_fraction_static"] = "given"
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
                non_torch = sglang_budget.DEFAULT_CONTEXT_BYTES
                inputs["non_torch"] = "estimated"
                assumptions.append(
                    f"CUDA context + torch.distributed before weights = {format_bytes(non_torch)} (estimate)"
                )
            pre_load = total - non_torch
        usable = int(pre_load * mfs)
        activation = pre_load - usable
        available = usable - weights_rank
    sg = sglang_budget.pool(model, d, elem, available)
    assumptions.extend(sg.notes)
    if d.page_size is None and d.block_size is None:
        inputs["page_size"] = "engine_default"
    tokens = sg.tokens
    failure = None
    if tokens <= 0:
        failure = "Not enough memory. Please try to increase --mem-fraction-static."
    fits = tokens >= max_model_len
    estimated = None if fits else max(tokens, 0)
    if tokens > 0 and not fits:
        assumptions.append("SGLang starts anyway; a request longer than the pool cannot be admitted")
    return Prediction(
        engine="sglang",
        engine_version=d.engine_version,
        model=model.name,
        gpu_name=d.gpu_name,
        tp=d.tp,
        pp=d.pp,
        dcp=d.dcp,
        kv_cache_dtype=d.kv_cache_dtype,
        kv_elem_bytes=elem,
        bytes_per_token=per_rank,
        bytes_per_token_all_ranks=all_ranks,
        weights_bytes=weights_rank,
        weights_total_bytes=weights_total,
        weights_scheme=scheme,
        param_count=model.param_count,
        total_bytes=total,
        usable_bytes=usable,
        activation_bytes=activation,
        non_torch_bytes=non_torch,
        cuda_graph_bytes=None,
        available_kv_bytes=available,
        kv_pool_tokens=max(tokens, 0),
        kv_pool_blocks=None,
        kv_pool_bytes=max(tokens, 0) * sg.cell_bytes,
        block_size=sg.page_size,
        page_bytes=None,
        kv_groups=None,
        swa_pool_tokens=sg.swa_tokens,
        max_model_len=max_model_len,
        max_concurrency=max(tokens, 0) / max_model_len,
        fits=fits,
        estimated_max_model_len=estimated,
        needed_kv_bytes=per_rank * max_model_len,
        gpu_memory_utilization=None,
        mem_fraction_static=mfs,
        exact=sg.exact,
        failure=failure,
        inputs=inputs,
        assumptions=tuple(assumptions),
    )
