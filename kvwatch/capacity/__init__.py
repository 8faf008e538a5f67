"""Capacity model: what a model and a deployment mean in bytes, engine-neutral.

config.json -> ``ModelGeometry`` (the types in model.py, built by geometry.py with the per-model_type
rules of architectures.py), bytes of weights (weights.py), dtype byte widths (dtypes.py), the card
catalogue (gpus.py), ``Deployment`` (deployment.py), the ``Prediction`` and ``Budget`` types
(prediction.py, budget.py). Each engine's arithmetic over these lives in kvwatch/engines; ``kvwatch.analysis.predict``
puts the two together. This module imports nothing so that importing a submodule stays cheap and
cycle-free::

    from kvwatch.capacity.geometry import load_model
    from kvwatch.analysis.predict import predict
    pred = predict(load_model("config.json"), Deployment(engine="vllm", gpu_memory_bytes=..., max_model_len=8192))
"""
