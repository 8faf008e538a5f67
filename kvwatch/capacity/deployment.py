"""Deployment: how a model is served (engine, GPU, parallelism, dtypes, memory knobs).

Every field is optional except the engine; ``None`` means "the engine's default, or kvwatch's
documented estimate" and the prediction says which. ``deployment_from_settings`` turns what the
sidecar read from an engine's log (kvwatch.state.facts SettingsFacts / MemoryFacts) into a
Deployment, so the prediction for a running engine uses every figure the engine printed itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar

from kvwatch.capacity.dtypes import CHECKPOINT_DTYPE_BYTES, KV_DTYPE_BYTES
from kvwatch.capacity.model import ModelGeometry
from kvwatch.core.errors import ConfigError
from kvwatch.core.kinds import DEFAULT_ENGINE, ENGINE_NAMES, EngineName

if TYPE_CHECKING:
    # Annotations only: kvwatch.state.facts imports the event models (pydantic), which `kvwatch predict`
    # never needs.
    from kvwatch.state.facts import MemoryFacts, SettingsFacts

# Plausibility bounds, far above any real deployment: a value past one is a typo or an attack, refused
# with the bound named (and the arithmetic stays finite). Sizes are per GPU.
MAX_GPU_MEMORY_BYTES = 16 * 2**40  # 16 TiB
# The smallest card memory a --gpu-memory may give: no GPU that serves an LLM has less than 256 MiB.
MIN_GPU_MEMORY_BYTES = 256 * 2**20
# The smallest weights or KV budget per GPU a size flag may give (a typo, not a model, below it).
MIN_TERM_BYTES = 2**20  # 1 MiB
MAX_RANKS = 4096  # tp, pp, dcp
MAX_BLOCK_TOKENS = 1 << 16  # block_size / page_size: 65,536
MAX_TOKENS = 1 << 30  # context lengths, batched tokens, workload lengths: 1,073,741,824
MAX_SEQS = 1 << 20  # max_num_seqs, cuda_graph_max_bs: 1,048,576
MAX_SPECULATIVE_TOKENS = 1024  # num_speculative_tokens: drafters propose a handful (DFlash 15)
_COUNT_BOUNDS: dict[str, int] = {
    "tp": MAX_RANKS,
    "pp": MAX_RANKS,
    "dp": MAX_RANKS,
    "dcp": MAX_RANKS,
    "block_size": MAX_BLOCK_TOKENS,
    "page_size": MAX_BLOCK_TOKENS,
    "max_model_len": MAX_TOKENS,
    "chunked_prefill_size": MAX_TOKENS,
    "max_num_batched_tokens": MAX_TOKENS,
    "cuda_graph_max_bs": MAX_SEQS,
    "max_num_seqs": MAX_SEQS,
    "num_speculative_tokens": MAX_SPECULATIVE_TOKENS,
}
_SIZE_FIELDS = (
    "gpu_memory_bytes",
    "weights_bytes",
    "activation_bytes",
    "non_torch_bytes",
    "cuda_graph_bytes",
    "available_kv_bytes",
    "free_after_weights_bytes",
    "memory_in_use_bytes",
)

# A value of one Deployment field, for changes by field name (command-line overrides).
DeploymentValue: TypeAlias = str | int | float | bool | None


@dataclass(frozen=True)
class Deployment:
    """One serving configuration. Sizes are bytes per GPU (rank); None = default or estimate."""

    engine: EngineName = DEFAULT_ENGINE
    engine_version: str | None = None
    gpu_memory_bytes: int | None = None
    gpu_name: str | None = None
    tp: int = 1
    pp: int = 1
    dcp: int = 1
    kv_cache_dtype: str = "auto"
    # vLLM tokens per block / SGLang tokens per page.
    block_size: int | None = None
    page_size: int | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    mem_fraction_static: float | None = None
    # The fraction is the one the engine printed (its resolved settings, after every adjustment it
    # makes to a typed one -- SGLang's aiter factor), not the one a user typed: not adjusted again.
    fraction_printed: bool = False
    weights_dtype: str | None = None
    weights_bytes: int | None = None
    activation_bytes: int | None = None
    non_torch_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    available_kv_bytes: int | None = None
    # SGLang: free memory right after loading weights ('Load weight end. avail mem='); with the
    # weights it gives the free memory before them, which mem_fraction_static is a fraction of.
    free_after_weights_bytes: int | None = None
    # Memory other processes already hold on each card when the engine starts (nvidia-smi's
    # Memory-Usage before launch): some releases count it as their own, some refuse to start on it.
    memory_in_use_bytes: int | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    max_num_batched_tokens: int | None = None
    hybrid_kv_cache_manager: bool = True
    # vLLM --enable-prefix-caching / --no-enable-prefix-caching (None = the release's default): it
    # sets how many blocks a hybrid model's Mamba / linear-attention state takes per request.
    enable_prefix_caching: bool | None = None
    # vLLM --language-model-only (0.17+): a multimodal checkpoint served as text only -- its
    # vision/audio towers are not built and the profile runs no encoder.
    language_model_only: bool | None = None
    # vLLM --limit-mm-per-prompt as kvwatch keeps it ('image=0,video=0', sorted: engines/vllm/
    # multimodal.limits_flag): every modality of the model at 0 serves it as text; None = not given.
    mm_limits: str | None = None
    # vLLM --skip-mm-profiling (0.10.2+): the profile run feeds no encoder; the towers still load.
    skip_mm_profiling: bool | None = None
    # vLLM's runner (--runner, 0.10+; the --task of 0.7-0.12): 'pooling' (embedding, classification,
    # reward) profiles a pooler where a generator profiles its sampler; None = the model's default.
    runner: Literal["generate", "pooling"] | None = None
    # The engine's own flags that move the non-KV terms (None = the release's default):
    # --max-num-seqs, --enforce-eager, --dtype (activation dtype), --quantization (runtime).
    max_num_seqs: int | None = None
    enforce_eager: bool | None = None
    dtype: str | None = None
    quantization: str | None = None
    # vLLM 0.8-0.11.0: whether the sampler runs FlashInfer, which picks the profile's sampler
    # (engines/vllm/memory.sampler_path); None = installed, as in the vllm/vllm-openai image;
    # False: not installed or disabled (--no-flashinfer, or the log's fallback line).
    flashinfer_sampler: bool | None = None
    # vLLM 0.8-0.10 started with VLLM_USE_V1=0 in its environment: the V0 engine (its scheduler
    # defaults and profile run) instead of the release's default V1 (engines/vllm/memory.runs_v0).
    v0_engine: bool = False
    # The image processor's max_pixels (the checkpoint's preprocessor_config.json, or vLLM's
    # --mm-processor-kwargs): the largest dummy image V0's profile feeds a Qwen2-VL-style tower
    # (engines/vllm/multimodal.py); None = not known, that profile is not sized.
    image_max_pixels: int | None = None
    # Data-parallel ranks, and whether attention is data-parallel inside the TP group (SGLang
    # --enable-dp-attention); a KV-transfer connector (vLLM --kv-transfer-config, SGLang disaggregation).
    # Neither is modelled yet: each is a condition the calibration envelope names (capacity/envelope.py).
    dp: int = 1
    dp_attention: bool = False
    kv_connector: str | None = None
    # Speculative decoding (vLLM --speculative-config): the drafter's method ('mtp', 'eagle3',
    # 'dflash', ...) and the tokens it proposes a step (None = the method's default).
    speculative_method: str | None = None
    num_speculative_tokens: int | None = None

    def with_(self, **changes: DeploymentValue) -> Deployment:
        """A copy with some fields changed (None values are ignored)."""
        given: dict[str, Any] = {k: v for k, v in changes.items() if v is not None}
        return replace(self, **given)


def kv_elem_bytes(model: ModelGeometry, kv_cache_dtype: str, dtype: str | None = None) -> int:
    """Bytes per stored KV element for a cache dtype name. 'auto' is the served model dtype: the
    ``--dtype`` given (float32 keeps 4 bytes), else the checkpoint's as served. Both engines take
    the model dtype for an 'auto' cache: vLLM 0.21.0 utils/torch_utils.py:396-401
    (kv_cache_dtype_str_to_dtype returns model_config.dtype; V0 0.8.5 worker/cache_engine.py:50-51),
    SGLang 0.5.23 mem_cache/kv_cache_dtype.py:49-59 (model_dtype unless the checkpoint quantises KV)."""
    name = kv_cache_dtype.lower().removeprefix("torch.")
    if name == "auto":
        served = CHECKPOINT_DTYPE_BYTES.get((dtype or "auto").lower().removeprefix("torch."))
        return served if served is not None else model.dtype_bytes
    if name not in KV_DTYPE_BYTES:
        raise ConfigError(
            f"unknown kv cache dtype {kv_cache_dtype!r} (use auto, bf16, fp16, fp8, fp8_e4m3, fp8_e5m2)"
        )
    return KV_DTYPE_BYTES[name]


def validate(model: ModelGeometry, d: Deployment) -> None:
    """Refuse what the engine itself would refuse, and sizes that make no sense, as ConfigError."""
    if d.engine not in ENGINE_NAMES:
        raise ConfigError(f"unknown engine {d.engine!r} (use {' or '.join(ENGINE_NAMES)})")
    for name in ("tp", "pp", "dcp"):
        value = getattr(d, name)
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    for name in (
        "block_size",
        "page_size",
        "max_model_len",
        "chunked_prefill_size",
        "cuda_graph_max_bs",
        "max_num_batched_tokens",
        "max_num_seqs",
        "num_speculative_tokens",
    ):
        value = getattr(d, name)
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be positive, got {value}")
    # available_kv_bytes may be zero or negative: engines print such budgets (vLLM V0 '-1.05GiB')
    # and then allocate no blocks, which is what the prediction should say.
    for name in ("gpu_memory_bytes", "weights_bytes", "free_after_weights_bytes"):
        value = getattr(d, name)
        if value is not None and value <= 0:
            raise ConfigError(f"{name.replace('_bytes', '')} memory must be positive, got {value} bytes")
    for name in ("activation_bytes", "non_torch_bytes", "cuda_graph_bytes", "memory_in_use_bytes"):
        value = getattr(d, name)
        if value is not None and value < 0:
            raise ConfigError(f"{name.replace('_bytes', '')} memory cannot be negative, got {value} bytes")
    for name, bound in _COUNT_BOUNDS.items():
        value = getattr(d, name)
        if value is not None and value > bound:
            raise ConfigError(f"{name} {value} is over the plausible maximum {bound:,}")
    for name in _SIZE_FIELDS:
        value = getattr(d, name)
        if value is not None and abs(value) > MAX_GPU_MEMORY_BYTES:
            raise ConfigError(
                f"{name.replace('_bytes', '')} memory {value:.4g} bytes is over the plausible maximum "
                f"of {MAX_GPU_MEMORY_BYTES // 2**40} TiB per GPU"
            )
    if d.memory_in_use_bytes and d.gpu_memory_bytes and d.memory_in_use_bytes >= d.gpu_memory_bytes:
        raise ConfigError(
            f"memory in use ({d.memory_in_use_bytes / 2**30:.2f} GiB) must be less than the card's "
            f"{d.gpu_memory_bytes / 2**30:.2f} GiB"
        )
    if d.gpu_memory_utilization is not None and not 0 < d.gpu_memory_utilization <= 1:
        raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {d.gpu_memory_utilization}")
    if d.mem_fraction_static is not None and not 0 < d.mem_fraction_static < 1:
        raise ConfigError(f"mem_fraction_static must be in (0, 1), got {d.mem_fraction_static}")
    kv_elem_bytes(model, d.kv_cache_dtype, d.dtype)
    heads = model.num_attention_heads
    if heads % d.tp:
        raise ConfigError(
            f"total number of attention heads ({heads}) must be divisible by tensor parallel size ({d.tp}); "
            f"{d.engine} refuses to start"
        )
    for layer in model.layers:
        if layer.is_paged and layer.kind != "mla":
            h = layer.num_kv_heads
            if (h >= d.tp and h % d.tp) or (h < d.tp and d.tp % h):
                raise ConfigError(
                    f"{h} KV heads cannot be split or replicated evenly over tensor parallel size {d.tp}"
                )
    if d.tp % d.dcp:
        raise ConfigError(
            f"tensor parallel size ({d.tp}) must be divisible by decode context parallel size ({d.dcp})"
        )
    if d.pp > model.num_layers:
        raise ConfigError(f"pipeline parallel size ({d.pp}) exceeds the model's {model.num_layers} layers")


_QUANT_TO_WEIGHTS: dict[str, str] = {
    "fp8": "fp8",
    "fbgemm_fp8": "fp8",
    "awq": "int4",
    "awq_marlin": "int4",
    "gptq": "int4",
    "gptq_marlin": "int4",
    "mxfp4": "mxfp4",
    "modelopt_fp4": "nvfp4",
}


def deployment_from_settings(
    engine: str,
    settings: SettingsFacts,
    memory: MemoryFacts,
    gpu_memory_bytes: int | None = None,
    **overrides: DeploymentValue,
) -> Deployment:
    """A Deployment from an engine's printed settings and memory budget (a state snapshot's facts).

    ``gpu_memory_bytes`` is used when the log did not print the card's total; ``overrides`` are
    Deployment fields that win over both (None values are ignored).
    """
    name = next((n for n in ENGINE_NAMES if n == engine), None)
    if name is None:
        raise ConfigError(f"unknown engine {engine!r} (use {' or '.join(ENGINE_NAMES)})")
    s, m = settings, memory
    weights_dtype = _QUANT_TO_WEIGHTS.get(s.quantization.lower()) if s.quantization is not None else None
    d = Deployment(
        engine=name,
        engine_version=s.version,
        gpu_memory_bytes=_first(m.total_bytes, gpu_memory_bytes),
        tp=_first(s.tensor_parallel_size, Deployment.tp),
        pp=_first(s.pipeline_parallel_size, Deployment.pp),
        dcp=_first(s.decode_context_parallel_size, Deployment.dcp),
        dp=_first(s.data_parallel_size, Deployment.dp),
        kv_cache_dtype=_first(s.kv_cache_dtype, Deployment.kv_cache_dtype),
        block_size=s.block_size,
        page_size=s.page_size,
        max_model_len=s.max_model_len,
        # The budget line's fraction wins over the settings line's.
        gpu_memory_utilization=_first(m.gpu_memory_utilization, s.gpu_memory_utilization),
        mem_fraction_static=_first(m.mem_fraction_static, s.mem_fraction_static),
        fraction_printed=m.mem_fraction_static is not None or s.mem_fraction_static is not None,
        weights_dtype=weights_dtype,
        weights_bytes=m.weights_bytes,
        activation_bytes=m.activation_bytes,
        non_torch_bytes=m.non_torch_bytes,
        cuda_graph_bytes=m.cuda_graph_bytes,
        available_kv_bytes=m.available_kv_bytes,
        free_after_weights_bytes=m.avail_after_weights_bytes,
        chunked_prefill_size=s.chunked_prefill_size,
        cuda_graph_max_bs=s.cuda_graph_max_bs,
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_num_seqs=s.max_num_seqs,
        enforce_eager=s.enforce_eager,
        enable_prefix_caching=s.enable_prefix_caching,
        language_model_only=s.language_model_only,
        dp_attention=_first(s.dp_attention, Deployment.dp_attention),
        mm_limits=s.mm_limits,
        skip_mm_profiling=s.skip_mm_profiling,
        runner=s.runner,
        flashinfer_sampler=s.flashinfer_sampler,
        dtype=s.dtype,
        quantization=s.quantization,
    )
    known = {f.name for f in fields(Deployment)}
    for key in overrides:
        if key not in known:
            raise ConfigError(f"unknown deployment field {key!r}")
    d = d.with_(**overrides)
    if overrides.get("mem_fraction_static") is not None:
        d = replace(d, fraction_printed=False)  # the operator's own figure, as typed
    if d.kv_cache_dtype.startswith("torch."):
        d = replace(d, kv_cache_dtype=d.kv_cache_dtype.removeprefix("torch."))
    return d


_T = TypeVar("_T")


def _first(value: _T | None, default: _T) -> _T:
    return default if value is None else value
