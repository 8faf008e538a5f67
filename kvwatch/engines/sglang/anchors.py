"""The words of SGLang's log table: the one declaration of its anchors.

``log.py``'s dispatch table types each row's anchor as ``Anchor`` (mypy refuses a row whose word is
not declared here) and refuses at import a declared word no row uses. The pipeline's pre-filter of a
source whose engine is not known yet reads ``ANCHORS`` from here, without importing the line table
(regex, the event models), so reading a vLLM log never imports SGLang's table.
"""

from __future__ import annotations

from typing import Literal, get_args

# In the order of the dispatch table (most frequent on a busy server first).
Anchor = Literal[
    "Decode batch",
    "Prefill batch",
    "#retracted_reqs",
    "Cache is allocated",
    "KV cache allocated",
    "swa_layer_tokens=",
    "max_total_num_token",
    "Load weight ",
    "Memory pool end",
    "graph end",
    "server_args=",
    "Not enough ",
    "is too small",
    "cannot hold even one request",
    "reduce --mem-fraction-static",
    "sglang: ",
]

ANCHORS: tuple[Anchor, ...] = get_args(Anchor)
"""Substrings of which every line a pattern of the table can claim contains at least one."""
