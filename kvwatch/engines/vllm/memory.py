"""vLLM's non-KV memory before launch: the terms ``determine_available_memory`` measures, modelled.

The budget identity (vllm 0.19.0 v1/worker/gpu_worker.py:384-421, v1/worker/utils.py:403-409)::

    requested = ceil(total x gpu_memory_utilization)     total = torch.cuda.mem_get_info()[1]
    available = requested - weights - torch peak increase - non-torch increase
                - CUDA-graph estimate (only where the release subtracts it)

Each term below names the source it is read from (file:line of the release named, from
``pip download vllm==X --no-deps``); the few coefficients the source leaves open are fitted on the
real startups of tests/apriori (calibration.py names the cases). Each term's error band is the
envelope's (envelope.py), sized from the leave-one-source-out error of bench/bench_accuracy.py,
which ``predict`` prints and the drift alert's tolerance follows. Weights as loaded are
weights.py. Citations are for 0.19.0 unless a line says otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.dims import ModelDims
from kvwatch.capacity.gpus import GpuSpec
from kvwatch.core.errors import ConfigError
from kvwatch.core.units import GiB, MiB
from kvwatch.engines.vllm import calibration, graph_profile, host_memory, multimodal, prefix_lm, releases
from kvwatch.engines.vllm.bnb import bnb_dequant

# --- engine defaults -----------------------------------------------------------------------------


def default_utilization(version: str | None) -> float:
    """0.90 up to 0.19 (config/cache.py:41), 0.92 from 0.20 (0.20.0 config/cache.py:66)."""
    return releases.UTILIZATION_DEFAULT.at(version)


def is_v1(version: str | None) -> bool:
    """V1 is the default engine from 0.8.0 (V0 before; VLLM_USE_V1=0 is ``runs_v0``'s)."""
    return releases.V1_ENGINE.at(version)


def runs_v0(d: Deployment) -> bool:
    """Whether the deployment runs the V0 engine: every release before 0.8, and 0.8.0-0.9.0 at PP >= 2.

    The V1 oracle falls back to V0 for pipeline parallelism unless the executor backend is one it
    names, and the default backend (None) is not among them: 'ray' only in 0.8.5
    (engine/arg_utils.py:1476-1482), 'ray'/'mp'/'external_launcher' in 0.9.0 (:1378-1384); 0.9.1
    adds the default (ParallelConfig.distributed_executor_backend, :1434-1440; 0.10.0 :1439-1445).
    kvwatch models the default backend.

    ``d.v0_engine`` (VLLM_USE_V1=0 in the environment) selects V0 on 0.8-0.10: arg_utils' oracle
    honours an explicit 0 (0.8.4 engine/arg_utils.py:1160-1162, ``try_v1 = envs.VLLM_USE_V1 or not
    envs.is_set("VLLM_USE_V1")``); 0.11 ships no V0 engine (releases.V0_SELECTABLE), so there it is
    bad input.
    """
    if not is_v1(d.engine_version):
        return True
    if d.v0_engine:
        if not releases.V0_SELECTABLE.at(d.engine_version):
            raise ConfigError(
                f"VLLM_USE_V1=0 (--v0-engine): vLLM {d.engine_version or 'newest'} has no V0 engine "
                "(removed in 0.11.0)"
            )
        return True
    # No release given means the newest, which runs V1 at any PP.
    return d.pp >= 2 and d.engine_version is not None and releases.V0_AT_PP.at(d.engine_version)


def default_batch_limits(
    version: str | None,
    total_bytes: int | None,
    gpu_name: str | None,
    max_model_len: int,
    v0: bool | None = None,
) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) the API server resolves when the user sets neither.

    V1 (engine/arg_utils.py:2053-2071, the same table 0.11-0.27): a card reporting >= 70 GiB that is
    not an A100 gets 1024 / 8192, every other card 256 / 2048. >= 160 GiB raises the tokens to 16384
    in 0.20 (0.20.0 arg_utils.py) and again from 0.28 (0.28.0 arg_utils.py:2582-2591, 0.33.0 :2973);
    0.21.0-0.27.1 have no such branch (0.21.0 :2217-2266, 0.27.1 :2515-2544). V0 (< 0.8) schedules
    256 sequences and, without chunked prefill, max(max_model_len, 2048) tokens (config.py
    SchedulerConfig). ``v0``: the release runs V0 (None: its default engine; True for a fallback).

    The card's memory is what NVML reports (platforms/cuda.py NvmlCudaPlatform.get_device_total_memory,
    0.25.1 :764-767, 0.13.0 :523-526); where NVML raises -- a unified-memory card such as GB10
    (gpus.GpuSpec.nvml_memory) -- the table takes 0 bytes (0.13.0 engine/arg_utils.py:1786-1792,
    0.25.1 :2415-2421) and the small defaults apply.
    """
    if (not is_v1(version)) if v0 is None else v0:
        # Beyond 32K tokens V0 turns chunked prefill on by default (0.6.4 engine/arg_utils.py:995-1020,
        # 0.8.5 :1504-1533), which schedules v0_chunked_prefill_tokens (512, then 2048).
        chunk = releases.V0_CHUNKED_PREFILL_TOKENS.at(version)
        return 256, chunk if max_model_len > 32768 else max(max_model_len, 2048)
    total = total_bytes or 0
    card = gpus.find(gpu_name)
    if card is not None and not card.nvml_memory:
        total = 0
    big = releases.BIG_CARD_TOKENS.at(version)
    if total >= 160 * GiB and big:
        return 1024, 16384
    if total >= 70 * GiB and "a100" not in (gpu_name or "").lower():
        return 1024, 8192
    return 256, 2048


def batch_limits(d: Deployment, max_model_len: int, dims: ModelDims | None = None) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) as given, else as the release resolves them; a V0
    fallback (runs_v0) takes V0's, a multimodal prefix LM the floor of its largest item
    (prefix_lm.py)."""
    v0 = runs_v0(d)
    seqs, tokens = default_batch_limits(d.engine_version, d.gpu_memory_bytes, d.gpu_name, max_model_len, v0)
    if dims is not None and not v0 and releases.PREFIX_LM_BATCH_FLOOR.at(d.engine_version):
        tokens = max(tokens, prefix_lm.prefix_lm_batch_floor(dims))
    return d.max_num_seqs or seqs, d.max_num_batched_tokens or tokens


