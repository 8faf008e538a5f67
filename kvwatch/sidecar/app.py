"""The sidecar's wiring and lifecycle: sources -> LinePipeline / MetricsReader -> Fleet -> collector -> HTTP.

The consumer thread's work (the queue, the appends a render asks for, the predictions) is in
consumer.py. Every failure of a source is counted and retried; only bad configuration stops startup. Which thread
does what is written once, in the package docstring (kvwatch/sidecar/__init__.py).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping

from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder
from prometheus_client.registry import CollectorRegistry

from kvwatch import __version__
from kvwatch.analysis.predictor import Predictor
from kvwatch.core.errors import ConfigError
from kvwatch.core.jsontypes import JsonObject, JsonValue
from kvwatch.export.collector import KvwatchCollector, SelfStats, SourceStatus
from kvwatch.sidecar import messages as msg
from kvwatch.sidecar.appends import AppendRequests
from kvwatch.sidecar.auth import BasicAuth
from kvwatch.sidecar.config import Settings, WebConfig, load_web_config
from kvwatch.sidecar.consumer import Consumer
from kvwatch.sidecar.http import Endpoints, tls_context
from kvwatch.sidecar.node import LogSources, node_watcher
from kvwatch.sidecar.saving import SaveSchedule
from kvwatch.sidecar.server import BoundedHTTPServer
from kvwatch.sidecar.sources import LogSource, ScrapeSource, StdinBacklog
from kvwatch.sources.hub import discover_model_config
from kvwatch.sources.logfile import FilePosition, LogTailer
from kvwatch.sources.metrics_reader import MetricsReader
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.sources.scrape import Scraper, ScrapeResult
from kvwatch.state.fleet import Fleet
from kvwatch.state.persist import StateStore, restore

log = logging.getLogger("kvwatch")

# Appends are read whenever /metrics is scraped (Sidecar.refresh: by the consumer, for the render),
# so a scrape is current however rarely the tailers look on their own; inotify wakes them at once for created, renamed and deleted
# files. Their own timed look (read appends, re-check every path for a missed event) then only keeps
# the state file current and is the safety net, so it can be rare: every timed wake-up of a thread,
# and the first system calls after it, cost milliseconds of CPU on virtual machines whose idle
# pages the host reclaims (measured in bench/bench_sidecar.py), several times the cost of parsing
# a second's worth of lines.
TAIL_INTERVAL = 10.0
# How long a render waits for the consumer to read the appends (kvwatch.sidecar.appends): far past
# the milliseconds it takes, well within a scraper's timeout (Prometheus: 10 s by default).
APPENDS_WAIT = 2.0
# prometheus_client's name for it (CONTENT_TYPE_PLAIN_0_0_4) exists only since 0.22.
_TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"


class Sidecar:
    """`kvwatch run`: start() brings everything up, stop() takes it down in bounded time."""

    def __init__(
        self,
        settings: Settings,
        *,
        registry: CollectorRegistry | None = None,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.environ = dict(os.environ if environ is None else environ)
        self.fleet = Fleet(clock=clock, max_instances=settings.max_instances, fact_ttl=settings.fact_ttl)
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.web = load_web_config(settings.web_config) if settings.web_config is not None else WebConfig()
        self._tls = tls_context(self.web) if self.web.tls else None
        self.auth = BasicAuth(self.web.basic_auth_users)
        self.store = StateStore(settings.state_dir) if settings.state_dir is not None else None
        for path in settings.model_config_path.values():
            if not path.exists():
                raise ConfigError(f"model config {path} does not exist")
        self.predictor = Predictor(
            model_config=settings.model_config_for,
            gpu_memory_bytes=self._gpu_memory(),
            resolve_model=lambda model: discover_model_config(
                model, self.environ, allow_network=settings.fetch_model_configs
            ),
        )
        self._queue: queue.Queue[msg.Message] = queue.Queue()
        self.appends = AppendRequests(self._queue.put, APPENDS_WAIT)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.node = (
            node_watcher(settings, self.fleet, self._tailer, lambda name: self._positions.get(name))
            if settings.node_logs is not None
            else None
        )
        self._logs = LogSources(
            [
                LogSource(s.name, s.path, LinePipeline(s.name, self.fleet, settings.engine))
                for s in settings.log
            ],
            self.node,
        )
        # Saved tailer positions by source, for node containers found after start.
        self._positions: JsonObject = {}
        self._scrapes = [
            ScrapeSource(
                s.name,
                # --scrape-timeout bounds the whole scrape: connect, headers and body together.
                Scraper(
                    s.url,
                    connect_timeout=settings.scrape_timeout,
                    read_timeout=settings.scrape_timeout,
                    timeout=settings.scrape_timeout,
                ),
                MetricsReader(settings.engine),
            )
            for s in settings.metrics_url
        ]
        self.saves = SaveSchedule(
            self.store,
            self.fleet,
            self._logs,
            lambda: self._queue.put(msg.Dirty()),
            release=settings.release_read,
        )
        self._consumer = Consumer(
            self._queue, self.fleet, self.predictor, self.saves, self.appends, self._logs
        )
        self.collector = KvwatchCollector(
            self.fleet.snapshot,
            self.predictor,
            self.source_statuses,
            lambda: self.fleet.dropped_events,
            self.self_stats,
            runtime=True,
            workload=self.node.workload if self.node is not None else lambda source: None,
            node_stats=self.node.stats if self.node is not None else lambda: None,
            prepared=True,  # a scrape reads the predictions the consumer made, never a config.json
        )
        self.registry.register(self.collector)
        self._server: BoundedHTTPServer | None = None

    def _gpu_memory(self) -> int | None:
        if self.settings.gpu_memory is not None:
            return self.settings.gpu_memory
        if self.settings.gpu is None:
            return None
        from kvwatch.capacity import gpus

        try:
            return int(gpus.lookup(self.settings.gpu).total_bytes)
        except KeyError:
            raise ConfigError(f"unknown GPU {self.settings.gpu!r} (give --gpu-memory SIZE instead)") from None

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Restore the state file, bind the listen address, start consumer, tailers and scrapers."""
        positions: JsonObject = {}
        if self.store is not None:
            saved = self.store.own_and_load()
            # Instances of sources no longer configured would be exported forever: leave them out.
            configured = {s.name for s in self.settings.log} | {s.name for s in self.settings.metrics_url}
            if self.node is not None:
                configured |= self.node.present()
            saved.instances = [st for st in saved.instances if st.source in configured]
            saved.source_settings = {k: v for k, v in saved.source_settings.items() if k in configured}
            left_out = restore(self.fleet, saved)
            positions = self._positions = saved.positions
            if left_out:
                log.warning(
                    "state file holds %d instances, over --max-instances %d: restored the %d most "
                    "recently updated",
                    len(saved.instances),
                    self.settings.max_instances,
                    len(saved.instances) - left_out,
                )
            if saved.instances:
                log.info("state restored path=%s instances=%d", self.store.path, len(saved.instances))
        addr = self.settings.listen
        endpoints = Endpoints(self.render_metrics, self.auth, self.render_status)
        try:
            self._server = BoundedHTTPServer(
                (addr.host, addr.port), endpoints, self._tls, immediate=endpoints.immediate
            )
        except (OSError, ValueError, OverflowError) as exc:  # ValueError: e.g. a host IDNA cannot encode
            if self.store is not None:
                self.store.release()
            reason = getattr(exc, "strerror", None) or exc
            raise ConfigError(f"cannot listen on {addr}: {reason}") from None
        self._spawn("kvwatch-http", self._server.serve)
        self.appends.open()
        self._spawn("kvwatch-consumer", self._consumer.run)
        for src in self._logs.configured:
            if src.pattern == "-":
                self._spawn("kvwatch-stdin", functools.partial(self._read_stdin, src))
                continue
            src.tailer = self._tailer(src, positions.get(src.name))
            src.tailer.start()
        for scrape in self._scrapes:
            self._spawn(f"kvwatch-scrape-{scrape.name}", functools.partial(self._scrape_loop, scrape))
        if self.node is not None:
            self.node.scan_now()  # the containers already there are followed before start returns
            self._spawn("kvwatch-node", functools.partial(self.node.run, self._stop))
        log.debug("kvwatch %s serving %s", __version__, self.url)
        _release_startup_memory()

    def _tailer(self, src: LogSource, saved: JsonValue | None) -> LogTailer:
        release = self.settings.release_read

        def on_line(path: str, line: str) -> None:
            self.saves.mark(src.on_line(line))

        def on_lines(path: str, lines: list[str]) -> None:
            self.saves.mark(src.on_lines(lines))
            if release:
                self.saves.moved()

        def on_rotate(path: str) -> None:
            log.info("log rotated source=%s path=%s", src.name, path)

        def on_error(path: str, exc: BaseException) -> None:
            log.debug("log read error source=%s path=%s err=%s", src.name, path, exc)

        return LogTailer(
            src.pattern,
            on_line,
            on_lines=on_lines,
            on_rotate=on_rotate,
            on_error=on_error,
            polling=self.settings.poll,
            append_interval=TAIL_INTERVAL,
            recheck_interval=TAIL_INTERVAL,
            resume=_load_positions(saved),
        )

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    @property
    def port(self) -> int:
        """The bound port (useful with --listen HOST:0)."""
        assert self._server is not None
        return self._server.port

    @property
    def url(self) -> str:
        """Where /metrics is served."""
        host = self.settings.listen.host
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        shown = "[::1]" if shown == "::" else (f"[{shown}]" if ":" in shown else shown)
        return f"{'https' if self._tls else 'http'}://{shown}:{self.port}/metrics"

    def stop(self) -> None:
        """Save the state while the tailers still hold their files, stop sources, close the server.

        Lines read after that last save are processed, not saved (nor their positions: the next start
        reads them again, once). With no consumer running (before start) nothing is saved or awaited.
        """
        self._stop.set()
        for scrape in self._scrapes:
            scrape.scraper.abort()  # a scrape in progress ends now, whatever it is waiting for
        if any(t.name == "kvwatch-consumer" and t.is_alive() for t in self._threads):
            saved = threading.Event()
            self._queue.put(msg.FinalSave(saved))
            saved.wait(timeout=5)
        for src in self._logs.configured:
            if src.tailer is not None:
                src.tailer.stop()
        if self.node is not None:
            self.node.stop_all()
        self._queue.put(msg.Stop())
        for thread in self._threads:
            if thread.name == "kvwatch-consumer":
                thread.join(timeout=10)
        if self._server is not None:
            self._server.stop_serving()
            for thread in self._threads:
                if thread.name == "kvwatch-http":
                    thread.join(timeout=5)
            self._server.server_close()
        # Scrape threads were aborted above; one still stuck in a TCP connect is a daemon thread that
        # holds nothing to save, so it is given a moment, not the whole budget of a clean stop.
        deadline = time.monotonic() + 0.5
        for thread in self._threads:
            if thread.name.startswith("kvwatch-scrape-"):
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
            elif thread.name != "kvwatch-stdin":
                thread.join(timeout=5)
        if self.store is not None:
            self.store.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stop is requested (True) or timeout passes (False)."""
        return self._stop.wait(timeout)

    def request_stop(self) -> None:
        """Ask the main loop to stop (signal handlers call this)."""
        self._stop.set()

    def request_save(self) -> None:
        """Save the state now and go on (SIGHUP: a terminal hang-up must not lose what was read)."""
        self._queue.put(msg.FinalSave(threading.Event()))

    # --- sources ---------------------------------------------------------------------------------
    def _scrape_loop(self, src: ScrapeSource) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                result, events, unreadable = src.scrape()
            except Exception as exc:  # input nobody foresaw: counted as unreadable, the loop goes on
                log.exception("metrics not read source=%s", src.name)
                result = ScrapeResult(True, None, time.monotonic() - started, None, None)
                events, unreadable = (), f"{type(exc).__name__}: {exc}"
            if self._stop.is_set() and not result.ok:
                return  # aborted by stop(): not the engine's failure
            self._queue.put(msg.Scraped(src, result, events, unreadable))
            # A steady cadence: the interval runs from the start of one scrape to the next.
            self._stop.wait(max(0.0, self.settings.scrape_interval - (time.monotonic() - started)))

    def _read_stdin(self, src: LogSource) -> None:
        from kvwatch.sources.lines import LineSplitter
        from kvwatch.sources.stdin import read_lines

        src.stdin_splitter = LineSplitter()
        backlog = src.stdin_backlog = StdinBacklog()

        def on_line(line: str) -> None:  # blocks while the consumer is behind (back-pressure)
            if backlog.admit(len(line), self._stop):
                self._queue.put(msg.StdinLine(src, line))

        read_lines(on_line, stop=self._stop, splitter=src.stdin_splitter)
        self._queue.put(msg.StdinClosed(src))

    def refresh(self) -> bool:
        """Have the consumer read what the engines appended since the tailers last looked, and wait
        for it (bounded: kvwatch.sidecar.appends), so a line appended just before a scrape is in
        that scrape; the calling thread (an HTTP worker at every scrape) reads and parses nothing.
        False when the read did not happen in time (the render then shows the state as it is)."""
        return self.appends.ask()

    def source_statuses(self) -> list[SourceStatus]:
        """Self-metrics of every source, for the collector."""
        return [s.status() for s in self._logs] + [s.status() for s in self._scrapes]

    # --- exposure --------------------------------------------------------------------------------
    def render_metrics(self, accept: str) -> tuple[bytes, str]:
        """The /metrics body for an Accept header and its content type, current to the last line."""
        self.refresh()
        encoder, content_type = choose_encoder(accept)
        # The classic text format (what Prometheus and a scraper without Accept get; "latest" is
        # 1.0.0 since prometheus_client 0.22): the collector's cached rows, byte-equal and ~4x faster.
        if content_type in (_TEXT_0_0_4, CONTENT_TYPE_LATEST):
            return self.collector.render(), content_type
        return encoder(self.registry), content_type

    def render_status(self) -> bytes:
        """The status page (/), current to the last line; its module is imported on the first
        request, so a sidecar nobody looks at never loads it (the idle memory budget)."""
        from kvwatch.export import status

        self.refresh()
        page = status.render(
            self.fleet.snapshot(), self.predictor.prepared, dropped_events=self.fleet.dropped_events
        )
        return page.encode("utf-8")

    def self_stats(self) -> SelfStats:
        """The HTTP server's, the authentication's and the state file's counters, for the collector."""
        server = self._server
        return SelfStats(
            http_connections_open=server.stats.open if server is not None else 0,
            http_connections_refused=server.stats.refused if server is not None else 0,
            http_connection_timeouts=server.stats.timed_out if server is not None else 0,
            http_auth_throttled=self.auth.throttled,
            state_files_invalid=self.store.invalid_files if self.store is not None else 0,
            state_save_errors=self.store.write_errors if self.store is not None else 0,
        )


def _release_startup_memory() -> None:
    """Hand the heap that imports and model schemas used at startup back to the OS (glibc only).

    Python frees those objects but glibc keeps the pages; the sidecar's resident memory is a stated
    budget, so give them back once, after startup. Elsewhere this is a no-op.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _load_positions(raw: JsonValue | None) -> dict[str, FilePosition] | None:
    """Saved tailer positions of one source, or None when absent or not understood."""
    if not isinstance(raw, dict):
        return None
    out: dict[str, FilePosition] = {}
    for path, pos in raw.items():
        if not isinstance(pos, dict):
            return None
        try:
            position = FilePosition.from_dict(pos)
        except (TypeError, KeyError, ValueError, AttributeError):
            return None
        if min(position.dev, position.inode, position.offset) < 0:
            return None
        out[path] = position
    return out
