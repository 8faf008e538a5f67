"""Architecture rules: the one table of what differs by a config's ``model_type``.

A row of ``ARCHITECTURES`` applies to every model_type that starts with its key, the longest key
winning (``qwen3_next`` over ``qwen3``), so a new variant of a known family (``qwen3_moe``,
``gemma3n``) inherits its family's rules. A row says:

- how to read the config: field ``aliases`` (GPT-2's ``n_layer`` for ``num_hidden_layers``), the
  library ``defaults`` a minimal file omits, the feed-forward width when the file leaves it null;
- which kind each layer is when the file has no ``layer_types``: a ``layer_pattern`` (Gemma's
  sliding/global interleave, Qwen3-Next's linear/full interval) and the window transformers
  assumes when ``sliding_window`` is absent;
- the parameter-count hooks weights.py applies (non-gated MLPs, biases, q/k norms, learned
  position embeddings).

A multimodal wrapper's ``text_config`` leaves its class's defaults out: ``NESTED_DEFAULTS`` holds
them by exact model_type.

Conventions a config names through its own fields hold for every model_type and need no row:
``layer_types`` (``LAYER_TYPE_KINDS``), Nemotron-H's ``hybrid_override_pattern``
(``HYBRID_PATTERN_KINDS``), DeciLM's ``block_configs``, MLA's ``kv_lora_rank``, ``multi_query``
(one KV head), Mistral's global ``sliding_window``. geometry.py builds the layers from these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvwatch.core.errors import ModelConfigError, UnmodelledError
from kvwatch.core.jsontypes import JsonObject, JsonValue

# A layer pattern: the kind of every layer, or None to fall back to the generic window rule.
LayerPattern = Callable[[Mapping[str, Any], int], list[str] | None]

# transformers' defaults for Gemma-family configs that omit them (Gemma2Config, Gemma3TextConfig).
_GEMMA3_SLIDING_WINDOW_PATTERN = 6
_GEMMA3_SLIDING_WINDOW = 4096
_GEMMA2_SLIDING_WINDOW = 4096

# ``layer_types`` names (transformers' spelling and older ones) -> the kinds kvwatch sizes.
LAYER_TYPE_KINDS: dict[str, str] = {
    "full_attention": "full",
    "attention": "full",
    "global": "full",
    "sliding_attention": "sliding",
    "local": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
    "mamba": "mamba",
}

# Nemotron-H ``hybrid_override_pattern``: * = attention, M = Mamba2, - = MLP, E = MoE.
HYBRID_PATTERN_KINDS: dict[str, str] = {"*": "full", "M": "mamba", "-": "none", "E": "none"}
# Nemotron-3.x configs (transformers 5) spell the same pattern as ``layers_block_type``, one name a
# layer: NemotronHConfig's hybrid_override_pattern property joins them back (_list_to_pattern:
# mamba M, moe E, attention *; other copies also mlp -, and linear_attention / full_attention).
_NEMOTRON_BLOCK_CHARS: dict[str, str] = {
    "mamba": "M",
    "linear_attention": "M",
    "attention": "*",
    "full_attention": "*",
    "mlp": "-",
    "moe": "E",
}


def nemotron_pattern(cfg: Mapping[str, JsonValue]) -> str | None:
    """Nemotron-H's layer pattern: ``hybrid_override_pattern``, or a nemotron_h config's
    ``layers_block_type`` list spelled the same way; None for any other config (or a list with a
    block name kvwatch has not read)."""
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:
        return pattern
    blocks = cfg.get("layers_block_type")
    if (
        not str(cfg.get("model_type", "")).startswith("nemotron_h")
        or not isinstance(blocks, list)
        or not blocks
    ):
        return None
    chars = [_NEMOTRON_BLOCK_CHARS.get(b) if isinstance(b, str) else None for b in blocks]
    return "".join(c for c in chars if c is not None) if all(chars) else None


def _every_nth_full(cfg: Mapping[str, Any], n_layers: int) -> list[str] | None:
    """Qwen3-Next / Qwen3.5: every full_attention_interval-th layer is full, the rest Gated DeltaNet."""
    interval = cfg.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0:
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(n_layers)]
    return None


def _gemma3_interleave(cfg: Mapping[str, Any], n_layers: int) -> list[str] | None:
    """Gemma 3: one global layer after every sliding_window_pattern - 1 sliding ones."""
    pattern = cfg.get("sliding_window_pattern") or _GEMMA3_SLIDING_WINDOW_PATTERN
    return ["full" if (i + 1) % int(pattern) == 0 else "sliding" for i in range(n_layers)]


def _gemma2_alternate(cfg: Mapping[str, Any], n_layers: int) -> list[str] | None:
    """Gemma 2: sliding and global layers alternate, sliding first."""
    return ["sliding" if i % 2 == 0 else "full" for i in range(n_layers)]


def _qwen2_window_layers(cfg: Mapping[str, Any], n_layers: int) -> list[str] | None:
    """Qwen2: with the window on, layers from max_window_layers on use it."""
    max_window_layers = cfg.get("max_window_layers")
    if (
        cfg.get("sliding_window") is not None
        and cfg.get("use_sliding_window") is not False
        and isinstance(max_window_layers, int)
    ):
        return ["sliding" if i >= max_window_layers else "full" for i in range(n_layers)]
    return None


@dataclass(frozen=True)
class Architecture:
    """The rules of one model_type family (see the module docstring)."""

    # --- reading the config
    # canonical (transformers) field name -> the name this family's config.json uses
    aliases: Mapping[str, str] = field(default_factory=dict)
    # transformers' class defaults for fields a minimal file omits
    defaults: Mapping[str, JsonValue] = field(default_factory=dict)
    # a multimodal wrapper of exactly this model_type: the model_type its text_config omits
    text_model_type: str | None = None
    # intermediate_size = this x hidden_size when the file leaves it absent or null (GPT-2's n_inner)
    inner_size_multiple: int | None = None
    # --- layers
    layer_pattern: LayerPattern | None = None
    default_window: int | None = None
    # --- parameter-count hooks (weights.py)
    mlp_matrices: int = 3  # gate, up, down; 2 for non-gated MLPs (relu2, GELU)
    qkv_bias: bool = False  # q/k/v biases whatever attention_bias says
    qk_norm: bool = False  # q_norm / k_norm of head_dim each
    gated_attention: bool = False  # q_proj also produces the output gate
    linear_bias: bool = False  # every linear (attention and MLP) has a bias
    norm_bias: bool = False  # LayerNorm with a bias beside its weight
    learned_positions: bool = False  # an absolute position table of max_position_embeddings x hidden


GENERIC = Architecture()

# GPT2Config / GPTBigCodeConfig attribute_map, plus n_inner for the feed-forward width.
_GPT2_ALIASES: dict[str, str] = {
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head",
    "hidden_size": "n_embd",
    "max_position_embeddings": "n_positions",
    "intermediate_size": "n_inner",
}
# GPT-2 and GPTBigCode are one layout (see their entries below).
_GPT2 = Architecture(
    aliases=_GPT2_ALIASES,
    inner_size_multiple=4,
    mlp_matrices=2,
    linear_bias=True,
    norm_bias=True,
    learned_positions=True,
)

ARCHITECTURES: dict[str, Architecture] = {
    "qwen2": Architecture(layer_pattern=_qwen2_window_layers, qkv_bias=True),
    "qwen3": Architecture(layer_pattern=_every_nth_full, qk_norm=True),
    "qwen3_next": Architecture(layer_pattern=_every_nth_full, qk_norm=True, gated_attention=True),
    "qwen3_5": Architecture(layer_pattern=_every_nth_full, qk_norm=True, gated_attention=True),
    "gemma2": Architecture(layer_pattern=_gemma2_alternate, default_window=_GEMMA2_SLIDING_WINDOW),
    "gemma3": Architecture(
        layer_pattern=_gemma3_interleave,
        default_window=_GEMMA3_SLIDING_WINDOW,
        qk_norm=True,
        text_model_type="gemma3_text",
    ),
    "gemma3_text": Architecture(
        layer_pattern=_gemma3_interleave,
        default_window=_GEMMA3_SLIDING_WINDOW,
        qk_norm=True,
        defaults={
            "vocab_size": 262208,
            "max_position_embeddings": 131072,
            "tie_word_embeddings": True,
            "sliding_window": _GEMMA3_SLIDING_WINDOW,
            "sliding_window_pattern": _GEMMA3_SLIDING_WINDOW_PATTERN,
        },
    ),
    "gemma4": Architecture(qk_norm=True),
    "nemotron_h": Architecture(mlp_matrices=2),  # relu2
    "opt": Architecture(mlp_matrices=2),
    # Two-matrix GELU MLPs (fc1/fc2, dense_h_to_4h/4h_to_h, c_fc/c_proj), as vLLM's model files load
    # them (models/phi.py PhiMLP, gpt_neox.py, falcon.py, starcoder2.py, bloom.py, mpt.py, gpt_j.py):
    # phi-2 loads 5.19 GiB, not the 6.74 a gate would make (tests/apriori).
    "phi": Architecture(mlp_matrices=2),
    "phi3": Architecture(),  # Phi-3/Phi-4: gated gate_up_proj
    "phimoe": Architecture(),
    "gpt_neox": Architecture(mlp_matrices=2),
    "falcon": Architecture(mlp_matrices=2),
    "falcon_h1": Architecture(),
    "falcon_mamba": Architecture(),
    "starcoder2": Architecture(mlp_matrices=2),
    "bloom": Architecture(mlp_matrices=2),
    "mpt": Architecture(mlp_matrices=2),
    "gptj": Architecture(mlp_matrices=2),
    "codegen": Architecture(mlp_matrices=2),
    # GPT-2 and GPTBigCode (StarCoder, SantaCoder; multi_query: true = one KV head): transformers'
    # attribute_map names, n_inner null = 4 x n_embd, Conv1D/Linear biases everywhere, LayerNorm,
    # a learned position table (modeling_gpt2.py, modeling_gpt_bigcode.py).
    "gpt2": _GPT2,
    "gpt_bigcode": _GPT2,
}


# transformers' class defaults a multimodal wrapper's text_config leaves out, by the text_config's
# exact model_type. A nested config is saved as its diff against its own class's defaults
# (configuration_utils.py to_diff_dict -> recursive_diff_dict, `value != default[key]`), while a
# top-level file keeps every model field (diffed against PreTrainedConfig's only), so only a nested
# one is filled; a top-level file missing a field is still refused.
NESTED_DEFAULTS: dict[str, Mapping[str, JsonValue]] = {
    # Gemma3TextConfig (transformers 5.24 models/gemma3/configuration_gemma3.py:66-72): gemma-3-4b-it's
    # text_config names only hidden_size, intermediate_size, num_hidden_layers and sliding_window.
    "gemma3_text": {
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
    },
    # LlamaConfig (transformers 5.24 models/llama/configuration_llama.py:63-78; num_key_value_heads
    # and head_dim left None there follow the heads, as geometry.py reads them): llava-1.5-7b-hf's
    # text_config (a Vicuna-7B) names only max_position_embeddings, rms_norm_eps and vocab_size.
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    },
    # MistralConfig (transformers 5.24 models/mistral/configuration_mistral.py:62-79): Mistral-Small
    # 3.1's text_config (Mistral3ForConditionalGeneration) leaves out tie_word_embeddings, so its
    # 1.25 GiB lm_head is its own (the llm-d and llm-d-benchmark logs load 44.76 GiB, not 43.45).
    "mistral": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "sliding_window": 4096,
    },
}


# Families whose layers are plain (grouped-query or MLA) attention read from the standard fields, no
# row needed: what `not calibrated: architecture ...` does not name. A model_type under none of these
# prefixes and no row above is still sized from the standard fields, and the prediction says so.
STANDARD_MODEL_TYPES: frozenset[str] = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "kimi_k2",
        "glm",
        "internlm",
        "granite",
        "olmo",
        "cohere",
        "exaone",
        "minimax_m2",
        "baichuan",
        "gpt_oss",
        "ernie",
        "hunyuan",
        "seed_oss",
        "smollm",
        "stablelm",
        "yi",
    }
)

# Fields that describe layers kvwatch does not read (Jamba's attention period, Zamba's and MiniMax's
# per-layer block types, Kimi-Linear's linear-attention config, DeepSeek-V4's compressed attention):
# a config carrying one would be sized as plain attention on every layer, so it is refused by name.
UNREAD_LAYOUT_KEYS: tuple[str, ...] = (
    "layers_block_type",
    "layer_block_types",
    "attn_type_list",
    "linear_attn_config",
    "full_attn_idxs",
    "attn_layer_indices",
    "attn_layer_period",
    "block_types",
    "ssm_cfg",
    "compress_ratios",
)


def is_read(model_type: str) -> bool:
    """Whether kvwatch has read this model_type's family (a row above or a standard family)."""
    keys = (*ARCHITECTURES, *STANDARD_MODEL_TYPES)
    return any(model_type.startswith(key) for key in keys)


