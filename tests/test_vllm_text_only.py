"""A multimodal checkpoint served as text by ``--limit-mm-per-prompt`` (engines/vllm/multimodal.py).

Every modality a class takes limited to 0: the profile runs no encoder (0.8.4
v1/core/encoder_cache_manager.py:123-130; 0.19.0 multimodal/registry.py:107-119), and from the
release each class reads the limits its towers are not built (0.10.2 qwen2_5_vl.py:930-931, 0.11.0
qwen3_vl.py:1129-1131, 0.19.0 interfaces.py _mark_tower_model). Real startup: zjpzhao's
Qwen3-VL-Embedding-2B on a T4 (vLLM 0.11.0, "'limit_mm_per_prompt': {'image': 0, 'video': 0}",
tests/apriori/public/vllm/cases.json).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench.accuracy_cases import deployment, load_cases
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import geometry_from_config, load_model
from kvwatch.capacity.model import ModelGeometry
from kvwatch.core.errors import ConfigError
from kvwatch.core.events import EngineSettings
from kvwatch.engines.flags import read_flags
from kvwatch.engines.vllm import calibration, memory, multimodal, weights
from kvwatch.engines.vllm import log as vllm_log
from kvwatch.engines.vllm.flags import FLAGS
from kvwatch.parsers.base import LineMeta
from kvwatch.parsers.prefix import strip_prefixes
from kvwatch.sources.pipeline import replay

ROOT = Path(__file__).parent
QWEN25_VL = ROOT / "apriori/public/configs/Qwen--Qwen2.5-VL-3B-Instruct.json"
QWEN25_VL_7B = ROOT / "apriori/public/configs/Qwen--Qwen2.5-VL-7B-Instruct.json"
GIB = 2**30


def _model(path: Path = QWEN25_VL) -> ModelGeometry:
    return load_model(path)


def _deployment(version: str = "0.19.0", **changes: object) -> Deployment:
    d = Deployment(engine="vllm", engine_version=version, gpu_memory_bytes=80 * GIB, max_model_len=32768)
    return replace(d, **changes)  # type: ignore[arg-type]


def parse_line(body: str) -> tuple[object, ...]:
    return vllm_log.parse(body, LineMeta())


def _terms(model: ModelGeometry, d: Deployment) -> tuple[int, int]:
    """First-stage weights and activation peak."""
    assert model.dims is not None
    seqs, tokens = memory.batch_limits(d, 32768)
    return (
        weights.weights_per_stage(model.dims, d, None)[0][0],
        memory.activation(model.dims, d, None, seqs, tokens)[0].bytes,
    )


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ('{"image": 0, "video": 0}', "image=0,video=0"),
        ('{"video": {"count": 0, "num_frames": 32}, "image": 0}', "image=0,video=0"),  # 0.11+ objects
        ("image=16,video=2", "image=16,video=2"),  # 0.8 nullable_kvs
        ('{"image": 2, "audio": 0}', "audio=0,image=2"),
    ],
)
def test_the_flag_reads_every_form_vllm_takes(value: str, kept: str) -> None:
    assert read_flags(["--limit-mm-per-prompt", value], FLAGS).fields == {"mm_limits": kept}


@pytest.mark.parametrize(
    "value", ['{"image": -1}', '{"image": "many"}', "[0]", "image", "{}", '{"Image!": 0}']
)
def test_a_limit_that_is_not_a_count_is_refused_naming_the_flag(value: str) -> None:
    with pytest.raises(ConfigError, match="--limit-mm-per-prompt"):
        read_flags(["--limit-mm-per-prompt", value], FLAGS)


def test_skip_mm_profiling_is_a_switch() -> None:
    assert read_flags(["--skip-mm-profiling"], FLAGS).fields == {"skip_mm_profiling": True}


def test_the_args_line_of_a_real_startup_gives_the_limits() -> None:
    """zjpzhao's non-default args line (0.11.0), verbatim from the case."""
    case = next(
        c for c in _cases() if c["id"].startswith("zjpzhao-qwen3vl-embedding-2b-t4-v0.11.0-cu118-2k-embed")
    )
    line = next(v for v in case["verbatim"] if "limit_mm_per_prompt" in v)
    body, _meta = strip_prefixes(line)
    events = [e for e in parse_line(body) if isinstance(e, EngineSettings)]
    assert [e.mm_limits for e in events] == ["image=0,video=0"]


