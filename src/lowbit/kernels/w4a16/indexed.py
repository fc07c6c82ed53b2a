"""W4A16 indexed MoE GEMM: BF16 activations x INT4 group-32 expert weights, vLLM routing.

Semantics (reference: `lowbit.reference.w4a16_indexed_ref`)::

    for block b < num_tokens_post_padded / BLOCK_M with e = expert_ids[b] >= 0:
        for id in sorted_token_ids[b*BLOCK_M : (b+1)*BLOCK_M] with id < M * top_k:
            out[id] = bf16( a[id // top_k] @ dequant(W[e])^T  (* topk_weights[id]) )

The routing block size *is* the kernel's M tile, so the caller builds the routing with
`w4a16_indexed_config(...).block_m` (vLLM does the same with its fused-MoE configs).

Kernel: one program per (routing block, N tile). Blocks past the device-side padded count and
``-1`` (remote expert) blocks return at once; sentinel rows are masked, so no host readback and
no out-of-bounds access. The main loop is `w4a16_core.w4a16_tile` (shared with the grouped
family): INT4 dequant in inline PTX (~2 instructions an element), the dequantized weight on
the MMA's M side.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import lru_cache

import torch
import triton
import triton.language as tl

from ...formats.w4a16 import W4A16Weight
from ...routing.layouts import live_block_bound
from ...runtime import numerics
from ...runtime.overrides import parse_override
from ...runtime.pdl import pdl_enabled
from ...runtime.device import is_sm90_native, require_sm90
from .portable import (
    GLUON_ENGINES,
    REGISTER_A_ENGINES,
    VALIDATED_TILES,
    W4A16Config,
    apply_env_overrides,
    avoid_miscompile,
    compile_configs_for,
    env_key,
    env_value,
    override_names,
    pick_gluon_tile,
    tile_config,
    w4a16_tile,
)

__all__ = ["W4A16IndexedConfig", "explain_w4a16_indexed_config", "w4a16_indexed", "w4a16_indexed_config"]

W4A16IndexedConfig = W4A16Config  # block_m is also the routing block size


@triton.jit
def _w4a16_indexed_kernel(
    a_ptr, qw_ptr, s_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, topk_w_ptr,
    N, K, num_routes, top_k,
    stride_am, stride_qe, stride_qn, stride_se, stride_sk, stride_cm, stride_ws,
    BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    ntpp = tl.load(ntpp_ptr)
    e = tl.load(expert_ids_ptr + pid_m).to(tl.int64)  # beside the count: one load latency, not two
    if (pid_m * BM >= ntpp) | (e < 0):  # past the device-side padded count, or another rank's expert (EP)
        return
    rm = pid_m * BM + tl.arange(0, BM)
    ids = tl.load(sorted_ids_ptr + rm)
    valid = ids < num_routes
    a_row = tl.where(valid, ids // top_k, 0).to(tl.int64)
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    k_tiles = tl.cdiv(K, 256)
    if SPLIT_K == 1:
        acc = w4a16_tile(a_ptr, a_row, valid, stride_am, qw_ptr, s_ptr, e, rn, n_ok,
                         stride_qe, stride_qn, stride_se, stride_sk, K, 0, k_tiles, BM, BN, SWAP_AB)
    else:
        # this program's share of the K tiles (possibly empty: it then stores zeros)
        per = tl.cdiv(k_tiles, SPLIT_K)
        kt_lo = tl.program_id(2) * per
        kt_hi = tl.minimum(kt_lo + per, k_tiles)
        acc = w4a16_tile(a_ptr, a_row, valid, stride_am, qw_ptr, s_ptr, e, rn, n_ok,
                         stride_qe, stride_qn, stride_se, stride_sk, K, kt_lo, kt_hi, BM, BN, SWAP_AB)
    if MUL_WEIGHT:
        acc = acc * tl.load(topk_w_ptr + ids, mask=valid, other=0.0)[:, None]
    mask = valid[:, None] & n_ok[None, :]
    c = c_ptr + ids[:, None].to(tl.int64) * stride_cm + rn[None, :]
    if SPLIT_K == 1:
        tl.store(c, numerics.to_bf16(acc), mask=mask)
    else:  # c_ptr is the FP32 workspace [SPLIT_K, M * top_k, N]
        tl.store(c + tl.program_id(2).to(tl.int64) * stride_ws, acc, mask=mask)


@triton.jit
def _w4a16_indexed_splitk_reduce_kernel(
    ws_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, N, num_routes, stride_ws, stride_wm, stride_cm,
    BM: tl.constexpr, BN: tl.constexpr, SPLIT_K: tl.constexpr,
):
    """``out[id] = bf16(sum_s ws[s, id])`` over exactly the rows the main kernel wrote (same
    block walk, same early exits), so unrouted rows of `out` stay untouched."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BM >= tl.load(ntpp_ptr):
        return
    if tl.load(expert_ids_ptr + pid_m) < 0:
        return
    ids = tl.load(sorted_ids_ptr + pid_m * BM + tl.arange(0, BM))
    valid = ids < num_routes
    rn = pid_n * BN + tl.arange(0, BN)
    mask = valid[:, None] & (rn < N)[None, :]
    rows = ids[:, None].to(tl.int64)
    acc = tl.zeros([BM, BN], tl.float32)
    for s in tl.static_range(SPLIT_K):  # fixed order: deterministic sums
        acc += tl.load(ws_ptr + s * stride_ws + rows * stride_wm + rn[None, :], mask=mask, other=0.0)
    tl.store(c_ptr + rows * stride_cm + rn[None, :], numerics.to_bf16(acc), mask=mask)


# --------------------------------------------------------------------------- heuristics
#: The M tile by tokens per expert (tok_e = routed rows / experts): the first row that fits.
#: Tiles and their measurements: `w4a16_core.VALIDATED_TILES`.
_M_TILES = (
    # (max tok_e, block_m, why)
    (16, 16, "decode: a few rows per expert; 256-row weight tiles, fastest at 3-16 tok_e"),
    (32, 32, "small batches: 32-row tiles, fastest at TP8 tok_e 21"),
    (float("inf"), 64, "prefill: 64-row tiles, fastest at EP8 tok_e 43; 128-row tiles measured slower"),
)

