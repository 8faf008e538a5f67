"""vLLM's runner vocabulary (--runner, and the --task it replaced), shared by the flag table and the
log's args line; a leaf, so reading a log does not load the command-line table."""

from __future__ import annotations

# 0.10.2 config/__init__.py RunnerOption and _RUNNER_TASKS (0.11.0 config/model.py:61-82): the tasks
# that pick the pooling runner; 'draft' is a speculative drafter's own runner, not a server's.
_POOLING_TASKS = frozenset({"embedding", "embed", "classify", "score", "reward"})
_GENERATE_TASKS = frozenset({"generate", "transcription"})


def runner_flag(value: str) -> str | None:
    """--runner auto|generate|pooling: the runner, None for auto (the model's default)."""
    if value not in ("auto", "generate", "pooling"):
        raise ValueError(f"expected auto, generate or pooling, got {value!r}")
    return None if value == "auto" else value


def task_flag(value: str) -> str | None:
    """--task (0.7-0.12, deprecated in 0.11 for --runner/--convert): the runner it selects."""
    if value == "auto":
        return None
    if value in _POOLING_TASKS:
        return "pooling"
    if value in _GENERATE_TASKS:
        return "generate"
    raise ValueError(f"not a task vLLM takes: {value!r}")
