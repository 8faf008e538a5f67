"""vLLM's weights as loaded: the bytes ``Model loading took`` reports, per pipeline stage.

Rules (vllm 0.19.0):
- ``--dtype`` sets every unquantised tensor (float32 doubles them); 'auto' serves a float32
  checkpoint in 16 bits.
- Runtime ``--quantization fp8`` (quantization/fp8.py, Fp8LinearMethod.process_weights_after_loading)
  stores every decoder linear in one byte; embeddings, lm_head, norms and routers stay 16-bit.
  compressed-tensors w8a8 (int8/fp8) is 1 B per parameter, w4a16 packed int4 plus a 16-bit scale
  per group; MXFP4 (gpt-oss) covers the routed experts only.
- The vocabulary is padded to 64 and split over TP (vocab_parallel_embedding.py:28, :75); tied
  embeddings load one matrix, except under PP, where the last stage builds its own lm_head.
- Linears split 1/tp; norms and the rotary cos/sin cache (max positions x rotary dim, in the
  activation dtype; rotary_embedding get_rope) are replicated on every rank.
- PP (distributed/utils.py get_pp_indices): the embedding on the first stage, the head on the last.
- bitsandbytes: the linears llm_int8_skip_modules names (Unsloth's dynamic 4-bit) stay in the
  activation dtype, on their own layer's stage (dims.bnb_skipped).
- Vision / audio towers (capacity.towers.tower_params, estimated from the config when no safetensors index is
  at hand) in the activation dtype, split over TP, on the first stage.
"""

from __future__ import annotations

from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.dims import ATTENTION, DENSE_MLP, EXPERTS, LM_HEAD, MIXER, SHARED, ModelDims
from kvwatch.capacity.gpus import GpuSpec
from kvwatch.engines.vllm import multimodal
from kvwatch.engines.vllm.memory import activation_dtype_bytes, runs_v0

# Bytes per quantised parameter, values and scales.
# NVFP4 (modelopt / compressed-tensors nvfp4-pack-quantized): packed 4-bit values and one fp8 scale
# per 16 (quantization/modelopt.py ModelOptNvFp4LinearMethod.create_weights: weight [N, K/2] uint8,
# weight_scale [N, K/16] fp8).
_QUANT_BYTES = {"fp8": 1.0, "int8": 1.0, "mxfp4": 4.25 / 8, "nvfp4": 0.5 + 1 / 16}
_INT4 = ("w4a16", "int4", "awq", "gptq")
# --weights-dtype / --quantization spellings -> the scheme above.
_RUNTIME = {
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "int8": "int8",
    "w8a8": "int8",
    "int4": "w4a16",
    "w4a16": "w4a16",
    "awq": "w4a16",
    "gptq": "w4a16",
    "bitsandbytes": "w4a16",
    "mxfp4": "mxfp4",
    "nvfp4": "nvfp4",
}