#: K shares by tokens per expert (first row that fits): a thin decode grid (one token: 8 experts
#: hit x N/256 tiles, about one program per SM) leaves most SMs' bandwidth unused, two K shares
#: double the programs. H200, 2026-11-29, Kimi EP8 gate_up + down, CUDA-graph replay:
#: 1 token (tok_e 0.17) 174.4 us -> 154.0 us with 2 shares (4 shares: 161.0); 4 tokens
#: (tok_e 0.67) 321.7 -> 386.3 us (slower: the grid is already full, the FP32 workspace costs).
_SPLIT_K = (
    # (max tok_e, split_k, why)
    (0.25, 2, "thin decode grid: 2 K shares (H200 EP8 1 token: 174.4 -> 154.0 us)"),
    (float("inf"), 1, ""),
)

#: The register-A Gluon kernel splits K only when asked (``LOWBIT_W4A16_SPLIT_K``): more programs
#: did not pay on a thin decode grid. H200, twentieth session (`scripts/probes/split_decode.py`,
#: Kimi EP8, 8-row blocks, same process, interleaved, us, reduction included; gate_up / down):
#: 1 token, 3-stage tile 49.8 / 31.9, split 2 / 3 / 4 54.4 / 37.5, 56.2 / 40.0, 57.7 / 43.3;
#: the group-loop tile split 2 51.7 / 34.1 (its unsplit down 30.4); 2-8 tokens 1.04-1.26x
#: slower split than unsplit. The 512 one-token gate_up programs are not too few to stream:
#: doubling them (eight CTAs an SM) left the main kernel at ~49 us.
_RS_SPLIT_K = 1
#: Output columns a program of the share reduction sums (8-row routing blocks: 8 KB of FP32 a
#: share a program).
_RS_REDUCE_BN = 256

#: ``LOWBIT_W4A16_PREGATHER``: 1 pre-gathers the routed rows wherever the chosen tile can
#: (`w4a16_sm90.pregather_ok`), 0 never; unset: `_PREGATHER_MIN_N` decides.
PREGATHER_ENV = "LOWBIT_W4A16_PREGATHER"
#: Environment overrides (each is part of the memo key).
ENV_OVERRIDES = override_names("W4A16") + [PREGATHER_ENV]

#: The register-A prefill tiles (`w4a16_sm90.PREGATHER_TILES`) gather the routed rows into the
#: routing's slot order first (`moe_routing.gather_indexed_rows`, one more write of every routed
#: row) and load a block's rows as one TMA box a step, from this N (the weight rows a gathered
#: byte meets): inside the kernel the gather's cp.async copies (16 warps x 8 a step on the 256x128)
#: queue in front of the words' shared-memory loads (ncu, thirtieth session: LDGSTS 11% of the
#: warp samples, MIO throttle), and the indexed 256x128 ran 0.86-0.87x the contiguous kernel on
#: the same rows in order (`scripts/probes/indexed_vs_contiguous.py`). H200, thirtieth session
#: (`scripts/probes/pregather.py`, one process, interleaved, bit-identical, us, in-kernel gather ->
#: pre-gathered, gather included): Kimi EP8 gate_up (N 4096) at 512 / 768 / 1024 (the bench's) /
#: 1152 / 1536 / 2048 tokens, 128x64: 600.4 -> 572.0, 799.4 -> 756.5, 1004.9 -> 945.8, 1128.8 ->
#: 1062.5, 1502.0 -> 1378.3, 2004.7 -> 1800.4; 256x128: 545.8 -> 528.8, 791.2 -> 737.2, 1027.9 ->
#: 956.1, 1083.8 -> 1019.1, 1449.3 -> 1332.0, 1821.3 -> 1691.4 (1.03-1.11x); down (N 7168)
#: 1.01-1.09x; the gather 21.8-75.2 us (gate_up), 13.0-36.2 (down). TP8 gate_up (N 512) at 6144 /
#: 8192 / 12288 tokens 0.83-0.88x: its gather (215-451 us, every routed row of 7168) outweighs
#: the GEMM's gain.
_PREGATHER_MIN_N = (2048, "rows pre-gathered into the routing's slot order, loaded by TMA (H200 Kimi EP8 "
                          "gate_up / down 1.01-1.11x; TP8 gate_up, N 512: 0.83-0.88x)")


