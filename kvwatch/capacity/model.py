"""What the capacity model knows about a checkpoint: one ``LayerSpec`` per decoder layer in a ``ModelGeometry``.

The types only, with the arithmetic that follows from them (bytes per token, pipeline stages).
geometry.py builds them from a config.json, weights.py counts their bytes; both import this module
and neither imports the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kvwatch.capacity.dims import ModelDims
from kvwatch.core.jsontypes import JsonValue

LayerKind = Literal["full", "sliding", "chunked", "mla", "linear", "mamba", "none"]

# Layers whose cache grows with every token of context.
GROWING_KINDS: frozenset[str] = frozenset({"full", "mla"})
# Layers that keep a per-token cache (growing or windowed) the engines page in blocks.
PAGED_KINDS: frozenset[str] = frozenset({"full", "mla", "sliding", "chunked"})


@dataclass(frozen=True)
class LayerSpec:
    """The KV state of one decoder layer, before tensor parallelism.

    ``num_kv_heads`` is the model's total (MLA: 1, the latent is not per head); ``head_size_k`` and
    ``head_size_v`` are the stored widths (MLA: the latent width and 0, as vLLM's MLAAttentionSpec
    and SGLang's MLA pool do). ``extra_bytes_per_token`` is per-token state stored outside K/V in
    bytes (the DeepSeek sparse-attention indexer key).
    """

    kind: LayerKind
    num_kv_heads: int = 0
    head_size_k: int = 0
    head_size_v: int = 0
    window: int | None = None
    extra_bytes_per_token: int = 0
    # Fixed per-request state of a linear-attention / Mamba layer, before TP: conv channels and the
    # conv window kept (kernel - 1), state heads and elements per head (GDN v_dim x k_dim, Mamba2
    # head_dim x state_size), and whether the recurrent state is kept in fp32 (mamba_ssm_dtype).
    state_conv_channels: int = 0
    state_conv_width: int = 0
    state_heads: int = 0
    state_head_elems: int = 0
    state_ssm_fp32: bool = False
    # Mamba2: B/C groups and state size, whose 2 x groups x state conv channels both engines widen
    # when TP does not divide the groups (see conv_channels), and the SSD kernel's chunk size
    # (mamba_chunk_size / chunk_size; 0 when the config names none).
    state_groups: int = 0
    state_size: int = 0
    state_chunk: int = 0
    # config.json's mamba_ssm_cache_dtype (Nemotron-H's name for the recurrent state's dtype), as given.
    state_ssm_cache_dtype: str = ""

    @property
    def is_paged(self) -> bool:
        return self.kind in PAGED_KINDS

    @property
    def grows(self) -> bool:
        return self.kind in GROWING_KINDS

    def conv_channels(self, tp: int) -> int:
        """Conv-state channels on one rank. A Mamba2 layer whose groups TP does not divide gets
        tp - n_groups groups more, so every head shard keeps its group (vLLM
        model_executor/layers/mamba/mamba_utils.py:174-177 and extra_groups_for_head_shards :201-210
        @0.25.1; SGLang configs/mamba_utils.py:29 and :219 @0.5.23)."""
        channels = self.state_conv_channels
        if self.state_groups and self.state_groups % tp:
            channels += 2 * (tp - self.state_groups) * self.state_size
        return channels // tp

    def state_bytes(self, tp: int, elem_bytes: int, ssm_fp32: bool | None = None) -> int:
        """One request's state in this layer on one rank (0 when its shape is not known): the conv
        window in the model dtype, the recurrent state in fp32 where the config says so (``ssm_fp32``:
        the engine's own choice instead)."""
        fp32 = self.state_ssm_fp32 if ssm_fp32 is None else ssm_fp32
        conv = self.conv_channels(tp) * self.state_conv_width * elem_bytes
        ssm = max(1, self.state_heads // tp) * self.state_head_elems * (4 if fp32 else elem_bytes)
        return conv + ssm if self.state_heads else 0

    def heads_per_rank(self, tp: int) -> int:
        """KV heads one tensor-parallel rank stores: max(1, h_kv // tp); MLA latents are not split."""
        if self.kind == "mla":
            return 1
        return max(1, self.num_kv_heads // tp)

    def bytes_per_token(self, tp: int, elem_bytes: float) -> int:
        """Cache bytes this layer stores per token on one rank (0 for fixed-state layers)."""
        if not self.is_paged:
            return 0
        return (
            int(self.heads_per_rank(tp) * (self.head_size_k + self.head_size_v) * elem_bytes)
            + self.extra_bytes_per_token
        )


@dataclass(frozen=True)
class ModelGeometry:
    """What the capacity model needs to know about a checkpoint."""

    name: str
    architecture: str
    model_type: str
    dtype: str
    dtype_bytes: int
    layers: tuple[LayerSpec, ...]
    hidden_size: int
    num_attention_heads: int
    vocab_size: int | None
    max_position_embeddings: int | None
    params: Mapping[str, int]
    quantization: Mapping[str, JsonValue] | None
    safetensors_total_size: int | None = None
    # rope_scaling that extends the context beyond max_position_embeddings (yarn, dynamic, linear).
    rope_scaled: bool = False
    source: str = ""
    notes: tuple[str, ...] = field(default=())
    # The shapes that set the non-KV memory (engines' memory models); None only for hand-built geometries.
    dims: ModelDims | None = None
    # Multi-token-prediction decoder layers the checkpoint ships beside the decoder (config.json
    # mtp_num_hidden_layers, Qwen3.5/3.6; num_nextn_predict_layers, DeepSeek-V3 and others): an
    # engine serving them as a speculative drafter adds their weights and attention caches.
    mtp_layers: int = 0

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def is_mla(self) -> bool:
        return any(layer.kind == "mla" for layer in self.layers)

    @property
    def param_count(self) -> int:
        """Parameters recomputed from the shapes (decoder, embeddings, head; no MTP/vision towers)."""
        return sum(self.params.values())

    def count(self, *kinds: str) -> int:
        return sum(1 for layer in self.layers if layer.kind in kinds)

    def bytes_per_token(self, tp: int = 1, elem_bytes: float | None = None, growing_only: bool = True) -> int:
        """Per-rank bytes one token of context costs across the layers whose cache grows with it."""
        eb = float(self.dtype_bytes) if elem_bytes is None else elem_bytes
        return sum(layer.bytes_per_token(tp, eb) for layer in self.layers if layer.grows or not growing_only)


def ceil_div(a: int, b: int) -> int:
    """Integer ceiling division (vLLM's cdiv)."""
    return -(-a // b)


def stage_layers(layers: Sequence[LayerSpec], pp: int) -> list[list[LayerSpec]]:
    """Split layers into pp contiguous pipeline stages, the remainder going to the earlier stages."""
    base, extra = divmod(len(layers), pp)
    out, start = [], 0
    for i in range(pp):
        size = base + (1 if i < extra else 0)
        out.append(list(layers[start : start + size]))
        start += size
    return out
