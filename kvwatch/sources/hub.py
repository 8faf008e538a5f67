"""Model configs by name: ``ORG/NAME[@REVISION]`` through huggingface_hub, local paths as they are.

Everywhere kvwatch takes a model config (``predict``, ``plan``, ``explain``, ``run --model-config``)
it also takes a Hub repository id. A path that exists is used as it is (a config.json, a model
directory, a hub-cache ``models--ORG--NAME`` directory). Otherwise a spec shaped like a repository
id resolves through huggingface_hub's own cache rules:

1. the local Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub),
   for the revision asked (default ``main``, through ``refs/``) -- no network;
2. then, unless HF_HUB_OFFLINE is set, the Hub at HF_ENDPOINT (default huggingface.co) with
   HF_TOKEN, fetching config.json and, when the repository has one, model.safetensors.index.json
   (it refines the weights estimate) into that cache -- never the weights.

Failures are one-line ModelConfigErrors: a gated or private repository "needs a token (set
HF_TOKEN)", a missing one is "no such model". huggingface_hub is imported only when a name must be
resolved, so commands and the sidecar that are given paths never load it.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvwatch.core.errors import ModelConfigError

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
# ORG/NAME as the Hub spells repository ids, optionally @REVISION (branch, tag or commit hash).
_REPO_ID = re.compile(
    r"(?P<repo>[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@(?P<revision>[A-Za-z0-9][\w./-]*))?"
)
_TRUE = {"1", "on", "yes", "true"}
# Seconds to wait for the Hub's answer to one request.
TIMEOUT = 10.0


def parse_repo_spec(spec: str) -> tuple[str, str | None] | None:
    """(repo id, revision or None) of ``ORG/NAME[@REVISION]``, or None when ``spec`` is not one."""
    match = _REPO_ID.fullmatch(spec.strip())
    if match is None or ".." in match["repo"] or match["repo"].endswith((".json", "/")):
        return None
    return match["repo"], match["revision"]


def hub_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The Hugging Face hub cache folder, by huggingface_hub's own precedence of variables."""
    env = os.environ if environ is None else environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    home = Path(env["HOME"]) if env.get("HOME") else Path.home()
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else home / ".cache"
    return base.expanduser() / "huggingface" / "hub"


def hub_offline(environ: Mapping[str, str] | None = None) -> bool:
    """Whether HF_HUB_OFFLINE forbids asking the Hub."""
    env = os.environ if environ is None else environ
    return env.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def _label(repo: str, revision: str | None) -> str:
    return f"{repo}@{revision}" if revision else repo


def _repo_cached(repo: str, cache: Path) -> bool:
    """Whether the cache has any entry for ``repo`` (checked before importing huggingface_hub)."""
    return (cache / f"models--{repo.replace('/', '--')}").is_dir()


def _from_cache(repo: str, revision: str | None, cache: Path) -> Path | None:
    """config.json of ``repo`` at ``revision`` in the cache, without any network access."""
    if not _repo_cached(repo, cache):
        return None
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, CONFIG, cache_dir=str(cache), revision=revision)
    return Path(found) if isinstance(found, str) else None


