"""Why the pool differs from the prediction: the budget rebuilt term by term, the gap attributed.

An engine sizes its KV pool by subtraction (vLLM: total x gpu_memory_utilization - weights -
activation peak - non-torch - CUDA graphs; SGLang: (free before weights) x mem_fraction_static -
weights), then divides by the bytes one token costs. ``observed_budget`` rebuilds that subtraction
from what the engine printed, deriving a term only where the engine's own identity allows it;
``attribute_gap`` splits the difference between the observed and the predicted KV budget into
the terms that caused it (bytes, and percent of the predicted budget); ``levers`` re-divides the
observed budget under the changes the seeds name (shorter max-model-len, fp8 cache, quantised
weights, more TP, a higher memory fraction). Everything here is pure: the sidecar's gap metric
and ``kvwatch explain`` call the same functions on the same snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kvwatch import capacity, names
from kvwatch.capacity import Deployment, ModelGeometry, Prediction, sglang_budget, vllm_budget
from kvwatch.capacity.weights import weight_bytes
from kvwatch.errors import ConfigError, KvwatchError
from kvwatch.events import Event, MemoryBudget
from kvwatch.state import InstanceSnapshot
from kvwatch.units import format_bytes

TermSource = Literal["printed", "derived", "given", "engine_default", "predicted"]

# MemoryBudget fields known before the engine starts: the a-priori prediction may use only these.
APRIORI_MEMORY: frozenset[str] = frozenset({"total_bytes", "gpu_memory_utilization", "mem_fraction_static"})

# Every term attribute_gap can name (a bounded label set for a per-term gap metric), in the order
# the KV budget subtracts them.
ATTRIBUTION_TERMS: tuple[str, ...] = (
    "total",
    "utilisation",
    "usable",
    "non_torch",
    "weights",
    "activation",
    "unattributed",
)

# Where the seeds stop: a memory fraction above this leaves too little for activations.
MAX_LEVER_FRACTION = 0.95
LEVER_FRACTION_STEP = 0.03
# Observed weights below this share of the config's own (unquantised) size: a quantised checkpoint.
QUANTISED_WEIGHTS_RATIO = 0.75


@dataclass(frozen=True)
class Term:
    """One term of a memory budget (bytes per rank) and where the figure came from."""

    name: str
    bytes: int | None
    source: TermSource | None = None
    note: str = ""


class _Put(Protocol):
    """Record a term unless it is already known (printed figures first, derived ones after)."""

    def __call__(self, name: str, value: int | None, source: TermSource, note: str = "") -> None: ...


@dataclass(frozen=True)
class Budget:
    """A memory budget by names.MEMORY_TERMS term, with the fraction (utilisation) it used."""

    engine: str
    fraction: float | None
    fraction_source: TermSource | None
    terms: Mapping[str, Term]

    def get(self, name: str) -> int | None:
        term = self.terms.get(name)
        return None if term is None else term.bytes

    def as_bytes(self) -> dict[str, int | None]:
        return {name: self.get(name) for name in names.MEMORY_TERMS}


def apriori_inputs(snap: InstanceSnapshot) -> tuple[dict[str, Any], dict[str, Any]]:
    """(settings, memory) a prediction may use before the engine starts, as the sidecar uses them.

    vLLM's 'Maximum concurrency for N tokens per request' names max_model_len when no settings
    line did.
    """
    settings = dict(snap.settings)
    if settings.get("max_model_len") is None and snap.pool.get("max_concurrency_tokens"):
        settings["max_model_len"] = snap.pool["max_concurrency_tokens"]
    memory = {k: v for k, v in snap.memory.items() if k in APRIORI_MEMORY}
    return settings, memory


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def observed_budget(
    engine: str,
    memory: Mapping[str, Any],
    pool: Mapping[str, Any],
    settings: Mapping[str, Any],
    gpu_memory_bytes: int | None = None,
) -> Budget:
    """The engine's budget from its printed terms; a missing term is derived only from the identity."""
    terms: dict[str, Term] = {}

    def put(name: str, value: int | None, source: TermSource, note: str = "") -> None:
        if value is not None and name not in terms:
            terms[name] = Term(name, value, source, note)

    total = _int(memory.get("total_bytes"))
    put("total", total, "printed")
    if total is None and gpu_memory_bytes is not None:
        total = gpu_memory_bytes
        put("total", total, "given", "--gpu / --gpu-memory")
    for key, name in (
        ("weights_bytes", "weights"),
        ("non_torch_bytes", "non_torch"),
        ("cuda_graph_bytes", "cuda_graphs"),
        ("activation_bytes", "activation"),
    ):
        put(name, _int(memory.get(key)), "printed")
    kv = _int(memory.get("available_kv_bytes"))
    put("kv", kv, "printed")
    if engine == "vllm":
        return _observed_vllm(terms, put, memory, settings, total, kv)
    return _observed_sglang(terms, put, memory, pool, settings, total, kv)


