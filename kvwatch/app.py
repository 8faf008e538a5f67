"""The sidecar's wiring: sources -> LinePipeline / MetricsReader -> Fleet -> collector -> HTTP.

Log lines are parsed and applied where they are read: in each tailer's thread, or in the HTTP
thread when a scrape of /metrics first reads what was appended (so a scrape is never behind the
log). The engine-/metrics scrapers and stdin put their items on one queue for a consumer thread,
which also writes the state file, pausing the tailers' delivery meanwhile so that the state and the
saved read positions describe the same lines. Every failure of a source is counted and retried;
only bad configuration stops startup.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import functools
import gc
import gzip
import hashlib
import logging
import os
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder
from prometheus_client.registry import CollectorRegistry

from kvwatch import __version__, names
from kvwatch.analysis.predictor import Predictor
from kvwatch.collector import KvwatchCollector, SourceStatus
from kvwatch.config import Settings, WebConfig, load_web_config
from kvwatch.errors import ConfigError
from kvwatch.events import Event, UsageSample
from kvwatch.parsers.base import ParseError
from kvwatch.parsers.prom_text import MetricsReader
from kvwatch.persist import StateStore, restore
from kvwatch.pipeline import LinePipeline
from kvwatch.scrape import Scraper, ScrapeResult
from kvwatch.sources.logfile import FilePosition, LogTailer
from kvwatch.state import Fleet

if TYPE_CHECKING:
    import ssl

log = logging.getLogger("kvwatch")

# The consumer saves the state file at most this often (and at stop).
# Facts an engine prints once (pool, settings, budget) and counters are saved within a second;
# usage samples only move the read positions forward, which a restart can as well re-read, so a
# state that changed by usage alone is saved at a slower pace (each save costs a JSON dump + fsync).
SAVE_INTERVAL = 1.0
USAGE_SAVE_INTERVAL = 30.0
# Appends are read whenever /metrics is scraped (Sidecar.refresh), so a scrape is current however
# rarely the tailers look on their own; inotify wakes them at once for created, renamed and deleted
# files. Their own timed look (read appends, re-check every path for a missed event) then only keeps
# the state file current and is the safety net, so it can be rare: every timed wake-up of a thread,
# and the first system calls after it, cost milliseconds of CPU on virtual machines whose idle
# pages the host reclaims (measured in bench/bench_sidecar.py), several times the cost of parsing
# a second's worth of lines.
TAIL_INTERVAL = 10.0


def hf_hub_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Hugging Face hub cache folders, in the order huggingface_hub itself looks them up."""
    if environ.get("HF_HUB_CACHE"):
        return [Path(environ["HF_HUB_CACHE"])]
    if environ.get("HF_HOME"):
        return [Path(environ["HF_HOME"]) / "hub"]
    base = Path(environ.get("XDG_CACHE_HOME") or Path(environ.get("HOME", "~")).expanduser() / ".cache")
    return [base / "huggingface" / "hub"]