#: On a Hopper GPU (N a multiple of 8, rows 16-byte aligned) the register-A Gluon kernel
#: (`w4a16_sm90`, engine "gluon_rs") by tok_e: (max tok_e, its routing block, why). The first row
#: that fits picks the routing block when the caller has not built the routing yet; EP and TP
#: profiles share it (a one-step K, TP down, runs the block's N-loop tile: `_fit_engine`).
#: H200, 2026-11-29 (fourth session), Kimi gate_up + down, CUDA graph, L2 flushed, us
#: (`scripts/sweeps/w4a16_indexed_rs_blocks.json`):
#:   EP8 1 / 4 / 20 tokens (tok_e 0.17 / 0.67 / 3.3), 64x16: 103.7 / 258.2 / 478.7 (3 stages)
#:       (the kernel before rows were gathered by cp.async: 130.6 / 290.4 / 542.9; Triton 154.3 /
#:       322.3 / 559.3 in the third session)
#:   EP8 50 tokens (tok_e 8.3): gluon_rs 16-row 503.8; Triton 16-row 579.8; gluon_rs 32-row 587.3
#:   EP8 256 tokens (tok_e 43): Triton 64-row 1195.9; gluon_rs 64-row 866.0 (128x64), 982.7
#:       (64x64); 128-row 1203.6
#:   EP8 1024 tokens (tok_e 171): Triton 3520.7; gluon_rs 128-row 2484.5 (128x128), 64-row 2576.1
#:   TP8 8192 tokens (tok_e 171): Triton 4963.3; gluon_rs 128-row 3686.0, 64-row 4064.5
#: Sixteenth session (`scripts/probes/mid_tiles.py`, same process, interleaved, gate_up / down):
#:   EP8 60 tokens (tok_e 10): 64x16 263.0 / 154.1, 64x32 327.0 / 189.8; EP8 100 / 150 / 190
#:   tokens (tok_e 17-32): 64x32 329.3 / 191.7, 358.4 / 218.5, 462.9 / 268.9 against Triton 32-row
#:   439.1 / 236.9, 481.1 / 262.5, 612.1 / 320.4 and 64x16 378.9 / 221.5, 502.3 / 288.4, 592.5 /
#:   331.6; TP8 1024 tokens gate_up 64x32 343.0 vs 128x32 396.0, the Triton tiles no longer win.
#: Twenty-first session (`scripts/probes/decode_blocks.py wide64`, both blocks on their 128-row
#:   group-loop tiles): EP8 32 / 50 / 64 tokens (tok_e 5.3 / 8.3 / 10.7), 16-row 221.7 / 117.9,
#:   228.5 / 119.9, 230.9 / 122.0 against 32-row 249.2 / 135.2, 250.6 / 136.8, 252.6 / 137.1.
#:   (`decode_blocks.py edges`, the blocks' defaults) 32-row 128x32 against 64-row 128x64 (half
#:   tail) at 160 / 192 / 224 tokens (tok_e 26.7 / 32 / 37.3): 298.6 / 161.6 vs 306.9 / 176.4,
#:   371.6 / 200.3 vs 343.1 / 191.2, 461.5 / 245.6 vs 379.5 / 208.4; 64-row against the 128-row
#:   block's 256x128 (half tail) at 320 / 384 / 448 / 512 tokens (tok_e 53-85): 406.6 / 230.4 vs
#:   469.0 / 270.6, 544.5 / 300.3 vs 540.2 / 300.5, 655.6 / 362.0 vs 585.9 / 337.1, 693.3 /
#:   380.4 vs 600.4 / 351.0.
#: Twenty-sixth session: the 64-row block's 128x64 refills its activations by halves, three CTAs an
#:   SM (`w4a16_sm90.HALF_ACT_TILES`: 1.08-1.14x), so both edges moved (`decode_blocks.py edges`,
#:   interleaved, us, gate_up / down): 32-row against 64-row at 112 / 128 / 144 / 160 / 192 tokens
#:   (tok_e 18.7-32) 247.7 / 135.9 vs 254.3 / 139.8, 254.2 / 138.3 vs 260.4 / 141.7, 275.5 / 146.3
#:   vs 266.9 / 144.6, 281.9 / 153.4 vs 274.3 / 149.7, 362.4 / 196.2 vs 305.0 / 162.9; 64-row
#:   against 128-row at 448 / 512 / 576 / 640 tokens (tok_e 75-107) 560.7 / 299.0 vs 583.6 /
#:   329.7, 602.8 / 320.0 vs 592.8 / 348.1, 630.3 / 336.6 vs 604.4 / 356.2, 674.1 / 358.5 vs
#:   615.7 / 363.3 (the layer sums: level at 96). Measured on EP8 only; TP8 shares the edges.
_GLUON_BLOCKS = (
    (12, 16, "sm_90 decode: register-A Gluon kernel, 16-row routing block (H200 EP8 1-64 tokens: "
             "1.15-1.49x the Triton kernel; 1.09-1.12x the 32-row block at tok_e 10.7)"),
    (22, 32, "sm_90 between decode and prefill: register-A Gluon kernel, 32-row routing block (H200 EP8 "
             "tok_e 17-32: 1.19-1.34x the Triton 32-row tiles; 1.02-1.03x the 64-row block at tok_e 21.3, "
             "0.97-0.99x at 24)"),
    (90, 64, "sm_90 prefill: register-A Gluon kernel, 64-row routing block (H200 EP8 tok_e 43: 866 us vs "
             "Triton 1196 with 128 weight rows; with its activations refilled by halves 1.06x the 128-row "
             "block at tok_e 75, 1.02x at 85, level at 96)"),
    (float("inf"), 128, "sm_90 large prefill: register-A Gluon kernel, 128-row routing block (H200 tok_e 171: EP8 "
                        "2485 us, TP8 3686 vs Triton 3521 / 4963 with 128 weight rows, 64-row block 2576 / 4065; "
                        "256 weight rows 1.10-1.14x that)"),
)


#: Past the 64-row block's range, the 128-row block's middle: (min tok_e exclusive, max tok_e,
#: why) where a projection with K past one step takes the 64-row block again. Since the
#: twenty-sixth session's refill by halves (three CTAs an SM) the one-warpgroup 128x64 is about
#: as efficient a padded row as the four-warpgroup 256x128, and the 64-row block pads less: an
#: expert of 150 routes runs 64 + 64 + 32 rows (half tail) instead of 128 + 64. H200,
#: twenty-eighth session (`scripts/probes/prefill_blocks.py`, interleaved, bit-identical, us,
#: 128-row -> 64-row): Kimi EP8 gate_up / down at 640 tokens (tok_e 107) 617.4 -> 684.1 / 362.8
#: -> 363.5 (0.90x / 1.00x: the 128-row block stays), 768 (128) 830.8 -> 803.6 / 457.5 -> 430.4,
#: 896 (149) 1056.2 -> 948.7 / 559.7 -> 503.3, the bench's 1024 (171) 1112.0 -> 1026.5 / 574.1 ->
#: 540.4, 1280 (213) 1284.9 -> 1288.8 / 672.1 -> 678.0, 1536 (256) 1582.0 -> 1504.4 / 804.6 ->
#: 794.5, 2048 (341) 2043.1 -> 2050.2 / 1033.6 -> 1031.9; TP8 gate_up 6144 / 8192 (the bench's) /
#: 10240 / 12288 tokens 874.4 -> 850.2, 1142.0 -> 1067.3, 1354.7 -> 1349.2, 1611.7 -> 1578.3.
#: Not measured past tok_e 341, nor for a one-step K (TP down keeps the 128-row N loop).
#: Twenty-ninth session: the four-warpgroup loop dequantizes a step's group 0 under the previous
#: step's last products (`w4a16_sm90._rs_groups_mainloop`), so the 256x128 gained and the range
#: ends at 200 (same probe, call 7, us, 128-row -> 64-row): EP8 gate_up / down at 768 (128) 814.8
#: -> 797.5 / 470.2 -> 437.5, 896 (149) 1055.5 -> 953.8 / 548.1 -> 494.3, 1024 (171, the bench's)
#: 1054.4 -> 1018.1 / 568.3 -> 539.7, 1152 (192) 1179.2 -> 1164.7 / 597.9 -> 601.8 (level), 1280
#: (213) 1217.7 -> 1272.0 / 648.3 -> 673.5, 1536 (256) 1509.1 -> 1530.3 / 767.2 -> 780.3, 2048
#: (341) 2074.2 -> 2181.6 / 1007.1 -> 1039.0 (the 128-row block 1.01-1.05x from 213); TP8 gate_up
#: 6144 / 8192 / 9216 / 10240 / 12288 tokens 860.7 -> 839.1, 1100.6 -> 1055.0, 1187.0 -> 1184.1,
#: 1288.7 -> 1351.2, 1551.6 -> 1575.5.
_PREFILL_64_RANGE = (115, 200, "sm_90 prefill, K past one step: register-A Gluon kernel, 64-row routing "
                               "block (H200 Kimi EP8 tok_e 128-171: 1.04-1.11x the 128-row block, level at "
                               "192; TP8 gate_up tok_e 128-171: 1.03-1.04x)")


