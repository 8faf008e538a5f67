"""Model-config discovery: where the config.json of the model an engine logged lives.

Kept on its own so it can be replaced (by huggingface_hub's own cache lookup) without touching the
sidecar's wiring; the Predictor only sees ``find_model_config``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path


def hf_hub_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Hugging Face hub cache folders, in the order huggingface_hub itself looks them up."""
    if environ.get("HF_HUB_CACHE"):
        return [Path(environ["HF_HUB_CACHE"])]
    if environ.get("HF_HOME"):
        return [Path(environ["HF_HOME"]) / "hub"]
    base = Path(environ.get("XDG_CACHE_HOME") or Path(environ.get("HOME", "~")).expanduser() / ".cache")
    return [base / "huggingface" / "hub"]


def find_model_config(model: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """The config.json of the model an engine logged: a local path, or its Hugging Face cache entry."""
    env = os.environ if environ is None else environ
    local = Path(model).expanduser()
    with contextlib.suppress(OSError):
        if local.is_file() and local.name.endswith(".json"):
            return local
        if (local / "config.json").is_file():
            return local / "config.json"
    if model.count("/") != 1 or model.startswith(("/", ".")):
        return None
    for hub in hf_hub_dirs(env):
        repo = hub / f"models--{model.replace('/', '--')}"
        try:
            revision = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
        except OSError:
            revision = ""
        if revision and (repo / "snapshots" / revision / "config.json").is_file():
            return repo / "snapshots" / revision / "config.json"
        with contextlib.suppress(OSError):
            found = sorted(repo.glob("snapshots/*/config.json"), key=lambda p: p.stat().st_mtime)
            if found:
                return found[-1]
    return None
