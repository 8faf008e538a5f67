"""vLLM's printed budget rebuilt term by term: requested = total x utilisation, and the identity
requested = weights + activation peak + non-torch (+ CUDA graphs from 0.21) + KV, which derives the
one term a release did not print (vllm/v1/worker/gpu_worker.py determine_available_memory)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvwatch.capacity.budget import Budget, Term, TermSource, int_fact, printed_fraction, putter
from kvwatch.engines.vllm import budget


def graphs_in_budget(version: Any) -> bool:
    """Whether vLLM takes CUDA-graph memory out of the KV budget (0.21+, or an unknown version)."""
    return budget.subtracts_cuda_graphs(str(version) if version else None)


def observed_budget(
    terms: dict[str, Term],
    memory: Mapping[str, Any],
    settings: Mapping[str, Any],
    total: int | None,
    kv: int | None,
) -> Budget:
    put = putter(terms)
    frac, frac_source = printed_fraction("gpu_memory_utilization", memory, settings)
    if frac is None and total is not None:
        version = settings.get("version")
        default: TermSource = "engine_default"
        frac, frac_source = budget.default_utilization(str(version) if version else None), default
    put("usable", int_fact(memory.get("requested_bytes")), "printed")
    if total is not None and frac is not None:
        put("usable", budget.requested_bytes(total, frac), "derived", "total x gpu_memory_utilization")
    usable, weights = terms.get("usable"), terms.get("weights")
    if "activation" not in terms and usable and weights and usable.bytes is not None and kv is not None:
        assert weights.bytes is not None
        subtracted = (
            ("non_torch", "cuda_graphs") if graphs_in_budget(settings.get("version")) else ("non_torch",)
        )
        others = sum(t.bytes or 0 for n, t in terms.items() if n in subtracted)
        put(
            "activation",
            usable.bytes - weights.bytes - kv - others,
            "derived",
            "usable - weights - KV - printed terms: the profiled peak and whatever the log did not print",
        )
    return Budget("vllm", frac, frac_source, terms)
