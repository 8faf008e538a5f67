"""vLLM's printed budget rebuilt term by term: requested = total x utilisation, and the identity
requested = weights + activation peak + non-torch (+ CUDA graphs from 0.21) + KV, which derives the
one term a release did not print (vllm/v1/worker/gpu_worker.py determine_available_memory)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvwatch.capacity.budget import Budget, Term, TermSource, printed_fraction, putter
from kvwatch.engines.vllm import budget
from kvwatch.engines.vllm import memory as terms_model

if TYPE_CHECKING:
    from kvwatch.state.facts import MemoryFacts, SettingsFacts


def graphs_in_budget(version: str | None) -> bool:
    """Whether vLLM takes CUDA-graph memory out of the KV budget (0.21+, or an unknown version)."""
    return terms_model.subtracts_cuda_graphs(version or None)


def observed_budget(
    terms: dict[str, Term],
    memory: MemoryFacts,
    settings: SettingsFacts,
    total: int | None,
    kv: int | None,
) -> Budget:
    put = putter(terms)
    frac, frac_source = printed_fraction(memory.gpu_memory_utilization, settings.gpu_memory_utilization)
    if frac is None and total is not None:
        default: TermSource = "engine_default"
        frac, frac_source = terms_model.default_utilization(settings.version or None), default
    put("usable", memory.requested_bytes, "printed")
    if total is not None and frac is not None:
        put("usable", budget.requested_bytes(total, frac), "derived", "total x gpu_memory_utilization")
    usable, weights = terms.get("usable"), terms.get("weights")
    if "activation" not in terms and usable and weights and usable.bytes is not None and kv is not None:
        assert weights.bytes is not None
        subtracted = ("non_torch", "cuda_graphs") if graphs_in_budget(settings.version) else ("non_torch",)
        others = sum(t.bytes or 0 for n, t in terms.items() if n in subtracted)
        put(
            "activation",
            usable.bytes - weights.bytes - kv - others,
            "derived",
            "usable - weights - KV - printed terms: the profiled peak and whatever the log did not print",
        )
    return Budget("vllm", frac, frac_source, terms)
