"""The sidecar's view of each configured source: what it reads with and what it has counted."""

from __future__ import annotations

import dataclasses

from kvwatch.core.events import Event
from kvwatch.export.collector import SourceStatus
from kvwatch.parsers.base import ParseError
from kvwatch.sources.lines import LineSplitter
from kvwatch.sources.logfile import LogTailer
from kvwatch.sources.metrics_reader import MetricsReader
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.sources.scrape import Scraper, ScrapeResult


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

    def on_lines(self, lines: list[str]) -> tuple[Event, ...]:
        """``on_line`` for a read chunk's lines, in order (the tailer's call per chunk): one
        callback for a busy log's thousands of lines."""
        feed = self.pipeline.feed
        out: list[Event] = []
        for line in lines:
            events = feed(line)
            if events:
                out.extend(events)
        return tuple(out)

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