def _fraction(
    key: str, memory: Mapping[str, Any], settings: Mapping[str, Any]
) -> tuple[float | None, TermSource | None]:
    for where in (memory, settings):
        value = where.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value), "printed"
    return None, None


def _observed_vllm(
    terms: dict[str, Term],
    put: _Put,
    memory: Mapping[str, Any],
    settings: Mapping[str, Any],
    total: int | None,
    kv: int | None,
) -> Budget:
    frac, frac_source = _fraction("gpu_memory_utilization", memory, settings)
    if frac is None and total is not None:
        version = settings.get("version")
        frac, frac_source = (
            vllm_budget.default_utilization(str(version) if version else None),
            "engine_default",
        )
    put("usable", _int(memory.get("requested_bytes")), "printed")
    if total is not None and frac is not None:
        put("usable", vllm_budget.requested_bytes(total, frac), "derived", "total x gpu_memory_utilization")
    usable, weights = terms.get("usable"), terms.get("weights")
    if "activation" not in terms and usable and weights and usable.bytes is not None and kv is not None:
        assert weights.bytes is not None
        version = settings.get("version")
        subtracted = ("non_torch", "cuda_graphs") if _graphs_in_budget(version) else ("non_torch",)
        others = sum(t.bytes or 0 for n, t in terms.items() if n in subtracted)
        put(
            "activation",
            usable.bytes - weights.bytes - kv - others,
            "derived",
            "usable - weights - KV - printed terms: the profiled peak and whatever the log did not print",
        )
    return Budget("vllm", frac, frac_source, terms)


def _graphs_in_budget(version: Any) -> bool:
    """Whether vLLM takes CUDA-graph memory out of the KV budget (0.21+, or an unknown version)."""
    return vllm_budget.subtracts_cuda_graphs(str(version) if version else None)


def _observed_sglang(
    terms: dict[str, Term],
    put: _Put,
    memory: Mapping[str, Any],
    pool: Mapping[str, Any],
    settings: Mapping[str, Any],
    total: int | None,
    kv: int | None,
) -> Budget:
    before = _int(memory.get("avail_before_weights_bytes"))
    after_weights = _int(memory.get("avail_after_weights_bytes"))
    after_pool = _int(memory.get("avail_after_pool_bytes"))
    if kv is None:
        kv = _int(pool.get("bytes"))
        put("kv", kv, "printed", "K size + V size of the allocated pool")
    if kv is None and after_weights is not None and after_pool is not None:
        kv = after_weights - after_pool
        put("kv", kv, "derived", "free after weights - free after the pool")
    if total is not None and before is not None:
        put("non_torch", total - before, "derived", "total - free before weights (CUDA context, NCCL)")
    frac, frac_source = _fraction("mem_fraction_static", memory, settings)
    if frac is None and total is not None:
        version = settings.get("version")
        d = Deployment(
            engine="sglang",
            engine_version=str(version) if version else None,
            gpu_memory_bytes=total,
            tp=_int(settings.get("tensor_parallel_size")) or 1,
            pp=_int(settings.get("pipeline_parallel_size")) or 1,
        )
        frac, frac_source = sglang_budget.default_mem_fraction_static(d).value, "engine_default"
    pre_load = before
    if pre_load is None and total is not None and "non_torch" in terms:
        pre_load = total - (terms["non_torch"].bytes or 0)
    weights = terms.get("weights")
    if pre_load is not None and frac is not None:
        put("usable", int(pre_load * frac), "derived", "free before weights x mem_fraction_static")
    elif weights is not None and weights.bytes is not None and kv is not None:
        put("usable", weights.bytes + kv, "derived", "weights + KV pool (SGLang's static part)")
    usable = terms.get("usable")
    if pre_load is not None and usable is not None and usable.bytes is not None:
        put("activation", pre_load - usable.bytes, "derived", "reserve outside mem_fraction_static")
    return Budget("sglang", frac, frac_source, terms)


