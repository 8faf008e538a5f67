"""The form kvwatch keeps --limit-mm-per-prompt in (``image=0,video=0``, sorted), written from the
flag and from the log's args line and read back by the multimodal rules; a leaf, so reading a log
does not load those rules."""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache

MODALITY = re.compile(r"[a-z_]{1,32}")


def kept_form(counts: Mapping[str, int]) -> str:
    """``image=0,video=0``: each modality and its count, sorted ('' for none)."""
    return ",".join(f"{k}={n}" for k, n in sorted(counts.items()))


@lru_cache(maxsize=64)
def read_kept(kept: str) -> dict[str, int]:
    """The kept form read back; an item that is not MODALITY=COUNT (a damaged state file) is left
    out, so that modality keeps vLLM's default."""
    items = (item.partition("=") for item in kept.split(","))
    return {k: int(n) for k, _, n in items if MODALITY.fullmatch(k) and n.isdigit() and len(n) <= 9}
