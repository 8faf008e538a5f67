"""`kvwatch demo`: the sidecar on bundled vLLM and SGLang logs written live (what `make demo` runs)."""

from __future__ import annotations

import argparse
import sys

HELP = "Run the sidecar on bundled vLLM and SGLang sample logs written live into temporary files."


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the demo."""
    parser.add_argument(
        "--listen", default="127.0.0.1:9477", metavar="HOST:PORT", help="where to serve /metrics"
    )
    parser.add_argument(
        "--duration", type=float, metavar="SECONDS", help="stop after this long (default: Ctrl-C)"
    )
    parser.add_argument(
        "--interval", type=float, default=0.5, metavar="SECONDS", help="pace of the engines' lines"
    )
    parser.add_argument(
        "--fault-after",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="when the one deliberate fault happens (default 20; a negative value: never)",
    )
    parser.add_argument(
        "--no-prometheus", action="store_true", help="do not start Prometheus even when it is installed"
    )
    parser.add_argument(
        "--alert-for",
        default="5s",
        metavar="DURATION",
        help="the for: of the fault's alert in the demo's copy of the rules (default 5s)",
    )
    parser.add_argument(
        "--for-scale",
        type=_positive,
        default=1.0,
        metavar="FACTOR",
        help="divide every other alert's for: by FACTOR in the demo's rules (default 1: as shipped)",
    )
    parser.add_argument(
        "--fact-ttl",
        type=_positive,
        metavar="SECONDS",
        help="the sidecar's --fact-ttl (default: the sidecar's, 60)",
    )
    parser.add_argument(
        "--heartbeat",
        type=_positive,
        default=60.0,
        metavar="SECONDS",
        help="while nothing but usage changes, one line this often (default 60)",
    )


def run(args: argparse.Namespace) -> int:
    """Start the demo and print a live summary until Ctrl-C or --duration."""
    from kvwatch.sidecar.demo import run_demo

    fault_after = None if args.fault_after < 0 else args.fault_after
    return run_demo(
        args.duration,
        args.listen,
        args.interval,
        sys.stdout,
        fault_after=fault_after,
        prometheus=not args.no_prometheus,
        alert_for=args.alert_for,
        for_scale=args.for_scale,
        fact_ttl=args.fact_ttl,
        heartbeat=args.heartbeat,
    )
