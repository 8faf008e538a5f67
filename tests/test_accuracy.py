"""The a-priori model on real startups (tests/apriori): within the error it claims, case by case.

A regression in any modelled term -- card totals, weights as loaded, the profile run's activation,
non-torch, the CUDA-graph rule, engine defaults -- moves some case out of its band and fails here.
The 50 full vLLM 0.19 logs are also parser material: kvwatch must read every figure the case
records from them, and the sidecar's own config-basis prediction (settings read from the log)
must land on the logged KV budget.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bench import accuracy_fit
from bench import bench_accuracy as acc
from bench.accuracy_cases import load_cases, load_config, predictable
from bench.accuracy_loso import Models, Report, Row, run
from kvwatch.analysis.predictor import Predictor
from kvwatch.core.units import GiB
from kvwatch.engines.sglang import calibration as sglang_calibration
from kvwatch.engines.sglang import envelope as sglang_envelope
from kvwatch.engines.vllm import calibration
from kvwatch.engines.vllm import envelope as vllm_envelope
from kvwatch.sources.pipeline import replay

APRIORI = Path(__file__).parent / "apriori"
CASES = load_cases()
REPORT_MODELS = Models()
CALIBRATION_SOURCES = ("llm-d-incubation/llm-d-planner", "llm-d/llm-d-benchmark", "release-sweep")
# What `make accuracy` measured when these cases were added (rounded the safe way): a regression in
# any modelled term, rule or fit moves one of them. Raised when the model improves, never lowered
# on the same cases. Re-measured 2026-12-02 when the set grew from 78 to 90 judged startups (the
# configs, startups and startups-2 data, the GB10/RX 9070 XT cards): the new cases are harder (V0
# 0.6.4 at 131K, an H100 0.10.2 MoE at +34 %), and the band floor, the out-of-sample error one
# condition away from the calibrated cells, doubled with them. The terms' scale is gone (the floor
# covers what the term bands miss): the LOSO median band went from 12.57 % to 7.78 % of the KV.
# Then: SGLang's weights rules took the LOSO mean from 5.93 % to 5.80 % (the model); vllm#32105's
# failed start predicted and the RTX 4080's started case judged (4 failed starts of 11 predicted); the
# sglang-data cases (20 SGLang judged, 104 in all) moved the median band from 7.78 % to 7.91 % (new data).
# Re-measured when the profile's sampler followed the release and the install (FlashInfer opt-in
# from 0.11.1; 'FlashInfer is not available' sorts before) and the fused-MoE scratch is freed with
# its layer before 0.14: LOSO median 0.61 -> 0.42 %, within 5 % 83 -> 84 %, and the floor with it;
# 85 % once LukeJYK's card was read from its own log (an A100-SXM4-80GB, not an unnamed card);
# V0's forward holds 3 hidden rows a token, not 2 (LOSO median 0.40 %, mean 5.09 %). All merged, over
# 104 startups: median 0.42 %, mean 4.35 %, within 5 % 86.5 %, band 97 % (median 7.43 %).
# Then vllm-data grew the set (measured on its own: from 90 to 104 judged startups, 14 new, 13 of
# them off H100 -- LAMBO's 4x RTX 3090 TP4 logs at -12 to -40 %, club-3090 #642 at -25 %, the T4
# Qwen3-VL embedding runs at -12/-15 %, club-3090 #46's DFlash drafter at -16 %): new, harder data, not
# a model change; the H100 in-sample figures did not move. The envelope widened with them (the RTX 3090
# and hybrid linear-attention cells are calibrated now): LOSO median band 7.79 % -> 11.30 %. Merged
# with the model changes above, over 118 startups: median 0.70 %, mean 5.54 %, within 5 % 80.5 %, band
# 89.8 % (median 11.30 %), failed starts 4 of 11. The four Mistral-Small 3.1/3.2 H100 startups judged
# once a nested 'mistral' text_config took MistralConfig's untied head (122 startups; the H100
# in-sample median 0.020 -> 0.026 % over 54 calibration cases: new data). SGLang's request table sized:
# Llama-4-Scout's failed start predicted (5 of 11).
# Then the model: from 0.18 a PCIe-only card's TP communication memory is baseline, so its non-torch
# increase is TP 1's (memory.fabric_non_torch; the LAMBO 4x RTX 3090 TP4 startups from -12..-40 % to
# -4..+0.2 %, club-3090 #46 from -16 to +3 %). LOSO median 0.70 -> 0.51 %, mean 5.54 -> 4.68 %, within
# 5 % 80.5 -> 82.2 %, band 89.8 -> 91.5 % (median 11.30 -> 8.95 %); the H100 in-sample figures did not
# move (median 0.020 %). Club-3090 #91/#294/#295 (MTP, judged in tokens) went from -2..-4 % to
# +14..+17 %: they had been right by cancellation, kvwatch does not model the MTP drafter.
# Then the CUDA-graph estimate: NCCL captured in every graph where no custom all-reduce path serves
# TP > 2 on PCIe-only cards (memory.nccl_in_graphs) is its own term, so LAMBO's 4x RTX 3090 3.65 GiB
# no longer shifts the shared base (0.21 -> 0.115 GiB, as fitted without it): the graph term's
# in-sample error 0.220 -> 0.146 GiB mean, 23.7 -> 15.9 % median. The KV headline pays in the
# speculative-decoding startups alone (club-3090 #46/#91/#294/#295, drafters not modelled, already
# over-predicted: 0.1 GiB less subtracted): LOSO mean 4.68 -> 4.71 %, band 91.5 -> 90.7 % (#294),
# off-H100 band 85.3 -> 83.8 %; every other case kept or improved. Merged over 122: median 0.51 %,
# mean 4.57 %, within 5 % 82.8 %, band 91.0 % (median 8.95 %), failed starts 5 of 11.
# The sglang-repos folder (SGLang startups from committed repo files: 7 judged, two of them failed
# starts predicted to fail) is new data: 127 startups, median 0.645 %, mean 4.30 %, within 5 %
# 84.3 %, band 92.1 % (median 7.90 %), off the calibration set 86.3 %, failed starts 7 of 13. Its
# four new 'Load weight begin' figures move SGLang's fitted context before weights from 0.5 (a
# median over two groups, tp 1 near 0.3-0.9 GiB and tp >= 4 near 2.3-2.5) from 1.95 to 0.77 GiB.
# sglang-data: a Qwen2.5-VL / Qwen3-VL tower's patch mergers in its weights (model), then five SGLang
# startups from committed files (data: three RTX 5060 Ti, one H100 fp8 KV, one 4 x RTX 4090 TP 4,
# each within 1.3-4.1 % leave-one-source-out): 132 startups, median 0.51 -> 0.71 % (the new cases sit
# above the old median, which lay in a sparse stretch of the sorted errors), mean 4.07 -> 3.97 %,
# within 5 % 85.8 -> 87.1 %, band 92 -> 93.2 % (median half-width 7.16 -> 6.29 %).
# vllm-data: V0's multimodal profile (model; gpustack#1800 +3469 -> +297 %, a failed start not in
# these figures) and vllm-router's gpt-oss-20b on GB10 judged on its base model's config (data:
# +20.6 %, its weights 12.82 GiB modelled against 13.72 logged): 133 startups, median 0.71 -> 0.74 %,
# mean 3.97 -> 4.10 %, within 5 % 87.1 -> 86.5 %, band 93.2 -> 93.2 % (median half-width 6.27 %).
# hybrid: vLLM's hybrid state rules per release (model; club3090-91 +4.1 -> +2.4 %) and
# meeting-translator's recorded language_model_only from its args line (data; -1.66 -> +0.66 %):
# median 0.74 -> 0.67 %, mean 4.10 -> 4.08 %.
# limit-mm: --limit-mm-per-prompt with every modality at 0 serves a VL checkpoint as text (model:
# zjpzhao's two Qwen3-VL-Embedding T4 startups on 0.11, which give {'image': 0, 'video': 0}, -17.3 ->
# -6.0 % and -14.1 -> -2.3 %): mean 4.08 -> 3.90 %, within 5 % 86.5 -> 87.2 %, band 93.2 -> 94.0 %
# (median half-width 6.27 -> 5.70 %), off the calibration set 86.3 -> 89.9 %.
# pooling: a pooling runner profiles its pooler, not a sampler (model: the same two startups, -6.0 ->
# -0.9 % and -2.3 -> +3.0 %): mean 3.90 -> 3.87 %, within 5 % 87.2 -> 88.0 %. The refit card widening
# narrowed with those errors (its bands ±10.27 -> ±9.75 %), and local-ai's phi-3 on an RTX 3090
# (-4.14 %) now sits just outside its ±4.18 %: band 94.0 -> 93.2 %, off the calibration set 89.9 ->
# 88.6 % -- a narrower band bought with one case, said here rather than hidden by a wider one.
# one release: the overall report predicted sglang PR#11309's indexer branch as 0.5.3 (the gatherer's
# "~0.5.3") where the SGLang scoring resolves 0.5.4 from its source (bench): +26.2 -> +2.6 %; mean
# 3.87 -> 3.69 %, within 5 % 88.0 -> 88.7 %, band 93.2 -> 94.0 % (median half-width 5.70 -> 5.47 %),
# off the calibration set 88.6 -> 89.9 %.
# new data, 2026-12-02 (four folders: vllm-newest 0.28-0.30 on GB10, a WSL2 laptop and a gfx1151;
# sglang-newest; vllm-cards; failed-starts), judged out of sample before any model change: 133 -> 149
# startups, median 0.68 -> 0.91 %, within 5 % 88.5 -> 85 %, median half-width 5.48 -> 8.35 % (the
# envelope widens for the new cards and releases), failed starts 13 -> 18. The model changes of the
# same session (gpt-oss's MXFP4 backend padding, SGLang's aiter factor on ROCm, Nemotron-3.x's
# layers_block_type, FlashInfer absent from two pip installs, the A100's TP class) are inside these
# figures: failed starts predicted 7 -> 12. The H100 in-sample median moves 0.027 -> 0.035 % with the
# shared coefficients refitted on the new cases (graphs, activation).
# mixed-precision: ModelOpt MIXED_PRECISION checkpoints are sized per group instead of refused, so
# club-3090#612's Qwen3.6-35B-A3B-NVFP4 on an RTX 5090 is judged: +22 %, inside its band (the V1
# encoder profile of its two images is not modelled). 149 -> 150 startups; within 5 % 85.2 -> 84.7 %
# (127 of 150: one case under the 85 %, said here rather than hidden by refusing the model),
# median 0.91 -> 0.93 %, mean 4.09 -> 4.21 %, median half-width 8.35 -> 8.25 %.
# V1 encoder profile: a Qwen3-VL / Qwen3.5 tower's profile is sized from the source (0.15+: the
# largest image, the items the encoder budget holds, the tower's peak, pixels and cached outputs alive
# through the forward and sampler) instead of the fitted lump: club-3090#612 +22.1 -> -4.6 %, lambo's
# 50k Qwen3.5-27B +9.9 -> -2.2 % (its three startups now agree at -2.2..-2.6 %); the club-3090
# Qwen3.6-27B TP 2 startups move about 5 points down (+2 -> -3.5 %; the 0.20-0.24 reading in
# multimodal.py finds no cause). Within 5 % 84.7 -> 86.0 %, median 0.93 -> 0.90 %, mean 4.21 ->
# 4.04 %, median half-width 8.25 -> 8.13 %; the refit H100 band narrowed and llm-d's FP8 Llama-3.3-70B
# at TP 4 (+3.10 %) left its ±2.83 %: band 93.3 -> 92.7 % (off the calibration set 89.5 -> 90.6 %).
# checkpoint KV dtype and graph profile: vLLM 0.14+ stores a ModelOpt checkpoint's own KV format
# for --kv-cache-dtype auto, so the Nemotron-3.5 NVFP4 startup on GB10 (its hf_quant_config.json's
# kv_cache_quant_algo FP8) is divided in fp8 pages: -29.4 -> +6.2 %; and TP 1's non-torch holds the
# CUDA-graph profile's memory only where vLLM measures it (0.18-0.26, graphs on; ROCm from 0.26):
# lambo's eager RTX 3090 startups -2.2..-3.8 -> -0.6..-1.6 %. Median 0.90 -> 0.85 %, mean 4.04 ->
# 3.81 %, band 92.7 -> 94.0 % (median half-width 8.13 -> 7.58 %; off the calibration set 90.6 ->
# 92.7 %); within 5 % stays 86.0 % (Nemotron is now +6.2 %, just outside).
# unified memory: on GB10 vLLM 0.11.1+ reads the free memory from the OS, so the host memory the
# startup takes counts as non-torch (1.92 GiB fitted, host_memory.py): the nine GB10 startups move
# from a median +6.5 % to 2.4 % (within 5 % 33 -> 67 %; virtualtubers' multimodal Qwen3.6-35B, its
# pool read from tokens, -12.0 -> -17.7 %). Median 0.85 -> 0.83 %, mean 3.81 -> 3.62 %, within 5 %
# 86.0 -> 88.0 %; the refit widenings shrink with the GB10 error (median half-width 7.58 -> 6.47 %)
# and the band holds 91.3 % (94.0 before; off the calibration set 92.7 -> 88.5 %).
# DiscoverPhysics' card named: its config line's compile range [2048] is max_num_batched_tokens,
# which 0.27.1 picks on a >= 70 GiB card only for an A100 (arg_utils.py:2544), so its batch
# defaults and non-torch class are the A100's: -11.0 -> -1.3 %. Within 5 % 88.0 -> 88.7 %, mean
# 3.62 -> 3.56 %, band 91.3 -> 92.0 % at a median half-width of 6.20 % (off the set 89.6 %).
# A100-SXM 80GB's total is the 79.25 GiB a vLLM log prints on a named A100-SXM4-80GB (LukeJYK),
# not deviceQuery's 79.15: every vLLM A100 startup moves 0.15-0.7 points closer, SGLang's context
# refits 0.51 -> 0.60 GiB (SGLang LOSO median 1.07 -> 0.84 %). Median 0.83 -> 0.75 %, within 5 %
# stays 88.7 %; the refit floor narrows and two llm-d TP 2/4 H100 rows at +2.4 % leave their
# +-2.3 %: band 92.0 -> 90.0 % (median half-width 6.16 %; off the set 90.6 %).
# A new startup, vllm#10360's AWQ Qwen2.5-32B on an RTX A6000 (ECC off) at 0.6.4.post1 with its
# non-torch figure (0.44 GiB, now in the V0 class), predicted +4.4 %: 151 startups, median 0.75 ->
# 0.76 % (the new row lies above it), within 5 % 88.7 -> 89.4 %, band 90.1 % at 6.03 %.
MEASURED = {
    "h100_in_median": 0.027,
    "h100_in_mean": 0.077,
    "h100_in_band": 1.0,
    "loso_cases": 151,
    "loso_median": 0.77,
    "loso_mean": 3.52,
    "loso_within_5": 0.894,
    "loso_band": 0.90,
    "loso_failed_predicted": 12,
    "loso_off_band": 0.905,
    # The price of the coverage: the median band half-width (% of the available KV), never widened
    # on the same cases.
    "h100_in_median_band": 2.63,
    "loso_median_band": 6.04,
}


@pytest.fixture(scope="module")
def report() -> Report:
    """The in-sample and leave-one-source-out report `make accuracy` prints, on every case: run
    (seconds) when a test first asks for it, never while collecting, and once per `make unit`,
    which sends a module's tests to one worker (pytest -n 2 --dist loadfile)."""
    return run(CASES)


