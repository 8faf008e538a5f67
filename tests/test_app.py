"""The sidecar in-process and as `kvwatch run`: tail -> /metrics, bad input, auth, TLS, kill -9 recovery."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_until as _wait

from kvwatch.cli import main
from kvwatch.core.events import Event
from kvwatch.sidecar.app import Sidecar
from kvwatch.sidecar.config import load_settings
from kvwatch.sources.hub import discover_model_config

TESTS = Path(__file__).parent
LOG_SAMPLES = TESTS / "log_samples"
MODEL_CONFIGS = TESTS / "model_configs"
LLAMA_8B = MODEL_CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json"
VLLM_STARTUP = (LOG_SAMPLES / "vllm/001-llama31-8b-rtx3090-profiling-20k.log").read_text().splitlines()
VLLM_STATS = (LOG_SAMPLES / "vllm/012-v0-metrics449-low-usage-2025-01.log").read_text().splitlines()
SGLANG_POOL = (LOG_SAMPLES / "sglang/017-dsv32-dp8-mla-kv-size-single-pool.log").read_text().splitlines()
SGLANG_RETRACT = next(
    line
    for line in (LOG_SAMPLES / "sglang/014-decode-oom-retract-old-wording-with-debug-prints.log")
    .read_text()
    .splitlines()
    if "#retracted_reqs" in line
)


def _append(path: Path, *lines: str) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))


def _scrape(url: str, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None) -> str:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=5, context=context) as resp:
        return str(resp.read().decode())


def _status(url: str, headers: dict[str, str] | None = None, context: ssl.SSLContext | None = None) -> int:
    """HTTP status of a GET (errors included), closing the response."""
    try:
        _scrape(url, headers, context)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)
    return 200


def _value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def test_tailed_lines_reach_metrics(tmp_path: Path, sidecar_factory: Callable[..., Sidecar]) -> None:
    log = tmp_path / "vllm.log"
    _append(log, *VLLM_STARTUP)
    car = sidecar_factory(log=[f"v={log}"], model_config=[str(LLAMA_8B)])
    _wait(lambda: _value(_scrape(car.url), "kvwatch_kv_pool_tokens", source="v") == 1952 * 16)
    _append(log, *VLLM_STATS)
    _wait(lambda: _value(_scrape(car.url), "kvwatch_kv_usage_ratio", source="v") == pytest.approx(0.023))
    text = _scrape(car.url)
    assert _value(text, "kvwatch_prediction_available", source="v", state="ok") == 1
    assert _value(text, "kvwatch_lines_read_total", source="v") == len(VLLM_STARTUP) + len(VLLM_STATS)
    assert _value(text, "kvwatch_source_up", source="v") == 1
    assert _scrape(car.url.replace("/metrics", "/healthz")) == "ok\n"
    assert _status(car.url.replace("/metrics", "/nope")) == 404


def test_a_scrape_shows_a_line_appended_just_before_it(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar], monkeypatch: pytest.MonkeyPatch
) -> None:
    """/metrics reads what the engine appended before rendering: the next scrape is current even
    though the tailer's own timed read is rare (here: never within the test)."""
    monkeypatch.setattr("kvwatch.sidecar.app.TAIL_INTERVAL", 3600.0)
    log = tmp_path / "vllm.log"
    _append(log, *VLLM_STARTUP)
    car = sidecar_factory(log=[f"v={log}"], model_config=[str(LLAMA_8B)])
    _wait(lambda: _value(_scrape(car.url), "kvwatch_kv_pool_tokens", source="v") == 1952 * 16)
    for n, line in enumerate(VLLM_STATS, start=1):
        _append(log, line)
        text = _scrape(car.url)  # no waiting: this very scrape has the line
        assert _value(text, "kvwatch_lines_read_total", source="v") == len(VLLM_STARTUP) + n
    assert _value(text, "kvwatch_kv_usage_ratio", source="v") == pytest.approx(0.023)


