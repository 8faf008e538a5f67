"""The architecture table (kvwatch/capacity/architectures.py): lookup and the rules it feeds.

The figures each row produces for a real checkpoint are in test_capacity.py (bytes per token) and
below (parameter counts against the published sizes).
"""

from __future__ import annotations

import pytest

from kvwatch.capacity.architectures import ARCHITECTURES, GENERIC, architecture, wrapper_text_model_type


@pytest.mark.parametrize(
    ("model_type", "row"),
    [
        ("qwen3", "qwen3"),
        ("qwen3_moe", "qwen3"),
        ("qwen3_next", "qwen3_next"),
        ("qwen3_5_moe", "qwen3_5"),
        ("qwen2_5_vl", "qwen2"),
        ("gemma3n_text", "gemma3"),
        ("gemma3_text", "gemma3_text"),
    ],
)
def test_the_longest_key_that_prefixes_the_model_type_wins(model_type: str, row: str) -> None:
    assert architecture(model_type) is ARCHITECTURES[row]


@pytest.mark.parametrize("model_type", ["llama", "mistral", "deepseek_v3", ""])
def test_a_model_type_without_a_row_gets_the_generic_rules(model_type: str) -> None:
    assert architecture(model_type) is GENERIC


def test_the_wrapper_rule_needs_the_exact_model_type() -> None:
    assert wrapper_text_model_type("gemma3") == "gemma3_text"
    assert wrapper_text_model_type("gemma3n") is None
    assert wrapper_text_model_type("llava") is None
