"""kvwatch's monitoring mixin: dashboards, recording rules and alerts, generated from ``kvwatch.export.names``.

Laid out like the kubernetes-mixin and node-mixin: ``config`` holds every selector, threshold and
duration (change them there, then regenerate); ``rules`` renders ``rules/kvwatch.rules.yaml``,
``rules/kvwatch.alerts.yaml`` and the Kubernetes PrometheusRule; ``dashboards`` builds the Grafana
dashboards with grafana-foundation-sdk (an optional dependency, never imported by the sidecar).
Metric names come only from ``kvwatch.export.names``, so a rename there shows up here on regeneration.
"""

from __future__ import annotations
