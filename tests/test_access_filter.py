"""Replay's first stage in a helper process (kvwatch/sources/access.py): the same replay as the serial
reading, its failures loud, its child never left behind."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gen_busy_log
from kvwatch.cli import main
from kvwatch.core.events import event_to_json
from kvwatch.sources import access
from kvwatch.sources.pipeline import replay

SAMPLES = Path(__file__).parent / "log_samples"


def _replayed(
    paths: list[str], parallel: bool
) -> tuple[str, list[str], list[tuple[int, int, int, int]], list[int]]:
    events: list[str] = []
    done: list[int] = []
    result = replay(
        paths,
        on_events=lambda evs: events.extend(event_to_json(e) for e in evs),
        progress=lambda _source, read, _total: done.append(read),
        parallel=parallel,
    )
    counters = [(p.lines_read, p.lines_matched, p.parse_errors, p.lines_truncated) for p in result.pipelines]
    return repr(result.snapshots()), events, counters, done


@pytest.fixture(scope="module")
def busy_logs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Busy logs of three shapes, each several read blocks long (built by the replay benchmark's
    generator from the real samples)."""
    out = tmp_path_factory.mktemp("busy")
    paths = []
    for shape in ("docker-v0-v1", "ray-dp", "sglang"):
        path = out / f"{shape}.log"
        gen_busy_log.generate(path, 40_000, shape=shape)
        paths.append(path)
    return paths


def test_helper_process_replays_what_this_process_does(busy_logs: list[Path]) -> None:
    for path in busy_logs:
        serial = _replayed([str(path)], parallel=False)
        helped = _replayed([str(path)], parallel=True)
        assert helped == serial
        assert helped[3][-1] == path.stat().st_size
        assert helped[2][0][0] == path.read_bytes().count(b"\n")


@pytest.mark.integration
def test_helper_process_on_every_sample() -> None:
    paths = sorted(str(p) for p in SAMPLES.glob("*/*.log"))
    assert len(paths) > 30
    for path in paths:
        assert _replayed([path], parallel=True) == _replayed([path], parallel=False), path


def test_large_files_choose_the_helper_and_streams_without_a_file_never(
    busy_logs: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    used: list[str] = []
    real = access._from_child

    def spy(fd: int, start: int, path: str, max_line_chars: int) -> object:
        used.append(path)
        return real(fd, start, path, max_line_chars)

    monkeypatch.setattr(access, "_from_child", spy)
    monkeypatch.setattr(access, "usable_cpus", lambda: 2)
    monkeypatch.setattr(access, "PARALLEL_MIN_BYTES", busy_logs[0].stat().st_size)
    replay([str(p) for p in busy_logs])
    assert used == [str(busy_logs[0])]  # the one file as large as the threshold

    monkeypatch.setattr(access, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(busy_logs[1].read_bytes())))
    used.clear()
    assert replay(["-"]).pipelines[0].lines_read == busy_logs[1].read_bytes().count(b"\n")
    assert used == []

    monkeypatch.setattr(access, "usable_cpus", lambda: 1)
    replay([str(busy_logs[0])])
    assert used == []


# A helper that sends one empty frame (no survivors, nothing dropped, 0 bytes read), then dies.
_ONE_FRAME_THEN_DIE = (
    "import struct, sys; sys.stdout.buffer.write(struct.pack('<QQQ', 0, 0, 0)); sys.stdout.flush(); "
    "sys.stderr.write('killed\\n'); sys.exit(3)"
)


