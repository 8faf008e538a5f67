"""Scrape-time work reads a snapshot: no /metrics or / render finds, reads or parses a config.json.

The sidecar's consumer thread makes an instance's prediction when its startup facts arrive
(kvwatch/sidecar/consumer.py); a render only looks it up (Predictor.prepared). Before, the first
scrape after a start loaded the model's config.json in the HTTP worker.
"""

from __future__ import annotations

import shutil
import threading
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until

from kvwatch.analysis.predictor import Predictor
from kvwatch.capacity import geometry
from kvwatch.core.events import EngineSettings, MemoryBudget, Preemption, UsageSample
from kvwatch.core.jsontypes import JsonObject
from kvwatch.sidecar import app
from kvwatch.sidecar.app import Sidecar
from kvwatch.sources.hub import discover_model_config
from kvwatch.state.fleet import Fleet

TESTS = Path(__file__).parent
LLAMA_8B = TESTS / "model_configs" / "meta-llama--Meta-Llama-3.1-8B.json"
VLLM_STARTUP = (TESTS / "log_samples/vllm/001-llama31-8b-rtx3090-profiling-20k.log").read_text().splitlines()
# The 0.11.0 banner and args line (the formats of vllm/entrypoints/openai/api_server.py:1839 and
# vllm/entrypoints/utils.py:233 in 0.11.0): the model name the sidecar looks up in the HF cache.
NAMED_STARTUP = [
    "vLLM API server version 0.11.0",
    "non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B', 'model': 'meta-llama/Llama-3.1-8B'}",
    *VLLM_STARTUP,
]


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def _value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


@pytest.fixture
def config_readers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread of every read of a model's config.json (geometry.read_json, which
    load_model reads the file and its weight index with)."""
    threads: list[str] = []
    read = geometry.read_json

    def recorded(path: Path) -> JsonObject:
        threads.append(threading.current_thread().name)
        return read(path)

    monkeypatch.setattr(geometry, "read_json", recorded)
    return threads


def test_the_consumer_reads_the_config_and_a_scrape_only_looks_up(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar], config_readers: list[str]
) -> None:
    log = tmp_path / "vllm.log"
    _write(log, VLLM_STARTUP)
    car = sidecar_factory(log=[f"v={log}"], model_config=[str(LLAMA_8B)])
    wait_until(lambda: _value(_scrape(car.url), "kvwatch_kv_pool_tokens", source="v") == 1952 * 16)
    text = _scrape(car.url)
    assert _scrape(car.url.replace("/metrics", "/")).count("prediction ok") == 1
    assert config_readers and set(config_readers) == {"kvwatch-consumer"}
    # The rows a scrape shows are the prediction an offline command makes of the same snapshot.
    snap = car.fleet.snapshot()[0]
    offline = Predictor(model_config=lambda source: LLAMA_8B).predict(snap)
    assert _value(text, "kvwatch_prediction_available", source="v", state="ok") == 1
    predicted = _value(text, "kvwatch_kv_pool_predicted_tokens", source="v", basis="config")
    assert predicted == offline.tokens["config"]


def test_a_model_found_in_the_hf_cache_is_found_by_the_consumer(
    tmp_path: Path,
    sidecar_factory: Callable[..., Sidecar],
    config_readers: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snapshot = tmp_path / ".cache/huggingface/hub/models--meta-llama--Llama-3.1-8B/snapshots/abc123"
    snapshot.mkdir(parents=True)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123", encoding="utf-8")
    shutil.copy(LLAMA_8B, snapshot / "config.json")
    finders: list[str] = []

    def recorded(
        model: str, environ: Mapping[str, str] | None = None, allow_network: bool = False
    ) -> Path | None:
        finders.append(threading.current_thread().name)
        return discover_model_config(model, environ, allow_network=allow_network)

    monkeypatch.setattr(app, "discover_model_config", recorded)
    log = tmp_path / "vllm.log"
    _write(log, NAMED_STARTUP)
    car = sidecar_factory(log=[f"v={log}"])  # HOME is tmp_path: the cache above
    wait_until(lambda: _value(_scrape(car.url), "kvwatch_prediction_available", source="v", state="ok") == 1)
    assert finders and set(finders) == {"kvwatch-consumer"}
    assert config_readers and set(config_readers) == {"kvwatch-consumer"}


def test_a_scrape_does_not_wait_for_a_prediction_being_made(
    tmp_path: Path,
    sidecar_factory: Callable[..., Sidecar],
    config_readers: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow config.json (a network file system, a Hub fetch) holds up the consumer, not /metrics:
    the scrape shows the observed pool without prediction rows, and the prediction once it is made."""
    release = threading.Event()
    read = geometry.read_json

    def slow(path: Path) -> JsonObject:
        assert release.wait(30)
        return read(path)

    monkeypatch.setattr(geometry, "read_json", slow)
    monkeypatch.setattr(app, "APPENDS_WAIT", 0.2)
    log = tmp_path / "vllm.log"
    _write(log, VLLM_STARTUP)
    car = sidecar_factory(log=[f"v={log}"], model_config=[str(LLAMA_8B)])
    try:
        # The pool as printed; its tokens wait for the engine's default block size (16), which the
        # prediction brings.
        wait_until(lambda: _value(_scrape(car.url), "kvwatch_kv_pool_blocks", source="v") == 1952)
        text = _scrape(car.url)
        assert _value(text, "kvwatch_kv_pool_tokens", source="v") is None
        assert _value(text, "kvwatch_prediction_available", source="v", state="ok") is None
        assert _value(text, "kvwatch_kv_pool_predicted_tokens", source="v", basis="config") is None
        assert "prediction not made yet" in _scrape(car.url.replace("/metrics", "/"))
    finally:
        release.set()
    wait_until(lambda: _value(_scrape(car.url), "kvwatch_prediction_available", source="v", state="ok") == 1)
    assert _value(_scrape(car.url), "kvwatch_kv_pool_tokens", source="v") == 1952 * 16


def test_startup_changes_move_with_what_a_prediction_reads_only() -> None:
    """The consumer re-reads the fleet for predictions only when this counter moved: a stats line
    (nearly every line of a busy engine) leaves it, a new instance or a startup fact moves it."""
    fleet = Fleet()
    fleet.apply("v", MemoryBudget(engine="vllm", weights_bytes=1 << 30))
    first = fleet.startup_changes
    assert first >= 2  # the new instance and its fact
    fleet.apply_all("v", [UsageSample(engine="vllm", kv_usage_ratio=0.5, running=3)] * 3)
    fleet.apply("v", Preemption(engine="vllm", count=2))
    assert fleet.startup_changes == first
    fleet.apply("v", EngineSettings(engine="vllm", max_model_len=8192))
    assert fleet.startup_changes == first + 1
