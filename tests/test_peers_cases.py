"""bench/peers_cases.py runs every public folder: one added later is a set of its own, not dropped."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from bench import peers_cases

PUBLIC = Path(__file__).resolve().parent / "apriori" / "public"


def _case(i: str, **extra: object) -> dict[str, object]:
    return {
        "id": i,
        "model": "meta-llama/Llama-3.2-1B",
        "gpu": "H100-SXM-80GB",
        "tp": 1,
        "model_config": "meta-llama--Llama-3.2-1B.json",
        "outcome": "started",
        "settings": {},
        "observed": {"kv_cache_tokens": 1000},
        **extra,
    }


def test_every_public_folder_is_loaded(tmp_path: Path) -> None:
    """A third folder (here 'vllm-rocm', its cases naming their engine) is read beside vllm/ and
    sglang/; a case without an engine field takes its folder's name, as the two fixed ones did."""
    for folder, cases in (
        ("vllm", [_case("a"), _case("b")]),
        ("sglang", [_case("c")]),
        ("vllm-rocm", [_case("d", engine="vllm")]),
    ):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    (tmp_path / "configs").mkdir()  # no cases.json: not a set
    public = [c for c in peers_cases.load_all(tmp_path) if c.case_set != "main"]
    assert [(c.case_set, c.id, c.engine) for c in public] == [
        ("public-sglang", "c", "sglang"),
        ("public-vllm", "a", "vllm"),
        ("public-vllm", "b", "vllm"),
        ("public-vllm-rocm", "d", "vllm"),
    ]


def test_the_real_public_folders_are_all_loaded() -> None:
    """Every tests/apriori/public/*/cases.json case is a case of set public-FOLDER, none dropped."""
    want = {
        f"public-{p.parent.name}": len(json.loads(p.read_text(encoding="utf-8")))
        for p in PUBLIC.glob("*/cases.json")
    }
    assert {"public-vllm", "public-sglang"} <= set(want)
    got = Counter(c.case_set for c in peers_cases.load_all(PUBLIC))
    assert {s: got[s] for s in want} == want
    assert set(got) == {"main", *want}
