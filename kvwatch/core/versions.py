"""Engine release numbers: '0.11.0rc2+cu130' read as (0, 11, 0). A leaf, so the parse path can
check a release without importing the capacity model."""

from __future__ import annotations

__all__ = ["version_tuple"]


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """'0.11.0rc2+cu130' -> (0, 11, 0); None or unparsable -> None (= newest)."""
    if not version:
        return None
    out: list[int] = []
    for part in version.lstrip("v").split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(out) if out else None
