"""`kvwatch run`: the sidecar. Flags map onto kvwatch.sidecar.config.Settings; the work is in kvwatch.sidecar."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from types import FrameType

from kvwatch.core.kinds import ENGINE_CHOICES
from kvwatch.sidecar.config import DEFAULT_PORT, Settings, load_settings

HELP = "Run the sidecar: tail engine logs, scrape engine /metrics, export KV-cache metrics for Prometheus."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags; every one can also come from KVWATCH_<NAME> or the --config YAML (flags win)."""
    add = parser.add_argument
    add("--config", type=Path, help="YAML settings file (keys as the long flags, e.g. metrics_url)")
    add(
        "--log",
        action="append",
        metavar="[NAME=]PATH",
        help="engine log to tail: file, glob or '-' (repeatable)",
    )
    add("--metrics-url", action="append", metavar="[NAME=]URL", help="engine /metrics to scrape (repeatable)")
    add(
        "--model-config",
        action="append",
        metavar="[NAME=]PATH",
        help="model config.json, folder or Hub name ORG/NAME[@REV], for all sources or source NAME (default: found from the model the log names)",
    )
    add(
        "--node-logs",
        metavar="DIR",
        help="node mode: follow every engine container's log under the kubelet's log root, e.g. /var/log/pods",
    )
    add(
        "--include",
        action="append",
        metavar="NS/POD/CONTAINER",
        help="node mode: follow only containers matching this glob (repeatable; default */*/*)",
    )
    add(
        "--exclude",
        action="append",
        metavar="NS/POD/CONTAINER",
        help="node mode: never follow containers matching this glob (repeatable)",
    )
    add(
        "--max-containers",
        type=int,
        metavar="N",
        help="node mode: containers followed at most; more are counted as dropped (default 128)",
    )
    add(
        "--pod-expiry",
        type=float,
        metavar="SECONDS",
        help="node mode: a deleted pod's instances are exported this long, then forgotten (default 30)",
    )
    add("--engine", choices=ENGINE_CHOICES, help="engine of every source (default: auto)")
    gpu = parser.add_mutually_exclusive_group()
    gpu.add_argument(
        "--gpu", metavar="NAME", help="GPU model, e.g. H100-SXM-80GB (else the log's total memory)"
    )
    gpu.add_argument("--gpu-memory", metavar="SIZE", help="GPU memory per device, e.g. 80GB or 81559MiB")
    add("--listen", metavar="HOST:PORT", help=f"where to serve /metrics (default 0.0.0.0:{DEFAULT_PORT})")
    add("--web-config", metavar="FILE", help="TLS and basic-auth settings (Prometheus web-config format)")
    add(
        "--state-dir",
        metavar="DIR",
        help="keep once-printed facts, counters and positions here across restarts",
    )
    add("--scrape-interval", type=float, metavar="SECONDS", help="seconds between engine scrapes (default 5)")
    add("--scrape-timeout", type=float, metavar="SECONDS", help="timeout of one engine scrape (default 3)")
    add("--max-instances", type=int, metavar="N", help="cap on tracked engine instances (default 256)")
    add(
        "--fact-ttl",
        type=float,
        metavar="SECONDS",
        help="a usage fact that stops arriving is stale after this long: no longer exported, flagged (default 60)",
    )
    add("--poll", action="store_true", default=None, help="poll log files instead of using inotify")
    add(
        "--fetch-model-configs",
        action="store_true",
        default=None,
        help="fetch the config.json of a logged model missing from the Hugging Face cache from the Hub (default: cache only)",
    )
    add(
        "--release-read",
        action="store_true",
        default=None,
        help="give back the disk blocks of log lines already read and saved (punch holes), so a log "
        "nothing rotates never fills its volume; needs --state-dir",
    )
    add("--log-level", choices=("debug", "info", "warning", "error"), help="kvwatch's own log level")


def run(args: argparse.Namespace) -> int:
    """Validate settings, start the sidecar, run until SIGTERM/SIGINT."""
    # Every flag that names a setting (the settings' own field names: one list, Settings).
    fields = {info.alias or name for name, info in Settings.model_fields.items()}
    flags = {key: value for key, value in vars(args).items() if key in fields}
    settings = load_settings(flags, config_file=args.config)
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from kvwatch.sidecar.app import Sidecar

    sidecar = Sidecar(settings)

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        sidecar.request_stop()

    def _on_hangup(signum: int, frame: FrameType | None) -> None:
        sidecar.request_save()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    # SIGHUP (the terminal or tmux pane closed, or a habit of daemons' 'reload'): save the state and
    # keep running. kvwatch logs to stderr, so there is no log file to reopen.
    signal.signal(signal.SIGHUP, _on_hangup)
    sidecar.start()
    print(f"kvwatch: serving {sidecar.url}", file=sys.stderr, flush=True)
    try:
        # No timeout: on POSIX a blocked wait is interrupted by signals, so the SIGTERM/SIGINT handler
        # still runs at once, and the main thread costs no wake-ups while kvwatch runs.
        sidecar.wait()
    finally:
        sidecar.stop()
    return 0
