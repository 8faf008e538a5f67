"""The line pipeline shared by the sidecar and the offline commands: one shape for both.

bytes -> ``LineSplitter`` (kvwatch/sources/lines.py, the only splitter) -> lines -> the engine's
fast path (``LogDialect.fast_path``: its most frequent line, prefixes included, in one match) or
else prefix peeling (kvwatch/parsers/prefix.py, one prefix grammar) and the engine's table
dispatch (``LogDialect.parse``) -> events -> Fleet.

``LinePipeline.feed`` takes one decoded line (the sidecar's tailer, stdin); ``feed_block`` takes a
block of raw lines, drops its access-log lines in bulk (kvwatch/sources/access.py) and hands the
rest to ``feed_filtered``, which decodes only the lines the fast path does not answer. Both drop a
line without an anchor phrase after a few substring checks (almost every line of a busy server),
detect the engine, and fold the events into the Fleet under the pipeline's source; they never
raise and never read files or clocks, and leave the same events, counters and state for the same
lines (but for lines over the length cap, which ``feed`` cuts before it looks at them and the
bulk drop reads whole). ``replay`` reads files to EOF (the ``kvwatch parse`` command and the golden tests)
through ``access.filtered_blocks`` into ``feed_filtered``: the same two stages, the first one in a
helper process for a large file; kvwatch/commands/summary.py turns the resulting snapshots into the
``parse`` output.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

from kvwatch.core.events import EngineSettings, Event, Preemption, StartupFailure, UsageSample
from kvwatch.core.kinds import EngineChoice, EngineName
from kvwatch.engines import registry
from kvwatch.engines.base import FastPathFn
from kvwatch.parsers.base import ParseFn
from kvwatch.parsers.prefix import strip_embedded, strip_prefixes
from kvwatch.sources.access import ACCESS_MARK, drop_access_lines, filtered_blocks
from kvwatch.state.fleet import Fleet, InstanceSnapshot

DEFAULT_MAX_LINE_CHARS = 65536

_MAX_REMEMBERED_FAILURES = 256

# Event types _dedupe may drop or that reset what it remembers.
_DEDUPED = (EngineSettings, Preemption, StartupFailure)


class LinePipeline:
    """One source's lines -> events applied to ``fleet`` under ``source``.

    Counters (exported by the sidecar): ``lines_read`` every line fed, ``lines_matched`` lines that
    produced at least one event, ``parse_errors`` lines a pattern claimed but could not convert,
    ``lines_truncated`` lines cut to ``max_line_chars``.
    """

    def __init__(
        self,
        source: str,
        fleet: Fleet,
        engine: EngineChoice = "auto",
        max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
    ) -> None:
        self.source = source
        self.fleet = fleet
        self.max_line_chars = max_line_chars
        self.lines_read = 0
        self.lines_matched = 0
        self.parse_errors = 0
        self.lines_truncated = 0
        self.engine: EngineName | None = None
        self._anchors: tuple[str, ...] = registry.all_anchors()
        self._parser: ParseFn | None = None
        self._fast: FastPathFn | None = None
        # Last startup failure per instance: the same error printed by every TP rank (or by a worker
        # and again by the driver's traceback) is one failure.
        self._last_failure: dict[str, dict[str, object]] = {}
        # Per instance, the lowest TP rank that has reported preemptions: SGLang's scheduler on every
        # TP rank prints the same retraction, which is one retraction, not tp_size of them.
        self._preemption_rank: dict[str, int] = {}
        if engine != "auto":
            self._set_engine(engine)

    def _set_engine(self, engine: EngineName) -> None:
        found = registry.ENGINES[engine]
        dialect = found.log
        self.engine = engine
        self._anchors = found.anchors
        self._parser = dialect.parse
        self._fast = dialect.fast_path

    def feed(self, line: str) -> tuple[Event, ...]:
        """Process one physical line (its terminator may be attached); returns the events applied."""
        self.lines_read += 1
        if len(line) > self.max_line_chars:
            line = line[: self.max_line_chars]
            self.lines_truncated += 1
        if ACCESS_MARK in line:
            return ()
        for anchor in self._anchors:
            if anchor in line:
                return self._claimed(line)
        return ()

    def feed_block(
        self,
        block: bytes | bytearray,
        on_events: Callable[[tuple[Event, ...]], None] | None = None,
        pos: int = 0,
        endpos: int | None = None,
    ) -> None:
        """``feed`` over raw UTF-8 lines (replay's hot path).

        ``block[pos:endpos]`` holds whole lines, each preceded by b"\\n" (so an empty range has no
        line and b"\\n" alone is one empty line). Its access-log lines are dropped in bulk
        (kvwatch/sources/access.py), the rest go to ``feed_filtered``.
        """
        self.feed_filtered(*drop_access_lines(block, pos, endpos), on_events)

    def feed_filtered(
        self,
        rest: bytes,
        dropped: int,
        on_events: Callable[[tuple[Event, ...]], None] | None = None,
    ) -> None:
        """A block's lines after ``drop_access_lines`` (``rest``, each line preceded by b"\\n"; the
        ``dropped`` access lines count as read): the same checks as ``feed``, in order, each line
        decoded (invalid UTF-8 replaced, as a text stream with errors="replace" would) unless the
        engine's block parser answers it from the raw bytes. ``lines_read`` counts every line.
        """
        found = rest.split(b"\n")  # b"" before the first b"\n", then one item per other line
        self.lines_read += dropped + len(found) - 1
        raw_lines = list(filter(None, found))
        if not raw_lines:
            return
        limit = self.max_line_chars
        anchors = self._anchors
        # The engine's most frequent line shape (a stats line), matched for all raw lines at once,
        # so those lines are never decoded; its events are the general path's, so they are
        # counted, deduplicated and applied as in _claimed. They wait in `pending` and reach the
        # Fleet in one call (one lock) at the end of the block or before any other line is
        # claimed, so it sees every event in order (on_events may see them first; it is never
        # given the Fleet). A fast row is ASCII: its byte length is its length in characters.
        rows = self._fast_rows(raw_lines)
        base = 0
        pending: list[Event] = []
        matched = 0
        for i, raw in enumerate(raw_lines):
            if rows is not None and len(raw) <= limit:
                events = rows[i - base]
                if events is not None:
                    # (A lone usage sample, nearly every time: _dedupe would return it as is, and
                    # isinstance against pydantic classes that do not match is slow.)
                    if len(events) != 1 or type(events[0]) is not UsageSample:
                        events = self._dedupe(events)
                    if events:
                        matched += 1
                        pending.extend(events)
                        if on_events is not None:
                            on_events(events)
                    continue
            # Decoded on its own, as a text stream with errors="replace" would (b"\n" is never
            # part of a UTF-8 sequence).
            line = raw.decode("utf-8", "replace")
            for anchor in anchors:
                if anchor in line:
                    break
            else:
                continue
            if pending:
                self.fleet.apply_all(self.source, pending)
                pending = []
            self.lines_matched += matched
            matched = 0
            if len(line) > limit:
                line = line[:limit]
                self.lines_truncated += 1
            events = self._claimed(line)
            anchors = self._anchors
            if rows is None and self._fast is not None:
                # The engine was detected on this line: the rest of the block can go the fast way.
                base = i + 1
                rows = self._fast_rows(raw_lines[base:])
            if events and on_events is not None:
                on_events(events)
        self.lines_matched += matched
        if pending:
            self.fleet.apply_all(self.source, pending)

    def _fast_rows(self, lines: list[bytes]) -> list[tuple[Event, ...] | None] | None:
        """The fast path's answer per line, or None (no fast path, or it failed: then every line
        takes the general path, which counts what it cannot convert)."""
        if self._fast is None:
            return None
        try:
            return self._fast(lines)
        except Exception:
            return None

    def _claimed(self, line: str) -> tuple[Event, ...]:
        """A line with an anchor: parse it, count the outcome, apply the events."""
        try:
            events = self._parse(line)
        except Exception:
            # A pattern claimed the line but its values did not convert (ParseError), or a parser
            # bug on input nobody foresaw: count it and keep going, the sidecar must not die.
            self.parse_errors += 1
            return ()
        if not events:
            return ()
        events = self._dedupe(events)
        if events:
            self.lines_matched += 1
            self.fleet.apply_all(self.source, events)
        return events

    def _parse(self, line: str) -> tuple[Event, ...]:
        if self.engine is None:
            engine = registry.detect_engine(line)
            if engine is None:
                return ()
            self._set_engine(engine)
            for anchor in self._anchors:
                if anchor in line:
                    break
            else:
                return ()
        if self._fast is not None:
            raw = line.rstrip("\r\n").encode("utf-8", "surrogatepass")
            if b"\n" not in raw:
                (fast,) = self._fast([raw])
                if fast is not None:
                    return fast
        parser = self._parser
        if parser is None:
            return ()
        body, meta = strip_prefixes(line)
        if body and not (body[0].isalpha() or body[0] == "#"):
            # Junk glued before a real prefix ('[Bug] [2026-06-28 15:16:45] ...', a pasted file name).
            second = strip_embedded(body, meta)
            if second is not None:
                body, meta = second
        events = parser(body, meta)
        if not events and ("[" in body or "(" in body):
            second = strip_embedded(body, meta)
            if second is not None:
                events = parser(*second)
        return events

    def _dedupe(self, events: tuple[Event, ...]) -> tuple[Event, ...]:
        for event in events:
            if isinstance(event, _DEDUPED):
                break
        else:
            # Stats lines, nearly every claimed line of a running server: nothing to check.
            return events
        kept: list[Event] = []
        for event in events:
            if isinstance(event, EngineSettings) and event.starts_engine:
                self._last_failure.pop(event.instance, None)
            elif isinstance(event, Preemption) and event.rank is not None:
                reporter = self._preemption_rank.get(event.instance)
                if reporter is not None and event.rank > reporter:
                    continue
                if reporter is None and len(self._preemption_rank) >= _MAX_REMEMBERED_FAILURES:
                    self._preemption_rank.clear()
                self._preemption_rank[event.instance] = event.rank
            elif isinstance(event, StartupFailure):
                facts = event.model_dump(exclude={"rank", "ts"})
                if self._last_failure.get(event.instance) == facts:
                    continue
                if len(self._last_failure) >= _MAX_REMEMBERED_FAILURES:
                    # Instance names come from the log; forgetting only risks counting a repeat twice.
                    self._last_failure.clear()
                self._last_failure[event.instance] = facts
            kept.append(event)
        return tuple(kept)


ProgressFn = Callable[[str, int, int], None]


@dataclass
class ReplayResult:
    """What a replay produced: the fleet it filled and one pipeline per source."""

    fleet: Fleet
    pipelines: list[LinePipeline] = field(default_factory=list)

    @property
    def engine(self) -> EngineName | None:
        """The first engine detected (or forced) across the sources."""
        for p in self.pipelines:
            if p.engine is not None:
                return p.engine
        return None

    def snapshots(self) -> list[InstanceSnapshot]:
        return self.fleet.snapshot()


def _open_binary(path: str) -> io.BufferedIOBase:
    if path == "-":
        return cast(io.BufferedIOBase, sys.stdin.buffer)
    return open(path, "rb")  # noqa: SIM115


def replay(
    paths_or_dash: Sequence[str],
    engine: EngineChoice = "auto",
    fleet: Fleet | None = None,
    on_events: Callable[[tuple[Event, ...]], None] | None = None,
    progress: ProgressFn | None = None,
    max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
    parallel: bool | None = None,
) -> ReplayResult:
    """Read every file (``-`` = stdin) to EOF through its own LinePipeline into one Fleet.

    Each path is one source (named as given, ``stdin`` for ``-``). ``on_events`` sees every
    non-empty event tuple in order; ``progress(source, bytes_done, bytes_total)`` is called after
    every block read from a regular file. A large file's access lines are dropped by a helper
    process (``parallel``: see kvwatch/sources/access.py ``filtered_blocks``). Raises OSError for a
    file that cannot be opened or read.
    """
    result = ReplayResult(fleet=fleet if fleet is not None else Fleet(clock=lambda: 0.0))
    for path in paths_or_dash:
        source = "stdin" if path == "-" else path
        pipeline = LinePipeline(source, result.fleet, engine=engine, max_line_chars=max_line_chars)
        result.pipelines.append(pipeline)
        total = os.path.getsize(path) if path != "-" and progress is not None else 0
        with _open_binary(path) as stream:
            for rest, dropped, done in filtered_blocks(path, stream, max_line_chars, parallel):
                pipeline.feed_filtered(rest, dropped, on_events)
                if progress is not None and total:
                    progress(source, min(done, total), total)
            if progress is not None and total:
                progress(source, total, total)
    return result
