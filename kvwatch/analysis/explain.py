"""``kvwatch explain``: one engine instance's budget rebuilt, predicted, attributed, with its levers.

Pure: it calls the same observed-budget, prediction, attribution and lever functions as the
sidecar's gap metric, on the same snapshot.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from kvwatch.analysis.attribution import (
    Attribution,
    apriori_inputs,
    attribute_gap,
    engine_budget_pool,
    gap_ratio,
    observed_budget,
)
from kvwatch.analysis.levers import Lever, levers
from kvwatch.analysis.predict import predict
from kvwatch.capacity.budget import Budget, predicted_budget
from kvwatch.capacity.deployment import deployment_from_settings
from kvwatch.capacity.model import ModelGeometry
from kvwatch.capacity.prediction import Prediction
from kvwatch.core.errors import KvwatchError
from kvwatch.core.events import Event, MemoryBudget
from kvwatch.core.jsontypes import JsonObject
from kvwatch.core.kinds import EngineName
from kvwatch.engines import registry
from kvwatch.state.facts import Failure, SettingsFacts
from kvwatch.state.fleet import InstanceSnapshot


@dataclass(frozen=True)
class RankSpread:
    """One printed memory figure that differs between the ranks of one instance."""

    field: str
    by_rank: Mapping[int, int]

    @property
    def limiting_rank(self) -> int:
        """The rank with the least of it (SGLang sizes every rank's pool from the minimum free)."""
        return min(self.by_rank, key=lambda r: (self.by_rank[r], r))


_SPREAD_FIELDS = (
    "avail_before_weights_bytes",
    "avail_after_weights_bytes",
    "avail_after_pool_bytes",
    "available_kv_bytes",
    "weights_bytes",
)


def rank_spreads(events: Iterable[Event], instance: str) -> list[RankSpread]:
    """Memory figures the ranks of ``instance`` printed with different values (last value per rank)."""
    seen: dict[str, dict[int, int]] = {}
    for e in events:
        if not isinstance(e, MemoryBudget) or e.instance != instance or e.rank is None:
            continue
        if e.total_bytes is not None and seen:
            seen.clear()  # a new budget printout: a later engine start
        for name in _SPREAD_FIELDS:
            value = getattr(e, name)
            if value is not None:
                seen.setdefault(name, {})[e.rank] = value
    return [RankSpread(k, v) for k, v in seen.items() if len(set(v.values())) > 1]


@dataclass(frozen=True)
class Explanation:
    """Everything ``kvwatch explain`` says about one engine instance."""

    source: str
    instance: str
    engine: EngineName
    engine_version: str | None
    model: str | None
    observed: Budget
    predicted: Budget | None
    prediction: Prediction | None
    observed_tokens: int | None
    predicted_tokens: int | None
    budget_tokens: int | None
    max_model_len: int | None
    attribution: Attribution | None
    levers: tuple[Lever, ...]
    spreads: tuple[RankSpread, ...]
    failure: Failure | None
    notes: tuple[str, ...] = field(default=())

    def to_json_dict(self) -> JsonObject:
        """The ``kvwatch explain --json`` object for this instance (bytes as integers)."""
        attribution: JsonObject | None = None
        if self.attribution is not None:
            a = self.attribution
            attribution = {
                "observed_kv_bytes": a.observed_kv,
                "predicted_kv_bytes": a.predicted_kv,
                "gap_bytes": a.gap_bytes,
                "gap_ratio": _round(a.gap_ratio),
                "terms": [
                    {
                        "term": c.term,
                        "bytes": c.bytes,
                        "percent_of_predicted": _round(a.percent(c)),
                        "share_of_gap": _round(a.share(c)),
                        "observed": c.observed,
                        "predicted": c.predicted,
                    }
                    for c in a.contributions
                ],
                "main_terms": [c.term for c in a.main_terms()],
            }
        return {
            "source": self.source,
            "instance": self.instance,
            "engine": self.engine,
            "engine_version": self.engine_version,
            "model": self.model,
            "max_model_len": self.max_model_len,
            "observed": _budget_json(self.observed),
            "predicted": _budget_json(self.predicted) if self.predicted is not None else None,
            "pool_tokens": {
                "observed": self.observed_tokens,
                "predicted": self.predicted_tokens,
                "engine_budget": self.budget_tokens,
            },
            "gap_ratio": {
                "config": _round(gap_ratio(self.observed_tokens, self.predicted_tokens)),
                "engine_budget": _round(gap_ratio(self.observed_tokens, self.budget_tokens)),
            },
            "attribution": attribution,
            "levers": [
                {
                    "lever": lv.name,
                    "change": lv.change,
                    "kv_bytes": lv.kv_bytes,
                    "pool_tokens": lv.pool_tokens,
                    "max_concurrency": _round(lv.max_concurrency),
                    "note": lv.note,
                }
                for lv in self.levers
            ],
            "rank_spread": [
                {
                    "field": s.field,
                    "by_rank": {str(r): v for r, v in sorted(s.by_rank.items())},
                    "limiting_rank": s.limiting_rank,
                }
                for s in self.spreads
            ],
            "startup_failure": self.failure.to_json() if self.failure is not None else None,
            "assumptions": list(self.prediction.assumptions) if self.prediction is not None else [],
            "notes": list(self.notes),
        }


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 4)


