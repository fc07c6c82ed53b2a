"""Hopper kernels of the indexed W4A16 layout (vLLM's ``moe_align_block_size`` routing, block size
BR = the kernel's activation rows) and their launchers.

- `_w4a16_indexed_sm90_kernel` (engine ``gluon``): the routed rows loaded into registers a step
  ahead, dequantized weights through shared memory; a comparison point, not a default.
- `_w4a16_indexed_rs_kernel` (``gluon_rs`` / ``gluon_ws``): the routed rows gathered by cp.async
  into the activation ring (`routed`), `mainloop.rs_mainloop` or `warp_specialized.ws_mainloop`,
  with the half and three-quarter tails, K shares and PDL.
- `_w4a16_indexed_tma_kernel`: the register-A main loop on rows pre-gathered into the routing's
  slot order, one TMA box a step.

Outputs go to row ``id`` (times the routing weight when given); sentinel slots, ``-1`` expert
blocks and blocks past the device-side padded count are skipped. The one-step-K N loop is
`nloop`'s.
"""

from __future__ import annotations

import itertools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma_wait
from triton.runtime.jit import mangle_type

from ....routing.kernels import gather_indexed_rows
from ....routing.layouts import live_block_bound
from ....runtime.kernel_config import KernelConfig
from ....runtime.pdl import gl_release_next, gl_wait_prior, launch_options
from ..tiles import (
    GROUP_LOOP_MAXNREG,
    INDEXED_REGISTER_A,
    INDEXED_RS_TILES,
    INDEXED_TILES,
    INDEXED_WS_TILES,
    PREGATHER_TILES,
    group_loop,
    half_acts,
    half_tail,
    indexed_form,
    k_split_ok,
    quarter_tail,
)
from .common import (
    GROUPS,
    act_desc,
    dequant_step,
    issue_step,
    load_weight_step,
    n_fastest,
    program_grid,
    tile_ids,
    weight_desc_types,
    weight_descs,
    weight_ring,
)
from .mainloop import rs_mainloop
from .routed import block_expert, gather_layout, gathered_rows, indexed_store, routed_rows
from .warp_specialized import WS_GATHER_WARPS, ws_mainloop

__all__ = ["compile_configs", "indexed_sig", "rs_constexprs", "w4a16_indexed_pregathered_launch",
           "w4a16_indexed_sm90_launch"]


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
    xs.index(p * GROUPS + 0).store(x0)
    xs.index(p * GROUPS + 1).store(x1)
    xs.index(p * GROUPS + 2).store(x2)
    xs.index(p * GROUPS + 3).store(x3)
    xs.index(p * GROUPS + 4).store(x4)
    xs.index(p * GROUPS + 5).store(x5)
    xs.index(p * GROUPS + 6).store(x6)
    xs.index(p * GROUPS + 7).store(x7)


