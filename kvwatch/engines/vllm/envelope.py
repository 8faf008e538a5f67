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
        "card": frozenset({"A100", "GB10", "H100", "L40S", "RTX-3090"}),
        "release": frozenset({"0.10", "0.11", "0.13", "0.15", "0.16", "0.19", "0.22", "0.6"}),
        "architecture": frozenset({"MoE", "dense", "hybrid linear-attention", "sliding-window"}),
        "modality": frozenset({"text", "vision tower"}),
        "quantization": frozenset({"fp8", "mxfp4", "none", "nvfp4", "w4a16"}),
        "parallelism": frozenset({"tp 1", "tp >= 2"}),
        "connector": frozenset({"none"}),
    },
    term_bands={"weights": 0.0074, "activation": 0.0155, "non_torch": 0.04, "cuda_graphs": 0.3893},
    widening={
        "card": 0.0346,
        "release": 0.0297,
        "architecture": 0.018,
        "modality": 0.0266,
        "quantization": 0.0057,
        "parallelism": 0.0847,
        "connector": 0.0266,
    },
    cases={
        "architecture=MLA": "llm-d-incubation/llm-d-planner (1)",
        "architecture=MoE": "2215860382/VedioSifter (1), DaisukeTakai/eval_dataset (1), LukeJYK/AutoScientists (1), NnamdiOdozi/mlops-assignment (1), builderOfTheWorlds/virtualTubers (1), fpolica91/triton-example (1), kolyangg/mlops-assignment (1), llm-d-incubation/llm-d-planner (1)",
        "architecture=all sliding-window": "sridhar1804/local-ai (1)",
        "architecture=dense": "0324wy/MapCoder (2), LzyFischer/MemSuit (2), ShanghaoLi0913/memory-aware_RLHF (1), Tegdam/pickr_ai (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), benyucong/neo4j-graphrag-python (1), briandepasquale/Controller-Search (1), dawn-boy/elloraa (1), daxdelvira/distributed_agent_gc (2), dennislee22/vLLM-benchmarking (5), faradawn/bench3 (1), graz-dev/vllm-benchmark (2), joshhickson/LogoMesh (1), kagaho/VLLM_Serve_llama3-70b-awq_on_L40S_with_Tensor_Parallelism_2 (1), kumaxxp/duo-talk (1), leadawon/LAMBO (1), llm-d-incubation/llm-d-planner (36), llm-d/llm-d-benchmark (7), mrpid12org/imageworks (1), qweewqq/EnergyLLM (1), release-sweep (4), vllm-project/vllm#10360 (1), vllm-project/vllm#10517 (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "architecture=hybrid linear-attention": "AIwork4me/Qwen3.8-27B-ROCm (2), builderOfTheWorlds/virtualTubers (3), leadawon/LAMBO (4), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#46 (1), noonghunna/club-3090#612 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), phivan3008/meeting-translator (1), sostrowsk/dgx-spark-local-llm (1), souspilot/DiscoverPhysicsWIP (1)",
        "architecture=sliding-window": "TW-10519/VLLM-ROUTER (1), builderOfTheWorlds/virtualTubers (1), dennislee22/vLLM-benchmarking (1), llm-d-incubation/llm-d-planner (4), llm-d/llm-d-benchmark (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (2), parallelworks/activate-rag-vllm (1), sostrowsk/dgx-spark-local-llm (2)",
        "architecture=unread model_type gemma": "llm-d-incubation/llm-d-planner (1)",
        "card=A100": "LukeJYK/AutoScientists (1), LzyFischer/MemSuit (2), benyucong/neo4j-graphrag-python (1), dennislee22/vLLM-benchmarking (6), joshhickson/LogoMesh (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (2), qweewqq/EnergyLLM (1), souspilot/DiscoverPhysicsWIP (1)",
        "card=A10G": "graz-dev/vllm-benchmark (2)",
        "card=GB10": "TW-10519/VLLM-ROUTER (1), builderOfTheWorlds/virtualTubers (5), sostrowsk/dgx-spark-local-llm (3)",
        "card=H100": "DaisukeTakai/eval_dataset (1), NnamdiOdozi/mlops-assignment (1), kolyangg/mlops-assignment (1), llm-d-incubation/llm-d-planner (43), llm-d/llm-d-benchmark (8), phivan3008/meeting-translator (1), release-sweep (4)",
        "card=H200": "faradawn/bench3 (1), parallelworks/activate-rag-vllm (1)",
        "card=L4": "abinavChandar/demo_env_l4 (1)",
        "card=L40S": "briandepasquale/Controller-Search (1), dawn-boy/elloraa (1), kagaho/VLLM_Serve_llama3-70b-awq_on_L40S_with_Tensor_Parallelism_2 (1)",
        "card=MI300X": "fpolica91/triton-example (1)",
        "card=RTX-3090": "leadawon/LAMBO (5), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), sridhar1804/local-ai (1), vllm-project/vllm#10517 (1)",
        "card=RTX-4080": "mrpid12org/imageworks (1)",
        "card=RTX-4090": "ShanghaoLi0913/memory-aware_RLHF (1), noonghunna/club-3090#46 (1)",
        "card=RTX-5090": "noonghunna/club-3090#612 (1)",
        "card=RTX-A5000": "kumaxxp/duo-talk (1)",
        "card=RTX-A6000": "vllm-project/vllm#10360 (1)",
        "card=RTX-PRO-6000": "2215860382/VedioSifter (1)",
        "card=RX-9070-XT": "apollo-mg/Project-Apollo (1)",
        "card=T4": "zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "card=unlisted card": "0324wy/MapCoder (2), AIwork4me/Qwen3.8-27B-ROCm (2), Tegdam/pickr_ai (1), daxdelvira/distributed_agent_gc (2)",
        "connector=none": "0324wy/MapCoder (2), 2215860382/VedioSifter (1), AIwork4me/Qwen3.8-27B-ROCm (2), DaisukeTakai/eval_dataset (1), LukeJYK/AutoScientists (1), LzyFischer/MemSuit (2), NnamdiOdozi/mlops-assignment (1), ShanghaoLi0913/memory-aware_RLHF (1), TW-10519/VLLM-ROUTER (1), Tegdam/pickr_ai (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), benyucong/neo4j-graphrag-python (1), briandepasquale/Controller-Search (1), builderOfTheWorlds/virtualTubers (5), dawn-boy/elloraa (1), daxdelvira/distributed_agent_gc (2), dennislee22/vLLM-benchmarking (6), faradawn/bench3 (1), fpolica91/triton-example (1), graz-dev/vllm-benchmark (2), joshhickson/LogoMesh (1), kagaho/VLLM_Serve_llama3-70b-awq_on_L40S_with_Tensor_Parallelism_2 (1), kolyangg/mlops-assignment (1), kumaxxp/duo-talk (1), leadawon/LAMBO (5), llm-d-incubation/llm-d-planner (43), llm-d/llm-d-benchmark (8), mrpid12org/imageworks (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (2), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#46 (1), noonghunna/club-3090#612 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), parallelworks/activate-rag-vllm (1), phivan3008/meeting-translator (1), qweewqq/EnergyLLM (1), release-sweep (4), sostrowsk/dgx-spark-local-llm (3), souspilot/DiscoverPhysicsWIP (1), sridhar1804/local-ai (1), vllm-project/vllm#10360 (1), vllm-project/vllm#10517 (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "modality=text": "0324wy/MapCoder (2), 2215860382/VedioSifter (1), DaisukeTakai/eval_dataset (1), LukeJYK/AutoScientists (1), LzyFischer/MemSuit (2), NnamdiOdozi/mlops-assignment (1), ShanghaoLi0913/memory-aware_RLHF (1), TW-10519/VLLM-ROUTER (1), Tegdam/pickr_ai (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), benyucong/neo4j-graphrag-python (1), briandepasquale/Controller-Search (1), builderOfTheWorlds/virtualTubers (3), dawn-boy/elloraa (1), daxdelvira/distributed_agent_gc (2), dennislee22/vLLM-benchmarking (6), faradawn/bench3 (1), fpolica91/triton-example (1), graz-dev/vllm-benchmark (2), joshhickson/LogoMesh (1), kagaho/VLLM_Serve_llama3-70b-awq_on_L40S_with_Tensor_Parallelism_2 (1), kolyangg/mlops-assignment (1), kumaxxp/duo-talk (1), leadawon/LAMBO (1), llm-d-incubation/llm-d-planner (39), llm-d/llm-d-benchmark (7), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), parallelworks/activate-rag-vllm (1), qweewqq/EnergyLLM (1), release-sweep (4), sridhar1804/local-ai (1), vllm-project/vllm#10360 (1), vllm-project/vllm#10517 (1)",
        "modality=vision tower": "AIwork4me/Qwen3.8-27B-ROCm (2), builderOfTheWorlds/virtualTubers (2), leadawon/LAMBO (4), llm-d-incubation/llm-d-planner (4), llm-d/llm-d-benchmark (1), mrpid12org/imageworks (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#46 (1), noonghunna/club-3090#612 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), phivan3008/meeting-translator (1), sostrowsk/dgx-spark-local-llm (3), souspilot/DiscoverPhysicsWIP (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "parallelism=pp >= 2": "llm-d-incubation/llm-d-planner (2)",
        "parallelism=tp 1": "2215860382/VedioSifter (1), AIwork4me/Qwen3.8-27B-ROCm (2), LukeJYK/AutoScientists (1), LzyFischer/MemSuit (2), NnamdiOdozi/mlops-assignment (1), ShanghaoLi0913/memory-aware_RLHF (1), TW-10519/VLLM-ROUTER (1), Tegdam/pickr_ai (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), benyucong/neo4j-graphrag-python (1), briandepasquale/Controller-Search (1), builderOfTheWorlds/virtualTubers (5), dawn-boy/elloraa (1), daxdelvira/distributed_agent_gc (1), dennislee22/vLLM-benchmarking (2), faradawn/bench3 (1), graz-dev/vllm-benchmark (2), joshhickson/LogoMesh (1), kolyangg/mlops-assignment (1), kumaxxp/duo-talk (1), llm-d-incubation/llm-d-planner (33), llm-d/llm-d-benchmark (6), mrpid12org/imageworks (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (2), noonghunna/club-3090#612 (1), phivan3008/meeting-translator (1), qweewqq/EnergyLLM (1), release-sweep (4), sostrowsk/dgx-spark-local-llm (3), sridhar1804/local-ai (1), vllm-project/vllm#10360 (1), vllm-project/vllm#10517 (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "parallelism=tp >= 2": "0324wy/MapCoder (2), DaisukeTakai/eval_dataset (1), daxdelvira/distributed_agent_gc (1), dennislee22/vLLM-benchmarking (4), fpolica91/triton-example (1), kagaho/VLLM_Serve_llama3-70b-awq_on_L40S_with_Tensor_Parallelism_2 (1), leadawon/LAMBO (5), llm-d-incubation/llm-d-planner (8), llm-d/llm-d-benchmark (2), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#46 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), parallelworks/activate-rag-vllm (1), souspilot/DiscoverPhysicsWIP (1)",
        "quantization=fp8": "DaisukeTakai/eval_dataset (1), NnamdiOdozi/mlops-assignment (1), builderOfTheWorlds/virtualTubers (3), dawn-boy/elloraa (1), fpolica91/triton-example (1), llm-d-incubation/llm-d-planner (4), llm-d/llm-d-benchmark (1), phivan3008/meeting-translator (1)",
        "quantization=int8": "llm-d-incubation/llm-d-planner (5)",
        "quantization=mxfp4": "TW-10519/VLLM-ROUTER (1), builderOfTheWorlds/virtualTubers (1), dennislee22/vLLM-benchmarking (1), llm-d/llm-d-benchmark (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), parallelworks/activate-rag-vllm (1)",
        "quantization=none": "0324wy/MapCoder (2), 2215860382/VedioSifter (1), AIwork4me/Qwen3.8-27B-ROCm (2), LukeJYK/AutoScientists (1), LzyFischer/MemSuit (2), ShanghaoLi0913/memory-aware_RLHF (1), abinavChandar/demo_env_l4 (1), benyucong/neo4j-graphrag-python (1), briandepasquale/Controller-Search (1), daxdelvira/distributed_agent_gc (2), dennislee22/vLLM-benchmarking (5), faradawn/bench3 (1), graz-dev/vllm-benchmark (2), kolyangg/mlops-assignment (1), leadawon/LAMBO (5), llm-d-incubation/llm-d-planner (33), llm-d/llm-d-benchmark (6), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (1), qweewqq/EnergyLLM (1), release-sweep (4), souspilot/DiscoverPhysicsWIP (1), sridhar1804/local-ai (1), vllm-project/vllm#10517 (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "quantization=nvfp4": "builderOfTheWorlds/virtualTubers (1), noonghunna/club-3090#612 (1), sostrowsk/dgx-spark-local-llm (2)",
        "quantization=w4a16": "Tegdam/pickr_ai (1), apollo-mg/Project-Apollo (1), joshhickson/LogoMesh (1), kagaho/VLLM_Serve_llama3-70b-awq_on_L40S_with_Tensor_Parallelism_2 (1), kumaxxp/duo-talk (1), llm-d-incubation/llm-d-planner (1), mrpid12org/imageworks (1), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), noonghunna/club-3090#46 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), sostrowsk/dgx-spark-local-llm (1), vllm-project/vllm#10360 (1)",
        "release=0.10": "DaisukeTakai/eval_dataset (1), ShanghaoLi0913/memory-aware_RLHF (1), benyucong/neo4j-graphrag-python (1), dennislee22/vLLM-benchmarking (6), kolyangg/mlops-assignment (1), mrpid12org/imageworks (1)",
        "release=0.11": "abinavChandar/demo_env_l4 (1), briandepasquale/Controller-Search (1), dawn-boy/elloraa (1), faradawn/bench3 (1), llm-d/llm-d-benchmark (1), qweewqq/EnergyLLM (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "release=0.12": "2215860382/VedioSifter (1)",
        "release=0.13": "TW-10519/VLLM-ROUTER (1), joshhickson/LogoMesh (1), kumaxxp/duo-talk (1)",
        "release=0.14": "apollo-mg/Project-Apollo (1)",
        "release=0.15": "llm-d/llm-d-benchmark (7), parallelworks/activate-rag-vllm (1), release-sweep (1)",
        "release=0.16": "fpolica91/triton-example (1), kagaho/VLLM_Serve_llama3-70b-awq_on_L40S_with_Tensor_Parallelism_2 (1), release-sweep (1)",
        "release=0.17": "LzyFischer/MemSuit (2), release-sweep (1)",
        "release=0.18": "leadawon/LAMBO (1), release-sweep (1)",
        "release=0.19": "leadawon/LAMBO (4), llm-d-incubation/llm-d-planner (43), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (2), sridhar1804/local-ai (1)",
        "release=0.20": "noonghunna/club-3090#46 (1), noonghunna/club-3090#91 (1)",
        "release=0.22": "NnamdiOdozi/mlops-assignment (1), graz-dev/vllm-benchmark (2), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1)",
        "release=0.24": "noonghunna/club-3090#612 (1), noonghunna/club-3090#642 (1)",
        "release=0.25": "sostrowsk/dgx-spark-local-llm (3)",
        "release=0.26": "LukeJYK/AutoScientists (1)",
        "release=0.27": "phivan3008/meeting-translator (1), souspilot/DiscoverPhysicsWIP (1)",
        "release=0.28": "AIwork4me/Qwen3.8-27B-ROCm (2)",
        "release=0.29": "Tegdam/pickr_ai (1)",
        "release=0.30": "builderOfTheWorlds/virtualTubers (5)",
        "release=0.6": "0324wy/MapCoder (2), vllm-project/vllm#10360 (1), vllm-project/vllm#10517 (1)",
        "release=0.7": "daxdelvira/distributed_agent_gc (2)",
        "widening card": "40 cases outside the others' envelope: 0324wy/MapCoder (2), 2215860382/VedioSifter (1), AIwork4me/Qwen3.8-27B-ROCm (2), ShanghaoLi0913/memory-aware_RLHF (1), TW-10519/VLLM-ROUTER (1), Tegdam/pickr_ai (1), abinavChandar/demo_env_l4 (1), apollo-mg/Project-Apollo (1), briandepasquale/Controller-Search (1), builderOfTheWorlds/virtualTubers (5), dawn-boy/elloraa (1), daxdelvira/distributed_agent_gc (2), faradawn/bench3 (1), fpolica91/triton-example (1), graz-dev/vllm-benchmark (2), kagaho/VLLM_Serve_llama3-70b-awq_on_L40S_with_Tensor_Parallelism_2 (1), kumaxxp/duo-talk (1), leagames0221-sys/longctx-bench-honest (1), mrpid12org/imageworks (1), noonghunna/club-3090#46 (1), noonghunna/club-3090#612 (1), parallelworks/activate-rag-vllm (1), sostrowsk/dgx-spark-local-llm (3), vllm-project/vllm#10360 (1), vllm-project/vllm#11230 (1), vllm-project/vllm#13061 (1), vllm-project/vllm#13882 (1), vllm-project/vllm#14452 (1), zjpzhao/vllm-qwen3vl-cu118-t4 (2)",
        "widening release": "55 cases outside the others' envelope: 0324wy/MapCoder (2), 2215860382/VedioSifter (1), AIwork4me/Qwen3.8-27B-ROCm (2), LukeJYK/AutoScientists (1), LzyFischer/MemSuit (2), TW-10519/VLLM-ROUTER (1), Tegdam/pickr_ai (1), apollo-mg/Project-Apollo (1), builderOfTheWorlds/virtualTubers (5), daxdelvira/distributed_agent_gc (2), fpolica91/triton-example (1), gpustack/gpustack#1800 (1), joshhickson/LogoMesh (1), kagaho/VLLM_Serve_llama3-70b-awq_on_L40S_with_Tensor_Parallelism_2 (1), kumaxxp/duo-talk (1), leadawon/LAMBO (1), leagames0221-sys/longctx-bench-honest (1), llm-d/llm-d-benchmark (8), noonghunna/club-3090#46 (1), noonghunna/club-3090#612 (1), noonghunna/club-3090#642 (1), noonghunna/club-3090#91 (1), parallelworks/activate-rag-vllm (1), phivan3008/meeting-translator (1), release-sweep (4), solodba/LLMOps (1), sostrowsk/dgx-spark-local-llm (3), souspilot/DiscoverPhysicsWIP (1), vllm-project/vllm#10360 (1), vllm-project/vllm#10517 (2), vllm-project/vllm#13061 (1), vllm-project/vllm#13882 (1), vllm-project/vllm#14452 (1), vllm-project/vllm#32105 (1)",
        "widening architecture": "3 cases outside the others' envelope: llm-d-incubation/llm-d-planner (2), sridhar1804/local-ai (1)",
        "widening modality": "0 cases outside the others' envelope: no case",
        "widening quantization": "9 cases outside the others' envelope: builderOfTheWorlds/virtualTubers (1), llm-d-incubation/llm-d-planner (5), noonghunna/club-3090#612 (1), sostrowsk/dgx-spark-local-llm (2)",
        "widening parallelism": "4 cases outside the others' envelope: llm-d-incubation/llm-d-planner (2), vllm-project/vllm#14452 (1), vllm-project/vllm#32105 (1)",
        "widening connector": "0 cases outside the others' envelope: no case",
        "band weights": "leave-one-source-out error of every case that logs it",
        "band activation": "leave-one-source-out error of every case that logs it",
        "band non_torch": "leave-one-source-out error of every case that logs it",
        "band cuda_graphs": "leave-one-source-out error of every case that logs it",
        "floor": "56 cases nearest the calibrated cell: DaisukeTakai/eval_dataset (1), NnamdiOdozi/mlops-assignment (1), benyucong/neo4j-graphrag-python (1), dennislee22/vLLM-benchmarking (6), kolyangg/mlops-assignment (1), leadawon/LAMBO (4), llm-d-incubation/llm-d-planner (34), llm-d/llm-d-benchmark (1), myoceane.fr/index.php/ai-vllm-a100-gemma-4 (2), noonghunna/club-3090#294 (1), noonghunna/club-3090#295 (1), qweewqq/EnergyLLM (1), vllm-project/vllm#23278 (1), vllm-project/vllm#27508 (1)",
    },
    floor=0.0201,
)
# --- envelope: end

CURRENT = Current(ENVELOPE)
