"""vLLM's pooling runner (embedding, classification, reward): the profile run's last step is the
pooler, not the sampler (0.10.2 v1/worker/gpu_model_runner.py:3034, 0.19.0 :5787, 0.33.0 :6137).

Real startups: zjpzhao's Qwen3-VL-Embedding-2B on a T4 (vLLM 0.11.0, "'runner': 'pooling',
'convert': 'embed'", tests/apriori/public/vllm/cases.json).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.accuracy_cases import deployment, load_cases
from kvwatch.capacity.deployment import Deployment
from kvwatch.capacity.geometry import load_model
from kvwatch.core.errors import ConfigError
from kvwatch.core.events import EngineSettings
from kvwatch.engines.flags import read_flags
from kvwatch.engines.vllm import log as vllm_log
from kvwatch.engines.vllm import memory
from kvwatch.engines.vllm.flags import FLAGS
from kvwatch.parsers.base import LineMeta

LLAMA = Path(__file__).parent / "model_configs" / "meta-llama--Meta-Llama-3.1-8B.json"
GIB = 2**30


@pytest.mark.parametrize(
    ("argv", "runner"),
    [
        (["--runner", "pooling"], "pooling"),
        (["--runner", "generate"], "generate"),
        (["--runner", "auto"], None),
        (["--task", "embed"], "pooling"),
        (["--task", "reward"], "pooling"),
        (["--task", "generate"], "generate"),
    ],
)
def test_runner_and_task_flags(argv: list[str], runner: str | None) -> None:
    assert read_flags(argv, FLAGS).fields == {"runner": runner}


@pytest.mark.parametrize("argv", [["--runner", "draft"], ["--runner", "embed"], ["--task", "summarise"]])
def test_a_runner_vllm_does_not_serve_is_refused(argv: list[str]) -> None:
    with pytest.raises(ConfigError, match=argv[0]):
        read_flags(argv, FLAGS)


@pytest.mark.parametrize(
    ("args", "runner"),
    [
        ("'runner': 'pooling', 'convert': 'embed'", "pooling"),
        ("'task': 'embed'", "pooling"),
        ("'task': 'generate'", "generate"),
        ("'runner': 'auto'", None),
    ],
)
def test_the_args_line_names_the_runner(args: str, runner: str | None) -> None:
    events = vllm_log.parse("non-default args: {'model': 'm', " + args + "}", LineMeta())
    (settings,) = [e for e in events if isinstance(e, EngineSettings)]
    assert settings.runner == runner


def _peak(d: Deployment) -> memory.Term:
    dims = load_model(LLAMA).dims
    assert dims is not None
    seqs, tokens = memory.batch_limits(d, 4096)
    return memory.activation(dims, d, None, seqs, tokens)[-1]


def test_the_pooler_replaces_the_sampler_in_the_profile_peak() -> None:
    """Llama-3.1-8B, 0.19, 2048 tokens: the sampler (rows x 128,256 vocab) dominates a generator's
    peak; a pooling runner's last step holds the hidden states and their float32 pooling, below the
    forward, so its peak is the forward's."""
    gen = Deployment(
        engine="vllm",
        engine_version="0.19.0",
        gpu_memory_bytes=80 * GIB,
        max_model_len=4096,
        max_num_batched_tokens=2048,
    )
    pool = replace(gen, runner="pooling")
    assert _peak(gen).note == "sampler" and _peak(pool).note == "forward"
    assert _peak(pool).bytes < _peak(gen).bytes


def test_v0_keeps_its_own_profile() -> None:
    """V0's pooling model runner is not modelled: its peak stays the generator's (said, not guessed)."""
    v0 = Deployment(
        engine="vllm", engine_version="0.8.4", v0_engine=True, gpu_memory_bytes=80 * GIB, max_model_len=4096
    )
    assert _peak(replace(v0, runner="pooling")) == _peak(v0)


def test_the_t4_embedding_startups_run_the_pooling_runner() -> None:
    cases = [c for c in load_cases() if c.id.startswith("zjpzhao-")]
    assert len(cases) == 2 and all(deployment(c).runner == "pooling" for c in cases)
