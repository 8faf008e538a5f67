"""Node mode (``kvwatch run --node-logs``): engine containers found in a kubelet-shaped log tree.

The tree is built the way the kubelet writes it (``<ns>_<pod>_<uid>/<container>/<N>.log``, CRI lines),
written live, rotated the kubelet's way (``0.log`` renamed to ``0.log.<timestamp>``, a new ``0.log``,
older generations gzipped), restarted (``1.log``) and deleted; every pod's figures must come out
under its own namespace/pod/container, with every line read exactly once.
"""

from __future__ import annotations

import gzip
import os
import shutil
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

from kvwatch.sidecar.app import Sidecar
from kvwatch.sidecar.node import Container, scan, selected

DEMO = Path(__file__).resolve().parent.parent / "kvwatch" / "data" / "demo"
VLLM_LINES = (DEMO / "vllm.log").read_text(encoding="utf-8").splitlines()
VLLM_STARTUP = VLLM_LINES[:745]  # demo.json: the first 745 lines are the engine's start
SGLANG_SECTIONS: dict[str, list[str]] = {}
_section = ""
for _line in (DEMO / "sglang.log").read_text(encoding="utf-8").splitlines():
    if _line.startswith("#@"):
        _section = _line.split()[1]
        SGLANG_SECTIONS.setdefault(_section, [])
    elif _section:
        SGLANG_SECTIONS[_section].append(_line)

VLLM_POD = "team-a_vllm-llama-6d5f9-x2x7k_0b6c4a8e-1f2d-4c3b-9a8e-7d6c5b4a3f21"
SGLANG_POD = "team-b_sglang-dsv32-0_5e1f0a7c-2b3d-4e5f-8a9b-0c1d2e3f4a5b"


def _vllm_stats(usage_pct: float, running: int) -> str:
    return (
        "(APIServer pid=1) INFO 04-22 00:08:00 [v1/metrics/loggers.py:259] Engine 000: Avg prompt throughput: "
        f"0.0 tokens/s, Avg generation throughput: 10.0 tokens/s, Running: {running} reqs, Waiting: 0 reqs, "
        f"GPU KV cache usage: {usage_pct:.1f}%, Prefix cache hit rate: 0.0%"
    )


class Kubelet:
    """Writes container logs the way the kubelet and the container runtime do."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.written: dict[str, int] = {}  # source name -> lines written
        self.stamp = 0

    def container_dir(self, pod_dir: str, container: str) -> Path:
        path = self.root / pod_dir / container
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write(self, pod_dir: str, container: str, lines: list[str], restart: int = 0) -> None:
        ns, pod, _uid = pod_dir.split("_")
        with (self.container_dir(pod_dir, container) / f"{restart}.log").open("a", encoding="utf-8") as f:
            for line in lines:
                # CRI: time, stream, P(artial)/F(ull) tag, the line.
                f.write(f"2026-12-01T10:00:00.{self.stamp:09d}Z stdout F {line}\n")
                self.stamp += 1
        name = f"{ns}.{pod}.{container}"
        self.written[name] = self.written.get(name, 0) + len(lines)

    def rotate(self, pod_dir: str, container: str, restart: int = 0) -> None:
        """kubelet's rotation: gzip older generations, rename the live file aside, runtime reopens."""
        d = self.container_dir(pod_dir, container)
        for old in sorted(d.glob(f"{restart}.log.*")):
            if old.suffix != ".gz":
                with old.open("rb") as src, gzip.open(f"{old}.gz", "wb") as dst:
                    shutil.copyfileobj(src, dst)
                old.unlink()
        self.stamp += 1
        os.rename(d / f"{restart}.log", d / f"{restart}.log.20261201-1000{self.stamp % 100:02d}")
        (d / f"{restart}.log").touch()


