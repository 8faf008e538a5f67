"""The coefficient of SGLang's budget that the source leaves open, with the cases behind it.

SGLang sizes its pool from the free memory its own probe reads before the weights load
('Load weight begin. avail mem='); what the CUDA context, torch.distributed and the communication
set-up take before that is not in the source. It is FITTED here on the real startups that print the
figure (bench/accuracy_fit.py: the median of card total - 'avail mem' over the cases, one rank or a
PCIe-only card apart from TP >= 2 over a fabric), never by hand;
``python -m bench.bench_accuracy --write`` writes it and tests/test_accuracy.py holds it to the fit.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kvwatch.capacity import gpus


@dataclass(frozen=True)
class Calibration:
    """The fitted coefficients (GiB)."""

    # Memory in use on a rank before the weights load (context, torch.distributed, NCCL): at one
    # rank or on PCIe-only cards, and at TP >= 2 over an NVLink/xGMI fabric (fabric_communication).
    # The logs' 'Init torch distributed ends. mem usage=' is 0.13 GiB at TP 4 on PCIe L4s
    # (llms-in-clouds, 0.4.3) and 2 GiB at TP 8 on H200s (sglang#11716, 0.5.4), while one rank
    # leaves ~0.4 GiB on 0.4.x (docs CI) and 0.5.7 (udbhav, L40S) alike: the communication set-up,
    # not the release, is what differs.
    context_gib: float
    context_gib_fabric: float


# --- fitted: begin
FITTED = Calibration(context_gib=0.6, context_gib_fabric=2.348)
CASES: dict[str, str] = {
    "context_gib": "AUGMXNT/llm-tracker.info-vault (1), MaxUhl98/Thesis (1), RyanRosario/llm-d (1), Stars1233/sgl-project.github.io (9), StevenWang-CY/sglang-attention-reproducibility (4), cli991/qwctest (1), didier-durand/llms-in-clouds (1), farbodtavakkoli/OTel (3), jerryzsj/my-deepseek-r1 (1), kvcache-ai/ktransformers#1870 (1), kvcache-ai/ktransformers#1969 (1), sgl-project/sglang#18263 (1), sgl-project/sglang#39713 (1), sgl-project/sglang#4760 (1), udbhav-ag/SGLang_setup (1), ugyhybnb/sglang-performance-test (1)",
    "context_gib_fabric": "SemiAnalysisAI/InferenceX#2128 (1), StevenWang-CY/sglang-attention-reproducibility (2), farbodtavakkoli/OTel (1), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1), sgl-project/sglang#14700 (1), sgl-project/sglang#7691 (1)",
}
# --- fitted: end

_current = [FITTED]


def current() -> Calibration:
    """The coefficients predictions use now (FITTED, unless the accuracy report swapped in a refit)."""
    return _current[-1]


def fabric_communication(tp: int, gpu_name: str | None) -> bool:
    """Whether torch.distributed's set-up before the weights spans an NVLink / xGMI fabric: TP >= 2
    on a card not known to be PCIe-only (gpus.GpuSpec.interconnect; an unlisted card counts as one).

    init_torch_distributed runs before 'Load weight begin' (0.4.9 model_executor/model_runner.py:478-572;
    0.5.4 :700-811): NCCL's communicators and custom all-reduce's IPC buffers are in what that probe
    sees. Custom all-reduce is off on more than two PCIe-only GPUs (0.5.4
    distributed/device_communicators/custom_all_reduce.py:148-153) and NCCL's NVLink SHARP buffers
    need the switch, so a PCIe-only card's ranks keep one rank's figure (llms-in-clouds' 4 x L4).
    """
    return gpus.tp_over_fabric(tp, gpu_name)


def context_bytes(calibration: Calibration, tp: int, gpu_name: str | None) -> int:
    """The memory in use on a rank before the weights load for this parallelism and card."""
    gib = calibration.context_gib_fabric if fabric_communication(tp, gpu_name) else calibration.context_gib
    return int(gib * 1024**3)


@contextmanager
def using(calibration: Calibration) -> Iterator[None]:
    """Predict with other coefficients inside the block (the report's leave-one-source-out refits)."""
    _current.append(calibration)
    try:
        yield
    finally:
        _current.pop()
