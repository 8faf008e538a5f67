"""What one SGLang rank holds beyond an even TP split of the checkpoint's weights: the embedding and
attention kept whole under DP attention, replicated MoE routers and sparse-attention indexers, and the
per-head copies of an MLA model's latent up-projection (budget.py sizes the pool from the total)."""

from __future__ import annotations

from dataclasses import replace

from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.dims import ATTENTION, EMBED, ROUTER
from kvwatch.capacity.model import ModelGeometry, stage_layers
from kvwatch.capacity.weights import weight_bytes, weight_bytes_of
from kvwatch.engines.sglang import releases
from kvwatch.engines.sglang.budget import attention_tp, is_dsa

# model_types whose SGLang attention is built over the attention-TP group (tp_size=attn_tp_size in
# their QKV and output projections, 0.5.4 models/qwen3.py:102-111, qwen3_moe.py:321-331,
# qwen2_moe.py:347-357, glm4_moe.py:215-225, gpt_oss.py:256-274, llama4.py:266-276,
# qwen3_next.py:272-285; MLA models: deepseek_v2.py:1086-1145). Others (llama, qwen2, ...) keep the
# full TP group in their projections (layers/linear.py:809-812).
_ATTN_TP_MODEL_TYPES = frozenset(
    {"qwen3", "qwen3_moe", "qwen2_moe", "glm4_moe", "gpt_oss", "llama4", "llama4_text", "qwen3_next"}
)


def attention_over_attn_tp(model: ModelGeometry) -> bool:
    """Whether SGLang splits this model's attention weights over the attention-TP group."""
    return model.is_mla or model.model_type in _ATTN_TP_MODEL_TYPES


def dp_attention_weights_extra(model: ModelGeometry, d: Deployment) -> int:
    """Bytes one rank holds beyond an even TP split when attention is data-parallel.

    The embedding is not split at all (VocabParallelEmbedding(enable_tp=not
    is_dp_attention_enabled()): 0.5.4 models/deepseek_v2.py:2647-2651, and qwen2, qwen2_moe,
    qwen3_next, gpt_oss, glm4_moe, llama4 alike); the attention of MLA models and of
    _ATTN_TP_MODEL_TYPES is split over the attention-TP group only (its layers, like every
    decoder layer, over the PP stages).
    """
    attn_tp = attention_tp(d)
    if attn_tp == d.tp:
        return 0
    extra = 0.0
    groups = [(EMBED, 1, 1)]
    if attention_over_attn_tp(model):
        groups.append((ATTENTION, attn_tp, max(d.pp, 1)))
    # The group alone, less what weight_bytes counts for no group (a vision tower).
    none, _ = weight_bytes(replace(model, params={}), d.weights_dtype)
    for group, split, stages in groups:
        count = model.params.get(group, 0)
        if count:
            part = weight_bytes(replace(model, params={group: count}), d.weights_dtype)[0] - none
            extra += (part / split - part / d.tp) / stages
    return int(extra)


def router_replicas(model: ModelGeometry, d: Deployment) -> int:
    """Bytes one rank holds beyond an even TP split for the MoE routers, which every rank keeps
    whole: DeepSeek's MoEGate is a plain Parameter (0.5.6 models/deepseek_v2.py:523-525), the others
    a ReplicatedLinear (qwen2_moe.py:169, qwen3_moe.py:123, gpt_oss.py:146, llama4.py:100,
    mixtral.py:81); their layers split over the PP stages."""
    count = model.params.get(ROUTER, 0)
    if not count or d.tp <= 1:
        return 0
    none, _ = weight_bytes(replace(model, params={}), d.weights_dtype)
    part = weight_bytes(replace(model, params={ROUTER: count}), d.weights_dtype)[0] - none
    return int((part - part / d.tp) / max(d.pp, 1))


def dsa_indexer_replicas(model: ModelGeometry, d: Deployment) -> int:
    """Bytes one rank holds beyond what the weights count for a DeepSeek sparse-attention indexer.

    Its wq_b and wk are ReplicatedLinear, whole on every rank in the checkpoint's scheme, and its
    weights_proj an unquantised ReplicatedLinear, in the model dtype and from 0.5.6 in fp32
    (releases.DSA_INDEXER_GATE_FP32; 0.5.6 layers/attention/nsa/nsa_indexer.py:133-156), while the
    count puts all three inside the attention, at its width and split over the attention-TP group.
    """
    dims = model.dims
    attn_params = model.params.get(ATTENTION, 0)
    if dims is None or not dims.dsa_indexer_linear_params or not attn_params:
        return 0
    width = weight_bytes_of(model, ATTENTION) / attn_params
    gate_width = 4 if releases.DSA_INDEXER_GATE_FP32.at(d.engine_version) else model.dtype_bytes
    attn_tp = attention_tp(d)
    layers = max(sum(1 for layer in stage if is_dsa(layer)) for stage in stage_layers(model.layers, d.pp))
    linear = dims.dsa_indexer_linear_params * width * (1 - 1 / attn_tp)
    gate = dims.dsa_indexer_gate_params * (gate_width - width / attn_tp)
    return int((linear + gate) * layers)


