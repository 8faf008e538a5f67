"""Leave-one-source-out: every fitted figure of the a-priori model judged on cases it was not fitted on.

For each source (one thread, one repository, one sweep) the vLLM coefficients are refitted without
it (accuracy_fit.fit), SGLang's band terms are refitted without it (accuracy_sglang.fold_terms), and
the envelope -- which values each axis covers, each vLLM term's band, the floor, the widening per
uncovered axis -- is refitted without it; its cases are then predicted with those and
checked against what their logs printed, band included. The in-sample figures use the fits on every
case (what kvwatch ships: calibration.FITTED and each engine's envelope table).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace

from bench import accuracy_fit, accuracy_sglang
from bench.accuracy_cases import Case, deployment, predictable
from kvwatch.analysis.predict import predict
from kvwatch.capacity.envelope import AXES, UNLISTED_CARD, Axis, Envelope, conditions
from kvwatch.capacity.model import ModelGeometry
from kvwatch.capacity.prediction import Prediction
from kvwatch.core.errors import KvwatchError
from kvwatch.core.units import GiB
from kvwatch.engines.sglang import calibration as sglang_calibration
from kvwatch.engines.sglang import envelope as sglang_envelope
from kvwatch.engines.sglang.predict import BAND, BandTerms, band_terms
from kvwatch.engines.vllm import calibration
from kvwatch.engines.vllm import envelope as vllm_envelope
from kvwatch.engines.vllm import memory as vllm_memory
from kvwatch.engines.vllm import predict as vllm_predict
from kvwatch.engines.vllm.calibration import Calibration

# The share of out-of-sample errors a band is sized to hold (term bands, the floor and the widenings
# alike): above the 80 % promised, since each is refitted without the source it judges.
QUANTILE = 0.85
# An axis with fewer uncovered cases than this takes the pooled widening of all uncovered cases.
MIN_AXIS_CASES = 3
# A value counts as calibrated when at least MIN_COVER checked cases have it (one pasted startup on
# a card is a data point, not a calibration) and they come from at least MIN_SOURCES independent
# sources. Why three sources: with two, holding out the source that holds most of a value's cases
# leaves it "calibrated" on the others' one or two startups. vLLM 0.19 is the case in point: 39 of
# its 42 cases are llm-d-planner's, and with that source held out myoceane's and local-ai's three
# startups still covered it, so its TP >= 2 rows lost their widening and missed by 2.3-3.1 % against
# bands of +/-0.4-2.2 % -- and, read as inside the envelope, they drove the (since removed) scale on
# the term bands to 26.7 (in-sample bands of +/-4 % around errors of 0.05 %). With three, a value rests on two
# other sources in every fold of its own cases.
MIN_COVER = 3
MIN_SOURCES = 3
# The terms each engine's envelope sizes a band for. SGLang's band terms are its own BandTerms
# (engines/sglang/predict.py BAND, fitted by bench/accuracy_sglang.py and refitted per held-out
# source below); its envelope holds the coverage and the widening only.
TERMS = {"vllm": ("weights", "activation", "non_torch", "cuda_graphs"), "sglang": ()}
CURRENT = {"vllm": vllm_envelope.CURRENT, "sglang": sglang_envelope.CURRENT}
NEWEST = {"vllm": vllm_envelope.NEWEST_READ, "sglang": sglang_envelope.NEWEST_READ}


def checked(case: Case) -> bool:
    """Whether a case checks the model: it started, logged the KV figure, and kvwatch predicts it."""
    return case.started and bool(case.observed.get(kv_key(case))) and predictable(case)


@dataclass
class Row:
    """One case's prediction against its log."""

    case: Case
    prediction: Prediction | None
    refused: str | None = None  # the UnmodelledError / config error kvwatch gave instead
    predicted: dict[str, float] = field(default_factory=dict)  # GiB per term; 'kv' GiB; 'kv_tokens'
    band_ratio: float | None = None  # the printed band / predicted available KV
    uncovered: tuple[tuple[Axis, str], ...] = ()
    consistent: bool = True
    implied_utilisation: float | None = None
    # Terms whose class no other source measures (the refit had to fall back): their error is the
    # class's absence, which the widening covers, not the term's scatter.
    unmeasured: frozenset[str] = frozenset()

    @property
    def kv_error(self) -> float | None:
        """(predicted - observed) / observed of the KV figure the log printed (vLLM: available KV
        bytes; SGLang: pool tokens)."""
        o = self.case.observed
        key = kv_key(self.case)
        if key not in o or key not in self.predicted or not o[key]:
            return None
        return (self.predicted[key] - o[key]) / abs(o[key])

    def term_error(self, term: str) -> float | None:
        obs, pred = self.case.observed.get(term), self.predicted.get(term)
        if obs is None or pred is None or obs == 0:
            return None
        return (pred - obs) / abs(obs)

    @property
    def inside_band(self) -> bool | None:
        err = self.kv_error
        if err is None or self.band_ratio is None:
            return None
        return abs(err) * _observed_kv_scale(self.case, self) <= self.band_ratio

    @property
    def predicted_fail(self) -> bool:
        return self.prediction is not None and self.prediction.failure is not None

    @property
    def usable_bytes(self) -> int:
        p = self.prediction
        return (p.usable_bytes or 0) if p is not None else 0