def find_model_config(model: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """The config.json of the model an engine logged: a local path, or its Hugging Face cache entry."""
    env = os.environ if environ is None else environ
    local = Path(model).expanduser()
    with contextlib.suppress(OSError):
        if local.is_file() and local.name.endswith(".json"):
            return local
        if (local / "config.json").is_file():
            return local / "config.json"
    if model.count("/") != 1 or model.startswith(("/", ".")):
        return None
    for hub in hf_hub_dirs(env):
        repo = hub / f"models--{model.replace('/', '--')}"
        try:
            revision = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
        except OSError:
            revision = ""
        if revision and (repo / "snapshots" / revision / "config.json").is_file():
            return repo / "snapshots" / revision / "config.json"
        with contextlib.suppress(OSError):
            found = sorted(repo.glob("snapshots/*/config.json"), key=lambda p: p.stat().st_mtime)
            if found:
                return found[-1]
    return None


@dataclasses.dataclass
class _LogSource:
    """One --log: its tailer and line pipeline. Counters are written by one thread each."""

    name: str
    pattern: str
    pipeline: LinePipeline
    tailer: LogTailer | None = None
    stdin_up: bool = True

    def on_line(self, line: str) -> tuple[Event, ...]:
        """Parse and apply one line at once; returns the events it produced.

        Called by whichever thread read the line -- the tailer's, or the HTTP thread serving a
        scrape (``Sidecar.refresh``) -- under the tailer's delivery lock, one line at a time in file
        order: applying lines where they are read needs no hand-off to another thread (a wake-up
        per line, the sidecar's main CPU cost at a steady line rate), and lets a save pause delivery
        to get a state that holds exactly the lines before the saved positions.
        """
        return self.pipeline.feed(line)

    def status(self) -> SourceStatus:
        tailer = self.tailer
        return SourceStatus(
            name=self.name,
            kind="log",
            up=tailer.up if tailer is not None else self.stdin_up,
            lines_read=self.pipeline.lines_read,
            lines_matched=self.pipeline.lines_matched,
            parse_errors=self.pipeline.parse_errors,
            rotations=tailer.rotations if tailer is not None else 0,
            read_errors=tailer.read_errors if tailer is not None else 0,
        )


@dataclasses.dataclass
class _ScrapeSource:
    """One --metrics-url: its scraper, reader and last result (written by the consumer only)."""

    name: str
    scraper: Scraper
    reader: MetricsReader
    up: bool = False
    duration: float | None = None
    errors: dict[str, int] = dataclasses.field(default_factory=dict)

    def status(self) -> SourceStatus:
        return SourceStatus(
            name=self.name,
            kind="metrics",
            up=self.up,
            scrape_duration_seconds=self.duration,
            scrape_errors=dict(self.errors),
        )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # handle_request() only after select() saw a connection: accept it or give up, never block.
    timeout = 0

    def __init__(self, address: tuple[str, int], app: Sidecar, tls: ssl.SSLContext | None) -> None:
        self.app = app
        self.tls = tls
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self._closing = False
        self._bell_r, self._bell_w = socket.socketpair()

    def serve(self) -> None:
        """serve_forever() without its poll twice a second for shutdown(): sleep in select() until a
        client connects or stop_serving() rings. An idle sidecar then costs no CPU; on VMs each
        wake-up of a thread costs ~1 ms of CPU, a visible share of the sidecar's 1% budget."""
        with selectors.DefaultSelector() as selector:
            selector.register(self, selectors.EVENT_READ)
            selector.register(self._bell_r, selectors.EVENT_READ)
            while not self._closing:
                for key, _ in selector.select():
                    if key.fileobj is self and not self._closing:
                        self.handle_request()

    def stop_serving(self) -> None:
        """Make serve() return (from another thread); then server_close()."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._bell_w.send(b"\0")

    def server_close(self) -> None:
        super().server_close()
        self._bell_r.close()
        self._bell_w.close()

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The TLS handshake runs in the request's own thread so a slow client cannot stall accept().
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(10.0)
        try:
            wrapped = self.tls.wrap_socket(request, server_side=True)
        except (OSError, ValueError) as exc:
            log.debug("tls handshake failed peer=%s err=%s", client_address, exc)
            return
        try:
            super().finish_request(wrapped, client_address)
        finally:
            # The TLS socket took over the connection; the server only closes the raw one.
            wrapped.close()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = f"kvwatch/{__version__}"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("http %s", format % args)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        app = self.server.app
        if not app.authorized(self.headers.get("Authorization")):
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="kvwatch"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            app.refresh()
            encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
            if content_type == CONTENT_TYPE_LATEST:
                body = app.collector.render()
            else:
                body = encoder(app.registry)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            if "gzip" in self.headers.get("Accept-Encoding", ""):
                body = gzip.compress(body, compresslevel=1)
                self.send_header("Content-Encoding", "gzip")
        elif path == "/healthz":
            body = b"ok\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
        elif path == "/":
            body = b"<html><body><h1>kvwatch</h1><p><a href='/metrics'>/metrics</a></p></body></html>\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
        else:
            body = b"not found\n"
            self.send_response(404)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _tls_context(web: WebConfig) -> ssl.SSLContext:
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        assert web.cert_file is not None and web.key_file is not None
        ctx.load_cert_chain(web.cert_file, web.key_file)
        if web.client_ca_file is not None:
            ctx.load_verify_locations(web.client_ca_file)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS certificate/key: {exc}") from None
    return ctx


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
        self._tls = _tls_context(self.web) if self.web.tls else None
        self._auth_ok: set[bytes] = set()
        self._auth_lock = threading.Lock()
        self.store = StateStore(settings.state_dir) if settings.state_dir is not None else None
        for path in settings.model_config_path.values():
            if not path.exists():
                raise ConfigError(f"model config {path} does not exist")
        self.predictor = Predictor(
            model_config=settings.model_config_for,
            gpu_memory_bytes=self._gpu_memory(),
            resolve_model=lambda model: find_model_config(model, self.environ),
        )
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._logs = [
            _LogSource(s.name, s.path, LinePipeline(s.name, self.fleet, settings.engine))
            for s in settings.log
        ]
        self._scrapes = [
            _ScrapeSource(
                s.name,
                Scraper(s.url, connect_timeout=settings.scrape_timeout, read_timeout=settings.scrape_timeout),
                MetricsReader(settings.engine),
            )
            for s in settings.metrics_url
        ]
        self.collector = KvwatchCollector(
            self.fleet.snapshot,
            self.predictor,
            self.source_statuses,
            lambda: self.fleet.dropped_events,
            runtime=True,
        )
        self.registry.register(self.collector)
        self._server: _Server | None = None
        self._dirty = False
        self._facts_dirty = False
        self._last_save = 0.0
        self._dirty_since = self._facts_since = 0.0

    def _gpu_memory(self) -> int | None:
        if self.settings.gpu_memory is not None:
            return self.settings.gpu_memory
        if self.settings.gpu is None:
            return None
        from kvwatch.capacity import gpus

        try:
            return int(gpus.lookup(self.settings.gpu).memory_bytes)
        except KeyError:
            raise ConfigError(f"unknown GPU {self.settings.gpu!r} (give --gpu-memory SIZE instead)") from None

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Restore the state file, bind the listen address, start consumer, tailers and scrapers."""
        positions: dict[str, Any] = {}
        if self.store is not None:
            saved = self.store.load()
            # Instances of sources no longer configured would be exported forever: leave them out.
            configured = {s.name for s in self.settings.log} | {s.name for s in self.settings.metrics_url}
            saved.instances = [st for st in saved.instances if st.source in configured]
            saved.source_settings = {k: v for k, v in saved.source_settings.items() if k in configured}
            restore(self.fleet, saved)
            positions = saved.positions
            if saved.instances:
                log.info("state restored path=%s instances=%d", self.store.path, len(saved.instances))
        addr = self.settings.listen
        try:
            self._server = _Server((addr.host, addr.port), self, self._tls)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {addr}: {exc.strerror or exc}") from None
        self._spawn("kvwatch-http", self._server.serve)
        self._spawn("kvwatch-consumer", self._consume)
        for src in self._logs:
            if src.pattern == "-":
                self._spawn("kvwatch-stdin", functools.partial(self._read_stdin, src))
                continue
            src.tailer = self._tailer(src, positions.get(src.name))
            src.tailer.start()
        for scrape in self._scrapes:
            self._spawn(f"kvwatch-scrape-{scrape.name}", functools.partial(self._scrape_loop, scrape))
        log.debug("kvwatch %s serving %s", __version__, self.url)
        _release_startup_memory()

    def _tailer(self, src: _LogSource, saved: Any) -> LogTailer:
        def on_line(path: str, line: str) -> None:
            self._mark(src.on_line(line))

        def on_rotate(path: str) -> None:
            log.info("log rotated source=%s path=%s", src.name, path)

        def on_error(path: str, exc: BaseException) -> None:
            log.debug("log read error source=%s path=%s err=%s", src.name, path, exc)

        return LogTailer(
            src.pattern,
            on_line,
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
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """Where /metrics is served."""
        host = self.settings.listen.host
        shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
        shown = "[::1]" if shown == "::" else (f"[{shown}]" if ":" in shown else shown)
        return f"{'https' if self._tls else 'http'}://{shown}:{self.port}/metrics"

    def stop(self) -> None:
        """Save the state while the tailers still hold their files, stop sources, close the server.

        Lines read after that last save are processed but not saved: their positions are not saved
        either, so the next start reads them again -- once.
        """
        self._stop.set()
        saved = threading.Event()
        self._queue.put(("final_save", saved))
        saved.wait(timeout=5)
        for src in self._logs:
            if src.tailer is not None:
                src.tailer.stop()
        self._queue.put(("stop",))
        for thread in self._threads:
            if thread.name == "kvwatch-consumer":
                thread.join(timeout=10)
        if self._server is not None:
            self._server.stop_serving()
            for thread in self._threads:
                if thread.name == "kvwatch-http":
                    thread.join(timeout=5)
            self._server.server_close()
        for thread in self._threads:
            if thread.name != "kvwatch-stdin":
                thread.join(timeout=5)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stop is requested (True) or timeout passes (False)."""
        return self._stop.wait(timeout)

    def request_stop(self) -> None:
        """Ask the main loop to stop (signal handlers call this)."""
        self._stop.set()

    # --- consumer --------------------------------------------------------------------------------
    def _consume(self) -> None:
        while True:
            try:
                # Asleep until an item comes or a save is due: no wake-ups while nothing changes.
                item = self._queue.get(timeout=self._save_due_in())
            except queue.Empty:
                self._maybe_save()
                continue
            if item[0] == "stop":
                self._drain()
                return
            if item[0] == "final_save":
                self._final_save()
                item[1].set()
                continue
            self._handle(item)
            if self._queue.empty():
                self._maybe_save()

    def _final_save(self) -> None:
        for _ in range(100):
            self._drain()
            if not self._dirty or self._save():
                return
            time.sleep(0.02)
        log.warning("could not save a consistent state at stop; the next start re-reads from the last save")

    def _drain(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item[0] not in ("stop", "final_save"):
                self._handle(item)
            elif item[0] == "final_save":
                item[1].set()

    def _handle(self, item: tuple[Any, ...]) -> None:
        kind = item[0]  # "dirty" only wakes the consumer to plan its next save
        if kind == "line":
            src: _LogSource = item[1]
            self._mark(src.on_line(item[2]))
        elif kind == "scrape":
            self._handle_scrape(item[1], item[2])
        elif kind == "stdin_eof":
            item[1].stdin_up = False

    def _handle_scrape(self, src: _ScrapeSource, result: ScrapeResult) -> None:
        src.duration = result.duration_seconds
        if not result.ok or result.text is None:
            src.up = False
            # Bounded label values: a reason the collector does not export is a connection failure.
            reason = result.error if result.error in names.SCRAPE_ERROR_REASONS else "connection"
            src.errors[reason] = src.errors.get(reason, 0) + 1
            return
        try:
            events = src.reader.read(result.text)
            if events:
                self.fleet.apply_all(src.name, events)
                self._mark(events)
        except ParseError as exc:
            src.up = False
            src.errors["parse"] = src.errors.get("parse", 0) + 1
            log.debug("metrics unreadable source=%s err=%s", src.name, exc)
            return
        except Exception:
            # Input nobody foresaw must not stop the consumer: count it as unreadable and go on.
            src.up = False
            src.errors["parse"] = src.errors.get("parse", 0) + 1
            log.exception("metrics not applied source=%s", src.name)
            return
        src.up = True

    def _mark(self, events: tuple[Event, ...]) -> None:
        """Note what the state file is missing (called from the thread that applied the events).

        When that makes a save due sooner than the consumer planned to wake (it sleeps without a
        timeout while the state is saved), the consumer is woken to plan again.
        """
        if not events:
            return
        wake = not self._dirty
        if wake:
            self._dirty_since = time.monotonic()
        self._dirty = True
        if not self._facts_dirty and not all(isinstance(e, UsageSample) for e in events):
            self._facts_since = time.monotonic()
            self._facts_dirty = wake = True
        if wake and self.store is not None:
            self._queue.put(("dirty",))

    def _save_due_in(self) -> float | None:
        """Seconds until the state file should be written; None when it holds everything.

        A save is due an interval after the first change it would hold (and after the last save),
        so a burst of lines -- an engine's startup, a log read from its start -- is one save.
        """
        if self.store is None or not self._dirty:
            return None
        if self._facts_dirty:
            due = max(self._last_save, self._facts_since) + SAVE_INTERVAL
        else:
            due = max(self._last_save, self._dirty_since) + USAGE_SAVE_INTERVAL
        return max(0.0, due - time.monotonic())

    def _maybe_save(self) -> None:
        if self._save_due_in() == 0.0:
            self._save()

    def _save(self) -> bool:
        """Write the state with the positions of exactly the lines it contains.

        Log lines are applied under their tailer's delivery lock (in its thread or a scrape's);
        holding every tailer's lock while the positions and the fleet are taken gives a consistent
        cut (stdin lines and engine-/metrics results are applied by this thread, so they cannot
        change the fleet meanwhile). The slow part, writing and fsyncing the file, happens after
        the tailers are released.
        """
        if self.store is None:
            return True
        tailers = [(src.name, src.tailer) for src in self._logs if src.tailer is not None]
        with contextlib.ExitStack() as paused:
            for _, tailer in tailers:
                paused.enter_context(tailer.delivery_paused())
            positions = {
                name: {path: pos.to_dict() for path, pos in tailer.positions().items()}
                for name, tailer in tailers
            }
            text = self.store.encode(self.fleet, positions)
            # Cleared inside the cut: a line applied after it marks the state dirty again.
            self._dirty = self._facts_dirty = False
        self._last_save = time.monotonic()
        if not self.store.write(text):
            self._dirty = self._facts_dirty = True
            return False
        return True

    # --- sources ---------------------------------------------------------------------------------
    def _scrape_loop(self, src: _ScrapeSource) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self._queue.put(("scrape", src, src.scraper.fetch()))
            # A steady cadence: the interval runs from the start of one scrape to the next.
            self._stop.wait(max(0.0, self.settings.scrape_interval - (time.monotonic() - started)))

    def _read_stdin(self, src: _LogSource) -> None:
        from kvwatch.sources.stdin import read_lines

        read_lines(lambda line: self._queue.put(("line", src, line)), stop=self._stop)
        self._queue.put(("stdin_eof", src))

    def refresh(self) -> None:
        """Read what the engines appended since the tailers last looked (called at every scrape of
        /metrics, in the HTTP thread): a line appended just before a scrape is in that scrape."""
        for src in self._logs:
            if src.tailer is not None:
                try:
                    src.tailer.refresh()
                except Exception:  # a scrape must answer whatever reading the log ran into
                    log.exception("reading appends at scrape failed source=%s", src.name)

    def source_statuses(self) -> list[SourceStatus]:
        """Self-metrics of every source, for the collector."""
        return [s.status() for s in self._logs] + [s.status() for s in self._scrapes]

    # --- exposure --------------------------------------------------------------------------------
    def authorized(self, header: str | None) -> bool:
        """Basic-auth check against the web config's bcrypt hashes (verified once per credential)."""
        users = self.web.basic_auth_users
        if not users:
            return True
        if header is None or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = users.get(user)
        if hashed is None:
            return False
        # bcrypt is slow on purpose; remember credentials that passed so scrapes stay cheap.
        token = hashlib.sha256(f"{user}\0{password}\0{hashed}".encode()).digest()
        with self._auth_lock:
            if token in self._auth_ok:
                return True
        import bcrypt

        try:
            ok = bcrypt.checkpw(password.encode("utf-8"), hashed.encode("utf-8"))
        except ValueError:
            return False
        if ok:
            with self._auth_lock:
                self._auth_ok.add(token)
        return ok


def _release_startup_memory() -> None:
    """Hand the heap that imports and model schemas used at startup back to the OS (glibc only).

    Python frees those objects but glibc keeps the pages; the sidecar's resident memory is a stated
    budget, so give them back once, after startup. Elsewhere this is a no-op.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _load_positions(raw: Any) -> dict[str, FilePosition] | None:
    """Saved tailer positions of one source, or None when absent or not understood."""
    if not isinstance(raw, dict):
        return None
    out: dict[str, FilePosition] = {}
    for path, pos in raw.items():
        try:
            out[path] = FilePosition.from_dict(pos)
        except (TypeError, KeyError, ValueError, AttributeError):
            return None
    return out
