"""End-to-end /metrics goldens: what a sidecar exports after reading each log sample to its end.

Every real sample (tests/log_samples/**/*.log) and the demo's logs (kvwatch/data/demo) go through
the sidecar's own pieces: the tailer's line splitter, ``LogSource`` with its ``LinePipeline`` into
a ``Fleet``, the ``Predictor`` (with the sample's model config where its manifest names one) and
the ``KvwatchCollector``'s ``render`` -- the body a scrape of /metrics gets. The clock is fixed, so
the timestamps it stamps are too; the process_* and python_* series are not there (they come from
the sidecar's runtime registry, not asked for here) and ``kvwatch_build_info`` is left out (it
carries kvwatch's and Python's versions). The goldens (``<stem>.metrics.txt`` beside each
sample; the demo's in tests/demo_metrics/, since kvwatch/data ships in the package) are written
by ``pytest --update-golden`` and reviewed as diffs, never hand-edited; promtool checks each one.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import kvwatch
from kvwatch.analysis.predictor import Predictor
from kvwatch.export import names
from kvwatch.export.collector import KvwatchCollector
from kvwatch.sidecar.sources import LogSource
from kvwatch.sources.lines import LineSplitter
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.state.fleet import Fleet

TESTS = Path(__file__).parent
LOG_SAMPLES = TESTS / "log_samples"
MODEL_CONFIGS = TESTS / "model_configs"
DEMO = Path(kvwatch.__file__).parent / "data" / "demo"
DEMO_GOLDENS = TESTS / "demo_metrics"
# 2025-06-15 16:53:20 UTC: every timestamp the state stamps (epoch start, last update).
CLOCK = 1_750_000_000.0
# The `source` label, as `--log sample=PATH` would give it (a path would differ per checkout).
SOURCE = "sample"


def _cases() -> list[tuple[Path, Path | None, Path]]:
    """(log, model config or None, golden) for every sample and demo log."""
    cases: list[tuple[Path, Path | None, Path]] = []
    for entry in json.loads((LOG_SAMPLES / "manifest.json").read_text(encoding="utf-8")):
        log = LOG_SAMPLES / entry["file"]
        config = entry.get("model_config")
        cases.append((log, MODEL_CONFIGS / config if config else None, log.with_suffix(".metrics.txt")))
    for source in json.loads((DEMO / "demo.json").read_text(encoding="utf-8"))["sources"]:
        log = DEMO / source["log"]
        golden = DEMO_GOLDENS / Path(source["log"]).with_suffix(".metrics.txt").name
        cases.append((log, DEMO / "models" / source["model_config"], golden))
    return sorted(cases)


CASES = _cases()


def _id(case: tuple[Path, Path | None, Path]) -> str:
    log = case[0]
    return (
        str(log.relative_to(LOG_SAMPLES).with_suffix(""))
        if log.is_relative_to(LOG_SAMPLES)
        else f"demo/{log.stem}"
    )


def exposition(log: Path, model_config: Path | None) -> str:
    """The /metrics body after the whole of ``log`` was read, as the golden holds it."""
    fleet = Fleet(clock=lambda: CLOCK)
    source = LogSource(SOURCE, str(log), LinePipeline(SOURCE, fleet, "auto"))
    splitter = LineSplitter()
    lines = splitter.feed(log.read_bytes())
    last = splitter.flush()
    if last is not None:
        lines.append(last)
    source.on_lines(lines)
    collector = KvwatchCollector(
        fleet.snapshot,
        Predictor(model_config=lambda name: model_config),
        lambda: [source.status()],
        lambda: fleet.dropped_events,
    )
    lines = collector.render().decode("utf-8").splitlines(keepends=True)
    return "".join(line for line in lines if _family(line) != names.BUILD_INFO.sample_name)


def _family(line: str) -> str:
    """The metric a line of the text format is about (its HELP, TYPE or sample)."""
    if line.startswith("# "):
        return line.split(" ", 3)[2]
    return line.split("{", 1)[0].split(" ", 1)[0]


def test_every_sample_and_demo_log_has_a_case() -> None:
    """The manifest lists every sample file, so none goes without a golden."""
    samples = {c[0] for c in CASES if c[0].is_relative_to(LOG_SAMPLES)}
    assert samples == set(LOG_SAMPLES.rglob("*.log"))
    assert len(CASES) == len(samples) + 2
    for _, config, _ in CASES:
        assert config is None or config.is_file(), config


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_metrics_golden(case: tuple[Path, Path | None, Path], update_golden: bool) -> None:
    log, config, golden = case
    observed = exposition(log, config)
    if update_golden:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(observed, encoding="utf-8")
        return
    assert golden.exists(), f"{golden.name} missing: run pytest --update-golden and review the diff"
    assert golden.read_text(encoding="utf-8") == observed


def test_no_orphan_metrics_goldens() -> None:
    """A golden whose sample was renamed or removed would silently stop being checked."""
    expected = {c[2] for c in CASES}
    found = {*LOG_SAMPLES.rglob("*.metrics.txt"), *DEMO_GOLDENS.glob("*.metrics.txt")}
    assert found == expected


@pytest.mark.integration
def test_promtool_accepts_every_metrics_golden(promtool: str) -> None:
    for _, _, golden in CASES:
        done = subprocess.run(
            [promtool, "check", "metrics"],
            input=golden.read_bytes(),
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, f"{golden}: {done.stdout.decode()}{done.stderr.decode()}"
