"""Golden files: every real log sample replayed through the pipeline, events and summary compared.

The goldens (``<stem>.events.jsonl``: one event per line; ``<stem>.summary.json``: the
``kvwatch parse --json`` object) are written by the tool with ``pytest --update-golden`` and
reviewed as diffs; they are never hand-edited. Samples of every engine are included; the facts a
human read from each sample are checked separately (tests/test_manifest_facts_*.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvwatch.commands.summary import summarize
from kvwatch.core.events import Event, event_from_json, event_to_json
from kvwatch.sources.pipeline import replay

SAMPLES = Path(__file__).parent / "log_samples"
LOGS = sorted(SAMPLES.rglob("*.log"))


def run_sample(path: Path) -> tuple[str, str]:
    """(events JSONL, summary JSON) of one sample, exactly as written to the golden files."""
    events: list[Event] = []
    result = replay([str(path)], on_events=events.extend)
    jsonl = "".join(event_to_json(e) + "\n" for e in events)
    summary = json.dumps(summarize(result.snapshots(), result.engine), indent=2) + "\n"
    return jsonl, summary


def check(golden: Path, observed: str, update: bool) -> None:
    if update:
        golden.write_text(observed, encoding="utf-8")
        return
    assert golden.exists(), f"{golden.name} missing: run pytest --update-golden and review the diff"
    assert golden.read_text(encoding="utf-8") == observed


def test_samples_exist() -> None:
    assert {p.relative_to(SAMPLES).parts[0] for p in LOGS} == {"vllm", "sglang"}
    assert len(LOGS) >= 39


@pytest.mark.parametrize("path", LOGS, ids=lambda p: str(p.relative_to(SAMPLES).with_suffix("")))
def test_golden(path: Path, update_golden: bool) -> None:
    jsonl, summary = run_sample(path)
    check(path.with_suffix(".events.jsonl"), jsonl, update_golden)
    check(path.with_suffix(".summary.json"), summary, update_golden)


@pytest.mark.parametrize("path", LOGS, ids=lambda p: str(p.relative_to(SAMPLES).with_suffix("")))
def test_golden_events_round_trip(path: Path) -> None:
    golden = path.with_suffix(".events.jsonl")
    if not golden.exists():
        pytest.fail(f"{golden.name} missing: run pytest --update-golden")
    for line in golden.read_text(encoding="utf-8").splitlines():
        assert event_to_json(event_from_json(line)) == line


def test_no_orphan_goldens() -> None:
    """A golden whose sample was renamed or removed would silently stop being checked."""
    stems = {p.with_suffix("") for p in LOGS}
    for golden in [*SAMPLES.rglob("*.events.jsonl"), *SAMPLES.rglob("*.summary.json")]:
        assert golden.with_suffix("").with_suffix("") in stems, golden.name
