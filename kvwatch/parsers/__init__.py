"""Pure log-line parsers: prefix stripping, then one module per engine (see base.py for the contract).

``PARSERS`` maps an engine to its body parser and ``ANCHORS`` to the substrings every line that
parser claims contains, so callers can drop uninteresting lines with a few substring checks.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from kvwatch.events import Engine
from kvwatch.parsers import vllm
from kvwatch.parsers.base import ParseFn


def _optional(name: str) -> ModuleType | None:
    """Import a parser module that another engineer may not have landed yet."""
    try:
        return importlib.import_module(f"kvwatch.parsers.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"kvwatch.parsers.{name}":
            raise
        return None


_sglang = _optional("sglang")

PARSERS: dict[Engine, ParseFn] = {"vllm": vllm.parse}
ANCHORS: dict[Engine, tuple[str, ...]] = {"vllm": vllm.ANCHORS}
if _sglang is not None:
    PARSERS["sglang"] = _sglang.parse
    ANCHORS["sglang"] = tuple(_sglang.ANCHORS)

ALL_ANCHORS: tuple[str, ...] = tuple(dict.fromkeys(a for anchors in ANCHORS.values() for a in anchors))