def kv_key(case: Case) -> str:
    """The KV figure a case is judged on: vLLM's available KV bytes where the log printed them,
    else the pool's tokens (SGLang always)."""
    return "kv" if case.engine == "vllm" and "kv" in case.observed else "kv_tokens"


def _observed_kv_scale(case: Case, row: Row) -> float:
    """observed / predicted of the KV figure: the error is relative to the observed figure, the band
    to the predicted one."""
    key = kv_key(case)
    pred = row.predicted.get(key)
    return case.observed[key] / pred if pred else 1.0


class Models:
    """Each case's geometry, read once."""

    def __init__(self) -> None:
        self._cache: dict[str, ModelGeometry] = {}

    def __call__(self, case: Case) -> ModelGeometry:
        if case.id not in self._cache:
            self._cache[case.id] = case.geometry()
        return self._cache[case.id]


def evaluate(case: Case, models: Callable[[Case], ModelGeometry]) -> Row:
    """Predict one case with the calibration and envelope in use now."""
    try:
        d = deployment(case)
        p = predict(models(case), d)
    except KvwatchError as exc:
        return Row(case, None, refused=str(exc))
    g = GiB
    predicted = {
        "weights": (p.weights_bytes or 0) / g,
        "activation": (p.activation_bytes or 0) / g,
        "non_torch": (p.non_torch_bytes or 0) / g,
        "cuda_graphs": (p.cuda_graph_bytes or 0) / g,
        "kv": p.available_kv_bytes / g,
        "kv_tokens": float(p.kv_pool_tokens),
    }
    if case.kv_tokens_from_v0_error and p.kv_pool_blocks is not None and vllm_memory.runs_v0(d):
        # Like with like: the figure V0's error prints, not the whole pool (PP divides it from 0.8).
        predicted["kv_tokens"] = float(vllm_predict.v0_check_tokens(d, p.kv_pool_blocks, p.block_size))
    band = p.available_kv_band_bytes
    row = Row(
        case,
        p,
        predicted=predicted,
        band_ratio=band / p.available_kv_bytes if band and p.available_kv_bytes > 0 else None,
    )
    o = case.observed
    if case.engine == "vllm" and case.started and p.total_bytes and p.gpu_memory_utilization:
        if all(k in o for k in ("weights", "activation", "non_torch", "kv")):
            used = o["weights"] + o["activation"] + o["non_torch"] + o["kv"]
            if p.cuda_graphs_subtracted:
                used += o.get("cuda_graphs", predicted["cuda_graphs"])
            row.implied_utilisation = used * GiB / p.total_bytes
            row.consistent = abs(row.implied_utilisation - p.gpu_memory_utilization) < 0.005
    return row


def _quantile(values: Sequence[float], q: float = QUANTILE) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[k]


def _err_bytes(row: Row) -> float:
    err = row.kv_error
    p = row.prediction
    if err is None or p is None:
        return 0.0
    return abs(err) * p.available_kv_bytes * _observed_kv_scale(row.case, row)