def _scrape(car: Sidecar) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(car.url, timeout=10) as resp:
        text = resp.read().decode("utf-8")
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def _value(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float | None:
    found = [v for lab, v in metrics.get(name, []) if all(lab.get(k) == w for k, w in labels.items())]
    assert len(found) <= 1, f"{name}{labels}: {len(found)} series"
    return found[0] if found else None


def test_scan_reads_the_pod_from_the_path_and_skips_what_is_not_a_container_dir(tmp_path: Path) -> None:
    (tmp_path / VLLM_POD / "vllm").mkdir(parents=True)
    (tmp_path / VLLM_POD / "istio-proxy").mkdir()
    (tmp_path / "not-a-pod-dir").mkdir()
    (tmp_path / VLLM_POD / "stray.log").write_text("x\n")
    found = scan(str(tmp_path))
    assert [(c.namespace, c.pod, c.container) for c in found] == [
        ("team-a", "vllm-llama-6d5f9-x2x7k", "istio-proxy"),
        ("team-a", "vllm-llama-6d5f9-x2x7k", "vllm"),
    ]
    vllm = found[1]
    assert vllm.source_name == "team-a.vllm-llama-6d5f9-x2x7k.vllm"
    assert selected(vllm, ("team-*/*/*",), ("*/*/istio-proxy",))
    assert not selected(found[0], ("team-*/*/*",), ("*/*/istio-proxy",))


def test_a_long_pod_name_gets_a_short_unique_source_name() -> None:
    pod = "p" * 200
    a = Container("/x", "ns", pod, "uid-1", "vllm")
    b = Container("/y", "ns", pod, "uid-2", "vllm")
    assert len(a.source_name) <= 63 and a.source_name != b.source_name


@pytest.mark.integration
def test_node_mode_follows_pods_through_rotation_restart_and_deletion(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar]
) -> None:
    root = tmp_path / "pods"
    root.mkdir()
    kubelet = Kubelet(root)
    kubelet.write(VLLM_POD, "vllm", VLLM_STARTUP)
    kubelet.write(VLLM_POD, "istio-proxy", ["[2026-12-01T10:00:00Z] envoy started"] * 3)
    kubelet.write(SGLANG_POD, "sglang", SGLANG_SECTIONS["startup"])
    car = sidecar_factory(node_logs=str(root), exclude=["*/*/istio-proxy"], pod_expiry=1.0)
    vllm_src, sglang_src = "team-a.vllm-llama-6d5f9-x2x7k.vllm", "team-b.sglang-dsv32-0.sglang"
    vllm_pod = {"namespace": "team-a", "pod": "vllm-llama-6d5f9-x2x7k", "container": "vllm"}
    sglang_pod = {"namespace": "team-b", "pod": "sglang-dsv32-0", "container": "sglang"}

    def pools() -> tuple[float | None, float | None]:
        m = _scrape(car)
        return (
            _value(m, "kvwatch_kv_pool_tokens", source=vllm_src, **vllm_pod),
            _value(m, "kvwatch_kv_pool_tokens", source=sglang_src, **sglang_pod),
        )

    wait_until(lambda: pools() == (476_000.0, 1_462_784.0), timeout=20)

    # Stats lines live, then the kubelet rotates the vLLM container's log twice (the older
    # generation gzipped), with lines before and after each rotation.
    for i in range(30):
        kubelet.write(VLLM_POD, "vllm", [_vllm_stats(i, i)])
    kubelet.rotate(VLLM_POD, "vllm")
    for i in range(30, 60):
        kubelet.write(VLLM_POD, "vllm", [_vllm_stats(i % 50, i)])
    kubelet.rotate(VLLM_POD, "vllm")
    kubelet.write(VLLM_POD, "vllm", [_vllm_stats(42.5, 7)])
    kubelet.write(SGLANG_POD, "sglang", SGLANG_SECTIONS["stats"])
    assert any(p.suffix == ".gz" for p in (root / VLLM_POD / "vllm").iterdir())

    def caught_up() -> bool:
        m = _scrape(car)
        return (
            _value(m, "kvwatch_lines_read_total", source=vllm_src) == kubelet.written[vllm_src]
            and _value(m, "kvwatch_lines_read_total", source=sglang_src) == kubelet.written[sglang_src]
        )

    wait_until(caught_up, timeout=20)
    m = _scrape(car)
    assert _value(m, "kvwatch_kv_usage_ratio", source=vllm_src, **vllm_pod) == pytest.approx(0.425)
    assert _value(m, "kvwatch_requests_running", source=vllm_src, **vllm_pod) == 7
    assert _value(m, "kvwatch_log_rotations_total", source=vllm_src) == 2
    assert _value(m, "kvwatch_kv_usage_ratio", source=sglang_src, **sglang_pod) is not None
    # The proxy container was excluded: no source, no series.
    assert not [lab for lab, _ in m["kvwatch_source_up"] if "istio" in lab["source"]]
    assert _value(m, "kvwatch_node_containers", state="followed") == 2

    # The vLLM container restarts: the runtime starts 1.log; the engine starts again.
    kubelet.write(VLLM_POD, "vllm", VLLM_STARTUP, restart=1)
    kubelet.write(VLLM_POD, "vllm", [_vllm_stats(3.0, 1)], restart=1)
    wait_until(
        lambda: _value(_scrape(car), "kvwatch_engine_restarts_total", source=vllm_src, **vllm_pod) == 1
    )
    wait_until(caught_up, timeout=20)
    m = _scrape(car)
    assert _value(m, "kvwatch_kv_usage_ratio", source=vllm_src, **vllm_pod) == pytest.approx(0.03)
    assert _value(m, "kvwatch_kv_pool_tokens", source=vllm_src, **vllm_pod) == 476_000

    # The kubelet removes the dead container's logs (0.log and its rotated generations): the
    # source is still up, reading 1.log.
    for old in (root / VLLM_POD / "vllm").glob("0.log*"):
        old.unlink()
    kubelet.write(VLLM_POD, "vllm", [_vllm_stats(4.0, 2)], restart=1)
    wait_until(caught_up, timeout=20)
    m = _scrape(car)
    assert _value(m, "kvwatch_kv_usage_ratio", source=vllm_src, **vllm_pod) == pytest.approx(0.04)
    wait_until(lambda: _value(_scrape(car), "kvwatch_source_up", source=vllm_src) == 1, timeout=20)

    # The SGLang pod is deleted: its series go once the expiry has passed; vLLM's stay.
    shutil.rmtree(root / SGLANG_POD)

    def sglang_gone() -> bool:
        m = _scrape(car)
        return _value(m, "kvwatch_kv_pool_tokens", source=sglang_src, **sglang_pod) is None and not [
            lab for lab, _ in m["kvwatch_source_up"] if lab["source"] == sglang_src
        ]

    wait_until(sglang_gone, timeout=20)
    m = _scrape(car)
    assert _value(m, "kvwatch_kv_pool_tokens", source=vllm_src, **vllm_pod) == 476_000
    assert _value(m, "kvwatch_source_up", source=vllm_src) == 1


