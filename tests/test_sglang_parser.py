"""Unit tests of the SGLang body parser, one case per format and version.

Bodies are the reference's verbatim examples (shared/reference/sglang-formats.md, copied here) and
lines of tests/log_samples/sglang with the prefix removed by hand. Byte figures are SGLang's 'GB'
(GiB) times 2**30, rounded to the nearest byte, written out as literals.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import examples

from kvwatch.core.events import (
    EngineSettings,
    Event,
    MemoryBudget,
    PoolSized,
    Preemption,
    StartupFailure,
    UsageSample,
)
from kvwatch.engines.sglang.log import ANCHORS, parse
from kvwatch.parsers.base import LineMeta, ParseError

META = LineMeta(instance="3", rank=1, ts="2025-06-01 10:00:13")


def events(body: str, meta: LineMeta = META) -> tuple[Event, ...]:
    """Parse and check the contract every claimed line must keep."""
    out = parse(body, meta)
    if out:
        assert any(a in body for a in ANCHORS), f"claimed a line without an anchor: {body!r}"
    for e in out:
        assert e.engine == "sglang"
        assert (e.instance, e.rank, e.ts) == (meta.instance, meta.rank, meta.ts)
    return out


def usage(body: str) -> UsageSample:
    (e,) = events(body)
    assert isinstance(e, UsageSample)
    return e


def pool(body: str) -> PoolSized:
    (e,) = events(body)
    assert isinstance(e, PoolSized)
    return e


def memory(body: str) -> MemoryBudget:
    (e,) = events(body)
    assert isinstance(e, MemoryBudget)
    return e


# --- Prefill / Decode batch lines ----------------------------------------------------------------


def test_prefill_v036_to_v043_with_cache_hit_rate() -> None:
    e = usage(
        "Prefill batch. #new-seq: 1, #new-token: 612, #cached-token: 0, cache hit rate: 0.00%, "
        "token usage: 0.00, #running-req: 0, #queue-req: 0"
    )
    assert (e.kv_usage_ratio, e.running, e.waiting, e.prefix_cache_hit_ratio) == (0.0, 0, 0, 0.0)
    assert e.used_tokens is None


def test_prefill_cache_hit_rate_percent_is_a_ratio() -> None:
    # sglang/015, '[16:43:33 TP0]' removed.
    e = usage(
        "Prefill batch. #new-seq: 5, #new-token: 8192, #cached-token: 1832, cache hit rate: 11.92%, "
        "token usage: 0.77, #running-req: 21, #queue-req: 18"
    )
    assert e.prefix_cache_hit_ratio == 0.1192
    assert (e.kv_usage_ratio, e.running, e.waiting) == (0.77, 21, 18)


def test_prefill_v02_without_token_usage() -> None:
    e = usage(
        "Prefill batch. #new-seq: 1, #new-token: 512, #cached-token: 0, cache hit rate: 0.00%, "
        "#running-req: 2, #queue-req: 7"
    )
    assert (e.running, e.waiting, e.kv_usage_ratio) == (2, 7, None)


def test_prefill_mixed_head_gives_running() -> None:
    # 0.3.4 mixed chunked prefill: '#running-req' only in the head.
    e = usage(
        "Prefill batch(mixed #running-req: 3). #new-seq: 1, #new-token: 512, #cached-token: 0, "
        "cache hit rate: 0.00%, token usage: 0.12, #queue-req: 4"
    )
    assert (e.running, e.waiting, e.kv_usage_ratio) == (3, 4, 0.12)


@pytest.mark.parametrize(
    "body",
    [
        # 0.4.4-0.4.5, 0.4.10-0.5.3: trailing ', '
        "Prefill batch. #new-seq: 3, #new-token: 1836, #cached-token: 4096, token usage: 0.05, "
        "#running-req: 12, #queue-req: 0, ",
        # 0.4.6-0.4.9 non-PD: no trailing comma
        "Prefill batch. #new-seq: 3, #new-token: 1836, #cached-token: 4096, token usage: 0.05, "
        "#running-req: 12, #queue-req: 0",
        # 0.5.4: iteration number always printed
        "Prefill batch [1207], #new-seq: 3, #new-token: 1836, #cached-token: 4096, token usage: 0.05, "
        "#running-req: 12, #queue-req: 0, ",
        # iteration number glued to the word, as in the 'Prefill batch[1]'
        "Prefill batch[1], #new-seq: 3, #new-token: 1836, #cached-token: 4096, token usage: 0.05, "
        "#running-req: 12, #queue-req: 0,",
        # 0.5.5-0.5.8
        "Prefill batch, #new-seq: 3, #new-token: 1836, #cached-token: 4096, token usage: 0.05, "
        "#running-req: 12, #queue-req: 0, ",
        # 0.5.12+
        "Prefill batch, #new-seq: 3, #new-token: 1836, #cached-token: 4096, token usage: 0.05, "
        "#running-req: 12, #queue-req: 0, #pending-token: 0, cuda graph: False, "
        "input throughput (token/s): 10234.56",
        # 0.5.9: ends with the graph flag
        "Prefill batch, #new-seq: 3, #new-token: 1836, #cached-token: 4096, token usage: 0.05, "
        "#running-req: 12, #queue-req: 0, input throughput (token/s): 10234.56, cuda graph: False",
    ],
    ids=["v044-trailing", "v046-plain", "v054-iter", "iter-glued", "v055-comma", "v0512", "v059"],
)
def test_prefill_head_and_comma_variants(body: str) -> None:
    e = usage(body)
    assert (e.kv_usage_ratio, e.running, e.waiting) == (0.05, 12, 0)


def test_prefill_v0512_reads_input_throughput() -> None:
    e = usage(
        "Prefill batch, #new-seq: 3, #new-token: 1836, #cached-token: 4096, token usage: 0.05, "
        "#running-req: 12, #queue-req: 0, #pending-token: 0, cuda graph: False, "
        "input throughput (token/s): 10234.56, est. prefill TFLOPS/s (per GPU): 312.50"
    )
    assert e.prompt_throughput == 10234.56
    assert e.generation_throughput is None


def test_prefill_hybrid_swa() -> None:
    e = usage(
        "Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, full token usage: 0.12, "
        "swa token usage: 0.31, #running-req: 4, #queue-req: 2, #pending-token: 12000, cuda graph: False, "
        "input throughput (token/s): 20480.00"
    )
    assert (e.kv_usage_ratio, e.swa_usage_ratio, e.running, e.waiting) == (0.12, 0.31, 4, 2)


def test_prefill_hybrid_mamba_sample_016() -> None:
    e = usage(
        "Prefill batch, #new-seq: 16, #new-token: 9088, #cached-token: 1114624, full token usage: 0.74, "
        "mamba usage: 0.80, #running-req: 10, #queue-req: 0, #pending-token: 0, npu graph: False, "
        "input throughput (token/s): 2114.79"
    )
    assert (e.kv_usage_ratio, e.mamba_usage_ratio, e.running) == (0.74, 0.8, 10)


def test_prefill_and_decode_v049_hybrid_full_swa_values() -> None:
    e = usage(
        "Decode batch. #running-req: 40, #token: full=50210, swa=9000, token usage: full=0.21, swa=0.15, "
        "cuda graph: True, gen throughput (token/s): 2100.51, #queue-req: 0"
    )
    assert (e.used_tokens, e.swa_used_tokens) == (50210, 9000)
    assert (e.kv_usage_ratio, e.swa_usage_ratio) == (0.21, 0.15)
    assert (e.running, e.waiting) == (40, 0)


@pytest.mark.parametrize(
    "body",
    [
        # 0.2.15-0.4.1 (and 0.4.3 non-speculative)
        "Decode batch. #running-req: 12, #token: 23110, token usage: 0.05, "
        "gen throughput (token/s): 1012.34, #queue-req: 0",
        # 0.4.4-0.4.5: trailing ', '
        "Decode batch. #running-req: 12, #token: 23110, token usage: 0.05, "
        "gen throughput (token/s): 1012.34, #queue-req: 0, ",
        # 0.4.7-0.4.9
        "Decode batch. #running-req: 12, #token: 23110, token usage: 0.05, cuda graph: True, "
        "gen throughput (token/s): 1012.34, #queue-req: 0",
        # 0.4.10-0.5.3
        "Decode batch. #running-req: 12, #token: 23110, token usage: 0.05, cuda graph: True, "
        "gen throughput (token/s): 1012.34, #queue-req: 0, ",
        # 0.5.4
        "Decode batch [1240], #running-req: 12, #token: 23110, token usage: 0.05, cuda graph: True, "
        "gen throughput (token/s): 1012.34, #queue-req: 0, ",
        # 0.5.5-0.5.8
        "Decode batch, #running-req: 12, #token: 23110, token usage: 0.05, cuda graph: True, "
        "gen throughput (token/s): 1012.34, #queue-req: 0, ",
        # Dec 2025 paste with ',' and no space (sglang/013)
        "Decode batch, #running-req: 12, #token: 23110, token usage: 0.05, cuda graph: True, "
        "gen throughput (token/s): 1012.34, #queue-req: 0,",
        # 0.5.9+: no trailing comma, MFU suffix
        "Decode batch, #running-req: 12, #token: 23110, token usage: 0.05, cuda graph: True, "
        "gen throughput (token/s): 1012.34, #queue-req: 0, est. decode TFLOPS/s (per GPU): 12.34, "
        "est. read BW (GB/s per GPU): 1800.00, est. write BW (GB/s per GPU): 3.21",
    ],
    ids=["v02", "v044", "v047", "v0410", "v054", "v055", "comma-no-space", "v059-mfu"],
)
def test_decode_head_and_comma_variants(body: str) -> None:
    e = usage(body)
    assert (e.running, e.used_tokens, e.kv_usage_ratio, e.waiting) == (12, 23110, 0.05, 0)
    assert e.generation_throughput == 1012.34


def test_decode_v043_largest_len_sample_004() -> None:
    e = usage(
        "Decode batch. #running-req: 182, #token: 113993, token usage: 0.27, "
        "gen throughput (token/s): 5287.55, largest-len: 0, #queue-req: 0, "
    )
    assert (e.running, e.used_tokens, e.kv_usage_ratio, e.waiting) == (182, 113993, 0.27, 0)


def test_decode_speculative_dp_attention() -> None:
    e = usage(
        "Decode batch, #running-req: 64, #token: 81920, token usage: 0.27, accept len: 2.81, "
        "accept rate: 0.60, cuda graph: True, gen throughput (token/s): 4096.00, #queue-req: 3"
    )
    assert (e.running, e.used_tokens, e.kv_usage_ratio, e.waiting) == (64, 81920, 0.27, 3)


def test_decode_hybrid_swa_sample_011() -> None:
    e = usage(
        "Decode batch, #running-req: 1, #full token: 165376, full token usage: 0.02, #swa token: 768, "
        "swa token usage: 0.00, accept len: 5.30, accept rate: 0.86, cuda graph: True, "
        "gen throughput (token/s): 167.04, #queue-req: 0"
    )
    assert (e.used_tokens, e.kv_usage_ratio) == (165376, 0.02)
    assert (e.swa_used_tokens, e.swa_usage_ratio) == (768, 0.0)


def test_decode_hybrid_mamba_sample_016() -> None:
    e = usage(
        "Decode batch, #running-req: 40, #full token: 350592, full token usage: 0.74, mamba num: 160, "
        "mamba usage: 0.80, accept len: 3.13, accept rate: 0.71, npu graph: True, "
        "gen throughput (token/s): 155.34, #queue-req: 0"
    )
    assert (e.used_tokens, e.kv_usage_ratio) == (350592, 0.74)
    assert (e.mamba_used_slots, e.mamba_usage_ratio) == (160, 0.8)


def test_decode_pd_server_retracted_queue_is_a_gauge() -> None:
    e = usage(
        "Decode batch, #running-req: 128, #token: 300000, token usage: 0.68, pre-allocated usage: 0.10, "
        "#prealloc-req: 4, #transfer-req: 2, #retracted-req: 5, cuda graph: True, "
        "gen throughput (token/s): 5120.00, #queue-req: 0"
    )
    assert (e.retracted, e.kv_usage_ratio, e.running) == (5, 0.68, 128)


def test_decode_hisparse_cpu_tier() -> None:
    e = usage(
        "Decode batch, #running-req: 8, #token: 4096, token usage: 0.10, #gpu token: 2048, "
        "gpu token usage: 0.40, #cpu token: 9000, cpu token usage: 0.05, cuda graph: True, "
        "gen throughput (token/s): 512.00, #queue-req: 0"
    )
    assert (e.kv_usage_ratio, e.cpu_kv_usage_ratio, e.used_tokens) == (0.1, 0.05, 4096)


def test_terminal_damaged_decode_sample_003() -> None:
    # 'token usaccept rate' is two columns spliced together: usage is not recoverable.
    e = usage(
        "Decode batch, #running-req: 45, #token: 44672, token usaccept rate: 0.32, npu graph: False, "
        "gen throughput (token/s): 863.65, #queue-req"
    )
    assert (e.running, e.used_tokens) == (45, 44672)
    assert e.kv_usage_ratio is None
    assert e.waiting is None


def test_terminal_damaged_prefill_sample_003_does_not_read_glued_field() -> None:
    e = usage(
        "Prefill batch, #new-seq: 1, #new-token: 896, #cached-tounning-req: 45, #queue-req: 81, "
        "#pending-token: 70187, npu graph: False, input th"
    )
    assert e.running is None
    assert e.waiting == 81


def test_damaged_value_is_skipped_not_guessed() -> None:
    e = usage("Decode batch. #running-req: 4#queue-req: 81, #token: 512, token usage: 0.0x1")
    assert (e.running, e.waiting, e.kv_usage_ratio, e.used_tokens) == (None, None, None, 512)


def test_batch_line_without_any_readable_field_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        parse("Decode batch. #runn", META)


def test_prose_mentioning_a_batch_is_not_claimed() -> None:
    assert events("the Decode batch size is too large for this GPU") == ()
    assert events("Prefill batch tokens exceeded, #queue-req growing") == ()


# --- retraction ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "count", "ratio", "gained"),
    [
        # <=0.4.6, sglang/014
        (
            "Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.8024 -> 0.9085",
            1,
            0.9085,
            None,
        ),
        # 0.4.7-0.5.2, 0.5.5-0.5.6
        (
            "KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.3317 -> 0.5012",
            3,
            0.5012,
            None,
        ),
        # 0.5.3-0.5.4
        (
            "KV cache pool is full. Retract requests. #retracted_reqs: 3, #aborted_retracted_reqs: 0, "
            "#new_token_ratio: 0.3317 -> 0.5012",
            3,
            0.5012,
            None,
        ),
        # 0.5.7+
        (
            "KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: 12288, "
            "#new_token_ratio: 0.3317 -> 0.5012",
            3,
            0.5012,
            12288,
        ),
        # 0.5.12+, hybrid SSM
        (
            "KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_tokens_gained: 8192, "
            "#mamba_num_gained: 2, #new_token_ratio: 0.3317 -> 0.5012",
            2,
            0.5012,
            8192,
        ),
        # SGLANG_TEST_RETRACT hook (0.5.7+): no ratio
        ("Testing retraction. #retracted_reqs: 1, #new_tokens_gained: 64", 1, None, 64),
        # wording cut off by the paste
        ("Retract requests. #retracted_reqs: 4, #new_token_ratio: 0.1000 -> 0.2000", 4, 0.2, None),
    ],
    ids=["v02-v046", "v047", "v053-aborted", "v057-gained", "v0512-mamba", "testing", "cut"],
)
def test_retraction_wordings(body: str, count: int, ratio: float | None, gained: int | None) -> None:
    (e,) = events(body)
    assert isinstance(e, Preemption)
    assert e.mechanism == "retract"
    assert (e.count, e.new_token_ratio, e.new_tokens_gained, e.total) == (count, ratio, gained, None)


def test_decode_allocation_failure_is_not_a_retraction() -> None:
    assert events("Decode out of memory. Try to lower your batch size.") == ()


# --- pool sizing ---------------------------------------------------------------------------------


def test_kv_alloc_mha_sample_001() -> None:
    e = pool("KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB")
    # 2 x 8.23 x 2**30 = 2 x 8836895212
    assert (e.pool, e.tokens, e.bytes) == ("full", 367404, 17673790424)


def test_kv_alloc_mla_single_size_sample_017() -> None:
    e = pool("KV Cache is allocated. #tokens: 1462784, KV size: 54.52 GB")
    assert (e.pool, e.tokens, e.bytes) == ("full", 1462784, 58540404244)


def test_kv_alloc_v043_without_tokens() -> None:
    e = pool("KV Cache is allocated. K size: 26.99 GB, V size: 26.99 GB.")
    assert (e.tokens, e.bytes) == (None, 2 * 28980291830)


def test_kv_alloc_v0515_dtype() -> None:
    e = pool(
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 442181, K size: 26.99 GB, V size: 26.99 GB"
    )
    assert (e.tokens, e.bytes) == (442181, 2 * 28980291830)


def test_kv_alloc_v0523_sub_pools() -> None:
    full = pool(
        "Full KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1000, K size: 1.00 GB, V size: 1.00 GB"
    )
    swa = pool(
        "SWA KV Cache is allocated. dtype: torch.bfloat16, #tokens: 800, K size: 0.10 GB, V size: 0.10 GB"
    )
    assert (full.pool, full.tokens, full.bytes) == ("full", 1000, 2147483648)
    assert (swa.pool, swa.tokens, swa.bytes) == ("swa", 800, 2 * 107374182)


def test_kv_alloc_with_rank_prefix_left_on_is_the_full_pool() -> None:
    e = pool("TP0] KV Cache is allocated. #tokens: 1000, KV size: 1.00 GB")
    assert e.pool == "full"


def test_kv_alloc_index_side_cache_and_va_reservation_are_not_the_pool() -> None:
    assert (
        events(
            "MiniMax MSA-v1 index KV Cache is allocated. dtype: torch.uint8, #tokens: 10, KV size: 0.01 GB"
        )
        == ()
    )
    assert (
        events("KV Cache VA upper bound. dtype: torch.bfloat16, #tokens: 9, K size: 1.00 GB, V size: 1.00 GB")
        == ()
    )


def test_post_capture_kv_sizing_v0519() -> None:
    p, m = events(
        "Post-capture KV sizing: KV cache allocated. dtype: torch.bfloat16, #tokens: 442181, "
        "KV size: 53.98 GB, avail mem=9.50 GB"
    )
    assert isinstance(p, PoolSized) and isinstance(m, MemoryBudget)
    assert (p.pool, p.tokens, p.bytes) == ("full", 442181, 57960583660)
    assert m.avail_after_pool_bytes == 10200547328
    assert (
        events(
            "Post-capture KV sizing: draft KV cache allocated. dtype: torch.bfloat16, #tokens: 9, KV size: 1.00 GB"
        )
        == ()
    )


def test_mamba_pool() -> None:
    e = pool(
        "Mamba Cache is allocated. max_mamba_cache_size: 656, conv_state size: 0.53GB, ssm_state size: 37.64GB "
    )
    assert (e.pool, e.state_slots, e.bytes) == ("mamba", 656, 569083167 + 40415642255)
    spec = pool(
        "Mamba Cache is allocated. max_mamba_cache_size: 10, conv_state size: 1.00GB, ssm_state size: 1.00GB "
        "intermediate_ssm_state_cache size: 2.00GB intermediate_conv_window_cache size: 1.00GB "
    )
    assert spec.bytes == 5 * 1073741824


@pytest.mark.parametrize(
    ("body", "settings"),
    [
        # 0.2.15-0.4.1
        (
            "max_total_num_tokens=442181, max_prefill_tokens=16384, max_running_requests=4097, context_len=131072",
            {"max_num_seqs": 4097, "max_model_len": 131072},
        ),
        # 0.4.3-0.4.6
        (
            "max_total_num_tokens=442181, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            "max_running_requests=4097, context_len=131072",
            {"max_num_seqs": 4097, "max_model_len": 131072, "chunked_prefill_size": 8192},
        ),
        # chunked prefill disabled
        (
            "max_total_num_tokens=442181, chunked_prefill_size=-1, max_prefill_tokens=16384, "
            "max_running_requests=4097, context_len=131072",
            {"max_num_seqs": 4097, "max_model_len": 131072, "chunked_prefill_size": -1},
        ),
    ],
    ids=["v02", "v043", "chunked-off"],
)
def test_max_total_num_tokens_older(body: str, settings: dict[str, int]) -> None:
    p, s = events(body)
    assert isinstance(p, PoolSized) and isinstance(s, EngineSettings)
    assert (p.pool, p.tokens) == ("full", 442181)
    assert not s.starts_engine
    assert {k: getattr(s, k) for k in settings} == settings


def test_max_total_num_tokens_v047_sample_008() -> None:
    p, s, m = events(
        "max_total_num_tokens=2086558, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        "max_running_requests=33, context_len=256000, available_gpu_mem=17.22 GB  means KV Cache Available total is 2M?"
    )
    assert isinstance(p, PoolSized) and isinstance(s, EngineSettings) and isinstance(m, MemoryBudget)
    assert p.tokens == 2086558
    assert (s.chunked_prefill_size, s.max_num_seqs, s.max_model_len) == (8192, 33, 256000)
    assert m.avail_after_startup_bytes == 18489834209


def test_max_total_num_tokens_cpu_device() -> None:
    *_, m = events(
        "max_total_num_tokens=1000, chunked_prefill_size=None, max_prefill_tokens=16384, "
        "max_running_requests=500, context_len=4096, available_cpu_mem=4.00 GB"
    )
    assert isinstance(m, MemoryBudget)
    assert m.avail_after_startup_bytes == 4294967296


def test_max_total_num_token_v01_singular_sample_021() -> None:
    e = pool(" UserWarning: Warning: available_size=35244, max_total_num_token=42308")
    assert (e.pool, e.tokens) == ("full", 42308)


def test_mem_leak_check_names_the_pool() -> None:
    e = pool("Mem Leak Detected! total_tokens=442100 vs self.max_total_num_tokens=442181")
    assert e.tokens == 442181


def test_other_max_total_phrases_are_not_the_pool() -> None:
    assert (
        events(
            "max_total_tokens=500000 is larger than the profiled value 442181. Use the profiled value instead."
        )
        == ()
    )
    (swa,) = events(
        "SWA ring: swa_max_total_num_tokens 910768 -> 65536 (fixed per-request SWA ring capacity)."
    )
    assert isinstance(swa, PoolSized)
    assert (swa.pool, swa.tokens) == ("swa", 65536)


@pytest.mark.parametrize(
    "body",
    [
        "Use Sliding window memory pool. full_layer_tokens=1138460, swa_layer_tokens=910768",
        "Use sliding window memory pool. full_layer_tokens=1138460, swa_layer_tokens=910768",
        "Post-capture KV sizing: full_layer_tokens=1138460, swa_layer_tokens=910768",
    ],
    ids=["v0410", "v057", "v0519-post-capture"],
)
def test_sliding_window_split(body: str) -> None:
    full, swa = events(body)
    assert isinstance(full, PoolSized) and isinstance(swa, PoolSized)
    assert (full.pool, full.tokens, swa.pool, swa.tokens) == ("full", 1138460, "swa", 910768)


def test_sliding_window_all_swa_and_non_hybrid_post_capture() -> None:
    e = pool("Use sliding window memory pool (all SWA). swa_layer_tokens=262144")
    assert (e.pool, e.tokens) == ("swa", 262144)
    e = pool("Post-capture KV sizing: full_layer_tokens=442181, swa_layer_tokens=0")
    assert (e.pool, e.tokens) == ("full", 442181)


# --- memory budget -------------------------------------------------------------------------------


def test_load_weight_begin() -> None:
    assert memory("Load weight begin. avail mem=78.58 GB").avail_before_weights_bytes == 84374632530


@pytest.mark.parametrize(
    ("body", "weights"),
    [
        ("Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.48 GB", None),
        (
            "Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.48 GB, mem usage=15.10 GB.",
            16213501542,
        ),
        (
            "Load weight end. elapsed=6.91 s, type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.48 GB, "
            "mem usage=15.10 GB.",
            16213501542,
        ),
        (
            "Load weight end. elapsed=6.91 s, type=LlamaForCausalLM, avail mem=63.48 GB, mem usage=15.10 GB.",
            16213501542,
        ),
        (
            "Load weight end. elapsed=30.12 s, type=DeepseekV3ForCausalLM, quant=fp8, fmt=e4m3, avail mem=63.48 GB, "
            "mem usage=15.10 GB.",
            16213501542,
        ),
    ],
    ids=["v02-v045", "v046-v058", "v059", "v0510", "v0510-quant"],
)
def test_load_weight_end(body: str, weights: int | None) -> None:
    e = memory(body)
    assert (e.avail_after_weights_bytes, e.weights_bytes) == (68161130988, weights)


def test_load_weight_end_sample_010_after_tqdm() -> None:
    e = memory(
        "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=103.67 GB, mem usage=81.66 GB."
    )
    assert (e.avail_after_weights_bytes, e.weights_bytes) == (111314814894, 87681757348)


def test_load_weight_draft_model_and_overlap_variant_are_skipped() -> None:
    assert (
        events(
            "Load weight end. type=DeepseekV3ForCausalLMNextN, dtype=torch.bfloat16, avail mem=60.00 GB, "
            "mem usage=1.20 GB."
        )
        == ()
    )
    assert (
        events("Load weight end. type=LlamaForCausalLMEagle3, avail mem=60.00 GB, mem usage=0.80 GB.") == ()
    )
    assert (
        events(
            "Load weight end. Committed real weights after CUDA graph capture in 3.20 s "
            "(capture overlap window 2.10 s, startup overlap total 5.00 s)"
        )
        == ()
    )


def test_memory_pool_end_sample_017() -> None:
    assert memory("Memory pool end. avail mem=15.38 GB").avail_after_pool_bytes == 16514149253


@pytest.mark.parametrize(
    "body",
    [
        "Capture cuda graph end. Time elapsed: 16.85 s. avail mem=8.78 GB. mem usage=0.52 GB.",
        "Capture cuda graph end. Time elapsed: 16.85 s. mem usage=0.52 GB. avail mem=8.78 GB.",
        "Capture npu graph end. Time elapsed: 16.85 s. mem usage=0.52 GB. avail mem=8.78 GB.",
        "Capture target decode CUDA graph end. elapsed=16.85 s, mem usage=0.52 GB, avail mem=8.78 GB.",
        "Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 16, 24, 32], elapsed=16.85 s, mem usage=0.52 GB, "
        "avail mem=8.78 GB.",
    ],
    ids=["v044", "v047", "npu", "v0515", "v0523"],
)
def test_cuda_graph_capture_end(body: str) -> None:
    assert memory(body).cuda_graph_bytes == 558345748


def test_cuda_graph_begin_and_draft_capture_are_skipped() -> None:
    assert events("Capture cuda graph begin. This can take up to several minutes. avail mem=9.30 GB") == ()
    assert (
        events("Capture draft decode CUDA graph end. elapsed=2.00 s, mem usage=0.10 GB, avail mem=8.00 GB.")
        == ()
    )
    assert (
        events("Capture draft cuda graph end. Time elapsed: 2.00 s. mem usage=0.10 GB. avail mem=8.00 GB.")
        == ()
    )


def test_mem_fraction_static_reduced_for_multimodal() -> None:
    e = memory("Automatically reduce --mem-fraction-static to 0.735 because this is a multimodal model.")
    assert e.mem_fraction_static == 0.735


# --- startup failures ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "mfs"),
    [
        ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", None),
        (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            "Current value: self.server_args.mem_fraction_static=0.835",
            0.835,
        ),
        (
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            "Current value: mem_fraction_static=0.7",
            0.7,
        ),
    ],
    ids=["v02-v052", "v053-v059", "v0510"],
)
def test_not_enough_memory(body: str, mfs: float | None) -> None:
    out = events(body)
    failure = out[0]
    assert isinstance(failure, StartupFailure)
    assert failure.reason == "not_enough_memory"
    assert failure.needed_kv_bytes is None and failure.available_kv_bytes is None
    if mfs is None:
        assert len(out) == 1
    else:
        (budget,) = out[1:]
        assert isinstance(budget, MemoryBudget) and budget.mem_fraction_static == mfs


def test_not_enough_memory_in_a_traceback_source_line_is_not_the_error() -> None:
    assert events('                "Not enough memory. Please try to increase --mem-fraction-static."') == ()


def test_not_enough_gpu_memory_for_mamba_carries_the_negative_budget() -> None:
    (e,) = events(
        "RuntimeError: Not enough GPU memory for hybrid (mamba/linear-attention) state cache. Computed "
        "max_mamba_cache_size=-3 (total_rest_memory=-1.25 GB, mamba_cache_per_req=45.00 MB). Try: (1) reduce "
        "--max-running-requests, (2) increase --mem-fraction-static, (3) reduce --speculative-num-draft-tokens, "
        "or (4) use GPUs with more memory."
    )
    assert isinstance(e, StartupFailure)
    assert (e.reason, e.available_kv_bytes) == ("not_enough_memory", -1342177280)


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        ("AssertionError: Memory pool size is too small", None),
        (
            "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests. "
            "max_mamba_cache_size=4, mamba_ratio=8, resulting max_num_reqs=0.",
            None,
        ),
        (
            "ValueError: SWA pool (4096 tokens) cannot hold even one request: the prefill admission floor is "
            "sliding_window_size (4096) + page_size (1). Increase --swa-full-tokens-ratio or the total KV budget.",
            4096,
        ),
    ],
    ids=["pool-too-small", "mamba-too-small", "swa-too-small"],
)
def test_pool_too_small(body: str, tokens: int | None) -> None:
    (e,) = events(body)
    assert isinstance(e, StartupFailure)
    assert (e.reason, e.max_tokens_in_cache) == ("not_enough_memory", tokens)


# --- settings ------------------------------------------------------------------------------------

SERVER_ARGS_V04 = (
    "server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V3', tokenizer_path='deepseek-ai/DeepSeek-V3', "
    "tokenizer_mode='auto', skip_tokenizer_init=False, load_format='auto', trust_remote_code=True, "
    "dtype='auto', kv_cache_dtype='fp8_e5m2', quantization=None, quantization_param_path=None, "
    "context_length=None, device='cuda', served_model_name='ds-v3', chat_template=None, is_embedding=False, "
    "revision=None, host='0.0.0.0', port=30000, mem_fraction_static=0.79, max_running_requests=None, "
    "max_total_tokens=None, chunked_prefill_size=8192, max_prefill_tokens=16384, schedule_policy='fcfs', "
    "schedule_conservativeness=1.0, cpu_offload_gb=0, page_size=1, tp_size=8, stream_interval=1, "
    "stream_output=False, random_seed=1234, constrained_json_whitespace_pattern=None, watchdog_timeout=300, "
    "dist_timeout=None, download_dir=None, base_gpu_id=0, gpu_id_step=1, log_level='info', "
    "log_level_http=None, log_requests=False, log_requests_level=0, show_time_cost=False, "
    "enable_metrics=True, decode_log_interval=40, api_key=None, file_storage_path='sglang_storage', "
    "enable_cache_report=False, reasoning_parser=None, dp_size=1, load_balance_method='round_robin', "
    "ep_size=1, dist_init_addr=None, nnodes=1, node_rank=0, "
    'json_model_override_args=\'{"tp_size": 99, "dtype": "float32", "a": [1, 2]}\', '
    "lora_paths=None, max_loras_per_batch=8, lora_backend='triton', attention_backend='flashinfer', "
    "sampling_backend='flashinfer', grammar_backend='xgrammar', speculative_algorithm=None, "
    "disable_radix_cache=False, disable_cuda_graph=False, disable_cuda_graph_padding=False, "
    "enable_dp_attention=False, cuda_graph_max_bs=160, cuda_graph_bs=[1, 2, 4, 8, 16], "
    "torchao_config='', enable_nan_detection=False, warmups=None, pp_size=1, debug_tensor_dump_output_folder=None)"
)


def test_server_args_dataclass_repr() -> None:
    (e,) = events(SERVER_ARGS_V04)
    assert isinstance(e, EngineSettings)
    assert e.starts_engine
    assert (e.model, e.served_model_name) == ("deepseek-ai/DeepSeek-V3", "ds-v3")
    assert (e.tensor_parallel_size, e.pipeline_parallel_size, e.data_parallel_size) == (8, 1, 1)
    assert (e.dtype, e.kv_cache_dtype, e.quantization) == ("auto", "fp8_e5m2", None)
    assert (e.page_size, e.max_model_len, e.chunked_prefill_size, e.cuda_graph_max_bs) == (1, None, 8192, 160)
    assert (e.mem_fraction_static, e.max_num_seqs) == (0.79, None)
    assert (e.enable_prefix_caching, e.enforce_eager) == (True, False)


def test_server_args_dict_form_v0519_reads_top_level_keys_only() -> None:
    (e,) = events(
        "server_args={'model_path': 'Qwen/Qwen3-32B', 'tokenizer_path': 'Qwen/Qwen3-32B', "
        "'speculative_config': {'dtype': 'float16', 'tp_size': 3, 'note': 'a, b) c'}, "
        "'dtype': 'bfloat16', 'kv_cache_dtype': 'auto', 'quantization': 'fp8', 'context_length': 32768, "
        "'mem_fraction_static': 0.835, 'max_running_requests': 256, 'chunked_prefill_size': 8192, "
        "'page_size': 16, 'tp_size': 2, 'pp_size': 1, 'dp_size': 4, 'cuda_graph_max_bs_decode': 256, "
        "'disable_radix_cache': True, 'served_model_name': 'qwen', 'enable_dp_attention': True}"
    )
    assert isinstance(e, EngineSettings)
    assert e.starts_engine
    assert (e.model, e.served_model_name, e.dtype, e.kv_cache_dtype) == (
        "Qwen/Qwen3-32B",
        "qwen",
        "bfloat16",
        "auto",
    )
    assert (e.tensor_parallel_size, e.data_parallel_size, e.page_size, e.max_model_len) == (2, 4, 16, 32768)
    assert (e.quantization, e.mem_fraction_static, e.max_num_seqs) == ("fp8", 0.835, 256)
    assert (e.cuda_graph_max_bs, e.enable_prefix_caching) == (256, False)
    assert e.dp_attention is True  # the pool is per DP rank, the KV heads over tp / dp


def test_server_args_truncated_paste_still_starts_an_engine() -> None:
    (e,) = events(
        "server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B-Instruct', tokenizer_path='meta-ll"
    )
    assert isinstance(e, EngineSettings)
    assert e.starts_engine and e.model == "meta-llama/Llama-3.1-8B-Instruct"


def test_server_args_with_an_unconvertible_value_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        parse("server_args=ServerArgs(model_path='m', tp_size='eight')", META)


def test_check_env_version_line() -> None:
    (e,) = events("sglang: 0.4.6.post1")
    assert isinstance(e, EngineSettings)
    assert (e.version, e.starts_engine) == ("0.4.6.post1", False)
    assert events("sglang: an error happened") == ()


# --- robustness ----------------------------------------------------------------------------------


def test_identity_defaults_when_the_prefix_said_nothing() -> None:
    (e,) = parse("Memory pool end. avail mem=15.38 GB", LineMeta())
    assert (e.instance, e.rank, e.ts, e.origin) == ("0", None, None, "log")


@pytest.mark.parametrize(
    "body",
    [
        'INFO:     127.0.0.1:37664 - "POST /v1/completions HTTP/1.1" 200 OK',
        "self.tree_cache.evictable_size()=0",
        "Init torch distributed ends. mem usage=0.61 GB",
        "The server is fired up and ready to roll!",
        "Capture cuda graph begin. This can take up to several minutes.",
        "",
    ],
)
def test_unknown_lines_are_ignored(body: str) -> None:
    assert parse(body, META) == ()


def test_a_number_too_long_to_convert_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        parse("max_total_num_tokens=" + "9" * 5000, META)


def test_one_megabyte_line_full_of_anchors_is_handled() -> None:
    body = ("Capture KV Cache is allocated. graph end " + "x" * 1000 + " server_args={'a': '") * 1000
    assert len(body) > 1_000_000
    try:
        out = parse(body, META)
    except ParseError:
        return
    assert isinstance(out, tuple)


REAL_BODIES = [
    "KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB",
    "Decode batch, #running-req: 45, #token: 44672, token usaccept rate: 0.32, npu graph: False, "
    "gen throughput (token/s): 863.65, #queue-req",
    "Decode batch. #running-req: 509, #token: 180776, token usage: 0.43, gen throughput (token/s): 7897.87, "
    "largest-len: 0, #queue-req: 0, ",
    "max_total_num_tokens=2086558, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=33, "
    "context_len=256000, available_gpu_mem=17.22 GB",
    "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=103.67 GB, mem usage=81.66 GB.",
    "Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.8024 -> 0.9085",
    "Prefill batch. #new-seq: 5, #new-token: 8192, #cached-token: 1832, cache hit rate: 11.92%, "
    "token usage: 0.77, #running-req: 21, #queue-req: 18",
    SERVER_ARGS_V04,
    " UserWarning: Warning: available_size=35244, max_total_num_token=42308",
    "Memory pool end. avail mem=15.38 GB",
]


def _contract_holds(body: str) -> None:
    try:
        out = parse(body, META)
    except ParseError:
        return
    assert isinstance(out, tuple)
    if out:
        assert any(a in body for a in ANCHORS)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_text_never_raises_anything_but_parse_error(body: str) -> None:
    _contract_holds(body)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(REAL_BODIES),
    st.integers(min_value=0, max_value=2000),
    st.integers(min_value=0, max_value=2000),
)
def test_truncated_real_lines_keep_the_contract(body: str, start: int, end: int) -> None:
    _contract_holds(body[start : start + end])


@settings(max_examples=examples(300), deadline=None)
@given(st.sampled_from(REAL_BODIES), st.randoms(use_true_random=False))
def test_shuffled_real_lines_keep_the_contract(body: str, rnd: random.Random) -> None:
    parts = body.split(", ")
    rnd.shuffle(parts)
    _contract_holds(", ".join(parts))
    chars = list(body)
    rnd.shuffle(chars)
    _contract_holds("".join(chars))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(REAL_BODIES), st.text(), st.text())
def test_real_lines_inside_noise_keep_the_contract(body: str, before: str, after: str) -> None:
    _contract_holds(before + body + after)


SERVER_ARGS_LINES = Path(__file__).parent / "sglang_server_args"


@pytest.mark.parametrize(
    ("name", "pp", "page", "cuda_bs"),
    [("v0.4.6.txt", None, 1, 256), ("v0.5.15.txt", 1, None, None)],
)
def test_server_args_full_length_dataclass_repr(
    name: str, pp: int | None, page: int | None, cuda_bs: int | None
) -> None:
    line = (SERVER_ARGS_LINES / name).read_text(encoding="utf-8").strip()
    body = line.split("] ", 1)[1]
    (e,) = events(body)
    assert isinstance(e, EngineSettings)
    assert e.starts_engine
    assert (e.model, e.served_model_name) == ("meta-llama/Llama-3.1-8B-Instruct",) * 2
    # 0.5.15 also has moe_dense_tp_size=None, mamba_ssm_dtype=None, ...: only top-level keys count.
    assert (e.tensor_parallel_size, e.pipeline_parallel_size, e.data_parallel_size) == (2, pp, 1)
    assert (e.dtype, e.kv_cache_dtype, e.quantization, e.max_model_len) == ("auto", "auto", None, None)
    assert (e.mem_fraction_static, e.chunked_prefill_size, e.page_size, e.cuda_graph_max_bs) == (
        0.835,
        8192,
        page,
        cuda_bs,
    )
    assert (e.enable_prefix_caching, e.enforce_eager) == (True, False)
