"""The sidecar's view of each configured source: what it reads with and what it has counted."""

from __future__ import annotations

import dataclasses
import threading

from kvwatch.core.events import Event
from kvwatch.export.collector import SourceStatus
from kvwatch.parsers.base import ParseError
from kvwatch.sources.lines import LineSplitter
from kvwatch.sources.logfile import LogTailer
from kvwatch.sources.metrics_reader import MetricsReader
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.sources.scrape import Scraper, ScrapeResult

# '--log -' reads ahead of the consumer at most this much: past it, the reader stops reading (the
# pipe's writer then blocks, as with any slow reader), so a flood costs no memory (issue 22: 380 MB
# after 40 s at 9 MB/s) and a stop drains a bounded queue.
STDIN_BACKLOG_LINES = 10_000
STDIN_BACKLOG_CHARS = 4 * 1024 * 1024


class StdinBacklog:
    """Lines read from stdin and not yet applied, bounded in lines and characters (thread-safe)."""

    def __init__(self, max_lines: int = STDIN_BACKLOG_LINES, max_chars: int = STDIN_BACKLOG_CHARS) -> None:
        self.max_lines = max_lines
        self.max_chars = max_chars
        self.lines = 0
        self.chars = 0
        self._changed = threading.Condition()

    def admit(self, chars: int, stop: threading.Event) -> bool:
        """Wait for room for one line of ``chars`` characters (always room when empty: one line of any
        length passes); False when ``stop`` is set first."""
        with self._changed:
            while self.lines and (self.lines >= self.max_lines or self.chars + chars > self.max_chars):
                if stop.is_set():
                    return False
                self._changed.wait(0.1)
            self.lines += 1
            self.chars += chars
            return True

    def done(self, chars: int) -> None:
        """One admitted line was applied."""
        with self._changed:
            self.lines -= 1
            self.chars -= chars
            self._changed.notify()


@dataclasses.dataclass
class LogSource:
    """One --log: its tailer and line pipeline. Counters are written by one thread each."""

    name: str
    pattern: str
    pipeline: LinePipeline
    tailer: LogTailer | None = None
    stdin_up: bool = True
    # '--log -': the splitter reading stdin (its count of lines cut at the cap), once it runs.
    stdin_splitter: LineSplitter | None = None
    # '--log -': the lines read and not yet applied.
    stdin_backlog: StdinBacklog | None = None

    def on_line(self, line: str) -> tuple[Event, ...]:
        """Parse and apply one line at once; returns the events it produced.

        Called by whichever thread read the line -- the tailer's, or an HTTP worker serving a
        scrape (``Sidecar.refresh``) -- under the tailer's delivery lock, one line at a time in file
        order; for stdin, by the consumer. Applying lines where they are read needs no hand-off to
        another thread (a wake-up per line, the sidecar's main CPU cost at a steady line rate), and
        lets a save pause delivery to get a state that holds exactly the lines before the saved
        positions.
        """
        return self.pipeline.feed(line)

    def _split_truncated(self) -> int:
        if self.tailer is not None:
            return self.tailer.truncated_lines
        return self.stdin_splitter.truncated if self.stdin_splitter is not None else 0

    def status(self) -> SourceStatus:
        """Self-metrics of this log, for the collector."""
        tailer = self.tailer
        return SourceStatus(
            name=self.name,
            kind="log",
            up=tailer.up if tailer is not None else self.stdin_up,
            lines_read=self.pipeline.lines_read,
            lines_matched=self.pipeline.lines_matched,
            parse_errors=self.pipeline.parse_errors,
            # The splitter cuts a line at the cap before the pipeline sees it; the pipeline's own
            # count is for lines handed to it whole.
            lines_truncated=self.pipeline.lines_truncated + self._split_truncated(),
            rotations=tailer.rotations if tailer is not None else 0,
            read_errors=tailer.read_errors if tailer is not None else 0,
            stdin_backlog=self.stdin_backlog.lines if self.stdin_backlog is not None else None,
        )


@dataclasses.dataclass
class ScrapeSource:
    """One --metrics-url: its scraper and reader (used by its scrape thread only) and last result
    (written by the consumer only)."""

    name: str
    scraper: Scraper
    reader: MetricsReader
    up: bool = False
    duration: float | None = None
    errors: dict[str, int] = dataclasses.field(default_factory=dict)

    def scrape(self) -> tuple[ScrapeResult, tuple[Event, ...], str | None]:
        """Fetch and read one body as it arrives (the scrape thread; only it uses ``reader``): the
        fetch, its events, and why the body was unreadable (None when it was read)."""
        body = self.reader.stream()
        result = self.scraper.fetch(body.feed)
        if not result.ok:
            return result, (), None
        try:
            return result, body.finish(), None
        except ParseError as exc:
            return result, (), str(exc)

    def status(self) -> SourceStatus:
        """Self-metrics of this endpoint, for the collector."""
        return SourceStatus(
            name=self.name,
            kind="metrics",
            up=self.up,
            scrape_duration_seconds=self.duration,
            scrape_errors=dict(self.errors),
            # (Ints the scrape thread updates: reading one from here is atomic.)
            series_dropped=self.reader.dropped_series,
            unusable_values=self.reader.bad_values,
        )
