"""The demo's Prometheus: the shipped rules, a short scrape interval, temporary dirs, 127.0.0.1 only.

Started by ``kvwatch demo`` when a ``prometheus`` binary is on PATH. The rules are the ones
``kvwatch rules`` writes (the same as rules/ in the repository, which tests/test_mixin.py holds
equal), with changes that are printed: the ``for:`` of the alert the demo's fault raises is cut
to a few seconds, so that it fires within the demo instead of after minutes, and with
``--for-scale`` every other ``for:`` is divided by that factor (to watch a quiet fleet stay quiet
past all of them in a short run).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from kvwatch.mixin import config, rules

JOB = "kvwatch-demo"


@dataclass(frozen=True)
class AlertState:
    """One alert Prometheus reports: its name, state (pending/firing) and labels."""

    name: str
    state: str
    labels: dict[str, str]


def find_prometheus() -> str | None:
    """The Prometheus server binary on PATH, or None."""
    return shutil.which("prometheus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


_DURATION = re.compile(r"(\d+)([smh])")
_SECONDS = {"s": 1, "m": 60, "h": 3600}


def scaled(duration: str, scale: float) -> str:
    """A shipped ``for:`` ('15m') divided by ``scale``, in whole milliseconds (at least 1 ms)."""
    match = _DURATION.fullmatch(duration)
    if match is None:
        raise ValueError(f"not a duration kvwatch's rules use: {duration!r}")
    seconds = int(match[1]) * _SECONDS[match[2]]
    return f"{max(1, round(seconds * 1000 / scale))}ms"


def write_rules(folder: Path, alert: str, alert_for: str, for_scale: float = 1.0) -> tuple[list[Path], str]:
    """kvwatch's rules in ``folder``, ``alert``'s ``for:`` set to ``alert_for`` and every other one
    divided by ``for_scale``; (files, the alert's shipped for:)."""
    written = [Path(p) for p in rules.write(folder, None, config.RUNBOOK_URL)]
    shipped = ""
    for path in written:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        changed = False
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                if rule.get("alert") == alert:
                    shipped = str(rule.get("for", ""))
                    rule["for"] = alert_for
                    changed = True
                elif "alert" in rule and for_scale != 1.0:
                    rule["for"] = scaled(str(rule["for"]), for_scale)
                    changed = True
        if changed:
            path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return written, shipped


class DemoPrometheus:
    """A Prometheus server scraping the demo's sidecar; ``stop()`` ends it (and waits for it)."""

    def __init__(
        self,
        binary: str,
        folder: Path,
        target: str,
        alert: str,
        alert_for: str,
        interval: str,
        for_scale: float = 1.0,
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.rule_files, self.shipped_for = write_rules(folder / "rules", alert, alert_for, for_scale)
        self.alert, self.alert_for = alert, alert_for
        settings = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target]}]}],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(settings), encoding="utf-8")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = (folder / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    @property
    def alerts_page(self) -> str:
        return f"{self.url}/alerts"

    def wait_ready(self, timeout: float = 20.0) -> bool:
        """Whether Prometheus answered /-/ready within ``timeout`` seconds (False: it exited or is slow)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def has_series(self, metric: str, source: str) -> bool:
        """Whether Prometheus has scraped ``metric`` of ``source`` yet (its first scrape comes a few
        seconds after start: a fault played before it would leave the alert nothing to compare)."""
        query = urllib.parse.quote(f'{metric}{{source="{source}"}}')
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?query={query}", timeout=2) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError):
            return False
        return bool(body.get("data", {}).get("result"))

    def alerts(self) -> list[AlertState] | None:
        """The alerts Prometheus holds now (pending and firing), or None when it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/alerts", timeout=2) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError):
            return None
        out = []
        for item in body.get("data", {}).get("alerts", []):
            labels = {str(k): str(v) for k, v in item.get("labels", {}).items()}
            out.append(AlertState(labels.get("alertname", "?"), str(item.get("state", "?")), labels))
        return out

    def stop(self) -> None:
        """Terminate Prometheus and wait for it (killed after 10 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()
