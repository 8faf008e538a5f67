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
        "card": frozenset({}),
        "release": frozenset({"0.5.3"}),
        "architecture": frozenset({}),
        "modality": frozenset({"text"}),
        "quantization": frozenset({"none"}),
        "parallelism": frozenset({"tp >= 2"}),
        "connector": frozenset({"none"}),
    },
    term_bands={},
    widening={
        "card": 0.059,
        "release": 0.059,
        "architecture": 0.059,
        "modality": 0.059,
        "quantization": 0.0895,
        "parallelism": 0.0895,
        "connector": 0.059,
    },
    cases={
        "architecture=dense": "sgl-project/sglang#11716 (1)",
        "architecture=hybrid linear-attention": "sgl-project/sglang#10407 (1), sgl-project/sglang#12419 (1)",
        "architecture=sparse MLA (indexer)": "sgl-project/sglang#11309 (2)",
        "card=B200": "sgl-project/sglang#11309 (2)",
        "card=H20": "sgl-project/sglang#10407 (1)",
        "card=H200": "sgl-project/sglang#11716 (1)",
        "card=MI300X": "sgl-project/sglang#12419 (1)",
        "connector=none": "sgl-project/sglang#10407 (1), sgl-project/sglang#11309 (2), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1)",
        "modality=text": "sgl-project/sglang#10407 (1), sgl-project/sglang#11309 (2), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1)",
        "parallelism=dp attention": "sgl-project/sglang#11309 (2)",
        "parallelism=tp >= 2": "sgl-project/sglang#10407 (1), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1)",
        "quantization=fp8": "sgl-project/sglang#11309 (2)",
        "quantization=none": "sgl-project/sglang#10407 (1), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1)",
        "release=0.5.2": "sgl-project/sglang#10407 (1)",
        "release=0.5.3": "sgl-project/sglang#11309 (2), sgl-project/sglang#11716 (1)",
        "release=0.5.4": "sgl-project/sglang#12419 (1)",
        "widening card": "7 cases outside the others' envelope: ajith-sirra-amd/Issues (1), sgl-project/sglang#10407 (1), sgl-project/sglang#11309 (2), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1), sgl-project/sglang#39713 (1)",
        "widening release": "7 cases outside the others' envelope: ajith-sirra-amd/Issues (1), sgl-project/sglang#10407 (1), sgl-project/sglang#11309 (2), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1), sgl-project/sglang#39713 (1)",
        "widening architecture": "7 cases outside the others' envelope: ajith-sirra-amd/Issues (1), sgl-project/sglang#10407 (1), sgl-project/sglang#11309 (2), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1), sgl-project/sglang#39713 (1)",
        "widening modality": "1 cases outside the others' envelope: ajith-sirra-amd/Issues (1)",
        "widening quantization": "6 cases outside the others' envelope: ajith-sirra-amd/Issues (1), sgl-project/sglang#10407 (1), sgl-project/sglang#11309 (2), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1)",
        "widening parallelism": "6 cases outside the others' envelope: sgl-project/sglang#10407 (1), sgl-project/sglang#11309 (2), sgl-project/sglang#11716 (1), sgl-project/sglang#12419 (1), sgl-project/sglang#39713 (1)",
        "widening connector": "0 cases outside the others' envelope: no case",
    },
)
# --- envelope: end

CURRENT = Current(ENVELOPE)
