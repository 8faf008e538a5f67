"""Streams are streams: every command that reads ``-`` (and a FIFO named as a file) works on input
that cannot seek: a pipe, a FIFO, a socket. ``cat LOG | kvwatch parse -`` prints what
``kvwatch parse LOG`` prints, on every bundled sample.
"""

from __future__ import annotations

import io
import os
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kvwatch.cli import main

TESTS = Path(__file__).parent
ROOT = TESTS.parent
DEMO = ROOT / "kvwatch" / "data" / "demo"
SAMPLES = sorted((TESTS / "log_samples").glob("*/*.log")) + sorted(DEMO.glob("*.log"))
VLLM_CONFIG = DEMO / "models" / "meta-llama--Meta-Llama-3.1-8B.json"
KVWATCH = [sys.executable, "-m", "kvwatch"]
TIMEOUT = 60


def _writer(fd: int, data: bytes) -> threading.Thread:
    """Write ``data`` to ``fd`` and close it, from a thread (a pipe holds less than a log)."""

    def write() -> None:
        with open(fd, "wb", closefd=True) as out:
            out.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


@contextmanager
def _stdin_from_pipe(monkeypatch: pytest.MonkeyPatch, data: bytes) -> Iterator[None]:
    r, w = os.pipe()
    thread = _writer(w, data)
    with open(r, "rb", closefd=True) as raw:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(raw))
        yield
    thread.join(TIMEOUT)


def test_samples_found() -> None:
    assert len(SAMPLES) >= 40


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_parse_from_a_pipe_equals_parse_of_the_file(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for form in ((), ("--json",), ("--events",)):
        rc = main(["parse", str(path), *form])
        want = capsys.readouterr()
        with _stdin_from_pipe(monkeypatch, path.read_bytes()):
            assert main(["parse", "-", *form]) == rc
        got = capsys.readouterr()
        # The source is named 'stdin' instead of the file; nothing else differs.
        assert got.out == want.out.replace(str(path), "stdin"), form
        assert got.err == want.err.replace(str(path), "stdin")


def _run(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


@pytest.mark.integration
def test_cat_into_parse_and_explain_through_a_shell_pipe() -> None:
    log = DEMO / "vllm.log"
    kv = " ".join(shlex.quote(a) for a in KVWATCH)
    piped = _run(f"cat {shlex.quote(str(log))} | {kv} parse -")
    direct = _run(f"{kv} parse {shlex.quote(str(log))}")
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == direct.stdout
    explained = _run(
        f"cat {shlex.quote(str(log))} | {kv} explain - --model-config {shlex.quote(str(VLLM_CONFIG))}"
    )
    assert explained.returncode == 0, explained.stderr
    assert "KV pool tokens: observed 476,000" in explained.stdout


@pytest.mark.integration
def test_a_fifo_named_as_the_log(tmp_path: Path) -> None:
    log = DEMO / "sglang.log"
    fifo = tmp_path / "engine.fifo"
    for command in ("parse", "explain"):
        os.mkfifo(fifo)
        proc = subprocess.Popen(
            [*KVWATCH, command, str(fifo), "--json"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        with open(fifo, "wb") as out:  # (blocks until kvwatch opens it)
            out.write(log.read_bytes())
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, stderr
        want = subprocess.run(
            [*KVWATCH, command, str(log), "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert stdout == want.stdout.replace(str(log), str(fifo))
        fifo.unlink()


def test_a_socket_as_stdin() -> None:
    log = DEMO / "vllm.log"
    ours, theirs = socket.socketpair()
    with ours, theirs:
        proc = subprocess.Popen(
            [*KVWATCH, "parse", "-", "--json"],
            cwd=ROOT,
            stdin=theirs.fileno(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        theirs.close()
        ours.sendall(log.read_bytes())
        ours.shutdown(socket.SHUT_WR)
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, stderr
    want = subprocess.run(
        [*KVWATCH, "parse", str(log), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert stdout == want.stdout.replace(str(log), "stdin")


def test_stdin_given_twice_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("parse", "explain"):
        assert main([command, "-", "-"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "'-' (stdin) can be given once" in err
