"""vLLM's /metrics: the `vllm:` names of every release mapped onto kvwatch's event fields.

vLLM hides the pool in ``cache_config_info`` label strings (num_gpu_blocks, block_size; from 0.28
kv_cache_size_tokens and kv_cache_max_concurrency), names an engine instance by the ``engine`` label
(the V1 DP engine index) and renamed the usage gauge at 0.9.2. See the vLLM formats reference.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kvwatch.parsers.samples import InstanceFacts, Sample, SampleReader, present


class VllmMetrics:
    """vLLM's MetricsDialect."""

    # vLLM's own `vllm:`, the `vllm_` of exporters that cannot keep colons, Ray Serve's `ray_vllm_`.
    prefix: re.Pattern[str] = re.compile(r"^(?:ray_)?vllm[:_](?P<name>.+)$")
    # Labels that say who exported a series, not what it measures.
    identity_labels: frozenset[str] = frozenset({"engine", "model_name"})
    cumulative_gauges: frozenset[str] = frozenset()
    # Every series name (prefix stripped) ``facts`` reads: the only ones a /metrics body materialises.
    families: frozenset[str] = frozenset(
        {
            "cache_config_info",
            "kv_cache_usage_perc",
            "gpu_cache_usage_perc",
            "cpu_cache_usage_perc",
            "num_requests_running",
            "num_requests_waiting",
            "num_requests_swapped",
            "gpu_prefix_cache_hit_rate",
            "prefix_cache_hits_total",
            "gpu_prefix_cache_hits_total",
            "prefix_cache_queries_total",
            "gpu_prefix_cache_queries_total",
            "num_preemptions_total",
        }
    )

    def identity(self, labels: Mapping[str, str]) -> tuple[str, tuple[int, int, int] | None]:
        return labels.get("engine") or "0", None

    def sums_pool_across_instances(self, samples: list[Sample]) -> bool:
        # The front end sums num_gpu_blocks over the DP engines it serves and repeats the sum in every
        # engine's cache_config_info (v1/engine/utils.py, 0.11): per instance only with one engine.
        return len({s.instance for s in samples if s.name == "cache_config_info"}) > 1

    def facts(
        self,
        reader: SampleReader,
        instance: str,
        by_name: dict[str, list[Sample]],
        was_reset: bool,
        summed_pool: bool,
    ) -> InstanceFacts:
        settings: dict[str, Any] = {}
        pool: dict[str, Any] = {}
        info = reader.info_labels(by_name, "cache_config_info")
        if info:
            block_size = reader.label_number(info, "block_size", int)
            settings["block_size"] = block_size
            settings["gpu_memory_utilization"] = reader.label_number(info, "gpu_memory_utilization", float)
            dtype = info.get("cache_dtype")
            settings["kv_cache_dtype"] = dtype if dtype not in (None, "", "None") else None
            prefix = info.get("enable_prefix_caching")
            settings["enable_prefix_caching"] = {"True": True, "False": False}.get(prefix or "")
            if not summed_pool:
                # 'None' before the engine sized its cache (V1 0.8.x registered the gauge too early).
                pool["blocks"] = reader.label_number(info, "num_gpu_blocks", int)
                pool["cpu_blocks"] = reader.label_number(info, "num_cpu_blocks", int)
            pool["block_size"] = block_size
            # From 0.28: the pool in tokens and the concurrency vLLM also logs at startup.
            pool["tokens"] = reader.label_number(info, "kv_cache_size_tokens", int)
            pool["max_concurrency"] = reader.label_number(info, "kv_cache_max_concurrency", float)
        usage: dict[str, Any] = {
            # kv_cache_usage_perc from 0.9.2; gpu_cache_usage_perc before (and beside it up to 0.11).
            "kv_usage_ratio": reader.ratio(by_name, "kv_cache_usage_perc", "gpu_cache_usage_perc"),
            "cpu_kv_usage_ratio": reader.ratio(by_name, "cpu_cache_usage_perc"),
            "running": reader.count(by_name, "num_requests_running"),
            "waiting": reader.count(by_name, "num_requests_waiting"),
            "swapped": reader.count(by_name, "num_requests_swapped"),
            # V0 0.5.5-0.9.0 exported the rate itself; V1 exports hit/query counters instead.
            "prefix_cache_hit_ratio": reader.ratio(by_name, "gpu_prefix_cache_hit_rate"),
        }
        if usage["prefix_cache_hit_ratio"] is None:
            usage["prefix_cache_hit_ratio"] = _hit_ratio(reader, instance, by_name, was_reset)
        preemption: dict[str, Any] = {}
        total = reader.count(by_name, "num_preemptions_total")
        if total is not None:
            preemption = {"mechanism": "preempt", "total": total}
        return InstanceFacts(present(settings), {"full": present(pool)}, present(usage), preemption)


def _hit_ratio(
    reader: SampleReader, instance: str, by_name: dict[str, list[Sample]], was_reset: bool
) -> float | None:
    """Hits / queries since the previous read (the rate ratio vLLM's docs recommend).

    On the first read (or after a restart) the ratio since engine start; None while no query
    arrived between two reads, so the last known ratio stands.
    """
    hits = reader.value(by_name, "prefix_cache_hits_total", "gpu_prefix_cache_hits_total")
    queries = reader.value(by_name, "prefix_cache_queries_total", "gpu_prefix_cache_queries_total")
    if hits is None or queries is None:
        return None
    key = (instance, "prefix_cache", ())
    previous = None if was_reset else reader.remembered.get(key)
    reader.remembered[key] = (hits, queries)
    d_hits, d_queries = (hits, queries) if previous is None else (hits - previous[0], queries - previous[1])
    if d_queries <= 0 or d_hits < 0 or d_hits > d_queries:
        return None
    return d_hits / d_queries
