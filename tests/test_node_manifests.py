"""deploy/kubernetes/node: the node agent's DaemonSet and PodMonitor agree with `kvwatch run` and
with each other, and read the kubelet's tree without touching the serving pods."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from kvwatch.export import names
from kvwatch.sidecar.config import DEFAULT_PORT, load_settings

NODE = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes" / "node"


def _docs() -> dict[str, dict[str, Any]]:
    kustomization = yaml.safe_load((NODE / "kustomization.yaml").read_text(encoding="utf-8"))
    assert set(kustomization["resources"]) == {p.name for p in NODE.glob("*.yaml")} - {"kustomization.yaml"}
    out: dict[str, dict[str, Any]] = {}
    for resource in kustomization["resources"]:
        for doc in yaml.safe_load_all((NODE / resource).read_text(encoding="utf-8")):
            out[doc["kind"]] = doc
    return out


def _run_args(args: list[str]) -> argparse.Namespace:
    from kvwatch.commands import run

    parser = argparse.ArgumentParser(prog="kvwatch run", exit_on_error=False)
    run.add_arguments(parser)
    return parser.parse_args(args)


def test_the_daemonset_runs_node_mode_on_the_mounted_log_root(tmp_path: Path) -> None:
    ds = _docs()["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert (
        ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    (kvwatch,) = pod["containers"]
    assert kvwatch["args"][0] == "run"
    args = _run_args(kvwatch["args"][1:])
    mounts = {m["mountPath"]: m for m in kvwatch["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    root = mounts[args.node_logs]
    assert root["readOnly"] is True
    assert volumes[root["name"]]["hostPath"]["path"] == "/var/log/pods"
    # The flags are valid settings (the root replaced by a folder that exists here).
    flags = {k: v for k, v in vars(args).items() if v is not None and k != "config"}
    flags["node_logs"], flags["state_dir"] = str(tmp_path), str(tmp_path / "state")
    settings = load_settings(flags, environ={})
    assert settings.node_logs == tmp_path and settings.max_containers == 128
    assert args.listen == f"0.0.0.0:{DEFAULT_PORT}"
    assert [p["containerPort"] for p in kvwatch["ports"]] == [DEFAULT_PORT]
    assert kvwatch["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # Writable: only the state and /tmp volumes; the rest, root filesystem included, is read-only.
    assert {m["mountPath"] for m in mounts.values() if not m.get("readOnly")} == {args.state_dir, "/tmp"}
    security = kvwatch["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    # It asks the API server nothing: no token mounted, no RBAC shipped.
    assert pod["automountServiceAccountToken"] is False
    assert not {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"} & set(_docs())
    # Lands on GPU nodes despite their taints.
    assert {t["key"] for t in pod["tolerations"]} >= {"nvidia.com/gpu"}
    assert pod["nodeSelector"]


def test_the_podmonitor_keeps_the_engine_pods_labels() -> None:
    docs = _docs()
    monitor, ds = docs["PodMonitor"], docs["DaemonSet"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"] for c in ds["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert endpoint["port"] in ports
    # kvwatch's namespace/pod/container (the engine's pod) win over the agent's target labels.
    assert endpoint["honorLabels"] is True
    assert set(names.WORKLOAD_LABELS) == {"namespace", "pod", "container"}
    (job,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
    assert job["replacement"].startswith("kvwatch")
