"""Plain-text rendering for the offline commands: aligned tables and horizontal bars.

``explain`` and ``plan`` print to terminals and CI logs, so the output is ASCII only, fixed width
and free of colour codes: it survives copy-paste into an issue, which is where these tables end up.
"""

from __future__ import annotations

from collections.abc import Sequence

BAR_WIDTH = 40


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell; columns whose index is in ``right`` are right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def bar(value: float, scale: float, width: int = BAR_WIDTH, char: str = "#") -> str:
    """A bar of ``value / scale`` of ``width`` characters (at least one for any positive value).

    Negative values (a vLLM KV budget below zero) are drawn with '-' so they cannot be mistaken for
    a small positive term.
    """
    if scale <= 0 or value == 0:
        return ""
    cells = min(width, max(1, round(abs(value) / scale * width)))
    return ("-" if value < 0 else char) * cells


def stacked_bar(parts: Sequence[tuple[str, float]], whole: float, width: int = BAR_WIDTH) -> str:
    """Parts of ``whole`` side by side, one character per 1/``width`` of it, exactly ``width`` wide.

    Each part's cells are capped at ``width`` before any string is built, so a part far larger
    than the whole (a card of 80 bytes holding 15 GiB of weights) costs ``width`` characters, not
    its ratio.
    """
    cells = []
    room = width
    for ch, size in parts:
        n = min(room, max(0, round(size / whole * width))) if whole > 0 else 0
        cells.append(ch[:1] * n)
        room -= n
    return "".join(cells).ljust(width, " ")


def pair_bars(
    label_width: int,
    rows: Sequence[tuple[str, float | None, float | None]],
    width: int = BAR_WIDTH,
    right: bool = True,
) -> str:
    """Two bars per row side by side (left: observed, right: predicted) on one shared scale.

    '?' marks a value that is not known; ``right=False`` draws the left bars alone.
    """
    scale = max((abs(v) for _, a, b in rows for v in (a, b) if v is not None), default=0.0)
    lines = []
    for label, a, b in rows:
        line = f"{label.ljust(label_width)}  |{('?' if a is None else bar(a, scale, width)).ljust(width)}|"
        if right:
            line += f"  |{('?' if b is None else bar(b, scale, width, char='=')).ljust(width)}|"
        lines.append(line)
    return "\n".join(lines)
