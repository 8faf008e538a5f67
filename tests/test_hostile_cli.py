"""Offline commands on hostile input (issue 14, items 6-7): one line on stderr and exit 2, never a
traceback; plausibility bounds named in the message; and a property test over arbitrary configs and
flags for predict / plan / explain."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes import examples

from kvwatch.cli import main
from kvwatch.engines import registry
from kvwatch.sources.logfile import LogTailer

CONFIGS = Path(__file__).parent / "model_configs"
LLAMA8 = CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json"
VLLM_LOG = Path(__file__).parent / "log_samples" / "vllm" / "001-llama31-8b-rtx3090-profiling-20k.log"
# The releases each engine accepts, as the messages spell them (they grow with a new release's rule).
VLLM_KNOWN = "vLLM {} to {}".format(*registry.get("vllm").known_versions)
SGLANG_KNOWN = "SGLang {} to {}".format(*registry.get("sglang").known_versions)


def _config(tmp_path: Path, name: str, **changes: object) -> str:
    cfg = json.loads(LLAMA8.read_text())
    cfg.update(changes)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _run(argv: list[str]) -> int:
    """main()'s exit code, argparse's SystemExit included."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert _run(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert needle in err, err


def test_deeply_nested_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    _one_line_exit_2(capsys, ["predict", str(path), "--gpu", "h100"], "nests too deeply")


def test_binary_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bin.json"
    path.write_bytes(bytes(range(256)) * 8)
    _one_line_exit_2(capsys, ["predict", str(path), "--gpu", "h100"], "not UTF-8")


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        (
            "vocab_size",
            10**30,
            "'vocab_size' is 1000000000000000000000000000000, over the plausible maximum 16,777,216",
        ),
        ("hidden_size", 1e308, "'hidden_size' is 1e+308, over the plausible maximum 1,048,576"),
        ("num_key_value_heads", 3, "32 is not a multiple of its 3 KV heads"),
        ("num_key_value_heads", 64, "64 KV heads for 32 attention heads"),
        ("max_position_embeddings", float("inf"), "over the plausible maximum"),
    ],
)
def test_implausible_config_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: object, needle: str
) -> None:
    path = _config(tmp_path, "bad", **{field: value})
    _one_line_exit_2(capsys, ["predict", path, "--gpu", "h100", "--max-model-len", "8192"], needle)


def test_implausible_config_in_explain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _config(tmp_path, "bad", hidden_size=1e308)
    _one_line_exit_2(capsys, ["explain", str(VLLM_LOG), "--model-config", path], "'hidden_size' is 1e+308")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--gpu-memory", "1e400"], "over the plausible maximum of 16 TiB"),
        (["--gpu-memory", "1e30GB"], "over the plausible maximum of 16 TiB"),
        (["--gpu", "h100", "--weights-memory", "1e30GB"], "over the plausible maximum"),
        (["--gpu", "h100", "--weights-memory", "100TB"], "over the plausible maximum of 16 TiB per GPU"),
        (["--gpu-memory", "-5GB"], "must be positive"),
        (
            ["--gpu", "h100", "--block-size", str(10**30)],
            "block_size 1000000000000000000000000000000 is over",
        ),
        (["--gpu", "h100", "--tp", "100000"], "tp 100000 is over the plausible maximum 4,096"),
        (["--gpu", "h100", "--engine-version", "banana"], f"kvwatch knows {VLLM_KNOWN}"),
        (["--gpu", "h100", "--engine-version", "7.0"], VLLM_KNOWN),
        (["--gpu", "h100", "--engine", "sglang", "--engine-version", "9.9"], SGLANG_KNOWN),
        (["--tp", "x"], "argument --tp: not an integer"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_flags(capsys: pytest.CaptureFixture[str], flags: list[str], needle: str) -> None:
    _one_line_exit_2(capsys, ["predict", str(LLAMA8), "--max-model-len", "8192", *flags], needle)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--workload", f"1x{10**30}"], "over the plausible maximum 1,073,741,824"),
        (["--workload", "1x1e30"], "cannot read"),
        (["--workload", "1x100", "--grow", str(10**30)], "over the plausible maximum 1,073,741,824"),
    ],
)
def test_bad_plan_flags(capsys: pytest.CaptureFixture[str], flags: list[str], needle: str) -> None:
    _one_line_exit_2(capsys, ["plan", str(LLAMA8), "--gpu", "h100", *flags], needle)


def test_explain_rejects_an_unknown_engine_version(capsys: pytest.CaptureFixture[str]) -> None:
    _one_line_exit_2(capsys, ["explain", str(VLLM_LOG), "--engine-version", "banana"], "not a version number")


def test_known_versions_still_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "predict",
        str(LLAMA8),
        "--gpu",
        "h100",
        "--max-model-len",
        "8192",
        "--engine-version",
        "0.11.0rc2",
    ]
    assert main(argv) == 0


