"""`kvwatch demo`: the real sidecar on bundled engine logs, written live into temporary files.

Two fake engines "write" log lines from kvwatch/data/demo/ (provenance in its README.md): first
their startup lines (settings, memory budget, pool), then stats lines at a steady pace, with the
first engine's log rotated (rename and create, as logrotate does) on the way. After
``fault_after`` seconds one deliberate, labelled fault happens: an engine whose data has a
``#@ fault`` section restarts with the smaller figures written there. The sidecar is the same
``Sidecar`` that ``kvwatch run`` starts; the demo only plays the engines, starts Prometheus when it
is installed (kvwatch.sidecar.demo_prometheus), and prints a summary read back from the sidecar's own
/metrics registry and Prometheus's alerts API.
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import TextIO

from kvwatch.core.jsontypes import JsonObject
from kvwatch.export import names
from kvwatch.mixin import config
from kvwatch.sidecar.app import Sidecar
from kvwatch.sidecar.config import load_settings
from kvwatch.sidecar.demo_fault import explain_restart
from kvwatch.sidecar.demo_prometheus import DemoPrometheus, find_prometheus


@dataclass
class _Fault:
    label: str
    startup: list[str]
    stats: list[str]


@dataclass
class _Engine:
    name: str
    path: Path
    model_config: Path
    card: str | None
    startup: list[str]
    stats: list[str]
    fault: _Fault | None = None
    sent: int = 0


@dataclass
class _FaultSeen:
    """What the demo knows of the fault it played, from kvwatch's own reading of both starts."""

    engine: str
    label: str
    at: float
    pool_before: int | None
    pool_after: int | None
    explanation: str


@dataclass
class _Seen:
    """Largest pool per source the demo has read from /metrics (the alert's max_over_time)."""

    largest: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Row:
    """One engine's summary: its lines, what in them changes only with a start or a fault (model,
    pool, preemptions, gaps, prediction), and its usage, which every stats line moves."""

    source: str
    text: str
    steady: tuple[str, ...]
    usage: str


def _demo_files() -> Path:
    return Path(str(resources.files("kvwatch") / "data" / "demo"))


def _sections(lines: list[str]) -> list[tuple[str, str, list[str]]]:
    """(kind, label, lines) of a log with '#@ KIND [label]' markers; other '#' lines are notes."""
    out: list[tuple[str, str, list[str]]] = []
    for line in lines:
        if line.startswith("#@"):
            kind, _, label = line[2:].strip().partition(" ")
            out.append((kind, label, []))
        elif not line.startswith("#") and out:
            out[-1][2].append(line)
    return out


def _load(source: JsonObject, folder: Path, data: Path) -> _Engine:
    """One source of data/demo/demo.json: its log split into startup, stats and fault lines."""
    name, log = str(source["name"]), str(source["log"])
    # Split on newlines only: real logs keep progress bars' carriage returns inside a line.
    lines = (data / log).read_bytes().decode("utf-8").removesuffix("\n").split("\n")
    model = data / "models" / str(source["model_config"])
    card = str(source["card"]) if source.get("card") else None
    if "startup_lines" in source:
        n = int(str(source["startup_lines"]))
        return _Engine(name, folder / log, model, card, lines[:n], lines[n:])
    parts = _sections(lines)
    kinds = [kind for kind, _, _ in parts]
    if kinds[:2] != ["startup", "stats"] or kinds[2:] not in ([], ["fault", "stats"]):
        raise ValueError(f"{log}: sections {kinds} (want startup, stats[, fault, stats])")
    fault = _Fault(parts[2][1], parts[2][2], parts[3][2]) if len(parts) == 4 else None
    return _Engine(name, folder / log, model, card, parts[0][2], parts[1][2], fault)


def _append(path: Path, lines: Iterable[str]) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def explain_fault(engine: _Engine) -> tuple[int | None, int | None, str]:
    """(pool before, pool after, the term that explains the change) of the fault's restart
    (kvwatch.sidecar.demo_fault)."""
    assert engine.fault is not None
    return explain_restart(engine.name, engine.card, engine.startup, engine.fault.startup)


