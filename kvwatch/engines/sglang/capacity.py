"""SGLang's budget arithmetic before launch: the ``Capacity`` part of its Engine (engines/base.py)."""

from __future__ import annotations

from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.model import LayerSpec, ModelGeometry
from kvwatch.capacity.prediction import Basis, Prediction
from kvwatch.engines.sglang import budget
from kvwatch.engines.sglang import predict as prediction


class SglangCapacity:
    """SGLang's KV cell layout, pool division and prediction."""

    def default_block_size(self, model: ModelGeometry | None) -> int | None:
        return None

    def layer_bytes(self, layer: LayerSpec, d: Deployment, elem_bytes: int) -> int:
        return budget.layer_cell(layer, budget.heads_tp(d), elem_bytes)

    def needs_gpu_memory(self, d: Deployment) -> bool:
        # SGLang's own 'Load weight end' figure replaces the card's size.
        return d.available_kv_bytes is None and d.free_after_weights_bytes is None

    def kv_cache_dtype(self, model: ModelGeometry, d: Deployment) -> tuple[str, str | None]:
        # 'auto' is the model dtype (deployment.kv_elem_bytes); a checkpoint's KV scales are not read.
        return d.kv_cache_dtype, None

    def predict(self, model: ModelGeometry, d: Deployment, basis: Basis) -> Prediction:
        return prediction.predict(model, d, basis)

    def pool_from_available(
        self, model: ModelGeometry, d: Deployment, elem_bytes: int, available: int
    ) -> tuple[int, int | None]:
        return budget.pool(model, d, elem_bytes, available).tokens, None

    def tokens_of_pool_bytes(
        self, model: ModelGeometry, d: Deployment, elem_bytes: int, pool_bytes: int
    ) -> int | None:
        return budget.tokens_of_pool_bytes(model, d, elem_bytes, pool_bytes)


CAPACITY = SglangCapacity()
