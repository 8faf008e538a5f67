"""SGLang's fast path gives exactly what the general path gives.

``engines/sglang/fastpath.parse_lines`` (one pattern over whole Prefill/Decode batch lines) must
equal ``parse(*strip_prefixes(line))`` event for event on every line it answers, answer None for
any other line (damaged values included: the general path skips those, the fast path never
guesses them), answer the shapes SGLang prints across releases, and leave a pipeline's counters,
events and state as the general path alone leaves them.
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

from kvwatch.core.events import Event, event_to_json
from kvwatch.engines.sglang import fastpath, log, stats
from kvwatch.parsers import prefix
from kvwatch.parsers.base import ParseError
from kvwatch.parsers.prefix import strip_prefixes
from kvwatch.sources.lines import read_blocks
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.state.fleet import Fleet

SAMPLES = Path(__file__).parent / "log_samples"
SAMPLE_LINES = [
    line
    for path in sorted(SAMPLES.rglob("*.log"))
    for line in path.read_text(encoding="utf-8", errors="replace").split("\n")
]
SGLANG_LINES = [
    line
    for path in sorted((SAMPLES / "sglang").glob("*.log"))
    for line in path.read_text(encoding="utf-8", errors="replace").split("\n")
    if line
]
PROPS = settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _fast(line: str) -> tuple[Event, ...] | None:
    """The fast path's answer for one line, as the pipeline asks it (terminator removed)."""
    raw = line.rstrip("\r\n").encode("utf-8", "surrogatepass")
    return None if b"\n" in raw else fastpath.parse_lines([raw])[0]


def _general(line: str) -> tuple[Event, ...]:
    return log.parse(*strip_prefixes(line))


def _agrees(line: str) -> tuple[Event, ...] | None:
    """The fast answer, checked against the general path (which may count a parse error)."""
    fast = _fast(line)
    try:
        general = _general(line)
    except ParseError:
        assert fast is None, repr(line)
        return None
    if fast is not None:
        identical_events(fast, general)
    return fast


def test_pattern_is_built_from_the_prefix_grammar_and_the_key_table() -> None:
    pattern = fastpath._FAST_BATCH_LINES.pattern.decode()
    assert prefix.fast_prefix(prefix.SGLANG) in pattern
    for key in stats._USAGE_KEYS:
        assert re.escape(key) + ": " in pattern


def test_fast_path_equals_general_path_on_every_sample_line() -> None:
    answered = 0
    for line in SAMPLE_LINES:
        if _agrees(line) is not None:
            answered += 1
    # Every complete batch line behind SGLang's own prefix (the samples' truncated, pasted and
    # prefix-less ones are the general path's) must actually be answered.
    batch = [
        x
        for x in SAMPLE_LINES
        if ("Decode batch" in x or "Prefill batch" in x)
        and x.startswith("[")
        and ": " in x.rstrip(", \r").rsplit(", ", 1)[-1]
    ]
    assert answered == len(batch) >= 30


def test_fast_path_answers_each_line_as_alone() -> None:
    lines = [x.rstrip("\r\n") for x in SAMPLE_LINES if "\n" not in x.rstrip("\r\n")]
    assert fastpath.parse_lines([x.encode() for x in lines]) == [_fast(x) for x in lines]
    assert fastpath.parse_lines([]) == []
    assert fastpath.parse_lines([b""]) == [None]
    batch = next(x for x in SAMPLE_LINES if _fast(x) is not None)
    assert fastpath.parse_lines([(batch + "\nx").encode(), batch.encode()]) == [None, None]
    for raw in (b"\xff" + batch.encode(), batch.encode() + b"\xc3\xa9"):
        assert fastpath.parse_lines([raw]) == [None]


