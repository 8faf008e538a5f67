"""Issue 22, case 1: every regular expression kvwatch applies to outside text is linear in it.

One /metrics line, ``x{a="b"`` + 65,000 spaces + ``z``, took 45 s to reject (cost grew with the
square of the line). The corpus here is generated from each compiled pattern of the package
(tests/hostile_regex.py: long runs of what each repeat accepts, near misses at the end, every
repeat grown at once), applied the way the package's source applies that pattern (match,
fullmatch, or search for finditer/findall/sub), at 16 Ki and 64 Ki characters: the longest line
kvwatch keeps. The time budget (CPU time of the matching thread, so a loaded machine does not
read as a slow pattern) is a bound on the shape of the cost, not a speed target: a 64 Ki
line must take under half a second (about a thousand times what a linear scan takes), and
quadrupling the line must not cost much more than four times as much (a quadratic pattern costs
sixteen times as much).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostile_regex import has_unbounded_repeat, package_patterns, worst_cases

import kvwatch
from kvwatch.core.kinds import EngineName
from kvwatch.parsers.base import ParseError
from kvwatch.parsers.prom_stream import MAX_LINE_CHARS
from kvwatch.sources.metrics_reader import MetricsReader
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.state.fleet import Fleet

SMALL, LARGE = 16 * 1024, MAX_LINE_CHARS
BUDGET_S = 0.5  # for a LARGE line
# A linear cost grows 4x from SMALL to LARGE, a quadratic one 16x; the slack absorbs a busy machine.
GROWTH = 8.0
FLOOR_S = 0.02
PATTERNS = list(package_patterns(Path(kvwatch.__file__).parent))


def _seconds(apply: Callable[[Any], object], text: Any) -> float:
    """CPU seconds of this thread: what the pattern costs, not how long other processes held the cores."""
    start = time.thread_time()
    apply(text)
    return time.thread_time() - start


def _best(apply: Callable[[Any], object], text: Any, first: float) -> float:
    """A time over its bound is measured twice more (a busy machine is not a slow pattern)."""
    return min(first, *(_seconds(apply, text) for _ in range(2)))


def _check_linear(apply: Callable[[Any], object], small: Any, large: Any, what: str) -> None:
    t_small = _seconds(apply, small)
    if t_small > BUDGET_S / 4:
        t_small = _best(apply, small, t_small)
    assert t_small <= BUDGET_S / 4, f"{what}: {SMALL} characters took {t_small:.2f} s"
    if t_small * 16 <= FLOOR_S:
        return  # even a quadratic cost stays under both bounds at LARGE (a quartic one would not)
    t_large = _seconds(apply, large)
    if t_large > min(BUDGET_S, GROWTH * t_small + FLOOR_S):
        t_large = _best(apply, large, t_large)
    assert t_large <= BUDGET_S, f"{what}: {LARGE} characters took {t_large:.2f} s"
    assert t_large <= GROWTH * t_small + FLOOR_S, (
        f"{what}: {SMALL} -> {LARGE} characters cost {t_small * 1000:.1f} -> {t_large * 1000:.1f} ms"
    )


def _data(pattern: re.Pattern[Any], text: str) -> str | bytes:
    return text.encode("utf-8") if isinstance(pattern.pattern, bytes) else text


def test_the_corpus_reaches_every_pattern_of_the_package() -> None:
    """The walk finds the patterns of every layer that reads outside text (a moved module still counts)."""
    found = {where.rsplit(".", 1)[0] for where, _, _ in PATTERNS}
    for module in (
        "kvwatch.parsers.prom_stream",
        "kvwatch.parsers.prefix",
        "kvwatch.engines.vllm.log",
        "kvwatch.engines.vllm.settings",
        "kvwatch.engines.vllm.fastpath",
        "kvwatch.engines.sglang.log",
        "kvwatch.engines.sglang.stats",
        "kvwatch.engines.sglang.settings",
        "kvwatch.engines.sglang.fastpath",
        "kvwatch.sidecar.config",
        "kvwatch.core.units",
    ):
        assert module in found
    # Every pattern with an unbounded repeat gets worst cases (the generator never silently writes none).
    for where, pattern, _ in PATTERNS:
        if has_unbounded_repeat(pattern):
            assert next(worst_cases(pattern, SMALL), None) is not None, where


@pytest.mark.parametrize(("where", "pattern", "how"), PATTERNS, ids=[f"{w}.{h}" for w, _, h in PATTERNS])
def test_every_pattern_is_linear_on_its_generated_worst_cases(
    where: str, pattern: re.Pattern[Any], how: str
) -> None:
    apply = getattr(pattern, how)
    large = dict(worst_cases(pattern, LARGE))
    for name, small in worst_cases(pattern, SMALL):
        if name in large:
            _check_linear(apply, _data(pattern, small), _data(pattern, large[name]), f"{where}.{how} {name}")


def _exposition(line: str) -> None:
    body = MetricsReader("vllm").stream()
    body.feed(line + "\n")
    try:
        body.finish()
    except ParseError:
        pass


@pytest.mark.parametrize(
    "make",
    [
        lambda n: 'x{a="b"' + " " * n + "z",  # the case found: 45 s at 65,000 spaces
        lambda n: "vllm:num_requests_running{" + " " * n + "} 1",
        lambda n: 'vllm:num_requests_running{a="' + "\\" * n,
        lambda n: 'x{a="b",' * (n // 8) + "z",
        lambda n: "x" * n + "{",
        lambda n: "vllm:num_requests_running{" + 'a="b" ' * (n // 6) + "} 1",
    ],
    ids=["found", "blank-labels", "backslashes", "many-labels", "long-name", "no-commas"],
)
def test_an_exposition_line_is_read_in_linear_time(make: Callable[[int], str]) -> None:
    small, large = make(SMALL - 32), make(LARGE - 32)
    assert len(large) <= MAX_LINE_CHARS
    _check_linear(_exposition, small, large, "MetricsReader")


@pytest.mark.parametrize(
    ("engine", "make"),
    [
        ("sglang", lambda n: "[2026-01-01 10:00:00 TP0] Decode batch [1]" + " " * n + "x"),
        ("sglang", lambda n: "Prefill batch(mixed #running-req: 1)." + " " * n + "x"),
        ("sglang", lambda n: "[2026-01-01 10:00:00" + " TP0" * (n // 4) + "] Decode batch, #token: 1"),
        ("sglang", lambda n: "sglang: 1." + "1." * (n // 2) + "!"),
        ("vllm", lambda n: "GPU KV cache size: 1" + " " * n + "[repeated 1x across clustr]"),
        ("vllm", lambda n: "GPU KV cache size: 1" + " " * n + "(a.py:1) )"),
        ("vllm", lambda n: "Memory profiling results: " + "a" * n),
        ("vllm", lambda n: "vLLM API server version 1." + "1" * n + "!"),
        ("vllm", lambda n: "non-default args: {" + "'a': 1, " * (n // 8)),
    ],
    ids=[
        "batch-blanks",
        "mixed-blanks",
        "sglang-tags",
        "sglang-version",
        "ray",
        "location",
        "profile",
        "version",
        "args",
    ],
)
def test_a_log_line_is_read_in_linear_time(engine: EngineName, make: Callable[[int], str]) -> None:
    def feed(line: str) -> None:
        LinePipeline("hostile", Fleet(), engine=engine).feed(line)

    _check_linear(feed, make(SMALL), make(LARGE), f"{engine} LinePipeline")
