"""The sidecar's view of each configured source: what it reads with and what it has counted."""

from __future__ import annotations

import dataclasses
import logging
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


log = logging.getLogger("kvwatch")
# A failing --metrics-url is logged at its first failure and then at most once per this many
# seconds (with the count since).
SCRAPE_WARN_INTERVAL = 60.0


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

        Called by whichever thread read the line -- the tailer's, or the consumer reading the
        appends for a scrape (``Sidecar.refresh``) -- under the tailer's delivery lock, one line at a time in file
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
    # The consumer's rate limit of failure warnings: when it last wrote one, and the failures since.
    warned_at: float | None = None
    unlogged: int = 0

    def log_failure(self, reason: str, detail: str | None, now: float) -> None:
        """Log a failed scrape: the first at once, then at most one per SCRAPE_WARN_INTERVAL with
        the count since, so a down engine neither fills the log nor goes unseen."""
        if self.warned_at is not None and now - self.warned_at < SCRAPE_WARN_INTERVAL:
            self.unlogged += 1
            return
        since = f" ({self.unlogged} more failures since the last warning)" if self.unlogged else ""
        log.warning(
            "scrape failed source=%s url=%s reason=%s err=%s%s",
            self.name,
            self.scraper.url,
            reason,
            detail or "-",
            since,
        )
        self.warned_at, self.unlogged = now, 0

    def log_recovery(self) -> None:
        """A scrape that works again after failures says so once."""
        if self.warned_at is not None:
            log.info("scrape recovered source=%s url=%s", self.name, self.scraper.url)
            self.warned_at, self.unlogged = None, 0

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
