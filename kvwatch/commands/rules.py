"""`kvwatch rules`: write the Prometheus recording and alerting rules generated from kvwatch's metric names."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvwatch.core.errors import ConfigError
from kvwatch.mixin import alertmanager, config, rules

HELP = "Write the Prometheus recording and alerting rules (and optionally a PrometheusRule) to a folder."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("rules"),
        metavar="DIR",
        help=f"folder for {rules.RULES_FILE} and {rules.ALERTS_FILE} (default: rules)",
    )
    parser.add_argument(
        "--prometheus-rule",
        type=Path,
        metavar="FILE",
        help="also write a prometheus-operator PrometheusRule carrying the same groups",
    )
    parser.add_argument(
        "--alertmanager",
        type=Path,
        metavar="FILE",
        help="also write an Alertmanager configuration: severity routing and kvwatch's inhibit_rules",
    )
    parser.add_argument(
        "--runbook-url",
        default=config.RUNBOOK_URL,
        metavar="URL",
        help="where docs/runbook.md is published; alerts link to URL#<alertname> (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    url = str(args.runbook_url)
    if not url.startswith(("http://", "https://")) or "#" in url:
        raise ConfigError(f"--runbook-url must be an http(s) URL without a #fragment, got {url!r}")
    try:
        written = rules.write(args.out, args.prometheus_rule, url)
        if args.alertmanager is not None:
            written.append(alertmanager.write(args.alertmanager))
    except OSError as exc:
        raise ConfigError(f"cannot write rules: {exc.strerror or exc} ({exc.filename})") from None
    for path in written:
        print(path)
    return 0
