"""Failed starts predicted as the engine fails them (issue 20): each test derives its figures from the
engine's own check, read in the release's source (cited per test), and checks kvwatch's verdict."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Literal, cast

import pytest

from bench import accuracy_cases, accuracy_loso
from bench import accuracy_sglang as acc_sglang
from bench.accuracy_cases import _card
from kvwatch.analysis.predict import engine_of, predict
from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.envelope import card_family
from kvwatch.capacity.geometry import load_model
from kvwatch.commands.predict import render
from kvwatch.core.errors import ConfigError
from kvwatch.core.units import GiB
from kvwatch.engines.sglang import request_table as sglang_request_table
from kvwatch.engines.vllm import memory

CONFIGS = Path(__file__).parent / "model_configs"
PUBLIC_CONFIGS = Path(__file__).parent / "apriori" / "public" / "configs"
# Qwen2.5-32B (QwQ-32B's architecture): 64 layers, 8 KV heads of 128 -> 32 layers a PP-2 stage, a
# 16-token block of one stage = 16 x 32 x 2 x 8 x 128 x 2 B = 2 MiB.
QWEN25_32B = PUBLIC_CONFIGS / "Qwen--Qwen2.5-32B.json"
STAGE_BLOCK = 16 * 32 * 2 * 8 * 128 * 2
# vllm#14452 (0.8.5, 2 x RTX 5090, PP 2): the smaller stage leaves 14.26 GiB, 7299 blocks.
BLOCKS = 7299


@pytest.mark.parametrize(
    ("version", "pp", "v0"),
    [("0.7.3", 1, True), ("0.8.5", 1, False), ("0.8.5", 2, True), ("0.9.0", 2, True), ("0.9.1", 2, False)],
)
def test_pipeline_parallel_falls_back_to_v0_until_0_9_1(version: str, pp: int, v0: bool) -> None:
    """0.8.5 engine/arg_utils.py:1476-1482 and 0.9.0 :1378-1384 fall back to V0 for PP without a
    named executor backend; 0.9.1 :1434-1440 accepts the default one."""
    assert memory.runs_v0(Deployment(engine="vllm", engine_version=version, pp=pp)) is v0


@pytest.mark.parametrize(
    ("version", "v0"), [("0.7.3", True), ("0.8.4", True), ("0.9.2", True), ("0.10.2", True), ("0.8.4", False)]
)
def test_vllm_use_v1_0_selects_v0_while_the_release_ships_it(version: str, v0: bool) -> None:
    """VLLM_USE_V1=0 (--v0-engine): 0.8.4 engine/arg_utils.py:1160-1162 disables V1 for an explicit
    0 (0.10.2 :1125-1127); unset, 0.8+ runs V1 at PP 1. GPUStack at 6de0e9c set it for every vLLM
    it launched (gpustack/worker/backends/base.py:185-196; gpustack#1800)."""
    d = Deployment(engine="vllm", engine_version=version, v0_engine=v0)
    assert memory.runs_v0(d) is (v0 or version == "0.7.3")
    # V0's scheduler default (no chunked prefill up to 32K): max(max_model_len, 2048) tokens.
    assert memory.batch_limits(d, 8192)[1] == (8192 if memory.runs_v0(d) else 2048)


@pytest.mark.parametrize("version", ["0.11.0", "0.19.0", None])
def test_vllm_use_v1_0_is_bad_input_once_v0_is_gone(version: str | None) -> None:
    """0.11.0's wheel ships no vllm/worker/model_runner.py: there is no V0 engine to select."""
    with pytest.raises(ConfigError, match="has no V0 engine"):
        memory.runs_v0(Deployment(engine="vllm", engine_version=version, v0_engine=True))


@pytest.mark.parametrize(
    ("version", "max_model_len", "fails"),
    [
        # 0.8.5 worker.py:563: max_seq_len = 16 x (7299 // 2) = 58,384 < 60,000 (the log's own figure).
        ("0.8.5", 60000, True),
        ("0.8.5", 50000, False),  # the same user's run at 50,000 started
        # 0.7.3 worker.py:542 counts every block: 16 x 7299 = 116,784 >= 60,000.
        ("0.7.3", 60000, False),
        # 0.10.0 runs V1: one request of 60,000 tokens needs 60,000 x 32 x 4 KiB = 7.32 GiB per stage.
        ("0.10.0", 60000, False),
    ],
)
def test_v0_divides_the_blocks_among_pipeline_virtual_engines(
    version: str, max_model_len: int, fails: bool
) -> None:
    m = load_model(QWEN25_32B)
    d = Deployment(
        engine="vllm",
        engine_version=version,
        pp=2,
        max_model_len=max_model_len,
        available_kv_bytes=BLOCKS * STAGE_BLOCK,
    )
    p = predict(m, d)
    assert p.kv_pool_blocks == BLOCKS
    assert p.fits is not fails
    assert any("falls back to V0 for PP 2" in a for a in p.assumptions) is (version == "0.8.5")
    if fails:
        assert p.failure is not None
        assert "larger than the maximum number of tokens that can be stored in KV cache (58384)" in p.failure
        assert p.estimated_max_model_len == 58384
    else:
        assert p.failure is None


@pytest.mark.parametrize(("version", "chunk"), [("0.6.4.post1", 512), ("0.6.5", 2048), ("0.8.5", 2048)])
def test_v0_long_context_profiles_its_releases_chunk(version: str, chunk: int) -> None:
    """Beyond 32K tokens V0 turns chunked prefill on (0.6.4 engine/arg_utils.py:995-1020, 0.8.5
    :1504-1533), so the scheduler's default is its chunk, not max_model_len: 512 tokens up to
    0.6.4.post1 (config.py:1103-1114; MapCoder's 0.6.4.post1 Llama-3.1-8B at 131K logs
    max_num_batched_tokens=512), 2048 from 0.6.5 (config.py:1344; 0.8.5 config.py:68)."""
    d = Deployment(engine="vllm", engine_version=version, pp=2, max_model_len=60000)
    assert memory.batch_limits(d, 60000) == (256, chunk)
    assert memory.batch_limits(d.with_(max_model_len=20000), 20000) == (256, 20000)


def test_float32_dtype_keeps_a_4_byte_kv_cache() -> None:
    """--kv-cache-dtype auto follows the model dtype (0.21.0 utils/torch_utils.py:396-401
    kv_cache_dtype_str_to_dtype; V0 0.8.5 worker/cache_engine.py:50-51), so --dtype float32 stores
    4-byte K and V. llm-d-planner's 0.19.0 Llama-3.1-8B run at --dtype float32 on an H100 logged
    'Available KV cache memory: 42.8 GiB' and 'GPU KV cache size: 175,296 tokens' (10,956 blocks of
    16 x 32 layers x 2 x 8 x 128 x 4 B)."""
    m = load_model(CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json")
    d = Deployment(
        engine="vllm", engine_version="0.19.0", max_model_len=8192, available_kv_bytes=int(42.8 * GiB)
    )
    p = predict(m, d.with_(dtype="float32"))
    assert p.bytes_per_token == 32 * 2 * 8 * 128 * 4
    assert (p.kv_pool_blocks, p.kv_pool_tokens) == (10956, 175_296)
    # --dtype half on the same checkpoint, and no --dtype at all, keep 2 bytes.
    assert predict(m, d.with_(dtype="half")).kv_pool_tokens == predict(m, d).kv_pool_tokens == 350_608
    # A quantised cache ignores --dtype.
    assert predict(m, d.with_(dtype="float32", kv_cache_dtype="fp8")).bytes_per_token == 32 * 2 * 8 * 128


# GLM-4.7-FP8 (vllm#32105): 92 layers, 8 KV heads of 128, a bf16 cache: 92 x 2 x 8 x 128 x 2 B a token.
GLM47 = PUBLIC_CONFIGS / "zai-org--GLM-4.7-FP8.json"
GLM47_TOKEN = 92 * 2 * 8 * 128 * 2


@pytest.mark.parametrize(
    ("version", "fails"),
    [("0.14.0", True), ("0.15.1", True), ("0.16.0", True), ("0.17.0", False), (None, False)],
)
def test_0_14_to_0_16_check_against_every_stage(version: str | None, fails: bool) -> None:
    """0.16.0 v1/core/kv_cache_utils.py:1514-1527 checks max_model_len against the groups of every
    stage's layers merged, against min(available); 0.18.0 :1570-1579 checks each worker's own.
    vllm#32105 (a 0.14-0.16 nightly, PP 8, 202,752 tokens) printed '71.16 GiB KV cache is needed'
    against 28.57 GiB: 202,752 tokens x the 92 layers; one stage's 11-12 layers need 9.3 GiB."""
    m = load_model(GLM47)
    d = Deployment(
        engine="vllm",
        engine_version=version,
        pp=8,
        max_model_len=202752,
        available_kv_bytes=int(28.57 * GiB),
    )
    p = predict(m, d)
    assert p.fits is not fails
    if fails:
        assert p.needed_kv_bytes == 202752 * GLM47_TOKEN
        assert p.failure is not None and "71.16 GiB KV cache is needed" in p.failure
        assert "all 8 pipeline stages at once" in p.failure
        # The log's estimate is 81,392: 5,087 blocks of 16 tokens in the printed 28.57 GiB.
        assert p.estimated_max_model_len is not None and abs(p.estimated_max_model_len - 81392) <= 16
    else:
        assert p.failure is None
        assert p.needed_kv_bytes is not None and p.needed_kv_bytes < 10 * GiB


@pytest.mark.parametrize(
    ("text", "name", "total_gib"),
    [
        # CUDA's total on a DGX Spark (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47).
        ("DGX Spark GB10 (121.6 GiB unified) x1", "GB10-128GB", 121.69),
        # nvidia-smi's 275,040 MiB less the 480 MiB no log has measured.
        ("B300 x8", "B300-288GB", (275040 - 480) / 1024),
        # 288 GiB as AMD counts it, less the same 480 MiB.
        ("AMD Instinct MI355X x8", "MI355X-288GB", 288 - 480 / 1024),
        # rocminfo's GPU pool of 16,695,296 KB.
        ("AMD Radeon RX 9070 XT (16GB, gfx1201) x1", "RX-9070-XT-16GB", 16695296 / 1024**2),
        # vLLM 0.10.2's 'Free memory on device (14.66/15.99 GiB)' (mrpid12org/imageworks nohup.out).
        ("RTX 4080 (16GB) x1", "RTX-4080-16GB", 15.99),
    ],
)
def test_cards_of_the_public_cases_are_catalogued(text: str, name: str, total_gib: float) -> None:
    got, total, why = _card(text, None)
    assert (got, why) == (name, None)
    assert total is not None and abs(total / GiB - total_gib) < 0.005
    assert card_family(got) == name.rsplit("-", 1)[0].upper()


LLAMA31_8B = CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json"


def _rtx4090(engine: Literal["vllm", "sglang"], version: str, max_model_len: int) -> Deployment:
    """Llama-3.1-8B's deployment on one RTX 4090 (23.55 GiB as torch sees it); vLLM at 0.9."""
    return Deployment(
        engine=engine,
        engine_version=version,
        gpu_name="RTX-4090-24GB",
        gpu_memory_bytes=int(23.55 * GiB),
        max_model_len=max_model_len,
        gpu_memory_utilization=0.9 if engine == "vllm" else None,
    )


@pytest.mark.parametrize(
    ("version", "counted"),
    [
        ("0.3.0", True),
        ("0.3.1", False),
        ("0.6.3.post1", False),
        ("0.6.4", True),
        ("0.6.4.post1", True),
        ("0.6.5", False),
        ("0.8.5", True),
        ("0.9.0", True),
        ("0.9.1", False),
        ("0.10.2", False),
    ],
)
def test_memory_other_processes_hold_counts_as_non_torch_where_the_release_counts_it(
    version: str, counted: bool
) -> None:
    """V0 0.6.4.x takes non-torch = total - free - torch (0.6.4.post1 worker/worker.py:207-213), so
    memory other processes hold at launch comes off the KV budget; 0.6.3.post1 (:231, peak = init
    free - free) and 0.6.5 (:198-200, a baseline snapshot) leave it out. V1 did the same up to 0.9.0
    (0.8.5 v1/worker/gpu_worker.py:195-210) and from 0.9.1 subtracts a snapshot (gpu_worker.py:135-148)."""
    m = load_model(LLAMA31_8B)
    d = _rtx4090("vllm", version, 4096)
    alone, shared = predict(m, d), predict(m, d.with_(memory_in_use_bytes=GiB))
    assert alone.non_torch_bytes is not None and shared.non_torch_bytes is not None
    assert shared.non_torch_bytes - alone.non_torch_bytes == (GiB if counted else 0)
    assert alone.available_kv_bytes - shared.available_kv_bytes == (GiB if counted else 0)
    assert shared.failure is None


def test_v1_refuses_to_start_below_utilisation_of_free_memory() -> None:
    """From 0.9.1 V1 checks free >= utilisation x total at start (0.10.2 v1/worker/gpu_worker.py:
    175-188). mrpid12org/imageworks' 0.10.2 RTX 4080 log: 'Free memory on device (13.58/15.99 GiB) on
    startup is less than desired GPU memory utilization (0.85, 13.59 GiB)': 2.41 GiB in use; its next
    start, with 14.66 GiB free, started ('Model loading took 4.2530 GiB': the AWQ weights)."""
    m = load_model(PUBLIC_CONFIGS / "llava-hf--llava-1.5-7b-hf.json")
    d = Deployment(
        engine="vllm",
        engine_version="0.10.2",
        gpu_name="RTX-4080-16GB",
        gpu_memory_bytes=int(15.99 * GiB),
        max_model_len=4096,
        gpu_memory_utilization=0.85,
        weights_bytes=int(4.253 * GiB),
    )
    failed = predict(m, d.with_(memory_in_use_bytes=int(2.41 * GiB)))
    assert failed.fits is False and failed.failure is not None
    assert failed.failure.startswith(
        "Free memory on device (13.58/15.99 GiB) on startup is less than desired GPU memory utilization "
        "(0.85, 13.59 GiB)."
    )
    started = predict(m, d.with_(memory_in_use_bytes=int((15.99 - 14.66) * GiB)))
    assert started.failure is None and started.fits
    # 0.9.0 has no such check: the same memory comes off its budget instead.
    assert predict(m, d.with_(engine_version="0.9.0", memory_in_use_bytes=int(2.41 * GiB))).failure is None


def test_a_baseline_release_runs_out_of_memory_allocating_the_cache() -> None:
    """V0 0.6.5 subtracts memory in use at launch as baseline (worker/worker.py:198-200) and sizes the
    cache for utilisation x total less its own usage; allocating it needs that much free."""
    m = load_model(LLAMA31_8B)
    d = _rtx4090("vllm", "0.6.5", 4096)
    assert predict(m, d.with_(memory_in_use_bytes=GiB)).failure is None
    p = predict(m, d.with_(memory_in_use_bytes=8 * GiB))
    assert p.fits is False and p.failure is not None and p.failure.startswith("CUDA out of memory")


def test_sglang_request_table_beyond_the_reserve_is_scouts_failed_start() -> None:
    """sgl-project/sglang#5755 (Llama-4-Scout, TP 8, 79.10 GiB cards, ~0.4.5, no --context-length):
    'Tried to allocate 80.04 GiB'. 0.4.5 sizes its req_to_token table after the profile at
    (clamp(tokens / context_len x 512, 2048, 4096) + 1) x (context_len + 4) int32
    (model_executor/model_runner.py:699-708, :758-760; mem_cache/memory_pool.py:64-66): 2,049 x
    10,485,764 x 4 B at Scout's default context, which no 80 GB card holds beside its KV pool."""
    raw = next(
        c
        for c in json.loads(acc_sglang.CASES.read_text(encoding="utf-8"))
        if c["id"] == "sgl-5755-llama4-scout-tp8-cuda-oom-kv-alloc"
    )
    case = next(c for c in acc_sglang.load_cases()[0] if c.id == raw["id"])
    p = acc_sglang.predict_case(case)
    table = sglang_request_table.request_table(
        Deployment(engine="sglang", engine_version=case.engine_version), p.kv_pool_tokens, p.max_model_len
    )
    assert round(table.bytes / GiB, 2) == raw["observed"]["oom_tried_to_allocate_gib"]
    assert p.failure is not None
    assert (
        "req_to_token" in p.failure and f"{raw['observed']['oom_tried_to_allocate_gib']:.2f} GiB" in p.failure
    )


def _imageworks_failed_record() -> dict[str, object]:
    cases = json.loads((Path(__file__).parent / "apriori" / "public" / "vllm" / "cases.json").read_text())
    rows = cases if isinstance(cases, list) else cases["cases"]
    return next(
        c for c in rows if c["id"] == "imageworks-llava-1.5-7b-awq-rtx4080-v0.10.2-util0.85-failed-freemem"
    )


def test_the_bench_passes_a_stated_memory_in_use_as_predict_does() -> None:
    """A case's ``gpu_memory_in_use_gib`` reaches the Deployment as ``--gpu-memory-in-use`` would,
    but only with the quote it came from: the recorded imageworks case states none (its 13.58 GiB
    free is the engine's own line, the outcome), so the bench predicts it with nothing in use."""
    record = _imageworks_failed_record()
    recorded = accuracy_cases._from_record(record, "mrpid12org/imageworks")
    assert accuracy_cases.deployment(recorded).memory_in_use_bytes is None
    stated = copy.deepcopy(record)
    settings = cast(dict[str, object], stated["settings"])
    settings["gpu_memory_in_use_gib"] = 2.41
    assert accuracy_cases.deployment(accuracy_cases._from_record(stated, "t")).memory_in_use_bytes is None
    settings["gpu_memory_in_use_source"] = "a user's nvidia-smi before launch (test record)"
    case = accuracy_cases._from_record(stated, "t")
    d = accuracy_cases.deployment(case)
    assert d.memory_in_use_bytes == int(2.41 * GiB)
    p = predict(case.geometry(), d)
    assert p.fits is False and p.failure is not None
    assert p.failure.startswith("Free memory on device (13.58/15.99 GiB) on startup is less than desired")


@pytest.mark.parametrize(
    ("version", "mode"),
    [
        ("0.10.2", "checked"),
        ("0.8.5", "counted"),
        ("0.6.4", "counted"),
        ("0.6.5", "baseline"),
        ("0.6.3", "baseline"),
    ],
)
def test_the_printed_other_processes_limit_is_where_the_start_starts_failing(version: str, mode: str) -> None:
    """``predict`` says how much memory other processes may hold before the start fails (a desktop on a
    consumer card, another server): a little less than that limit starts, a little more fails, by the
    release's own rule (checked at start, counted as non-torch, or an OOM allocating the cache)."""
    m = load_model(LLAMA31_8B)
    d = _rtx4090("vllm", version, 8192)
    assert memory.others_memory(d) == mode
    alone = predict(m, d)
    limit = alone.others_limit_bytes
    assert limit is not None and limit > 0 and alone.others_limit_note
    assert alone.to_json_dict()["other_processes_limit_bytes"] == limit
    step = 64 * 2**20
    assert predict(m, d.with_(memory_in_use_bytes=limit - step)).failure is None
    assert predict(m, d.with_(memory_in_use_bytes=limit + step)).failure is not None
    # Given memory in use already, the limit is still the total others may hold, not what is left.
    held = predict(m, d.with_(memory_in_use_bytes=GiB))
    assert held.others_limit_bytes is not None and abs(held.others_limit_bytes - limit) <= step


def test_no_other_processes_limit_where_the_start_fails_anyway() -> None:
    m = load_model(LLAMA31_8B)
    d = _rtx4090("vllm", "0.10.2", 131072)
    p = predict(m, d)
    assert p.failure is not None and p.others_limit_bytes is None


def test_a_failure_the_source_calls_intermittent_is_listed_not_counted() -> None:
    """The same deployment that starts on some runs: its outcome is not a function of kvwatch's
    inputs, so it is not a failed start to call (its pool, where printed, is still judged)."""
    record: dict[str, object] = {"error": "CUDA out of memory", "scoring": {"outcome": "failed_after_pool"}}
    assert accuracy_cases._failure_not_sizing(record) is None
    record["scoring"] = {"outcome": "failed_after_pool", "intermittent": "fails intermittently"}
    reason = accuracy_cases._failure_not_sizing(record)
    assert reason is not None and "intermittent" in reason
    cases = {c.id: c for c in accuracy_cases.load_cases()}
    pr = cases["sgl-pr39713-qwen3-0.6b-h100-mfs083-prefill-graph-oom"]
    assert pr.other_failure is not None and not pr.started


@pytest.mark.parametrize("version", ["0.4.7", "0.5.9", "0.5.23"])
def test_sglang_sizes_from_the_free_memory_it_measures(version: str) -> None:
    """SGLang's pool is mem_fraction_static of the free memory before weights, less the weights
    (get_available_gpu_memory; 0.5.23 distributed/bootstrap.py:207): what other processes hold comes
    off that free memory, so the pool shrinks by mfs of it, and the printed limit is where the start
    stops starting by SGLang's own failures."""
    m = load_model(LLAMA31_8B)
    d = _rtx4090("sglang", version, 8192)
    alone, shared = predict(m, d), predict(m, d.with_(memory_in_use_bytes=GiB))
    mfs = alone.mem_fraction_static
    assert mfs is not None and shared.mem_fraction_static == mfs
    assert abs((alone.available_kv_bytes - shared.available_kv_bytes) - mfs * GiB) <= 1
    assert any("other processes" in a for a in shared.assumptions)
    limit = alone.others_limit_bytes
    assert limit is not None and alone.others_limit_note and "SGLang" in alone.others_limit_note
    step = 64 * 2**20
    assert predict(m, d.with_(memory_in_use_bytes=limit - step)).failure is None
    assert predict(m, d.with_(memory_in_use_bytes=limit + step)).failure is not None


def test_the_bench_judges_v0_errors_figure_against_v0_checks_own() -> None:
    """vllm#14452's 60k start printed 58384 tokens (3649 blocks x 16, one of two PP virtual engines'
    share of 7299): the bench compares it with the same share of kvwatch's pool, not the whole pool."""
    cases = {c.id: c for c in accuracy_cases.load_cases()}
    case = cases["gh14452-qwq-32b-unsloth-bnb-4bit-2xrtx5090-pp2-v0.8.5dev-60k-failed"]
    assert case.kv_tokens_from_v0_error and case.observed["kv_tokens"] == 58384
    row = accuracy_loso.evaluate(case, accuracy_loso.Models())
    assert row.prediction is not None and row.prediction.kv_pool_blocks is not None
    assert row.predicted["kv_tokens"] == 16 * (row.prediction.kv_pool_blocks // 2)
    started = cases["gh10517-llama31-8b-rtx3090-v0.6.4-20k"]
    assert not started.kv_tokens_from_v0_error


def test_a_fit_the_band_does_not_promise_is_said() -> None:
    """gpustack#1800 (vLLM 0.8.4 V0, Qwen2.5-VL-7B on an RTX 3090 at GPUStack's 8192 tokens) failed
    with 2400 tokens of KV; kvwatch's modelled figure fits one request, its band's low end does not:
    predict says so instead of a bare yes. A comfortable fit says nothing more."""
    m = load_model(PUBLIC_CONFIGS / "Qwen--Qwen2.5-VL-7B-Instruct.json")
    d = Deployment(
        engine="vllm",
        engine_version="0.8.4",
        gpu_name="RTX-3090-24GB",
        gpu_memory_bytes=int(23.58 * GiB),
        max_model_len=8192,
        v0_engine=True,
        image_max_pixels=12845056,
    )
    p = predict(m, d)
    assert p.fits and p.available_kv_band_bytes is not None and p.needed_kv_bytes is not None
    assert p.fits_at_band_low is False
    assert p.available_kv_bytes - p.available_kv_band_bytes < p.needed_kv_bytes <= p.available_kv_bytes
    assert p.to_json_dict()["fits_at_band_low"] is False
    assert "not at the band's low end" in render(p, engine_of(d))
    roomy = predict(m, d.with_(gpu_name="A100-SXM-80GB", gpu_memory_bytes=int(79.15 * GiB)))
    assert roomy.fits_at_band_low is True and "low end" not in render(roomy, engine_of(d))
    failing = predict(m, d.with_(max_model_len=32768))
    assert not failing.fits and failing.fits_at_band_low is None


LLAMA33_70B = CONFIGS / "meta-llama--Llama-3.3-70B-Instruct.json"
LOAD_OOM = "CUDA out of memory loading the weights"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_weights_beyond_the_card_fail_in_the_loader_not_for_want_of_kv_memory(
    engine: Literal["vllm", "sglang"],
) -> None:
    """Llama-3.3-70B in bf16 (~131 GiB) on one 79.19 GiB H100: both engines load the weights before
    they measure any budget (vLLM 0.19 v1/worker/gpu_worker.py load_model before determine_available_memory;
    SGLang 0.5.23 model_runner.py load_model before init_memory_pool), so the start ends in torch's
    CUDA out of memory, which no utilisation or static fraction cures; two ranks load it."""
    m = load_model(LLAMA33_70B)
    h100 = gpus.find("H100")
    assert h100 is not None
    d = Deployment(
        engine=engine,
        engine_version="0.19.0" if engine == "vllm" else "0.5.23",
        gpu_name=h100.name,
        gpu_memory_bytes=h100.total_bytes,
    )
    for knob in ({"gpu_memory_utilization": 0.99} if engine == "vllm" else {"mem_fraction_static": 0.95}, {}):
        p = predict(m, d.with_(**knob))
        assert p.fits is False and p.failure is not None and p.failure.startswith(LOAD_OOM), p.failure
        assert p.weights_bytes is not None and p.weights_bytes > 79 * GiB
        assert "--tp" in p.failure and "smaller (quantised) checkpoint" in p.failure
        assert "engine would fail: " + p.failure in render(p, engine_of(d))
    sharded = predict(m, d.with_(tp=2, mem_fraction_static=0.9 if engine == "sglang" else None))
    assert sharded.failure is None or not sharded.failure.startswith(LOAD_OOM)


@pytest.mark.parametrize(("engine", "version"), [("vllm", "0.19.0"), ("vllm", "0.6.5"), ("sglang", "0.5.23")])
def test_the_load_failure_starts_where_the_weights_pass_the_free_memory(
    engine: Literal["vllm", "sglang"], version: str
) -> None:
    """Given weights just under the memory free at load (card less the non-torch memory kvwatch
    counts there and other processes' memory) the start fails for want of KV memory at most; a MiB
    past it, in the loader. The free figure is the one the failure prints."""
    m = load_model(LLAMA31_8B)
    in_use = GiB
    d = _rtx4090(engine, version, 4096).with_(memory_in_use_bytes=in_use, gpu_memory_utilization=None)
    probe = predict(m, d.with_(weights_bytes=30 * GiB))
    assert probe.failure is not None and probe.failure.startswith(LOAD_OOM)
    free_text = probe.failure.split("card, ")[1].split(" of it free")[0]
    free = float(free_text.split()[0]) * (GiB if free_text.endswith("GiB") else 2**20)
    assert d.gpu_memory_bytes is not None and free < d.gpu_memory_bytes - in_use
    under = predict(m, d.with_(weights_bytes=int(free) - 64 * 2**20))
    assert under.failure is None or not under.failure.startswith(LOAD_OOM)
    over = predict(m, d.with_(weights_bytes=int(free) + 64 * 2**20))
    assert over.failure is not None and over.failure.startswith(LOAD_OOM) and over.fits is False


def test_v1_s_free_memory_check_comes_before_the_load() -> None:
    """0.10.2 refuses to start below utilisation x total free (v1/worker/gpu_worker.py:175-188) before
    it loads anything: with too much memory in use that is the failure, whatever the weights weigh."""
    m = load_model(LLAMA33_70B)
    h100 = gpus.find("H100")
    assert h100 is not None
    d = Deployment(
        engine="vllm",
        engine_version="0.10.2",
        gpu_name=h100.name,
        gpu_memory_bytes=h100.total_bytes,
        memory_in_use_bytes=20 * GiB,
    )
    p = predict(m, d)
    assert p.failure is not None and p.failure.startswith("Free memory on device")
