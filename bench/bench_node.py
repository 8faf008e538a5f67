"""Node mode's target (issue 23 item 4): one agent follows 64 engine containers' logs at 200 lines/s
each (12,800 lines/s, kubelet-shaped tree, CRI lines) in at most 5% of one CPU and 100 MiB RSS.

kvwatch runs as its own process (``kvwatch run --node-logs``), scraped every 15 s as Prometheus
would; a second process writes the logs. What a container prints is the replay benchmark's busy
server (bench/gen_busy_log.py, built from the real samples: the startup block once, then ~98.4%
access lines and ~1.6% stats lines with a few preemptions), the vLLM API-server shape for half the
containers and the SGLang shape for the other half, each line wrapped by the kubelet's CRI prefix.
CPU is the kvwatch process's utime+stime over the measured window.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONTAINERS = 64
LINES_PER_SECOND = 200
WARMUP_S = 10.0
MEASURE_S = 30.0
CPU_PERCENT = 5.0
RSS_MIB = 100.0
# Lines per generated log: more than a container is sent in the whole run, so none repeats.
BUSY_LINES = 200_000

_WRITER = r"""
import os, sys, time
root, n, rate, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
corpora = {}
for spec in sys.argv[5:]:
    engine, path = spec.split("=", 1)
    corpora[engine] = [l for l in open(path, encoding="utf-8").read().split("\n") if l]
dirs = sorted(os.path.join(root, d, c) for d in os.listdir(root) for c in os.listdir(os.path.join(root, d)))
files = [open(os.path.join(d, "0.log"), "a", encoding="utf-8", buffering=1 << 16) for d in dirs]
sources = [corpora[os.path.basename(d)] for d in dirs]
pos = [0] * n
tick = 0.1
per_tick = max(1, int(rate * tick))
start = time.monotonic()
k = 0
while time.monotonic() - start < seconds:
    for i, f in enumerate(files):
        chunk = []
        for _ in range(per_tick):
            chunk.append("2026-12-01T10:00:00.000000000Z stdout F " + sources[i][pos[i]] + "\n")
            pos[i] = (pos[i] + 1) % len(sources[i])
        f.write("".join(chunk))
        f.flush()
    k += 1
    time.sleep(max(0.0, start + k * tick - time.monotonic()))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _busy_lines(shape: str) -> Path:
    """A busy server's log of one shape (cached in bench/out by the generator)."""
    from bench import gen_busy_log

    path = gen_busy_log.default_path(BUSY_LINES, shape)
    gen_busy_log.ensure(path, BUSY_LINES, shape=shape)
    return path


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def main() -> int:
    vllm_log, sglang_log = _busy_lines("apiserver"), _busy_lines("sglang")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "pods"
        for i in range(CONTAINERS):
            engine = "vllm" if i % 2 == 0 else "sglang"
            d = root / f"team-{i % 8}_{engine}-{i}_uid-{i:04d}" / engine
            d.mkdir(parents=True)
            (d / "0.log").touch()
        port = _free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HOME": tmp}
        kv = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvwatch",
                "run",
                "--node-logs",
                str(root),
                "--listen",
                f"127.0.0.1:{port}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        seconds = WARMUP_S + MEASURE_S + 5
        writer = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WRITER,
                str(root),
                str(CONTAINERS),
                str(LINES_PER_SECOND),
                str(seconds),
                f"vllm={vllm_log}",
                f"sglang={sglang_log}",
            ]
        )
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    _scrape(url)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        print("kvwatch did not come up")
                        return 1
                    time.sleep(0.2)
            time.sleep(WARMUP_S)
            _scrape(url)
            cpu0, t0 = _cpu_seconds(kv.pid), time.monotonic()
            peak = _rss_mib(kv.pid)
            next_scrape = t0 + 15
            while time.monotonic() - t0 < MEASURE_S:
                time.sleep(0.5)
                peak = max(peak, _rss_mib(kv.pid))
                if time.monotonic() >= next_scrape:
                    _scrape(url)
                    next_scrape += 15
            text = _scrape(url)
            cpu = (_cpu_seconds(kv.pid) - cpu0) / (time.monotonic() - t0) * 100
            peak = max(peak, _rss_mib(kv.pid))
            read = sum(
                float(row.rsplit(" ", 1)[1])
                for row in text.splitlines()
                if row.startswith("kvwatch_lines_read_total{")
            )
            followed = next(
                (
                    float(r.rsplit(" ", 1)[1])
                    for r in text.splitlines()
                    if r.startswith('kvwatch_node_containers{state="followed"}')
                ),
                0.0,
            )
        finally:
            writer.terminate()
            writer.wait(timeout=10)
            kv.terminate()
            kv.wait(timeout=10)
    ok_cpu, ok_rss = cpu <= CPU_PERCENT, peak <= RSS_MIB
    print(
        f"node mode: {CONTAINERS} containers x {LINES_PER_SECOND} lines/s ({followed:.0f} followed as engines, "
        f"{read:,.0f} lines read): CPU {cpu:.2f}% of one core (target <= {CPU_PERCENT}%) "
        f"{'ok' if ok_cpu else 'MISSED'}; peak RSS {peak:.1f} MiB (target <= {RSS_MIB:.0f}) {'ok' if ok_rss else 'MISSED'}"
    )
    return 0 if ok_cpu and ok_rss else 1


if __name__ == "__main__":
    raise SystemExit(main())
