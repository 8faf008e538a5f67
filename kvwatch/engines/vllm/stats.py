"""vLLM's periodic stats lines -> UsageSample (and the V1 line's per-interval Preemption).

The V0 and V1 'Avg prompt throughput: ...' line (its field set is dynamic: split into 'Key: value'
pairs), and V0's separate prefix-cache hit-rate line. ``usage_sample`` is the one builder of a
stats line's sample, shared with the byte-level fast path (fastpath.py) so both give the same
fields. The rows that reach these handlers are in log.py's table.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from kvwatch.core.events import Event, Preemption, UsageSample
from kvwatch.engines.vllm.common import NUM, ident, ratio
from kvwatch.parsers.base import NO_EVENTS, LineMeta, ParseError

# V0 'Avg prompt throughput: 0.0 tokens/s, ..., Running: 2 reqs, Swapped: 0 reqs, Pending: 3 reqs,
# GPU KV cache usage: 82.1%, CPU KV cache usage: 0.0%' (0.4.3+ ends with '.'); V1 0.8.3+ starts with
# 'Engine 000: ' ('2 Engines Aggregated: ' for the aggregated DP logger), fields are dynamic.
_STATS_HEAD = re.compile(
    r"^(?:Engine (?P<engine>\d+): |(?P<agg>\d+) Engines Aggregated: )?Avg prompt throughput"
)

# V0 0.5.5+ (prefix caching on): 'Prefix cache hit rate: GPU: 12.50%, CPU: 0.00%'
_V0_HIT_RATE = re.compile(r"^Prefix cache hit rate: GPU: (?P<gpu>" + NUM + r")%")


def stats_line(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    """The periodic stats line's events; None for any other line."""
    m = _STATS_HEAD.match(body) if "throughput" in body else None
    return _stats(body, m, meta) if m is not None else None


def _percent(val: str) -> float:
    return ratio(val.removesuffix("%"))


# Stats keys with a fixed meaning -> (field, converter). V0's 'Pending' is the waiting queue.
# Stats-line key -> UsageSample field (or 'preemptions', a Preemption's count), by value type.
_STAT_COUNTS: dict[str, str] = {
    "Running": "running",
    "Waiting": "waiting",
    "Pending": "waiting",
    "Swapped": "swapped",
    "Preemptions": "preemptions",
}
_STAT_RATES: dict[str, tuple[str, Callable[[str], float]]] = {
    "Avg prompt throughput": ("prompt_throughput", float),
    "Avg generation throughput": ("generation_throughput", float),
    "Prefix cache hit rate": ("prefix_cache_hit_ratio", _percent),
}


def usage_sample(meta: LineMeta, counts: Mapping[str, int], shares: Mapping[str, float]) -> UsageSample:
    """The sample of a stats line's values, by field. Every field a stats line can give is named
    (None where this one has none): the fast path's events are copies of ``usage_sample(meta, {},
    {})`` with a line's values, so both paths' events have the same fields set."""
    return UsageSample(
        **ident(meta),
        kv_usage_ratio=shares.get("kv_usage_ratio"),
        running=counts.get("running"),
        waiting=counts.get("waiting"),
        swapped=counts.get("swapped"),
        prefix_cache_hit_ratio=shares.get("prefix_cache_hit_ratio"),
        cpu_kv_usage_ratio=shares.get("cpu_kv_usage_ratio"),
        prompt_throughput=shares.get("prompt_throughput"),
        generation_throughput=shares.get("generation_throughput"),
    )


def _stats(body: str, head: re.Match[str], meta: LineMeta) -> tuple[Event, ...]:
    """The periodic stats line: split on ', ' into 'Key: value' pairs (the field set is dynamic)."""
    engine = head.group("engine")
    if engine is not None:
        instance = str(int(engine))
        if instance != meta.instance:
            meta = LineMeta(instance=instance, rank=meta.rank, ts=meta.ts)
    elif head.group("agg") is not None:
        # The aggregated DP logger sums every engine: not one instance's numbers.
        meta = LineMeta(instance="all", rank=meta.rank, ts=meta.ts)
    text = body[head.end() - len("Avg prompt throughput") :].rstrip().removesuffix(".")
    counts: dict[str, int] = {}
    shares: dict[str, float] = {}
    try:
        for part in text.split(", "):
            key, sep, rest = part.partition(": ")
            if not sep:
                continue
            val = rest.split(" ", 1)[0]
            count, rate = _STAT_COUNTS.get(key), _STAT_RATES.get(key)
            if count is not None:
                counts[count] = int(val)
            elif rate is not None:
                shares[rate[0]] = rate[1](val)
            elif key.endswith("KV cache usage") and not key.startswith(("External", "MM")):
                # '<DEV> KV cache usage' (0.30+); V0 prints GPU then CPU (its swap space).
                share = ratio(val.removesuffix("%"))
                if "kv_usage_ratio" in shares and key == "CPU KV cache usage":
                    shares["cpu_kv_usage_ratio"] = share
                else:
                    shares.setdefault("kv_usage_ratio", share)
    except (ValueError, ArithmeticError) as exc:
        raise ParseError(f"bad stats value in {body[:80]!r}") from exc
    events: list[Event] = [usage_sample(meta, counts, shares)]
    preemptions = counts.get("preemptions")
    if preemptions is not None:
        events.append(Preemption(**ident(meta), mechanism="preempt", count=preemptions))
    return tuple(events)


def v0_hit_rate(body: str, meta: LineMeta) -> tuple[Event, ...] | None:
    """V0's prefix-cache hit-rate line; None for any other line."""
    if not body.startswith("Prefix cache hit rate: GPU"):
        return None
    m = _V0_HIT_RATE.match(body)
    return (UsageSample(**ident(meta), prefix_cache_hit_ratio=ratio(m.group("gpu"))),) if m else NO_EVENTS
