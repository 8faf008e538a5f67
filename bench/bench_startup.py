"""Start-up targets (issue 15 item 3): the commands a newcomer types first answer at once.

``kvwatch --help``, ``kvwatch predict CONFIG --gpu h100 --json`` and ``kvwatch parse`` of a small
log each spend at most 150 ms importing modules, measured with ``python -X importtime`` (the sum
of every module's own import time, the interpreter's site start-up included) as the best of a few
runs, since the import cost is what varies with how much each command loads. ``predict --json``
must not import pydantic, prometheus_client, watchdog or huggingface_hub at all (a local config
needs none of them).

Every module is measured as an installed kvwatch imports it: from bytecode (pip compiles it at
install, as it did the dependencies'). The runs share a private bytecode cache that one untimed run
fills, whatever PYTHONDONTWRITEBYTECODE says: with that variable set and no cache, each run
compiled every kvwatch module from source (~25 ms of ``parse``'s imports) and none of pydantic's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "model_configs" / "Qwen--Qwen3-32B.json"
SMALL_LOG = ROOT / "tests" / "log_samples" / "vllm" / "001-llama31-8b-rtx3090-profiling-20k.log"

IMPORT_MS = 150.0
RUNS = 5
HEAVY = ("pydantic", "prometheus_client", "watchdog", "huggingface_hub")

COMMANDS: dict[str, list[str]] = {
    "--help": ["--help"],
    "predict --json": ["predict", str(CONFIG), "--gpu", "h100", "--json"],
    "parse small log": ["parse", str(SMALL_LOG)],
}
# Top-level packages each command must not import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "--help": HEAVY,
    "predict --json": HEAVY,
    "parse small log": ("prometheus_client", "watchdog", "huggingface_hub"),
}


def import_profile(args: list[str], cache: str) -> tuple[float, set[str]]:
    """(milliseconds of imports, top-level packages imported) of one ``kvwatch ARGS`` run, its
    bytecode read from (and written to) ``cache``."""
    code = "import sys; from kvwatch.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code, *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"kvwatch {' '.join(args)} exited {proc.returncode}: {proc.stderr[-500:]}")
    total_us = 0
    packages: set[str] = set()
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, _cumulative, name = line[len("import time:") :].split("|", 2)
        total_us += int(own)
        packages.add(name.strip().split(".")[0])
    return total_us / 1000, packages


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kvwatch-bytecode-") as cache:
        for args in COMMANDS.values():
            import_profile(args, cache)  # untimed: fills the cache, as an install would
        return 1 if _measure(cache) else 0


def _measure(cache: str) -> bool:
    """Print each command's best import time; True when one misses its target."""
    failed = False
    for label, args in COMMANDS.items():
        runs = [import_profile(args, cache) for _ in range(RUNS)]
        best = min(ms for ms, _ in runs)
        packages = runs[0][1]
        heavy = sorted(p for p in FORBIDDEN[label] if p in packages)
        ok = best <= IMPORT_MS and not heavy
        failed |= not ok
        extra = f"; imports {', '.join(heavy)}" if heavy else ""
        print(
            f"  kvwatch {label:<16} imports {best:6.1f} ms (best of {RUNS}; target <= {IMPORT_MS:.0f} ms)"
            f"{extra}  {'ok' if ok else 'MISSED'}",
            flush=True,
        )
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
