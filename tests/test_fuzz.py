"""Property tests: arbitrary, damaged and huge input never raises and never grows memory without bound."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes import examples

from kvwatch.engines import registry
from kvwatch.parsers.base import LineMeta, ParseError
from kvwatch.parsers.prefix import strip_embedded, strip_prefixes
from kvwatch.sources.lines import READ_BLOCK_BYTES, read_blocks
from kvwatch.sources.pipeline import LinePipeline, replay
from kvwatch.state.fleet import Fleet

SAMPLES = Path(__file__).parent / "log_samples"
REAL_LINES: list[str] = [
    line
    for path in sorted(SAMPLES.rglob("*.log"))
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines()
    if line.strip()
]

FUZZ = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text that looks like log lines: real lines, cut and spliced, with noise and prefixes around them.
real_line = st.sampled_from(REAL_LINES)


@st.composite
def damaged_line(draw: st.DrawFn) -> str:
    a, b = draw(real_line), draw(real_line)
    cut_a = draw(st.integers(0, len(a)))
    cut_b = draw(st.integers(0, len(b)))
    noise = draw(st.text(max_size=20))
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return a[:cut_a]
    if choice == 1:
        return a[:cut_a] + b[cut_b:]
    if choice == 2:
        return noise + a[cut_a:]
    return a[:cut_a] + noise + a[cut_a:]


any_text = st.one_of(st.text(), damaged_line(), real_line)


def _parse_all(body: str, meta: LineMeta) -> None:
    for parse in (e.log.parse for e in registry.ENGINES.values()):
        try:
            parse(body, meta)
        except ParseError:
            pass


@FUZZ
@given(any_text)
def test_prefix_and_parsers_only_raise_parse_error(text: str) -> None:
    body, meta = strip_prefixes(text)
    assert isinstance(body, str)
    _parse_all(body, meta)
    second = strip_embedded(body, meta)
    if second is not None:
        _parse_all(*second)


@FUZZ
@given(st.binary(max_size=2000))
def test_pipeline_survives_arbitrary_bytes(data: bytes) -> None:
    for engine in ("auto", "vllm", "sglang"):
        p = LinePipeline("fuzz", Fleet(), engine=engine)
        lines = data.decode("utf-8", errors="replace").split("\n")
        for line in lines:
            p.feed(line)
        assert p.lines_read == len(lines)
        assert p.lines_matched <= p.lines_read


@FUZZ
@given(st.lists(damaged_line(), max_size=40))
def test_pipeline_survives_damaged_real_lines(lines: list[str]) -> None:
    p = LinePipeline("fuzz", Fleet())
    for line in lines:
        p.feed(line)
    assert p.lines_read == len(lines)


@settings(max_examples=20, deadline=None)
@given(st.randoms(use_true_random=False))
def test_shuffled_real_lines_parse_without_errors(rng: object) -> None:
    lines = list(REAL_LINES)
    rng.shuffle(lines)  # type: ignore[attr-defined]
    for engine in ("vllm", "sglang"):
        p = LinePipeline("shuffled", Fleet(), engine=engine)
        for line in lines:
            p.feed(line)
        assert p.parse_errors == 0


def test_one_megabyte_line_is_capped() -> None:
    huge = "GPU KV cache size: 9 tokens " + "x" * (1 << 20)
    p = LinePipeline("big", Fleet(), max_line_chars=65536)
    p.feed(huge)
    assert p.lines_truncated == 1
    (snap,) = p.fleet.snapshot()
    assert snap.pool.tokens == 9


@settings(max_examples=25, deadline=None)
@given(st.binary(min_size=1, max_size=3 << 20))
def test_replay_reads_bounded_lines_from_invalid_utf8(data: bytes) -> None:
    fd, name = tempfile.mkstemp(suffix=".log")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data + b"\n" + b"\xff" * (1 << 20) + b"\nGPU KV cache size: 7 tokens\n")
        with open(name, "rb") as stream:
            bound = max(READ_BLOCK_BYTES, 4097)
            assert all(
                len(line.decode("utf-8", "replace")) <= bound
                for block, pos, endpos in read_blocks(stream, 4096)
                for line in block[pos + 1 : endpos].split(b"\n")
            )
        result = replay([name], engine="vllm", max_line_chars=4096)
        (snap,) = result.snapshots()
        assert snap.pool.tokens == 7
    finally:
        os.unlink(name)


@FUZZ
@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=60))
def test_instances_are_capped(ranks: list[int]) -> None:
    fleet = Fleet(max_instances=8)
    p = LinePipeline("many", fleet)
    for n in ranks:
        p.feed(
            f"(EngineCore_DP{n} pid=1) INFO 10-03 09:15:22 [kv_cache_utils.py:1087] GPU KV cache size: 5 tokens"
        )
    assert len(fleet.snapshot()) <= 8
    assert len(fleet.snapshot()) == min(8, len(set(ranks)))


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_real_lines_never_raise_through_parsers(engine: str) -> None:
    parse = registry.get(engine).log.parse
    for line in REAL_LINES:
        parse(*strip_prefixes(line))


PATHOLOGICAL = {
    "logo art without text": "█ " * 30000 + "x version",
    "many sglang tags": "[2025-01-01 10:00:00" + " TP1" * 15000 + " KV Cache is allocated",
    "unclosed process prefix": "(a" + " b" * 30000 + " KV cache",
    "repeated embedded prefixes": "@" + "[2025-01-01 10:00:00 TP1" * 2500 + " KV cache size: 1 tokens",
    "many config fields": "Initializing a V1 LLM engine (v1) with config: " + "a=" * 30000,
    "many stats parts": "Avg prompt throughput: " + "1, " * 20000 + "KV cache",
    "many location suffixes": "KV cache" + " (a.py:1)" * 6000 + "x)",
    "long json": "{" + '"message": "KV cache", ' * 3000,
}


@pytest.mark.parametrize("line", PATHOLOGICAL.values(), ids=PATHOLOGICAL.keys())
def test_pathological_lines_do_not_raise(line: str) -> None:
    """Lines built to make backtracking patterns work hard (60k characters) are still read."""
    for engine in ("auto", "vllm", "sglang"):
        p = LinePipeline("worst", Fleet(), engine=engine)
        p.feed(line)
        assert p.lines_read == 1
