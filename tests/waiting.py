"""Bounded waits for tests that start servers and processes: poll a condition, stop a process."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any


def wait_until(check: Callable[[], object], timeout: float = 15.0, poll: float = 0.05) -> None:
    """Return once ``check()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(poll)
    raise AssertionError("condition not met in time")


def stop(proc: subprocess.Popen[Any]) -> None:
    """Terminate a process started by a test, killing it if it does not exit within 15 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