def test_a_child_that_breaks_off_is_one_line_and_exit_2(
    busy_logs: list[Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        access, "_child_argv", lambda fd, start, n: [sys.executable, "-c", _ONE_FRAME_THEN_DIE]
    )
    with pytest.raises(OSError, match=r"filter process broke off \(exit 3: killed\)"):
        replay([str(busy_logs[0])], parallel=True)
    monkeypatch.setattr(access, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(access, "usable_cpus", lambda: 2)
    assert main(["parse", str(busy_logs[0])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "filter process broke off" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, "-c", "import sys; sys.exit(3)"],  # dies before its first frame
        ["/nonexistent/python3"],  # cannot start
    ],
)
def test_a_helper_that_gives_nothing_leaves_the_reading_here(
    busy_logs: list[Path], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    want = _replayed([str(busy_logs[1])], parallel=False)
    monkeypatch.setattr(access, "_child_argv", lambda fd, start, n: argv)
    assert _replayed([str(busy_logs[1])], parallel=True) == want


def test_the_helper_reads_the_open_file_not_the_name(busy_logs: list[Path], tmp_path: Path) -> None:
    """The file renamed, and another put in its place, after it was opened: the opened one is read."""
    path = tmp_path / "moved.log"
    path.write_bytes(busy_logs[0].read_bytes())
    with path.open("rb") as stream:
        path.rename(tmp_path / "elsewhere.log")
        path.write_bytes(b"")
        got = sum(
            dropped for _, dropped, _ in access.filtered_blocks(str(path), stream, 65536, parallel=True)
        )
    assert got == sum(b"HTTP/" in line for line in busy_logs[0].read_bytes().splitlines())


def test_a_reader_that_stops_early_leaves_no_child(
    busy_logs: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    children: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def spy(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        children.append(popen(*args, **kwargs))  # type: ignore[call-overload]
        return children[-1]

    monkeypatch.setattr(subprocess, "Popen", spy)
    with busy_logs[0].open("rb") as stream:
        blocks = access.filtered_blocks(str(busy_logs[0]), stream, 65536, parallel=True)
        assert next(blocks)[2] > 0
        blocks.close()
    (child,) = children
    assert child.returncode is not None  # killed and reaped


def test_drop_access_lines_counts_what_it_drops() -> None:
    lines = [b"INFO x", b'1.2.3.4:5 - "GET /metrics HTTP/1.1" 200 OK'] * 7 + [b"", b"HTTP/", b"last"]
    block = b"".join(b"\n" + line for line in lines)
    rest, dropped = access.drop_access_lines(block)
    assert dropped == sum(b"HTTP/" in line for line in lines) == 8
    assert rest.split(b"\n")[1:] == [line for line in lines if b"HTTP/" not in line]


def _blocks(stream: object, parallel: bool) -> list[tuple[bytes, int, int]]:
    return list(access.filtered_blocks("log", stream, 65536, parallel=parallel))  # type: ignore[arg-type]


def test_the_helper_starts_where_the_stream_stands(busy_logs: list[Path]) -> None:
    """A stream already read from (and buffered ahead): both ways go on from its position."""
    got = {}
    for parallel in (False, True):
        with busy_logs[0].open("rb") as stream:
            stream.readline()
            got[parallel] = _blocks(stream, parallel)
    assert got[True] == got[False]
    assert sum(d for _, d, _ in got[True]) == busy_logs[0].read_bytes().count(b"HTTP/")


# A helper that moves the shared offset (a plain read of 1 MiB), then dies before its first frame.
_READ_THEN_DIE = "import os, sys; os.read(int(sys.argv[1]), 1 << 20); sys.exit(3)"


def test_the_reading_falls_back_where_the_stream_stood(
    busy_logs: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    with busy_logs[0].open("rb") as stream:
        stream.readline()
        want = _blocks(stream, parallel=False)
    monkeypatch.setattr(
        access, "_child_argv", lambda fd, start, n: [sys.executable, "-c", _READ_THEN_DIE, str(fd)]
    )
    with busy_logs[0].open("rb") as stream:
        stream.readline()
        assert _blocks(stream, parallel=True) == want


def test_stdin_redirected_from_a_large_file(busy_logs: list[Path]) -> None:
    """'kvwatch parse - < big.log': the file is the parent's fd 0, which the helper's own stdin takes."""
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    code = (
        "import sys; from kvwatch.sources import access; access.PARALLEL_MIN_BYTES = 0; "
        "access.usable_cpus = lambda: 2; from kvwatch.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    out = {}
    for extra in ([], ["--serial"]):
        with busy_logs[0].open("rb") as stdin:
            done = subprocess.run(
                [sys.executable, "-c", code, "parse", "--json", "-", *extra],
                stdin=stdin,
                capture_output=True,
                text=True,
                env=env,
                cwd=Path(__file__).parent.parent,
                check=False,
            )
        assert done.returncode == 0, done.stderr
        out[bool(extra)] = done.stdout
    assert out[True] == out[False]
    assert '"engine": "vllm"' in out[True]


def test_events_into_a_reader_that_stops_early(busy_logs: list[Path]) -> None:
    """'kvwatch parse --events LOG | head -1': quiet, exit 0 (the pipe closing is not a read error)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "parse", "--events", str(busy_logs[0])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).parent.parent,
    )
    assert proc.stdout is not None and proc.stderr is not None
    with proc.stderr:
        assert proc.stdout.readline().startswith(b"{")
        proc.stdout.close()
        assert proc.wait(timeout=60) == 0
        assert proc.stderr.read() == b""
