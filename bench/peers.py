"""Run the peers on kvwatch's own data: llm-d-planner, aiconfigurator and hf-mem against real startups.

Not part of ``make bench`` or the tests: the peers live in their own virtual environments, never the
project's. Install them (the releases this report was made with):

    python3 -m venv bench/out/peers/venv-llm-d-planner
    bench/out/peers/venv-llm-d-planner/bin/pip install llm-d-planner==0.3.3
    python3 -m venv bench/out/peers/venv-aiconfigurator
    bench/out/peers/venv-aiconfigurator/bin/pip install aiconfigurator==0.12.0
    python3 -m venv bench/out/peers/venv-hf-mem
    bench/out/peers/venv-hf-mem/bin/pip install hf-mem==0.5.6

Run: ``.venv/bin/python -m bench.peers [--venvs DIR] [--public DIR] [--json FILE]``, where ``--public``
holds the public startups (every ``*/cases.json``, and ``configs/``). Every tool is fed the same
local config.json (none may reach the Hub) and the settings the case records; kvwatch goes through
its CLI (``kvwatch predict ... --json``). A tool that crashes on a case (its own exception, a dead or
hung process) is counted and named under "crashes" and the run goes on. docs/peers.md has the method
and the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import peers_cases
from bench.peers_cases import Case
from bench.peers_drivers import DRIVERS

ROOT = Path(__file__).resolve().parent.parent
KVWATCH = ROOT / ".venv" / "bin" / "kvwatch"
GIB = 1 << 30
NEAR_PCT = 5.0
CATASTROPHE_PCT = 25.0
# Tools x what they are compared on. "budget": the available-KV figure (vLLM's 'Available KV cache
# memory', GiB per GPU) and the pool in tokens, end to end from config + card + settings.
# "geometry": tokens from the engine's own logged budget, i.e. the bytes one token costs per GPU.
TOOLS = ("kvwatch", "kvwatch+weights", "llm-d-planner+weights", "aiconfigurator", "hf-mem")


@dataclass
class Result:
    """One tool on one case: the figures it gave, or why it could not."""

    kv_gib: float | None = None
    tokens: float | None = None
    geometry_tokens: float | None = None
    error: str | None = None


@dataclass
class Row:
    case: Case
    results: dict[str, Result] = field(default_factory=dict)


def _kvwatch(case: Case, config_path: Path, extra: list[str]) -> Result:
    cmd = [str(KVWATCH), "predict", str(config_path), *case.kvwatch_args(), *extra, "--json"]
    engine_flags = case.engine_flags()
    if engine_flags:
        cmd += ["--", *engine_flags]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return Result(error="crashed: no answer in 120 s")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        # Exit 2 is kvwatch's one-line refusal; anything else (a traceback, a signal) is a crash.
        return Result(error=last if proc.returncode == 2 else f"crashed: exit {proc.returncode}: {last}")
    try:
        d = json.loads(proc.stdout)
        return Result(kv_gib=d["available_kv_bytes"] / GIB, tokens=float(d["kv_pool_tokens"]))
    except (ValueError, KeyError, TypeError) as e:
        return Result(error=f"crashed: unreadable answer ({type(e).__name__}: {e})")


def run_kvwatch(rows: list[Row], workdir: Path) -> None:
    for row in rows:
        c = row.case
        path = c.write_config(workdir)
        row.results["kvwatch"] = _kvwatch(c, path, [])
        w = c.observed_weights_gib
        if c.engine == "vllm" and w is not None:
            row.results["kvwatch+weights"] = _kvwatch(c, path, ["--weights-memory", f"{int(w * GIB)}"])
        else:
            row.results["kvwatch+weights"] = Result(error="no logged weights")
        kv = c.observed_kv_gib
        if c.engine == "vllm" and kv is not None and kv > 0:
            g = _kvwatch(c, path, ["--available-kv-memory", f"{int(kv * GIB)}"])
            row.results["kvwatch"].geometry_tokens = g.tokens


def _drive(name: str, python: Path, requests: list[dict[str, Any]], timeout: float) -> list[dict[str, Any]]:
    """One run of a peer's driver on ``requests``; raises RuntimeError where the driver itself died
    (a crash, a hang, no readable answer), which a per-case ``except`` in the driver cannot catch."""
    try:
        proc = subprocess.run(
            [str(python), "-c", DRIVERS[name]],
            input=json.dumps(requests),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"no answer in {timeout:.0f} s") from e
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {last}")
    try:
        answers = json.loads((proc.stdout.strip().splitlines() or [""])[-1])
    except ValueError as e:
        raise RuntimeError(f"unreadable answer: {last}") from e
    if not isinstance(answers, list) or len(answers) != len(requests):
        raise RuntimeError("answers do not match the requests")
    return answers


def run_peer(name: str, python: Path, rows: list[Row], workdir: Path) -> None:
    """Feed every case to one peer's driver (in the peer's own venv) and read its answers. Where
    the driver dies on the batch, each case is rerun alone, so the one it dies on is named
    ("crashed: ...") and the others still count."""
    requests = [r.case.peer_request(workdir) for r in rows]
    try:
        answers = _drive(name, python, requests, 1800)
    except RuntimeError as batch:
        print(f"{name}: driver died on the batch ({batch}); rerunning case by case", file=sys.stderr)
        answers = []
        for req in requests:
            try:
                answers += _drive(name, python, [req], 300)
            except RuntimeError as e:
                answers.append({"error": f"crashed: {e}"})
    tool = {"llm-d-planner": "llm-d-planner+weights"}.get(name, name)
    for row, a in zip(rows, answers, strict=True):
        res = Result(error=a.get("error"))
        if a.get("kv_gib") is not None:
            res.kv_gib = float(a["kv_gib"])
        if a.get("tokens") is not None:
            res.tokens = float(a["tokens"])
        per_token = a.get("bytes_per_token")
        kv = row.case.observed_kv_gib
        if per_token and row.case.engine == "vllm" and kv is not None and kv > 0:
            res.geometry_tokens = kv * GIB / float(per_token)
        row.results[tool] = res


def _pct(pred: float | None, obs: float | None) -> float | None:
    if pred is None or obs is None or obs <= 0:
        return None
    return 100.0 * (pred - obs) / obs


def errors(rows: list[Row], tool: str, metric: str) -> list[tuple[Case, float]]:
    """(case, signed % error) for every case where the tool gave the figure and the log has it."""
    out: list[tuple[Case, float]] = []
    for r in rows:
        res = r.results.get(tool)
        if res is None or not r.case.started or not r.case.consistent:
            continue
        if metric == "kv":
            e = _pct(res.kv_gib, r.case.observed_kv_gib)
        elif metric == "tokens":
            e = _pct(res.tokens, r.case.observed_tokens)
        else:
            e = _pct(res.geometry_tokens, r.case.observed_tokens)
        if e is not None:
            out.append((r.case, e))
    return out


def offered(rows: list[Row], metric: str) -> int:
    """The started, self-consistent cases whose log has the figure (what every tool is offered)."""
    n = 0
    for r in rows:
        c = r.case
        obs = c.observed_kv_gib if metric == "kv" else c.observed_tokens
        n += bool(c.started and c.consistent and obs and (metric != "geometry" or c.observed_kv_gib))
    return n


def stats(errs: list[tuple[Case, float]], of: int) -> dict[str, Any]:
    if not errs:
        return {"cases": 0, "offered": of}
    a = [abs(e) for _, e in errs]
    worst = sorted(errs, key=lambda ce: -abs(ce[1]))[:3]
    return {
        "cases": len(errs),
        "offered": of,
        "median_abs_pct": round(statistics.median(a), 2),
        "mean_abs_pct": round(statistics.mean(a), 2),
        "within_5pct": round(100.0 * sum(x <= NEAR_PCT for x in a) / len(a), 1),
        "over_25pct": sum(x > CATASTROPHE_PCT for x in a),
        "worst": [(c.id, round(e, 1)) for c, e in worst],
    }


def _fmt(s: dict[str, Any]) -> str:
    worst = "; ".join(f"{i} {e:+.0f}%" for i, e in s["worst"])
    return (
        f"| {s['cases']}/{s['offered']} | {s['median_abs_pct']:.2f} | {s['mean_abs_pct']:.2f} | {s['within_5pct']:.0f}% "
        f"| {s['over_25pct']} | {worst} |"
    )


def report(rows: list[Row]) -> tuple[str, dict[str, Any]]:
    """The markdown tables (per case set, per tool, per metric) and the same figures as JSON."""
    lines: list[str] = []
    figures: dict[str, Any] = {}
    sets = sorted({r.case.case_set for r in rows})
    for metric, title in (
        ("kv", "available KV GiB per GPU (vLLM)"),
        ("tokens", "KV pool tokens"),
        ("geometry", "tokens from the engine's own logged budget (bytes per token; vLLM)"),
    ):
        lines += [
            f"### {title}",
            "",
            "| set | tool | handled | median abs % | mean abs % | within 5% | >25% | worst |",
        ]
        lines.append("|---|---|---|---|---|---|---|---|")
        for s in sets:
            subset = [r for r in rows if r.case.case_set == s]
            for tool in TOOLS:
                st = stats(errors(subset, tool, metric), offered(subset, metric))
                if st["cases"]:
                    figures.setdefault(metric, {}).setdefault(s, {})[tool] = st
                    lines.append(f"| {s} | {tool} " + _fmt(st))
        lines.append("")
    return "\n".join(lines), figures


# (kvwatch's line, the peer's) compared on the cases both answered: the planner carries the weights
# oracle, so it meets kvwatch given the same weights; hf-mem has only the geometry.
PAIRS = (
    ("kvwatch+weights", "llm-d-planner+weights", ("kv", "tokens", "geometry")),
    ("kvwatch", "aiconfigurator", ("kv", "tokens", "geometry")),
    ("kvwatch", "hf-mem", ("geometry",)),
)


def head_to_head(rows: list[Row]) -> list[str]:
    """Per metric, set and pair, on the cases both tools answered (the tables above count each tool
    on what it took, and the peers refuse the hard cases more): n, then each side's median abs %
    and cases off by more than 25 %."""
    out = [
        "| metric | set | kvwatch line | peer | both answered | kvwatch median / >25% | peer median / >25% |"
    ]
    out.append("|---|---|---|---|---|---|---|")
    for metric in ("kv", "tokens", "geometry"):
        for s in sorted({r.case.case_set for r in rows}):
            subset = [r for r in rows if r.case.case_set == s]
            for ours, peer, metrics in PAIRS:
                if metric not in metrics:
                    continue
                # The geometry needs no weights: kvwatch's one line there.
                mine = {
                    c.slug: e for c, e in errors(subset, "kvwatch" if metric == "geometry" else ours, metric)
                }
                theirs = {c.slug: e for c, e in errors(subset, peer, metric)}
                both = sorted(mine.keys() & theirs.keys())
                if not both:
                    continue
                a, b = [abs(mine[k]) for k in both], [abs(theirs[k]) for k in both]
                out.append(
                    f"| {metric} | {s} | {'kvwatch' if metric == 'geometry' else ours} | {peer} | {len(both)} "
                    f"| {statistics.median(a):.2f} / {sum(x > CATASTROPHE_PCT for x in a)} "
                    f"| {statistics.median(b):.2f} / {sum(x > CATASTROPHE_PCT for x in b)} |"
                )
    return out


def refusals(rows: list[Row]) -> dict[str, dict[str, list[str]]]:
    """Why each tool could not take cases: error text (first 80 chars) -> the cases ("SET ID")."""
    out: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        for tool, res in r.results.items():
            if res.error:
                out.setdefault(tool, {}).setdefault(res.error[:80], []).append(
                    f"{r.case.case_set} {r.case.id}"
                )
    return out


# Exceptions that say the tool broke on a case it accepted, not that it declined an input it has
# no field for (those are the drivers' ValueErrors and the tools' own NotImplementedError & co).
_CRASH_TYPES = (
    "AttributeError",
    "AssertionError",
    "IndexError",
    "KeyError",
    "NameError",
    "RecursionError",
    "TypeError",
    "UnboundLocalError",
    "ZeroDivisionError",
)


def crashes(rows: list[Row]) -> dict[str, list[str]]:
    """Per tool, the cases it crashed on ("SET ID: error"): a dead process, a hang, an unreadable
    answer, or one of the exceptions above; the refusals stay in ``refusals`` only."""
    out: dict[str, list[str]] = {}
    for r in rows:
        for tool, res in r.results.items():
            if res.error and res.error.startswith(("crashed", *(f"{t}:" for t in _CRASH_TYPES))):
                out.setdefault(tool, []).append(f"{r.case.case_set} {r.case.id}: {res.error[:120]}")
    return out


def catastrophes(rows: list[Row]) -> list[str]:
    """Cases where one side is off by more than 25 % and the other is not (KV GiB, else tokens),
    each peer against its kvwatch line in ``PAIRS`` (the planner against kvwatch given the same
    logged weights)."""
    out: list[str] = []
    for r in rows:
        if not r.case.started or not r.case.consistent:
            continue
        metric_obs = r.case.observed_kv_gib if r.case.engine == "vllm" else None
        for ours, tool, _ in PAIRS[:2]:
            k, p = r.results.get(ours), r.results.get(tool)
            if k is None or p is None:
                continue
            if metric_obs is not None:
                ek, ep = _pct(k.kv_gib, metric_obs), _pct(p.kv_gib, metric_obs)
            else:
                ek, ep = _pct(k.tokens, r.case.observed_tokens), _pct(p.tokens, r.case.observed_tokens)
            if ek is None or ep is None:
                continue
            if (abs(ep) > CATASTROPHE_PCT) != (abs(ek) > CATASTROPHE_PCT):
                out.append(f"{r.case.case_set} {r.case.id}: {tool} {ep:+.0f}%, {ours} {ek:+.0f}%")
    return out


def failed_starts(rows: list[Row]) -> list[str]:
    """The startups that failed, and what each tool said of their KV room (GiB per GPU)."""
    out: list[str] = []
    for r in rows:
        if r.case.started:
            continue
        said = []
        for tool in ("kvwatch", "llm-d-planner+weights", "aiconfigurator"):
            res = r.results.get(tool)
            if res is not None and res.kv_gib is not None:
                said.append(f"{tool} {res.kv_gib:.2f}")
            elif res is not None and res.error and "no KV budget" in res.error:
                said.append(f"{tool} no KV budget")
        if said:
            out.append(f"{r.case.case_set} {r.case.id} (log: {r.case.observed_kv_gib}): " + ", ".join(said))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--venvs", type=Path, default=ROOT / "bench" / "out" / "peers", help="folder of venv-NAME"
    )
    ap.add_argument("--public", type=Path, default=ROOT / "tests" / "apriori" / "public")
    ap.add_argument("--json", type=Path, help="write every case's figures here")
    args = ap.parse_args(argv)
    cases = peers_cases.load_all(args.public)
    rows = [Row(c) for c in cases if c.skip is None]
    skipped = [c for c in cases if c.skip is not None]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run_kvwatch(rows, work)
        for name in DRIVERS:
            python = args.venvs / f"venv-{name}" / "bin" / "python"
            if not python.is_file():
                print(f"{name}: no venv at {python.parent.parent}; skipped", file=sys.stderr)
                continue
            run_peer(name, python, rows, work)
    text, figures = report(rows)
    print(f"cases: {len(cases)}, with a config and a card: {len(rows)}, skipped: {len(skipped)}")
    for s in sorted({c.case_set for c in cases}):
        of_set = [c for c in cases if c.case_set == s]
        run = [c for c in of_set if c.skip is None]
        print(f"- {s}: {len(of_set)} cases, {len(run)} run ({sum(c.started for c in run)} started)")
    print()
    print(text)
    print("### head to head: on the cases both tools answered\n")
    print("\n".join(head_to_head(rows)))
    print()
    print("### left out: the recorded utilisation is not the run's (the log's terms add up to another)\n")
    for r in rows:
        implied = r.case.implied_utilisation()
        if not r.case.consistent and implied is not None:
            util = r.case.settings.get("gpu_memory_utilization")
            print(f"- {r.case.case_set} {r.case.id}: recorded {util}, implied {implied:.3f}")
    print()
    print("### refusals (tool: reason x cases: the cases)\n")
    for tool, reasons in sorted(refusals(rows).items()):
        for reason, ids in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            print(f"- {tool}: {reason} x{len(ids)}: {', '.join(ids)}")
    crashed = crashes(rows)
    print(f"\n### crashes: {sum(map(len, crashed.values()))} (tool: case: error)\n")
    for tool, lines in sorted(crashed.items()):
        print(f"- {tool}: {len(lines)}")
        for line in lines:
            print(f"  - {line}")
    print("\n### failed starts: each tool's KV room\n")
    for line in failed_starts(rows):
        print(f"- {line}")
    print("\n### one side off by more than 25 %, the other not\n")
    for line in catastrophes(rows):
        print(f"- {line}")
    if args.json:
        out = {
            "figures": figures,
            "skipped": {c.id: c.skip for c in skipped},
            "crashes": crashed,
            "cases": [
                {
                    "id": r.case.id,
                    "set": r.case.case_set,
                    "observed_kv_gib": r.case.observed_kv_gib,
                    "observed_tokens": r.case.observed_tokens,
                    **{t: vars(res) for t, res in r.results.items()},
                }
                for r in rows
            ],
        }
        args.json.write_text(json.dumps(out, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
