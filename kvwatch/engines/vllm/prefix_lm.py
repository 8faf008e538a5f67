"""vLLM's default batch for a multimodal prefix LM: one item of its dearest modality in one batch.

A prefix-LM decoder (bidirectional attention over its vision positions) does not chunk multimodal
input, so from 0.22 the API server raises a default max_num_batched_tokens below its largest item's
tokens to that count (memory.batch_limits applies it where the user set none).
"""

from __future__ import annotations

from kvwatch.capacity.dims import ModelDims

# Gemma-4's video ceiling: 32 sampled frames of 70 soft tokens + boi + eoi + ~6 timestamp tokens
# (0.25.1 model_executor/models/gemma4_mm.py:91-92, :257-266; the same in 0.22.0 :87, 0.33.0).
GEMMA4_VIDEO_TOKENS = 32 * (70 + 2 + 6)


def prefix_lm_batch_floor(dims: ModelDims) -> int:
    """The max_num_batched_tokens a multimodal prefix LM needs by default: one item of its most
    expensive modality in one batch, since it does not chunk multimodal input (0.25.1
    engine/arg_utils.py:2630-2650 via _get_min_mm_batched_tokens :2558-2588, every modality the
    model supports counted once, whatever --limit-mm-per-prompt allows). Gemma-4 is the class that
    reports its ceilings: an image's default_output_length and the video's 2,496; audio's
    processor-side length (its E-series towers) is not in config.json and stays below the video's.
    0 for a causal decoder."""
    if not dims.prefix_lm_image_tokens:
        return 0
    return max(dims.prefix_lm_image_tokens, GEMMA4_VIDEO_TOKENS)
