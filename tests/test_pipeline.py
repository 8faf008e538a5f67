"""LinePipeline, replay and summarize: line -> events -> Fleet, as the sidecar and `kvwatch parse` use them."""

from __future__ import annotations

import dataclasses
import importlib
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvwatch.commands.summary import summarize
from kvwatch.core.events import PoolSized, StartupFailure
from kvwatch.engines import registry
from kvwatch.engines.registry import detect_engine
from kvwatch.sources.pipeline import LinePipeline, replay
from kvwatch.state.fleet import Fleet

SAMPLES = Path(__file__).parent / "log_samples"

STATS = (
    "(APIServer pid=1) INFO 05-12 08:01:39 [loggers.py:271] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
    "Avg generation throughput: 7.2 tokens/s, Running: {run} reqs, Waiting: 1 reqs, {extra}"
    "GPU KV cache usage: {pct}%, Prefix cache hit rate: 0.0%"
)


def pipeline(engine: str = "auto") -> LinePipeline:
    return LinePipeline("src", Fleet(clock=lambda: 0.0), engine=engine)  # type: ignore[arg-type]


def test_lines_without_anchor_are_dropped_and_counted() -> None:
    p = pipeline()
    assert p.feed('(APIServer pid=1) INFO:     127.0.0.1:1 - "GET /metrics HTTP/1.1" 200 OK\n') == ()
    assert p.feed("INFO 05-12 08:01:39 [core.py:1] nothing to see\n") == ()
    assert (p.lines_read, p.lines_matched, p.parse_errors, p.engine) == (2, 0, 0, None)
    assert p.fleet.snapshot() == []


def test_engine_detected_from_first_decisive_line() -> None:
    p = pipeline()
    events = p.feed(STATS.format(run=3, extra="", pct="41.2") + "\r\n")
    assert p.engine == "vllm"
    assert len(events) == 1
    (snap,) = p.fleet.snapshot()
    assert (snap.source, snap.engine, snap.usage.running, snap.usage.kv_usage_ratio) == (
        "src",
        "vllm",
        3,
        0.412,
    )
    assert (p.lines_read, p.lines_matched) == (1, 1)


def test_forced_engine_ignores_the_other_engines_lines() -> None:
    p = pipeline("sglang")
    assert p.feed(STATS.format(run=3, extra="", pct="41.2")) == ()
    assert p.feed("[2025-03-14 02:16:14 TP0] Decode batch. #running-req: 5, #token: 10, token usage: 0.43, ")
    assert p.engine == "sglang"


@pytest.mark.parametrize("path", sorted(SAMPLES.rglob("*.log")), ids=lambda p: p.stem)
def test_every_sample_is_detected_as_its_engine(path: Path) -> None:
    result = replay([str(path)])
    assert result.engine == path.parent.name


def test_parse_error_is_counted_and_skipped() -> None:
    p = pipeline()
    bad = STATS.format(run="many", extra="", pct="41.2")
    assert p.feed(bad) == ()
    assert (p.parse_errors, p.lines_matched) == (1, 0)
    assert p.feed(STATS.format(run=2, extra="", pct="10.0"))
    assert p.parse_errors == 1