class Demo:
    """Plays the engines into ``folder`` and runs the sidecar on them."""

    def __init__(
        self,
        folder: Path,
        listen: str = "127.0.0.1:9477",
        interval: float = 0.5,
        fault_after: float | None = 20.0,
        fact_ttl: float | None = None,
    ) -> None:
        data = _demo_files()
        self.folder = folder
        self.interval = interval
        self.fault_after = fault_after
        spec = json.loads((data / "demo.json").read_text(encoding="utf-8"))
        self.alert = str(spec["alert"])
        self.engines = [_load(source, folder, data) for source in spec["sources"]]
        for engine in self.engines:
            engine.path.touch()
        flags: dict[str, object] = {
            "log": [f"{e.name}={e.path}" for e in self.engines],
            "model_config": [f"{e.name}={e.model_config}" for e in self.engines],
            "listen": listen,
            "state_dir": str(folder / "state"),
        }
        if fact_ttl is not None:
            flags["fact_ttl"] = fact_ttl
        self.settings = load_settings(flags, environ={})
        self.sidecar = Sidecar(self.settings, environ={})
        self.rotated = False
        # Rotations kvwatch has counted per source and the demo has reported (see rotations()).
        self._rotations_told: dict[str, float] = {}
        self.fault: _FaultSeen | None = None
        self.seen = _Seen()
        # Whether the fault may be played now (the demo's Prometheus must have seen the healthy pool).
        self.fault_gate: Callable[[str], bool] = lambda source: True
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._writer = threading.Thread(target=self._write, name="kvwatch-demo-writer", daemon=True)

    def start(self) -> None:
        """Start the sidecar, then the engines' writer."""
        self.sidecar.start()
        self.started = time.monotonic()
        self._writer.start()

    def stop(self) -> None:
        """Stop the writer and the sidecar."""
        self._stop.set()
        self._writer.join(timeout=5)
        self.sidecar.stop()

    def _write(self) -> None:
        for engine in self.engines:
            _append(engine.path, engine.startup)
        step = 0
        while not self._stop.wait(self.interval):
            engine = self.engines[step % len(self.engines)]
            _append(engine.path, [engine.stats[engine.sent % len(engine.stats)]])
            engine.sent += 1
            step += 1
            if not self.rotated and step == 12:
                self._rotate(self.engines[0])
            elapsed = time.monotonic() - self.started
            if self.fault is None and self.fault_after is not None and elapsed >= self.fault_after:
                self._play_fault(elapsed)

    def _rotate(self, engine: _Engine) -> None:
        """logrotate's default: rename the file away, the engine reopens a new one."""
        os.replace(engine.path, engine.path.with_name(engine.path.name + ".1"))
        engine.path.touch()
        self.rotated = True

    def _play_fault(self, elapsed: float) -> None:
        engine = next((e for e in self.engines if e.fault is not None), None)
        if engine is None or engine.fault is None or not self.fault_gate(engine.name):
            return
        before, after, why = explain_fault(engine)
        _append(engine.path, engine.fault.startup)
        engine.stats, engine.sent = engine.fault.stats, 0
        self.fault = _FaultSeen(engine.name, engine.fault.label, elapsed, before, after, why)

    def rotations(self) -> list[str]:
        """A line per log whose rotation kvwatch counted since the last call: read from kvwatch's own
        counter, so the demo says a log rotated once, when kvwatch has followed it."""
        reg = self.sidecar.registry
        out = []
        for engine in self.engines:
            count = reg.get_sample_value(names.LOG_ROTATIONS.sample_name, {"source": engine.name}) or 0.0
            if count > self._rotations_told.get(engine.name, 0.0):
                self._rotations_told[engine.name] = count
                out.append(
                    f"{engine.name} log rotated (renamed to {engine.path.name}.1 and created anew, as "
                    f"logrotate does): kvwatch followed it ({names.LOG_ROTATIONS.sample_name} {count:.0f})"
                )
        return out

    def summary(self) -> str:
        """One line per engine: model, pool, usage, headroom, preemptions, gap to each prediction."""
        return "\n".join(row.text for row in self.rows()) or "  (no engine seen yet)"

    def rows(self) -> list[_Row]:
        """Per engine, its summary lines and what in them changes only with a start or a fault."""
        self.sidecar.refresh()  # what a scrape of /metrics does first: read what the engines appended
        reg = self.sidecar.registry
        out = []
        for snap in self.sidecar.fleet.snapshot():
            model = snap.settings.served_model_name or snap.settings.model or ""
            lab = {
                "source": snap.source,
                names.ENGINE_KIND_LABEL: snap.engine,
                names.MODEL_LABEL: str(model),
                "dp_rank": snap.instance,
            }

            def value(metric: names.Metric, lab: dict[str, str] = lab, **extra: str) -> float | None:
                return reg.get_sample_value(metric.sample_name, {**lab, **extra})

            pool = value(names.KV_POOL_TOKENS)
            if pool is not None:
                self.seen.largest[snap.source] = max(pool, self.seen.largest.get(snap.source, 0.0))
            usage = value(names.KV_USAGE_RATIO)
            head = value(names.KV_HEADROOM_TOKENS)
            pre = value(names.PREEMPTIONS)
            gap = value(names.KV_POOL_GAP_RATIO, basis="config")
            budget_gap = value(names.KV_POOL_GAP_RATIO, basis="engine_budget")
            state = next(
                (s for s in names.PREDICTION_STATES if value(names.PREDICTION_AVAILABLE, state=s) == 1),
                "-",
            )
            text = (
                f"  {snap.source:<7} model={model or '-'}\n"
                f"          pool={_fmt(pool)} tokens  usage={_pct(usage)}  headroom={_fmt(head)} tokens"
                f"  preemptions={_fmt(pre)}  gap: config {_pct(gap, signed=True)},"
                f" engine budget {_pct(budget_gap, signed=True)}  prediction={state}"
            )
            steady = (str(model), _fmt(pool), _fmt(pre), _pct(gap, True), _pct(budget_gap, True), state)
            out.append(_Row(snap.source, text, steady, _pct(usage)))
        return out

    def shrink_ratio(self, source: str) -> float | None:
        """The alert's expression for ``source``: pool now / largest pool seen."""
        pool = None
        for snap in self.sidecar.fleet.snapshot():
            if snap.source == source:
                pool = snap.pool.tokens
        largest = self.seen.largest.get(source)
        return pool / largest if pool is not None and largest else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value * 100:+.2f}%" if signed else f"{value * 100:.1f}%"