def predicted_budget(prediction: Prediction) -> Budget:
    """The prediction's budget as a Budget (every term 'predicted')."""
    terms = {
        name: Term(name, value, "predicted")
        for name, value in prediction.memory_terms().items()
        if value is not None
    }
    frac = (
        prediction.gpu_memory_utilization if prediction.engine == "vllm" else prediction.mem_fraction_static
    )
    return Budget(prediction.engine, frac, "predicted", terms)


@dataclass(frozen=True)
class Contribution:
    """How much one term moved the KV budget: positive = the observed pool is larger for it."""

    term: str
    bytes: int
    observed: int | float | None = None
    predicted: int | float | None = None


@dataclass(frozen=True)
class Attribution:
    """The KV-budget gap (observed - predicted) split into the terms that make it up."""

    observed_kv: int
    predicted_kv: int
    contributions: tuple[Contribution, ...]

    @property
    def gap_bytes(self) -> int:
        return self.observed_kv - self.predicted_kv

    @property
    def gap_ratio(self) -> float | None:
        """observed / predicted - 1, the same ratio as the sidecar's gap gauge."""
        return gap_ratio(self.observed_kv, self.predicted_kv)

    def percent(self, c: Contribution) -> float | None:
        """A contribution in percent of the predicted KV budget."""
        return 100.0 * c.bytes / self.predicted_kv if self.predicted_kv > 0 else None

    def share(self, c: Contribution) -> float | None:
        """A contribution as a share of the gap (the shares sum to 1)."""
        gap = self.gap_bytes
        return c.bytes / gap if gap else None

    def main_terms(self, share: float = 0.1) -> list[Contribution]:
        """The terms that make up at least ``share`` of the gross gap, largest first."""
        gross = sum(abs(c.bytes) for c in self.contributions)
        if gross == 0:
            return []
        return sorted(
            (c for c in self.contributions if abs(c.bytes) >= share * gross),
            key=lambda c: -abs(c.bytes),
        )


def gap_ratio(observed: float | None, predicted: float | None) -> float | None:
    """observed / predicted - 1 (negative: smaller than predicted); None when undefined."""
    if observed is None or predicted is None or predicted <= 0:
        return None
    return observed / predicted - 1.0


def attribute_gap(
    engine: str,
    observed: Mapping[str, int | None],
    predicted: Mapping[str, int | None],
    observed_fraction: float | None = None,
    predicted_fraction: float | None = None,
) -> Attribution | None:
    """Split observed KV - predicted KV (names.MEMORY_TERMS mappings, bytes per rank) by term.

    vLLM: kv = total x f - weights - (activation + non-torch + CUDA graphs); the last three are
    one term because kvwatch predicts them as one allowance. SGLang: kv = (total - non_torch) x f
    - weights. Each difference is weighted as it enters the identity (a card that is 1 GiB larger
    adds f GiB, not 1 GiB); what no known term explains is 'unattributed'. None when either KV
    budget is unknown.
    """
    ok, pk = observed.get("kv"), predicted.get("kv")
    if ok is None or pk is None:
        return None
    out: list[Contribution] = []
    to, tp_ = observed.get("total"), predicted.get("total")
    fo, fp = observed_fraction, predicted_fraction
    usable_split = False
    if engine == "sglang":
        no, np_ = observed.get("non_torch"), predicted.get("non_torch")
        if to is not None and tp_ is not None and fp is not None and no is not None and np_ is not None:
            out.append(Contribution("total", round((to - tp_) * fp), to, tp_))
            out.append(Contribution("non_torch", round(-(no - np_) * fp), no, np_))
            if fo is not None:
                out.append(Contribution("utilisation", round((to - no) * (fo - fp)), fo, fp))
                usable_split = True
    elif to is not None and tp_ is not None and fp is not None and fo is not None:
        out.append(Contribution("total", round((to - tp_) * fp), to, tp_))
        out.append(Contribution("utilisation", round(to * (fo - fp)), fo, fp))
        usable_split = True
    if not usable_split:
        uo, up = observed.get("usable"), predicted.get("usable")
        if uo is not None and up is not None:
            out.append(Contribution("usable", uo - up, uo, up))
    wo, wp = observed.get("weights"), predicted.get("weights")
    if wo is not None and wp is not None:
        out.append(Contribution("weights", -(wo - wp), wo, wp))
    if engine == "vllm":
        ao, ap = observed.get("activation"), predicted.get("activation")
        if ao is not None and ap is not None:
            oa = ao + (observed.get("non_torch") or 0) + (observed.get("cuda_graphs") or 0)
            pa = ap + (predicted.get("non_torch") or 0) + (predicted.get("cuda_graphs") or 0)
            out.append(Contribution("activation", -(oa - pa), oa, pa))
    rest = (ok - pk) - sum(c.bytes for c in out)
    out.append(Contribution("unattributed", rest))
    return Attribution(ok, pk, tuple(out))


