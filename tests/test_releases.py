"""Each engine's release rules: one table (kvwatch/engines/<engine>/releases.py) whose rows cite the
engine's source, run in release order inside the releases kvwatch knows, and are the only place a
release is compared (docs/architecture.md, "Recipe: a new engine release's rule")."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

from kvwatch.core.kinds import ENGINE_NAMES
from kvwatch.core.versions import Rule, Side, version_tuple
from kvwatch.engines import registry

ENGINES_DIR = Path(__file__).parent.parent / "kvwatch" / "engines"
# A source names the file it was read from: a path ending in .py (a line number where one was read).
SOURCE = re.compile(r"[\w/]+\.py\b")
# An inline comparison of a release tuple: `v < (0, 20)`, `(0, 29) <= v[:2]`.
TUPLE_COMPARISON = re.compile(r"(?:[<>]=?|==)\s*\(\d+, \d+|\(\d+, \d+(?:, \d+)?\)\s*(?:[<>]=?|==)")


def releases(engine: str) -> ModuleType:
    return importlib.import_module(f"kvwatch.engines.{engine}.releases")


def rows() -> list[tuple[str, Rule[object]]]:
    return [(engine, rule) for engine in ENGINE_NAMES for rule in releases(engine).RULES]


@pytest.mark.parametrize(("engine", "rule"), rows(), ids=lambda x: x if isinstance(x, str) else x.name)
def test_every_rule_cites_its_source_and_runs_in_release_order(engine: str, rule: Rule[object]) -> None:
    oldest, newest = (version_tuple(v) for v in registry.get(engine).known_versions)
    assert oldest is not None and newest is not None
    assert re.fullmatch(r"[a-z][a-z0-9_]*", rule.name)
    assert rule.meaning.strip() and "\n" not in rule.meaning
    assert len(rule.sides) >= 2, "a rule is what one release does differently: two sides at least"
    assert rule.sides[0].since is None, "the first side holds for every release before the next"
    starts = []
    for side in rule.sides:
        assert SOURCE.search(side.source), f"{rule.name}: side {side.since} names no source file"
        if side.since is not None:
            start = version_tuple(side.since)
            assert start is not None, f"{rule.name}: since {side.since!r} is not a release"
            assert oldest <= start <= newest, f"{rule.name}: {side.since} is outside known_versions"
            starts.append(start)
    assert starts == sorted(starts) and len(set(starts)) == len(starts), f"{rule.name}: sides out of order"
    values = [side.value for side in rule.sides]
    assert all(a != b for a, b in zip(values, values[1:], strict=False)), (
        f"{rule.name}: a side changes nothing"
    )


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_the_table_lists_every_rule_of_its_module_once(engine: str) -> None:
    module = releases(engine)
    declared = [value for value in vars(module).values() if isinstance(value, Rule)]
    assert sorted(r.name for r in module.RULES) == sorted(r.name for r in declared)
    assert len({r.name for r in module.RULES}) == len(module.RULES)


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_no_engine_module_compares_a_release_outside_its_table(engine: str) -> None:
    """A rule inline (`v is None or v >= (0, N)`) is a rule no table lists and no test of the table
    sees: it belongs in releases.py."""
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in sorted((ENGINES_DIR / engine).glob("*.py"))
        if path.name != "releases.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if TUPLE_COMPARISON.search(line.split("#")[0])
    ]
    assert not found


RULE = Rule(
    "example",
    "a value that changes at 0.20 and back at 0.28",
    Side(None, "old", "a.py:1"),
    Side("0.20", "mid", "a.py:2"),
    Side("0.28.1", "new", "a.py:3"),
)


@pytest.mark.parametrize(
    ("version", "value"),
    [
        (None, "new"),  # no release given or printed: the newest
        ("", "new"),
        ("not a release", "new"),
        ("0.3", "old"),
        ("0.19.9", "old"),
        ("0.20", "mid"),
        ("0.20.0rc1", "mid"),
        ("v0.28.0+cu130", "mid"),
        ("0.28.1", "new"),
        ("0.40", "new"),  # newer than the newest side: the newest
        ((0, 20, 3), "mid"),
    ],
)
def test_a_rule_is_the_last_side_at_or_before_the_release(
    version: str | tuple[int, ...] | None, value: str
) -> None:
    assert RULE.at(version) == value