def test_a_scrape_answers_when_reading_the_log_fails(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar], monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "vllm.log"
    _append(log, *VLLM_STARTUP)
    car = sidecar_factory(log=[f"v={log}"], model_config=[str(LLAMA_8B)])
    _wait(lambda: _value(_scrape(car.url), "kvwatch_kv_pool_tokens", source="v") == 1952 * 16)

    def boom(timeout: float = 0.05) -> bool:
        raise RuntimeError("a bug while reading")

    for src in car._logs:
        assert src.tailer is not None
        monkeypatch.setattr(src.tailer, "refresh", boom)
    assert _value(_scrape(car.url), "kvwatch_kv_pool_tokens", source="v") == 1952 * 16


def test_a_scrape_reads_and_parses_nothing_in_its_http_worker(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The appends a scrape must show are read and parsed by the consumer thread, which the render
    waits for: no line reaches a parser in an HTTP worker."""
    log = tmp_path / "vllm.log"
    _append(log, *VLLM_STARTUP)
    car = sidecar_factory(log=[f"v={log}"], model_config=[str(LLAMA_8B)])
    _wait(lambda: _value(_scrape(car.url), "kvwatch_kv_pool_tokens", source="v") == 1952 * 16)
    (src,) = list(car._logs)
    feed, threads = src.pipeline.feed, []

    def recording_feed(line: str) -> tuple[Event, ...]:
        threads.append(threading.current_thread().name)
        return feed(line)

    monkeypatch.setattr(src.pipeline, "feed", recording_feed)
    for n, line in enumerate(VLLM_STATS[:5], start=1):
        _append(log, line)
        text = _scrape(car.url)  # still no waiting: this very scrape has the line
        assert _value(text, "kvwatch_lines_read_total", source="v") == len(VLLM_STARTUP) + n
    assert len(threads) == 5 and not [name for name in threads if name.startswith("kvwatch-http")], threads


def test_a_read_that_blocks_does_not_block_a_scrape(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log read stuck in the kernel (a hung network file system) holds up its input thread, never
    /metrics: the render waits a bounded time once, then answers from the state it has."""
    log = tmp_path / "vllm.log"
    _append(log, *VLLM_STARTUP)
    car = sidecar_factory(log=[f"v={log}"], model_config=[str(LLAMA_8B)])
    _wait(lambda: _value(_scrape(car.url), "kvwatch_kv_pool_tokens", source="v") == 1952 * 16)
    release, entered = threading.Event(), threading.Event()

    def stuck(timeout: float = 0.05) -> bool:
        entered.set()
        release.wait(30)
        return False

    for src in car._logs:
        assert src.tailer is not None
        monkeypatch.setattr(src.tailer, "refresh", stuck)
    monkeypatch.setattr(car.appends, "wait", 0.2)
    try:
        for _ in range(3):  # urlopen's 5 s: a scrape waiting for the read would fail here
            assert _value(_scrape(car.url), "kvwatch_kv_pool_tokens", source="v") == 1952 * 16
        assert entered.is_set() and car.appends.late == 1  # one late read; the next scrapes did not ask
    finally:
        release.set()


def test_missing_log_is_counted_and_waited_for(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar]
) -> None:
    log = tmp_path / "later.log"
    car = sidecar_factory(log=[f"v={log}"])
    _wait(lambda: _value(_scrape(car.url), "kvwatch_source_up", source="v") == 0)
    _wait(lambda: (_value(_scrape(car.url), "kvwatch_log_read_errors_total", source="v") or 0) >= 1)
    _append(log, *VLLM_STARTUP)
    _wait(lambda: _value(_scrape(car.url), "kvwatch_kv_pool_blocks", source="v") == 1952)
    assert _value(_scrape(car.url), "kvwatch_source_up", source="v") == 1


def test_lines_cut_at_the_cap_are_counted(tmp_path: Path, sidecar_factory: Callable[..., Sidecar]) -> None:
    log = tmp_path / "vllm.log"
    _append(log, *VLLM_STARTUP, "x" * 70_000, "y" * 100)
    car = sidecar_factory(log=[f"v={log}"])
    _wait(lambda: _value(_scrape(car.url), "kvwatch_lines_read_total", source="v") == len(VLLM_STARTUP) + 2)
    assert _value(_scrape(car.url), "kvwatch_log_lines_truncated_total", source="v") == 1