def _download(repo: str, revision: str | None, environ: Mapping[str, str], cache: Path) -> Path:
    """Fetch config.json (and the safetensors index, when there is one) from the Hub into the cache."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils.tqdm import disable_progress_bars

    label = _label(repo, revision)
    endpoint = environ.get("HF_ENDPOINT") or None
    token = environ.get("HF_TOKEN") or None
    where = f" at {endpoint}" if endpoint else ""
    options: dict[str, Any] = {"cache_dir": str(cache), "endpoint": endpoint, "token": token}
    try:
        with warnings.catch_warnings():
            # Two small JSON files: no progress bars, and no library warnings on a one-line CLI.
            warnings.simplefilter("ignore")
            disable_progress_bars()
            # One HEAD first, without the download's retries and cache fallback, so that an
            # unreachable Hub fails at once and every refusal keeps its own error class.
            get_hf_file_metadata(
                hf_hub_url(repo, CONFIG, revision=revision, endpoint=endpoint), token=token, timeout=TIMEOUT
            )
            path = Path(hf_hub_download(repo, CONFIG, revision=revision, etag_timeout=TIMEOUT, **options))
    except GatedRepoError:
        raise ModelConfigError(f"{label} is gated: it needs a token (set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise ModelConfigError(f"no revision {revision!r} of {repo} on the Hub{where}") from None
    except RepositoryNotFoundError as exc:
        private = _status(exc) in (401, 403) and token is None
        hint = " (or it is private and needs a token: set HF_TOKEN)" if private else ""
        raise ModelConfigError(f"no such model on the Hub{where}: {repo}{hint}") from None
    except LocalEntryNotFoundError as exc:
        raise ModelConfigError(f"cannot fetch {label} from the Hub{where}: {_one_line(exc)}") from None
    except EntryNotFoundError:
        raise ModelConfigError(f"{label} has no {CONFIG} on the Hub{where}") from None
    except HfHubHTTPError as exc:
        status = _status(exc)
        if status in (401, 403):
            raise ModelConfigError(
                f"{label} needs a token (set HF_TOKEN): the Hub answered {status}"
            ) from None
        raise ModelConfigError(f"cannot fetch {label} from the Hub{where}: HTTP {status}") from None
    except Exception as exc:
        # The transport's own errors (requests before huggingface_hub 1.0, httpx after: no
        # common base class), timeouts, a file-system error writing the cache.
        raise ModelConfigError(
            f"cannot reach the Hub{where} for {label} ({_one_line(exc)}); "
            "give a config.json path, or set HF_HUB_OFFLINE=1 to use the cache only"
        ) from None
    # The index only refines the weights: a repository without one, or a failure, is not an error.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf_hub_download(repo, INDEX, revision=revision, etag_timeout=TIMEOUT, **options)
    except Exception:  # the transport errors above; the config alone is enough
        pass
    return path


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:160] + "...") if len(text) > 160 else (text or type(exc).__name__)


def resolve_model_config(spec: str, environ: Mapping[str, str] | None = None) -> Path:
    """A model config path for ``spec``: an existing path as it is, else a Hub name through the cache
    and then (unless HF_HUB_OFFLINE) the Hub. ModelConfigError (one line) when neither has it."""
    env = os.environ if environ is None else environ
    local = Path(spec).expanduser()
    if local.exists():
        return local
    parsed = parse_repo_spec(spec)
    if parsed is None:
        raise ModelConfigError(
            f"model config not found: {spec} (give a config.json, a model directory or a Hub name ORG/NAME)"
        )
    repo, revision = parsed
    cache = hub_cache_dir(env)
    cached = _from_cache(repo, revision, cache)
    if cached is not None:
        return cached
    if hub_offline(env):
        raise ModelConfigError(
            f"{_label(repo, revision)} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE is set"
        )
    return _download(repo, revision, env, cache)


def discover_model_config(
    model: str, environ: Mapping[str, str] | None = None, *, allow_network: bool = False
) -> Path | None:
    """The config.json of the model an engine logged, or None when kvwatch cannot find it.

    For the sidecar: a local path (a .json file, or a directory holding config.json), else a Hub
    name from the local cache only -- the Hub itself is asked only with ``allow_network`` (and
    never under HF_HUB_OFFLINE). Never raises for a model it cannot find or fetch.
    """
    env = os.environ if environ is None else environ
    local = Path(model).expanduser()
    try:
        if local.is_file() and local.name.endswith(".json"):
            return local
        if (local / CONFIG).is_file():
            return local / CONFIG
    except OSError:
        return None
    parsed = parse_repo_spec(model)
    if parsed is None:
        return None
    repo, revision = parsed
    cache = hub_cache_dir(env)
    try:
        cached = _from_cache(repo, revision, cache)
        if cached is not None or not allow_network or hub_offline(env):
            return cached
        return _download(repo, revision, env, cache)
    except (ModelConfigError, OSError, ValueError):
        return None
