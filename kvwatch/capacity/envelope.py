"""The calibration envelope: which deployments the a-priori model was checked on, and how much wider
its band is for a deployment outside it.

A deployment is described on seven axes (card family, release, architecture class, modality,
quantisation, parallelism, KV connector). Each engine keeps ONE table (kvwatch/engines/<engine>/
envelope.py, written by ``python -m bench.bench_accuracy --write``) of the values its real startups
cover (a value counts only with enough cases from enough independent sources, bench/accuracy_loso.py
MIN_COVER / MIN_SOURCES), the band of each modelled term sized from leave-one-source-out error, a
floor no modelled band goes below (the leave-one-source-out error of the cell nearest the calibrated
one), and per axis the widening a value outside the envelope adds -- itself sized from the
leave-one-source-out error of the cases that were outside the other sources' envelope on that axis.
``predict`` names every uncovered value ("not calibrated: A100 class, release 0.10, vision tower")
and the band it prints, which the drift alert's config-basis tolerance follows, is widened by each.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from kvwatch.capacity import gpus
from kvwatch.capacity.architectures import is_read
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.model import ModelGeometry
from kvwatch.core.versions import version_tuple

Axis = Literal["card", "release", "architecture", "modality", "quantization", "parallelism", "connector"]
AXES: tuple[Axis, ...] = (
    "card",
    "release",
    "architecture",
    "modality",
    "quantization",
    "parallelism",
    "connector",
)

# Not a card family: every card kvwatch does not know, whatever its memory. Never calibrated, however
# many startups ran on such cards (three sources' 44, 79 and 40 GiB cards are three different cards).
UNLISTED_CARD = "unlisted card"
_FORM = re.compile(r"-(?:SXM|PCIE|NVL|HBM3|ECC-OFF)\b.*|-\d+GB.*", re.IGNORECASE)


def card_family(gpu_name: str | None, total_bytes: int | None = None) -> str:
    """'H100-SXM-80GB' -> 'H100', 'RTX-4090-24GB' -> 'RTX-4090'. A card given only by its memory
    is the catalogue card whose measured total it is exactly (a log's 79.19 GiB is an H100), else
    'unlisted card'."""
    card = gpus.find(gpu_name)
    if card is None and total_bytes is not None:
        card = next((c for c in gpus.CATALOGUE if c.total_measured and c.total_bytes == total_bytes), None)
    if card is None:
        return UNLISTED_CARD
    return _FORM.sub("", card.name).upper()


def release_bucket(version: str | None, newest_read: str) -> str:
    """The release a version falls in, to the precision of ``newest_read`` ('0.33' buckets vLLM by
    minor release, '0.5.23' SGLang by patch release, where its rules move); no version is the
    newest read, whose rules apply; past it, 'newer than X'."""
    newest = version_tuple(newest_read)
    v = version_tuple(version) or newest
    if v is None or newest is None:
        return newest_read
    parts = len(newest)
    head = tuple(v[:parts]) + (0,) * max(0, parts - len(v))
    if head > tuple(newest):
        return f"newer than {newest_read}"
    return ".".join(str(x) for x in head)


def architecture_class(model: ModelGeometry) -> str:
    """The layer layout class: what decides which of the engine's rules apply."""
    kinds = {layer.kind for layer in model.layers}
    if not is_read(model.model_type):
        return f"unread model_type {model.model_type or '(none)'}"
    if kinds & {"linear", "mamba"}:
        return "hybrid linear-attention"
    if any(layer.extra_bytes_per_token for layer in model.layers):
        return "sparse MLA (indexer)"
    if "mla" in kinds:
        return "MLA"
    if kinds & {"sliding", "chunked"}:
        return "sliding-window" if "full" in kinds else "all sliding-window"
    dims = model.dims
    return "MoE" if dims is not None and dims.n_experts else "dense"


def conditions(model: ModelGeometry, d: Deployment, newest_read: str) -> dict[Axis, str]:
    """The deployment's value on every axis of the envelope."""
    dims = model.dims
    quant = (d.quantization or "").lower() or (dims.checkpoint_quant if dims is not None else None)
    if d.dp_attention and d.dp > 1:
        parallel = "dp attention"
    elif d.pp > 1:
        parallel = "pp >= 2"
    elif d.tp > 1:
        parallel = "tp >= 2"
    else:
        parallel = "tp 1"
    return {
        "card": card_family(d.gpu_name, d.gpu_memory_bytes),
        "release": release_bucket(d.engine_version, newest_read),
        "architecture": architecture_class(model),
        "modality": "vision tower" if dims is not None and dims.has_vision_tower else "text",
        "quantization": quant or "none",
        "parallelism": parallel,
        "connector": d.kv_connector or "none",
    }


# How an uncovered value is named in `predict`'s "not calibrated:" line.
_LABELS: dict[Axis, str] = {
    "card": "{} class",
    "release": "release {}",
    "architecture": "{}",
    "modality": "{}",
    "quantization": "{} weights",
    "parallelism": "{}",
    "connector": "KV connector {}",
}


@dataclass(frozen=True)
class Envelope:
    """One engine's calibration envelope (see the module docstring). Fractions are of the usable
    memory (the requested / static-fraction bytes of one rank)."""

    newest_read: str
    covered: Mapping[Axis, frozenset[str]]
    # Per modelled term, the band as a fraction of the term (leave-one-source-out quantile); what
    # their quadrature sum misses on the cases inside the envelope, the floor covers.
    term_bands: Mapping[str, float]
    # Per axis, the widening of an uncovered value, as a fraction of the usable memory.
    widening: Mapping[Axis, float]
    # The cases (by source) each figure comes from.
    cases: Mapping[str, str]
    # The narrowest band of a prediction with a modelled term, as a fraction of the usable memory.
    floor: float = 0.0

    def uncovered(self, conds: Mapping[Axis, str]) -> list[tuple[Axis, str]]:
        """The axes whose value no calibration case has, in AXES order."""
        return [
            (axis, conds[axis]) for axis in AXES if conds[axis] not in self.covered.get(axis, frozenset())
        ]

    def widen(self, band: int, usable: int, uncovered: list[tuple[Axis, str]], modelled: bool = True) -> int:
        """The band, never narrower than the floor where a term is modelled (figures all given
        carry no model error), with each uncovered condition's widening added in quadrature."""
        if modelled:
            band = max(band, int(self.floor * usable))
        extra = sum(
            (self.widening.get(axis, max(self.widening.values(), default=0.0)) * usable) ** 2
            for axis, _ in uncovered
        )
        return int(math.sqrt(band**2 + extra))


def label(axis: Axis, value: str) -> str:
    """'A100 class', 'release 0.10', 'vision tower', ..."""
    return _LABELS[axis].format(value)


def not_calibrated_note(
    uncovered: list[tuple[Axis, str]], engine: str, version: str | None, newest: str
) -> str:
    """The assumption line that names what the calibration set does not cover."""
    note = (
        "not calibrated: " + ", ".join(label(a, v) for a, v in uncovered) + " (the band is widened for each)"
    )
    if any(a == "release" and v.startswith("newer") for a, v in uncovered):
        note += f"; {engine} {version} is predicted with the rules of the newest release read, {newest}"
    return note


class Current:
    """The envelope an engine's predictions use now: its table, unless the accuracy report swapped
    in the one fitted without the source it holds out (``using``)."""

    def __init__(self, table: Envelope) -> None:
        self._stack = [table]

    def get(self) -> Envelope:
        return self._stack[-1]

    @contextmanager
    def using(self, envelope: Envelope) -> Iterator[None]:
        self._stack.append(envelope)
        try:
            yield
        finally:
            self._stack.pop()
