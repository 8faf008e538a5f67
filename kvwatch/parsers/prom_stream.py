"""Prometheus text exposition, read line by line in bounded memory, keeping only what kvwatch reads.

An engine's /metrics can hold 100k series (per-LoRA histograms, label churn) of which kvwatch reads
a few dozen. ``ExpositionStream`` takes the body in chunks as it arrives (``feed``), checks every
line's syntax (so an HTML error page or a truncated body is still a ParseError, as with
prometheus_client's parser, whose typing rules it follows), but builds a ``Sample`` only for the
series whose name (its engine prefix stripped) is in the engine dialect's ``wanted`` set. What it
holds at any time is one partial line (at most ``MAX_LINE_CHARS``) and at most
``MAX_KEPT_SERIES`` kept samples per engine; further kept series are dropped and counted in
``dropped``. Pure: no I/O, clock or logging.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvwatch.parsers.samples import Sample

# A line longer than this is not an engine's exposition (real lines are well under 1 KiB).
MAX_LINE_CHARS = 64 * 1024
# Series of the families kvwatch reads, per scrape: beyond it a series is dropped and counted.
MAX_KEPT_SERIES = 10_000

# Linear in the line (a 64 KiB line is the cap): every repeat is possessive (what it gives back
# could never be read by what follows it), so a near miss such as 'x{a="b"' + 65,000 blanks + 'z' is
# refused in one pass instead of one per way of sharing the blanks between two repeats (issue 22).
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*+")
_LABEL = r'[ \t]*+[a-zA-Z_][a-zA-Z0-9_]*+[ \t]*+=[ \t]*+"(?:[^"\\]|\\.)*+"[ \t]*+'
_SAMPLE = re.compile(
    r"(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*+)"
    rf"(?:[ \t]*+\{{(?P<labels>(?:{_LABEL},)*+(?:{_LABEL})?+[ \t]*+)\}}[ \t]*+|[ \t]++)"
    r"(?P<rest>\S.*)"
)
# finditer tries every position: the lookbehind fails at once inside a run of blanks or of a name,
# which the attempt at the run's start has already read to its end.
_PAIR = re.compile(
    r'(?<![ \t\w])[ \t]*+([a-zA-Z_][a-zA-Z0-9_]*+)[ \t]*+=[ \t]*+"((?:[^"\\]|\\.)*+)"[ \t]*+,?'
)
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_ALLOWED_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}


@dataclass(frozen=True)
class Dialect:
    """What the stream needs of one engine's MetricsDialect."""

    prefix: re.Pattern[str]
    wanted: frozenset[str]
    identity_labels: frozenset[str]
    # A series' labels -> (engine instance, (tp, pp, ep) rank or None).
    identity: Callable[[Mapping[str, str]], tuple[str, tuple[int, int, int] | None]]


def _value(text: str) -> float:
    if "_" in text:  # float() reads '1_000'; the exposition format does not
        raise ValueError(f"invalid value {text!r}")
    return float(text)


def key_labels(key: str) -> dict[str, str]:
    """The labels of an ``other_counters`` key (``name{labels}`` as written)."""
    start = key.find("{")
    return _labels(key[start + 1 : key.rindex("}")]) if start >= 0 else {}


def _labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for m in _PAIR.finditer(text):
        key, value = m.group(1), m.group(2)
        if key in out:
            raise ValueError(f"duplicate label {key!r}")
        out[key] = _ESCAPE.sub(lambda e: _UNESCAPED[e.group(0)], value) if "\\" in value else value
    return out