def _h100(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.case.source in CALIBRATION_SOURCES]


def test_every_case_is_read_and_each_unpredicted_one_says_why(report: Report) -> None:
    cases = json.loads((APRIORI / "cases.json").read_text(encoding="utf-8"))
    public = sum(
        len(json.loads(p.read_text(encoding="utf-8"))) for p in (APRIORI / "public").glob("*/cases.json")
    )
    assert len(CASES) == len(cases) + len(list((APRIORI / "version-sweep").glob("*.json"))) + public
    usable = [c for c in CASES if predictable(c)]
    assert len(usable) >= 137
    assert sum(c.engine == "sglang" for c in usable) >= 25
    for c in CASES:
        assert predictable(c) or c.skip or any(r.refused for r in report.in_sample if r.case.id == c.id), c.id


def test_the_shipped_coefficients_are_the_fit_on_every_case() -> None:
    """calibration.FITTED is what bench/accuracy_fit.py gives on the cases (python -m bench.bench_accuracy --write)."""
    fitted = accuracy_fit.rounded(accuracy_fit.fit([c for c in CASES if predictable(c)], REPORT_MODELS))
    assert fitted == calibration.FITTED
    assert set(calibration.CASES) == set(calibration.FITTED.__dict__)
    sglang_fitted, used = accuracy_fit.fit_sglang(CASES)
    assert sglang_fitted == sglang_calibration.FITTED
    assert used["context_gib"] and used["context_gib_fabric"]
    assert set(sglang_calibration.CASES) == set(sglang_calibration.FITTED.__dict__)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_shipped_envelope_is_the_fit_on_every_case(engine: str, report: Report) -> None:
    shipped = {"vllm": vllm_envelope.ENVELOPE, "sglang": sglang_envelope.ENVELOPE}[engine]
    fitted = report.envelopes[engine]
    assert shipped.covered == fitted.covered
    assert shipped.term_bands == fitted.term_bands
    assert shipped.widening == fitted.widening
    assert shipped.floor == fitted.floor
    for axis in shipped.covered:
        assert f"widening {axis}" in shipped.cases