def capture_sizes(
    max_num_seqs: int, max_num_batched_tokens: int, version: str | None = None, sm_major: int = 9
) -> int:
    """How many CUDA-graph sizes vLLM captures: [1, 2, 4] + 8..248 step 8 + 256.. step 16 up to
    min(2 x max_num_seqs, cap, max_num_batched_tokens) (config/vllm.py:1349-1353, 1389-1403), cap 512,
    1024 on SM100 from 0.28 (0.28.0 config/vllm.py:1936-1943). From 0.21 max_num_batched_tokens is
    captured too when under the top (0.21.0 :1580), from 0.31 max_num_seqs (0.31.0 :2540)."""
    cap = releases.SM100_CAPTURE_CAP.at(version) if sm_major == 10 else 512
    top = min(max_num_seqs * 2, cap, max_num_batched_tokens)
    sizes = {s for s in (1, 2, 4, *range(8, 256, 8), *range(256, top + 1, 16)) if s <= top}
    if releases.CAPTURES_BATCHED_TOKENS.at(version) and max_num_batched_tokens <= top:
        sizes.add(max_num_batched_tokens)
    if releases.CAPTURES_MAX_NUM_SEQS.at(version) and max_num_seqs <= top:
        sizes.add(max_num_seqs)
    return len(sizes)


def subtracts_cuda_graphs(version: str | None) -> bool:
    """VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS defaults to 1 from 0.20.0 (0.20.0 envs.py:1724; 0.19.0
    envs.py:1654 has "0"): the estimate comes out of the KV budget. The source wins over 0.21's log
    text ("default since v0.21.0")."""
    return releases.SUBTRACTS_CUDA_GRAPHS.at(version)


def estimates_cuda_graphs(version: str | None) -> bool:
    """0.18+ profiles CUDA-graph memory before sizing the pool (gpu_worker.py profile_cudagraph_memory)."""
    return releases.ESTIMATES_CUDA_GRAPHS.at(version)


# --- terms ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Term:
    """One modelled term: bytes and how it was modelled (its band is the envelope's, envelope.py)."""

    bytes: int
    note: str = ""


