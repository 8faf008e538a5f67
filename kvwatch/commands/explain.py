"""``kvwatch explain``: why an engine's KV pool differs from kvwatch's prediction, from its own log."""

from __future__ import annotations

import argparse
import json
import math
import sys

from kvwatch.analysis.attribution import Attribution
from kvwatch.analysis.explain import Explanation, Overrides, explain
from kvwatch.capacity import gpus
from kvwatch.capacity.budget import Budget
from kvwatch.capacity.geometry import load_model
from kvwatch.capacity.model import ModelGeometry
from kvwatch.commands.predict import _positive_int, gpu_memory_size
from kvwatch.commands.render import pair_bars, table
from kvwatch.core.errors import ConfigError
from kvwatch.core.events import Event
from kvwatch.core.kinds import ENGINE_CHOICES
from kvwatch.core.units import GiB, format_bytes
from kvwatch.engines import registry
from kvwatch.sources.hub import resolve_model_config
from kvwatch.sources.pipeline import replay
from kvwatch.state.facts import Failure

HELP = "rebuild an engine's memory budget from its startup log and explain the gap to the prediction"

# Terms shown in the budget table, with the label that says what each one is.
_ROWS: tuple[tuple[str, str], ...] = (
    ("total", "GPU total"),
    ("usable", "usable (x fraction)"),
    ("non_torch", "non-torch"),
    ("weights", "weights"),
    ("activation", "activation peak"),
    ("cuda_graphs", "CUDA graphs"),
    ("kv", "KV budget"),
)
_CONTRIBUTION_LABELS: dict[str, str] = {
    "total": "GPU total",
    "utilisation": "memory fraction",
    "usable": "usable memory",
    "non_torch": "non-torch (context)",
    "weights": "weights",
    "activation": "activation + non-torch",
    "unattributed": "not explained by a term",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", metavar="LOG", nargs="+", help="engine log file(s); '-' reads stdin")
    parser.add_argument("--engine", choices=ENGINE_CHOICES, default="auto", help="engine (default: detect)")
    parser.add_argument(
        "--model-config",
        metavar="CONFIG",
        help="the model's config.json or Hub name ORG/NAME[@REVISION] (for the prediction and the levers)",
    )
    gpu = parser.add_mutually_exclusive_group()
    gpu.add_argument(
        "--gpu", help="GPU name from the catalogue when the log does not print the card's memory"
    )
    gpu.add_argument("--gpu-memory", metavar="SIZE", help="GPU memory as the driver reports it (81559MiB)")
    parser.add_argument("--tp", type=_positive_int, help="tensor parallel size, if the log does not print it")
    parser.add_argument(
        "--pp", type=_positive_int, help="pipeline parallel size, if the log does not print it"
    )
    parser.add_argument("--kv-cache-dtype", help="KV cache dtype, if the log does not print it (fp8, bf16)")
    parser.add_argument("--max-model-len", type=_positive_int, help="context length, if the log does not say")
    parser.add_argument(
        "--engine-version", help="engine version whose defaults apply, if the log has no banner"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--html",
        metavar="FILE",
        help="also write the budget as a picture: the sidecar's status page, one file",
    )


def _check_version(engine: str, version: str) -> None:
    """The version must be one the named engine (or, with --engine auto, either engine) knows."""
    errors = []
    for found in registry.ENGINES.values() if engine == "auto" else (registry.get(engine),):
        try:
            found.check_version(version)
            return
        except ConfigError as exc:
            errors.append(exc)
    raise errors[0]


def _has_budget(e: Explanation) -> bool:
    """Something to explain: a budget or pool the log printed, or the start's own failure."""
    return bool(e.observed.terms) or e.observed_tokens is not None or e.failure is not None


def _failure_lines(f: Failure) -> list[str]:
    """The startup failure in the figures the engine gave, and what would have started."""
    head = f"startup failure: {f.reason}"
    if f.reason == "free_memory_below_utilization" and f.free_bytes and f.total_bytes and f.requested_bytes:
        held = max(f.total_bytes - f.free_bytes, 0)
        most = math.floor(f.free_bytes / f.total_bytes * 100) / 100
        return [
            head,
            f"  {_fmt(f.free_bytes)} of the {_fmt(f.total_bytes)} card was free at start: other processes "
            f"(and this engine's CUDA context) held {_fmt(held)}; utilisation {f.gpu_memory_utilization} "
            f"asks for {_fmt(f.requested_bytes)} free",
            f"  starts with --gpu-memory-utilization {most:.2f} or less, or with "
            f"{_fmt(f.requested_bytes - f.free_bytes)} more freed on the card",
        ]
    if f.reason == "max_model_len_too_large" and f.max_model_len:
        if f.needed_kv_bytes and f.available_kv_bytes:
            line = (
                f"  one request of max_model_len {f.max_model_len:,} needs {_fmt(f.needed_kv_bytes)} of KV cache; "
                f"{_fmt(f.available_kv_bytes)} was available"
            )
        elif f.max_tokens_in_cache is not None:
            line = f"  the cache holds {f.max_tokens_in_cache:,} tokens, max_model_len is {f.max_model_len:,}"
        else:
            line = f"  max_model_len {f.max_model_len:,} does not fit the cache"
        if f.estimated_max_model_len:
            line += f": the longest that fits is {f.estimated_max_model_len:,} tokens"
        return [head, line]
    if f.available_kv_bytes is not None:
        return [head, f"  {_fmt(f.available_kv_bytes)} left for the KV cache after weights and activations"]
    return [head]


def run(args: argparse.Namespace) -> int:
    if args.logs.count("-") > 1:
        raise ConfigError("'-' (stdin) can be given once")
    config = resolve_model_config(args.model_config) if args.model_config else None
    model: ModelGeometry | None = load_model(config) if config is not None else None
    gpu_memory = None
    if args.gpu:
        gpu_memory = gpus.lookup(args.gpu).total_bytes
    elif args.gpu_memory:
        gpu_memory = gpu_memory_size(args.gpu_memory)
    events: list[Event] = []
    try:
        result = replay(args.logs, engine=args.engine, on_events=events.extend)
    except OSError as exc:
        raise ConfigError(f"cannot read {exc.filename}: {exc.strerror}") from None
    if args.engine_version is not None:
        _check_version(args.engine, args.engine_version)
    overrides = Overrides(
        tp=args.tp,
        pp=args.pp,
        kv_cache_dtype=args.kv_cache_dtype,
        max_model_len=args.max_model_len,
        engine_version=args.engine_version,
    )
    explanations = [explain(snap, model, gpu_memory, overrides, events) for snap in result.snapshots()]
    explanations = [e for e in explanations if _has_budget(e)]
    if not explanations:
        raise ConfigError(
            f"no KV-cache memory or pool lines in {', '.join(args.logs)} "
            "(explain needs an engine's startup log: 'Available KV cache memory', 'KV Cache is allocated', ...)"
        )
    if args.html:
        from kvwatch.commands import explain_html

        explain_html.write(
            args.html, result.snapshots(), explanations, config, gpu_memory, overrides, args.logs
        )
    if args.json:
        json.dump({"instances": [e.to_json_dict() for e in explanations]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print("\n\n".join(render(e) for e in explanations))
    return 0


def _fmt(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)


def _signed(value: int) -> str:
    return ("+" if value > 0 else "") + format_bytes(value) if value else "0"


def _budget_rows(observed: Budget, predicted: Budget | None) -> list[list[str]]:
    rows = []
    for name, label in _ROWS:
        o = observed.terms.get(name)
        p = predicted.terms.get(name) if predicted is not None else None
        if o is None and p is None:
            continue
        if name == "usable":
            fo = f"{observed.fraction:g}" if observed.fraction is not None else "?"
            fp = (
                f"{predicted.fraction:g}" if predicted is not None and predicted.fraction is not None else "?"
            )
            label = f"usable (x{fo} / x{fp})" if predicted is not None else f"usable (x{fo})"
        diff = ""
        if o is not None and p is not None and o.bytes is not None and p.bytes is not None:
            diff = _signed(o.bytes - p.bytes)
        rows.append(
            [
                label,
                _fmt(o.bytes) if o else "-",
                (o.source or "") if o else "",
                _fmt(p.bytes) if p else "-",
                diff,
            ]
        )
    return rows


def _label(a: Attribution, term: str) -> str:
    label = _CONTRIBUTION_LABELS.get(term, term)
    if term == "activation" and "cuda_graphs" in a.counted:
        label += " + graphs"  # the release subtracts CUDA-graph memory too
    return label


# Engines print their memory terms to two decimals of a GiB ('58.11 GiB', SGLang's '54.52 GB'):
# each printed figure is up to half of 0.01 GiB off.
PRINTED_ROUNDING_BYTES = GiB // 200


def _rounding(observed: Budget) -> int:
    """How far the gap can be from 0 by the rounding of the printed terms alone."""
    printed = sum(1 for t in observed.terms.values() if t.source == "printed")
    return printed * PRINTED_ROUNDING_BYTES


def _attribution_lines(a: Attribution, bytes_per_token: int | None, rounding: int = 0) -> list[str]:
    ratio = a.gap_ratio
    head = f"why the KV budget differs: observed - predicted = {_signed(a.gap_bytes)}"
    if ratio is not None:
        head += f" ({ratio * 100:+.1f}% of the prediction)"
    rows = []
    for c in a.contributions:
        if c.bytes == 0 and c.term != "unattributed":
            continue
        pct = a.percent(c)
        share = a.share(c)
        tokens = f"{c.bytes // bytes_per_token:+,}" if bytes_per_token else ""
        rows.append(
            [
                _label(a, c.term),
                _signed(c.bytes),
                f"{pct:+.1f}%" if pct is not None else "",
                f"{share * 100:.0f}%" if share is not None else "",
                tokens,
            ]
        )
    lines = [
        head,
        table(["term", "effect on KV", "% of predicted", "share of gap", "tokens"], rows, (1, 2, 3, 4)),
    ]
    main = a.main_terms()
    if a.gap_bytes and abs(a.gap_bytes) <= rounding:
        lines.append(
            f"mainly: the rounding of the printed figures (0.01 GiB each, {format_bytes(rounding)} at most): "
            "the budget is the predicted one"
        )
    elif main:
        lines.append("mainly: " + ", ".join(_label(a, c.term) for c in main))
    return lines


def render(e: Explanation) -> str:
    """The human report for one instance: budget table, bars, gap attribution, levers."""
    title = (
        f"{e.source} ({e.engine}{' ' + e.engine_version if e.engine_version else ''}, instance {e.instance})"
    )
    lines = [title, "=" * len(title)]
    head = []
    if e.model:
        head.append(f"model {e.model}")
    if e.max_model_len:
        head.append(f"max_model_len {e.max_model_len:,}")
    if head:
        lines.append(", ".join(head))
    lines.append("")
    headers = ["term (per rank)", "observed", "from", "predicted", "difference"]
    rows = _budget_rows(e.observed, e.predicted)
    if e.predicted is None:
        headers, rows = headers[:3], [r[:3] for r in rows]
    if rows or e.failure is None:
        lines.append(table(headers, rows, (1, 3, 4)))
    else:
        lines.append("no memory terms printed (the start failed before the engine logged them)")
    bar_rows = []
    for name, label in _ROWS:
        if name in ("total", "usable"):
            continue
        o = e.observed.get(name)
        p = e.predicted.get(name) if e.predicted is not None else None
        if o is not None or p is not None:
            bar_rows.append((label, o, p))
    if bar_rows and e.predicted is not None:
        lines += ["", "observed (#) | predicted (=), one scale:"]
        lines.append(pair_bars(max(len(r[0]) for r in bar_rows), bar_rows))
    elif len(bar_rows) > 1:
        lines += ["", "observed, one scale:"]
        lines.append(pair_bars(max(len(r[0]) for r in bar_rows), bar_rows, right=False))
    lines.append("")
    tokens = [f"observed {e.observed_tokens:,}" if e.observed_tokens is not None else "observed -"]
    if e.predicted_tokens is not None:
        tokens.append(f"predicted {e.predicted_tokens:,}")
    if e.budget_tokens is not None:
        tokens.append(f"engine budget / kvwatch's bytes per token {e.budget_tokens:,}")
    lines.append("KV pool tokens: " + "; ".join(tokens))
    if e.observed_tokens is not None and e.budget_tokens:
        diff = e.observed_tokens / e.budget_tokens - 1
        if abs(diff) > 0.01:
            lines.append(
                f"  the engine's pool holds {abs(diff) * 100:.1f}% {'more' if diff > 0 else 'fewer'} tokens than "
                "kvwatch makes of the same budget: the bytes per token differ (cache dtype, layers, TP?)"
            )
    if e.attribution is not None:
        bpt = e.prediction.bytes_per_token if e.prediction is not None else None
        lines += [""] + _attribution_lines(e.attribution, bpt, _rounding(e.observed))
    if e.levers:
        rows = [
            [lv.change, _fmt(lv.kv_bytes), f"{lv.pool_tokens:,}", f"{lv.max_concurrency:.2f}x", lv.note]
            for lv in e.levers
        ]
        lines += [
            "",
            "levers (the observed budget, changed and divided the engine's way):",
            table(["change", "KV budget", "pool tokens", "concurrency", "note"], rows, (1, 2, 3)),
        ]
    for s in e.spreads:
        values = sorted(s.by_rank.items())
        lines.append(
            f"ranks differ in {s.field.removesuffix('_bytes')}: "
            + ", ".join(f"TP{r} {v / GiB:.2f} GiB" for r, v in values)
            + f"; limiting rank TP{s.limiting_rank}"
        )
    if e.failure is not None:
        lines += _failure_lines(e.failure)
    if e.prediction is not None and e.prediction.assumptions:
        lines += ["", "prediction assumptions:"] + [f"  - {a}" for a in e.prediction.assumptions]
    if e.notes:
        lines += [""] + [f"note: {n}" for n in e.notes]
    return "\n".join(lines)
