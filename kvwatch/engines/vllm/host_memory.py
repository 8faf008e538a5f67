"""Host memory in vLLM's non-torch figure: on a unified-memory card the OS's memory is the card's.

On such a card (GB10) vLLM takes the free memory from psutil's available memory instead of
cudaMemGetInfo, which under-reports it there (0.11.1 utils/mem_utils.py:86-102 by compute capability
8.7/11.0/12.1; 0.25.1 :147-154 by ``is_integrated``). The non-torch increase is the rise of
total - free less torch's reserved memory since the worker's init snapshot (mem_utils.py
memory_profiling), so what the engine's processes take on the host while the weights load and the
profile runs -- compiled graphs, loader buffers, the front end's processors -- comes off the KV
budget. The source bounds it by nothing: its size is FITTED (calibration.non_torch_unified_gib,
bench/accuracy_fit.py names the cases).
"""

from __future__ import annotations

from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.gpus import GpuSpec
from kvwatch.engines.vllm import releases

NOTE = (
    "unified memory: vLLM reads the free memory as the OS's available memory, so {gib:.2f} GiB of "
    "host memory the startup takes after the init snapshot is counted as non-torch"
)


def counts_host_memory(d: Deployment, card: GpuSpec | None) -> bool:
    """Whether the deployment's non-torch increase holds the host memory its startup takes."""
    return card is not None and card.unified_memory and releases.UNIFIED_FREE_FROM_OS.at(d.engine_version)
