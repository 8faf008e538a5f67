"""The ``kvwatch parse`` summary: per engine instance the last known pool, budget and usage.

``summary`` turns replayed snapshots into a typed ``Summary``; ``Summary.to_json`` is the
``parse --json`` object (its keys and their order are the golden files' format).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.core.jsontypes import JsonObject
from kvwatch.core.kinds import EngineName
from kvwatch.state.facts import Failure
from kvwatch.state.fleet import InstanceSnapshot


@dataclass(frozen=True)
class InstanceSummary:
    """One engine instance of the summary; None = the log did not say."""

    source: str | None  # only when the summary covers several sources
    instance: str
    kv_pool_tokens: int | None
    kv_pool_blocks: int | None
    block_size: int | None
    kv_pool_bytes: int | None
    max_concurrency: float | None
    max_concurrency_tokens: int | None
    model_weights_bytes: int | None
    kv_usage_ratio: float | None
    requests_running: int | None
    requests_waiting: int | None
    preemptions_total: int | None
    startup_error: Failure | None

    def to_json(self) -> JsonObject:
        out: JsonObject = {} if self.source is None else {"source": self.source}
        f = self.startup_error
        out.update(
            {
                "instance": self.instance,
                "kv_pool_tokens": self.kv_pool_tokens,
                "kv_pool_blocks": self.kv_pool_blocks,
                "block_size": self.block_size,
                "kv_pool_bytes": self.kv_pool_bytes,
                "max_concurrency": self.max_concurrency,
                "max_concurrency_tokens": self.max_concurrency_tokens,
                "model_weights_bytes": self.model_weights_bytes,
                "kv_usage_ratio": self.kv_usage_ratio,
                "requests_running": self.requests_running,
                "requests_waiting": self.requests_waiting,
                "preemptions_total": self.preemptions_total,
                "startup_error": (
                    {
                        "needed_kv_bytes": f.needed_kv_bytes,
                        "available_kv_bytes": f.available_kv_bytes,
                        "max_model_len": f.max_model_len,
                        "estimated_max_model_len": f.estimated_max_model_len,
                    }
                    if f is not None
                    else None
                ),
            }
        )
        return out


@dataclass(frozen=True)
class Summary:
    """What ``kvwatch parse`` prints: the engine, its version and each instance."""

    engine: EngineName | None
    engine_version: str | None
    instances: tuple[InstanceSummary, ...]

    def to_json(self) -> JsonObject:
        return {
            "engine": self.engine,
            "engine_version": self.engine_version,
            "instances": [i.to_json() for i in self.instances],
        }


def _instance_summary(snap: InstanceSnapshot, with_source: bool) -> InstanceSummary:
    pool = snap.pool
    usage = snap.usage
    pool_bytes = pool.bytes
    if pool_bytes is None:
        # vLLM prints the memory it reserves for the pool, not the pool's exact size.
        reserved = snap.memory.available_kv_bytes
        if reserved is not None and reserved >= 0:
            pool_bytes = reserved
    seen_preemption_info = bool(snap.preemptions_total or snap.retractions or not usage.empty())
    return InstanceSummary(
        source=snap.source if with_source else None,
        instance=snap.instance,
        kv_pool_tokens=pool.tokens,
        kv_pool_blocks=pool.blocks,
        block_size=pool.block_size if pool.block_size is not None else snap.settings.block_size,
        kv_pool_bytes=pool_bytes,
        max_concurrency=pool.max_concurrency,
        max_concurrency_tokens=pool.max_concurrency_tokens,
        model_weights_bytes=snap.memory.weights_bytes,
        kv_usage_ratio=usage.kv_usage_ratio,
        requests_running=usage.running,
        requests_waiting=usage.waiting,
        preemptions_total=snap.preemptions_total if seen_preemption_info else None,
        startup_error=snap.last_failure,
    )


def summary(snapshots: Sequence[InstanceSnapshot], engine: EngineName | None = None) -> Summary:
    """Per instance the last known pool, budget and usage; ``source`` is given for each instance
    only when the snapshots come from several sources."""
    version: str | None = None
    for snap in snapshots:
        if engine is None:
            engine = snap.engine
        if version is None and snap.settings.version is not None:
            version = snap.settings.version
    with_source = len({s.source for s in snapshots}) > 1
    return Summary(engine, version, tuple(_instance_summary(s, with_source) for s in snapshots))


def summarize(snapshots: Sequence[InstanceSnapshot], engine: EngineName | None = None) -> JsonObject:
    """The ``kvwatch parse --json`` object."""
    return summary(snapshots, engine).to_json()