def fault_report(demo: Demo, prom: DemoPrometheus | None) -> str:
    """The fault, the term that explains it and the alert it raises (firing in Prometheus, or why
    it would fire)."""
    f = demo.fault
    if f is None:
        when = "" if demo.fault_after is None else f" at {demo.fault_after:.0f}s"
        return f"  fault: none yet (one deliberate fault{when})" if demo.fault_after is not None else ""
    change = ""
    if f.pool_before and f.pool_after is not None:
        change = (
            f": pool {f.pool_before:,} -> {f.pool_after:,} tokens ({f.pool_after / f.pool_before - 1:+.1%})"
        )
    lines = [
        f"  FAULT (deliberate, at {f.at:.0f}s) {f.engine}: {f.label}{change}",
        f"  explained by {f.explanation}",
    ]
    if prom is None:
        ratio = demo.shrink_ratio(f.engine)
        now = "-" if ratio is None else f"{ratio:.3f}"
        lines.append(
            f"  alert {demo.alert} would fire (after its for: {config.FOR[demo.alert]}): pool / largest pool"
            f" in {config.SHRINK_LOOKBACK} = {now} < {1 - config.SHRINK_RATIO:g}"
            " (Prometheus is not installed: apt-get install prometheus)"
        )
        return "\n".join(lines)
    alerts = prom.alerts()
    if alerts is None:
        lines.append(f"  alert {demo.alert}: Prometheus at {prom.url} does not answer")
        return "\n".join(lines)
    mine = [a for a in alerts if a.name == demo.alert and a.labels.get("source") == f.engine]
    state = mine[0].state if mine else "not yet pending"
    lines.append(
        f"  alert {demo.alert} (source={f.engine}): {state} in Prometheus ({prom.alerts_page});"
        f" for: {prom.alert_for} in the demo, {prom.shipped_for} as shipped"
    )
    others = sorted(
        {f"{a.name}({a.state}, source={a.labels.get('source', '-')})" for a in alerts if a not in mine}
    )
    if others:
        lines.append(f"  other alerts: {', '.join(others)}")
    return "\n".join(lines)


