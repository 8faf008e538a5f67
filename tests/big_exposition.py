"""A large engine /metrics body for the hostile-input tests: a real vLLM exposition plus ~100k series.

The extra series are what a busy engine with label churn exposes (per-LoRA histograms, per-reason
counters): families kvwatch does not read, counters among them, as prometheus_client writes them.
"""

from __future__ import annotations

from pathlib import Path

FIXTURE = Path(__file__).parent / "metrics_fixtures" / "vllm-0.10.1-v1.txt"
_BUCKETS = ("1", "2", "5", "10", "20", "50", "100", "200", "500", "+Inf")


def exposition(series: int = 100_000) -> bytes:
    """The fixture followed by ``series`` extra series (histogram buckets and counters), ~67 bytes each."""
    lines = [FIXTURE.read_text().rstrip("\n")]
    lines.append("# HELP vllm:request_prompt_tokens Number of prefill tokens processed.")
    lines.append("# TYPE vllm:request_prompt_tokens histogram")
    per_model = len(_BUCKETS) + 2
    models = series * 9 // 10 // per_model
    for m in range(models):
        labels = f'engine="0",model_name="l{m:05d}"'
        for le in _BUCKETS:
            lines.append(f'vllm:request_prompt_tokens_bucket{{{labels},le="{le}"}} {m % 97}.0')
        lines.append(f"vllm:request_prompt_tokens_count{{{labels}}} {m % 97}.0")
        lines.append(f"vllm:request_prompt_tokens_sum{{{labels}}} {m * 3}.0")
    lines.append("# HELP vllm:request_success_total Count of successfully processed requests.")
    lines.append("# TYPE vllm:request_success_total counter")
    for i in range(series - models * per_model):
        lines.append(f'vllm:request_success_total{{engine="0",finished_reason="r{i:06d}"}} {i}.0')
    return ("\n".join(lines) + "\n").encode()
