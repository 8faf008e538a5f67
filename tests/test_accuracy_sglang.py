"""The a-priori SGLang model on real SGLang startups (tests/apriori/public/sglang): held where it is.

The thresholds are the figures bench/accuracy_sglang.py measures today (leave-one-source-out, which
refits SGLang's band terms without the held-out source); a regression in any SGLang rule -- the
default static fraction, the cell size, the DP-attention split, the SWA and Mamba divisions -- moves
them and fails here. Every case outside its printed band, and every failed start predicted to
start, is listed below with the reason; a fix that brings one inside must take it off the list.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import accuracy_sglang as acc
from kvwatch.engines.sglang.predict import BAND

CASES = Path(__file__).parent / "apriori" / "public" / "sglang" / "cases.json"
SCORED, EXCLUDED = acc.load_cases()
IN_SAMPLE, FITTED = acc.in_sample(SCORED)
LOSO = acc.leave_one_source_out(SCORED)

# Measured 2026-12-02 after the refit on the issue-20 data plus the sglang-data cases (Qwen3-235B and
# Llama-4-Scout scored, nine docs-CI startups; leave-one-source-out refits the band terms without the
# held-out source; the envelope's widening per uncovered condition is the shipped one, fitted by
# bench/bench_accuracy.py), with sglang-fails' weights rules (MLA w_kc / w_vc copies, replicated routers,
# the DSA indexer): median 0.93 %, mean 3.60 %, 16 of 22 within 5 %, 20 of 22 inside the printed band;
# pool bytes median 2.19 % over 18; weights median 1.42 % over 8 cases.
# The sglang-repos folder (committed logs) then added a DeepSeek-V3.2 B200 failed start (predicted to
# fail, weights -0.61 %), a Qwen2.5-3B A100 startup (-2.06 %), a Llama-3-8B MI300X 0.3.x bench_latency
# pool (-0.09 %) and an R1-Distill-Qwen-7B RTX 3090 WSL2 startup (+10.55 %: the Windows desktop shares
# the card): median 1.21 %, mean 3.67 %, 18 of 25 within 5 %, 23 of 25 inside the printed band; pool
# bytes median 2.34 % over 20; weights median 1.42 % over 10 (new data, not a model change). Its
# Qwen3-VL-30B-A3B B200 startup (-1.00 % weights, +0.18 % tokens) moved the fitted context before
# weights from 0.5 from 1.95 to 1.40 GiB (the median of six): median 1.35 %, mean 3.64 %, 20 of 26
# within 5 %, 23 of 26 inside the band; pool median 1.52 % over 21, weights median 1.02 % over 11.
# Its Qwen3-VL-32B H100 failed start (predicted to fail, weights -0.79 %) took that context to
# 0.85 GiB (the median of seven, in two groups): median 1.49 %, mean 3.95 %, 19 of 26 within 5 %,
# 23 of 26 inside the band, failed starts 3 of 4; pool median 2.93 %, weights median 1.02 % over 12.
# Its Qwen3-VL-30B-A3B A100 startup (+5.61 %: a 30,553-token pool, 2.8 GiB beside 58 GiB of weights)
# and the eighth context figure (0.77 GiB): median 1.55 %, mean 4.07 %, 18 of 27 within 5 %, 24 of 27
# inside the band; pool median 3.79 % over 22, weights median 1.01 % over 13.
# Then sglang-misses (the memory
# before weights by communication class, not release; the fp32 rotary cache in the weights): mean
# 3.13 %, 17 of 22 within 5 %, pool median 1.78 %, weights median 1.17 %; the median rose to 1.61 %
# (sglang#10407's +0.08 % had cancelled a 1.95 GiB TP 1 context against TP 4's; now -1.56 %).
# Merged with the sglang-repos cases, over 27: median 0.99 %, mean 2.91 %, 21 of 27 within 5 %, 25 of
# 27 inside the band, pool median 1.98 % over 22, weights median 0.78 % over 13, failed starts 3 of 4.
# sglang-data then counted a Qwen2.5-VL / Qwen3-VL tower's patch mergers, patch and position tables
# in its weights (Qwen3-VL-30B-A3B A100 +8.37 -> +0.06 %, B200 +0.88 -> +0.60 %) and added five
# committed startups (three Qwen3-VL-2B on an RTX 5060 Ti, +1.93 to +3.69 %; Qwen3-VL-32B fp8 KV on
# H100, +1.83 %; Qwen3-14B TP 4 on 4 x RTX 4090, +1.32 %), all inside their bands: over 32, median
# 1.24 % (the new cases' errors sit above the old median), mean 2.58 %, 27 of 32 within 5 %, 30 of 32
# inside the band, pool median 1.87 % over 27, weights median 0.79 % over 18, failed starts 3 of 4.
# sglang-newest (2026-12-02: llm-d's Qwen3-32B on H100 at 0.5.19, OTel's Qwen3-0.6B / reranker on
# H100 and MI355X at 0.5.17-0.5.18) added four scored startups; the MI355X pools came out +17.8 %
# until the aiter backend's x 0.85 above 8192 context (0.5.5+, ROCm; budget.aiter_factor) was
# modelled, then -0.02 %. Over 36: median 1.07 %, mean 2.38 %, 31 of 36 within 5 %, 34 of 36
# inside the band, pool median 1.84 %; weights median 0.79 -> 1.36 % over 23 (the MI355X weights
# come in 7 % under the logged ones -- not explained, left).
MEDIAN_PCT = 1.1
MEAN_PCT = 2.4
WITHIN_5_PCT = 86.0
INSIDE_BAND_PCT = 94.0
# The pool bytes are printed by most of the 36 (the 0.3 / 0.4.0 docs-CI logs print no KV line).
POOL_MEDIAN_PCT = 1.9
WEIGHTS_MEDIAN_PCT = 1.4

# Cases whose token count falls outside the band their prediction prints, and why. The nine docs-CI
# startups (clean 80 GB cards, free memory before weights within 0.3 % of kvwatch's estimate) took
# the pre-load band term from 0.035 to 0.015, and these two no longer fit inside it (the README of
# tests/apriori/public/sglang gives each reason):
KNOWN_OUTSIDE: dict[str, str] = {
    "sgl-12419-qwen3next-rocm-tp4-mamba": (
        "mem_fraction_static is not in the excerpt; the printed figures imply 0.778 against the 0.865 "
        "default -- most likely the user's own setting"
    ),
    "sgl-pr39713-qwen3-0.6b-h100-mfs083-prefill-graph-oom": (
        "a dev build of 2026-09-16 (scored as 0.5.20) sized the pool from 4.7 GiB less than kvwatch: "
        "1.95 GiB in use before the weights (0.51 fitted) and 3.52 GiB between the weights and the profile "
        "(the printed pool and 'Memory pool end'); no 0.5.19-0.5.23 code allocates either for a dense "
        "Qwen3 at defaults, and the arithmetic itself is SGLang's (tests/test_sglang_budget.py)"
    ),
}
# Failed starts (for want of memory) predicted to start, and why.
KNOWN_FAILED_MISSES = {
    "sgl-7691-dsr1-rocm-tp8-dp8-dpattn-mfs095-negative-profile": (
        "the profile printed -561981 tokens, yet the excerpt's own figures give a positive budget "
        "(21.73 - 188.32 x 0.05 GiB), and its 166.59 GiB of weights are twice the FP8 checkpoint's; "
        "0.4.8.post1's EPMoE holding its experts twice under SGLANG_USE_AITER (ep_moe/layer.py:238-249, "
        ":1055-1063) and aiter's x 0.85 (model_runner.py:436-438) would explain both, but kvwatch is "
        "given neither --attention-backend nor the environment"
    ),
}


def test_cases_are_scored_or_excluded_with_a_reason() -> None:
    raw = [c for p in acc.case_files() for c in json.loads(p.read_text(encoding="utf-8"))]
    assert CASES in acc.case_files()
    assert len(raw) == len(SCORED) + len(EXCLUDED) == 63
    assert all(why for _, why in EXCLUDED)
    assert len(SCORED) >= 31
    assert len({c.source for c in SCORED}) >= 18


def test_every_scored_case_is_predicted() -> None:
    assert [r.case.id for r in IN_SAMPLE if r.prediction is None] == []


def test_shipped_band_terms_are_the_fitted_ones() -> None:
    assert FITTED == BAND


def test_leave_one_source_out_holds_the_measured_figures() -> None:
    s = acc.summary(LOSO)
    assert s["tokens_n"] == 36
    assert s["tokens_median"] <= MEDIAN_PCT
    assert s["tokens_mean"] <= MEAN_PCT
    assert s["tokens_within5"] >= WITHIN_5_PCT
    assert s["inside_band"] >= INSIDE_BAND_PCT
    assert s["weights_median"] <= WEIGHTS_MEDIAN_PCT
    # The printed pool bytes follow the tokens (the buffers' own bytes per token).
    assert s["pool_median"] <= POOL_MEDIAN_PCT


@pytest.mark.parametrize("row", [r for r in LOSO if r.tokens_pct is not None], ids=lambda r: r.case.id)
def test_case_inside_its_printed_band(row: acc.Row) -> None:
    assert row.band_pct is not None and row.band_pct > 0
    if row.case.id in KNOWN_OUTSIDE:
        assert not row.inside_band, (
            f"now inside its band: take it off KNOWN_OUTSIDE ({row.tokens_pct:+.2f} %)"
        )
    else:
        assert row.inside_band, (row.tokens_pct, row.band_pct)


def test_failed_starts_are_predicted_to_fail() -> None:
    failed = [r for r in LOSO if r.case.outcome == "failed_sizing"]
    assert failed
    for r in failed:
        assert r.predicted_fail != (r.case.id in KNOWN_FAILED_MISSES), r.case.id


def test_started_cases_are_predicted_to_start() -> None:
    assert acc.summary(LOSO)["started_predicted_fail"] == 0