@dataclass(frozen=True)
class Lever:
    """One change from the seeds, applied to the observed budget and divided the engine's way."""

    name: str
    change: str
    kv_bytes: int
    pool_tokens: int
    max_concurrency: float
    note: str = ""


def _pool(model: ModelGeometry, d: Deployment, kv: int) -> int:
    return capacity.pool_from_available(model, d, kv)[0] if kv > 0 else 0


def levers(
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
            tokens = _pool(model, dep, new_kv)
        except KvwatchError:
            return
        if tokens <= 0:
            return  # the change does not make room for a single block
        mml = length or max_model_len
        out.append(Lever(name, change, new_kv, tokens, tokens / mml if mml else 0.0, note))

    if pool_tokens < max_model_len:
        fit = _longest_fitting(model, d, kv, max_model_len)
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
    elem = capacity.kv_elem_bytes(model, d.kv_cache_dtype)
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
            capacity.validate(model, d.with_(tp=tp2))
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
        total = observed.get("total")
        if d.engine == "vllm" and total is not None:
            extra = vllm_budget.requested_bytes(total, new) - vllm_budget.requested_bytes(total, frac)
            add(
                "utilisation",
                f"--gpu-memory-utilization {new}",
                d.with_(gpu_memory_utilization=new),
                kv + extra,
                "less room for activations: risk of CUDA OOM at large prefills",
            )
        elif d.engine == "sglang" and total is not None:
            base = total - (observed.get("non_torch") or 0)
            add(
                "utilisation",
                f"--mem-fraction-static {new}",
                d.with_(mem_fraction_static=new),
                kv + int(base * new) - int(base * frac),
                "less room for activations and CUDA graphs: risk of CUDA OOM",
            )
    return out


def _longest_fitting(model: ModelGeometry, d: Deployment, kv: int, max_model_len: int) -> int:
    """The longest request the KV budget admits (vLLM's estimate_max_model_len; SGLang: the pool)."""
    if kv <= 0:
        return 0
    pred = capacity.predict(model, d.with_(available_kv_bytes=kv, max_model_len=max_model_len))
    if pred.fits:
        return max_model_len
    return pred.estimated_max_model_len or 0


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
    engine: str
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
    failure: Mapping[str, Any] | None
    notes: tuple[str, ...] = field(default=())

    def to_json_dict(self) -> dict[str, Any]:
        """The ``kvwatch explain --json`` object for this instance (bytes as integers)."""
        attribution = None
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
            "startup_failure": dict(self.failure) if self.failure is not None else None,
            "assumptions": list(self.prediction.assumptions) if self.prediction is not None else [],
            "notes": list(self.notes),
        }


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 4)


