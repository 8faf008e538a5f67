"""`kvwatch parse`: output forms, stdin, errors and the progress bar."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.cli import main
from kvwatch.commands import parse as parse_cmd

SAMPLES = Path(__file__).parent / "log_samples"
V0_ERROR = SAMPLES / "vllm" / "016-v0-rtx4060-cuda-blocks-zero-negative-kv.log"
V1_POOL = SAMPLES / "vllm" / "024-v1-2026-worker-tp0-engcore-prefix-qwen36-27b-2x3090.log"
SGLANG = SAMPLES / "sglang" / "017-dsv32-dp8-mla-kv-size-single-pool.log"


def test_json_matches_the_golden_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parse", str(V1_POOL), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(V1_POOL.with_suffix(".summary.json").read_text())
    assert out["instances"][0]["kv_pool_tokens"] == 623873


def test_events_match_the_golden_events(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parse", str(V0_ERROR), "--events"]) == 0
    assert capsys.readouterr().out == V0_ERROR.with_suffix(".events.jsonl").read_text()


def test_table_per_instance(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parse", str(V1_POOL), str(SGLANG)]) == 0
    out = capsys.readouterr().out
    assert f"({V1_POOL}, instance 0)" in out
    assert f"({SGLANG}, instance 0)" in out
    assert "623,873" in out
    assert "2.38x at 262,144 tokens" in out
    assert "1,462,784" in out
    assert "54.52 GiB" in out


def test_table_shows_startup_error(capsys: pytest.CaptureFixture[str]) -> None:
    path = SAMPLES / "vllm" / "023-tpu-v1-models-s-typo-traceback.log"
    assert main(["parse", str(path)]) == 0
    out = capsys.readouterr().out
    assert "max_model_len 131,072, needs 16.00 GiB, available 727.04 MiB, fits 5,632" in out


def test_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(V1_POOL.read_bytes())))
    assert main(["parse", "-", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(V1_POOL.with_suffix(".summary.json").read_text())


def test_forced_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parse", str(V1_POOL), "--engine", "sglang", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"no KV-cache lines in {V1_POOL} for --engine sglang" in err


def test_empty_log_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "empty.log"
    log.write_text("nothing about the KV cache\n")
    for form in ((), ("--json",), ("--events",)):
        # As explain: nothing found is one line on stderr and exit 2, whatever the output form.
        assert main(["parse", str(log), *form]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith(f"kvwatch parse: error: no KV-cache lines in {log} (") and err.count("\n") == 1


def test_missing_file_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parse", "/nonexistent/x.log"]) == 2
    err = capsys.readouterr().err
    assert err == "kvwatch parse: error: no such log file: /nonexistent/x.log\n"


def test_directory_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["parse", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"kvwatch parse: error: {tmp_path} is a directory, not a log file\n"


def test_json_and_events_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["parse", str(V1_POOL), "--json", "--events"])
    assert exc.value.code == 2


def test_progress_bar_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "big.log"
    log.write_text('INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n' * 40000 + V1_POOL.read_text())
    monkeypatch.setattr(parse_cmd, "PROGRESS_MIN_BYTES", 1024)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["parse", str(log), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["instances"][0]["kv_pool_tokens"] == 623873
    assert "big.log [" in captured.err
    assert "100%" in captured.err
    assert captured.err.endswith("\n")


def test_no_progress_bar_when_not_a_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parse_cmd, "PROGRESS_MIN_BYTES", 1)
    assert main(["parse", str(V1_POOL)]) == 0
    assert capsys.readouterr().err == ""


def test_console_script() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvwatch", "parse", str(V1_POOL), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout)["instances"][0]["max_concurrency"] == 2.38