@pytest.mark.parametrize(
    ("args", "kept", "profiling"),
    [
        (
            "'limit_mm_per_prompt': {'video': {'count': 1, 'num_frames': 8}, 'image': 3}",
            "image=3,video=1",
            None,
        ),
        ("'skip_mm_profiling': True, 'limit_mm_per_prompt': {}", None, True),
    ],
)
def test_the_args_dict_forms(args: str, kept: str | None, profiling: bool | None) -> None:
    events = parse_line("non-default args: {'model': 'Qwen/Qwen2.5-VL-3B-Instruct', " + args + "}")
    (settings,) = [e for e in events if isinstance(e, EngineSettings)]
    assert (settings.mm_limits, settings.skip_mm_profiling) == (kept, profiling)


def test_the_namespace_form_of_old_releases() -> None:
    line = "args: Namespace(model='Qwen/Qwen2-VL-7B-Instruct', limit_mm_per_prompt={'image': 0, 'video': 0}, tensor_parallel_size=1)"
    (settings,) = [e for e in parse_line(line) if isinstance(e, EngineSettings)]
    assert settings.mm_limits == "image=0,video=0"


def test_every_modality_at_zero_is_language_model_only() -> None:
    """0.19: no tower (its parameters off the weights) and no encoder term, as --language-model-only."""
    model = _model()
    assert model.dims is not None and model.dims.architecture == "Qwen2_5_VLForConditionalGeneration"
    full = _terms(model, _deployment())
    text = _terms(model, _deployment(mm_limits="image=0,video=0"))
    assert text == _terms(model, _deployment(language_model_only=True))
    assert full[0] - text[0] == int(model.dims.vision_params * 2)
    assert full[1] - text[1] == int(calibration.current().vision_encoder_gib * GIB)


def test_a_modality_left_open_keeps_tower_and_encoder() -> None:
    """Qwen2.5-VL takes video too: image alone at 0 leaves video at V1's 999."""
    model = _model()
    assert _terms(model, _deployment(mm_limits="image=0")) == _terms(model, _deployment())


def test_before_the_class_reads_the_limits_the_tower_still_loads() -> None:
    """0.9.2 builds Qwen2.5-VL's tower unconditionally (qwen2_5_vl.py:855) but runs no encoder."""
    model = _model()
    full = _terms(model, _deployment("0.9.2"))
    text = _terms(model, _deployment("0.9.2", mm_limits="image=0,video=0"))
    assert text[0] == full[0]
    assert full[1] - text[1] == int(calibration.current().vision_encoder_gib * GIB)


def test_a_class_kvwatch_has_not_listed_is_never_taken_for_text() -> None:
    """Without knowing which modalities a class takes, kvwatch keeps tower and encoder: the smaller pool."""
    raw = json.loads(QWEN25_VL.read_text(encoding="utf-8"))
    raw["architectures"] = ["SomeNewVLForConditionalGeneration"]
    model = geometry_from_config(raw)
    assert _terms(model, _deployment(mm_limits="image=0,video=0")) == _terms(model, _deployment())


def test_skip_mm_profiling_drops_the_encoder_and_keeps_the_tower() -> None:
    model = _model()
    full = _terms(model, _deployment())
    skip = _terms(model, _deployment(skip_mm_profiling=True))
    assert skip[0] == full[0] and full[1] - skip[1] == int(calibration.current().vision_encoder_gib * GIB)


def _v0(**changes: object) -> Deployment:
    """gpustack#1800's V0 deployment (0.8.4, VLLM_USE_V1=0) on the 7B's processor max_pixels."""
    d = Deployment(
        engine="vllm",
        engine_version="0.8.4",
        gpu_memory_bytes=24 * GIB,
        max_model_len=8192,
        v0_engine=True,
        image_max_pixels=12845056,
    )
    return replace(d, **changes)  # type: ignore[arg-type]


