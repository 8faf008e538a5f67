"""SGLang's /metrics: the `sglang:` names of every release mapped onto kvwatch's event fields.

SGLang exports one series per scheduler process (tp_rank, pp_rank, moe_ep_rank labels; dp_rank names
the instance), the pool as gauges (max_total_num_tokens, num_pages/page_size or, in 0.5.9-0.5.10, a
cache_config_info label string) and retractions in three forms across releases.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kvwatch.parsers.samples import InstanceFacts, Sample, SampleReader, finite, label_int, present


class SglangMetrics:
    """SGLang's MetricsDialect."""

    prefix: re.Pattern[str] = re.compile(r"^sglang[:_](?P<name>.+)$")
    # Labels that say who exported a series, not what it measures.
    identity_labels: frozenset[str] = frozenset(
        {"model_name", "dp_rank", "tp_rank", "pp_rank", "moe_ep_rank", "engine_type"}
    )
    # The cumulative retraction count kept in a gauge (0.4.10-0.5.2): treated as a counter.
    cumulative_gauges: frozenset[str] = frozenset({"total_retracted_reqs"})
    # Every series name (prefix stripped) ``facts`` reads: the only ones a /metrics body materialises.
    families: frozenset[str] = frozenset(
        {
            "cache_config_info",
            "page_size",
            "num_pages",
            "context_len",
            "max_total_num_tokens",
            "max_total_num_tokens_swa",
            "full_token_usage",
            "token_usage",
            "num_used_tokens",
            "kv_used_tokens",
            "swa_used_tokens",
            "mamba_used_tokens",
            "num_running_reqs",
            "num_queue_reqs",
            "cache_hit_rate",
            "swa_token_usage",
            "mamba_usage",
            "gen_throughput",
            "num_retracted_requests_total",
            "total_retracted_reqs",
            "num_retracted_reqs",
        }
    )

    def identity(self, labels: Mapping[str, str]) -> tuple[str, tuple[int, int, int] | None]:
        instance = labels.get("dp_rank") or "0"
        if "tp_rank" not in labels:
            return instance, None
        plain = dict(labels)
        return instance, (
            label_int(plain, "tp_rank"),
            label_int(plain, "pp_rank"),
            label_int(plain, "moe_ep_rank"),
        )

    def sums_pool_across_instances(self, samples: list[Sample]) -> bool:
        return False

    def facts(
        self,
        reader: SampleReader,
        instance: str,
        by_name: dict[str, list[Sample]],
        was_reset: bool,
        summed_pool: bool,
    ) -> InstanceFacts:
        info = reader.info_labels(by_name, "cache_config_info")  # 0.5.9-0.5.10 only
        page_size = reader.count(by_name, "page_size")
        if page_size is None and info:
            page_size = reader.label_number(info, "page_size", int)
        num_pages = reader.count(by_name, "num_pages")
        if num_pages is None and info:
            num_pages = reader.label_number(info, "num_pages", int)
        settings = {"page_size": page_size, "max_model_len": reader.count(by_name, "context_len")}
        pools = {
            "full": {
                "tokens": reader.count(by_name, "max_total_num_tokens"),
                "blocks": num_pages,
                "block_size": page_size,
            },
            "swa": {"tokens": reader.count(by_name, "max_total_num_tokens_swa")},
        }
        usage: dict[str, Any] = {
            # token_usage is the max over a hybrid model's pools; full_token_usage (0.5.10+) the full pool.
            "kv_usage_ratio": reader.ratio(by_name, "full_token_usage", "token_usage"),
            "used_tokens": reader.count(by_name, "num_used_tokens", "kv_used_tokens"),
            "swa_used_tokens": reader.count(by_name, "swa_used_tokens"),
            "mamba_used_slots": reader.count(by_name, "mamba_used_tokens"),
            "running": reader.count(by_name, "num_running_reqs"),
            "waiting": reader.count(by_name, "num_queue_reqs"),
            "prefix_cache_hit_ratio": reader.ratio(by_name, "cache_hit_rate"),
            "swa_usage_ratio": reader.ratio(by_name, "swa_token_usage"),
            "mamba_usage_ratio": reader.ratio(by_name, "mamba_usage"),
            "generation_throughput": reader.value(by_name, "gen_throughput"),
        }
        return InstanceFacts(
            present(settings),
            {pool: present(facts) for pool, facts in pools.items()},
            present(usage),
            _retractions(reader, instance, by_name),
        )


def _retractions(reader: SampleReader, instance: str, by_name: dict[str, list[Sample]]) -> dict[str, Any]:
    """SGLang's three forms, the cumulative ones first so nothing is counted twice.

    0.5.7+ counter ``num_retracted_requests_total``; 0.4.10-0.5.2 cumulative gauge
    ``total_retracted_reqs``; otherwise the per-interval gauge ``num_retracted_reqs`` (one series
    per process), which keeps its value until the next stats report: a non-zero value is counted
    only when it differs from the previous read of that series, so a stale gauge is not counted
    again (the reader misses retractions of intervals it did not see; it never invents any).
    """
    total = reader.count(by_name, "num_retracted_requests_total", "total_retracted_reqs")
    if total is not None:
        return {"mechanism": "retract", "total": total}
    group = by_name.get("num_retracted_reqs")
    if not group:
        return {}
    count = 0
    for s in group:
        if not finite(s.value) or s.value < 0:
            reader.bad_values += 1
            continue
        key = (instance, "retracted", s.series)
        previous = reader.remembered.get(key)
        reader.remembered[key] = (s.value,)
        if s.value > 0 and (previous is None or s.value != previous[0]):
            count += int(s.value)
    return {"mechanism": "retract", "count": count}
