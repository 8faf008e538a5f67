"""The coefficients of vLLM's memory model that the source leaves open, each with the cases behind it.

Everything else in memory.py is read from vLLM's source. These few are FITTED on real startups
(tests/apriori), by the closed-form fits of bench/accuracy_fit.py (a median of what each case
implies, or least squares), never by hand: ``python -m bench accuracy --fit`` prints this table
from the cases, and tests/test_accuracy.py holds the numbers here to it. The accuracy report's
leave-one-source-out figures refit them without the source held out (``using``), which is what
makes those figures out of sample.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Calibration:
    """The fitted coefficients (GiB unless named otherwise)."""

    # V1 forward transient per token, in elements of the activation dtype: forward_h x hidden
    # + 3 x intermediate / tp (memory.activation).
    forward_h: float
    # Bytes per [rows x vocab] element the 0.15/0.16 sort sampler adds beyond the 36 counted.
    sampler_sort_extra: float
    # Small tensors alive at the profile's peak (GiB).
    small_tensors_gib: float
    # The encoder cache a vision tower's profile leaves alive (GiB).
    vision_encoder_gib: float
    # Non-torch increase by class (memory.non_torch): TP >= 2 on 0.18+ (intercept at TP 2, slope
    # per extra rank), PP >= 2 at TP 1 on 0.18+, TP 1 on 0.18+, TP 1 on 0.8-0.17, TP >= 2 before
    # 0.18, TP 1 on V0 (< 0.8: its own profiler, 'Memory profiling results' non_torch_memory).
    non_torch_tp_gib: float
    non_torch_tp_slope_gib: float
    non_torch_pp_gib: float
    non_torch_tp1_gib: float
    non_torch_tp1_old_gib: float
    non_torch_tp_old_gib: float
    non_torch_v0_gib: float
    # CUDA-graph estimate: base + per_layer x layers on the rank x sqrt(sizes / 51) + moe, + nccl x
    # layers x sizes / 51 where the captured all-reduces are NCCL calls (memory.nccl_in_graphs).
    graphs_base_gib: float
    graphs_per_layer_gib: float
    graphs_moe_gib: float
    graphs_nccl_gib: float = 0.0
    # Host memory a unified-memory card's startup takes after the init snapshot (the engine's
    # processes load, compile and profile), which vLLM counts as non-torch there (memory.non_torch).
    non_torch_unified_gib: float = 0.0


# Fitted on tests/apriori (bench/accuracy_fit.py, all sources); the cases behind each coefficient,
# by source: llm-d-planner = the 50 vLLM 0.19.0 H100 logs, llm-d-benchmark = its 9 transcribed
# rows, sweep = the Qwen3-14B release sweep 0.15-0.18, public = tests/apriori/public.
# --- fitted: begin
FITTED = Calibration(
    forward_h=4.118,
    sampler_sort_extra=1.995,
    small_tensors_gib=0.005154,
    vision_encoder_gib=0.175,
    non_torch_tp_gib=2.082,
    non_torch_tp_slope_gib=0.03733,
    non_torch_pp_gib=0.07,
    non_torch_tp1_gib=0.25,
    non_torch_tp1_old_gib=0.13,
    non_torch_tp_old_gib=0.545,
    non_torch_v0_gib=0.35,
    graphs_base_gib=0.1533,
    graphs_per_layer_gib=0.02022,
    graphs_moe_gib=-0.06945,
    graphs_nccl_gib=0.08905,
    non_torch_unified_gib=1.915,
)
CASES: dict[str, str] = {
    "forward_h": "benyucong/neo4j-graphrag-python (1), llm-d-incubation/llm-d-planner (4), llm-d/llm-d-benchmark (1)",
    "sampler_sort_extra": "kolyangg/mlops-assignment (1), llm-d/llm-d-benchmark (8), release-sweep (2)",
    "small_tensors_gib": "LukeJYK/AutoScientists (1), benyucong/neo4j-graphrag-python (1), daxdelvira/distributed_agent_gc (2), kolyangg/mlops-assignment (1), leagames0221-sys/longctx-bench-honest (1), llm-d-incubation/llm-d-planner (43), llm-d/llm-d-benchmark (9), release-sweep (4), vllm-project/vllm#13882 (1)",
    "vision_encoder_gib": "llm-d-incubation/llm-d-planner (4), llm-d/llm-d-benchmark (1)",
    "non_torch_tp_gib": "llm-d-incubation/llm-d-planner (8)",
    "non_torch_tp_slope_gib": "llm-d-incubation/llm-d-planner (8)",
    "non_torch_pp_gib": "llm-d-incubation/llm-d-planner (2)",
    "non_torch_tp1_gib": "llm-d-incubation/llm-d-planner (33), release-sweep (1)",
    "non_torch_tp1_old_gib": "kolyangg/mlops-assignment (1), llm-d/llm-d-benchmark (7), release-sweep (3)",
    "non_torch_tp_old_gib": "llm-d/llm-d-benchmark (2)",
    "non_torch_v0_gib": "vllm-project/vllm#10360 (1), vllm-project/vllm#10517 (2)",
    "graphs_base_gib": "AIwork4me/Qwen3.8-27B-ROCm (1), LukeJYK/AutoScientists (1), NnamdiOdozi/mlops-assignment (1), leadawon/LAMBO (1), llm-d-incubation/llm-d-planner (43), sostrowsk/dgx-spark-local-llm (3), souspilot/DiscoverPhysicsWIP (1), sridhar1804/local-ai (1)",
    "graphs_per_layer_gib": "AIwork4me/Qwen3.8-27B-ROCm (1), LukeJYK/AutoScientists (1), NnamdiOdozi/mlops-assignment (1), leadawon/LAMBO (1), llm-d-incubation/llm-d-planner (43), sostrowsk/dgx-spark-local-llm (3), souspilot/DiscoverPhysicsWIP (1), sridhar1804/local-ai (1)",
    "graphs_moe_gib": "AIwork4me/Qwen3.8-27B-ROCm (1), LukeJYK/AutoScientists (1), NnamdiOdozi/mlops-assignment (1), leadawon/LAMBO (1), llm-d-incubation/llm-d-planner (43), sostrowsk/dgx-spark-local-llm (3), souspilot/DiscoverPhysicsWIP (1), sridhar1804/local-ai (1)",
    "graphs_nccl_gib": "leadawon/LAMBO (1)",
    "non_torch_unified_gib": "TW-10519/VLLM-ROUTER (1), sostrowsk/dgx-spark-local-llm (3)",
}
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