class ExpositionStream:
    """One body's lines -> the kept samples of each candidate engine, and prefix counts for detection."""

    def __init__(self, dialects: Mapping[str, Dialect]) -> None:
        self._dialects = dict(dialects)
        self.kept: dict[str, list[Sample]] = {name: [] for name in dialects}
        # The other counters (and `_created` timestamps) of each engine: line key (name and labels as
        # written) -> value, so that an engine restart still shows in a counter kvwatch does not read.
        self.other_counters: dict[str, dict[str, float]] = {name: {} for name in dialects}
        self.prefix_counts: dict[str, int] = dict.fromkeys(dialects, 0)
        self.dropped = 0
        self.lines = 0
        self.error: str | None = None
        self._partial = ""
        # The family the last HELP/TYPE line opened, as prometheus_client's parser tracks it.
        self._family = ""
        self._type = "untyped"
        self._allowed: tuple[str, ...] = ()

    def feed(self, chunk: str) -> None:
        """Take the next piece of the body (any split, even inside a line)."""
        if self.error is not None or not chunk:
            return
        text = self._partial + chunk
        start = 0
        while True:
            end = text.find("\n", start)
            if end < 0:
                break
            self._line(text[start:end])
            if self.error is not None:
                return
            start = end + 1
        self._partial = text[start:]
        if len(self._partial) > MAX_LINE_CHARS:
            self.error = f"a line longer than {MAX_LINE_CHARS} characters"

    def close(self) -> None:
        """The body ended: read its last line (which need not end in a newline)."""
        if self.error is None and self._partial:
            self._line(self._partial)
        self._partial = ""

    def _line(self, raw: str) -> None:
        if len(raw) > MAX_LINE_CHARS:
            self.error = f"a line longer than {MAX_LINE_CHARS} characters"
            return
        line = raw.strip()
        if not line:
            return
        self.lines += 1
        try:
            if line[0] == "#":
                self._comment(line)
            else:
                self._sample(line)
        except ValueError as exc:
            self.error = f"line {self.lines}: {exc}: {line[:120]!r}"

    def _comment(self, line: str) -> None:
        parts = line.split(None, 3)
        if len(parts) < 3 or parts[1] not in ("TYPE", "HELP"):
            return
        name = parts[2]
        if name.startswith('"') and name.endswith('"') and len(name) > 1:
            name = name[1:-1]
        elif not _NAME.fullmatch(name):
            raise ValueError("invalid metric name")
        if parts[1] == "HELP":
            if name != self._family:
                self._family, self._type, self._allowed = name, "untyped", (name,)
            return
        if len(parts) < 4:
            raise ValueError("TYPE without a type")
        self._family = name
        self._type = parts[3]
        self._allowed = tuple(name + s for s in _ALLOWED_SUFFIXES.get(self._type, ("",)))

    def _sample(self, line: str) -> None:
        m = _SAMPLE.fullmatch(line)
        if m is None:
            raise ValueError("not a sample")
        value = _value(m.group("rest").split(None, 1)[0])
        exposed = m.group("name")
        if exposed in self._allowed:
            family_type = self._type
            if family_type == "counter" and not self._family.endswith("_total"):
                exposed += "_total"  # prometheus_client names a counter's sample <family>_total
        else:
            family_type = "untyped"
            self._family, self._type, self._allowed = "", "untyped", ()
        for engine, dialect in self._dialects.items():
            prefixed = dialect.prefix.match(exposed)
            if prefixed is None:
                continue
            self.prefix_counts[engine] += 1
            name = prefixed.group("name")
            counter = name.endswith("_total") and family_type in ("counter", "unknown", "untyped")
            if name not in dialect.wanted:
                other = self.other_counters[engine]
                if (counter or name.endswith("_created")) and len(other) < MAX_KEPT_SERIES:
                    other[line[: m.start("rest")].rstrip()] = value
                continue
            kept = self.kept[engine]
            if len(kept) >= MAX_KEPT_SERIES:
                self.dropped += 1
                continue
            labels = _labels(m.group("labels") or "")
            instance, rank = dialect.identity(labels)
            series = tuple(sorted((k, v) for k, v in labels.items() if k not in dialect.identity_labels))
            kept.append(Sample(name, exposed, labels, value, instance, rank, series, counter))
