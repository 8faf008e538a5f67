"""SGLang's periodic lines: Prefill/Decode batch statistics and retractions (its preemption).

Batch lines are read as ``key: value`` pairs, never by position: the set of fields changed in almost
every release, and pasted lines lose columns. A value that is not a clean number is left out rather
than guessed, so a terminal-damaged field ('#cached-tounning-req: 45') never becomes a reading.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal

from kvwatch.core.events import Event, Preemption, UsageSample
from kvwatch.engines.sglang.common import ident as _ident
from kvwatch.engines.sglang.common import opt_float as _opt_float
from kvwatch.engines.sglang.common import opt_int as _opt_int
from kvwatch.parsers.base import NO_EVENTS, LineMeta, ParseError

# --- periodic batch lines ------------------------------------------------------------------------

# Head of every Prefill/Decode batch line; the key/value list follows. One sample per variant:
# 0.3.x        "[16:43:29 TP0] Prefill batch. #new-seq: 1, #new-token: 2062, ..."   (sglang/015, Oct 2024)
# 0.2-0.3.4    "Prefill batch(mixed #running-req: 3). #new-seq: 1, #new-token: 512, ..."
# 0.5.4        "[2025-10-01 10:00:41 TP0] Decode batch [1240], #running-req: 12, #token: 23110, ..."
# 0.5.5+       "[2026-07-21 15:00:13 TP0 EP0] Decode batch, #running-req: 24, #token: 233600, ..."
# (Possessive blanks: a run of them before a non-# is one failed attempt, not one per split.)
_BATCH_HEAD = re.compile(
    r"""
    (?P<phase>Prefill|Decode)\ batch
    (?:
        \ ?\[\d++\]\ *+,?                                # ' [1240],' (0.5.4, SGLANG_LOG_FORWARD_ITERS)
      | \(mixed\ \#running-req:\ (?P<mixed>\d+)\)\.?     # mixed chunked prefill (0.2.x-0.3.4)
      | [.,]
    )?
    \ *+(?=\#)                                           # the key/value list starts with '#new-seq' or '#running-req'
    """,
    re.VERBOSE,
)

# A clean value: the whole item after ': ' must be this, else the field was damaged and is skipped.
_INT = re.compile(r"\d+")
_DECIMAL = re.compile(r"\d+(?:\.\d+)?")
_PERCENT = re.compile(r"(?P<num>\d+(?:\.\d+)?)%")
# 0.4.9 hybrid SWA writes two pools in one item: '#token: full=1024, swa=512' (split on ',' here).
_SUBPOOL = re.compile(r"(?P<pool>full|swa)=(?P<num>\d+(?:\.\d+)?)")

# Batch-line key -> (UsageSample field, kind). Keys as printed across 0.2.15-0.5.23 (section 2).
_USAGE_KEYS: dict[str, tuple[str, str]] = {
    "#running-req": ("running", "int"),
    "#queue-req": ("waiting", "int"),
    "#token": ("used_tokens", "int"),
    "#full token": ("used_tokens", "int"),
    "#swa token": ("swa_used_tokens", "int"),
    "mamba num": ("mamba_used_slots", "int"),
    "#retracted-req": ("retracted", "int"),
    "token usage": ("kv_usage_ratio", "ratio"),
    "full token usage": ("kv_usage_ratio", "ratio"),
    "swa token usage": ("swa_usage_ratio", "ratio"),
    "mamba usage": ("mamba_usage_ratio", "ratio"),
    "cpu token usage": ("cpu_kv_usage_ratio", "ratio"),
    "cache hit rate": ("prefix_cache_hit_ratio", "percent"),
    "gen throughput (token/s)": ("generation_throughput", "float"),
    "input throughput (token/s)": ("prompt_throughput", "float"),
}
# 0.4.9 hybrid '#token: full=.., swa=..' / 'token usage: full=.., swa=..': the swa half's field.
_SWA_TWIN = {"used_tokens": "swa_used_tokens", "kv_usage_ratio": "swa_usage_ratio"}


def _convert(kind: str, value: str) -> int | float | None:
    """A batch-line value, or None when it is not a clean number (damaged column)."""
    if kind == "int":
        return int(value) if _INT.fullmatch(value) else None
    if kind == "percent":
        m = _PERCENT.fullmatch(value)
        return float(Decimal(m.group("num")) / 100) if m else None
    return float(value) if _DECIMAL.fullmatch(value) else None


class BatchValues:
    """The values of one batch line by UsageSample field: counts (``int`` keys) and the rest."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.shares: dict[str, float] = {}

    def put(self, field: str, kind: str, text: str) -> None:
        value = _convert(kind, text)
        if isinstance(value, int):
            self.counts[field] = value
        elif value is not None:
            self.shares[field] = value

    def __bool__(self) -> bool:
        return bool(self.counts or self.shares)


def _batch_fields(items: Iterator[str]) -> BatchValues:
    """Fold 'key: value' items into UsageSample fields; unknown keys and damaged values are skipped."""
    fields = BatchValues()
    last: tuple[str, str] | None = None
    for item in items:
        key, sep, raw = item.partition(":")
        if not sep:
            # The ', swa=..' half of a 0.4.9 hybrid item belongs to the key before it.
            sub = _SUBPOOL.fullmatch(item.strip())
            if last is not None and sub is not None and sub.group("pool") == "swa":
                twin = _SWA_TWIN.get(last[0])
                if twin is not None:
                    fields.put(twin, last[1], sub.group("num"))
            last = None
            continue
        spec = _USAGE_KEYS.get(key.strip())
        last = spec
        if spec is None:
            continue
        value_text = raw.strip()
        sub = _SUBPOOL.fullmatch(value_text)
        if sub is not None and sub.group("pool") == "full":
            value_text = sub.group("num")
        fields.put(spec[0], spec[1], value_text)
    return fields


def usage_sample(meta: LineMeta, values: BatchValues) -> UsageSample:
    """The sample of a batch line's values. Every field a batch line can give is named (None where
    this one has none): the fast path's events are copies of ``usage_sample(meta, BatchValues())``
    with a row's values, so both paths' events have the same fields set."""
    counts, shares = values.counts, values.shares
    return UsageSample(
        **_ident(meta),
        kv_usage_ratio=shares.get("kv_usage_ratio"),
        used_tokens=counts.get("used_tokens"),
        running=counts.get("running"),
        waiting=counts.get("waiting"),
        prefix_cache_hit_ratio=shares.get("prefix_cache_hit_ratio"),
        swa_usage_ratio=shares.get("swa_usage_ratio"),
        mamba_usage_ratio=shares.get("mamba_usage_ratio"),
        swa_used_tokens=counts.get("swa_used_tokens"),
        mamba_used_slots=counts.get("mamba_used_slots"),
        retracted=counts.get("retracted"),
        cpu_kv_usage_ratio=shares.get("cpu_kv_usage_ratio"),
        prompt_throughput=shares.get("prompt_throughput"),
        generation_throughput=shares.get("generation_throughput"),
    )


def parse_batch(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _BATCH_HEAD.search(body)
    if m is None:
        return NO_EVENTS
    fields = _batch_fields(iter(body[m.end() :].split(",")))
    if m.group("mixed") is not None and "running" not in fields.counts:
        fields.counts["running"] = int(m.group("mixed"))
    if not fields:
        raise ParseError(f"{m.group('phase')} batch line without a readable field")
    return (usage_sample(meta, fields),)


# --- retraction (SGLang's preemption) ------------------------------------------------------------

# <=0.4.6  "[2025-05-28 08:25:50] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.8024 -> 0.9085"
# 0.4.7+   "KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.3317 -> 0.5012"
# 0.5.3-4  "... #retracted_reqs: 3, #aborted_retracted_reqs: 0, #new_token_ratio: 0.3317 -> 0.5012"
# 0.5.7+   "... #retracted_reqs: 3, #new_tokens_gained: 12288, #new_token_ratio: 0.3317 -> 0.5012"
# 0.5.12+  "... #new_tokens_gained: 8192, #mamba_num_gained: 2, #new_token_ratio: ..." ('Testing retraction.' too)
# The wording before '#retracted_reqs' is not required: every wording carries that key.
_RETRACT = re.compile(
    r"""
    \#retracted_reqs:\ (?P<count>\d+)
    (?:,\ \#aborted_retracted_reqs:\ \d+)?
    (?:,\ \#new_tokens_gained:\ (?P<gained>-?\d+))?
    (?:,\ \#mamba_num_gained:\ -?\d+)?
    (?:,\ \#new_token_ratio:\ (?P<before>\d+(?:\.\d+)?)\ ->\ (?P<after>\d+(?:\.\d+)?))?
    """,
    re.VERBOSE,
)


def parse_retract(body: str, meta: LineMeta) -> tuple[Event, ...]:
    m = _RETRACT.search(body)
    if m is None:
        return NO_EVENTS
    return (
        Preemption(
            **_ident(meta),
            mechanism="retract",
            count=int(m.group("count")),
            new_token_ratio=_opt_float(m.group("after")),
            new_tokens_gained=_opt_int(m.group("gained")),
        ),
    )
