"""The a-priori SGLang model against real SGLang startups (tests/apriori/public/sglang), per class.

Each scored case is predicted through ``kvwatch predict``'s own path -- its argument parser,
``read_request`` (the engine's flags after ``--`` included) and ``analysis.predict.predict`` --
from what the user set (model config, card, release, tp/dp, the flags on their command line; never
a figure the log printed), and compared with what SGLang printed: the KV pool's tokens
(``#tokens`` / ``max_total_num_tokens``; the full-attention pool of hybrid SWA models), the pool's
bytes (K + V size), the weights ('Load weight end. mem usage'), and whether the start fails for want
of memory. Cases the README lists as excluded are counted, never scored.

The report gives, per class (MLA, NSA indexer, GQA/MHA, hybrid Mamba/GDN, SWA, DP attention,
speculative, multimodal, FP8, card family, release range) and overall: the median and mean
|error| of the token count, the share within 5 %, the share inside the band the prediction prints,
and the failed starts predicted to fail;
the leave-one-source-out figures hold each source (an issue, PR or repository) out in turn: the
band terms (engines/sglang/predict.py BAND) are refitted without it; in-sample uses the terms fitted
on every case, which predict.py ships. The widening per uncovered condition on top of the band is
the shipped envelope's (engines/sglang/envelope.py), which ``python -m bench accuracy`` fits on
these cases among the others and refits per held-out source in its own report.

The cases are tests/apriori/public/sglang, which the general report (bench/accuracy_cases.py) reads
too; this report predicts each from its ``scoring`` block, the general one from its log fields.

Run: ``python -m bench accuracy-sglang`` (part of ``make accuracy``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.accuracy_cases import CONFIG_DIRS, PUBLIC, public_case_files, source_of
from kvwatch.analysis.predict import predict
from kvwatch.capacity.geometry import load_model
from kvwatch.capacity.prediction import Prediction
from kvwatch.commands import predict as predict_command
from kvwatch.core.errors import KvwatchError
from kvwatch.core.units import GiB
from kvwatch.core.versions import version_tuple
from kvwatch.engines.sglang.predict import BAND, BandTerms, band_terms

# The SGLang cases the general report (bench/accuracy_cases.py) reads too, and its config folders:
# tests/apriori/public/sglang and every other public folder whose cases carry a `scoring` block
# (sglang-repos: startups from committed files).
CASES = PUBLIC / "sglang" / "cases.json"


def case_files() -> list[Path]:
    """The public cases.json files of SGLang startups (each case with a `scoring` block)."""
    return [
        p
        for p in public_case_files()
        if p == CASES or any("scoring" in c for c in json.loads(p.read_text(encoding="utf-8")))
    ]


WITHIN_PCT = 5.0
# The band is sized so that this share of each term's errors falls inside it.
BAND_QUANTILE = 0.8


@dataclass(frozen=True)
class Case:
    """One scored startup: the command line a user would give, and what SGLang printed."""

    id: str
    source: str
    argv: tuple[str, ...]
    engine_flags: tuple[str, ...]
    config: Path
    engine_version: str
    card: str
    tp: int
    dp: int
    dp_attention: bool
    classes: tuple[str, ...]
    outcome: str
    observed_tokens: int | None
    observed_pool_gib: float | None
    observed_weights_gib: float | None
    # Free memory before weights ('Load weight begin' avail, else 'Load weight end' avail + mem
    # usage) and a default mem_fraction_static the log printed: the band terms are fitted on these.
    observed_pre_load_gib: float | None
    observed_default_fraction: float | None
    note: str


def _config(name: str) -> Path:
    for folder in CONFIG_DIRS:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(name)


def _observed_tokens(o: dict[str, Any]) -> int | None:
    for key in ("swa_full_layer_tokens", "kv_tokens", "max_total_num_tokens"):
        if isinstance(o.get(key), int):
            return int(o[key])
    return None


def _observed_pool(o: dict[str, Any]) -> float | None:
    if "swa_pool_k_size_gib" in o:
        return float(
            o["swa_pool_k_size_gib"]
            + o["swa_pool_v_size_gib"]
            + o["full_pool_k_size_gib"]
            + o["full_pool_v_size_gib"]
        )
    if "kv_size_gib" in o:
        return float(o["kv_size_gib"])
    if "k_size_gib" in o:
        return float(o["k_size_gib"] + o["v_size_gib"])
    return None


def _first_number(o: dict[str, Any], *keys: str) -> float | None:
    for key in keys:
        value = o.get(key)
        if isinstance(value, int | float):
            return float(value)
    return None


def _observed_pre_load(o: dict[str, Any]) -> float | None:
    begin = _first_number(o, "load_weight_begin_avail_gib_min", "load_weight_begin_avail_gib")
    if begin is not None:
        return begin
    end = _first_number(o, "load_weight_end_avail_gib_min", "load_weight_end_avail_gib")
    weights = _first_number(o, "weight_mem_usage_gib")
    return end + weights if end is not None and weights is not None else None


def _observed_default_fraction(raw: dict[str, Any]) -> float | None:
    """A default mem_fraction_static the case's log printed (server_args dump or a debug print)."""
    st = raw["settings"]
    source = str(st.get("mem_fraction_static_source", ""))
    value = st.get("mem_fraction_static")
    if (
        isinstance(value, float)
        and "engine default" in source
        and raw["scoring"].get("mem_fraction_static") is None
    ):
        return value
    return None


