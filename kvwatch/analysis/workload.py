"""Workloads: retained sequence lengths, optionally grouped by a shared prefix, and their blocks.

Read from an inline spec ('200x4k,50x32k'), CSV or JSON. The engines allocate whole blocks (vLLM)
or pages (SGLang) per sequence, so a workload's blocks round each sequence up before summing and
count a shared prefix's full blocks once per group -- prefix caching shares whole blocks only, the
partial tail stays private to each sequence.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvwatch.capacity.deployment import MAX_GPU_MEMORY_BYTES, MAX_RANKS, MAX_TOKENS, MIN_TERM_BYTES
from kvwatch.core.errors import ConfigError
from kvwatch.core.units import parse_size

# A workload spec is expanded row by row, never sequence by sequence, but a typo like 1e12
# sequences should still be refused rather than planned.
MAX_SEQUENCES = 10_000_000

# (Possessive blanks: a long run of them is refused in one pass.)
_ITEM = re.compile(r"^\s*(?:(?P<count>\d+)\s*[x*]\s*)?(?P<len>\d+)\s*+(?P<k>[kK])?\s*+$")


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
        longest = max(r.length for r in self.rows) + positions
        if positions < 0 or longest > MAX_TOKENS:
            raise ConfigError(
                f"growing by {positions:,} positions makes sequences of {longest:,}, over the plausible "
                f"maximum {MAX_TOKENS:,}"
            )
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
    if number > MAX_TOKENS:
        raise ConfigError(f"workload: {what} {number:,} is over the plausible maximum {MAX_TOKENS:,}")
    return number


def _length(text: str) -> int:
    m = _ITEM.match(text)
    if m is None or m.group("count"):
        raise ConfigError(f"workload: not a length: {text!r}")
    return _bounded(_int(m.group("len"), "length") * (1024 if m.group("k") else 1))


def _bounded(length: int) -> int:
    if length > MAX_TOKENS:
        raise ConfigError(f"workload: length {length:,} is over the plausible maximum {MAX_TOKENS:,}")
    return length


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
        rows.append(Row(count, _bounded(_int(m.group("len"), "length") * (1024 if m.group("k") else 1))))
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
    except RecursionError:
        raise ConfigError("workload JSON nests too deeply") from None
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
        except UnicodeDecodeError:
            raise ConfigError(f"workload file {spec} is not UTF-8 text") from None
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
            if len(out) + count > MAX_RANKS:
                raise ConfigError(f"{len(out) + count:,} ranks is over the plausible maximum {MAX_RANKS:,}")
            out += [_rank_budget(size_text)] * count
        else:
            if len(out) + 1 > MAX_RANKS:
                raise ConfigError(f"{len(out) + 1:,} ranks is over the plausible maximum {MAX_RANKS:,}")
            out.append(_rank_budget(item))
    return tuple(out)


def _rank_budget(text: str) -> int:
    """One rank's KV budget: 1 MiB to the largest card (a unit-less '52' is bytes, refused)."""
    return parse_size(text, minimum=MIN_TERM_BYTES, maximum=MAX_GPU_MEMORY_BYTES)