def unread_layout(cfg: Mapping[str, JsonValue]) -> str | None:
    """The first field of UNREAD_LAYOUT_KEYS the config carries, if any (Nemotron-H's
    layers_block_type is read: nemotron_pattern)."""
    read = {"layers_block_type"} if nemotron_pattern(cfg) is not None else set()
    return next((k for k in UNREAD_LAYOUT_KEYS if k not in read and cfg.get(k) not in (None, [], {})), None)


def architecture(model_type: str) -> Architecture:
    """The row whose key is the longest prefix of model_type (GENERIC when none is)."""
    best = max((key for key in ARCHITECTURES if model_type.startswith(key)), key=len, default=None)
    return GENERIC if best is None else ARCHITECTURES[best]


def wrapper_text_model_type(model_type: str) -> str | None:
    """The model_type a multimodal wrapper of exactly ``model_type`` implies for its text_config."""
    row = ARCHITECTURES.get(model_type)
    return row.text_model_type if row is not None else None


def nested_defaults(model_type: str) -> Mapping[str, JsonValue]:
    """The class defaults a wrapper's text_config of exactly ``model_type`` leaves out (by exact
    model_type, not prefix: Llama 4's text_config is not Llama 2's class)."""
    return NESTED_DEFAULTS.get(model_type, {})