#: A one-step K (TP8 down: the N-loop kernel) takes the 128-row block from this tok_e (exclusive)
#: where the table says 64: gathered once for up to 56 weight tiles, the 128-row block's
#: programs amortize more, and its half tail pads as little. H200, twenty-eighth session
#: (`scripts/probes/prefill_blocks.py tp8down`, interleaved, bit-identical, us, 128-row -> 64-row):
#: Kimi TP8 down at 1536 / 2048 tokens (tok_e 32 / 43) 240.7 -> 238.2, 245.7 -> 244.3 (level),
#: 2560 / 3072 / 3584 / 4096 (tok_e 53-85) 279.7 -> 323.7, 355.6 -> 400.6, 410.6 -> 482.5, 418.5 ->
#: 490.7 (the 128-row block 1.13-1.18x), 6144 / 8192 / 12288 562.7 -> 644.4, 712.5 -> 744.1, 992.6 ->
#: 1122.8.
_NLOOP_128_FROM = (48, "sm_90 prefill, one K step: register-A Gluon N loop, 128-row routing block (H200 Kimi TP8 "
                       "down tok_e 53-85: 1.13-1.18x the 64-row block, level at 32-43)")
#: ... and keeps the 32-row block up to this tok_e (the table's 32-row edge is 22): the 64- and
#: 128-row N loops sit at ~235-245 us from tok_e 21 to 43 where the 32-row one grows from 157.
#: H200, twenty-eighth session (`prefill_blocks.py tp8down`, ``LOWBIT_W4A16_ENGINE=gluon_rs``, us,
#: 32 / 64 / 128-row blocks): Kimi TP8 down at 1024 tokens (tok_e 21.3) 157.3 / 234.3 / 238.3,
#: 1280 (26.7) 180.7 / 235.9 / 238.4, 1536 (32) 244.6 / 238.4 / 241.1, 2048 (42.7) 280.1 / 243.1 /
#: 244.4, 2560 (53.3) 330.0 / 322.5 / 276.5.
_NLOOP_32_UNTIL = (30, "sm_90 between decode and prefill, one K step: register-A Gluon N loop, 32-row routing "
                       "block (H200 Kimi TP8 down tok_e 26.7: 1.31x the 64-row block, level at 32)")


#: EP decode on sm_90: up to this tok_e, 8-row routing blocks (one to a few routes an expert hit)
#: on the register-A kernel's group-loop tile, eight CTAs an SM (`w4a16_sm90.GROUP_LOOP_MAXNREG`
#: has the measurements: H200 Kimi EP8 4 / 8 / 16 tokens 1.08-1.13x the 16-row block, 32
#: tokens 0.98x). TP keeps the 16-row block: its one-step down runs the 16-row N-loop tile.
_EP_DECODE_BLOCK = (4, 8, "sm_90 EP decode: register-A Gluon kernel, 8-row routing block, one K group at a "
                          "time at 64 registers, 8 CTAs an SM (H200 EP8 4-16 tokens: 1.08-1.13x the 16-row block)")


#: Eighth session: with a K of more than one step (and two waves of programs, `wide_tile_pays`)
#: the prefill blocks run the four-warpgroup register-A tiles instead (`INDEXED_RS_TILES` has
#: the numbers); a one-step K (TP down) keeps the warp-specialized N loop.
#: Prefill routing blocks (64 and 128 rows: the two-warpgroup tiles) ran the register-A kernel
#: warp-specialized (engine "gluon_ws": a 4-warp producer partition gathers the rows by
#: cp.async and TMAs the weights). H200, sixth session, CUDA graph, us, gluon_rs -> gluon_ws
#: (`scripts/sweeps/w4a16_indexed_ws.json`): EP8 256 tokens 820.0 -> 761.4, 1024 tokens
#: 2274.4 -> 2112.3, TP8 8192 tokens 3523.2 -> 3422.8. With a one-warp producer the gather
#: kept up only at 256 tokens (780.2; 1024 tokens 2314.3). The 16-row decode block has no
#: two-warpgroup tile worth running (128x16 with a producer: 0.70-0.73x the 64x16 tile).
_WS_BLOCKS = (64, 128)
#: The 64-row block (K past one step) runs the one-warpgroup 128x64 group loop with its half tail
#: instead of the warp-specialized four-warpgroup 256x64 with its tails. H200, twenty-first
#: session (`scripts/probes/decode_blocks.py wide64`, interleaved, bit-identical, us, gate_up /
#: down, Kimi EP8): 256 tokens (tok_e 43) 388.4 / 230.3 -> 375.7 / 219.3, 320 tokens 430.8 /
#: 233.9 -> 426.9 / 227.3, 384 tokens 557.2 / 316.9 -> 554.1 / 302.2, 512 tokens (tok_e 85)
#: 701.0 / 396.4 -> 686.5 / 378.4 (1.01-1.05x); without the tail 0.93-1.07x.
_GROUP_LOOP_BLOCKS = (64,)


def _rs_block(tok_e: float, k: int, profile: str, pregathered: bool = False) -> tuple[int, str]:
    """The register-A kernel's routing block and its reason at this tok_e: `_GLUON_BLOCKS`, the EP
    decode block (`_EP_DECODE_BLOCK`), the 64-row block's second range for K past one step
    (`_PREFILL_64_RANGE`; not on `pregathered` rows, where the 128-row block's one-warpgroup tile
    wins there: `w4a16_sm90.PREGATHER_BLOCK_TILES`), and a one-step K's N-loop edges
    (`_NLOOP_128_FROM`, `_NLOOP_32_UNTIL`)."""
    _, block, why = next(r for r in _GLUON_BLOCKS if tok_e <= r[0])
    if profile == "EP" and tok_e <= _EP_DECODE_BLOCK[0]:
        _, block, why = _EP_DECODE_BLOCK
    if k > 256 and not pregathered and _PREFILL_64_RANGE[0] < tok_e <= _PREFILL_64_RANGE[1]:
        block, why = 64, _PREFILL_64_RANGE[2]
    if k <= 256 and block == 64 and tok_e > _NLOOP_128_FROM[0]:
        block, why = 128, _NLOOP_128_FROM[1]
    if k <= 256 and block == 64 and tok_e <= _NLOOP_32_UNTIL[0]:
        block, why = 32, _NLOOP_32_UNTIL[1]
    return block, why


def _gluon_runs(block_m: int, tok_e: float, k: int, profile: str) -> bool:
    """Whether the register-A kernel is the default for a routing block at this tok_e: the
    block `_GLUON_BLOCKS` or `_rs_block` picks; in the table's prefill range either prefill block
    (both measured faster than Triton there); a block only it runs."""
    _, table_block, _ = next(r for r in _GLUON_BLOCKS if tok_e <= r[0])
    prefill = (64, 128)
    return (block_m in (table_block, _rs_block(tok_e, k, profile)[0])
            or (table_block in prefill and block_m in prefill) or block_m not in VALIDATED_TILES)


