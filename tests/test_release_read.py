"""``--release-read``: the sidecar's shared log file gives back what kvwatch read and saved, so a file
nothing rotates streams through a size-limited volume with no line lost (kvwatch/sources/release.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

from kvwatch.sidecar.app import Sidecar
from kvwatch.sources.files import FilePosition
from kvwatch.sources.logfile import LogTailer

DEMO = Path(__file__).resolve().parent.parent / "kvwatch" / "data" / "demo"
VLLM_STARTUP = (DEMO / "vllm.log").read_text(encoding="utf-8").splitlines()[:745]
LIMIT = 64 << 20  # the volume's size
TOTAL = 1 << 30  # what streams through it


@contextlib.contextmanager
def _volume(path: Path) -> Iterator[bool]:
    """A 64 MiB tmpfs at ``path`` when this process may mount one (root: CI), else a plain folder
    whose usage the test measures itself; yields whether the limit is the kernel's."""
    path.mkdir()
    mounted = False
    if os.geteuid() == 0:
        mounted = (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={LIMIT}", "tmpfs", str(path)], capture_output=True
            ).returncode
            == 0
        )
    if not mounted and os.environ.get("CI") == "true" and os.geteuid() == 0:
        pytest.fail("CI runs as root and must be able to mount a 64 MiB tmpfs for this test")
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def _stats(running: int) -> str:
    return (
        "(APIServer pid=1) INFO 04-22 00:08:00 [v1/metrics/loggers.py:259] Engine 000: Avg prompt throughput: "
        f"0.0 tokens/s, Avg generation throughput: 10.0 tokens/s, Running: {running} reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 1.0%, Prefix cache hit rate: 0.0%"
    )


def _write_all(fd: int, data: bytes, deadline: float, on_full: Callable[[], object]) -> int:
    """tee's write, except that a full volume is waited out (counted) rather than a lost line."""
    view, stalls = memoryview(data), 0
    while view:
        try:
            view = view[os.write(fd, view) :]
        except OSError as exc:
            if exc.errno != errno.ENOSPC or time.monotonic() > deadline:
                raise
            stalls += 1
            on_full()
            time.sleep(0.05)
    return stalls


def _scrape(car: Sidecar) -> dict[str, float]:
    with urllib.request.urlopen(car.url, timeout=10) as resp:
        text = resp.read().decode()
    return {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name in ("kvwatch_lines_read_total", "kvwatch_requests_running", "kvwatch_kv_pool_tokens")
    }


@pytest.mark.integration
def test_a_gib_streams_through_a_64_mib_volume_with_no_line_lost(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar]
) -> None:
    with _volume(tmp_path / "logs") as kernel_limit:
        log = tmp_path / "logs" / "vllm.log"
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = len(VLLM_STARTUP)
            os.write(fd, ("\n".join(VLLM_STARTUP) + "\n").encode())
            car = sidecar_factory(log=f"engine={log}", state_dir=str(tmp_path / "state"), release_read=True)
            filler = (
                "(APIServer pid=1) DEBUG 04-22 00:08:01 [engine/output.py:1] " + "x" * 16_300 + "\n"
            ).encode()
            deadline, stalls, peak, sent, running = time.monotonic() + 240, 0, 0, 0, 0
            while sent < TOTAL:
                block = []
                for _ in range(63):
                    block.append(filler)
                running += 1
                block.append((_stats(running) + "\n").encode())
                data = b"".join(block)
                # A full volume: Prometheus' next scrape makes kvwatch read (and then give back)
                # what was appended, as it does every scrape interval in a pod.
                stalls += _write_all(fd, data, deadline, lambda: _scrape(car))
                sent += len(data)
                written += len(block)
                peak = max(peak, os.fstat(fd).st_blocks * 512)
                assert kernel_limit or peak <= LIMIT, f"the log holds {peak} bytes on disk"
        finally:
            os.close(fd)

        wait_until(lambda: _scrape(car).get("kvwatch_lines_read_total") == written, timeout=60)
        m = _scrape(car)
        assert m["kvwatch_requests_running"] == running  # the last stats line, after 1 GiB
        assert m["kvwatch_kv_pool_tokens"] == 476_000  # the startup block, read before it was given back
        st = os.stat(log)
        assert st.st_size >= TOTAL  # the file kept its size and offsets ...
        assert st.st_blocks * 512 <= LIMIT  # ... while its read part went back to the volume
        print(
            f"release-read: {sent / 2**20:.0f} MiB through {LIMIT >> 20} MiB, peak {peak >> 20} MiB, stalls {stalls}"
        )


def test_a_tailer_resumes_after_the_bytes_it_gave_back(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    first = [f"line {i} " + "y" * 200 for i in range(100)]
    log.write_text("".join(f"{line}\n" for line in first))
    got: list[str] = []
    tailer = LogTailer(str(log), lambda path, line: got.append(line), recheck_interval=0.05)
    tailer.start()
    try:
        wait_until(lambda: len(got) == len(first))
        saved = tailer.positions()
        assert tailer.release(saved) > 0
        assert os.stat(log).st_blocks * 512 < os.stat(log).st_size
        with log.open("a") as f:
            f.write("after release\n")
        wait_until(lambda: got[-1:] == ["after release"])
        saved = tailer.positions()
    finally:
        tailer.stop()
    assert got == [*first, "after release"]
    # A new kvwatch resumes at the saved position (its fingerprint was never given back).
    with log.open("a") as f:
        f.write("while down\n")
    again: list[str] = []
    resume = {p: FilePosition.from_dict(pos.to_dict()) for p, pos in saved.items()}
    second = LogTailer(str(log), lambda path, line: again.append(line), recheck_interval=0.05, resume=resume)
    second.start()
    try:
        wait_until(lambda: again == ["while down"])
        time.sleep(0.3)
        assert again == ["while down"]
    finally:
        second.stop()


def test_release_read_needs_a_state_dir(tmp_path: Path) -> None:
    from kvwatch.core.errors import ConfigError
    from kvwatch.sidecar.config import load_settings

    with pytest.raises(ConfigError, match="needs --state-dir"):
        load_settings({"log": [str(tmp_path / "x.log")], "release_read": True}, environ={})
