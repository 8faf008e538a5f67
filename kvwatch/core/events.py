"""Typed events: what a parser (log line or /metrics sample) tells kvwatch about one engine instance.

Every parser returns these; nothing downstream looks at text again. Events carry only what the
engine printed or exposed (no clock, no derived figures): the state layer combines them and the
capacity model predicts beside them. Sizes are integer bytes, interpreted as the engine meant them
(vLLM's 'GB' before 0.8.5 and SGLang's 'GB' are GiB). Ratios are 0-1.

Identity: ``instance`` is the engine instance inside one source -- the data-parallel rank or V1
engine index ("0" when the engine is not data-parallel); ``rank`` is the TP/PP worker that printed
the line when the prefix names one. Capacity facts repeated by several TP ranks are one fact: the
state keeps one pool per instance and replaces it, never sums it.

Each fact field is declared once, in a fact-field class (``SettingsFields``, ``MemoryFields``,
``PoolFields``, ``UsageFields``, ``FailureFields``): the event inherits its fields from it, and so
does the state's fact group of the same facts (kvwatch/state/facts.py), so the two cannot disagree
on a name or a type. The fact-field classes are frozen dataclasses that generate no methods: in an
event they only give pydantic (and mypy) their fields, which pydantic validates like its own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Annotated, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from kvwatch.core.kinds import EngineName
from kvwatch.core.labels import FailureReason
from kvwatch.core.labels import Origin as Origin  # re-exported: events carry it

# The value of one event field, where a parser gathers fields by name before building the event.
EventValue = str | int | float | bool | None


class _Event(BaseModel, frozen=True):
    """Fields every event has. (``frozen=True`` is given on every event class: mypy reads it there.)"""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    engine: EngineName
    instance: str = "0"
    rank: int | None = None
    origin: Origin = "log"
    # Timestamp exactly as the line printed it (engines print no year); None when absent.
    ts: str | None = None


class EventIdentity(TypedDict):
    """The identity fields a parser gives every event of one line (``Event(**identity, ...)``)."""

    engine: EngineName
    instance: str
    rank: int | None
    ts: str | None


# A fact-field class is a dataclass for its fields alone (kw-only and frozen, as the events and the
# groups that inherit them are): it generates no method, so an event keeps pydantic's __init__,
# __eq__, __hash__ and __repr__. (Spelled out on each: mypy reads only a literal @dataclass call.)


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False, match_args=False)
class SettingsFields:
    """What an engine printed about its settings."""

    version: str | None = None
    model: str | None = None
    served_model_name: str | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    data_parallel_size: int | None = None
    decode_context_parallel_size: int | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    quantization: str | None = None
    block_size: int | None = None
    page_size: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = None
    gpu_memory_utilization: float | None = None
    mem_fraction_static: float | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    # SGLang --enable-dp-attention: attention data-parallel over the dp ranks (attention TP = tp / dp,
    # a pool per DP rank); server_args' enable_dp_attention.
    dp_attention: bool | None = None
    # --language-model-only (vLLM 0.17+, SGLang 0.5.18+): a multimodal checkpoint served as text.
    language_model_only: bool | None = None
    # vLLM --limit-mm-per-prompt ('image=0,video=0', sorted) and --skip-mm-profiling, from the args line.
    mm_limits: str | None = None
    skip_mm_profiling: bool | None = None
    # vLLM's runner ('runner': 'pooling', or a pooling 'task' of 0.7-0.12): a pooler, not a sampler.
    runner: Literal["generate", "pooling"] | None = None
    engine_generation: Literal["v0", "v1"] | None = None
    # Whether the top-p/top-k sampler runs FlashInfer's kernels (False: the engine logged that it
    # falls back to its own, a fact of the install that sizes the profile run's sampler).
    flashinfer_sampler: bool | None = None


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False, match_args=False)
class MemoryFields:
    """The terms of the startup memory budget."""

    total_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    requested_bytes: int | None = None
    weights_bytes: int | None = None
    activation_bytes: int | None = None
    non_torch_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    available_kv_bytes: int | None = None
    # SGLang: free memory reported after loading weights ('Load weight end ... avail mem=') and
    # after allocating the pool ('Memory pool end. avail mem=').
    avail_after_weights_bytes: int | None = None
    avail_after_pool_bytes: int | None = None
    # SGLang: free memory before loading weights ('Load weight begin. avail mem='; the base its
    # KV budget is a fraction of) and once fully started ('max_total_num_tokens=...,
    # available_gpu_mem=': the headroom left for activations at serve time).
    avail_before_weights_bytes: int | None = None
    avail_after_startup_bytes: int | None = None
    mem_fraction_static: float | None = None


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False, match_args=False)
class PoolFields:
    """One KV pool the engine allocated (its kind is the event's, not a fact)."""

    tokens: int | None = None
    blocks: int | None = None
    cpu_blocks: int | None = None
    block_size: int | None = None
    # Bytes of the pool on one rank (SGLang's K size + V size, or its single KV size).
    bytes: int | None = None
    max_concurrency: float | None = None
    max_concurrency_tokens: int | None = None
    # Mamba/linear-attention state slots (SGLang 'Mamba Cache is allocated. max_mamba_cache_size').
    state_slots: int | None = None
    # Layers of padding a hybrid model's KV groups were filled up with (memory that holds no
    # layer's cache), and the share of the KV memory the engine says that wastes at most (vLLM
    # 'Add 1 padding layers, may waste at most 3.45% KV cache memory').
    padding_layers: int | None = None
    padding_waste_ratio: float | None = None


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False, match_args=False)
class UsageFields:
    """How full the pool is and how busy the engine is."""

    kv_usage_ratio: float | None = None
    used_tokens: int | None = None
    running: int | None = None
    waiting: int | None = None
    swapped: int | None = None
    prefix_cache_hit_ratio: float | None = None
    swa_usage_ratio: float | None = None
    mamba_usage_ratio: float | None = None
    # SGLang hybrid pools: '#swa token' (sliding-window pool tokens) and 'mamba num' (state slots).
    swa_used_tokens: int | None = None
    mamba_used_slots: int | None = None
    # SGLang PD decode '#retracted-req': requests retracted and waiting to be re-admitted (a queue
    # length, not a count of new retractions -- those are Preemption events).
    retracted: int | None = None
    cpu_kv_usage_ratio: float | None = None
    prompt_throughput: float | None = None
    generation_throughput: float | None = None