@gluon.jit
def _w4a16_indexed_sm90_kernel(
    a_ptr, w_desc, s_desc, c_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, topk_w_ptr,
    N, K, num_routes, top_k, stride_am, stride_cm,
    BR: gl.constexpr, STAGES: gl.constexpr, MUL_WEIGHT: gl.constexpr, N_FASTEST: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Indexed layout (`moe_align_block_size` routing with block size BR): grid routing
    blocks x N tiles, one axis (`tile_ids`). Words and scales stream through a STAGES-deep TMA ring; the routed rows
    (row ``id // top_k`` of route ``id``) are loaded into registers one step ahead and stored
    into the free buffer set once the previous step's products retire; output row ``id``."""
    BW: gl.constexpr = w_desc.block_type.shape[0]
    pid_m, pid_n = tile_ids(N, BW, N_FASTEST)
    e, runs = block_expert(ntpp_ptr, expert_ids_ptr, pid_m, BR)
    if not runs:  # past the device-side padded count, or another rank's expert (EP)
        return
    n0 = pid_n * BW

    x_l: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [num_warps, 1], [1, 0])  # 16-byte row loads
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR, 16])
    deq_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BW, 32], gl.bfloat16)
    x_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BR, 32], gl.bfloat16)
    deq = gl.allocate_shared_memory(gl.bfloat16, [2 * GROUPS, BW, 32], deq_l)
    xs = gl.allocate_shared_memory(gl.bfloat16, [2 * GROUPS, BR, 32], x_sl)
    wring, sring, ready = weight_ring(w_desc, s_desc, STAGES)

    nk = gl.cdiv(K, 256)
    wrow = e * N + n0
    srow = e * nk * 8
    step_bytes: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes
    for i in gl.static_range(STAGES - 1):
        live = i < nk
        mbarrier.expect(ready.index(i), step_bytes, pred=live)
        load_weight_step(w_desc, s_desc, wrow, srow, n0, i, ready.index(i), wring, sring, i, live)

    row_ok, a_rows = routed_rows(a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k, stride_am, BR, gl.SliceLayout(1, x_l))
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
        dequant_step(wring, sring, s, deq, p, num_warps)
        acc = issue_step(deq, p, xs, p, acc)
        # retire step kt-1's products: buffer sets 1 - p and stage (kt-1) % STAGES are free
        acc = warpgroup_mma_wait(num_outstanding=GROUPS, deps=(acc,))
        _gather_store(xs, 1 - p, x0, x1, x2, x3, x4, x5, x6, x7)
        nxt = kt + STAGES - 1
        ns = nxt % STAGES
        live = nxt < nk
        mbarrier.expect(ready.index(ns), step_bytes, pred=live)
        load_weight_step(w_desc, s_desc, wrow, srow, n0, nxt, ready.index(ns), wring, sring, ns, live)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    indexed_store(acc, c_ptr, sorted_ids_ptr, topk_w_ptr, pid_m, n0, N, num_routes, stride_cm, MUL_WEIGHT,
                   num_warps)


