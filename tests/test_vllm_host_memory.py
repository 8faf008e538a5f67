"""On a unified-memory card vLLM's non-torch increase holds the host memory the startup takes.

0.11.1 takes a GB10's free memory from psutil's available memory (utils/mem_utils.py:86-102; 0.25.1
:147-154), so the host memory taken after the init snapshot is non-torch there; 0.11.0 and every
discrete card read cudaMemGetInfo. The GB10 startups that print weights and available KV are the
evidence: with the discrete class alone their pools came out 1.8-3.0 GiB long.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from bench import accuracy_fit
from bench.accuracy_cases import load_cases, predictable
from bench.accuracy_loso import Models, evaluate
from kvwatch.analysis.predict import predict
from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import load_model
from kvwatch.core.units import GiB
from kvwatch.engines.vllm import calibration, host_memory, memory

CONFIGS = Path(__file__).parent / "model_configs"
GB10 = "GB10-128GB"


def _d(version: str, gpu: str = GB10) -> Deployment:
    card = gpus.find(gpu)
    assert card is not None
    return Deployment(
        engine="vllm",
        engine_version=version,
        gpu_name=card.name,
        gpu_memory_bytes=card.total_bytes,
        max_model_len=8192,
    )


@pytest.mark.parametrize(
    ("version", "gpu", "counted"),
    [
        ("0.11.0", GB10, False),  # cudaMemGetInfo only
        ("0.11.1", GB10, True),  # SM 12.1 in shared_sysmem_device_mem_sms
        ("0.25.1", GB10, True),  # is_integrated
        ("0.33.0", GB10, True),
        ("0.25.1", "H100-80GB-HBM3", False),  # discrete
        ("0.25.1", "GH200-96GB", False),  # its HBM is the GPU's own
    ],
)
def test_which_startups_count_host_memory(version: str, gpu: str, counted: bool) -> None:
    d = _d(version, gpu)
    assert host_memory.counts_host_memory(d, gpus.find(gpu)) is counted
    plain = memory.non_torch(_d(version, "H100-80GB-HBM3")).bytes
    extra = calibration.current().non_torch_unified_gib * GiB if counted else 0
    assert memory.non_torch(d).bytes == pytest.approx(plain + extra, abs=2)


def test_the_prediction_names_it() -> None:
    m = load_model(CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json")
    p = predict(m, _d("0.25.1"))
    assert any("unified memory" in a and "host memory" in a for a in p.assumptions), p.assumptions
    older = predict(m, _d("0.11.0"))
    assert p.non_torch_bytes is not None and older.non_torch_bytes is not None
    assert p.non_torch_bytes - older.non_torch_bytes > GiB


def test_the_coefficient_is_the_median_its_cases_imply_and_moves_them_in() -> None:
    """The fit's cases are the GB10 startups with weights and KV in their logs; each one's error with
    the term is smaller than without it, and the coefficient is their median shortfall."""
    cases = [c for c in load_cases() if predictable(c)]
    models = Models()
    cal, used = accuracy_fit.fit_with_cases(cases, models)
    ids = used["non_torch_unified_gib"]
    assert len(ids) >= 4 and len({c.source for c in cases if c.id in ids}) >= 2
    assert cal.non_torch_unified_gib == pytest.approx(calibration.FITTED.non_torch_unified_gib, rel=1e-3)
    errors_with, errors_without = [], []
    for c in cases:
        if c.id not in ids:
            continue
        errors_with.append(abs(evaluate(c, models).kv_error or 0))
        with calibration.using(replace(calibration.FITTED, non_torch_unified_gib=0.0)):
            errors_without.append(abs(evaluate(c, models).kv_error or 0))
    assert statistics.median(errors_with) < statistics.median(errors_without)
