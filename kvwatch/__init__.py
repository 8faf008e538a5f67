"""kvwatch: predict, observe and explain the KV-cache pool of vLLM and SGLang servers."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