@gluon.jit
def _indexed_rs_block(a_ptr, w_desc, s_desc, c_ptr, ids_ptr, topk_w_ptr, e, n0, N, K, num_routes, top_k, stride_am,
                      stride_cm, BR: gl.constexpr, STAGES: gl.constexpr, MUL_WEIGHT: gl.constexpr,
                      X_LAYOUT: gl.constexpr, num_warps: gl.constexpr, WARP_SPECIALIZE: gl.constexpr = False,
                      QUARTER: gl.constexpr = False, GROUP_LOOP: gl.constexpr = False, ks=0, nk=None,
                      PDL_WAIT: gl.constexpr = False, HALF_ACTS: gl.constexpr = False, K_TAIL: gl.constexpr = True):
    """One routing block's tile on `rs_mainloop` (`ws_mainloop` with WARP_SPECIALIZE, its
    producer gathering with X_LAYOUT): the first BR slots at `ids_ptr` (the block's sorted ids)
    gathered, multiplied and stored; with QUARTER (warp-specialized four-warpgroup tiles) only
    the first three quarters of them multiplied (`tiles.RegisterATile.ws_tails`). `ks`, `nk`: a K share
    (`_k_share`; register-A main loop only), stored in FP32 to `c_ptr`. PDL_WAIT (register-A main
    loop only): `_rs_rings`'."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR // 2 if QUARTER else BR, 16])
    wrow = e * N + n0
    srow = e * gl.cdiv(K, 256) * 8
    if QUARTER:
        mma2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BR // 4, 16])
        acc, acc2 = ws_mainloop(w_desc, w_desc, s_desc, 0, wrow, srow, n0, K, mma, BR, STAGES, True, a_ptr, ids_ptr,
                                 0, num_routes, top_k, stride_am, X_LAYOUT, mma2)
        indexed_store(acc2, c_ptr, ids_ptr + BR // 2, topk_w_ptr, 0, n0, N, num_routes, stride_cm, MUL_WEIGHT,
                       num_warps)
    elif WARP_SPECIALIZE:
        acc = ws_mainloop(w_desc, w_desc, s_desc, 0, wrow, srow, n0, K, mma, BR, STAGES, True, a_ptr, ids_ptr, 0,
                           num_routes, top_k, stride_am, X_LAYOUT)[0]
    else:
        row_ok, a_rows = gathered_rows(a_ptr, ids_ptr, 0, num_routes, top_k, stride_am, BR, X_LAYOUT)
        acc = rs_mainloop(w_desc, a_rows, row_ok, w_desc, s_desc, 0, wrow, srow, n0, K, mma, BR, STAGES, True,
                           X_LAYOUT, GROUP_LOOP=GROUP_LOOP, ks=ks, nk=nk, PDL_WAIT=PDL_WAIT, HALF_ACTS=HALF_ACTS,
                           K_TAIL=K_TAIL)
    indexed_store(acc, c_ptr, ids_ptr, topk_w_ptr, 0, n0, N, num_routes, stride_cm, MUL_WEIGHT, num_warps)


@gluon.jit
def _indexed_program(N, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, BR: gl.constexpr, BW: gl.constexpr,
                     N_FASTEST: gl.constexpr, PDL_FIRST: gl.constexpr):
    """The register-A indexed kernels' program: (routing block, first output column, the block's
    sorted ids, its expert, whether it runs: `block_expert`). PDL_FIRST: wait on the previous
    kernel (and release the next) before reading anything."""
    if PDL_FIRST:
        gl_wait_prior()
        gl_release_next()
    pid_m, pid_n = tile_ids(N, BW, N_FASTEST)
    e, runs = block_expert(ntpp_ptr, expert_ids_ptr, pid_m, BR)
    return pid_m, pid_n * BW, sorted_ids_ptr + pid_m * BR, e, runs


@gluon.jit
def _k_share(K, SPLIT_K: gl.constexpr):
    """(first K step, steps) of this program's share of K's 256-wide steps (grid axis 2): SPLIT_K
    runs as equal as can be, none empty while SPLIT_K <= steps (`k_split_ok`)."""
    steps = gl.cdiv(K, 256)
    s = gl.program_id(2)
    ks = s * steps // SPLIT_K
    return ks, (s + 1) * steps // SPLIT_K - ks


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
    """The indexed layout on the register-A main loop (`rs_mainloop`; GROUP_LOOP: one group at a
    time, `tiles.GROUP_LOOP_MAXNREG`): the routed rows (row ``id // top_k`` of route ``id``) are gathered by cp.async into the same STAGES-deep ring
    as the words, so no register holds them and routing blocks of up to 128 rows fit beside
    two sets of A fragments. Grid, early exits and output rows as `_w4a16_indexed_sm90_kernel`.
    X_LAYOUT: the gather's register layout, one thread a 4- to 16-byte piece of a ``[BR, 32]``
    box with no replication (`gather_layout`).
    HALF_TAIL: a block whose second half holds no route (an expert's last block, as
    `moe_align_block_size` puts an expert's routes first) runs the BR / 2-row tile instead
    (X_HALF_LAYOUT: its gather layout), so its wgmmas do not multiply the padding
    (`tiles.RegisterATile.half_tail`). QUARTER_TAIL (warp-specialized four-warpgroup tiles): a block
    with no route in its last quarter multiplies only its first three quarters (`ws_tails`).
    SPLIT_K > 1: grid axis 2 splits K (`_k_share`); `c_ptr` is then the FP32 workspace
    ``[SPLIT_K, num_routes, N]`` (share s at ``c_ptr + s * stride_ws``), summed by
    the op's reduction kernel (`portable.splitk_reduce`).
    PDL (`lowbit.runtime.pdl`): 0 launched without it; 1 wait on the previous kernel first; 2 (register-A main
    loop only) read the routing and TMA the first STAGES weight steps, then wait: the routing
    must have been written two launches or more before this one.
    K_TAIL: the gather masks K per copy (K may end inside a 256-wide step); without it, rows only
    (`tiles.RegisterATile.even_k`: four-warpgroup tiles on a K that is a multiple of 256)."""
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
    """One routing block's tile on `rs_mainloop` with its rows by TMA from the pre-gathered buffer
    (rows ``r0 ..``, as many as `x_desc`'s box), stored as `_indexed_rs_block` stores them."""
    BR: gl.constexpr = x_desc.block_type.shape[1]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR, 16])
    acc = rs_mainloop(x_desc, 0, 0, w_desc, s_desc, r0, e * N + n0, e * gl.cdiv(K, 256) * 8, n0, K, mma, BR, STAGES,
                       False, mma, GROUP_LOOP=GROUP_LOOP, PDL_WAIT=PDL_WAIT, HALF_ACTS=HALF_ACTS)
    indexed_store(acc, c_ptr, ids_ptr, topk_w_ptr, 0, n0, N, num_routes, stride_cm, MUL_WEIGHT, num_warps)


@gluon.jit
def _w4a16_indexed_tma_kernel(
    x_desc, xh_desc, w_desc, s_desc, c_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, topk_w_ptr,
    N, K, num_routes, stride_cm,
    STAGES: gl.constexpr, MUL_WEIGHT: gl.constexpr, N_FASTEST: gl.constexpr, HALF_TAIL: gl.constexpr,
    GROUP_LOOP: gl.constexpr, HALF_ACTS: gl.constexpr, num_warps: gl.constexpr, PDL: gl.constexpr = 0,
):
    """`_w4a16_indexed_rs_kernel` on rows pre-gathered into the routing's slot order
    (`lowbit.routing.kernels.gather_indexed_rows`: buffer row s = the activation row of slot s): a routing
    block's rows are one TMA box a step (`x_desc`, `act_desc` of the buffer), as the grouped
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


def rs_constexprs(tile, warp_specialize: bool, k: int = 0) -> dict:
    """The register-A indexed kernel's layout and variant constexprs for `tile` and K `k` (0: any K,
    a tail allowed): launchers and compile tier."""
    bw, br, warps, stages = tile
    half = half_tail(tile, warp_specialize, "indexed")
    loop = group_loop(tile, warp_specialize)
    gather_warps = WS_GATHER_WARPS.value if warp_specialize else warps
    form = indexed_form(tile)
    even_k = form is not None and form.even_k
    return {"X_LAYOUT": gather_layout(br, gather_warps, loop),
            "WARP_SPECIALIZE": warp_specialize, "HALF_TAIL": half,
            "X_HALF_LAYOUT": gather_layout(br // 2, gather_warps, loop) if half else None,
            "QUARTER_TAIL": quarter_tail(tile, warp_specialize, "indexed"), "GROUP_LOOP": loop,
            "HALF_ACTS": half_acts(tile, warp_specialize, "indexed"),
            "K_TAIL": not (k > 0 and k % 256 == 0 and not warp_specialize and even_k)}


def _rs_maxnreg(tile, constexprs: dict) -> int | None:
    """The ptxas register cap of a register-A launch: a group-loop tile's (`tiles.GROUP_LOOP_MAXNREG`)."""
    if constexprs.get("GROUP_LOOP"):
        return GROUP_LOOP_MAXNREG[tuple(tile)]
    return None


