"""The replay fast paths give exactly what the general path gives.

``fastpath.parse_lines`` (one pattern over whole stats lines) must equal ``parse(*strip_prefixes(line))``
event for event on every line it answers; ``LinePipeline.feed_block`` over raw bytes (bulk
access-line filter) must leave the same counters, events and state as ``feed`` line by line; and
the byte reader must cut a stream into the lines a text split gives.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lanes import examples
from same_events import identical_events

from kvwatch.core.events import Event, Preemption, UsageSample, event_to_json
from kvwatch.engines.vllm import fastpath, log, stats
from kvwatch.parsers.base import LineMeta
from kvwatch.parsers.prefix import strip_prefixes
from kvwatch.sources.lines import read_blocks
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.state.fleet import Fleet

SAMPLES = Path(__file__).parent / "log_samples"
SAMPLE_FILES = sorted(SAMPLES.rglob("*.log"))
SAMPLE_LINES = [
    line for path in SAMPLE_FILES for line in path.read_text(encoding="utf-8", errors="replace").split("\n")
]
PROPS = settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fast(line: str) -> tuple[Event, ...] | None:
    """The fast path's answer for one line, as the pipeline asks it (terminator removed)."""
    raw = line.rstrip("\r\n").encode("utf-8", "surrogatepass")
    return None if b"\n" in raw else fastpath.parse_lines([raw])[0]


def _general(line: str) -> tuple[Event, ...]:
    return log.parse(*strip_prefixes(line))


def test_fast_path_answers_each_line_as_alone() -> None:
    lines = [x.rstrip("\r\n") for x in SAMPLE_LINES if "\n" not in x.rstrip("\r\n")]
    assert fastpath.parse_lines([x.encode() for x in lines]) == [_fast(x) for x in lines]
    assert fastpath.parse_lines([]) == []
    assert fastpath.parse_lines([b""]) == [None]
    # A line with a newline in it is not a line: every answer is None (the general path reads them).
    stats = next(x for x in SAMPLE_LINES if _fast(x) is not None)
    assert fastpath.parse_lines([(stats + "\nx").encode(), stats.encode()]) == [None, None]
    # Raw lines: what their decoded form (invalid bytes replaced) gives, i.e. nothing (ASCII only).
    for raw in (b"\xff" + stats.encode(), stats.encode()[:-3] + b"\xe2\x82", stats.encode() + b"\xc3\xa9"):
        assert fastpath.parse_lines([raw]) == [None]


def test_fast_path_equals_general_path_on_every_sample_line() -> None:
    answered = 0
    for line in SAMPLE_LINES:
        fast = _fast(line)
        if fast is not None:
            answered += 1
            identical_events(fast, _general(line))
    # The samples' stats lines in V0 and V1 shapes (with and without process prefix, Docker-stamped
    # too): the fast path must actually answer every one of them.
    stats = [x for x in SAMPLE_LINES if "Avg prompt throughput" in x]
    assert answered == len(stats) >= 20


def test_events_are_fresh_copies_of_their_printers() -> None:
    """Each event is its own copy of the printer's cached events: nothing one event holds reaches
    another's, and the cached events keep no line's values."""
    line = (
        "INFO 01-02 03:04:05 [loggers.py:123] Engine 001: Avg prompt throughput: 0.0 tokens/s, Avg generation "
        "throughput: 12.3 tokens/s, Running: 2 reqs, Waiting: 0 reqs, Preemptions: 3, GPU KV cache usage: 1.5%"
    )
    first, again = _fast(line), _fast(line)
    assert first is not None and len(first) == 2
    identical_events(first, _general(line))
    assert first is not None and again is not None and first == again
    for a, b in zip(first, again, strict=True):
        assert a.__dict__ is not b.__dict__ and a.model_fields_set is not b.model_fields_set
    usage, preemption = fastpath._printer(b"", b"", b"001", b"")
    assert usage == stats.usage_sample(LineMeta(instance="1"), {}, {})
    assert (usage.ts, usage.running, preemption.ts, preemption.count) == (None, None, None, None)
    assert UsageSample.__pydantic_post_init__ is None and Preemption.__pydantic_post_init__ is None


# --- generated stats lines -----------------------------------------------------------------------

PROCESSES = (
    "",
    "(APIServer pid=4801) ",
    "(EngineCore_DP1 pid=5012) ",
    "(EngineCore_3 pid=7) ",
    "(VllmWorker rank=2 pid=4312) ",
    "(Worker_DP1_TP0 pid=8) ",
    "(VllmWorkerProcess pid=6496) ",
    "(pid=123, ip=10.0.0.1) ",
)
LEVELS = ("INFO", "DEBUG", "WARNING", "WARN", "ERROR", "CRITICAL", "NOTICE")
LOCATIONS = ("[loggers.py:259]", "metrics.py:449]", "[loggers.py:87]", "[v1/metrics/loggers.py:1]")
HEADS = ("", "Engine 000: ", "Engine 001: ", "Engine 12: ", "2 Engines Aggregated: ")
ENDINGS = ("", ".", "\r", "\n", "\r\n", ".\r\n", " ", ". ", "\t")