COMMON = [
    # 0.5.5+ (the shape of a busy server's log), with and without the trailing ', '.
    "[2026-03-17 15:00:30 TP0] Decode batch, #running-req: 7, #token: 71599, token usage: 0.09, cuda graph: True, "
    "gen throughput (token/s): 1561.24, #queue-req: 2, ",
    "[2026-03-17 15:00:20 TP0] Prefill batch, #new-seq: 1, #new-token: 7896, #cached-token: 1764, token usage: 0.07, "
    "#running-req: 2, #queue-req: 0",
    # 0.3.x: time only, '. ', cache hit rate in percent.
    "[16:43:29 TP0] Prefill batch. #new-seq: 1, #new-token: 2062, #cached-token: 0, cache hit rate: 12.34%, "
    "token usage: 0.01, #running-req: 0, #queue-req: 0",
    # 0.2-0.3.4 mixed chunked prefill; 0.5.4 forward iterations; DP/EP tags; hybrid pools.
    "[2024-10-01 10:00:00 TP1] Prefill batch(mixed #running-req: 3). #new-seq: 1, #new-token: 512, #queue-req: 0",
    "[2025-10-01 10:00:41 TP0] Decode batch [1240], #running-req: 12, #token: 23110, token usage: 0.05, "
    "gen throughput (token/s): 812.10, #queue-req: 0,",
    "[2025-10-07 22:29:11 DP3 TP5 EP5] Decode batch, #running-req: 1, #full token: 165376, full token usage: 0.02, "
    "#swa token: 9000, swa token usage: 0.10, accept len: 2.91, accept rate: 0.73, cuda graph: True, "
    "gen throughput (token/s): 96.41, #queue-req: 0",
    "[2025-10-07 22:29:11 ATTN_CP0 TP0] Prefill batch, #new-seq: 1, #new-token: 8, #cached-token: 0, "
    "full token usage: 0.01, mamba usage: 0.20, mamba num: 4, #retracted-req: 2, cpu token usage: 0.30, "
    "input throughput (token/s): 512.5, #pending-token: 0, npu graph: False",
    # Container and Ray process prefixes in front.
    "2026-03-17T15:00:10.123456789Z stdout F [2026-03-17 15:00:10 TP0] Decode batch, #running-req: 1, #token: 1",
    "(SchedulerActor pid=123, ip=10.0.0.1) [2026-03-17 15:00:10 DP1 TP2] Decode batch, #running-req: 1\r",
]


@pytest.mark.parametrize("line", COMMON)
def test_fast_path_answers_the_common_shapes(line: str) -> None:
    fast = _fast(line)
    assert fast is not None, line
    identical_events(fast, _general(line))


LEFT = [
    # Damaged values: the general path skips them, the fast path must not read them.
    "[2026-05-28 02:59:59 TP0] Decode batch, #running-req: 4x5, #token: 44672, token usage: 0.5",
    "[2026-05-28 02:59:59 TP0] Decode batch, #running-req: 45, #token: 44672, token usage: 0.5%",
    "[2026-05-28 02:59:59 TP0] Decode batch, #running-req: 45, token usage: .5",
    "[2026-05-28 02:59:59 TP0] Decode batch, #running-req: 45, cache hit rate: 12.5",
    "[2026-05-28 02:59:59 TP0] Decode batch, #running-req: 45, #token: ٣",
    # A truncated last item, a 0.4.9 hybrid pair, two keys for one field, no readable field.
    "[2026-05-28 02:59:59 TP0] Decode batch, #running-req: 45, #queue-req",
    "[2026-05-28 02:59:59 TP0] Decode batch, #running-req: 4, #token: full=1024, swa=512, token usage: 0.1",
    "[2026-05-28 02:59:59 TP0] Decode batch, #token: 1, #full token: 2",
    "[2026-05-28 02:59:59 TP0] Decode batch, #new-seq: 1, cuda graph: True",
    # What strip_prefixes would peel further: Ray's repeat suffix, a trailing location, ANSI.
    "[2026-05-28 02:59:59 TP0] Decode batch, #running-req: 4 [repeated 3x across cluster]",
    "[2026-05-28 02:59:59 TP0] Decode batch, #running-req: 4, at: x (scheduler.py:12)",
    "[2026-05-28 02:59:59 TP0] Decode batch, #running-req: \x1b[0m4",
    # Not a batch line.
    "[2026-05-28 02:59:59 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3",
    "Decode batch. #running-req: 1010, #token: 55006",
]


@pytest.mark.parametrize("line", LEFT)
def test_fast_path_leaves_everything_else_to_the_general_path(line: str) -> None:
    assert _fast(line) is None
    _agrees(line)


# --- generated batch lines -----------------------------------------------------------------------

