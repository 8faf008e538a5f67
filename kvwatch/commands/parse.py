"""`kvwatch parse`: replay engine logs through the sidecar's pipeline and print what they say.

The same LinePipeline the sidecar feeds from its tailer reads each file to EOF; the result is a
table per engine instance (default), one JSON object (``--json``) or one JSON event per line
(``--events``, streamed as read).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from kvwatch.commands.summary import InstanceSummary, Summary, summary
from kvwatch.core.errors import ConfigError
from kvwatch.core.events import Event, event_to_json
from kvwatch.core.kinds import ENGINE_CHOICES, ENGINE_NAMES
from kvwatch.core.units import format_bytes
from kvwatch.sources.pipeline import replay

HELP = "Read vLLM/SGLang logs ('-' for stdin) and print the KV-cache pool, budget and usage they report."

# Files at least this big get a progress bar on stderr (when it is a terminal).
PROGRESS_MIN_BYTES = 4 * 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="log file, or '-' for stdin")
    parser.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default="auto",
        help="engine that wrote the logs (default: detected per file)",
    )
    parser.add_argument(
        "--serial",
        action="store_true",
        help="one CPU: never drop a large file's access lines in a helper process",
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print one JSON object (per-instance summary)")
    out.add_argument("--events", action="store_true", help="print every event as one JSON line")


class _Progress:
    """A one-line progress bar on stderr for big files; silent when stderr is not a terminal."""

    def __init__(self) -> None:
        self.active = False

    def __call__(self, source: str, done: int, total: int) -> None:
        if total < PROGRESS_MIN_BYTES:
            return
        pct = 100 * done // total if total else 100
        width = 30
        filled = width * pct // 100
        bar = "#" * filled + "." * (width - filled)
        sys.stderr.write(f"\r{os.path.basename(source)} [{bar}] {pct:3d}% {format_bytes(done)}")
        sys.stderr.flush()
        self.active = True
        if done >= total:
            sys.stderr.write("\n")
            self.active = False


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,}"


def _rows(instance: InstanceSummary) -> list[tuple[str, str]]:
    """Human rows for one instance of the summary."""
    conc = instance.max_concurrency
    conc_text = "-" if conc is None else f"{conc:.2f}x"
    if conc is not None and instance.max_concurrency_tokens is not None:
        conc_text += f" at {instance.max_concurrency_tokens:,} tokens"
    usage = instance.kv_usage_ratio
    failure = instance.startup_error
    if failure is None:
        failure_text = "-"
    else:
        parts = []
        if failure.max_model_len is not None:
            parts.append(f"max_model_len {failure.max_model_len:,}")
        if failure.needed_kv_bytes is not None:
            parts.append(f"needs {format_bytes(failure.needed_kv_bytes)}")
        if failure.available_kv_bytes is not None:
            parts.append(f"available {format_bytes(failure.available_kv_bytes)}")
        if failure.estimated_max_model_len is not None:
            parts.append(f"fits {failure.estimated_max_model_len:,}")
        failure_text = ", ".join(parts) or "yes"
    return [
        ("KV pool tokens", _num(instance.kv_pool_tokens)),
        ("KV pool blocks", _num(instance.kv_pool_blocks)),
        ("block size", _cell(instance.block_size)),
        ("KV pool memory", format_bytes(instance.kv_pool_bytes)),
        ("max concurrency", conc_text),
        ("model weights", format_bytes(instance.model_weights_bytes)),
        ("KV usage", "-" if usage is None else f"{100 * usage:.1f}%"),
        ("requests running", _cell(instance.requests_running)),
        ("requests waiting", _cell(instance.requests_waiting)),
        ("preemptions", _cell(instance.preemptions_total)),
        ("startup error", failure_text),
    ]


def format_table(summary: Summary) -> str:
    """The default output: one block of 'fact  value' rows per engine instance."""
    engine = summary.engine or "unknown engine"
    version = summary.engine_version
    head = f"{engine} {version}" if version else engine
    if not summary.instances:
        return f"{head}: no KV-cache lines found\n"
    lines: list[str] = []
    for instance in summary.instances:
        where = f"{instance.source}, " if instance.source is not None else ""
        lines.append(f"{head} ({where}instance {instance.instance})")
        rows = _rows(instance)
        width = max(len(label) for label, _ in rows)
        lines.extend(f"  {label.ljust(width)}  {value}" for label, value in rows)
        lines.append("")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    for path in args.logs:
        if path != "-" and os.path.isdir(path):
            raise ConfigError(f"{path} is a directory, not a log file")
        if path != "-" and not os.path.exists(path):
            raise ConfigError(f"no such log file: {path}")
    if args.logs.count("-") > 1:
        raise ConfigError("'-' (stdin) can be given once")

    def print_events(events: tuple[Event, ...]) -> None:
        for event in events:
            sys.stdout.write(event_to_json(event) + "\n")

    progress = _Progress() if sys.stderr.isatty() else None
    try:
        result = replay(
            args.logs,
            engine=args.engine,
            on_events=print_events if args.events else None,
            progress=progress,
            parallel=False if args.serial else None,
        )
    except BrokenPipeError:
        raise  # (stdout's reader went away, as `| head` does: not a file kvwatch could not read)
    except OSError as exc:
        raise ConfigError(f"cannot read {exc.filename or 'input'}: {exc.strerror or exc}") from exc
    summarized = summary(result.snapshots(), result.engine)
    if not summarized.instances:
        # As explain: nothing to report is an error (exit 2), not an empty table that looks fine.
        forced = f" for --engine {args.engine}" if args.engine != "auto" else ""
        raise ConfigError(
            f"no KV-cache lines in {', '.join(args.logs)}{forced} (kvwatch reads the pool, memory and "
            f"stats lines of {' and '.join(ENGINE_NAMES)} logs)"
        )
    if args.events:
        return 0
    if args.json:
        sys.stdout.write(json.dumps(summarized.to_json(), indent=2) + "\n")
    else:
        sys.stdout.write(format_table(summarized))
    return 0