def test_unreachable_engine_metrics_is_source_down(sidecar_factory: Callable[..., Sidecar]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    car = sidecar_factory(metrics_url=[f"e=127.0.0.1:{port}"], scrape_interval=0.2)
    _wait(
        lambda: (
            (_value(_scrape(car.url), "kvwatch_scrape_errors_total", source="e", reason="connection") or 0)
            >= 1
        )
    )
    assert _value(_scrape(car.url), "kvwatch_source_up", source="e") == 0


def test_bad_model_config_keeps_observed_metrics(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar]
) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json", encoding="utf-8")
    log = tmp_path / "vllm.log"
    _append(log, *VLLM_STARTUP, *VLLM_STATS)
    car = sidecar_factory(log=[f"v={log}"], model_config=[str(bad)])
    _wait(lambda: _value(_scrape(car.url), "kvwatch_kv_usage_ratio", source="v") is not None)
    assert _value(_scrape(car.url), "kvwatch_prediction_available", source="v", state="bad_model_config") == 1


def test_basic_auth_and_tls(tmp_path: Path, sidecar_factory: Callable[..., Sidecar]) -> None:
    bcrypt = pytest.importorskip("bcrypt")
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl not installed")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\nbasic_auth_users:\n  prom: '{hashed}'\n",
        encoding="utf-8",
    )
    log = tmp_path / "vllm.log"
    _append(log, *VLLM_STARTUP)
    car = sidecar_factory(log=[f"v={log}"], web_config=str(web))
    assert car.url.startswith("https://")
    ctx = ssl.create_default_context(cafile=str(tmp_path / "cert.pem"))
    ctx.check_hostname = False
    good = {"Authorization": "Basic " + base64.b64encode(b"prom:s3cret").decode()}
    bad = {"Authorization": "Basic " + base64.b64encode(b"prom:wrong").decode()}
    for headers in ({}, bad):
        assert _status(car.url, headers, ctx) == 401
    # /healthz needs no credentials (probes), on the same port and over TLS like everything else.
    assert _scrape(car.url.replace("/metrics", "/healthz"), {}, ctx) == "ok\n"
    _wait(lambda: _value(_scrape(car.url, good, ctx), "kvwatch_kv_pool_blocks", source="v") == 1952)
    with pytest.raises(OSError):  # plain HTTP on the TLS port
        _scrape(car.url.replace("https://", "http://"), good)


def test_discover_model_config_local_and_hf_cache(tmp_path: Path) -> None:
    """The sidecar's lookup of a logged model: a local folder, else huggingface_hub's cache rules."""
    local = tmp_path / "models" / "llama"
    local.mkdir(parents=True)
    shutil.copy(LLAMA_8B, local / "config.json")
    assert discover_model_config(str(local), {}) == local / "config.json"
    hub = tmp_path / "hf" / "hub" / "models--meta-llama--Llama-3.1-8B"
    (hub / "snapshots" / "abc123").mkdir(parents=True)
    (hub / "refs").mkdir()
    (hub / "refs" / "main").write_text("abc123", encoding="utf-8")
    shutil.copy(LLAMA_8B, hub / "snapshots" / "abc123" / "config.json")
    found = hub / "snapshots" / "abc123" / "config.json"
    for env in (
        {"HF_HOME": str(tmp_path / "hf")},
        {"HF_HUB_CACHE": str(tmp_path / "hf" / "hub")},
        {"XDG_CACHE_HOME": str(tmp_path / "xdg")},
        {"HOME": str(tmp_path / "home")},
    ):
        if "XDG_CACHE_HOME" in env or "HOME" in env:
            cache = Path(next(iter(env.values()))) / (
                "huggingface" if "XDG_CACHE_HOME" in env else ".cache/huggingface"
            )
            cache.mkdir(parents=True, exist_ok=True)
            if not (cache / "hub").exists():
                (cache / "hub").symlink_to(tmp_path / "hf" / "hub")
            found_here = cache / "hub" / found.relative_to(tmp_path / "hf" / "hub")
        else:
            found_here = found
        assert discover_model_config("meta-llama/Llama-3.1-8B", env) == found_here, env
    env = {"HF_HOME": str(tmp_path / "hf")}
    assert discover_model_config("meta-llama/Llama-3.1-8B@abc123", env) == found
    assert discover_model_config("meta-llama/Other", env) is None
    assert (
        discover_model_config("meta-llama/Llama-3.1-8B", {"HF_HUB_CACHE": str(tmp_path / "nowhere")}) is None
    )


