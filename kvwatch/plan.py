"""Workload planning: will these conversations fit, on which rank do they stop fitting, on which card.

A workload is a list of retained sequence lengths (prompt state included), optionally grouped by a
shared prefix. The engines allocate whole blocks (vLLM) or pages (SGLang) per sequence, so the plan
rounds each sequence up before summing, and counts a shared prefix's full blocks once per group --
prefix caching shares whole blocks only, the partial tail stays private to each sequence. Every rank
must hold its share of every sequence: the plan checks each rank's KV budget on its own and names
the rank that limits, because an aggregate fleet budget hides one short rank. The sizing itself
(bytes per token, the budget, the engine's block division) is kvwatch.capacity's; this module only
adds the workload side.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import regex

from kvwatch.capacity import (
    Deployment,
    GpuSpec,
    ModelGeometry,
    Prediction,
    gpus,
    pool_from_available,
    predict,
)
from kvwatch.errors import ConfigError
from kvwatch.units import parse_size

# Default utilisation target for the card search: vLLM's own default gpu_memory_utilization and the
# seeds' "smallest card where the total stays under 92%".
DEFAULT_TARGET = 0.92
# Cache dtypes and weight quantisations the card search tries (None = the checkpoint as it is).
CARD_KV_DTYPES: tuple[str, ...] = ("auto", "fp8")
CARD_WEIGHTS: tuple[str | None, ...] = (None, "fp8", "int4")
# A workload spec is expanded row by row, never sequence by sequence, but a typo like 1e12
# sequences should still be refused rather than planned.
MAX_SEQUENCES = 10_000_000

_ITEM = regex.compile(r"^\s*(?:(?P<count>\d+)\s*[x*]\s*)?(?P<len>\d+)\s*(?P<k>[kK])?\s*$")


@dataclass(frozen=True)
class Row:
    """``count`` sequences of ``length`` retained positions, optionally in a shared-prefix group."""

    count: int
    length: int
    group: str | None = None


@dataclass(frozen=True)
class Workload:
    """Retained lengths, as rows, and the shared prefix length of each group."""

    rows: tuple[Row, ...]
    prefixes: Mapping[str, int] = field(default_factory=dict)

    @property
    def sequences(self) -> int:
        return sum(r.count for r in self.rows)

    @property
    def tokens(self) -> int:
        """Logical positions: the plain sum of lengths (what the payload formula multiplies)."""
        return sum(r.count * r.length for r in self.rows)

    @property
    def longest(self) -> int:
        return max(r.length for r in self.rows)

    def grown(self, positions: int) -> Workload:
        """Every sequence longer by ``positions`` (each conversation keeps growing; prefixes do not)."""
        if positions == 0:
            return self
        return Workload(
            tuple(Row(r.count, r.length + positions, r.group) for r in self.rows), dict(self.prefixes)
        )

    def blocks(self, block_size: int) -> WorkloadBlocks:
        """Blocks the engine allocates: per sequence ceil(length / block), shared full blocks once."""
        b = block_size
        unshared = sum(r.count * -(-r.length // b) for r in self.rows)
        used_groups = {r.group for r in self.rows if r.group is not None}
        saved = 0
        for r in self.rows:
            if r.group is not None:
                saved += r.count * (self.prefixes[r.group] // b)
        shared = sum(self.prefixes[g] // b for g in used_groups)
        return WorkloadBlocks(
            block_size=b,
            blocks=unshared - saved + shared,
            unshared_blocks=unshared,
            shared_blocks=shared,
        )

    def greedy_fit(self, pool_tokens: int, block_size: int) -> int:
        """Sequences admitted in workload order before the pool runs out (shared blocks paid once)."""
        b = block_size
        left = pool_tokens // b
        opened: set[str] = set()
        admitted = 0
        for r in self.rows:
            shared = self.prefixes[r.group] // b if r.group is not None else 0
            own = -(-r.length // b) - shared
            if r.group is not None and r.group not in opened:
                if own + shared > left:
                    return admitted
                left -= own + shared
                opened.add(r.group)
                admitted += 1
                count = r.count - 1
            else:
                count = r.count
            take = min(count, left // own) if own > 0 else count
            admitted += take
            left -= take * own
            if take < count:
                return admitted
        return admitted


@dataclass(frozen=True)
class WorkloadBlocks:
    block_size: int
    blocks: int
    unshared_blocks: int
    shared_blocks: int

    @property
    def tokens(self) -> int:
        """Allocated positions (blocks x block size): what the pool must hold."""
        return self.blocks * self.block_size

    @property
    def saved_blocks(self) -> int:
        """Blocks prefix sharing saves against every sequence holding its own copy."""
        return self.unshared_blocks - self.blocks


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigError(f"workload: {what} must be a whole number, got {value!r}")
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(f"workload: {what} must be a whole number, got {value!r}") from None
    if number < 1:
        raise ConfigError(f"workload: {what} must be positive, got {number}")
    return number


def _length(text: str) -> int:
    m = _ITEM.match(text)
    if m is None or m.group("count"):
        raise ConfigError(f"workload: not a length: {text!r}")
    return _int(m.group("len"), "length") * (1024 if m.group("k") else 1)


def _finish(rows: list[Row], prefixes: dict[str, int]) -> Workload:
    if not rows:
        raise ConfigError("workload is empty")
    total = sum(r.count for r in rows)
    if total > MAX_SEQUENCES:
        raise ConfigError(f"workload has {total:,} sequences (at most {MAX_SEQUENCES:,})")
    for r in rows:
        if r.group is None:
            continue
        if r.group not in prefixes:
            raise ConfigError(f"workload: prefix group {r.group!r} has no prefix length")
        if prefixes[r.group] > r.length:
            raise ConfigError(
                f"workload: a {r.length}-position sequence cannot share the "
                f"{prefixes[r.group]}-position prefix of group {r.group!r}"
            )
    return Workload(tuple(rows), prefixes)


def parse_inline(spec: str) -> Workload:
    """'6x32768,20x8192', '4x32k', '8192' (k = 1024 positions); no prefix groups inline."""
    rows = []
    for item in spec.split(","):
        m = _ITEM.match(item)
        if m is None:
            raise ConfigError(
                f"workload: cannot read {item.strip()!r} (use COUNTxLENGTH items, e.g. 6x32768,20x8192)"
            )
        count = _int(m.group("count"), "count") if m.group("count") else 1
        rows.append(Row(count, _int(m.group("len"), "length") * (1024 if m.group("k") else 1)))
    return _finish(rows, {})


def _add_prefix(prefixes: dict[str, int], group: str, length: int) -> None:
    if prefixes.get(group, length) != length:
        raise ConfigError(f"workload: prefix group {group!r} has two prefix lengths")
    prefixes[group] = length


def parse_csv(text: str) -> Workload:
    """CSV with a header: ``length`` and optional ``count``, ``prefix_group``, ``prefix_length``."""
    reader = csv.DictReader(io.StringIO(text))
    fields = [f.strip() for f in reader.fieldnames or []]
    if "length" not in fields:
        raise ConfigError("workload CSV needs a header row with a 'length' column")
    rows: list[Row] = []
    prefixes: dict[str, int] = {}
    for n, raw in enumerate(reader, start=2):
        rec = {(k or "").strip(): (v or "").strip() for k, v in raw.items()}
        if not any(rec.values()):
            continue
        try:
            length = _length(rec["length"])
            count = _int(rec["count"], "count") if rec.get("count") else 1
        except ConfigError as exc:
            raise ConfigError(f"workload CSV line {n}: {exc}") from None
        group = rec.get("prefix_group") or None
        if rec.get("prefix_length"):
            if group is None:
                raise ConfigError(f"workload CSV line {n}: prefix_length without prefix_group")
            _add_prefix(prefixes, group, _length(rec["prefix_length"]))
        rows.append(Row(count, length, group))
    return _finish(rows, prefixes)


def parse_json(text: str) -> Workload:
    """A list of lengths, or {"sequences": [...], "prefix_groups": {name: length}}.

    Each sequence is a length or {"length", "count", "prefix_group", "prefix_length"}.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"workload JSON: {exc}") from None
    prefixes: dict[str, int] = {}
    if isinstance(data, dict):
        groups = data.get("prefix_groups") or {}
        if not isinstance(groups, dict):
            raise ConfigError("workload JSON: 'prefix_groups' must map group names to lengths")
        for name, length in groups.items():
            _add_prefix(prefixes, str(name), _int(length, f"prefix length of {name!r}"))
        items = data.get("sequences")
    else:
        items = data
    if not isinstance(items, list):
        raise ConfigError("workload JSON: expected a list of sequences (or {'sequences': [...]})")
    rows: list[Row] = []
    for item in items:
        if isinstance(item, dict):
            unknown = set(item) - {"length", "count", "prefix_group", "prefix_length"}
            if unknown:
                raise ConfigError(f"workload JSON: unknown field(s) {', '.join(sorted(unknown))}")
            group = item.get("prefix_group")
            group = None if group is None else str(group)
            if item.get("prefix_length") is not None:
                if group is None:
                    raise ConfigError("workload JSON: prefix_length without prefix_group")
                _add_prefix(prefixes, group, _int(item["prefix_length"], "prefix_length"))
            rows.append(Row(_int(item.get("count", 1), "count"), _int(item.get("length"), "length"), group))
        else:
            rows.append(Row(1, _int(item, "length")))
    return _finish(rows, prefixes)