def normalise(cfg: JsonObject) -> JsonObject:
    """Fill in the library defaults, the aliased fields and a null feed-forward width, in place."""
    row = architecture(str(cfg.get("model_type") or ""))
    for key, value in row.defaults.items():
        cfg.setdefault(key, value)
    for canonical, alias in row.aliases.items():
        if canonical not in cfg and alias in cfg:
            cfg[canonical] = cfg[alias]
    hidden = cfg.get("hidden_size")
    if row.inner_size_multiple and cfg.get("intermediate_size") is None and isinstance(hidden, int):
        cfg["intermediate_size"] = row.inner_size_multiple * hidden
    return cfg


def layer_kinds(config: Mapping[str, JsonValue], n_layers: int) -> list[str]:
    """The attention kind of every layer, from whichever convention the config uses."""
    # config.json is a document of any shape: read dynamically here, each value checked.
    cfg: Mapping[str, Any] = config
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        if len(types) != n_layers:
            raise ModelConfigError(
                f"config.json layer_types has {len(types)} entries but num_hidden_layers is {n_layers}"
            )
        kinds = []
        for t in types:
            if t not in LAYER_TYPE_KINDS:
                raise UnmodelledError(f"config.json layer_types has {t!r}, a layer kind kvwatch cannot size")
            kinds.append(LAYER_TYPE_KINDS[t])
        return kinds
    row = architecture(str(cfg.get("model_type") or ""))
    if row.layer_pattern is not None:
        pattern = row.layer_pattern(cfg, n_layers)
        if pattern is not None:
            return pattern
    if cfg.get("sliding_window") is not None and cfg.get("use_sliding_window") is not False:
        # Mistral-style: one global window on every layer.
        return ["sliding"] * n_layers
    return ["full"] * n_layers


def sliding_window(cfg: Mapping[str, JsonValue]) -> int:
    """The window of the sliding layers: the config's, else the family's library default."""
    window = cfg.get("sliding_window")
    if window is None:
        default = architecture(str(cfg.get("model_type") or "")).default_window
        if default is not None:
            return default
        raise ModelConfigError("config.json has sliding-window layers but no 'sliding_window'")
    if not isinstance(window, int) or window <= 0:
        raise ModelConfigError(
            f"config.json field 'sliding_window' must be a positive integer, got {window!r}"
        )
    return window