def mla_up_proj_copies(model: ModelGeometry, d: Deployment) -> int:
    """Bytes one rank holds for the per-head copies of an MLA model's latent up-projection.

    After loading, post_load_weights splits kv_b_proj into w_kc and w_vc and keeps both as new
    contiguous tensors beside kv_b_proj itself (0.4.3.post4 models/deepseek_v2.py:1217-1221; 0.5.6
    :3639-3657; minicpm3, kimi_linear and longcat_flash alike), so 'Load weight end' counts the
    projection twice. The copies are in the model dtype when kv_b_proj is not fp8, and when an fp8
    kv_b_proj with 128 x 128 blocks is dequantised on CUDA (releases.MLA_FP8_UP_PROJ_DEQUANT); an
    fp8 one otherwise stays fp8 (block_quant_to_tensor_quant, ROCm and 0.4.6 before). kv_b_proj is
    split over the attention-TP group (0.5.6 deepseek_v2.py:1271-1279), its layers over PP stages.
    """
    dims = model.dims
    if dims is None or not dims.mla_kv_up_params or not model.is_mla:
        return 0
    attn_params = model.params.get(ATTENTION, 0)
    # An fp8 checkpoint whose attention is quantised (one byte a parameter); int8 and int4 ones
    # are dequantised to the model dtype (int8_block_dequant, awq_dequantize: 0.5.6 :3524-3541).
    fp8 = dims.checkpoint_quant == "fp8" and 0 < attn_params == weight_bytes_of(model, ATTENTION)
    width = model.dtype_bytes
    if fp8:
        quant = model.quantization or {}
        block = quant.get("weight_block_size")
        card = gpus.find(d.gpu_name)
        cuda = card is None or card.vendor == "nvidia"
        dequant = block == [128, 128] and cuda and releases.MLA_FP8_UP_PROJ_DEQUANT.at(d.engine_version)
        width = model.dtype_bytes if dequant else 1
    layers = max(
        sum(1 for layer in stage if layer.kind == "mla") for stage in stage_layers(model.layers, d.pp)
    )
    return dims.mla_kv_up_params * layers * width // attention_tp(d)


def rope_cache(model: ModelGeometry, d: Deployment) -> int:
    """Bytes of the rotary cos/sin cache every rank builds beside the weights, which 'Load weight end.
    mem usage' counts: one [rope positions, rotary_dim] table per stage (get_rope caches one instance
    per shape, 0.5.7 layers/rotary_embedding.py:2497-2545), kept in fp32 on CUDA "for numerical
    stability" and cast to the model dtype elsewhere (0.4.3.post4 layers/rotary_embedding.py:81-86;
    0.4.7 :82-93; 0.5.7 :112-133). Llama 3.1's 131,072 x 128 table is the 64 MiB the RTX 4090 startup
    (MaxUhl98/Thesis) loads above the checkpoint."""
    dims = model.dims
    if dims is None or dims.rope_positions <= 0 or dims.rotary_dim <= 0:
        return 0
    card = gpus.find(d.gpu_name)
    cuda = card is None or card.vendor == "nvidia"
    return dims.rope_positions * dims.rotary_dim * (4 if cuda else model.dtype_bytes)


def tower_not_built(model: ModelGeometry, d: Deployment) -> int:
    """Bytes of the vision tower one rank does not load under --language-model-only, for the
    architectures that then build none (releases.LM_ONLY_TOWERLESS; 0.5.18 models/qwen3_vl.py:1243-1246
    sets ``self.visual = None``): the tower as weight_bytes counts it, split like the rest."""
    dims = model.dims
    if not d.language_model_only or dims is None or not dims.vision_params:
        return 0
    if model.architecture not in releases.LM_ONLY_TOWERLESS.at(d.engine_version):
        return 0
    # What weight_bytes counts for no group is the tower (the what-if --weights-dtype counts none).
    tower, _ = weight_bytes(replace(model, params={}), d.weights_dtype)
    return tower // max(d.tp, 1)