def test_the_sidecar_fetches_a_logged_model_only_when_allowed() -> None:
    assert load_settings({"log": ["x.log"]}, environ={}).fetch_model_configs is False
    assert load_settings({"log": ["x.log"]}, environ={"KVWATCH_FETCH_MODEL_CONFIGS": "1"}).fetch_model_configs


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "--log", "a.log", "--listen", "nohost:port"],
        ["run", "--log", "a.log", "--model-config", "/does/not/exist.json"],
        ["run", "--log", "a.log", "--gpu", "NoSuchGPU-1GB"],
    ],
)
def test_bad_configuration_exits_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvwatch run: error:"), err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_kvwatch(log: Path, state: Path, port: int) -> subprocess.Popen[bytes]:
    with (log.parent / "kvwatch.stderr").open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "kvwatch", "run", "--log", f"s={log}", "--state-dir", str(state),
             "--listen", f"127.0.0.1:{port}", "--engine", "sglang"],
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip


def _metrics_or_empty(url: str) -> str:
    try:
        return _scrape(url)
    except OSError:
        return ""


@pytest.mark.integration
def test_kill_9_and_restart_recovers_pool_and_counts_once(tmp_path: Path) -> None:
    """kill -9 mid-log, rotate the log while kvwatch is down, restart with the same --state-dir."""
    log, state, port = tmp_path / "sglang.log", tmp_path / "state", _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    lab = {"source": "s", "dp_rank": "0"}
    _append(log, *SGLANG_POOL, SGLANG_RETRACT, SGLANG_RETRACT)
    proc = _start_kvwatch(log, state, port)
    try:
        _wait(lambda: _value(_metrics_or_empty(url), "kvwatch_preemptions_total", **lab) == 2)
        _append(log, SGLANG_RETRACT)
        _wait(lambda: _value(_metrics_or_empty(url), "kvwatch_preemptions_total", **lab) == 3)
        # The state file is written at most once a second by the consumer; wait for the last lines.
        _wait(lambda: _saved_count(state) == 3)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    # Rotate while kvwatch is down: the pool lines are gone from the file kvwatch will read.
    os.replace(log, log.with_name("sglang.log.1"))
    _append(log, SGLANG_RETRACT)
    proc = _start_kvwatch(log, state, port)
    try:
        _wait(lambda: _value(_metrics_or_empty(url), "kvwatch_preemptions_total", **lab) == 4)
        text = _scrape(url)
        assert _value(text, "kvwatch_kv_pool_tokens", **lab) == 1462784
        time.sleep(1.0)  # nothing re-read: the count stays
        assert _value(_scrape(url), "kvwatch_preemptions_total", **lab) == 4
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def _saved_count(state: Path) -> int:
    import json

    try:
        data = json.loads((state / "kvwatch-state.json").read_text())
    except (OSError, ValueError):
        return -1
    return int(sum(inst["preemptions_total"] for inst in data["instances"]))


