"""Levers: what each change the seeds name would make of an engine's observed budget.

A shorter max-model-len, an fp8 cache, quantised weights, more TP, a higher memory fraction: each is
applied to the budget the engine printed and divided the engine's way (kvwatch.analysis.predict).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvwatch.analysis.predict import pool_from_available, predict
from kvwatch.capacity.budget import Budget
from kvwatch.capacity.deployment import Deployment, kv_elem_bytes, validate
from kvwatch.capacity.model import ModelGeometry
from kvwatch.capacity.weights import weight_bytes
from kvwatch.core.errors import ConfigError, KvwatchError
from kvwatch.core.units import format_bytes
from kvwatch.engines.base import Engine

# Where the seeds stop: a memory fraction above this leaves too little for activations.
MAX_LEVER_FRACTION = 0.95
LEVER_FRACTION_STEP = 0.03
# Observed weights below this share of the config's own (unquantised) size: a quantised checkpoint.
QUANTISED_WEIGHTS_RATIO = 0.75


@dataclass(frozen=True)
class Lever:
    """One change from the seeds, applied to the observed budget and divided the engine's way."""

    name: str
    change: str
    kv_bytes: int
    pool_tokens: int
    max_concurrency: float
    note: str = ""


def tokens_from_budget(engine: Engine, model: ModelGeometry, d: Deployment, kv: int) -> int:
    """The tokens the engine makes of ``kv`` bytes (0 when there are none)."""
    return pool_from_available(model, d, kv, engine)[0] if kv > 0 else 0


def levers(
    engine: Engine,
    model: ModelGeometry,
    deployment: Deployment,
    observed: Budget,
    pool_tokens: int,
    max_model_len: int,
) -> list[Lever]:
    """What each seed lever would make of this engine's observed budget (per rank)."""
    kv = observed.get("kv")
    if kv is None:
        return []
    d = deployment
    out: list[Lever] = []

    def add(name: str, change: str, dep: Deployment, new_kv: int, note: str = "", length: int = 0) -> None:
        try:
            tokens = tokens_from_budget(engine, model, dep, new_kv)
        except KvwatchError:
            return
        if tokens <= 0:
            return  # the change does not make room for a single block
        mml = length or max_model_len
        out.append(Lever(name, change, new_kv, tokens, tokens / mml if mml else 0.0, note))

    if pool_tokens < max_model_len:
        fit = _longest_fitting(engine, model, d, kv, max_model_len)
        if fit:
            out.append(
                Lever(
                    "max_model_len",
                    f"--max-model-len {fit}",
                    kv,
                    pool_tokens,
                    pool_tokens / fit,
                    "the longest request the pool can admit; the pool itself does not change",
                )
            )
    elif max_model_len >= 2:
        half = max_model_len // 2
        out.append(
            Lever(
                "max_model_len",
                f"--max-model-len {half}",
                kv,
                pool_tokens,
                pool_tokens / half,
                "same pool, twice the full-length requests",
            )
        )
    # The dtype the engine stores: a checkpoint's own fp8 KV (an 'auto' it resolves) has no lever left.
    elem = kv_elem_bytes(model, engine.capacity.kv_cache_dtype(model, d)[0], d.dtype)
    if elem > 1:
        add(
            "kv_cache_dtype",
            "--kv-cache-dtype fp8",
            d.with_(kv_cache_dtype="fp8"),
            kv,
            "check output quality",
        )
    weights = observed.get("weights")
    if weights is not None and weights > 0:
        current = weight_bytes(model, d.weights_dtype)[0]
        # Weights far below the config's own size mean a quantised checkpoint already: the ratio
        # below would then promise savings it already has.
        per_rank = current // (d.tp * d.pp)
        quantised = per_rank > 0 and weights < QUANTISED_WEIGHTS_RATIO * per_rank
        for dtype in ("fp8", "int4"):
            smaller = weight_bytes(model, dtype)[0]
            if current > 0 and smaller < current and not quantised:
                saved = int(weights * (1 - smaller / current))
                add(
                    "weights",
                    f"{dtype} weights",
                    d,
                    kv + saved,
                    f"weights {format_bytes(weights * smaller // current)} per rank",
                )
        tp2 = d.tp * 2
        try:
            validate(model, d.with_(tp=tp2))
        except ConfigError:
            pass
        else:
            add(
                "tp",
                f"--tensor-parallel-size {tp2}",
                d.with_(tp=tp2),
                kv + weights - weights // 2,
                "half the weights per rank; activation and non-torch memory assumed unchanged",
            )
    frac = observed.fraction
    if frac is not None and frac < MAX_LEVER_FRACTION:
        new = round(min(MAX_LEVER_FRACTION, frac + LEVER_FRACTION_STEP), 2)
        raised = engine.observed.fraction_lever(d, observed, frac, new)
        if raised is not None:
            add("utilisation", raised.change, raised.deployment, kv + raised.extra_kv_bytes, raised.note)
    return out


def _longest_fitting(engine: Engine, model: ModelGeometry, d: Deployment, kv: int, max_model_len: int) -> int:
    """The longest request the KV budget admits (vLLM's estimate_max_model_len; SGLang: the pool)."""
    if kv <= 0:
        return 0
    pred = predict(model, d.with_(available_kv_bytes=kv, max_model_len=max_model_len), engine)
    if pred.fits:
        return max_model_len
    return pred.estimated_max_model_len or 0
