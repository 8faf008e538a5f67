"""The demo's fault, explained: kvwatch's budget rebuild of the healthy start and of the restart,
and the attribution `kvwatch explain` prints of the change between them -- the headline term, and
what it leaves of the change, computed."""

from __future__ import annotations

from collections.abc import Iterable

from kvwatch.analysis.attribution import attribute_gap, observed_budget
from kvwatch.capacity import gpus
from kvwatch.capacity.budget import Budget, Contribution
from kvwatch.core.kinds import EngineName
from kvwatch.core.units import GiB
from kvwatch.engines import registry
from kvwatch.sources.pipeline import LinePipeline
from kvwatch.state.fleet import Fleet

# Read by the fault's explanation: what each memory term is, as `kvwatch explain` names them.
_TERM_LABELS = {
    "non_torch": "non_torch (GPU total - free memory before weights)",
    "total": "GPU total",
    "usable": "usable memory (x memory fraction)",
    "weights": "weights",
    "activation": "activation reserve",
    "utilisation": "memory fraction",
}


def _start_budget(
    name: str, card: str | None, lines: list[str]
) -> tuple[EngineName | None, int | None, Budget | None]:
    """(engine kind, pool tokens, budget) kvwatch reads from one start's lines."""
    fleet = Fleet()
    pipe = LinePipeline(name, fleet)
    for line in lines:
        pipe.feed(line)
    snaps = fleet.snapshot()
    if not snaps or pipe.engine is None:
        return None, None, None
    snap = snaps[0]
    spec = gpus.find(card)
    total = spec.total_bytes if spec is not None else None
    budget = observed_budget(
        registry.ENGINES[snap.engine], snap.memory, snap.pool, snap.settings, gpu_memory_bytes=total
    )
    return pipe.engine, snap.pool.tokens, budget


def explain_restart(
    name: str, card: str | None, first: list[str], restart_lines: list[str]
) -> tuple[int | None, int | None, str]:
    """(pool before, pool after, the term that explains the change) of a restart, from kvwatch's
    budget rebuild of each start (the same attribution `kvwatch explain` prints), on ``card``."""
    kind, before, healthy = _start_budget(name, card, first)
    _, after, restart = _start_budget(name, card, restart_lines)
    attribution = None
    if kind is not None and healthy is not None and restart is not None:
        attribution = attribute_gap(
            registry.ENGINES[kind], restart.as_bytes(), healthy.as_bytes(), restart.fraction, healthy.fraction
        )
    if attribution is None or not attribution.main_terms() or healthy is None:
        return before, after, "kvwatch cannot split this change by term"
    main = attribution.main_terms()[0]
    label = _TERM_LABELS.get(main.term, main.term)
    moved = f"{_gib(main.predicted)} -> {_gib(main.observed)} GiB" if main.predicted is not None else ""
    why = (
        f"{label}: {moved}, which moves the KV budget by {main.bytes / GiB:+.2f} GiB "
        f"(of {attribution.gap_bytes / GiB:+.2f} GiB)"
    )
    return (
        before,
        after,
        why + _rest(attribution.gap_bytes - main.bytes, attribution.contributions, main, healthy),
    )


def _rest(rest: int, parts: Iterable[Contribution], main: Contribution, budget: Budget) -> str:
    """What the headline term leaves of the change, computed: the other terms kvwatch split it
    into, and the part no printed term explains with the memory fraction the terms were weighed by."""
    others = [c for c in parts if c is not main and abs(c.bytes) >= GiB / 100]
    if abs(rest) < GiB / 100 or not others:
        return ""
    weight = ""
    if budget.fraction is not None:
        source = (
            "the engine's default for this card, as the log prints none"
            if budget.fraction_source == "engine_default"
            else str(budget.fraction_source)
        )
        weight = f" (kvwatch weighs each term by the memory fraction {budget.fraction:.3f}, {source})"
    if [c.term for c in others] == ["unattributed"]:
        return f"\n  the other {rest / GiB:+.2f} GiB: no printed term explains it{weight}"
    shown = [
        f"{c.bytes / GiB:+.2f} GiB no printed term explains{weight}"
        if c.term == "unattributed"
        else f"{_TERM_LABELS.get(c.term, c.term)} {c.bytes / GiB:+.2f} GiB"
        for c in others
    ]
    return f"\n  the other {rest / GiB:+.2f} GiB: {'; '.join(shown)}"


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value / GiB:.2f}"