@dataclass(frozen=True, kw_only=True, init=False, repr=False, eq=False, match_args=False)
class FailureFields:
    """Why the engine refused to start, with the figures it gave."""

    reason: FailureReason
    needed_kv_bytes: int | None = None
    available_kv_bytes: int | None = None
    max_model_len: int | None = None
    max_tokens_in_cache: int | None = None
    estimated_max_model_len: int | None = None
    # The free-memory check at start: the card's free and total memory then, and what the
    # utilisation asked for (other processes held total - free).
    free_bytes: int | None = None
    total_bytes: int | None = None
    requested_bytes: int | None = None
    gpu_memory_utilization: float | None = None


# Each event is (its fact fields, its head): the head (kind and what else is not a fact) comes
# after the identity and before the facts in the event's fields, as its JSON has always listed them.
class _SettingsHead(_Event, frozen=True):
    kind: Literal["settings"] = "settings"
    starts_engine: bool = False


class EngineSettings(SettingsFields, _SettingsHead, frozen=True):
    """Settings an engine printed at startup (banner, args, config line, server_args).

    ``starts_engine`` is True for lines that only appear once per engine start (the version banner,
    'Initializing ... engine', server_args), so the state opens a new epoch on them.
    """


class _MemoryHead(_Event, frozen=True):
    kind: Literal["memory"] = "memory"


class MemoryBudget(MemoryFields, _MemoryHead, frozen=True):
    """Terms of the startup memory budget, as printed (any subset per line)."""


PoolKind = Literal["full", "swa", "mamba"]


class _PoolHead(_Event, frozen=True):
    kind: Literal["pool"] = "pool"
    pool: PoolKind = "full"


class PoolSized(PoolFields, _PoolHead, frozen=True):
    """The KV pool the engine allocated (any subset per line; the state merges one startup's lines)."""


class _UsageHead(_Event, frozen=True):
    kind: Literal["usage"] = "usage"


class UsageSample(UsageFields, _UsageHead, frozen=True):
    """A periodic stats line or /metrics scrape: how full the pool is and how busy the engine is."""


class Preemption(_Event, frozen=True):
    """Requests evicted from the KV cache: vLLM preemptions, SGLang retractions.

    ``total`` is a cumulative count the engine reported (vLLM V0's
    total_num_cumulative_preemption, a /metrics counter); ``count`` is a number of new preemptions
    in this report (vLLM V1's per-interval 'Preemptions: N', SGLang's #retracted_reqs). The state
    keeps one monotonic counter per epoch from either form.
    """

    kind: Literal["preemption"] = "preemption"
    mechanism: Literal["preempt", "retract"] = "preempt"
    total: int | None = None
    count: int | None = None
    new_token_ratio: float | None = None
    new_tokens_gained: int | None = None


class _FailureHead(_Event, frozen=True):
    kind: Literal["startup_failure"] = "startup_failure"


class StartupFailure(FailureFields, _FailureHead, frozen=True):
    """The engine refused to start for lack of KV-cache memory."""


class CounterReset(_Event, frozen=True):
    """A /metrics counter went backwards: the engine restarted between two scrapes."""

    kind: Literal["counter_reset"] = "counter_reset"
    metric: str
    previous: float
    current: float


DisagreementFact = Literal["pool_tokens", "pool_blocks", "block_size", "kv_usage_ratio"]


class Disagreement(_Event, frozen=True):
    """The log and /metrics give different values for the same fact (beyond rounding)."""

    kind: Literal["disagreement"] = "disagreement"
    fact: DisagreementFact
    log_value: float
    metrics_value: float


