"""vLLM speculative decoding with an MTP drafter: its layers in the KV groups, its weights, the flag.

Figures from real startups (tests/apriori/public/vllm/cases.json): sostrowsk/dgx-spark-local-llm
qwen36.log (Qwen3.6-35B-A3B, 0.25.1, {'method': 'mtp', 'num_speculative_tokens': 3}: 'Add 3
padding layers, may waste at most 10.00% KV cache memory', 74.22 GiB -> 3,366,051 tokens, 12.84x).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench.accuracy_cases import deployment, load_cases
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import geometry_from_config
from kvwatch.capacity.model import ModelGeometry
from kvwatch.cli import main
from kvwatch.engines.vllm import budget, calibration, hybrid, memory, weights

ROOT = Path(__file__).parent
QWEN35_27B = ROOT / "apriori/public/configs/Qwen--Qwen3.5-27B.json"
QWEN35_35B = ROOT / "model_configs/Qwen--Qwen3.5-35B-A3B.json"
GIB = 2**30


def _model(path: Path) -> ModelGeometry:
    return geometry_from_config(json.loads(path.read_text(encoding="utf-8")))


def test_qwen35_configs_name_one_mtp_layer() -> None:
    assert _model(QWEN35_27B).mtp_layers == 1
    assert _model(QWEN35_35B).mtp_layers == 1


def _sostrowsk(method: str | None, tokens: int | None) -> budget.VllmPool:
    d = Deployment(
        engine="vllm",
        engine_version="0.25.1",
        max_model_len=262144,
        speculative_method=method,
        num_speculative_tokens=tokens,
    )
    return budget.plan(_model(QWEN35_35B), d, 2, int(74.22 * GIB), 262144, 2048)


def test_mtp_layer_joins_the_hybrid_groups_as_the_log_says() -> None:
    """30 GDN + 10 full-attention layers, + 1 MTP full-attention layer: groups of 11, the GDN
    layers padded by 3 (the log's 'Add 3 padding layers'); 3299 blocks of the printed 74.22 GiB
    (vLLM's unrounded figure gave 3300) over 245 + 3 x (1 + 3) blocks a request -- prefix caching
    off, the engine config line's enable_prefix_caching=False -- is the log's 12.84x, and the
    tokens within one block of the log's 3,366,051."""
    pool = _sostrowsk("mtp", 3)
    assert pool.padding_layers == 3
    assert pool.tensors == 11
    assert pool.num_blocks == 3299
    assert f"{pool.max_concurrency:.2f}" == "12.84"
    assert 0 <= 3_366_051 - pool.tokens <= 262144 // 257
    # Without the drafter the same budget reads 12 % more tokens than vLLM allocated.
    plain = _sostrowsk(None, None)
    assert plain.padding_layers == 0
    assert plain.tokens > 3_366_051 * 1.10


def test_proposed_tokens_widen_the_conv_state_and_the_blocks_a_request_keeps() -> None:
    """Qwen3.6-27B at TP 2, fp8 KV: one GDN state is 5,120 conv channels x (3 + 3 proposed) x 2 B
    + 24 heads x 128 x 128 x 4 B = 1,634,304 B, so the attention block grows from 1,568 to
    16 x ceil(1,634,304 / (16 x 1,024)) = 1,600 tokens. club-3090 #294 passes --enable-prefix-caching:
    mamba_cache_mode 'align', each GDN group keeps 2 + 3 blocks a request; 0.22 leaves prefix caching
    off for a hybrid model by default (config/model.py is_prefix_caching_supported): 'none', 1 + 3."""
    model = _model(QWEN35_27B)
    d = Deployment(
        engine="vllm",
        engine_version="0.22.0",
        tp=2,
        dtype="float16",
        kv_cache_dtype="fp8_e5m2",
        max_model_len=262144,
        speculative_method="mtp",
        num_speculative_tokens=3,
        enable_prefix_caching=True,
    )
    spec = budget.plan(model, d, 1, 11 * GIB, 262144, 8192)
    plain = budget.plan(
        model, replace(d, speculative_method=None, num_speculative_tokens=None), 1, 11 * GIB, 262144, 8192
    )
    assert (spec.block_size, plain.block_size) == (1600, 1568)
    assert spec.tensors == 17 and spec.padding_layers == 3
    state_groups = [g for g in spec.groups if g.spec.kind == "state"]
    assert len(state_groups) == 3 and all(g.spec.state_blocks == 5 for g in state_groups)
    default = budget.plan(model, replace(d, enable_prefix_caching=None), 1, 11 * GIB, 262144, 8192)
    assert all(g.spec.state_blocks == 4 for g in default.groups if g.spec.kind == "state")


def test_mtp_without_a_token_count_proposes_the_checkpoint_n_predict() -> None:
    model = _model(QWEN35_27B)
    assert hybrid.speculative_tokens(model, Deployment(engine="vllm", speculative_method="mtp")) == 1
    assert hybrid.speculative_tokens(model, Deployment(engine="vllm", speculative_method="qwen3_5_mtp")) == 1
    assert hybrid.speculative_tokens(model, Deployment(engine="vllm")) == 0


def test_mtp_weights_load_with_the_target() -> None:
    model = _model(QWEN35_27B)
    assert model.dims is not None
    d = Deployment(engine="vllm", tp=2)
    plain = weights.weights_per_stage(model.dims, d, None)[0][0]
    drafted = weights.weights_per_stage(model.dims, d, None, drafter_layers=1)[0][0]
    fc = 2 * 5120 * 5120 * 2 // 2
    # One average decoder layer (bf16, split over 2 ranks) plus the fc: no second embedding or head.
    assert fc < drafted - plain < fc + 2 * plain // 64


def test_the_bench_reads_the_speculative_config_the_user_typed() -> None:
    cases = {c.id: c for c in load_cases()}
    d = deployment(cases["club3090-294-qwen3.6-27b-autoround-2xrtx3090-tp2-v0.22-262k-fp8e5m2-mtp-p2poff"])
    assert (d.speculative_method, d.num_speculative_tokens) == ("mtp", 3)
    d = deployment(cases["club3090-642-qwen3.6-27b-autoround-2xrtx3090-tp2-v0.24-262k-mtp"])
    assert (d.speculative_method, d.num_speculative_tokens) == ("mtp", None)


def _predict(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    argv = [str(QWEN35_35B), "--gpu-memory", "121.6GiB", "--gpu-memory-utilization", "0.85"]
    argv += ["--engine-version", "0.25.1", "--max-model-len", "262144", *extra, "--json"]
    assert main(["predict", *argv]) == 0
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def test_predict_takes_the_speculative_config_as_typed(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _predict(capsys)
    spec = _predict(capsys, "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}')
    assert isinstance(plain["kv_pool_tokens"], int) and isinstance(spec["kv_pool_tokens"], int)
    assert spec["kv_pool_tokens"] < plain["kv_pool_tokens"] * 0.92
    assert isinstance(plain["weights_bytes"], int) and isinstance(spec["weights_bytes"], int)
    assert spec["weights_bytes"] > plain["weights_bytes"]
    assert "MTP" in json.dumps(spec["assumptions"])


@pytest.mark.parametrize(
    "value",
    ['{"method": "mtp"', "[3]", '{"num_speculative_tokens": 0}', '{"method": 3}', "{}"],
)
def test_bad_speculative_config_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    assert main(["predict", str(QWEN35_35B), "--gpu", "h100", "--speculative-config", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--speculative-config" in err


def test_sglang_refuses_the_vllm_speculative_config(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["predict", str(QWEN35_35B), "--engine", "sglang", "--gpu", "h100"]
    assert main([*argv, "--speculative-config", '{"method": "mtp"}']) == 2
    assert "not modelled" in capsys.readouterr().err


def test_the_mtp_layer_runs_on_the_last_pipeline_stage() -> None:
    """The target's 64 layers split as without a drafter (32 + 32); the MTP layer joins the last."""
    model = _model(QWEN35_27B)
    d = Deployment(engine="vllm", pp=2, speculative_method="mtp")
    stages = budget._stages(model, d)
    assert [len(s) for s in stages] == [32, 33]
    assert stages[0] == list(model.layers[:32]) and stages[1][-1].kind == "full"


def test_language_model_only_builds_no_tower_and_profiles_no_encoder() -> None:
    """phivan3008/meeting-translator (vLLM 0.27.1) serves Qwen3.6-27B with 'language_model_only': True:
    every modality's limit reads 0, _mark_tower_model skips the vision tower (0.19.0
    model_executor/models/interfaces.py:249-290) and the encoder budget is 0, so profile_run runs no
    encoder (0.19.0 v1/worker/gpu_model_runner.py:5734)."""
    model = _model(QWEN35_27B)
    assert model.dims is not None and model.dims.has_vision_tower and model.dims.vision_params > 0
    d = Deployment(engine="vllm", engine_version="0.27.1", gpu_memory_bytes=80 * GIB, max_model_len=4096)
    text = replace(d, language_model_only=True)
    full = weights.weights_per_stage(model.dims, d, None)[0][0]
    lean = weights.weights_per_stage(model.dims, text, None)[0][0]
    assert full - lean == int(model.dims.vision_params * 2)
    seqs, tokens = memory.batch_limits(d, 4096)
    a = memory.activation(model.dims, d, None, seqs, tokens)[0].bytes
    b = memory.activation(model.dims, text, None, seqs, tokens)[0].bytes
    # The encoder profile a Qwen3.5 tower adds on 0.27.1 is sized from the source
    # (memory.v1_multimodal), and --language-model-only removes all of it.
    assert memory.v1_multimodal(model.dims, d, seqs, tokens, 4096) is not None
    assert memory.v1_multimodal(model.dims, text, seqs, tokens, 4096) is None
    assert a - b > int(calibration.current().vision_encoder_gib * GIB)