def _classes(raw: dict[str, Any], s: dict[str, Any]) -> tuple[str, ...]:
    """The classes the report groups by, from the case's own tags and the scoring block."""
    tags = " ".join(raw.get("classes", [])).lower()
    out = []
    if "nsa" in tags or "dsa" in tags:
        out.append("NSA indexer")
    elif "mla" in tags:
        out.append("MLA")
    if "mamba" in tags or "gdn" in tags:
        out.append("hybrid Mamba/GDN")
    elif "swa" in tags:
        out.append("SWA")
    elif not out:
        out.append("GQA/MHA")
    if s.get("dp_attention"):
        out.append("DP attention")
    if "spec" in tags:
        out.append("speculative")
    if "multimodal" in tags:
        out.append("multimodal")
    if "fp8" in tags:
        out.append("FP8")
    if s.get("gpu"):
        card = re.sub(r"-(?:SXM|PCIe|NVL)\b.*|-\d+GB.*", "", s["gpu"])
    else:
        card = str(raw.get("card_class") or "unknown").split(" ")[0]
    out.append(f"card {card}")
    v = version_tuple(s["engine_version"])
    if v is not None:
        out.append(
            "release "
            + (
                "<0.4.9"
                if v < (0, 4, 9)
                else "0.4.9-0.5.2"
                if v < (0, 5, 3)
                else "0.5.3-0.5.9"
                if v < (0, 5, 10)
                else ">=0.5.10"
            )
        )
    return tuple(out)


def load_cases(paths: list[Path] | None = None) -> tuple[list[Case], list[tuple[str, str]]]:
    """(scored cases, [(id, why excluded)]) of the given case files (default: every SGLang one)."""
    scored: list[Case] = []
    excluded: list[tuple[str, str]] = []
    records = [
        r for p in (case_files() if paths is None else paths) for r in json.loads(p.read_text("utf-8"))
    ]
    for raw in records:
        s = raw["scoring"]
        if s.get("excluded"):
            excluded.append((raw["id"], s["excluded"]))
            continue
        argv = ["--engine", "sglang", "--engine-version", s["engine_version"], "--tp", str(s["tp"])]
        argv += ["--gpu", s["gpu"]] if s.get("gpu") else ["--gpu-memory", s["gpu_memory"]]
        if s.get("mem_fraction_static") is not None:
            argv += ["--mem-fraction-static", str(s["mem_fraction_static"])]
        if s.get("kv_cache_dtype"):
            argv += ["--kv-cache-dtype", s["kv_cache_dtype"]]
        flags = list(s.get("flags", []))
        if s.get("dp", 1) > 1:
            flags += ["--dp-size", str(s["dp"])]
        if s.get("dp_attention"):
            flags.append("--enable-dp-attention")
        o = raw["observed"]
        weights_only = bool(s.get("weights_only"))
        scored.append(
            Case(
                id=raw["id"],
                source=source_of(raw["source_url"]),
                argv=tuple(argv),
                engine_flags=tuple(flags),
                config=_config(s["config"]),
                engine_version=s["engine_version"],
                card=s.get("gpu") or s["gpu_memory"],
                tp=s["tp"],
                dp=s.get("dp", 1),
                dp_attention=bool(s.get("dp_attention")),
                classes=_classes(raw, s),
                outcome=s["outcome"],
                observed_tokens=None if weights_only else _observed_tokens(o),
                observed_pool_gib=None if weights_only else _observed_pool(o),
                observed_weights_gib=o.get("weight_mem_usage_gib"),
                observed_pre_load_gib=_observed_pre_load(o),
                observed_default_fraction=_observed_default_fraction(raw),
                note=s.get("outcome_note", ""),
            )
        )
    return scored, excluded


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvwatch predict")
    predict_command.add_arguments(parser)
    return parser


def predict_case(case: Case) -> Prediction:
    """``kvwatch predict CONFIG <argv> -- <engine flags>``, as the command computes it."""
    args = _parser().parse_args([str(case.config), *case.argv])
    args.engine_flags = list(case.engine_flags)
    request = predict_command.read_request(args)
    return predict(load_model(case.config), request.deployment, request.engine)