def load_workload(spec: str) -> Workload:
    """An inline spec, or a .csv / .json file of lengths with optional shared-prefix groups."""
    path = Path(spec)
    if spec.lower().endswith((".csv", ".json")) or path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read workload file {spec}: {exc.strerror or exc}") from None
        return parse_json(text) if spec.lower().endswith(".json") else parse_csv(text)
    return parse_inline(spec)


def parse_rank_budgets(spec: str) -> tuple[int, ...]:
    """'52GiB' (every rank) or '7x52GiB,47GiB' (rank by rank, in rank order)."""
    out: list[int] = []
    for item in spec.split(","):
        count_text, sep, size_text = item.strip().partition("x")
        if sep and count_text.strip().isdigit():
            count = int(count_text)
            if count < 1:
                raise ConfigError(f"rank count must be positive in {item.strip()!r}")
            out += [parse_size(size_text)] * count
        else:
            out.append(parse_size(item))
    return tuple(out)


@dataclass(frozen=True)
class RankCheck:
    """One rank's KV budget against the workload's share on that rank."""

    rank: int
    budget_bytes: int
    pool_tokens: int
    needed_bytes: int
    needed_tokens: int
    fits: bool
    sequences_fit: int


@dataclass(frozen=True)
class Plan:
    """The workload against one deployment: bytes per rank, the check on every rank, growth."""

    model: str
    engine: str
    gpu_name: str | None
    tp: int
    pp: int
    kv_cache_dtype: str
    weights_dtype: str | None
    block_size: int
    bytes_per_token: int
    bytes_per_token_all_ranks: int
    max_model_len: int
    sequences: int
    logical_tokens: int
    allocated_tokens: int
    shared_blocks: int
    saved_blocks: int
    payload_bytes: int
    payload_bytes_all_ranks: int
    needed_bytes: int
    grow: int
    grow_bytes: int
    fits_before_growth: bool | None
    ranks: tuple[RankCheck, ...]
    limiting_rank: int
    ranks_differ: bool
    fits: bool
    sequences_fit: int
    copies: int
    prediction: Prediction
    notes: tuple[str, ...]

    def to_json_dict(self) -> dict[str, Any]:
        """The ``kvwatch plan --json`` object for this deployment (bytes as integers)."""
        return {
            "model": self.model,
            "engine": self.engine,
            "gpu": self.gpu_name,
            "tp": self.tp,
            "pp": self.pp,
            "kv_cache_dtype": self.kv_cache_dtype,
            "weights_dtype": self.weights_dtype,
            "block_size": self.block_size,
            "bytes_per_token": self.bytes_per_token,
            "bytes_per_token_all_ranks": self.bytes_per_token_all_ranks,
            "max_model_len": self.max_model_len,
            "workload": {
                "sequences": self.sequences,
                "logical_tokens": self.logical_tokens,
                "allocated_tokens": self.allocated_tokens,
                "shared_blocks": self.shared_blocks,
                "saved_blocks": self.saved_blocks,
                "grow": self.grow,
            },
            "payload_bytes_per_rank": self.payload_bytes,
            "payload_bytes_all_ranks": self.payload_bytes_all_ranks,
            "needed_bytes_per_rank": self.needed_bytes,
            "grow_bytes_per_rank": self.grow_bytes,
            "fits_before_growth": self.fits_before_growth,
            "ranks": [
                {
                    "rank": r.rank,
                    "kv_budget_bytes": r.budget_bytes,
                    "pool_tokens": r.pool_tokens,
                    "needed_bytes": r.needed_bytes,
                    "fits": r.fits,
                    "sequences_fit": r.sequences_fit,
                }
                for r in self.ranks
            ],
            "limiting_rank": self.limiting_rank if self.ranks_differ else None,
            "fits": self.fits,
            "sequences_fit": self.sequences_fit,
            "copies": self.copies,
            "weights_bytes_per_rank": self.prediction.weights_bytes,
            "notes": list(self.notes),
        }


