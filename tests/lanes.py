"""Example counts of the heavy property tests in the two lanes.

``make test`` (what CI runs) draws each property test's full count. ``make unit``, the quick lane,
sets KVWATCH_QUICK_TESTS=1 and draws a quarter of it for the tests that pass their count through
``examples``: those where every example already drives the whole path under test (a fast path
against the general one, a parser or a command against arbitrary input), so the count only decides
how rare an input a run can reach -- the full lane keeps reaching them.
"""

from __future__ import annotations

import os

QUICK = os.environ.get("KVWATCH_QUICK_TESTS") == "1"


def examples(full: int) -> int:
    """``full`` in ``make test``; in ``make unit`` a quarter of it, never under 50."""
    return max(full // 4, 50) if QUICK else full
