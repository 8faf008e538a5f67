"""The status page: each instance's memory budget as a picture, rendered server-side.

One HTML document with inline CSS and inline SVG: no script, no external asset (no CDN, no font
from elsewhere), and a Content-Security-Policy that says so, so the page works air-gapped and
nothing on it can run. It is drawn from the figures /metrics exports (kvwatch/export/figures.py:
the memory terms, pool, usage and headroom; the prediction's band), never from figures of its own.

Every string that reaches the page came from an engine's log, its /metrics or the command line
(model names, versions, sources, prediction errors quoting a path) and is treated as hostile: it
passes through ``html.escape`` in text and attributes alike, SVG text included, and is cut to a
bounded length. The page is bounded too: at most ``MAX_SHOWN`` instances, and it says how many
were left out.

The sidecar serves it at ``/`` (imported on the first request, so an idle sidecar never loads it);
``kvwatch explain --html`` writes it for the instances of one log.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvwatch.analysis.predictor import PredictionResult
from kvwatch.core.units import GiB
from kvwatch.export.figures import (
    PoolFigures,
    UsageFigures,
    observed_terms,
    pool_figures,
    predicted_terms,
    usage_figures,
)
from kvwatch.state.instance import InstanceSnapshot

# Instances drawn on one page (the fleet holds up to --max-instances; the page stays small).
MAX_SHOWN = 32
# Longest string from a log or upstream shown (model paths can be long; a hostile one can be huge).
MAX_TEXT = 160

# The stacked terms, bottom first, with their legend label and colour. 'total' and 'usable' are
# not parts of the stack: they are drawn as markers on the same scale.
STACK: tuple[tuple[str, str, str], ...] = (
    ("weights", "weights", "#4e79a7"),
    ("activation", "activation peak", "#f28e2b"),
    ("non_torch", "non-torch", "#76b7b2"),
    ("cuda_graphs", "CUDA graphs", "#b07aa1"),
    ("kv", "KV cache", "#59a14f"),
)
_MARKERS: tuple[tuple[str, str], ...] = (("usable", "usable (x fraction)"), ("total", "GPU total"))

# The budget chart's geometry (SVG user units = CSS px).
_WIDTH = 760
_LEFT = 92  # room for the row labels
_RIGHT = 24
_PLOT = _WIDTH - _LEFT - _RIGHT
_ROW_H = 26
_ROWS_Y = (34, 70)  # observed, predicted
_AXIS_Y = 104
_HEIGHT = 146

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src 'none'; form-action 'none'; base-uri 'none'"

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:24px;color:#1d1d1f;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:0 0 2px;word-break:break-all}
.meta{color:#555;margin:0 0 10px;word-break:break-all}
section.instance{border:1px solid #ccc;border-radius:6px;padding:14px 16px;margin:16px 0;max-width:900px}
table{border-collapse:collapse;margin:8px 0}td,th{padding:2px 10px 2px 0;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left}th{color:#555;font-weight:600}
.legend span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px;border:1px solid #0003}
.warn{color:#a4262c}.ok{color:#2b6a2b}.note{color:#555;font-size:13px}
svg text{font:12px system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;fill:#333}
"""


def _e(value: object) -> str:
    """Escaped for HTML text and attributes alike (quotes included), cut to MAX_TEXT characters."""
    text = str(value)
    if len(text) > MAX_TEXT:
        text = text[: MAX_TEXT - 1] + "\u2026"
    return html.escape(text, quote=True)


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GiB:.2f} GiB"


def _signed_gib(value: int) -> str:
    shown = f"{value / GiB:+.2f}"
    return ("0.00" if shown in ("+0.00", "-0.00") else shown) + " GiB"


def _tokens(value: float | None) -> str:
    return "-" if value is None else f"{_count(value)} tokens"


