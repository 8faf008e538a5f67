"""Models by name (kvwatch/sources/hub.py): ORG/NAME[@REVISION] through huggingface_hub.

The Hub is a stand-in served on 127.0.0.1 (tests/hub_standin.py) reached through HF_ENDPOINT, with
HF_HOME in tmp_path, so the installed huggingface_hub client runs its real code path: fetch from
the stand-in, then from the cache with HF_HUB_OFFLINE=1 and the stand-in stopped. The Qwen3-32B
config.json it serves is the real one in tests/model_configs (provenance in its manifest.json);
the other repositories are labelled test fixtures.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_standin import Repo, StandInHub

from kvwatch.capacity.geometry import load_model
from kvwatch.core.errors import ModelConfigError
from kvwatch.sidecar.config import load_settings
from kvwatch.sources import hub as hub_module
from kvwatch.sources.hub import (
    discover_model_config,
    hub_cache_dir,
    parse_repo_spec,
    resolve_model_config,
)

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "model_configs"
QWEN3_32B = (CONFIGS / "Qwen--Qwen3-32B.json").read_bytes()
MAIN = "a" * 40
PINNED = "b" * 40
# A second Qwen3-32B commit for revision pinning: the real config with a shorter context (test data).
PINNED_CONFIG = json.dumps({**json.loads(QWEN3_32B), "max_position_embeddings": 32768}).encode()
# A test repository with a safetensors index (metadata.total_size made up for the test: 20 GB).
INDEXED_CONFIG = (CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json").read_bytes()
INDEX = json.dumps({"metadata": {"total_size": 20_000_000_000}, "weight_map": {}}).encode()


@pytest.fixture
def hub() -> Iterator[StandInHub]:
    server = StandInHub(
        {
            "Qwen/Qwen3-32B": Repo(
                refs={"main": MAIN, "v0": PINNED},
                commits={MAIN: {"config.json": QWEN3_32B}, PINNED: {"config.json": PINNED_CONFIG}},
            ),
            "kvwatch-test/gated": Repo(
                refs={"main": MAIN}, commits={MAIN: {"config.json": QWEN3_32B}}, gated=True
            ),
            "kvwatch-test/indexed": Repo(
                refs={"main": MAIN},
                commits={MAIN: {"config.json": INDEXED_CONFIG, "model.safetensors.index.json": INDEX}},
            ),
        }
    )
    try:
        yield server
    finally:
        server.close()


def _env(tmp_path: Path, hub: StandInHub | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env["HF_HOME"] = str(tmp_path / "hf")
    if hub is not None:
        env["HF_ENDPOINT"] = hub.url
    env.update(extra)
    return env


def _kvwatch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvwatch", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def _figures(text: str) -> dict[str, object]:
    out = json.loads(text)
    assert isinstance(out, dict)
    out.pop("source", None)
    return out


def test_repo_specs() -> None:
    assert parse_repo_spec("Qwen/Qwen3-32B") == ("Qwen/Qwen3-32B", None)
    assert parse_repo_spec("meta-llama/Llama-3.1-8B@v1.0") == ("meta-llama/Llama-3.1-8B", "v1.0")
    assert parse_repo_spec(f"org/name@{MAIN}") == ("org/name", MAIN)
    for spec in ("config.json", "/abs/path", "./rel/x", "a/b/c", "org/x.json", "../up", "org/", "@x"):
        assert parse_repo_spec(spec) is None, spec


def test_a_local_path_is_used_as_it_is(tmp_path: Path) -> None:
    path = CONFIGS / "Qwen--Qwen3-32B.json"
    assert resolve_model_config(str(path), _env(tmp_path)) == path
    with pytest.raises(ModelConfigError, match="model config not found: nope.json"):
        resolve_model_config("nope.json", _env(tmp_path))


def test_hub_cache_dir_follows_huggingface_hub_precedence(tmp_path: Path) -> None:
    assert hub_cache_dir({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}) == Path("/c")
    assert hub_cache_dir({"HF_HOME": "/h"}) == Path("/h/hub")
    assert hub_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")


@pytest.mark.integration
def test_predict_by_name_from_the_hub_then_from_the_cache(tmp_path: Path, hub: StandInHub) -> None:
    local = _kvwatch(
        _env(tmp_path), "predict", str(CONFIGS / "Qwen--Qwen3-32B.json"), "--gpu", "h100", "--json"
    )
    assert local.returncode == 0, local.stderr

    fetched = _kvwatch(_env(tmp_path, hub), "predict", "Qwen/Qwen3-32B", "--gpu", "h100", "--json")
    assert fetched.returncode == 0, fetched.stderr
    assert _figures(fetched.stdout) == _figures(local.stdout)
    assert _figures(fetched.stdout)["model"] == "Qwen/Qwen3-32B"
    # Only the two JSON files were asked for, never weights. (The client may also GET its own
    # /api/ telemetry registry, which the stand-in refuses.)
    asked = {path.rsplit("/", 1)[1] for _, path in hub.requests if "/resolve/" in path}
    assert all("/resolve/" in path or path.startswith("/api/") for _, path in hub.requests)
    assert asked == {"config.json", "model.safetensors.index.json"}
    snapshot = tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-32B" / "snapshots" / MAIN
    assert (snapshot / "config.json").read_bytes() == QWEN3_32B

    hub.close()
    offline = _kvwatch(_env(tmp_path, hub, HF_HUB_OFFLINE="1"), "predict", "Qwen/Qwen3-32B", "--gpu", "h100")
    assert offline.returncode == 0, offline.stderr
    assert "Qwen/Qwen3-32B" in offline.stdout and "KV pool" in offline.stdout


@pytest.mark.integration
def test_a_gated_repo_needs_a_token(tmp_path: Path, hub: StandInHub) -> None:
    refused = _kvwatch(_env(tmp_path, hub), "predict", "kvwatch-test/gated", "--gpu", "h100")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert "needs a token (set HF_TOKEN)" in refused.stderr
    allowed = _kvwatch(
        _env(tmp_path, hub, HF_TOKEN=hub.token), "predict", "kvwatch-test/gated", "--gpu", "h100"
    )
    assert allowed.returncode == 0, allowed.stderr


@pytest.mark.integration
def test_refusals_are_one_line_errors(tmp_path: Path, hub: StandInHub) -> None:
    env = _env(tmp_path, hub)
    with pytest.raises(ModelConfigError, match="no such model on the Hub at .*: nobody/nothing"):
        resolve_model_config("nobody/nothing", env)
    with pytest.raises(ModelConfigError, match="no revision 'v9' of Qwen/Qwen3-32B"):
        resolve_model_config("Qwen/Qwen3-32B@v9", env)
    with pytest.raises(ModelConfigError, match="is not in the Hugging Face cache .* HF_HUB_OFFLINE is set"):
        resolve_model_config("Qwen/Qwen3-32B", {**env, "HF_HUB_OFFLINE": "1"})
    for cmd in (
        ["plan", "nobody/nothing", "--workload", "1x1024", "--gpu", "h100"],
        ["predict", "nobody/nothing"],
    ):
        out = _kvwatch(env, *cmd)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and "no such model" in out.stderr, (
            out.stderr
        )


class _DeadHub:
    """A port on 127.0.0.1 that takes connections and counts them: it hangs up on each at once
    ('closes') or holds each without a word ('stalls'), the two ways a Hub is unreachable."""

    def __init__(self, mode: str) -> None:
        self.mode, self.connections, self._held = mode, 0, list[socket.socket]()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            if self.mode == "closes":
                conn.close()
            else:
                self._held.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for conn in self._held:
            conn.close()
        self._sock.close()


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["closes", "stalls"])
def test_an_unreachable_hub_fails_at_once(tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """'At once' as structure, not a stopwatch: the resolver's one HEAD, under its own timeout,
    is the only connection made (hf_hub_download alone retries a Hub that never answers)."""
    monkeypatch.setattr(hub_module, "TIMEOUT", 0.5)
    dead = _DeadHub(mode)
    env = {**_env(tmp_path), "HF_ENDPOINT": dead.url}
    raised: list[BaseException] = []

    def resolve() -> None:
        try:
            resolve_model_config("Qwen/Qwen3-32B", env)
        except BaseException as exc:  # noqa: BLE001 - checked below, in the test's thread
            raised.append(exc)

    worker = threading.Thread(target=resolve, daemon=True)
    worker.start()
    worker.join(timeout=60)  # a hang detector: retries against a stalled Hub would go on for minutes
    dead.close()
    assert not worker.is_alive() and dead.connections == 1, dead.connections
    assert len(raised) == 1 and isinstance(raised[0], ModelConfigError)
    assert str(raised[0]).startswith("cannot reach the Hub at http://127.0.0.1:")
    assert "\n" not in str(raised[0])


@pytest.mark.integration
def test_revision_pinning(tmp_path: Path, hub: StandInHub) -> None:
    env = _env(tmp_path, hub)
    pinned = resolve_model_config(f"Qwen/Qwen3-32B@{PINNED}", env)
    assert pinned.parent.name == PINNED
    assert load_model(pinned).max_position_embeddings == 32768
    by_tag = resolve_model_config("Qwen/Qwen3-32B@v0", env)
    assert by_tag == pinned
    main = resolve_model_config("Qwen/Qwen3-32B", env)
    assert main.parent.name == MAIN and load_model(main).max_position_embeddings == 40960
    # Pinned revisions resolve from the cache too, with the Hub gone.
    hub.close()
    offline = {**env, "HF_HUB_OFFLINE": "1"}
    assert resolve_model_config("Qwen/Qwen3-32B@v0", offline) == pinned
    assert resolve_model_config(f"Qwen/Qwen3-32B@{PINNED}", offline) == pinned


@pytest.mark.integration
def test_the_safetensors_index_comes_along(tmp_path: Path, hub: StandInHub) -> None:
    path = resolve_model_config("kvwatch-test/indexed", _env(tmp_path, hub))
    assert (path.parent / "model.safetensors.index.json").is_file()
    assert load_model(path).safetensors_total_size == 20_000_000_000


@pytest.mark.integration
def test_sidecar_discovery_reads_the_cache_only(tmp_path: Path, hub: StandInHub) -> None:
    env = _env(tmp_path, hub)
    assert discover_model_config("Qwen/Qwen3-32B", env) is None
    assert hub.requests == []  # cache only: the Hub was not asked
    fetched = discover_model_config("Qwen/Qwen3-32B", env, allow_network=True)
    assert fetched is not None and fetched.parent.name == MAIN
    hub.close()
    assert discover_model_config("Qwen/Qwen3-32B", env) == fetched
    assert discover_model_config("kvwatch-test/gated", env, allow_network=True) is None
    assert discover_model_config(str(fetched.parent), env) == fetched
    assert discover_model_config(str(fetched), env) == fetched
    assert discover_model_config("not a model", env) is None


def test_discovery_of_an_uncached_name_does_not_import_huggingface_hub(tmp_path: Path) -> None:
    code = (
        "import sys; from kvwatch.sources.hub import discover_model_config as d; "
        f"assert d('Qwen/Qwen3-32B', {{'HF_HOME': {str(tmp_path)!r}}}) is None; "
        "assert 'huggingface_hub' not in sys.modules, 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=ROOT)


@pytest.mark.integration
def test_run_takes_a_model_name(tmp_path: Path, hub: StandInHub, monkeypatch: pytest.MonkeyPatch) -> None:
    path = resolve_model_config("Qwen/Qwen3-32B", _env(tmp_path, hub))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = load_settings(
        {"log": [str(tmp_path / "engine.log")], "model_config": ["Qwen/Qwen3-32B"]}, environ={}
    )
    assert settings.model_config_for("engine") == path
    with pytest.raises(Exception, match="nobody/nothing is not in the Hugging Face cache"):
        load_settings({"log": [str(tmp_path / "engine.log")], "model_config": ["nobody/nothing"]}, environ={})
