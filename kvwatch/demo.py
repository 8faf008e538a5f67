"""`kvwatch demo`: the real sidecar on bundled engine logs, written live into temporary files.

Two fake engines "write" real log lines (kvwatch/data/demo/, copied from tests/log_samples): first
their startup lines (settings, memory budget, pool), then stats lines at a steady pace, with the vLLM
log rotated (rename and create, as logrotate does) on the way. The sidecar is the same ``Sidecar``
that ``kvwatch run`` starts; the demo only plays the engines and prints a short summary read back
from the sidecar's own /metrics registry.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import TextIO

from kvwatch import names
from kvwatch.config import load_settings
from kvwatch.sidecar.app import Sidecar


@dataclass
class _Engine:
    name: str
    path: Path
    model_config: Path
    startup: list[str]
    stats: list[str]
    sent: int = 0


def _demo_files() -> Path:
    return Path(str(resources.files("kvwatch") / "data" / "demo"))


def _load(source: dict[str, str | int], folder: Path, data: Path) -> _Engine:
    """One source of data/demo/demo.json: its log split into the startup lines and the rest."""
    name, log, n = str(source["name"]), str(source["log"]), int(source["startup_lines"])
    lines = (data / log).read_text(encoding="utf-8").splitlines()
    model = data / "models" / str(source["model_config"])
    return _Engine(name, folder / log, model, lines[:n], lines[n:])


def _append(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line + "\n")


class Demo:
    """Plays two engines into ``folder`` and runs the sidecar on them."""

    def __init__(self, folder: Path, listen: str = "127.0.0.1:9477", interval: float = 0.5) -> None:
        data = _demo_files()
        self.folder = folder
        self.interval = interval
        sources = json.loads((data / "demo.json").read_text(encoding="utf-8"))["sources"]
        self.engines = [_load(source, folder, data) for source in sources]
        for engine in self.engines:
            engine.path.touch()
        self.settings = load_settings(
            {
                "log": [f"{e.name}={e.path}" for e in self.engines],
                "model_config": [f"{e.name}={e.model_config}" for e in self.engines],
                "listen": listen,
                "state_dir": str(folder / "state"),
            },
            environ={},
        )
        self.sidecar = Sidecar(self.settings, environ={})
        self.rotated = False
        self._stop = threading.Event()
        self._writer = threading.Thread(target=self._write, name="kvwatch-demo-writer", daemon=True)

    def start(self) -> None:
        """Start the sidecar, then the engines' writer."""
        self.sidecar.start()
        self._writer.start()

    def stop(self) -> None:
        """Stop the writer and the sidecar."""
        self._stop.set()
        self._writer.join(timeout=5)
        self.sidecar.stop()

    def _write(self) -> None:
        for engine in self.engines:
            for line in engine.startup:
                _append(engine.path, line)
        step = 0
        while not self._stop.wait(self.interval):
            engine = self.engines[step % len(self.engines)]
            _append(engine.path, engine.stats[engine.sent % len(engine.stats)])
            engine.sent += 1
            step += 1
            if not self.rotated and step == 12:
                self._rotate(self.engines[0])

    def _rotate(self, engine: _Engine) -> None:
        """logrotate's default: rename the file away, the engine reopens a new one."""
        os.replace(engine.path, engine.path.with_name(engine.path.name + ".1"))
        engine.path.touch()
        self.rotated = True

    def summary(self) -> str:
        """One line per engine: pool, usage, headroom, preemptions, gap to each prediction."""
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
            usage = value(names.KV_USAGE_RATIO)
            head = value(names.KV_HEADROOM_TOKENS)
            pre = value(names.PREEMPTIONS)
            gap = value(names.KV_POOL_GAP_RATIO, basis="config")
            budget_gap = value(names.KV_POOL_GAP_RATIO, basis="engine_budget")
            state = next(
                (s for s in names.PREDICTION_STATES if value(names.PREDICTION_AVAILABLE, state=s) == 1),
                "-",
            )
            out.append(
                f"  {snap.source:<7} pool={_fmt(pool)} tokens  usage={_pct(usage)}  headroom={_fmt(head)} tokens"
                f"  preemptions={_fmt(pre)}  gap: config {_pct(gap, signed=True)},"
                f" engine budget {_pct(budget_gap, signed=True)}  prediction={state}"
            )
        return "\n".join(out) or "  (no engine seen yet)"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value * 100:+.1f}%" if signed else f"{value * 100:.1f}%"


def run_demo(duration: float | None, listen: str, interval: float, out: TextIO, every: float = 3.0) -> int:
    """Run until Ctrl-C (or SIGTERM), or for ``duration`` seconds; print the URL and a summary every few seconds."""
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Explicit handlers: Ctrl-C must work even where SIGINT was inherited as ignored (background jobs).
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with tempfile.TemporaryDirectory(prefix="kvwatch-demo-") as tmp:
            demo = Demo(Path(tmp), listen=listen, interval=interval)
            demo.start()
            print(f"kvwatch demo: sidecar serving {demo.sidecar.url}", file=out, flush=True)
            print(f"kvwatch demo: engines writing to {tmp} (Ctrl-C stops)", file=out, flush=True)
            started = time.monotonic()
            try:
                while duration is None or time.monotonic() - started < duration:
                    left = every if duration is None else min(every, duration - (time.monotonic() - started))
                    if stop.wait(max(left, 0.0)):
                        break
                    rotated = " (vLLM log rotated)" if demo.rotated else ""
                    summary = demo.summary()
                    print(f"[{time.monotonic() - started:5.1f}s]{rotated}\n{summary}", file=out, flush=True)
            finally:
                demo.stop()
            print("kvwatch demo: stopped", file=out, flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
