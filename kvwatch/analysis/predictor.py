"""The sidecar's predictions: the pool of each engine instance, per basis, cached per start.

Basis 'config' uses only what is known before the engine starts (model, settings, GPU memory);
basis 'engine_budget' divides the KV memory the engine itself logged, with the engine's own
arithmetic, so its gap isolates the bytes-per-token model from the memory-budget model. A failure
is a typed error whose ``prediction_state`` the collector exports as is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kvwatch.analysis.attribution import apriori_inputs, engine_budget_pool
from kvwatch.analysis.predict import predict
from kvwatch.capacity.deployment import deployment_from_settings
from kvwatch.capacity.geometry import load_model
from kvwatch.capacity.model import ModelGeometry
from kvwatch.core.errors import KvwatchError
from kvwatch.core.kinds import EngineName
from kvwatch.core.labels import ConcurrencyBasis, PredictionBasis, PredictionState
from kvwatch.engines import registry
from kvwatch.state.facts import MemoryFacts, SettingsFacts
from kvwatch.state.fleet import InstanceSnapshot

log = logging.getLogger(__name__)


# (source, instance, epoch, engine, settings, memory): what one prediction depends on.
_Key = tuple[str, str, int, EngineName, SettingsFacts, MemoryFacts]


@dataclass(frozen=True)
class PredictionResult:
    """What kvwatch predicts for one instance, per basis (the label values of core/labels.py)."""

    state: PredictionState
    reason: str = ""
    # basis -> predicted pool tokens / bytes / max concurrency
    tokens: Mapping[PredictionBasis, int] = field(default_factory=dict)
    bytes: Mapping[PredictionBasis, int] = field(default_factory=dict)
    max_concurrency: Mapping[ConcurrencyBasis, float] = field(default_factory=dict)
    # basis -> the prediction's expected relative error, where it is modelled (config).
    error_ratio: Mapping[PredictionBasis, float] = field(default_factory=dict)
    # basis -> predicted pool blocks (vLLM): what an observed pool known only in blocks is compared
    # with, since vLLM's token count is not blocks x block size (hybrid groups; from 0.20.1 every
    # sliding-window model, budget.logs_tokens_from_concurrency).
    blocks: Mapping[PredictionBasis, int] = field(default_factory=dict)
    bytes_per_token: int | None = None
    # term -> predicted bytes: Prediction.memory_terms() (keyed by MemoryTerm's words).
    memory: Mapping[str, int] = field(default_factory=dict)
    # Tokens per block the engine uses by default when its log does not say (vLLM: 16 on CUDA).
    block_size: int | None = None
    # The context length the engine runs with when neither its log nor /metrics says (the model's
    # default): lets the collector derive headroom in requests for metrics-only sources.
    max_model_len: int | None = None


def _key(snap: InstanceSnapshot) -> _Key:
    # The fact groups are frozen and compare by their facts (not by when they were updated).
    return (snap.source, snap.instance, snap.epoch, snap.engine, snap.settings, snap.memory)


class Predictor:
    """Predicts the pool of each instance from the model config, its logged settings and the GPU.

    Basis 'config' uses only what is known before the engine starts (model, settings, GPU memory);
    basis 'engine_budget' divides the KV memory the engine itself logged, with the engine's own
    arithmetic, so its gap isolates the bytes-per-token model from the memory-budget model.

    ``predict`` computes what it has not yet (an offline command, a test); the sidecar computes in
    its consumer thread (``prepare``, when the startup facts changed) and a scrape only looks up
    (``prepared``), so no scrape reads, parses or fetches a model's config.json.
    """

    def __init__(
        self,
        model_config: Callable[[str], Path | None] = lambda source: None,
        gpu_memory_bytes: int | None = None,
        resolve_model: Callable[[str], Path | None] | None = None,
        max_entries: int = 1024,
    ) -> None:
        self._model_config = model_config
        self._gpu_memory = gpu_memory_bytes
        self._resolve = resolve_model
        self._max = max_entries
        # _lock guards the cache and is held only for a look-up or a store, so a scrape's look-up
        # never waits for a computation; _computing makes one computation at a time (the model and
        # path memos below are its own).
        self._lock = threading.Lock()
        self._computing = threading.Lock()
        self._cache: dict[_Key, PredictionResult] = {}
        self._models: dict[Path, ModelGeometry | KvwatchError] = {}
        self._resolved: dict[str, Path | None] = {}
        self.computations = 0

    def predict(self, snap: InstanceSnapshot) -> PredictionResult:
        """The prediction for one instance, computed once per (epoch, settings, memory)."""
        key = _key(snap)
        with self._computing:
            hit = self._lookup(key)
            if hit is not None:
                return hit
            result = self._compute(snap)
            with self._lock:
                if len(self._cache) >= self._max:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = result
            return result

    def prepare(self, snaps: Iterable[InstanceSnapshot]) -> int:
        """Compute the prediction of every instance whose startup facts have none yet (the sidecar's
        consumer, off the scrape path); how many were computed."""
        made = 0
        for snap in snaps:
            if self._lookup(_key(snap)) is None:
                self.predict(snap)
                made += 1
        return made

    def prepared(self, snap: InstanceSnapshot) -> PredictionResult | None:
        """The prediction made for the instance's startup facts, or None when none is yet: a look-up
        only, never a computation (what a scrape calls)."""
        return self._lookup(_key(snap))

    def _lookup(self, key: _Key) -> PredictionResult | None:
        with self._lock:
            return self._cache.get(key)

    def _model_path(self, source: str, settings: SettingsFacts) -> Path | None:
        given = self._model_config(source)
        if given is not None:
            return given
        model = settings.model
        if model is None or self._resolve is None:
            return None
        if model not in self._resolved:
            path = self._resolve(model)
            self._resolved[model] = path
            if path is None:
                log.info("no model config found for model=%s (give --model-config)", model)
            else:
                log.info("model config discovered model=%s path=%s", model, path)
        return self._resolved[model]

    def _load(self, path: Path) -> ModelGeometry | KvwatchError:
        if path not in self._models:
            try:
                self._models[path] = load_model(path)
            except KvwatchError as exc:
                log.warning("model config unusable path=%s err=%s", path, exc)
                self._models[path] = exc
        return self._models[path]

    def _compute(self, snap: InstanceSnapshot) -> PredictionResult:
        self.computations += 1
        engine = registry.ENGINES[snap.engine]
        path = self._model_path(snap.source, snap.settings)
        if path is None:
            return PredictionResult(state="no_model_config")
        model = self._load(path)
        if isinstance(model, KvwatchError):
            return PredictionResult(state=model.prediction_state, reason=str(model))
        # The same a-priori inputs `kvwatch explain` predicts from (settings, card, fraction).
        settings, apriori = apriori_inputs(snap)
        gpu = self._gpu_memory
        tokens: dict[PredictionBasis, int] = {}
        pool_bytes: dict[PredictionBasis, int] = {}
        concurrency: dict[ConcurrencyBasis, float] = {}
        error_ratio: dict[PredictionBasis, float] = {}
        blocks: dict[PredictionBasis, int] = {}
        memory: dict[str, int] = {}
        bytes_per_token = block_size = None
        max_model_len = model.max_position_embeddings
        state: PredictionState = "ok"
        try:
            # Basis 'config': only what is known before the engine starts (the card, the settings).
            deployment = deployment_from_settings(snap.engine, settings, apriori, gpu)
            block_size = deployment.block_size or deployment.page_size
            if deployment.gpu_memory_bytes is None:
                state = "no_gpu_memory"
            else:
                pred = predict(model, deployment, engine)
                bytes_per_token, block_size = pred.bytes_per_token, pred.block_size
                max_model_len = pred.max_model_len
                tokens["config"] = pred.kv_pool_tokens
                pool_bytes["config"] = pred.kv_pool_bytes
                concurrency["config"] = float(pred.max_concurrency)
                if pred.error_band_ratio is not None:
                    error_ratio["config"] = pred.error_band_ratio
                if pred.kv_pool_blocks is not None:
                    blocks["config"] = pred.kv_pool_blocks
                memory = {k: int(v) for k, v in pred.memory_terms().items() if v is not None}
            # Basis 'engine_budget': the KV memory the engine itself reported, divided its way.
            # vLLM prints its budget ('Available KV cache memory'); SGLang prints the pool's bytes.
            full = deployment_from_settings(snap.engine, settings, snap.memory, gpu)
            own_pool = engine_budget_pool(engine, model, full, snap.memory, snap.pool)
            if own_pool is not None:
                available = own_pool.bytes
                tokens["engine_budget"] = own_pool.tokens
                if own_pool.blocks is not None:
                    blocks["engine_budget"] = own_pool.blocks
                pool_bytes["engine_budget"] = available
                # The engine's own concurrency (blocks over the blocks one request takes), not
                # tokens / max_model_len: the two differ for sliding-window layers up to vLLM 0.20.0.
                max_len = settings.max_model_len
                if max_len is not None and max_len > 0:
                    own = predict(model, full.with_(available_kv_bytes=available), engine)
                    concurrency["engine_budget"] = float(own.max_concurrency)
        except KvwatchError as exc:
            log.info("no prediction source=%s dp_rank=%s err=%s", snap.source, snap.instance, exc)
            return PredictionResult(
                state=exc.prediction_state,
                reason=str(exc),
                block_size=block_size,
                max_model_len=max_model_len,
            )
        return PredictionResult(
            state=state,
            tokens=tokens,
            bytes=pool_bytes,
            max_concurrency=concurrency,
            error_ratio=error_ratio,
            blocks=blocks,
            bytes_per_token=bytes_per_token,
            memory=memory,
            block_size=block_size,
            max_model_len=max_model_len,
        )
