"""The coefficient of SGLang's budget that the source leaves open, with the cases behind it.

SGLang sizes its pool from the free memory its own probe reads before the weights load
('Load weight begin. avail mem='); what the CUDA context, torch.distributed and the communication
set-up take before that is not in the source. It is FITTED here on the real startups that print the
figure (bench/accuracy_fit.py: the median of card total - 'avail mem' over the cases), never by hand;
``python -m bench.bench_accuracy --write`` writes it and tests/test_accuracy.py holds it to the fit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Calibration:
    """The fitted coefficients (GiB)."""

    # Memory in use on a rank before the weights load (context, torch.distributed, NCCL).
    context_gib: float


# --- fitted: begin
FITTED = Calibration(context_gib=2.23)
CASES: dict[str, str] = {"context_gib": "sgl-project/sglang#11716 (1), sgl-project/sglang#39713 (1)"}
# --- fitted: end

_current = [FITTED]


def current() -> Calibration:
    """The coefficients predictions use now (FITTED, unless the accuracy report swapped in a refit)."""
    return _current[-1]


@contextmanager
def using(calibration: Calibration) -> Iterator[None]:
    """Predict with other coefficients inside the block (the report's leave-one-source-out refits)."""
    _current.append(calibration)
    try:
        yield
    finally:
        _current.pop()
