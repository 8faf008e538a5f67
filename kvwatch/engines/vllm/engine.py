"""vLLM as kvwatch sees it: the Engine protocol over this package's modules."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvwatch.core.errors import ConfigError
from kvwatch.core.kinds import EngineName
from kvwatch.engines.base import FractionLever, LogDialect
from kvwatch.engines.vllm.anchors import ANCHORS
from kvwatch.engines.vllm.flags import FLAGS

if TYPE_CHECKING:
    # Annotations only: kvwatch.state.facts imports the event models (pydantic), and the capacity
    # model (imported by the methods that use it) is not needed to read a log.
    from kvwatch.capacity.budget import Budget, Contribution, Term
    from kvwatch.capacity.deployment import Deployment, DeploymentValue
    from kvwatch.capacity.model import LayerSpec, ModelGeometry
    from kvwatch.capacity.prediction import Basis, Prediction
    from kvwatch.engines.vllm.metrics import VllmMetrics
    from kvwatch.state.facts import MemoryFacts, PoolFacts, SettingsFacts

# Phrases that appear in vLLM output of some release and never in SGLang's (engine detection).
PHRASES: tuple[str, ...] = (
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


class Vllm:
    """The vLLM engine."""

    name: EngineName = "vllm"
    flags = FLAGS
    anchors = ANCHORS
    phrases = PHRASES
    fraction_setting = "gpu_memory_utilization"
    fraction_label = "requested (util)"
    overhead_label = "activation peak"
    # The releases whose logs, /metrics and defaults kvwatch knows (oldest, newest).
    known_versions = ("0.3", "0.33")

    # Built on first use (see _log_dialect); cached on the instance, so tests may replace them.
    @functools.cached_property
    def log(self) -> LogDialect:
        return _log_dialect()

    @functools.cached_property
    def metrics(self) -> VllmMetrics:
        return _metrics()

    def default_block_size(self, model: ModelGeometry | None) -> int | None:
        from kvwatch.engines.vllm import budget

        return budget.DEFAULT_BLOCK_SIZE

    def layer_bytes(self, layer: LayerSpec, d: Deployment, elem_bytes: int) -> int:
        from kvwatch.engines.vllm import budget

        if layer.kind == "mla" and d.kv_cache_dtype == "fp8_ds_mla":
            return budget.FP8_DS_MLA_BYTES + layer.extra_bytes_per_token
        return layer.bytes_per_token(d.tp, elem_bytes)

    def needs_gpu_memory(self, d: Deployment) -> bool:
        return d.available_kv_bytes is None

    def predict(self, model: ModelGeometry, d: Deployment, basis: Basis) -> Prediction:
        from kvwatch.engines.vllm import predict

        return predict.predict(model, d, basis)

    def pool_from_available(
        self, model: ModelGeometry, d: Deployment, elem_bytes: int, available: int
    ) -> tuple[int, int | None]:
        from kvwatch.engines.vllm import budget, memory

        max_model_len = d.max_model_len or model.max_position_embeddings
        if max_model_len is None:
            raise ConfigError("config.json has no max_position_embeddings; pass --max-model-len")
        mnbt = memory.batch_limits(d, max_model_len)[1]
        p = budget.plan(model, d, elem_bytes, available, max_model_len, mnbt)
        return p.tokens, p.num_blocks

    def tokens_of_pool_bytes(
        self, model: ModelGeometry, d: Deployment, elem_bytes: int, pool_bytes: int
    ) -> int | None:
        return None

    def observed_budget(
        self,
        terms: dict[str, Term],
        memory: MemoryFacts,
        pool: PoolFacts,
        settings: SettingsFacts,
        total: int | None,
        kv: int | None,
    ) -> Budget:
        from kvwatch.engines.vllm import observed

        return observed.observed_budget(terms, memory, settings, total, kv)

    def budget_terms_for_gap(
        self, observed_terms: Mapping[str, int | None], settings: SettingsFacts
    ) -> dict[str, int | None]:
        from kvwatch.engines.vllm import observed

        out = dict(observed_terms)
        if not observed.graphs_in_budget(settings.version):
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
        from kvwatch.capacity.budget import Contribution, usable_and_weights

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
        self, d: Deployment, observed_budget: Budget, fraction: float, new: float
    ) -> FractionLever | None:
        from kvwatch.engines.vllm import budget

        total = observed_budget.get("total")
        if total is None:
            return None
        extra = budget.requested_bytes(total, new) - budget.requested_bytes(total, fraction)
        return FractionLever(
            f"--gpu-memory-utilization {new}",
            d.with_(gpu_memory_utilization=new),
            extra,
            "less room for activations: risk of CUDA OOM at large prefills",
        )

    def deployment_flags(
        self, utilization: float | None, static_fraction: float | None, block_size: int | None
    ) -> dict[str, DeploymentValue]:
        if static_fraction is not None:
            raise ConfigError(
                "--mem-fraction-static is an SGLang setting; use --gpu-memory-utilization with vLLM"
            )
        return {"gpu_memory_utilization": utilization, "block_size": block_size}


# The log and /metrics dialects are built on first use: their line tables import regex and the
# event models (pydantic), which a prediction never needs.
@functools.cache
def _log_dialect() -> LogDialect:
    from kvwatch.engines.vllm import fastpath, log

    return LogDialect(
        parse=log.parse,
        anchors=ANCHORS,
        phrases=PHRASES,
        fast_path=fastpath.parse_lines,
    )


@functools.cache
def _metrics() -> VllmMetrics:
    from kvwatch.engines.vllm.metrics import VllmMetrics

    return VllmMetrics()


ENGINE = Vllm()
