"""Pure log-line parsers: prefix stripping, then one module per engine (see base.py for the contract).

``PARSERS`` maps an engine to its body parser and ``ANCHORS`` to the substrings every line that
parser claims contains, so callers can drop uninteresting lines with a few substring checks.
"""

from __future__ import annotations

from kvwatch.events import Engine
from kvwatch.parsers import sglang, vllm
from kvwatch.parsers.base import ParseFn

PARSERS: dict[Engine, ParseFn] = {"vllm": vllm.parse, "sglang": sglang.parse}
ANCHORS: dict[Engine, tuple[str, ...]] = {"vllm": vllm.ANCHORS, "sglang": sglang.ANCHORS}

# Every anchor of every engine, for sources whose engine is not known yet.
ALL_ANCHORS: tuple[str, ...] = tuple(dict.fromkeys(a for anchors in ANCHORS.values() for a in anchors))