def test_the_docs_table_is_the_report(report: Report) -> None:
    """docs/predict.md's headline table is what `make accuracy` measures (written by --write)."""
    doc = acc.DOC.read_text(encoding="utf-8")
    begin, end = doc.index(acc.DOC_BEGIN) + len(acc.DOC_BEGIN) + 1, doc.index(acc.DOC_END)
    assert doc[begin:end] == acc.doc_table(report)


def test_in_sample_on_the_h100_calibration_set(report: Report) -> None:
    s = acc.stats(_h100(report.in_sample))
    assert s["cases"] >= 44
    assert s["median_pct"] <= MEASURED["h100_in_median"]
    assert s["mean_pct"] <= MEASURED["h100_in_mean"]
    assert s["inside_band"] >= MEASURED["h100_in_band"]
    assert s["median_band_pct"] <= MEASURED["h100_in_median_band"]
    # Only cases whose recorded settings contradict their own logged terms are left out.
    assert [r.case.id for r in report.in_sample if not r.consistent] == [
        "llmdbench-emp-gpt-oss-120b-tp1-mml16000"
    ]


def test_leave_one_source_out_overall_and_off_h100(report: Report) -> None:
    """The figures `make accuracy` reports, held where they were measured (never loosened)."""
    s = acc.stats(report.loso)
    assert s["cases"] >= MEASURED["loso_cases"]
    assert s["median_pct"] <= MEASURED["loso_median"]
    assert s["mean_pct"] <= MEASURED["loso_mean"]
    assert s["within_5pct"] >= MEASURED["loso_within_5"]
    assert s["inside_band"] >= MEASURED["loso_band"]
    assert s["median_band_pct"] <= MEASURED["loso_median_band"]
    assert s["failed_predicted"] >= MEASURED["loso_failed_predicted"]
    off = acc.stats([r for r in report.loso if r.case.source not in CALIBRATION_SOURCES])
    assert off["inside_band"] >= MEASURED["loso_off_band"]