def test_unexpected_parser_exception_never_escapes(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(body: str, meta: object) -> tuple[()]:
        raise IndexError("parser bug")

    engine = registry.get("vllm")
    monkeypatch.setattr(engine, "log", dataclasses.replace(engine.log, parse=broken))
    p = pipeline("vllm")
    assert p.feed("GPU KV cache size: 1 tokens") == ()
    assert p.parse_errors == 1


def test_long_line_is_capped() -> None:
    p = LinePipeline("src", Fleet(), max_line_chars=100)
    p.feed("GPU KV cache size: 5 tokens" + " " * 10_000 + "x")
    assert p.lines_truncated == 1
    (snap,) = p.fleet.snapshot()
    assert snap.pool.tokens == 5


def test_tp_ranks_repeating_capacity_are_one_fact() -> None:
    p = pipeline()
    for rank in range(4):
        p.feed(
            f"(Worker_TP{rank} pid={10 + rank}) INFO 02-01 09:15:21 [gpu_worker.py:359] Available KV cache memory: 53.3 GiB"
        )
    p.feed(
        "(EngineCore_DP0 pid=5) INFO 02-01 09:15:22 [kv_cache_utils.py:1305] GPU KV cache size: 434,448 tokens"
    )
    p.feed(
        "(EngineCore_DP0 pid=5) INFO 02-01 09:15:22 [kv_cache_utils.py:1305] GPU KV cache size: 434,448 tokens"
    )
    (snap,) = p.fleet.snapshot()
    assert snap.pool.tokens == 434448
    assert snap.memory.available_kv_bytes == int(53.3 * 2**30 + 0.5)


def test_same_startup_failure_from_every_rank_is_one_failure() -> None:
    err = (
        "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be "
        "stored in KV cache (79392). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
        "when initializing the engine."
    )
    p = pipeline()
    p.feed(f"(VllmWorkerProcess pid=6496) ERROR 07-24 14:07:40 multiproc_worker_utils.py:226] {err}")
    p.feed(f"(VllmWorkerProcess pid=6497) ERROR 07-24 14:07:40 multiproc_worker_utils.py:226] {err}")
    p.feed(f"[rank0]: {err}")
    (snap,) = p.fleet.snapshot()
    assert snap.startup_failures == {"max_model_len_too_large": 1}
    # A new engine start, then the same failure again: that is a second failure.
    p.feed("INFO 07-24 14:10:00 api_server.py:177] vLLM API server version 0.5.3")
    out = p.feed(err)
    assert any(isinstance(e, StartupFailure) for e in out)
    (snap,) = p.fleet.snapshot()
    assert snap.restarts == 1
    assert snap.startup_failures == {"max_model_len_too_large": 2}
    assert snap.last_failure is not None and snap.last_failure.max_tokens_in_cache == 79392


def test_dp_engines_are_separate_instances() -> None:
    p = pipeline()
    for dp, tokens in ((0, "100,000"), (1, "90,000")):
        p.feed(
            f"(EngineCore_DP{dp} pid=1) INFO 10-03 09:15:22 [kv_cache_utils.py:1087] GPU KV cache size: {tokens} tokens"
        )
    p.feed(STATS.format(run=3, extra="", pct="41.2").replace("Engine 000", "Engine 001"))
    snaps = {s.instance: s for s in p.fleet.snapshot()}
    assert snaps["0"].pool.tokens == 100000
    assert snaps["1"].pool.tokens == 90000
    assert snaps["1"].usage.running == 3
    assert snaps["0"].usage.running is None


def test_v0_cumulative_preemption_count_is_the_fact() -> None:
    p = pipeline()
    warning = (
        "WARNING 06-05 10:12:00 scheduler.py:1089] Sequence group {n} is preempted by PreemptionMode.RECOMPUTE "
        "mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
        "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
        "total_num_cumulative_preemption={n}"
    )
    for n in (1, 51, 101):
        p.feed(warning.format(n=n))
    (snap,) = p.fleet.snapshot()
    assert snap.preemptions_total == 101
    summary: Any = summarize(p.fleet.snapshot())
    assert summary["instances"][0]["preemptions_total"] == 101


def test_v1_preemptions_are_per_interval() -> None:
    p = pipeline()
    p.feed(STATS.format(run=3, extra="Preemptions: 4, ", pct="99.0"))
    p.feed(STATS.format(run=3, extra="", pct="99.0"))
    p.feed(STATS.format(run=3, extra="Preemptions: 3, ", pct="99.0"))
    (snap,) = p.fleet.snapshot()
    assert snap.preemptions_total == 7


def test_restart_replaces_the_pool() -> None:
    p = pipeline()
    p.feed("INFO 10-03 09:14:30 [api_server.py:1839] vLLM API server version 0.11.0")
    p.feed("INFO 10-03 09:15:22 [kv_cache_utils.py:1087] GPU KV cache size: 434,448 tokens")
    p.feed("INFO 10-03 10:14:30 [api_server.py:1839] vLLM API server version 0.11.0")
    p.feed("INFO 10-03 10:15:22 [kv_cache_utils.py:1087] GPU KV cache size: 200,000 tokens")
    (snap,) = p.fleet.snapshot()
    assert (snap.epoch, snap.restarts, snap.pool.tokens) == (2, 1, 200000)


@pytest.mark.parametrize(
    "lines",
    [
        [
            "INFO 08-12 10:00:00 [kv_cache_utils.py:716] GPU KV cache size: 434,448 tokens",
            "INFO 08-12 10:00:00 [kv_cache_utils.py:720] Maximum concurrency for 32,768 tokens per request: 13.26x",
        ],
        [
            "(EngineCore pid=5012) INFO 06-01 09:15:22 [kv_cache_utils.py:1870] GPU KV cache size: 434,448 tokens, "
            "Maximum concurrency for 32,768 tokens per request: 13.26x"
        ],
    ],
    ids=["two-lines", "one-line"],
)
def test_size_and_concurrency_pair_either_form(lines: list[str]) -> None:
    p = pipeline()
    for line in lines:
        p.feed(line)
    summary: Any = summarize(p.fleet.snapshot())
    inst = summary["instances"][0]
    assert (inst["kv_pool_tokens"], inst["max_concurrency"], inst["max_concurrency_tokens"]) == (
        434448,
        13.26,
        32768,
    )


def test_embedded_prefix_found_after_junk() -> None:
    p = pipeline()
    (event,) = p.feed(
        "see this: (EngineCore_DP1 pid=5) INFO 10-03 09:15:22 [x.py:1] GPU KV cache size: 7 tokens"
    )
    assert isinstance(event, PoolSized)
    assert (event.instance, event.tokens) == ("1", 7)


def test_replay_files_and_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "a.log"
    log.write_bytes(
        b"INFO 08-12 10:00:00 [kv_cache_utils.py:716] GPU KV cache size: 434,448 tokens\r\n"
        b"\xff\xfe not utf-8 \x80\n"
        + b"x" * 300
        + b"\n"
        + b"Maximum concurrency for 32,768 tokens per request: 13.26x"
    )
    stdin = io.TextIOWrapper(io.BytesIO(b"Available KV cache memory: 8.11 GiB\n"))
    monkeypatch.setattr(sys, "stdin", stdin)
    seen: list[object] = []
    progress: list[tuple[str, int, int]] = []
    result = replay(
        [str(log), "-"],
        on_events=seen.extend,
        progress=lambda s, d, t: progress.append((s, d, t)),
        max_line_chars=100,
    )
    assert [p.source for p in result.pipelines] == [str(log), "stdin"]
    assert [p.lines_read for p in result.pipelines] == [4, 1]
    assert len(seen) == 3
    assert progress[-1] == (str(log), log.stat().st_size, log.stat().st_size)
    summary: Any = summarize(result.snapshots(), result.engine)
    assert [i["source"] for i in summary["instances"]] == [str(log), "stdin"]
    assert summary["instances"][0]["kv_pool_tokens"] == 434448
    assert summary["instances"][1]["kv_pool_bytes"] == 8708046193


def test_summary_shape_and_nulls() -> None:
    p = pipeline()
    p.feed("vLLM API server version 0.9.2")
    p.feed("Model loading took 14.99 GiB and 4.5 seconds")
    summary = summarize(p.fleet.snapshot())
    assert summary == {
        "engine": "vllm",
        "engine_version": "0.9.2",
        "instances": [
            {
                "instance": "0",
                "kv_pool_tokens": None,
                "kv_pool_blocks": None,
                "block_size": None,
                "kv_pool_bytes": None,
                "max_concurrency": None,
                "max_concurrency_tokens": None,
                "model_weights_bytes": 16095389942,
                "kv_usage_ratio": None,
                "requests_running": None,
                "requests_waiting": None,
                "preemptions_total": None,
                "startup_error": None,
            }
        ],
    }
    assert summarize([]) == {"engine": None, "engine_version": None, "instances": []}


def test_tqdm_bar_glued_before_a_log_line() -> None:
    """tqdm writes '\r'-refreshed bars without a newline; the next log line ends up on the same line."""
    p = pipeline()
    (event,) = p.feed(
        "\rCapturing CUDA graphs: 100%|██████████| 67/67 [00:12<00:00,  5.41it/s]"
        "(EngineCore_DP0 pid=5012) INFO 10-03 09:15:40 [gpu_model_runner.py:3480] Graph capturing finished in "
        "12 secs, took 0.62 GiB\r\n"
    )
    assert event.ts == "10-03 09:15:40"
    (snap,) = p.fleet.snapshot()
    assert snap.memory.cuda_graph_bytes == int(0.62 * 2**30 + 0.5)


@pytest.mark.parametrize(
    ("line", "engine"),
    [
        (
            "(EngineCore_DP0 pid=1) INFO 10-03 09:15:22 [kv_cache_utils.py:1087] GPU KV cache size: 5 tokens",
            "vllm",
        ),
        ("INFO 06-05 10:00:00 gpu_executor.py:83] # GPU blocks: 27153, # CPU blocks: 2048", "vllm"),
        ("Maximum concurrency for 32768 tokens per request: 13.26x", "vllm"),
        (
            "[2025-10-07 22:29:11 DP0 TP0] KV Cache is allocated. #tokens: 1462784, KV size: 54.52 GB",
            "sglang",
        ),
        (
            "[2025-03-14 02:16:14 TP0] Decode batch. #running-req: 509, #token: 180776, token usage: 0.43",
            "sglang",
        ),
        (" UserWarning: Warning: available_size=35244, max_total_num_token=42308", "sglang"),
        ("server_args=ServerArgs(model_path='/models/vllm-compat')", None),
        ("the KV cache is full", None),
    ],
)
def test_detect_engine(line: str, engine: str | None) -> None:
    assert detect_engine(line) == engine


def test_undecided_lines_wait_for_a_decisive_one() -> None:
    p = pipeline()
    assert p.feed("server_args=ServerArgs(model_path='/models/vllm-compat')") == ()
    assert p.engine is None
    assert p.feed(
        "[2025-10-07 22:29:11 TP0] KV Cache is allocated. #tokens: 1000, K size: 1.00 GB, V size: 1.00 GB"
    )
    assert p.engine == "sglang"


def test_retraction_printed_by_every_tp_rank_is_counted_once() -> None:
    # SGLang's scheduler runs on every TP rank and each prints the same retraction.
    p = pipeline("sglang")
    for rank in (0, 1, 0, 1):
        p.feed(
            f"[2025-06-01 10:00:0{rank} TP{rank}] KV cache pool is full. Retract requests. "
            "#retracted_reqs: 3, #new_token_ratio: 0.5000 -> 0.8000\n"
        )
    (snap,) = p.fleet.snapshot()
    assert snap.preemptions_total == 6
    # A DP replica's ranks are a separate instance and count on their own.
    p.feed(
        "[2025-06-01 10:00:05 DP1 TP2] KV cache pool is full. Retract requests. "
        "#retracted_reqs: 2, #new_token_ratio: 0.5000 -> 0.8000\n"
    )
    assert {s.instance: s.preemptions_total for s in p.fleet.snapshot()} == {"0": 6, "1": 2}


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_engine_anchors_are_the_log_tables_words(name: str) -> None:
    """The pre-filter of an undetected source and the line table share one declaration of the anchors
    (engines/<engine>/anchors.py): every row's word is declared there, every declared word has a row."""
    engine = registry.get(name)
    declared = importlib.import_module(f"kvwatch.engines.{name}.anchors").ANCHORS
    table = importlib.import_module(f"kvwatch.engines.{name}.log")
    rows = table._TABLE if name == "vllm" else table._HANDLERS
    assert engine.anchors is declared
    assert set(declared) == {anchor for anchor, _ in rows}


@pytest.mark.parametrize(
    ("sample", "other"),
    [
        ("vllm/001-llama31-8b-rtx3090-profiling-20k.log", "sglang"),
        ("sglang/001-qwen3-235b-fp8-tp4-kv-alloc.log", "vllm"),
    ],
)
def test_reading_one_engines_log_builds_no_other_dialect(sample: str, other: str) -> None:
    code = (
        "import sys; from kvwatch.sources.pipeline import replay; "
        f"r = replay([{str(SAMPLES / sample)!r}]); assert r.snapshots(), 'nothing read'; "
        f"loaded = [m for m in sys.modules if m.startswith(('kvwatch.engines.{other}.log', "
        f"'kvwatch.engines.{other}.fastpath', 'kvwatch.capacity'))]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
