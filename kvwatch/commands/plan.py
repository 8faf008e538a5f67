"""``kvwatch plan``: what a workload needs before launch -- per rank, with growth, and which card."""

from __future__ import annotations

import argparse
import json
import math
import sys

from kvwatch.analysis.plan import (
    DEFAULT_TARGET,
    CardFit,
    Plan,
    card_fits,
    make_plan,
    smallest_cards,
)
from kvwatch.analysis.workload import load_workload, parse_rank_budgets
from kvwatch.capacity import gpus
from kvwatch.capacity.geometry import load_model
from kvwatch.capacity.gpus import GpuSpec
from kvwatch.commands.predict import _positive_int, read_request
from kvwatch.commands.predict import add_arguments as add_deployment_arguments
from kvwatch.commands.render import table
from kvwatch.core.errors import ConfigError
from kvwatch.core.jsontypes import JsonObject
from kvwatch.core.units import format_bytes
from kvwatch.sources.hub import resolve_model_config

HELP = "check a workload of retained lengths against every rank, and find the smallest card it fits"


def _target(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_deployment_arguments(parser)
    parser.add_argument(
        "--workload",
        required=True,
        metavar="SPEC",
        help="retained lengths: '6x32768,20x8192', or a .csv/.json file (with shared-prefix groups)",
    )
    parser.add_argument("--gpus", metavar="A,B,C", help="cards to search (default: the whole catalogue)")
    parser.add_argument(
        "--grow", type=_positive_int, help="positions every conversation grows by (checks the grown workload)"
    )
    parser.add_argument(
        "--target",
        type=_target,
        default=DEFAULT_TARGET,
        help=f"utilisation target for the card search (default {DEFAULT_TARGET})",
    )


def run(args: argparse.Namespace) -> int:
    model = load_model(resolve_model_config(args.model_config))
    workload = load_workload(args.workload)
    budgets = parse_rank_budgets(args.available_kv_memory) if args.available_kv_memory else None
    args.available_kv_memory = None
    request = read_request(args)
    engine, deployment = request.engine, request.deployment
    cards: list[GpuSpec] | None = None
    if args.gpus:
        cards = [gpus.lookup(name.strip()) for name in args.gpus.split(",") if name.strip()]
        if not cards:
            raise ConfigError("--gpus names no card")
    plan = None
    if budgets is not None or deployment.gpu_memory_bytes is not None:
        plan = make_plan(
            model, deployment, workload, grow=args.grow or 0, rank_kv_bytes=budgets, engine=engine
        )
    grown = workload.grown(args.grow or 0)
    fits = card_fits(model, deployment, grown, target=args.target, cards=cards, engine=engine)
    if args.json:
        out: JsonObject = {
            "plan": plan.to_json_dict() if plan is not None else None,
            "target": args.target,
            "cards": [_card_json(f) for f in fits],
            "smallest": [
                {"kv_cache_dtype": kv, "weights": w, **(_card_json(f) if f else {"gpu": None})}
                for (kv, w), f in smallest_cards(fits).items()
            ],
        }
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        parts = [render_plan(plan)] if plan is not None else []
        parts.append(
            render_cards(fits, args.target, deployment.tp * deployment.pp, show_all=cards is not None)
        )
        print("\n\n".join(parts))
    return 0


def _card_json(f: CardFit) -> JsonObject:
    return {
        "gpu": f.gpu.name,
        "kv_cache_dtype": f.kv_cache_dtype,
        "weights": f.weights,
        "fits": f.fits,
        "kv_budget_bytes": f.kv_budget_bytes,
        "pool_tokens": f.pool_tokens,
        "needed_tokens": f.needed_tokens,
        "weights_bytes_per_rank": f.weights_bytes,
        "card_memory_bytes": f.total_bytes,
        "card_use": f.card_use,
        "pool_use": f.pool_use,
    }


def _percent(value: float | None) -> str:
    """A share as the tables print it: one decimal, rounded down, so a row under 92% never reads 92.0%."""
    return f"{math.floor(value * 1000) / 10:.1f}%" if value is not None else ""


def render_plan(p: Plan) -> str:
    """The per-rank check of one deployment."""
    lines = [
        f"{p.model} on {p.gpu_name or 'given KV budgets'}: {p.engine}, tp={p.tp} pp={p.pp}, "
        f"KV cache {p.kv_cache_dtype}, {p.block_size}-token blocks",
        f"workload: {p.sequences:,} sequences, {p.logical_tokens:,} positions"
        + (f" (after growing {p.grow:,} each)" if p.grow else "")
        + f"; {p.allocated_tokens:,} allocated in whole blocks"
        + (f", {p.saved_blocks:,} blocks saved by shared prefixes" if p.saved_blocks else ""),
        f"payload: {format_bytes(p.bytes_per_token)} per position per rank -> {format_bytes(p.payload_bytes)} "
        f"per rank ({format_bytes(p.payload_bytes_all_ranks)} all ranks); allocated {format_bytes(p.needed_bytes)} per rank",
    ]
    if p.grow:
        lines.append(
            f"growth: +{p.grow:,} positions x {p.sequences:,} sequences = {format_bytes(p.grow_bytes)} more per rank; "
            f"before growing it {'fits' if p.fits_before_growth else 'does NOT fit'}"
        )
    rows = [
        [
            str(r.rank),
            format_bytes(r.budget_bytes),
            f"{r.pool_tokens:,}",
            format_bytes(r.needed_bytes),
            "yes" if r.fits else "NO",
            f"{r.sequences_fit:,}",
            "<- limiting" if p.ranks_differ and r.rank == p.limiting_rank else "",
        ]
        for r in p.ranks
    ]
    lines += [
        "",
        table(
            ["rank", "KV budget", "pool tokens", "needed", "fits", "sequences fit", ""], rows, (1, 2, 3, 5)
        ),
    ]
    limit = p.ranks[p.limiting_rank]
    if p.fits:
        verdict = f"fits: the pool holds {p.copies:,} copies of this workload"
        if p.ranks_differ:
            verdict += f" (rank {p.limiting_rank} limits)"
    else:
        where = f"rank {limit.rank} ({format_bytes(limit.budget_bytes)})" if p.ranks_differ else "every rank"
        verdict = f"does NOT fit: {where} holds {p.sequences_fit:,} of {p.sequences:,} sequences"
    lines += ["", verdict]
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def render_cards(fits: list[CardFit], target: float, ranks: int, show_all: bool) -> str:
    """Smallest card per cache dtype and weight quantisation (and every card when --gpus chose them)."""
    per = f" x {ranks}" if ranks > 1 else ""
    lines = [
        f"smallest card{per} under {target:.0%} of its memory "
        "(card used: weights + non-KV allowance + the workload's share of the KV pool):"
    ]
    rows = []
    for (kv, w), f in smallest_cards(fits).items():
        if f is None:
            none = "none of these cards" if show_all else "none in the catalogue"
            rows.append([kv, w, none, "", "", ""])
        else:
            rows.append(
                [
                    kv,
                    w,
                    f.gpu.name,
                    format_bytes(f.weights_bytes),
                    f"{f.pool_tokens:,}",
                    _percent(f.card_use),
                ]
            )
    lines.append(
        table(
            ["KV cache", "weights", "card", "weights/rank", "pool tokens", "card used"],
            rows,
            (3, 4, 5),
        )
    )
    if show_all:
        rows = [
            [
                f.gpu.name,
                f.kv_cache_dtype,
                f.weights,
                "yes" if f.fits else "no",
                format_bytes(f.kv_budget_bytes),
                f"{f.pool_tokens:,}",
                f"{f.needed_tokens:,}",
            ]
            for f in fits
        ]
        lines += [
            "",
            table(
                ["card", "KV cache", "weights", "fits", "KV budget", "pool tokens", "needed"], rows, (4, 5, 6)
            ),
        ]
    return "\n".join(lines)
