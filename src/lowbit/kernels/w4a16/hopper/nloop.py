"""The indexed layout's N-loop kernel (Hopper, register-A) for a K of one 256-wide step (Kimi TP8
down): one program gathers its routing block's rows once and runs 8 to 56 weight tiles over
them (`tiles.NLOOP_N_TILES`), the next tiles' words in the TMA ring, each tile stored as it
retires; a 128-row block with no route in its second half runs the 64-row copy.
"""

from __future__ import annotations

import itertools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma_wait

from ....routing.layouts import live_block_bound
from ....runtime.kernel_config import KernelConfig
from ..int4_gluon import unscaled
from ..tiles import NLOOP_TILES, indexed_form, nloop_tile_counts
from .common import act_ring, dequant_regs, issue_regs, load_weights, weight_desc_types, weight_descs, weight_ring
from .indexed import indexed_sig
from .routed import block_expert, gather_async, gather_layout, gathered_rows, indexed_store

__all__ = ["compile_configs", "w4a16_indexed_nloop_launch"]


@gluon.jit
def _w4a16_indexed_nloop_kernel(
    a_ptr, w_desc, s_desc, c_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, topk_w_ptr,
    N, K, num_routes, top_k, stride_am, stride_cm,
    BR: gl.constexpr, STAGES: gl.constexpr, MUL_WEIGHT: gl.constexpr, X_LAYOUT: gl.constexpr,
    N_TILES: gl.constexpr, HALF_TAIL: gl.constexpr, X_HALF_LAYOUT: gl.constexpr, num_warps: gl.constexpr,
):
    """The register-A indexed kernel for a K of one 256-wide step (K <= 256; Kimi TP8 down has
    K = 256): one program gathers its routing block's rows once and loops over N_TILES weight
    tiles (N tiles ``t0 ..``; `_nloop_block`; the heuristics pick how many: a constexpr, since
    a runtime count costs the 32-row tile 3-13 registers, one CTA an SM with routing weights).
    With one K step a tile, `_w4a16_indexed_rs_kernel` is all prologue and epilogue: every (routing block, N tile)
    program re-gathers the same rows and only one program an SM runs (registers).
    HALF_TAIL: a block whose second half holds no route (an expert's last block) runs the
    BR / 2-row tile (X_HALF_LAYOUT: its gather layout), as `_w4a16_indexed_rs_kernel` does
    (`tiles.RegisterATile.nloop_half_tail`). Grid: routing blocks x cdiv(N tiles, N_TILES), one axis, the N
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
    e, runs = block_expert(ntpp_ptr, expert_ids_ptr, pid_m, BR)
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
    xs = act_ring(w_desc, BR, 1, True)
    wring, sring, wready = weight_ring(w_desc, s_desc, STAGES)
    row_ok, a_rows = gathered_rows(a_ptr, ids_ptr, 0, num_routes, top_k, stride_am, BR, X_LAYOUT)
    gather_async(xs, 0, a_rows, row_ok, 0, K, X_LAYOUT)
    async_copy.commit_group()
    srow = e * 8  # one K step: eight scale rows an expert
    for i in gl.static_range(STAGES):
        n0 = (t0 + i) * BW
        load_weights(w_desc, s_desc, e * N + n0, srow, n0, 0, wready.index(i), wring, sring, i, i < count)
    async_copy.wait_group(0)
    fence_async_shared()
    mbarrier.wait(wready.index(0), 0)
    w0, w1, w2, w3, w4, w5, w6, w7 = dequant_regs(wring, sring, 0, dot_a)
    gl.thread_barrier()  # every warp holds tile 0's fragments and sees every gathered row
    n0 = (t0 + STAGES) * BW
    load_weights(w_desc, s_desc, e * N + n0, srow, n0, 0, wready.index(0), wring, sring, 0, STAGES < count)
    for j in range(count):
        acc = issue_regs(xs, 0, gl.zeros([BW, BR], gl.float32, mma), w0, w1, w2, w3, w4, w5, w6, w7)
        # tile j+1 dequantized while tile j's products run (past the last tile: unused, no wait)
        s1 = (j + 1) % STAGES
        mbarrier.wait(wready.index(s1), ((j + 1) // STAGES) & 1, pred=j + 1 < count)
        v0, v1, v2, v3, v4, v5, v6, v7 = dequant_regs(wring, sring, s1, dot_a)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
        gl.thread_barrier()  # every warp is done with stage s1's words
        n0 = (t0 + j + 1 + STAGES) * BW
        load_weights(w_desc, s_desc, e * N + n0, srow, n0, 0, wready.index(s1), wring, sring, s1,
                      j + 1 + STAGES < count)
        indexed_store(unscaled(acc), c_ptr, ids_ptr, topk_w_ptr, 0, (t0 + j) * BW, N, num_routes,
                       stride_cm, MUL_WEIGHT, num_warps)
        w0, w1, w2, w3, w4, w5, w6, w7 = v0, v1, v2, v3, v4, v5, v6, v7
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(wready.index(i))


def _nloop_constexprs(tile) -> dict:
    """The N-loop kernel's gather layouts and tail constexpr for `tile` (launcher and compile tier)."""
    _, br, warps, _ = tile
    half = br // 2 if indexed_form(tile).nloop_half_tail else 0
    return {"X_LAYOUT": gather_layout(br, warps), "HALF_TAIL": bool(half),
            "X_HALF_LAYOUT": gather_layout(half, warps) if half else None}


