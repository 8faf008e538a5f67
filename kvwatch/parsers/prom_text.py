"""An engine's /metrics exposition text -> the same events the log parsers emit (origin="metrics").

vLLM and SGLang renamed their metrics across releases, hide the pool size in label strings
(``vllm:cache_config_info{num_gpu_blocks="27153",...} 1``) and repeat one pool once per TP rank.
``MetricsReader`` hides all of that: it parses the text with prometheus_client's parser, maps every
known name variant onto one event field, keeps one fact per engine instance (vLLM ``engine`` label,
SGLang ``dp_rank``; the lowest TP/PP rank of an instance speaks for it) and remembers the previous
counter values so an engine restart becomes a ``CounterReset`` instead of a negative rate.

The reader is pure apart from that memory: no I/O, clock or logging. Values it cannot use (NaN,
negative counts, unreadable label strings) are skipped and counted in ``bad_values``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import regex
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from kvwatch.errors import ConfigError
from kvwatch.events import (
    CounterReset,
    Engine,
    EngineSettings,
    Event,
    PoolSized,
    Preemption,
    UsageSample,
)
from kvwatch.parsers.base import ParseError

EngineChoice = Literal["auto", "vllm", "sglang"]
_EventClass = type[EngineSettings] | type[PoolSized] | type[UsageSample] | type[Preemption]

# vLLM's own `vllm:`, the `vllm_` of exporters that cannot keep colons, Ray Serve's `ray_vllm_`.
_PREFIX: dict[Engine, regex.Pattern[str]] = {
    "vllm": regex.compile(r"^(?:ray_)?vllm[:_](?P<name>.+)$"),
    "sglang": regex.compile(r"^sglang[:_](?P<name>.+)$"),
}

# Labels that say who exported a series, not what it measures: they pick the instance and rank and
# are left out of the key that tells two series of one metric apart.
_IDENTITY_LABELS = frozenset(
    {"engine", "model_name", "dp_rank", "tp_rank", "pp_rank", "moe_ep_rank", "engine_type"}
)

# SGLang's cumulative retraction count kept in a gauge (0.4.10-0.5.2): treated as a counter.
_CUMULATIVE_GAUGES = frozenset({"total_retracted_reqs"})


@dataclass(frozen=True, slots=True)
class _Sample:
    """One series of a recognised engine, its prefix stripped."""

    name: str  # without the engine prefix, e.g. 'num_preemptions_total'
    exposed: str  # as the engine exposed it, e.g. 'vllm:num_preemptions_total'
    labels: dict[str, str]
    value: float
    instance: str
    # (tp_rank, pp_rank, moe_ep_rank) for SGLang scheduler series; None when the series names no rank.
    rank: tuple[int, int, int] | None
    series: tuple[tuple[str, str], ...]
    counter: bool


def _finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


def _label_int(labels: dict[str, str], key: str) -> int:
    text = labels.get(key, "0")
    return int(text) if text.isascii() and text.isdigit() else 0


def _instance_order(instance: str) -> tuple[int, int, str]:
    """Numeric instances in numeric order ('2' before '10'), others after."""
    return (0, int(instance), "") if instance.isascii() and instance.isdigit() else (1, 0, instance)


class MetricsReader:
    """Turns successive /metrics texts of one engine into events; keeps counters between calls."""

    def __init__(self, engine: EngineChoice = "auto") -> None:
        if engine not in ("auto", "vllm", "sglang"):
            raise ConfigError(f"metrics engine must be auto, vllm or sglang, not {engine!r}")
        # None until the first text that names a known engine (engine='auto').
        self.engine: Engine | None = None if engine == "auto" else engine
        # Values seen but unusable (NaN counts, negative counters, label strings that are no number).
        self.bad_values = 0
        # (instance, exposed name, series key) -> last value, for counters, `_created` and cumulative gauges.
        self._counters: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
        # (instance, series key) -> last value of SGLang's per-interval retraction gauge.
        self._interval: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        # instance -> (hits, queries) of the prefix-cache counters at the previous read.
        self._prefix: dict[str, tuple[float, float]] = {}

    # --- parsing -----------------------------------------------------------------------------------

    def read(self, text: str) -> tuple[Event, ...]:
        """Events for one scrape, ordered per instance: reset, settings, pools, usage, preemption.

        Raises ParseError when the text is not Prometheus exposition format.
        """
        try:
            families = list(text_string_to_metric_families(text))
        except Exception as exc:  # the lax parser raises ValueError, IndexError, TypeError...
            raise ParseError(f"not Prometheus exposition text: {exc}") from exc
        raw = [(fam.type, s.name, s.labels, float(s.value)) for fam in families for s in fam.samples]
        engine = self._detect(name for _, name, _, _ in raw)
        if engine is None:
            return ()
        samples = list(self._samples(engine, raw))
        by_instance: dict[str, list[_Sample]] = {}
        for sample in samples:
            by_instance.setdefault(sample.instance, []).append(sample)
        # vLLM's front end sums num_gpu_blocks over the DP engines it serves and repeats the sum in
        # every engine's cache_config_info (v1/engine/utils.py, 0.11): per instance only with one engine.
        info_engines = {s.instance for s in samples if s.name == "cache_config_info"}
        summed = engine == "vllm" and len(info_engines) > 1
        events: list[Event] = []
        for instance in sorted(by_instance, key=_instance_order):
            chosen = self._one_rank(by_instance[instance])
            events.extend(self._instance_events(engine, instance, chosen, summed))
        return tuple(events)

    def _detect(self, names: Iterable[str]) -> Engine | None:
        if self.engine is not None:
            return self.engine
        counts: dict[Engine, int] = {"vllm": 0, "sglang": 0}
        for name in names:
            for engine, pattern in _PREFIX.items():
                if pattern.match(name):
                    counts[engine] += 1
        best = max(counts, key=lambda e: counts[e])
        if counts[best] == 0:
            return None
        self.engine = best
        return best

    @staticmethod
    def _samples(engine: Engine, raw: list[tuple[str, str, dict[str, str], float]]) -> Iterator[_Sample]:
        pattern = _PREFIX[engine]
        for family_type, exposed, labels, value in raw:
            m = pattern.match(exposed)
            if m is None:
                continue
            name = m.group("name")
            if engine == "vllm":
                instance = labels.get("engine") or "0"
                rank = None
            else:
                instance = labels.get("dp_rank") or "0"
                rank = (
                    (
                        _label_int(labels, "tp_rank"),
                        _label_int(labels, "pp_rank"),
                        _label_int(labels, "moe_ep_rank"),
                    )
                    if "tp_rank" in labels
                    else None
                )
            series = tuple(sorted((k, v) for k, v in labels.items() if k not in _IDENTITY_LABELS))
            counter = name.endswith("_total") and family_type in ("counter", "unknown", "untyped")
            yield _Sample(name, exposed, labels, value, instance, rank, series, counter)

    @staticmethod
    def _one_rank(samples: list[_Sample]) -> dict[str, list[_Sample]]:
        """Samples by name, keeping only the lowest rank of the instance (TP ranks repeat one pool)."""
        ranks = [s.rank for s in samples if s.rank is not None]
        lowest = min(ranks) if ranks else None
        out: dict[str, list[_Sample]] = {}
        for s in samples:
            if s.rank is None or s.rank == lowest:
                out.setdefault(s.name, []).append(s)
        for group in out.values():
            group.sort(key=lambda s: s.series)
        return out

    # --- per instance ------------------------------------------------------------------------------

    def _instance_events(
        self, engine: Engine, instance: str, by_name: dict[str, list[_Sample]], summed_blocks: bool
    ) -> list[Event]:
        events: list[Event] = []
        reset = self._check_counters(engine, instance, by_name)
        if reset is not None:
            events.append(reset)
        ident: dict[str, Any] = {"engine": engine, "instance": instance, "origin": "metrics"}
        rank = next((s.rank[0] for group in by_name.values() for s in group if s.rank is not None), None)
        if rank is not None:
            ident["rank"] = rank
        if engine == "vllm":
            settings, pools, usage, preemption = self._vllm(
                instance, by_name, reset is not None, summed_blocks
            )
        else:
            settings, pools, usage, preemption = self._sglang(instance, by_name)
        model = self._label(by_name, "model_name")
        if model is not None:
            settings["served_model_name"] = model
        if settings:
            self._build(events, EngineSettings, ident, settings)
        for pool, facts in pools.items():
            if facts:
                self._build(events, PoolSized, ident, {"pool": pool, **facts})
        if usage:
            self._build(events, UsageSample, ident, usage)
        if preemption:
            self._build(events, Preemption, ident, preemption)
        return events

    def _build(
        self, out: list[Event], cls: _EventClass, ident: dict[str, Any], facts: dict[str, Any]
    ) -> None:
        try:
            out.append(cls(**ident, **facts))
        except ValidationError:
            self.bad_values += 1

    def _check_counters(
        self, engine: Engine, instance: str, by_name: dict[str, list[_Sample]]
    ) -> CounterReset | None:
        """Compare this read's counters with the last; the first that went back is the reset."""
        current: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
        totals = {name for name, group in by_name.items() if any(s.counter for s in group)}
        for name, group in by_name.items():
            created = name.endswith("_created") and f"{name[: -len('_created')]}_total" in totals
            cumulative = name in _CUMULATIVE_GAUGES
            for s in group:
                if (s.counter or created or cumulative) and _finite(s.value):
                    current[(instance, s.exposed, s.series)] = s.value
        reset: CounterReset | None = None
        for key, value in sorted(current.items()):
            previous = self._counters.get(key)
            if previous is None or reset is not None:
                continue
            went_back = value != previous if key[1].endswith("_created") else value < previous
            if went_back:
                reset = CounterReset(
                    engine=engine,
                    instance=instance,
                    origin="metrics",
                    metric=key[1],
                    previous=previous,
                    current=value,
                )
        if reset is not None:
            # A new engine process: every remembered figure of this instance belongs to the old one.
            for old in [k for k in self._counters if k[0] == instance]:
                del self._counters[old]
            for old_interval in [k for k in self._interval if k[0] == instance]:
                del self._interval[old_interval]
            self._prefix.pop(instance, None)
        self._counters.update(current)
        return reset

    def _value(self, by_name: dict[str, list[_Sample]], *names: str) -> float | None:
        """The first finite value among the name variants, newest name first."""
        for name in names:
            for s in by_name.get(name, ()):
                if _finite(s.value):
                    return s.value
                self.bad_values += 1
        return None

    def _count(self, by_name: dict[str, list[_Sample]], *names: str) -> int | None:
        """A value that must be a non-negative whole number (requests, tokens, blocks)."""
        value = self._value(by_name, *names)
        if value is None:
            return None
        if value < 0:
            self.bad_values += 1
            return None
        return int(value)

    def _ratio(self, by_name: dict[str, list[_Sample]], *names: str) -> float | None:
        """A 0-1 ratio; negative means 'not applicable' (V0 reports -1 when prefix caching is off)."""
        value = self._value(by_name, *names)
        return None if value is None or value < 0 else value

    @staticmethod
    def _label(by_name: dict[str, list[_Sample]], key: str) -> str | None:
        for group in by_name.values():
            for s in group:
                value = s.labels.get(key)
                if value:
                    return value
        return None

    def _info_labels(self, by_name: dict[str, list[_Sample]], name: str) -> dict[str, str]:
        group = by_name.get(name)
        if not group:
            return {}
        # Several series only when the config changed in a multiprocess registry; the value-1 one is live.
        live = [s for s in group if s.value == 1.0] or group
        return dict(live[-1].labels)

    def _label_number(self, labels: dict[str, str], key: str, kind: type[int] | type[float]) -> Any:
        """A number vLLM wrote into a label with str(); 'None' means unset."""
        text = labels.get(key)
        if text is None or text in ("None", ""):
            return None
        try:
            number = float(text)
        except ValueError:
            self.bad_values += 1
            return None
        if not _finite(number) or number < 0:
            self.bad_values += 1
            return None
        return number if kind is float else int(number)

    # --- vLLM --------------------------------------------------------------------------------------

    def _vllm(
        self, instance: str, by_name: dict[str, list[_Sample]], was_reset: bool, summed_blocks: bool
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any], dict[str, Any]]:
        settings: dict[str, Any] = {}
        pool: dict[str, Any] = {}
        info = self._info_labels(by_name, "cache_config_info")
        if info:
            block_size = self._label_number(info, "block_size", int)
            settings["block_size"] = block_size
            settings["gpu_memory_utilization"] = self._label_number(info, "gpu_memory_utilization", float)
            dtype = info.get("cache_dtype")
            settings["kv_cache_dtype"] = dtype if dtype not in (None, "", "None") else None
            prefix = info.get("enable_prefix_caching")
            settings["enable_prefix_caching"] = {"True": True, "False": False}.get(prefix or "")
            if not summed_blocks:
                # 'None' before the engine sized its cache (V1 0.8.x registered the gauge too early).
                pool["blocks"] = self._label_number(info, "num_gpu_blocks", int)
                pool["cpu_blocks"] = self._label_number(info, "num_cpu_blocks", int)
            pool["block_size"] = block_size
            # From 0.28: the pool in tokens and the concurrency vLLM also logs at startup.
            pool["tokens"] = self._label_number(info, "kv_cache_size_tokens", int)
            pool["max_concurrency"] = self._label_number(info, "kv_cache_max_concurrency", float)
        usage: dict[str, Any] = {
            # kv_cache_usage_perc from 0.9.2; gpu_cache_usage_perc before (and beside it up to 0.11).
            "kv_usage_ratio": self._ratio(by_name, "kv_cache_usage_perc", "gpu_cache_usage_perc"),
            "cpu_kv_usage_ratio": self._ratio(by_name, "cpu_cache_usage_perc"),
            "running": self._count(by_name, "num_requests_running"),
            "waiting": self._count(by_name, "num_requests_waiting"),
            "swapped": self._count(by_name, "num_requests_swapped"),
            # V0 0.5.5-0.9.0 exported the rate itself; V1 exports hit/query counters instead.
            "prefix_cache_hit_ratio": self._ratio(by_name, "gpu_prefix_cache_hit_rate"),
        }
        if usage["prefix_cache_hit_ratio"] is None:
            usage["prefix_cache_hit_ratio"] = self._hit_ratio(instance, by_name, was_reset)
        preemption: dict[str, Any] = {}
        total = self._count(by_name, "num_preemptions_total")
        if total is not None:
            preemption = {"mechanism": "preempt", "total": total}
        return (
            _present(settings),
            {"full": _present(pool)},
            _present(usage),
            preemption,
        )

    def _hit_ratio(self, instance: str, by_name: dict[str, list[_Sample]], was_reset: bool) -> float | None:
        """Hits / queries since the previous read (the rate ratio vLLM's docs recommend).

        On the first read (or after a restart) the ratio since engine start; None while no query
        arrived between two reads, so the last known ratio stands.
        """
        hits = self._value(by_name, "prefix_cache_hits_total", "gpu_prefix_cache_hits_total")
        queries = self._value(by_name, "prefix_cache_queries_total", "gpu_prefix_cache_queries_total")
        if hits is None or queries is None:
            return None
        previous = None if was_reset else self._prefix.get(instance)
        self._prefix[instance] = (hits, queries)
        d_hits, d_queries = (
            (hits, queries) if previous is None else (hits - previous[0], queries - previous[1])
        )
        if d_queries <= 0 or d_hits < 0 or d_hits > d_queries:
            return None
        return d_hits / d_queries

    # --- SGLang ------------------------------------------------------------------------------------

    def _sglang(
        self, instance: str, by_name: dict[str, list[_Sample]]
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any], dict[str, Any]]:
        info = self._info_labels(by_name, "cache_config_info")  # 0.5.9-0.5.10 only
        page_size = self._count(by_name, "page_size")
        if page_size is None and info:
            page_size = self._label_number(info, "page_size", int)
        num_pages = self._count(by_name, "num_pages")
        if num_pages is None and info:
            num_pages = self._label_number(info, "num_pages", int)
        settings = {"page_size": page_size, "max_model_len": self._count(by_name, "context_len")}
        pools = {
            "full": {
                "tokens": self._count(by_name, "max_total_num_tokens"),
                "blocks": num_pages,
                "block_size": page_size,
            },
            "swa": {"tokens": self._count(by_name, "max_total_num_tokens_swa")},
        }
        usage: dict[str, Any] = {
            # token_usage is the max over a hybrid model's pools; full_token_usage (0.5.10+) the full pool.
            "kv_usage_ratio": self._ratio(by_name, "full_token_usage", "token_usage"),
            "used_tokens": self._count(by_name, "num_used_tokens", "kv_used_tokens"),
            "swa_used_tokens": self._count(by_name, "swa_used_tokens"),
            "mamba_used_slots": self._count(by_name, "mamba_used_tokens"),
            "running": self._count(by_name, "num_running_reqs"),
            "waiting": self._count(by_name, "num_queue_reqs"),
            "prefix_cache_hit_ratio": self._ratio(by_name, "cache_hit_rate"),
            "swa_usage_ratio": self._ratio(by_name, "swa_token_usage"),
            "mamba_usage_ratio": self._ratio(by_name, "mamba_usage"),
            "generation_throughput": self._value(by_name, "gen_throughput"),
        }
        return (
            _present(settings),
            {pool: _present(facts) for pool, facts in pools.items()},
            _present(usage),
            self._retractions(instance, by_name),
        )

    def _retractions(self, instance: str, by_name: dict[str, list[_Sample]]) -> dict[str, Any]:
        """SGLang's three forms, the cumulative ones first so nothing is counted twice.

        0.5.7+ counter ``num_retracted_requests_total``; 0.4.10-0.5.2 cumulative gauge
        ``total_retracted_reqs``; otherwise the per-interval gauge ``num_retracted_reqs`` (one series
        per process), which keeps its value until the next stats report: a non-zero value is counted
        only when it differs from the previous read of that series, so a stale gauge is not counted
        again (the reader misses retractions of intervals it did not see; it never invents any).
        """
        total = self._count(by_name, "num_retracted_requests_total", "total_retracted_reqs")
        if total is not None:
            return {"mechanism": "retract", "total": total}
        group = by_name.get("num_retracted_reqs")
        if not group:
            return {}
        count = 0
        for s in group:
            if not _finite(s.value) or s.value < 0:
                self.bad_values += 1
                continue
            key = (instance, s.series)
            previous = self._interval.get(key)
            self._interval[key] = s.value
            if s.value > 0 and s.value != previous:
                count += int(s.value)
        return {"mechanism": "retract", "count": count}


def _present(facts: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in facts.items() if v is not None}
