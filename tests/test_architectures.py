"""The architecture table (kvwatch/capacity/architectures.py): lookup and the rules it feeds.

The figures each row produces for a real checkpoint are in test_capacity.py (bytes per token) and
below (parameter counts against the published sizes).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvwatch.analysis.predict import predict
from kvwatch.capacity.architectures import ARCHITECTURES, GENERIC, architecture, wrapper_text_model_type
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.dims import ATTENTION, EXPERTS, LM_HEAD, MIXER, ROUTER, SHARED
from kvwatch.capacity.geometry import geometry_from_config, load_model
from kvwatch.capacity.weights import weight_bytes_of
from kvwatch.core.errors import ModelConfigError, UnmodelledError
from kvwatch.core.jsontypes import JsonObject
from kvwatch.core.kinds import EngineName


@pytest.mark.parametrize(
    ("model_type", "row"),
    [
        ("qwen3", "qwen3"),
        ("qwen3_moe", "qwen3"),
        ("qwen3_next", "qwen3_next"),
        ("qwen3_5_moe", "qwen3_5"),
        ("qwen2_5_vl", "qwen2"),
        ("gemma3n_text", "gemma3"),
        ("gemma3_text", "gemma3_text"),
    ],
)
def test_the_longest_key_that_prefixes_the_model_type_wins(model_type: str, row: str) -> None:
    assert architecture(model_type) is ARCHITECTURES[row]


@pytest.mark.parametrize("model_type", ["llama", "mistral", "deepseek_v3", ""])
def test_a_model_type_without_a_row_gets_the_generic_rules(model_type: str) -> None:
    assert architecture(model_type) is GENERIC


def test_the_wrapper_rule_needs_the_exact_model_type() -> None:
    assert wrapper_text_model_type("gemma3") == "gemma3_text"
    assert wrapper_text_model_type("gemma3n") is None
    assert wrapper_text_model_type("llava") is None


# --- unknown is said, never guessed as zero -------------------------------------------------------

_TESTS = Path(__file__).parent
_BASE: JsonObject = {
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "hidden_size": 512,
    "intermediate_size": 1024,
}


def _every_config_in_tests() -> list[Path]:
    """Every config.json-like file under tests/ (model_configs, apriori and its public cases, any other)."""
    out = []
    for path in sorted(_TESTS.rglob("*.json")):
        if path.name == "manifest.json" or path.name.endswith((".summary.json", ".events.json")):
            continue
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(raw, dict) and ("model_type" in raw or "architectures" in raw):
            out.append(path)
    return out


CONFIGS = _every_config_in_tests()


def test_the_walk_finds_the_configs() -> None:
    assert len(CONFIGS) >= 28


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(_TESTS)))
def test_no_config_in_tests_is_sized_at_zero_bytes_per_token(path: Path, engine: EngineName) -> None:
    """Each config is either sized above 0 B per token or refused with the unknown thing named."""
    try:
        model = load_model(path)
        d = Deployment(engine=engine, engine_version=None, gpu_memory_bytes=80 * 2**30, max_model_len=4096)
        pred = predict(model, d)
    except ModelConfigError as exc:
        # Refused by name: what kvwatch has no rule for (unmodelled) or the field a config lacks.
        assert exc.prediction_state in ("unmodelled", "bad_model_config", "unsupported_model")
        assert str(exc) and "\n" not in str(exc) and ("'" in str(exc) or "model_type" in str(exc))
        return
    assert pred.bytes_per_token > 0
    assert pred.weights_bytes is not None and pred.weights_bytes > 0


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        # Jamba: attention every attn_layer_period-th layer, Mamba between (read as attention everywhere before).
        ({"model_type": "jamba", "attn_layer_period": 8, "attn_layer_offset": 4}, "attn_layer_period"),
        ({"model_type": "minimax_text_01", "attn_type_list": [0, 1, 0, 1]}, "attn_type_list"),
        ({"model_type": "kimi_linear", "linear_attn_config": {"kda_layers": [1, 2]}}, "linear_attn_config"),
        # A state-only model: sized at 0 B per token before.
        ({"model_type": "mamba2", "layer_types": ["mamba"] * 4}, "state-only"),
        ({"model_type": "llama", "layer_types": ["full_attention", "ring_attention"] * 2}, "ring_attention"),
        # Quantisation methods kvwatch cannot weigh: weighed as unquantised before.
        ({"model_type": "llama", "quantization_config": {"quant_method": "hqq"}}, "'hqq'"),
        ({"model_type": "llama", "quantization_config": {"bits": 4}}, "no quant_method"),
        ({"model_type": "llama", "quantization_config": {"quant_method": "gptq", "bits": 3}}, "3-bit"),
        # MIXED_PRECISION without its per-layer map, or with a layer or algorithm kvwatch cannot place.
        (
            {
                "model_type": "llama",
                "quantization_config": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"},
            },
            "MIXED_PRECISION",
        ),
        (
            {
                "model_type": "llama",
                "quantization_config": {
                    "quant_method": "modelopt",
                    "quant_algo": "MIXED_PRECISION",
                    "quantized_layers": {"model.layers.0.self_attn.q_proj": {"quant_algo": "W4A8_AWQ"}},
                },
            },
            "W4A8_AWQ",
        ),
        (
            {
                "model_type": "llama",
                "quantization_config": {
                    "quant_method": "modelopt",
                    "quant_algo": "MIXED_PRECISION",
                    "quantized_layers": {"model.layers.0.router_logits": {"quant_algo": "FP8"}},
                },
            },
            "router_logits",
        ),
        # A mixed fp8/fp4 checkpoint: weighed as if every tensor were the first group's (fp8) before.
        (
            {
                "model_type": "llama",
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "config_groups": {
                        "attn": {
                            "targets": ["re:.*self_attn.*"],
                            "weights": {"num_bits": 8, "type": "float"},
                        },
                        "experts": {
                            "targets": ["re:.*experts.*"],
                            "weights": {"num_bits": 4, "type": "float"},
                        },
                    },
                },
            },
            "mixes weight formats",
        ),
    ],
)
def test_what_kvwatch_cannot_size_is_refused_by_name(extra: JsonObject, named: str) -> None:
    with pytest.raises(UnmodelledError, match=re.escape(named)) as caught:
        geometry_from_config({**_BASE, **extra})
    assert caught.value.prediction_state == "unmodelled"


@pytest.mark.parametrize(
    ("quant", "scheme"),
    [
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "nvfp4"),
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8"),
        ({"quant_method": "auto-round", "bits": 4, "group_size": 128}, "w4a16"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float"}}},
            },
            "nvfp4",
        ),
    ],
)
def test_quantisation_methods_kvwatch_weighs(quant: JsonObject, scheme: str) -> None:
    model = geometry_from_config({**_BASE, "model_type": "llama", "quantization_config": quant})
    assert model.dims is not None and model.dims.checkpoint_quant == scheme


def test_an_all_sliding_model_costs_its_window_bytes_per_token() -> None:
    """Mistral-style: every layer windowed, none growing: a token in the window still costs bytes."""
    cfg: JsonObject = {**_BASE, "model_type": "mistral", "sliding_window": 4096, "num_key_value_heads": 8}
    pred = predict(
        geometry_from_config(cfg),
        Deployment(engine="vllm", gpu_memory_bytes=80 * 2**30, max_model_len=8192),
    )
    assert pred.bytes_per_token == 4 * 8 * 64 * 2 * 2


def test_nemotron_h_layers_block_type_is_its_hybrid_pattern() -> None:
    """Nemotron-3.x configs list the layer kinds (layers_block_type) where Nemotron-H had a pattern
    string; both describe the same model. A list with a name kvwatch has not read, or the field on
    another model type (Zamba's block types), is still refused by name."""
    path = (
        Path(__file__).parent
        / "apriori/public/configs/nvidia--NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4.json"
    )
    raw = json.loads(path.read_text())
    chars = {"mamba": "M", "attention": "*", "moe": "E", "mlp": "-"}
    listed = geometry_from_config(raw)
    as_pattern = {k: v for k, v in raw.items() if k != "layers_block_type"}
    as_pattern["hybrid_override_pattern"] = "".join(chars[b] for b in raw["layers_block_type"])
    spelled = geometry_from_config(as_pattern)
    assert listed.layers == spelled.layers and listed.params == spelled.params
    assert sum(1 for layer in listed.layers if layer.kind == "full") == raw["layers_block_type"].count(
        "attention"
    )
    # The MoE blocks carry their router and the shared expert (vLLM models/nemotron_h.py:143-190).
    assert listed.params[SHARED] == 23 * 2 * 2688 * 3712 and listed.params[ROUTER] == 23 * 2688 * 128
    with pytest.raises(UnmodelledError, match="layers_block_type"):
        geometry_from_config({**raw, "layers_block_type": [*raw["layers_block_type"][:-1], "wormhole"]})
    with pytest.raises(UnmodelledError, match="layers_block_type"):
        geometry_from_config({**_BASE, "layers_block_type": ["mamba", "hybrid"]})


def test_modelopt_mixed_precision_weighs_each_group_as_its_layers_say() -> None:
    """nvidia/Qwen3.6-35B-A3B-NVFP4 (tests/apriori/public/configs): FP8 attention and linear-attention
    projections, NVFP4 (weight-only W4A16) routed and shared experts and lm_head; the rest (embedding,
    norms, vision tower) in bf16. Each group costs its own scheme, not the headline one."""
    path = Path(__file__).parent / "apriori/public/configs/nvidia--Qwen3.6-35B-A3B-NVFP4.json"
    m = load_model(path)
    assert m.dims is not None and m.dims.checkpoint_quant == "nvfp4"
    groups = dict(m.dims.group_quant)
    assert groups[ATTENTION] == groups[MIXER] == "fp8"
    assert groups[EXPERTS] == groups[SHARED] == groups[LM_HEAD] == "nvfp4"
    assert weight_bytes_of(m, ATTENTION) == m.params[ATTENTION]  # one byte a parameter
    assert weight_bytes_of(m, EXPERTS) == int(m.params[EXPERTS] * 4.5 // 8)
    assert weight_bytes_of(m, LM_HEAD) == int(m.params[LM_HEAD] * 4.5 // 8)
    # vLLM's loader: the same split, the head quantised too.
    d = Deployment(engine="vllm", engine_version="0.24.0", gpu_name="RTX-5090-32GB", max_model_len=8192)
    vllm = predict(m, d.with_(gpu_memory_bytes=32 * 1024**3)).weights_bytes
    flat = predict(m, d.with_(gpu_memory_bytes=32 * 1024**3, weights_dtype="nvfp4")).weights_bytes
    assert vllm is not None and flat is not None
    # Against every linear at NVFP4 and a bf16 head: FP8 attention and mixers cost 1 - 0.5625 B a
    # parameter more, the NVFP4 head 2 - 0.5625 B a row element less.
    rows = -(-m.dims.vocab_size // 64) * 64
    more = (m.dims.attention_params + m.dims.mixer_params) * (1 - 0.5625)
    less = rows * m.dims.hidden_size * (2 - 0.5625)
    assert abs(vllm - (flat + more - less)) < 1024**2