def _budget_json(b: Budget) -> dict[str, Any]:
    return {
        "fraction": b.fraction,
        "fraction_source": b.fraction_source,
        "terms": {
            name: {"bytes": t.bytes, "source": t.source} for name, t in b.terms.items() if t.bytes is not None
        },
    }


# Deployment field -> the EngineSettings field a log would have printed it as.
_SETTING_OF: dict[str, str] = {
    "tp": "tensor_parallel_size",
    "pp": "pipeline_parallel_size",
    "engine_version": "version",
}


def explain(
    snap: InstanceSnapshot,
    model: ModelGeometry | None,
    gpu_memory_bytes: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    events: Iterable[Event] = (),
) -> Explanation:
    """Rebuild, predict, attribute and list the levers for one instance of a replayed log.

    ``overrides`` are Deployment fields from the command line; they fill what the log did not
    print and never replace what it did. ``events`` are the replayed events, for the per-rank spread.
    """
    settings, apriori = apriori_inputs(snap)
    # Flags fill what the log did not print (the log wins); the observed budget's engine defaults
    # depend on them too.
    extra = {
        k: v
        for k, v in (overrides or {}).items()
        if v is not None and settings.get(_SETTING_OF.get(k, k)) is None
    }
    given = {_SETTING_OF.get(k, k): v for k, v in extra.items()}
    observed = observed_budget(snap.engine, snap.memory, snap.pool, {**given, **settings}, gpu_memory_bytes)
    pool = snap.pool
    observed_tokens = _int(pool.get("tokens"))
    if observed_tokens is None and _int(pool.get("blocks")) is not None:
        block = _int(pool.get("block_size")) or _int(settings.get("block_size"))
        if block is None and snap.engine == "vllm":
            block = vllm_budget.DEFAULT_BLOCK_SIZE
        observed_tokens = pool["blocks"] * block if block else None
    notes: list[str] = []
    prediction = predicted = None
    predicted_tokens = budget_tokens = None
    attribution = None
    lever_list: list[Lever] = []
    max_model_len = _int(extra.get("max_model_len")) or _int(settings.get("max_model_len"))
    if model is None:
        notes.append(
            "no model config: give --model-config for the prediction, the attribution and the levers"
        )
    else:
        try:
            a_priori = capacity.deployment_from_settings(
                snap.engine, settings, apriori, gpu_memory_bytes, **extra
            )
            if a_priori.gpu_memory_bytes is None:
                notes.append(
                    "the log does not print the card's memory: give --gpu or --gpu-memory to predict"
                )
            else:
                prediction = capacity.predict(model, a_priori)
                predicted = predicted_budget(prediction)
                predicted_tokens = prediction.kv_pool_tokens
                max_model_len = prediction.max_model_len
                observed_terms = observed.as_bytes()
                if snap.engine == "vllm" and not _graphs_in_budget(settings.get("version")):
                    # Captured after the pool was sized: printed, but not part of this budget.
                    observed_terms["cuda_graphs"] = None
                attribution = attribute_gap(
                    snap.engine,
                    observed_terms,
                    predicted.as_bytes(),
                    observed.fraction,
                    predicted.fraction,
                )
            kv = observed.get("kv")
            if max_model_len is None:
                max_model_len = model.max_position_embeddings
            if kv is not None and kv > 0:
                budget_tokens = _pool(model, a_priori, kv)
            elif kv is not None:
                notes.append(
                    "the KV budget is not positive: nothing is left for the cache after the terms above"
                )
            if kv is not None and max_model_len:
                lever_list = levers(
                    model, a_priori, observed, observed_tokens or budget_tokens or 0, max_model_len
                )
        except KvwatchError as exc:
            notes.append(f"no prediction: {exc}")
    if observed_tokens is None and budget_tokens is not None:
        notes.append("the log prints no pool size: compare the engine_budget tokens instead")
    if attribution is not None and all(c.term == "unattributed" for c in attribution.contributions):
        notes.append("the log prints too few budget terms to attribute the gap to any of them")
    return Explanation(
        source=snap.source,
        instance=snap.instance,
        engine=snap.engine,
        engine_version=_str(settings.get("version")),
        model=model.name if model is not None else _str(settings.get("model")),
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


def _str(value: Any) -> str | None:
    return str(value) if value is not None else None