@lru_cache(maxsize=4096)
def _config_cached(num_routes: int, num_experts: int, n: int, k: int, block_m: int | None, gluon: bool,
                   env: tuple) -> W4A16Config:
    tok_e = num_routes / max(num_experts, 1)
    profile = "TP" if num_experts > 64 and n * k < 4096 * 7168 // 2 else "EP"
    from .hopper import INDEXED_RS_TILES

    rs_blocks = sorted({t[1] for t in INDEXED_RS_TILES})
    # an engine override other than gluon_rs: the routing block as for that engine
    gluon = gluon and env_value(env, "engine") in ("", *REGISTER_A_ENGINES)
    if block_m is None:
        _, block_m, why = next(r for r in _M_TILES if tok_e <= r[0])
        rs_block, rs_why = _rs_block(tok_e, k, profile, _pregather_wanted(n, k, env[-1]))
        if gluon:
            block_m, why = rs_block, rs_why
    else:
        why = "block_m fixed by the routing"
        rs_only = block_m in rs_blocks and (gluon or env_value(env, "engine") in REGISTER_A_ENGINES)
        if block_m not in VALIDATED_TILES and not rs_only:  # only GPU-validated tiles are ever launched
            raise ValueError(
                f"no W4A16 indexed configuration with block_m={block_m}; build the routing with "
                f"one of {sorted(VALIDATED_TILES)} (on sm_90 also {rs_blocks}) (w4a16_indexed_config(...).block_m)"
            )
    _, split, split_why = next(r for r in _SPLIT_K if tok_e <= r[0])
    rs = gluon and _gluon_runs(block_m, tok_e, k, profile)
    if rs:  # the register-A kernel splits K only when asked (`_RS_SPLIT_K`)
        split, split_why = _RS_SPLIT_K, ""
    why = f"tok_e={tok_e:.2f} ({profile}): {why}" + (f"; {split_why}" if split_why else "")
    if block_m in VALIDATED_TILES:
        cfg = replace(tile_config(block_m, why), split_k=split)
    else:  # a routing block only the register-A Gluon kernel runs
        cfg = W4A16Config(block_m, 128, 8, 2, True, engine="gluon_rs", reason=why)
    programs = float("inf")
    if rs:  # prefill blocks: the four-warpgroup tile (the 256 weight rows' grid permitting), or for a
        # one-step K the N loop (warp-specialized 128-row tiles)
        from .hopper import wide_tile_pays

        blocks = num_routes / block_m + min(num_experts, num_routes)  # routed blocks + padding blocks, about
        # a 64-row block with K past one step: the one-warpgroup 128x64 (`INDEXED_RS_TILES`' first 64-row
        # tile, `_GROUP_LOOP_BLOCKS`)
        group_loop_64 = block_m in _GROUP_LOOP_BLOCKS and k > 256
        wide = k > 256 and wide_tile_pays(blocks, n) and not group_loop_64
        programs = blocks * triton.cdiv(n, 64)  # (a group-loop tile's 64-row grid)
        from .hopper import INDEXED_WS_TILES

        # a four-warpgroup tile runs warp-specialized where that engine has it (`INDEXED_WS_TILES`)
        ws = (block_m in _WS_BLOCKS and not group_loop_64
              and (not wide or (256, block_m) in {t[:2] for t in INDEXED_WS_TILES}))
        cfg = replace(cfg, engine="gluon_ws" if ws else "gluon_rs")
        if group_loop_64:
            cfg = replace(cfg, reason=f"{cfg.reason}; 128 weight rows on one warpgroup (H200 EP8 tok_e 43-85: "
                          "1.01-1.05x the warp-specialized 256x64)")
    else:
        wide = False
    pregather = _pregather_wanted(n, k, env[-1])
    cfg = avoid_miscompile(_fit_engine(apply_env_overrides(cfg, "W4A16"), env, k, wide, programs, profile,
                                       (num_routes, num_experts, n), pregather), n)
    return _with_pregather(cfg, k, env[-1], pregather)


def _pregather_wanted(n: int, k: int, forced: str) -> bool:
    """Whether a projection's rows are to be pre-gathered, tile permitting: ``LOWBIT_W4A16_PREGATHER``
    (`forced`, "" when unset), else `_PREGATHER_MIN_N`; never for a one-step K (the N loop)."""
    if forced:
        return parse_override(PREGATHER_ENV, forced, False) and k > 256
    return n >= _PREGATHER_MIN_N[0] and k > 256


def _with_pregather(cfg: W4A16Config, k: int, forced: str, want: bool) -> W4A16Config:
    """`cfg` with `pregather` set where `want` (`_pregather_wanted`) and its tile has the form
    (`w4a16_sm90.pregather_ok`; `_fit_engine` picked that tile), the reason saying why or why not."""
    from .hopper import pregather_ok

    tile = (cfg.block_n, cfg.block_m, cfg.num_warps, cfg.num_stages)
    can = cfg.engine == "gluon_rs" and pregather_ok(tile, k, split_k=cfg.split_k)
    if forced:
        why = f"{PREGATHER_ENV}={forced}" + ("" if can or not want else ": this tile cannot (no pre-gathered form)")
    else:
        why = _PREGATHER_MIN_N[1] if want and can else ""
    if not why:
        return cfg
    return replace(cfg, pregather=want and can, reason=f"{cfg.reason}; {why}")


def _engine_tiles(engine: str) -> tuple:
    """The (weight rows, routing block, warps, stages) tiles a Gluon engine's kernel is built for."""
    from .hopper import INDEXED_RS_TILES, INDEXED_TILES, INDEXED_WS_TILES

    return {"gluon": INDEXED_TILES, "gluon_rs": INDEXED_RS_TILES, "gluon_ws": INDEXED_WS_TILES}[engine]


