"""Build a busy vLLM server's log for the replay benchmark, from the real samples in tests/log_samples.

A loaded vLLM V1 API server (0.11.2+) prints one uvicorn access line per request and one stats line
per engine every 10 s; everything kvwatch cares about is in the stats lines and a handful of startup
lines. The file is: the startup lines once (version, non-default args, max model len, then the pool
lines), then ~98.4% access lines and ~1.6% stats lines, a few of which carry 'Preemptions: N'
(printed only when N > 0, per interval). Line shapes, process prefixes and wording are copied from
the samples (the stats template from vllm/007, the access line from sglang/018 -- uvicorn's format is
the same under either engine -- behind vLLM's '(APIServer pid=N) ' stdout prefix).

Deterministic for a seed. Next to the log a JSON file records what was put in (line counts and the
facts a correct replay must find: pool tokens, preemptions total, the last stats values), so the
benchmark can check the replay without trusting the code under test.

Usage: ``python -m bench.gen_busy_log [--lines N] [--seed S] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "tests" / "log_samples"
OUT_DIR = Path(__file__).resolve().parent / "out"

DEFAULT_LINES = 5_000_000
DEFAULT_SEED = 20260530
STATS_FRACTION = 0.016
PREEMPTION_INTERVALS = 40  # stats lines carrying 'Preemptions: N' ("a few preemptions")
# Bump when the output for a given (lines, seed) changes, so a cached file is rebuilt.
FORMAT_VERSION = 1

# Startup: API server version, args, max model len (vllm/032), then the pool (vllm/024).
_STARTUP_SOURCES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "vllm/032-v1-v014-pp3-apiserver-startup-config.log",
        ("API server version", "non-default args", "Resolved architecture", "Using max model len"),
    ),
    (
        "vllm/024-v1-2026-worker-tp0-engcore-prefix-qwen36-27b-2x3090.log",
        ("Available KV cache memory", "GPU KV cache size", "Maximum concurrency"),
    ),
)
_STATS_SOURCE = "vllm/007-v1-apiserver-loggers259-waiting-2026.log"
_ACCESS_SOURCE = "sglang/018-sep2025-prefill-decode-trailing-comma-space-access-log.log"

_POOL = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_STATS = re.compile(
    r"^(?P<prefix>\(APIServer pid=\d+\) INFO )\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?P<loc> \[loggers\.py:\d+\] )"
    r"Engine 000: "
)
_ACCESS = re.compile(r'(?P<level>INFO: +)[\d.]+:\d+ - "POST /v1/chat/completions HTTP/1\.1" 200 OK')

# Requests a busy OpenAI-compatible server sees, with rough weights (health checks and scrapes too).
_REQUESTS: tuple[tuple[str, int], ...] = (
    ('"POST /v1/chat/completions HTTP/1.1" 200 OK', 70),
    ('"POST /v1/completions HTTP/1.1" 200 OK', 20),
    ('"GET /metrics HTTP/1.1" 200 OK', 4),
    ('"GET /health HTTP/1.1" 200 OK', 4),
    ('"GET /v1/models HTTP/1.1" 200 OK', 1),
    ('"POST /v1/chat/completions HTTP/1.1" 400 Bad Request', 1),
)


def _sample_lines(rel: str) -> list[str]:
    return (SAMPLES / rel).read_text(encoding="utf-8").splitlines()


def _pick(lines: list[str], phrase: str, rel: str) -> str:
    for line in lines:
        if phrase in line:
            return line
    raise SystemExit(f"gen_busy_log: no line with {phrase!r} in {rel}")


def templates() -> tuple[list[str], str, str, str]:
    """(startup lines, stats prefix+location, access-line level part, API server process prefix)."""
    startup: list[str] = []
    for rel, phrases in _STARTUP_SOURCES:
        lines = _sample_lines(rel)
        startup.extend(_pick(lines, p, rel) for p in phrases)
    stats_line = _pick(_sample_lines(_STATS_SOURCE), "Engine 000:", _STATS_SOURCE)
    m = _STATS.match(stats_line)
    if m is None:
        raise SystemExit(f"gen_busy_log: unexpected stats line shape in {_STATS_SOURCE}")
    access_line = _pick(_sample_lines(_ACCESS_SOURCE), "HTTP/1.1", _ACCESS_SOURCE)
    a = _ACCESS.search(access_line)
    if a is None:
        raise SystemExit(f"gen_busy_log: unexpected access line shape in {_ACCESS_SOURCE}")
    process = m.group("prefix").removesuffix("INFO ")
    return startup, m.group("prefix") + "{ts}" + m.group("loc"), a.group("level"), process


def generate(path: Path, lines: int = DEFAULT_LINES, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """Write the log to ``path``; return what was put in (also written to ``path`` + '.json')."""
    rng = random.Random(seed)
    startup, stats_head, access_level, process = templates()
    pool_match = _POOL.search("\n".join(startup))
    if pool_match is None:
        raise SystemExit("gen_busy_log: the startup lines carry no pool size")
    body_lines = lines - len(startup)
    n_stats = round(body_lines * STATS_FRACTION)
    # Stats lines at evenly spread positions; a few of them, chosen at random, carry preemptions.
    stats_at = {round((i + 1) * body_lines / (n_stats + 1)) for i in range(n_stats)}
    preempt_slots = set(rng.sample(range(n_stats), min(PREEMPTION_INTERVALS, n_stats)))
    requests = [r for r, _ in _REQUESTS]
    weights = [w for _, w in _REQUESTS]
    access_head = process + access_level
    clients = [f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}" for _ in range(64)]

    preemptions_total = 0
    last: dict[str, Any] = {}
    access = 0
    stats_index = 0
    minute, second = 0, 0
    running, waiting, usage = 8, 0, 10.0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        fh.write("\n".join(startup) + "\n")
        buf: list[str] = []
        reqs = rng.choices(requests, weights, k=body_lines)
        for i in range(body_lines):
            if i in stats_at:
                second += 10
                if second >= 60:
                    second -= 60
                    minute += 1
                hour, mm = divmod(minute, 60)
                ts = f"03-17 {(15 + hour) % 24:02d}:{mm:02d}:{second:02d}"
                running = max(1, min(256, running + rng.randint(-6, 6)))
                waiting = max(0, min(512, waiting + rng.randint(-8, 8)))
                usage = max(0.0, min(99.9, usage + rng.uniform(-4.0, 4.0)))
                parts = [
                    f"Avg prompt throughput: {rng.uniform(0, 25000):.1f} tokens/s",
                    f"Avg generation throughput: {rng.uniform(0, 2500):.1f} tokens/s",
                    f"Running: {running} reqs",
                    f"Waiting: {waiting} reqs",
                ]
                if stats_index in preempt_slots:
                    count = rng.randint(1, 12)
                    preemptions_total += count
                    parts.append(f"Preemptions: {count}")
                parts.append(f"GPU KV cache usage: {usage:.1f}%")
                parts.append(f"Prefix cache hit rate: {rng.uniform(0, 60):.1f}%")
                buf.append(stats_head.format(ts=ts) + "Engine 000: " + ", ".join(parts))
                last = {"running": running, "waiting": waiting, "kv_usage_percent": round(usage, 1)}
                stats_index += 1
            else:
                ip = clients[rng.randrange(64)]
                buf.append(f"{access_head}{ip}:{rng.randrange(32768, 61000)} - {reqs[i]}")
                access += 1
            if len(buf) >= 65536:
                fh.write("\n".join(buf) + "\n")
                buf.clear()
        if buf:
            fh.write("\n".join(buf) + "\n")
    facts: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "lines": lines,
        "seed": seed,
        "bytes": path.stat().st_size,
        "startup_lines": len(startup),
        "access_lines": access,
        "stats_lines": stats_index,
        "preemption_lines": len(preempt_slots),
        "kv_pool_tokens": int(pool_match.group(1).replace(",", "")),
        "preemptions_total": preemptions_total,
        "last_stats": last,
    }
    Path(str(path) + ".json").write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    return facts


def ensure(path: Path, lines: int = DEFAULT_LINES, seed: int = DEFAULT_SEED) -> dict[str, Any]:
    """Reuse ``path`` when it was built by this generator version with the same size and seed."""
    meta = Path(str(path) + ".json")
    if path.exists() and meta.exists():
        try:
            facts: dict[str, Any] = json.loads(meta.read_text(encoding="utf-8"))
        except ValueError:
            facts = {}
        if (
            facts.get("format_version") == FORMAT_VERSION
            and facts.get("lines") == lines
            and facts.get("seed") == seed
            and facts.get("bytes") == path.stat().st_size
        ):
            return facts
    return generate(path, lines, seed)


def default_path(lines: int = DEFAULT_LINES) -> Path:
    return OUT_DIR / f"busy-vllm-{lines}.log"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=DEFAULT_LINES)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    path = args.out or default_path(args.lines)
    facts = generate(path, args.lines, args.seed)
    print(f"{path}: {facts['lines']:,} lines, {facts['bytes'] / 1e6:.1f} MB")
    print(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
