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
