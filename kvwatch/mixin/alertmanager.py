"""The Alertmanager configuration shipped in deploy/alertmanager: severity routing and inhibitions.

One cause, one page: when a more specific or more severe alert fires for the same sidecar, source
or rank, the alerts it explains are inhibited (they stay visible in Alertmanager, marked suppressed,
but notify nobody). Every alert name comes from ``kvwatch.mixin.rules``; the labels an inhibition
compares from ``kvwatch.mixin.config``. docs/runbook.md ("Severities and inhibitions") explains the
scheme; tests/test_mixin.py checks every name exists and the file is fresh, tests/test_promtool.py
runs ``amtool check-config`` and ``amtool config routes test`` on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvwatch.core.jsontypes import JsonObject, JsonValue
from kvwatch.core.labels import SEVERITIES, Severity
from kvwatch.mixin import config, rules

ALERTMANAGER_FILE = "alertmanager.yml"

# Receivers: replace the webhook URLs with your pager and ticket integrations.
PAGE = "kvwatch-page"
QUEUE = "kvwatch-queue"
NULL = "kvwatch-null"


@dataclass(frozen=True)
class Inhibition:
    """While `source` fires, `targets` with the same `equal` labels notify nobody."""

    source: str  # an alert name, or "severity=<level>"
    targets: tuple[str, ...]
    equal: tuple[str, ...]
    why: str

    def as_dict(self) -> JsonObject:
        source: list[JsonValue]
        target: list[JsonValue]
        if self.source.startswith("severity="):
            source = [f'severity="{self.source.partition("=")[2]}"']
        else:
            source = [f'alertname="{self.source}"']
        if all(t.startswith("severity=") for t in self.targets):
            levels = "|".join(t.partition("=")[2] for t in self.targets)
            target = [f'severity=~"{levels}"', 'alertname=~"KV.*"']
        else:
            target = [f'alertname=~"{"|".join(self.targets)}"']
        return {"source_matchers": source, "target_matchers": target, "equal": list(self.equal)}


def inhibitions() -> list[Inhibition]:
    """Every inhibition, most general first."""
    rank, source, target = config.INHIBIT_RANK, config.INHIBIT_SOURCE, config.INHIBIT_TARGET
    return [
        Inhibition(
            "KVWatchTargetDown",
            tuple(a.alert for a in rules.alerts() if a.alert not in ("KVWatchTargetDown", "KVWatchAbsent")),
            target,
            "kvwatch itself cannot be scraped: whatever else it said about this pod is stale.",
        ),
        Inhibition(
            "severity=critical",
            ("severity=warning", "severity=info"),
            source,
            "The engine failed to start: its capacity warnings follow from that.",
        ),
        Inhibition(
            "KVWatchSourceDown",
            ("KVWatchStale", "KVWatchParseErrors", "KVCacheNearlyFull", "KVHeadroomBelowOneRequest"),
            source,
            "kvwatch cannot read the source: its facts are stale and its usage values frozen.",
        ),
        Inhibition(
            "KVWatchStale",
            ("KVCacheNearlyFull", "KVHeadroomBelowOneRequest", "KVPreemptionsRising"),
            rank,
            "The rank's facts froze: usage-based alerts on it read a frozen value.",
        ),
        Inhibition(
            "KVPoolShrankSinceLastStart",
            ("KVPoolDriftsFromPrediction", "KVPoolBelowSiblingReplicas", "KVRankBelowSiblings"),
            rank,
            "A restart came back with a smaller pool: drift and sibling gaps are that one change.",
        ),
        Inhibition(
            "KVRankBelowSiblings",
            ("KVPoolDriftsFromPrediction", "KVPoolBelowSiblingReplicas"),
            rank,
            "One rank of the engine is short (another process on its GPU): the drift and the gap to "
            "the sibling replicas are that rank.",
        ),
        Inhibition(
            "KVPoolBelowSiblingReplicas",
            ("KVPoolDriftsFromPrediction",),
            rank,
            "The replica is smaller than identical siblings: the drift from prediction is the same gap.",
        ),
        Inhibition(
            "KVPreemptionsRising",
            ("KVCacheNearlyFull", "KVHeadroomBelowOneRequest"),
            rank,
            "The pool is full enough to evict requests: full and no-headroom are its causes.",
        ),
        Inhibition(
            "KVCacheNearlyFull",
            ("KVHeadroomBelowOneRequest",),
            rank,
            "A full pool has no headroom either.",
        ),
    ]


# Where each severity goes: a critical alert pages (and repeats hourly), a warning queues, info is dropped.
RECEIVER: dict[Severity, str] = {"critical": PAGE, "warning": QUEUE, "info": NULL}


def _route(severity: Severity) -> JsonObject:
    route: JsonObject = {"receiver": RECEIVER[severity], "matchers": [f'severity="{severity}"']}
    if severity == "critical":
        route["repeat_interval"] = "1h"
    return route


def document() -> JsonObject:
    """The Alertmanager configuration (route, receivers, inhibit_rules)."""
    group_by: list[JsonValue] = ["alertname", "cluster", "namespace", "pod", config.MODEL]
    return {
        "route": {
            "receiver": QUEUE,
            "group_by": group_by,
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
            "routes": [_route(severity) for severity in SEVERITIES],
        },
        "receivers": [
            {"name": PAGE, "webhook_configs": [{"url": "http://alert-router.example:9095/page"}]},
            {"name": QUEUE, "webhook_configs": [{"url": "http://alert-router.example:9095/queue"}]},
            {"name": NULL},
        ],
        "inhibit_rules": [i.as_dict() for i in inhibitions()],
    }


HEADER = (
    "# Generated by `kvwatch rules --alertmanager` from kvwatch/mixin; edit the code, not this file.\n"
    "# Severity routing and kvwatch's inhibitions (docs/runbook.md, 'Severities and inhibitions').\n"
    "# Replace the webhook URLs with your receivers, or merge `inhibit_rules` into your own config.\n"
)


def rendered() -> str:
    """The file's text."""
    lines = [HEADER]
    body = rules.to_yaml(document())
    # Say why each inhibition exists, above its entry.
    whys = iter(i.why for i in inhibitions())
    for line in body.splitlines(keepends=True):
        if line.startswith("  - source_matchers:"):
            lines.append(f"  # {next(whys)}\n")
        lines.append(line)
    return "".join(lines)


def write(path: Path) -> Path:
    """Write the configuration; return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(rendered(), encoding="utf-8")
    return path