def _budget_json(b: Budget) -> JsonObject:
    return {
        "fraction": b.fraction,
        "fraction_source": b.fraction_source,
        "terms": {
            name: {"bytes": t.bytes, "source": t.source} for name, t in b.terms.items() if t.bytes is not None
        },
    }


@dataclass(frozen=True)
class Overrides:
    """Deployment fields from the command line: they fill what the log did not print."""

    tp: int | None = None
    pp: int | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    engine_version: str | None = None

    def unprinted(self, settings: SettingsFacts) -> Overrides:
        """The overrides of what ``settings`` does not say (the log wins over a flag)."""
        s = settings
        return Overrides(
            tp=self.tp if s.tensor_parallel_size is None else None,
            pp=self.pp if s.pipeline_parallel_size is None else None,
            kv_cache_dtype=self.kv_cache_dtype if s.kv_cache_dtype is None else None,
            max_model_len=self.max_model_len if s.max_model_len is None else None,
            engine_version=self.engine_version if s.version is None else None,
        )

    def filled(self, settings: SettingsFacts) -> SettingsFacts:
        """``settings`` with what it does not say taken from the overrides."""
        return SettingsFacts(
            tensor_parallel_size=self.tp,
            pipeline_parallel_size=self.pp,
            kv_cache_dtype=self.kv_cache_dtype,
            max_model_len=self.max_model_len,
            version=self.engine_version,
        ).overlaid(settings)


# The pool the engine made of its own budget and the one this config's bytes per token make of the
# same bytes differ by more than this: another model's config (the cache dtype or TP read wrong
# gives factors of 2, a close relative's config a few percent).
MISMATCH_RATIO = 0.10
_SIZE = re.compile(r"(?<![0-9a-z.])([0-9]+(?:\.[0-9]+)?)b(?![a-z])")


def _size_tag(name: str) -> str | None:
    """'meta-llama/Llama-3.1-8B-Instruct' -> '8'; None when the name gives no parameter count."""
    found = _SIZE.findall(name.rsplit("/", 1)[-1].lower())
    return found[-1] if found else None


def model_mismatch(
    served: str | None, config: str, observed_tokens: int | None, budget_tokens: int | None
) -> str | None:
    """One line when the config is unlikely to be the served model's: the pool the engine made of
    its budget disagrees with the config's bytes per token, or the names give other sizes (8B/70B)."""
    names = f"the log serves {served}, the config is {config}" if served else f"the config is {config}"
    if observed_tokens and budget_tokens:
        ratio = observed_tokens / budget_tokens - 1
        if abs(ratio) > MISMATCH_RATIO:
            return (
                f"model mismatch? the engine's pool holds {abs(ratio) * 100:.0f}% "
                f"{'more' if ratio > 0 else 'fewer'} tokens than this config's bytes per token make of "
                f"its budget: another model, release or cache dtype ({names})"
            )
    if served:
        a, b = _size_tag(served), _size_tag(config)
        if a is not None and b is not None and float(a) != float(b):
            return f"model mismatch? {names}: {a}B and {b}B parameters"
    return None


