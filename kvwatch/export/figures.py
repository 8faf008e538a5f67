"""The figures kvwatch derives from one instance's snapshot and prediction, in one place.

The collector exports them and the status page (kvwatch/export/status.py) draws them, so a number
on the page is the number on /metrics: both call these functions, neither derives its own. Pure:
no prometheus_client here, so the page and ``kvwatch explain --html`` import it without the
exporter.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvwatch.analysis.predictor import PredictionResult
from kvwatch.core import labels
from kvwatch.state.facts import MemoryFacts, UsageFacts
from kvwatch.state.instance import InstanceSnapshot


def observed_terms(m: MemoryFacts) -> tuple[tuple[labels.MemoryTerm, int | None], ...]:
    """The printed memory budget as names.MEMORY_TERMS terms (basis 'observed')."""
    return (
        ("total", m.total_bytes),
        ("usable", m.requested_bytes),
        ("weights", m.weights_bytes),
        ("activation", m.activation_bytes),
        ("non_torch", m.non_torch_bytes),
        ("cuda_graphs", m.cuda_graph_bytes),
        ("kv", m.available_kv_bytes),
    )


def predicted_terms(pred: PredictionResult | None) -> tuple[tuple[labels.MemoryTerm, int | None], ...]:
    """The predicted memory budget as names.MEMORY_TERMS terms (basis 'predicted'); None: no
    prediction made yet (a scrape before the sidecar's consumer prepared it)."""
    memory = pred.memory if pred is not None else {}
    return tuple((term, memory.get(term)) for term in labels.MEMORY_TERMS)


@dataclass(frozen=True)
class PoolFigures:
    """The pool as exported: what the engine said, filled in where its own figures allow."""

    block_size: int | None
    tokens: int | None
    blocks: int | None
    # Known only in blocks (V0 logs, /metrics before 0.28): compare blocks, not tokens.
    in_blocks: bool
    # The context length the engine runs with (its settings, else its pool line).
    max_len: int | None
    # The request length headroom in requests is counted in: max_len, else the model's default.
    request_len: int | None


def pool_figures(snap: InstanceSnapshot, pred: PredictionResult | None) -> PoolFigures:
    """The full pool's tokens, blocks and block size, and the request lengths, of one instance
    (``pred`` None: no prediction made yet, so no model default fills a gap)."""
    settings, pool = snap.settings, snap.pool
    default_block = pred.block_size if pred is not None else None
    block_size = pool.block_size or settings.block_size or settings.page_size or default_block
    tokens = pool.tokens
    blocks = pool.blocks
    # Known only in blocks (V0 logs, /metrics before 0.28): the gap compares blocks, as the
    # engine's own token count is not blocks x block size for hybrid or sliding-window models.
    in_blocks = tokens is None and blocks is not None
    if tokens is None and blocks is not None and block_size:
        tokens = blocks * block_size
    max_len = settings.max_model_len or pool.max_concurrency_tokens
    # Headroom in requests needs a request length: the engine's, else the model's default
    # (a metrics-only vLLM source reports no max_model_len; the model config gives it).
    default_len = pred.max_model_len if pred is not None else None
    return PoolFigures(block_size, tokens, blocks, in_blocks, max_len, max_len or default_len)


@dataclass(frozen=True)
class UsageFigures:
    """How full the pool is and what is left, as exported."""

    ratio: float | None
    used: int | None
    headroom_tokens: int | None
    headroom_requests: int | None


def usage_figures(usage: UsageFacts, pool_tokens: int | None, request_len: int | None) -> UsageFigures:
    """Usage ratio and used tokens (each from the other when one is missing), and the headroom."""
    ratio = usage.kv_usage_ratio
    used = usage.used_tokens
    if used is None and ratio is not None and pool_tokens is not None:
        used = round(ratio * pool_tokens)
    if ratio is None and used is not None and pool_tokens:
        ratio = used / pool_tokens
    free = requests = None
    if pool_tokens is not None and used is not None:
        free = max(pool_tokens - used, 0)
        if request_len:
            requests = free // request_len
    return UsageFigures(ratio, used, free, requests)