class _Calm:
    """The demo's periodic output: the summary when anything but usage changed (a start, a fault,
    an alert's state), a log rotation once, and otherwise one line every ``heartbeat`` seconds."""

    def __init__(self, out: TextIO, heartbeat: float) -> None:
        self.out, self.heartbeat = out, heartbeat
        self.key: object = None
        self.last = -math.inf

    def tick(self, demo: Demo, prom: DemoPrometheus | None, elapsed: float) -> None:
        at = f"[{elapsed:5.1f}s]"
        for line in demo.rotations():
            print(f"{at} {line}", file=self.out, flush=True)
        rows = demo.rows()
        report = fault_report(demo, prom)
        key = (tuple((row.source, row.steady) for row in rows), report)
        if key != self.key:
            summary = "\n".join(row.text for row in rows) or "  (no engine seen yet)"
            print(f"{at}\n{summary}" + (f"\n{report}" if report else ""), file=self.out, flush=True)
        elif elapsed - self.last >= self.heartbeat:
            usage = ", ".join(f"{row.source} {row.usage}" for row in rows)
            print(f"{at} no change but usage ({usage})", file=self.out, flush=True)
        else:
            return
        self.key, self.last = key, elapsed


def run_demo(
    duration: float | None,
    listen: str,
    interval: float,
    out: TextIO,
    every: float = 3.0,
    fault_after: float | None = 20.0,
    prometheus: bool = True,
    alert_for: str = "5s",
    for_scale: float = 1.0,
    fact_ttl: float | None = None,
    heartbeat: float = 60.0,
) -> int:
    """Run until Ctrl-C (or SIGTERM), or for ``duration`` seconds; print the URLs, then the summary
    whenever it changes (looked at every ``every`` seconds)."""
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Explicit handlers: Ctrl-C must work even where SIGINT was inherited as ignored (background jobs).
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with tempfile.TemporaryDirectory(prefix="kvwatch-demo-") as tmp:
            demo = Demo(
                Path(tmp), listen=listen, interval=interval, fault_after=fault_after, fact_ttl=fact_ttl
            )
            demo.start()
            prom: DemoPrometheus | None = None
            try:
                print(f"kvwatch demo: sidecar serving {demo.sidecar.url}", file=out, flush=True)
                print(f"kvwatch demo: engines writing to {tmp} (Ctrl-C stops)", file=out, flush=True)
                binary = find_prometheus() if prometheus else None
                if binary is not None:
                    target = demo.sidecar.url.split("//", 1)[1].split("/", 1)[0]
                    prom = DemoPrometheus(
                        binary, Path(tmp) / "prometheus", target, demo.alert, alert_for, "1s", for_scale
                    )
                    ready = prom.wait_ready()
                    pool_metric = names.KV_POOL_TOKENS.sample_name
                    demo.fault_gate = functools.partial(prom.has_series, pool_metric)
                    print(
                        f"kvwatch demo: Prometheus {'serving' if ready else 'starting at'} {prom.url},"
                        f" alerts at {prom.alerts_page} (rules from kvwatch rules;"
                        f" {demo.alert} for: {prom.shipped_for} -> {alert_for} for the demo"
                        + ("" if for_scale == 1.0 else f"; every other for: / {for_scale:g}")
                        + ")",
                        file=out,
                        flush=True,
                    )
                else:
                    print(
                        "kvwatch demo: Prometheus not installed: the summary says what would fire", file=out
                    )
                calm = _Calm(out, heartbeat)
                while duration is None or time.monotonic() - demo.started < duration:
                    left = (
                        every
                        if duration is None
                        else min(every, duration - (time.monotonic() - demo.started))
                    )
                    if stop.wait(max(left, 0.0)):
                        break
                    calm.tick(demo, prom, time.monotonic() - demo.started)
            finally:
                if prom is not None:
                    prom.stop()
                demo.stop()
            print("kvwatch demo: stopped", file=out, flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
