"""vLLM's prediction: the budget of gpu_worker.py subtracted, then divided by kv_cache_utils' rules.

The division (groups, blocks, tokens, concurrency, the 'To serve at least one request' check) is
budget.py; this module puts the budget together from what was measured, given or estimated and
records which, then builds the Prediction.
"""

from __future__ import annotations

from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import ModelGeometry
from kvwatch.capacity.prediction import Basis, Prediction
from kvwatch.engines.vllm import budget
from kvwatch.units import GiB, format_bytes


def predict(model: ModelGeometry, d: Deployment, basis: Basis) -> Prediction:
    """vLLM's budget: requested = total x utilisation, minus weights, the profiled peak, non-torch and,
    from 0.21, CUDA graphs; then the KV groups and blocks of kv_cache_utils."""
    elem, max_model_len = basis.kv_elem_bytes, basis.max_model_len
    per_rank, all_ranks = basis.bytes_per_token, basis.bytes_per_token_all_ranks
    weights_rank, weights_total, scheme = basis.weights_bytes, basis.weights_total_bytes, basis.weights_scheme
    inputs, assumptions = basis.inputs, basis.assumptions
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
            util = budget.default_utilization(d.engine_version)
            inputs["gpu_memory_utilization"] = "engine_default"
            assumptions.append(
                f"gpu_memory_utilization = {util} (vLLM {d.engine_version or 'newest'} default)"
            )
        else:
            inputs["gpu_memory_utilization"] = "given"
        requested = budget.requested_bytes(total, util)
        measured = [x for x in (d.activation_bytes, d.non_torch_bytes, d.cuda_graph_bytes) if x is not None]
        if not measured:
            activation = budget.DEFAULT_OVERHEAD_BYTES
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
        graphs_applied = graphs if budget.subtracts_cuda_graphs(d.engine_version) else 0
        if graphs and not graphs_applied:
            assumptions.append("CUDA-graph memory not subtracted from the KV budget before vLLM 0.21")
        available = requested - weights_rank - activation - non_torch - graphs_applied
    mnbt = d.max_num_batched_tokens or budget.default_max_num_batched_tokens(total, d.gpu_name)
    if any(layer.kind in ("sliding", "chunked") for layer in model.layers):
        inputs["max_num_batched_tokens"] = "given" if d.max_num_batched_tokens else "engine_default"
    if d.block_size is None:
        inputs["block_size"] = "engine_default"
    plan = budget.plan(model, d, elem, available, max_model_len, mnbt)
    assumptions.extend(plan.notes)
    if plan.padding_layers:
        assumptions.append(
            f"hybrid KV groups: {len(plan.groups)} groups, {plan.padding_layers} padding layer(s)"
        )
    needed = budget.needed_bytes(model, d, elem, max_model_len, mnbt)
    failure = None
    estimated = None
    if available <= 0:
        failure = "No available memory for the cache blocks. Try increasing `gpu_memory_utilization`."
        fits = False
        estimated = 0
    elif needed > available:
        fits = False
        estimated = budget.estimate_max_model_len(model, d, elem, available, max_model_len, mnbt)
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
