"""`kvwatch dashboards`: write the Grafana dashboards generated from kvwatch's metric names.

The dashboards are built with grafana-foundation-sdk, an optional dependency (``kvwatch[dashboards]``)
the sidecar image does not carry; without it this command fails with a one-line message.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvwatch.core.errors import ConfigError

HELP = "Write the Grafana dashboards (JSON, and optionally a Kubernetes ConfigMap) to a folder."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("dashboards"),
        metavar="DIR",
        help="folder for the dashboard JSON files (default: dashboards)",
    )
    parser.add_argument(
        "--configmap",
        type=Path,
        metavar="FILE",
        help="also write a ConfigMap with the dashboards, labelled grafana_dashboard=1 for Grafana's sidecar",
    )


def run(args: argparse.Namespace) -> int:
    try:
        from kvwatch.mixin import dashboards
    except ImportError as exc:
        raise ConfigError(
            f"kvwatch dashboards needs grafana-foundation-sdk ({exc.name} is missing): "
            "pip install 'kvwatch[dashboards]'"
        ) from None
    try:
        written = dashboards.write(args.out, args.configmap)
    except OSError as exc:
        raise ConfigError(f"cannot write dashboards: {exc.strerror or exc} ({exc.filename})") from None
    for path in written:
        print(path)
    return 0
