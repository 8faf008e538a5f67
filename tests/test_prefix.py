"""Prefix stripping: one case per wrapper style, as engines, runtimes and launchers print them."""

from __future__ import annotations

import json

import pytest

from kvwatch.parsers.base import LineMeta
from kvwatch.parsers.prefix import strip_embedded, strip_prefixes

MSG = "GPU KV cache size: 434,448 tokens"

CASES: list[tuple[str, str, str, LineMeta]] = [
    ("bare", MSG, MSG, LineMeta()),
    ("crlf", MSG + "\r\n", MSG, LineMeta()),
    (
        "vllm<=0.7 level prefix without bracket",
        "INFO 06-05 10:00:00 gpu_executor.py:122] # GPU blocks: 27152, # CPU blocks: 2048",
        "# GPU blocks: 27152, # CPU blocks: 2048",
        LineMeta(ts="06-05 10:00:00"),
    ),
    (
        "vllm 0.8+ [file:line]",
        f"INFO 08-12 10:00:00 [kv_cache_utils.py:716] {MSG}",
        MSG,
        LineMeta(ts="08-12 10:00:00"),
    ),
    (
        "vllm DEBUG path fileinfo",
        f"DEBUG 08-12 10:00:00 [v1/core/kv_cache_utils.py:716] {MSG}",
        MSG,
        LineMeta(ts="08-12 10:00:00"),
    ),
    (
        "vllm 0.11 ANSI EngineCore_DP0",
        f"\x1b[1;36m(EngineCore_DP0 pid=5012)\x1b[0;0m INFO 10-03 09:15:22 [kv_cache_utils.py:1087] {MSG}",
        MSG,
        LineMeta(instance="0", ts="10-03 09:15:22"),
    ),
    (
        "vllm EngineCore_DP3",
        f"(EngineCore_DP3 pid=5012) INFO 10-03 09:15:22 [kv_cache_utils.py:1087] {MSG}",
        MSG,
        LineMeta(instance="3", ts="10-03 09:15:22"),
    ),
    (
        "vllm 0.8.5 EngineCore_1",
        f"(EngineCore_1 pid=5012) INFO 05-01 09:15:22 [kv_cache_utils.py:634] {MSG}",
        MSG,
        LineMeta(instance="1", ts="05-01 09:15:22"),
    ),
    (
        "vllm 0.12 ColoredFormatter",
        f"\x1b[32mINFO\x1b[0m \x1b[90m08-12 10:00:00\x1b[0m \x1b[90m[kv_cache_utils.py:1291]\x1b[0m {MSG}",
        MSG,
        LineMeta(ts="08-12 10:00:00"),
    ),
    (
        "vllm VllmWorker rank",
        "(VllmWorker rank=2 pid=4312) INFO 07-10 12:00:01 [gpu_model_runner.py:1770] Model loading took 7.1206 GiB and 4.530159 seconds",
        "Model loading took 7.1206 GiB and 4.530159 seconds",
        LineMeta(rank=2, ts="07-10 12:00:01"),
    ),
    (
        "vllm 0.10.1 VllmWorker PP0_TP1",
        "(VllmWorker PP0_TP1 pid=7) INFO 08-01 12:00:01 [gpu_worker.py:276] Available KV cache memory: 53.27 GiB",
        "Available KV cache memory: 53.27 GiB",
        LineMeta(rank=1, ts="08-01 12:00:01"),
    ),
    (
        "vllm Worker_DP1_TP0_EP0",
        "(Worker_DP1_TP0_EP0 pid=8) INFO 02-01 09:15:21 [gpu_worker.py:359] Available KV cache memory: 53.3 GiB",
        "Available KV cache memory: 53.3 GiB",
        LineMeta(instance="1", rank=0, ts="02-01 09:15:21"),
    ),
    (
        "vllm V0 VllmWorkerProcess",
        "(VllmWorkerProcess pid=6496) ERROR 07-24 14:07:40 multiproc_worker_utils.py:226] ValueError: x",
        "ValueError: x",
        LineMeta(ts="07-24 14:07:40"),
    ),
    (
        "vllm empty continuation line",
        "(VllmWorkerProcess pid=6496) ERROR 07-24 14:07:40 multiproc_worker_utils.py:226]",
        "",
        LineMeta(ts="07-24 14:07:40"),
    ),
    (
        "vllm APIServer",
        "(APIServer pid=4801) INFO 10-03 09:20:10 [loggers.py:127] Engine 000: Avg prompt throughput: 1.0 tokens/s",
        "Engine 000: Avg prompt throughput: 1.0 tokens/s",
        LineMeta(ts="10-03 09:20:10"),
    ),
    (
        "docker --timestamps",
        f"2026-05-12T08:01:39.331095044Z (APIServer pid=1) INFO 05-12 08:01:39 [loggers.py:271] {MSG}",
        MSG,
        LineMeta(ts="05-12 08:01:39"),
    ),
    (
        "docker timestamp only",
        f"2026-05-12T08:01:39.331095044Z {MSG}",
        MSG,
        LineMeta(ts="2026-05-12T08:01:39.331095044Z"),
    ),
    (
        "kubernetes offset timestamp",
        f"2026-05-12T08:01:39.331+02:00 {MSG}",
        MSG,
        LineMeta(ts="2026-05-12T08:01:39.331+02:00"),
    ),
    (
        "CRI containerd",
        f"2026-05-12T08:01:39.331095044Z stdout F (EngineCore_DP1 pid=7) INFO 05-12 08:01:39 [kv_cache_utils.py:1087] {MSG}",
        MSG,
        LineMeta(instance="1", ts="05-12 08:01:39"),
    ),
    (
        "kubectl --prefix",
        f"[pod/vllm-0/vllm] INFO 08-12 10:00:00 [kv_cache_utils.py:716] {MSG}",
        MSG,
        LineMeta(ts="08-12 10:00:00"),
    ),
    (
        "syslog",
        f"Nov 30 10:00:00 gpu-node-1 vllm[1234]: INFO 11-30 10:00:00 [kv_cache_utils.py:716] {MSG}",
        MSG,
        LineMeta(ts="11-30 10:00:00"),
    ),
    (
        "ray worker pid ip",
        f"(pid=1234, ip=10.0.0.1) INFO 06-05 10:00:00 gpu_executor.py:83] {MSG}",
        MSG,
        LineMeta(ts="06-05 10:00:00"),
    ),
    (
        "ray repeated",
        f"(RayWorkerWrapper pid=1234, ip=10.0.0.1) INFO 06-05 10:00:00 worker.py:83] {MSG} [repeated 7x across cluster]",
        MSG,
        LineMeta(ts="06-05 10:00:00", repeated=7),
    ),
    (
        "ray repeated with explanation",
        f"(pid=1) {MSG} [repeated 3x across cluster] (Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable.)",
        MSG,
        LineMeta(repeated=3),
    ),
    (
        "engine core forwarding a ray worker",
        f"(EngineCore_DP2 pid=1) (RayWorkerWrapper pid=2, ip=10.0.0.2) INFO 06-05 10:00:00 [gpu_worker.py:83] {MSG}",
        MSG,
        LineMeta(instance="2", ts="06-05 10:00:00"),
    ),
    (
        "torch rank0",
        "[rank0]: ValueError: The model's max seq len (131072) is larger",
        "ValueError: The model's max seq len (131072) is larger",
        LineMeta(rank=0),
    ),
    (
        "vllm partial prefix left by a user",
        "[kv_cache_utils.py:868] Maximum concurrency for 100,000 tokens per request: 2.31x",
        "Maximum concurrency for 100,000 tokens per request: 2.31x",
        LineMeta(),
    ),
    (
        "lighteval moves file:line to the end",
        "[2025-03-27 14:19:15,991] [    INFO]: Maximum concurrency for 32768 tokens per request: 66.08x (executor_base.py:115)",
        "Maximum concurrency for 32768 tokens per request: 66.08x",
        LineMeta(ts="2025-03-27 14:19:15,991"),
    ),
    (
        "location suffix only",
        "Sequence group 224 is preempted ... total_num_cumulative_preemption=51 (scheduler.py:1558)",
        "Sequence group 224 is preempted ... total_num_cumulative_preemption=51",
        LineMeta(),
    ),
    (
        "python logging default format",
        f"2025-03-27 14:19:15,991 - vllm.worker - INFO - {MSG}",
        MSG,
        LineMeta(ts="2025-03-27 14:19:15,991"),
    ),
    ("logging.basicConfig", f"INFO:vllm.engine.llm_engine:{MSG}", MSG, LineMeta()),
    (
        "sglang TP0",
        "[2025-03-14 02:16:14 TP0] Decode batch. #running-req: 509",
        "Decode batch. #running-req: 509",
        LineMeta(rank=0, ts="2025-03-14 02:16:14"),
    ),
    (
        "sglang DP0 TP0",
        "[2025-10-07 22:29:11 DP3 TP5] KV Cache is allocated. #tokens: 1462784, KV size: 54.52 GB",
        "KV Cache is allocated. #tokens: 1462784, KV size: 54.52 GB",
        LineMeta(instance="3", rank=5, ts="2025-10-07 22:29:11"),
    ),
    (
        "sglang TP0 EP0",
        "[2026-07-21 15:00:13 TP1 EP1] Decode batch, #running-req: 24",
        "Decode batch, #running-req: 24",
        LineMeta(rank=1, ts="2026-07-21 15:00:13"),
    ),
    (
        "sglang ATTN_CP0 TP0 with millis",
        "[2026-01-01 10:00:00.123 DP1 PP0 ATTN_CP0 MOE_DP1 TP2 EP2] Prefill batch, #new-seq: 1",
        "Prefill batch, #new-seq: 1",
        LineMeta(instance="1", rank=2, ts="2026-01-01 10:00:00.123"),
    ),
    (
        "sglang 0.2 time only",
        "[16:43:29 TP0] Prefill batch. #new-seq: 1",
        "Prefill batch. #new-seq: 1",
        LineMeta(rank=0, ts="16:43:29"),
    ),
    (
        "sglang main process",
        "[2025-01-01 10:00:00] server_args=ServerArgs(model_path='x')",
        "server_args=ServerArgs(model_path='x')",
        LineMeta(ts="2025-01-01 10:00:00"),
    ),
    (
        "sglang under ray",
        "(SchedulerActor pid=123, ip=10.0.0.1) [2025-01-01 10:00:00 DP1 TP0] Decode batch, #running-req: 3",
        "Decode batch, #running-req: 3",
        LineMeta(instance="1", rank=0, ts="2025-01-01 10:00:00"),
    ),
    (
        "time-only stamp",
        f"10:00:00.123 {MSG}",
        MSG,
        LineMeta(ts="10:00:00.123"),
    ),
]


