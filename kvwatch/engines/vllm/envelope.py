"""vLLM's calibration envelope: ONE table of what its real startups cover and how wide the band is.

Written by ``python -m bench accuracy --envelope`` from the cases of tests/apriori (never by hand);
tests/test_accuracy.py holds it equal to what the cases give. See kvwatch/capacity/envelope.py for
what each figure means.
"""

from __future__ import annotations

from kvwatch.capacity.envelope import Current, Envelope

# The newest release whose source kvwatch's rules were read from (memory.py, budget.py).
NEWEST_READ = "0.33"

# --- envelope: begin
ENVELOPE = Envelope(
    newest_read=NEWEST_READ,
    covered={
        "card": frozenset({"A100", "GB10", "H100"}),
        "release": frozenset({"0.10", "0.15", "0.19", "0.25"}),
        "architecture": frozenset({"dense", "sliding-window"}),
        "modality": frozenset({"text", "vision tower"}),
        "quantization": frozenset({"fp8", "int8", "none", "w4a16"}),
        "parallelism": frozenset({"tp 1", "tp >= 2"}),
        "connector": frozenset({"none"}),
    },
    term_bands={
        "weights": 0.0064,
        "activation": 0.0039,
        "non_torch": 0.04,
        "cuda_graphs": 0.605,
        "scale": 1.0,
    },
    widening={
        "card": 0.07,
        "release": 0.0243,
        "architecture": 0.07,
        "modality": 0.07,
        "quantization": 0.0535,
        "parallelism": 0.3672,
        "connector": 0.0243,
    },
    cases={
        "architecture=MLA": "llm-d-incubation/llm-d-planner (1)",
        "architecture=MoE": "NnamdiOdozi/mlops-assignment (1)",
        "architecture=dense": "ShanghaoLi0913/memory-aware_RLHF (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), dawn-boy/elloraa (1), dennislee22/vLLM-benchmarking (5), kumaxxp/duo-talk (1), llm-d-incubation/llm-d-planner (32), llm-d/llm-d-benchmark (6), release-sweep (4), vllm-project/vllm#10517 (1)",
        "architecture=hybrid linear-attention": "sostrowsk/dgx-spark-local-llm (1)",
        "architecture=sliding-window": "dennislee22/vLLM-benchmarking (1), llm-d-incubation/llm-d-planner (1), llm-d/llm-d-benchmark (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), sostrowsk/dgx-spark-local-llm (2)",
        "card=A100": "dennislee22/vLLM-benchmarking (6), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1)",
        "card=GB10": "sostrowsk/dgx-spark-local-llm (3)",
        "card=H100": "NnamdiOdozi/mlops-assignment (1), llm-d-incubation/llm-d-planner (34), llm-d/llm-d-benchmark (7), release-sweep (4)",
        "card=L4": "abinavChandar/demo_env_l4 (1)",
        "card=L40S": "dawn-boy/elloraa (1)",
        "card=RTX-3090": "vllm-project/vllm#10517 (1)",
        "card=RTX-4090": "ShanghaoLi0913/memory-aware_RLHF (1)",
        "card=RTX-A5000": "kumaxxp/duo-talk (1)",
        "card=RX-9070-XT": "apollo-mg/Project-Apollo (1)",
        "connector=none": "NnamdiOdozi/mlops-assignment (1), ShanghaoLi0913/memory-aware_RLHF (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), dawn-boy/elloraa (1), dennislee22/vLLM-benchmarking (6), kumaxxp/duo-talk (1), llm-d-incubation/llm-d-planner (34), llm-d/llm-d-benchmark (7), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), release-sweep (4), sostrowsk/dgx-spark-local-llm (3), vllm-project/vllm#10517 (1)",
        "modality=text": "NnamdiOdozi/mlops-assignment (1), ShanghaoLi0913/memory-aware_RLHF (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), dawn-boy/elloraa (1), dennislee22/vLLM-benchmarking (6), kumaxxp/duo-talk (1), llm-d-incubation/llm-d-planner (34), llm-d/llm-d-benchmark (7), release-sweep (4), vllm-project/vllm#10517 (1)",
        "modality=vision tower": "myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), sostrowsk/dgx-spark-local-llm (3)",
        "parallelism=pp >= 2": "llm-d-incubation/llm-d-planner (2)",
        "parallelism=tp 1": "NnamdiOdozi/mlops-assignment (1), ShanghaoLi0913/memory-aware_RLHF (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), dawn-boy/elloraa (1), dennislee22/vLLM-benchmarking (2), kumaxxp/duo-talk (1), llm-d-incubation/llm-d-planner (25), llm-d/llm-d-benchmark (5), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), release-sweep (4), sostrowsk/dgx-spark-local-llm (3), vllm-project/vllm#10517 (1)",
        "parallelism=tp >= 2": "dennislee22/vLLM-benchmarking (4), llm-d-incubation/llm-d-planner (7), llm-d/llm-d-benchmark (2)",
        "quantization=fp8": "NnamdiOdozi/mlops-assignment (1), dawn-boy/elloraa (1), llm-d-incubation/llm-d-planner (4), llm-d/llm-d-benchmark (1)",
        "quantization=int8": "llm-d-incubation/llm-d-planner (3)",
        "quantization=mxfp4": "dennislee22/vLLM-benchmarking (1), llm-d/llm-d-benchmark (1)",
        "quantization=none": "ShanghaoLi0913/memory-aware_RLHF (1), abinavChandar/demo_env_l4 (1), dennislee22/vLLM-benchmarking (5), llm-d-incubation/llm-d-planner (26), llm-d/llm-d-benchmark (5), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), release-sweep (4), vllm-project/vllm#10517 (1)",
        "quantization=nvfp4": "sostrowsk/dgx-spark-local-llm (2)",
        "quantization=w4a16": "apollo-mg/Project-Apollo (1), kumaxxp/duo-talk (1), llm-d-incubation/llm-d-planner (1), sostrowsk/dgx-spark-local-llm (1)",
        "release=0.10": "ShanghaoLi0913/memory-aware_RLHF (1), dennislee22/vLLM-benchmarking (6)",
        "release=0.11": "abinavChandar/demo_env_l4 (1), dawn-boy/elloraa (1)",
        "release=0.13": "kumaxxp/duo-talk (1)",
        "release=0.14": "apollo-mg/Project-Apollo (1)",
        "release=0.15": "llm-d/llm-d-benchmark (7), release-sweep (1)",
        "release=0.16": "release-sweep (1)",
        "release=0.17": "release-sweep (1)",
        "release=0.18": "release-sweep (1)",
        "release=0.19": "llm-d-incubation/llm-d-planner (34), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1)",
        "release=0.22": "NnamdiOdozi/mlops-assignment (1)",
        "release=0.25": "sostrowsk/dgx-spark-local-llm (3)",
        "release=0.6": "vllm-project/vllm#10517 (1)",
        "widening card": "18 cases outside the others' envelope: ShanghaoLi0913/memory-aware_RLHF (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), dawn-boy/elloraa (1), dennislee22/vLLM-benchmarking (6), kumaxxp/duo-talk (1), sostrowsk/dgx-spark-local-llm (3), vllm-project/vllm#10517 (2), vllm-project/vllm#11230 (1), vllm-project/vllm#14452 (1)",
        "widening release": "63 cases outside the others' envelope: NnamdiOdozi/mlops-assignment (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), dawn-boy/elloraa (1), dennislee22/vLLM-benchmarking (6), kumaxxp/duo-talk (1), llm-d-incubation/llm-d-planner (34), llm-d/llm-d-benchmark (8), release-sweep (3), sostrowsk/dgx-spark-local-llm (3), vllm-project/vllm#10517 (2), vllm-project/vllm#11230 (1), vllm-project/vllm#14452 (1)",
        "widening architecture": "3 cases outside the others' envelope: NnamdiOdozi/mlops-assignment (1), llm-d-incubation/llm-d-planner (1), sostrowsk/dgx-spark-local-llm (1)",
        "widening modality": "3 cases outside the others' envelope: sostrowsk/dgx-spark-local-llm (3)",
        "widening quantization": "7 cases outside the others' envelope: dennislee22/vLLM-benchmarking (1), llm-d-incubation/llm-d-planner (3), llm-d/llm-d-benchmark (1), sostrowsk/dgx-spark-local-llm (2)",
        "widening parallelism": "3 cases outside the others' envelope: llm-d-incubation/llm-d-planner (2), vllm-project/vllm#14452 (1)",
        "widening connector": "0 cases outside the others' envelope: no case",
        "band weights": "leave-one-source-out error of every case that logs it",
        "band activation": "leave-one-source-out error of every case that logs it",
        "band non_torch": "leave-one-source-out error of every case that logs it",
        "band cuda_graphs": "leave-one-source-out error of every case that logs it",
        "band scale": "leave-one-source-out error of every case that logs it",
    },
)
# --- envelope: end

CURRENT = Current(ENVELOPE)
