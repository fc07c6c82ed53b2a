"""The tiles the block-scaled GEMM engines are compiled for, as plain data (no Triton, no Gluon).

The heuristics (`heuristics`) choose among these, the engines (`portable`, `hopper_fp8`,
`hopper_fp4`) are built for them, and the compile tier compiles every one for sm_90a. A Triton
tile is ``(block_m, block_n, num_warps, num_stages, swap_ab)``; the shapes the register and
shared-memory budgets allow come from the compile tier's reports.
"""

from __future__ import annotations

__all__ = [
    "SCALE_BLOCK",
    "FP8_DECODE_TILES",
    "FP8_MID_TILE",
    "FP8_PREFILL_TILE",
    "FP4_DECODE_TILES",
    "FP4_PREFILL_TILE",
    "FP4_FIX_TILE",
    "FP8_TRITON_TILES",
    "FP4_TRITON_TILES",
    "GLUON_TILES",
    "WS_PAIRS",
    "DECODE_MMA_TILES",
]

#: K step = activation-scale group = edge of the 128x128 weight-scale block (fp8_gemm), and the
#: K of one folded / mma step of fp4_gemm.
SCALE_BLOCK = 128

# --------------------------------------------------------------------------- Triton kernels
#: fp8_gemm's swap-AB decode tiles (M <= 64), by M padded to a power of two >= 16: 64 weight rows
#: on the wgmma M side, the activation rows as its N side; BN = 64 doubles the programs along N
#: before K is split. smem a stage (bm + 64) * 128 B <= 16 KB: 4 stages hide DRAM latency.
FP8_DECODE_TILES = {16: (16, 64, 4, 4, True), 32: (32, 64, 4, 4, True), 64: (64, 64, 4, 4, True)}
#: 64 < M <= 128: 64x128 tiles, one warpgroup (two M tiles rather than one half-empty 128-row one).
FP8_MID_TILE = (64, 128, 4, 4, False)
#: M > 128: 128x128 tiles, two warpgroups; the two FP32 accumulators (running sum + block
#: product) take 128 registers a thread, so 128x256 would spill.
FP8_PREFILL_TILE = (128, 128, 8, 3, False)

#: fp4_gemm's direct-kernel decode tiles (M <= 64), by padded M: swap-AB as fp8_gemm's, 6 stages
#: (a 128-K step moves only 64 * 64 B of weight); at 64 rows the in-register weight upcast and
#: two [64, 64] FP32 accumulators spill with 4 warps, so 8.
FP4_DECODE_TILES = {16: (16, 64, 4, 6, True), 32: (32, 64, 4, 6, True), 64: (64, 64, 8, 6, True)}
#: M > 64: 128x64, two warpgroups: one upcast weight tile serves 128 rows (128x128 spills with
#: the upcast in registers: 255 registers + stack at 8 warps).
FP4_PREFILL_TILE = (128, 64, 8, 3, False)
#: The fold engine's exact fixup: the prefill tile, k_step 128, no split-K (it overwrites output
#: tiles). Its block_n is also the fold's weight rows per leftover flag.
FP4_FIX_TILE = FP4_PREFILL_TILE

#: Every tile of fp8_gemm's / fp4_gemm's Triton kernel.
FP8_TRITON_TILES = (*FP8_DECODE_TILES.values(), FP8_MID_TILE, FP8_PREFILL_TILE)
FP4_TRITON_TILES = (*FP4_DECODE_TILES.values(), FP4_PREFILL_TILE)

# --------------------------------------------------------------------------- Gluon kernels
#: (block_m, block_n, num_warps, stages) of `hopper_fp8`'s kernels. 64x128, one warpgroup: the
#: pairwise kernel (two K blocks an iteration). 128x128 ("8 warps") and 192x128 ("12 warps"):
#: the persistent warp-specialized kernel, two or three consumer warpgroups of 64 rows and a
#: producer warp; 4 stages of 32 / 40 KB (A + B).
GLUON_TILES = ((128, 128, 8, 4), (192, 128, 12, 4), (64, 128, 4, 4))
#: Two products in flight a warpgroup (PAIRS), per consumer warpgroup count: three warpgroups
#: have 160 registers a thread, too few for three [64, 128] FP32 tiles.
WS_PAIRS = {2: True, 3: False}

#: fp4_gemm's decode mma engine (`hopper_fp4`), by padded activation rows (the MMA's N side):
#: (cols, num_warps (16 weight rows each), ring stages); 32 columns reuse the 16-column shape.
#: H200, 2026-11-30, commit 023b217: M=16 (N, K) = (2304, 5120) 4 warps 14.0 us, 2 warps 15.0.
DECODE_MMA_TILES = {16: (16, 4, 4), 32: (32, 4, 4), 64: (64, 4, 4)}
