"""Shared pytest options and fixtures."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser

    from kvwatch.sidecar.app import Sidecar

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
def mtail() -> str:
    """Debian's mtail, the replay benchmark's peer (bench/kvwatch.mtail)."""
    return _tool("mtail", "mtail")


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


@pytest.fixture(scope="session")
def chromium() -> str:
    """Path to Debian's chromium (for the status page's browser tests)."""
    return _tool("chromium", "chromium")


@pytest.fixture(scope="session")
def browser(chromium: str) -> Iterator[Browser]:
    """Debian's chromium driven by Playwright (never a browser Playwright downloads); in CI a
    missing Playwright fails like a missing tool, elsewhere it skips."""
    import os

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        message = "playwright not installed (pip install -e '.[test]')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    with sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=chromium)
        yield launched
        launched.close()


@pytest.fixture
def sidecar_factory(tmp_path: Path) -> Iterator[Callable[..., Sidecar]]:
    """Start in-process sidecars from ``kvwatch run`` flags (listening on a free 127.0.0.1 port,
    HOME in tmp_path); every one started is stopped after the test."""
    from kvwatch.sidecar.app import Sidecar
    from kvwatch.sidecar.config import load_settings

    started: list[Sidecar] = []

    def make(**flags: object) -> Sidecar:
        flags.setdefault("listen", "127.0.0.1:0")
        car = Sidecar(load_settings(flags, environ={}), environ={"HOME": str(tmp_path)})
        car.start()
        started.append(car)
        return car

    yield make
    for car in started:
        car.stop()


@pytest.fixture(autouse=True)
def _fresh_unexported_tally(monkeypatch: pytest.MonkeyPatch) -> None:
    """kvwatch_values_unexported_total counts for the whole process (one sidecar is one process);
    each test starts from zero, so a hostile-state test that trips it does not leak into the
    /metrics goldens that run after it."""
    from kvwatch.export import collector

    monkeypatch.setattr(collector, "_unexported", collector._Tally())
