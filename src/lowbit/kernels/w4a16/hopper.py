"""Hopper (sm_90a) Gluon kernels of the W4A16 GEMMs (grouped contiguous, grouped masked,
indexed): the dequantization of K step ``k + 1`` overlapped with the tensor-core products of
step ``k``.

Why they exist. Every Triton W4A16 kernel of this library (indexed, contiguous, masked; every
tile) compiles to ``wgmma.wait_group 0`` after each K step: Triton retires a step's wgmma
before the next step's dequantization starts, so the CUDA cores (dequant) and the tensor cores
(wgmma) take turns (docs/performance.md). Gluon exposes the wait.

Common to both variants: per 256-wide K step a ``STAGES``-deep TMA ring brings the packed words
(``[BW, 32]`` i32 of the ``[E * N, Kp / 8]`` view) and the scales (``[8, BW]`` bf16 of the
``[E * Kp / 32, N]`` view, unswizzled and read through a plain view: group i is row i), plus,
for the grouped layouts, eight ``[BR, 32]`` activation boxes (the packing pairs group i with
group i + 4 in one word, so each weight group meets the activation columns of its own group).
Dequantization is `int4_dequant`'s PTX: for the register-A kernels its subnormal form (prmt, and,
one fma.bf16x2 a weight pair: ``dequant_byte_subnormal_ptx(j)``, two K-adjacent words a byte,
straight into the fragment registers, or ``dequant_group_subnormal_ptx(g)`` a group at a time),
whose weights are 2^-64 times the true ones, so every register-A main loop hands its
accumulator back through `_unscaled` (exact: the bits are those of every other path);
``DEQUANT_PAIR_PTX`` (lop3 + two fma) for the shared-memory ones.
The weight rows are wgmma's M side (as the Triton kernels' swap-AB tiles).

- **Register-A** (engine ``gluon_rs``; one main loop `_rs_mainloop` under
  `_w4a16_grouped_rs_kernel` and `_w4a16_indexed_rs_kernel`): the words are loaded from the
  ring straight into wgmma's A-fragment layout (``DotOperandLayout``), dequantized in place,
  and fed to eight asynchronous register-A wgmmas; step k+1 is dequantized while step k's
  products run, then ``wait_group 0``; a stage's words are refilled as soon as they are
  dequantized, its activations once the products retire. No shared-memory round trip, no fence; 128 weight rows
  (two warpgroups) fit a CTA. The indexed kernel gathers its routed rows (row ``id // top_k``
  of route ``id``) by cp.async into the same ring (zero-filled for sentinels and the K tail),
  so no register holds them and 16- to 128-row routing blocks fit. The default on sm_90 where
  it measured faster (H200, 2026-11-29: grouped contiguous 2.0-2.1x the Triton kernel, masked
  1.04-1.36x, indexed decode 1.15-1.49x and prefill 1.38-1.42x; the tile tables below and
  the heuristics carry the numbers).
- **Warp-specialized register-A** (engine ``gluon_ws``; `_ws_mainloop` under the same two
  kernels, two-warpgroup tiles and the indexed 256x64): the same arithmetic, bit-identical, but a producer
  partition issues every load (TMA rows and weights; the indexed kernel's 4-warp producer also
  gathers the routed rows by cp.async, signalled with ``cp.async.mbarrier.arrive.noinc``) as
  soon as the consumers release a stage by mbarrier, so no CTA barrier is left in the loop.
  The default for the two-warpgroup tiles of contiguous, the masked split tiles and the
  128-row indexed block's one-step K and thin grids (H200, sixth session: 1.03-1.20x `gluon_rs`;
  `GLUON_WS_TILES` has the numbers).
- **Four warpgroups** (engine ``gluon_rs`` with a 256-weight-row tile; `_rs_groups_mainloop`
  under the same two kernels, 16 warps): each activation block is read once for 256 weight
  rows, half the activation bytes a FLOP of the 128-row tiles (their bound: the seventh
  session's 128x128 lost 24% to its activation loads). At 128 registers a thread the
  accumulator leaves no room for a step's fragments twice, so a step is dequantized one group
  at a time under the previous group's wgmma. The prefill default where the grid has two waves
  of programs (H200, eighth session: 1.03-1.19x the warp-specialized 128-row tiles). Its
  256x64 has a warp-specialized form (`_ws_groups_partition`, eighteenth session: 1.12-1.15x),
  since the twenty-first session on request only: the 64-row blocks run the one-warpgroup
  128x64 below (1.01-1.18x it).
- **One warpgroup, 128 weight rows** (`WIDE_DECODE_TILES`, the 128x64 of `GROUP_LOOP_MAXNREG`):
  the group loop with two m64 wgmmas a group under a register cap (96-168), so two to five CTAs
  share an SM where the four-warpgroup tiles run one. The 8- to 64-row routing blocks and
  masked tiles where their grid allows (twentieth and twenty-first sessions: 1.04-1.37x). The
  128x64 holds one step of activations, refilled a half step at a time (`_rs_halves_mainloop`,
  `HALF_ACT_TILES`): 68 KB, three CTAs an SM (twenty-sixth session: 1.01-1.17x).
- **Half-row tails** (`HALF_TAIL_TILES`, `SPLIT_HI_TAIL_TILES`): a row block whose live rows end
  in its first half (an expert's last block) runs a second copy of the main loop compiled for
  half the rows (the split tiles: for their power-of-two part), in the same program and the
  same shared memory, so the wgmmas skip rows that are never stored. Where the tensor cores
  bound the tile (128-row blocks, masked) that is 1.04-1.18x (H200, seventeenth session).
- **N loop** (`_w4a16_indexed_nloop_kernel`, indexed, K of one 256-wide step: Kimi TP8 down):
  one program gathers its routed rows once and runs 8 to 56 weight tiles over them, as many as
  the grid allows (`nloop_n_tiles`), the next tiles' words in the TMA ring, each tile stored as it
  retires; a 128-row block with no route in its second half runs the 64-row copy
  (`NLOOP_HALF_TAIL_TILES`).
- **Shared-memory** (engine ``gluon``; `_w4a16_grouped_sm90_kernel`,
  `_w4a16_indexed_sm90_kernel`): dequantized weights stored into two sets of eight
  ``[64, 32]`` buffers, SS-wgmma, ``wait_group 8`` retires only the previous step; its indexed
  kernel loads the routed rows into registers a step ahead. Measured 0.35-0.84x the Triton
  kernels: kept as the comparison point, not a default.

Indexed layout (both): outputs go to row ``id`` (times the routing weight when given); sentinel
slots, ``-1`` expert blocks and blocks past the device-side padded count are skipped as in the
Triton kernel.

Gluon does not run under the Triton interpreter: the Triton kernels stay the path on CPU and
on any other GPU; the compile tier builds every tile for sm_90a (HGMMA in the SASS, the wait
depth in the PTX, no spills).
"""

from __future__ import annotations

import itertools
import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ...routing.layouts import live_block_bound
from ...runtime.pdl import gl_release_next, gl_wait_prior, launch_options
from ...runtime.device import H200_NUM_SMS, num_sms
from .int4 import (DEQUANT_PAIR_PTX, SUBNORMAL_ACC_SCALE, dequant_byte_subnormal_ptx,
                           dequant_group_subnormal_ptx, scale_factors_ptx)

__all__ = ["GLUON_RS_TILES", "GLUON_SPLIT_WS_TILES", "GLUON_TILES", "GLUON_WS_TILES", "WS_TAIL_TILES", "INDEXED_WS_TILES", "INDEXED_RS_TILES", "INDEXED_TILES",
           "GLUON_SPLIT_TILES", "NLOOP_HALF_TAIL_TILES", "NLOOP_N_TILES", "NLOOP_TILES", "nloop_n_tiles", "nloop_tile_counts", "WIDE_TILE_MIN_PROGRAMS", "compile_configs", "runs_nloop",
           "split_tile_rows", "tail_rows", "nloop_tail_rows", "half_acts_note", "wide_tile_pays", "masked_row_slots",
           "w4a16_grouped_sm90_launch", "w4a16_grouped_split_launch", "w4a16_indexed_sm90_launch"]

#: (weight rows, activation rows, num_warps, stages): one warpgroup, 64 weight rows on the
#: wgmma M side; 128 activation rows = one contiguous segment. Shared memory a stage: packed
#: words [64, 32] i32 (8 KB) + scales [8, 64] bf16 (1 KB) + activations 8 x [BR, 32] bf16 (64 KB
#: at BR 128); plus two sets of dequantized weights (2 x 8 x 4 KB). 227 KB caps the stages.
GLUON_TILES = ((64, 128, 4, 2), (64, 64, 4, 3))
#: The indexed kernel's tiles, (weight rows, routing block size, num_warps, stages): the stages
#: ring holds words + scales (9 KB a stage); gathered rows and dequantized weights ping-pong in
#: two buffer sets. 3 stages at BR <= 32 keep a CTA under 113 KB: two CTAs an SM.
INDEXED_TILES = ((64, 16, 4, 3), (64, 32, 4, 3), (64, 64, 4, 3), (64, 16, 4, 6))
#: The register-A indexed kernel's tiles (same fields; the first of a routing block is its
#: default). The routed rows are gathered by cp.async into the stage ring, so no register holds
#: them: 122-140 registers at 16-32 rows, 156-231 at 64-128 (compile tier, no spills).
#: H200 2026-11-29 (fourth session), Kimi EP8 gate_up + down, CUDA graph, us:
#:   16-row block, 1 / 4 / 20 tokens: 64x16 3 stages 103.7 / 258.2 / 478.7 (4 CTAs an SM), 4 stages
#:   113.3 / 258.7 / 480.7, 6 stages 117.7 / 298.5 / 562.7; 128x16 136.2 / 360.4 / 692.9
#:   64-row block, 256 tokens: 128x64 866.0, 64x64 982.7; 128-row block, 1024 tokens: 128x128
#:   2484.5, 64x128 2836.0 (`w4a16_indexed._GLUON_BLOCKS` has the comparison with Triton)
#: 32-row block, sixteenth session (`scripts/probes/mid_tiles.py`, same process, interleaved, us):
#:   64x32 first: TP8 512 / 1024 tokens gate_up 332.1 / 343.0 vs 128x32 383.3 / 396.0; EP8 100 /
#:   150 / 190 tokens gate_up 329.3 / 358.4 / 462.9 vs Triton 32-row 439.1 / 481.1 / 612.1, down
#:   191.7 / 218.5 / 268.9 vs 236.9 / 262.5 / 320.4. A one-step K runs the block's N-loop tile
#:   instead (`w4a16_indexed._fit_engine`: TP8 down 1.4-2.7x the 64-row tiles).
#: 64- and 128-row blocks, eighth session: the four-warpgroup tiles (256 weight rows, 16 warps,
#:   `_rs_groups_mainloop`; 102-128 registers, no spills) first, H200 (`scripts/probes/wide_tile.py`,
#:   same process, bit-identical, us, warp-specialized 128-row tile -> 256): EP8 256 tokens gate_up
#:   509.2 -> 468.2, down 287.1 -> 261.8; 1024 tokens 1364.0 -> 1243.0 and 727.2 -> 649.7; TP8 8192
#:   tokens gate_up 1364.0 -> 1191.9. 256x16 at 20 tokens: 0.80x / 0.74x the 64x16 tile (not kept);
#:   64-row blocks at 1024 tokens: 0.84-0.87x the 128-row ones on the 256-row tile too.
#: 8-row block, and the 16-row block's group-loop tile first, nineteenth session
#: (`scripts/probes/decode_blocks.py`): see `GROUP_LOOP_MAXNREG`. Twenty-first session: the
#: 32-row block's 128-row form (`WIDE_DECODE_TILES`) and the 64-row block's one-warpgroup
#: 128x64 first (`GROUP_LOOP_MAXNREG`; the four-warpgroup 256x64 where `wide` asks for it).
INDEXED_RS_TILES = ((64, 8, 4, 2), (64, 8, 4, 3), (128, 8, 4, 2),
                    (64, 16, 4, 2), (64, 16, 4, 3), (64, 16, 4, 4), (64, 16, 4, 6), (128, 16, 8, 4), (128, 16, 4, 2),
                    (64, 32, 4, 4), (128, 32, 8, 4), (128, 32, 4, 2),
                    (128, 64, 4, 2), (256, 64, 16, 3), (128, 64, 8, 3), (64, 64, 4, 3), (256, 128, 16, 2),
                    (128, 128, 8, 2), (64, 128, 4, 2))
#: The register-A grouped kernel's tiles (weight rows, rows, num_warps, stages): no dequantized
#: buffers in shared memory, so 128 weight rows (two warpgroups) fit beside the activation ring.
#: 154-195 registers, no spills (compile tier). The first tile of a row count is its default:
#: H200 2026-11-29, Kimi EP8 gate_up + down, CUDA graph: contiguous 128 rows/expert 128x128
#: 1283 us, 128x64 1714, 64x128 1861 (2 or 3 stages), Triton 2560; 256 rows/expert 2664 / 3494 /
#: 4137, Triton 5579; masked 32 tok/expert (128x64) 860, Triton 1173.
#: Masked decode, 16- and 32-row tiles (fourth session, us): 8 tok/expert 64x16 600.0, 128x16
#: 615.1 (Triton 621.3); 16 tok/expert 64x32 666.2, 128x32 749.1 (Triton 701.0); 32 tok/expert
#: 128x64 854.0, 64x32 924.1. Fifth session (L2 flush by reads, new dequantization): 8 tok/expert
#: 64x16 with 3 stages 533.5 (4 CTAs an SM), 4 stages 561.6; 16 tok/expert 64x32 3 stages 631.1,
#: 4 stages 629.3 (both 2 CTAs an SM: 156-160 registers).
#: Eighth session: the four-warpgroup tiles (256 weight rows, `_rs_groups_mainloop`) first for 128
#: and 64 rows where the grid allows (`wide_tile_pays`); `w4a16_grouped` has the numbers. Tried
#: and not kept (same process): masked 8 tok/expert 256x16 0.94x / 0.87x (gate_up / down) the
#: 64x16 tile; 16 tok 256x32 1.01x / 1.05x the 64x32; 32 tok 256x32 0.83x / 0.79x the 256x64.
#: Twenty-first session: the masked 64-row M tile runs the one-warpgroup 128x64 first, and the
#: 32-row one its 128-row form (`GROUP_LOOP_MAXNREG`, `WIDE_DECODE_TILES` have the numbers).
GLUON_RS_TILES = ((256, 128, 16, 2), (128, 128, 8, 2), (128, 64, 4, 2), (256, 64, 16, 3), (128, 64, 8, 3),
                  (64, 128, 4, 2), (64, 128, 4, 3), (64, 32, 4, 4), (64, 32, 4, 2), (128, 32, 8, 4), (128, 32, 4, 2),
                  (64, 16, 4, 2), (64, 16, 4, 3), (64, 16, 4, 4), (128, 16, 8, 4), (128, 16, 4, 2))
#: The warp-specialized grouped kernel's tiles (engine ``gluon_ws``, `_ws_mainloop`): the
#: two-warpgroup register-A tiles. A 4-warp tile plus its producer warp compiles to 255
#: registers a thread (ptxas ignores the partitions' setmaxnreg), one CTA an SM, where the
#: register-A kernel runs two to four: not offered. 168 registers, no spills (compile tier).
#: H200 2026-11-29 (`scripts/probes/ws_grouped.py`, Kimi EP8 contiguous gate_up, CUDA graph,
#: bit-identical to `gluon_rs`): 128 rows/expert 128x128 767.8 vs 894.7 us (1.17x), 128x64
#: 970.5 vs 1163.2 (1.20x); 256 rows/expert 128x128 1599.4 vs 1803.5 (1.13x).
#: And the four-warpgroup 256x64 (`_ws_groups_partition`, with `WS_TAIL_TILES`; 96 registers, the
#: indexed tile below has the limits): the masked 64-row M tile's default where 256-row programs
#: fill two waves until the twenty-first session's one-warpgroup 128x64 (`GROUP_LOOP_MAXNREG`);
#: now on request (`LOWBIT_W4A16_GROUPED_ENGINE=gluon_ws`, `_BLOCK_N=256`). H200, eighteenth
#: session (`scripts/probes/ws_wide.py`, interleaved, bit-identical valid rows, us, gate_up /
#: down): masked 32 tok/expert (22-42 rows) register-A 256x64 with its half tail 384.4 / 219.5,
#: warp-specialized with tails 352.8 / 213.6. Not for
#: contiguous (0.69-0.70x 256x128, which it cannot replace) nor masked 64 (0.87-0.90x the split 96).
GLUON_WS_TILES = tuple(t for t in GLUON_RS_TILES if t[2] == 8) + ((256, 64, 16, 3),)
#: The indexed kernel's warp-specialized tiles (engine ``gluon_ws``): the two-warpgroup
#: register-A tiles, the routed rows gathered by the producer warp's cp.async; and the
#: four-warpgroup 256x64 (`_ws_groups_partition`). Its producer makes 20 warps, so ptxas caps every
#: thread at 96 registers: enough for a 64-row accumulator (no spills, compile tier), not for
#: 256x128's (C7512: wgmmas serialized, at any producer size: Triton pads a worker to four warps).
#: H200, eighteenth session (`scripts/probes/ws_wide.py`, one process, interleaved,
#: bit-identical, us, gate_up / down, Kimi EP8): 256 tokens (43 routes an expert) 437.2 ->
#: 389.7 / 261.0 -> 232.0 (1.12x); 384 tokens 662.0 -> 577.8 / 364.0 -> 316.2 (1.15x). Not for
#: the grouped layouts: masked 32 tok/expert 0.94-1.00x the register-A kernel with its half tail,
#: masked 64 0.83-0.86x the split 96 tile, contiguous 128 rows 0.69-0.70x 256x128.
INDEXED_WS_TILES = tuple(t for t in INDEXED_RS_TILES if t[2] == 8) + ((256, 64, 16, 3),)
#: One-warpgroup register-A tiles on the group-at-a-time loop (`_rs_groups_mainloop`: 8 fragment
#: registers a group instead of a whole step's 64, twice), with their ptxas register cap
#: (``maxnreg``): 64 registers and a 2-stage ring of 8-row blocks (26 KB) fit eight CTAs an SM,
#: where the step loop's ~128 registers allow four. More CTAs an SM, not a deeper ring, is
#: what streams the decode weights: H200, nineteenth session (`scripts/probes/decode_blocks.py`,
#: one process, interleaved, bit-identical, Kimi EP8 gate_up / down, us): 4 tokens 64x16 (the
#: step loop, 3 stages, 4 CTAs an SM) 122.2 / 65.2, 64x8 step loop 3 stages 116.9 / 61.8, 64x8
#: group loop 3 stages (5 CTAs) 118.0 / 60.8, 2 stages (8 CTAs) 113.4 / 59.8; 8 tokens 203.8 /
#: 111.9 -> 187.6 / 99.6 (2 stages); 16 tokens 225.0 / 125.8 -> 207.6 / 111.8. At 32 tokens
#: (5.3 routes an expert) the 8-row blocks lose (262.4 / 138.3 against 256.3 / 140.8). A grid
#: too thin to fill the eight slots runs `THIN_GRID_TILES` instead.
#: The grouped masked 16-row tile likewise (six CTAs an SM by its 35 KB ring; its row-block
#: loop needs 72 registers, 64 spill 16 bytes), 8 tok/expert, counts 6-10: 64x16 3 stages (step
#: loop, 4 CTAs an SM) 285.1 / 153.0 us, group loop 2 stages 242.0 / 123.5 (1.18x / 1.24x, at 64
#: registers), 246.7 / 126.4 at 80, 3 stages 258.1 / 135.9. The indexed 16-row block (EP8 32 / 50
#: tokens, 5-8 routes an expert) on it: 251.4 / 134.8 and 257.9 / 138.5 against the step loop's
#: 254.2 / 140.8 and 258.1 / 143.8 (1.00-1.04x). Masked 16 tok/expert, 64x32 on the group loop
#: (2 stages, 128 registers, four CTAs an SM) against the 4-stage step loop with two accumulators
#: (`SPLIT_ACC_TILES`): gate_up 308.7 vs 304.9, down 153.5 vs 182.0 (two runs: 155.0 vs 180.6):
#: so only for a short K (`SHORT_K_TILES`).
#: The 128-row tiles (two m64 wgmmas a group) of `WIDE_DECODE_TILES` too, and the 64-row block's
#: 128x64 at 168 registers (64 of accumulator; two CTAs an SM by its 100 KB ring until the
#: twenty-sixth session's `HALF_ACT_TILES`, three since). H200,
#: twenty-first session (`scripts/probes/decode_blocks.py wide64`, interleaved, valid rows
#: bit-identical, us, gate_up / down), against the warp-specialized four-warpgroup 256x64 (with
#: its tails): masked 32 tok/expert EP8 355.0 / 216.3 -> 340.0 / 183.0, 40 tok 367.1 / 224.8 ->
#: 354.3 / 194.5, EP16 182.7 / 110.4 -> 172.4 / 94.1, EP32 124.7 / 65.7 -> 114.8 / 55.8
#: (1.04-1.18x; the 64x64 group loop 0.84-0.99x the 128x64 masked, 0.77-0.78x indexed);
#: indexed EP8 256 tokens (43 routes an expert) 387.9 / 231.8 -> 377.1 / 215.4, 384 tokens
#: (64 routes) 547.1 / 310.2 -> 574.7 / 309.1 without a tail, 1.01-1.05x at 256-512 tokens with
#: one (`HALF_TAIL_TILES`, `w4a16_indexed._GROUP_LOOP_BLOCKS`).
GROUP_LOOP_MAXNREG = {(64, 8, 4, 2): 64, (64, 16, 4, 2): 72, (64, 32, 4, 2): 128,
                      (128, 8, 4, 2): 96, (128, 16, 4, 2): 128, (128, 32, 4, 2): 128, (128, 64, 4, 2): 168,
                      (128, 128, 4, 2): 240}  # the last: pre-gathered rows only (`PREGATHER_BLOCK_TILES`)