def fit_envelope(
    engine: str,
    rows: Sequence[Row],
    base: dict[str, float],
    covered_by: Iterable[Case],
    models: Callable[[Case], ModelGeometry],
) -> Envelope:
    """The envelope these rows (predicted out of sample) give; ``base`` is each row's band before
    widening (bytes), ``covered_by`` the cases whose conditions count as calibrated."""
    by_value: dict[tuple[Axis, str], list[Case]] = {}
    for c in covered_by:
        if c.engine == engine and checked(c):
            for axis, value in conditions(models(c), deployment(c), NEWEST[engine]).items():
                by_value.setdefault((axis, value), []).append(c)
    covered: dict[Axis, set[str]] = {axis: set() for axis in AXES}
    for (axis, value), group in by_value.items():
        if value == UNLISTED_CARD:
            continue  # many different cards under one name: never a calibrated condition
        if len(group) >= MIN_COVER and len({c.source for c in group}) >= MIN_SOURCES:
            covered[axis].add(value)
    terms: dict[str, float] = {}
    # Each term's band from the cases inside the others' envelope (the rest size the widenings).
    inside_rows = [r for r in rows if not r.uncovered]
    for term in TERMS[engine]:

        def errors(pool: Sequence[Row], term: str = term) -> list[float]:
            return [
                abs(e) * r.case.observed[term] / r.predicted[term]
                for r in pool
                if term not in r.unmeasured
                and (e := r.term_error(term)) is not None
                and r.predicted.get(term)
            ]

        errs = errors(inside_rows)
        terms[term] = round(_quantile(errs if len(errs) >= MIN_AXIS_CASES else errors(rows)), 4)
    # No scale on the terms' sum: where the cases inside the envelope miss by more than their term
    # bands, the floor (the 85 % quantile of those very cases' error, _floor) already covers them.
    # A scale fitted as the quantile of error / band blew up on small bands (12.4x on the 90
    # startups of 2026-12-02: Qwen3-32B on an H100 printed 7.89 GiB +- 22.88 GiB).
    floor = _floor(rows)
    residual: dict[Axis, list[float]] = {axis: [] for axis in AXES}
    pooled: list[float] = []
    for r in rows:
        if r.kv_error is None or not r.usable_bytes or not r.uncovered:
            continue
        b = max(base.get(r.case.id, 0.0), floor * r.usable_bytes)
        extra = math.sqrt(max(0.0, _err_bytes(r) ** 2 - b**2)) / r.usable_bytes
        pooled.append(extra)
        for axis, _ in r.uncovered:
            residual[axis].append(extra)
    widening = {
        axis: round(_quantile(residual[axis] if len(residual[axis]) >= MIN_AXIS_CASES else pooled), 4)
        for axis in AXES
    }
    return Envelope(
        newest_read=NEWEST[engine],
        covered={axis: frozenset(v) for axis, v in covered.items()},
        term_bands=terms,
        widening=widening,
        cases={},
        floor=floor,
    )


