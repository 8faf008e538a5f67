"""SGLang's printed budget rebuilt term by term from its 'avail mem' figures: free before weights
x mem_fraction_static is the static part (weights + KV pool); the rest is the reserve for
activations and CUDA graphs (model_runner.py profile_max_num_token)."""

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
from kvwatch.engines.sglang import budget

if TYPE_CHECKING:
    from kvwatch.state.facts import MemoryFacts, PoolFacts, SettingsFacts


def observed_budget(
    terms: dict[str, Term],
    memory: MemoryFacts,
    pool: PoolFacts,
    settings: SettingsFacts,
    total: int | None,
    kv: int | None,
) -> Budget:
    put = putter(terms)
    before = memory.avail_before_weights_bytes
    after_weights = memory.avail_after_weights_bytes
    after_pool = memory.avail_after_pool_bytes
    if kv is None:
        kv = pool.bytes
        put("kv", kv, "printed", "K size + V size of the allocated pool")
    if kv is None and after_weights is not None and after_pool is not None:
        kv = after_weights - after_pool
        put("kv", kv, "derived", "free after weights - free after the pool")
    if total is not None and before is not None:
        put("non_torch", total - before, "derived", "total - free before weights (CUDA context, NCCL)")
    frac, frac_source = printed_fraction(memory.mem_fraction_static, settings.mem_fraction_static)
    if frac is None and total is not None:
        d = Deployment(
            engine="sglang",
            engine_version=settings.version or None,
            gpu_memory_bytes=total,
            tp=settings.tensor_parallel_size or 1,
            pp=settings.pipeline_parallel_size or 1,
        )
        default: TermSource = "engine_default"
        frac, frac_source = budget.default_mem_fraction_static(d).value, default
    pre_load = before
    if pre_load is None and total is not None and "non_torch" in terms:
        pre_load = total - (terms["non_torch"].bytes or 0)
    weights = terms.get("weights")
    if pre_load is not None and frac is not None:
        put("usable", int(pre_load * frac), "derived", "free before weights x mem_fraction_static")
    elif weights is not None and weights.bytes is not None and kv is not None:
        put("usable", weights.bytes + kv, "derived", "weights + KV pool (SGLang's static part)")
    usable = terms.get("usable")
    if pre_load is not None and usable is not None and usable.bytes is not None:
        put("activation", pre_load - usable.bytes, "derived", "reserve outside mem_fraction_static")
    return Budget("sglang", frac, frac_source, terms)


class SglangObserved:
    """SGLang's printed budget read back: the ``ObservedBudget`` part of its Engine (engines/base.py)."""

    def observed_budget(
        self,
        terms: dict[str, Term],
        memory: MemoryFacts,
        pool: PoolFacts,
        settings: SettingsFacts,
        total: int | None,
        kv: int | None,
    ) -> Budget:
        return observed_budget(terms, memory, pool, settings, total, kv)

    def budget_terms_for_gap(
        self, observed_terms: Mapping[str, int | None], settings: SettingsFacts
    ) -> dict[str, int | None]:
        return dict(observed_terms)

    def attribute(
        self,
        observed_terms: Mapping[str, int | None],
        predicted: Mapping[str, int | None],
        observed_fraction: float | None,
        predicted_fraction: float | None,
    ) -> list[Contribution]:
        # kv = (total - non_torch) x f - weights.
        out: list[Contribution] = []
        to, tp_ = observed_terms.get("total"), predicted.get("total")
        no, np_ = observed_terms.get("non_torch"), predicted.get("non_torch")
        fo, fp = observed_fraction, predicted_fraction
        split = False
        if to is not None and tp_ is not None and fp is not None and no is not None and np_ is not None:
            out.append(Contribution("total", round((to - tp_) * fp), to, tp_))
            out.append(Contribution("non_torch", round(-(no - np_) * fp), no, np_))
            if fo is not None:
                out.append(Contribution("utilisation", round((to - no) * (fo - fp)), fo, fp))
                split = True
        return out + usable_and_weights(observed_terms, predicted, split)

    def fraction_lever(
        self, d: Deployment, observed: Budget, fraction: float, new: float
    ) -> FractionLever | None:
        total = observed.get("total")
        if total is None:
            return None
        base = total - (observed.get("non_torch") or 0)
        return FractionLever(
            f"--mem-fraction-static {new}",
            d.with_(mem_fraction_static=new),
            int(base * new) - int(base * fraction),
            "less room for activations and CUDA graphs: risk of CUDA OOM",
        )


OBSERVED = SglangObserved()
