"""The tiles the sparse-attention engines are compiled for, as plain data (no Triton, no Gluon).

`heuristics` picks among them, `portable` and `hopper` are built for them, and the compile tier
compiles every one for sm_90a.
"""

from __future__ import annotations

__all__ = ["MAX_HEAD_DIM", "TILE_TABLE", "COMBINE_HEADS", "HEAD_DIM", "HEADS", "GLUON_TILES"]

#: Largest head dimension the op accepts (DeepSeek V4: 512). The register and shared-memory
#: budgets below are sized for it; larger d would need another tiling.
MAX_HEAD_DIM = 512

# --------------------------------------------------------------------------- Triton kernel
#: heads per program -> (block_kv, num_warps, num_stages, swap_ab), at d = 512, from the sm_90a
#: register / stack / shared-memory reports: swap-AB turns 16 and 32 heads into wgmma (HGMMA, the
#: KV block on the M side); 4 warps spill at 32 and 64 heads; 64 heads with swap at BK 64 has a
#: stack. BK 64 keeps a 64 KB gather in flight while the previous block is multiplied (Little's
#: law wants ~30 KB a SM to cover HBM latency at full bandwidth).
#: Compile tier, Triton 3.6, 2026-11-29, commit f71cfd2: 16 / 32 / 64 heads 142 / 201 / 255 registers, no stack.
TILE_TABLE: dict[int, tuple[int, int, int, bool]] = {
    16: (64, 8, 2, True),
    32: (64, 8, 2, True),
    64: (64, 8, 2, False),
}
#: Heads a program of the split-share combine kernel folds (its FP32 [HC, 512] tile: 64
#: registers a thread at 4 warps).
COMBINE_HEADS = 16

# --------------------------------------------------------------------------- Gluon kernel
#: The only head dimension and head tile of `hopper`'s kernel (DeepSeek V4's MQA: d = 512).
HEAD_DIM = 512
HEADS = 64
#: (block_kv, stages) of `hopper`'s kernel: two KV buffers of ``block_kv`` slots (one a consumer
#: warpgroup), each in two halves of d with their own barriers, beside q's 64 KB.
GLUON_TILES = ((64, 2),)