class _Fixture:
    """An engine /metrics endpoint on 127.0.0.1 serving whatever text the test sets."""

    def __init__(self, text: str) -> None:
        import http.server
        import threading

        self.text = text
        fixture = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - stdlib name
                body = fixture.text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def test_engine_metrics_scraped_and_counter_reset_is_a_restart(
    sidecar_factory: Callable[..., Sidecar],
) -> None:
    text = (TESTS / "metrics_fixtures" / "vllm-0.10.1-v1.txt").read_text()
    engine = _Fixture(text)
    try:
        car = sidecar_factory(metrics_url=[f"e={engine.url}"], scrape_interval=0.1)
        lab = {"source": "e", "dp_rank": "0", "model_name": "Qwen/Qwen2.5-7B-Instruct"}
        _wait(lambda: _value(_scrape(car.url), "kvwatch_kv_pool_blocks", **lab) == 27153)
        page = _scrape(car.url)
        assert _value(page, "kvwatch_kv_pool_tokens", **lab) == 27153 * 16
        assert _value(page, "kvwatch_kv_usage_ratio", **lab) == pytest.approx(0.412)
        assert _value(page, "kvwatch_preemptions_total", **lab) == 7
        assert _value(page, "kvwatch_source_up", source="e") == 1
        # The engine restarts: its preemption counter starts again from 2.
        engine.text = text.replace(
            'model_name="Qwen/Qwen2.5-7B-Instruct"} 7.0', 'model_name="Qwen/Qwen2.5-7B-Instruct"} 2.0'
        )
        _wait(lambda: _value(_scrape(car.url), "kvwatch_engine_restarts_total", **lab) == 1)
        assert _value(_scrape(car.url), "kvwatch_preemptions_total", **lab) == 9
    finally:
        engine.close()


@pytest.mark.integration
def test_stdin_source(tmp_path: Path) -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    with (tmp_path / "stderr").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvwatch", "run", "--log", "-", "--listen", f"127.0.0.1:{port}"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        assert proc.stdin is not None
        proc.stdin.write("".join(line + "\n" for line in [*VLLM_STARTUP, "x" * 70_000]).encode())
        proc.stdin.flush()
        _wait(lambda: _value(_metrics_or_empty(url), "kvwatch_kv_pool_blocks", source="stdin") == 1952)
        _wait(
            lambda: _value(_metrics_or_empty(url), "kvwatch_log_lines_truncated_total", source="stdin") == 1
        )
        proc.stdin.close()  # the engine is gone: the source is down, the exporter stays up
        _wait(lambda: _value(_metrics_or_empty(url), "kvwatch_source_up", source="stdin") == 0)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


