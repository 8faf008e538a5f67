"""LineSplitter: whole lines out of arbitrary chunks, bounded memory, never an exception on bad bytes."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.sources.lines import LineSplitter


def test_partial_line_is_kept_until_its_newline() -> None:
    s = LineSplitter()
    assert s.feed(b"INFO 07-01 kv cache ") == []
    assert s.pending_bytes == len(b"INFO 07-01 kv cache ")
    assert s.feed(b"size: 10 tokens\nnext") == ["INFO 07-01 kv cache size: 10 tokens"]
    assert s.pending_bytes == 4
    assert s.feed(b"\n") == ["next"]
    assert s.pending_bytes == 0


_LINE_END = re.compile(rb"\r\n|\r|\n")


def test_crlf_and_lf_are_both_stripped_and_empty_lines_kept() -> None:
    s = LineSplitter()
    assert s.feed(b"a\r\nb\n\r\n\nc\r") == ["a", "b", "", "", "c"]
    # A CR that ends a chunk and the LF that opens the next are one CRLF, not two line ends.
    assert s.feed(b"\nd\n") == ["d"]


def test_lone_cr_ends_a_line_as_progress_bars_write_it() -> None:
    """tqdm redraws with a bare CR: each redraw is a line, and a log line after the bar is its own."""
    s = LineSplitter()
    assert s.feed(b"progress 10%\rprogress 20%\rINFO GPU KV cache size: 5 tokens\n") == [
        "progress 10%",
        "progress 20%",
        "INFO GPU KV cache size: 5 tokens",
    ]
    assert s.feed(b"a\r") == ["a"]
    assert s.feed(b"b\r\r\n") == ["b", ""]


def test_invalid_utf8_becomes_replacement_characters() -> None:
    s = LineSplitter()
    assert s.feed(b"GPU KV cache \xff\xfe size\n") == ["GPU KV cache \ufffd\ufffd size"]


def test_multibyte_character_split_across_chunks_decodes_whole() -> None:
    s = LineSplitter()
    data = "Qwen3 — 64 GiB\n".encode()
    cut = data.index(b"\xe2") + 1
    assert s.feed(data[:cut]) == []
    assert s.feed(data[cut:]) == ["Qwen3 — 64 GiB"]


def test_long_line_in_one_chunk_is_truncated_and_counted() -> None:
    s = LineSplitter(max_line_chars=10)
    assert s.feed(b"x" * 100 + b"\nshort\n") == ["x" * 10, "short"]
    assert s.truncated == 1


def test_runaway_line_without_newline_keeps_memory_bounded() -> None:
    s = LineSplitter(max_line_chars=8)
    for _ in range(1000):
        assert s.feed(b"y" * 1000) == []
    # Only 4 bytes per allowed character (and one more) are kept; the rest is counted, not stored.
    assert len(s._buf) <= (8 + 1) * 4
    assert s.pending_bytes == 1_000_000
    assert s.feed(b"tail\nok\n") == ["y" * 8, "ok"]
    assert s.truncated == 1
    assert s.pending_bytes == 0


def test_truncation_counts_characters_not_bytes() -> None:
    s = LineSplitter(max_line_chars=3)
    # Three 3-byte characters fit exactly; four do not.
    assert s.feed("ééé\n".encode() + "€€€\n".encode() + "€€€€\n".encode()) == ["ééé", "€€€", "€€€"]
    assert s.truncated == 1


def test_flush_returns_the_unterminated_tail_once() -> None:
    s = LineSplitter()
    s.feed(b"last words")
    assert s.flush() == "last words"
    assert s.flush() is None
    assert s.feed(b"\n") == [""]


def test_reset_drops_the_tail() -> None:
    s = LineSplitter()
    s.feed(b"half a li")
    s.reset()
    assert s.feed(b"new line\n") == ["new line"]


@given(
    lines=st.lists(
        st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\n\r"), max_size=40), max_size=30
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=20),
    crlf=st.booleans(),
)
def test_any_chunking_gives_the_same_lines(lines: list[str], cuts: list[int], crlf: bool) -> None:
    end = "\r\n" if crlf else "\n"
    data = "".join(line + end for line in lines).encode()
    points = sorted({c % (len(data) + 1) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    s = LineSplitter()
    out: list[str] = []
    for chunk in chunks:
        out.extend(s.feed(chunk))
    assert out == lines
    assert s.flush() is None


@given(data=st.binary(max_size=300), cap=st.integers(min_value=1, max_value=20))
def test_arbitrary_bytes_never_raise_and_respect_the_cap(data: bytes, cap: int) -> None:
    s = LineSplitter(max_line_chars=cap)
    out = s.feed(data)
    tail = s.flush()
    if tail is not None:
        out.append(tail)
    assert all(len(line) <= cap for line in out)
    ends = len(_LINE_END.findall(data))
    assert len(out) == ends + (0 if data.endswith((b"\n", b"\r")) or not data else 1)


def test_feed_ends_gives_the_offset_after_each_terminator() -> None:
    s = LineSplitter()
    assert s.feed_ends(b"a\rb\r\nc\nd\r") == [("a", 2), ("b", 5), ("c", 7), ("d", 9)]
    # The LF completing that CRLF is no line of its own.
    assert s.feed_ends(b"\ne\n") == [("e", 3)]
    assert s.feed_ends(b"par") == []
    assert s.feed_ends(b"tial\r\n") == [("partial", 6)]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(min_value=4, max_value=64))
def test_a_block_decoded_at_once_is_the_lines_decoded_one_by_one(data: bytes, cap: int) -> None:
    """feed decodes a block of short lines in one call: the same text as line by line, invalid
    UTF-8 replaced alike, however the bytes fall."""
    splitter = LineSplitter(cap)
    got = splitter.feed(data)
    pieces = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")[:-1]
    expected = [p.decode("utf-8", errors="replace")[:cap] for p in pieces]
    assert got == expected
