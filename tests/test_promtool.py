"""promtool checks of the shipped rules: `promtool check rules` on rules/*.yaml and
`promtool test rules` on tests/rules/*_test.yaml (every alert: a case that fires, one that must not),
plus `promtool check config` on the compose stack's Prometheus configuration.

promtool comes from the `promtool` fixture (conftest.py): missing fails in CI, skips elsewhere.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
RULE_FILES = sorted((ROOT / "rules").glob("*.yaml"))
RULE_TESTS = sorted((ROOT / "tests" / "rules").glob("*_test.yaml"))

pytestmark = pytest.mark.integration


def _promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, check=False)


def test_there_are_rules_and_rule_tests() -> None:
    assert [p.name for p in RULE_FILES] == ["kvwatch.alerts.yaml", "kvwatch.rules.yaml"]
    assert RULE_TESTS


def test_promtool_check_rules(promtool: str) -> None:
    result = _promtool(promtool, "check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", RULE_TESTS, ids=[p.name for p in RULE_TESTS])
def test_promtool_test_rules(promtool: str, test_file: Path) -> None:
    result = _promtool(promtool, "test", "rules", str(test_file))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules_fails_when_an_alert_threshold_moves(promtool: str, tmp_path: Path) -> None:
    """The unit tests pin behaviour: the same tests against a loosened alert must fail."""
    (tmp_path / "rules").mkdir()
    (tmp_path / "tests" / "rules").mkdir(parents=True)
    for path in RULE_FILES:
        text = path.read_text(encoding="utf-8")
        if path.name == "kvwatch.alerts.yaml":
            assert "kvwatch_kv_usage_ratio > 0.95" in text
            text = text.replace("kvwatch_kv_usage_ratio > 0.95", "kvwatch_kv_usage_ratio > 0.99")
        (tmp_path / "rules" / path.name).write_text(text, encoding="utf-8")
    test_copy = tmp_path / "tests" / "rules" / "alerts_test.yaml"
    test_copy.write_text((ROOT / "tests" / "rules" / "kvwatch_alerts_test.yaml").read_text(encoding="utf-8"))
    result = _promtool(promtool, "test", "rules", str(test_copy))
    assert result.returncode != 0
    assert "KVCacheNearlyFull" in result.stdout + result.stderr


def test_promtool_check_config_of_the_compose_prometheus(promtool: str, tmp_path: Path) -> None:
    """The compose Prometheus config, with its in-container rule path pointed at rules/."""
    config = yaml.safe_load((ROOT / "deploy" / "compose" / "prometheus" / "prometheus.yml").read_text())
    config["rule_files"] = [str(ROOT / "rules" / "*.yaml")]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    result = _promtool(promtool, "check", "config", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr
