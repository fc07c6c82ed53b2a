"""Small end-to-end models built from lowbit's kernels, each with a reference pipeline.

`deepseek_block`: a DeepSeek-V4-style block (FP8 attention projections, MXFP4 routed experts,
indexer top-k sparse attention over an MQA KV cache, Sinkhorn hyper-connections) with random
weights, a prefill + decode driver, and ``backend="kernels" | "reference"``.

Importing this package imports no kernel module; the kernels are imported on first use.
"""

from .deepseek_block import (
    BlockConfig,
    DeepSeekBlock,
    KVCache,
    StepResult,
    run_prefill_decode,
)

__all__ = ["BlockConfig", "DeepSeekBlock", "KVCache", "StepResult", "run_prefill_decode"]