number = st.one_of(
    st.integers(0, 10**6).map(str),
    st.floats(0, 1e5, allow_nan=False).map(lambda x: f"{x:.1f}"),
    st.sampled_from(["0.0", "100.0", "12.25", "007", "1e3", "nan", "-1.0", "١٢", "3.", ".5"]),
)


@st.composite
def stats_line(draw: st.DrawFn) -> str:
    parts = [
        f"Avg prompt throughput: {draw(number)} tokens/s",
        f"Avg generation throughput: {draw(number)} tokens/s",
        f"Running: {draw(number)} reqs",
    ]
    if draw(st.booleans()):
        parts.append(f"Swapped: {draw(number)} reqs")
    parts.append(f"{draw(st.sampled_from(['Waiting', 'Pending']))}: {draw(number)} reqs")
    if draw(st.booleans()):
        parts.append(f"Deferred: {draw(number)} reqs")
    if draw(st.booleans()):
        parts.append(f"Preemptions: {draw(number)}")
    parts.append(f"{draw(st.sampled_from(['GPU', 'XPU', 'CPU']))} KV cache usage: {draw(number)}%")
    for key in ("CPU KV cache usage", "Prefix cache hit rate"):
        if draw(st.booleans()):
            parts.append(f"{key}: {draw(number)}%")
    if draw(st.booleans()):
        parts.append(f"Corrupted: {draw(number)} reqs")
    for key in ("External prefix cache hit rate", "MM cache hit rate"):
        if draw(st.booleans()):
            parts.append(f"{key}: {draw(number)}%")
    if draw(st.booleans()):
        parts.insert(
            draw(st.integers(0, len(parts))), draw(st.sampled_from(["Waiting: 3 reqs", "KV fetch: 1"]))
        )
    prefix = (
        draw(st.sampled_from(PROCESSES))
        + draw(st.sampled_from(LEVELS))
        + f" {draw(st.sampled_from(['03-17 15:00:10', '12-31 23:59:59', '03-17 15:00:10.123']))} "
        + draw(st.sampled_from(LOCATIONS))
        + " "
    )
    line = prefix + draw(st.sampled_from(HEADS)) + ", ".join(parts) + draw(st.sampled_from(ENDINGS))
    # Damage: a character changed, inserted or removed anywhere (ANSI, Unicode digits, spaces...).
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(line)))
        noise = draw(
            st.sampled_from(["", " ", "\x1b[0m", "٣", "x", ",", ":", "%", ".", "(", ")", "\x1c", "]"])
        )
        cut = draw(st.integers(0, 1))
        line = line[:at] + noise + line[at + cut :]
    return line


@PROPS
@given(stats_line())
def test_fast_path_equals_general_path_on_generated_lines(line: str) -> None:
    fast = _fast(line)
    if "\n" not in line.rstrip("\r\n"):
        raw = line.rstrip("\r\n").encode("utf-8", "surrogatepass")
        assert fastpath.parse_lines([raw, b"x", raw]) == [fast, None, fast]
    if fast is None:
        return
    identical_events(fast, _general(line))


def test_fast_path_answers_the_common_shapes() -> None:
    """The shapes the fast path is for (not only damaged lines): each must be answered."""
    lines = [
        "(APIServer pid=1) INFO 03-17 15:00:10 [loggers.py:259] Engine 000: Avg prompt throughput: 1.0 tokens/s, "
        "Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 4 reqs, Preemptions: 5, "
        "GPU KV cache usage: 6.0%, Prefix cache hit rate: 7.0%",
        "INFO 01-22 18:27:20 metrics.py:449] Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: "
        "41.7 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 2.0%, "
        "CPU KV cache usage: 0.0%.",
        "(EngineCore_DP1 pid=2) INFO 03-17 15:00:10 [loggers.py:259] 2 Engines Aggregated: Avg prompt throughput: "
        "1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 4 reqs, "
        "GPU KV cache usage: 6.0%, Prefix cache hit rate: 7.0%, MM cache hit rate: 1.0%\r\n",
    ]
    for line in lines:
        fast = _fast(line)
        assert fast is not None, line
        identical_events(fast, _general(line))


# --- feed_block and the byte reader ----------------------------------------------------------------


