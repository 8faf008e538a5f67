"""`kvwatch demo`: the sidecar on bundled vLLM and SGLang logs written live (what `make demo` runs)."""

from __future__ import annotations

import argparse
import sys

HELP = "Run the sidecar on bundled vLLM and SGLang sample logs written live into temporary files."


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


def run(args: argparse.Namespace) -> int:
    """Start the demo and print a live summary until Ctrl-C or --duration."""
    from kvwatch.demo import run_demo

    return run_demo(args.duration, args.listen, args.interval, sys.stdout)