def _pool_tokens(model: ModelGeometry, d: Deployment, budget: int) -> int:
    return pool_from_available(model, d, budget)[0] if budget > 0 else 0


def make_plan(
    model: ModelGeometry,
    deployment: Deployment,
    workload: Workload,
    grow: int = 0,
    rank_kv_bytes: Sequence[int] | None = None,
) -> Plan:
    """Check ``workload`` (grown by ``grow`` positions per sequence) on every rank of ``deployment``.

    Without ``rank_kv_bytes`` every rank gets the KV budget kvwatch.capacity predicts for the card;
    with it (one value, or one per rank in rank order), those are the ranks' KV budgets.
    """
    if grow < 0:
        raise ConfigError(f"--grow must not be negative, got {grow}")
    ranks_n = deployment.tp * deployment.pp
    notes: list[str] = []
    if rank_kv_bytes is not None:
        if len(rank_kv_bytes) not in (1, ranks_n):
            raise ConfigError(
                f"{len(rank_kv_bytes)} rank budgets given for {ranks_n} ranks (tp x pp); give one or {ranks_n}"
            )
        budgets = tuple(rank_kv_bytes) * (ranks_n if len(rank_kv_bytes) == 1 else 1)
        pred = predict(model, deployment.with_(available_kv_bytes=min(budgets)))
    else:
        pred = predict(model, deployment)
        budgets = (pred.available_kv_bytes,) * ranks_n
    block = pred.block_size
    bpt = pred.bytes_per_token
    grown = workload.grown(grow)
    wb = grown.blocks(block)
    needed = wb.tokens * bpt
    pools: dict[int, int] = {}
    checks = []
    for rank, budget in enumerate(budgets):
        if budget not in pools:
            pools[budget] = _pool_tokens(model, deployment, budget)
        pool = pools[budget]
        checks.append(
            RankCheck(
                rank=rank,
                budget_bytes=budget,
                pool_tokens=pool,
                needed_bytes=needed,
                needed_tokens=wb.tokens,
                fits=budget > 0 and needed <= budget and wb.tokens <= pool,
                sequences_fit=grown.greedy_fit(pool, block),
            )
        )
    limiting = min(checks, key=lambda c: (c.pool_tokens, c.budget_bytes, c.rank))
    fits_before: bool | None = None
    grow_bytes = 0
    if grow:
        base = workload.blocks(block)
        grow_bytes = needed - base.tokens * bpt
        fits_before = base.tokens * bpt <= limiting.budget_bytes and base.tokens <= limiting.pool_tokens
    if grown.longest > pred.max_model_len:
        notes.append(
            f"the longest sequence ({grown.longest:,}) exceeds max_model_len {pred.max_model_len:,}: "
            "the engine rejects it; raise --max-model-len"
        )
    if pred.kv_groups is not None and pred.kv_groups > 1 or pred.swa_pool_tokens is not None:
        notes.append("sliding-window layers keep only their window: the payload counts the growing layers")
    if not pred.exact:
        notes.append("the pool of this model is an estimate (see kvwatch predict)")
    if pred.weights_bytes is not None and rank_kv_bytes is None and pred.available_kv_bytes <= 0:
        notes.append("the weights leave no KV budget on this card")
    return Plan(
        model=pred.model,
        engine=pred.engine,
        gpu_name=pred.gpu_name,
        tp=deployment.tp,
        pp=deployment.pp,
        kv_cache_dtype=_kv_label(model, pred.kv_cache_dtype),
        weights_dtype=deployment.weights_dtype,
        block_size=block,
        bytes_per_token=bpt,
        bytes_per_token_all_ranks=pred.bytes_per_token_all_ranks,
        max_model_len=pred.max_model_len,
        sequences=grown.sequences,
        logical_tokens=grown.tokens,
        allocated_tokens=wb.tokens,
        shared_blocks=wb.shared_blocks,
        saved_blocks=wb.saved_blocks,
        payload_bytes=grown.tokens * bpt,
        payload_bytes_all_ranks=grown.tokens * pred.bytes_per_token_all_ranks,
        needed_bytes=needed,
        grow=grow,
        grow_bytes=grow_bytes,
        fits_before_growth=fits_before,
        ranks=tuple(checks),
        limiting_rank=limiting.rank,
        ranks_differ=len(set(budgets)) > 1,
        fits=all(c.fits for c in checks) and grown.longest <= pred.max_model_len,
        sequences_fit=limiting.sequences_fit,
        copies=limiting.pool_tokens // wb.tokens if wb.tokens else 0,
        prediction=pred,
        notes=tuple(notes),
    )


