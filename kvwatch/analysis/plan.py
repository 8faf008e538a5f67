"""Workload planning: will these conversations fit, on which rank do they stop fitting, on which card.

A workload is a list of retained sequence lengths (prompt state included), optionally grouped by a
shared prefix. The engines allocate whole blocks (vLLM) or pages (SGLang) per sequence, so the plan
rounds each sequence up before summing, and counts a shared prefix's full blocks once per group --
prefix caching shares whole blocks only, the partial tail stays private to each sequence. Every rank
must hold its share of every sequence: the plan checks each rank's KV budget on its own and names
the rank that limits, because an aggregate fleet budget hides one short rank. The sizing itself
(bytes per token, the budget, the engine's block division) is kvwatch.analysis.predict's; this module
only adds the workload side (workload.py reads workloads).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvwatch.analysis.predict import engine_of, pool_from_available, predict
from kvwatch.analysis.workload import Workload
from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.gpus import GpuSpec
from kvwatch.capacity.model import ModelGeometry
from kvwatch.capacity.prediction import Prediction
from kvwatch.capacity.weights import LOAD_OOM
from kvwatch.core.errors import ConfigError
from kvwatch.core.jsontypes import JsonObject
from kvwatch.core.kinds import EngineName
from kvwatch.engines.base import Engine

# Default utilisation target for the card search: vLLM's own default gpu_memory_utilization and the
# seeds' "smallest card where the total stays under 92%".
DEFAULT_TARGET = 0.92
# Cache dtypes and weight quantisations the card search tries (None = the checkpoint as it is).
CARD_KV_DTYPES: tuple[str, ...] = ("auto", "fp8")
CARD_WEIGHTS: tuple[str | None, ...] = (None, "fp8", "int4")


@dataclass(frozen=True)
class RankCheck:
    """One rank's KV budget against the workload's share on that rank."""

    rank: int
    budget_bytes: int
    pool_tokens: int
    needed_bytes: int
    needed_tokens: int
    fits: bool
    sequences_fit: int


@dataclass(frozen=True)
class Plan:
    """The workload against one deployment: bytes per rank, the check on every rank, growth."""

    model: str
    engine: EngineName
    gpu_name: str | None
    tp: int
    pp: int
    kv_cache_dtype: str
    weights_dtype: str | None
    block_size: int
    bytes_per_token: int
    bytes_per_token_all_ranks: int
    max_model_len: int
    sequences: int
    logical_tokens: int
    allocated_tokens: int
    shared_blocks: int
    saved_blocks: int
    payload_bytes: int
    payload_bytes_all_ranks: int
    needed_bytes: int
    grow: int
    grow_bytes: int
    fits_before_growth: bool | None
    ranks: tuple[RankCheck, ...]
    limiting_rank: int
    ranks_differ: bool
    fits: bool
    sequences_fit: int
    copies: int
    prediction: Prediction
    notes: tuple[str, ...]

    def to_json_dict(self) -> JsonObject:
        """The ``kvwatch plan --json`` object for this deployment (bytes as integers)."""
        return {
            "model": self.model,
            "engine": self.engine,
            "gpu": self.gpu_name,
            "tp": self.tp,
            "pp": self.pp,
            "kv_cache_dtype": self.kv_cache_dtype,
            "weights_dtype": self.weights_dtype,
            "block_size": self.block_size,
            "bytes_per_token": self.bytes_per_token,
            "bytes_per_token_all_ranks": self.bytes_per_token_all_ranks,
            "max_model_len": self.max_model_len,
            "workload": {
                "sequences": self.sequences,
                "logical_tokens": self.logical_tokens,
                "allocated_tokens": self.allocated_tokens,
                "shared_blocks": self.shared_blocks,
                "saved_blocks": self.saved_blocks,
                "grow": self.grow,
            },
            "payload_bytes_per_rank": self.payload_bytes,
            "payload_bytes_all_ranks": self.payload_bytes_all_ranks,
            "needed_bytes_per_rank": self.needed_bytes,
            "grow_bytes_per_rank": self.grow_bytes,
            "fits_before_growth": self.fits_before_growth,
            "ranks": [
                {
                    "rank": r.rank,
                    "kv_budget_bytes": r.budget_bytes,
                    "pool_tokens": r.pool_tokens,
                    "needed_bytes": r.needed_bytes,
                    "fits": r.fits,
                    "sequences_fit": r.sequences_fit,
                }
                for r in self.ranks
            ],
            "limiting_rank": self.limiting_rank if self.ranks_differ else None,
            "fits": self.fits,
            "sequences_fit": self.sequences_fit,
            "copies": self.copies,
            "weights_bytes_per_rank": self.prediction.weights_bytes,
            "notes": list(self.notes),
        }


def _pool_tokens(engine: Engine, model: ModelGeometry, d: Deployment, budget: int) -> int:
    return pool_from_available(model, d, budget, engine)[0] if budget > 0 else 0


def make_plan(
    model: ModelGeometry,
    deployment: Deployment,
    workload: Workload,
    grow: int = 0,
    rank_kv_bytes: Sequence[int] | None = None,
    engine: Engine | None = None,
) -> Plan:
    """Check ``workload`` (grown by ``grow`` positions per sequence) on every rank of ``deployment``.

    Without ``rank_kv_bytes`` every rank gets the KV budget kvwatch.capacity predicts for the card;
    with it (one value, or one per rank in rank order), those are the ranks' KV budgets.
    """
    if grow < 0:
        raise ConfigError(f"--grow must not be negative, got {grow}")
    engine = engine_of(deployment, engine)
    ranks_n = deployment.tp * deployment.pp
    notes: list[str] = []
    if rank_kv_bytes is not None:
        if len(rank_kv_bytes) not in (1, ranks_n):
            raise ConfigError(
                f"{len(rank_kv_bytes)} rank budgets given for {ranks_n} ranks (tp x pp); give one or {ranks_n}"
            )
        budgets = tuple(rank_kv_bytes) * (ranks_n if len(rank_kv_bytes) == 1 else 1)
        pred = predict(model, deployment.with_(available_kv_bytes=min(budgets)), engine)
    else:
        pred = predict(model, deployment, engine)
        budgets = (pred.available_kv_bytes,) * ranks_n
    block = pred.block_size
    bpt = pred.bytes_per_token
    grown = workload.grown(grow)
    wb = grown.blocks(block)
    needed = wb.tokens * bpt
    pools: dict[int, int] = {}
    checks = []
    for rank, budget in enumerate(budgets):
        if budget not in pools:
            pools[budget] = _pool_tokens(engine, model, deployment, budget)
        pool = pools[budget]
        checks.append(
            RankCheck(
                rank=rank,
                budget_bytes=budget,
                pool_tokens=pool,
                needed_bytes=needed,
                needed_tokens=wb.tokens,
                fits=budget > 0 and needed <= budget and wb.tokens <= pool,
                sequences_fit=grown.greedy_fit(pool, block),
            )
        )
    limiting = min(checks, key=lambda c: (c.pool_tokens, c.budget_bytes, c.rank))
    fits_before: bool | None = None
    grow_bytes = 0
    if grow:
        base = workload.blocks(block)
        grow_bytes = needed - base.tokens * bpt
        fits_before = base.tokens * bpt <= limiting.budget_bytes and base.tokens <= limiting.pool_tokens
    if grown.longest > pred.max_model_len:
        notes.append(
            f"the longest sequence ({grown.longest:,}) exceeds max_model_len {pred.max_model_len:,}: "
            "the engine rejects it; raise --max-model-len"
        )
    if pred.kv_groups is not None and pred.kv_groups > 1 or pred.swa_pool_tokens is not None:
        notes.append("sliding-window layers keep only their window: the payload counts the growing layers")
    if not pred.exact:
        notes.append("the pool of this model is an estimate (see kvwatch predict)")
    if pred.failure is not None and pred.failure.startswith(LOAD_OOM):
        notes.append(pred.failure)
    elif pred.weights_bytes is not None and rank_kv_bytes is None and pred.available_kv_bytes <= 0:
        notes.append("the weights leave no KV budget on this card")
    return Plan(
        model=pred.model,
        engine=pred.engine,
        gpu_name=pred.gpu_name,
        tp=deployment.tp,
        pp=deployment.pp,
        kv_cache_dtype=_kv_label(model, pred.kv_cache_dtype),
        weights_dtype=deployment.weights_dtype,
        block_size=block,
        bytes_per_token=bpt,
        bytes_per_token_all_ranks=pred.bytes_per_token_all_ranks,
        max_model_len=pred.max_model_len,
        sequences=grown.sequences,
        logical_tokens=grown.tokens,
        allocated_tokens=wb.tokens,
        shared_blocks=wb.shared_blocks,
        saved_blocks=wb.saved_blocks,
        payload_bytes=grown.tokens * bpt,
        payload_bytes_all_ranks=grown.tokens * pred.bytes_per_token_all_ranks,
        needed_bytes=needed,
        grow=grow,
        grow_bytes=grow_bytes,
        fits_before_growth=fits_before,
        ranks=tuple(checks),
        limiting_rank=limiting.rank,
        ranks_differ=len(set(budgets)) > 1,
        fits=all(c.fits for c in checks) and grown.longest <= pred.max_model_len,
        sequences_fit=limiting.sequences_fit,
        copies=limiting.pool_tokens // wb.tokens if wb.tokens else 0,
        prediction=pred,
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class CardFit:
    """One card (x tp x pp) for one cache dtype and weight quantisation, at the utilisation target."""

    gpu: GpuSpec
    kv_cache_dtype: str
    weights: str
    fits: bool
    kv_budget_bytes: int
    pool_tokens: int
    needed_tokens: int
    weights_bytes: int | None
    # The card's memory and the part the engine's fraction allows (weights + non-KV + KV budget).
    total_bytes: int | None = None
    usable_bytes: int | None = None

    @property
    def pool_use(self) -> float | None:
        """Share of the KV pool the workload takes (above 1: it does not fit)."""
        return self.needed_tokens / self.pool_tokens if self.pool_tokens > 0 else None

    @property
    def card_use(self) -> float | None:
        """Share of the card's memory that weights, the non-KV allowance and the workload's share of
        the KV pool take: the figure the utilisation target bounds (at most the target when it fits)."""
        share = self.pool_use
        if share is None or not self.total_bytes or self.usable_bytes is None:
            return None
        reserved = self.usable_bytes - self.kv_budget_bytes
        return (reserved + share * self.kv_budget_bytes) / self.total_bytes


def _kv_label(model: ModelGeometry, kv: str) -> str:
    """'auto' resolved to the model dtype it stands for (bf16, fp16)."""
    return model.dtype.replace("bfloat16", "bf16").replace("float16", "fp16") if kv == "auto" else kv


def card_fits(
    model: ModelGeometry,
    base: Deployment,
    workload: Workload,
    target: float = DEFAULT_TARGET,
    cards: Iterable[GpuSpec] | None = None,
    kv_dtypes: Sequence[str] = CARD_KV_DTYPES,
    weights: Sequence[str | None] = CARD_WEIGHTS,
    engine: Engine | None = None,
) -> list[CardFit]:
    """Every card x cache dtype x weight quantisation, with the budget under ``target``.

    The target replaces the engine's memory fraction (vLLM gpu_memory_utilization, SGLang
    mem_fraction_static): weights, the non-KV allowance and the workload's KV must stay under it.
    """
    if not 0 < target < 1:
        raise ConfigError(f"--target must be in (0, 1), got {target}")
    chosen = sorted(cards if cards is not None else gpus.CATALOGUE, key=lambda g: g.memory_bytes)
    engine = engine_of(base, engine)
    fraction = {engine.labels.fraction_setting: target}
    out: list[CardFit] = []
    for kv in kv_dtypes:
        for w in weights:
            for card in chosen:
                d = base.with_(
                    gpu_memory_bytes=card.total_bytes,
                    gpu_name=card.name,
                    kv_cache_dtype=kv,
                    weights_dtype=w,
                    **fraction,
                )
                pred = predict(model, d, engine)
                needed = workload.blocks(pred.block_size).tokens
                pool = pred.kv_pool_tokens if pred.available_kv_bytes > 0 else 0
                out.append(
                    CardFit(
                        gpu=card,
                        kv_cache_dtype=_kv_label(model, kv),
                        weights=w or f"checkpoint ({pred.weights_scheme})",
                        fits=pool > 0 and needed <= pool and workload.longest <= pred.max_model_len,
                        kv_budget_bytes=pred.available_kv_bytes,
                        pool_tokens=pool,
                        needed_tokens=needed,
                        weights_bytes=pred.weights_bytes,
                        total_bytes=pred.total_bytes,
                        usable_bytes=pred.usable_bytes,
                    )
                )
    return out


def smallest_cards(fits: Sequence[CardFit]) -> dict[tuple[str, str], CardFit | None]:
    """(cache dtype, weights) -> the smallest card that fits (None when none does)."""
    out: dict[tuple[str, str], CardFit | None] = {}
    for f in fits:
        key = (f.kv_cache_dtype, f.weights)
        if key not in out:
            out[key] = None
        current = out[key]
        if f.fits and (current is None or f.gpu.memory_bytes < current.gpu.memory_bytes):
            out[key] = f
    return out