@pytest.mark.parametrize(("raw", "body", "meta"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_strip_prefixes(raw: str, body: str, meta: LineMeta) -> None:
    assert strip_prefixes(raw) == (body, meta)


def test_json_message_field_with_process_name() -> None:
    record = {
        "asctime": "2026-01-01 10:00:00,000",
        "levelname": "INFO",
        "name": "vllm.v1.core.kv_cache_utils",
        "processName": "EngineCore_DP2",
        "process": 5012,
        "message": MSG,
    }
    assert strip_prefixes(json.dumps(record)) == (MSG, LineMeta(instance="2", ts="2026-01-01 10:00:00,000"))


def test_docker_json_file_log_field_is_peeled_again() -> None:
    inner = f"(EngineCore_DP1 pid=7) INFO 05-12 08:01:39 [kv_cache_utils.py:1087] {MSG}\n"
    record = {"log": inner, "stream": "stdout", "time": "2026-05-12T08:01:39.331095044Z"}
    assert strip_prefixes(json.dumps(record)) == (MSG, LineMeta(instance="1", ts="05-12 08:01:39"))


@pytest.mark.parametrize("raw", ['{"message": 3}', "{not json", '["message"]', "{}"])
def test_json_without_message_is_left_alone(raw: str) -> None:
    body, meta = strip_prefixes(raw)
    assert body == raw
    assert meta == LineMeta()


def test_uvicorn_access_line_keeps_its_text() -> None:
    raw = 'INFO:     127.0.0.1:37664 - "POST /v1/completions HTTP/1.1" 200 OK'
    assert strip_prefixes(raw)[0] == raw


def test_embedded_prefix_after_junk() -> None:
    body, meta = strip_prefixes(
        "@c:\\Users\\me\\log.txt [2026-08-23 09:05:37 TP0 EP0] Decode batch, #running-req: 1"
    )
    assert body.startswith("@c:")
    second = strip_embedded(body, meta)
    assert second == ("Decode batch, #running-req: 1", LineMeta(rank=0, ts="2026-08-23 09:05:37"))
    bug = strip_embedded("[Bug] [2026-06-28 15:16:45] max_total_num_tokens=2086558", LineMeta())
    assert bug == ("max_total_num_tokens=2086558", LineMeta(ts="2026-06-28 15:16:45"))
    assert strip_embedded("no prefix in here", LineMeta()) is None
