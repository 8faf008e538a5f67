"""Capacity model: size the KV pool from config.json exactly as vLLM and SGLang do.

Public API (used by ``kvwatch predict``, the sidecar, ``explain`` and ``plan``)::

    model = load_model("path/to/config.json")          # or a model dir / hub-cache dir
    dep = Deployment(engine="vllm", gpu_memory_bytes=gpus.lookup("h100").memory_bytes, max_model_len=8192)
    pred = predict(model, dep)                         # Prediction; pred.to_json_dict() is `predict --json`
    tokens, blocks = pool_from_available(model, dep, available_kv_bytes)   # engine-exact division
    dep = deployment_from_settings("vllm", snapshot.settings, snapshot.memory, gpu_memory_bytes=...)
"""

from __future__ import annotations

from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment, deployment_from_settings, kv_elem_bytes, validate
from kvwatch.capacity.geometry import LayerSpec, ModelGeometry, geometry_from_config, load_model
from kvwatch.capacity.gpus import GpuSpec
from kvwatch.capacity.predict import Prediction, pool_from_available, predict
from kvwatch.capacity.weights import weight_bytes, weights_per_rank

__all__ = [
    "Deployment",
    "GpuSpec",
    "LayerSpec",
    "ModelGeometry",
    "Prediction",
    "deployment_from_settings",
    "geometry_from_config",
    "gpus",
    "kv_elem_bytes",
    "load_model",
    "pool_from_available",
    "predict",
    "validate",
    "weight_bytes",
    "weights_per_rank",
]
