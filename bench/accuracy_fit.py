"""The fits behind kvwatch/engines/vllm/calibration.py, in closed form, on any subset of the cases.

Each coefficient is fitted from the cases that print the term it sets: a non-torch class is the
median of its cases' non-torch figures (TP >= 2 on 0.18+: least squares on TP); the CUDA-graph
rule is least squares on the 'Estimated CUDA graph memory' lines; each activation coefficient is
the median over its cases of the value that makes the modelled activation equal the logged one
(the model is linear in each, so two evaluations per case give it). A coefficient no case sets is
left at zero (its term is then unmodelled and the band's widening covers it), never at the value
fitted with the cases held out. ``fit`` on every case reproduces calibration.FITTED (a test holds
them equal); the leave-one-source-out report calls it without the source it holds out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from bench.accuracy_cases import Case, deployment
from kvwatch.analysis.predict import predict
from kvwatch.capacity import gpus
from kvwatch.capacity.model import ModelGeometry
from kvwatch.core.units import GiB
from kvwatch.core.versions import version_tuple
from kvwatch.engines.sglang import calibration as sglang_calibration
from kvwatch.engines.vllm import calibration, graph_profile, host_memory, memory, weights
from kvwatch.engines.vllm.calibration import Calibration

_FIELDS = ("forward_h", "sampler_sort_extra", "vision_encoder_gib", "small_tensors_gib")


def _model_len(case: Case, model: ModelGeometry) -> int:
    return int(case.settings.get("max_model_len") or model.max_position_embeddings or 4096)


def _activation(case: Case, model: ModelGeometry, cal: Calibration) -> float:
    """The modelled activation of the case's first stage (GiB), with ``cal``."""
    d = deployment(case)
    assert model.dims is not None
    seqs, tokens = memory.batch_limits(d, _model_len(case, model), model.dims)
    with calibration.using(cal):
        return memory.activation(model.dims, d, gpus.find(d.gpu_name), seqs, tokens)[0].bytes / GiB


def _implied(
    cases: Sequence[tuple[Case, ModelGeometry]], cal: Calibration, name: str, used: list[str]
) -> float | None:
    """The median value of one activation coefficient its cases imply (None: no case sets it)."""
    step = 1.0 if name in ("forward_h", "sampler_sort_extra") else 0.1
    values = []
    used.clear()
    for case, model in cases:
        here = getattr(cal, name)
        low = _activation(case, model, cal)
        high = _activation(case, model, replace(cal, **{name: here + step}))
        slope = (high - low) / step
        if slope > 1e-4:
            values.append(here + (case.observed["activation"] - low) / slope)
            used.append(case.id)
    return statistics.median(values) if values else None


# Each single-value non-torch class and the coarser class that stands in when no case measures it.
_NON_TORCH_FALLBACK: dict[str, str | None] = {
    "non_torch_v0_gib": "non_torch_tp1_old_gib",
    "non_torch_tp1_old_gib": "non_torch_tp1_gib",
    "non_torch_tp1_gib": None,
    "non_torch_pp_gib": "non_torch_tp1_gib",
    "non_torch_tp_old_gib": "non_torch_tp_gib",
}


def non_torch_class(case: Case) -> str:
    v = version_tuple(case.engine_version)
    new = v is None or v >= (0, 18)
    if case.tp >= 2 and not new:
        return "non_torch_tp_old_gib"
    if case.tp >= 2 and memory.fabric_non_torch(deployment(case)):
        return "non_torch_tp_gib"
    # A PCIe-only card at TP >= 2 on 0.18+ measures TP 1's class (memory.fabric_non_torch).
    if case.pp >= 2 and case.tp < 2:
        return "non_torch_pp_gib"
    if v is not None and v < (0, 8):
        return "non_torch_v0_gib"
    # TP 1's larger class only where the CUDA-graph profile is measured (memory.non_torch's rule).
    measured = new and graph_profile.graph_profile_measured(deployment(case))
    return "non_torch_tp1_gib" if measured else "non_torch_tp1_old_gib"


