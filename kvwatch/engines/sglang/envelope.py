"""SGLang's calibration envelope: ONE table of what its real startups cover and how much wider the
band is outside it.

Written by ``python -m bench.bench_accuracy --write`` from the SGLang cases of tests/apriori/public
(never by hand); tests/test_accuracy.py holds it equal to what the cases give. See
kvwatch/capacity/envelope.py for what each figure means. It holds no term bands: SGLang's band
terms are predict.py's ``BAND`` (fitted by bench/accuracy_sglang.py), which this table's widening
is added to.
"""

from __future__ import annotations

from kvwatch.capacity.envelope import Current, Envelope

# The newest release whose source kvwatch's rules were read from (budget.py).
NEWEST_READ = "0.5.23"

# --- envelope: begin
ENVELOPE = Envelope(
    newest_read=NEWEST_READ,
    covered={
        "card": frozenset({"H100"}),
        "release": frozenset({"0.5.4"}),
        "architecture": frozenset({"dense"}),
        "modality": frozenset({"text"}),
        "quantization": frozenset({"none"}),
        "parallelism": frozenset({"tp 1", "tp >= 2"}),
        "connector": frozenset({"none"}),
    },
    term_bands={},
    widening={
        "card": 0.01,
        "release": 0.0008,
        "architecture": 0.0155,
        "modality": 0.0101,
        "quantization": 0.0155,
        "parallelism": 0.0008,
        "connector": 0.0008,
    },
    cases={
        "architecture=MoE": "StevenWang-CY/sglang-attention-reproducibility (2), vllm-project/vllm#21348 (1)",
        "architecture=dense": "AUGMXNT/llm-tracker.info-vault (1), MaxUhl98/Thesis (1), RyanRosario/llm-d (1), Stars1233/sgl-project.github.io (9), StevenWang-CY/sglang-attention-reproducibility (4), cli991/qwctest (1), didier-durand/llms-in-clouds (1), farbodtavakkoli/OTel (1), jerryzsj/my-deepseek-r1 (1), sgl-project/sglang#11716 (1), sgl-project/sglang#4760 (1), udbhav-ag/SGLang_setup (1), ugyhybnb/sglang-performance-test (1)",
        "architecture=hybrid linear-attention": "sgl-project/sglang#10407 (1), sgl-project/sglang#12419 (1)",
        "architecture=sliding-window": "sgl-project/sglang#19718 (1)",
        "architecture=sparse MLA (indexer)": "sgl-project/sglang#11309 (2)",
        "card=A100": "StevenWang-CY/sglang-attention-reproducibility (1), cli991/qwctest (1)",
        "card=B200": "StevenWang-CY/sglang-attention-reproducibility (1), sgl-project/sglang#11309 (2)",
        "card=H100": "RyanRosario/llm-d (1), Stars1233/sgl-project.github.io (9), StevenWang-CY/sglang-attention-reproducibility (1), farbodtavakkoli/OTel (1), sgl-project/sglang#4760 (1), vllm-project/vllm#21348 (1)",
        "card=H20": "sgl-project/sglang#10407 (1)",
        "card=H200": "sgl-project/sglang#11716 (1)",
        "card=L4": "didier-durand/llms-in-clouds (1)",
        "card=L40S": "udbhav-ag/SGLang_setup (1)",
        "card=MI300X": "AUGMXNT/llm-tracker.info-vault (1), sgl-project/sglang#12419 (1)",
        "card=RTX-3090": "jerryzsj/my-deepseek-r1 (1)",
        "card=RTX-4090": "MaxUhl98/Thesis (1), ugyhybnb/sglang-performance-test (1)",
        "card=RTX-PRO-6000": "sgl-project/sglang#19718 (1)",
        "card=unlisted card": "StevenWang-CY/sglang-attention-reproducibility (3)",
        "connector=none": "AUGMXNT/llm-tracker.info-vault (1), MaxUhl98/Thesis (1), RyanRosario/llm-d (1), Stars1233/sgl-project.github.io (9), StevenWang-CY/sglang-attention-reproducibility (6), cli991/qwctest (1), didier-durand/llms-in-clouds (1), farbodtavakkoli/OTel (1), jerryzsj/my-deepseek-r1 (1), sgl-project/sglang#10407 (1), sgl-project/sglang#11309 (2), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1), sgl-project/sglang#19718 (1), sgl-project/sglang#4760 (1), udbhav-ag/SGLang_setup (1), ugyhybnb/sglang-performance-test (1), vllm-project/vllm#21348 (1)",
        "modality=text": "AUGMXNT/llm-tracker.info-vault (1), MaxUhl98/Thesis (1), RyanRosario/llm-d (1), Stars1233/sgl-project.github.io (9), cli991/qwctest (1), didier-durand/llms-in-clouds (1), farbodtavakkoli/OTel (1), jerryzsj/my-deepseek-r1 (1), sgl-project/sglang#10407 (1), sgl-project/sglang#11309 (2), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1), sgl-project/sglang#19718 (1), sgl-project/sglang#4760 (1), udbhav-ag/SGLang_setup (1), ugyhybnb/sglang-performance-test (1), vllm-project/vllm#21348 (1)",
        "modality=vision tower": "StevenWang-CY/sglang-attention-reproducibility (6)",
        "parallelism=dp attention": "sgl-project/sglang#11309 (2)",
        "parallelism=tp 1": "AUGMXNT/llm-tracker.info-vault (1), MaxUhl98/Thesis (1), RyanRosario/llm-d (1), Stars1233/sgl-project.github.io (9), StevenWang-CY/sglang-attention-reproducibility (6), cli991/qwctest (1), farbodtavakkoli/OTel (1), jerryzsj/my-deepseek-r1 (1), sgl-project/sglang#19718 (1), sgl-project/sglang#4760 (1), udbhav-ag/SGLang_setup (1)",
        "parallelism=tp >= 2": "didier-durand/llms-in-clouds (1), sgl-project/sglang#10407 (1), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1), ugyhybnb/sglang-performance-test (1), vllm-project/vllm#21348 (1)",
        "quantization=fp8": "sgl-project/sglang#11309 (2), vllm-project/vllm#21348 (1)",
        "quantization=mxfp4": "sgl-project/sglang#19718 (1)",
        "quantization=none": "AUGMXNT/llm-tracker.info-vault (1), MaxUhl98/Thesis (1), RyanRosario/llm-d (1), Stars1233/sgl-project.github.io (9), StevenWang-CY/sglang-attention-reproducibility (6), cli991/qwctest (1), didier-durand/llms-in-clouds (1), farbodtavakkoli/OTel (1), jerryzsj/my-deepseek-r1 (1), sgl-project/sglang#10407 (1), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1), sgl-project/sglang#4760 (1), udbhav-ag/SGLang_setup (1), ugyhybnb/sglang-performance-test (1)",
        "release=0.3.0": "AUGMXNT/llm-tracker.info-vault (1)",
        "release=0.3.4": "Stars1233/sgl-project.github.io (2)",
        "release=0.4.0": "Stars1233/sgl-project.github.io (2)",
        "release=0.4.2": "Stars1233/sgl-project.github.io (5), jerryzsj/my-deepseek-r1 (1)",
        "release=0.4.3": "didier-durand/llms-in-clouds (1)",
        "release=0.4.4": "sgl-project/sglang#4760 (1)",
        "release=0.4.7": "MaxUhl98/Thesis (1)",
        "release=0.4.9": "vllm-project/vllm#21348 (1)",
        "release=0.5.10": "StevenWang-CY/sglang-attention-reproducibility (3)",
        "release=0.5.13": "ugyhybnb/sglang-performance-test (1)",
        "release=0.5.14": "StevenWang-CY/sglang-attention-reproducibility (1)",
        "release=0.5.18": "farbodtavakkoli/OTel (1)",
        "release=0.5.19": "RyanRosario/llm-d (1)",
        "release=0.5.2": "sgl-project/sglang#10407 (1)",
        "release=0.5.3": "sgl-project/sglang#11309 (1)",
        "release=0.5.4": "sgl-project/sglang#11309 (1), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1)",
        "release=0.5.5": "StevenWang-CY/sglang-attention-reproducibility (2)",
        "release=0.5.7": "udbhav-ag/SGLang_setup (1)",
        "release=0.5.9": "cli991/qwctest (1), sgl-project/sglang#19718 (1)",
        "widening card": "21 cases outside the others' envelope: AUGMXNT/llm-tracker.info-vault (1), MaxUhl98/Thesis (1), StevenWang-CY/sglang-attention-reproducibility (5), ajith-sirra-amd/Issues (1), cli991/qwctest (1), didier-durand/llms-in-clouds (1), farbodtavakkoli/OTel (2), jerryzsj/my-deepseek-r1 (1), sgl-project/sglang#10407 (1), sgl-project/sglang#11309 (2), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1), sgl-project/sglang#19718 (1), udbhav-ag/SGLang_setup (1), ugyhybnb/sglang-performance-test (1)",
        "widening release": "36 cases outside the others' envelope: AUGMXNT/llm-tracker.info-vault (1), MaxUhl98/Thesis (1), RyanRosario/llm-d (1), Stars1233/sgl-project.github.io (9), StevenWang-CY/sglang-attention-reproducibility (6), ajith-sirra-amd/Issues (1), cli991/qwctest (1), didier-durand/llms-in-clouds (1), farbodtavakkoli/OTel (3), jerryzsj/my-deepseek-r1 (1), sgl-project/sglang#10407 (1), sgl-project/sglang#11309 (2), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1), sgl-project/sglang#19718 (1), sgl-project/sglang#39713 (1), sgl-project/sglang#4760 (1), udbhav-ag/SGLang_setup (1), ugyhybnb/sglang-performance-test (1), vllm-project/vllm#21348 (1)",
        "widening architecture": "9 cases outside the others' envelope: StevenWang-CY/sglang-attention-reproducibility (2), ajith-sirra-amd/Issues (1), sgl-project/sglang#10407 (1), sgl-project/sglang#11309 (2), sgl-project/sglang#12419 (1), sgl-project/sglang#19718 (1), vllm-project/vllm#21348 (1)",
        "widening modality": "7 cases outside the others' envelope: StevenWang-CY/sglang-attention-reproducibility (6), ajith-sirra-amd/Issues (1)",
        "widening quantization": "5 cases outside the others' envelope: ajith-sirra-amd/Issues (1), sgl-project/sglang#11309 (2), sgl-project/sglang#19718 (1), vllm-project/vllm#21348 (1)",
        "widening parallelism": "2 cases outside the others' envelope: sgl-project/sglang#11309 (2)",
        "widening connector": "0 cases outside the others' envelope: no case",
        "floor": "13 cases nearest the calibrated cell: RyanRosario/llm-d (1), Stars1233/sgl-project.github.io (9), farbodtavakkoli/OTel (1), sgl-project/sglang#39713 (1), sgl-project/sglang#4760 (1)",
    },
    floor=0.0163,
)
# --- envelope: end

CURRENT = Current(ENVELOPE)