@dataclass(frozen=True)
class CardFit:
    """One card (x tp x pp) for one cache dtype and weight quantisation, at the utilisation target."""

    gpu: GpuSpec
    kv_cache_dtype: str
    weights: str
    fits: bool
    kv_budget_bytes: int
    pool_tokens: int
    needed_tokens: int
    weights_bytes: int | None

    @property
    def pool_use(self) -> float | None:
        """Share of the pool the workload takes (above 1: it does not fit)."""
        return self.needed_tokens / self.pool_tokens if self.pool_tokens > 0 else None


def _kv_label(model: ModelGeometry, kv: str) -> str:
    """'auto' resolved to the model dtype it stands for (bf16, fp16)."""
    return model.dtype.replace("bfloat16", "bf16").replace("float16", "fp16") if kv == "auto" else kv


def card_fits(
    model: ModelGeometry,
    base: Deployment,
    workload: Workload,
    target: float = DEFAULT_TARGET,
    cards: Iterable[GpuSpec] | None = None,
    kv_dtypes: Sequence[str] = CARD_KV_DTYPES,
    weights: Sequence[str | None] = CARD_WEIGHTS,
) -> list[CardFit]:
    """Every card x cache dtype x weight quantisation, with the budget under ``target``.

    The target replaces the engine's memory fraction (vLLM gpu_memory_utilization, SGLang
    mem_fraction_static): weights, the non-KV allowance and the workload's KV must stay under it.
    """
    if not 0 < target < 1:
        raise ConfigError(f"--target must be in (0, 1), got {target}")
    chosen = sorted(cards if cards is not None else gpus.CATALOGUE, key=lambda g: g.memory_bytes)
    fraction = (
        {"gpu_memory_utilization": target} if base.engine == "vllm" else {"mem_fraction_static": target}
    )
    out: list[CardFit] = []
    for kv in kv_dtypes:
        for w in weights:
            for card in chosen:
                d = base.with_(
                    gpu_memory_bytes=card.memory_bytes,
                    gpu_name=card.name,
                    kv_cache_dtype=kv,
                    weights_dtype=w,
                    **fraction,
                )
                pred = predict(model, d)
                needed = workload.blocks(pred.block_size).tokens
                pool = pred.kv_pool_tokens if pred.available_kv_bytes > 0 else 0
                out.append(
                    CardFit(
                        gpu=card,
                        kv_cache_dtype=_kv_label(model, kv),
                        weights=w or f"checkpoint ({pred.weights_scheme})",
                        fits=pool > 0 and needed <= pool and workload.longest <= pred.max_model_len,
                        kv_budget_bytes=pred.available_kv_bytes,
                        pool_tokens=pool,
                        needed_tokens=needed,
                        weights_bytes=pred.weights_bytes,
                    )
                )
    return out


def smallest_cards(fits: Sequence[CardFit]) -> dict[tuple[str, str], CardFit | None]:
    """(cache dtype, weights) -> the smallest card that fits (None when none does)."""
    out: dict[tuple[str, str], CardFit | None] = {}
    for f in fits:
        key = (f.kv_cache_dtype, f.weights)
        if key not in out:
            out[key] = None
        current = out[key]
        if f.fits and (current is None or f.gpu.memory_bytes < current.gpu.memory_bytes):
            out[key] = f
    return out