# --- Plausibility bounds ----------------------------------------------------------------------------
# The closed range of every number an event carries (field name -> range): what an engine could mean.
# The state refuses a value outside it before it enters (counted in kvwatch_bad_values_total{fact})
# and keeps the rest of the event. A log line 'GPU KV cache size: 1' + 309 zeros is no pool (issue
# 22): it broke every /metrics render and every state file. Each range is far past any deployment,
# so it never refuses a real figure, and small enough that every product the collector forms
# (blocks x block size, used / pool) stays a finite float and every saved number fits 64 bits.
_COUNT = (0.0, float(2**40))  # tokens, blocks, requests, slots: ~1.1e12, 1000x the largest pool
_SIGNED_COUNT = (-float(2**40), float(2**40))  # SGLang prints -1 for 'off'; vLLM V0 a negative cache
_BYTES = (0.0, float(2**50))  # 1 PiB on one rank
_SIGNED_BYTES = (-float(2**50), float(2**50))  # a budget the engine found short ('-1.05 GiB' for KV)
_RATIO = (0.0, 1.0)
_PARALLEL = (1.0, float(2**16))  # GPUs in one TP/PP/DP group
_RATE = (0.0, 1e12)  # tokens per second
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "rank": (0.0, float(2**16)),
    # settings
    "tensor_parallel_size": _PARALLEL,
    "pipeline_parallel_size": _PARALLEL,
    "data_parallel_size": _PARALLEL,
    "decode_context_parallel_size": _PARALLEL,
    "block_size": (1.0, float(2**20)),
    "page_size": (1.0, float(2**20)),
    "max_model_len": _COUNT,
    "max_num_seqs": _SIGNED_COUNT,
    "max_num_batched_tokens": _SIGNED_COUNT,
    "chunked_prefill_size": _SIGNED_COUNT,
    "cuda_graph_max_bs": _SIGNED_COUNT,
    "gpu_memory_utilization": _RATIO,
    "mem_fraction_static": _RATIO,
    # memory
    "total_bytes": _BYTES,
    "requested_bytes": _BYTES,
    "weights_bytes": _BYTES,
    "activation_bytes": _BYTES,
    "non_torch_bytes": _SIGNED_BYTES,
    "cuda_graph_bytes": _SIGNED_BYTES,
    "available_kv_bytes": _SIGNED_BYTES,
    "free_bytes": _BYTES,
    "avail_after_weights_bytes": _BYTES,
    "avail_after_pool_bytes": _BYTES,
    "avail_before_weights_bytes": _BYTES,
    "avail_after_startup_bytes": _BYTES,
    # pool
    "tokens": _COUNT,
    "blocks": _COUNT,
    "cpu_blocks": _COUNT,
    "bytes": _BYTES,
    "max_concurrency": _COUNT,
    "max_concurrency_tokens": _COUNT,
    "state_slots": _COUNT,
    "padding_layers": _COUNT,
    "padding_waste_ratio": _RATIO,
    # usage
    "kv_usage_ratio": _RATIO,
    "prefix_cache_hit_ratio": _RATIO,
    "swa_usage_ratio": _RATIO,
    "mamba_usage_ratio": _RATIO,
    "cpu_kv_usage_ratio": _RATIO,
    "used_tokens": _COUNT,
    "running": _COUNT,
    "waiting": _COUNT,
    "swapped": _COUNT,
    "swa_used_tokens": _COUNT,
    "mamba_used_slots": _COUNT,
    "retracted": _COUNT,
    "prompt_throughput": _RATE,
    "generation_throughput": _RATE,
    # preemption
    "total": _COUNT,
    "count": _COUNT,
    "new_token_ratio": (0.0, float(2**20)),
    "new_tokens_gained": _COUNT,
    # startup failure
    "needed_kv_bytes": _SIGNED_BYTES,
    "max_tokens_in_cache": _SIGNED_COUNT,
    "estimated_max_model_len": _SIGNED_COUNT,
}
# Longest text fact (a model path, a version, a dtype) kept: the state file holds up to 4096.
MAX_TEXT_CHARS = 1024
# Events whose numbers are comparisons or raw counter readings, not facts the state keeps as such.
UNBOUNDED_EVENTS = ("counter_reset", "disagreement")


Event = Annotated[
    EngineSettings
    | MemoryBudget
    | PoolSized
    | UsageSample
    | Preemption
    | StartupFailure
    | CounterReset
    | Disagreement,
    Field(discriminator="kind"),
]


@functools.cache
def _event_adapter() -> TypeAdapter[Event]:
    """The discriminated-union validator, built on first use: the sidecar never reads events back
    from JSON, and building it costs a few MiB of resident memory."""
    return TypeAdapter(Event)


def event_to_json(event: Event) -> str:
    """One event as compact JSON without null fields (the golden-file and --events format)."""
    return event.model_dump_json(exclude_none=True)


def event_from_json(text: str) -> Event:
    """Inverse of event_to_json."""
    return _event_adapter().validate_json(text)
