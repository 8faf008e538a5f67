"""Engine auto-detection: which engine wrote a log, from phrases only one of them prints.

A source is one engine's log, so the first decisive line settles it for the rest of the file
(the user can force it with ``--engine``). Phrases are plain substrings of the raw line, checked
only on lines that already passed the parsers' anchor filter.
"""

from __future__ import annotations

from kvwatch.events import Engine

# Phrases that appear in vLLM output of some release and never in SGLang's.
VLLM_PHRASES: tuple[str, ...] = (
    "vLLM",
    "vllm",
    "GPU KV cache size",
    "KV cache size:",
    "# GPU blocks",
    "# CUDA blocks",
    "# cuda blocks",
    "CPU blocks:",
    "Maximum concurrency for",
    "Avg prompt throughput",
    "preempted by PreemptionMode",
    "Available KV cache memory",
    "Model loading took",
    "Loading model weights took",
    "max seq len",
    "No available memory for the cache blocks",
    "reserved for KV Cache",
    "Memory profiling results",
    "(EngineCore",
    "(APIServer pid=",
    "VllmWorker",
    "(Worker_",
    "LLM engine",
)

# Phrases that appear in SGLang output of some release and never in vLLM's.
SGLANG_PHRASES: tuple[str, ...] = (
    "sglang",
    "SGLang",
    "Decode batch",
    "Prefill batch",
    "KV Cache is allocated",
    "max_total_num_token",
    "Load weight end",
    "Load weight begin",
    "Memory pool end",
    "#running-req",
    "token usage:",
    "server_args=",
    "Retract requests",
    "Decode out of memory happened",
    "KV cache pool",
    "Not enough memory",
    "avail mem=",
)


def detect_engine(line: str) -> Engine | None:
    """The engine a line reveals, or None when it could come from either (or neither)."""
    vllm = any(p in line for p in VLLM_PHRASES)
    sglang = any(p in line for p in SGLANG_PHRASES)
    if vllm and not sglang:
        return "vllm"
    if sglang and not vllm:
        return "sglang"
    return None