@pytest.mark.integration
def test_node_mode_caps_the_containers_it_follows_and_counts_the_rest(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar]
) -> None:
    root = tmp_path / "pods"
    kubelet = Kubelet(root)
    for i in range(5):
        kubelet.write(f"ns_vllm-{i}_uid-{i}", "vllm", VLLM_STARTUP[:5])
    car = sidecar_factory(node_logs=str(root), max_containers=3)
    m = _scrape(car)
    running = (_value(m, "kvwatch_node_containers", state="probing") or 0) + (
        _value(m, "kvwatch_node_containers", state="followed") or 0
    )
    assert running == 3
    assert _value(m, "kvwatch_node_containers_dropped_total") == 2
    # Counted once per container, however many scans see it.
    assert car.node is not None
    car.node.scan_now()
    assert _value(_scrape(car), "kvwatch_node_containers_dropped_total") == 2


def test_node_mode_refuses_a_root_that_is_not_a_directory(tmp_path: Path) -> None:
    from kvwatch.core.errors import ConfigError
    from kvwatch.sidecar.config import load_settings

    with pytest.raises(ConfigError, match="is not a directory"):
        load_settings({"node_logs": str(tmp_path / "missing")}, environ={})
    with pytest.raises(ConfigError, match="NAMESPACE/POD/CONTAINER"):
        load_settings({"node_logs": str(tmp_path), "include": ["vllm-*"]}, environ={})