#: Masked tiles whose form for a K of at most `SHORT_K_STEPS` 256-wide steps is a group-loop tile:
#: a short loop cannot amortize a deep ring's fill, more CTAs an SM overlap the fills (the
#: measurement above: masked 16 tok/expert, down K 2048 = 8 steps 1.17-1.19x, gate_up K 7168 0.99x).
SHORT_K_TILES = {(64, 32, 4, 4): (64, 32, 4, 2)}
SHORT_K_STEPS = 8
#: A group-loop tile's deeper-ring alternative (the step loop, 3 stages) for grids of fewer than
#: `GROUP_LOOP_MIN_PROGRAMS` programs: with about four programs an SM, a 2-stage ring has too few
#: bytes in flight. H200, nineteenth session, Kimi EP8 one token: gate_up (512 programs) 64x8
#: 2 stages 74.3 us, 3 stages 50.1 (64x16: 51.7); down (896 programs) 2 stages 30.6, 3 stages
#: 31.8 (64x16: 33.2).
THIN_GRID_TILES = {(64, 8, 4, 2): (64, 8, 4, 3), (64, 16, 4, 2): (64, 16, 4, 3)}
GROUP_LOOP_MIN_PROGRAMS = 6 * H200_NUM_SMS
#: The register-A indexed decode tiles whose split-K form the compile tier builds (any tile
#: splits under ``LOWBIT_W4A16_SPLIT_K``; the heuristics never split: `w4a16_indexed._RS_SPLIT_K`
#: has the measurements).
INDEXED_SPLIT_TILES = ((64, 8, 4, 3), (64, 8, 4, 2))
#: Four-warpgroup masked tiles whose rows are not a power of two (`_w4a16_grouped_split_kernel`,
#: two accumulators), (weight rows, rows, warps, stages): 48 = 32 + 16, 80 = 64 + 16, 96 = 64 + 32.
#: Humming 0.1.20 picks 40-48 and 80-88-row tiles there. H200, thirteenth session
#: (`scripts/probes/wide_tile.py split`, same process, bit-identical valid rows, us, gate_up / down,
#: against the 256x64 tile, which runs a second row block for an expert past 64 rows):
#: 64 tok/expert (45-83 rows) 256x80 574.0 / 309.2 vs 687.2 / 365.1 (1.20x / 1.18x), 256x96
#: 575.8 / 308.8 vs 662.0 / 367.6 (1.15x / 1.19x); 32 tok/expert (22-42 rows) 256x48 441.7 /
#: 254.9 vs 429.5 / 246.0 (0.97x / 0.96x: two wgmmas a group cost more than 16 padded rows), so
#: `split_tile_rows` picks them only past 64 rows.
GLUON_SPLIT_TILES = ((256, 48, 16, 3), (256, 80, 16, 2), (256, 96, 16, 2))
#: Split tiles with a warp-specialized form (`_w4a16_grouped_split_kernel` WARP_SPECIALIZE: BR_LO
#: = BR_HI / 2, the tile the first three quarters of a 2 * BR_HI-row ring).
GLUON_SPLIT_WS_TILES = ((256, 48, 16, 3), (256, 96, 16, 2))
_GROUPS = gl.constexpr(8)  # K groups of 32 in one 256-wide packed step
#: Registers of `_ws_mainloop`'s producer warp (setmaxnreg): it only computes TMA coordinates.
_WS_LOAD_REGS = gl.constexpr(40)
#: ... and of the indexed kernel's producer warp, which also holds its lanes' routed-row
#: pointers (up to 16 rows a lane at 128-row blocks) for the cp.async gather.
_WS_GATHER_REGS = gl.constexpr(64)
#: Warps of the indexed kernel's producer partition: a 128-row block's step is 4096 16-byte
#: copies, 128 a lane for one warp.
_WS_GATHER_WARPS = gl.constexpr(4)


@gluon.jit
def _dequant_pair(words, s_lo, s_hi):
    """bf16 weights of groups i and i + 4 from words shifted by 4i (`int4_dequant` layout)."""
    _, s_lo = gl.broadcast(words, s_lo)
    _, s_hi = gl.broadcast(words, s_hi)
    return gl.inline_asm_elementwise(DEQUANT_PAIR_PTX, "=h,=h,r,h,h", [words, s_lo, s_hi],
                                     dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=1)


@gluon.jit
def _load_weight_step(w_desc, s_desc, wrow, srow, n0, kt, bar, wring, sring, st, pred):
    """TMA of K step `kt`'s packed words (``[BW, 32]`` i32 at row `wrow`) and scales (``[8, BW]``
    bf16, rows ``srow + 8kt``, columns from `n0`) into stage `st`, arriving on `bar`."""
    tma.async_copy_global_to_shared(w_desc, [wrow, kt * 32], bar, wring.index(st), pred=pred)
    tma.async_copy_global_to_shared(s_desc, [srow + kt * 8, n0], bar, sring.index(st), pred=pred)


@gluon.jit
def _dequant_step(wring, sring, st, deq, p, num_warps: gl.constexpr):
    """Dequantize the step held in stage `st` into buffer set `p` of `deq`: buffer ``8p + g``
    holds group g (K ``256kt + 32g ..``) of the rows, bf16 ``(q - 8) * s``."""
    words_l: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])  # 16 bytes a thread
    words = wring.index(st).load(words_l)
    # The [8, BW] scale box is unswizzled: viewed as a plain row-major buffer, group i is row i,
    # read as a [BW, 1] column (one scale a weight row, broadcast along K). Slicing the NVMMA
    # view directly reads with the wrong strides on Triton 3.6 (H200 probe, 2026-11-29).
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    scales = sring.index(st)._reinterpret(gl.bfloat16, sring.index(st).shape, plain)
    for i in gl.static_range(4):
        s_lo = scales.slice(i, 1, dim=0).permute((1, 0)).load(words_l)
        s_hi = scales.slice(i + 4, 1, dim=0).permute((1, 0)).load(words_l)
        w_lo, w_hi = _dequant_pair(words >> (4 * i), s_lo, s_hi)
        deq.index(p * _GROUPS + i).store(w_lo)
        deq.index(p * _GROUPS + i + 4).store(w_hi)


@gluon.jit
def _issue_step(deq, p, xs, s, acc):
    """The eight asynchronous wgmmas of one K step, ``[BW, 32] x [32, BR]`` each, chained on
    `acc`, after the shared-memory writes of this step are visible to the async proxy."""
    fence_async_shared()
    gl.thread_barrier()  # every thread's part of the tiles is in shared memory
    for g in gl.static_range(_GROUPS):
        acc = warpgroup_mma(deq.index(p * _GROUPS + g), xs.index(s * _GROUPS + g).permute((1, 0)), acc,
                            is_async=True)
    return acc


@gluon.jit
def _weight_ring(w_desc, s_desc, STAGES: gl.constexpr):
    """The STAGES-deep ring of packed words and scales, and one initialized mbarrier a stage
    (a grouped kernel's activation boxes arrive on the same barrier)."""
    BW: gl.constexpr = w_desc.block_type.shape[0]
    wring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BW, 32], w_desc.layout)
    sring = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 8, BW], s_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    return wring, sring, ready


@gluon.jit
def _tile_ids(N, BW: gl.constexpr, N_FASTEST: gl.constexpr):
    """(row block, N tile) of this program. N_FASTEST: the grid is one axis with the N tiles
    fastest, so the programs that share a row block's activations run side by side and read
    them from DRAM once; else a 2-D grid (row blocks, N tiles), the row blocks fastest, where a
    prefill whose activations outgrow the L2 (Kimi EP8 contiguous: 48 x 1.8 MB) re-reads them
    for every wave of N tiles. `_n_fastest` chooses (launchers)."""
    if N_FASTEST:
        nt = gl.cdiv(N, BW)
        pid = gl.program_id(0)
        return pid // nt, pid % nt
    else:
        return gl.program_id(0), gl.program_id(1)


@gluon.jit
def _block_expert(ntpp_ptr, expert_ids_ptr, pid_m, BR: gl.constexpr):
    """(expert, runs) of indexed routing block `pid_m`; `runs` is False past the device-side
    padded count and on another rank's expert (``-1``, EP). The count and the expert id are
    loaded side by side and tested once: one global-load latency before the first TMA instead
    of two (the test on the count used to sit between the loads, SASS)."""
    ntpp = gl.load(ntpp_ptr)
    e = gl.load(expert_ids_ptr + pid_m)  # in bounds: the grid has at most the buffer's blocks
    return e, (pid_m * BR < ntpp) & (e >= 0)


@gluon.jit
def _grouped_rows(route_ptr, pid_r, row_slots, max_m, BR: gl.constexpr, MASKED: gl.constexpr):
    """The row blocks of program row `pid_r` in a grouped layout, as a loop: its expert, the
    first row of the expert's slab (base), ``range(first, stop, step)`` over the block starts
    inside it, and the expert's valid rows (masked; unused for contiguous).
    Masked: `row_slots` programs an expert (route_ptr = masked_m), slot j taking blocks j,
    j + row_slots, ... below ``masked_m[e]``: a grid sized for the expected rows, not for max_m
    (a program with no block left does nothing), and any count still covered. Contiguous:
    route_ptr = m_indices, one block a program, none for a padding block (``m_indices < 0``:
    its rows are never read); `row_slots` unused."""
    if MASKED:
        e = pid_r // row_slots
        base = e * max_m
        valid = gl.minimum(gl.load(route_ptr + e), max_m)
        first = (pid_r % row_slots) * BR
        stop = valid
        step = row_slots * BR
    else:
        base = 0
        first = pid_r * BR
        e = gl.load(route_ptr + first)
        stop = gl.where(e >= 0, first + BR, first)
        step = BR
        valid = max_m  # padding rows are found through m_indices
    return e, base, first, stop, step, valid


@triton.constexpr_function
def _store_layout(BR: int, BW: int, num_warps: int) -> gl.BlockedLayout:
    """``[BR, BW]`` output tile, 8 columns (16 bytes) a thread, a row's BW columns in BW / 8 lanes."""
    lanes = min(BW // 8, 32)
    return gl.BlockedLayout([1, 8], [32 // lanes, lanes], [num_warps, 1], [1, 0])


@gluon.jit
def _transposed(acc, num_warps: gl.constexpr, dtype: gl.constexpr = gl.bfloat16):
    """`dtype` (bf16; FP32 for a split-K share) ``[BR, BW]`` of the ``[BW, BR]`` accumulator
    (weight rows = output columns), in 8-column row pieces: stored straight from wgmma's layout,
    a warp's store hit 2-byte elements of eight rows (half of each 32-byte sector wasted); the
    transpose goes through shared memory."""
    st_l: gl.constexpr = _store_layout(acc.shape[1], acc.shape[0], num_warps)
    return gl.convert_layout(gl.permute(acc.to(dtype), (1, 0)), st_l)


@gluon.jit
def _grouped_store(acc, c_ptr, route_ptr, r0, n0, e, max_m, valid, N, stride_cm, MASKED: gl.constexpr,
                   num_warps: gl.constexpr):
    """Store ``acc[i, r] = out[r0 + r, n0 + i]`` (the weight rows are the output columns): rows
    past ``masked_m[e]`` (masked) or padding rows (contiguous, ``m_indices < 0``) unwritten."""
    out = _transposed(acc, num_warps)
    st_l: gl.constexpr = out.type.layout
    orr = r0 + gl.arange(0, out.shape[0], layout=gl.SliceLayout(1, st_l))
    on = n0 + gl.arange(0, out.shape[1], layout=gl.SliceLayout(0, st_l))
    if MASKED:
        row_live = orr - e * max_m < valid
    else:
        row_live = gl.load(route_ptr + orr) >= 0
    c = c_ptr + orr[:, None].to(gl.int64) * stride_cm + on[None, :]
    gl.store(c, out, mask=row_live[:, None] & (on < N)[None, :])


@gluon.jit
def _routed_rows(a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k, stride_am, BR: gl.constexpr,
                 rows_l: gl.constexpr):
    """Routing block `pid_m`'s rows in the 1-D layout `rows_l`: which slots hold routes
    (sentinels do not) and the row pointers ``a[id // top_k]`` (sentinels point at row 0)."""
    ids = gl.load(sorted_ids_ptr + pid_m * BR + gl.arange(0, BR, layout=rows_l))
    row_ok = ids < num_routes
    return row_ok, a_ptr + gl.where(row_ok, ids // top_k, 0).to(gl.int64) * stride_am


@gluon.jit
def _gathered_rows(a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k, stride_am, BR: gl.constexpr, x_l: gl.constexpr):
    """`_routed_rows` for the cp.async gather's 3-D ``[8, BR, 32]`` layout `x_l` (`_gather_layout`):
    ``[1, BR, 1]`` row flags and row pointers."""
    row_ok, a_rows = _routed_rows(a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k, stride_am, BR,
                                  gl.SliceLayout(0, gl.SliceLayout(2, x_l)))
    return row_ok[None, :, None], a_rows[None, :, None]


@gluon.jit
def _indexed_store(acc, c_ptr, sorted_ids_ptr, topk_w_ptr, pid_m, n0, N, num_routes, stride_cm,
                   MUL_WEIGHT: gl.constexpr, num_warps: gl.constexpr):
    """Store ``acc[i, r] = out[ids[r], n0 + i]`` (times the routing weight with MUL_WEIGHT);
    sentinel slots unwritten. `c_ptr`: bf16 output, or an FP32 split-K share's rows."""
    mma: gl.constexpr = acc.type.layout
    BR: gl.constexpr = acc.shape[1]
    if MUL_WEIGHT:
        wid = gl.load(sorted_ids_ptr + pid_m * BR + gl.arange(0, BR, layout=gl.SliceLayout(0, mma)))
        acc = acc * gl.load(topk_w_ptr + wid, mask=wid < num_routes, other=0.0)[None, :]
    out = _transposed(acc, num_warps, c_ptr.dtype.element_ty)
    st_l: gl.constexpr = out.type.layout
    oid = gl.load(sorted_ids_ptr + pid_m * BR + gl.arange(0, BR, layout=gl.SliceLayout(1, st_l)))
    on = n0 + gl.arange(0, out.shape[1], layout=gl.SliceLayout(0, st_l))
    c = c_ptr + oid[:, None].to(gl.int64) * stride_cm + on[None, :]
    gl.store(c, out, mask=(oid < num_routes)[:, None] & (on < N)[None, :])


@gluon.jit
def _w4a16_grouped_sm90_kernel(
    x_desc, w_desc, s_desc, c_ptr, route_ptr,
    N, K, max_m, stride_cm, row_slots,
    STAGES: gl.constexpr, MASKED: gl.constexpr, N_FASTEST: gl.constexpr, num_warps: gl.constexpr,
):
    """Contiguous (MASKED=0): m / BR row blocks, route_ptr = m_indices, the expert of each
    row (-1 = padding). Masked (MASKED=1): G * row_slots program rows, route_ptr = masked_m,
    the valid rows of each expert's max_m-row slab (`_grouped_rows`). Grid: program rows x N
    tiles, one axis (`_tile_ids`). w_desc: the packed words as
    ``[E * N, Kp / 8]``; s_desc: the scales as ``[E * Kp / 32, N]``."""
    BR: gl.constexpr = x_desc.block_type.shape[0]
    BW: gl.constexpr = w_desc.block_type.shape[0]
    pid_r, pid_n = _tile_ids(N, BW, N_FASTEST)
    e, base, first, stop, step, valid = _grouped_rows(route_ptr, pid_r, row_slots, max_m, BR, MASKED)
    n0 = pid_n * BW
    for rb in range(first, stop, step):
        _grouped_smem_block(x_desc, w_desc, s_desc, c_ptr, route_ptr, N, K, max_m, stride_cm, e, base + rb, n0,
                            valid, STAGES, MASKED, num_warps)


@gluon.jit
def _grouped_smem_block(x_desc, w_desc, s_desc, c_ptr, route_ptr, N, K, max_m, stride_cm, e, r0, n0, valid,
                        STAGES: gl.constexpr, MASKED: gl.constexpr, num_warps: gl.constexpr):
    """One row block (rows ``r0 ..`` of expert `e`) x one N tile of `_w4a16_grouped_sm90_kernel`."""
    BR: gl.constexpr = x_desc.block_type.shape[0]
    BW: gl.constexpr = w_desc.block_type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR, 16])
    deq_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BW, 32], gl.bfloat16)
    deq = gl.allocate_shared_memory(gl.bfloat16, [2 * _GROUPS, BW, 32], deq_l)
    xs = gl.allocate_shared_memory(x_desc.dtype, [STAGES * _GROUPS, BR, 32], x_desc.layout)
    wring, sring, ready = _weight_ring(w_desc, s_desc, STAGES)

    nk = gl.cdiv(K, 256)
    wrow = e * N + n0
    srow = e * nk * 8
    step_bytes: gl.constexpr = _GROUPS * x_desc.block_type.nbytes + w_desc.block_type.nbytes + s_desc.block_type.nbytes
    for i in gl.static_range(STAGES - 1):  # prologue: steps 0 .. STAGES-2 in flight
        live = i < nk
        mbarrier.expect(ready.index(i), step_bytes, pred=live)
        _load_weight_step(w_desc, s_desc, wrow, srow, n0, i, ready.index(i), wring, sring, i, live)
        for g in gl.static_range(_GROUPS):
            tma.async_copy_global_to_shared(x_desc, [r0, i * 256 + g * 32], ready.index(i),
                                            xs.index(i * _GROUPS + g), pred=live)

    acc = gl.zeros([BW, BR], gl.float32, mma)
    for kt in range(nk):
        s = kt % STAGES
        p = kt % 2
        mbarrier.wait(ready.index(s), (kt // STAGES) & 1)
        _dequant_step(wring, sring, s, deq, p, num_warps)
        acc = _issue_step(deq, p, xs, s, acc)
        # retire step kt-1's eight products; step kt's stay on the tensor cores
        acc = warpgroup_mma_wait(num_outstanding=_GROUPS, deps=(acc,))
        nxt = kt + STAGES - 1  # its stage held step kt-1: words read, products retired
        ns = nxt % STAGES
        live = nxt < nk
        mbarrier.expect(ready.index(ns), step_bytes, pred=live)
        _load_weight_step(w_desc, s_desc, wrow, srow, n0, nxt, ready.index(ns), wring, sring, ns, live)
        for g in gl.static_range(_GROUPS):
            tma.async_copy_global_to_shared(x_desc, [r0, nxt * 256 + g * 32], ready.index(ns),
                                            xs.index(ns * _GROUPS + g), pred=live)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    _grouped_store(acc, c_ptr, route_ptr, r0, n0, e, max_m, valid, N, stride_cm, MASKED, num_warps)


_ACC_SCALE = gl.constexpr(SUBNORMAL_ACC_SCALE)


@gluon.jit
def _scale_factors(s, g: gl.constexpr):
    """Group g's bf16 scales `s` (any shape) as the subnormal dequantization's two factors
    (`int4_dequant.scale_factors_ptx`), each an int32 holding a bf16x2 pair: ``s * 2^69`` (even
    g) or ``s * 2^65`` (odd g), and ``-8 s * 2^-64``."""
    PTX: gl.constexpr = scale_factors_ptx(g % 2)
    return gl.inline_asm_elementwise(PTX, "=r,=r,h", [s], dtype=(gl.int32, gl.int32), is_pure=True, pack=1)


@gluon.jit
def _unscaled(acc):
    """A register-A main loop's accumulator (its weights are 2^-64 times the true ones,
    `int4_dequant` subnormal form) at the true scale: exact."""
    return acc * _ACC_SCALE


@gluon.jit
def _dequant_byte(words, s_even, s_odd, j: gl.constexpr):
    """Groups 2j and 2j + 1 (``int4_dequant.dequant_byte_subnormal_ptx(j)``: byte j of the words)
    in `words`' register layout, whose K-adjacent element pairs must share a register (a
    k_width-2 dot operand): two bf16 tensors 2^-64 times the weights. `s_even`, `s_odd`: the two
    groups' bf16 scales, broadcastable to `words` (one a row). Also the output-centric decode
    engine's (`moe_decode_sm90`)."""
    f_even, c_even = _scale_factors(s_even, 0)
    f_odd, c_odd = _scale_factors(s_odd, 1)
    _, f_even = gl.broadcast(words, f_even)
    _, f_odd = gl.broadcast(words, f_odd)
    _, c_even = gl.broadcast(words, c_even)
    _, c_odd = gl.broadcast(words, c_odd)
    PTX: gl.constexpr = dequant_byte_subnormal_ptx(j)
    return gl.inline_asm_elementwise(PTX, "=r,=r,r,r,r,r,r,r,r,r,r,r", [words, f_even, f_odd, c_even, c_odd],
                                     dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=2)


@gluon.jit
def _dequant_pair_regs(words, scales, j: gl.constexpr, srow: gl.constexpr):
    """Groups 2j and 2j + 1 of a step as two ``[BW, 32]`` A fragments, 2^-64 times the weights
    (`_dequant_byte`): `scales` the stage's ``[8 * BW]`` flat view, `srow` the fragments' row layout."""
    BW: gl.constexpr = words.shape[0]
    s_even = scales.slice((2 * j) * BW, BW).load(srow)[:, None]
    s_odd = scales.slice((2 * j + 1) * BW, BW).load(srow)[:, None]
    return _dequant_byte(words, s_even, s_odd, j)


@gluon.jit
def _dequant_regs(wring, sring, st, dot_a: gl.constexpr):
    """Step held in stage `st`, dequantized straight into wgmma / mma.sync A fragments: eight
    ``[BW, 32]`` bf16 tensors (group g = K ``32g ..`` of the step) in the register layout `dot_a`,
    2^-64 times the weights (the caller's accumulator goes through `_unscaled`)."""
    words = wring.index(st).load(dot_a)
    BW: gl.constexpr = wring.shape[1]
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    scales = sring.index(st)._reinterpret(gl.bfloat16, [8 * BW], flat)
    srow: gl.constexpr = gl.SliceLayout(1, dot_a)
    w0, w1 = _dequant_pair_regs(words, scales, 0, srow)
    w2, w3 = _dequant_pair_regs(words, scales, 1, srow)
    w4, w5 = _dequant_pair_regs(words, scales, 2, srow)
    w6, w7 = _dequant_pair_regs(words, scales, 3, srow)
    return w0, w1, w2, w3, w4, w5, w6, w7


@gluon.jit
def _issue_groups(xs, s, acc, acc2, ws, SPLIT: gl.constexpr):
    """Step k's eight asynchronous register-A wgmmas, ``[BW, 32] x [32, BR]`` each (`ws`: the
    eight A fragments), into `acc`; with SPLIT the odd groups go to `acc2` instead: two chains
    of dependent wgmmas a step, which the caller adds once after the loop (`_split_acc` says
    where that measured faster). Returns (acc, acc2)."""
    for g in gl.static_range(_GROUPS):
        if SPLIT and g % 2 == 1:
            acc2 = warpgroup_mma(ws[g], xs.index(s * _GROUPS + g).permute((1, 0)), acc2, is_async=True)
        else:
            acc = warpgroup_mma(ws[g], xs.index(s * _GROUPS + g).permute((1, 0)), acc, is_async=True)
    return acc, acc2


@gluon.jit
def _issue_regs(xs, s, acc, w0, w1, w2, w3, w4, w5, w6, w7):
    """`_issue_groups` into one accumulator."""
    return _issue_groups(xs, s, acc, acc, (w0, w1, w2, w3, w4, w5, w6, w7), False)[0]


@gluon.jit
def _stage_boxes(xs, st, GROUPS: gl.constexpr = _GROUPS):
    """Stage `st` of a ``[STAGES * GROUPS, BR, 32]`` activation ring as one ``[GROUPS, BR, 32]``
    view (a memdesc slice needs a constant start; BR is a multiple of the swizzle period, so the
    boxes stacked are the rows of one ``[GROUPS * BR, 32]`` box). GROUPS: 8 (a K step), or 4 (a
    half step, `_rs_halves_mainloop`)."""
    BR: gl.constexpr = xs.shape[1]
    STAGES: gl.constexpr = xs.shape[0] // GROUPS
    flat = xs._reinterpret(xs.dtype, [STAGES, GROUPS * BR, 32], xs.type.layout)
    return flat.index(st).reshape([GROUPS, BR, 32])


@gluon.jit
def _gather_boxes(boxes, a_rows, row_ok, kt, K, x_l: gl.constexpr, g0: gl.constexpr = 0, K_TAIL: gl.constexpr = True):
    """cp.async of the routed activation rows into `boxes`, a ``[G, BR, 32]`` view
    (`_stage_boxes`): box i gets group ``g0 + i`` of K step `kt` (K ``256kt + 32(g0 + i) ..``), in
    one copy op; masked rows and K past the end are zero-filled, so sentinel slots and the K tail
    multiply as zeros. No registers hold the rows. One op, not one a group: Triton's barrier pass
    orders every shared-memory write after the previous one, so eight ops cost eight CTA barriers
    a step (SASS, 2026-11-30). `a_rows`, `row_ok`: ``[1, BR, 1]`` (`_gathered_rows`). The rows
    must be 16-byte aligned (`w4a16_indexed_sm90_launch` checks). Without K_TAIL (K a multiple of
    256, `EVEN_K_GATHER_TILES`) only the rows are masked."""
    G: gl.constexpr = boxes.shape[0]
    g = gl.arange(0, G, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_l)))[:, None, None] + g0
    j = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_l)))[None, None, :]
    k0 = kt * 256 + g * 32  # K is a multiple of 32 (group size): a group is all in or all out
    if K_TAIL:
        async_copy.async_copy_global_to_shared(boxes, a_rows + (k0 + j), mask=row_ok & (k0 < K))
    else:
        async_copy.async_copy_global_to_shared(boxes, a_rows + (k0 + j), mask=row_ok)