def _by_lines(lines: list[str], engine: Any = "auto") -> tuple[LinePipeline, list[tuple[Event, ...]]]:
    p = LinePipeline("src", Fleet(clock=lambda: 0.0), engine=engine)
    seen = [events for line in lines if (events := p.feed(line))]
    return p, seen


def _by_block(data: bytes, engine: Any = "auto") -> tuple[LinePipeline, list[tuple[Event, ...]]]:
    p = LinePipeline("src", Fleet(clock=lambda: 0.0), engine=engine)
    seen: list[tuple[Event, ...]] = []
    for block, pos, endpos in read_blocks(io.BytesIO(data), p.max_line_chars):
        p.feed_block(block, seen.append, pos, endpos)
    return p, seen


def _same_outcome(a: LinePipeline, b: LinePipeline) -> None:
    counters = ("lines_read", "lines_matched", "parse_errors", "lines_truncated", "engine")
    assert [getattr(a, c) for c in counters] == [getattr(b, c) for c in counters]
    # repr, not ==: a stats line may print 'nan', and nan != nan.
    assert repr(a.fleet.snapshot()) == repr(b.fleet.snapshot())


def _as_json(seen: list[tuple[Event, ...]]) -> list[list[str]]:
    return [[event_to_json(e) for e in events] for events in seen]


@pytest.mark.parametrize("path", SAMPLE_FILES, ids=lambda p: f"{p.parent.name}/{p.name[:3]}")
def test_feed_block_equals_feed_on_every_sample(path: Path) -> None:
    data = path.read_bytes()
    lines = data.decode("utf-8", "replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    by_line, seen_lines = _by_lines(lines)
    by_block, seen_block = _by_block(data)
    assert _as_json(seen_block) == _as_json(seen_lines)
    _same_outcome(by_line, by_block)


# Line ends as LineSplitter reads them: CRLF, a lone CR (progress bars), LF.
_LINE_END = re.compile(r"\r\n|\r|\n")

access = st.sampled_from(
    [
        '(APIServer pid=7) INFO:     10.0.0.1:5000 - "POST /v1/completions HTTP/1.1" 200 OK',
        'INFO:     127.0.0.1:1 - "GET /version HTTP/1.1" 200 OK',
        "HTTP/ KV cache size: 5 tokens",
    ]
)
log_line = st.one_of(
    access,
    st.sampled_from([x for x in SAMPLE_LINES if x]),
    stats_line(),
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=40),
)
log_text = st.lists(log_line, max_size=60)


@PROPS
@given(log_text, st.sampled_from(["auto", "vllm", "sglang"]))
def test_feed_block_equals_feed_on_mixed_lines(lines: list[str | bytes], engine: str) -> None:
    data = b"\n".join(x if isinstance(x, bytes) else x.encode("utf-8", "surrogatepass") for x in lines)
    text = data.decode("utf-8", "replace")
    split = _LINE_END.split(text)
    if split[-1] == "":
        split.pop()  # a file's last terminator ends a line, it does not start one
    by_line, seen_lines = _by_lines(split, engine)
    by_block, seen_block = _by_block(data, engine)
    assert _as_json(seen_block) == _as_json(seen_lines)
    _same_outcome(by_line, by_block)


@PROPS
@given(
    st.lists(
        st.one_of(st.binary(max_size=30), st.text(max_size=30).map(lambda t: t.encode("utf-8", "replace"))),
        max_size=40,
    ),
    st.integers(1, 64),
)
def test_byte_reader_splits_like_text(pieces: list[bytes], block_bytes: int) -> None:
    """With lines shorter than the cap, any block size gives the lines of a text split."""
    data = b"\n".join(pieces)
    want = _LINE_END.split(data.decode("utf-8", "replace"))
    if want[-1] == "":
        want.pop()
    got = [
        line.decode("utf-8", "replace")
        for block, pos, endpos in read_blocks(io.BytesIO(data), 4096, block_bytes)
        for line in block[pos + 1 : endpos].split(b"\n")
    ]
    assert got == want


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=3000), st.integers(1, 300), st.integers(1, 40))
def test_byte_reader_caps_cut_lines(data: bytes, block_bytes: int, max_chars: int) -> None:
    """A line a block boundary cuts is kept to max_chars + 1 characters: the prefix a text read kept."""
    text_lines = _LINE_END.split(data.decode("utf-8", "replace"))
    got = [
        line.decode("utf-8", "replace")
        for block, pos, endpos in read_blocks(io.BytesIO(data), max_chars, block_bytes)
        for line in block[pos + 1 : endpos].split(b"\n")
    ]
    if text_lines[-1] == "":
        text_lines.pop()
    assert len(got) == len(text_lines)
    for line, whole in zip(got, text_lines, strict=True):
        assert whole.startswith(line)
        assert line == whole or len(line) == max_chars + 1