def w4a16_indexed_sm90_launch(a: torch.Tensor, w, sorted_ids: torch.Tensor, expert_ids: torch.Tensor,
                              ntpp: torch.Tensor, top_k: int, topk_weights: torch.Tensor | None, out: torch.Tensor,
                              tile: tuple, regs_a: bool = False, warp_specialize: bool = False, split_k: int = 1,
                              pdl: int = 0) -> None:
    """Launch on operands `lowbit.kernels.w4a16.indexed` has validated (its docstring has the
    shapes; N a multiple of 8): the shared-memory kernel on a tile of `tiles.INDEXED_TILES`, whose
    routing block size the routing was built with; `regs_a`: the register-A kernel (a tile of
    `tiles.INDEXED_RS_TILES`), with `warp_specialize` its producer-warp main loop (a tile of
    `tiles.INDEXED_WS_TILES`). `split_k` > 1 (register-A main loop only, every share at least one
    256-wide step): `out` is the FP32 workspace ``[split_k, M * top_k, N]`` of K shares, which the
    caller sums. `pdl` (`lowbit.runtime.pdl`): 0 a plain launch; 1 a PDL launch that waits first;
    2 one that streams its first weight steps before its wait (the routing written two launches
    back or more). The register-A kernel takes it (2 becomes 1 on the warp-specialized main
    loop); the shared-memory engine launches plainly."""
    bw, br, warps, stages = tile
    if split_k > 1 and (not regs_a or warp_specialize or not k_split_ok(w.k, split_k)):
        raise ValueError(f"split_k={split_k}: the register-A (not warp-specialized) kernel splits K, into "
                         f"non-empty shares of K={w.k}'s {triton.cdiv(w.k, 256)} steps; tile {tile}")
    w_desc, s_desc = weight_descs(w, bw)
    routes = out.shape[-2]  # M * top_k (out or the K shares' workspace)
    blocks = live_block_bound(expert_ids.numel(), routes)  # no program for the over-allocation
    kernel = _w4a16_indexed_rs_kernel if regs_a else _w4a16_indexed_sm90_kernel
    extra = rs_constexprs(tile, warp_specialize, w.k) if regs_a else {}
    if regs_a and (cap := _rs_maxnreg(tile, extra)):
        extra["maxnreg"] = cap
    if regs_a and pdl:
        extra.update(PDL=1 if extra["WARP_SPECIALIZE"] else pdl, **launch_options(True))
    if split_k > 1:
        extra.update(SPLIT_K=split_k, stride_ws=out.stride(0))
    fastest = n_fastest(br)
    grid = program_grid(blocks, triton.cdiv(w.n, bw), fastest)
    if split_k > 1:  # the K shares on axis 2
        grid = (*grid, split_k) if len(grid) == 2 else (*grid, 1, split_k)
    kernel[grid](
        a, w_desc, s_desc, out, sorted_ids, expert_ids, ntpp, out if topk_weights is None else topk_weights,
        w.n, w.k, routes, top_k, a.stride(0), out.stride(-2),
        BR=br, STAGES=stages, MUL_WEIGHT=topk_weights is not None, N_FASTEST=fastest, num_warps=warps, **extra,
    )


