"""Why the pool differs from the prediction: the KV-budget gap split into the terms that caused it.

An engine sizes its KV pool by subtraction (vLLM: total x gpu_memory_utilization - weights -
activation peak - non-torch - CUDA graphs; SGLang: (free before weights) x mem_fraction_static -
weights). ``observed_budget`` rebuilds that subtraction from what the engine printed (each engine's
own identity, kvwatch/engines/*/observed.py); ``attribute_gap`` splits the difference between the
observed and the predicted KV budget into its terms (bytes, and percent of the predicted budget).
The sidecar's gap metric and ``kvwatch explain`` call the same functions on the same snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from kvwatch.analysis.predict import pool_from_available, tokens_of_pool_bytes
from kvwatch.capacity.budget import Budget, Contribution, Term, putter
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.model import ModelGeometry
from kvwatch.engines.base import Engine
from kvwatch.state.facts import MemoryFacts, PoolFacts, SettingsFacts
from kvwatch.state.fleet import InstanceSnapshot

# Every term attribute_gap can name (a bounded label set for a per-term gap metric), in the order
# the KV budget subtracts them.
ATTRIBUTION_TERMS: tuple[str, ...] = (
    "total",
    "utilisation",
    "usable",
    "non_torch",
    "weights",
    "activation",
    "unattributed",
)


def apriori_inputs(snap: InstanceSnapshot) -> tuple[SettingsFacts, MemoryFacts]:
    """(settings, memory) a prediction may use before the engine starts, as the sidecar uses them.

    Of the memory budget, only what is known before the engine starts: the card and the fraction.
    vLLM's 'Maximum concurrency for N tokens per request' names max_model_len when no settings
    line did.
    """
    settings = snap.settings
    if settings.max_model_len is None and snap.pool.max_concurrency_tokens:
        settings = replace(settings, max_model_len=snap.pool.max_concurrency_tokens)
    m = snap.memory
    memory = MemoryFacts(
        total_bytes=m.total_bytes,
        gpu_memory_utilization=m.gpu_memory_utilization,
        mem_fraction_static=m.mem_fraction_static,
        updated_at=m.updated_at,
    )
    return settings, memory


def observed_budget(
    engine: Engine,
    memory: MemoryFacts,
    pool: PoolFacts,
    settings: SettingsFacts,
    gpu_memory_bytes: int | None = None,
) -> Budget:
    """The engine's budget from its printed terms; a missing term is derived only from the identity."""
    terms: dict[str, Term] = {}
    put = putter(terms)

    total = memory.total_bytes
    put("total", total, "printed")
    if total is None and gpu_memory_bytes is not None:
        total = gpu_memory_bytes
        put("total", total, "given", "--gpu / --gpu-memory")
    put("weights", memory.weights_bytes, "printed")
    put("non_torch", memory.non_torch_bytes, "printed")
    put("cuda_graphs", memory.cuda_graph_bytes, "printed")
    put("activation", memory.activation_bytes, "printed")
    kv = memory.available_kv_bytes
    put("kv", kv, "printed")
    return engine.observed.observed_budget(terms, memory, pool, settings, total, kv)


@dataclass(frozen=True)
class EngineBudgetPool:
    """The pool the engine makes of the KV memory it printed (basis 'engine_budget')."""

    tokens: int
    blocks: int | None
    bytes: int


def engine_budget_pool(
    engine: Engine, model: ModelGeometry, deployment: Deployment, memory: MemoryFacts, pool: PoolFacts
) -> EngineBudgetPool | None:
    """The printed KV memory divided the engine's way: the one figure the sidecar's engine_budget
    gauges and ``kvwatch explain`` both show.

    vLLM prints its budget ('Available KV cache memory'): divided as the engine divides it. SGLang
    prints the pool's buffers ('KV size'), whose bytes per token differ from the cell its budget is
    divided by (DeepSeek sparse attention): the tokens are the buffers' own. None when the engine
    printed neither, or no positive amount.
    """
    available = memory.available_kv_bytes
    printed_pool = available is None and pool.bytes is not None
    if available is None:
        available = pool.bytes
    if available is None or available <= 0:
        return None
    tokens, blocks = pool_from_available(model, deployment, available, engine)
    if printed_pool:
        tokens = tokens_of_pool_bytes(model, deployment, available, engine) or tokens
    return EngineBudgetPool(tokens, blocks, available)


@dataclass(frozen=True)
class Attribution:
    """The KV-budget gap (observed - predicted) split into the terms that make it up."""

    observed_kv: int
    predicted_kv: int
    contributions: tuple[Contribution, ...]
    # The terms either side brings into the split (what the release subtracts and someone knows).
    counted: frozenset[str] = frozenset()

    @property
    def gap_bytes(self) -> int:
        return self.observed_kv - self.predicted_kv

    @property
    def gap_ratio(self) -> float | None:
        """observed / predicted - 1, the same ratio as the sidecar's gap gauge."""
        return gap_ratio(self.observed_kv, self.predicted_kv)

    def percent(self, c: Contribution) -> float | None:
        """A contribution in percent of the predicted KV budget."""
        return 100.0 * c.bytes / self.predicted_kv if self.predicted_kv > 0 else None

    def share(self, c: Contribution) -> float | None:
        """A contribution as a share of the gap (the shares sum to 1)."""
        gap = self.gap_bytes
        return c.bytes / gap if gap else None

    def main_terms(self, share: float = 0.1) -> list[Contribution]:
        """The terms that make up at least ``share`` of the gross gap, largest first."""
        gross = sum(abs(c.bytes) for c in self.contributions)
        if gross == 0:
            return []
        return sorted(
            (c for c in self.contributions if abs(c.bytes) >= share * gross),
            key=lambda c: -abs(c.bytes),
        )


def gap_ratio(observed: float | None, predicted: float | None) -> float | None:
    """observed / predicted - 1 (negative: smaller than predicted); None when undefined."""
    if observed is None or predicted is None or predicted <= 0:
        return None
    return observed / predicted - 1.0


def attribute_gap(
    engine: Engine,
    observed: Mapping[str, int | None],
    predicted: Mapping[str, int | None],
    observed_fraction: float | None = None,
    predicted_fraction: float | None = None,
) -> Attribution | None:
    """Split observed KV - predicted KV (names.MEMORY_TERMS mappings, bytes per rank) by term.

    vLLM: kv = total x f - weights - (activation + non-torch + CUDA graphs); the last three are
    one term because kvwatch predicts them as one allowance. SGLang: kv = (total - non_torch) x f
    - weights. Each difference is weighted as it enters the identity (a card that is 1 GiB larger
    adds f GiB, not 1 GiB); what no known term explains is 'unattributed'. None when either KV
    budget is unknown. Pass only the terms the release subtracts (``engine.observed.budget_terms_for_gap`` on
    both sides): the contributions and 'unattributed' then add up to the gap exactly.
    """
    ok, pk = observed.get("kv"), predicted.get("kv")
    if ok is None or pk is None:
        return None
    out = engine.observed.attribute(observed, predicted, observed_fraction, predicted_fraction)
    rest = (ok - pk) - sum(c.bytes for c in out)
    out.append(Contribution("unattributed", rest))
    counted = frozenset(
        n for n in (*observed, *predicted) if (observed.get(n), predicted.get(n)) != (None, None)
    )
    return Attribution(ok, pk, tuple(out), counted)