def _fit_engine(cfg: W4A16Config, env: tuple, k: int, wide: bool = False,
                programs: float = float("inf"), profile: str = "", grid: tuple | None = None,
                pregather: bool = False) -> W4A16Config:
    """``LOWBIT_W4A16_ENGINE=gluon`` / ``gluon_rs`` as a global switch: that kernel's tile with
    the same routing block size (a split-K kept only where the register-A kernel splits:
    `_rs_splits`); ``LOWBIT_W4A16_BLOCK_N`` (weight rows) and ``_NUM_STAGES`` pick among its
    tiles when set. A routing block the register-A kernel has no
    tile for (64) runs the shared-memory Gluon kernel. `wide`: the heuristics chose the
    routing block's four-warpgroup tile (256 weight rows), which then comes first. `programs`:
    the grid's size, about; too few for a group-loop tile's eight CTAs an SM run its deeper-ring
    alternative (`w4a16_sm90.group_loop_tile`) unless a stage count is forced; with the
    `profile` ("EP" / "TP") its 128-row form was measured for, one whose grid and K allow runs
    that form (`WIDE_DECODE_TILES`) unless a stage count or weight rows are forced. `grid`:
    (routes, experts, N), for the N-loop kernel's tiles a program (`nloop_n_tiles`, on an H200's
    SMs; the launcher counts the GPU's). `pregather` (`_pregather_wanted`): the tile for rows
    pre-gathered, the routing block's own (`w4a16_sm90.PREGATHER_BLOCK_TILES`, on the register-A
    engine) unless the engine or the tile is forced, else on ``gluon_rs`` the pre-gathered form of
    the tile picked (same weight rows and stages; `PREGATHER_TILES`). The reason says what was
    chosen."""
    if cfg.engine == "triton":
        return cfg
    if cfg.engine not in GLUON_ENGINES:
        raise ValueError(f"LOWBIT_W4A16_ENGINE must be 'triton' or one of {GLUON_ENGINES}, got {cfg.engine!r}")
    engine = cfg.engine
    if engine == "gluon_ws" and not any(t[1] == cfg.block_m for t in _engine_tiles("gluon_ws")):
        engine = "gluon_rs"
    if engine == "gluon_rs" and not any(t[1] == cfg.block_m for t in _engine_tiles("gluon_rs")):
        engine = "gluon"
    from .hopper import group_loop_tile, half_acts_note, nloop_n_tiles, nloop_tail_rows, runs_nloop, tail_rows

    tiles = _engine_tiles(engine)
    if engine in REGISTER_A_ENGINES and k <= 256:
        # one K step: the routing block's N-loop tile first (H200, sixteenth session, TP8 down: 128x16
        # 1.50-1.65x the 64x16 tile at 4-50 tokens; 128x32 2.69x it at 1024)
        tiles = tuple(t for t in tiles if runs_nloop(t, k)) + tiles
    tile, note = pick_gluon_tile(tiles, cfg.block_m, cfg, env, wide), ""
    if engine == "gluon_rs" and not env_value(env, "num_stages"):
        tile, note = group_loop_tile(tile, programs, k, family="" if env_value(env, "block_n") else profile)
    if pregather and k > 256 and engine in REGISTER_A_ENGINES:
        from .hopper import PREGATHER_BLOCK_TILES, PREGATHER_TILES

        forced = env_value(env, "engine") or env_value(env, "block_n") or env_value(env, "num_stages")
        if not forced and cfg.block_m in PREGATHER_BLOCK_TILES:
            engine, tile, note = "gluon_rs", PREGATHER_BLOCK_TILES[cfg.block_m], ""
        elif engine == "gluon_rs":
            tile = next((t for t in PREGATHER_TILES if (t[0], t[1], t[3]) == (tile[0], cfg.block_m, tile[3])), tile)
    bw, _, warps, stages = tile
    tile = (bw, cfg.block_m, warps, stages)  # (the routing's block even where no tile has it: refused at launch)
    if engine in REGISTER_A_ENGINES and runs_nloop(tile, k):
        chunk = nloop_n_tiles(cfg.block_m, *grid, bw) if grid else "8-56"
        variant = (f"; K <= 256 (one step): the N-loop kernel, {chunk} weight tiles a program by the grid "
                   "(H200 TP8 down 32-8192 tokens: 1.05-1.18x a fixed 8)")
        if tail := nloop_tail_rows(tile):
            variant += (f"; a block with no route past slot {tail} runs the {tail}-row tile (H200 TP8 8192 tokens "
                        "down: 1.14x)")
    elif tail := tail_rows(tile, engine, "indexed"):
        measured = ("384 tokens: 1.03-1.06x" if engine == "gluon_ws"
                    else "384 / 512 tokens: 1.04-1.10x" if cfg.block_m == 64
                    else "1024 tokens: 1.09x" if bw == 256 else "1024 tokens, on the 256x128: 1.09x")
        variant = f"; a block with no route past slot {tail} runs the {tail}-row tile (H200 EP8 {measured})"
        variant += half_acts_note(tile, engine, "indexed")
    else:
        variant = note + half_acts_note(tile, engine, "indexed")
    split = cfg.split_k if _rs_splits(engine, tile, k, cfg.split_k) else 1
    if split > 1:
        variant += f"; K in {split} shares (FP32, summed by a second kernel)"
    one_wg = " on one warpgroup" if warps == 4 and cfg.block_m == 128 else ""
    return replace(cfg, engine=engine, block_n=bw, num_warps=warps, num_stages=stages, swap_ab=True, split_k=split,
                   reason=f"{cfg.reason}; {engine} tile {bw} weight rows x {cfg.block_m} routes{one_wg}, {stages} "
                          f"stages{variant}")


def w4a16_indexed_config(num_routes: int, num_experts: int, n: int, k: int, block_m: int | None = None,
                         gluon: bool = False) -> W4A16Config:
    """The launch configuration for ``num_routes = M * top_k`` routed rows over `num_experts`
    experts of ``[n, k]`` weights. Memoized per shape descriptor and environment overrides
    (``LOWBIT_W4A16_BLOCK_M``, ``_BLOCK_N``, ``_NUM_WARPS``, ``_NUM_STAGES``, ``_SWAP_AB``,
    ``_SPLIT_K``, ``_ENGINE``, ``_PREGATHER``). `block_m` pins the M tile (the routing was already built with
    that block size; `gluon` never changes it). gluon: the Hopper Gluon kernels can run (an
    sm_90 GPU, N a multiple of 8); where they measured faster they are then the default."""
    return _config_cached(num_routes, num_experts, n, k, block_m, gluon,
                          env_key("W4A16") + (os.environ.get(PREGATHER_ENV, ""),))


def gluon_capable(a: torch.Tensor, w: W4A16Weight) -> bool:
    """Whether the Gluon kernels can run these operands: an sm_90 GPU, N a multiple of 8 (the
    scales' TMA rows), activation rows 16-byte aligned (the register-A kernel gathers them
    with 16-byte cp.async)."""
    return is_sm90_native(a.device) and w.n % 8 == 0 and _rows_aligned(a)


def _rows_aligned(a: torch.Tensor) -> bool:
    return a.data_ptr() % 16 == 0 and a.stride(0) % 8 == 0


