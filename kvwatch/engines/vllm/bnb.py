"""The transient of a bitsandbytes 4-bit matmul in vLLM's profile forward (memory.activation)."""

from __future__ import annotations

from kvwatch.capacity.dims import ModelDims


def bnb_dequant(dims: ModelDims, tp: int, tokens: int) -> int:
    """The transient of a bitsandbytes 4-bit matmul in the profile forward: vLLM casts the input to
    bf16 and calls matmul_4bit once per output shard, copying each result into the layer's output
    (0.8.5 quantization/bitsandbytes.py:320-375); for more than one row bitsandbytes dequantises the
    shard's whole weight to bf16 and runs a dense linear (bitsandbytes 0.45.5
    autograd/_functions.py:462 and :521-533). At the peak, the largest shard -- the MLP's gate (or
    up) projection, intermediate / tp x hidden -- is alive in bf16 beside its result (tokens x
    the wider of the gate's and down's outputs). MoE experts (no dense intermediate) are not sized.
    """
    inter = dims.intermediate_size // tp
    if dims.quant_method != "bitsandbytes" or dims.checkpoint_quant != "w4a16" or not inter:
        return 0
    return (inter * dims.hidden_size + max(inter, dims.hidden_size) * tokens) * 2