def w4a16_indexed_nloop_launch(a: torch.Tensor, w, sorted_ids: torch.Tensor, expert_ids: torch.Tensor,
                               ntpp: torch.Tensor, top_k: int, topk_weights: torch.Tensor | None, out: torch.Tensor,
                               tile: tuple, n_tiles: int) -> None:
    """Launch the N-loop kernel on operands `lowbit.kernels.w4a16.indexed` has validated (a K of
    one 256-wide step): tile one of `tiles.NLOOP_TILES`, `n_tiles` weight tiles a program (one of
    `tiles.nloop_tile_counts(routing block)`, the heuristics' `nloop_n_tiles`)."""
    bw, br, warps, stages = tile
    if tuple(tile) not in NLOOP_TILES or w.k > 256:
        raise ValueError(f"the N-loop kernel runs a K of one 256-wide step on the tiles {NLOOP_TILES}; "
                         f"got {tile}, K={w.k}")
    if n_tiles not in nloop_tile_counts(br):
        raise ValueError(f"n_tiles must be one of {nloop_tile_counts(br)} for {br}-row blocks, got {n_tiles}")
    w_desc, s_desc = weight_descs(w, bw)
    routes = out.shape[0]
    blocks = live_block_bound(expert_ids.numel(), routes)  # no program for the over-allocation
    chunks = triton.cdiv(triton.cdiv(w.n, bw), n_tiles)
    _w4a16_indexed_nloop_kernel[(blocks * chunks,)](
        a, w_desc, s_desc, out, sorted_ids, expert_ids, ntpp, out if topk_weights is None else topk_weights,
        w.n, w.k, routes, top_k, a.stride(0), out.stride(0),
        BR=br, STAGES=stages, MUL_WEIGHT=topk_weights is not None, N_TILES=n_tiles, num_warps=warps,
        **_nloop_constexprs(tile))


def compile_configs() -> list[KernelConfig]:
    """Every N-loop tile and tiles-a-program count, for the compile tier (sm_90a)."""
    cfgs = []
    for (bw, br, warps, stages), mul in itertools.product(NLOOP_TILES, (False, True)):
        for n_tiles in nloop_tile_counts(br):
            cfgs.append(KernelConfig(
                f"w4a16_indexed_sm90_nloop[BW={bw},BR={br},w={warps},stages={stages},MUL_WEIGHT={int(mul)},"
                f"N_TILES={n_tiles}]",
                _w4a16_indexed_nloop_kernel,
                {**{k: v for k, v in indexed_sig(bw).items() if k != "N_FASTEST"}, **weight_desc_types(bw),
                 "N_TILES": "constexpr", **{k: "constexpr" for k in _nloop_constexprs((bw, br, warps, stages))}},
                {"BR": br, "STAGES": stages, "MUL_WEIGHT": mul, "N_TILES": n_tiles, "num_warps": warps,
                 **_nloop_constexprs((bw, br, warps, stages))},
                num_warps=warps, num_stages=1, expect_sass=("HGMMA",), expect_ptx=("wgmma.wait_group.sync.aligned 0",),
                unaligned=("N", "K", "num_routes", "top_k")))
    return cfgs
