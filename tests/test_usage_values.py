"""fold_columns (the state's merge of a block's usage samples) against checking them one by one."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from lanes import examples

from kvwatch.state.usage_values import BAD_VALUE_FACTS, fold_columns, refused_facts

FACTS = ("kv_usage_ratio", "running", "prompt_throughput", "swa_usage_ratio")
_VALUE = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.0, max_value=1.0),
    st.integers(min_value=-3, max_value=2**64),
    st.just("12"),
)


def _one_by_one(samples: list[dict[str, object]]) -> tuple[dict[str, object], dict[str, int]]:
    """What folding the samples in order does: each sample's refused facts are counted and dropped."""
    changed: dict[str, object] = {}
    refused: dict[str, int] = {}
    for sample in samples:
        facts = {k: v for k, v in sample.items() if v is not None}
        for fact in refused_facts(facts) or ():
            del facts[fact]
            refused[fact] = refused.get(fact, 0) + 1
        changed.update(facts)
    return changed, refused


def _same(a: object, b: object) -> bool:
    return (
        a is b
        or a == b
        or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    )


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.fixed_dictionaries({f: _VALUE for f in FACTS}), min_size=1, max_size=12))
def test_fold_columns_equals_one_by_one(samples: list[dict[str, object]]) -> None:
    columns = [tuple(s[f] for s in samples) for f in FACTS]
    changed, refused = fold_columns(FACTS, columns)
    want_changed, want_refused = _one_by_one(samples)
    assert refused == want_refused
    assert changed.keys() == want_changed.keys()
    assert all(_same(changed[k], want_changed[k]) for k in changed)


def test_fold_columns_keeps_the_last_accepted_value() -> None:
    changed, refused = fold_columns(
        ("kv_usage_ratio", "running"), [(0.5, 1.93, float("nan"), None), (3, None, -1, None)]
    )
    assert changed == {"kv_usage_ratio": 0.5, "running": 3}
    assert refused == {"kv_usage_ratio": 2, "running": 1}
    assert set(refused) <= set(BAD_VALUE_FACTS)


def test_fold_columns_refuses_an_int_too_large_for_a_float_beside_floats() -> None:
    # (sum() of the column overflows; one by one, the exact comparison refuses the int.)
    assert fold_columns(("kv_usage_ratio",), [(0.5, 10**400)]) == (
        {"kv_usage_ratio": 0.5},
        {"kv_usage_ratio": 1},
    )