def w4a16_indexed_pregathered_launch(a: torch.Tensor, w, sorted_ids: torch.Tensor, expert_ids: torch.Tensor,
                                     ntpp: torch.Tensor, top_k: int, topk_weights: torch.Tensor | None,
                                     out: torch.Tensor, tile: tuple, pdl: int = 0, slot_order: bool = False) -> None:
    """`w4a16_indexed_sm90_launch` on rows pre-gathered into the routing's slot order: the rows
    of `a` gathered into a ``[P, K]`` buffer (`lowbit.routing.kernels.gather_indexed_rows`; `a`
    itself with `slot_order`: already ``[P, K]`` in slot order, for ``out.shape[0]`` routes),
    then `_w4a16_indexed_tma_kernel` over it; tile one of `tiles.PREGATHER_TILES`; `pdl` as there
    (both forms)."""
    if tuple(tile) not in PREGATHER_TILES:
        raise ValueError(f"pregather: the pre-gathered kernel runs the tiles {PREGATHER_TILES}; got {tile}")
    bw, br, warps, stages = tile
    w_desc, s_desc = weight_descs(w, bw)
    blocks = live_block_bound(expert_ids.numel(), out.shape[0])  # no program for the over-allocation
    rows = a if slot_order else gather_indexed_rows(a, sorted_ids, expert_ids, ntpp, top_k)
    extra = rs_constexprs(tile, False, w.k)
    x_desc = act_desc(rows, w.k, br, 4 if extra["HALF_ACTS"] else 8)
    xh_desc = act_desc(rows, w.k, br // 2) if extra["HALF_TAIL"] else x_desc
    consts = {k: extra[k] for k in ("HALF_TAIL", "GROUP_LOOP", "HALF_ACTS")}
    if cap := _rs_maxnreg(tile, extra):
        consts["maxnreg"] = cap
    if pdl:
        consts.update(PDL=pdl, **launch_options(True))
    fastest = n_fastest(br)
    _w4a16_indexed_tma_kernel[program_grid(blocks, triton.cdiv(w.n, bw), fastest)](
        x_desc, xh_desc, w_desc, s_desc, out, sorted_ids, expert_ids, ntpp, out if topk_weights is None else topk_weights,
        w.n, w.k, out.shape[0], out.stride(0),
        STAGES=stages, MUL_WEIGHT=topk_weights is not None, N_FASTEST=fastest, num_warps=warps, **consts,
    )


def indexed_sig(bw: int) -> dict[str, str]:
    """The compile tier's signature of the indexed kernels' common arguments, in their order."""
    return {
        "a_ptr": "*bf16", **weight_desc_types(bw), "c_ptr": "*bf16", "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32",
        "ntpp_ptr": "*i32", "topk_w_ptr": "*fp32", "N": "i32", "K": "i32", "num_routes": "i32", "top_k": "i32",
        "stride_am": "i32", "stride_cm": "i32",
        "BR": "constexpr", "STAGES": "constexpr", "MUL_WEIGHT": "constexpr", "N_FASTEST": "constexpr",
        "num_warps": "constexpr",
    }


def compile_configs() -> list[KernelConfig]:
    """Every indexed Gluon tile the launchers run (in-kernel gather, its K-tail, K-share and PDL
    forms, and the pre-gathered kernel), for the compile tier (sm_90a)."""
    cfgs = []
    kinds = {"gluon": (_w4a16_indexed_sm90_kernel, f"wgmma.wait_group.sync.aligned {GROUPS.value}"),
             "gluon_rs": (_w4a16_indexed_rs_kernel, "wgmma.wait_group.sync.aligned 0"),
             "gluon_ws": (_w4a16_indexed_rs_kernel, "wgmma.wait_group.sync.aligned 0")}
    for kind, (bw, br, warps, stages) in ([("gluon", t) for t in INDEXED_TILES] + [("gluon_rs", t) for t in INDEXED_RS_TILES]
                                          + [("gluon_ws", t) for t in INDEXED_WS_TILES]):
        isig = indexed_sig(bw)
        ws = kind == "gluon_ws"
        tile = (bw, br, warps, stages)
        # Kimi's K (a multiple of 256): the production build; a K tail's build below
        extra = rs_constexprs(tile, ws, 7168) if kind != "gluon" else {}
        if kind != "gluon":  # no K shares (the launch's defaults)
            extra["SPLIT_K"] = 1
        kernel, ptx = kinds[kind]

        def build(name: str, consts: dict, mul: bool, sig: dict, unaligned: tuple = ()) -> KernelConfig:
            return KernelConfig(
                f"w4a16_indexed_sm90_{name}[BW={bw},BR={br},w={warps},stages={stages}" + (
                    f",MUL_WEIGHT={int(mul)}]" if name == kind else "]"),
                kernel, sig,
                {"BR": br, "STAGES": stages, "MUL_WEIGHT": mul, "N_FASTEST": n_fastest(br), "num_warps": warps,
                 **consts},
                num_warps=warps, num_stages=1, expect_sass=("HGMMA",), expect_ptx=(ptx,),
                maxnreg=_rs_maxnreg(tile, consts),
                unaligned=("N", "K", "num_routes", "top_k", *unaligned))
        for mul in (False, True):
            cfgs.append(build(kind, extra, mul, {**isig, **{k: "constexpr" for k in extra}}))
        form = indexed_form(tile)
        if kind == "gluon_rs" and form.even_k:  # a K tail's build
            tail = {**extra, "K_TAIL": True}
            cfgs.append(build("gluon_rs_ktail", tail, True, {**isig, **{k: "constexpr" for k in tail}}))
        if kind == "gluon_rs" and form.split_k:  # the K shares' build
            cfgs.append(build("gluon_rs_splitk", {**extra, "SPLIT_K": 2}, True,
                              {**isig, "c_ptr": "*fp32", **{k: "constexpr" for k in extra}, "SPLIT_K": "constexpr",
                               "stride_ws": "i32"}, ("stride_ws",)))
    # the PDL forms (`lowbit.runtime.pdl`) the MoE layer launches: the down projection's (PDL 2:
    # weights before the wait) and gate_up's (PDL 1); warp-specialized at 1
    pdl_builds = ([("gluon_rs", t.shape, p) for t in INDEXED_REGISTER_A for p in t.pdl]
                  + [("gluon_ws", t.shape, p) for t in INDEXED_REGISTER_A for p in t.ws_pdl])
    for kind, (bw, br, warps, stages), pdl in pdl_builds:
        extra = {**rs_constexprs((bw, br, warps, stages), kind == "gluon_ws", 7168), "SPLIT_K": 1, "PDL": pdl}
        cfgs.append(KernelConfig(
            f"w4a16_indexed_sm90_{kind}_pdl{pdl}[BW={bw},BR={br},w={warps},stages={stages}]",
            _w4a16_indexed_rs_kernel, {**indexed_sig(bw), **{k: "constexpr" for k in extra}},
            {"BR": br, "STAGES": stages, "MUL_WEIGHT": False, "N_FASTEST": n_fastest(br), "num_warps": warps,
             **extra},
            num_warps=warps, num_stages=1, expect_sass=("HGMMA",),
            expect_ptx=("wgmma.wait_group.sync.aligned 0", "griddepcontrol.wait", "griddepcontrol.launch_dependents"),
            maxnreg=_rs_maxnreg((bw, br, warps, stages), extra),
            unaligned=("N", "K", "num_routes", "top_k")))
    # the pre-gathered rows' kernel, plain and with PDL (the MoE layer's)
    for (bw, br, warps, stages), (mul, pdl) in itertools.product(PREGATHER_TILES, ((False, 0), (True, 0), (False, 1),
                                                                                   (False, 2))):
        tile = (bw, br, warps, stages)
        extra = rs_constexprs(tile, False, 7168)
        consts = {k: extra[k] for k in ("HALF_TAIL", "GROUP_LOOP", "HALF_ACTS")}
        probe = torch.empty(16, 64, dtype=torch.bfloat16)
        cfgs.append(KernelConfig(
            f"w4a16_indexed_sm90_gluon_tma[BW={bw},BR={br},w={warps},stages={stages},MUL_WEIGHT={int(mul)},PDL={pdl}]",
            _w4a16_indexed_tma_kernel,
            {"x_desc": mangle_type(act_desc(probe, 64, br, 4 if consts["HALF_ACTS"] else 8)),
             "xh_desc": mangle_type(act_desc(probe, 64, br // 2 if consts["HALF_TAIL"] else br)),
             **weight_desc_types(bw), "c_ptr": "*bf16", "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32",
             "ntpp_ptr": "*i32", "topk_w_ptr": "*fp32", "N": "i32", "K": "i32", "num_routes": "i32", "stride_cm": "i32",
             "STAGES": "constexpr", "MUL_WEIGHT": "constexpr", "N_FASTEST": "constexpr", "num_warps": "constexpr",
             "PDL": "constexpr", **{k: "constexpr" for k in consts}},
            {"STAGES": stages, "MUL_WEIGHT": mul, "N_FASTEST": n_fastest(br), "num_warps": warps, "PDL": pdl,
             **consts},
            num_warps=warps, num_stages=1, expect_sass=("HGMMA",),
            expect_ptx=("wgmma.wait_group.sync.aligned 0",) + (("griddepcontrol.wait",) if pdl else ()),
            maxnreg=_rs_maxnreg(tile, extra), max_spill_bytes=indexed_form(tile).spill_bytes,
            unaligned=("N", "K", "num_routes")))
    return cfgs
