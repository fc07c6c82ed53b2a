"""Pure-PyTorch FP32 references: the ground truth every kernel is tested against.

Written for clarity, not speed; each docstring states the semantics with shapes and dtypes.
Modules: `moe` (W4A16 MoE GEMM in the three routing layouts, a whole MoE block),
`routing` (the routing layout builders), `quant` (act_quant, fp4_quant), `gemm` (fp8_gemm,
fp4_gemm), `attention` (sparse_attn), `sinkhorn` (hc_split_sinkhorn).
"""

from .moe import (  # noqa: F401
    moe_block_ref,
    moe_experts_ref,
    router_topk_ref,
    w4a16_contiguous_ref,
    w4a16_indexed_ref,
    w4a16_masked_ref,
)
from .routing import build_contiguous_ref, build_masked_ref, moe_align_block_size_ref  # noqa: F401
from .quant import act_quant_ref, fp4_quant_ref  # noqa: F401
from .gemm import fp4_gemm_ref, fp8_gemm_ref  # noqa: F401
from .attention import sparse_attn_ref  # noqa: F401
from .sinkhorn import hc_split_sinkhorn_ref  # noqa: F401