@dataclass
class Row:
    """One case's prediction against its log."""

    case: Case
    prediction: Prediction | None
    error: str = ""

    def _pct(self, pred: float | None, obs: float | None) -> float | None:
        if pred is None or obs is None or obs == 0:
            return None
        return 100.0 * (pred - obs) / obs

    @property
    def tokens_pct(self) -> float | None:
        p = self.prediction
        return self._pct(p.kv_pool_tokens if p else None, self.case.observed_tokens)

    @property
    def pool_pct(self) -> float | None:
        p = self.prediction
        return self._pct(
            p.kv_pool_bytes / GiB if p and p.kv_pool_bytes else None, self.case.observed_pool_gib
        )

    @property
    def weights_pct(self) -> float | None:
        p = self.prediction
        w = p.weights_bytes / GiB if p and p.weights_bytes else None
        return self._pct(w, self.case.observed_weights_gib)

    @property
    def band_pct(self) -> float | None:
        """The band the prediction prints, as a share of its KV budget (what the token count scales with)."""
        p = self.prediction
        return 100.0 * p.error_band_ratio if p is not None and p.error_band_ratio is not None else None

    @property
    def inside_band(self) -> bool:
        err, band = self.tokens_pct, self.band_pct
        return err is not None and band is not None and abs(err) <= band

    @property
    def predicted_fail(self) -> bool:
        p = self.prediction
        return p is None or p.failure is not None


def evaluate(case: Case, terms: BandTerms | None = None) -> Row:
    """The case predicted with the band terms given (default: the ones predict.py ships)."""
    try:
        if terms is None:
            return Row(case, predict_case(case))
        with band_terms(terms):
            return Row(case, predict_case(case))
    except KvwatchError as exc:
        return Row(case, None, str(exc))


def term_errors(rows: Iterable[Row]) -> dict[str, list[float]]:
    """Each band term's error over the rows that printed it: weights and the free memory before
    weights (relative), a default mem_fraction_static (absolute)."""
    out: dict[str, list[float]] = {"weights": [], "pre_load": [], "fraction": []}
    for r in rows:
        p, c = r.prediction, r.case
        if p is None:
            continue
        if c.observed_weights_gib and p.weights_bytes and p.inputs.get("weights") in ("estimated", "derived"):
            out["weights"].append(abs(p.weights_bytes / GiB / c.observed_weights_gib - 1))
        if c.observed_pre_load_gib and p.usable_bytes is not None and p.activation_bytes is not None:
            pre = (p.usable_bytes + p.activation_bytes) / GiB
            out["pre_load"].append(abs(pre / c.observed_pre_load_gib - 1))
        if c.observed_default_fraction is not None and p.mem_fraction_static is not None:
            out["fraction"].append(abs(p.mem_fraction_static - c.observed_default_fraction))
    return out


def _p80(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(BAND_QUANTILE * len(ordered)) - 1)]


def fit_band(rows: Iterable[Row]) -> BandTerms:
    """The band terms: the 80th percentile of each term's error over ``rows`` (rounded to 0.001)."""
    e = term_errors(rows)
    return BandTerms(**{k: round(_p80(v), 3) for k, v in e.items()})


def _stats(errors: list[float]) -> dict[str, float]:
    a = [abs(e) for e in errors]
    if not a:
        return {}
    return {
        "n": len(a),
        "median": statistics.median(a),
        "mean": statistics.mean(a),
        "within5": 100.0 * sum(e <= WITHIN_PCT for e in a) / len(a),
    }


def summary(rows: Iterable[Row]) -> dict[str, float]:
    """The headline figures of a set of rows (token count, pool bytes, weights, band, failed starts)."""
    rows = list(rows)
    out: dict[str, float] = {}
    for name, get in (
        ("tokens", lambda r: r.tokens_pct),
        ("pool", lambda r: r.pool_pct),
        ("weights", lambda r: r.weights_pct),
    ):
        getter: Callable[[Row], float | None] = get
        for k, v in _stats([e for r in rows if (e := getter(r)) is not None]).items():
            out[f"{name}_{k}"] = v
    with_tokens = [r for r in rows if r.tokens_pct is not None]
    if with_tokens:
        out["inside_band"] = 100.0 * sum(r.inside_band for r in with_tokens) / len(with_tokens)
    sizing = [r for r in rows if r.case.outcome == "failed_sizing"]
    out["failed_sizing"] = len(sizing)
    out["failed_sizing_predicted"] = sum(r.predicted_fail for r in sizing)
    started = [r for r in rows if r.case.outcome != "failed_sizing" and r.case.observed_tokens]
    out["started_predicted_fail"] = sum(r.predicted_fail for r in started)
    return out


def in_sample(cases: list[Case]) -> tuple[list[Row], BandTerms]:
    """Every case predicted with the band terms fitted on all of them."""
    terms = fit_band(evaluate(c) for c in cases)
    return [evaluate(c, terms) for c in cases], terms


