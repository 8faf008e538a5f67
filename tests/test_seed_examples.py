"""The seeds' worked examples, each reproduced by kvwatch plan from the seed's own stated assumptions.

The seed texts lost their tables, so every example below restates the assumptions the prose gives
(card memory as the driver reports it, utilisation, how the weights are counted, what is set aside
for activations, the workload) and lets kvwatch's planner do the arithmetic. Seeds:
  000 "The KV cache size formula" (vLLM on an H100: 0.92 x 81,559 MiB, weights = parameters x
      bytes per weight, 6.0 GiB for activations + CUDA graphs + non-torch, 8k requests);
  001 "KV Cache Sizing" (Llama 3.1 70B, bf16 cache, 320 KiB per position, per-rank budgets);
  002 "KV cache explained" (checkpoint file sizes, 92% of what nvidia-smi reports, before activations).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from kvwatch.analysis.plan import card_fits, make_plan, smallest_cards
from kvwatch.analysis.workload import parse_inline, parse_rank_budgets
from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import load_model
from kvwatch.capacity.gpus import GpuSpec
from kvwatch.capacity.model import ModelGeometry
from kvwatch.capacity.weights import LOAD_OOM, weights_per_rank
from kvwatch.cli import main
from kvwatch.core.units import GiB, KiB, MiB

CONFIGS = Path(__file__).parent / "model_configs"
# Llama-3-70B and Llama 3.1 70B share every shape the seeds use (80 layers, 8 KV heads of 128,
# hidden 8192, vocabulary 128,256); the bundled config is 3.1's.
LLAMA_70B = CONFIGS / "meta-llama--Meta-Llama-3.1-70B.json"


def seed000_h100(m: ModelGeometry, **kw: Any) -> Deployment:
    """Seed 000's box: an H100 SXM reporting 81,559 MiB, vLLM at its default 0.92, 8k requests.

    The seed's own inputs, given: 6.0 GiB for activations + CUDA graphs + non-torch (its allowance,
    where kvwatch now models each term; checked against real startups in test_accuracy.py) and the
    weights as the checkpoint's files (kvwatch.capacity.weights).
    """
    weights = weights_per_rank(m, kw.get("tp", 1), 1, kw.get("weights_dtype")).per_rank_bytes
    return Deployment(
        engine="vllm",
        gpu_memory_bytes=81559 * MiB,
        gpu_name="H100",
        gpu_memory_utilization=0.92,
        max_model_len=8192,
        activation_bytes=6 * GiB,
        weights_bytes=weights,
        **kw,
    )


def with_fp8_checkpoint(src: Path, tmp_path: Path) -> Path:
    """The same config.json as its FP8 checkpoint ships it: quantization_config fp8.

    kvwatch then counts the weights as the checkpoint's files hold them: every decoder linear at
    one byte, embeddings and lm_head left in bf16.
    """
    raw = json.loads(src.read_text())
    raw["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    out = tmp_path / f"{src.stem}-FP8.json"
    out.write_text(json.dumps(raw))
    return out


# --- seed 001 ----------------------------------------------------------------------------------


def test_001_ten_40gib_sequences_tp8_one_short_rank_fits_nine() -> None:
    """Llama 3.1 70B, bf16 cache: 320 KiB per position; 131,072 positions = 40 GiB per sequence.

    TP=8 shards the 8 KV heads evenly (one per rank, no replication): 5 GiB per rank per sequence,
    ten sequences need 50 GiB on every rank. Seven ranks have 52 GiB available for the cache, one
    has 47 GiB; the budgets are the cache's, "before further headroom".
    """
    m = load_model(LLAMA_70B)
    p = make_plan(
        m,
        Deployment(tp=8, max_model_len=131072),
        parse_inline("10x131072"),
        rank_kv_bytes=parse_rank_budgets("7x52GiB,47GiB"),
    )
    assert p.bytes_per_token_all_ranks == 320 * KiB
    assert p.payload_bytes_all_ranks == 10 * 40 * GiB
    assert p.bytes_per_token == 40 * KiB
    assert p.needed_bytes == 50 * GiB
    assert not p.fits
    assert p.ranks_differ and p.limiting_rank == 7
    assert [r.fits for r in p.ranks] == [True] * 7 + [False]
    # floor(47 / 5) = 9
    assert p.sequences_fit == 9


def test_001_payload_per_position() -> None:
    """320 KiB per position becomes 2.5 GiB at 8,192 positions and 40 GiB at 131,072 (TP=1, bf16)."""
    m = load_model(LLAMA_70B)
    for length, gib in ((8192, 2.5), (131072, 40)):
        p = make_plan(
            m, Deployment(max_model_len=131072), parse_inline(str(length)), rank_kv_bytes=[64 * GiB]
        )
        assert p.payload_bytes == gib * GiB


def test_001_six_conversations_grow_past_a_35gib_budget() -> None:
    """The chart's six conversations: two of 32,768 positions and four of 8,192.

    (The sanity check says a 32,768-position sequence is four times an 8,192-position one and "two
    long sequences cost twice as much as four short ones"; 30 GiB before growth = 37.5 - 7.5.)
    Llama 3.1 70B, bf16 cache, one rank, a 35 GiB payload budget; every conversation grows by 4,096
    retained positions, no shared prefix or eviction.
    """
    m = load_model(LLAMA_70B)
    p = make_plan(
        m,
        Deployment(max_model_len=131072),
        parse_inline("2x32768,4x8192"),
        grow=4096,
        rank_kv_bytes=[35 * GiB],
    )
    # 4,096 x 320 KiB = 1.25 GiB per conversation; six need 7.5 GiB.
    assert p.grow_bytes == 7.5 * GiB
    assert p.needed_bytes == 37.5 * GiB
    assert p.fits_before_growth is True
    assert p.fits is False


# --- seed 000 ----------------------------------------------------------------------------------


def test_000_qwen3_32b_h100_three_then_eighteen_by_halving_the_weights() -> None:
    """Qwen3-32B, 256 KiB per token: 61 GiB of bf16 weights leave ~6.3 GiB, three 8k conversations.

    "Qwen3-32B goes from 3 concurrent requests to 18 by halving the weights alone" (fp8 weights =
    parameter count x 1 byte; the cache stays bf16).
    """
    m = load_model(CONFIGS / "Qwen--Qwen3-32B.json")
    one_8k = parse_inline("8192")
    bf16 = make_plan(m, seed000_h100(m), one_8k)
    assert bf16.bytes_per_token == 256 * KiB
    assert round(bf16.prediction.weights_bytes / GiB) == 61  # type: ignore[operator]
    assert round(bf16.ranks[0].budget_bytes / GiB, 1) == 6.3
    assert round(bf16.ranks[0].pool_tokens, -2) == 25_600
    assert bf16.copies == 3
    fp8 = make_plan(m, seed000_h100(m, weights_dtype="fp8"), one_8k)
    assert fp8.copies == 18
    # The card search models vLLM's loader instead of "every parameter at one byte": runtime fp8 keeps
    # the embedding and the head in bf16 (quantization/fp8.py), 31.97 GiB, so one H100 holds 17 such
    # requests with fp8 weights, not the seed's 18.
    base = seed000_h100(m).with_()
    base = dataclasses.replace(base, weights_bytes=None)
    for n, fp8_fits in ((17, True), (18, False)):
        fits = card_fits(m, base, parse_inline(f"{n}x8192"), cards=smi(gpus.lookup("h100")))
        by = {(f.kv_cache_dtype, f.weights): f for f in fits}
        assert by[("bf16", "fp8")].fits is fp8_fits and not by[("bf16", "checkpoint (bfloat16)")].fits
        weights = by[("bf16", "fp8")].weights_bytes
        assert weights is not None
        assert round(weights / GiB, 2) == 31.97


def test_000_llama3_70b_bf16_does_not_fit_one_h100() -> None:
    """70.6B parameters x 2 bytes = 131 GiB of weights against 73.28 GiB usable: no KV budget at all.

    With fp8 weights the illustrative 1.57 GiB pool cannot admit an 8,192-token request but holds
    shorter contexts.
    """
    m = load_model(LLAMA_70B)
    bf16 = make_plan(m, seed000_h100(m), parse_inline("8192"))
    assert not bf16.fits and bf16.copies == 0
    assert bf16.ranks[0].budget_bytes < 0
    # Before any budget: the weights alone pass the memory free when they load (capacity.weights).
    assert any(n.startswith(LOAD_OOM) and "131.42 GiB per GPU" in n for n in bf16.notes), bf16.notes
    fp8 = make_plan(m, seed000_h100(m, weights_dtype="fp8"), parse_inline("8192"))
    assert round(fp8.ranks[0].budget_bytes / GiB, 2) == 1.57
    assert not fp8.fits
    assert make_plan(m, seed000_h100(m, weights_dtype="fp8"), parse_inline("4096")).fits


def test_000_llama3_70b_tp8_holds_1_33m_tokens_162_requests() -> None:
    """TP=8: one KV head per rank, 40 KiB per token per GPU; 1.33M resident tokens, 162 8k requests."""
    m = load_model(LLAMA_70B)
    p = make_plan(m, seed000_h100(m, tp=8), parse_inline("8192"))
    assert p.bytes_per_token == 40 * KiB
    assert round(p.ranks[0].pool_tokens / 1e6, 2) == 1.33
    assert p.copies == 162
    assert p.sequences_fit == 1 and p.fits


def test_000_deepseek_v3_16_gpus_52_requests() -> None:
    """MLA's latent is not divided by TP: 61 x 576 x 2 = 70,272 B (68.6 KiB) per token on every GPU.

    Sixteen GPUs (TP=16) split the weights, not the cache: 52 concurrent 8k requests.
    """
    m = load_model(CONFIGS / "deepseek-ai--DeepSeek-V3.json")
    p = make_plan(m, seed000_h100(m, tp=16), parse_inline("8192"))
    assert p.bytes_per_token == 61 * (512 + 64) * 2
    assert round(p.bytes_per_token / KiB, 1) == 68.6
    assert p.copies == 52


# --- seed 002 ----------------------------------------------------------------------------------


def seed002(m: ModelGeometry, **kw: Any) -> Deployment:
    """92% of the card as nvidia-smi reports it, weights as the checkpoint's files, before activations."""
    weights = weights_per_rank(m, 1, 1, kw.get("weights_dtype")).per_rank_bytes
    return Deployment(engine="vllm", activation_bytes=0, weights_bytes=weights, max_model_len=32768, **kw)


def smi(*cards: GpuSpec) -> list[GpuSpec]:
    """The seed's card table computes from nvidia-smi's figure: cards whose total is that figure."""
    chosen = cards or gpus.CATALOGUE
    return [dataclasses.replace(c, measured_total_bytes=c.memory_bytes) for c in chosen]


def test_002_llama33_70b_fp8_80gb_and_h200_nvl(tmp_path: Path) -> None:
    """Llama 3.3 70B FP8: 18,000-19,000 tokens on an 80 GB card, about 200,000 on an H200 NVL."""
    m = load_model(with_fp8_checkpoint(CONFIGS / "meta-llama--Llama-3.3-70B-Instruct.json", tmp_path))
    cards = smi(gpus.lookup("h100"), gpus.lookup("h200-nvl"))
    fits = {
        f.gpu.name: f
        for f in card_fits(
            m, seed002(m), parse_inline("6x32768"), cards=cards, kv_dtypes=("auto",), weights=(None,)
        )
    }
    assert 18_000 <= fits["H100-SXM-80GB"].pool_tokens <= 19_000
    assert round(fits["H200-NVL-141GB"].pool_tokens, -4) == 200_000
    # "enough for six 32k conversations at once" -- on the 141 GB card only.
    assert fits["H200-NVL-141GB"].fits and not fits["H100-SXM-80GB"].fits


def test_002_llama33_70b_fp8_six_32k_smallest_card_is_141gb(tmp_path: Path) -> None:
    m = load_model(with_fp8_checkpoint(CONFIGS / "meta-llama--Llama-3.3-70B-Instruct.json", tmp_path))
    smallest = smallest_cards(
        card_fits(m, seed002(m), parse_inline("6x32768"), cards=smi(), kv_dtypes=("auto",), weights=(None,))
    )
    (card,) = smallest.values()
    assert card is not None and card.gpu.memory_bytes == 143771 * MiB


def test_002_qwen3_8b_a6000_190k_210k_with_ecc_off() -> None:
    """Qwen3-8B: 144 KiB per token; 26.1 GiB after the weights on an RTX A6000 (46,068 MiB, ECC on)
    holds about 190,000 tokens, about 210,000 with ECC off (49,140 MiB)."""
    m = load_model(CONFIGS / "Qwen--Qwen3-8B.json")
    cards = smi(gpus.lookup("a6000"), gpus.lookup("a6000-ecc-off"))
    fits = card_fits(
        m, seed002(m), parse_inline("5x32768"), cards=cards, kv_dtypes=("auto",), weights=(None,)
    )
    on, off = fits
    assert on.gpu.memory_bytes == 46068 * MiB and off.gpu.memory_bytes == 49140 * MiB
    assert round(on.kv_budget_bytes / GiB, 1) == 26.1
    assert round(on.pool_tokens, -4) == 190_000
    assert round(off.pool_tokens, -4) == 210_000
    # "With ECC off ... each 48 GB cell gains 2.8 GiB" (3,072 MiB x 0.92).
    assert round((off.kv_budget_bytes - on.kv_budget_bytes) / GiB, 1) == 2.8
    # "even a 48 GB RTX A6000 or L40S holds five full 32k conversations"
    assert on.fits


def test_002_qwen3_8b_five_32k_smallest_card_is_48gb() -> None:
    m = load_model(CONFIGS / "Qwen--Qwen3-8B.json")
    smallest = smallest_cards(
        card_fits(m, seed002(m), parse_inline("5x32768"), cards=smi(), kv_dtypes=("auto",), weights=(None,))
    )
    (card,) = smallest.values()
    assert card is not None and card.gpu.memory_bytes == 46068 * MiB


def test_002_qwen3_32b_fp8_borderline_on_48gb(tmp_path: Path) -> None:
    """ "A 32B model at FP8 is the borderline case on 48 GB: one 32k conversation needs 8 GiB of the
    9.4 GiB left, before activations." """
    m = load_model(with_fp8_checkpoint(CONFIGS / "Qwen--Qwen3-32B.json", tmp_path))
    d = seed002(m, gpu_memory_bytes=gpus.lookup("a6000").memory_bytes, gpu_memory_utilization=0.92)
    one = make_plan(m, d, parse_inline("32768"))
    assert round(one.ranks[0].budget_bytes / GiB, 1) == 9.4
    assert one.needed_bytes == 8 * GiB
    assert one.fits and one.copies == 1
    assert not make_plan(m, d, parse_inline("2x32768")).fits


def test_cli_reproduces_the_rank_example(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "plan",
            str(LLAMA_70B),
            "--tp",
            "8",
            "--max-model-len",
            "131072",
            "--workload",
            "10x131072",
            "--available-kv-memory",
            "7x52GiB,47GiB",
            "--gpus",
            "h100",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    plan = out["plan"]
    assert plan["limiting_rank"] == 7 and plan["sequences_fit"] == 9 and plan["fits"] is False
    assert plan["needed_bytes_per_rank"] == 50 * GiB
    assert math.isclose(plan["payload_bytes_all_ranks"] / GiB, 400)