clean_number = st.one_of(
    st.integers(0, 10**7).map(str), st.floats(0, 1e5, allow_nan=False).map(lambda x: f"{x:.2f}")
)
bad_number = st.sampled_from(
    ["0", "0.0", "1.00", "007", "1e3", "nan", "-1", "١٢", "3.", ".5", "5%", "full=3", "9" * 30, "True"]
)
number = st.one_of(*[clean_number] * 7, bad_number)
KNOWN = list(stats._USAGE_KEYS)
OTHER = [
    "#new-seq",
    "#new-token",
    "#cached-token",
    "cuda graph",
    "npu graph",
    "largest-len",
    "accept len",
    "accept rate",
    "#pending-token",
    "#cached-tounning-req",
    "token usa",
]
HEADS = ["Decode batch, ", "Prefill batch, ", "Decode batch. ", "Prefill batch. ", "Decode batch [1240], "]
HEADS += ["Prefill batch(mixed #running-req: 3). ", "Decode batch,", "Prefill batch "]
TAGS = ["", " TP0", " DP1 TP3", " TP0 EP0", " ATTN_CP0 TP1", " DP0 DP2 TP1 TP4"]
STAMPS = ["2026-03-17 15:00:10", "16:43:29", "2026-03-17 15:00:10,123", "2026-03-17 15:00:10.123456"]
OUTER = ["", "2026-03-17T15:00:10.123456789Z ", "2024-01-01T00:00:00.000000000Z stdout F "]
PROCESSES = ["", "(SchedulerActor pid=123, ip=10.0.0.1) ", "(pid=3, ip=10.0.0.1) ", "(EngineCore_DP1 pid=8) "]
ENDINGS = ["", ",", ", ", ".", " ", "\r", "\r\n", "\t"]


@st.composite
def item(draw: st.DrawFn) -> str:
    key = draw(st.sampled_from(KNOWN + OTHER))
    value = draw(number)
    if stats._USAGE_KEYS.get(key, ("", ""))[1] == "percent" and draw(st.integers(0, 3)):
        value += "%"
    return f"{key}: {value}"


@st.composite
def batch_line(draw: st.DrawFn) -> str:
    items = draw(st.lists(item(), min_size=1, max_size=9))
    if not items[0].startswith("#") and draw(st.integers(0, 3)):
        items.insert(0, "#new-seq: 1")
    ansi = draw(st.sampled_from(["", "\x1b[0m"]))
    line = (
        draw(st.sampled_from(OUTER))
        + draw(st.sampled_from(PROCESSES))
        + f"[{draw(st.sampled_from(STAMPS))}{draw(st.sampled_from(TAGS))}]{ansi} "
        + draw(st.sampled_from(HEADS))
        + ", ".join(items)
        + draw(st.sampled_from(ENDINGS[:3] + ENDINGS))
    )
    # Damage: a character changed, inserted or removed anywhere.
    for _ in range(draw(st.sampled_from([0, 1, 1, 2]))):
        at = draw(st.integers(0, len(line)))
        noise = draw(
            st.sampled_from(["", " ", "\x1b[0m", "٣", "x", ",", ":", "%", ".", "(", ")", "[", "]", "="])
        )
        line = line[:at] + noise + line[at + draw(st.integers(0, 1)) :]
    return line


@PROPS
@given(batch_line())
def test_fast_path_equals_general_path_on_generated_lines(line: str) -> None:
    fast = _agrees(line)
    if "\n" not in line.rstrip("\r\n"):
        raw = line.rstrip("\r\n").encode("utf-8", "surrogatepass")
        assert fastpath.parse_lines([raw, b"x", raw]) == [fast, None, fast]


@st.composite
def clean_batch_line(draw: st.DrawFn) -> str:
    """A batch line in a shape SGLang prints, with clean values: the fast path must answer it."""
    fields: dict[str, str] = {}
    items = []
    for key in draw(st.lists(st.sampled_from(KNOWN + OTHER), min_size=1, max_size=9)):
        spec = stats._USAGE_KEYS.get(key)
        if spec is not None and fields.setdefault(spec[0], key) != key:
            continue  # one key per field
        value = draw(
            st.integers(0, 10**6).map(str)
            if spec is None or spec[1] == "int"
            else st.sampled_from(["0.5", "12", "100.00"])
        )
        items.append(f"{key}: {value}{'%' if spec is not None and spec[1] == 'percent' else ''}")
    if not fields:
        items.append("#running-req: 1")
    if not items[0].startswith("#"):
        items.insert(0, "#new-seq: 1")  # the list starts with a '#' key (stats._BATCH_HEAD)
    return (
        draw(st.sampled_from(OUTER))
        + draw(st.sampled_from(PROCESSES))
        + f"[{draw(st.sampled_from(STAMPS))}{draw(st.sampled_from(TAGS))}] "
        + draw(st.sampled_from(HEADS[:-1]))
        + ", ".join(items)
        + draw(st.sampled_from(ENDINGS[:3] + ["\r", "\r\n"]))
    )