def test_argparse_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["predict"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "MODEL_CONFIG" in err


# --- property: arbitrary JSON and flags -> exit 0 or 2, never a traceback -----------------------------

_KEYS = [
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "intermediate_size",
    "max_position_embeddings",
    "torch_dtype",
    "model_type",
    "sliding_window",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "tie_word_embeddings",
    "rope_scaling",
    "quantization_config",
    "text_config",
    "num_local_experts",
    "num_experts_per_tok",
    "layer_types",
    "hybrid_override_pattern",
    "block_configs",
]
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_VALUE = st.one_of(
    st.integers(min_value=-5, max_value=5000),
    st.sampled_from(
        ["0", "-1", "1e30", "1e400", "nan", "inf", "-5GB", "80GB", "1e30GB", "x", "", "1e-9", "0.5"]
    ),
)
_FLAGS = [
    "--gpu-memory",
    "--tp",
    "--pp",
    "--dcp",
    "--block-size",
    "--max-model-len",
    "--max-num-batched-tokens",
    "--gpu-memory-utilization",
    "--mem-fraction-static",
    "--weights-memory",
    "--activation-memory",
    "--available-kv-memory",
    "--gpu-memory-in-use",
    "--engine-version",
    "--kv-cache-dtype",
    "--weights-dtype",
]


@st.composite
def _config_and_flags(draw: st.DrawFn) -> tuple[dict[str, object], list[str]]:
    base = json.loads(LLAMA8.read_text()) if draw(st.booleans()) else {}
    for key in draw(st.lists(st.sampled_from(_KEYS), max_size=4)):
        base[key] = draw(_JSON)
    flags: list[str] = []
    for flag in draw(st.lists(st.sampled_from(_FLAGS), max_size=4)):
        flags += [flag, str(draw(_VALUE))]
    return base, flags


@settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_config_and_flags(), st.sampled_from(["predict", "plan", "explain"]))
def test_any_config_and_flags_exit_0_or_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: tuple[dict[str, object], list[str]],
    command: str,
) -> None:
    config, flags = case
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    if command == "predict":
        argv = ["predict", str(path), "--gpu", "h100", *flags]
    elif command == "plan":
        argv = ["plan", str(path), "--gpu", "h100", "--workload", "2x4096", *flags]
    else:
        known = ("--gpu-memory", "--tp", "--max-model-len", "--engine-version", "--kv-cache-dtype")
        pairs = [p for p in zip(flags[::2], flags[1::2], strict=True) if p[0] in known]
        argv = ["explain", str(VLLM_LOG), "--model-config", str(path), *(x for p in pairs for x in p)]
    rc = _run(argv)
    out = capsys.readouterr()
    assert rc in (0, 2), (argv, config, out.err)
    assert "Traceback" not in out.err
    if rc == 2:
        assert out.err.count("\n") == 1, out.err


# --- CR-only line endings (item 8): the replay path reads them as the lines they are ------------------


@pytest.mark.parametrize("ending", [b"\r", b"\r\n"])
def test_parse_reads_cr_and_crlf_logs_as_lf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ending: bytes
) -> None:
    data = VLLM_LOG.read_bytes()
    converted = tmp_path / "cr.log"
    converted.write_bytes(data.replace(b"\n", ending))
    assert main(["parse", str(VLLM_LOG), "--events"]) == 0
    want = capsys.readouterr().out
    assert main(["parse", str(converted), "--events"]) == 0
    got = capsys.readouterr().out
    assert want and got == want.replace(str(VLLM_LOG), str(converted))


def test_tailer_splits_cr_lines_and_resumes_after_them(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"Loading 10%\rLoading 100%\rINFO ready\r\nnext\n")
    got: list[str] = []
    tailer = LogTailer(str(log), lambda _path, line: got.append(line), recheck_interval=3600.0)
    tailer.start()
    try:
        deadline = time.monotonic() + 10
        while len(got) < 4 and time.monotonic() < deadline:
            tailer.refresh()
            time.sleep(0.02)
        position = tailer.positions()[str(log)]
    finally:
        tailer.stop()
    assert got == ["Loading 10%", "Loading 100%", "INFO ready", "next"]
    assert position.offset == log.stat().st_size
    with log.open("ab") as fh:
        fh.write(b"after\r")
    again: list[str] = []
    resumed = LogTailer(
        str(log), lambda _path, line: again.append(line), recheck_interval=3600.0, resume={str(log): position}
    )
    resumed.start()
    try:
        deadline = time.monotonic() + 10
        while not again and time.monotonic() < deadline:
            resumed.refresh()
            time.sleep(0.02)
    finally:
        resumed.stop()
    assert again == ["after"]


@pytest.mark.parametrize(
    ("content", "needle"), [(bytes(range(256)), "not UTF-8"), (b"[" * 100_000, "nests too deeply")]
)
def test_run_settings_file_binary_or_deep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, needle: str
) -> None:
    path = tmp_path / "kvwatch.yaml"
    path.write_bytes(content)
    _one_line_exit_2(capsys, ["run", "--config", str(path)], needle)
