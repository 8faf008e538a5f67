"""The package's own plumbing: units, CLI error handling, metric-name module."""

from __future__ import annotations

import select
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.core.errors import ConfigError
from kvwatch.core.units import GiB, MiB, parse_size
from kvwatch.export import names


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("52.31566GiB", int(52.31566 * GiB)),
        ("80GB", 80 * 10**9),
        ("81559MiB", 81559 * MiB),
        ("1234", 1234),
        ("1.5 KiB", 1536),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-5GB", "0", "12XB"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_size(text)


def test_metric_names_unique_and_prefixed() -> None:
    seen = [m.sample_name for m in names.METRICS]
    assert len(seen) == len(set(seen))
    assert all(n.startswith("kvwatch_") for n in seen)
    assert all(not m.name.endswith("_total") for m in names.METRICS)


def test_python_m_kvwatch_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvwatch", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("kvwatch ")


def test_parse_size_zero_only_when_allowed() -> None:
    assert parse_size("0GiB", allow_zero=True) == 0
    with pytest.raises(ConfigError):
        parse_size("0GiB")


def test_readme_metric_table_is_generated_from_names() -> None:
    from pathlib import Path

    root = Path(__file__).parent.parent
    for doc in ("README.md", "docs/sidecar.md"):
        assert names.markdown_table() in (root / doc).read_text(encoding="utf-8"), doc


def _sidecar_cmdline(log: Path, env: dict[str, str]) -> list[str]:
    """Start `python -m kvwatch run`, wait until it serves, return its /proc cmdline, stop it."""
    with subprocess.Popen(
        [sys.executable, "-m", "kvwatch", "run", "--log", str(log), "--listen", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        try:
            assert proc.stderr is not None
            # Bounded: a sidecar that never says it serves fails the test, never hangs it.
            ready, _, _ = select.select([proc.stderr], [], [], 60)
            assert ready, "kvwatch run said nothing on stderr within 60 s"
            assert "serving" in proc.stderr.readline()  # started, signal handlers installed
            return Path(f"/proc/{proc.pid}/cmdline").read_text().split("\0")
        finally:
            proc.terminate()
            assert proc.wait(timeout=15) == 0


@pytest.mark.integration
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_sidecar_restarts_itself_without_docstrings(tmp_path: Path) -> None:
    """`kvwatch run` from the command line re-executes as `python -OO` (same PID) to save memory."""
    import os

    log = tmp_path / "engine.log"
    log.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "KVWATCH_KEEP_DOCSTRINGS"}
    assert _sidecar_cmdline(log, env)[1:5] == ["-OO", "-m", "kvwatch", "run"]
    assert "-OO" not in _sidecar_cmdline(log, dict(env, KVWATCH_KEEP_DOCSTRINGS="1"))