@PROPS
@given(clean_batch_line())
def test_fast_path_answers_generated_clean_lines(line: str) -> None:
    assert _agrees(line) is not None, repr(line)


# --- through the pipeline --------------------------------------------------------------------------


class _GeneralOnly(LinePipeline):
    """A pipeline without the engine's fast path: prefix peeling + ``log.parse`` for every line."""

    def _set_engine(self, engine: Any) -> None:
        super()._set_engine(engine)
        self._fast = None


def _general_only(lines: list[str], engine: Any) -> tuple[LinePipeline, list[tuple[Event, ...]]]:
    p = _GeneralOnly("src", Fleet(clock=lambda: 0.0), engine=engine)
    seen = [events for line in lines if (events := p.feed(line))]
    return p, seen


def _by_block(data: bytes, engine: Any) -> tuple[LinePipeline, list[tuple[Event, ...]]]:
    p = LinePipeline("src", Fleet(clock=lambda: 0.0), engine=engine)
    seen: list[tuple[Event, ...]] = []
    for block, pos, endpos in read_blocks(io.BytesIO(data), p.max_line_chars):
        p.feed_block(block, seen.append, pos, endpos)
    return p, seen


sglang_lines = st.lists(
    st.one_of(
        batch_line(),
        clean_batch_line(),
        st.sampled_from(SGLANG_LINES),
        st.just('[2026-03-17 15:00:10] INFO:     10.0.0.1:5 - "POST /generate HTTP/1.1" 200 OK'),
    ),
    max_size=40,
)


@PROPS
@given(sglang_lines, st.sampled_from(["auto", "sglang"]))
def test_fast_block_equals_general_lines(lines: list[str], engine: str) -> None:
    data = "\n".join(lines).encode("utf-8", "surrogatepass")
    # Line ends as the splitter reads them: LF, CRLF and a lone CR (progress bars).
    text = re.split(r"\r\n|\r|\n", data.decode("utf-8", "replace"))
    if text[-1] == "":
        text.pop()
    general, seen_general = _general_only(text, engine)
    fast, seen_fast = _by_block(data, engine)
    assert [[event_to_json(e) for e in x] for x in seen_fast] == [
        [event_to_json(e) for e in x] for x in seen_general
    ]
    counters = ("lines_read", "lines_matched", "parse_errors", "lines_truncated", "engine")
    assert [getattr(fast, c) for c in counters] == [getattr(general, c) for c in counters]
    assert repr(fast.fleet.snapshot()) == repr(general.fleet.snapshot())


def test_events_are_built_as_model_construct_builds_them() -> None:
    from kvwatch.core.events import UsageSample

    line = COMMON[0]
    (event,) = _fast(line) or ()
    constructed = UsageSample.model_construct(**{k: getattr(event, k) for k in event.model_fields_set})
    assert list(event.__dict__.items()) == list(constructed.__dict__.items())
    assert event.model_fields_set == constructed.model_fields_set
    assert UsageSample.__pydantic_post_init__ is None  # model_construct would run it
    # Each event has its own fields set, so nothing one event's holder does reaches another's.
    again = _fast(line)
    assert again is not None and again[0].model_fields_set is not event.model_fields_set


def test_shape_cache_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastpath, "_SHAPES", {})
    monkeypatch.setattr(fastpath, "_MAX_SHAPES", 3)
    lines = [f"[2026-03-17 15:00:10 TP{n}] Decode batch, #running-req: {n}" for n in range(10)]
    for line in lines:
        identical_events(_fast(line) or (), _general(line))
    assert len(fastpath._SHAPES) <= 3
