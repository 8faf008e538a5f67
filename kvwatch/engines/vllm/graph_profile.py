"""Whether vLLM's CUDA-graph memory profile runs inside the measurement of the non-torch increase.

From 0.18 determine_available_memory calls profile_cudagraph_memory inside the ``with
memory_profiling(...)`` block (0.19.0 v1/worker/gpu_worker.py:366-381; 0.20.0 :377-384, 0.22.0
:392-411, 0.25.1 :464-483, 0.26.0 :484-506), so what that profile leaves outside torch (its graph
pool, the kernels its captures load) is in ``non_torch_increase``: kvwatch's larger 0.18+ class
(memory.non_torch, releases.NON_TORCH_WITH_GRAPH_PROFILE). It is called only where graphs will be
captured:

- not with --enforce-eager: 0.19.0 gpu_worker.py:380 (``not self.model_config.enforce_eager``);
  0.20.0-0.26.0 test ``cudagraph_mode != CUDAGraphMode.NONE`` (0.22.0 :406-409), which
  enforce_eager sets;
- not on ROCm before 0.26: 0.19.0 :380 and 0.20.0 :381 ``not current_platform.is_rocm()``,
  0.21.0 :403 and 0.25.1 :479 ``current_platform.is_cuda()``; 0.26.0 :501-505 ``is_cuda_alike()``
  (vllm#44825) takes ROCm in.

From 0.27 the call sits after the block (0.27.1 gpu_worker.py:500-517; 0.28.0 :515-532; 0.33.0
:685-717), and the
budget's consumed memory is the free-memory drop up to the end of the block (0.27.1
utils/mem_utils.py:317-326, ``total_consumed`` + ``transient_peak_headroom``), so the graph
profile's memory is no longer in it. Wherever the profile is outside the measurement the increase
is what the profile forward alone leaves: the class of the releases without a graph profile
(0.8-0.17), calibration.non_torch_tp1_old_gib.

The rules are releases.GRAPH_PROFILE_MEASURED and releases.ROCM_GRAPH_PROFILE.
"""

from __future__ import annotations

from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.engines.vllm.releases import GRAPH_PROFILE_MEASURED, ROCM_GRAPH_PROFILE


def graph_profile_measured(d: Deployment) -> bool:
    """Whether this startup's non-torch increase holds the CUDA-graph profile's memory: a release
    that profiles inside memory_profiling, graphs on, and a platform the profile runs on."""
    if d.enforce_eager or not GRAPH_PROFILE_MEASURED.at(d.engine_version):
        return False
    card = gpus.find(d.gpu_name)
    return card is None or card.vendor != "amd" or ROCM_GRAPH_PROFILE.at(d.engine_version)


NOTE = "no CUDA-graph profile inside the measurement (--enforce-eager, ROCm before 0.26, or 0.27+)"
