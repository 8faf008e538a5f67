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
import datetime
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
FORMAT_VERSION = 3

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


SHAPES = ("apiserver", "docker-v0-v1", "cri", "ansi", "ray-dp", "sglang")
"""The log shapes the replay benchmark builds (see ``_Shape``)."""

_SGLANG_STARTUP = (
    "[2026-03-17 15:00:00] server_args=ServerArgs(model_path='Qwen/Qwen3-8B', tp_size=1, mem_fraction_static=0.88)",
    "[2026-03-17 15:00:05 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, avail mem=63.75 GB, "
    "mem usage=15.27 GB.",
    "[2026-03-17 15:00:06 TP0] KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB",
    "[2026-03-17 15:00:06 TP0] max_total_num_tokens=367404, chunked_prefill_size=8192, max_prefill_tokens=16384, "
    "max_running_requests=4096, context_len=40960",
)


class _Shape:
    """How one shape writes its lines: a per-line outer prefix, the access line, the stats line."""

    def __init__(self, name: str, process: str, access_level: str, stats_head: str) -> None:
        self.name = name
        self.process = process
        self.access_level = access_level
        self.stats_head = stats_head  # '(APIServer pid=N) INFO {ts} [loggers.py:N] '
        self.instances = 2 if name == "ray-dp" else 1

    def outer(self, clock: int) -> str:
        """Container stamp of the docker and CRI shapes ('' for the others)."""
        at = _START + datetime.timedelta(seconds=clock)
        stamp = f"{at:%Y-%m-%dT%H:%M:%S}.{clock % 997:06d}123Z "
        if self.name == "docker-v0-v1":
            return stamp
        if self.name == "cri":
            return stamp + "stdout F "
        return ""

    def access(self, clock: int, client: str) -> str:
        if self.name == "sglang":
            return f"[2026-03-17 {_hms(clock)}] INFO:     {client}"
        if self.name == "docker-v0-v1":
            return f"{self.outer(clock)}INFO:     {client}"  # bare uvicorn line, no process prefix
        if self.name == "ansi":
            return f"\x1b[1;36m{self.process.strip()}\x1b[0;0m {self.access_level}{client}"
        return f"{self.outer(clock)}{self.process}{self.access_level}{client}"

    def stats(self, clock: int, index: int, instance: int, v: dict[str, Any], preemptions: int) -> str:
        ts = f"03-17 {_hms(clock)}"
        if self.name == "sglang":
            head = f"[2026-03-17 {_hms(clock)} TP0] "
            if index % 4 == 0:
                return (
                    f"{head}Prefill batch, #new-seq: 1, #new-token: {v['new']}, #cached-token: {v['cached']}, "
                    f"token usage: {v['usage'] / 100:.2f}, #running-req: {v['running']}, #queue-req: {v['waiting']}, "
                )
            return (
                f"{head}Decode batch, #running-req: {v['running']}, #token: {v['tokens']}, "
                f"token usage: {v['usage'] / 100:.2f}, cuda graph: True, gen throughput (token/s): {v['gen']:.2f}, "
                f"#queue-req: {v['waiting']}, "
            )
        if self.name == "docker-v0-v1" and index % 2 == 0:
            return (
                f"{self.outer(clock)}INFO {ts} metrics.py:341] Avg prompt throughput: {v['prompt']:.1f} tokens/s, "
                f"Avg generation throughput: {v['gen']:.1f} tokens/s, Running: {v['running']} reqs, "
                f"Swapped: 0 reqs, Pending: {v['waiting']} reqs, GPU KV cache usage: {v['usage']:.1f}%, "
                "CPU KV cache usage: 0.0%."
            )
        parts = [
            f"Avg prompt throughput: {v['prompt']:.1f} tokens/s",
            f"Avg generation throughput: {v['gen']:.1f} tokens/s",
            f"Running: {v['running']} reqs",
            f"Waiting: {v['waiting']} reqs",
        ]
        if preemptions:
            parts.append(f"Preemptions: {preemptions}")
        parts.append(f"GPU KV cache usage: {v['usage']:.1f}%")
        parts.append(f"Prefix cache hit rate: {v['hit']:.1f}%")
        body = f"Engine {instance:03d}: " + ", ".join(parts)
        if self.name == "ansi":
            return (
                f"\x1b[1;36m{self.process.strip()}\x1b[0;0m \x1b[32mINFO\x1b[0m \x1b[90m{ts}\x1b[0m "
                f"\x1b[90m[loggers.py:259]\x1b[0m {body}"
            )
        if self.name == "ray-dp":
            return f"(EngineCore_DP{instance} pid={4100 + instance}, ip=10.0.0.{instance + 1}) INFO {ts} [loggers.py:259] {body}"
        return self.outer(clock) + self.stats_head.format(ts=ts) + body

    def retraction(self, clock: int, count: int) -> str:
        return (
            f"[2026-03-17 {_hms(clock)} TP0] KV cache pool is full. Retract requests. #retracted_reqs: {count}, "
            "#new_token_ratio: 0.3317 -> 0.5012"
        )

    def startup(self, lines: list[str]) -> list[str]:
        if self.name == "sglang":
            return list(_SGLANG_STARTUP)
        if self.name == "ansi":
            return [_colour(x) for x in lines]
        return [self.outer(0) + x for x in lines]

    def noise(self, clock: int) -> str:
        """A Ray worker's line without a fact (ray-dp only)."""
        return (
            f"(RayWorkerWrapper pid=4312, ip=10.0.0.2) INFO 03-17 {_hms(clock)} [custom_all_reduce.py:203] "
            "Registering 4515 cuda graph addresses"
        )


