"""vLLM's printed budget rebuilt term by term: requested = total x utilisation, and the identity
requested = weights + activation peak + non-torch (+ CUDA graphs from 0.21) + KV, which derives the
one term a release did not print (vllm/v1/worker/gpu_worker.py determine_available_memory)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvwatch.capacity.budget import (
    Budget,
    Contribution,
    Term,
    TermSource,
    printed_fraction,
    putter,
    usable_and_weights,
)
from kvwatch.capacity.deployment import Deployment
from kvwatch.engines.base import FractionLever
from kvwatch.engines.vllm import budget
from kvwatch.engines.vllm import memory as terms_model

if TYPE_CHECKING:
    from kvwatch.state.facts import MemoryFacts, PoolFacts, SettingsFacts


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


class VllmObserved:
    """vLLM's printed budget read back: the ``ObservedBudget`` part of its Engine (engines/base.py)."""

    def observed_budget(
        self,
        terms: dict[str, Term],
        memory: MemoryFacts,
        pool: PoolFacts,
        settings: SettingsFacts,
        total: int | None,
        kv: int | None,
    ) -> Budget:
        return observed_budget(terms, memory, settings, total, kv)

    def budget_terms_for_gap(
        self, observed_terms: Mapping[str, int | None], settings: SettingsFacts
    ) -> dict[str, int | None]:
        out = dict(observed_terms)
        if not graphs_in_budget(settings.version):
            # Captured after the pool was sized: printed, but not part of this budget.
            out["cuda_graphs"] = None
        return out

    def attribute(
        self,
        observed_terms: Mapping[str, int | None],
        predicted: Mapping[str, int | None],
        observed_fraction: float | None,
        predicted_fraction: float | None,
    ) -> list[Contribution]:
        # kv = total x f - weights - (activation + non-torch + CUDA graphs); the last three are one
        # term because kvwatch predicts them as one allowance.
        out: list[Contribution] = []
        to, tp_ = observed_terms.get("total"), predicted.get("total")
        fo, fp = observed_fraction, predicted_fraction
        split = to is not None and tp_ is not None and fp is not None and fo is not None
        if to is not None and tp_ is not None and fp is not None and fo is not None:
            out.append(Contribution("total", round((to - tp_) * fp), to, tp_))
            out.append(Contribution("utilisation", round(to * (fo - fp)), fo, fp))
        out += usable_and_weights(observed_terms, predicted, split)
        ao, ap = observed_terms.get("activation"), predicted.get("activation")
        if ao is not None and ap is not None:
            oa = ao + (observed_terms.get("non_torch") or 0) + (observed_terms.get("cuda_graphs") or 0)
            pa = ap + (predicted.get("non_torch") or 0) + (predicted.get("cuda_graphs") or 0)
            out.append(Contribution("activation", -(oa - pa), oa, pa))
        return out

    def fraction_lever(
        self, d: Deployment, observed: Budget, fraction: float, new: float
    ) -> FractionLever | None:
        total = observed.get("total")
        if total is None:
            return None
        extra = budget.requested_bytes(total, new) - budget.requested_bytes(total, fraction)
        return FractionLever(
            f"--gpu-memory-utilization {new}",
            d.with_(gpu_memory_utilization=new),
            extra,
            "less room for activations: risk of CUDA OOM at large prefills",
        )


OBSERVED = VllmObserved()