def _least_squares(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float] | None:
    """Normal equations for a handful of unknowns (None when singular)."""
    n = len(rows[0]) if rows else 0
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        for r in range(n):
            if r != col:
                k = a[r][col] / a[col][col]
                a[r] = [x - k * y for x, y in zip(a[r], a[col], strict=True)]
                b[r] -= k * b[col]
    return [b[i] / a[i][i] for i in range(n)]


def _graph_features(case: Case, model: ModelGeometry) -> list[float]:
    d = deployment(case)
    seqs, tokens = memory.batch_limits(d, _model_len(case, model), model.dims)
    card = gpus.find(d.gpu_name)
    n = memory.capture_sizes(seqs, tokens, d.engine_version, card.sm_major if card is not None else 9)
    layers = weights.stage_layers(model.num_layers, d.pp)[0]
    moe = 1.0 if model.dims is not None and model.dims.n_experts else 0.0
    nccl = layers * n / 51 if memory.nccl_in_graphs(d) else 0.0
    return [1.0, layers * math.sqrt(n / 51), moe, nccl]


def fit(cases: Sequence[Case], models: Callable[[Case], ModelGeometry]) -> Calibration:
    """The calibration these (vLLM) cases give."""
    return fit_with_cases(cases, models)[0]


def fit_with_cases(
    cases: Sequence[Case], models: Callable[[Case], ModelGeometry]
) -> tuple[Calibration, dict[str, list[str]]]:
    """The calibration these (vLLM) cases give, and the ids of the cases behind each coefficient."""
    used: dict[str, list[str]] = {}
    with_model = [(c, models(c)) for c in cases if c.engine == "vllm"]
    cal = calibration.FITTED
    # Non-torch, by class.
    by_class: dict[str, list[Case]] = {}
    for c, _ in with_model:
        # A card outside the catalogue (a vGPU profile, an unnamed card) measures its own driver, not
        # the engine's class: it does not set a class's figure.
        # A unified-memory card's figure holds host memory besides the class's (_unified_host).
        card = gpus.find(c.gpu_name)
        if (
            "non_torch" in c.observed
            and card is not None
            and not host_memory.counts_host_memory(deployment(c), card)
        ):
            by_class.setdefault(non_torch_class(c), []).append(c)
    changes: dict[str, float] = {}
    for name in _NON_TORCH_FALLBACK:
        # A class no case measures takes the next coarser class's cases (V0 -> 0.8-0.17 -> 0.18+).
        key: str | None = name
        while key is not None and not by_class.get(key):
            key = _NON_TORCH_FALLBACK[key]
        group = by_class.get(key, []) if key is not None else []
        changes[name] = statistics.median(c.observed["non_torch"] for c in group) if group else 0.0
        used[name] = [c.id for c in group]
    tp = by_class.get("non_torch_tp_gib", []) or by_class.get("non_torch_tp_old_gib", [])
    used["non_torch_tp_gib"] = used["non_torch_tp_slope_gib"] = [c.id for c in tp]
    line = _least_squares([[1.0, c.tp - 2.0] for c in tp], [c.observed["non_torch"] for c in tp])
    if line is not None and len({c.tp for c in tp}) >= 2:
        changes["non_torch_tp_gib"], changes["non_torch_tp_slope_gib"] = line
    else:
        changes["non_torch_tp_gib"] = statistics.median(c.observed["non_torch"] for c in tp) if tp else 0.0
        changes["non_torch_tp_slope_gib"] = 0.0
    # CUDA-graph estimate: the NCCL-in-graph term only where some case captures NCCL (else zero).
    graphed = [(c, m) for c, m in with_model if "cuda_graphs" in c.observed]
    names = ["graphs_base_gib", "graphs_per_layer_gib", "graphs_moe_gib", "graphs_nccl_gib"]
    rows = [_graph_features(c, m) for c, m in graphed]
    nccl_cases = [c.id for (c, _), r in zip(graphed, rows, strict=True) if r[3]]
    if not nccl_cases:
        rows, names = [r[:3] for r in rows], names[:3]
        changes["graphs_nccl_gib"] = 0.0
        used["graphs_nccl_gib"] = []
    coef = _least_squares(rows, [c.observed["cuda_graphs"] for c, _ in graphed])
    if coef is not None:
        changes.update(zip(names, coef, strict=True))
    for name in names:
        used[name] = (nccl_cases if name == "graphs_nccl_gib" else [c.id for c, _ in graphed]) if coef else []
    cal = replace(cal, **changes)
    # Activation coefficients, two passes (they share cases).
    act_cases = [(c, m) for c, m in with_model if "activation" in c.observed]
    for _ in range(2):
        for name in _FIELDS:
            used[name] = []
            value = _implied(act_cases, cal, name, used[name])
            cal = replace(cal, **{name: value if value is not None else 0.0})
    unified, used["non_torch_unified_gib"] = _unified_host(with_model, cal)
    return replace(cal, non_torch_unified_gib=unified), used