def fold_terms(cases: list[Case]) -> dict[str, BandTerms]:
    """Per source, the band terms fitted on the other sources' cases (the general report's
    leave-one-source-out, bench/accuracy_loso.py, predicts SGLang with these too)."""
    base = {c.id: evaluate(c) for c in cases}
    return {
        source: fit_band(base[t.id] for t in cases if t.source != source)
        for source in {c.source for c in cases}
    }


def leave_one_source_out(cases: list[Case]) -> list[Row]:
    """Each case predicted with band terms refitted without its source's cases. The rest of the
    SGLang model (the engine's arithmetic, kvwatch's fixed estimates) has nothing fitted to them."""
    folds = fold_terms(cases)
    return [evaluate(c, folds[c.source]) for c in cases]


def _fmt(v: float | None, spec: str = "+7.2f") -> str:
    return format(v, spec) if v is not None else " " * 6 + "-"


def print_report(rows: list[Row], loso: list[Row], excluded: list[tuple[str, str]]) -> None:
    head = f"{'case':58s} {'release':11s} {'card':17s} tp dp | {'tokens':>9s} {'pool':>7s} {'weights':>7s} {'band':>6s} | outcome"
    print(head)
    print("-" * len(head))
    for r in rows:
        c = r.case
        outcome = c.outcome
        if c.outcome != "started":
            outcome += f" (predicted {'fail' if r.predicted_fail else 'start'})"
        band = f"{r.band_pct:6.2f}" if r.band_pct is not None else "     -"
        print(
            f"{c.id[:58]:58s} {c.engine_version:11s} {c.card[:17]:17s} {c.tp:2d} {c.dp:2d} | "
            f"{_fmt(r.tokens_pct, '+8.2f')}% {_fmt(r.pool_pct)} {_fmt(r.weights_pct)} {band} | {outcome}"
            + (f"  [{r.error}]" if r.error else "")
        )
    print()
    classes = sorted({k for r in rows for k in r.case.classes})
    print("per class; the token error is the same in and out of sample (only the band is refitted per fold)")
    print(
        f"{'class':24s} {'n':>3s} {'median':>7s} {'mean':>7s} {'<=5%':>6s} {'band':>6s} {'LOSO':>6s} | "
        "pool med | weights med"
    )
    for name, keep in [("overall", None)] + [(k, k) for k in classes]:
        group = [r for r in rows if keep is None or keep in r.case.classes]
        held = [r for r in loso if keep is None or keep in r.case.classes]
        s, lo = summary(group), summary(held)
        if "tokens_n" not in s and "weights_n" not in s:
            continue
        print(
            f"{name:24s} {int(s.get('tokens_n', 0)):3d} {_fmt(s.get('tokens_median'), '7.2f')} "
            f"{_fmt(s.get('tokens_mean'), '7.2f')} {_fmt(s.get('tokens_within5'), '6.1f')} "
            f"{_fmt(s.get('inside_band'), '6.1f')} {_fmt(lo.get('inside_band'), '6.1f')} | "
            f"{_fmt(s.get('pool_median'), '8.2f')} | "
            f"{_fmt(s.get('weights_median'), '7.2f')} ({int(s.get('weights_n', 0))})"
        )
    s, lo = summary(rows), summary(loso)
    print()
    for label, t in (("in-sample", s), ("leave-one-source-out", lo)):
        print(
            f"{label:21s} tokens: median {t.get('tokens_median', 0):.2f} %, mean {t.get('tokens_mean', 0):.2f} %, "
            f"{t.get('tokens_within5', 0):.0f} % within 5 %, {t.get('inside_band', 0):.0f} % inside the printed band "
            f"({int(t.get('tokens_n', 0))} cases); failed starts predicted to fail: "
            f"{int(t['failed_sizing_predicted'])} of {int(t['failed_sizing'])}"
        )
    print(
        "(the band terms are refitted per held-out source for leave-one-source-out; the widening per "
        "uncovered condition is the shipped envelope's; the rest of the SGLang model has no coefficient "
        "fitted to these cases)"
    )
    print(f"sources: {len({r.case.source for r in rows})}; excluded cases: {len(excluded)}")
    for case_id, why in excluded:
        print(f"  excluded {case_id}: {why}")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cases, excluded = load_cases()
    rows, terms = in_sample(cases)
    loso = leave_one_source_out(cases)
    print_report(rows, loso, excluded)
    print(f"band terms fitted on every case: {terms}; predict.py ships {BAND}")
    if "--fit" in args:
        print(f"BAND = {terms!r}")
    if terms != BAND:
        print(
            "the band terms predict.py ships are not the ones these cases give: python -m bench.bench_accuracy --write"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
