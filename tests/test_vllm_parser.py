"""vLLM body parser: one case per format and version, from the examples of the vLLM formats reference."""

from __future__ import annotations

from typing import Any

import pytest

from kvwatch.core.events import (
    EngineSettings,
    Event,
    MemoryBudget,
    PoolSized,
    Preemption,
    StartupFailure,
    UsageSample,
)
from kvwatch.core.units import GiB, MiB
from kvwatch.engines.vllm import log as vllm
from kvwatch.parsers.base import LineMeta, ParseError
from kvwatch.parsers.prefix import strip_prefixes

META = LineMeta()


def facts(events: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Events without the identity fields every event carries."""
    return [
        {
            k: v
            for k, v in e.model_dump(exclude_none=True).items()
            if k not in ("engine", "instance", "origin")
        }
        for e in events
    ]


def gib(x: str) -> int:
    from decimal import Decimal

    return int((Decimal(x) * GiB).to_integral_value())


CASES: list[tuple[str, str, list[dict[str, Any]]]] = [
    # --- pool -----------------------------------------------------------------------------------
    (
        "v0 0.4.3 gpu/cpu blocks",
        "# GPU blocks: 27153, # CPU blocks: 2048",
        [{"kind": "pool", "pool": "full", "blocks": 27153, "cpu_blocks": 2048}],
    ),
    (
        "v0 0.7 cuda blocks",
        "# CUDA blocks: 27153, # CPU blocks: 2048",
        [{"kind": "pool", "pool": "full", "blocks": 27153, "cpu_blocks": 2048}],
    ),
    (
        "v0 lower-case cuda blocks",
        "# cuda blocks: 0, # CPU blocks: 4681",
        [{"kind": "pool", "pool": "full", "blocks": 0, "cpu_blocks": 4681}],
    ),
    (
        "v0 tpu blocks",
        "# TPU blocks: 8000, # CPU blocks: 1000",
        [{"kind": "pool", "pool": "full", "blocks": 8000, "cpu_blocks": 1000}],
    ),
    (
        "paste without '# '",
        "GPU blocks: 1952, # CPU blocks: 2048",
        [{"kind": "pool", "pool": "full", "blocks": 1952, "cpu_blocks": 2048}],
    ),
    ("v1 0.6.6 gpu blocks only", "# GPU blocks: 27153", [{"kind": "pool", "pool": "full", "blocks": 27153}]),
    ("cpu executor pool", "# CPU blocks: 4096", [{"kind": "pool", "pool": "full", "blocks": 4096}]),
    (
        "v1 0.9.2 kv cache size",
        "GPU KV cache size: 434,448 tokens",
        [{"kind": "pool", "pool": "full", "tokens": 434448}],
    ),
    (
        "v0 0.6.6 max concurrency raw",
        "Maximum concurrency for 32768 tokens per request: 13.26x",
        [{"kind": "pool", "pool": "full", "max_concurrency": 13.26, "max_concurrency_tokens": 32768}],
    ),
    (
        "v1 0.9.2 max concurrency commas",
        "Maximum concurrency for 32,768 tokens per request: 13.26x",
        [{"kind": "pool", "pool": "full", "max_concurrency": 13.26, "max_concurrency_tokens": 32768}],
    ),
    (
        "v1 0.28 one line",
        "GPU KV cache size: 434,448 tokens, Maximum concurrency for 32,768 tokens per request: 13.26x",
        [
            {
                "kind": "pool",
                "pool": "full",
                "tokens": 434448,
                "max_concurrency": 13.26,
                "max_concurrency_tokens": 32768,
            }
        ],
    ),
    (
        "v1 0.30 xpu device word",
        "XPU KV cache size: 100,000 tokens, Maximum concurrency for 8,192 tokens per request: 12.21x",
        [
            {
                "kind": "pool",
                "pool": "full",
                "tokens": 100000,
                "max_concurrency": 12.21,
                "max_concurrency_tokens": 8192,
            }
        ],
    ),
    (
        "v1 0.33 gpu + host",
        "GPU + host KV cache size: 434,448 tokens, Maximum concurrency for 32,768 tokens per request: 13.26x",
        [
            {
                "kind": "pool",
                "pool": "full",
                "tokens": 434448,
                "max_concurrency": 13.26,
                "max_concurrency_tokens": 32768,
            }
        ],
    ),
    (
        "override",
        "Overriding num_gpu_blocks=27153 with num_gpu_blocks_override=512",
        [{"kind": "pool", "pool": "full", "blocks": 512}],
    ),
    (
        "0.18+ minimal profiling cache is not the pool",
        "Overriding num_gpu_blocks=0 with num_gpu_blocks_override=512",
        [],
    ),
    (
        "0.19 engine default max_num_batched_tokens",
        "Defaulting max_num_batched_tokens to 8192 for OPENAI_API_SERVER usage context.",
        [{"kind": "settings", "starts_engine": False, "max_num_batched_tokens": 8192}],
    ),
    (
        "0.19 engine default max_num_seqs",
        "Defaulting max_num_seqs to 1024 for OPENAI_API_SERVER usage context.",
        [{"kind": "settings", "starts_engine": False, "max_num_seqs": 1024}],
    ),
    (
        "0.19 worker init memory snapshot",
        "worker init memory snapshot: torch_peak=0.0GiB, free_memory=78.68GiB, total_memory=79.19GiB, "
        "cuda_memory=0.51GiB, torch_memory=0.0GiB, non_torch_memory=0.51GiB, timestamp=1776870744.2147915, "
        "auto_measure=True",
        [{"kind": "memory", "total_bytes": 85029615043}],
    ),
    (
        "cache_config_info engine index",
        "Engine 001: vllm cache_config_info with initialization after num_gpu_blocks is: 27153",
        [{"kind": "pool", "pool": "full", "blocks": 27153}],
    ),
    # --- memory budget --------------------------------------------------------------------------
    (
        # llm-d's 0.19 DEBUG sweep (../shared/apriori/logs, meta-llama kvfp8 on H100), verbatim.
        "0.19-0.26 startup usage (DEBUG)",
        "Free memory on device (78.68/79.19 GiB) on startup. Desired GPU memory utilization is (0.95, 75.23 GiB). "
        "Actual usage is 14.99 GiB for weight, 1.89 GiB for peak activation, 0.25 GiB for non-torch memory, "
        "and 0.91 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with "
        "`--kv-cache-memory=61260126208` (57.05 GiB) to fit into requested memory, or "
        "`--kv-cache-memory=64961173504` (60.5 GiB) to fully utilize gpu memory. Current kv cache memory in "
        "use is 58.11 GiB.",
        [
            {
                "kind": "memory",
                "total_bytes": gib("79.19"),
                "gpu_memory_utilization": 0.95,
                "requested_bytes": gib("75.23"),
            }
        ],
    ),
    (
        # Tegdam/pickr_ai's 0.29.0 startup on an RTX 4050 laptop (tests/apriori/public/vllm-newest), verbatim.
        "0.27+ startup usage (INFO)",
        "Free memory on device (4.95/6.0 GiB) on startup. Desired GPU memory utilization is (0.79, 4.74 GiB). "
        "Actual usage is 2.1 GiB for consumed memory (weights + non-torch), 0.22 GiB for peak activation, and "
        "0.07 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory="
        "2358995846` (2.2 GiB) to fit into requested memory, or `--kv-cache-memory=2590736384` (2.41 GiB) to "
        "fully utilize gpu memory. Current kv cache memory in use is 2.41 GiB.",
        [
            {
                "kind": "memory",
                "total_bytes": gib("6.0"),
                "gpu_memory_utilization": 0.79,
                "requested_bytes": gib("4.74"),
            }
        ],
    ),
    (
        "0.3-0.7 loading model weights GB",
        "Loading model weights took 14.9888 GB",
        [{"kind": "memory", "weights_bytes": gib("14.9888")}],
    ),
    (
        "0.8.0 model loading GB",
        "Model loading took 7.1206 GB and 4.530159 seconds",
        [{"kind": "memory", "weights_bytes": gib("7.1206")}],
    ),
    (
        "0.8.5 model loading GiB",
        "Model loading took 7.1206 GiB and 4.530159 seconds",
        [{"kind": "memory", "weights_bytes": gib("7.1206")}],
    ),
    (
        "0.14 model loading GiB memory",
        "Model loading took 7.5 GiB memory and 12.345678 seconds",
        [{"kind": "memory", "weights_bytes": gib("7.5")}],
    ),
    (
        "available kv 2 decimals",
        "Available KV cache memory: 53.27 GiB",
        [{"kind": "memory", "available_kv_bytes": gib("53.27")}],
    ),
    (
        "available kv 1 decimal",
        "Available KV cache memory: 53.3 GiB",
        [{"kind": "memory", "available_kv_bytes": gib("53.3")}],
    ),
    (
        "available kv negative",
        "Available KV cache memory: -1.5 GiB",
        [
            {"kind": "memory", "available_kv_bytes": -gib("1.5")},
            {"kind": "startup_failure", "reason": "negative_kv_budget", "available_kv_bytes": -gib("1.5")},
        ],
    ),
    (
        "0.6.4 memory profiling results",
        "Memory profiling results: total_gpu_memory=23.58GiB initial_memory_usage=15.34GiB "
        "peak_torch_memory=17.06GiB memory_usage_post_profile=15.35GiB non_torch_memory=0.35GiB "
        "kv_cache_size=3.81GiB gpu_memory_utilization=0.90",
        [
            {
                "kind": "memory",
                "total_bytes": gib("23.58"),
                "non_torch_bytes": gib("0.35"),
                "available_kv_bytes": gib("3.81"),
                "gpu_memory_utilization": 0.9,
            }
        ],
    ),
    ("0.6.5 breakdown line 1", "Memory profiling takes 4.32 seconds", []),
    (
        "0.6.5 breakdown line 2",
        "the current vLLM instance can use total_gpu_memory (79.11GiB) x gpu_memory_utilization (0.90) = 71.20GiB",
        [
            {
                "kind": "memory",
                "total_bytes": gib("79.11"),
                "gpu_memory_utilization": 0.9,
                "requested_bytes": gib("71.20"),
            }
        ],
    ),
    (
        "0.6.5 breakdown line 3",
        "model weights take 14.99GiB; non_torch_memory takes 0.20GiB; PyTorch activation peak memory takes "
        "1.92GiB; the rest of the memory reserved for KV Cache is 54.09GiB.",
        [
            {
                "kind": "memory",
                "weights_bytes": gib("14.99"),
                "non_torch_bytes": gib("0.20"),
                "activation_bytes": gib("1.92"),
                "available_kv_bytes": gib("54.09"),
            }
        ],
    ),
    (
        "breakdown negative budget",
        "model weights take 5.20GiB; non_torch_memory takes 0.03GiB; PyTorch activation peak memory takes "
        "1.42GiB; the rest of the memory reserved for KV Cache is -1.05GiB.",
        [
            {
                "kind": "memory",
                "weights_bytes": gib("5.20"),
                "non_torch_bytes": gib("0.03"),
                "activation_bytes": gib("1.42"),
                "available_kv_bytes": -gib("1.05"),
            },
            {"kind": "startup_failure", "reason": "negative_kv_budget", "available_kv_bytes": -gib("1.05")},
        ],
    ),
    (
        "debug profile repr",
        "Memory profiling takes 3.10 seconds. Total non KV cache memory: 16.40GiB; torch peak memory increase: "
        "1.41GiB; non-torch forward increase memory: 0.03GiB; weights memory: 14.96GiB.",
        [
            {
                "kind": "memory",
                "activation_bytes": gib("1.41"),
                "non_torch_bytes": gib("0.03"),
                "weights_bytes": gib("14.96"),
            }
        ],
    ),
    (
        "cuda graphs",
        "Graph capturing finished in 12 secs, took 0.62 GiB",
        [{"kind": "memory", "cuda_graph_bytes": gib("0.62")}],
    ),
    ("0.4 graphs without size", "Graph capturing finished in 5 secs.", []),
    (
        "cuda graph estimate",
        "Estimated CUDA graph memory: 0.85 GiB total",
        [{"kind": "memory", "cuda_graph_bytes": gib("0.85")}],
    ),
    (
        "cuda graph estimate MiB",
        "Estimated CUDA graph memory: 512.00 MiB total",
        [{"kind": "memory", "cuda_graph_bytes": 512 * MiB}],
    ),
    # --- usage ----------------------------------------------------------------------------------
    (
        "v0 0.3 stats no period",
        "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 44.9 tokens/s, Running: 2 reqs, "
        "Swapped: 0 reqs, Pending: 3 reqs, GPU KV cache usage: 82.1%, CPU KV cache usage: 0.0%",
        [
            {
                "kind": "usage",
                "kv_usage_ratio": 0.821,
                "running": 2,
                "waiting": 3,
                "swapped": 0,
                "cpu_kv_usage_ratio": 0.0,
                "prompt_throughput": 0.0,
                "generation_throughput": 44.9,
            }
        ],
    ),
    (
        "v0 0.4.3 stats with period",
        "Avg prompt throughput: 1234.5 tokens/s, Avg generation throughput: 567.8 tokens/s, Running: 32 reqs, "
        "Swapped: 0 reqs, Pending: 5 reqs, GPU KV cache usage: 87.3%, CPU KV cache usage: 0.0%.",
        [
            {
                "kind": "usage",
                "kv_usage_ratio": 0.873,
                "running": 32,
                "waiting": 5,
                "swapped": 0,
                "cpu_kv_usage_ratio": 0.0,
                "prompt_throughput": 1234.5,
                "generation_throughput": 567.8,
            }
        ],
    ),
    (
        "v0 prefix cache hit rate line",
        "Prefix cache hit rate: GPU: 12.50%, CPU: 0.00%",
        [{"kind": "usage", "prefix_cache_hit_ratio": 0.125}],
    ),
    (
        "v1 0.7.3 stats",
        "Avg prompt throughput: 1520.3 tokens/s, Avg generation throughput: 802.1 tokens/s, Running: 24 reqs, "
        "Waiting: 0 reqs, GPU KV cache usage: 41.2%, Prefix cache hit rate: 12.5%",
        [
            {
                "kind": "usage",
                "kv_usage_ratio": 0.412,
                "running": 24,
                "waiting": 0,
                "prefix_cache_hit_ratio": 0.125,
                "prompt_throughput": 1520.3,
                "generation_throughput": 802.1,
            }
        ],
    ),
    (
        "v1 0.14 preemptions per interval",
        "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 2101.4 tokens/s, "
        "Running: 180 reqs, Waiting: 37 reqs, Preemptions: 4, GPU KV cache usage: 99.1%, "
        "Prefix cache hit rate: 0.0%, External prefix cache hit rate: 35.0%",
        [
            {
                "kind": "usage",
                "kv_usage_ratio": 0.991,
                "running": 180,
                "waiting": 37,
                "prefix_cache_hit_ratio": 0.0,
                "prompt_throughput": 0.0,
                "generation_throughput": 2101.4,
            },
            {"kind": "preemption", "mechanism": "preempt", "count": 4},
        ],
    ),
    (
        "v1 0.33 kv fetch with inner commas and mm cache",
        "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
        "Running: 3 reqs, Waiting: 4 reqs, Deferred: 1 reqs, KV fetch: 1 waiting to start, 2 in progress, "
        "0 completed waiting, CPU KV cache usage: 5.5%, MM cache hit rate: 50.0%",
        [
            {
                "kind": "usage",
                "kv_usage_ratio": 0.055,
                "running": 3,
                "waiting": 4,
                "prompt_throughput": 1.0,
                "generation_throughput": 2.0,
            }
        ],
    ),
    # --- preemption -----------------------------------------------------------------------------
    (
        "v0 preemption warning",
        "Sequence group cmpl-3f2a9c0e1b5d4e8f-0 is preempted by PreemptionMode.RECOMPUTE mode because there is "
        "not enough KV cache space. This can affect the end-to-end performance. Increase gpu_memory_utilization "
        "or tensor_parallel_size to provide more KV cache memory. total_num_cumulative_preemption=101",
        [{"kind": "preemption", "mechanism": "preempt", "total": 101}],
    ),
    # --- startup failures -----------------------------------------------------------------------
    (
        "v0 max seq len",
        "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be "
        "stored in KV cache (54048). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.",
        [
            {
                "kind": "startup_failure",
                "reason": "max_model_len_too_large",
                "max_model_len": 131072,
                "max_tokens_in_cache": 54048,
            },
            {"kind": "pool", "pool": "full", "tokens": 54048},
        ],
    ),
    (
        "v1 0.7 GB wording",
        "To serve at least one request with the models's max seq len (131072), (16.00 GB KV cache is needed, "
        "which is larger than the available KV cache memory (9.47 GB). Try increasing `gpu_memory_utilization` "
        "or decreasing `max_model_len` when initializing the engine.",
        [
            {
                "kind": "startup_failure",
                "reason": "max_model_len_too_large",
                "max_model_len": 131072,
                "needed_kv_bytes": gib("16.00"),
                "available_kv_bytes": gib("9.47"),
            }
        ],
    ),
    (
        "v1 0.8.5 bug without the estimate",
        "To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (9.47 GiB). Based on the available memory,  Try "
        "increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
        [
            {
                "kind": "startup_failure",
                "reason": "max_model_len_too_large",
                "max_model_len": 131072,
                "needed_kv_bytes": gib("16.00"),
                "available_kv_bytes": gib("9.47"),
            }
        ],
    ),
    (
        "v1 0.11 with estimate",
        "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache "
        "is needed, which is larger than the available KV cache memory (9.47 GiB). Based on the available "
        "memory, the estimated maximum model length is 77536. Try increasing `gpu_memory_utilization` or "
        "decreasing `max_model_len` when initializing the engine.",
        [
            {
                "kind": "startup_failure",
                "reason": "max_model_len_too_large",
                "max_model_len": 131072,
                "needed_kv_bytes": gib("16.00"),
                "available_kv_bytes": gib("9.47"),
                "estimated_max_model_len": 77536,
            }
        ],
    ),
    (
        "v1 0.33 model's and cpu backend wording",
        "ValueError: To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (9.47 GiB). Based on the available memory, "
        "the estimated maximum model length is 77536. Try increasing `gpu_memory_utilization` (which also "
        "controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. "
        "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
        [
            {
                "kind": "startup_failure",
                "reason": "max_model_len_too_large",
                "max_model_len": 131072,
                "needed_kv_bytes": gib("16.0"),
                "available_kv_bytes": gib("9.47"),
                "estimated_max_model_len": 77536,
            }
        ],
    ),
    (
        "no available memory",
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.",
        [{"kind": "startup_failure", "reason": "no_memory_for_cache"}],
    ),
    (
        "no available memory 0.33",
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the "
        "engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). See "
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.",
        [{"kind": "startup_failure", "reason": "no_memory_for_cache"}],
    ),
    ("source line of the raise is not the error", '    "No available memory for the cache blocks. "', []),
    # --- settings -------------------------------------------------------------------------------
    (
        "api server version",
        "vLLM API server version 0.11.0",
        [{"kind": "settings", "starts_engine": True, "version": "0.11.0"}],
    ),
    (
        "server version without logo",
        "vLLM server version 0.20.2, serving model Qwen/Qwen2.5-7B-Instruct",
        [
            {
                "kind": "settings",
                "starts_engine": True,
                "version": "0.20.2",
                "model": "Qwen/Qwen2.5-7B-Instruct",
            }
        ],
    ),
    (
        "logo version",
        " ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.20.2",
        [{"kind": "settings", "starts_engine": True, "version": "0.20.2"}],
    ),
    (
        "logo model",
        "  █▄█▀ █     █     █     █  model   Qwen/Qwen2.5-7B-Instruct",
        [{"kind": "settings", "starts_engine": False, "model": "Qwen/Qwen2.5-7B-Instruct"}],
    ),
    (
        "non-default args",
        "non-default args: {'model_tag': 'Qwen/Qwen2.5-7B-Instruct', 'model': 'Qwen/Qwen2.5-7B-Instruct', "
        "'gpu_memory_utilization': 0.95, 'max_model_len': 8192, 'block_size': 32, 'kv_cache_dtype': 'fp8', "
        "'tensor_parallel_size': 2, 'enable_prefix_caching': False, 'language_model_only': True, "
        "'served_model_name': ['qwen']}",
        [
            {
                "kind": "settings",
                "starts_engine": False,
                "model": "Qwen/Qwen2.5-7B-Instruct",
                "served_model_name": "qwen",
                "tensor_parallel_size": 2,
                "kv_cache_dtype": "fp8",
                "block_size": 32,
                "max_model_len": 8192,
                "gpu_memory_utilization": 0.95,
                "enable_prefix_caching": False,
                "language_model_only": True,
            }
        ],
    ),
    (
        "0.4-0.8 args namespace",
        "args: Namespace(host=None, port=8000, model='meta-llama/Llama-2-7b-hf', tensor_parallel_size=2, "
        "block_size=16, gpu_memory_utilization=0.9, max_model_len=None, kv_cache_dtype='auto', "
        "enforce_eager=False, max_num_seqs=256)",
        [
            {
                "kind": "settings",
                "starts_engine": False,
                "model": "meta-llama/Llama-2-7b-hf",
                "tensor_parallel_size": 2,
                "kv_cache_dtype": "auto",
                "block_size": 16,
                "max_num_seqs": 256,
                "gpu_memory_utilization": 0.9,
                "enforce_eager": False,
            }
        ],
    ),
    (
        "v1 0.9.2 config line",
        "Initializing a V1 LLM engine (v0.9.2) with config: model='Qwen/Qwen2.5-7B-Instruct', "
        "speculative_config=None, tokenizer='Qwen/Qwen2.5-7B-Instruct', skip_tokenizer_init=False, "
        "tokenizer_mode=auto, revision=None, override_neuron_config={}, tokenizer_revision=None, "
        "trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=32768, download_dir=None, "
        "load_format=LoadFormat.AUTO, tensor_parallel_size=1, pipeline_parallel_size=1, "
        "disable_custom_all_reduce=False, quantization=None, enforce_eager=False, kv_cache_dtype=auto,  "
        "device_config=cuda, decoding_config=DecodingConfig(backend='auto'), seed=0, "
        "served_model_name=Qwen/Qwen2.5-7B-Instruct, enable_prefix_caching=True, chunked_prefill_enabled=True",
        [
            {
                "kind": "settings",
                "starts_engine": True,
                "version": "0.9.2",
                "model": "Qwen/Qwen2.5-7B-Instruct",
                "served_model_name": "Qwen/Qwen2.5-7B-Instruct",
                "tensor_parallel_size": 1,
                "pipeline_parallel_size": 1,
                "dtype": "bfloat16",
                "kv_cache_dtype": "auto",
                "max_model_len": 32768,
                "enable_prefix_caching": True,
                "enforce_eager": False,
                "engine_generation": "v1",
            }
        ],
    ),
    (
        "v0 0.4.3 config line",
        "Initializing an LLM engine (v0.4.3) with config: model='meta-llama/Llama-2-7b-hf', "
        "speculative_config=None, tokenizer='meta-llama/Llama-2-7b-hf', dtype=torch.float16, max_seq_len=4096, "
        "tensor_parallel_size=4, quantization=None, enforce_eager=False, kv_cache_dtype=fp8, seed=0)",
        [
            {
                "kind": "settings",
                "starts_engine": True,
                "version": "0.4.3",
                "model": "meta-llama/Llama-2-7b-hf",
                "tensor_parallel_size": 4,
                "dtype": "float16",
                "kv_cache_dtype": "fp8",
                "max_model_len": 4096,
                "enforce_eager": False,
            }
        ],
    ),
    (
        "speculative config's nested model does not win",
        "Initializing a V1 LLM engine (v0.20.2) with config: model='main/model', "
        "speculative_config=SpeculativeConfig(method='mtp', model='draft/model', num_spec_tokens=3), "
        "max_seq_len=262144",
        [
            {
                "kind": "settings",
                "starts_engine": True,
                "version": "0.20.2",
                "model": "main/model",
                "max_model_len": 262144,
                "engine_generation": "v1",
            }
        ],
    ),
    (
        # souspilot/DiscoverPhysicsWIP logs/vllm.log @ff4df16 (0.27.1 on an A100; no 'Chunked prefill'
        # line in the log), cut to the fields that matter: the compile ranges' bound is the budget.
        "0.27.1 config line's compile ranges give max_num_batched_tokens",
        "Initializing a V1 LLM engine (v0.27.1) with config: model='./qwen36_27B', max_seq_len=65536, "
        "tensor_parallel_size=2, compilation_config={'mode': <CompilationMode.VLLM_COMPILE: 3>, "
        "'compile_sizes': [], 'compile_ranges_endpoints': [2048], 'inductor_compile_config': "
        "{'enable_auto_functionalized_v2': False}, 'max_cudagraph_capture_size': 512}",
        [
            {
                "kind": "settings",
                "starts_engine": True,
                "version": "0.27.1",
                "model": "./qwen36_27B",
                "tensor_parallel_size": 2,
                "max_model_len": 65536,
                "max_num_batched_tokens": 2048,
                "engine_generation": "v1",
            }
        ],
    ),
    (
        # An allreduce-rms fusion endpoint sits below the bound (0.27.1 config/vllm.py:1977-1978).
        "compile ranges with a fusion endpoint: the largest is the budget",
        "Initializing a V1 LLM engine (v0.27.1) with config: model='m', compilation_config={"
        "'compile_ranges_endpoints': [1024, 8192]}",
        [
            {
                "kind": "settings",
                "starts_engine": True,
                "version": "0.27.1",
                "model": "m",
                "max_num_batched_tokens": 8192,
                "engine_generation": "v1",
            }
        ],
    ),
    (
        "using max model len",
        "Using max model len 262144",
        [{"kind": "settings", "starts_engine": False, "max_model_len": 262144}],
    ),
    (
        "chunked prefill budget",
        "Chunked prefill is enabled with max_num_batched_tokens=2048.",
        [{"kind": "settings", "starts_engine": False, "max_num_batched_tokens": 2048}],
    ),
    (
        "forced mla block size",
        "Forcing kv cache block size to 64 for FlashMLA backend.",
        [{"kind": "settings", "starts_engine": False, "block_size": 64}],
    ),
    (
        "cuda graph profiling names the utilisation",
        "CUDA graph memory profiling is enabled (default since v0.21.0). The current "
        "--gpu-memory-utilization=0.9200 is equivalent to --gpu-memory-utilization=0.9047 without CUDA graph "
        "memory profiling. To maintain the same effective KV cache size as before, increase "
        "--gpu-memory-utilization to 0.9353. To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.",
        [{"kind": "settings", "starts_engine": False, "gpu_memory_utilization": 0.92}],
    ),
    (
        "debug requested memory 0.9",
        "Initial free memory: 78.50 GiB, free memory: 60.12 GiB, requested GPU memory: 71.20 GiB",
        [{"kind": "memory", "requested_bytes": gib("71.20")}],
    ),
    (
        "debug requested memory 0.14",
        "Initial free memory: 78.5 GiB; Requested memory: 0.900000 (util), 71.2 GiB",
        [{"kind": "memory", "gpu_memory_utilization": 0.9, "requested_bytes": gib("71.2")}],
    ),
    (
        "0.33 auto-fit reduced",
        "Auto-fit max_model_len: reduced from 131072 to 77536 to fit in available KV cache memory (9.47 GiB)",
        [{"kind": "settings", "starts_engine": False, "max_model_len": 77536}],
    ),
    (
        "0.33 auto-fit full",
        "Auto-fit max_model_len: full model context length 32768 fits in available KV cache memory (9.47 GiB)",
        [{"kind": "settings", "starts_engine": False, "max_model_len": 32768}],
    ),
    (
        "headless launcher version",
        "Launching vLLM (v0.9.2) headless multiproc executor, with head node address tcp://10.0.0.1:1234 for "
        "torch.distributed process group.",
        [{"kind": "settings", "starts_engine": True, "version": "0.9.2"}],
    ),
    (
        "batch runner version",
        "vLLM batch processing API version 0.6.0",
        [{"kind": "settings", "starts_engine": True, "version": "0.6.0"}],
    ),
    (
        "0.3.3 config line without version",
        "Initializing an LLM engine with config: model='facebook/opt-125m', tokenizer='facebook/opt-125m', "
        "tokenizer_mode=auto, revision=None, trust_remote_code=False, dtype=torch.float16, max_seq_len=2048, "
        "download_dir=None, load_format=auto, tensor_parallel_size=1, quantization=None, enforce_eager=False, "
        "kv_cache_dtype=auto, seed=0)",
        [
            {
                "kind": "settings",
                "starts_engine": True,
                "model": "facebook/opt-125m",
                "tensor_parallel_size": 1,
                "dtype": "float16",
                "kv_cache_dtype": "auto",
                "max_model_len": 2048,
                "enforce_eager": False,
            }
        ],
    ),
    # hybrid KV groups' padding (0.11.0 Gemma-3-4B on an A100, tests/log_samples/vllm/021; 0.25.1
    # Qwen3.6-35B-A3B, tests/apriori/public/vllm/cases.json)
    (
        "0.11 padding layers",
        "Add 1 padding layers, may waste at most 3.45% KV cache memory",
        [{"kind": "pool", "pool": "full", "padding_layers": 1, "padding_waste_ratio": 0.0345}],
    ),
    (
        "0.25 padding layers",
        "Add 3 padding layers, may waste at most 10.00% KV cache memory",
        [{"kind": "pool", "pool": "full", "padding_layers": 3, "padding_waste_ratio": 0.1}],
    ),
    # the sampler without FlashInfer (0.8.0-0.11.0 installed without the flashinfer extra; the
    # energyllm, elloraa, demo_env_l4, kolyangg and daisuketakai cases of
    # tests/apriori/public/vllm/cases.json)
    (
        "0.11 flashinfer not available",
        "FlashInfer is not available. Falling back to the PyTorch-native implementation of top-p & "
        "top-k sampling. For the best performance, please install FlashInfer.",
        [{"kind": "settings", "starts_engine": False, "flashinfer_sampler": False}],
    ),
    # installed but VLLM_USE_FLASHINFER_SAMPLER=0 (a public issue's paste, at
    # [topk_topp_sampler.py:52]: 0.9.2's line), and 0.8.x with FlashInfer >= 0.2.3 (public logs
    # at [topk_topp_sampler.py:44]: 0.8.5's); each also the words of vLLM's source there.
    (
        "0.9 flashinfer available but not enabled",
        "FlashInfer is available, but it is not enabled. Falling back to the PyTorch-native implementation "
        "of top-p & top-k sampling. For the best performance, please set VLLM_USE_FLASHINFER_SAMPLER=1.",
        [{"kind": "settings", "starts_engine": False, "flashinfer_sampler": False}],
    ),
    (
        "0.8 flashinfer >= 0.2.3 disabled",
        "Currently, FlashInfer top-p & top-k sampling sampler is disabled because FlashInfer>=v0.2.3 is not "
        "backward compatible. Falling back to the PyTorch-native implementation of top-p & top-k sampling.",
        [{"kind": "settings", "starts_engine": False, "flashinfer_sampler": False}],
    ),
    # --- lines that look close but are not facts ------------------------------------------------
    ("init engine timing", "init engine (profile, create kv cache, warmup model) took 25.31 seconds", []),
    ("uvicorn", 'INFO:     127.0.0.1:37664 - "POST /v1/completions HTTP/1.1" 200 OK', []),
    ("prose mentioning the version", "the version of torch is 2.4", []),
    # 0.19.0's opt-in note (the demo log, kvwatch/data/demo/vllm.log): installed, no fallback.
    (
        "flashinfer available but opt-in",
        "FlashInfer top-p/top-k sampling is available but disabled by default. Set "
        "VLLM_USE_FLASHINFER_SAMPLER=1 to opt in after verifying accuracy for your workloads.",
        [],
    ),
    # 0.7.3's rejection sampler (speculative decoding; v1/sample/rejection_sampler.py:40-44), not
    # the top-p/top-k sampler the profile runs
    (
        "rejection sampler fallback",
        "FlashInfer is available, but it is not enabled. Falling back to the PyTorch-native implementation "
        "of rejection sampling. For the best performance, please set VLLM_USE_FLASHINFER_SAMPLER=1.",
        [],
    ),
]


@pytest.mark.parametrize(("body", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_vllm_body(body: str, expected: list[dict[str, Any]]) -> None:
    assert facts(vllm.parse(body, META)) == expected


def test_every_claimed_case_contains_an_anchor() -> None:
    for name, body, expected in CASES:
        if expected:
            assert any(a in body for a in vllm.ANCHORS), name


@pytest.mark.parametrize(
    ("anchor", "body"),
    [
        ("KV cache", "Reserved 3 KV cache slots for the drafter"),
        ("blocks", "Swapped 12 blocks to the host"),
        ("took", "Tokenizer warm-up took 0.5 seconds"),
        ("CUDA graph memory", "CUDA graph memory pool trimmed"),
    ],
)
def test_a_row_added_at_the_end_of_the_table_is_reached(
    anchor: str, body: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new line is one new row: no earlier row claims a line that is not its own (before, every
    'KV cache', 'blocks' or 'took' line ended in one handler's if-chain and a new row was dead)."""
    assert vllm.parse(body, LineMeta()) == ()
    answer = (Preemption(engine="vllm", total=7),)
    monkeypatch.setattr(vllm, "_TABLE", (*vllm._TABLE, (anchor, lambda b, m: answer)))
    assert vllm.parse(body, LineMeta()) == answer


def test_identity_comes_from_meta() -> None:
    meta = LineMeta(instance="3", rank=1, ts="10-03 09:15:22")
    (event,) = vllm.parse("Available KV cache memory: 53.27 GiB", meta)
    assert isinstance(event, MemoryBudget)
    assert (event.engine, event.instance, event.rank, event.ts) == ("vllm", "3", 1, "10-03 09:15:22")


def test_stats_engine_index_sets_the_instance() -> None:
    body, meta = strip_prefixes(
        "(APIServer pid=4801) INFO 10-03 09:20:10 [loggers.py:127] Engine 002: Avg prompt throughput: "
        "1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 41.2%, Prefix cache hit rate: 12.5%"
    )
    (event,) = vllm.parse(body, meta)
    assert isinstance(event, UsageSample)
    assert event.instance == "2"


def test_aggregated_stats_are_not_one_instance() -> None:
    (event,) = vllm.parse(
        "2 Engines Aggregated: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
        "Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 41.2%, Prefix cache hit rate: 12.5%",
        META,
    )
    assert isinstance(event, UsageSample)
    assert event.instance == "all"
    assert event.running == 3


def test_v0_breakdown_three_crlf_lines_through_prefixes() -> None:
    record = (
        "INFO 12-20 10:00:04 worker.py:241] Memory profiling takes 4.32 seconds\r\n"
        "INFO 12-20 10:00:04 worker.py:241] the current vLLM instance can use total_gpu_memory (79.11GiB) x "
        "gpu_memory_utilization (0.90) = 71.20GiB\r\n"
        "INFO 12-20 10:00:04 worker.py:241] model weights take 14.99GiB; non_torch_memory takes 0.20GiB; "
        "PyTorch activation peak memory takes 1.92GiB; the rest of the memory reserved for KV Cache is 54.09GiB.\r\n"
    )
    events: list[Event] = []
    for line in record.splitlines(keepends=True):
        events.extend(vllm.parse(*strip_prefixes(line)))
    assert [type(e) for e in events] == [MemoryBudget, MemoryBudget]
    merged: dict[str, Any] = {}
    for e in events:
        merged.update(
            {k: v for k, v in e.model_dump(exclude_none=True).items() if k.endswith(("bytes", "ion"))}
        )
    assert merged == {
        "total_bytes": gib("79.11"),
        "gpu_memory_utilization": 0.9,
        "requested_bytes": gib("71.20"),
        "weights_bytes": gib("14.99"),
        "non_torch_bytes": gib("0.20"),
        "activation_bytes": gib("1.92"),
        "available_kv_bytes": gib("54.09"),
    }


def test_bad_stats_value_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        vllm.parse(
            "Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: many reqs, "
            "Waiting: 0 reqs, GPU KV cache usage: 41.2%",
            META,
        )


def test_bad_settings_value_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        vllm.parse("non-default args: {'max_model_len': 'lots'}", META)


def test_event_types() -> None:
    """The kinds above map onto the shared event classes (guards against a renamed discriminator)."""
    kinds = {
        "settings": EngineSettings,
        "memory": MemoryBudget,
        "pool": PoolSized,
        "usage": UsageSample,
        "preemption": Preemption,
        "startup_failure": StartupFailure,
    }
    for name, body, expected in CASES:
        for event, want in zip(vllm.parse(body, META), expected, strict=True):
            assert isinstance(event, kinds[want["kind"]]), name


# xorbitsai/inference#3237 (2025-04): Xinference re-logs vLLM's V0 max-seq-len error under its own
# logger ('%(asctime)s %(name)s %(process)d %(levelname)s' + xoscar's '[address=..., pid=...]'). The
# first line is verbatim as pasted (the paste lost the year's first digit), the second as printed.
XINFERENCE_MAXLEN = (
    "025-04-12 21:57:39,467 xinference.api.restful_api 1 ERROR    [address=0.0.0.0:43423, pid=167] The "
    "model's max seq len (32768) is larger than the maximum number of tokens that can be stored in KV cache "
    "(17744). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the "
    "engine."
)


@pytest.mark.parametrize("line", [XINFERENCE_MAXLEN, "2" + XINFERENCE_MAXLEN])
def test_max_seq_len_error_re_logged_by_xinference_is_a_startup_failure(line: str) -> None:
    body, _meta = strip_prefixes(line)
    assert facts(vllm.parse(body, META)) == [
        {
            "kind": "startup_failure",
            "reason": "max_model_len_too_large",
            "max_model_len": 32768,
            "max_tokens_in_cache": 17744,
        },
        {"kind": "pool", "pool": "full", "tokens": 17744},
    ]


def test_max_seq_len_error_re_logged_through_the_pipeline() -> None:
    from kvwatch.sources.pipeline import LinePipeline
    from kvwatch.state.fleet import Fleet

    fleet = Fleet(clock=lambda: 1.0)
    LinePipeline("x", fleet, "auto").feed(XINFERENCE_MAXLEN)
    (snap,) = fleet.snapshot()
    assert snap.engine == "vllm"
    assert dict(snap.startup_failures) == {"max_model_len_too_large": 1}


@pytest.mark.parametrize(
    "line",
    [
        # The verbatim lines, prefixes included (tests/apriori/public/vllm/cases.json): 0.11.0's
        # engine core (energyllm) and a 0.10.0 TP8 worker (daisuketakai).
        "(EngineCore_DP0 pid=18987) WARNING 11-05 11:27:03 [topk_topp_sampler.py:66] FlashInfer is not "
        "available. Falling back to the PyTorch-native implementation of top-p & top-k sampling. For the "
        "best performance, please install FlashInfer.",
        "(VllmWorker rank=0 pid=775158) WARNING 08-16 02:04:30 [topk_topp_sampler.py:59] FlashInfer is not "
        "available. Falling back to the PyTorch-native implementation of top-p & top-k sampling. For the "
        "best performance, please install FlashInfer.",
    ],
)
def test_no_flashinfer_line_through_prefixes(line: str) -> None:
    (event,) = vllm.parse(*strip_prefixes(line))
    assert isinstance(event, EngineSettings)
    assert (event.flashinfer_sampler, event.instance, event.starts_engine) == (False, "0", False)


@pytest.mark.parametrize(
    "line",
    [
        # 0.10.2 v1/worker/gpu_worker.py:181-187 (mrpid12org/imageworks nohup.out, RTX 4080)
        "(EngineCore_DP0 pid=941609) ERROR 09-30 18:29:03 [core.py:718] ValueError: Free memory on device "
        "(13.58/15.99 GiB) on startup is less than desired GPU memory utilization (0.85, 13.59 GiB). "
        "Decrease GPU memory utilization or reduce GPU memory used by other processes.",
        # 0.19.0 v1/worker/utils.py:412-421 names the device
        "(EngineCore pid=1) ValueError: Free memory on device cuda:0 (13.58/15.99 GiB) on startup is less "
        "than desired GPU memory utilization (0.85, 13.59 GiB). Decrease GPU memory utilization or reduce "
        "GPU memory used by other processes.",
    ],
)
def test_free_memory_below_utilization_is_a_startup_failure(line: str) -> None:
    body, _meta = strip_prefixes(line)
    assert facts(vllm.parse(body, META)) == [
        {
            "kind": "startup_failure",
            "reason": "free_memory_below_utilization",
            "free_bytes": 14581413970,  # 13.58 GiB, rounded to the byte
            "total_bytes": 17169131766,  # 15.99 GiB
            "requested_bytes": 14592151388,  # 13.59 GiB
            "gpu_memory_utilization": 0.85,
        }
    ]
