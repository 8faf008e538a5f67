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
        "card": frozenset({"A100", "H100", "RTX-3090"}),
        "release": frozenset({"0.10", "0.11", "0.15", "0.19", "0.22"}),
        "architecture": frozenset({"MoE", "dense", "hybrid linear-attention", "sliding-window"}),
        "modality": frozenset({"text", "vision tower"}),
        "quantization": frozenset({"fp8", "mxfp4", "none", "w4a16"}),
        "parallelism": frozenset({"tp 1", "tp >= 2"}),
        "connector": frozenset({"none"}),
    },
    term_bands={"weights": 0.0078, "activation": 0.005, "non_torch": 0.04, "cuda_graphs": 1.2304},
    widening={
        "card": 0.0619,
        "release": 0.0443,
        "architecture": 0.0173,
        "modality": 0.0173,
        "quantization": 0.0159,
        "parallelism": 0.0845,
        "connector": 0.0173,
    },
    cases={
        "architecture=MLA": "llm-d-incubation/llm-d-planner (1)",
        "architecture=MoE": "DaisukeTakai/eval_dataset (1), LukeJYK/AutoScientists (1), NnamdiOdozi/mlops-assignment (1), fpolica91/triton-example (1), kolyangg/mlops-assignment (1), llm-d-incubation/llm-d-planner (1)",
        "architecture=all sliding-window": "sridhar1804/local-ai (1)",
        "architecture=dense": "0324wy/MapCoder (2), LzyFischer/MemSuit (2), ShanghaoLi0913/memory-aware_RLHF (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), benyucong/neo4j-graphrag-python (1), briandepasquale/Controller-Search (1), dawn-boy/elloraa (1), daxdelvira/distributed_agent_gc (2), dennislee22/vLLM-benchmarking (5), faradawn/bench3 (1), kumaxxp/duo-talk (1), leadawon/LAMBO (1), llm-d-incubation/llm-d-planner (36), llm-d/llm-d-benchmark (7), mrpid12org/imageworks (1), qweewqq/EnergyLLM (1), release-sweep (4), vllm-project/vllm#10517 (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "architecture=hybrid linear-attention": "leadawon/LAMBO (4), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#46 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), phivan3008/meeting-translator (1), sostrowsk/dgx-spark-local-llm (1)",
        "architecture=sliding-window": "TW-10519/VLLM-ROUTER (1), dennislee22/vLLM-benchmarking (1), llm-d-incubation/llm-d-planner (4), llm-d/llm-d-benchmark (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (2), parallelworks/activate-rag-vllm (1), sostrowsk/dgx-spark-local-llm (2)",
        "architecture=unread model_type gemma": "llm-d-incubation/llm-d-planner (1)",
        "card=A100": "LukeJYK/AutoScientists (1), LzyFischer/MemSuit (2), dennislee22/vLLM-benchmarking (6), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (2), qweewqq/EnergyLLM (1)",
        "card=GB10": "TW-10519/VLLM-ROUTER (1), sostrowsk/dgx-spark-local-llm (3)",
        "card=H100": "DaisukeTakai/eval_dataset (1), NnamdiOdozi/mlops-assignment (1), kolyangg/mlops-assignment (1), llm-d-incubation/llm-d-planner (43), llm-d/llm-d-benchmark (8), phivan3008/meeting-translator (1), release-sweep (4)",
        "card=H200": "faradawn/bench3 (1), parallelworks/activate-rag-vllm (1)",
        "card=L4": "abinavChandar/demo_env_l4 (1)",
        "card=L40S": "briandepasquale/Controller-Search (1), dawn-boy/elloraa (1)",
        "card=MI300X": "fpolica91/triton-example (1)",
        "card=RTX-3090": "leadawon/LAMBO (5), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), sridhar1804/local-ai (1), vllm-project/vllm#10517 (1)",
        "card=RTX-4080": "mrpid12org/imageworks (1)",
        "card=RTX-4090": "ShanghaoLi0913/memory-aware_RLHF (1), noonghunna/club-3090#46 (1)",
        "card=RTX-A5000": "kumaxxp/duo-talk (1)",
        "card=RX-9070-XT": "apollo-mg/Project-Apollo (1)",
        "card=T4": "zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "card=unlisted card": "0324wy/MapCoder (2), benyucong/neo4j-graphrag-python (1), daxdelvira/distributed_agent_gc (2)",
        "connector=none": "0324wy/MapCoder (2), DaisukeTakai/eval_dataset (1), LukeJYK/AutoScientists (1), LzyFischer/MemSuit (2), NnamdiOdozi/mlops-assignment (1), ShanghaoLi0913/memory-aware_RLHF (1), TW-10519/VLLM-ROUTER (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), benyucong/neo4j-graphrag-python (1), briandepasquale/Controller-Search (1), dawn-boy/elloraa (1), daxdelvira/distributed_agent_gc (2), dennislee22/vLLM-benchmarking (6), faradawn/bench3 (1), fpolica91/triton-example (1), kolyangg/mlops-assignment (1), kumaxxp/duo-talk (1), leadawon/LAMBO (5), llm-d-incubation/llm-d-planner (43), llm-d/llm-d-benchmark (8), mrpid12org/imageworks (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (2), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#46 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), parallelworks/activate-rag-vllm (1), phivan3008/meeting-translator (1), qweewqq/EnergyLLM (1), release-sweep (4), sostrowsk/dgx-spark-local-llm (3), sridhar1804/local-ai (1), vllm-project/vllm#10517 (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "modality=text": "0324wy/MapCoder (2), DaisukeTakai/eval_dataset (1), LukeJYK/AutoScientists (1), LzyFischer/MemSuit (2), NnamdiOdozi/mlops-assignment (1), ShanghaoLi0913/memory-aware_RLHF (1), TW-10519/VLLM-ROUTER (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), benyucong/neo4j-graphrag-python (1), briandepasquale/Controller-Search (1), dawn-boy/elloraa (1), daxdelvira/distributed_agent_gc (2), dennislee22/vLLM-benchmarking (6), faradawn/bench3 (1), fpolica91/triton-example (1), kolyangg/mlops-assignment (1), kumaxxp/duo-talk (1), leadawon/LAMBO (1), llm-d-incubation/llm-d-planner (39), llm-d/llm-d-benchmark (7), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), parallelworks/activate-rag-vllm (1), qweewqq/EnergyLLM (1), release-sweep (4), sridhar1804/local-ai (1), vllm-project/vllm#10517 (1)",
        "modality=vision tower": "leadawon/LAMBO (4), llm-d-incubation/llm-d-planner (4), llm-d/llm-d-benchmark (1), mrpid12org/imageworks (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#46 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), phivan3008/meeting-translator (1), sostrowsk/dgx-spark-local-llm (3), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "parallelism=pp >= 2": "llm-d-incubation/llm-d-planner (2)",
        "parallelism=tp 1": "LukeJYK/AutoScientists (1), LzyFischer/MemSuit (2), NnamdiOdozi/mlops-assignment (1), ShanghaoLi0913/memory-aware_RLHF (1), TW-10519/VLLM-ROUTER (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), benyucong/neo4j-graphrag-python (1), briandepasquale/Controller-Search (1), dawn-boy/elloraa (1), daxdelvira/distributed_agent_gc (1), dennislee22/vLLM-benchmarking (2), faradawn/bench3 (1), kolyangg/mlops-assignment (1), kumaxxp/duo-talk (1), llm-d-incubation/llm-d-planner (33), llm-d/llm-d-benchmark (6), mrpid12org/imageworks (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (2), phivan3008/meeting-translator (1), qweewqq/EnergyLLM (1), release-sweep (4), sostrowsk/dgx-spark-local-llm (3), sridhar1804/local-ai (1), vllm-project/vllm#10517 (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "parallelism=tp >= 2": "0324wy/MapCoder (2), DaisukeTakai/eval_dataset (1), daxdelvira/distributed_agent_gc (1), dennislee22/vLLM-benchmarking (4), fpolica91/triton-example (1), leadawon/LAMBO (5), llm-d-incubation/llm-d-planner (8), llm-d/llm-d-benchmark (2), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#46 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), parallelworks/activate-rag-vllm (1)",
        "quantization=fp8": "DaisukeTakai/eval_dataset (1), NnamdiOdozi/mlops-assignment (1), dawn-boy/elloraa (1), fpolica91/triton-example (1), llm-d-incubation/llm-d-planner (4), llm-d/llm-d-benchmark (1), phivan3008/meeting-translator (1)",
        "quantization=int8": "llm-d-incubation/llm-d-planner (5)",
        "quantization=mxfp4": "TW-10519/VLLM-ROUTER (1), dennislee22/vLLM-benchmarking (1), llm-d/llm-d-benchmark (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), parallelworks/activate-rag-vllm (1)",
        "quantization=none": "0324wy/MapCoder (2), LukeJYK/AutoScientists (1), LzyFischer/MemSuit (2), ShanghaoLi0913/memory-aware_RLHF (1), abinavChandar/demo_env_l4 (1), benyucong/neo4j-graphrag-python (1), briandepasquale/Controller-Search (1), daxdelvira/distributed_agent_gc (2), dennislee22/vLLM-benchmarking (5), faradawn/bench3 (1), kolyangg/mlops-assignment (1), leadawon/LAMBO (5), llm-d-incubation/llm-d-planner (33), llm-d/llm-d-benchmark (6), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), qweewqq/EnergyLLM (1), release-sweep (4), sridhar1804/local-ai (1), vllm-project/vllm#10517 (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "quantization=nvfp4": "sostrowsk/dgx-spark-local-llm (2)",
        "quantization=w4a16": "apollo-mg/Project-Apollo (1), kumaxxp/duo-talk (1), llm-d-incubation/llm-d-planner (1), mrpid12org/imageworks (1), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#46 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), sostrowsk/dgx-spark-local-llm (1)",
        "release=0.10": "DaisukeTakai/eval_dataset (1), ShanghaoLi0913/memory-aware_RLHF (1), benyucong/neo4j-graphrag-python (1), dennislee22/vLLM-benchmarking (6), kolyangg/mlops-assignment (1), mrpid12org/imageworks (1)",
        "release=0.11": "abinavChandar/demo_env_l4 (1), briandepasquale/Controller-Search (1), dawn-boy/elloraa (1), faradawn/bench3 (1), llm-d/llm-d-benchmark (1), qweewqq/EnergyLLM (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "release=0.13": "TW-10519/VLLM-ROUTER (1), kumaxxp/duo-talk (1)",
        "release=0.14": "apollo-mg/Project-Apollo (1)",
        "release=0.15": "llm-d/llm-d-benchmark (7), parallelworks/activate-rag-vllm (1), release-sweep (1)",
        "release=0.16": "fpolica91/triton-example (1), release-sweep (1)",
        "release=0.17": "LzyFischer/MemSuit (2), release-sweep (1)",
        "release=0.18": "leadawon/LAMBO (1), release-sweep (1)",
        "release=0.19": "leadawon/LAMBO (4), llm-d-incubation/llm-d-planner (43), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (2), sridhar1804/local-ai (1)",
        "release=0.20": "noonghunna/club-3090#46 (1), noonghunna/club-3090#91 (1)",
        "release=0.22": "NnamdiOdozi/mlops-assignment (1), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1)",
        "release=0.24": "noonghunna/club-3090#642 (1)",
        "release=0.25": "sostrowsk/dgx-spark-local-llm (3)",
        "release=0.26": "LukeJYK/AutoScientists (1)",
        "release=0.27": "phivan3008/meeting-translator (1)",
        "release=0.6": "0324wy/MapCoder (2), vllm-project/vllm#10517 (1)",
        "release=0.7": "daxdelvira/distributed_agent_gc (2)",
        "widening card": "25 cases outside the others' envelope: 0324wy/MapCoder (2), ShanghaoLi0913/memory-aware_RLHF (1), TW-10519/VLLM-ROUTER (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), benyucong/neo4j-graphrag-python (1), briandepasquale/Controller-Search (1), dawn-boy/elloraa (1), daxdelvira/distributed_agent_gc (2), faradawn/bench3 (1), fpolica91/triton-example (1), kumaxxp/duo-talk (1), mrpid12org/imageworks (1), noonghunna/club-3090#46 (1), parallelworks/activate-rag-vllm (1), sostrowsk/dgx-spark-local-llm (3), vllm-project/vllm#11230 (1), vllm-project/vllm#13061 (1), vllm-project/vllm#14452 (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "widening release": "42 cases outside the others' envelope: 0324wy/MapCoder (2), LukeJYK/AutoScientists (1), LzyFischer/MemSuit (2), NnamdiOdozi/mlops-assignment (1), TW-10519/VLLM-ROUTER (1), apollo-mg/Project-Apollo (1), daxdelvira/distributed_agent_gc (2), fpolica91/triton-example (1), gpustack/gpustack#1800 (1), kumaxxp/duo-talk (1), leadawon/LAMBO (1), llm-d/llm-d-benchmark (8), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#46 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), parallelworks/activate-rag-vllm (1), phivan3008/meeting-translator (1), release-sweep (4), sostrowsk/dgx-spark-local-llm (3), vllm-project/vllm#10517 (2), vllm-project/vllm#11230 (1), vllm-project/vllm#13061 (1), vllm-project/vllm#14452 (1), vllm-project/vllm#32105 (1)",
        "widening architecture": "3 cases outside the others' envelope: llm-d-incubation/llm-d-planner (2), sridhar1804/local-ai (1)",
        "widening modality": "0 cases outside the others' envelope: no case",
        "widening quantization": "7 cases outside the others' envelope: llm-d-incubation/llm-d-planner (5), sostrowsk/dgx-spark-local-llm (2)",
        "widening parallelism": "4 cases outside the others' envelope: llm-d-incubation/llm-d-planner (2), vllm-project/vllm#14452 (1), vllm-project/vllm#32105 (1)",
        "widening connector": "0 cases outside the others' envelope: no case",
        "band weights": "leave-one-source-out error of every case that logs it",
        "band activation": "leave-one-source-out error of every case that logs it",
        "band non_torch": "leave-one-source-out error of every case that logs it",
        "band cuda_graphs": "leave-one-source-out error of every case that logs it",
        "floor": "50 cases nearest the calibrated cell: DaisukeTakai/eval_dataset (1), dennislee22/vLLM-benchmarking (6), kolyangg/mlops-assignment (1), leadawon/LAMBO (4), llm-d-incubation/llm-d-planner (34), llm-d/llm-d-benchmark (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (2), qweewqq/EnergyLLM (1)",
    },
    floor=0.0207,
)
# --- envelope: end

CURRENT = Current(ENVELOPE)
