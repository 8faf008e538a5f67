"""Errors that stop a command before it does anything.

KvwatchError
 ├── ConfigError             bad flags, environment or YAML settings
 │    └── NoGpuMemoryError   a prediction that needs the card's memory, and none was given or printed
 └── ModelConfigError        a config.json kvwatch cannot size (names the missing field)
      └── UnsupportedModelError  a layer kind or dtype kvwatch does not model
           └── UnmodelledError   something kvwatch cannot size (an architecture, layer kind,
                                 quantization method or KV layout), named, never sized as zero

Each class names the ``kvwatch_prediction_available{state}`` it means (names.PREDICTION_STATES), so
the sidecar reports why it has no prediction without reading messages. The CLI prints
``str(error)`` on one line and exits with code 2.
"""

from __future__ import annotations

from typing import ClassVar

from kvwatch.core.labels import PredictionState


class KvwatchError(Exception):
    """A user-facing error: one line, exit code 2."""

    prediction_state: ClassVar[PredictionState] = "bad_model_config"


class ConfigError(KvwatchError):
    """Invalid kvwatch configuration (flags, environment, settings file)."""


class NoGpuMemoryError(ConfigError):
    """The card's memory is needed and unknown."""

    prediction_state = "no_gpu_memory"


class ModelConfigError(KvwatchError):
    """A model config.json that cannot be read or sized."""


class UnsupportedModelError(ModelConfigError):
    """A config.json whose layer kinds or dtype kvwatch does not model."""

    prediction_state: ClassVar[PredictionState] = "unsupported_model"


class UnmodelledError(UnsupportedModelError):
    """A model_type, layer kind, quantization method or KV layout kvwatch has no rule for.

    Raised instead of a silent default (0 B per token, an unquantised weight count): the message
    names what is unknown, ``predict``/``plan``/``explain`` print it and exit 2, and the sidecar
    exports ``kvwatch_prediction_available{state="unmodelled"}`` (no prediction, so no drift page).
    """

    prediction_state: ClassVar[PredictionState] = "unmodelled"
