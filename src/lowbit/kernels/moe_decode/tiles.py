"""The tiles the output-centric decode engines are compiled for, as plain data (no Triton, no
Gluon): the heuristics pick from them, the engines and the compile tier build them.

Measurements below: Kimi K2.x EP8 layer (48 experts, H 7168, I 2048, top-8), gate_up + down,
CUDA-graph replay, L2 flushed.
"""

from __future__ import annotations

__all__ = [
    "FMT_INT4",
    "FMT_MXFP8",
    "ROUTE_CHUNK",
    "WEIGHT_FORMATS",
    "MMA_FORMATS",
    "TILES",
    "MMA_SPLITS",
    "MMA_SPLITS_MXFP8",
    "MMA_EXTRA_TILES",
]

#: Weight format codes, the Triton kernels' ``FMT`` constexpr.
FMT_INT4 = 0
FMT_MXFP8 = 1
#: Routes scanned at once when a gate_up owner looks for the routes sharing its expert (dot and mma engines).
ROUTE_CHUNK = 64

#: The heuristics' names of the weight formats; ``"mxfp8_k256"``: MXFP8 in the k256-interleaved
#: layout, which only the mma engine reads.
WEIGHT_FORMATS = ("int4", "mxfp8", "mxfp8_k256")
#: The formats the mma engine (sm_90, Gluon) reads.
MMA_FORMATS = ("int4", "mxfp8_k256")

#: Tiles per (engine, weight format): (block_i, block_h, num_warps, num_stages, measured). The
#: fma engine's stages pipeline its K loops (``tl.range(num_stages=)``); the mma engine's are its
#: cp.async ring's depth (tokens and splits: `MMA_SPLITS`; num_warps unused).
TILES = {
    #: H200, 2026-11-29, commits 03c2eac / 059f10d: 163.7 us at M=1 (16x16 4 warps 169.2; 2-4 stages 194.7+)
    ("fma", "int4"): (64, 64, 8, 1, "H200 M=1: 163.7 us (16x16 tiles: 169.2; 2-4 stages: 194.7+)"),
    #: H200, 2026-11-29, commit 059f10d: 151.2 us at M=1 with 3 stages (1 stage 176.3; 32x32 4 warps 200.5)
    ("fma", "mxfp8"): (16, 16, 2, 3, "H200 M=1: 151.2 us with 3 stages (1 stage: 176.3)"),
    #: H200, 2026-11-29, commit 03c2eac: 800.3 us at M=8 (64x32 2 stages 966.0; 128x64 8 warps 957.9)
    ("dot", "int4"): (64, 64, 4, 3, "H200 M=8: 800.3 us (64x32 2-stage: 966.0)"),
    #: H200, 2026-11-29, commit 03c2eac: 1167.6 us at M=8 (64x64 3 stages 1390.3; 32x32 1382.7)
    ("dot", "mxfp8"): (64, 32, 4, 2, "H200 M=8: 1167.6 us (64x64 3-stage: 1390.3)"),
    #: H200, 2026-11-30, commit 1f915eb: 89.1 us at M=1, 405.8 at M=8
    ("mma", "int4"): (16, 16, 4, 4, "H200 M=1: 89.1 us, M=8: 405.8 (`MMA_SPLITS`)"),
    #: H200, 2026-11-30, commit c08f96b: INT4's tile, not swept for MXFP8; 124.9 us at M=1, 532.8 at M=8
    ("mma", "mxfp8_k256"): (16, 16, 4, 4, "H200 M=1: 124.9 us, M=8: 532.8, M=16: 833.3 (`MMA_SPLITS_MXFP8`)"),
}

#: The mma engine's MMA columns and warp splits by batch M, INT4: (max M, tokens, split_gate_up,
#: split_down), the first row that fits. A split of s gives each of s warps ``tokens / s``
#: columns and 1/s of the work (gate_up: of K; down: of the expert visits), so small batches
#: still put several warps on each 16-row weight block.
#: H200, 2026-11-30, commit 1f915eb, 4 stages: gate_up split 2 51.3 vs split 1 56.5 us at M=1, split 1 207.7 vs split 2 219.9 at M=8; down split 2 37.7 vs split 4 46.6 at M=1
MMA_SPLITS = (
    (4, 8, 2, 2),
    (8, 8, 1, 2),
    (1 << 30, 16, 1, 2),
)
#: The same for k256-interleaved MXFP8 (twice INT4's words a K step, so one gate_up warp a K
#: chunk streams enough bytes alone).
#: H200, 2026-11-30, commit 988f3b5: (8, 1, 2) 833.3 vs (16, 1, 2) 940.4 us at M=16; (16, 1, 1) 1326.2 vs 1367.0 at M=32
MMA_SPLITS_MXFP8 = (
    (16, 8, 1, 2),
    (1 << 30, 16, 1, 1),
)
#: (columns, split) tiles the compile tier builds beyond the heuristics' picks, so that an
#: override reaching them is known to build.
MMA_EXTRA_TILES = ((8, 1), (8, 4), (8, 8), (16, 1), (32, 1))
