"""vLLM's budget arithmetic before launch: the ``Capacity`` part of its Engine (engines/base.py)."""

from __future__ import annotations

from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.model import LayerSpec, ModelGeometry
from kvwatch.capacity.prediction import Basis, Prediction
from kvwatch.core.errors import ConfigError
from kvwatch.engines.vllm import budget, kv_dtype, memory
from kvwatch.engines.vllm import predict as prediction


class VllmCapacity:
    """vLLM's KV cache layout, pool division and prediction."""

    def default_block_size(self, model: ModelGeometry | None) -> int | None:
        return budget.DEFAULT_BLOCK_SIZE

    def layer_bytes(self, layer: LayerSpec, d: Deployment, elem_bytes: int) -> int:
        if layer.kind == "mla" and d.kv_cache_dtype == "fp8_ds_mla":
            return budget.FP8_DS_MLA_BYTES + layer.extra_bytes_per_token
        return layer.bytes_per_token(d.tp, elem_bytes)

    def needs_gpu_memory(self, d: Deployment) -> bool:
        return d.available_kv_bytes is None

    def kv_cache_dtype(self, model: ModelGeometry, d: Deployment) -> tuple[str, str | None]:
        return kv_dtype.resolve(model, d)

    def predict(self, model: ModelGeometry, d: Deployment, basis: Basis) -> Prediction:
        return prediction.predict(model, d, basis)

    def pool_from_available(
        self, model: ModelGeometry, d: Deployment, elem_bytes: int, available: int
    ) -> tuple[int, int | None]:
        max_model_len = d.max_model_len or model.max_position_embeddings
        if max_model_len is None:
            raise ConfigError("config.json has no max_position_embeddings; pass --max-model-len")
        mnbt = memory.batch_limits(d, max_model_len, model.dims)[1]
        p = budget.plan(model, d, elem_bytes, available, max_model_len, mnbt)
        return p.tokens, p.num_blocks

    def tokens_of_pool_bytes(
        self, model: ModelGeometry, d: Deployment, elem_bytes: int, pool_bytes: int
    ) -> int | None:
        return None


CAPACITY = VllmCapacity()
