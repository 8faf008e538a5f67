"""SGLang's --language-model-only (0.5.18+): a multimodal checkpoint served as text.

Each figure is the release's own rule (releases.LM_ONLY_*; file:line there): from 0.5.18 the flag
drops the vision factor from the default mem_fraction_static and the Qwen3-VL line builds no vision
tower; only from 0.5.20 does the model config stop counting the model as multimodal (the 100 MiB
encoder-cache reservation and the prefill-graph rule follow).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kvwatch.analysis.predict import predict
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import load_model
from kvwatch.capacity.model import ModelGeometry
from kvwatch.capacity.weights import weight_bytes
from kvwatch.core.events import EngineSettings
from kvwatch.core.units import MiB
from kvwatch.engines.sglang import budget, weight_extras
from kvwatch.engines.sglang.settings import parse_server_args
from kvwatch.parsers.base import LineMeta

HERE = Path(__file__).parent
H100_MIB = 81559


def _model(path: str) -> ModelGeometry:
    return load_model(HERE / path)


QWEN3_VL = "apriori/public/configs/Qwen--Qwen3-VL-32B-Instruct.json"
QWEN25_VL = "apriori/public/configs/Qwen--Qwen2.5-VL-7B-Instruct.json"


def _sglang(version: str, **kw: object) -> Deployment:
    return Deployment(
        engine="sglang", engine_version=version, gpu_name="H100-SXM-80GB", gpu_memory_bytes=H100_MIB * MiB
    ).with_(**kw)  # type: ignore[arg-type]


def test_before_0_5_18_the_flag_changes_nothing_and_says_so() -> None:
    m = _model(QWEN3_VL)
    plain = predict(m, _sglang("0.5.17"))
    flagged = predict(m, _sglang("0.5.17", language_model_only=True))
    assert flagged.kv_pool_tokens == plain.kv_pool_tokens
    assert any("takes it from 0.5.18" in a for a in flagged.assumptions)


def test_qwen3_vl_served_as_text_loads_no_tower_and_drops_the_vision_factor() -> None:
    m = _model(QWEN3_VL)
    assert m.dims is not None and m.dims.vision_params > 0
    tower = weight_bytes(replace(m, params={}))[0]
    assert tower == m.dims.vision_params * m.dtype_bytes
    for version in ("0.5.19", "0.5.23"):
        plain = predict(m, _sglang(version))
        text = predict(m, _sglang(version, language_model_only=True))
        assert plain.weights_bytes is not None and text.weights_bytes is not None
        assert plain.weights_bytes - text.weights_bytes == tower
        # The fraction is the text model's: the vision factor (0.95 x ...) is not applied.
        factor = budget.vlm_factor(m)
        assert factor < 1.0
        frac = budget.default_mem_fraction_static(_sglang(version, language_model_only=True), m).value
        assert frac == round(frac, 3) == text.mem_fraction_static  # SGLang's rounded reserve, no factor
        if version == "0.5.19":
            assert plain.mem_fraction_static == frac * factor
        else:
            # Text-only to SGLang: the prefill graphs are on, and their term joins the reserve.
            assert plain.mem_fraction_static is not None and frac < plain.mem_fraction_static / factor
        assert text.kv_pool_tokens > plain.kv_pool_tokens
        assert any("no vision tower loaded" in a for a in text.assumptions)


def test_the_model_stays_multimodal_to_sglang_until_0_5_20() -> None:
    m = _model(QWEN3_VL)
    # 0.5.19 configs/model_config.py:356: is_lm_only reads the checkpoint's own flag only, so the
    # encoder-cache reservation (0.5.18+) stays; 0.5.20 :467-469 reads the server flag too.
    assert budget.multimodal_reservation(m, _sglang("0.5.19", language_model_only=True)) == 100 * MiB
    assert budget.multimodal_reservation(m, _sglang("0.5.20", language_model_only=True)) == 0
    assert budget.multimodal_reservation(m, _sglang("0.5.20")) == 100 * MiB
    # The prefill-graph term: off for a multimodal model, the text model's from 0.5.20.
    assert budget.piecewise_reserved(m, _sglang("0.5.19", language_model_only=True), 8192) == 0.0
    assert budget.piecewise_reserved(m, _sglang("0.5.20", language_model_only=True), 8192) > 0.0


def test_an_architecture_that_keeps_its_tower_keeps_its_weights() -> None:
    m = _model(QWEN25_VL)  # Qwen2_5_VLForConditionalGeneration does not read the flag (0.5.23)
    d = _sglang("0.5.23", language_model_only=True)
    assert weight_extras.tower_not_built(m, d) == 0
    plain, text = predict(m, _sglang("0.5.23")), predict(m, d)
    assert text.weights_bytes == plain.weights_bytes
    assert any("still loads its vision tower" in a for a in text.assumptions)
    # ... but the fraction still loses the vision factor, so the pool grows.
    assert text.kv_pool_tokens > plain.kv_pool_tokens


def test_a_text_model_is_unchanged() -> None:
    m = _model("model_configs/meta-llama--Meta-Llama-3.1-8B.json")
    plain = predict(m, _sglang("0.5.23"))
    text = predict(m, _sglang("0.5.23", language_model_only=True))
    assert text.kv_pool_tokens == plain.kv_pool_tokens


def test_the_server_args_line_carries_the_flag() -> None:
    meta = LineMeta()
    dict_repr = (
        "server_args={'model_path': 'Qwen/Qwen3-VL-32B-Instruct', 'language_model_only': True, 'tp_size': 1}"
    )
    (event,) = parse_server_args(dict_repr, meta)
    assert isinstance(event, EngineSettings) and event.language_model_only is True
    (event,) = parse_server_args("server_args=ServerArgs(model_path='x', language_model_only=False)", meta)
    assert isinstance(event, EngineSettings) and event.language_model_only is False
