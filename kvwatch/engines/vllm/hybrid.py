"""vLLM's hybrid (Mamba / linear-attention) models and speculative drafters: how many tokens a drafter
proposes and which layers it adds, the mamba_cache_mode prefix caching sets, the blocks a state
layer takes per request, the recurrent state's dtype and the attention block raised to hold a state.

budget.py groups and divides the pool with these; rows that change by release are in releases.py.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal

from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.model import LayerSpec, ModelGeometry, ceil_div
from kvwatch.engines.vllm import releases

# The smallest attention kernel block: FlashAttention's MultipleOf(16) (0.25.1 platforms/interface.py
# _align_hybrid_block_size takes max(the backend's smallest, block_size); 0.19.0 a constant 16).
KERNEL_BLOCK_ALIGNMENT = 16
# Model classes implementing SupportsMambaPrefixCaching, which prefix caching puts in
# mamba_cache_mode 'all' (0.25.1 model_executor/models/falcon_h1.py:496, granitemoehybrid.py:572,
# jamba.py:463, mamba.py:173, mamba2.py:170, nemotron_h.py:776, zamba2.py:807; 0.19.0 bamba.py:396).
# Gated DeltaNet (Qwen3-Next, Qwen3.5), KDA, MiniMax and the rest take 'align'.
MAMBA_PREFIX_CACHING_ARCHS = frozenset(
    {
        "BambaForCausalLM",
        "FalconH1ForCausalLM",
        "FalconMambaForCausalLM",
        "GraniteMoeHybridForCausalLM",
        "JambaForCausalLM",
        "MambaForCausalLM",
        "Mamba2ForCausalLM",
        "NemotronHForCausalLM",
        "Zamba2ForCausalLM",
    }
)
# Models built on MambaMixer2 (0.33.0 model_executor/models/falcon_h1.py, granitemoehybrid.py,
# mamba2.py, nemotron_h.py, zamba2.py; bamba.py in 0.19.0), whose align-mode state keeps a
# prefill-checkpoint block from 0.32 (releases.MAMBA2_PREFILL_CHECKPOINT).
MAMBA2_MIXER_ARCHS = frozenset(
    {
        "BambaForCausalLM",
        "FalconH1ForCausalLM",
        "GraniteMoeHybridForCausalLM",
        "Mamba2ForCausalLM",
        "NemotronHForCausalLM",
        "Zamba2ForCausalLM",
    }
)
# Architectures whose config hook picks the recurrent state's dtype (MODELS_CONFIG_MAP, 0.19.0
# model_executor/models/config.py:738-739 and :746-747); every other model keeps mamba_ssm_cache_dtype
# 'auto', the model dtype (layers/mamba/mamba_utils.py _mamba_state_dtype, 0.25.1 :84-96).
NEMOTRON_H_ARCHS = frozenset({"NemotronHForCausalLM", "NemotronHPuzzleForCausalLM"})
QWEN3_5_ARCHS = frozenset({"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"})
# Mamba1 has no chunk: vLLM takes 2048 (config/model.py get_mamba_chunk_size, 0.25.1 :1432-1435).
DEFAULT_MAMBA_CHUNK = 2048

MambaCacheMode = Literal["none", "align", "all"]


def is_mtp(method: str | None) -> bool:
    """Whether a speculative method is a multi-token-prediction head of the target's checkpoint:
    'mtp' and every '<model>_mtp' of MTPModelTypes (0.25.1 config/speculative.py:36-57; 0.20.1
    :34-51), which vLLM folds into 'mtp' (0.25.1 :652-656)."""
    return method is not None and (method == "mtp" or method.endswith("_mtp"))


def speculative_tokens(model: ModelGeometry, d: Deployment) -> int:
    """Tokens the drafter proposes a step: the user's num_speculative_tokens, else for MTP the
    checkpoint's n_predict (mtp_num_hidden_layers / num_nextn_predict_layers, 0.25.1
    config/speculative.py:498-515 and :919-926); 0 without speculative decoding."""
    if d.num_speculative_tokens is not None:
        return d.num_speculative_tokens
    if is_mtp(d.speculative_method):
        return max(model.mtp_layers, 1)
    return 0


def with_drafter(model: ModelGeometry, d: Deployment) -> ModelGeometry:
    """The target's layers as speculation changes them: every GDN / Mamba conv state widened by
    the proposed tokens (0.25.1 model_executor/layers/mamba/mamba_utils.py:218-228, num_spec from
    qwen3_5.py:530-542; 0.20.1 qwen3_5.py:729-741)."""
    num_spec = speculative_tokens(model, d)
    if not num_spec:
        return model
    layers = tuple(
        replace(layer, state_conv_width=layer.state_conv_width + num_spec)
        if layer.kind in ("linear", "mamba") and layer.state_conv_width
        else layer
        for layer in model.layers
    )
    return replace(model, layers=layers)


def drafter_layers(model: ModelGeometry, d: Deployment) -> list[LayerSpec]:
    """The drafter's attention layers, whose caches join the pool beside the target's.

    They register in the same forward context, so get_kv_cache_spec gives them specs of their own
    and they join the KV cache groups (0.25.1 v1/worker/gpu_model_runner.py load_model :5231-5235
    loads the drafter with the target). An MTP drafter is the checkpoint's mtp_num_hidden_layers
    full-attention decoder layers (0.25.1 model_executor/models/qwen3_5_mtp.py:79 and :105-112;
    0.20.1 :73 and :100-104), shaped as the target's full-attention layers; it runs on the last
    stage (its lm_head only there, :218-231). A non-MTP drafter's own layers (EAGLE, DFlash: a
    separate checkpoint) are not read.
    """
    if not is_mtp(d.speculative_method):
        return []
    attention = next((layer for layer in model.layers if layer.kind in ("full", "mla")), None)
    return [attention] * model.mtp_layers if attention is not None else []


def prefix_caching(d: Deployment) -> bool:
    """Whether a hybrid model runs with prefix caching: --enable-prefix-caching /
    --no-enable-prefix-caching as given, else the release's default for hybrid models, off up to
    0.25 and on from 0.26 (releases.HYBRID_PREFIX_CACHING; engine/arg_utils.py
    _set_default_chunked_prefill_and_prefix_caching_args, 0.25.1 :2514-2515)."""
    if d.enable_prefix_caching is not None:
        return d.enable_prefix_caching
    return releases.HYBRID_PREFIX_CACHING.at(d.engine_version)


def mamba_cache_mode(model: ModelGeometry, d: Deployment) -> MambaCacheMode:
    """vLLM's mamba_cache_mode for a hybrid model (MambaModelConfig.verify_and_update_config).

    Without prefix caching 'none'. With it, from 0.15, a model with Mamba prefix caching support
    (MAMBA_PREFIX_CACHING_ARCHS) takes 'all' up to 0.27 -- 'align' in 0.20-0.21 under speculative
    decoding -- and every other model 'align' (0.25.1 model_executor/models/config.py:558-597;
    0.20.0 :351-377; 0.28.0 :602-609 'align' for all). 0.12-0.14 have no modes: prefix caching keeps
    a supporting model's state per block ('all', no speculative blocks) and is switched off for the
    rest (0.14.0 model_executor/models/config.py:332-352); 0.11 switches it off for every hybrid model
    (0.11.0 :294-296).
    """
    version = d.engine_version
    rule = releases.MAMBA_STATE_BLOCKS.at(version)
    if rule == "page" or not prefix_caching(d):
        return "none"
    supports = model.architecture in MAMBA_PREFIX_CACHING_ARCHS
    if rule == "mamba_block":
        return "all" if supports else "none"
    if not supports or not releases.MAMBA_ALL_MODE_DEFAULT.at(version):
        return "align"
    if speculative_tokens(model, d) and releases.SPECULATIVE_ALIGN.at(version):
        return "align"
    return "all"


def state_blocks_per_request(model: ModelGeometry, d: Deployment) -> tuple[int, bool]:
    """(blocks, per_token) a state layer's group takes per request: MambaSpec.max_memory_usage_bytes.

    'none': 1 + one per proposed token; 'align': 2 + one per proposed token; 'all': a block per
    block_size tokens of max_model_len (per_token True), plus the speculative ones from 0.22
    (0.25.1 v1/kv_cache_interface.py:688-697; 0.21.0 :562-566; releases.ALL_MODE_SPECULATIVE_BLOCKS).
    0.11 counts one page whatever is proposed (0.11.0 :235), 0.12-0.14 cdiv(max_model_len,
    mamba_block_size), one block without prefix caching (mamba_block_size = max_model_len) and no
    speculative blocks (0.14.0 :292-294).
    """
    version = d.engine_version
    rule = releases.MAMBA_STATE_BLOCKS.at(version)
    mode = mamba_cache_mode(model, d)
    spec = speculative_tokens(model, d)
    if rule == "page":
        return 1, False
    if rule == "mamba_block":
        return (0, True) if mode == "all" else (1, False)
    if mode == "all":
        return (spec if releases.ALL_MODE_SPECULATIVE_BLOCKS.at(version) else 0), True
    if mode == "none":
        return 1 + spec, False
    # 'align': 2 + spec + num_prefill_checkpoint_blocks, 1 for a MambaMixer2 layer from 0.32
    # (0.33.0 v1/kv_cache_interface.py:1135-1139, layers/mamba/mamba_mixer2.py:1108-1118). A Gated
    # DeltaNet layer exports checkpoints only on some prefill backends (0.33.0
    # layers/mamba/gdn/qwen_gdn_linear_attn.py:740-760): not counted.
    checkpoint = model.architecture in MAMBA2_MIXER_ARCHS and releases.MAMBA2_PREFILL_CHECKPOINT.at(version)
    return 2 + spec + int(checkpoint), False


def ssm_fp32(model: ModelGeometry, layer: LayerSpec, d: Deployment) -> bool:
    """Whether vLLM keeps a state layer's recurrent (temporal) state in float32.

    mamba_ssm_cache_dtype 'auto' keeps it in the conv state's dtype, the model's (layers/mamba/
    mamba_utils.py:84-96 @0.25.1). Two config hooks change it: Qwen3.5 takes config.json's
    mamba_ssm_dtype from 0.17 (Qwen3_5ForConditionalGenerationConfig, 0.19.0 model_executor/models/
    config.py:663-690), Nemotron-H config.json's mamba_ssm_cache_dtype, else float16 up to 0.19 and
    float32 from 0.20 (NemotronHForCausalLMConfig, 0.19.0 :483-500; 0.25.1 :606-625)."""
    if model.architecture in QWEN3_5_ARCHS:
        return layer.state_ssm_fp32 and releases.QWEN3_5_SSM_DTYPE.at(d.engine_version)
    if model.architecture in NEMOTRON_H_ARCHS:
        if layer.state_ssm_cache_dtype:
            return layer.state_ssm_cache_dtype == "float32"
        return releases.NEMOTRON_H_SSM_FP32.at(d.engine_version)
    return False


def state_block(model: ModelGeometry, d: Deployment, elem_bytes: int, block: int) -> tuple[int, int] | None:
    """(attention block size, state bytes) of a hybrid model whose state shapes the config gives.

    platforms/interface.py _align_hybrid_block_size (0.25.1 :750-912; 0.21.0 :505-668; 0.19.0
    model_executor/models/config.py HybridAttentionMambaModelConfig): the attention page must hold one
    layer's state, so the block grows to align x ceil(state / (align x attention bytes per token)),
    align = max(the backend's kernel block, 16, block_size); in mamba_cache_mode 'all' to a multiple
    of lcm(the Mamba2 chunk size, align) (0.25.1 :869-877). The state page is padded to that page.
    The conv state is in the model dtype (mamba_cache_dtype 'auto'), the recurrent one as ssm_fp32
    says (Qwen3.5: 1056 tokens at TP 1 bf16, 2096 with an fp8 KV cache, as their startups log). None:
    no state layers, a shape the config leaves out, or attention layers of different widths (not
    modelled).
    """
    states = [layer for layer in model.layers if layer.kind in ("linear", "mamba")]
    paged = [layer for layer in model.layers if layer.is_paged]
    if not states or not paged or any(not layer.state_heads for layer in states):
        return None
    widths = {layer.bytes_per_token(d.tp, elem_bytes) for layer in paged}
    if len(widths) != 1:
        return None
    per_token = widths.pop()
    state = max(layer.state_bytes(d.tp, model.dtype_bytes, ssm_fp32(model, layer, d)) for layer in states)
    align = max(KERNEL_BLOCK_ALIGNMENT, block)
    if mamba_cache_mode(model, d) == "all":
        chunk = max(layer.state_chunk for layer in states) or DEFAULT_MAMBA_CHUNK
        step = math.lcm(chunk, align)
        return max(block, step * ceil_div(ceil_div(state, per_token), step)), state
    return max(block, align * ceil_div(state, align * per_token)), state