# Sampler bytes per [rows x vocab] element alive at the profile's peak, counted from the source:
# bf16 logits held by _dummy_sampler_run (gpu_model_runner.py:5571) 2, their fp32 copy
# (sample/sampler.py:90) 4, softmax probs (topk_topp_sampler.py:112) 4, q = empty_like(probs) (:240) 4.
SAMPLER_NATIVE_BYTES = 12
# 0.11.1-0.16, and 0.8-0.11.0 without FlashInfer, sort the whole [rows, vocab] (0.15.0
# topk_topp_sampler.py:262; the same apply_top_k_top_p in 0.10.2 :126, 0.11.0 :164): sorted fp32 4 + int64
# indices 8 + top-k mask 1 + probs_sort 4 + top-p mask 1 + CUB radix double buffers 12, on top of the
# bf16 (2) and fp32 (4) logits = 36 counted, and calibration.sampler_sort_extra FITTED.
SAMPLER_SORT_COUNTED = 36
# FlashInfer (0.8-0.11.0 when installed): the 2 + 4 logits, the top-k masked logits 4, probs 4.
SAMPLER_FLASHINFER_BYTES = 12
# V0 (< 0.8): fp32 logits, probs and logprobs over the last token of each scheduled sequence.
SAMPLER_V0_BYTES = 12
# Torch's cuBLAS workspace (":4096:8" = 32 MiB on sm90+, ~8 MiB before Hopper) and the FITTED small
# tensors alive at the peak (calibration.small_tensors_gib).
CUBLAS_WORKSPACE_HOPPER = 32 * MiB
CUBLAS_WORKSPACE = 8 * MiB + 128 * 1024
# V1 forward transient per token, in elements of the activation dtype: forward_h x hidden +
# 3 x intermediate / tp. Residual, normed input, gate_up (2I) and act (I) are 2H + 3I counted; q/k/v,
# attention output and torch.compile buffers make the rest, FITTED (calibration.forward_h). V0 runs no
# compile: 3H + 3I, counted -- the model loop still holds the layer's input while the layer runs
# (0.6.4 models/llama.py:339-342), beside the residual and the attention output the MLP reads (the
# norms work in place, layernorm.py:78-85; llama.py:259-267, 92-96). Multimodal: see activation().
FORWARD_H_V0 = 3.0


def sampler_path(version: str | None, flashinfer: bool | None = None) -> str:
    """Which top-k/top-p implementation the profile's dummy sampler run takes on CUDA.

    0.8-0.11.0: FlashInfer when it is installed (0.11.0 topk_topp_sampler.py:39-67), else the
    PyTorch sort; the wheel lists flashinfer-python as an extra only (0.10.2 and 0.11.0 METADATA
    'Provides-Extra: flashinfer'), so a bare ``pip install vllm`` sorts -- its log says
    "FlashInfer is not available" -- while the vllm/vllm-openai image ships it (``flashinfer``
    False: not installed; None: installed, the default). 0.11.1-0.16: PyTorch sort, FlashInfer
    opt-in only (0.11.1 topk_topp_sampler.py:34-46). 0.17-0.20: the Triton kernel for >= 8 rows
    (0.19.0 topk_topp_sampler.py:251) with a cached [SMs, vocab] fp32 buffer
    (topk_topp_triton.py:1018). 0.21: FlashInfer by default, but _dummy_sampler_run also warms
    forward_native, so the native peak is the larger. V0: its own.
    """
    path = releases.SAMPLER_PATH.at(version)
    return "sort" if path == "flashinfer" and flashinfer is False else path


def activation_dtype_bytes(dims: ModelDims, d: Deployment) -> int:
    """--dtype float32 keeps 4 bytes; 'auto' serves a float32 checkpoint in 16 bits (config/model.py
    _get_and_verify_dtype)."""
    name = (d.dtype or "auto").lower().removeprefix("torch.")
    if name in ("float32", "fp32", "float"):
        return 4
    if name in ("float16", "half", "fp16", "bfloat16", "bf16"):
        return 2
    return 2 if dims.dtype_bytes >= 4 else dims.dtype_bytes