def floor_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows whose error sizes the floor: those inside the others' envelope, or, with fewer than
    MIN_AXIS_CASES of them, those one condition outside it (the nearest calibrated cell)."""
    judged = [r for r in rows if r.kv_error is not None and r.usable_bytes]
    inside = [r for r in judged if not r.uncovered]
    return inside if len(inside) >= MIN_AXIS_CASES else [r for r in judged if len(r.uncovered) == 1]


def _floor(rows: Sequence[Row]) -> float:
    """The narrowest band the envelope prints, as a fraction of the usable memory: the QUANTILE of
    the out-of-sample |error| of floor_rows (fewer than MIN_AXIS_CASES: no floor).

    The term bands are each term's own scatter; what they miss is a coefficient that, without the
    source it judges, rests on another source's few cases (vLLM 0.18+'s TP >= 2 non-torch without
    llm-d-planner is off by 74 %, 1.5 GiB, on a 0.08 % non-torch band). The floor is the KV figure's
    own out-of-sample error in the cell nearest the calibrated one, so a band is never narrower
    than what the model has been seen to miss by there; it is a floor (max), not a term added in
    quadrature, because those rows' errors already include every term's.
    """
    chosen = floor_rows(rows)
    errs = [_err_bytes(r) / r.usable_bytes for r in chosen]
    return round(_quantile(errs), 4) if len(errs) >= MIN_AXIS_CASES else 0.0


def _no_widening(env: Envelope) -> Envelope:
    """The envelope's term bands alone: no widening, no floor (each row's base band)."""
    return replace(env, widening=dict.fromkeys(AXES, 0.0), floor=0.0)


def _sglang_band(case: Case, folds: Mapping[str, BandTerms]) -> AbstractContextManager[None]:
    """SGLang's band terms fitted without the case's source (bench/accuracy_sglang.py; a source it
    does not score takes the terms fitted on every scored case, which predict.py ships)."""
    if case.engine != "sglang":
        return nullcontext()
    return band_terms(folds.get(case.source, BAND))


@dataclass
class Report:
    """Rows in sample and out of sample, and the fits."""

    in_sample: list[Row]
    loso: list[Row]
    calibration: Calibration
    envelopes: dict[str, Envelope]
    sources: dict[str, list[str]]


def run(cases: Sequence[Case]) -> Report:
    """Both evaluations over every case."""
    models = Models()
    usable = [c for c in cases if predictable(c)]
    fitted_all = accuracy_fit.fit(usable, models)
    folds = accuracy_sglang.fold_terms(accuracy_sglang.load_cases()[0])
    by_source: dict[str, list[Case]] = {}
    for c in cases:
        by_source.setdefault(c.source, []).append(c)
    has_terms = {
        s
        for s, cs in by_source.items()
        if any(c.engine == "vllm" and set(c.observed) - {"kv"} for c in cs if predictable(c))
    }
    # The context before weights needs no model config: every case that prints it counts.
    sglang_all = accuracy_fit.fit_sglang(cases)[0]
    # Pass 1: each source predicted with the coefficients fitted without it (bands not yet).
    cals: dict[str, Calibration] = {}
    sglang_cals: dict[str, sglang_calibration.Calibration] = {}
    loso: dict[str, Row] = {}
    for source, group in by_source.items():
        rest = [c for c in usable if c.source != source]
        cals[source] = accuracy_fit.fit(rest, models) if source in has_terms else fitted_all
        sglang_cals[source] = accuracy_fit.fit_sglang([c for c in cases if c.source != source])[0]
        with calibration.using(cals[source]), sglang_calibration.using(sglang_cals[source]):
            for c in group:
                if c.skip is None:
                    with _sglang_band(c, folds):
                        loso[c.id] = evaluate(c, models)
    # Which rows' non-torch class no other source measures.
    for source in by_source:
        classes = {
            accuracy_fit.non_torch_class(c)
            for c in usable
            if c.source != source and c.engine == "vllm" and "non_torch" in c.observed
        }
        for c in by_source[source]:
            row = loso.get(c.id)
            if row is not None and c.engine == "vllm" and accuracy_fit.non_torch_class(c) not in classes:
                row.unmeasured = frozenset({"non_torch"})
    # Each row's uncovered axes, against the cases of the other sources.
    for source, group in by_source.items():
        for engine in ("vllm", "sglang"):
            env = fit_envelope(engine, [], {}, [c for c in usable if c.source != source], models)
            for c in group:
                row = loso.get(c.id)
                if row is not None and row.prediction is not None and c.engine == engine:
                    row.uncovered = tuple(env.uncovered(conditions(models(c), deployment(c), NEWEST[engine])))
    # Base bands with term bands fitted on all rows (no widening), then the envelope without each source.
    rows = list(loso.values())
    base: dict[str, float] = {}
    term_envs = {
        e: _no_widening(fit_envelope(e, [r for r in rows if r.case.engine == e], {}, usable, models))
        for e in CURRENT
    }
    for r in rows:
        if r.prediction is None:
            continue
        with (
            CURRENT[r.case.engine].using(term_envs[r.case.engine]),
            calibration.using(cals[r.case.source]),
            _sglang_band(r.case, folds),
            sglang_calibration.using(sglang_cals[r.case.source]),
        ):
            again = evaluate(r.case, models)
        if again.prediction is not None and again.prediction.available_kv_band_bytes is not None:
            base[r.case.id] = float(again.prediction.available_kv_band_bytes)
    out: list[Row] = []
    for source, group in by_source.items():
        others = [r for r in rows if r.case.source != source]
        for c in group:
            row = loso.get(c.id)
            if row is None or row.prediction is None:
                if row is not None:
                    out.append(row)
                continue
            env = fit_envelope(
                c.engine,
                [r for r in others if r.case.engine == c.engine],
                base,
                [x for x in usable if x.source != source],
                models,
            )
            with (
                CURRENT[c.engine].using(env),
                calibration.using(cals[source]),
                sglang_calibration.using(sglang_cals[source]),
                _sglang_band(c, folds),
            ):
                banded = evaluate(c, models)
            banded.uncovered, banded.unmeasured = row.uncovered, row.unmeasured
            out.append(banded)
    envelopes = {
        e: fit_envelope(e, [r for r in rows if r.case.engine == e], base, usable, models) for e in CURRENT
    }
    in_sample = []
    for c in cases:
        if c.skip is not None:
            continue
        with (
            calibration.using(fitted_all),
            sglang_calibration.using(sglang_all),
            CURRENT[c.engine].using(envelopes[c.engine]),
        ):
            row = evaluate(c, models)
        if row.prediction is not None:
            row.uncovered = tuple(
                envelopes[c.engine].uncovered(conditions(models(c), deployment(c), NEWEST[c.engine]))
            )
        in_sample.append(row)
    sources = {s: [c.id for c in cs] for s, cs in by_source.items()}
    return Report(in_sample, out, fitted_all, envelopes, sources)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
