"""SGLang's whole-line fast path: the Prefill/Decode batch line, prefixes included, in one stdlib match.

On a busy SGLang server the batch lines are nearly every line that carries a fact. As for vLLM
(kvwatch/engines/vllm/fastpath.py), the pipeline hands every claimed line to ``parse_lines`` (the
engine's ``LogDialect.fast_path``) before the general path (prefix peeling + ``log.parse``), the
sidecar one line at a time and replay a block's lines at once; tests hold the two paths equal
event for event.
"""

from __future__ import annotations

import re
from decimal import Decimal
from functools import lru_cache
from typing import Any

from kvwatch.core.events import Event, UsageSample
from kvwatch.engines.sglang.stats import _USAGE_KEYS, BatchValues, usage_sample
from kvwatch.parsers.base import LineMeta
from kvwatch.parsers.prefix import SGLANG, fast_identity, fast_prefix

# The batch line as stats.parse_batch reads it, behind the prefixes strip_prefixes reads most often
# (prefix.fast_prefix over prefix.SGLANG: the same layer definitions strip_prefixes compiles), as
# one stdlib bytes pattern over raw lines. The head is stats._BATCH_HEAD's (every release's shape:
# 'Decode batch, ', 'Decode batch. ', 'Decode batch [1240], ', 'Prefill batch(mixed #running-req:
# N). '); then a list of 'key: value' items, each separated by exactly ', ', optionally ended by
# ',' or ', '. Each of stats._USAGE_KEYS (the one key table) is its own alternative with the clean
# value its kind converts (ASCII digits only); any other key is matched and ignored, as
# _batch_fields ignores it, with a value of plain characters. A known key with any other value (a
# damaged column, a 0.4.9 'full=.., swa=..' pair) matches no alternative, so the line is left to
# the general path, which skips or splits that value: the fast path never guesses one. Items
# keep their last capture across the repetition, which is _batch_fields' "last one wins".
# Characters that would make strip_prefixes do more ('[' of a Ray '[repeated Nx', a trailing
# '(file.py:N)', tabs, ANSI, non-ASCII) are not admitted in the items.
_KEYS: tuple[tuple[str, str, str], ...] = tuple((k, f, kind) for k, (f, kind) in _USAGE_KEYS.items())
_INT = r"[0-9]+"
_NUM = r"[0-9]+(?:\.[0-9]+)?"
_VALUE = {"int": f"({_INT})", "float": f"({_NUM})", "ratio": f"({_NUM})", "percent": f"({_NUM})%"}
_KNOWN = "|".join(re.escape(key) + ": " + _VALUE[kind] for key, _, kind in _KEYS)
_KEY_CHAR = r"[^\x00-\x20,:\[\]\x7f-\xff]"  # printable ASCII but space, ',', ':', '[', ']'
_VALUE_CHAR = r"[^\x00-\x20,:\[\]()\x7f-\xff]"
_OTHER = (
    "(?!(?:" + "|".join(re.escape(key) for key, _, _ in _KEYS) + "):)"
    rf"{_KEY_CHAR}+(?: {_KEY_CHAR}+)*: {_VALUE_CHAR}+(?: {_VALUE_CHAR}+)*"
)
_ITEM = f"(?:{_KNOWN}|{_OTHER})"
_BATCH_BODY = (
    r"(?:Prefill|Decode) batch"
    r"(?: ?\[[0-9]++\] *+,?|\(mixed #running-req: ([0-9]+)\)\.?|[.,])? *+(?=#)"  # possessive, as there
    rf"(?:{_ITEM}(?:, |,?(?=\r*$)))+\r*"  # (one copy of _ITEM: its groups are the row's)
)
# Over many lines joined by b'\n', one findall row per line (the second alternative takes any
# other line, its groups all empty), so the per-line match calls are made in C.
_FAST_BATCH_LINES = re.compile(
    ("^(?:" + fast_prefix(SGLANG) + _BATCH_BODY + "|[^\n]*)$").encode("ascii"), re.MULTILINE
)
_PREFIX_ROW = ("cts", "p1name", "p2name", "ts", "tags")
if tuple(sorted(_FAST_BATCH_LINES.groupindex, key=_FAST_BATCH_LINES.groupindex.__getitem__)) != _PREFIX_ROW:
    raise AssertionError("fast batch pattern: its named groups are not in _PREFIX_ROW's order")
