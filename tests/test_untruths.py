"""The smaller untruths of issue 21: what --help promises is what the command does; a typo is one
line and exit 2, never silence; a failing scrape is in the log; another model's config is said."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from waiting import wait_until

from kvwatch.cli import main
from kvwatch.sidecar.sources import SCRAPE_WARN_INTERVAL, ScrapeSource
from kvwatch.sources.metrics_reader import MetricsReader
from kvwatch.sources.scrape import Scraper

TESTS = Path(__file__).parent
CONFIGS = TESTS / "model_configs"
LLAMA = CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json"
DEMO = TESTS.parent / "kvwatch" / "data" / "demo"


def _one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and needle in err, err


def test_predict_without_a_card_lists_the_ignored_engine_flags(capsys: pytest.CaptureFixture[str]) -> None:
    # --help: "flags kvwatch does not model are listed as ignored" -- with or without --gpu.
    assert main(["predict", str(LLAMA), "--", "--max-num-seqs", "12", "--served-model-name", "x"]) == 0
    out = capsys.readouterr().out
    assert "no card given" in out
    assert "engine flags kvwatch does not model, ignored: --served-model-name x" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", str(LLAMA), "--gpu", "H100", "--", "--max-num-seqs", "12", "--json"],
        ["predict", str(LLAMA), "--", "--gpu", "H100"],
        ["plan", str(LLAMA), "--workload", "4x8192", "--gpu", "H100", "--", "--json"],
    ],
)
def test_kvwatch_flags_after_the_dash_dash_are_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    flag = argv[-1] if argv[-1].startswith("--") else argv[-2]
    _one_line_exit_2(capsys, argv, f"{flag} after '--' is read as a vllm flag")


def test_engine_flags_that_kvwatch_also_has_are_still_the_engines(capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM's own --max-model-len after `--` is an engine flag (it wins), not a misplaced kvwatch one.
    assert main(["predict", str(LLAMA), "--gpu", "H100", "--", "--max-model-len", "4096"]) == 0
    assert "at 4,096 tokens" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("notaurl", "names no port and its host 'notaurl' no domain"),
        ("http://", "no host in 'http://'"),
        ("vllm:99999", "not a URL: 'vllm:99999'"),
        ("ftp://x:1/metrics", "not an http(s) URL"),
    ],
)
def test_a_metrics_url_no_scrape_can_reach_is_refused_at_start(
    url: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _one_line_exit_2(capsys, ["run", "--metrics-url", url, "--listen", "127.0.0.1:0"], needle)


def test_urls_users_give_are_kept(capsys: pytest.CaptureFixture[str]) -> None:
    from kvwatch.sidecar.config import Settings

    for url in ("vllm:8000", "localhost", "10.0.0.1", "vllm.ns.svc", "http://[::1]:8000/metrics"):
        assert Settings.model_validate({"metrics_url": [url]}).metrics_url


def test_scrape_failures_are_logged_at_a_bounded_pace(caplog: pytest.LogCaptureFixture) -> None:
    src = ScrapeSource("engine", Scraper("http://127.0.0.1:9/metrics"), MetricsReader())
    now = 1000.0
    with caplog.at_level(logging.INFO, logger="kvwatch"):
        for _ in range(10):  # one failure per second
            src.log_failure("connection", "ConnectionRefusedError", now)
            now += 1.0
        now += SCRAPE_WARN_INTERVAL
        src.log_failure("connection", "ConnectionRefusedError", now)
        src.log_recovery()
        src.log_recovery()  # (said once)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("scrape failed source=engine url=http://127.0.0.1:9/metrics reason=connection")
    assert lines[1].endswith("(9 more failures since the last warning)")
    assert lines[2] == "scrape recovered source=engine url=http://127.0.0.1:9/metrics"


def test_the_sidecar_logs_a_failing_scrape() -> None:
    """Through the consumer: a --metrics-url that refuses connections is in the log at once."""
    cmd = [sys.executable, "-m", "kvwatch", "run", "--metrics-url", "127.0.0.1:9", "--listen", "127.0.0.1:0"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: seen.extend(proc.stderr or ()), daemon=True)
    reader.start()
    want = "scrape failed source=127.0.0.1:9 url=http://127.0.0.1:9/metrics reason=connection"
    try:
        wait_until(lambda: any(want in line for line in seen), timeout=30)
    finally:
        proc.kill()
        proc.wait(10)
        reader.join(10)
        proc.stderr.close()


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (
            "Qwen--Qwen2.5-7B.json",
            "the engine's pool holds 56% fewer tokens than this config's bytes per token",
        ),
        ("meta-llama--Meta-Llama-3.1-70B.json", "the config is meta-llama/Meta-Llama-3.1-70B"),
    ],
)
def test_explain_says_when_the_config_is_another_models(
    config: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", str(DEMO / "vllm.log"), "--model-config", str(CONFIGS / config)]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "model mismatch?" in line]
    assert len(notes) == 1 and needle in notes[0], notes
    assert "the log serves meta-llama/Llama-3.1-8B-Instruct" in notes[0]


def test_explain_names_no_mismatch_for_the_base_models_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(DEMO / "vllm.log"), "--model-config", str(LLAMA)]) == 0
    assert "mismatch" not in capsys.readouterr().out


def test_a_gap_within_the_printed_rounding_is_said_to_be_rounding(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's vLLM start is predicted to +8.48 MiB; its seven printed terms are each rounded to
    0.01 GiB, so nothing is 'mainly' to blame (the issue saw '+805 MiB (6103%)' here)."""
    assert main(["explain", str(DEMO / "vllm.log"), "--model-config", str(LLAMA)]) == 0
    out = capsys.readouterr().out
    assert "observed - predicted = +8.48 MiB (+0.0% of the prediction)" in out
    assert "mainly: the rounding of the printed figures (0.01 GiB each, 35.84 MiB at most)" in out
    assert "graphs" not in out.split("why the KV budget differs")[1].split("levers")[0]