def explain(
    snap: InstanceSnapshot,
    model: ModelGeometry | None,
    gpu_memory_bytes: int | None = None,
    overrides: Overrides | None = None,
    events: Iterable[Event] = (),
) -> Explanation:
    """Rebuild, predict, attribute and list the levers for one instance of a replayed log.

    ``overrides`` fill what the log did not print and never replace what it did. ``events`` are
    the replayed events, for the per-rank spread.
    """
    engine = registry.ENGINES[snap.engine]
    settings, apriori = apriori_inputs(snap)
    # Flags fill what the log did not print (the log wins); the observed budget's engine defaults
    # depend on them too.
    extra = (overrides or Overrides()).unprinted(settings)
    observed = observed_budget(engine, snap.memory, snap.pool, extra.filled(settings), gpu_memory_bytes)
    pool = snap.pool
    observed_tokens = pool.tokens
    if observed_tokens is None and pool.blocks is not None:
        block = pool.block_size or settings.block_size
        if block is None:
            block = engine.capacity.default_block_size(model)
        observed_tokens = pool.blocks * block if block else None
    notes: list[str] = []
    prediction = predicted = None
    predicted_tokens = budget_tokens = None
    attribution = None
    lever_list: list[Lever] = []
    max_model_len = extra.max_model_len or settings.max_model_len
    if model is None:
        notes.append(
            "no model config: give --model-config for the prediction, the attribution and the levers"
        )
    else:
        try:
            fill = {
                "tp": extra.tp,
                "pp": extra.pp,
                "kv_cache_dtype": extra.kv_cache_dtype,
                "max_model_len": extra.max_model_len,
                "engine_version": extra.engine_version,
            }
            a_priori = deployment_from_settings(snap.engine, settings, apriori, gpu_memory_bytes, **fill)
            if a_priori.gpu_memory_bytes is None:
                notes.append(
                    "the log does not print the card's memory: give --gpu or --gpu-memory to predict"
                )
            else:
                prediction = predict(model, a_priori, engine)
                predicted = predicted_budget(prediction)
                predicted_tokens = prediction.kv_pool_tokens
                max_model_len = prediction.max_model_len
                # Both sides counted as the release counts them (vLLM up to 0.19 prints and
                # estimates CUDA-graph memory but does not subtract it).
                version = a_priori.engine_version
                gap_settings = replace(settings, version=version)
                attribution = attribute_gap(
                    engine,
                    engine.observed.budget_terms_for_gap(observed.as_bytes(), gap_settings),
                    engine.observed.budget_terms_for_gap(predicted.as_bytes(), gap_settings),
                    observed.fraction,
                    predicted.fraction,
                )
            kv = observed.get("kv")
            if max_model_len is None:
                max_model_len = model.max_position_embeddings
            # The engine-budget pool: the sidecar's function on the sidecar's inputs.
            full = deployment_from_settings(snap.engine, settings, snap.memory, gpu_memory_bytes, **fill)
            own_pool = engine_budget_pool(engine, model, full, snap.memory, snap.pool)
            if own_pool is not None:
                budget_tokens = own_pool.tokens
            if kv is not None and kv <= 0:
                notes.append(
                    "the KV budget is not positive: nothing is left for the cache after the terms above"
                )
            if kv is not None and max_model_len:
                lever_list = levers(
                    engine, model, a_priori, observed, observed_tokens or budget_tokens or 0, max_model_len
                )
        except KvwatchError as exc:
            notes.append(f"no prediction: {exc}")
    if observed_tokens is None and budget_tokens is not None:
        notes.append("the log prints no pool size: compare the engine_budget tokens instead")
    if model is not None:
        mismatch = model_mismatch(settings.model, model.name, observed_tokens, budget_tokens)
        if mismatch is not None:
            notes.append(mismatch)
    if attribution is not None and all(c.term == "unattributed" for c in attribution.contributions):
        notes.append("the log prints too few budget terms to attribute the gap to any of them")
    return Explanation(
        source=snap.source,
        instance=snap.instance,
        engine=snap.engine,
        engine_version=settings.version,
        model=model.name if model is not None else settings.model,
        observed=observed,
        predicted=predicted,
        prediction=prediction,
        observed_tokens=observed_tokens,
        predicted_tokens=predicted_tokens,
        budget_tokens=budget_tokens,
        max_model_len=max_model_len,
        attribution=attribution,
        levers=tuple(lever_list),
        spreads=tuple(rank_spreads(events, snap.instance)),
        failure=snap.last_failure,
        notes=tuple(notes),
    )
