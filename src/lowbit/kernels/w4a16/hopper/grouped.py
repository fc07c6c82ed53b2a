"""Hopper kernels of the grouped W4A16 layouts (contiguous: one expert a 128-row segment; masked:
``masked_m[g]`` live rows of each expert's max_m-row slab) and their launchers.

- `_w4a16_grouped_sm90_kernel` (engine ``gluon``): dequantized weights stored into shared
  memory, SS-wgmma; a comparison point, not a default.
- `_w4a16_grouped_rs_kernel` (``gluon_rs`` / ``gluon_ws``): `mainloop.rs_mainloop` or
  `warp_specialized.ws_mainloop` over each of a program's row blocks, with the masked tails.
- `_w4a16_grouped_split_kernel`: four-warpgroup masked tiles of 48 / 80 / 96 rows (two
  accumulators, `tiles.GROUPED_SPLIT`).

Masked grids have `row_slots` programs an expert for each N tile, each looping over its
expert's row blocks below ``masked_m`` (no host readback: capturable in a CUDA graph).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type

from ....runtime.kernel_config import KernelConfig
from ..tiles import (
    GLUON_RS_TILES,
    GLUON_SPLIT_TILES,
    GLUON_SPLIT_WS_TILES,
    GLUON_TILES,
    GLUON_WS_TILES,
    GROUP_LOOP_MAXNREG,
    group_loop,
    grouped_form,
    half_acts,
    half_tail,
    quarter_tail,
    split_form,
    split_rows,
)
from ..int4_gluon import unscaled
from .common import (
    GROUPS,
    act_desc,
    act_layout,
    act_ring,
    dequant_group_regs,
    dequant_step,
    issue_step,
    load_weight_step,
    load_weights,
    n_fastest,
    program_grid,
    stage_boxes,
    tile_ids,
    transposed,
    weight_desc_types,
    weight_descs,
    weight_ring,
)
from .mainloop import rs_mainloop, rs_rings_done
from .warp_specialized import ws_mainloop

__all__ = ["checked_row_slots", "compile_configs", "w4a16_grouped_sm90_launch", "w4a16_grouped_split_launch"]


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


@gluon.jit
def _grouped_store(acc, c_ptr, route_ptr, r0, n0, e, max_m, valid, N, stride_cm, MASKED: gl.constexpr,
                   num_warps: gl.constexpr):
    """Store ``acc[i, r] = out[r0 + r, n0 + i]`` (the weight rows are the output columns): rows
    past ``masked_m[e]`` (masked) or padding rows (contiguous, ``m_indices < 0``) unwritten."""
    out = transposed(acc, num_warps)
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
def _w4a16_grouped_sm90_kernel(
    x_desc, w_desc, s_desc, c_ptr, route_ptr,
    N, K, max_m, stride_cm, row_slots,
    STAGES: gl.constexpr, MASKED: gl.constexpr, N_FASTEST: gl.constexpr, num_warps: gl.constexpr,
):
    """Contiguous (MASKED=0): m / BR row blocks, route_ptr = m_indices, the expert of each
    row (-1 = padding). Masked (MASKED=1): G * row_slots program rows, route_ptr = masked_m,
    the valid rows of each expert's max_m-row slab (`_grouped_rows`). Grid: program rows x N
    tiles, one axis (`tile_ids`). w_desc: the packed words as
    ``[E * N, Kp / 8]``; s_desc: the scales as ``[E * Kp / 32, N]``."""
    BR: gl.constexpr = x_desc.block_type.shape[0]
    BW: gl.constexpr = w_desc.block_type.shape[0]
    pid_r, pid_n = tile_ids(N, BW, N_FASTEST)
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
    deq = gl.allocate_shared_memory(gl.bfloat16, [2 * GROUPS, BW, 32], deq_l)
    xs = gl.allocate_shared_memory(x_desc.dtype, [STAGES * GROUPS, BR, 32], x_desc.layout)
    wring, sring, ready = weight_ring(w_desc, s_desc, STAGES)

    nk = gl.cdiv(K, 256)
    wrow = e * N + n0
    srow = e * nk * 8
    step_bytes: gl.constexpr = GROUPS * x_desc.block_type.nbytes + w_desc.block_type.nbytes + s_desc.block_type.nbytes
    for i in gl.static_range(STAGES - 1):  # prologue: steps 0 .. STAGES-2 in flight
        live = i < nk
        mbarrier.expect(ready.index(i), step_bytes, pred=live)
        load_weight_step(w_desc, s_desc, wrow, srow, n0, i, ready.index(i), wring, sring, i, live)
        for g in gl.static_range(GROUPS):
            tma.async_copy_global_to_shared(x_desc, [r0, i * 256 + g * 32], ready.index(i),
                                            xs.index(i * GROUPS + g), pred=live)

    acc = gl.zeros([BW, BR], gl.float32, mma)
    for kt in range(nk):
        s = kt % STAGES
        p = kt % 2
        mbarrier.wait(ready.index(s), (kt // STAGES) & 1)
        dequant_step(wring, sring, s, deq, p, num_warps)
        acc = issue_step(deq, p, xs, s, acc)
        # retire step kt-1's eight products; step kt's stay on the tensor cores
        acc = warpgroup_mma_wait(num_outstanding=GROUPS, deps=(acc,))
        nxt = kt + STAGES - 1  # its stage held step kt-1: words read, products retired
        ns = nxt % STAGES
        live = nxt < nk
        mbarrier.expect(ready.index(ns), step_bytes, pred=live)
        load_weight_step(w_desc, s_desc, wrow, srow, n0, nxt, ready.index(ns), wring, sring, ns, live)
        for g in gl.static_range(GROUPS):
            tma.async_copy_global_to_shared(x_desc, [r0, nxt * 256 + g * 32], ready.index(ns),
                                            xs.index(ns * GROUPS + g), pred=live)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    _grouped_store(acc, c_ptr, route_ptr, r0, n0, e, max_m, valid, N, stride_cm, MASKED, num_warps)


@gluon.jit
def _grouped_rs_block(x_desc, w_desc, s_desc, c_ptr, route_ptr, r0, e, n0, N, K, max_m, valid, stride_cm,
                      STAGES: gl.constexpr, MASKED: gl.constexpr, SPLIT_ACC: gl.constexpr, num_warps: gl.constexpr,
                      WARP_SPECIALIZE: gl.constexpr = False, QUARTER: gl.constexpr = False,
                      GROUP_LOOP: gl.constexpr = False, HALF_ACTS: gl.constexpr = False):
    """One row block's tile on `rs_mainloop` (`ws_mainloop` with WARP_SPECIALIZE): rows ``r0 ..``
    (as many as `x_desc`'s box) by TMA, multiplied and stored; with QUARTER (warp-specialized
    four-warpgroup tiles) only the first three quarters of them (`tiles.RegisterATile.ws_tails`)."""
    BR: gl.constexpr = x_desc.block_type.shape[1]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR // 2 if QUARTER else BR, 16])
    srow = e * gl.cdiv(K, 256) * 8
    if QUARTER:
        mma2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BR // 4, 16])
        acc, acc2 = ws_mainloop(x_desc, w_desc, s_desc, r0, e * N + n0, srow, n0, K, mma, BR, STAGES, False,
                                 x_l=mma, mma2=mma2)
        _grouped_store(acc2, c_ptr, route_ptr, r0 + BR // 2, n0, e, max_m, valid, N, stride_cm, MASKED, num_warps)
    elif WARP_SPECIALIZE:
        acc = ws_mainloop(x_desc, w_desc, s_desc, r0, e * N + n0, srow, n0, K, mma, BR, STAGES, False,
                           x_l=mma)[0]  # x_l: any layout, no gather
    else:
        acc = rs_mainloop(x_desc, 0, 0, w_desc, s_desc, r0, e * N + n0, srow, n0, K, mma, BR, STAGES, False, mma,
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
    (``wgmma ... {a regs}, [b smem]``, `rs_mainloop`): no shared-memory round trip, no fence,
    and 64 to 256 weight rows a CTA (one, two or four warpgroups) over one activation tile, so
    the activation bytes re-read from L2 per FLOP fall with the weight rows. Same grid and
    routing as `_w4a16_grouped_sm90_kernel`.
    HALF_TAIL (masked): a row block whose second half holds no live row (the expert's count ends
    in its first half) runs the half-row tile, its activations through `xh_desc` (box of BR / 2
    rows), so its wgmmas do not multiply rows that are never stored (`tiles.RegisterATile.half_tail`);
    `xh_desc` is unused otherwise. QUARTER_TAIL (masked, warp-specialized four-warpgroup tiles): a
    block whose live rows end in its first three quarters multiplies only those
    (`tiles.RegisterATile.ws_tails`). GROUP_LOOP: one K group at a time (`tiles.GROUP_LOOP_MAXNREG`)."""
    BR: gl.constexpr = x_desc.block_type.shape[1]
    BW: gl.constexpr = w_desc.block_type.shape[0]
    gl.static_assert(MASKED or not HALF_TAIL, "HALF_TAIL: masked layout only")
    gl.static_assert(MASKED and WARP_SPECIALIZE or not QUARTER_TAIL, "QUARTER_TAIL: masked, warp-specialized")
    pid_r, pid_n = tile_ids(N, BW, N_FASTEST)
    e, base, first, stop, step, valid = _grouped_rows(route_ptr, pid_r, row_slots, max_m, BR, MASKED)
    n0 = pid_n * BW
    if WARP_SPECIALIZE:  # one row block a program (the launcher's row_slots: every block of max_m):
        # the loop below ran 5% slower here (H200, 2026-11-30, d6f4573: EP32 masked 32 tok/expert, 128x64)
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
def _rs_split_mainloop(x_desc, x2_desc, w_desc, s_desc, r0, wrow, srow, n0, K, mma: gl.constexpr, mma2: gl.constexpr,
                       STAGES: gl.constexpr):
    """`mainloop._rs_groups_mainloop` (grouped layouts, TMA activations) for a row tile that is not a power
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
    xs = act_ring(x_desc, BR_HI, STAGES, False)
    xs2 = act_ring(x2_desc, BR_LO, STAGES, False)
    wring, sring, wready = weight_ring(w_desc, s_desc, STAGES)
    xready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(xready.index(i), count=1)
    act_bytes: gl.constexpr = x_desc.block_type.nbytes + x2_desc.block_type.nbytes

    nk = gl.cdiv(K, 256)
    for i in gl.static_range(STAGES):
        load_weights(w_desc, s_desc, wrow, srow, n0, i, wready.index(i), wring, sring, i, i < nk)
        # one expect for both boxes: an expect is an arrive, and the barrier counts one
        mbarrier.expect(xready.index(i), act_bytes, pred=i < nk)
        tma.async_copy_global_to_shared(x_desc, [i * GROUPS, r0, 0], xready.index(i), stage_boxes(xs, i), pred=i < nk)
        tma.async_copy_global_to_shared(x2_desc, [i * GROUPS, r0 + BR_HI, 0], xready.index(i), stage_boxes(xs2, i),
                                        pred=i < nk)

    acc = gl.zeros([BW, BR_HI], gl.float32, mma)
    acc2 = gl.zeros([BW, BR_LO], gl.float32, mma2)
    # `_rs_groups_mainloop`'s four-warpgroup schedule: group 0 of a step dequantized under the
    # previous step's last products, issued before the refill
    mbarrier.wait(wready.index(0), 0)
    words = wring.index(0).load(dot_a)
    nxt = dequant_group_regs(words, sring.index(0)._reinterpret(gl.bfloat16, [8 * BW], flat), 0, rows_l)
    for kt in range(nk):
        s = kt % STAGES
        mbarrier.wait(xready.index(s), (kt // STAGES) & 1)
        acc = warpgroup_mma(nxt, xs.index(s * GROUPS).permute((1, 0)), acc, is_async=True)
        acc2 = warpgroup_mma(gl.convert_layout(nxt, dot_a2), xs2.index(s * GROUPS).permute((1, 0)), acc2,
                             is_async=True)
        prev = nxt
        if kt > 0:  # every warpgroup is done with step kt-1's stage (the barrier below)
            sp = (kt - 1) % STAGES
            fill = kt - 1 + STAGES
            load_weights(w_desc, s_desc, wrow, srow, n0, fill, wready.index(sp), wring, sring, sp, fill < nk)
            mbarrier.expect(xready.index(sp), act_bytes, pred=fill < nk)
            tma.async_copy_global_to_shared(x_desc, [fill * GROUPS, r0, 0], xready.index(sp), stage_boxes(xs, sp),
                                            pred=fill < nk)
            tma.async_copy_global_to_shared(x2_desc, [fill * GROUPS, r0 + BR_HI, 0], xready.index(sp),
                                            stage_boxes(xs2, sp), pred=fill < nk)
        scales = sring.index(s)._reinterpret(gl.bfloat16, [8 * BW], flat)
        for g in gl.static_range(1, GROUPS):
            w = dequant_group_regs(words, scales, g, rows_l)
            done = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, prev))
            acc = done[0]
            acc2 = done[1]
            acc = warpgroup_mma(w, xs.index(s * GROUPS + g).permute((1, 0)), acc, is_async=True)
            acc2 = warpgroup_mma(gl.convert_layout(w, dot_a2), xs2.index(s * GROUPS + g).permute((1, 0)), acc2,
                                 is_async=True)
            prev = w
        s1 = (kt + 1) % STAGES
        mbarrier.wait(wready.index(s1), ((kt + 1) // STAGES) & 1, pred=kt + 1 < nk)
        words = wring.index(s1).load(dot_a)
        nxt = dequant_group_regs(words, sring.index(s1)._reinterpret(gl.bfloat16, [8 * BW], flat), 0, rows_l)
        done = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, prev))
        acc = done[0]
        acc2 = done[1]
        gl.thread_barrier()  # every warpgroup is done with stage s
    rs_rings_done(wready, xready, STAGES, False)
    return unscaled(acc), unscaled(acc2)


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
    (`rs_mainloop`, one accumulator: no BR_LO wgmmas over rows that are never stored;
    `tiles.SplitTile.hi_tail`).
    WARP_SPECIALIZE (BR_LO = BR_HI / 2: `tiles.SplitTile.ws`): `ws_mainloop` over a ring of
    2 * BR_HI rows (`x2_desc`'s box), of which the tile is the first three quarters (the
    three-quarter tail of `_ws_groups_partition`); its HI_TAIL the BR_HI-row tile
    warp-specialized too."""
    BR_HI: gl.constexpr = x_desc.block_type.shape[1]
    BR_LO: gl.constexpr = x2_desc.block_type.shape[1] // 4 if WARP_SPECIALIZE else x2_desc.block_type.shape[1]
    gl.static_assert(not WARP_SPECIALIZE or 4 * BR_LO == 2 * BR_HI, "WARP_SPECIALIZE: x2_desc boxes 2 * BR_HI rows")
    BW: gl.constexpr = w_desc.block_type.shape[0]
    pid_r, pid_n = tile_ids(N, BW, N_FASTEST)
    e, base, first, stop, _, valid = _grouped_rows(route_ptr, pid_r, row_slots, max_m, BR_HI + BR_LO, MASKED)
    n0 = pid_n * BW
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR_HI, 16])
    mma2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                   instr_shape=[16, BR_LO, 16])
    # one row block a program (the launcher's row_slots: every block of max_m); the loop of the
    # other kernels measured 2% slower here (H200, 2026-11-30, c010493: masked 64 tok/expert, 256x80)
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