def _bytes_per_param(scheme: str, group: int) -> float:
    if scheme in _QUANT_BYTES:
        return _QUANT_BYTES[scheme]
    return 0.5 + 2.0 / max(group, 1)  # packed int4 + one 16-bit scale per group


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def mxfp4_expert_bytes(dims: ModelDims, tp: int, sm_major: int) -> float:
    """Bytes per routed-expert parameter of an MXFP4 checkpoint (gpt-oss) as the MoE backend of the
    card lays it out: 4-bit values and an 8-bit scale per 32, in padded shapes.

    - Marlin below SM 9.0 and on SM 12.x (triton_kernels runs on 9.0 <= SM < 11.0 only: 0.10.2
      quantization/mxfp4.py:89-94, 0.15.0 :151-162, 0.19.0 fused_moe/oracle/mxfp4.py:197-223,
      0.33.0 :426-433 for SM 12.x): the intermediate per rank to a multiple of 128 and the hidden
      size to 256, values and scales alike (0.10.2 mxfp4.py:184-201; 0.19.0 oracle :380-385).
      gpt-oss-20b's 13.72 GiB on an A100 (0.19) and on a GB10 (0.13) alike.
    - Triton on Hopper: the intermediate to a multiple of 64 (0.10.2 mxfp4.py:216-218, 0.19.0
      oracle :399), and the Hopper MX value layout pads the values' hidden dimension to 256
      (inferred from gpt-oss-120b: 64.38 GiB at TP 1 on an H100, 32.98 a rank at TP 2 on H200,
      where 1440 -> 1472 is the intermediate's padding; not read line by line).
    - Blackwell (SM 10.x) takes FlashInfer's layouts, not modelled: unpadded.
    """
    inter = max(dims.moe_intermediate_size // max(tp, 1), 1)
    hidden = max(dims.hidden_size, 1)
    if sm_major < 9 or sm_major >= 11:
        pad = _round_up(inter, 128) / inter * (_round_up(hidden, 256) / hidden)
        return 4.25 / 8 * pad
    if sm_major == 9:
        pad_i = _round_up(inter, 64) / inter
        pad_h = _round_up(hidden, 256) / hidden
        return (4.0 * pad_h + 0.25) * pad_i / 8
    return 4.25 / 8


def pad_vocab(vocab: int, tp: int) -> int:
    """Rows per rank of VocabParallelEmbedding / ParallelLMHead (padded to 64, split over TP)."""
    padded = -(-vocab // 64) * 64
    return -(-padded // tp)


def stage_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per PP stage: an even split, the remainder on the first stages (get_pp_indices)."""
    base, rem = divmod(num_layers, pp)
    return [base + (1 if i < rem else 0) for i in range(pp)]


_UNQUANTISED = frozenset({"bf16", "bfloat16", "fp16", "float16", "half", "auto"})


def scheme(dims: ModelDims, d: Deployment) -> str | None:
    """The quantisation the loader applies.

    ``--weights-dtype`` is a what-if over the checkpoint (bf16/fp16 = unquantised); the engine's own
    ``--quantization`` flag quantises a 16-bit checkpoint at load (fp8) but does not re-quantise one
    that ships int8/int4/MXFP4 weights; otherwise the checkpoint's quantization_config.
    """
    what_if = (d.weights_dtype or "").lower()
    if what_if in _UNQUANTISED:
        return None
    if what_if in _RUNTIME:
        return _RUNTIME[what_if]
    runtime = _RUNTIME.get((d.quantization or "").lower())
    if runtime is not None and dims.checkpoint_quant not in ("int8", "w4a16", "mxfp4", "nvfp4"):
        return runtime
    return dims.checkpoint_quant


def weights_per_stage(
    dims: ModelDims, d: Deployment, gpu: GpuSpec | None, drafter_layers: int = 0
) -> tuple[list[int], str | None]:
    """Bytes on TP rank 0 of each PP stage, and the quantisation applied (None: unquantised).

    ``drafter_layers``: the MTP decoder layers a speculative MTP drafter loads inside the same
    'Model loading took' measurement (0.25.1 v1/worker/gpu_model_runner.py:5216-5235 and :5294);
    with its fc (2 x hidden -> hidden, ColumnParallelLinear) and three norms (qwen3_5_mtp.py:95-124),
    on the last stage. Its embedding and lm_head are freed for the target's (MTP always shares them
    at PP 1, v1/spec_decode/llm_base_proposer.py:1463-1494 and :1539-1550), so they add nothing.
    Each MTP layer is costed as the decoder's average layer in the checkpoint's scheme.
    """
    act = activation_dtype_bytes(dims, d)
    q = scheme(dims, d)
    linear = _bytes_per_param(q, dims.quant_group) if q in ("fp8", "int8", "nvfp4", *_INT4) else act
    experts = _bytes_per_param(q, dims.quant_group) if q is not None else act
    if q == "mxfp4" and gpu is not None:
        experts = mxfp4_expert_bytes(dims, d.tp, gpu.sm_major)
    rows = pad_vocab(dims.vocab_size, d.tp)
    embed = rows * dims.hidden_size * act
    head: float = rows * dims.hidden_size * act
    rope = dims.rope_positions * dims.rotary_dim * act
    # The vision/audio towers, unquantised, split over TP, on the first stage (the encoder runs there).
    # Served as text, a class that reads the limits builds none (multimodal.tower_built: --language-
    # model-only, or every modality limited to 0, from the release each class skips it).
    built = multimodal.tower_built(dims, d, v0=runs_v0(d))
    towers = dims.vision_params * act / d.tp if built else 0.0
    layers = max(dims.num_layers, 1)
    linear_bytes = dims.linear_params * linear
    mixed = dict(dims.group_quant) if not d.weights_dtype else {}
    if mixed:
        # ModelOpt MIXED_PRECISION: each group as its quantized_layers name it (vLLM 0.24.0
        # quantization/modelopt.py:2269-2300 picks the method per layer), 'none' in the model dtype;
        # the dense and shared MLPs share linear_params' rest and take the MLP scheme.
        def per_param(group: str) -> float:
            s = mixed.get(group, "none")  # 'fp8' / 'nvfp4' (dims.mixed_precision_groups) or 'none'
            return act if s == "none" else _QUANT_BYTES[s]

        mlp = per_param(SHARED) if mixed.get(SHARED, "none") != "none" else per_param(DENSE_MLP)
        rest = dims.linear_params - dims.attention_params - dims.mixer_params
        linear_bytes = (
            dims.attention_params * per_param(ATTENTION) + dims.mixer_params * per_param(MIXER) + rest * mlp
        )
        experts = per_param(EXPERTS)
        if LM_HEAD in mixed:
            head = rows * dims.hidden_size * per_param(LM_HEAD)
    per_layer = (linear_bytes + dims.expert_params * experts) / layers / d.tp
    per_layer += dims.other_params * act / layers
    out: list[int] = []
    first = 0
    for i, n in enumerate(stage_layers(dims.num_layers, d.pp)):
        b = n * per_layer + rope
        # bitsandbytes llm_int8_skip_modules: those linears load unquantised (UnquantizedLinearMethod,
        # 0.8.5 quantization/bitsandbytes.py:123-129), on the stage that holds their layer.
        kept = sum(a + m for a, m in dims.bnb_skipped[first : first + n])
        b += kept * (act - linear) / d.tp
        first += n
        if i == 0:
            b += embed + towers
        if i == d.pp - 1 and (not dims.tied_embeddings or d.pp > 1):
            b += head
        if i == d.pp - 1 and drafter_layers:
            fc = 2 * dims.hidden_size * dims.hidden_size * linear / d.tp
            b += drafter_layers * per_layer + fc + 3 * dims.hidden_size * act
        out.append(int(b))
    return out, q
