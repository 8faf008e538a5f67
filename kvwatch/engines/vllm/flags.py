"""vLLM's own command line (``vllm serve MODEL …``, EngineArgs in vllm/engine/arg_utils.py), by flag.

Only flags that move the KV pool are read; every other one is listed as ignored. Sizes read the way
vLLM's argparse reads them (``32k`` = 32,000, ``32K`` = 32,768; human_readable_int).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvwatch.core.errors import ConfigError
from kvwatch.engines.flags import Flag, fraction, human_int, json_object, positive_int, text
from kvwatch.engines.vllm.multimodal import limits_flag, max_pixels_flag
from kvwatch.engines.vllm.runner import runner_flag, task_flag

if TYPE_CHECKING:
    from kvwatch.capacity.deployment import DeploymentValue


def _kv_memory(value: str) -> int:
    # --kv-cache-memory (0.11+, CacheConfig.kv_cache_memory_bytes): the KV budget per GPU in bytes.
    return human_int(value)


FLAGS: tuple[Flag, ...] = (
    Flag(("--model",), "model"),
    Flag(("--tensor-parallel-size", "-tp"), "tp", positive_int),
    Flag(("--pipeline-parallel-size", "-pp"), "pp", positive_int),
    Flag(("--decode-context-parallel-size", "-dcp"), "dcp", positive_int),
    Flag(("--max-model-len",), "max_model_len", human_int),
    Flag(("--max-num-seqs",), "max_num_seqs", positive_int),
    Flag(("--max-num-batched-tokens",), "max_num_batched_tokens", human_int),
    Flag(("--gpu-memory-utilization",), "gpu_memory_utilization", fraction),
    Flag(("--enforce-eager",), "enforce_eager", switch=True, inverse=("--no-enforce-eager",)),
    Flag(
        ("--language-model-only",),
        "language_model_only",
        switch=True,
        inverse=("--no-language-model-only",),
    ),
    Flag(
        ("--enable-prefix-caching",),
        "enable_prefix_caching",
        switch=True,
        inverse=("--no-enable-prefix-caching",),
    ),
    Flag(("--quantization", "-q"), "quantization", text),
    Flag(("--dtype",), "dtype", text),
    Flag(("--kv-cache-dtype",), "kv_cache_dtype", text),
    Flag(("--block-size",), "block_size", positive_int),
    Flag(
        ("--disable-hybrid-kv-cache-manager",),
        "hybrid_kv_cache_manager",
        switch=True,
        constant=False,
        inverse=("--no-disable-hybrid-kv-cache-manager",),
    ),
    Flag(("--kv-cache-memory", "--kv-cache-memory-bytes"), "available_kv_bytes", _kv_memory),
    # --mm-processor-kwargs (ModelConfig.mm_processor_kwargs): its max_pixels sizes V0's dummy images.
    Flag(("--mm-processor-kwargs",), "image_max_pixels", max_pixels_flag),
    # --limit-mm-per-prompt (MultiModalConfig.limit_per_prompt): items a prompt may carry per
    # modality; all of a model's at 0 serve it as text (multimodal.text_only).
    Flag(("--limit-mm-per-prompt",), "mm_limits", limits_flag),
    # --runner (0.10+) and the --task it replaced (0.7-0.12): which runner the profile run is.
    Flag(("--runner",), "runner", runner_flag),
    Flag(("--task",), "runner", task_flag),
    # --skip-mm-profiling (0.10.2+ MultiModalConfig.skip_mm_profiling): the profile feeds no encoder.
    Flag(
        ("--skip-mm-profiling",),
        "skip_mm_profiling",
        switch=True,
        inverse=("--no-skip-mm-profiling",),
    ),
)


def fold_dotted(argv: Sequence[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser (0.19.0 utils/argparse_utils.py:302-355; 0.10+): every
    ``--key.sub[.sub] VALUE`` (or ``=VALUE``; ``key.sub+ a,b`` for a list) is taken out of the argv
    and merged into one JSON object given as ``--key`` after the rest, so it wins over a whole
    object typed earlier. A value that is not JSON stays a string."""
    out: list[str] = []
    folded: dict[str, dict[str, object]] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not (arg.startswith("-") and "." in arg):
            out.append(arg)
            continue
        name, eq, value = arg.partition("=")
        if eq and "." not in name:
            out.append(arg)  # the '.' was in the value ('--gpu-memory-utilization=0.9')
            continue
        if not eq:
            if i >= len(argv):
                out.append(arg)  # no value to fold: argparse reports it as it would
                continue
            value = argv[i]
            i += 1
        if name.endswith("+"):
            name, value = name[:-1], json.dumps(value.split(","))
        key, *keys = name.split(".")
        try:
            parsed: object = json.loads(value)
        except ValueError:
            parsed = value
        node = folded.setdefault(key, {})
        for sub in keys[:-1]:
            child = node.get(sub)
            if not isinstance(child, dict):
                child = {}
                node[sub] = child
            node = child
        if keys:
            node[keys[-1]] = parsed
    for key, obj in folded.items():
        out += [key, json.dumps(obj)]
    return out


def deployment_fields(
    utilization: float | None, static_fraction: float | None, block_size: int | None
) -> dict[str, DeploymentValue]:
    """kvwatch's own --gpu-memory-utilization and --block-size as Deployment fields."""
    if static_fraction is not None:
        raise ConfigError(
            "--mem-fraction-static is an SGLang setting; use --gpu-memory-utilization with vLLM"
        )
    return {"gpu_memory_utilization": utilization, "block_size": block_size}


def speculative_fields(value: str) -> dict[str, DeploymentValue]:
    """--speculative-config as vLLM takes it (a JSON object, SpeculativeConfig's fields): the
    method and num_speculative_tokens as Deployment fields; the other keys do not move the pool
    kvwatch sizes. 'model' alone (a draft checkpoint) leaves the method to vLLM's detection."""
    try:
        spec = json_object(value)
    except ValueError as exc:
        raise ConfigError(f"--speculative-config {exc}") from None
    method, tokens = spec.get("method"), spec.get("num_speculative_tokens")
    if method is not None and (not isinstance(method, str) or not method.strip()):
        raise ConfigError(f"--speculative-config method must be a name, got {method!r}")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise ConfigError(
            f"--speculative-config num_speculative_tokens must be a positive integer, got {tokens!r}"
        )
    if method is None and tokens is None and not spec.get("model"):
        raise ConfigError("--speculative-config names neither a method, a model nor num_speculative_tokens")
    return {
        "speculative_method": method.strip().lower() if method else None,
        "num_speculative_tokens": tokens,
    }