def _count(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


@dataclass(frozen=True)
class _Budget:
    """The two stacks of one instance, by term, and the prediction's band on the KV term."""

    observed: dict[str, int]
    predicted: dict[str, int]
    band_ratio: float | None

    def scale_max(self) -> float:
        """The largest byte figure drawn (a stack's end, a marker, the band's far edge)."""
        ends = [
            float(sum(v for t, v in side.items() if t in _STACKED))
            for side in (self.observed, self.predicted)
        ]
        markers = [
            float(v) for side in (self.observed, self.predicted) for t, v in side.items() if t not in _STACKED
        ]
        band = self.band()
        return max([*ends, *markers, band[1] if band else 0.0])

    def band(self) -> tuple[float, float] | None:
        """Where the predicted KV term may end: its stack's end, give or take the expected error."""
        kv = self.predicted.get("kv")
        if self.band_ratio is None or kv is None:
            return None
        end = float(sum(v for t, v in self.predicted.items() if t in _STACKED))
        return end - kv * self.band_ratio, end + kv * self.band_ratio


_STACKED = frozenset(term for term, _, _ in STACK)


def _known(terms: Iterable[tuple[str, int | None]]) -> dict[str, int]:
    """Terms with a value the chart can draw (a negative budget is drawn as nothing)."""
    return {t: v for t, v in terms if v is not None and v >= 0}


def _budget(snap: InstanceSnapshot, pred: PredictionResult) -> _Budget:
    return _Budget(
        _known(observed_terms(snap.memory)), _known(predicted_terms(pred)), pred.error_ratio.get("config")
    )


def _ticks(top: float) -> tuple[float, list[float]]:
    """A round GiB step with at most eight ticks up to ``top`` bytes, and the tick values in bytes."""
    top_gib = max(top / GiB, 1e-9)
    step = 1.0
    for mult in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000):
        step = float(mult)
        if top_gib / step <= 8:
            break
    count = int(top_gib // step) + 1
    return step, [i * step * GiB for i in range(count + 1)]


def _svg_budget(b: _Budget, name: str) -> str:
    """Observed and predicted stacks on one GiB axis, with the usable/total markers and the band."""
    step, ticks = _ticks(b.scale_max())
    top = max(ticks[-1], b.scale_max())
    per_byte = _PLOT / top
    out = [
        f'<svg class="budget" xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{_HEIGHT}" '
        f'viewBox="0 0 {_WIDTH} {_HEIGHT}" role="img" aria-label="memory budget per rank of {_e(name)}, GiB">',
        f"<title>memory budget per rank of {_e(name)}</title>",
        '<text x="0" y="14" font-weight="600">memory budget of one rank (GiB)</text>',
    ]
    for (basis, side), y in zip((("observed", b.observed), ("predicted", b.predicted)), _ROWS_Y, strict=True):
        out.append(f'<text x="0" y="{y + _ROW_H / 2 + 4}">{basis}</text>')
        if not any(t in _STACKED for t in side):
            out.append(f'<text class="note" x="{_LEFT + 4}" y="{y + _ROW_H / 2 + 4}">not known</text>')
        x = 0.0
        for term, label, colour in STACK:
            value = side.get(term)
            if value is None:
                continue
            w = value * per_byte
            out.append(
                f'<rect class="seg" data-basis="{basis}" data-term="{term}" x="{_LEFT + x:.2f}" y="{y}" '
                f'width="{w:.2f}" height="{_ROW_H}" fill="{colour}">'
                f"<title>{_e(basis)} {_e(label)}: {_gib(value)}</title></rect>"
            )
            x += w
        for term, label in _MARKERS:
            value = side.get(term)
            if value is None:
                continue
            mx = _LEFT + value * per_byte
            dash = ' stroke-dasharray="4 3"' if term == "usable" else ""
            out.append(
                f'<line class="marker" data-basis="{basis}" data-term="{term}" x1="{mx:.2f}" x2="{mx:.2f}" '
                f'y1="{y - 4}" y2="{y + _ROW_H + 4}" stroke="#222" stroke-width="2"{dash}>'
                f"<title>{_e(basis)} {_e(label)}: {_gib(value)}</title></line>"
            )
    band, ratio = b.band(), b.band_ratio
    if band is not None and ratio is not None:
        lo, hi = max(band[0], 0.0), band[1]
        y = _ROWS_Y[1]
        out.append(
            f'<rect class="band" data-basis="predicted" data-term="kv" x="{_LEFT + lo * per_byte:.2f}" '
            f'y="{y - 6}" width="{(hi - lo) * per_byte:.2f}" height="{_ROW_H + 12}" fill="#000" '
            f'fill-opacity="0.12" stroke="#000" stroke-dasharray="2 2">'
            f"<title>predicted KV cache band: \u00b1{ratio * 100:.1f}% "
            f"({_gib(lo)} to {_gib(hi)})</title></rect>"
        )
    out.append(
        f'<line x1="{_LEFT}" x2="{_LEFT + _PLOT}" y1="{_AXIS_Y}" y2="{_AXIS_Y}" stroke="#666" stroke-width="1"/>'
    )
    for tick in ticks:
        tx = _LEFT + tick * per_byte
        if tx > _LEFT + _PLOT + 0.5:
            break
        gib = tick / GiB
        label = f"{gib:g}" if step >= 1 else f"{gib:.2f}".rstrip("0").rstrip(".")
        out.append(
            f'<line x1="{tx:.2f}" x2="{tx:.2f}" y1="{_AXIS_Y}" y2="{_AXIS_Y + 5}" stroke="#666"/>'
            f'<text class="tick" data-gib="{gib:g}" x="{tx:.2f}" y="{_AXIS_Y + 18}" '
            f'text-anchor="middle">{_e(label)}</text>'
        )
    out.append(
        f'<text x="{_LEFT + _PLOT / 2}" y="{_AXIS_Y + 36}" text-anchor="middle">GiB per rank</text></svg>'
    )
    return "".join(out)


def _svg_usage(fig: PoolFigures, use: UsageFigures) -> str:
    """The pool as one bar: used tokens, then headroom."""
    if not fig.tokens or use.used is None:
        return ""
    width, left, plot = 520, 92, 300
    used_w = min(use.used / fig.tokens, 1.0) * plot
    pct = f"{use.ratio * 100:.1f}%" if use.ratio is not None else "-"
    return (
        f'<svg class="usage" xmlns="http://www.w3.org/2000/svg" width="{width}" height="34" '
        f'viewBox="0 0 {width} 34" role="img" aria-label="KV pool usage">'
        '<text x="0" y="21">KV pool</text>'
        f'<rect class="pool" x="{left}" y="6" width="{plot}" height="20" fill="#e6efe4" stroke="#59a14f">'
        f"<title>pool: {_count(fig.tokens)} tokens</title></rect>"
        f'<rect class="used" x="{left}" y="6" width="{used_w:.2f}" height="20" fill="#59a14f">'
        f"<title>used: {_count(use.used)} tokens</title></rect>"
        f'<text x="{left + plot + 8}" y="21">{_e(pct)} used</text></svg>'
    )


def _legend() -> str:
    items = "".join(
        f'<span><i class="sw" style="background:{colour}"></i>{_e(label)}</span>'
        for _, label, colour in STACK
    )
    return (
        f'<p class="legend">{items}</p><p class="note">dashed line: usable memory (GPU total x the memory '
        "fraction); solid line: GPU total; grey box: the prediction's expected error on the KV cache</p>"
    )


def _budget_table(b: _Budget) -> str:
    rows = []
    for term, label in (*((t, lab) for t, lab, _ in STACK), *_MARKERS):
        o, p = b.observed.get(term), b.predicted.get(term)
        if o is None and p is None:
            continue
        diff = _signed_gib(o - p) if o is not None and p is not None else ""
        rows.append(
            f'<tr data-term="{term}"><td>{_e(label)}</td><td>{_gib(o) if o is not None else "not printed"}</td>'
            f"<td>{_gib(p)}</td><td>{diff}</td></tr>"
        )
    if not rows:
        return '<p class="note">no memory budget known yet (the engine has not printed it)</p>'
    head = "<tr><th>term (per rank)</th><th>observed</th><th>predicted</th><th>observed \u2212 predicted</th></tr>"
    return f'<table class="terms">{head}{"".join(rows)}</table>'


def _pool_table(
    snap: InstanceSnapshot, pred: PredictionResult, fig: PoolFigures, use: UsageFigures, state: str
) -> str:
    predicted = pred.tokens.get("config")
    band = pred.error_ratio.get("config")
    pred_text = _count(predicted)
    if predicted is not None and band is not None:
        pred_text += f" (\u00b1{band * 100:.1f}%)"
    rows = [
        ("pool", _tokens(fig.tokens) + (f" ({_count(fig.blocks)} blocks)" if fig.blocks else "")),
        ("predicted pool", f"{pred_text} tokens" if predicted is not None else f"- ({_e(state)})"),
        ("usage", f"{use.ratio * 100:.1f}%" if use.ratio is not None else "-"),
        ("used", _tokens(use.used)),
        ("headroom", _tokens(use.headroom_tokens)),
        (
            "headroom in requests",
            f"{_count(use.headroom_requests)} ({_count(fig.request_len)} tokens each)"
            if use.headroom_requests is not None
            else "-",
        ),
        ("running / waiting", f"{_count(snap.usage.running)} / {_count(snap.usage.waiting)}"),
        (
            "preemptions",
            _count(snap.preemptions_total) + (" (requests retracted)" if snap.retractions else ""),
        ),
        ("restarts", _count(snap.restarts)),
    ]
    body = "".join(f'<tr data-row="{_e(k)}"><td>{_e(k)}</td><td>{v}</td></tr>' for k, v in rows)
    return f'<table class="pool">{body}</table>'


def _failure(snap: InstanceSnapshot) -> str:
    f = snap.last_failure
    if f is None:
        total = sum(snap.startup_failures.values())
        if total:
            return f'<p class="failure">startup failures: {_count(total)} (none in this start)</p>'
        return '<p class="failure ok">last startup failure: none</p>'
    parts = [f"reason {_e(f.reason)}"]
    if f.needed_kv_bytes is not None:
        parts.append(f"needed {_gib(f.needed_kv_bytes)} of KV cache")
    if f.available_kv_bytes is not None:
        parts.append(f"available {_gib(f.available_kv_bytes)}")
    if f.max_model_len is not None:
        parts.append(f"max_model_len {_count(f.max_model_len)}")
    if f.max_tokens_in_cache is not None:
        parts.append(f"the cache holds {_count(f.max_tokens_in_cache)} tokens")
    if f.estimated_max_model_len is not None:
        parts.append(f"estimated max_model_len {_count(f.estimated_max_model_len)}")
    return f'<p class="failure warn">last startup failure: {"; ".join(parts)}</p>'


# What the page shows of an instance whose prediction is not made yet (the sidecar's consumer makes
# it when the startup facts arrive; the page never does): no predicted figures.
_NOT_MADE = PredictionResult(state="ok")


def _instance(snap: InstanceSnapshot, made: PredictionResult | None) -> str:
    pred = made if made is not None else _NOT_MADE
    state = pred.state if made is not None else "not made yet"
    settings = snap.settings
    model = settings.served_model_name or settings.model
    fig = pool_figures(snap, pred)
    use = usage_figures(snap.usage, fig.tokens, fig.request_len)
    budget = _budget(snap, pred)
    meta = [f"engine {_e(snap.engine)}" + (f" {_e(settings.version)}" if settings.version else "")]
    meta.append(f"instance {_e(snap.instance)}")
    if settings.model and settings.served_model_name and settings.model != settings.served_model_name:
        meta.append(f"model {_e(settings.model)}")
    if settings.tensor_parallel_size:
        meta.append(f"TP {_e(settings.tensor_parallel_size)}")
    if settings.kv_cache_dtype:
        meta.append(f"KV dtype {_e(settings.kv_cache_dtype)}")
    if fig.max_len:
        meta.append(f"max_model_len {_count(fig.max_len)}")
    prediction = f"prediction {_e(state)}" + (f": {_e(pred.reason)}" if pred.reason else "")
    name = f"{snap.source} \u00b7 {model or 'model not printed'}"
    chart = _svg_budget(budget, name) if budget.observed or budget.predicted else ""
    return (
        f'<section class="instance" data-source="{_e(snap.source)}" data-instance="{_e(snap.instance)}">'
        f"<h2>{_e(name)}</h2>"
        f'<p class="meta">{", ".join(meta)}; {prediction}</p>'
        f"{chart}{_legend() if chart else ''}{_budget_table(budget)}"
        f"{_svg_usage(fig, use)}{_pool_table(snap, pred, fig, use, state)}{_failure(snap)}</section>"
    )


def render(
    snapshots: Sequence[InstanceSnapshot],
    predict: Callable[[InstanceSnapshot], PredictionResult | None],
    *,
    title: str = "kvwatch status",
    dropped_events: int = 0,
    generated_at: float | None = None,
    limit: int = MAX_SHOWN,
) -> str:
    """The page for the first ``limit`` instances (predicted only for those), as one HTML document.

    ``predict`` answers None for an instance whose prediction is not made yet (the sidecar's page
    only looks up what its consumer prepared)."""
    shown = snapshots[:limit]
    left_out = len(snapshots) - len(shown)
    when = time.strftime(
        "%Y-%m-%d %H:%M:%S UTC", time.gmtime(time.time() if generated_at is None else generated_at)
    )
    summary = f"{len(snapshots)} instance{'s' if len(snapshots) != 1 else ''}"
    if left_out:
        summary += f"; showing the first {len(shown)}, {left_out} left out (see /metrics for all)"
    if dropped_events:
        summary += f"; {_count(dropped_events)} events dropped over the instance cap"
    body = (
        "".join(_instance(s, predict(s)) for s in shown) or '<p class="note">no engine instance seen yet</p>'
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f'<h1>{_e(title)}</h1><p class="meta" id="summary">{_e(summary)}; as of {_e(when)}</p>'
        f"{body}</body></html>\n"
    )