def test_failed_starts_of_the_calibration_set_are_predicted_to_fail(report: Report) -> None:
    failed = [r for r in _h100(report.in_sample) if not r.case.started]
    assert failed
    for r in failed:
        assert r.predicted_fail, r.case.id
        assert r.prediction is not None and r.prediction.failure is not None
        assert "No available memory" in r.prediction.failure


@pytest.mark.parametrize("term", ["weights", "activation", "non_torch"])
def test_each_term_is_reported_and_close(term: str, report: Report) -> None:
    s = acc.term_stats(_h100(report.in_sample), term)
    assert s["cases"] >= 40
    assert s["mean_gib"] <= 0.05


def _log_cases() -> list[dict[str, object]]:
    out = []
    for c in json.loads((APRIORI / "cases.json").read_text(encoding="utf-8")):
        name = str(c["source_url"]).rsplit("/", 1)[-1]
        if (APRIORI / "logs" / f"{name}.gz").is_file():
            out.append({**c, "_log": name})
    return out


LOGS = _log_cases()


def test_every_bundled_log_belongs_to_a_case() -> None:
    assert len(LOGS) == len(list((APRIORI / "logs").glob("*.log.gz"))) == 50


@pytest.mark.parametrize("case", LOGS, ids=lambda c: str(c["_log"]))
def test_parser_reads_the_figures_of_a_real_019_log(case: dict[str, object], tmp_path: Path) -> None:
    log = tmp_path / str(case["_log"])
    log.write_bytes(gzip.decompress((APRIORI / "logs" / f"{case['_log']}.gz").read_bytes()))
    result = replay([str(log)])
    snaps = result.fleet.snapshot()
    assert snaps, "no engine instance read"
    snap = snaps[0]
    observed = case["observed"]
    assert isinstance(observed, dict)

    def gib(value: int | None) -> float:
        assert isinstance(value, int)
        return value / GiB

    memory = snap.memory
    assert round(gib(memory.total_bytes), 2) == observed["total_gpu_gib"]
    assert round(gib(memory.weights_bytes), 2) == observed["weights_gib"]
    if case["outcome"] == "started":
        assert round(gib(memory.available_kv_bytes), 2) == observed["available_kv_gib"]
        assert snap.pools["full"].tokens == observed["kv_cache_tokens"]
        assert snap.pools["full"].blocks == observed["gpu_blocks"]
    settings = case["settings"]
    assert isinstance(settings, dict)
    if settings.get("max_num_seqs") is not None:
        assert snap.settings.max_num_seqs == settings["max_num_seqs"]
    if settings.get("max_num_batched_tokens") is not None:
        assert snap.settings.max_num_batched_tokens == settings["max_num_batched_tokens"]


@pytest.mark.parametrize(
    "case",
    [c for c in LOGS if c.get("model_config") and c["outcome"] == "started"],
    ids=lambda c: str(c["_log"]),
)
def test_sidecar_config_basis_lands_on_the_logged_budget(case: dict[str, object], tmp_path: Path) -> None:
    """What the sidecar predicts from the settings it read in the log (basis 'config')."""
    log = tmp_path / str(case["_log"])
    log.write_bytes(gzip.decompress((APRIORI / "logs" / f"{case['_log']}.gz").read_bytes()))
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(load_config(str(case["model_config"]), str(case["model"]))), encoding="utf-8"
    )
    (snap,) = replay([str(log)]).fleet.snapshot()
    result = Predictor(model_config=lambda source: config).predict(snap)
    assert result.state == "ok", result.reason
    observed = case["observed"]
    assert isinstance(observed, dict)
    predicted = result.memory["kv"] / GiB
    # The same model as `kvwatch predict`, on the settings the engine logged: within a percent.
    assert abs(predicted - observed["available_kv_gib"]) <= 0.01 * observed["available_kv_gib"] + 0.05