def w4a16_grouped_sm90_launch(a: torch.Tensor, w, route: torch.Tensor, out: torch.Tensor, tile: tuple,
                              max_m: int = 0, regs_a: bool = False, warp_specialize: bool = False,
                              row_slots: int = 0) -> None:
    """Launch on operands `lowbit.kernels.w4a16.grouped` has validated (N a multiple of 8: TMA row
    strides). Contiguous (``max_m == 0``): a ``bf16 [m, K]``, route = m_indices ``int32 [m]``.
    Masked (``max_m > 0``): a the flat ``bf16 [G * max_m, K]``, route = masked_m ``int32 [G]``,
    and `row_slots` programs an expert for each N tile (0: one a row block of max_m, the only
    grid of the warp-specialized kernel, which does not loop over row blocks). w: the layout's
    `W4A16Weight`; out ``bf16 [rows, N]``; tile one of `tiles.GLUON_TILES` (or with `regs_a`, the
    register-A kernel, of `tiles.GLUON_RS_TILES`; with `warp_specialize` too, of `GLUON_WS_TILES`)."""
    if warp_specialize and row_slots:
        raise ValueError("the warp-specialized grouped kernel runs one program a row block of max_m: row_slots=0")
    bw, br, warps, stages = tile
    rows = a.shape[0]
    extra = _rs_constexprs(tile, warp_specialize, bool(max_m)) if regs_a else {}
    if regs_a:
        x_desc = act_desc(a, w.k, br, 4 if extra.get("HALF_ACTS") else 8)
        xh_desc = act_desc(a, w.k, br // 2) if extra["HALF_TAIL"] else x_desc
    else:
        x_desc = TensorDescriptor(a, [rows, w.k], [a.stride(0), 1], [br, 32], act_layout(br))
    w_desc, s_desc = weight_descs(w, bw)
    slots = checked_row_slots(max_m, br, row_slots)
    blocks = w.num_experts * slots if max_m else rows // br
    kernel = _w4a16_grouped_rs_kernel if regs_a else _w4a16_grouped_sm90_kernel
    if regs_a and (cap := _rs_maxnreg(tile, extra)):
        extra["maxnreg"] = cap
    fastest = n_fastest(br)
    descs = (x_desc, xh_desc) if regs_a else (x_desc,)
    kernel[program_grid(blocks, triton.cdiv(w.n, bw), fastest)](
        *descs, w_desc, s_desc, out, route, w.n, w.k, max_m, out.stride(0), slots,
        STAGES=stages, MASKED=bool(max_m), N_FASTEST=fastest, num_warps=warps, **extra,
    )


def checked_row_slots(max_m: int, rows: int, row_slots: int) -> int:
    """The programs an expert of a masked grid of `rows`-row tiles: `row_slots`, 0 for one a row
    block of max_m (contiguous: 1, unused); out of range raises."""
    if not max_m:
        return 1  # contiguous: unused
    all_blocks = triton.cdiv(max_m, rows)
    if row_slots < 0 or row_slots > all_blocks:
        raise ValueError(f"row_slots must be in 0..{all_blocks} (cdiv(max_m={max_m}, {rows})), got {row_slots}")
    return row_slots or all_blocks


def w4a16_grouped_split_launch(a: torch.Tensor, w, route: torch.Tensor, out: torch.Tensor, tile: tuple, max_m: int,
                               warp_specialize: bool = False) -> None:
    """`w4a16_grouped_sm90_launch` for a tile of `tiles.GLUON_SPLIT_TILES` (masked only: contiguous
    segments are 128-row aligned, which a 48- to 96-row tile does not divide): one program a
    row block of max_m (the kernel does not loop over an expert's blocks); `warp_specialize`:
    its `ws_mainloop` form (a tile of `tiles.GLUON_SPLIT_WS_TILES`)."""
    bw, br, warps, stages = tile
    if not max_m:
        raise ValueError(f"the {br}-row split tiles are masked-only (contiguous segments are 128-row aligned)")
    if warp_specialize and tuple(tile) not in GLUON_SPLIT_WS_TILES:
        raise ValueError(f"split tile {tile} has no warp-specialized form ({GLUON_SPLIT_WS_TILES})")
    form = split_form(tile)
    if form is None:
        raise ValueError(f"{tile} is not a split tile ({GLUON_SPLIT_TILES})")
    hi, lo = split_rows(br)
    w_desc, s_desc = weight_descs(w, bw)
    slots = checked_row_slots(max_m, br, 0)
    _w4a16_grouped_split_kernel[program_grid(w.num_experts * slots, triton.cdiv(w.n, bw), True)](
        act_desc(a, w.k, hi), act_desc(a, w.k, 2 * hi if warp_specialize else lo), w_desc, s_desc, out, route, w.n,
        w.k, max_m, out.stride(0), slots, STAGES=stages, MASKED=True, N_FASTEST=True,
        HI_TAIL=form.hi_tail, WARP_SPECIALIZE=warp_specialize, num_warps=warps,
    )


def _rs_constexprs(tile, warp_specialize: bool, masked: bool) -> dict:
    """The register-A grouped kernel's variant constexprs for `tile` (launcher and compile tier)."""
    form = grouped_form(tile)
    return {"WARP_SPECIALIZE": warp_specialize, "SPLIT_ACC": form is not None and form.split_acc,
            "HALF_TAIL": masked and half_tail(tile, warp_specialize, "masked"),
            "QUARTER_TAIL": masked and quarter_tail(tile, warp_specialize, "masked"),
            "GROUP_LOOP": group_loop(tile, warp_specialize),
            "HALF_ACTS": half_acts(tile, warp_specialize, "masked" if masked else "contiguous")}


def _rs_maxnreg(tile, constexprs: dict) -> int | None:
    """The ptxas register cap of a register-A launch (launcher and compile tier): a group-loop
    tile's (`tiles.GROUP_LOOP_MAXNREG`), else the tile's own (`tiles.RegisterATile.maxnreg`), else none."""
    if constexprs.get("GROUP_LOOP"):
        return GROUP_LOOP_MAXNREG[tuple(tile)]
    form = grouped_form(tile)
    return form.maxnreg if form is not None and form.maxnreg else None


def compile_configs() -> list[KernelConfig]:
    """Every grouped Gluon tile the launchers run, for the compile tier (sm_90a)."""
    cfgs = []
    grouped = ([("", t) for t in GLUON_TILES] + [("_rs", t) for t in GLUON_RS_TILES]
               + [("_ws", t) for t in GLUON_WS_TILES])
    for kind, (bw, br, warps, stages) in grouped:
        rs = kind != ""
        probe = torch.empty(16, 64, dtype=torch.bfloat16)
        for masked in (False, True):
            tile = (bw, br, warps, stages)
            extra = _rs_constexprs(tile, kind == "_ws", masked) if rs else {}
            # the launcher's descriptor: a half step's box where the tile refills by halves
            x_desc = (act_desc(probe, 64, br, 4 if extra["HALF_ACTS"] else 8) if rs
                      else TensorDescriptor(probe, [16, 64], [64, 1], [br, 32], act_layout(br)))
            sig = {
                "x_desc": mangle_type(x_desc),
                **({"xh_desc": mangle_type(act_desc(probe, 64, br // 2 if extra["HALF_TAIL"] else br))} if rs else {}),
                **weight_desc_types(bw), "c_ptr": "*bf16", "route_ptr": "*i32", "N": "i32", "K": "i32",
                "max_m": "i32", "stride_cm": "i32", "row_slots": "i32", "STAGES": "constexpr", "MASKED": "constexpr",
                "N_FASTEST": "constexpr", "num_warps": "constexpr", **{k: "constexpr" for k in extra},
            }
            spill = grouped_form(tile).spill_bytes if rs and masked and extra["HALF_ACTS"] else 0
            cfgs.append(KernelConfig(
                f"w4a16_{'masked' if masked else 'contiguous'}_sm90_gluon{kind}"
                f"[BW={bw},BR={br},w={warps},stages={stages}]",
                _w4a16_grouped_rs_kernel if rs else _w4a16_grouped_sm90_kernel, sig,
                {"STAGES": stages, "MASKED": masked, "N_FASTEST": n_fastest(br), "num_warps": warps, **extra},
                num_warps=warps, num_stages=1, expect_sass=("HGMMA",),
                maxnreg=_rs_maxnreg(tile, extra) if rs else None, max_spill_bytes=spill,
                expect_ptx=(f"wgmma.wait_group.sync.aligned {0 if rs else GROUPS.value}",),
                unaligned=("N", "K", "max_m", "row_slots"),
                # the shared-memory engine (a comparison point, 0.35-0.84x the Triton kernel): ptxas
                # serializes its wgmmas (C7515), so its `wait_group 8` overlap never reaches the SASS
                allowed_ptxas=() if rs else ("C7515",)))
    for ws, (bw, br, warps, stages) in ([(False, t) for t in GLUON_SPLIT_TILES]
                                        + [(True, t) for t in GLUON_SPLIT_WS_TILES]):
        hi, lo = split_rows(br)
        probe = torch.empty(16, 64, dtype=torch.bfloat16)
        sig = {"x_desc": mangle_type(act_desc(probe, 64, hi)),
               "x2_desc": mangle_type(act_desc(probe, 64, 2 * hi if ws else lo)),
               **weight_desc_types(bw), "c_ptr": "*bf16", "route_ptr": "*i32", "N": "i32", "K": "i32",
               "max_m": "i32", "stride_cm": "i32", "row_slots": "i32", "STAGES": "constexpr", "MASKED": "constexpr",
               "N_FASTEST": "constexpr", "HI_TAIL": "constexpr", "WARP_SPECIALIZE": "constexpr",
               "num_warps": "constexpr"}
        cfgs.append(KernelConfig(
            f"w4a16_masked_sm90_gluon_{'ws_' if ws else ''}split[BW={bw},BR={br},w={warps},stages={stages}]",
            _w4a16_grouped_split_kernel,
            sig, {"STAGES": stages, "MASKED": True, "N_FASTEST": True,
                  "HI_TAIL": split_form((bw, br, warps, stages)).hi_tail, "WARP_SPECIALIZE": ws,
                  "num_warps": warps}, num_warps=warps,
            num_stages=1, expect_sass=("HGMMA",), expect_ptx=("wgmma.wait_group.sync.aligned 0",),
            unaligned=("N", "K", "max_m", "row_slots")))
    return cfgs
