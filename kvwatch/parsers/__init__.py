"""Pure log-line parsers: prefix stripping, then one module per engine (see base.py for the contract).

``PARSERS`` maps an engine to its body parser and ``ANCHORS`` to the substrings every line that
parser claims contains, so callers can drop uninteresting lines with a few substring checks.
"""

from __future__ import annotations

from collections.abc import Callable

from kvwatch.events import Engine, Event
from kvwatch.parsers import sglang, vllm
from kvwatch.parsers.base import ParseFn

PARSERS: dict[Engine, ParseFn] = {"vllm": vllm.parse, "sglang": sglang.parse}

# Whole-line fast paths: the events of a raw line in an engine's most frequent shape (prefixes
# included), or None for any other line, which then goes through strip_prefixes and PARSERS.
# BLOCK_PARSERS do the same for a list of raw UTF-8 lines without b'\n', one result per line.
LineParseFn = Callable[[str], "tuple[Event, ...] | None"]
BlockParseFn = Callable[[list[bytes]], "list[tuple[Event, ...] | None]"]
LINE_PARSERS: dict[Engine, LineParseFn] = {"vllm": vllm.parse_line}
BLOCK_PARSERS: dict[Engine, BlockParseFn] = {"vllm": vllm.parse_lines}
ANCHORS: dict[Engine, tuple[str, ...]] = {"vllm": vllm.ANCHORS, "sglang": sglang.ANCHORS}

# Every anchor of every engine, for sources whose engine is not known yet.
ALL_ANCHORS: tuple[str, ...] = tuple(dict.fromkeys(a for anchors in ANCHORS.values() for a in anchors))