def _unified_host(cases: Sequence[tuple[Case, ModelGeometry]], cal: Calibration) -> tuple[float, list[str]]:
    """The host memory a unified-memory card's startup adds to the non-torch increase
    (kvwatch.engines.vllm.host_memory): the median over the started cases on such a card of their
    logged non-torch figure beyond the class's, or, where they print their weights and available KV
    but no non-torch figure (every such log today), of what the budget leaves unexplained once the
    logged weights stand in for the modelled ones. Zero where no case measures it."""
    values, ids = [], []
    for case, model in cases:
        d = deployment(case)
        o = case.observed
        if not (case.started and (("kv" in o and "weights" in o) or "non_torch" in o) and case.pp == 1):
            continue
        if not host_memory.counts_host_memory(d, gpus.find(d.gpu_name)):
            continue
        with calibration.using(replace(cal, non_torch_unified_gib=0.0)):
            # A logged non-torch figure says it directly; else the budget's unexplained rest.
            if "non_torch" in o:
                values.append(o["non_torch"] - memory.non_torch(d).bytes / GiB)
            else:
                p = predict(model, d.with_(weights_bytes=int(o["weights"] * GiB)))
                values.append(p.available_kv_bytes / GiB - o["kv"])
        ids.append(case.id)
    return (statistics.median(values) if values else 0.0), ids


def fit_sglang(cases: Sequence[Case]) -> tuple[sglang_calibration.Calibration, dict[str, list[str]]]:
    """SGLang's context before weights: the median of card total - the free memory before weights
    ('Load weight begin. avail mem', else 'Load weight end' avail + mem usage) over the cases that
    print it on a catalogued card, with or without a config.json at hand (it needs none), one rank
    or a PCIe-only card apart from TP >= 2 over a fabric (calibration.fabric_communication); a class
    no case prints takes the median of all (none at all: zero)."""
    used = [
        c
        for c in cases
        if c.engine == "sglang" and "pre_load" in c.observed and c.gpu_total_bytes and gpus.find(c.gpu_name)
    ]

    def median(group: list[Case]) -> float | None:
        values = [c.gpu_total_bytes / GiB - c.observed["pre_load"] for c in group if c.gpu_total_bytes]
        return float(f"{statistics.median(values):.4g}") if values else None

    fabric = [c for c in used if sglang_calibration.fabric_communication(c.tp or 1, c.gpu_name)]
    local = [c for c in used if c not in fabric]
    every = median(used) or 0.0
    fitted = sglang_calibration.Calibration(
        context_gib=median(local) or every, context_gib_fabric=median(fabric) or every
    )
    return fitted, {
        "context_gib": [c.id for c in local or used],
        "context_gib_fabric": [c.id for c in fabric or used],
    }


def rounded(cal: Calibration) -> Calibration:
    """The calibration as the table writes it (4 significant digits)."""
    return Calibration(**{k: float(f"{v:.4g}") for k, v in cal.__dict__.items()})