@pytest.mark.integration
def test_demo_runs_for_a_bounded_time(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--listen", "127.0.0.1:0", "--duration", "4", "--interval", "0.05", "--no-prometheus"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "sidecar serving http://127.0.0.1:" in out
    assert "pool=476,000 tokens" in out
    assert "pool=1,462,784 tokens" in out
    # The rotation is told once, when kvwatch has followed it.
    assert out.count("vllm log rotated (renamed to vllm.log.1") == 1
    assert out.rstrip().endswith("kvwatch demo: stopped")


def test_model_config_discovered_from_the_logged_model(tmp_path: Path) -> None:
    """No --model-config: the model the engine logs is looked up in the Hugging Face cache."""
    lines = (LOG_SAMPLES / "vllm/032-v1-v014-pp3-apiserver-startup-config.log").read_text().splitlines()
    repo = tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-VL-30B-A3B-Thinking-FP8"
    (repo / "snapshots" / "cf3058e4").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("cf3058e4", encoding="utf-8")
    shutil.copy(MODEL_CONFIGS / "Qwen--Qwen3-30B-A3B.json", repo / "snapshots" / "cf3058e4" / "config.json")
    log = tmp_path / "vllm.log"
    _append(log, *lines)
    results: dict[str, object] = {}
    for name, env in (("found", {"HF_HOME": str(tmp_path / "hf")}), ("missing", {"HOME": str(tmp_path)})):
        settings = load_settings(
            {"log": [f"v={log}"], "listen": "127.0.0.1:0", "gpu_memory": "24GiB"}, environ={}
        )
        car = Sidecar(settings, environ=env)
        car.start()
        try:

            def all_read(car: Sidecar = car) -> bool:
                return _value(_scrape(car.url), "kvwatch_lines_read_total", source="v") == len(lines)

            _wait(all_read)
            page = _scrape(car.url)
            results[name] = [
                state
                for state in (
                    "ok",
                    "no_model_config",
                    "bad_model_config",
                    "unsupported_model",
                    "no_gpu_memory",
                )
                if _value(page, "kvwatch_prediction_available", source="v", state=state) == 1
            ]
            results[name + "_tokens"] = _value(
                page, "kvwatch_kv_pool_predicted_tokens", source="v", basis="config"
            )
        finally:
            car.stop()
    assert results["found"] == ["ok"]
    assert results["found_tokens"] is not None
    assert results["missing"] == ["no_model_config"]


def test_restored_instances_of_removed_sources_are_dropped(tmp_path: Path) -> None:
    from kvwatch.core.events import PoolSized
    from kvwatch.state.fleet import Fleet
    from kvwatch.state.persist import StateStore

    old = Fleet()
    old.apply("gone", PoolSized(engine="vllm", tokens=1000))
    old.apply("v", PoolSized(engine="vllm", tokens=2000))
    StateStore(tmp_path / "state").save(old, {})
    log = tmp_path / "v.log"
    log.touch()
    settings = load_settings(
        {"log": [f"v={log}"], "listen": "127.0.0.1:0", "state_dir": str(tmp_path / "state")}, environ={}
    )
    car = Sidecar(settings, environ={})
    car.start()
    try:
        page = _scrape(car.url)
        assert _value(page, "kvwatch_kv_pool_tokens", source="v") == 2000
        assert _value(page, "kvwatch_kv_pool_tokens", source="gone") is None
    finally:
        car.stop()


def test_bad_settings_file_and_env_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "kvwatch.yaml"
    cfg.write_text("log: [a.log]\nscrape_interval: -1\n", encoding="utf-8")
    assert main(["run", "--config", str(cfg)]) == 2
    assert "scrape_interval" in capsys.readouterr().err
    monkeypatch.setenv("KVWATCH_LISTEN", "127.0.0.1:notaport")
    assert main(["run", "--log", "a.log"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "listen" in err


@pytest.mark.integration
def test_kill_9_while_lines_flow_counts_every_line_once(tmp_path: Path) -> None:
    """kill -9 at an arbitrary moment while the engine keeps writing; after the restart every
    retraction in the log is counted exactly once: the state file and the saved read positions
    always describe the same lines."""
    import threading

    log, state, port = tmp_path / "sglang.log", tmp_path / "state", _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    lab = {"source": "s", "dp_rank": "0"}
    total = 400
    _append(log, *SGLANG_POOL)
    proc = _start_kvwatch(log, state, port)

    def engine() -> None:
        with log.open("a", encoding="utf-8") as fh:
            for _ in range(total):
                fh.write(SGLANG_RETRACT + "\n")
                fh.flush()
                time.sleep(0.01)

    writer = threading.Thread(target=engine)
    try:
        _wait(lambda: _value(_metrics_or_empty(url), "kvwatch_kv_pool_tokens", **lab) == 1462784)
        writer.start()
        # At least one save in the middle of the stream. Scraping meanwhile, as Prometheus does, is
        # what has kvwatch read the lines as they come (its own reads are 10 s apart).
        _wait(lambda: bool(_metrics_or_empty(url)) and _saved_count(state) >= 100)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        writer.join(timeout=30)
    assert _saved_count(state) < total  # killed mid-log, not after the last line
    proc = _start_kvwatch(log, state, port)
    try:
        _wait(lambda: _value(_metrics_or_empty(url), "kvwatch_preemptions_total", **lab) == total)
        time.sleep(1.0)
        page = _scrape(url)
        assert _value(page, "kvwatch_preemptions_total", **lab) == total
        assert _value(page, "kvwatch_kv_pool_tokens", **lab) == 1462784
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


@pytest.mark.integration
def test_kill_9_then_rotation_while_down_counts_every_line_once(tmp_path: Path) -> None:
    """Lines written to the old file after the kill, a rename rotation while kvwatch is down, lines
    in the new file: after the restart the old file is finished from the saved position and the new
    one read from its start, so every retraction is counted once."""
    log, state, port = tmp_path / "sglang.log", tmp_path / "state", _free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    lab = {"source": "s", "dp_rank": "0"}
    _append(log, *SGLANG_POOL)
    proc = _start_kvwatch(log, state, port)
    try:
        with log.open("a", encoding="utf-8") as engine:
            for _ in range(200):
                engine.write(SGLANG_RETRACT + "\n")
                engine.flush()
            _wait(lambda: _saved_count(state) == 200)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            for _ in range(30):  # the engine goes on writing while kvwatch is down
                engine.write(SGLANG_RETRACT + "\n")
        os.replace(log, log.with_name("sglang.log.1"))
        _append(log, *[SGLANG_RETRACT] * 20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    proc = _start_kvwatch(log, state, port)
    try:
        _wait(lambda: _value(_metrics_or_empty(url), "kvwatch_preemptions_total", **lab) == 250)
        time.sleep(1.0)
        assert _value(_scrape(url), "kvwatch_preemptions_total", **lab) == 250
        assert _value(_scrape(url), "kvwatch_kv_pool_tokens", **lab) == 1462784
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_log_and_metrics_of_one_engine_share_a_name(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar]
) -> None:
    """Same NAME for a log and a URL: one set of series, cross-checked; source_up needs both."""
    engine = _Fixture((TESTS / "metrics_fixtures" / "vllm-0.10.1-v1.txt").read_text())
    log = tmp_path / "vllm.log"
    _append(log, *VLLM_STARTUP)  # this log's pool (1,952 blocks) is not the one /metrics reports
    try:
        car = sidecar_factory(log=[f"e={log}"], metrics_url=[f"e={engine.url}"], scrape_interval=0.1)
        _wait(
            lambda: (
                (
                    _value(
                        _scrape(car.url),
                        "kvwatch_log_metrics_disagreements_total",
                        source="e",
                        fact="pool_blocks",
                    )
                    or 0
                )
                >= 1
            )
        )
        page = _scrape(car.url)
        assert _value(page, "kvwatch_source_up", source="e") == 1
        assert _value(page, "kvwatch_lines_read_total", source="e") == len(VLLM_STARTUP)
        assert _value(page, "kvwatch_scrape_errors_total", source="e", reason="connection") == 0
        engine.close()
        _wait(lambda: _value(_scrape(car.url), "kvwatch_source_up", source="e") == 0)
    finally:
        engine.close()


def test_gzip_and_openmetrics_negotiation(tmp_path: Path, sidecar_factory: Callable[..., Sidecar]) -> None:
    import gzip

    log = tmp_path / "vllm.log"
    _append(log, *VLLM_STARTUP)
    car = sidecar_factory(log=[f"v={log}"])
    _wait(lambda: _value(_scrape(car.url), "kvwatch_kv_pool_blocks", source="v") == 1952)
    req = urllib.request.Request(car.url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["Content-Encoding"] == "gzip"
        text = gzip.decompress(resp.read()).decode()
    assert _value(text, "kvwatch_kv_pool_blocks", source="v") == 1952
    req = urllib.request.Request(car.url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        body = resp.read().decode()
    assert body.rstrip().endswith("# EOF")
    assert 'kvwatch_kv_pool_blocks{dp_rank="0",engine_kind="vllm",model_name="",source="v"} 1952.0' in body


@pytest.mark.integration
def test_state_file_pace_facts_soon_usage_later(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar]
) -> None:
    """A new pool or counter is saved within a second; stats lines alone only move the positions,
    which a restart can re-read, so they do not cost a save (JSON dump + fsync) every second."""
    import json

    log = tmp_path / "vllm.log"
    state = tmp_path / "state"
    _append(log, *VLLM_STARTUP)
    car = sidecar_factory(log=[f"v={log}"], state_dir=str(state))
    state_file = state / "kvwatch-state.json"
    _wait(lambda: state_file.exists() and json.loads(state_file.read_text())["instances"] != [])
    saved = state_file.stat().st_mtime_ns
    stats = (
        "INFO 07-10 12:00:10 [loggers.py:116] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 7.2 tokens/s, Running: 3 reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 2.0%, Prefix cache hit rate: 0.0%"
    )
    _append(log, stats)
    _wait(lambda: _value(_scrape(car.url), "kvwatch_requests_running", source="v") == 3)
    time.sleep(1.5)
    assert state_file.stat().st_mtime_ns == saved
    _append(log, stats.replace("Waiting: 0 reqs, ", "Waiting: 0 reqs, Preemptions: 2, "))
    _wait(lambda: json.loads(state_file.read_text())["instances"][0]["preemptions_total"] == 2)


def test_wrong_typed_state_file_starts_fresh_and_metrics_answer(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar]
) -> None:
    """epoch_started "now" once made /metrics reply empty while /healthz said ok."""
    import json

    from kvwatch.core.events import PoolSized
    from kvwatch.state.fleet import Fleet
    from kvwatch.state.persist import StateStore

    old = Fleet()
    old.apply("v", PoolSized(engine="vllm", tokens=2000))
    state = tmp_path / "state"
    StateStore(state).save(old, {})
    data = json.loads((state / "kvwatch-state.json").read_text())
    data["instances"][0]["epoch_started"] = "now"
    (state / "kvwatch-state.json").write_text(json.dumps(data))
    log = tmp_path / "v.log"
    _append(log, *VLLM_STARTUP)
    car = sidecar_factory(log=[f"v={log}"], state_dir=str(state))
    _wait(lambda: _value(_scrape(car.url), "kvwatch_kv_pool_blocks", source="v") == 1952)
    page = _scrape(car.url)
    assert _value(page, "kvwatch_state_file_invalid_total") == 1
    assert len(list(state.glob("kvwatch-state.json.corrupt-*"))) == 1


def test_five_thousand_restored_instances_obey_max_instances(
    tmp_path: Path, sidecar_factory: Callable[..., Sidecar]
) -> None:
    from kvwatch.core.events import PoolSized
    from kvwatch.state.fleet import Fleet
    from kvwatch.state.persist import StateStore

    old = Fleet(max_instances=10_000)
    for i in range(5000):
        old.apply("v", PoolSized(engine="vllm", instance=str(i), tokens=1000))
    StateStore(tmp_path / "state").save(old, {})
    log = tmp_path / "v.log"
    log.touch()
    car = sidecar_factory(log=[f"v={log}"], state_dir=str(tmp_path / "state"), max_instances=256)
    assert _value(_scrape(car.url), "kvwatch_instances") == 256


def test_stop_before_start_returns_at_once_and_saves_nothing(tmp_path: Path) -> None:
    """No consumer runs before start to answer the final save: stop once waited 5 s for it. A
    stop before start (or a second stop) must return at once and leave the state file as it was."""
    from kvwatch.core.events import PoolSized
    from kvwatch.state.fleet import Fleet
    from kvwatch.state.persist import StateStore

    old = Fleet()
    old.apply("v", PoolSized(engine="vllm", tokens=2000))
    state = tmp_path / "state"
    StateStore(state).save(old, {})
    saved = (state / "kvwatch-state.json").read_bytes()
    log = tmp_path / "v.log"
    log.touch()
    settings = load_settings(
        {"log": [f"v={log}"], "listen": "127.0.0.1:0", "state_dir": str(state)}, environ={}
    )
    car = Sidecar(settings, environ={})
    began = time.monotonic()
    car.stop()
    assert time.monotonic() - began < 1.0
    assert (state / "kvwatch-state.json").read_bytes() == saved
    # A started sidecar stopped twice: the second stop has no consumer left either.
    car = Sidecar(settings, environ={})
    car.start()
    assert _value(_scrape(car.url), "kvwatch_kv_pool_tokens", source="v") == 2000
    car.stop()
    began = time.monotonic()
    car.stop()
    assert time.monotonic() - began < 1.0