@gluon.jit
def _gather_async(xs, st, a_rows, row_ok, kt, K, x_l: gl.constexpr, K_TAIL: gl.constexpr = True):
    """`_gather_boxes` of K step `kt` into stage `st` of the ring `xs` (eight ``[BR, 32]`` boxes)."""
    _gather_boxes(_stage_boxes(xs, st), a_rows, row_ok, kt, K, x_l, 0, K_TAIL)


@gluon.jit
def _load_weights(w_desc, s_desc, wrow, srow, n0, kt, bar, wring, sring, st, pred):
    """Step `kt`'s words and scales by TMA into stage `st` of the weight ring, arriving on `bar`."""
    step_bytes: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes
    mbarrier.expect(bar, step_bytes, pred=pred)
    _load_weight_step(w_desc, s_desc, wrow, srow, n0, kt, bar, wring, sring, st, pred)


@gluon.jit
def _load_acts(x_desc, a_rows, row_ok, K, r0, kt, bar, xs, st, pred, GATHER: gl.constexpr, x_l: gl.constexpr,
               K_TAIL: gl.constexpr = True):
    """Step `kt`'s activations into stage `st` of the activation ring: one TMA of the eight
    ``[BR, 32]`` boxes of rows ``r0 ..`` (`x_desc`: the 3-D group view of `_act_desc`) arriving
    on `bar`, or, with GATHER, a cp.async gather of the routed row pointers `a_rows` (one commit
    group a step, waited for with ``async_copy.wait_group``; `bar` unused). One op either way:
    Triton's barrier pass puts a CTA barrier between two ops that signal the same mbarrier."""
    if GATHER:
        _gather_async(xs, st, a_rows, row_ok & pred, kt, K, x_l, K_TAIL)
        async_copy.commit_group()
    else:
        mbarrier.expect(bar, x_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(x_desc, [kt * _GROUPS, r0, 0], bar, _stage_boxes(xs, st), pred=pred)


@gluon.jit
def _act_ring(x_desc, BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr):
    """The STAGES-deep activation ring, eight ``[BR, 32]`` bf16 boxes a stage: in `x_desc`'s
    TMA layout, or (GATHER: rows copied by cp.async) the default NVMMA layout for wgmma."""
    if GATHER:
        xs = gl.allocate_shared_memory(gl.bfloat16, [STAGES * _GROUPS, BR, 32],
                                       gl.NVMMASharedLayout.get_default_for([BR, 32], gl.bfloat16))
    else:
        xs = gl.allocate_shared_memory(x_desc.dtype, [STAGES * _GROUPS, BR, 32], x_desc.layout)
    return xs


@gluon.jit
def _rs_rings(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, BR: gl.constexpr, STAGES: gl.constexpr,
              GATHER: gl.constexpr, x_l: gl.constexpr, ks, nk, PDL_WAIT: gl.constexpr = False,
              K_TAIL: gl.constexpr = True):
    """The register-A main loops' rings (activations, words + scales, one ready mbarrier a stage
    each) with steps 0 .. STAGES-1 in flight; with GATHER, this thread's copies of step 0 landed
    and fenced (every thread's once the caller passes a CTA barrier). Returns the rings, the
    barriers and the step count. Loop step i is K step ``ks + i`` of the `nk` this program
    runs (`_k_share`; None: all of K). PDL_WAIT: the weight steps are issued first, then the
    wait on the previous kernel (`pdl`, ``PDL=2``), then the activations."""
    xs = _act_ring(x_desc, BR, STAGES, GATHER)
    wring, sring, wready = _weight_ring(w_desc, s_desc, STAGES)
    xready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(xready.index(i), count=1)

    if nk is None:
        nk = gl.cdiv(K, 256)
    for i in gl.static_range(STAGES):
        _load_weights(w_desc, s_desc, wrow, srow, n0, ks + i, wready.index(i), wring, sring, i, i < nk)
        if not PDL_WAIT:
            _load_acts(x_desc, a_rows, row_ok, K, r0, ks + i, xready.index(i), xs, i, i < nk, GATHER, x_l, K_TAIL)
    if PDL_WAIT:  # the weights are constant: they travel while the previous kernel finishes
        gl_wait_prior()
        gl_release_next()
        for i in gl.static_range(STAGES):
            _load_acts(x_desc, a_rows, row_ok, K, r0, ks + i, xready.index(i), xs, i, i < nk, GATHER, x_l, K_TAIL)
    if GATHER:
        async_copy.wait_group(STAGES - 1)
        fence_async_shared()
    return xs, wring, sring, wready, xready, nk


@gluon.jit
def _rs_rings_done(wready, xready, STAGES: gl.constexpr, GATHER: gl.constexpr):
    if GATHER:
        async_copy.wait_group(0)  # no copy may outlive the CTA's shared memory
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(wready.index(i))
        mbarrier.invalidate(xready.index(i))


@gluon.jit
def _rs_mainloop(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, mma: gl.constexpr,
                 BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr, x_l: gl.constexpr,
                 SPLIT_ACC: gl.constexpr = False, GROUP_LOOP: gl.constexpr = False, ks=0, nk=None,
                 PDL_WAIT: gl.constexpr = False, HALF_ACTS: gl.constexpr = False, K_TAIL: gl.constexpr = True):
    """The register-A main loop of a tile: up to 128 weight rows (one or two warpgroups) hold a
    whole step's fragments twice (`_rs_steps_mainloop`, which SPLIT_ACC gives two accumulators);
    four-warpgroup tiles (256 weight rows), and with GROUP_LOOP one-warpgroup tiles under a
    register cap (`GROUP_LOOP_MAXNREG`), dequantize one group at a time (`_rs_groups_mainloop`).
    Same arguments and result. `ks`, `nk`: the K share (`_k_share`; default all of K).
    PDL_WAIT: `_rs_rings`'. HALF_ACTS (with GROUP_LOOP): one step of activations refilled by
    halves (`_rs_halves_mainloop`, `HALF_ACT_TILES`)."""
    if HALF_ACTS:
        gl.static_assert(GROUP_LOOP, "HALF_ACTS: one-warpgroup group-loop tiles only")
        acc = _rs_halves_mainloop(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, mma, BR, STAGES,
                                  GATHER, x_l, ks, nk, PDL_WAIT)
    elif w_desc.block_type.shape[0] > 128 or GROUP_LOOP:
        acc = _rs_groups_mainloop(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, mma, BR, STAGES,
                                  GATHER, x_l, ks, nk, PDL_WAIT, K_TAIL)
    else:
        acc = _rs_steps_mainloop(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, mma, BR, STAGES,
                                 GATHER, x_l, SPLIT_ACC, ks, nk, PDL_WAIT)
    return _unscaled(acc)


@gluon.jit
def _rs_steps_mainloop(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, mma: gl.constexpr,
                       BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr, x_l: gl.constexpr,
                       SPLIT_ACC: gl.constexpr, ks, nk, PDL_WAIT: gl.constexpr = False):
    """FP32 ``[BW, BR]``: the weight rows ``wrow ..`` of the ``[E * N, Kp / 8]`` words view
    (scales from row `srow` of the ``[E * Kp / 32, N]`` view), dequantized as wgmma's register
    A operand, times the activation rows (B operand from the STAGES-deep shared-memory ring:
    rows ``r0 ..`` by TMA, or the routed rows `a_rows` by cp.async with GATHER), over all of K.

    Step k+1 is dequantized while step k's eight products run. The words and scales of a
    stage are dead once dequantized, so a stage's weights are refilled (step k + STAGES) at
    the top of step k, before its products are issued: STAGES - 1 weight steps stay in flight
    through the dequantization, where refilling after the products retire left STAGES - 2
    (one, at three stages: too few bytes in flight to stream HBM at decode). The activations
    of a stage are refilled once step k's products retire (``wait_group 0``, then a barrier).
    SPLIT_ACC: the odd groups accumulate apart (`_issue_groups`), summed after the loop."""
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    BW: gl.constexpr = w_desc.block_type.shape[0]
    # step 0's rows landed (this thread's), visible to wgmma (every thread's) after the barrier
    xs, wring, sring, wready, xready, nk = _rs_rings(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K,
                                                     BR, STAGES, GATHER, x_l, ks, nk, PDL_WAIT)

    acc = gl.zeros([BW, BR], gl.float32, mma)
    acc2 = gl.zeros([BW, BR], gl.float32, mma)  # SPLIT_ACC only (loop-invariant, and dropped, otherwise)
    mbarrier.wait(wready.index(0), 0)
    w0, w1, w2, w3, w4, w5, w6, w7 = _dequant_regs(wring, sring, 0, dot_a)
    gl.thread_barrier()  # every warp holds its step-0 fragments: stage 0's weights are free
    _load_weights(w_desc, s_desc, wrow, srow, n0, ks + STAGES, wready.index(0), wring, sring, 0, STAGES < nk)
    for kt in range(nk - 1):
        s = kt % STAGES
        if not GATHER:
            mbarrier.wait(xready.index(s), (kt // STAGES) & 1)
        if SPLIT_ACC:
            acc, acc2 = _issue_groups(xs, s, acc, acc2, (w0, w1, w2, w3, w4, w5, w6, w7), True)
        else:
            acc = _issue_regs(xs, s, acc, w0, w1, w2, w3, w4, w5, w6, w7)
        # step kt+1 dequantized into registers while step kt's products run
        s1 = (kt + 1) % STAGES
        mbarrier.wait(wready.index(s1), ((kt + 1) // STAGES) & 1)
        v0, v1, v2, v3, v4, v5, v6, v7 = _dequant_regs(wring, sring, s1, dot_a)
        if GATHER:  # step kt+1's rows: groups committed so far = STAGES + kt, the newest STAGES-2 may fly
            async_copy.wait_group(STAGES - 2)
            fence_async_shared()
        if SPLIT_ACC:
            acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, w0, w1, w2, w3, w4, w5, w6, w7))[:2]
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
        # every warpgroup is done with stage s's activations and stage s1's words
        gl.thread_barrier()
        _load_acts(x_desc, a_rows, row_ok, K, r0, ks + kt + STAGES, xready.index(s), xs, s, kt + STAGES < nk, GATHER,
                   x_l)
        _load_weights(w_desc, s_desc, wrow, srow, n0, ks + kt + 1 + STAGES, wready.index(s1), wring, sring, s1,
                      kt + 1 + STAGES < nk)
        w0, w1, w2, w3, w4, w5, w6, w7 = v0, v1, v2, v3, v4, v5, v6, v7
    sl = (nk - 1) % STAGES
    if not GATHER:
        mbarrier.wait(xready.index(sl), ((nk - 1) // STAGES) & 1)
    if SPLIT_ACC:
        acc, acc2 = _issue_groups(xs, sl, acc, acc2, (w0, w1, w2, w3, w4, w5, w6, w7), True)
        acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, w0, w1, w2, w3, w4, w5, w6, w7))[:2]
        acc = acc + acc2
    else:
        acc = _issue_regs(xs, sl, acc, w0, w1, w2, w3, w4, w5, w6, w7)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
    _rs_rings_done(wready, xready, STAGES, GATHER)
    return acc


@gluon.jit
def _refill_stage(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, ks, kt, nk, wready, xready, wring, sring,
                  xs, STAGES: gl.constexpr, GATHER: gl.constexpr, x_l: gl.constexpr, K_TAIL: gl.constexpr = True):
    """Loop step `kt`'s stage of the rings refilled with step ``kt + STAGES`` (none past `nk`)."""
    s = kt % STAGES
    _load_weights(w_desc, s_desc, wrow, srow, n0, ks + kt + STAGES, wready.index(s), wring, sring, s, kt + STAGES < nk)
    _load_acts(x_desc, a_rows, row_ok, K, r0, ks + kt + STAGES, xready.index(s), xs, s, kt + STAGES < nk, GATHER, x_l,
               K_TAIL)


@gluon.jit
def _rs_groups_mainloop(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, mma: gl.constexpr,
                        BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr, x_l: gl.constexpr, ks, nk,
                        PDL_WAIT: gl.constexpr = False, K_TAIL: gl.constexpr = True):
    """`_rs_steps_mainloop` for four-warpgroup tiles (256 weight rows, 16 warps): half the activation
    bytes a FLOP of the 128-row tiles (each activation block read once for 256 weight rows).
    Also the one-warpgroup decode tiles of `GROUP_LOOP_MAXNREG`: 64 registers, eight CTAs an SM.
    At 16 warps a thread has 128 registers: the accumulator takes 64, so a step's fragments
    cannot be held twice (128) as `_rs_steps_mainloop` does; a step is dequantized one group at a time
    instead, group g + 1 while group g's wgmma runs (8 fragment registers each). Warp
    specialization is not offered: its producer warpgroup leaves a consumer 112 registers, and
    ptxas then serializes the wgmmas (C7512). Every warpgroup retires its products at the end
    of a step (an outstanding wgmma across the loop's back edge serializes them too: C7515),
    then a CTA barrier and the refill of the stage with step k + STAGES.

    Four-warpgroup tiles (EARLY_G0): that barrier lines up every warpgroup's idle gap (wait for
    the step's words, load them, dequantize group 0) on the one CTA of the SM, so the tensor pipe
    drained at each step (ncu, twenty-ninth session: 53% busy at 1.78 GHz on the 256x128). Group
    0 of step k+1 is dequantized while step k's last products run, and issued right after the
    barrier, before the refill of step k's stage. H200, twenty-ninth session
    (`scripts/probes/variant_cases.py` with ``VARIANT_CASES=old``, one process, interleaved,
    bit-identical, us): Kimi EP8 contiguous 128 rows/expert 256x128 gate_up 559.9 -> 527.3, down
    322.9 -> 302.7 (1.06-1.07x); indexed 256x128 1.04-1.05x (`w4a16_indexed._PREFILL_64_RANGE`).
    Not for the one-warpgroup group-loop tiles and `_rs_halves_mainloop`, whose two to eight CTAs
    an SM already overlap their gaps: there it ran 0.94-1.00x (EP8 8-1024 tokens, TP8, masked)."""
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows_l: gl.constexpr = gl.SliceLayout(1, dot_a)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    BW: gl.constexpr = w_desc.block_type.shape[0]
    xs, wring, sring, wready, xready, nk = _rs_rings(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K,
                                                     BR, STAGES, GATHER, x_l, ks, nk, PDL_WAIT, K_TAIL)
    if GATHER:  # step 0's rows: this thread's landed; every thread's after the barrier
        gl.thread_barrier()

    acc = gl.zeros([BW, BR], gl.float32, mma)
    EARLY_G0: gl.constexpr = BW > 128
    if EARLY_G0:
        mbarrier.wait(wready.index(0), 0)
        words = wring.index(0).load(dot_a)
        nxt = _dequant_group_regs(words, sring.index(0)._reinterpret(gl.bfloat16, [8 * BW], flat), 0, rows_l)
    for kt in range(nk):
        s = kt % STAGES
        if EARLY_G0:
            if not GATHER:
                mbarrier.wait(xready.index(s), (kt // STAGES) & 1)
            # group 0, dequantized under the previous step's last products, issued straight after
            # the CTA barrier and before the refill of the previous step's stage
            acc = warpgroup_mma(nxt, xs.index(s * _GROUPS).permute((1, 0)), acc, is_async=True)
            prev = nxt
            if kt > 0:  # every warpgroup is done with step kt-1's stage (the barrier below)
                _refill_stage(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, ks, kt - 1, nk, wready,
                              xready, wring, sring, xs, STAGES, GATHER, x_l, K_TAIL)
        else:
            mbarrier.wait(wready.index(s), (kt // STAGES) & 1)
            if not GATHER:
                mbarrier.wait(xready.index(s), (kt // STAGES) & 1)
            words = wring.index(s).load(dot_a)
            prev = _dequant_group_regs(words, sring.index(s)._reinterpret(gl.bfloat16, [8 * BW], flat), 0, rows_l)
            acc = warpgroup_mma(prev, xs.index(s * _GROUPS).permute((1, 0)), acc, is_async=True)
        scales = sring.index(s)._reinterpret(gl.bfloat16, [8 * BW], flat)
        for g in gl.static_range(1, _GROUPS):
            w = _dequant_group_regs(words, scales, g, rows_l)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
            acc = warpgroup_mma(w, xs.index(s * _GROUPS + g).permute((1, 0)), acc, is_async=True)
            prev = w
        if EARLY_G0:  # step k+1's group 0 while group 7's products run (past the last step: a stale stage, unused)
            s1 = (kt + 1) % STAGES
            mbarrier.wait(wready.index(s1), ((kt + 1) // STAGES) & 1, pred=kt + 1 < nk)
            words = wring.index(s1).load(dot_a)
            nxt = _dequant_group_regs(words, sring.index(s1)._reinterpret(gl.bfloat16, [8 * BW], flat), 0, rows_l)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
        if GATHER:  # step k+1's rows: groups committed so far = STAGES + kt, the newest STAGES-2 may fly
            async_copy.wait_group(STAGES - 2)
            fence_async_shared()
        gl.thread_barrier()  # every warpgroup is done with stage s
        if not EARLY_G0:
            _refill_stage(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, ks, kt, nk, wready, xready,
                          wring, sring, xs, STAGES, GATHER, x_l, K_TAIL)
    _rs_rings_done(wready, xready, STAGES, GATHER)
    return acc


@gluon.jit
def _load_half(x_desc, xh, h: gl.constexpr, a_rows, row_ok, K, r0, kt, bar, pred, GATHER: gl.constexpr,
               x_l: gl.constexpr):
    """Half `h` of K step `kt` (groups ``4h .. 4h+3``) into the ``[4, BR, 32]`` buffer `xh`: one
    TMA of a ``[4, BR, 32]`` box (`x_desc`, `_act_desc` with ``groups=4``) arriving on `bar`, or,
    with GATHER, `_gather_boxes`' cp.async of the routed rows as one commit group."""
    boxes = _stage_boxes(xh, 0, 4)
    if GATHER:
        _gather_boxes(boxes, a_rows, row_ok & pred, kt, K, x_l, 4 * h)
        async_copy.commit_group()
    else:
        mbarrier.expect(bar, x_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(x_desc, [kt * _GROUPS + 4 * h, r0, 0], bar, boxes, pred=pred)


@gluon.jit
def _half_landed(bar, kt, GATHER: gl.constexpr, pred=True):
    """The half loaded last (`_load_half`, step `kt`, if `pred`) has landed and is visible to
    wgmma: with GATHER this thread's copies (the caller's CTA barrier makes them every thread's),
    else its TMA."""
    if GATHER:
        async_copy.wait_group(0)
        fence_async_shared()
    else:
        mbarrier.wait(bar, kt & 1, pred=pred)


@gluon.jit
def _rs_halves_mainloop(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, mma: gl.constexpr,
                        BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr, x_l: gl.constexpr, ks, nk,
                        PDL_WAIT: gl.constexpr = False):
    """`_rs_groups_mainloop` (one warpgroup) with ONE step of activations instead of a
    STAGES-deep ring, refilled a half step at a time: groups 0-3 of step k+1 are loaded once
    every warp has retired group 3 of step k, groups 4-7 once the step is done, each waited for
    half a step later. The 128x64 tile's 100 KB (two 32 KB activation stages) become 68 KB, so
    three CTAs share an SM instead of two (`HALF_ACT_TILES`). Same arguments and result; without
    GATHER `x_desc`'s box is a half step (`_act_desc` with ``groups=4``)."""
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows_l: gl.constexpr = gl.SliceLayout(1, dot_a)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    BW: gl.constexpr = w_desc.block_type.shape[0]
    # two allocations, not one: Triton's barrier pass then sees that a half's refill and the
    # other half's wgmmas touch different buffers (one buffer cost a CTA barrier more a half)
    if GATHER:
        x_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BR, 32], gl.bfloat16)
    else:
        x_sl: gl.constexpr = x_desc.layout
    xa = gl.allocate_shared_memory(gl.bfloat16, [4, BR, 32], x_sl)
    xb = gl.allocate_shared_memory(gl.bfloat16, [4, BR, 32], x_sl)
    xready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # TMA only
    for i in gl.static_range(2):
        mbarrier.init(xready.index(i), count=1)
    wring, sring, wready = _weight_ring(w_desc, s_desc, STAGES)
    if nk is None:
        nk = gl.cdiv(K, 256)
    for i in gl.static_range(STAGES):
        _load_weights(w_desc, s_desc, wrow, srow, n0, ks + i, wready.index(i), wring, sring, i, i < nk)
    if PDL_WAIT:  # the weights are constant: they travel while the previous kernel finishes
        gl_wait_prior()
        gl_release_next()
    _load_half(x_desc, xa, 0, a_rows, row_ok, K, r0, ks, xready.index(0), True, GATHER, x_l)
    _load_half(x_desc, xb, 1, a_rows, row_ok, K, r0, ks, xready.index(1), True, GATHER, x_l)
    if GATHER:
        async_copy.wait_group(1)  # step 0's first half (this thread's; every thread's after the barrier)
        fence_async_shared()
        gl.thread_barrier()
    else:
        mbarrier.wait(xready.index(0), 0)

    acc = gl.zeros([BW, BR], gl.float32, mma)
    for kt in range(nk):
        s = kt % STAGES
        mbarrier.wait(wready.index(s), (kt // STAGES) & 1)
        scales = sring.index(s)._reinterpret(gl.bfloat16, [8 * BW], flat)
        words = wring.index(s).load(dot_a)
        more = kt + 1 < nk
        prev = _dequant_group_regs(words, scales, 0, rows_l)
        acc = warpgroup_mma(prev, xa.index(0).permute((1, 0)), acc, is_async=True)
        for g in gl.static_range(1, _GROUPS):
            w = _dequant_group_regs(words, scales, g, rows_l)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
            if g == 4:  # the second half landed; every warp retired groups 0-3: refill them
                _half_landed(xready.index(1), kt, GATHER)
                gl.thread_barrier()
                _load_half(x_desc, xa, 0, a_rows, row_ok, K, r0, ks + kt + 1, xready.index(0), more, GATHER, x_l)
            if g < 4:
                acc = warpgroup_mma(w, xa.index(g).permute((1, 0)), acc, is_async=True)
            else:
                acc = warpgroup_mma(w, xb.index(g - 4).permute((1, 0)), acc, is_async=True)
            prev = w
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
        _half_landed(xready.index(0), kt + 1, GATHER, more)  # step k+1's first half (past the last step: none)
        gl.thread_barrier()  # every warp is done with stage s's words and groups 4-7
        _load_weights(w_desc, s_desc, wrow, srow, n0, ks + kt + STAGES, wready.index(s), wring, sring, s,
                      kt + STAGES < nk)
        _load_half(x_desc, xb, 1, a_rows, row_ok, K, r0, ks + kt + 1, xready.index(1), more, GATHER, x_l)
    if GATHER:
        async_copy.wait_group(0)  # no copy may outlive the CTA's shared memory
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(wready.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(xready.index(i))
    return acc


@gluon.jit
def _rs_split_mainloop(x_desc, x2_desc, w_desc, s_desc, r0, wrow, srow, n0, K, mma: gl.constexpr, mma2: gl.constexpr,
                       STAGES: gl.constexpr):
    """`_rs_groups_mainloop` (grouped layouts, TMA activations) for a row tile that is not a power
    of two, BR = BR_HI + BR_LO (48 = 32 + 16, 80 = 64 + 16, 96 = 64 + 32): Gluon tensors and
    shared buffers must have power-of-two shapes, so the rows are two rings and two
    accumulators, and each group's fragment feeds two wgmmas (N = BR_HI and N = BR_LO; the
    fragment's layout is the same registers under either parent, so the conversion is free).
    Returns the two FP32 accumulators ``[BW, BR_HI]`` (rows ``r0 ..``) and ``[BW, BR_LO]``
    (rows ``r0 + BR_HI ..``)."""
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    dot_a2: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma2, k_width=2)
    rows_l: gl.constexpr = gl.SliceLayout(1, dot_a)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    BW: gl.constexpr = w_desc.block_type.shape[0]
    BR_HI: gl.constexpr = x_desc.block_type.shape[1]
    BR_LO: gl.constexpr = x2_desc.block_type.shape[1]
    xs = _act_ring(x_desc, BR_HI, STAGES, False)
    xs2 = _act_ring(x2_desc, BR_LO, STAGES, False)
    wring, sring, wready = _weight_ring(w_desc, s_desc, STAGES)
    xready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(xready.index(i), count=1)
    act_bytes: gl.constexpr = x_desc.block_type.nbytes + x2_desc.block_type.nbytes

    nk = gl.cdiv(K, 256)
    for i in gl.static_range(STAGES):
        _load_weights(w_desc, s_desc, wrow, srow, n0, i, wready.index(i), wring, sring, i, i < nk)
        # one expect for both boxes: an expect is an arrive, and the barrier counts one
        mbarrier.expect(xready.index(i), act_bytes, pred=i < nk)
        tma.async_copy_global_to_shared(x_desc, [i * _GROUPS, r0, 0], xready.index(i), _stage_boxes(xs, i), pred=i < nk)
        tma.async_copy_global_to_shared(x2_desc, [i * _GROUPS, r0 + BR_HI, 0], xready.index(i), _stage_boxes(xs2, i),
                                        pred=i < nk)

    acc = gl.zeros([BW, BR_HI], gl.float32, mma)
    acc2 = gl.zeros([BW, BR_LO], gl.float32, mma2)
    # `_rs_groups_mainloop`'s four-warpgroup schedule: group 0 of a step dequantized under the
    # previous step's last products, issued before the refill
    mbarrier.wait(wready.index(0), 0)
    words = wring.index(0).load(dot_a)
    nxt = _dequant_group_regs(words, sring.index(0)._reinterpret(gl.bfloat16, [8 * BW], flat), 0, rows_l)
    for kt in range(nk):
        s = kt % STAGES
        mbarrier.wait(xready.index(s), (kt // STAGES) & 1)
        acc = warpgroup_mma(nxt, xs.index(s * _GROUPS).permute((1, 0)), acc, is_async=True)
        acc2 = warpgroup_mma(gl.convert_layout(nxt, dot_a2), xs2.index(s * _GROUPS).permute((1, 0)), acc2,
                             is_async=True)
        prev = nxt
        if kt > 0:  # every warpgroup is done with step kt-1's stage (the barrier below)
            sp = (kt - 1) % STAGES
            fill = kt - 1 + STAGES
            _load_weights(w_desc, s_desc, wrow, srow, n0, fill, wready.index(sp), wring, sring, sp, fill < nk)
            mbarrier.expect(xready.index(sp), act_bytes, pred=fill < nk)
            tma.async_copy_global_to_shared(x_desc, [fill * _GROUPS, r0, 0], xready.index(sp), _stage_boxes(xs, sp),
                                            pred=fill < nk)
            tma.async_copy_global_to_shared(x2_desc, [fill * _GROUPS, r0 + BR_HI, 0], xready.index(sp),
                                            _stage_boxes(xs2, sp), pred=fill < nk)
        scales = sring.index(s)._reinterpret(gl.bfloat16, [8 * BW], flat)
        for g in gl.static_range(1, _GROUPS):
            w = _dequant_group_regs(words, scales, g, rows_l)
            done = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, prev))
            acc = done[0]
            acc2 = done[1]
            acc = warpgroup_mma(w, xs.index(s * _GROUPS + g).permute((1, 0)), acc, is_async=True)
            acc2 = warpgroup_mma(gl.convert_layout(w, dot_a2), xs2.index(s * _GROUPS + g).permute((1, 0)), acc2,
                                 is_async=True)
            prev = w
        s1 = (kt + 1) % STAGES
        mbarrier.wait(wready.index(s1), ((kt + 1) // STAGES) & 1, pred=kt + 1 < nk)
        words = wring.index(s1).load(dot_a)
        nxt = _dequant_group_regs(words, sring.index(s1)._reinterpret(gl.bfloat16, [8 * BW], flat), 0, rows_l)
        done = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, prev))
        acc = done[0]
        acc2 = done[1]
        gl.thread_barrier()  # every warpgroup is done with stage s
    _rs_rings_done(wready, xready, STAGES, False)
    return _unscaled(acc), _unscaled(acc2)


@gluon.jit
def _ws_mma_partition(xs, wring, sring, wready, wempty, xready, xempty, K, mma: gl.constexpr, BW: gl.constexpr,
                      BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr, mma2: gl.constexpr):
    """Consumer warpgroups of `_ws_mainloop`: `_ws_groups_partition` for four-warpgroup tiles (and
    its three-quarter tail, `mma2`), `_ws_steps_partition` otherwise (the split `_rs_mainloop`
    makes). Returns ``(acc,)`` (``(acc, acc2)`` with `mma2`)."""
    if BW > 128:
        res = _ws_groups_partition(xs, wring, sring, wready, wempty, xready, xempty, K, mma, BW, BR, STAGES, GATHER,
                                   mma2)
    else:
        res = _ws_steps_partition(xs, wring, sring, wready, wempty, xready, xempty, K, mma, BW, BR, STAGES, GATHER)
    return res


@gluon.jit
def _ws_steps_partition(xs, wring, sring, wready, wempty, xready, xempty, K, mma: gl.constexpr, BW: gl.constexpr,
                        BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr):
    """Consumer warpgroups of `_ws_mainloop` (up to two): `_rs_steps_mainloop`'s arithmetic (dequantize step k+1
    while step k's products run), with every stage released by mbarrier instead of refilled by
    these warps: the words and scales once dequantized (Gluon puts a barrier over the
    partition's warps before each arrive), the activations once their wgmmas retire."""
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    nk = gl.cdiv(K, 256)
    acc = gl.zeros([BW, BR], gl.float32, mma)
    mbarrier.wait(wready.index(0), 0)
    w0, w1, w2, w3, w4, w5, w6, w7 = _dequant_regs(wring, sring, 0, dot_a)
    fence_async_shared()  # generic-proxy reads of the stage ordered before the producer's TMA refill
    mbarrier.arrive(wempty.index(0), count=1)
    for kt in range(nk - 1):
        s = kt % STAGES
        mbarrier.wait(xready.index(s), (kt // STAGES) & 1)
        if GATHER:  # cp.async wrote the rows through the generic proxy; wgmma reads through the async one
            fence_async_shared()
        acc = _issue_regs(xs, s, acc, w0, w1, w2, w3, w4, w5, w6, w7)
        s1 = (kt + 1) % STAGES
        mbarrier.wait(wready.index(s1), ((kt + 1) // STAGES) & 1)
        v0, v1, v2, v3, v4, v5, v6, v7 = _dequant_regs(wring, sring, s1, dot_a)
        fence_async_shared()
        mbarrier.arrive(wempty.index(s1), count=1)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
        mbarrier.arrive(xempty.index(s), count=1)
        w0, w1, w2, w3, w4, w5, w6, w7 = v0, v1, v2, v3, v4, v5, v6, v7
    sl = (nk - 1) % STAGES
    mbarrier.wait(xready.index(sl), ((nk - 1) // STAGES) & 1)
    if GATHER:
        fence_async_shared()
    acc = _issue_regs(xs, sl, acc, w0, w1, w2, w3, w4, w5, w6, w7)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
    return (_unscaled(acc),)  # a partition returns a tuple (Triton 3.6 flattens it)


@gluon.jit
def _ws_groups_partition(xs, wring, sring, wready, wempty, xready, xempty, K, mma: gl.constexpr, BW: gl.constexpr,
                         BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr, mma2: gl.constexpr = None):
    """Consumer warpgroups of `_ws_mainloop` for four-warpgroup tiles: `_rs_groups_mainloop`'s
    arithmetic (one group dequantized while the previous group's wgmma runs), with the stages
    released by mbarrier instead of refilled by these warps: the words and scales once the
    last group is dequantized, the activations once the step's wgmmas retire.
    With `mma2` (the three-quarter tail, `QUARTER_TAIL`): only the first 3/4 of the ring's BR rows
    are multiplied, as two accumulators (Gluon shapes are powers of two): rows ``0 .. BR/2`` in
    `mma` (instr N = BR/2) and ``BR/2 .. 3BR/4`` in `mma2` (N = BR/4), each group's fragment
    feeding both (the same registers under either parent). Returns ``(acc,)`` or ``(acc, acc2)``."""
    SPLIT: gl.constexpr = mma2 is not None
    HI: gl.constexpr = BR // 2 if SPLIT else BR
    LO: gl.constexpr = BR // 4
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    dot_a2: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma2 if SPLIT else mma, k_width=2)
    rows_l: gl.constexpr = gl.SliceLayout(1, dot_a)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    nk = gl.cdiv(K, 256)
    acc = gl.zeros([BW, HI], gl.float32, mma)
    acc2 = gl.zeros([BW, LO], gl.float32, mma2 if SPLIT else mma)  # SPLIT only (loop-invariant otherwise)
    for kt in range(nk):
        s = kt % STAGES
        ph = (kt // STAGES) & 1
        mbarrier.wait(wready.index(s), ph)
        scales = sring.index(s)._reinterpret(gl.bfloat16, [8 * BW], flat)
        words = wring.index(s).load(dot_a)
        mbarrier.wait(xready.index(s), ph)
        if GATHER:  # cp.async wrote the rows through the generic proxy; wgmma reads through the async one
            fence_async_shared()
        prev = _dequant_group_regs(words, scales, 0, rows_l)
        acc, acc2 = _issue_group_rows(prev, xs.index(s * _GROUPS), acc, acc2, dot_a2, SPLIT)
        for g in gl.static_range(1, _GROUPS):
            w = _dequant_group_regs(words, scales, g, rows_l)
            acc, acc2 = _retire_group_rows(acc, acc2, prev, SPLIT)
            acc, acc2 = _issue_group_rows(w, xs.index(s * _GROUPS + g), acc, acc2, dot_a2, SPLIT)
            prev = w
        fence_async_shared()  # generic-proxy reads of the stage ordered before the producer's TMA refill
        mbarrier.arrive(wempty.index(s), count=1)
        acc, acc2 = _retire_group_rows(acc, acc2, prev, SPLIT)
        mbarrier.arrive(xempty.index(s), count=1)
    if SPLIT:
        res = (_unscaled(acc), _unscaled(acc2))
    else:
        res = (_unscaled(acc),)
    return res


@gluon.jit
def _issue_group_rows(w, xb, acc, acc2, dot_a2: gl.constexpr, SPLIT: gl.constexpr):
    """One group's asynchronous wgmma(s) of `_ws_groups_partition`: fragment `w` times the ring
    box `xb` (``[BR, 32]``) into `acc`, or with SPLIT its first half of rows into `acc` and the
    next quarter into `acc2`."""
    if SPLIT:  # (the ring's rows, not the accumulators': those may be in-flight wgmma results)
        HI: gl.constexpr = xb.shape[0] // 2
        LO: gl.constexpr = xb.shape[0] // 4
        acc = warpgroup_mma(w, xb.slice(0, HI).permute((1, 0)), acc, is_async=True)
        acc2 = warpgroup_mma(gl.convert_layout(w, dot_a2), xb.slice(HI, LO).permute((1, 0)), acc2, is_async=True)
    else:
        acc = warpgroup_mma(w, xb.permute((1, 0)), acc, is_async=True)
    return acc, acc2


@gluon.jit
def _retire_group_rows(acc, acc2, prev, SPLIT: gl.constexpr):
    """Wait for `_issue_group_rows`' wgmmas (fragment `prev` free again)."""
    if SPLIT:
        done = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, prev))
        acc = done[0]
        acc2 = done[1]
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
    return acc, acc2


@gluon.jit
def _dequant_group_regs(words, scales, g: gl.constexpr, srow: gl.constexpr):
    """Group g of a step (K ``32g ..``) as one ``[BW, 32]`` A fragment, 2^-64 times the weights
    (`_dequant_regs` one group at a time): `scales` the stage's ``[8 * BW]`` flat view, `srow` the
    fragment's row layout."""
    BW: gl.constexpr = words.shape[0]
    f, c = _scale_factors(scales.slice(g * BW, BW).load(srow)[:, None], g)
    _, f = gl.broadcast(words, f)
    _, c = gl.broadcast(words, c)
    PTX: gl.constexpr = dequant_group_subnormal_ptx(g)
    return gl.inline_asm_elementwise(PTX, "=r,r,r,r,r,r,r", [words, f, c], dtype=gl.bfloat16, is_pure=True, pack=2)


@gluon.jit
def _ws_load_partition(x_desc, w_desc, s_desc, xs, wring, sring, wready, wempty, xready, xempty, r0, wrow, srow, n0,
                       K, STAGES: gl.constexpr, GATHER: gl.constexpr, a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k,
                       stride_am, BR: gl.constexpr, x_l: gl.constexpr):
    """Producer partition of `_ws_mainloop`: step k's words + scales into stage k % STAGES as
    soon as the consumers released it, then its activations once those are released (the empty
    barriers start in phase 0, so waiting on phase 1 passes for the first STAGES steps): TMA
    boxes of rows ``r0 ..``, or with GATHER the routed rows (row ``id // top_k`` of route
    ``id``) by cp.async (`_gather_async`: sentinels and the K tail zero-filled), each lane's
    copies of a step signalled on that stage's ready barrier (``cp.async.mbarrier.arrive.noinc``:
    the barrier counts the partition's lanes)."""
    nk = gl.cdiv(K, 256)
    for kt in range(nk):
        s = kt % STAGES
        ph = (kt // STAGES) & 1
        mbarrier.wait(wempty.index(s), ph ^ 1)
        _load_weights(w_desc, s_desc, wrow, srow, n0, kt, wready.index(s), wring, sring, s, True)
        if GATHER:
            # the row pointers are re-derived every step (the ids hit L1): held across the loop,
            # a 128-row block's 16 pointers a lane spill the producer's registers
            row_ok, a_rows = _gathered_rows(a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k, stride_am, BR, x_l)
            mbarrier.wait(xempty.index(s), ph ^ 1)
            _gather_async(xs, s, a_rows, row_ok, kt, K, x_l)
            async_copy.mbarrier_arrive(xready.index(s), increment_count=False)
        else:
            mbarrier.wait(xempty.index(s), ph ^ 1)
            _load_acts(x_desc, 0, 0, K, r0, kt, xready.index(s), xs, s, True, False, x_l)


@gluon.jit
def _ws_mainloop(x_desc, w_desc, s_desc, r0, wrow, srow, n0, K, mma: gl.constexpr, BR: gl.constexpr,
                 STAGES: gl.constexpr, GATHER: gl.constexpr = False, a_ptr=0, sorted_ids_ptr=0, pid_m=0,
                 num_routes=0, top_k=0, stride_am=0, x_l: gl.constexpr = None, mma2: gl.constexpr = None):
    """`_rs_mainloop` warp-specialized: a producer partition (`_ws_load_partition`) issues every
    load as soon as its stage is released, the consumer warpgroups only wait, dequantize and multiply.
    No CTA barrier is left in the loop, so the next step's loads are not held back by the
    slowest warpgroup's products, and each warpgroup runs at its own pace. Same arithmetic in
    the same order as `_rs_mainloop`: bit-identical results (H200 probe,
    `scripts/probes/ws_grouped.py`). BR: the ring's rows. `mma2`: the three-quarter tail
    (`_ws_groups_partition`). Returns the consumers' tuple: ``(acc,)``, or ``(acc, acc2)``."""
    BW: gl.constexpr = w_desc.block_type.shape[0]
    xs = _act_ring(x_desc, BR, STAGES, GATHER)
    wring, sring, wready = _weight_ring(w_desc, s_desc, STAGES)
    wempty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    xready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    xempty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(wempty.index(i), count=1)
        mbarrier.init(xready.index(i), count=32 * _WS_GATHER_WARPS.value if GATHER else 1)  # gather: one a lane
        mbarrier.init(xempty.index(i), count=1)
    # (the argument tuples are written out per call: Gluon cannot hold layouts in a tuple variable)
    if GATHER:  # the gather needs more lanes and registers (row pointers) than TMA issue does
        return gl.warp_specialize([
            (_ws_mma_partition, (xs, wring, sring, wready, wempty, xready, xempty, K, mma, BW, BR, STAGES, True,
                                 mma2)),
            (_ws_load_partition, (x_desc, w_desc, s_desc, xs, wring, sring, wready, wempty, xready, xempty, r0, wrow,
                                  srow, n0, K, STAGES, True, a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k,
                                  stride_am, BR, x_l)),
        ], [_WS_GATHER_WARPS.value], [_WS_GATHER_REGS.value])
    else:
        return gl.warp_specialize([
            (_ws_mma_partition, (xs, wring, sring, wready, wempty, xready, xempty, K, mma, BW, BR, STAGES, False,
                                 mma2)),
            (_ws_load_partition, (x_desc, w_desc, s_desc, xs, wring, sring, wready, wempty, xready, xempty, r0, wrow,
                                  srow, n0, K, STAGES, False, a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k,
                                  stride_am, BR, x_l)),
        ], [1], [_WS_LOAD_REGS.value])


@gluon.jit
def _grouped_rs_block(x_desc, w_desc, s_desc, c_ptr, route_ptr, r0, e, n0, N, K, max_m, valid, stride_cm,
                      STAGES: gl.constexpr, MASKED: gl.constexpr, SPLIT_ACC: gl.constexpr, num_warps: gl.constexpr,
                      WARP_SPECIALIZE: gl.constexpr = False, QUARTER: gl.constexpr = False,
                      GROUP_LOOP: gl.constexpr = False, HALF_ACTS: gl.constexpr = False):
    """One row block's tile on `_rs_mainloop` (`_ws_mainloop` with WARP_SPECIALIZE): rows ``r0 ..``
    (as many as `x_desc`'s box) by TMA, multiplied and stored; with QUARTER (warp-specialized
    four-warpgroup tiles) only the first three quarters of them (`WS_TAIL_TILES`)."""
    BR: gl.constexpr = x_desc.block_type.shape[1]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR // 2 if QUARTER else BR, 16])
    srow = e * gl.cdiv(K, 256) * 8
    if QUARTER:
        mma2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BR // 4, 16])
        acc, acc2 = _ws_mainloop(x_desc, w_desc, s_desc, r0, e * N + n0, srow, n0, K, mma, BR, STAGES, False,
                                 x_l=mma, mma2=mma2)
        _grouped_store(acc2, c_ptr, route_ptr, r0 + BR // 2, n0, e, max_m, valid, N, stride_cm, MASKED, num_warps)
    elif WARP_SPECIALIZE:
        acc = _ws_mainloop(x_desc, w_desc, s_desc, r0, e * N + n0, srow, n0, K, mma, BR, STAGES, False,
                           x_l=mma)[0]  # x_l: any layout, no gather
    else:
        acc = _rs_mainloop(x_desc, 0, 0, w_desc, s_desc, r0, e * N + n0, srow, n0, K, mma, BR, STAGES, False, mma,
                           SPLIT_ACC, GROUP_LOOP, HALF_ACTS=HALF_ACTS)
    _grouped_store(acc, c_ptr, route_ptr, r0, n0, e, max_m, valid, N, stride_cm, MASKED, num_warps)


@gluon.jit
def _w4a16_grouped_rs_kernel(
    x_desc, xh_desc, w_desc, s_desc, c_ptr, route_ptr,
    N, K, max_m, stride_cm, row_slots,
    STAGES: gl.constexpr, MASKED: gl.constexpr, WARP_SPECIALIZE: gl.constexpr, N_FASTEST: gl.constexpr,
    SPLIT_ACC: gl.constexpr, HALF_TAIL: gl.constexpr, QUARTER_TAIL: gl.constexpr, GROUP_LOOP: gl.constexpr,
    num_warps: gl.constexpr, HALF_ACTS: gl.constexpr = False,
):
    """The grouped kernel with the dequantized weights kept in registers as the wgmma A operand
    (``wgmma ... {a regs}, [b smem]``, `_rs_mainloop`): no shared-memory round trip, no fence,
    and 64 to 256 weight rows a CTA (one, two or four warpgroups) over one activation tile, so
    the activation bytes re-read from L2 per FLOP fall with the weight rows. Same grid and
    routing as `_w4a16_grouped_sm90_kernel`.
    HALF_TAIL (masked): a row block whose second half holds no live row (the expert's count ends
    in its first half) runs the half-row tile, its activations through `xh_desc` (box of BR / 2
    rows), so its wgmmas do not multiply rows that are never stored (`HALF_TAIL_TILES`);
    `xh_desc` is unused otherwise. QUARTER_TAIL (masked, warp-specialized four-warpgroup tiles): a
    block whose live rows end in its first three quarters multiplies only those
    (`WS_TAIL_TILES`). GROUP_LOOP: one K group at a time (`GROUP_LOOP_MAXNREG`)."""
    BR: gl.constexpr = x_desc.block_type.shape[1]
    BW: gl.constexpr = w_desc.block_type.shape[0]
    gl.static_assert(MASKED or not HALF_TAIL, "HALF_TAIL: masked layout only")
    gl.static_assert(MASKED and WARP_SPECIALIZE or not QUARTER_TAIL, "QUARTER_TAIL: masked, warp-specialized")
    pid_r, pid_n = _tile_ids(N, BW, N_FASTEST)
    e, base, first, stop, step, valid = _grouped_rows(route_ptr, pid_r, row_slots, max_m, BR, MASKED)
    n0 = pid_n * BW
    if WARP_SPECIALIZE:  # two-warpgroup tiles only (`GLUON_WS_TILES`); one row block a program
        # (the launcher's row_slots: every block of max_m): the loop below ran 5% slower here
        # (sixteenth session, EP32 masked 32 tok/expert, 128x64)
        if first < stop:
            r0 = base + first
            if HALF_TAIL and valid - first <= BR // 2:
                _grouped_rs_block(xh_desc, w_desc, s_desc, c_ptr, route_ptr, r0, e, n0, N, K, max_m, valid,
                                  stride_cm, STAGES, MASKED, SPLIT_ACC, num_warps, True)
            elif QUARTER_TAIL and valid - first <= BR * 3 // 4:
                _grouped_rs_block(x_desc, w_desc, s_desc, c_ptr, route_ptr, r0, e, n0, N, K, max_m, valid,
                                  stride_cm, STAGES, MASKED, SPLIT_ACC, num_warps, True, True)
            else:
                _grouped_rs_block(x_desc, w_desc, s_desc, c_ptr, route_ptr, r0, e, n0, N, K, max_m, valid,
                                  stride_cm, STAGES, MASKED, SPLIT_ACC, num_warps, True)
    else:
        for rb in range(first, stop, step):
            r0 = base + rb
            if HALF_TAIL and valid - rb <= BR // 2:
                _grouped_rs_block(xh_desc, w_desc, s_desc, c_ptr, route_ptr, r0, e, n0, N, K, max_m, valid,
                                  stride_cm, STAGES, MASKED, SPLIT_ACC, num_warps, GROUP_LOOP=GROUP_LOOP)
            else:
                _grouped_rs_block(x_desc, w_desc, s_desc, c_ptr, route_ptr, r0, e, n0, N, K, max_m, valid,
                                  stride_cm, STAGES, MASKED, SPLIT_ACC, num_warps, GROUP_LOOP=GROUP_LOOP,
                                  HALF_ACTS=HALF_ACTS)


@gluon.jit
def _w4a16_grouped_split_kernel(
    x_desc, x2_desc, w_desc, s_desc, c_ptr, route_ptr,
    N, K, max_m, stride_cm, row_slots,
    STAGES: gl.constexpr, MASKED: gl.constexpr, N_FASTEST: gl.constexpr, HI_TAIL: gl.constexpr,
    WARP_SPECIALIZE: gl.constexpr, num_warps: gl.constexpr,
):
    """`_w4a16_grouped_rs_kernel` on a row tile BR_HI + BR_LO that is not a power of two (the
    four-warpgroup main loop `_rs_split_mainloop`): an expert of masked 32 tok/expert (22-42
    rows) fits one 48-row tile instead of padding to 64; one of 64 tok/expert (45-83) one 80-row
    tile instead of two 64-row ones.
    HI_TAIL: a block whose rows end within its first BR_HI runs the BR_HI-row tile alone
    (`_rs_mainloop`, one accumulator: no BR_LO wgmmas over rows that are never stored;
    `SPLIT_HI_TAIL_TILES`).
    WARP_SPECIALIZE (BR_LO = BR_HI / 2: `GLUON_SPLIT_WS_TILES`): `_ws_mainloop` over a ring of
    2 * BR_HI rows (`x2_desc`'s box), of which the tile is the first three quarters (the
    three-quarter tail of `_ws_groups_partition`); its HI_TAIL the BR_HI-row tile
    warp-specialized too."""
    BR_HI: gl.constexpr = x_desc.block_type.shape[1]
    BR_LO: gl.constexpr = x2_desc.block_type.shape[1] // 4 if WARP_SPECIALIZE else x2_desc.block_type.shape[1]
    gl.static_assert(not WARP_SPECIALIZE or 4 * BR_LO == 2 * BR_HI, "WARP_SPECIALIZE: x2_desc boxes 2 * BR_HI rows")
    BW: gl.constexpr = w_desc.block_type.shape[0]
    pid_r, pid_n = _tile_ids(N, BW, N_FASTEST)
    e, base, first, stop, _, valid = _grouped_rows(route_ptr, pid_r, row_slots, max_m, BR_HI + BR_LO, MASKED)
    n0 = pid_n * BW
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR_HI, 16])
    mma2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                   instr_shape=[16, BR_LO, 16])
    # one row block a program (the launcher's row_slots: every block of max_m); the loop of the
    # other kernels measured 2% slower here (sixteenth session, masked 64 tok/expert, 256x80)
    if first < stop:
        r0 = base + first
        if HI_TAIL and valid - first <= BR_HI:
            _grouped_rs_block(x_desc, w_desc, s_desc, c_ptr, route_ptr, r0, e, n0, N, K, max_m, valid, stride_cm,
                              STAGES, MASKED, False, num_warps, WARP_SPECIALIZE)
        elif WARP_SPECIALIZE:
            _grouped_rs_block(x2_desc, w_desc, s_desc, c_ptr, route_ptr, r0, e, n0, N, K, max_m, valid, stride_cm,
                              STAGES, MASKED, False, num_warps, True, True)
        else:
            acc, acc2 = _rs_split_mainloop(x_desc, x2_desc, w_desc, s_desc, r0, e * N + n0, e * gl.cdiv(K, 256) * 8,
                                           n0, K, mma, mma2, STAGES)
            _grouped_store(acc, c_ptr, route_ptr, r0, n0, e, max_m, valid, N, stride_cm, MASKED, num_warps)
            _grouped_store(acc2, c_ptr, route_ptr, r0 + BR_HI, n0, e, max_m, valid, N, stride_cm, MASKED, num_warps)


@gluon.jit
def _gather_load(a_rows, row_ok, kt, K, x_l: gl.constexpr):
    """K step `kt` of the routed activation rows, ``[BR, 32]`` a group, into registers (eight
    tensors: the loads are in flight while the current step is dequantized); past K reads 0."""
    jx = gl.arange(0, 32, layout=gl.SliceLayout(0, x_l))
    k0 = kt * 256 + jx
    x0 = gl.load(a_rows + k0[None, :], mask=row_ok[:, None] & (k0 < K)[None, :], other=0.0)
    x1 = gl.load(a_rows + (k0 + 32)[None, :], mask=row_ok[:, None] & (k0 + 32 < K)[None, :], other=0.0)
    x2 = gl.load(a_rows + (k0 + 64)[None, :], mask=row_ok[:, None] & (k0 + 64 < K)[None, :], other=0.0)
    x3 = gl.load(a_rows + (k0 + 96)[None, :], mask=row_ok[:, None] & (k0 + 96 < K)[None, :], other=0.0)
    x4 = gl.load(a_rows + (k0 + 128)[None, :], mask=row_ok[:, None] & (k0 + 128 < K)[None, :], other=0.0)
    x5 = gl.load(a_rows + (k0 + 160)[None, :], mask=row_ok[:, None] & (k0 + 160 < K)[None, :], other=0.0)
    x6 = gl.load(a_rows + (k0 + 192)[None, :], mask=row_ok[:, None] & (k0 + 192 < K)[None, :], other=0.0)
    x7 = gl.load(a_rows + (k0 + 224)[None, :], mask=row_ok[:, None] & (k0 + 224 < K)[None, :], other=0.0)
    return x0, x1, x2, x3, x4, x5, x6, x7


@gluon.jit
def _gather_store(xs, p, x0, x1, x2, x3, x4, x5, x6, x7):
    xs.index(p * _GROUPS + 0).store(x0)
    xs.index(p * _GROUPS + 1).store(x1)
    xs.index(p * _GROUPS + 2).store(x2)
    xs.index(p * _GROUPS + 3).store(x3)
    xs.index(p * _GROUPS + 4).store(x4)
    xs.index(p * _GROUPS + 5).store(x5)
    xs.index(p * _GROUPS + 6).store(x6)
    xs.index(p * _GROUPS + 7).store(x7)


@gluon.jit
def _w4a16_indexed_sm90_kernel(
    a_ptr, w_desc, s_desc, c_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, topk_w_ptr,
    N, K, num_routes, top_k, stride_am, stride_cm,
    BR: gl.constexpr, STAGES: gl.constexpr, MUL_WEIGHT: gl.constexpr, N_FASTEST: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Indexed layout (`moe_align_block_size` routing with block size BR): grid routing
    blocks x N tiles, one axis (`_tile_ids`). Words and scales stream through a STAGES-deep TMA ring; the routed rows
    (row ``id // top_k`` of route ``id``) are loaded into registers one step ahead and stored
    into the free buffer set once the previous step's products retire; output row ``id``."""
    BW: gl.constexpr = w_desc.block_type.shape[0]
    pid_m, pid_n = _tile_ids(N, BW, N_FASTEST)
    e, runs = _block_expert(ntpp_ptr, expert_ids_ptr, pid_m, BR)
    if not runs:  # past the device-side padded count, or another rank's expert (EP)
        return
    n0 = pid_n * BW

    x_l: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [num_warps, 1], [1, 0])  # 16-byte row loads
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR, 16])
    deq_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BW, 32], gl.bfloat16)
    x_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BR, 32], gl.bfloat16)
    deq = gl.allocate_shared_memory(gl.bfloat16, [2 * _GROUPS, BW, 32], deq_l)
    xs = gl.allocate_shared_memory(gl.bfloat16, [2 * _GROUPS, BR, 32], x_sl)
    wring, sring, ready = _weight_ring(w_desc, s_desc, STAGES)

    nk = gl.cdiv(K, 256)
    wrow = e * N + n0
    srow = e * nk * 8
    step_bytes: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes
    for i in gl.static_range(STAGES - 1):
        live = i < nk
        mbarrier.expect(ready.index(i), step_bytes, pred=live)
        _load_weight_step(w_desc, s_desc, wrow, srow, n0, i, ready.index(i), wring, sring, i, live)

    row_ok, a_rows = _routed_rows(a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k, stride_am, BR, gl.SliceLayout(1, x_l))
    a_rows = a_rows[:, None]
    x0, x1, x2, x3, x4, x5, x6, x7 = _gather_load(a_rows, row_ok, 0, K, x_l)
    _gather_store(xs, 0, x0, x1, x2, x3, x4, x5, x6, x7)

    acc = gl.zeros([BW, BR], gl.float32, mma)
    for kt in range(nk):
        s = kt % STAGES
        p = kt % 2
        # step kt+1's rows travel while step kt is dequantized and multiplied
        x0, x1, x2, x3, x4, x5, x6, x7 = _gather_load(a_rows, row_ok & (kt + 1 < nk), kt + 1, K, x_l)
        mbarrier.wait(ready.index(s), (kt // STAGES) & 1)
        _dequant_step(wring, sring, s, deq, p, num_warps)
        acc = _issue_step(deq, p, xs, p, acc)
        # retire step kt-1's products: buffer sets 1 - p and stage (kt-1) % STAGES are free
        acc = warpgroup_mma_wait(num_outstanding=_GROUPS, deps=(acc,))
        _gather_store(xs, 1 - p, x0, x1, x2, x3, x4, x5, x6, x7)
        nxt = kt + STAGES - 1
        ns = nxt % STAGES
        live = nxt < nk
        mbarrier.expect(ready.index(ns), step_bytes, pred=live)
        _load_weight_step(w_desc, s_desc, wrow, srow, n0, nxt, ready.index(ns), wring, sring, ns, live)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    _indexed_store(acc, c_ptr, sorted_ids_ptr, topk_w_ptr, pid_m, n0, N, num_routes, stride_cm, MUL_WEIGHT,
                   num_warps)


@gluon.jit
def _indexed_rs_block(a_ptr, w_desc, s_desc, c_ptr, ids_ptr, topk_w_ptr, e, n0, N, K, num_routes, top_k, stride_am,
                      stride_cm, BR: gl.constexpr, STAGES: gl.constexpr, MUL_WEIGHT: gl.constexpr,
                      X_LAYOUT: gl.constexpr, num_warps: gl.constexpr, WARP_SPECIALIZE: gl.constexpr = False,
                      QUARTER: gl.constexpr = False, GROUP_LOOP: gl.constexpr = False, ks=0, nk=None,
                      PDL_WAIT: gl.constexpr = False, HALF_ACTS: gl.constexpr = False, K_TAIL: gl.constexpr = True):
    """One routing block's tile on `_rs_mainloop` (`_ws_mainloop` with WARP_SPECIALIZE, its
    producer gathering with X_LAYOUT): the first BR slots at `ids_ptr` (the block's sorted ids)
    gathered, multiplied and stored; with QUARTER (warp-specialized four-warpgroup tiles) only
    the first three quarters of them multiplied (`WS_TAIL_TILES`). `ks`, `nk`: a K share
    (`_k_share`; register-A main loop only), stored in FP32 to `c_ptr`. PDL_WAIT (register-A main
    loop only): `_rs_rings`'."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR // 2 if QUARTER else BR, 16])
    wrow = e * N + n0
    srow = e * gl.cdiv(K, 256) * 8
    if QUARTER:
        mma2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BR // 4, 16])
        acc, acc2 = _ws_mainloop(w_desc, w_desc, s_desc, 0, wrow, srow, n0, K, mma, BR, STAGES, True, a_ptr, ids_ptr,
                                 0, num_routes, top_k, stride_am, X_LAYOUT, mma2)
        _indexed_store(acc2, c_ptr, ids_ptr + BR // 2, topk_w_ptr, 0, n0, N, num_routes, stride_cm, MUL_WEIGHT,
                       num_warps)
    elif WARP_SPECIALIZE:
        acc = _ws_mainloop(w_desc, w_desc, s_desc, 0, wrow, srow, n0, K, mma, BR, STAGES, True, a_ptr, ids_ptr, 0,
                           num_routes, top_k, stride_am, X_LAYOUT)[0]
    else:
        row_ok, a_rows = _gathered_rows(a_ptr, ids_ptr, 0, num_routes, top_k, stride_am, BR, X_LAYOUT)
        acc = _rs_mainloop(w_desc, a_rows, row_ok, w_desc, s_desc, 0, wrow, srow, n0, K, mma, BR, STAGES, True,
                           X_LAYOUT, GROUP_LOOP=GROUP_LOOP, ks=ks, nk=nk, PDL_WAIT=PDL_WAIT, HALF_ACTS=HALF_ACTS,
                           K_TAIL=K_TAIL)
    _indexed_store(acc, c_ptr, ids_ptr, topk_w_ptr, 0, n0, N, num_routes, stride_cm, MUL_WEIGHT, num_warps)


@gluon.jit
def _indexed_program(N, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, BR: gl.constexpr, BW: gl.constexpr,
                     N_FASTEST: gl.constexpr, PDL_FIRST: gl.constexpr):
    """The register-A indexed kernels' program: (routing block, first output column, the block's
    sorted ids, its expert, whether it runs: `_block_expert`). PDL_FIRST: wait on the previous
    kernel (and release the next) before reading anything."""
    if PDL_FIRST:
        gl_wait_prior()
        gl_release_next()
    pid_m, pid_n = _tile_ids(N, BW, N_FASTEST)
    e, runs = _block_expert(ntpp_ptr, expert_ids_ptr, pid_m, BR)
    return pid_m, pid_n * BW, sorted_ids_ptr + pid_m * BR, e, runs


@gluon.jit
def _k_share(K, SPLIT_K: gl.constexpr):
    """(first K step, steps) of this program's share of K's 256-wide steps (grid axis 2): SPLIT_K
    runs as equal as can be, none empty while SPLIT_K <= steps (`k_split_ok`)."""
    steps = gl.cdiv(K, 256)
    s = gl.program_id(2)
    ks = s * steps // SPLIT_K
    return ks, (s + 1) * steps // SPLIT_K - ks


def k_split_ok(k: int, split: int) -> bool:
    """Whether `split` K shares of `_k_share` are all non-empty for this K (the main loops run at
    least one step): at most one a 256-wide step."""
    return 1 <= split <= triton.cdiv(k, 256)


@gluon.jit
def _w4a16_indexed_rs_kernel(
    a_ptr, w_desc, s_desc, c_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, topk_w_ptr,
    N, K, num_routes, top_k, stride_am, stride_cm,
    BR: gl.constexpr, STAGES: gl.constexpr, MUL_WEIGHT: gl.constexpr, X_LAYOUT: gl.constexpr,
    WARP_SPECIALIZE: gl.constexpr, N_FASTEST: gl.constexpr, HALF_TAIL: gl.constexpr, X_HALF_LAYOUT: gl.constexpr,
    QUARTER_TAIL: gl.constexpr, GROUP_LOOP: gl.constexpr, num_warps: gl.constexpr,
    SPLIT_K: gl.constexpr = 1, stride_ws=0, PDL: gl.constexpr = 0, HALF_ACTS: gl.constexpr = False,
    K_TAIL: gl.constexpr = True,
):
    """The indexed layout on the register-A main loop (`_rs_mainloop`; GROUP_LOOP: one group at a
    time, `GROUP_LOOP_MAXNREG`): the routed rows (row
    ``id // top_k`` of route ``id``) are gathered by cp.async into the same STAGES-deep ring
    as the words, so no register holds them and routing blocks of up to 128 rows fit beside
    two sets of A fragments. Grid, early exits and output rows as `_w4a16_indexed_sm90_kernel`.
    X_LAYOUT: the gather's register layout, one thread a 4- to 16-byte piece of a ``[BR, 32]``
    box with no replication (`_gather_layout`).
    HALF_TAIL: a block whose second half holds no route (an expert's last block, as
    `moe_align_block_size` puts an expert's routes first) runs the BR / 2-row tile instead
    (X_HALF_LAYOUT: its gather layout), so its wgmmas do not multiply the padding
    (`HALF_TAIL_TILES`). QUARTER_TAIL (warp-specialized four-warpgroup tiles): a block with no
    route in its last quarter multiplies only its first three quarters (`WS_TAIL_TILES`).
    SPLIT_K > 1: grid axis 2 splits K (`_k_share`); `c_ptr` is then the FP32 workspace
    ``[SPLIT_K, num_routes, N]`` (share s at ``c_ptr + s * stride_ws``), summed by
    `w4a16_indexed`'s reduction kernel.
    PDL (`pdl`): 0 launched without it; 1 wait on the previous kernel first; 2 (register-A main
    loop only) read the routing and TMA the first STAGES weight steps, then wait: the routing
    must have been written two launches or more before this one.
    K_TAIL: the gather masks K per copy (K may end inside a 256-wide step); without it, rows only
    (`EVEN_K_GATHER_TILES`: four-warpgroup tiles on a K that is a multiple of 256)."""
    BW: gl.constexpr = w_desc.block_type.shape[0]
    gl.static_assert(WARP_SPECIALIZE or not QUARTER_TAIL, "QUARTER_TAIL: warp-specialized only")
    gl.static_assert(SPLIT_K == 1 or not WARP_SPECIALIZE, "SPLIT_K: the register-A main loop only")
    gl.static_assert(PDL != 2 or not WARP_SPECIALIZE, "PDL=2: the register-A main loop only")
    pid_m, n0, ids_ptr, e, runs = _indexed_program(N, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, BR, BW, N_FASTEST,
                                                   PDL == 1)
    if not runs:  # past the device-side padded count, or another rank's expert (EP)
        return
    if SPLIT_K == 1:
        ks = 0
        nk = None  # all of K
    else:
        ks, nk = _k_share(K, SPLIT_K)
        c_ptr += gl.program_id(2).to(gl.int64) * stride_ws
    if HALF_TAIL or QUARTER_TAIL:  # which of the block's slots past BR / 2 hold a route
        tail_l: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        slot = gl.arange(0, BR // 2, layout=tail_l)
        tail = gl.load(ids_ptr + BR // 2 + slot)
        half_free = gl.min(tail, axis=0) >= num_routes
        quarter_free = gl.min(gl.where(slot >= BR // 4, tail, num_routes), axis=0) >= num_routes
    else:
        half_free = False
        quarter_free = False
    if HALF_TAIL and half_free:  # no route in the second half
        _indexed_rs_block(a_ptr, w_desc, s_desc, c_ptr, ids_ptr, topk_w_ptr, e, n0, N, K, num_routes, top_k,
                          stride_am, stride_cm, BR // 2, STAGES, MUL_WEIGHT, X_HALF_LAYOUT, num_warps, WARP_SPECIALIZE,
                          GROUP_LOOP=GROUP_LOOP, ks=ks, nk=nk, PDL_WAIT=PDL == 2, K_TAIL=K_TAIL)
    elif QUARTER_TAIL and quarter_free:  # none in the last quarter
        _indexed_rs_block(a_ptr, w_desc, s_desc, c_ptr, ids_ptr, topk_w_ptr, e, n0, N, K, num_routes, top_k,
                          stride_am, stride_cm, BR, STAGES, MUL_WEIGHT, X_LAYOUT, num_warps, True, True)
    else:
        _indexed_rs_block(a_ptr, w_desc, s_desc, c_ptr, ids_ptr, topk_w_ptr, e, n0, N, K, num_routes, top_k,
                          stride_am, stride_cm, BR, STAGES, MUL_WEIGHT, X_LAYOUT, num_warps, WARP_SPECIALIZE,
                          GROUP_LOOP=GROUP_LOOP, ks=ks, nk=nk, PDL_WAIT=PDL == 2, HALF_ACTS=HALF_ACTS,
                          K_TAIL=K_TAIL)


@gluon.jit
def _indexed_tma_block(x_desc, w_desc, s_desc, c_ptr, ids_ptr, topk_w_ptr, r0, e, n0, N, K, num_routes, stride_cm,
                       STAGES: gl.constexpr, MUL_WEIGHT: gl.constexpr, num_warps: gl.constexpr,
                       GROUP_LOOP: gl.constexpr = False, HALF_ACTS: gl.constexpr = False, PDL_WAIT: gl.constexpr = False):
    """One routing block's tile on `_rs_mainloop` with its rows by TMA from the pre-gathered buffer
    (rows ``r0 ..``, as many as `x_desc`'s box), stored as `_indexed_rs_block` stores them."""
    BR: gl.constexpr = x_desc.block_type.shape[1]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR, 16])
    acc = _rs_mainloop(x_desc, 0, 0, w_desc, s_desc, r0, e * N + n0, e * gl.cdiv(K, 256) * 8, n0, K, mma, BR, STAGES,
                       False, mma, GROUP_LOOP=GROUP_LOOP, PDL_WAIT=PDL_WAIT, HALF_ACTS=HALF_ACTS)
    _indexed_store(acc, c_ptr, ids_ptr, topk_w_ptr, 0, n0, N, num_routes, stride_cm, MUL_WEIGHT, num_warps)


@gluon.jit
def _w4a16_indexed_tma_kernel(
    x_desc, xh_desc, w_desc, s_desc, c_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, topk_w_ptr,
    N, K, num_routes, stride_cm,
    STAGES: gl.constexpr, MUL_WEIGHT: gl.constexpr, N_FASTEST: gl.constexpr, HALF_TAIL: gl.constexpr,
    GROUP_LOOP: gl.constexpr, HALF_ACTS: gl.constexpr, num_warps: gl.constexpr, PDL: gl.constexpr = 0,
):
    """`_w4a16_indexed_rs_kernel` on rows pre-gathered into the routing's slot order
    (`moe_routing.gather_indexed_rows`: buffer row s = the activation row of slot s): a routing
    block's rows are one TMA box a step (`x_desc`, `_act_desc` of the buffer), as the grouped
    kernels load theirs, instead of a cp.async copy a thread and row piece. Grid, early exits,
    HALF_TAIL (`xh_desc`: the BR / 2-row box), output rows and PDL as `_w4a16_indexed_rs_kernel`
    (no warp specialization, no K shares)."""
    BR: gl.constexpr = x_desc.block_type.shape[1]
    BW: gl.constexpr = w_desc.block_type.shape[0]
    pid_m, n0, ids_ptr, e, runs = _indexed_program(N, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, BR, BW, N_FASTEST,
                                                   PDL == 1)
    if not runs:  # past the device-side padded count, or another rank's expert (EP)
        return
    if HALF_TAIL:  # a block with no route in its second half runs the half-row tile
        tail_l: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        half_free = gl.min(gl.load(ids_ptr + BR // 2 + gl.arange(0, BR // 2, layout=tail_l)), axis=0) >= num_routes
    else:
        half_free = False
    if HALF_TAIL and half_free:
        _indexed_tma_block(xh_desc, w_desc, s_desc, c_ptr, ids_ptr, topk_w_ptr, pid_m * BR, e, n0, N, K, num_routes,
                           stride_cm, STAGES, MUL_WEIGHT, num_warps, GROUP_LOOP=GROUP_LOOP, PDL_WAIT=PDL == 2)
    else:
        _indexed_tma_block(x_desc, w_desc, s_desc, c_ptr, ids_ptr, topk_w_ptr, pid_m * BR, e, n0, N, K, num_routes,
                           stride_cm, STAGES, MUL_WEIGHT, num_warps, GROUP_LOOP=GROUP_LOOP, HALF_ACTS=HALF_ACTS,
                           PDL_WAIT=PDL == 2)


@gluon.jit
def _w4a16_indexed_nloop_kernel(
    a_ptr, w_desc, s_desc, c_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, topk_w_ptr,
    N, K, num_routes, top_k, stride_am, stride_cm,
    BR: gl.constexpr, STAGES: gl.constexpr, MUL_WEIGHT: gl.constexpr, X_LAYOUT: gl.constexpr,
    N_TILES: gl.constexpr, HALF_TAIL: gl.constexpr, X_HALF_LAYOUT: gl.constexpr, num_warps: gl.constexpr,
):
    """The register-A indexed kernel for a K of one 256-wide step (K <= 256; Kimi TP8 down has
    K = 256): one program gathers its routing block's rows once and loops over N_TILES weight
    tiles (N tiles ``t0 ..``; `_nloop_block`; `nloop_n_tiles` picks how many: a constexpr, since
    a runtime count cost the 32-row tile 3-13 registers, one CTA an SM with routing weights).
    With one K step a tile, `_w4a16_indexed_rs_kernel` is all prologue and epilogue: every (routing block, N tile)
    program re-gathers the same rows and only one program an SM runs (registers).
    HALF_TAIL: a block whose second half holds no route (an expert's last block) runs the
    BR / 2-row tile (X_HALF_LAYOUT: its gather layout), as `_w4a16_indexed_rs_kernel` does
    (`NLOOP_HALF_TAIL_TILES`). Grid: routing blocks x cdiv(N tiles, N_TILES), one axis, the N
    chunks fastest."""
    BW: gl.constexpr = w_desc.block_type.shape[0]
    nt = gl.cdiv(N, BW)
    chunks = gl.cdiv(nt, N_TILES)
    pid_m = gl.program_id(0) // chunks
    t0 = (gl.program_id(0) % chunks) * N_TILES
    ids_ptr = sorted_ids_ptr + pid_m * BR
    if HALF_TAIL:  # the ids of the block's slots past BR / 2, loaded beside the block's expert (one
        # latency, not two; the routing buffer holds every launched block), read whole by every
        # warp (a warp's reduction, no CTA barrier before the first weight TMA)
        tail_l: gl.constexpr = gl.BlockedLayout([max(BR // 64, 1)], [32], [num_warps], [0])
        tail = gl.load(ids_ptr + BR // 2 + gl.arange(0, BR // 2, layout=tail_l))
    e, runs = _block_expert(ntpp_ptr, expert_ids_ptr, pid_m, BR)
    if not runs:  # past the device-side padded count, or another rank's expert (EP)
        return
    count = gl.minimum(nt - t0, N_TILES)
    if HALF_TAIL:
        half_free = gl.min(tail, axis=0) >= num_routes
    else:
        half_free = False
    if HALF_TAIL and half_free:  # no route in the second half
        _nloop_block(a_ptr, w_desc, s_desc, c_ptr, ids_ptr, topk_w_ptr, e, t0, count, N, K, num_routes, top_k,
                     stride_am, stride_cm, BR // 2, STAGES, MUL_WEIGHT, X_HALF_LAYOUT, num_warps)
    else:
        _nloop_block(a_ptr, w_desc, s_desc, c_ptr, ids_ptr, topk_w_ptr, e, t0, count, N, K, num_routes, top_k,
                     stride_am, stride_cm, BR, STAGES, MUL_WEIGHT, X_LAYOUT, num_warps)


@gluon.jit
def _nloop_block(a_ptr, w_desc, s_desc, c_ptr, ids_ptr, topk_w_ptr, e, t0, count, N, K, num_routes, top_k,
                 stride_am, stride_cm, BR: gl.constexpr, STAGES: gl.constexpr, MUL_WEIGHT: gl.constexpr,
                 X_LAYOUT: gl.constexpr, num_warps: gl.constexpr):
    """`_w4a16_indexed_nloop_kernel`'s work on the first BR slots of a routing block (`ids_ptr`:
    its sorted ids) of expert `e`: its rows gathered once, then `count` weight tiles from N tile
    `t0`, the words and scales of the next tiles in a STAGES-deep TMA ring, tile j+1 dequantized
    while tile j's products run, each tile stored as it retires."""
    BW: gl.constexpr = w_desc.block_type.shape[0]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR, 16])
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    xs = _act_ring(w_desc, BR, 1, True)
    wring, sring, wready = _weight_ring(w_desc, s_desc, STAGES)
    row_ok, a_rows = _gathered_rows(a_ptr, ids_ptr, 0, num_routes, top_k, stride_am, BR, X_LAYOUT)
    _gather_async(xs, 0, a_rows, row_ok, 0, K, X_LAYOUT)
    async_copy.commit_group()
    srow = e * 8  # one K step: eight scale rows an expert
    for i in gl.static_range(STAGES):
        n0 = (t0 + i) * BW
        _load_weights(w_desc, s_desc, e * N + n0, srow, n0, 0, wready.index(i), wring, sring, i, i < count)
    async_copy.wait_group(0)
    fence_async_shared()
    mbarrier.wait(wready.index(0), 0)
    w0, w1, w2, w3, w4, w5, w6, w7 = _dequant_regs(wring, sring, 0, dot_a)
    gl.thread_barrier()  # every warp holds tile 0's fragments and sees every gathered row
    n0 = (t0 + STAGES) * BW
    _load_weights(w_desc, s_desc, e * N + n0, srow, n0, 0, wready.index(0), wring, sring, 0, STAGES < count)
    for j in range(count):
        acc = _issue_regs(xs, 0, gl.zeros([BW, BR], gl.float32, mma), w0, w1, w2, w3, w4, w5, w6, w7)
        # tile j+1 dequantized while tile j's products run (past the last tile: unused, no wait)
        s1 = (j + 1) % STAGES
        mbarrier.wait(wready.index(s1), ((j + 1) // STAGES) & 1, pred=j + 1 < count)
        v0, v1, v2, v3, v4, v5, v6, v7 = _dequant_regs(wring, sring, s1, dot_a)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
        gl.thread_barrier()  # every warp is done with stage s1's words
        n0 = (t0 + j + 1 + STAGES) * BW
        _load_weights(w_desc, s_desc, e * N + n0, srow, n0, 0, wready.index(s1), wring, sring, s1,
                      j + 1 + STAGES < count)
        _indexed_store(_unscaled(acc), c_ptr, ids_ptr, topk_w_ptr, 0, (t0 + j) * BW, N, num_routes,
                       stride_cm, MUL_WEIGHT, num_warps)
        w0, w1, w2, w3, w4, w5, w6, w7 = v0, v1, v2, v3, v4, v5, v6, v7
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(wready.index(i))


#: N tiles a program of `_w4a16_indexed_nloop_kernel` may loop over (`nloop_n_tiles` picks one by
#: the grid): a program gathers its routed rows once for them, so more tiles a program
#: amortize the gather and the ring's fill (about a tile and a half of work), fewer keep more
#: programs to spread over the SMs. 8: the fewest (decode: Kimi TP8 down's 56 tiles of 128 in
#: seven programs a routing block).
NLOOP_N_TILES = (56, 28, 14, 8)
#: A program's tiles times its routing block's rows at most: long programs leave the last wave
#: uneven (the 128-row block's half-tail programs run half as long).
NLOOP_MAX_ROW_TILES = 128 * 28
#: Waves of programs (over the SMs times `NLOOP_CTAS_PER_SM`) the grid must keep (`nloop_n_tiles`
#: has the measurements: 1.4-1.7 waves lost 7-23%, 2.2 gained 5% at TP8 32 tokens).
NLOOP_MIN_WAVES = 2.0
#: CTAs an SM of each N-loop routing block's tile, by its registers (compile tier: 16 / 32 rows
#: 112-124 registers, 64 / 128 rows 150-178, at 256 threads).
NLOOP_CTAS_PER_SM = {16: 2, 32: 2, 64: 1, 128: 1}
#: The register-A tiles that run as `_w4a16_indexed_nloop_kernel` when K is one step: the
#: two-warpgroup ones (the 4-warp tiles spill in the N loop: 255 registers, compile tier; so does
#: the 16-warp 256x64: 256 bytes).
NLOOP_TILES = tuple(t for t in INDEXED_WS_TILES if t[2] == 8)
#: N-loop tiles whose blocks with no route in their second half run the half-row tile
#: (`_w4a16_indexed_nloop_kernel` HALF_TAIL): the 128-row block. Kimi TP8 down at 8192 tokens has
#: 171 routes an expert, so every other block holds ~43. H200, twenty-seventh session
#: (`scripts/probes/nloop_tail.py`, one process, interleaved, bit-identical, us, no tail -> tail):
#: the bench's ``tp8_indexed_t8192`` down 878.8 -> 770.0 and 884.9 -> 776.8 (1.14x, two calls).
#: Not the 64-row block: TP8 down at 4096 tokens (tok_e 85, tails common) 549.0 -> 526.0 but at
#: 2048 (tok_e 43, tails rare) 283.6 -> 295.1, where most of its tok_e range lies; nor the 32-row
#: one (the second main loop takes it from 124 registers to 176, compile tier: one CTA an SM
#: instead of two), nor the 16-row one (its 8-row half copies each row twice, `_gather_layout`).
NLOOP_HALF_TAIL_TILES = tuple(t for t in NLOOP_TILES if t[1] == 128)


#: The four-warpgroup (256 weight rows) tiles run one CTA an SM; below two waves of programs
#: their tail wave costs more than the halved activation traffic saves. H200, eighth session
#: (`scripts/probes/wide_tile.py fewer`, same process, bit-identical, 256-row vs 128-row tile):
#: EP32 (12 experts) gate_up, 192 programs: 0.87x contiguous, 0.88x masked 32 tok/expert; down,
#: 336 programs: 1.11x / 1.14x; EP16 gate_up, 384 programs: 1.13x / 1.06x.
WIDE_TILE_MIN_PROGRAMS = 2 * H200_NUM_SMS


def wide_tile_pays(row_blocks: float, n: int) -> bool:
    """Whether `row_blocks` blocks of activation rows over N outputs fill enough programs of 256
    weight rows for the four-warpgroup tile (`WIDE_TILE_MIN_PROGRAMS`)."""
    return row_blocks * triton.cdiv(n, 256) >= WIDE_TILE_MIN_PROGRAMS


def group_loop_tile(tile: tuple, programs: float, k: int = 0, family: str = "") -> tuple[tuple, str]:
    """The register-A tile to run in place of the heuristics' `tile` for a grid of about
    `programs` 64-row programs and this K, and a note for their reason: a group-loop tile
    (`GROUP_LOOP_MAXNREG`) on a grid under `GROUP_LOOP_MIN_PROGRAMS` runs its deeper-ring
    alternative (`THIN_GRID_TILES`); with `family` ("EP" / "TP": the indexed profile, "masked";
    "": none, or the caller's overrides forbid it) among those its 128-weight-row form was
    measured for (`WIDE_DECODE_TILES`), one whose 128-row grid keeps the family's
    `WIDE_MIN_PROGRAMS` and whose K is short enough runs that form."""
    tile = tuple(tile)
    big, max_steps, families, measured = WIDE_DECODE_TILES.get(tile, (None, 0, (), ""))
    if (family in families and triton.cdiv(k, 256) <= max_steps
            and programs / 2 >= WIDE_MIN_PROGRAMS.get(family, GROUP_LOOP_MIN_PROGRAMS)):
        return big, (f"; 128 weight rows on one warpgroup, one K group at a time under {GROUP_LOOP_MAXNREG[big]} "
                     f"registers (H200 {measured})")
    if tile in THIN_GRID_TILES and programs < GROUP_LOOP_MIN_PROGRAMS:
        return THIN_GRID_TILES[tile], (f"; under {GROUP_LOOP_MIN_PROGRAMS} programs the whole-step loop, "
                                       f"{THIN_GRID_TILES[tile][3]} stages (H200 EP8 1 token gate_up: 50.1 us vs "
                                       f"74.3 at 2 stages)")
    if tile in GROUP_LOOP_MAXNREG:
        return tile, f"; one K group at a time under {GROUP_LOOP_MAXNREG[tile]} registers: more CTAs an SM"
    return tile, ""


#: Decode and mid-size blocks (`group_loop_tile` with a `family`): 128 weight rows on one
#: warpgroup (two m64 wgmmas a group, the group loop) in place of a 64-row tile, where its grid
#: keeps the family's `WIDE_MIN_PROGRAMS` and K has at most the listed 256-wide steps: (tile ->
#: (wide tile, max K steps, the families it was measured faster for, the measurement)). A
#: step's fixed work (barriers, copies, descriptors: about half of the issue-bound loop's 456
#: instructions) then serves twice the weights (SASS: 745 instructions a 128-row step against
#: 2 x 456), at three to five CTAs an SM (96-128 registers). H200, twentieth session
#: (`scripts/probes/decode_blocks.py`, Kimi EP8,
#: same process, bit-identical, us, 64-row -> 128-row): 8-row blocks, down (K 8 steps) at 4 / 8 /
#: 16 tokens 57.4 -> 53.6, 95.2 -> 89.0, 106.6 -> 99.7, one token 29.8 -> 31.3 (448 programs);
#: gate_up (28 steps) 109.5 -> 113.1, 179.9 -> 173.8, 198.8 -> 202.6 (not taken); 16-row blocks
#: at 32 / 50 tokens gate_up 241.5 -> 225.5, 246.0 -> 229.5, down 128.4 -> 120.4, 130.5 -> 122.2.
#: Masked 8 tok/expert (the 16-row group loop, same probe): gate_up 244.5 -> 231.1, down 125.8 -> 120.7.
#: The 32-row block, twenty-first session (`decode_blocks.py mid`, us, gate_up / down, the 64x32
#: step loop at 4 stages (two CTAs an SM by its ring) -> 128x32 on the group loop (three)):
#: EP8 64 / 100 / 150 / 190 tokens 326.9 / 188.8 -> 251.2 / 137.8, 328.2 / 191.0 -> 257.8 /
#: 141.4, 348.4 / 202.8 -> 289.4 / 154.1, 487.3 / 282.0 -> 380.5 / 208.4; TP8 512 / 1024 tokens
#: gate_up 330.3 -> 253.3, 338.1 -> 267.9; masked 16 / 24 tok/expert 307.9 / 183.1 -> 251.1 /
#: 133.2, 327.7 / 189.4 -> 266.6 / 141.3 (1.20-1.37x; the 64x32 group loop 0.99-1.23x; 128x32
#: at 3 stages, two CTAs an SM, 1.06-1.17x). Its short-K form (`SHORT_K_TILES`) maps there too.
_WIDE_32 = ((128, 32, 4, 2), 1 << 30, ("EP", "TP", "masked"),
            "EP8 64-190 tokens, TP8 gate_up, masked 16 tok/expert on 12-48 experts: 1.16-1.37x the 64x32 step loop")
#: The 128-row programs a family's grid must keep for `WIDE_DECODE_TILES` (64-row programs / 2;
#: default `GROUP_LOOP_MIN_PROGRAMS`). Indexed: its one-token gate_up (256 programs of 128 rows)
#: ran 85.9 us on 128x8 against the 3-stage 64x8 step loop's 50.2. Masked: none; H200,
#: twenty-first session (`decode_blocks.py thin`, us, gate_up / down, the 64-row default ->
#: the 128-row form): 24 experts 8 tok/expert 125.7 / 64.9 -> 119.9 / 63.5, 16 tok 158.7 /
#: 95.6 -> 137.0 / 74.9; 12 experts (384 programs of 128 rows) 8 tok 77.1 / 37.9 -> 62.5 /
#: 38.6, 16 tok 82.9 / 53.3 -> 70.2 / 42.8.
WIDE_MIN_PROGRAMS = {"masked": 0}
WIDE_DECODE_TILES = {
    (64, 8, 4, 2): ((128, 8, 4, 2), 8, ("EP",), "EP8 decode down 1.07x the 64-row tile"),
    (64, 16, 4, 2): ((128, 16, 4, 2), 1 << 30, ("EP", "masked"),
                     "EP8 32 / 50 tokens 1.07x, masked 8 tok/expert 0.98-1.23x the 64-row tiles"),
    (64, 32, 4, 4): _WIDE_32,
    (64, 32, 4, 2): _WIDE_32,
}


def runs_nloop(tile: tuple, k: int) -> bool:
    """Whether a register-A indexed `tile` runs as the N-loop kernel for this K (one 256-wide
    step, a two-warpgroup tile): the launcher's rule, which the heuristics' reason reports."""
    return k <= 256 and tuple(tile) in NLOOP_TILES


def nloop_n_tiles(block_m: int, num_routes: int, num_experts: int, n: int, bw: int = 128,
                  num_sms: int = H200_NUM_SMS) -> int:
    """N tiles a program of the N-loop kernel loops over (`NLOOP_N_TILES`): the most whose
    program keeps at most `NLOOP_MAX_ROW_TILES` (rows x tiles) and whose grid keeps
    `NLOOP_MIN_WAVES` waves, for about ``num_routes / block_m + num_experts / 2`` routing blocks
    (half a block of padding an expert) over N outputs in tiles of `bw` rows; the fewest if
    none does. H200, twenty-seventh session (`scripts/probes/nloop_tail.py`, Kimi TP8 down, one
    process, interleaved, bit-identical, us, 8 / 14 / 28 / 56 tiles a program, call 5): 8192
    tokens (128-row blocks) 779.0 / 737.2 / 721.3 / 738.7; 4096 (64-row) 556.7 / 520.5 / 499.4 /
    493.6; 2048 (64-row) 287.7 / 264.4 / 250.2 / 245.1; 1024 (32-row) 171.1 / 166.0 / 158.0 /
    194.3; 512 (16-row) 149.8 / 143.5 / 146.9 / 157.5; 128 132.5 / 125.7 / 123.0 / 140.0; 32 74.3
    / 70.4 / 81.9 / 79.4 (call 4 agrees within 2% at 1024-8192)."""
    blocks = num_routes / block_m + min(num_experts, num_routes) / 2
    slots = num_sms * NLOOP_CTAS_PER_SM.get(block_m, 1)
    tiles = triton.cdiv(n, bw)
    for chunk in nloop_tile_counts(block_m):
        if blocks * triton.cdiv(tiles, chunk) >= NLOOP_MIN_WAVES * slots:
            return chunk
    return NLOOP_N_TILES[-1]


def nloop_tile_counts(block_m: int) -> tuple[int, ...]:
    """The tiles a program (`NLOOP_N_TILES`) a routing block of `block_m` rows may run in the N-loop
    kernel, most first: each a compiled variant, at most `NLOOP_MAX_ROW_TILES` rows x tiles."""
    return tuple(c for c in NLOOP_N_TILES if block_m * c <= NLOOP_MAX_ROW_TILES or c == NLOOP_N_TILES[-1])


def _gather_layout(br: int, num_warps: int, wide_pieces: bool = False) -> gl.BlockedLayout:
    """The cp.async gather's layout for a stage's ``[8, br, 32]`` bf16 boxes.

    Default: every thread a distinct piece of each box (16 bytes when the box is big enough,
    4-8 bytes for small routing blocks), warps along the rows; a thread copies several rows
    when 8 elements a thread do not cover the box, and the same piece of all eight boxes.
    `wide_pieces` (the group-loop tiles, `GROUP_LOOP_MAXNREG`): 16-byte pieces always, a row's
    four in four lanes, up to eight rows a warp, warps along the rows while there are rows
    left, then along the boxes; an 8- or 16-row block then copies 2 or 4 pieces a thread a
    step instead of 8 (decode loop 489 -> 456 instructions, SASS). H200, twentieth session
    (`scripts/probes/gather_layout.py`, Kimi EP8, bit-identical): 1.01-1.07x at 1-50 tokens on
    the group-loop tiles. Not the default: the step-loop tiles then took 167-175 registers
    (128 before; capped at 128 they spill), one CTA an SM fewer: one-token gate_up on 64x8x3
    49.5 -> 56.7 us."""
    if wide_pieces:
        tr = min(br, 8)  # lanes along the rows
        wr = min(num_warps, max(1, br // tr))  # warps along the rows
        return gl.BlockedLayout([1, 1, 8], [8 // tr, tr, 4], [num_warps // wr, wr, 1], [2, 1, 0])
    vec = max(2, min(8, br * 32 // (32 * num_warps)))
    return gl.BlockedLayout([1, 1, vec], [1, 32 * vec // 32, 32 // vec], [1, num_warps, 1], [2, 1, 0])


def _n_fastest(br: int) -> bool:
    """The program order (`_tile_ids`): N tiles fastest for prefill tiles (>= 64 activation rows),
    row blocks fastest for decode tiles. H200, 2026-11-30 (`scripts/probes/ab.py`, Kimi EP8, same
    process, bit-identical): N fastest made contiguous 128 rows/expert 870.7 -> 776.3 us (its
    88 MB of activations outgrow the L2), masked 32 tok/expert (128x64) 470.9 -> 451.9, indexed
    down at 1024 tokens 855.5 -> 804.0, indexed decode 0.99-1.07x, but masked 8 tok/expert
    (64x16) 258.4 -> 283.9."""
    return br >= 64


def _grid(blocks: int, n_tiles: int, n_fastest: bool) -> tuple[int, ...]:
    return (blocks * n_tiles,) if n_fastest else (blocks, n_tiles)


def _x_layout(br: int):
    return gl.NVMMASharedLayout.get_default_for([br, 32], gl.bfloat16)


def _act_desc(a: torch.Tensor, k: int, br: int, groups: int = 8) -> TensorDescriptor:
    """TMA descriptor of the activations ``bf16 [rows, K]`` seen as ``[K / 32, rows, 32]`` (group,
    row, column; strides 32, row stride, 1): one box ``[8, br, 32]`` is a K step's eight
    ``[br, 32]`` group boxes, stacked as the activation ring holds them (``groups=4``: half a
    step, `_rs_halves_mainloop`). Groups past K read 0."""
    return TensorDescriptor(a, [k // 32, a.shape[0], 32], [32, a.stride(0), 1], [groups, br, 32], _x_layout(br))


_S_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)  # plain rows: sliced by group


def _weight_descs(w, bw: int) -> tuple[TensorDescriptor, TensorDescriptor]:
    """TMA descriptors of a prepared weight: words ``[E * N, Kp / 8]`` (box ``[bw, 32]``, one
    K step of `bw` rows) and scales ``[E * Kp / 32, N]`` (box ``[8, bw]``, one step's groups).
    A box past row N of an expert reads the next expert's rows: those outputs are masked."""
    e, n, kw = w.qweight.shape
    if n % 8:
        raise ValueError(f"engine='gluon' loads the scales ([E * Kp/32, N] bf16) through TMA, whose row "
                         f"stride must be a multiple of 16 bytes: N={n} is not a multiple of 8 (use engine='triton')")
    words = w.qweight.view(e * n, kw)
    scales = w.scales.view(-1, n)
    w_desc = TensorDescriptor(words, list(words.shape), [kw, 1], [bw, 32],
                              gl.NVMMASharedLayout.get_default_for([bw, 32], gl.int32))
    s_desc = TensorDescriptor(scales, list(scales.shape), [n, 1], [8, bw], _S_LAYOUT)
    return w_desc, s_desc


def w4a16_grouped_sm90_launch(a, w, route, out, tile, max_m: int = 0, regs_a: bool = False,
                              warp_specialize: bool = False, row_slots: int = 0) -> None:
    """Launch on operands `w4a16_grouped` has validated (N a multiple of 8: TMA row strides).
    Contiguous (``max_m == 0``): a ``bf16 [m, K]``, route = m_indices ``int32 [m]``. Masked
    (``max_m > 0``): a the flat ``bf16 [G * max_m, K]``, route = masked_m ``int32 [G]``, and
    `row_slots` programs an expert for each N tile (`masked_row_slots`; 0: one a row block of
    max_m, the only grid of the warp-specialized kernel, which does not loop over row blocks).
    w: the mode's `W4A16Weight`; out ``bf16 [rows, N]``; tile one of `GLUON_TILES` (or of
    `GLUON_RS_TILES` with `regs_a`: the register-A kernel; with `warp_specialize` too, its
    `_ws_mainloop` with a producer warp)."""
    if warp_specialize and row_slots:
        raise ValueError("the warp-specialized grouped kernel runs one program a row block of max_m: row_slots=0")
    bw, br, warps, stages = tile
    rows = a.shape[0]
    extra = _grouped_rs_constexprs(tile, warp_specialize, bool(max_m)) if regs_a else {}
    if regs_a:
        x_desc = _act_desc(a, w.k, br, 4 if extra.get("HALF_ACTS") else 8)
        xh_desc = _act_desc(a, w.k, br // 2) if extra["HALF_TAIL"] else x_desc
    else:
        x_desc = TensorDescriptor(a, [rows, w.k], [a.stride(0), 1], [br, 32], _x_layout(br))
    w_desc, s_desc = _weight_descs(w, bw)
    slots = _slots(max_m, br, row_slots)
    blocks = w.num_experts * slots if max_m else rows // br
    kernel = _w4a16_grouped_rs_kernel if regs_a else _w4a16_grouped_sm90_kernel
    if regs_a and (cap := _rs_maxnreg(tile, extra, grouped=True)):
        extra["maxnreg"] = cap
    n_fastest = _n_fastest(br)
    descs = (x_desc, xh_desc) if regs_a else (x_desc,)
    kernel[_grid(blocks, triton.cdiv(w.n, bw), n_fastest)](
        *descs, w_desc, s_desc, out, route, w.n, w.k, max_m, out.stride(0), slots,
        STAGES=stages, MASKED=bool(max_m), N_FASTEST=n_fastest, num_warps=warps, **extra,
    )


#: ptxas register caps of grouped register-A tiles (``maxnreg``). The loop over an expert's row
#: blocks (`_grouped_rows`) raised ptxas's count of the one-warpgroup tiles from 168 to 209-228.
#: Capped at 168 (no spill), 64x16 ran 1.02-1.03x uncapped (masked 8 tok/expert, H200,
#: sixteenth session: 287.7 / 153.7 vs 296.0 / 157.3 us); 64x32 capped spills 8 bytes and ran
#: the same (339.1 / 190.9 vs 338.5 / 190.7), so it is not capped.
GROUPED_MAXNREG = {(64, 16, 4, 3): 168}


def masked_row_slots(expected_rows: float, max_m: int, rows: int) -> int:
    """Programs an expert (for each N tile) of the masked kernels with `rows`-row tiles: enough
    row blocks for `expected_rows` (the heuristic's expected_m times its spread), at most one
    a row block of max_m. Each program loops over its expert's blocks (`_grouped_rows`), so a
    count past the expected one is still computed, by fewer programs. Why not one program a
    row block of max_m: the programs past ``masked_m`` exit at once, but each is still
    scheduled. H200, sixteenth session (Kimi EP8, max_m 256, interleaved, us, gate_up / down,
    one program a block of max_m -> this rule, bit-identical): masked 8 tok/expert 294.0 / 197.8
    -> 287.7 / 153.7, 16 tok 341.5 / 207.7 -> 339.1 / 190.9, 32 tok 413.5 / 241.0 -> 413.0 /
    239.8. The split tiles and the warp-specialized kernel keep one program a block (their loop
    versions ran 2% and 5% slower: `w4a16_grouped_split_launch`, `_w4a16_grouped_rs_kernel`)."""
    return max(1, min(triton.cdiv(max_m, rows), triton.cdiv(math.ceil(expected_rows), rows)))


def _slots(max_m: int, rows: int, row_slots: int) -> int:
    if not max_m:
        return 1  # contiguous: unused
    all_blocks = triton.cdiv(max_m, rows)
    if row_slots < 0 or row_slots > all_blocks:
        raise ValueError(f"row_slots must be in 0..{all_blocks} (cdiv(max_m={max_m}, {rows})), got {row_slots}")
    return row_slots or all_blocks


#: The grouped register-A tiles whose main loop keeps two accumulators (`_issue_groups`).
#: H200, sixteenth session (`scripts/probes/split_acc.py`, interleaved, Kimi EP8 masked, us,
#: gate_up / down): 64x32 at 16 tok/expert 359.0 -> 339.1 / 226.1 -> 209.6 and 364.1 -> 347.0 /
#: 226.0 -> 209.2 (1.05-1.08x); 64x16 at 8 tok/expert 1.02x, 128x64 at 32-64 1.00x (not split).
#: The indexed kernel's 64x32 tile (cp.async gather) ran 0.97x split, so it keeps one.
SPLIT_ACC_TILES = ((64, 32, 4, 4),)


def _split_acc(tile) -> bool:
    return tuple(tile) in SPLIT_ACC_TILES


def split_tile_rows(rows: float) -> int:
    """The masked split tile's row count for an expert of about `rows` rows (expected rows times
    the spread), 0 where a power-of-two tile serves: only past 64 rows (measured above:
    `GLUON_SPLIT_TILES`), the smallest split tile that holds them."""
    if rows <= 64:
        return 0
    return min((t[1] for t in GLUON_SPLIT_TILES if t[1] >= rows), default=0)


def _split_rows(br: int) -> tuple[int, int]:
    """A row tile that is not a power of two as (power of two, power of two remainder)."""
    hi = 1 << (br.bit_length() - 1)
    lo = br - hi
    if lo & (lo - 1) or lo < 8:
        raise ValueError(f"row tile {br} is not a power of two plus a power of two >= 8")
    return hi, lo


#: Split tiles whose blocks with rows only in the first BR_HI run the BR_HI-row tile alone
#: (HI_TAIL in `_w4a16_grouped_split_kernel`). H200, seventeenth session (`scripts/probes/half_tail.py
#: split`, one process, interleaved, bit-identical, Kimi EP8 masked 64 tok/expert, us, gate_up /
#: down): 256x96 524.8 -> 467.9 / 301.9 -> 263.5 (1.12x / 1.15x), 256x80 581.3 -> 493.4 / 296.7 ->
#: 267.1 (1.18x / 1.11x).
SPLIT_HI_TAIL_TILES = ((256, 48, 16, 3), (256, 80, 16, 2), (256, 96, 16, 2))


def w4a16_grouped_split_launch(a, w, route, out, tile, max_m: int, warp_specialize: bool = False) -> None:
    """`w4a16_grouped_sm90_launch` for a tile of `GLUON_SPLIT_TILES` (masked only: contiguous
    segments are 128-row aligned, which a 48- to 96-row tile does not divide): one program a
    row block of max_m (the kernel does not loop over an expert's blocks); `warp_specialize`:
    its `_ws_mainloop` form (a tile of `GLUON_SPLIT_WS_TILES`)."""
    bw, br, warps, stages = tile
    if not max_m:
        raise ValueError(f"the {br}-row split tiles are masked-only (contiguous segments are 128-row aligned)")
    if warp_specialize and tuple(tile) not in GLUON_SPLIT_WS_TILES:
        raise ValueError(f"split tile {tile} has no warp-specialized form ({GLUON_SPLIT_WS_TILES})")
    hi, lo = _split_rows(br)
    w_desc, s_desc = _weight_descs(w, bw)
    slots = _slots(max_m, br, 0)
    _w4a16_grouped_split_kernel[_grid(w.num_experts * slots, triton.cdiv(w.n, bw), True)](
        _act_desc(a, w.k, hi), _act_desc(a, w.k, 2 * hi if warp_specialize else lo), w_desc, s_desc, out, route, w.n,
        w.k, max_m, out.stride(0), slots, STAGES=stages, MASKED=True, N_FASTEST=True,
        HI_TAIL=tuple(tile) in SPLIT_HI_TAIL_TILES, WARP_SPECIALIZE=warp_specialize, num_warps=warps,
    )


#: Register-A tiles whose row blocks with no live row in their second half (an expert's last
#: block) run the half-row tile in the same program (HALF_TAIL in `_w4a16_grouped_rs_kernel`,
#: `_w4a16_indexed_rs_kernel`), so the wgmmas skip rows that are never stored. H200, seventeenth
#: session (`scripts/probes/half_tail.py`: old and new kernel in one process, interleaved,
#: bit-identical, us, Kimi EP8, gate_up / down):
#:   indexed 1024 tokens (128-row blocks, ~170 routes an expert) 256x128 1187.7 -> 1086.8 /
#:   649.4 -> 593.9; TP8 8192 tokens gate_up 1199.5 -> 1103.7; 512 tokens (no tails) 0.99-1.00x;
#:   masked 32 tok/expert 256x64 405.8 -> 383.4 / 239.2 -> 218.2; masked 16 64x32 328.3 ->
#:   304.9 / 190.0 -> 182.0.
#: Not kept: the indexed 64x32 tile (100-150 tokens, 0.91-0.98x: the second main loop took
#: ptxas from 4 CTAs an SM to 3); the indexed 256x64 (256 tokens: 43 routes an expert, no half
#: tails; 0.99-1.01x); contiguous 256x128 (segments of 0.7-1.3 x 128 rows padded to 128:
#: 1.02-1.06x, but exact 128-row segments, the bench's, 0.97-0.99x: the check costs where no
#: block has a half tail).
#: Twenty-first session, the one-warpgroup 128x64 group loop: masked measured with its half tail
#: only; indexed (`decode_blocks.py wide64`, us, gate_up / down, no tail -> half tail) EP8 384
#: tokens 578.8 / 318.1 -> 554.1 / 302.2, 512 tokens 755.1 / 406.4 -> 686.5 / 378.4, 256 tokens
#: 376.7 / 215.2 -> 375.7 / 219.3.
HALF_TAIL_TILES = {"masked": ((256, 64, 16, 3), (64, 32, 4, 4), (128, 64, 4, 2)),
                   "indexed": ((256, 128, 16, 2), (128, 64, 4, 2), (128, 128, 4, 2))}


#: The warp-specialized (four-warpgroup) tiles' tails, each a second `_ws_mainloop` region in the
#: same program: a row block with no live row in its second half runs the half-row tile
#: (HALF_TAIL), one with none in its last quarter multiplies only its first three quarters
#: (QUARTER_TAIL: a BR/2 + BR/4 split of the accumulator). H200, eighteenth session
#: (`scripts/probes/ws_wide.py`, us, gate_up / down, no tails -> half only -> both): indexed
#: 256 tokens 387.4 / 228.8 -> 396.8 / 232.8 -> 388.5 / 227.2; 384 tokens 572.5 / 313.2 ->
#: 552.9 / 308.7 -> 540.5 / 304.1; masked 32 tok/expert 384.4 / 234.0 -> 355.3 / 215.7 -> 352.8 /
#: 213.6. Only both are offered.
WS_TAIL_TILES = {"masked": ((256, 64, 16, 3),), "indexed": ((256, 64, 16, 3),)}


#: Group-loop tiles whose activations are one step refilled by halves (`_rs_halves_mainloop`)
#: instead of a STAGES-deep ring: 128x64 then fits three CTAs an SM (68 KB at 168 registers,
#: where two 32 KB activation stages made 100 KB: two CTAs an SM). H200, twenty-sixth session
#: (`scripts/probes/half_acts.py`, one process, interleaved, bit-identical, us, ring -> halves):
#:   indexed EP8 (64-row blocks) gate_up / down: the bench's 256-token draw 364.7 -> 337.6 /
#:   210.0 -> 184.0, 192 tokens 329.1 -> 300.5 / 184.8 -> 163.6, 384 tokens 529.1 -> 473.5 /
#:   282.5 -> 249.9; `moe_experts` 256 / 384 tokens 601.2 -> 544.5 / 853.8 -> 754.9;
#:   masked 32 tok/expert (bench draws) EP8 300.7 -> 293.0 / 166.4 -> 154.8, EP16 165.1 -> 163.8 /
#:   92.1 -> 90.3, EP32 103.7 -> 88.4 / 53.3 -> 52.4.
#: Not kept: the 128x32 group loop by halves (52 KB, four CTAs an SM at 128 registers, which
#: then spill): indexed 96 / 160 tokens 0.98-1.03x, masked 16 tok/expert down 0.88x.
HALF_ACT_TILES = {"indexed": ((128, 64, 4, 2), (128, 128, 4, 2)), "masked": ((128, 64, 4, 2),), "contiguous": ()}
#: Stack bytes a halves tile may spill (compile tier): the masked 128x64 at its 168-register cap
#: (three CTAs an SM allow no more) keeps 15 epilogue scalars (output row, pointers, counts) on
#: the stack across the main loop, stored once and read once a row block; measured faster as it
#: is (the table above).
#: The pre-gathered indexed 128x64 (`_w4a16_indexed_tma_kernel`) spills 16 bytes at the same cap
#: (two epilogue scalars); measured as it is (`w4a16_indexed._PREGATHER_MIN_N`).
HALF_ACT_SPILL_BYTES = {("masked", (128, 64, 4, 2)): 64, ("indexed_tma", (128, 64, 4, 2)): 16}


def _half_acts(tile, warp_specialize: bool, family: str) -> bool:
    return _group_loop(tile, warp_specialize) and tuple(tile) in HALF_ACT_TILES[family]


def half_acts_note(tile, engine: str, family: str) -> str:
    """What the heuristics' reasons say of a tile that refills its activations by halves
    (`HALF_ACT_TILES`), "" for any other: `engine` the Gluon engine, `family` "indexed", "masked"
    or "contiguous"."""
    if engine != "gluon_rs" or not _half_acts(tile, False, family):
        return ""
    if tuple(tile) in PREGATHER_BLOCK_TILES.values():
        return ("; one K step of activations refilled by halves: two CTAs an SM (H200 EP8 768-2048 tokens, "
                "pre-gathered: 1.03-1.11x the 256x128)")
    measured = "EP8 192-384 tokens: 1.08-1.14x" if family == "indexed" else "masked 32 tok/expert: 1.01-1.17x"
    return f"; one K step of activations refilled by halves: three CTAs an SM (H200 {measured})"


def _half_tail(tile, warp_specialize: bool, family: str) -> bool:
    tiles = WS_TAIL_TILES if warp_specialize else HALF_TAIL_TILES
    return tuple(tile) in tiles[family]


def _quarter_tail(tile, warp_specialize: bool, family: str) -> bool:
    return warp_specialize and tuple(tile) in WS_TAIL_TILES[family]


def tail_rows(tile, engine: str, family: str) -> int:
    """The rows of the smaller tile that a block of `tile` whose live rows end early runs instead
    (`HALF_TAIL_TILES`, `WS_TAIL_TILES`, `SPLIT_HI_TAIL_TILES`), 0 if none: what the
    heuristics' reasons report. `engine`: the Gluon engine; `family`: "masked", "contiguous" or
    "indexed"."""
    tile = tuple(tile)
    if engine not in ("gluon_rs", "gluon_ws"):
        return 0
    split = GLUON_SPLIT_TILES if engine == "gluon_rs" else GLUON_SPLIT_WS_TILES
    if family == "masked" and tile in split and tile in SPLIT_HI_TAIL_TILES:
        return _split_rows(tile[1])[0]
    half = HALF_TAIL_TILES if engine == "gluon_rs" else WS_TAIL_TILES
    return tile[1] // 2 if tile in half.get(family, ()) else 0


def nloop_tail_rows(tile) -> int:
    """The rows of the half-row tile that an N-loop block of `tile` (`runs_nloop`) whose second
    half holds no route runs instead (`NLOOP_HALF_TAIL_TILES`), 0 if none."""
    return tile[1] // 2 if tuple(tile) in NLOOP_HALF_TAIL_TILES else 0


def _group_loop(tile, warp_specialize: bool) -> bool:
    """Whether a register-A launch of `tile` runs the group loop (`GROUP_LOOP_MAXNREG`; never the
    warp-specialized main loop)."""
    return not warp_specialize and tuple(tile) in GROUP_LOOP_MAXNREG


def _grouped_rs_constexprs(tile, warp_specialize: bool, masked: bool) -> dict:
    """The register-A grouped kernel's variant constexprs for `tile` (launcher and compile tier)."""
    return {"WARP_SPECIALIZE": warp_specialize, "SPLIT_ACC": _split_acc(tile),
            "HALF_TAIL": masked and _half_tail(tile, warp_specialize, "masked"),
            "QUARTER_TAIL": masked and _quarter_tail(tile, warp_specialize, "masked"),
            "GROUP_LOOP": _group_loop(tile, warp_specialize),
            "HALF_ACTS": _half_acts(tile, warp_specialize, "masked" if masked else "contiguous")}


#: Register-A indexed tiles whose cp.async gather masks rows only, not K, when K is a multiple of
#: 256 (K_TAIL in `_w4a16_indexed_rs_kernel`): the four-warpgroup tiles, one CTA an SM, whose 16
#: warps all copy. H200, twenty-ninth session (`scripts/probes/variant_cases.py`, variant
#: ``evenk``, one process, interleaved, bit-identical, us): Kimi EP8 2048 tokens 256x128 gate_up
#: 1808.2 -> 1738.9, down 945.8 -> 911.4 (1.04x; as built, against the previous commit: 1862.0 -> 1791.5,
#: 951.6 -> 917.5, GPU tests passed). Not the one-warpgroup tiles: 0.98-1.02x at 8-1024
#: tokens, and the 128x64 by halves then spills 8 bytes at its 168-register cap.
EVEN_K_GATHER_TILES = ((256, 128, 16, 2), (256, 64, 16, 3))


def _indexed_rs_constexprs(tile, warp_specialize: bool, k: int = 0) -> dict:
    """The register-A indexed kernel's layout and variant constexprs for `tile` and K `k` (0: any K,
    a tail allowed)."""
    bw, br, warps, stages = tile
    half = _half_tail(tile, warp_specialize, "indexed")
    group_loop = _group_loop(tile, warp_specialize)
    gather_warps = _WS_GATHER_WARPS.value if warp_specialize else warps
    return {"X_LAYOUT": _gather_layout(br, gather_warps, group_loop),
            "WARP_SPECIALIZE": warp_specialize, "HALF_TAIL": half,
            "X_HALF_LAYOUT": _gather_layout(br // 2, gather_warps, group_loop) if half else None,
            "QUARTER_TAIL": _quarter_tail(tile, warp_specialize, "indexed"), "GROUP_LOOP": group_loop,
            "HALF_ACTS": _half_acts(tile, warp_specialize, "indexed"),
            "K_TAIL": not (k > 0 and k % 256 == 0 and not warp_specialize and tuple(tile) in EVEN_K_GATHER_TILES)}


def _nloop_constexprs(tile) -> dict:
    """The N-loop kernel's gather layouts and tail constexpr for `tile` (launcher and compile tier)."""
    _, br, warps, _ = tile
    half = nloop_tail_rows(tile)
    return {"X_LAYOUT": _gather_layout(br, warps), "HALF_TAIL": bool(half),
            "X_HALF_LAYOUT": _gather_layout(half, warps) if half else None}


def _rs_maxnreg(tile, constexprs: dict, grouped: bool) -> int | None:
    """The ptxas register cap of a register-A launch (launchers and compile tier): a group-loop
    tile's (`GROUP_LOOP_MAXNREG`), else the grouped kernel's (`GROUPED_MAXNREG`), else none."""
    if constexprs.get("GROUP_LOOP"):
        return GROUP_LOOP_MAXNREG[tuple(tile)]
    return GROUPED_MAXNREG.get(tuple(tile)) if grouped else None


def w4a16_indexed_sm90_launch(a, w, sorted_ids, expert_ids, ntpp, top_k: int, topk_weights, out, tile,
                              regs_a: bool = False, warp_specialize: bool = False, split_k: int = 1,
                              pdl: int = 0, pregather: bool = False, slot_order: bool = False) -> None:
    """Launch on operands `w4a16_indexed` has validated (its docstring has the shapes; N a
    multiple of 8); tile one of `INDEXED_TILES`, whose routing block size the routing was
    built with; `regs_a`: the register-A kernel (a tile of `INDEXED_RS_TILES`), with
    `warp_specialize` its producer-warp main loop (a tile of `INDEXED_WS_TILES`). A K of one
    256-wide step on a two-warpgroup register-A tile (`NLOOP_TILES`) runs the N-loop kernel
    `_w4a16_indexed_nloop_kernel` instead (with or without `warp_specialize`). `split_k` > 1
    (register-A main loop only, `k_split_ok`): `out` is the FP32 workspace
    ``[split_k, M * top_k, N]`` of K shares, which the caller sums. `pdl` (`pdl`): 0 a plain launch;
    1 a PDL launch that waits first; 2 one that streams its first weight steps before its wait (the
    routing written two launches back or more). The register-A kernel takes it (2 becomes 1 on
    the warp-specialized main loop); the N loop and the shared-memory engine launch plainly.
    `slot_order` (with `pregather`): `a` is already ``[P, K]`` in slot order, with
    ``out.shape[0]`` routes (`w4a16_indexed`'s ``slot_order_routes``)."""
    bw, br, warps, stages = tile
    if slot_order and not pregather:
        raise ValueError("slot_order: rows in slot order run on the pre-gathered path only (pregather)")
    if pregather and not pregather_ok(tile, w.k, warp_specialize, split_k, regs_a):
        raise ValueError(f"pregather: the register-A kernel's main loop (no warp specialization, no K shares, K past "
                         f"one step) on a tile of {PREGATHER_TILES}; got {tile}, K={w.k}")
    if split_k > 1 and (not regs_a or warp_specialize or runs_nloop(tile, w.k) or not k_split_ok(w.k, split_k)):
        raise ValueError(f"split_k={split_k}: the register-A (not warp-specialized) kernel splits K, into "
                         f"non-empty shares of K={w.k}'s {triton.cdiv(w.k, 256)} steps; tile {tile}")
    w_desc, s_desc = _weight_descs(w, bw)
    routes = out.shape[-2]  # M * top_k (out or the K shares' workspace); with `slot_order`, a has P rows
    blocks = live_block_bound(expert_ids.numel(), routes)  # no program for the over-allocation
    if regs_a and runs_nloop(tile, w.k):
        n_tiles = nloop_n_tiles(br, routes, w.num_experts, w.n, bw, num_sms(a.device))
        chunks = triton.cdiv(triton.cdiv(w.n, bw), n_tiles)
        _w4a16_indexed_nloop_kernel[(blocks * chunks,)](
            a, w_desc, s_desc, out, sorted_ids, expert_ids, ntpp, out if topk_weights is None else topk_weights,
            w.n, w.k, routes, top_k, a.stride(0), out.stride(0),
            BR=br, STAGES=stages, MUL_WEIGHT=topk_weights is not None, N_TILES=n_tiles, num_warps=warps,
            **_nloop_constexprs(tile))
        return
    if pregather:
        _indexed_tma_launch(a, w, w_desc, s_desc, sorted_ids, expert_ids, ntpp, top_k, topk_weights, out, tile,
                            blocks, pdl, slot_order)
        return
    kernel = _w4a16_indexed_rs_kernel if regs_a else _w4a16_indexed_sm90_kernel
    extra = _indexed_rs_constexprs(tile, warp_specialize, w.k) if regs_a else {}
    if regs_a and (cap := _rs_maxnreg(tile, extra, grouped=False)):
        extra["maxnreg"] = cap
    if regs_a and pdl:
        extra.update(PDL=1 if extra["WARP_SPECIALIZE"] else pdl, **launch_options(True))
    if split_k > 1:
        extra.update(SPLIT_K=split_k, stride_ws=out.stride(0))
    n_fastest = _n_fastest(br)
    grid = _grid(blocks, triton.cdiv(w.n, bw), n_fastest)
    if split_k > 1:  # the K shares on axis 2
        grid = (*grid, split_k) if len(grid) == 2 else (*grid, 1, split_k)
    kernel[grid](
        a, w_desc, s_desc, out, sorted_ids, expert_ids, ntpp, out if topk_weights is None else topk_weights,
        w.n, w.k, routes, top_k, a.stride(0), out.stride(-2),
        BR=br, STAGES=stages, MUL_WEIGHT=topk_weights is not None, N_FASTEST=n_fastest, num_warps=warps, **extra,
    )


#: The register-A indexed tiles that can run on pre-gathered rows (`_w4a16_indexed_tma_kernel`):
#: the prefill blocks' main-loop tiles (a K past one step), and one only that kernel runs: the
#: 128-row block on one warpgroup (128 weight rows x 128 routes, group loop at 240 registers,
#: its activations one step refilled by halves: 100 KB, two CTAs an SM; `PREGATHER_BLOCK_TILES`).
#: With the in-kernel gather that tile spills (24 bytes at 240 registers): not offered there.
PREGATHER_TILES = ((256, 128, 16, 2), (128, 64, 4, 2), (128, 128, 4, 2))
#: The pre-gathered path's tile by routing block, where it differs from the block's default.
#: H200, thirtieth session (`scripts/probes/pregather.py tiles`, one process, interleaved,
#: bit-identical, us, all pre-gathered; 128x64 (64-row block) / 256x128 / 128x128 one warpgroup):
#: Kimi EP8 gate_up at 512 / 768 / 1024 (the bench's) / 1536 / 2048 tokens 575.1 / 534.3 / 539.3,
#: 763.1 / 758.0 / 733.6, 958.3 / 991.3 / 921.3, 1425.0 / 1387.5 / 1327.4, 1898.9 / 1780.6 /
#: 1719.5; down 306.1 / 321.2 / 304.8, 391.7 / 394.4 / 376.5, 496.7 / 514.5 / 479.3, 711.4 / 710.3 /
#: 663.7, 952.2 / 928.6 / 873.2: the one-warpgroup 128x128 1.03-1.11x the 256x128 (0.99x at 512
#: tokens' gate_up), 1.00-1.10x the 64-row block.
PREGATHER_BLOCK_TILES = {128: (128, 128, 4, 2)}


def pregather_ok(tile, k: int, warp_specialize: bool = False, split_k: int = 1, regs_a: bool = True) -> bool:
    """Whether `tile` can run `w4a16_indexed_sm90_launch`'s ``pregather`` path for this K."""
    return regs_a and not warp_specialize and split_k == 1 and k > 256 and tuple(tile) in PREGATHER_TILES


def _indexed_tma_launch(a, w, w_desc, s_desc, sorted_ids, expert_ids, ntpp, top_k, topk_weights, out, tile,
                        blocks: int, pdl: int, slot_order: bool = False) -> None:
    """`gather_indexed_rows` into a ``[P, K]`` buffer (`a` itself when `slot_order`), then
    `_w4a16_indexed_tma_kernel` over it."""
    from ...routing.kernels import gather_indexed_rows

    bw, br, warps, stages = tile
    rows = a if slot_order else gather_indexed_rows(a, sorted_ids, expert_ids, ntpp, top_k)
    extra = _indexed_rs_constexprs(tile, False, w.k)
    x_desc = _act_desc(rows, w.k, br, 4 if extra["HALF_ACTS"] else 8)
    xh_desc = _act_desc(rows, w.k, br // 2) if extra["HALF_TAIL"] else x_desc
    consts = {k: extra[k] for k in ("HALF_TAIL", "GROUP_LOOP", "HALF_ACTS")}
    if cap := _rs_maxnreg(tile, extra, grouped=False):
        consts["maxnreg"] = cap
    if pdl:
        consts.update(PDL=pdl, **launch_options(True))
    n_fastest = _n_fastest(br)
    _w4a16_indexed_tma_kernel[_grid(blocks, triton.cdiv(w.n, bw), n_fastest)](
        x_desc, xh_desc, w_desc, s_desc, out, sorted_ids, expert_ids, ntpp, out if topk_weights is None else topk_weights,
        w.n, w.k, out.shape[0], out.stride(0),
        STAGES=stages, MUL_WEIGHT=topk_weights is not None, N_FASTEST=n_fastest, num_warps=warps, **consts,
    )


def compile_configs():
    """The Gluon tiles for the compile tier."""
    from triton.runtime.jit import mangle_type

    from ..compile_tier import KernelConfig

    def descs(bw: int) -> dict[str, str]:  # types only: dtype, block, layout
        words = torch.empty(64, 64, dtype=torch.int32)
        scales = torch.empty(64, 64, dtype=torch.bfloat16)
        return {"w_desc": mangle_type(TensorDescriptor(words, [64, 64], [64, 1], [bw, 32],
                                                       gl.NVMMASharedLayout.get_default_for([bw, 32], gl.int32))),
                "s_desc": mangle_type(TensorDescriptor(scales, [64, 64], [64, 1], [8, bw], _S_LAYOUT))}

    cfgs = []
    grouped = ([("", t) for t in GLUON_TILES] + [("_rs", t) for t in GLUON_RS_TILES]
               + [("_ws", t) for t in GLUON_WS_TILES])
    for kind, (bw, br, warps, stages) in grouped:
        rs = kind != ""
        probe = torch.empty(16, 64, dtype=torch.bfloat16)
        for masked in (False, True):
            extra = _grouped_rs_constexprs((bw, br, warps, stages), kind == "_ws", masked) if rs else {}
            # the launcher's descriptor: a half step's box where the tile refills by halves
            x_desc = (_act_desc(probe, 64, br, 4 if extra["HALF_ACTS"] else 8) if rs
                      else TensorDescriptor(probe, [16, 64], [64, 1], [br, 32], _x_layout(br)))
            sig = {
                "x_desc": mangle_type(x_desc),
                **({"xh_desc": mangle_type(_act_desc(probe, 64, br // 2 if extra["HALF_TAIL"] else br))} if rs else {}),
                **descs(bw), "c_ptr": "*bf16", "route_ptr": "*i32", "N": "i32", "K": "i32", "max_m": "i32",
                "stride_cm": "i32", "row_slots": "i32", "STAGES": "constexpr", "MASKED": "constexpr",
                "N_FASTEST": "constexpr", "num_warps": "constexpr", **{k: "constexpr" for k in extra},
            }
            cfgs.append(KernelConfig(
                f"w4a16_{'masked' if masked else 'contiguous'}_sm90_gluon{kind}"
                f"[BW={bw},BR={br},w={warps},stages={stages}]",
                _w4a16_grouped_rs_kernel if rs else _w4a16_grouped_sm90_kernel, sig,
                {"STAGES": stages, "MASKED": masked, "N_FASTEST": _n_fastest(br), "num_warps": warps, **extra},
                num_warps=warps, num_stages=1, expect_sass=("HGMMA",),
                maxnreg=_rs_maxnreg((bw, br, warps, stages), extra, grouped=True) if rs else None,
                max_spill_bytes=HALF_ACT_SPILL_BYTES.get(("masked" if masked else "contiguous", (bw, br, warps, stages)),
                                                         0) if extra.get("HALF_ACTS") else 0,
                expect_ptx=(f"wgmma.wait_group.sync.aligned {0 if rs else _GROUPS.value}",), unaligned=("N", "K", "max_m", "row_slots"),
                # the shared-memory engine (a comparison point, 0.35-0.84x the Triton kernel): ptxas
                # serializes its wgmmas (C7515), so its `wait_group 8` overlap never reaches the SASS
                allowed_ptxas=() if rs else ("C7515",)))
    for ws, (bw, br, warps, stages) in ([(False, t) for t in GLUON_SPLIT_TILES]
                                        + [(True, t) for t in GLUON_SPLIT_WS_TILES]):
        hi, lo = _split_rows(br)
        probe = torch.empty(16, 64, dtype=torch.bfloat16)
        sig = {"x_desc": mangle_type(_act_desc(probe, 64, hi)),
               "x2_desc": mangle_type(_act_desc(probe, 64, 2 * hi if ws else lo)),
               **descs(bw), "c_ptr": "*bf16", "route_ptr": "*i32", "N": "i32", "K": "i32", "max_m": "i32",
               "stride_cm": "i32", "row_slots": "i32", "STAGES": "constexpr", "MASKED": "constexpr",
               "N_FASTEST": "constexpr", "HI_TAIL": "constexpr", "WARP_SPECIALIZE": "constexpr",
               "num_warps": "constexpr"}
        cfgs.append(KernelConfig(
            f"w4a16_masked_sm90_gluon_{'ws_' if ws else ''}split[BW={bw},BR={br},w={warps},stages={stages}]",
            _w4a16_grouped_split_kernel,
            sig, {"STAGES": stages, "MASKED": True, "N_FASTEST": True,
                  "HI_TAIL": (bw, br, warps, stages) in SPLIT_HI_TAIL_TILES, "WARP_SPECIALIZE": ws,
                  "num_warps": warps}, num_warps=warps,
            num_stages=1, expect_sass=("HGMMA",), expect_ptx=("wgmma.wait_group.sync.aligned 0",),
            unaligned=("N", "K", "max_m", "row_slots")))
    kinds = {"gluon": (_w4a16_indexed_sm90_kernel, f"wgmma.wait_group.sync.aligned {_GROUPS.value}"),
             "gluon_rs": (_w4a16_indexed_rs_kernel, "wgmma.wait_group.sync.aligned 0"),
             "gluon_ws": (_w4a16_indexed_rs_kernel, "wgmma.wait_group.sync.aligned 0")}
    for kind, (bw, br, warps, stages) in ([("gluon", t) for t in INDEXED_TILES] + [("gluon_rs", t) for t in INDEXED_RS_TILES]
                                          + [("gluon_ws", t) for t in INDEXED_WS_TILES]):
        isig = {
            "a_ptr": "*bf16", **descs(bw), "c_ptr": "*bf16", "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32",
            "ntpp_ptr": "*i32", "topk_w_ptr": "*fp32", "N": "i32", "K": "i32", "num_routes": "i32", "top_k": "i32",
            "stride_am": "i32", "stride_cm": "i32",
            "BR": "constexpr", "STAGES": "constexpr", "MUL_WEIGHT": "constexpr", "N_FASTEST": "constexpr",
            "num_warps": "constexpr",
        }
        ws = kind == "gluon_ws"
        # Kimi's K (a multiple of 256): the production build; a K tail's build below
        extra = _indexed_rs_constexprs((bw, br, warps, stages), ws, 7168) if kind != "gluon" else {}
        if kind != "gluon":  # no K shares (the launch's defaults)
            extra["SPLIT_K"] = 1
        kernel, ptx = kinds[kind]

        def build(name: str, consts: dict, mul: bool, sig: dict, unaligned: tuple = ()) -> KernelConfig:
            return KernelConfig(
                f"w4a16_indexed_sm90_{name}[BW={bw},BR={br},w={warps},stages={stages}" + (
                    f",MUL_WEIGHT={int(mul)}]" if name == kind else "]"),
                kernel, sig,
                {"BR": br, "STAGES": stages, "MUL_WEIGHT": mul, "N_FASTEST": _n_fastest(br), "num_warps": warps,
                 **consts},
                num_warps=warps, num_stages=1, expect_sass=("HGMMA",), expect_ptx=(ptx,),
                maxnreg=_rs_maxnreg((bw, br, warps, stages), consts, grouped=False),
                unaligned=("N", "K", "num_routes", "top_k", *unaligned))
        for mul in (False, True):
            cfgs.append(build(kind, extra, mul, {**isig, **{k: "constexpr" for k in extra}}))
        if kind == "gluon_rs" and (bw, br, warps, stages) in EVEN_K_GATHER_TILES:  # a K tail's build
            tail = {**extra, "K_TAIL": True}
            cfgs.append(build("gluon_rs_ktail", tail, True, {**isig, **{k: "constexpr" for k in tail}}))
        if kind == "gluon_rs" and (bw, br, warps, stages) in INDEXED_SPLIT_TILES:  # the K shares' build
            cfgs.append(build("gluon_rs_splitk", {**extra, "SPLIT_K": 2}, True,
                              {**isig, "c_ptr": "*fp32", **{k: "constexpr" for k in extra}, "SPLIT_K": "constexpr",
                               "stride_ws": "i32"}, ("stride_ws",)))
    # the PDL forms (`pdl`) of the MoE layer's decode and prefill tiles: the down projection's
    # (PDL 2: weights before the wait) and gate_up's (PDL 1), warp-specialized at 1
    pdl_tiles = [("gluon_rs", t, p) for t in ((64, 8, 4, 2), (64, 8, 4, 3), (128, 64, 4, 2), (256, 128, 16, 2))
                 for p in (1, 2)] + [("gluon_ws", (256, 64, 16, 3), 1)]
    for kind, (bw, br, warps, stages), pdl in pdl_tiles:
        extra = {**_indexed_rs_constexprs((bw, br, warps, stages), kind == "gluon_ws", 7168), "SPLIT_K": 1,
                 "PDL": pdl}
        cfgs.append(KernelConfig(
            f"w4a16_indexed_sm90_{kind}_pdl{pdl}[BW={bw},BR={br},w={warps},stages={stages}]",
            _w4a16_indexed_rs_kernel, {**isig, **descs(bw), **{k: "constexpr" for k in extra}},
            {"BR": br, "STAGES": stages, "MUL_WEIGHT": False, "N_FASTEST": _n_fastest(br), "num_warps": warps,
             **extra},
            num_warps=warps, num_stages=1, expect_sass=("HGMMA",),
            expect_ptx=("wgmma.wait_group.sync.aligned 0", "griddepcontrol.wait", "griddepcontrol.launch_dependents"),
            maxnreg=_rs_maxnreg((bw, br, warps, stages), extra, grouped=False),
            unaligned=("N", "K", "num_routes", "top_k")))
    for (bw, br, warps, stages), mul in itertools.product(NLOOP_TILES, (False, True)):
        for n_tiles in nloop_tile_counts(br):
            cfgs.append(KernelConfig(
                f"w4a16_indexed_sm90_nloop[BW={bw},BR={br},w={warps},stages={stages},MUL_WEIGHT={int(mul)},"
                f"N_TILES={n_tiles}]",
                _w4a16_indexed_nloop_kernel,
                {**{k: v for k, v in isig.items() if k != "N_FASTEST"}, **descs(bw), "N_TILES": "constexpr",
                 **{k: "constexpr" for k in _nloop_constexprs((bw, br, warps, stages))}},
                {"BR": br, "STAGES": stages, "MUL_WEIGHT": mul, "N_TILES": n_tiles, "num_warps": warps,
                 **_nloop_constexprs((bw, br, warps, stages))},
                num_warps=warps, num_stages=1, expect_sass=("HGMMA",), expect_ptx=("wgmma.wait_group.sync.aligned 0",),
                unaligned=("N", "K", "num_routes", "top_k")))
    # the pre-gathered rows' kernel (`PREGATHER_TILES`), plain and with PDL (the MoE layer's)
    for (bw, br, warps, stages), (mul, pdl) in itertools.product(PREGATHER_TILES, ((False, 0), (True, 0), (False, 1),
                                                                                   (False, 2))):
        extra = _indexed_rs_constexprs((bw, br, warps, stages), False, 7168)
        consts = {k: extra[k] for k in ("HALF_TAIL", "GROUP_LOOP", "HALF_ACTS")}
        probe = torch.empty(16, 64, dtype=torch.bfloat16)
        cfgs.append(KernelConfig(
            f"w4a16_indexed_sm90_gluon_tma[BW={bw},BR={br},w={warps},stages={stages},MUL_WEIGHT={int(mul)},PDL={pdl}]",
            _w4a16_indexed_tma_kernel,
            {"x_desc": mangle_type(_act_desc(probe, 64, br, 4 if consts["HALF_ACTS"] else 8)),
             "xh_desc": mangle_type(_act_desc(probe, 64, br // 2 if consts["HALF_TAIL"] else br)),
             **descs(bw), "c_ptr": "*bf16", "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "ntpp_ptr": "*i32",
             "topk_w_ptr": "*fp32", "N": "i32", "K": "i32", "num_routes": "i32", "stride_cm": "i32",
             "STAGES": "constexpr", "MUL_WEIGHT": "constexpr", "N_FASTEST": "constexpr", "num_warps": "constexpr",
             "PDL": "constexpr", **{k: "constexpr" for k in consts}},
            {"STAGES": stages, "MUL_WEIGHT": mul, "N_FASTEST": _n_fastest(br), "num_warps": warps, "PDL": pdl,
             **consts},
            num_warps=warps, num_stages=1, expect_sass=("HGMMA",),
            expect_ptx=("wgmma.wait_group.sync.aligned 0",) + (("griddepcontrol.wait",) if pdl else ()),
            maxnreg=_rs_maxnreg((bw, br, warps, stages), extra, grouped=False),
            max_spill_bytes=HALF_ACT_SPILL_BYTES.get(("indexed_tma", (bw, br, warps, stages)), 0),
            unaligned=("N", "K", "num_routes")))
    return cfgs