def _sampler_bytes(dims: ModelDims, d: Deployment, rows: int, act: int, sms: int) -> int:
    """Torch bytes the dummy sampler run adds (_dummy_sampler_run, gpu_model_runner.py:5556).

    Logits are full-vocab on every TP rank (logits_processor.py:75-83 all-gathers them), which is
    why activation does not change with TP; an fp32 model's .to(float32) is a no-op (sampler.py:90).
    """
    path = "v0" if runs_v0(d) else sampler_path(d.engine_version, d.flashinfer_sampler)
    logits16 = 2 if act == 2 else 0
    extra = 0
    if path == "sort":
        per = SAMPLER_SORT_COUNTED + calibration.current().sampler_sort_extra - (2 - logits16)
    elif path == "triton":
        per = SAMPLER_NATIVE_BYTES + logits16
        extra = min(sms, rows) * dims.vocab_size * 4
    elif path == "flashinfer":
        per = SAMPLER_FLASHINFER_BYTES + logits16
    else:
        per = SAMPLER_V0_BYTES
    # The last hidden states gathered for sampling and rand_like (gpu_model_runner.py:5553, :5569).
    small = 2 * rows * dims.hidden_size * act
    return int(rows * dims.vocab_size * per + extra + small)


def _moe_workspace(dims: ModelDims, tp: int, tokens: int, act: int) -> int:
    """The fused-MoE workspace of the profile forward: M x topk x max(N/2, K) + M x topk x max(N, K),
    N = 2 x moe_I / tp, K = H (modular_kernel.py:1036-1066, fused_moe.py:1976-1991). From 0.14 it is
    grown and kept until lock_workspace, so it is alive through the sampler pass
    (v1/worker/workspace.py); before, fused_experts allocates it per call and frees it with the
    layer (0.10.2 fused_moe.py:1580-1590): part of the forward's transient only
    (releases.MOE_WORKSPACE_PERSISTENT). MXFP4 MoE (mxfp4.py, OAI triton kernels) allocates per
    call instead."""
    if not dims.n_experts or not dims.top_k or dims.checkpoint_quant == "mxfp4":
        return 0
    n = 2 * dims.moe_intermediate_size // tp
    k = dims.hidden_size
    ws13 = max(tokens * dims.top_k * max(n // 2, k), tokens * k)
    ws2 = tokens * dims.top_k * max(n, k)
    return (ws13 + ws2) * act


def v0_multimodal(
    dims: ModelDims, d: Deployment, max_num_seqs: int, tokens: int, max_model_len: int | None
) -> multimodal.Profile | None:
    """V0's dummy multimodal batch (multimodal.v0_profile) where the deployment runs V0 and the
    processor's max_pixels is known; None otherwise (the profile then sizes text tokens only)."""
    if not runs_v0(d) or d.image_max_pixels is None or not multimodal.encoder_profiled(dims, d, v0=True):
        return None
    length = max_model_len or d.max_model_len or tokens
    counts = (multimodal.limit(d, "image", v0=True), multimodal.limit(d, "video", v0=True))
    return multimodal.v0_profile(
        dims, d.image_max_pixels, max_num_seqs, tokens, length, activation_dtype_bytes(dims, d), counts
    )


def profiles_pooler(d: Deployment) -> bool:
    """Whether the profile run ends in the pooler, not the sampler: a pooling runner on V1 (0.10.2
    v1/worker/gpu_model_runner.py:3034, 0.19.0 :5787, 0.33.0 :6137); V0's pooling runner is not
    modelled, so V0 keeps the sampler pass."""
    return d.runner == "pooling" and not runs_v0(d)


def v1_multimodal(
    dims: ModelDims, d: Deployment, max_num_seqs: int, tokens: int, max_model_len: int | None
) -> multimodal.V1Profile | None:
    """V1's encoder profile (multimodal.v1_profile) for a tower it sizes (Qwen3-VL / Qwen3.5, from
    0.15: releases.QWEN3_TOWER_PROFILE); None for the lump, on V0, or with no encoder to run (served
    as text, --skip-mm-profiling: multimodal.encoder_profiled)."""
    grid = dims.vision_grid
    if grid is None or runs_v0(d) or not releases.QWEN3_TOWER_PROFILE.at(d.engine_version):
        return None
    if not multimodal.encoder_profiled(dims, d, v0=False):
        return None
    # --limit-mm-per-prompt: a modality at 0 passes no tower; the others cap the items a prompt holds.
    limits = {m: multimodal.limit(d, m, v0=False) for m in ("image", "video")}
    length, act = max_model_len or d.max_model_len or tokens, activation_dtype_bytes(dims, d)
    return multimodal.v1_profile(grid, d.image_max_pixels, max_num_seqs, tokens, length, act, d.tp, limits)


def activation(
    dims: ModelDims,
    d: Deployment,
    gpu: GpuSpec | None,
    max_num_seqs: int,
    tokens: int,
    max_model_len: int | None = None,
) -> list[Term]:
    """The torch peak increase of the profile run, per pipeline stage (gpu_worker.py:372-386).

    profile_run (gpu_model_runner.py:5721-5800): the forward over max_num_batched_tokens, then -- on
    the last PP stage only (:5792) -- the dummy sampler over min(tokens, max_num_seqs) rows while the
    forward's hidden states are still referenced. Peak = persistent (cuBLAS workspace, MoE workspace,
    PP buffers) + max(forward transient, hidden out + sampler). Stages that do not sample hold the
    received and sent intermediate tensors, 2 x tokens x H (gpu_model_runner.py:5441).

    V0 with a Qwen2-VL-style tower (v0_multimodal): the batch is clamped to the sequences that hold
    max_mm_tokens each, the forward runs over the dummy prompts' tokens (more than the budget when a
    prompt's placeholders outgrow its share), the float32 pixel values stay on the card through it,
    and the tower's own transient joins the max (multimodal.py).

    V1, Qwen3-VL / Qwen3.5 tower (v1_multimodal): pixels + max(tower peak, cached outputs + forward /
    sampler), the cache cleared after the sampler (gpu_model_runner.py:5762-5795). Other towers, or
    before 0.15: the FITTED vision_encoder_gib lump in the persistent part.
    """
    act = activation_dtype_bytes(dims, d)
    v1 = not runs_v0(d)
    mm = v0_multimodal(dims, d, max_num_seqs, tokens, max_model_len)
    if mm is not None:
        max_num_seqs, tokens = mm.seqs, mm.forward_tokens
    rows = min(tokens, max_num_seqs)
    hopper = gpu is None or gpu.sm_major >= 9
    cal = calibration.current()
    # From 0.33 the cuBLAS/cuBLASLt handles and their workspace exist before the init snapshot
    # (0.33.0 v1/worker/gpu_worker.py:520-529): baseline, not profile memory.
    in_baseline = releases.CUBLAS_IN_BASELINE.at(d.engine_version)
    cublas = 0 if in_baseline else (CUBLAS_WORKSPACE_HOPPER if hopper else CUBLAS_WORKSPACE)
    persistent = cublas + int(cal.small_tensors_gib * GiB)
    moe = _moe_workspace(dims, d.tp, tokens, act)
    kept = releases.MOE_WORKSPACE_PERSISTENT.at(d.engine_version)
    persistent += moe if kept else 0
    # Served as text (--language-model-only, or every modality limited to 0): no modality has items, so
    # the encoder budget is 0 and profile_run runs no encoder (0.19.0 gpu_model_runner.py:5734,
    # v1/core/encoder_cache_manager.py:288-294); --skip-mm-profiling skips it too (multimodal.py).
    profiled = multimodal.encoder_profiled(dims, d, v0=not v1)
    v1mm = v1_multimodal(dims, d, max_num_seqs, tokens, max_model_len)
    if profiled and v1mm is None:
        persistent += int(cal.vision_encoder_gib * GiB)
    persistent += mm.pixel_bytes if mm is not None else 0
    coefficient = cal.forward_h if v1 else FORWARD_H_V0
    forward = int(tokens * (coefficient * dims.hidden_size + 3 * dims.intermediate_size / d.tp) * act)
    forward += 0 if kept else moe
    forward += bnb_dequant(dims, d.tp, tokens)
    pooler = profiles_pooler(d)
    if pooler:
        # The forward's hidden states, pooled per task (_dummy_pooler_run, every supported task over
        # the whole batch) into the float32 head dtype -- at most every token's.
        sampler = tokens * dims.hidden_size * (act + 4)
    else:
        sampler = tokens * dims.hidden_size * act + _sampler_bytes(
            dims, d, rows, act, (gpu.sm_count if gpu and gpu.sm_count else 132)
        )
    pp_buffers = 2 * tokens * dims.hidden_size * act if d.pp > 1 else 0
    encoder = mm.encoder_bytes if mm is not None else 0
    if v1mm is not None:
        # The pixel values stay through the stage's whole profile run; the cached outputs sit
        # beside the forward and the sampler; the tower's own peak comes before them.
        persistent += v1mm.pixel_bytes
        forward += v1mm.cached_bytes
        sampler += v1mm.cached_bytes
        encoder = v1mm.encoder_bytes
    out: list[Term] = []
    for stage in range(d.pp):
        last = stage == d.pp - 1
        # The tower runs on the first stage, before the decoder layers (its transient freed by then).
        body = max(forward, sampler) if last else forward
        note = ("pooler" if pooler else "sampler") if last and sampler >= forward else "forward"
        if stage == 0 and encoder > body:
            body, note = encoder, "vision encoder"
        total = persistent + body + pp_buffers
        out.append(Term(total, note))
    return out


def others_memory(d: Deployment) -> releases.OthersMemory:
    """What the release does with memory other processes hold on the card at launch: 'counted' as its
    own non-torch memory (V0 up to 0.3.0 and at 0.6.4.x, V1 up to 0.9.0: non-torch = total - free -
    torch), left in the 'baseline' the profile subtracts (V0 0.3.1-0.6.3, from 0.6.5), or 'checked'
    at start: free >= utilisation x total, then left in the baseline (V1 from 0.9.1)."""
    rule = releases.V0_OTHERS_MEMORY if runs_v0(d) else releases.V1_OTHERS_MEMORY
    return rule.at(d.engine_version)


def fabric_non_torch(d: Deployment) -> bool:
    """Whether TP adds communication memory to the non-torch increase: TP >= 2 on a card not known
    to be PCIe-only (gpus.GpuSpec.interconnect; an unlisted card keeps the measured class).

    From 0.18 the init snapshot is taken after init_worker_distributed_environment (0.18.1 and
    0.19.0 v1/worker/gpu_worker.py:259-283, "ensures NCCL buffers are allocated before we measure"),
    so what the communicators allocate at init -- pynccl's warm-up, custom all-reduce's IPC buffers
    (custom_all_reduce.py:177-181) -- is baseline, not budget. The ~1.8 GiB above TP 1's that the
    H100 SXM startups log at TP 2 and 4 alike is allocated later, by the collectives on the NVSwitch
    fabric -- not traced to one line; NCCL connects lazily (NCCL_RUNTIME_CONNECT) and its NVLink
    SHARP buffers exist only with the switch, the likely allocation. PCIe-only cards
    have no such fabric, and custom all-reduce is off beyond two of them (custom_all_reduce.py:152-160)
    or without P2P (:164-170): their increase is TP 1's. The LAMBO 4x RTX 3090 startups leave
    0.1-1.3 GiB for activation and non-torch together, where the fabric class needs 2.2 GiB.
    NVLink SHARP (NCCL's NVLS) needs compute capability 9.0 and an NVSwitch, so a card before SM 9
    (A100 SXM, with its NVLink) takes TP 1's class too: an SM 8.0 80 GB pair at TP 2 on 0.27.1 logs
    'SymmMemCommunicator: Device capability 8.0 not supported' and 0.17 GiB of non-torch memory
    (souspilot/DiscoverPhysicsWIP, tests/apriori/public/vllm-cards).
    """
    card = gpus.find(d.gpu_name)
    return gpus.tp_over_fabric(d.tp, d.gpu_name) and (card is None or card.sm_major >= 9)


def non_torch(d: Deployment) -> Term:
    """The non-torch increase since the worker's init snapshot (mem_utils.py:288-291).

    cuBLAS/cuBLASLt handles and kernel modules of the first forward at TP1; from 0.18 the CUDA-graph
    profile runs inside the memory_profiling context (gpu_worker.py:366-381), which leaves more; at
    TP >= 2 on an NVSwitch fabric the communication buffers allocated outside torch after the
    snapshot (fabric_non_torch; PCIe-only cards take TP 1's class from 0.18). With PP the NCCL
    set-up already sits in the init snapshot. TP 1's larger class only where the graph profile is
    measured (graph_profile: graphs on, not ROCm before 0.26, 0.18-0.26). Values FITTED per release
    class (calibration.py): the ~2 GiB at TP >= 2 is not traced to one line of the source. On a
    unified-memory card the host memory the startup takes is counted too (host_memory.py).
    """
    new, unmeasured = releases.NON_TORCH_WITH_GRAPH_PROFILE.at(d.engine_version), False
    cal = calibration.current()
    pcie = new and d.tp >= 2 and not fabric_non_torch(d)
    if d.tp >= 2 and not pcie:
        gib = (
            cal.non_torch_tp_gib + cal.non_torch_tp_slope_gib * (d.tp - 2)
            if new
            else cal.non_torch_tp_old_gib
        )
    elif d.pp >= 2 and d.tp < 2:
        gib = cal.non_torch_pp_gib
    elif runs_v0(d):
        gib = cal.non_torch_v0_gib
    else:
        # TP 1's class holds the CUDA-graph profile's memory only where that is measured (graph_profile).
        unmeasured = new and not graph_profile.graph_profile_measured(d)
        gib = cal.non_torch_tp1_old_gib if unmeasured or not new else cal.non_torch_tp1_gib
    card = gpus.find(d.gpu_name)
    unified = host_memory.counts_host_memory(d, card)
    gib += cal.non_torch_unified_gib if unified else 0.0
    why = (
        "a PCIe-only card: no NVSwitch buffers after the init snapshot"
        if card is None or card.interconnect == "pcie"
        else f"SM {card.sm_major}: NVLink SHARP's buffers need SM 9"
    )
    note = "; ".join(
        ([f"TP 1's figure ({why})"] if pcie else [])
        + ([graph_profile.NOTE] if unmeasured else [])
        + ([host_memory.NOTE.format(gib=cal.non_torch_unified_gib)] if unified else [])
    )
    return Term(int(gib * GiB), note)


NCCL_GRAPHS_NOTE = "every graph carries NCCL all-reduces (no custom all-reduce beyond two PCIe-only GPUs)"


def nccl_in_graphs(d: Deployment) -> bool:
    """Whether the all-reduces captured in the CUDA graphs are NCCL calls: TP > 2 on a PCIe-only card
    that neither symmetric memory nor FlashInfer serves.

    CudaCommunicator.all_reduce tries quick-reduce (ROCm), FlashInfer (VLLM_ALLREDUCE_USE_FLASHINFER,
    off by default: 0.19.0 envs.py:212), custom all-reduce, torch symmetric memory, then pynccl
    (device_communicators/cuda_communicator.py:180-225). Custom all-reduce is off on more than two
    PCIe-only GPUs (custom_all_reduce.py:152-160); symmetric memory serves capability 9.0 and 10.0
    only (all_reduce_utils.py:52-64). What is left is NCCL, captured into every graph, and NCCL's
    cuMem allocations cost memory per captured call (vllm-project/vllm#5091, NVIDIA/nccl#1234); 0.19
    no longer sets NCCL_CUMEM_ENABLE=0. At TP 2 custom all-reduce needs P2P, which kvwatch cannot
    see: not counted.
    """
    card = gpus.find(d.gpu_name)
    return (
        d.tp > 2
        and card is not None
        and card.vendor == "nvidia"
        and card.interconnect == "pcie"
        and card.sm_major not in (9, 10)
    )


# CUDA-graph estimate, FITTED (calibration.graphs_*): c0 + c1 x layers on the rank x sqrt(sizes / 51)
# + c2 for MoE, + c3 x layers x sizes / 51 where every graph carries NCCL calls (two all-reduces a
# layer, each with its own memory), GiB. The estimate itself is the first capture plus (n - 1) x the
# second (gpu_model_runner.py:5862-5955).


def cuda_graphs(dims: ModelDims, d: Deployment, max_num_seqs: int, tokens: int, layers: int) -> Term:
    """The estimate 0.18+ prints; none with --enforce-eager (gpu_worker.py:380) or before 0.18."""
    if d.enforce_eager or not estimates_cuda_graphs(d.engine_version):
        return Term(0, "none")
    card = gpus.find(d.gpu_name)
    n = capture_sizes(max_num_seqs, tokens, d.engine_version, card.sm_major if card is not None else 9)
    cal = calibration.current()
    nccl = nccl_in_graphs(d)
    gib = (
        cal.graphs_base_gib
        + cal.graphs_per_layer_gib * layers * math.sqrt(n / 51)
        + (cal.graphs_moe_gib if dims.n_experts else 0.0)
        + (cal.graphs_nccl_gib * layers * n / 51 if nccl else 0.0)
    )
    return Term(int(gib * GiB), f"{n} capture sizes" + (f"; {NCCL_GRAPHS_NOTE}" if nccl else ""))
