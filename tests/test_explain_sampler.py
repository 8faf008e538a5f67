"""The sampler vLLM logs it falls back to reaches the sidecar's and explain's config-basis prediction.

vLLM 0.8-0.11.0 installed without FlashInfer logs 'FlashInfer is not available' and its profile run
sorts the whole vocabulary (engines/vllm/memory.sampler_path): a prediction that assumed FlashInfer
overstates the pool by the sort's activation, a false drift page. The startup here is a real one:
the verbatim lines of the energyllm case (Llama-3.1-8B-Instruct, vLLM 0.11.0, an A100-40GB, the
log's 19.24 GiB and 157,584 tokens; tests/apriori/public/vllm/cases.json).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvwatch.analysis.explain import explain
from kvwatch.analysis.predictor import PredictionResult, Predictor
from kvwatch.capacity import gpus
from kvwatch.capacity.geometry import load_model
from kvwatch.sources.pipeline import replay
from kvwatch.state.fleet import InstanceSnapshot

TESTS = Path(__file__).parent
CONFIG = TESTS / "model_configs" / "meta-llama--Meta-Llama-3.1-8B.json"
CASE_ID = "energyllm-llama31-8b-a100-40gb-v0.11.0-4k"
LINE = "FlashInfer is not available"


def _case() -> Any:
    cases = json.loads((TESTS / "apriori" / "public" / "vllm" / "cases.json").read_text())
    return next(c for c in cases if c["id"] == CASE_ID)


def _snapshot(tmp_path: Path, with_line: bool) -> InstanceSnapshot:
    lines = [line for line in _case()["verbatim"] if with_line or LINE not in line]
    assert any(LINE in line for line in lines) == with_line
    log = tmp_path / ("with.log" if with_line else "without.log")
    log.write_text("\n".join(lines) + "\n")
    (snap,) = replay([str(log)]).snapshots()
    return snap


def _sidecar(snap: InstanceSnapshot) -> PredictionResult:
    card = gpus.lookup("A100-40GB").memory_bytes
    return Predictor(model_config=lambda source: CONFIG, gpu_memory_bytes=card).predict(snap)


def test_logged_fallback_is_a_settings_fact(tmp_path: Path) -> None:
    """The line sets the one fact; the budget and pool facts of the two startups are the same."""
    with_line, without = _snapshot(tmp_path, True), _snapshot(tmp_path, False)
    assert with_line.settings.flashinfer_sampler is False
    assert without.settings.flashinfer_sampler is None
    assert (with_line.memory, with_line.pool) == (without.memory, without.pool)


def test_config_basis_of_a_startup_without_flashinfer_sorts(tmp_path: Path) -> None:
    observed = _case()["observed"]["kv_cache_tokens"]
    assert observed == 157_584
    with_line, without = _snapshot(tmp_path, True), _snapshot(tmp_path, False)
    sorted_, assumed = _sidecar(with_line), _sidecar(without)
    assert sorted_.state == assumed.state == "ok"
    # The sort's [rows, vocab] buffers: a larger activation peak, a smaller pool, nearer the log's.
    assert sorted_.memory["activation"] > assumed.memory["activation"]
    assert abs(sorted_.tokens["config"] - observed) < abs(assumed.tokens["config"] - observed)
    # The engine's own budget does not depend on the sampler model.
    assert sorted_.tokens["engine_budget"] == assumed.tokens["engine_budget"]

    # explain predicts from the same facts: the same tokens, and it says which sampler it modelled.
    card = gpus.lookup("A100-40GB").memory_bytes
    model = load_model(CONFIG)
    for snap, result, path in ((with_line, sorted_, "sort"), (without, assumed, "flashinfer")):
        e = explain(snap, model, card)
        assert e.predicted_tokens == result.tokens["config"]
        assert e.prediction is not None
        assert any(f"sampler path {path})" in note for note in e.prediction.assumptions)
