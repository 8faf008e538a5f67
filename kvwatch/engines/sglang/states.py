"""SGLang's Mamba / linear-attention request states beside the KV cache of a hybrid model: one
request's state bytes, how many slots SGLang keeps per release, and what the KV cache is left."""

from __future__ import annotations

from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.model import ModelGeometry
from kvwatch.engines.sglang import releases

DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
# State slots a hybrid model keeps while its radix cache is off and --max-running-requests is not set.
FIXED_MAMBA_SLOTS = 512


def state_bytes_per_request(model: ModelGeometry, d: Deployment) -> int:
    """One request's Mamba / linear-attention state on one rank (configs/mamba_utils.py:116-125,
    :222-230 @0.5.23): the conv window in bf16 (SGLANG_MAMBA_CONV_DTYPE) and the recurrent state in
    fp32, SGLang's default ssm dtype (:47-107); 0 when a layer's shape is not in config.json."""
    total = 0
    for layer in model.layers:
        if layer.kind not in ("linear", "mamba"):
            continue
        if not layer.state_heads:
            return 0
        conv = layer.conv_channels(d.tp) * layer.state_conv_width * 2
        total += conv + max(1, layer.state_heads // d.tp) * layer.state_head_elems * 4
    return total


def state_slots_dp(model: ModelGeometry, d: Deployment) -> int:
    """What a hybrid model's default state-slot count is divided by under DP attention: dp for a GDN
    model (hybrid_gdn_config) in 0.5.4-0.5.8, after the slots are sized, fixed or from the ratio
    (0.5.4 model_runner.py:1470-1473; 0.5.6 :1487-1490; 0.5.7-0.5.8 taken as 0.5.6); else 1 --
    0.5.2-0.5.3 do not divide (0.5.2 model_runner.py:308-325), a Mamba2 model is not divided, and
    from 0.5.9 only an explicit --max-mamba-cache-size or --max-running-requests is, not the ratio's
    count (0.5.9 model_runner_kv_cache_mixin.py:172-203; 0.5.23 kv_cache_configurator.py:3303-3345)."""
    gdn = any(layer.kind == "linear" for layer in model.layers)
    if not (d.dp_attention and d.dp > 1 and gdn and releases.STATE_SLOTS_DP_DIVIDED.at(d.engine_version)):
        return 1
    return d.dp


def kv_bytes_beside_states(model: ModelGeometry, d: Deployment, available: int) -> tuple[int, bool, str]:
    """(KV-cache bytes, exact, note) of ``available`` budget bytes once the request states are kept."""
    ratio = DEFAULT_MAMBA_FULL_MEMORY_RATIO
    exact = True
    state_budget = available * ratio / (1 + ratio)
    per_req = state_bytes_per_request(model, d)
    v = d.engine_version
    mamba2 = any(layer.kind == "mamba" for layer in model.layers)
    fixed = releases.FIXED_STATE_SLOTS.at(v) or (mamba2 and releases.MAMBA2_FIXED_STATE_SLOTS.at(v))
    dp = state_slots_dp(model, d)
    if per_req and fixed:
        # Without the radix cache the state is a fixed max_mamba_cache_size of slots:
        # max_running_requests, else 512. A GDN model runs so up to 0.5.3 (0.5.2
        # model_executor/model_runner.py:308-325, :1125-1131; 0.5.3 :360-372); a Mamba2 model
        # (Nemotron-H, Falcon-H1) up to 0.5.6 as read (0.5.4 model_runner.py:402-405,
        # :1443-1452; 0.5.6 :450), 0.5.7-0.5.8 taken as 0.5.6.
        slots = FIXED_MAMBA_SLOTS // dp
        kv_bytes = available - slots * per_req
        note = f"Mamba/linear-attention state: {slots} fixed request slots of {per_req:,} B (max_mamba_cache_size)"
    elif per_req:
        # From 0.5.4 as many whole request states as mamba_full_memory_ratio's share holds
        # (0.5.4 model_runner.py:1443-1467), / dp for a GDN model under DP attention in 0.5.4-0.5.8
        # (state_slots_dp); from 0.5.17 one more slot for the pool's padding (0.5.9
        # model_runner_kv_cache_mixin.py:151-210; 0.5.17 kv_cache_configurator.py:1911/1978;
        # 0.5.23 :3368-3409). The KV cache gets the rest.
        if releases.STATE_PADDING_SLOT.at(v):
            slots = max(int((state_budget - per_req) // per_req), 0) + 1
        else:
            slots = int(state_budget // per_req) // dp
        kv_bytes = available - slots * per_req
        note = (
            f"Mamba/linear-attention state: {slots:,} request slots of {per_req:,} B "
            f"({ratio}/(1+{ratio}) of the budget, mamba_full_memory_ratio"
            + (f", divided by dp={dp})" if dp > 1 else ")")
        )
    else:
        kv_bytes = int(available * (1 - ratio / (1 + ratio) / dp))
        exact = False
        note = (
            f"Mamba/linear-attention state takes {ratio}/(1+{ratio}) of the budget (mamba_full_memory_ratio)"
            + (f", divided by dp={dp}" if dp > 1 else "")
            + "; its shape is not in config.json"
        )
    return kv_bytes, exact, note
