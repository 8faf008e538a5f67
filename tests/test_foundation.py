"""The package's own plumbing: units, CLI error handling, metric-name module."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvwatch import names
from kvwatch.errors import ConfigError
from kvwatch.units import GiB, MiB, parse_size


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

    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    assert names.markdown_table() in readme