def explain_w4a16_indexed_config(num_routes: int, num_experts: int, n: int, k: int, gluon: bool = False) -> str:
    c = w4a16_indexed_config(num_routes, num_experts, n, k, gluon=gluon)
    return (f"w4a16_indexed M*top_k={num_routes} E={num_experts} N={n} K={k}: block_m={c.block_m} "
            f"block_n={c.block_n} warps={c.num_warps} stages={c.num_stages} swap_ab={c.swap_ab} split_k={c.split_k} engine={c.engine} "
            f"pregather={c.pregather} "
            f"-- {c.reason}")


# --------------------------------------------------------------------------- launcher
def w4a16_indexed(
    a: torch.Tensor,
    w: W4A16Weight,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    top_k: int,
    *,
    topk_weights: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: W4A16Config | None = None,
    routing_ready: bool = False,
    slot_order_routes: int | None = None,
) -> torch.Tensor:
    """W4A16 MoE GEMM on the indexed (vLLM ``moe_align_block_size``) layout.

    a: ``bf16 [M, K]`` (row ``id // top_k`` feeds route ``id``); w: `W4A16Weight` packed with
    ``profile="indexed"`` (``[E, N, K]``); sorted_ids ``int32 [P]``, expert_ids ``int32 [P / B]``,
    num_tokens_post_padded ``int32 [1]`` from `lowbit.routing.moe_align_block_size` with block
    size ``B = config.block_m``; topk_weights optional ``fp32 [M, top_k]`` multiplied in the
    epilogue; out optional ``bf16 [M * top_k, N]`` (rows of unrouted/remote routes are left as
    they were). Returns ``out``.

    Every block before ``num_tokens_post_padded`` must hold a route (`IndexedRouting`: an
    expert with no route has no block): the grid has ``min(P / B, M * top_k)`` row blocks
    (`lowbit.routing.live_block_bound`), not one a block of the over-allocated buffer.

    On sm_90 the register-A kernels launch with programmatic dependent launch (`pdl`; off with
    ``LOWBIT_PDL=0``): they start while the previous kernel on the stream finishes and wait for
    it before reading anything. ``routing_ready=True`` promises that the routing tensors were
    written two launches or more before this call (``moe_experts``: routing, gate_up,
    ``silu_mul``, down): the kernel then also streams its first weight steps before that wait.

    ``slot_order_routes=R``: `a` is already in the routing's slot order, ``bf16 [P, K]`` with row
    s the activations of slot s (`moe_routing.gather_indexed_rows`, or ``silu_mul(gu,
    routing=...)``), for R routes (out ``[R, N]``; `top_k` must be 1). Only the pre-gathered
    engine reads that layout (``config.pregather``), and it then skips its own gather.
    """
    w.check("indexed")
    if a.dtype != torch.bfloat16 or a.dim() != 2:
        raise TypeError(f"a must be bf16 [M, K], got {a.dtype} {tuple(a.shape)}")
    if a.shape[1] != w.k:
        raise ValueError(f"a has K={a.shape[1]}, the weight has K={w.k}")
    if a.stride(1) != 1:
        raise ValueError("a must be contiguous along K")
    for name, t in (("sorted_ids", sorted_ids), ("expert_ids", expert_ids), ("num_tokens_post_padded", num_tokens_post_padded)):
        if t.dtype != torch.int32 or t.dim() != 1:
            raise TypeError(f"{name} must be int32 1-D, got {t.dtype} {tuple(t.shape)}")
        if t.device != a.device:
            raise ValueError(f"{name} is on {t.device}, a on {a.device}")
    if expert_ids.numel() == 0 or sorted_ids.numel() % expert_ids.numel():
        raise ValueError(f"sorted_ids ({sorted_ids.numel()}) must be whole blocks of expert_ids ({expert_ids.numel()})")
    block = sorted_ids.numel() // expert_ids.numel()
    if slot_order_routes is not None:
        if top_k != 1 or a.shape[0] != sorted_ids.numel() or slot_order_routes < 0:
            raise ValueError(f"slot_order_routes: a must hold one row a routing slot ([{sorted_ids.numel()}, K]) with "
                             f"top_k 1 and a route count >= 0; got a {tuple(a.shape)}, top_k {top_k}, "
                             f"{slot_order_routes} routes")
        m = num_routes = slot_order_routes
    else:
        m = a.shape[0]
        num_routes = m * top_k
    if config is None:
        config = w4a16_indexed_config(num_routes, w.num_experts, w.n, w.k, block_m=block, gluon=gluon_capable(a, w))
    if config.block_m != block:
        raise ValueError(f"routing was built with block size {block}, config.block_m={config.block_m}")
    if slot_order_routes is not None and not config.pregather:
        raise ValueError(f"slot_order_routes: a in slot order needs the pre-gathered engine (config.pregather); "
                         f"this config ({config.engine}, tile {config.block_n}x{config.block_m}) gathers rows itself")
    if topk_weights is not None and (topk_weights.dtype != torch.float32 or topk_weights.numel() != num_routes):
        raise TypeError(f"topk_weights must be float32 [M, top_k] = [{m}, {top_k}], got {topk_weights.dtype} {tuple(topk_weights.shape)}")
    if out is None:
        out = torch.empty(num_routes, w.n, dtype=torch.bfloat16, device=a.device)
    elif out.dtype != torch.bfloat16 or tuple(out.shape) != (num_routes, w.n) or out.stride(1) != 1:
        raise ValueError(f"out must be bf16 [{num_routes}, {w.n}] contiguous along N, got {out.dtype} {tuple(out.shape)}")
    if config.split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {config.split_k}")
    if config.pregather and config.engine != "gluon_rs":
        raise ValueError(f"w4a16_indexed: pregather runs on the gluon_rs engine only, got engine={config.engine!r}")
    if config.engine in GLUON_ENGINES:
        _launch_gluon(a, w, sorted_ids, expert_ids, num_tokens_post_padded, top_k, topk_weights, out, config,
                      routing_ready, slot_order=slot_order_routes is not None)
        return out
    if config.engine != "triton":
        raise ValueError(f"w4a16_indexed: engine must be 'triton' or one of {GLUON_ENGINES}, got {config.engine!r}")
    config = avoid_miscompile(config, w.n)
    n_tiles = triton.cdiv(w.n, config.block_n)
    split = config.split_k
    # split-K: FP32 shares in a workspace, summed (in a fixed order) by a second kernel
    dst = out if split == 1 else torch.empty(split, num_routes, w.n, dtype=torch.float32, device=a.device)
    _w4a16_indexed_kernel[(live_block_bound(expert_ids.numel(), num_routes), n_tiles, split)](
        a, w.qweight, w.scales, dst, sorted_ids, expert_ids, num_tokens_post_padded,
        topk_weights if topk_weights is not None else a,
        w.n, w.k, num_routes, top_k,
        a.stride(0), w.qweight.stride(0), w.qweight.stride(1), w.scales.stride(0), w.scales.stride(1),
        dst.stride(-2), dst.stride(0) if split > 1 else 0,
        BM=config.block_m, BN=config.block_n, SWAP_AB=config.swap_ab, MUL_WEIGHT=topk_weights is not None,
        SPLIT_K=split, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if split > 1:
        _splitk_reduce(dst, out, sorted_ids, expert_ids, num_tokens_post_padded, config.block_m, config.block_n)
    return out


def _launch_gluon(a, w, sorted_ids, expert_ids, ntpp, top_k, topk_weights, out, config: W4A16Config,
                  routing_ready: bool = False, slot_order: bool = False) -> None:
    """The Hopper Gluon kernels (`w4a16_sm90`): a CUDA sm_90 device, one of their tiles. engine
    ``gluon``: dequantized weights through shared memory; ``gluon_rs``: in registers."""
    from .hopper import PREGATHER_TILES, w4a16_indexed_sm90_launch

    regs_a = config.engine in REGISTER_A_ENGINES
    tiles = _engine_tiles(config.engine) + (PREGATHER_TILES if config.pregather else ())
    tile = (config.block_n, config.block_m, config.num_warps, config.num_stages)
    split = config.split_k
    if tile not in tiles or not config.swap_ab or (split != 1 and not _rs_splits(config.engine, tile, w.k, split)):
        raise ValueError(f"w4a16_indexed: the {config.engine} engine runs the tiles (weight rows, routing block, warps, "
                         f"stages) in {tiles} with swap_ab, split-K only on gluon_rs into non-empty shares of "
                         f"K's 256-wide steps; got {tile}, split_k={split}, K={w.k}")
    require_sm90(a.device, "w4a16_indexed")
    if regs_a and not _rows_aligned(a):
        raise ValueError(f"w4a16_indexed: the gluon_rs engine gathers activation rows with 16-byte copies: a needs a "
                         f"16-byte aligned base and a row stride that is a multiple of 8 elements, got stride "
                         f"{a.stride(0)} (use engine='triton' or a contiguous copy)")
    num_routes = out.shape[0]
    # split-K: FP32 shares, summed in a fixed order by the Triton kernel's reduction
    dst = out if split == 1 else torch.empty(split, num_routes, w.n, dtype=torch.float32, device=a.device)
    pdl = (2 if routing_ready else 1) if pdl_enabled(a.device) else 0
    w4a16_indexed_sm90_launch(a, w, sorted_ids, expert_ids, ntpp, top_k, topk_weights, dst, tile, regs_a,
                              warp_specialize=config.engine == "gluon_ws", split_k=split, pdl=pdl,
                              pregather=config.pregather, slot_order=slot_order)
    if split > 1:
        _splitk_reduce(dst, out, sorted_ids, expert_ids, ntpp, config.block_m, _RS_REDUCE_BN)


def _rs_splits(engine: str, tile: tuple, k: int, split: int) -> bool:
    """Whether the Gluon `engine` splits K `split` ways for `tile`: the register-A kernel's main
    loop only (not warp-specialized, not the one-step N loop), every share non-empty."""
    from .hopper import k_split_ok, runs_nloop

    return engine == "gluon_rs" and not runs_nloop(tile, k) and k_split_ok(k, split)


def _splitk_reduce(ws, out, sorted_ids, expert_ids, ntpp, block_m: int, block_n: int) -> None:
    """``out[id] = bf16(sum_s ws[s, id])`` for the routed rows of the FP32 shares ``ws [S, rows, N]``."""
    n = out.shape[1]
    _w4a16_indexed_splitk_reduce_kernel[(live_block_bound(expert_ids.numel(), out.shape[0]), triton.cdiv(n, block_n))](
        ws, out, sorted_ids, expert_ids, ntpp, n, out.shape[0], ws.stride(0), ws.stride(1), out.stride(0),
        BM=block_m, BN=block_n, SPLIT_K=ws.shape[0], num_warps=4,
    )


def compile_configs():
    """Every configuration the heuristics can pick, plus the split-K path (reachable through
    ``LOWBIT_W4A16_SPLIT_K``; not yet picked by the heuristics: no GPU measurement yet)."""
    from ..compile_tier import KernelConfig

    sig = {"a_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*bf16", "c_ptr": "*bf16", "sorted_ids_ptr": "*i32",
           "expert_ids_ptr": "*i32", "ntpp_ptr": "*i32", "topk_w_ptr": "*fp32",
           "N": "i32", "K": "i32", "num_routes": "i32", "top_k": "i32",
           "stride_am": "i32", "stride_qe": "i32", "stride_qn": "i32", "stride_se": "i32", "stride_sk": "i32",
           "stride_cm": "i32", "stride_ws": "i32",
           "BM": "constexpr", "BN": "constexpr", "SWAP_AB": "constexpr", "MUL_WEIGHT": "constexpr",
           "SPLIT_K": "constexpr"}
    cfgs = compile_configs_for(_w4a16_indexed_kernel, sig, "w4a16_indexed",
                               [{"MUL_WEIGHT": False, "SPLIT_K": 1}, {"MUL_WEIGHT": True, "SPLIT_K": 1}],
                               ("num_routes", "top_k"))
    sig_split = {**sig, "c_ptr": "*fp32"}
    cfgs += compile_configs_for(_w4a16_indexed_kernel, sig_split, "w4a16_indexed_splitk",
                                [{"MUL_WEIGHT": w, "SPLIT_K": k} for k in (2, 4) for w in (False, True)],
                                ("num_routes", "top_k"))
    red_sig = {"ws_ptr": "*fp32", "c_ptr": "*bf16", "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32",
               "ntpp_ptr": "*i32", "N": "i32", "num_routes": "i32", "stride_ws": "i32", "stride_wm": "i32",
               "stride_cm": "i32", "BM": "constexpr", "BN": "constexpr", "SPLIT_K": "constexpr"}
    for bm, (bn, _, _, _) in VALIDATED_TILES.items():
        for k in (2, 4):
            cfgs.append(KernelConfig(f"w4a16_indexed_splitk_reduce[BM={bm},BN={bn},SPLIT_K={k}]",
                                     _w4a16_indexed_splitk_reduce_kernel, red_sig, {"BM": bm, "BN": bn, "SPLIT_K": k},
                                     num_warps=4, unaligned=("num_routes",)))
    return cfgs