# Unnamed groups follow the named ones: the mixed head's running count, then one per _KEYS entry.
_TS = _PREFIX_ROW.index("ts")
_MIXED = len(_PREFIX_ROW)
_FIRST_KEY = _MIXED + 1
if _FAST_BATCH_LINES.groups != _FIRST_KEY + len(_KEYS):
    raise AssertionError("fast batch pattern: one group per key expected")


def _percent(value: bytes) -> float:
    return float(Decimal(value.decode()) / 100)  # stats._convert's 'percent'


_CONVERT: dict[str, Any] = {"int": int, "float": float, "ratio": float, "percent": _percent}
# Per key group: (UsageSample field, converter), in group order.
_FIELDS: tuple[tuple[str, Any], ...] = tuple((field, _CONVERT[kind]) for _, field, kind in _KEYS)

# A row's shape: (the prefix groups that name the printer, then which value groups it fills). Per
# shape, what every row of it shares: the event without ts and the values (its printer's instance
# and rank), and (group, field, converter) per value; None when the general path must read such
# rows. A row's event is a copy of its shape's (stats.usage_sample of no values, so it names every
# field the general path names) with the row's values (``model_copy(update=...)``,
# pydantic's own constructor for values already in their field types: the pattern and converters
# gave them); tests compare them with validated ones, attribute by attribute.
ShapeKey = tuple[Any, ...]
Shape = tuple[UsageSample, tuple[tuple[int, str, Any], ...]] | None
_SHAPES: dict[ShapeKey, Shape] = {}
_MAX_SHAPES = 4096
_UNKNOWN: Shape = (UsageSample(engine="sglang"), ())


def _shape(key: ShapeKey) -> Shape:
    """What rows of shape ``key`` share, or None for a row the general path must read: one without a
    readable field (it counts a parse error), or where two keys fill one field ('#token' and
    '#full token': only the items' order says which one _batch_fields keeps, and a row has lost
    that order)."""
    p1name, p2name, tags, mixed, *present = key
    plan = [
        (_FIRST_KEY + i, f, c)
        for i, ((f, c), there) in enumerate(zip(_FIELDS, present, strict=True))
        if there
    ]
    fields = [f for _, f, _ in plan]
    shape: Shape = None
    if len(set(fields)) == len(fields):
        if mixed and "running" not in fields:
            plan.append((_MIXED, "running", int))  # stats.parse_batch: the mixed head's count
        if plan:
            instance, rank = _identity(p1name, p2name, tags) if p1name or p2name or tags else ("0", None)
            shape = (usage_sample(LineMeta(instance=instance, rank=rank), BatchValues()), tuple(plan))
    if len(_SHAPES) >= _MAX_SHAPES:
        _SHAPES.clear()  # shapes come from the log: forgetting them only costs rebuilding them
    _SHAPES[key] = shape
    return shape


@lru_cache(maxsize=256)
def _identity(p1name: bytes, p2name: bytes, tags: bytes) -> tuple[str, int | None]:
    instance, rank = fast_identity(p1name.decode(), p2name.decode(), tags.decode())
    return ("0" if instance is None else instance), rank


def parse_lines(lines: list[bytes]) -> list[tuple[Event, ...] | None]:
    """Per raw line (UTF-8, no b'\\n'), its events when it is a batch line in a common shape, else
    None (then prefix peeling + ``log.parse`` read it).

    Equal, event for event, to ``parse(*strip_prefixes(line))`` on every line it answers: the
    prefixes are read as strip_prefixes reads them (process names, then the SGLang tags), and the
    values go through _batch_fields' conversions. All lines are matched in one call. A line with
    b'\\n' in it (not a line) leaves every answer None.
    """
    if not lines:
        return []
    rows = _FAST_BATCH_LINES.findall(b"\n".join(lines))
    if len(rows) != len(lines):
        return [None] * len(lines)
    out: list[tuple[Event, ...] | None] = []
    shapes, unknown = _SHAPES, _UNKNOWN
    for row in rows:
        # (Absent groups are b'': every group that takes part in a match is non-empty, ts always.)
        if not row[_TS]:
            out.append(None)
            continue
        key = (row[1], row[2], row[4], *map(bool, row[_MIXED:]))
        shape = shapes.get(key, unknown)
        if shape is unknown:
            shape = _shape(key)
        if shape is None:
            out.append(None)
            continue
        printer, plan = shape
        values: dict[str, object] = {"ts": row[_TS].decode()}
        for i, field, convert in plan:
            values[field] = convert(row[i])
        out.append((printer.model_copy(update=values),))
    return out
