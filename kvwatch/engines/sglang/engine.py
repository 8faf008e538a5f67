"""SGLang as kvwatch sees it: the Engine protocol over this package's modules."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvwatch.core.errors import ConfigError
from kvwatch.core.kinds import EngineName
from kvwatch.engines.base import FractionLever, LogDialect
from kvwatch.engines.sglang.anchors import ANCHORS
from kvwatch.engines.sglang.flags import FLAGS

if TYPE_CHECKING:
    # Annotations only: kvwatch.state.facts imports the event models (pydantic), and the capacity
    # model (imported by the methods that use it) is not needed to read a log.
    from kvwatch.capacity.budget import Budget, Contribution, Term
    from kvwatch.capacity.deployment import Deployment, DeploymentValue
    from kvwatch.capacity.model import LayerSpec, ModelGeometry
    from kvwatch.capacity.prediction import Basis, Prediction
    from kvwatch.engines.sglang.metrics import SglangMetrics
    from kvwatch.state.facts import MemoryFacts, PoolFacts, SettingsFacts

# Phrases that appear in SGLang output of some release and never in vLLM's (engine detection).
PHRASES: tuple[str, ...] = (
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


class Sglang:
    """The SGLang engine."""

    name: EngineName = "sglang"
    flags = FLAGS
    anchors = ANCHORS
    phrases = PHRASES
    fraction_setting = "mem_fraction_static"
    fraction_label = "static (mem_fraction)"
    overhead_label = "reserved (1 - fraction)"
    # The releases whose logs, /metrics and defaults kvwatch knows (oldest, newest).
    known_versions = ("0.1", "0.5.23")

    # Built on first use (see _log_dialect); cached on the instance, so tests may replace them.
    @functools.cached_property
    def log(self) -> LogDialect:
        return _log_dialect()

    @functools.cached_property
    def metrics(self) -> SglangMetrics:
        return _metrics()

    def default_block_size(self, model: ModelGeometry | None) -> int | None:
        return None

    def layer_bytes(self, layer: LayerSpec, d: Deployment, elem_bytes: int) -> int:
        from kvwatch.engines.sglang import budget

        return budget.layer_cell(layer, budget.heads_tp(d), elem_bytes)

    def needs_gpu_memory(self, d: Deployment) -> bool:
        # SGLang's own 'Load weight end' figure replaces the card's size.
        return d.available_kv_bytes is None and d.free_after_weights_bytes is None

    def predict(self, model: ModelGeometry, d: Deployment, basis: Basis) -> Prediction:
        from kvwatch.engines.sglang import predict

        return predict.predict(model, d, basis)

    def pool_from_available(
        self, model: ModelGeometry, d: Deployment, elem_bytes: int, available: int
    ) -> tuple[int, int | None]:
        from kvwatch.engines.sglang import budget

        return budget.pool(model, d, elem_bytes, available).tokens, None

    def tokens_of_pool_bytes(
        self, model: ModelGeometry, d: Deployment, elem_bytes: int, pool_bytes: int
    ) -> int | None:
        from kvwatch.engines.sglang import budget

        return budget.tokens_of_pool_bytes(model, d, elem_bytes, pool_bytes)

    def observed_budget(
        self,
        terms: dict[str, Term],
        memory: MemoryFacts,
        pool: PoolFacts,
        settings: SettingsFacts,
        total: int | None,
        kv: int | None,
    ) -> Budget:
        from kvwatch.engines.sglang import observed

        return observed.observed_budget(terms, memory, pool, settings, total, kv)

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
        from kvwatch.capacity.budget import Contribution, usable_and_weights

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
        self, d: Deployment, observed_budget: Budget, fraction: float, new: float
    ) -> FractionLever | None:
        total = observed_budget.get("total")
        if total is None:
            return None
        base = total - (observed_budget.get("non_torch") or 0)
        return FractionLever(
            f"--mem-fraction-static {new}",
            d.with_(mem_fraction_static=new),
            int(base * new) - int(base * fraction),
            "less room for activations and CUDA graphs: risk of CUDA OOM",
        )

    def deployment_flags(
        self, utilization: float | None, static_fraction: float | None, block_size: int | None
    ) -> dict[str, DeploymentValue]:
        if utilization is not None:
            raise ConfigError(
                "--gpu-memory-utilization is a vLLM setting; use --mem-fraction-static with SGLang"
            )
        return {"mem_fraction_static": static_fraction, "page_size": block_size}


# Built on first use, as in the vLLM package: a prediction never parses a log or /metrics.
@functools.cache
def _log_dialect() -> LogDialect:
    from kvwatch.engines.sglang import fastpath, log

    return LogDialect(parse=log.parse, anchors=ANCHORS, phrases=PHRASES, fast_path=fastpath.parse_lines)


@functools.cache
def _metrics() -> SglangMetrics:
    from kvwatch.engines.sglang.metrics import SglangMetrics

    return SglangMetrics()


ENGINE = Sglang()
