"""SGLang's own command line (``python -m sglang.launch_server --model-path …``, ServerArgs in
python/sglang/srt/server_args.py), by flag.

Only flags that move the KV pool are read; every other one is listed as ignored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvwatch.core.errors import ConfigError
from kvwatch.engines.flags import Flag, human_int, positive_int, text

if TYPE_CHECKING:
    from kvwatch.capacity.deployment import DeploymentValue


def _static_fraction(value: str) -> float:
    f = float(value)
    if not 0 < f < 1:
        raise ValueError(f"must be in (0, 1), got {value}")
    return f


FLAGS: tuple[Flag, ...] = (
    Flag(("--model-path", "--model"), "model"),
    Flag(("--tp-size", "--tp", "--tensor-parallel-size"), "tp", positive_int),
    Flag(("--pp-size", "--pipeline-parallel-size"), "pp", positive_int),
    Flag(("--dp-size", "--dp", "--data-parallel-size"), "dp", positive_int),
    Flag(("--enable-dp-attention",), "dp_attention", switch=True),
    Flag(("--mem-fraction-static",), "mem_fraction_static", _static_fraction),
    Flag(("--context-length",), "max_model_len", human_int),
    Flag(("--chunked-prefill-size",), "chunked_prefill_size", positive_int),
    Flag(("--cuda-graph-max-bs",), "cuda_graph_max_bs", positive_int),
    Flag(("--max-running-requests",), "max_num_seqs", positive_int),
    Flag(("--page-size",), "page_size", positive_int),
    Flag(("--kv-cache-dtype",), "kv_cache_dtype", text),
    Flag(("--dtype",), "dtype", text),
    Flag(("--quantization",), "quantization", text),
    Flag(("--disable-cuda-graph",), "enforce_eager", switch=True),
    Flag(("--language-model-only",), "language_model_only", switch=True),
)


def deployment_fields(
    utilization: float | None, static_fraction: float | None, block_size: int | None
) -> dict[str, DeploymentValue]:
    """kvwatch's own --mem-fraction-static and --block-size (SGLang's page size) as Deployment fields."""
    if utilization is not None:
        raise ConfigError("--gpu-memory-utilization is a vLLM setting; use --mem-fraction-static with SGLang")
    return {"mem_fraction_static": static_fraction, "page_size": block_size}
