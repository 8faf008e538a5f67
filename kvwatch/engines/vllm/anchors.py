"""The words of vLLM's log table: the one declaration of its anchors.

``log.py``'s table types each row's anchor as ``Anchor`` (mypy refuses a row whose word is not
declared here) and refuses at import a declared word no row uses. The pipeline's pre-filter of a
source whose engine is not known yet reads ``ANCHORS`` from here, without importing the line table
(regex, the event models), so reading an SGLang log never imports vLLM's table.
"""

from __future__ import annotations

from typing import Literal, get_args

# In the order of the table's rows (an anchor repeated by later rows is listed once).
Anchor = Literal[
    "KV cache",
    "Free memory on device",
    "KV Cache",
    "blocks",
    "Maximum concurrency",
    "took",
    "total_gpu_memory",
    "CUDA graph memory",
    "equested",
    "max model len",
    "max_num_batched_tokens",
    "Defaulting ",
    "memory snapshot",
    "FlashInfer",
    "block size",
    "Prefix cache hit rate",
    "█  model",
    "█  version",
    "version",
    "LLM engine",
    "args",
    "headless",
]

ANCHORS: tuple[Anchor, ...] = get_args(Anchor)
"""Substrings at least one of which every line the table claims contains (the cheap pre-filter)."""
