"""The prediction of one engine instance's KV pool: every term, and where each input came from.

Engine-neutral: each engine's package under kvwatch/engines fills it with its own arithmetic;
kvwatch.analysis.predict chooses the engine, and the sidecar, ``predict``, ``explain`` and ``plan``
read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, TypedDict

from kvwatch.core.jsontypes import JsonObject, JsonValue
from kvwatch.core.kinds import EngineName

if TYPE_CHECKING:
    from kvwatch.capacity.deployment import Deployment
    from kvwatch.capacity.model import ModelGeometry

InputSource = Literal["given", "engine_default", "estimated", "derived"]


@dataclass(frozen=True)
class Prediction:
    """The predicted KV pool of one engine instance (sizes in bytes per rank unless named otherwise)."""

    engine: EngineName
    engine_version: str | None
    model: str
    gpu_name: str | None
    tp: int
    pp: int
    dcp: int
    kv_cache_dtype: str
    kv_elem_bytes: int
    bytes_per_token: int
    bytes_per_token_all_ranks: int
    weights_bytes: int | None
    weights_total_bytes: int | None
    weights_scheme: str | None
    param_count: int
    total_bytes: int | None
    usable_bytes: int | None
    activation_bytes: int | None
    non_torch_bytes: int | None
    cuda_graph_bytes: int | None
    available_kv_bytes: int
    kv_pool_tokens: int
    kv_pool_blocks: int | None
    kv_pool_bytes: int
    block_size: int
    page_bytes: int | None
    kv_groups: int | None
    swa_pool_tokens: int | None
    max_model_len: int
    max_concurrency: float
    fits: bool
    estimated_max_model_len: int | None
    needed_kv_bytes: int | None
    gpu_memory_utilization: float | None
    mem_fraction_static: float | None
    exact: bool
    failure: str | None
    inputs: dict[str, InputSource] = field(default_factory=dict)
    assumptions: tuple[str, ...] = ()
    # Expected error of available_kv_bytes when the figure is modelled before launch (sized so that
    # about 80 % of real startups land inside it out of sample, widened for every condition outside
    # the calibration envelope); None when it was given or came from the engine's own terms.
    available_kv_band_bytes: int | None = None
    # Whether the CUDA-graph figure is part of the budget (vLLM from 0.20); None when not applicable.
    cuda_graphs_subtracted: bool | None = None
    # The conditions no calibration case covers ('A100 class', 'release 0.10', 'vision tower'): each
    # widened the band (capacity/envelope.py).
    not_calibrated: tuple[str, ...] = ()
    # The most memory other processes (a desktop, another server, a vGPU reserve) may hold on each GPU
    # at launch before this start fails, and how the release fails past it; None where not modelled
    # or the start fails anyway.
    others_limit_bytes: int | None = None
    others_limit_note: str | None = None

    @property
    def error_band_ratio(self) -> float | None:
        """The band as a share of the available KV bytes (the drift alert's config-basis tolerance)."""
        if self.available_kv_band_bytes is None or self.available_kv_bytes <= 0:
            return None
        return self.available_kv_band_bytes / self.available_kv_bytes

    @property
    def fits_at_band_low(self) -> bool | None:
        """Whether one request of max_model_len still fits at the band's low end. False is a fit the
        band does not promise: the modelled figure fits, the error it carries out of sample may not
        (vLLM then refuses to start, SGLang cannot admit such a request). None without a band or fit."""
        if not self.fits or self.available_kv_band_bytes is None or self.needed_kv_bytes is None:
            return None
        return self.available_kv_bytes - self.available_kv_band_bytes >= self.needed_kv_bytes

    def memory_terms(self) -> dict[str, int | None]:
        """The budget by kvwatch.export.names.MEMORY_TERMS term (bytes per rank; None = not part of this budget)."""
        return {
            "total": self.total_bytes,
            "usable": self.usable_bytes,
            "weights": self.weights_bytes,
            "activation": self.activation_bytes,
            "non_torch": self.non_torch_bytes,
            "cuda_graphs": self.cuda_graph_bytes,
            "kv": self.available_kv_bytes,
        }

    @property
    def fraction(self) -> float | None:
        """The memory fraction the budget used (vLLM's utilisation or SGLang's static fraction)."""
        if self.gpu_memory_utilization is not None:
            return self.gpu_memory_utilization
        return self.mem_fraction_static

    def to_json_dict(self) -> JsonObject:
        """The ``kvwatch predict --json`` object: integers of bytes, floats for ratios."""
        return {
            "engine": self.engine,
            "engine_version": self.engine_version,
            "model": self.model,
            "gpu": self.gpu_name,
            "tp": self.tp,
            "pp": self.pp,
            "dcp": self.dcp,
            "kv_cache_dtype": self.kv_cache_dtype,
            "bytes_per_token": self.bytes_per_token,
            "bytes_per_token_all_ranks": self.bytes_per_token_all_ranks,
            "param_count": self.param_count,
            "weights_bytes": self.weights_bytes,
            "weights_total_bytes": self.weights_total_bytes,
            "weights_scheme": self.weights_scheme,
            "available_kv_bytes": self.available_kv_bytes,
            "available_kv_band_bytes": self.available_kv_band_bytes,
            "not_calibrated": list(self.not_calibrated),
            "cuda_graphs_subtracted": self.cuda_graphs_subtracted,
            "kv_pool_tokens": self.kv_pool_tokens,
            "kv_pool_blocks": self.kv_pool_blocks,
            "kv_pool_bytes": self.kv_pool_bytes,
            "swa_pool_tokens": self.swa_pool_tokens,
            "block_size": self.block_size,
            "page_bytes": self.page_bytes,
            "kv_groups": self.kv_groups,
            "max_model_len": self.max_model_len,
            "max_concurrency": round(self.max_concurrency, 4),
            "fits": self.fits,
            "fits_at_band_low": self.fits_at_band_low,
            "estimated_max_model_len": self.estimated_max_model_len,
            "needed_kv_bytes": self.needed_kv_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "mem_fraction_static": self.mem_fraction_static,
            "memory": dict[str, JsonValue](self.memory_terms()),
            "exact": self.exact,
            "failure": self.failure,
            "other_processes_limit_bytes": self.others_limit_bytes,
            "inputs": dict(self.inputs),
            "assumptions": list(self.assumptions),
        }


@dataclass
class Basis:
    """What every engine's prediction starts from: the figures that do not depend on the engine.

    ``inputs`` and ``assumptions`` are filled on: the engine adds what its own arithmetic assumed.
    """

    kv_elem_bytes: int
    max_model_len: int
    bytes_per_token: int
    bytes_per_token_all_ranks: int
    weights_bytes: int | None
    weights_total_bytes: int | None
    weights_scheme: str | None
    inputs: dict[str, InputSource] = field(default_factory=dict)
    assumptions: list[str] = field(default_factory=list)

    def identity(self, model: ModelGeometry, d: Deployment) -> PredictionIdentity:
        """The Prediction fields every engine fills the same way (who, where, bytes per token, weights)."""
        return PredictionIdentity(
            engine=d.engine,
            engine_version=d.engine_version,
            model=model.name,
            gpu_name=d.gpu_name,
            tp=d.tp,
            pp=d.pp,
            dcp=d.dcp,
            kv_cache_dtype=d.kv_cache_dtype,
            kv_elem_bytes=self.kv_elem_bytes,
            bytes_per_token=self.bytes_per_token,
            bytes_per_token_all_ranks=self.bytes_per_token_all_ranks,
            weights_bytes=self.weights_bytes,
            weights_total_bytes=self.weights_total_bytes,
            weights_scheme=self.weights_scheme,
            param_count=model.param_count,
            max_model_len=self.max_model_len,
            inputs=self.inputs,
            assumptions=tuple(self.assumptions),
        )


class PredictionIdentity(TypedDict):
    """Keyword arguments of ``Prediction`` that do not depend on the engine's arithmetic."""

    engine: EngineName
    engine_version: str | None
    model: str
    gpu_name: str | None
    tp: int
    pp: int
    dcp: int
    kv_cache_dtype: str
    kv_elem_bytes: int
    bytes_per_token: int
    bytes_per_token_all_ranks: int
    weights_bytes: int | None
    weights_total_bytes: int | None
    weights_scheme: str | None
    param_count: int
    max_model_len: int
    inputs: dict[str, InputSource]
    assumptions: tuple[str, ...]
