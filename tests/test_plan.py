"""kvwatch.analysis.plan and ``kvwatch plan``: workload specs, block rounding, shared prefixes, ranks, cards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.analysis.plan import card_fits, make_plan, smallest_cards
from kvwatch.analysis.workload import (
    Row,
    Workload,
    load_workload,
    parse_csv,
    parse_inline,
    parse_json,
    parse_rank_budgets,
)
from kvwatch.capacity import gpus
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import load_model
from kvwatch.capacity.weights import weights_per_rank
from kvwatch.cli import main
from kvwatch.core.errors import ConfigError
from kvwatch.core.units import GiB, KiB

CONFIGS = Path(__file__).parent / "model_configs"
LLAMA_8B = CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json"
LLAMA_70B = CONFIGS / "meta-llama--Meta-Llama-3.1-70B.json"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


# --- workload specs ----------------------------------------------------------------------------


def test_inline_spec() -> None:
    w = parse_inline("6x32768,20x8192")
    assert w.rows == (Row(6, 32768), Row(20, 8192))
    assert w.sequences == 26
    assert w.tokens == 6 * 32768 + 20 * 8192
    assert w.longest == 32768


def test_inline_k_suffix_and_bare_lengths() -> None:
    assert parse_inline("4x32k, 8192").rows == (Row(4, 32 * 1024), Row(1, 8192))


@pytest.mark.parametrize(
    "spec", ["", "6x", "x8192", "abc", "0x8192", "6x0", "6x-5", "6x32768;2x5", "1.5x8192"]
)
def test_inline_spec_errors(spec: str) -> None:
    with pytest.raises(ConfigError, match="workload"):
        parse_inline(spec)


def test_csv_with_prefix_groups() -> None:
    w = parse_csv("length,count,prefix_group,prefix_length\n8192,4,sys,2048\n4096,2,sys,\n16k,1,,\n\n")
    assert w.rows == (Row(4, 8192, "sys"), Row(2, 4096, "sys"), Row(1, 16384))
    assert w.prefixes == {"sys": 2048}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("len,count\n5,1\n", "'length' column"),
        ("length\nabc\n", "line 2"),
        ("length,count\n5,0\n", "count must be positive"),
        ("length,prefix_length\n5000,100\n", "prefix_length without prefix_group"),
        ("length,prefix_group\n5000,sys\n", "no prefix length"),
        ("length,prefix_group,prefix_length\n1000,sys,2048\n", "cannot share"),
        ("length,prefix_group,prefix_length\n5000,sys,2048\n5000,sys,1024\n", "two prefix lengths"),
        ("length\n", "empty"),
    ],
)
def test_csv_errors(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_csv(text)


def test_json_forms() -> None:
    assert parse_json("[8192, 8192, 32768]").rows == (Row(1, 8192), Row(1, 8192), Row(1, 32768))
    w = parse_json(
        json.dumps(
            {
                "prefix_groups": {"rag": 6000},
                "sequences": [
                    {"length": 9000, "count": 3, "prefix_group": "rag"},
                    {"length": 7000, "prefix_group": "tools", "prefix_length": 512},
                    1024,
                ],
            }
        )
    )
    assert w.rows == (Row(3, 9000, "rag"), Row(1, 7000, "tools"), Row(1, 1024))
    assert w.prefixes == {"rag": 6000, "tools": 512}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", "workload JSON"),
        ('{"sequences": 5}', "expected a list"),
        ('[{"length": 5, "colour": "red"}]', "unknown field"),
        ('[{"count": 2}]', "length must be a whole number"),
        ("[true]", "whole number"),
        ('{"prefix_groups": [1], "sequences": [5]}', "prefix_groups"),
        ("[]", "empty"),
    ],
)
def test_json_errors(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_json(text)


def test_load_workload_files(tmp_path: Path) -> None:
    (tmp_path / "w.csv").write_text("length,count\n8192,3\n")
    (tmp_path / "w.json").write_text("[100, 200]")
    assert load_workload(str(tmp_path / "w.csv")).sequences == 3
    assert load_workload(str(tmp_path / "w.json")).tokens == 300
    with pytest.raises(ConfigError, match="cannot read workload file"):
        load_workload(str(tmp_path / "missing.csv"))


def test_too_many_sequences_refused() -> None:
    with pytest.raises(ConfigError, match="sequences"):
        parse_inline("99999999x16")


# --- blocks ------------------------------------------------------------------------------------


def test_block_rounding_is_per_sequence() -> None:
    # Seed: "a 17-token request occupies 32 slots at block_size=16". Rounding the sum instead
    # (3 x 17 = 51 -> 64) would under-count by a block per two sequences.
    wb = parse_inline("3x17").blocks(16)
    assert wb.blocks == 3 * 2
    assert wb.tokens == 96


def test_shared_prefix_full_blocks_counted_once() -> None:
    # 4 sequences of 5,000 positions sharing a 4,100-position prefix, 16-token blocks:
    # 4100 // 16 = 256 full shared blocks (the 4-token tail stays private), each sequence
    # ceil(5000 / 16) = 313 blocks of which 313 - 256 = 57 are its own.
    w = Workload((Row(4, 5000, "sys"),), {"sys": 4100})
    wb = w.blocks(16)
    assert wb.shared_blocks == 256
    assert wb.blocks == 4 * 57 + 256
    assert wb.unshared_blocks == 4 * 313
    assert wb.saved_blocks == 3 * 256


def test_prefix_groups_are_separate() -> None:
    w = Workload((Row(2, 64, "a"), Row(2, 64, "b")), {"a": 32, "b": 32})
    # Each group's 2 prefix blocks are stored once per group, not once overall.
    assert w.blocks(16).blocks == 2 + 2 * 2 + 2 + 2 * 2


def test_greedy_fit_pays_shared_blocks_once() -> None:
    w = Workload((Row(10, 64, "sys"),), {"sys": 48})
    # 3 shared blocks + 1 own block per sequence: 3 + 1 for the first, 1 for each next one.
    assert w.greedy_fit(pool_tokens=16 * 4, block_size=16) == 1
    assert w.greedy_fit(pool_tokens=16 * 8, block_size=16) == 5
    assert w.greedy_fit(pool_tokens=16 * 100, block_size=16) == 10
    assert w.greedy_fit(pool_tokens=16 * 3, block_size=16) == 0


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=8),
    prefix=st.integers(0, 5000),
    block=st.sampled_from([1, 16, 64]),
)
def test_sharing_never_costs_more_and_greedy_agrees(lengths: list[int], prefix: int, block: int) -> None:
    prefix = min(prefix, *lengths)
    shared = Workload(tuple(Row(1, n, "g") for n in lengths), {"g": prefix})
    alone = Workload(tuple(Row(1, n) for n in lengths))
    assert shared.blocks(block).blocks <= alone.blocks(block).blocks
    assert alone.blocks(block).tokens >= alone.tokens
    # A pool exactly the size of the workload admits all of it, one block less does not.
    need = shared.blocks(block).tokens
    assert shared.greedy_fit(need, block) == len(lengths)
    assert shared.greedy_fit(need - block, block) < len(lengths)


def test_grow_adds_positions_to_every_sequence_not_prefixes() -> None:
    w = Workload((Row(2, 1000, "p"), Row(1, 50)), {"p": 512}).grown(100)
    assert w.rows == (Row(2, 1100, "p"), Row(1, 150))
    assert w.prefixes == {"p": 512}


# --- ranks -------------------------------------------------------------------------------------


def test_rank_budget_spec() -> None:
    assert parse_rank_budgets("7x52GiB,47GiB") == (52 * GiB,) * 7 + (47 * GiB,)
    assert parse_rank_budgets("35GiB") == (35 * GiB,)
    with pytest.raises(ConfigError):
        parse_rank_budgets("0x52GiB")
    with pytest.raises(ConfigError):
        parse_rank_budgets("lots")


def test_plan_equal_ranks_name_no_limiting_rank() -> None:
    m = load_model(LLAMA_70B)
    p = make_plan(m, Deployment(tp=2), parse_inline("4x8192"), rank_kv_bytes=[10 * GiB])
    assert len(p.ranks) == 2 and not p.ranks_differ
    # 70B at TP=2: 4 KV heads per rank, 80 layers, 128 dims, K+V, 2 bytes = 160 KiB per position.
    assert p.bytes_per_token == 2 * 80 * 4 * 128 * 2
    assert p.needed_bytes == 4 * 8192 * 160 * KiB
    assert p.fits
    assert p.to_json_dict()["limiting_rank"] is None


def test_plan_rank_count_must_match() -> None:
    m = load_model(LLAMA_70B)
    with pytest.raises(ConfigError, match="3 rank budgets given for 8 ranks"):
        make_plan(m, Deployment(tp=8), parse_inline("8192"), rank_kv_bytes=[GiB] * 3)


def test_plan_from_the_card_budget() -> None:
    m = load_model(LLAMA_8B)
    # The seed's inputs: nvidia-smi's 81,559 MiB, its 6.0 GiB allowance, the checkpoint's weights.
    d = Deployment(
        gpu_memory_bytes=gpus.lookup("h100").memory_bytes,
        gpu_name="H100",
        max_model_len=8192,
        activation_bytes=6 * GiB,
        weights_bytes=weights_per_rank(m, 1, 1).per_rank_bytes,
        engine_version="0.33.0",  # 0.92 utilisation; pinned so a newer release's default does not move it
    )
    p = make_plan(m, d, parse_inline("52x8192"))
    # The seed's H100 budget: 26,785 blocks of 16 = 428,560 tokens (from weights rounded to 14.96 GiB;
    # the recomputed weights land one block away); 52 requests of 512 blocks fit, 53 do not.
    assert p.prediction.kv_pool_blocks is not None
    assert p.ranks[0].pool_tokens == p.prediction.kv_pool_blocks * 16
    assert abs(p.ranks[0].pool_tokens - 428_560) <= 16
    assert p.fits and p.copies == 1
    assert not make_plan(m, d, parse_inline("53x8192")).fits


def test_plan_notes_sequences_longer_than_max_model_len() -> None:
    m = load_model(LLAMA_8B)
    p = make_plan(m, Deployment(max_model_len=4096), parse_inline("8192"), rank_kv_bytes=[GiB])
    assert any("exceeds max_model_len" in n for n in p.notes)
    # The pool has room (1 GiB holds 8,192 positions at 128 KiB), but the engine rejects the request.
    assert p.ranks[0].fits and not p.fits


def test_negative_grow_refused() -> None:
    with pytest.raises(ConfigError, match="grow"):
        make_plan(load_model(LLAMA_8B), Deployment(), parse_inline("8"), grow=-1, rank_kv_bytes=[GiB])


# --- cards -------------------------------------------------------------------------------------


def test_a_larger_card_never_fits_less() -> None:
    m = load_model(LLAMA_8B)
    fits = card_fits(m, Deployment(max_model_len=32768), parse_inline("6x32768"))
    by_variant: dict[tuple[str, str], list[Any]] = {}
    for f in fits:
        by_variant.setdefault((f.kv_cache_dtype, f.weights), []).append(f)
    for rows in by_variant.values():
        seen_fit = False
        for f in rows:  # ascending memory
            assert f.fits or not seen_fit, f"{f.gpu.name} fails after a smaller card fit"
            seen_fit = seen_fit or f.fits
    smallest = smallest_cards(fits)
    assert set(smallest) == {
        (kv, w) for kv in ("bf16", "fp8") for w in ("checkpoint (bfloat16)", "fp8", "int4")
    }
    # An fp8 cache never needs a bigger card than a bf16 cache.
    for w in ("checkpoint (bfloat16)", "fp8", "int4"):
        b, f8 = smallest[("bf16", w)], smallest[("fp8", w)]
        assert b is not None and f8 is not None
        assert f8.gpu.memory_bytes <= b.gpu.memory_bytes


def test_card_target_range() -> None:
    with pytest.raises(ConfigError, match="target"):
        card_fits(load_model(LLAMA_8B), Deployment(), parse_inline("8"), target=1.2)


# --- the command -------------------------------------------------------------------------------


def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(
        capsys,
        str(LLAMA_70B),
        "--tp",
        "8",
        "--workload",
        "10x131072",
        "--available-kv-memory",
        "7x52GiB,47GiB",
        "--gpus",
        "h100,h200",
    )
    assert rc == 0, err
    assert "<- limiting" in out
    assert "does NOT fit: rank 7 (47.00 GiB) holds 9 of 10 sequences" in out
    assert "smallest card x 8 under 92%" in out
    assert "H200-SXM-141GB" in out


def test_cli_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = tmp_path / "w.json"
    spec.write_text(
        json.dumps(
            {
                "prefix_groups": {"sys": 4096},
                "sequences": [{"length": 8192, "count": 8, "prefix_group": "sys"}],
            }
        )
    )
    rc, out, err = run_cli(
        capsys,
        str(LLAMA_8B),
        "--gpu",
        "h100",
        "--max-model-len",
        "16384",
        "--workload",
        str(spec),
        "--grow",
        "512",
        "--json",
    )
    assert rc == 0, err
    data = json.loads(out)
    plan = data["plan"]
    assert plan["workload"]["sequences"] == 8
    assert plan["workload"]["logical_tokens"] == 8 * (8192 + 512)
    # 4096 // 16 = 256 shared blocks stored once: 7 x 256 saved.
    assert plan["workload"]["saved_blocks"] == 7 * 256
    assert plan["grow_bytes_per_rank"] == 8 * 512 * 128 * KiB
    assert plan["fits"] is True
    assert {c["gpu"] for c in data["cards"]} == {g.name for g in gpus.CATALOGUE}
    assert len(data["smallest"]) == 6


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--workload", "6x"], "workload"),
        (["--workload", "8192", "--gpus", "h100,nosuchcard"], "unknown GPU"),
        (["--workload", "missing.csv"], "cannot read workload file"),
        (["--workload", "8192", "--available-kv-memory", "3x1GiB"], "rank budgets"),
    ],
)
def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], match: str) -> None:
    rc, out, err = run_cli(capsys, str(LLAMA_8B), *argv, "--tp", "2")
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1 and match in err
    assert err.startswith("kvwatch plan: error: ")


def test_cli_target_flag_checked_by_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plan", str(LLAMA_8B), "--workload", "8192", "--target", "1.5"])
    assert exc.value.code == 2
    capsys.readouterr()


ALL_CONFIGS = sorted(p for p in CONFIGS.glob("*.json") if p.name != "manifest.json")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("config", ALL_CONFIGS, ids=lambda p: p.stem)
def test_every_bundled_config_plans(config: Path, engine: Literal["vllm", "sglang"]) -> None:
    """Every architecture kvwatch sizes (MLA, hybrid sliding/linear, MoE) plans without error, and
    the verdict agrees with the limiting rank's pool."""
    m = load_model(config)
    d = Deployment(engine=engine, gpu_memory_bytes=gpus.lookup("h200").memory_bytes, max_model_len=32768)
    w = Workload((Row(6, 8192, "sys"), Row(2, 32000)), {"sys": 1000})
    p = make_plan(m, d, w, grow=64)
    limit = p.ranks[p.limiting_rank]
    assert p.allocated_tokens >= p.logical_tokens - p.saved_blocks * p.block_size
    assert p.fits == (limit.fits and p.sequences_fit == p.sequences)
    assert p.copies == (limit.pool_tokens // p.allocated_tokens)
    if limit.budget_bytes <= 0:
        assert not p.fits and p.copies == 0 and limit.pool_tokens == 0
