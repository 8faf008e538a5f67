"""Prediction: a model and a deployment in, the engine's KV pool (and the budget behind it) out.

``predict`` works out what every engine's prediction starts from (bytes per token, weights per
rank, the context length) and hands it to the engine's own arithmetic (kvwatch/engines/*/predict.py),
which records for every input whether it was given, taken from the engine's default, or estimated;
``pool_from_available`` is the engine-exact division alone, for when the engine has already
printed its KV budget (the sidecar's 'engine_budget' basis). Each takes the ``Engine`` its caller
resolved (a command, the sidecar's predictor), which must be the deployment's; without one, the
deployment's engine is looked up by its ``EngineName``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from kvwatch.capacity.deployment import Deployment, kv_elem_bytes, validate
from kvwatch.capacity.gpus import GpuSpec
from kvwatch.capacity.model import ModelGeometry, stage_layers
from kvwatch.capacity.prediction import Basis, InputSource, Prediction
from kvwatch.capacity.weights import weights_per_rank
from kvwatch.core.errors import ConfigError, KvwatchError, NoGpuMemoryError, UnmodelledError
from kvwatch.engines import registry
from kvwatch.engines.base import Capacity, Engine

__all__ = ["Prediction", "pool_from_available", "predict", "predict_on_cards"]


def engine_of(d: Deployment, engine: Engine | None = None) -> Engine:
    """``engine`` when the caller resolved it (it must be the deployment's), else the deployment's."""
    if engine is None:
        return registry.ENGINES[d.engine]
    if engine.name != d.engine:
        raise ValueError(f"a {d.engine} deployment given the {engine.name} engine")
    return engine


def _bytes_per_token(capacity: Capacity, model: ModelGeometry, d: Deployment, elem: int) -> tuple[int, int]:
    """(per rank on the fullest pipeline stage, summed over every rank) for the growing layers; a
    model whose every cached layer is windowed (Mistral-style) counts those, what a token inside the
    window costs -- never 0 B per token."""
    grows = any(layer.grows for layer in model.layers)
    stages = [
        sum(
            capacity.layer_bytes(layer, d, elem)
            for layer in stage
            if (layer.grows if grows else layer.is_paged)
        )
        for stage in stage_layers(model.layers, d.pp)
    ]
    if max(stages) <= 0:
        raise UnmodelledError(
            f"{model.name}: kvwatch sizes its KV cache at 0 B per token; its layers are not modelled"
        )
    return max(stages), sum(stages) * d.tp


def pool_from_available(
    model: ModelGeometry, deployment: Deployment, available_kv_bytes: int, engine: Engine | None = None
) -> tuple[int, int | None]:
    """(tokens, blocks) the engine makes of ``available_kv_bytes`` on one rank; blocks None for SGLang."""
    validate(model, deployment)
    capacity = engine_of(deployment, engine).capacity
    deployment, _ = _resolved(capacity, model, deployment)
    elem = kv_elem_bytes(model, deployment.kv_cache_dtype, deployment.dtype)
    return capacity.pool_from_available(model, deployment, elem, available_kv_bytes)


def tokens_of_pool_bytes(
    model: ModelGeometry, deployment: Deployment, pool_bytes: int, engine: Engine | None = None
) -> int | None:
    """Tokens of a pool whose buffers the engine printed in bytes (SGLang's 'KV size'); None for an
    engine that prints its budget instead."""
    validate(model, deployment)
    capacity = engine_of(deployment, engine).capacity
    deployment, _ = _resolved(capacity, model, deployment)
    elem = kv_elem_bytes(model, deployment.kv_cache_dtype, deployment.dtype)
    return capacity.tokens_of_pool_bytes(model, deployment, elem, pool_bytes)


def _resolved(capacity: Capacity, model: ModelGeometry, d: Deployment) -> tuple[Deployment, str | None]:
    """``d`` with the cache dtype the engine stores (an 'auto' the checkpoint decides), and why."""
    dtype, note = capacity.kv_cache_dtype(model, d)
    return (d if dtype == d.kv_cache_dtype else replace(d, kv_cache_dtype=dtype)), note


def _max_model_len(model: ModelGeometry, d: Deployment) -> int:
    if d.max_model_len is not None:
        return d.max_model_len
    if model.max_position_embeddings is None:
        raise ConfigError("config.json has no max_position_embeddings; pass --max-model-len")
    return model.max_position_embeddings


def predict(model: ModelGeometry, deployment: Deployment, engine: Engine | None = None) -> Prediction:
    """The engine's KV pool for this model and deployment, with every assumption listed."""
    validate(model, deployment)
    return _predict(engine_of(deployment, engine).capacity, model, deployment)


def predict_on_cards(
    model: ModelGeometry, base: Deployment, cards: Iterable[GpuSpec], engine: Engine | None = None
) -> list[Prediction]:
    """The prediction on each of ``cards`` that holds the deployment, in their order.

    ``base`` is validated once (what the engine refuses on any card: a ConfigError); only the card
    changes from one prediction to the next, and a card the deployment does not fit is left out.
    """
    validate(model, base)
    capacity = engine_of(base, engine).capacity
    out = []
    for card in cards:
        try:
            out.append(
                _predict(capacity, model, base.with_(gpu_memory_bytes=card.total_bytes, gpu_name=card.name))
            )
        except KvwatchError:
            continue
    return out


def _predict(capacity: Capacity, model: ModelGeometry, d: Deployment) -> Prediction:
    if d.gpu_memory_bytes is None and capacity.needs_gpu_memory(d):
        raise NoGpuMemoryError(
            "need the GPU's memory (--gpu NAME or --gpu-memory SIZE) or --available-kv-memory"
        )
    given = d.kv_cache_dtype
    d, kv_note = _resolved(capacity, model, d)
    elem = kv_elem_bytes(model, d.kv_cache_dtype, d.dtype)
    inputs: dict[str, InputSource] = {}
    assumptions: list[str] = list(model.notes)
    if kv_note:
        assumptions.append(kv_note)
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
    inputs["kv_cache_dtype"] = "given" if given != "auto" else "derived" if kv_note else "engine_default"
    per_rank, all_ranks = _bytes_per_token(capacity, model, d, elem)

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

    basis = Basis(
        kv_elem_bytes=elem,
        max_model_len=max_model_len,
        bytes_per_token=per_rank,
        bytes_per_token_all_ranks=all_ranks,
        weights_bytes=weights_rank,
        weights_total_bytes=weights_total,
        weights_scheme=scheme,
        inputs=inputs,
        assumptions=assumptions,
    )
    return capacity.predict(model, d, basis)