_START = datetime.datetime(2026, 3, 17, 15, 0, 0)


def _hms(clock: int) -> str:
    return f"{(15 + clock // 3600) % 24:02d}:{clock // 60 % 60:02d}:{clock % 60:02d}"


def _colour(line: str) -> str:
    if line.startswith("("):
        head, _, rest = line.partition(") ")
        return f"\x1b[1;36m{head})\x1b[0;0m {rest}"
    return line


def _sglang_pool() -> int:
    m = re.search(r"#tokens: (\d+)", "\n".join(_SGLANG_STARTUP))
    assert m is not None
    return int(m.group(1))


def generate(
    path: Path, lines: int = DEFAULT_LINES, seed: int = DEFAULT_SEED, shape: str = "apiserver"
) -> dict[str, Any]:
    """Write the log to ``path``; return what was put in (also written to ``path`` + '.json')."""
    rng = random.Random(seed)
    startup_src, stats_head, access_level, process = templates()
    sh = _Shape(shape, process, access_level, stats_head)
    startup = sh.startup(startup_src)
    if shape == "sglang":
        pool = _sglang_pool()
    else:
        pool_match = _POOL.search("\n".join(startup))
        if pool_match is None:
            raise SystemExit("gen_busy_log: the startup lines carry no pool size")
        pool = int(pool_match.group(1).replace(",", ""))
    body_lines = lines - len(startup)
    n_stats = round(body_lines * STATS_FRACTION)
    # Stats lines at evenly spread positions; a few of them, chosen at random, carry preemptions
    # (vLLM V1 lines only: V0's stats line has no such field; SGLang: a retraction line instead).
    stats_at = {round((i + 1) * body_lines / (n_stats + 1)) for i in range(n_stats)}
    eligible = [i for i in range(n_stats) if not (shape == "docker-v0-v1" and i % 2 == 0)]
    preempt_slots = set(rng.sample(eligible, min(PREEMPTION_INTERVALS, len(eligible))))
    noise_every = 997 if shape == "ray-dp" else 0
    requests = [r for r, _ in _REQUESTS]
    weights = [w for _, w in _REQUESTS]
    clients = [f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}" for _ in range(64)]

    preemptions_total = 0
    last: dict[str, dict[str, Any]] = {}
    access = 0
    stats_index = 0
    clock = 10
    state = [{"running": 8, "waiting": 0, "usage": 10.0} for _ in range(sh.instances)]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as fh:
        fh.write("\n".join(startup) + "\n")
        buf: list[str] = []
        reqs = rng.choices(requests, weights, k=body_lines)
        for i in range(body_lines):
            if i in stats_at:
                instance = stats_index % sh.instances
                if instance == 0:
                    clock += 10
                st = state[instance]
                st["running"] = max(1, min(256, st["running"] + rng.randint(-6, 6)))
                st["waiting"] = max(0, min(512, st["waiting"] + rng.randint(-8, 8)))
                st["usage"] = max(0.0, min(99.9, st["usage"] + rng.uniform(-4.0, 4.0)))
                values = dict(st)
                values.update(
                    prompt=rng.uniform(0, 25000),
                    gen=rng.uniform(0, 2500),
                    hit=rng.uniform(0, 60),
                    new=rng.randrange(1, 8192),
                    cached=rng.randrange(0, 4096),
                    tokens=rng.randrange(1000, pool),
                )
                count = rng.randint(1, 12) if stats_index in preempt_slots else 0
                preemptions_total += count
                if count and shape == "sglang":
                    buf.append(sh.retraction(clock, count))
                    count = 0
                buf.append(sh.stats(clock, stats_index, instance, values, count))
                usage = (
                    round(values["usage"] / 100, 2) if shape == "sglang" else round(values["usage"], 1) / 100
                )
                last[str(instance)] = {
                    "running": st["running"],
                    "waiting": st["waiting"],
                    "kv_usage_ratio": round(usage, 6),
                }
                stats_index += 1
            elif noise_every and i % noise_every == 0:
                buf.append(sh.noise(clock))
            else:
                client = f"{clients[rng.randrange(64)]}:{rng.randrange(32768, 61000)} - {reqs[i]}"
                buf.append(sh.access(clock, client))
                access += 1
            if len(buf) >= 65536:
                fh.write("\n".join(buf) + "\n")
                buf.clear()
        if buf:
            fh.write("\n".join(buf) + "\n")
    facts: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "shape": shape,
        "lines": lines,
        "seed": seed,
        "bytes": path.stat().st_size,
        "startup_lines": len(startup),
        "access_lines": access,
        "stats_lines": stats_index,
        "preemption_lines": len(preempt_slots),
        "kv_pool_tokens": pool,
        "preemptions_total": preemptions_total,
        "last_stats": last,
    }
    Path(str(path) + ".json").write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    return facts


def ensure(
    path: Path, lines: int = DEFAULT_LINES, seed: int = DEFAULT_SEED, shape: str = "apiserver"
) -> dict[str, Any]:
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
            and facts.get("shape") == shape
            and facts.get("bytes") == path.stat().st_size
        ):
            return facts
    return generate(path, lines, seed, shape)


def default_path(lines: int = DEFAULT_LINES, shape: str = "apiserver") -> Path:
    return OUT_DIR / f"busy-{shape}-{lines}.log"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=DEFAULT_LINES)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--shape", choices=SHAPES, default="apiserver")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    path = args.out or default_path(args.lines, args.shape)
    facts = generate(path, args.lines, args.seed, args.shape)
    print(f"{path}: {facts['lines']:,} lines, {facts['bytes'] / 1e6:.1f} MB")
    print(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
