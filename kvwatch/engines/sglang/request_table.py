"""SGLang's per-request token table (ReqToTokenPool.req_to_token): its rows, width and bytes per
release, sized from the profiled pool and allocated after it (budget.py sizes the pool itself)."""

from __future__ import annotations

from dataclasses import dataclass

from kvwatch.capacity.deployment import Deployment
from kvwatch.engines.sglang import releases

# Positions a req_to_token row holds beyond context_len: 4, plus speculative_num_draft_tokens with
# speculative decoding (0.4.5 model_executor/model_runner.py:760; 0.5.9
# model_runner_kv_cache_mixin.py:424-426; 0.5.23 mem_cache/allocation_sizing.py:96-116), which a
# Deployment does not carry.
REQUEST_TABLE_EXTRA_POSITIONS = 4
# The table's element: torch.int32 (0.4.5 mem_cache/memory_pool.py:64-66; 0.5.23 :406-407).
REQUEST_TABLE_ELEM_BYTES = 4


@dataclass(frozen=True)
class RequestTable:
    """SGLang's per-request token table (ReqToTokenPool.req_to_token) on one rank.

    A [rows, context_len + 4] int32 tensor mapping each running request's positions to KV slots.
    It is sized from the profiled pool (max_running_requests) and allocated after the profile, beside
    the KV pool, in every release read (0.4.5 model_runner.py:697-770; 0.5.9
    model_runner_kv_cache_mixin.py:339-480; 0.5.23 mem_cache/kv_cache_configurator.py:742-746,
    :3175-3190): no release subtracts it from the KV budget, so it comes out of what
    mem_fraction_static leaves beside the pool -- and a long default context (Llama-4-Scout's
    10,485,760) makes it larger than that.
    """

    requests: int
    rows: int
    positions: int

    @property
    def bytes(self) -> int:
        return self.rows * self.positions * REQUEST_TABLE_ELEM_BYTES


def max_running_requests(d: Deployment, tokens: int, context_len: int) -> int:
    """The requests SGLang sizes its req_to_token table for on one rank (releases.REQUEST_SLOTS):
    the estimate clamp(int(tokens / context_len x 512), 2048, 4096) when --max-running-requests is not
    given; from 0.5.10 at most tokens // 2, and a given one divided over the DP-attention ranks.
    (EAGLE's default of 48 and a hybrid model's state-slot cap are not modelled.)"""
    estimated = min(max(int(tokens / max(context_len, 1) * 512), 2048), 4096)
    given = d.max_num_seqs
    rule = releases.REQUEST_SLOTS.at(d.engine_version)
    if rule == "given_or_estimate":
        return given if given is not None else estimated
    workers = d.dp if d.dp_attention and d.dp > 1 else 1
    if given is None:
        return min(estimated, tokens // 2)
    per_worker = max(1, given // workers)
    return min(per_worker, estimated if rule == "estimate_half_pool" else tokens // 2)


def request_table(d: Deployment, tokens: int, context_len: int) -> RequestTable:
    """The req_to_token table SGLang allocates beside a pool of ``tokens`` for ``context_len``."""
    requests = max_running_requests(d, tokens, context_len)
    rows = requests + releases.REQUEST_TABLE_PADDING_ROW.at(d.engine_version)
    return RequestTable(requests, rows, context_len + REQUEST_TABLE_EXTRA_POSITIONS)