def test_v0_profiles_the_items_the_limits_allow() -> None:
    """V0's dummy data carries limit items of each modality (0.8.4 qwen2_vl.py:978-1000); the video
    shares the frames left beside the images (:934-948), and none at all is the text profile."""
    dims = _model(QWEN25_VL_7B).dims
    assert dims is not None and dims.vision_grid is not None
    one = memory.v0_multimodal(dims, _v0(), 256, 8192, 8192)
    two_images = memory.v0_multimodal(dims, _v0(mm_limits="image=2,video=0"), 256, 8192, 8192)
    assert one is not None and two_images is not None
    image, _video = multimodal.dummy_items(dims.vision_grid, 12845056, 8192)
    assert two_images.mm_tokens == 2 * image.tokens
    assert one.mm_tokens > image.tokens  # an image and a video by default
    assert memory.v0_multimodal(dims, _v0(mm_limits="image=0,video=0"), 256, 8192, 8192) is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (
            '{"image": 0, "video": 0}',
            "served as text (every modality it takes at 0): the profile runs no "
            "encoder; the towers are not loaded",
        ),
        (
            '{"image": 0}',
            "--limit-mm-per-prompt leaves video above 0: the towers load and the encoder is profiled",
        ),
    ],
)
def test_predict_says_what_the_limits_do(value: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    from kvwatch.cli import main

    argv = [
        "predict",
        str(QWEN25_VL),
        "--engine-version",
        "0.19.0",
        "--gpu",
        "h100",
        "--",
        "--limit-mm-per-prompt",
    ]
    assert main([*argv, value]) == 0
    assert f"  - {says}\n" in capsys.readouterr().out


def _cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(
        (ROOT / "apriori/public/vllm/cases.json").read_text(encoding="utf-8")
    )
    return cases


def test_the_t4_embedding_startups_are_judged_as_text() -> None:
    """Both of zjpzhao's startups give the limits; the bench passes them to the prediction."""
    cases = [c for c in load_cases() if c.id.startswith("zjpzhao-")]
    assert len(cases) == 2
    for case in cases:
        assert deployment(case).mm_limits == "image=0,video=0"


def test_an_excerpt_that_starts_at_the_args_line_keeps_its_settings(tmp_path: Path) -> None:
    """zjpzhao's excerpt opens with the API server's args and max-model-len lines, before any line
    naming vLLM: with the engine detected from content, those settings (0.8 utilisation, the limits)
    must still reach the instance, as they do with --engine vllm."""
    case = next(c for c in _cases() if c["id"] == "zjpzhao-qwen3vl-embedding-2b-t4-v0.11.0-cu118-2k-embed")
    log = tmp_path / "vllm.log"
    log.write_text("\n".join(case["verbatim"]) + "\n", encoding="utf-8")
    for engine in ("auto", "vllm"):
        (snap,) = replay([str(log)], engine=engine).fleet.snapshot()
        assert (snap.settings.gpu_memory_utilization, snap.settings.mm_limits) == (0.8, "image=0,video=0")


def test_a_damaged_limit_keeps_the_default_instead_of_failing() -> None:
    """A state file's settings are read back as text: a limit that is not MODALITY=COUNT is left
    out (the modality keeps vLLM's default), never an exception in the consumer thread."""
    model = _model()
    assert model.dims is not None
    d = _deployment(mm_limits="image=zero,video=0,=3,???")
    assert multimodal.limit(d, "image", v0=False) == 999 and multimodal.limit(d, "video", v0=False) == 0
    assert _terms(model, d) == _terms(model, _deployment())


@pytest.mark.parametrize(
    ("argv", "fields"),
    [
        (
            ["--limit-mm-per-prompt.image", "0", "--limit-mm-per-prompt.video=0"],
            {"mm_limits": "image=0,video=0"},
        ),
        (["--mm-processor-kwargs.max_pixels", "1003520"], {"image_max_pixels": 1003520}),
        # Folded after the rest, as vLLM does: the dotted key wins over a whole object typed first.
        (
            ["--limit-mm-per-prompt", '{"image": 2}', "--limit-mm-per-prompt.image", "0"],
            {"mm_limits": "image=0"},
        ),
        (["--gpu-memory-utilization=0.85"], {"gpu_memory_utilization": 0.85}),
    ],
)
def test_dotted_keys_fold_into_one_object_as_vllms_parser_does(
    argv: list[str], fields: dict[str, object]
) -> None:
    """0.19.0 utils/argparse_utils.py:302-355 (FlexibleArgumentParser)."""
    from kvwatch.engines import registry

    assert registry.get("vllm").flags.read(argv).fields == fields


def test_kvwatchs_own_flag_in_dotted_form_after_the_separator_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kvwatch.cli import main

    argv = ["predict", str(QWEN25_VL), "--gpu", "h100", "--", "--speculative-config.method", "mtp"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--speculative-config after '--'" in err and err.count("\n") == 1
