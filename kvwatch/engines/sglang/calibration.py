"""The coefficient of SGLang's budget that the source leaves open, with the cases behind it.

SGLang sizes its pool from the free memory its own probe reads before the weights load
('Load weight begin. avail mem='); what the CUDA context, torch.distributed and the communication
set-up take before that is not in the source. It is FITTED here on the real startups that print the
figure (bench/accuracy_fit.py: the median of card total - 'avail mem' over the cases, for 0.4.x and
from 0.5 apart), never by hand;
``python -m bench.bench_accuracy --write`` writes it and tests/test_accuracy.py holds it to the fit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kvwatch.engines.sglang import releases


@dataclass(frozen=True)
class Calibration:
    """The fitted coefficients (GiB)."""

    # Memory in use on a rank before the weights load (context, torch.distributed, NCCL), from 0.5
    # and before it: the logs' 'Init torch distributed ends. mem usage=' is 0.13 GiB on 0.4.3
    # (llms-in-clouds, L4) and 2 GiB on 0.5.3 (sglang#11716, H200), so one median fits neither.
    context_gib: float
    context_gib_04: float


# --- fitted: begin
FITTED = Calibration(context_gib=0.7714, context_gib_04=0.38)
CASES: dict[str, str] = {
    "context_gib": "StevenWang-CY/sglang-attention-reproducibility (4), cli991/qwctest (1), sgl-project/sglang#11716 (1), sgl-project/sglang#39713 (1), udbhav-ag/SGLang_setup (1)",
    "context_gib_04": "AUGMXNT/llm-tracker.info-vault (1), Stars1233/sgl-project.github.io (9), didier-durand/llms-in-clouds (1), jerryzsj/my-deepseek-r1 (1)",
}
# --- fitted: end

_current = [FITTED]


def current() -> Calibration:
    """The coefficients predictions use now (FITTED, unless the accuracy report swapped in a refit)."""
    return _current[-1]


def context_bytes(calibration: Calibration, version: tuple[int, ...] | None) -> int:
    """The memory in use before the weights load for this release (no release: the newest's)."""
    gib = calibration.context_gib_04 if releases.CONTEXT_04.at(version) else calibration.context_gib
    return int(gib * 1024**3)


@contextmanager
def using(calibration: Calibration) -> Iterator[None]:
    """Predict with other coefficients inside the block (the report's leave-one-source-out refits)."""
    _current.append(calibration)
    try:
        yield
    finally:
        _current.pop()
