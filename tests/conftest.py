"""Shared pytest options and fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).parent
LOG_SAMPLES = TESTS / "log_samples"
MODEL_CONFIGS = TESTS / "model_configs"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite golden files from the tool's current output (review the diff before committing)",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


def _tool(name: str, package: str = "prometheus") -> str:
    """Path of a Debian package's binary; in CI a missing one fails, elsewhere it skips."""
    import os
    import shutil

    path = shutil.which(name)
    if path is None:
        message = f"{name} not found (Debian package {package!r}; `make tools` installs it as root)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    """Path to promtool."""
    return _tool("promtool")


@pytest.fixture(scope="session")
def prometheus_server() -> str:
    """Path to the Prometheus server binary."""
    return _tool("prometheus")


@pytest.fixture(scope="session")
def amtool() -> str:
    """Path to amtool."""
    return _tool("amtool", "prometheus-alertmanager")


@pytest.fixture(scope="session")
def alertmanager_server() -> str:
    """Path to the Alertmanager server binary (Debian installs it as prometheus-alertmanager)."""
    import shutil

    if shutil.which("alertmanager"):
        return _tool("alertmanager", "prometheus-alertmanager")
    return _tool("prometheus-alertmanager", "prometheus-alertmanager")
