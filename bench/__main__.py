"""Run every benchmark module ``bench/bench_*.py`` (each exposes ``main() -> int``), or the named ones.

Usage: ``python -m bench [NAME ...]`` where NAME is a module stem without ``bench_``.
Exit status is non-zero when any benchmark misses its target.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).parent
    available = sorted(p.stem.removeprefix("bench_") for p in here.glob("bench_*.py")) + ["accuracy-sglang"]
    chosen = argv or available
    failed = []
    for name in chosen:
        if name not in available:
            print(f"unknown benchmark {name!r}; available: {', '.join(available)}", file=sys.stderr)
            return 2
        print(f"== bench {name}", flush=True)
        module = importlib.import_module(
            "bench.accuracy_sglang" if name == "accuracy-sglang" else f"bench.bench_{name}"
        )
        if module.main() != 0:
            failed.append(name)
    if failed:
        print(f"benchmarks missing their targets: {', '.join(failed)}")
        return 1
    print("all benchmarks met their targets")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
