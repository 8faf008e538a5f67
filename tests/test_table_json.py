"""Every human table of `predict` and `plan` says what its --json twin says, and agrees with its title.

Each test runs the command twice (table, --json), reads the numbers back out of the table and
compares them with the JSON's: a figure the table rounds is compared after the same rounding.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from kvwatch.cli import main
from kvwatch.core.units import format_bytes

CONFIGS = Path(__file__).resolve().parent / "model_configs"
QWEN3_32B = str(CONFIGS / "Qwen--Qwen3-32B.json")


def _out(*args: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(list(args)) == 0
    return buf.getvalue()


def _rows(text: str, header_start: str) -> list[list[str]]:
    """The rows of the table whose header line starts with ``header_start`` (cells: 2+ spaces apart)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    out = []
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        out.append(re.split(r"\s{2,}", line.strip()))
    return out


def _floor_percent(value: float) -> str:
    return f"{math.floor(value * 1000) / 10:.1f}%"


PLAN = ("plan", QWEN3_32B, "--workload", "6x32768,20x8192", "--gpu", "h100", "--gpus", "h100,h200,b200")


def test_plan_tables_equal_the_json() -> None:
    text = _out(*PLAN)
    data: dict[str, Any] = json.loads(_out(*PLAN, "--json"))
    # The per-rank check.
    (rank,) = _rows(text, "rank")
    (jrank,) = data["plan"]["ranks"]
    assert rank == [
        "0",
        format_bytes(jrank["kv_budget_bytes"]),
        f"{jrank['pool_tokens']:,}",
        format_bytes(jrank["needed_bytes"]),
        "yes" if jrank["fits"] else "NO",
        f"{jrank['sequences_fit']:,}",
    ]
    # The smallest card per combination: listed under the target, and under it.
    title = next(line for line in text.splitlines() if line.startswith("smallest card"))
    assert f"under {data['target']:.0%}" in title
    smallest = _rows(text, "KV cache  weights")
    assert len(smallest) == len(data["smallest"])
    for row, s in zip(smallest, data["smallest"], strict=True):
        assert row[:2] == [s["kv_cache_dtype"], s["weights"]]
        if s["gpu"] is None:
            assert row[2] == "none of these cards"
            continue
        assert row[2:] == [
            s["gpu"],
            format_bytes(s["weights_bytes_per_rank"]),
            f"{s['pool_tokens']:,}",
            _floor_percent(s["card_use"]),
        ]
        assert s["fits"] and s["card_use"] <= data["target"]
    # Every card searched.
    cards = _rows(text, "card  ")
    assert len(cards) == len(data["cards"])
    for row, c in zip(cards, data["cards"], strict=True):
        assert row == [
            c["gpu"],
            c["kv_cache_dtype"],
            c["weights"],
            "yes" if c["fits"] else "no",
            format_bytes(c["kv_budget_bytes"]),
            f"{c['pool_tokens']:,}",
            f"{c['needed_tokens']:,}",
        ]


@pytest.mark.parametrize("target", ["0.92", "0.8"])
def test_a_card_that_fits_stays_under_the_target(target: str) -> None:
    data = json.loads(_out("plan", QWEN3_32B, "--workload", "6x32768,20x8192", "--target", target, "--json"))
    for card in data["cards"]:
        if card["fits"]:
            assert card["card_use"] <= float(target) + 1e-9, card
            assert card["pool_use"] <= 1


@pytest.mark.parametrize(
    "args",
    [
        (QWEN3_32B, "--gpu", "h100"),
        (
            str(CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json"),
            "--gpu",
            "H100-SXM-80GB",
            "--max-model-len",
            "8192",
        ),
        (str(CONFIGS / "Qwen--Qwen3-8B.json"), "--engine", "sglang", "--gpu", "h100"),
    ],
)
def test_predict_table_equals_the_json(args: tuple[str, ...]) -> None:
    # Labels are padded to one width plus two spaces; the first block is the table.
    table = _out("predict", *args).split("\n\n")[0]
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in table.splitlines())
    data = json.loads(_out("predict", *args, "--json"))
    assert rows["KV pool"].split()[0] == f"{data['kv_pool_tokens']:,}"
    assert rows["bytes per token"].startswith(f"{data['bytes_per_token']:,} B per GPU")
    kv = format_bytes(data["available_kv_bytes"])
    if data["available_kv_band_bytes"] is not None:
        kv += f" ± {format_bytes(data['available_kv_band_bytes'])} (modelled before launch)"
    assert rows["available KV"] == kv
    assert rows["max concurrency"].startswith(
        f"{data['max_concurrency']:.2f}x at {data['max_model_len']:,} tokens"
    )
    assert rows["fits max_model_len"].startswith("yes" if data["fits"] else "NO")
    if data["kv_pool_blocks"] is not None:
        assert rows["KV blocks"].startswith(f"{data['kv_pool_blocks']:,} x {data['block_size']} tokens")
    assert rows["weights"].startswith(format_bytes(data["weights_bytes"]))
