"""Engines' own command lines read into Deployment fields (kvwatch predict MODEL -- <flags>)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvwatch.cli import main
from kvwatch.core.errors import ConfigError
from kvwatch.engines.flags import human_int, read_flags
from kvwatch.engines.sglang.flags import FLAGS as SGLANG
from kvwatch.engines.vllm.flags import FLAGS as VLLM


def test_vllm_serve_line() -> None:
    r = read_flags(
        [
            "meta-llama/Llama-3.1-8B-Instruct",
            "--tensor-parallel-size",
            "4",
            "--max-num-seqs=256",
            "--gpu-memory-utilization",
            "0.9",
            "--enforce-eager",
            "--quantization",
            "fp8",
            "--dtype",
            "float16",
            "--max-model-len",
            "32k",
            "--served-model-name",
            "llama",
            "--trust-remote-code",
        ],
        VLLM,
    )
    assert r.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert r.fields == {
        "tp": 4,
        "max_num_seqs": 256,
        "gpu_memory_utilization": 0.9,
        "enforce_eager": True,
        "quantization": "fp8",
        "dtype": "float16",
        "max_model_len": 32000,
    }
    assert r.ignored == ["--served-model-name llama", "--trust-remote-code"]


def test_vllm_switch_inverse_and_hybrid_manager() -> None:
    r = read_flags(["--no-enforce-eager", "--disable-hybrid-kv-cache-manager", "-tp", "2"], VLLM)
    assert r.fields == {"enforce_eager": False, "hybrid_kv_cache_manager": False, "tp": 2}


def test_vllm_prefix_caching_flag_both_ways() -> None:
    # A hybrid model's state blocks per request follow it (engines/vllm/hybrid.mamba_cache_mode).
    assert read_flags(["--enable-prefix-caching"], VLLM).fields == {"enable_prefix_caching": True}
    assert read_flags(["--no-enable-prefix-caching"], VLLM).fields == {"enable_prefix_caching": False}
    assert read_flags(["--language-model-only"], VLLM).fields == {"language_model_only": True}


def test_sglang_launch_server_line() -> None:
    r = read_flags(
        [
            "--model-path",
            "deepseek-ai/DeepSeek-V3",
            "--tp-size",
            "8",
            "--mem-fraction-static",
            "0.85",
            "--context-length",
            "65536",
            "--chunked-prefill-size",
            "4096",
            "--cuda-graph-max-bs",
            "128",
            "--disable-cuda-graph",
            "--dp-size",
            "8",
            "--enable-dp-attention",
            "--enable-torch-compile",
        ],
        SGLANG,
    )
    assert r.model == "deepseek-ai/DeepSeek-V3"
    assert r.fields == {
        "tp": 8,
        "mem_fraction_static": 0.85,
        "max_model_len": 65536,
        "chunked_prefill_size": 4096,
        "cuda_graph_max_bs": 128,
        "enforce_eager": True,
        "dp": 8,
        "dp_attention": True,
    }
    assert r.ignored == ["--enable-torch-compile"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tensor-parallel-size"], "needs a value"),
        (["--tensor-parallel-size", "zero"], "--tensor-parallel-size"),
        (["--gpu-memory-utilization", "1.5"], "(0, 1]"),
        (["--enforce-eager=yes"], "takes no value"),
        (["--max-model-len", "1e30"], "--max-model-len"),
    ],
)
def test_bad_values_name_the_flag(argv: list[str], message: str) -> None:
    with pytest.raises(
        ConfigError, match=message.replace("(", r"\(").replace("[", r"\[").replace("]", r"\]")
    ):
        read_flags(argv, VLLM)


def test_human_int_reads_as_vllm_does() -> None:
    assert human_int("32768") == 32768
    assert human_int("32k") == 32000
    assert human_int("32K") == 32768
    assert human_int("1M") == 1024**2
    with pytest.raises(ValueError):
        human_int("1.5")


CONFIGS = Path(__file__).parent / "model_configs"
QWEN8 = str(CONFIGS / "Qwen--Qwen3-8B.json")


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["predict", *argv]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_predict_takes_the_engines_own_flags_after_a_double_dash(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _json(capsys, QWEN8, "--gpu", "h100", "--json")
    flagged = _json(
        capsys,
        QWEN8,
        "--gpu",
        "h100",
        "--json",
        "--",
        "--max-model-len",
        "16k",
        "--max-num-seqs",
        "256",
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.85",
        "--trust-remote-code",
    )
    assert flagged["max_model_len"] == 16000 and plain["max_model_len"] == 40960
    assert flagged["gpu_memory_utilization"] == 0.85
    assert flagged["memory"]["cuda_graphs"] == 0  # --enforce-eager captures none
    assert flagged["memory"]["activation"] < plain["memory"]["activation"]  # 256 sequences sample less
    assert any("ignored: --trust-remote-code" in a for a in flagged["assumptions"])


def test_sglang_flags_after_the_double_dash(capsys: pytest.CaptureFixture[str]) -> None:
    data = _json(
        capsys, QWEN8, "--engine", "sglang", "--gpu", "h100", "--json", "--", "--mem-fraction-static", "0.8"
    )
    assert data["mem_fraction_static"] == 0.8


def test_double_dash_is_refused_where_no_engine_flags_are_taken(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["parse", "x.log", "--", "--tp", "2"])
    assert exc.value.code == 2


def test_predict_without_a_card_prints_every_card(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", QWEN8, "--max-model-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "147,456 B per GPU" in out and "15.27 GiB per GPU" in out
    assert "H100-SXM-80GB" in out and "RTX-4090-24GB" in out
    data = _json(capsys, QWEN8, "--max-model-len", "32768", "--json")
    cards = {c["gpu"]: c for c in data["cards"]}
    assert cards["H100-SXM-80GB"]["fits"] and not cards["L4-24GB"]["fits"]
    totals = [c["memory"]["total"] for c in data["cards"]]
    assert totals == sorted(totals)
