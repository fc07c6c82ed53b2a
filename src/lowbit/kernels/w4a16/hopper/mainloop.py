"""The register-A main loops: a tile's K loop with the dequantized weights held in registers as
wgmma's A operand (``wgmma ... {a regs}, [b smem]``), shared by the grouped and indexed kernels.

- whole-step loop (`_rs_steps_mainloop`, up to 128 weight rows): step k + 1 is dequantized
  while step k's eight products run, then ``wait_group 0``; a stage's words are refilled as soon
  as they are dequantized, its activations once the products retire;
- group loop (`_rs_groups_mainloop`, four-warpgroup tiles and the one-warpgroup tiles of
  `tiles.GROUP_LOOP_MAXNREG`): one K group at a time under the previous group's wgmma;
- refill by halves (`_rs_halves_mainloop`, `tiles.RegisterATile.half_acts`): the group loop with
  one step of activations, refilled a half step at a time (more CTAs an SM).

Activations arrive by TMA (rows ``r0 ..``) or, with GATHER, as routed rows by cp.async (`routed`).
Every loop returns its accumulator through `int4_gluon.unscaled` (the subnormal form's 2^64).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from ....runtime.pdl import gl_release_next, gl_wait_prior
from ..int4_gluon import unscaled
from .common import (GROUPS, act_ring, dequant_group_regs, dequant_regs, issue_groups, issue_regs, load_weights,
                     stage_boxes, weight_ring)
from .routed import gather_async, gather_boxes

__all__ = ["load_acts", "rs_mainloop", "rs_rings_done"]


@gluon.jit
def load_acts(x_desc, a_rows, row_ok, K, r0, kt, bar, xs, st, pred, GATHER: gl.constexpr, x_l: gl.constexpr,
               K_TAIL: gl.constexpr = True):
    """Step `kt`'s activations into stage `st` of the activation ring: one TMA of the eight
    ``[BR, 32]`` boxes of rows ``r0 ..`` (`x_desc`: the 3-D group view of `act_desc`) arriving
    on `bar`, or, with GATHER, a cp.async gather of the routed row pointers `a_rows` (one commit
    group a step, waited for with ``async_copy.wait_group``; `bar` unused). One op either way:
    Triton's barrier pass puts a CTA barrier between two ops that signal the same mbarrier."""
    if GATHER:
        gather_async(xs, st, a_rows, row_ok & pred, kt, K, x_l, K_TAIL)
        async_copy.commit_group()
    else:
        mbarrier.expect(bar, x_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(x_desc, [kt * GROUPS, r0, 0], bar, stage_boxes(xs, st), pred=pred)


@gluon.jit
def _rs_rings(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, BR: gl.constexpr, STAGES: gl.constexpr,
              GATHER: gl.constexpr, x_l: gl.constexpr, ks, nk, PDL_WAIT: gl.constexpr = False,
              K_TAIL: gl.constexpr = True):
    """The register-A main loops' rings (activations, words + scales, one ready mbarrier a stage
    each) with steps 0 .. STAGES-1 in flight; with GATHER, this thread's copies of step 0 landed
    and fenced (every thread's once the caller passes a CTA barrier). Returns the rings, the
    barriers and the step count. Loop step i is K step ``ks + i`` of the `nk` this program
    runs (a K share; None: all of K). PDL_WAIT: the weight steps are issued first, then the
    wait on the previous kernel (`lowbit.runtime.pdl`, ``PDL=2``), then the activations."""
    xs = act_ring(x_desc, BR, STAGES, GATHER)
    wring, sring, wready = weight_ring(w_desc, s_desc, STAGES)
    xready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(xready.index(i), count=1)

    if nk is None:
        nk = gl.cdiv(K, 256)
    for i in gl.static_range(STAGES):
        load_weights(w_desc, s_desc, wrow, srow, n0, ks + i, wready.index(i), wring, sring, i, i < nk)
        if not PDL_WAIT:
            load_acts(x_desc, a_rows, row_ok, K, r0, ks + i, xready.index(i), xs, i, i < nk, GATHER, x_l, K_TAIL)
    if PDL_WAIT:  # the weights are constant: they travel while the previous kernel finishes
        gl_wait_prior()
        gl_release_next()
        for i in gl.static_range(STAGES):
            load_acts(x_desc, a_rows, row_ok, K, r0, ks + i, xready.index(i), xs, i, i < nk, GATHER, x_l, K_TAIL)
    if GATHER:
        async_copy.wait_group(STAGES - 1)
        fence_async_shared()
    return xs, wring, sring, wready, xready, nk


@gluon.jit
def rs_rings_done(wready, xready, STAGES: gl.constexpr, GATHER: gl.constexpr):
    if GATHER:
        async_copy.wait_group(0)  # no copy may outlive the CTA's shared memory
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(wready.index(i))
        mbarrier.invalidate(xready.index(i))


@gluon.jit
def rs_mainloop(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, mma: gl.constexpr,
                 BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr, x_l: gl.constexpr,
                 SPLIT_ACC: gl.constexpr = False, GROUP_LOOP: gl.constexpr = False, ks=0, nk=None,
                 PDL_WAIT: gl.constexpr = False, HALF_ACTS: gl.constexpr = False, K_TAIL: gl.constexpr = True):
    """The register-A main loop of a tile: up to 128 weight rows (one or two warpgroups) hold a
    whole step's fragments twice (`_rs_steps_mainloop`, which SPLIT_ACC gives two accumulators);
    four-warpgroup tiles (256 weight rows), and with GROUP_LOOP one-warpgroup tiles under a
    register cap (`tiles.GROUP_LOOP_MAXNREG`), dequantize one group at a time
    (`_rs_groups_mainloop`). Same arguments and result. `ks`, `nk`: the K share (default all of
    K). PDL_WAIT: `_rs_rings`'. HALF_ACTS (with GROUP_LOOP): one step of activations refilled by
    halves (`_rs_halves_mainloop`)."""
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
    return unscaled(acc)


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
    SPLIT_ACC: the odd groups accumulate apart (`issue_groups`), summed after the loop."""
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    BW: gl.constexpr = w_desc.block_type.shape[0]
    # step 0's rows landed (this thread's), visible to wgmma (every thread's) after the barrier
    xs, wring, sring, wready, xready, nk = _rs_rings(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K,
                                                     BR, STAGES, GATHER, x_l, ks, nk, PDL_WAIT)

    acc = gl.zeros([BW, BR], gl.float32, mma)
    acc2 = gl.zeros([BW, BR], gl.float32, mma)  # SPLIT_ACC only (loop-invariant, and dropped, otherwise)
    mbarrier.wait(wready.index(0), 0)
    w0, w1, w2, w3, w4, w5, w6, w7 = dequant_regs(wring, sring, 0, dot_a)
    gl.thread_barrier()  # every warp holds its step-0 fragments: stage 0's weights are free
    load_weights(w_desc, s_desc, wrow, srow, n0, ks + STAGES, wready.index(0), wring, sring, 0, STAGES < nk)
    for kt in range(nk - 1):
        s = kt % STAGES
        if not GATHER:
            mbarrier.wait(xready.index(s), (kt // STAGES) & 1)
        if SPLIT_ACC:
            acc, acc2 = issue_groups(xs, s, acc, acc2, (w0, w1, w2, w3, w4, w5, w6, w7), True)
        else:
            acc = issue_regs(xs, s, acc, w0, w1, w2, w3, w4, w5, w6, w7)
        # step kt+1 dequantized into registers while step kt's products run
        s1 = (kt + 1) % STAGES
        mbarrier.wait(wready.index(s1), ((kt + 1) // STAGES) & 1)
        v0, v1, v2, v3, v4, v5, v6, v7 = dequant_regs(wring, sring, s1, dot_a)
        if GATHER:  # step kt+1's rows: groups committed so far = STAGES + kt, the newest STAGES-2 may fly
            async_copy.wait_group(STAGES - 2)
            fence_async_shared()
        if SPLIT_ACC:
            acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, w0, w1, w2, w3, w4, w5, w6, w7))[:2]
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
        # every warpgroup is done with stage s's activations and stage s1's words
        gl.thread_barrier()
        load_acts(x_desc, a_rows, row_ok, K, r0, ks + kt + STAGES, xready.index(s), xs, s, kt + STAGES < nk, GATHER,
                   x_l)
        load_weights(w_desc, s_desc, wrow, srow, n0, ks + kt + 1 + STAGES, wready.index(s1), wring, sring, s1,
                      kt + 1 + STAGES < nk)
        w0, w1, w2, w3, w4, w5, w6, w7 = v0, v1, v2, v3, v4, v5, v6, v7
    sl = (nk - 1) % STAGES
    if not GATHER:
        mbarrier.wait(xready.index(sl), ((nk - 1) // STAGES) & 1)
    if SPLIT_ACC:
        acc, acc2 = issue_groups(xs, sl, acc, acc2, (w0, w1, w2, w3, w4, w5, w6, w7), True)
        acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, w0, w1, w2, w3, w4, w5, w6, w7))[:2]
        acc = acc + acc2
    else:
        acc = issue_regs(xs, sl, acc, w0, w1, w2, w3, w4, w5, w6, w7)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
    rs_rings_done(wready, xready, STAGES, GATHER)
    return acc


@gluon.jit
def _refill_stage(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, ks, kt, nk, wready, xready, wring, sring,
                  xs, STAGES: gl.constexpr, GATHER: gl.constexpr, x_l: gl.constexpr, K_TAIL: gl.constexpr = True):
    """Loop step `kt`'s stage of the rings refilled with step ``kt + STAGES`` (none past `nk`)."""
    s = kt % STAGES
    load_weights(w_desc, s_desc, wrow, srow, n0, ks + kt + STAGES, wready.index(s), wring, sring, s, kt + STAGES < nk)
    load_acts(x_desc, a_rows, row_ok, K, r0, ks + kt + STAGES, xready.index(s), xs, s, kt + STAGES < nk, GATHER, x_l,
               K_TAIL)


@gluon.jit
def _rs_groups_mainloop(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, mma: gl.constexpr,
                        BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr, x_l: gl.constexpr, ks, nk,
                        PDL_WAIT: gl.constexpr = False, K_TAIL: gl.constexpr = True):
    """`_rs_steps_mainloop` for four-warpgroup tiles (256 weight rows, 16 warps): half the activation
    bytes a FLOP of the 128-row tiles (each activation block read once for 256 weight rows).
    Also the one-warpgroup decode tiles of `tiles.GROUP_LOOP_MAXNREG`: 64 registers, eight CTAs an SM.
    At 16 warps a thread has 128 registers: the accumulator takes 64, so a step's fragments
    cannot be held twice (128) as `_rs_steps_mainloop` does; a step is dequantized one group at a time
    instead, group g + 1 while group g's wgmma runs (8 fragment registers each). Warp
    specialization is not offered: its producer warpgroup leaves a consumer 112 registers, and
    ptxas then serializes the wgmmas (C7512). Every warpgroup retires its products at the end
    of a step (an outstanding wgmma across the loop's back edge serializes them too: C7515),
    then a CTA barrier and the refill of the stage with step k + STAGES.

    Four-warpgroup tiles (EARLY_G0): that barrier lines up every warpgroup's idle gap (wait for
    the step's words, load them, dequantize group 0) on the one CTA of the SM, so group 0 of step
    k+1 is dequantized while step k's last products run, and issued right after the barrier,
    before the refill of step k's stage. Not for the one-warpgroup tiles, whose two to eight
    CTAs an SM already overlap their gaps.
    H200, 2026-12-01, d0a7cde: contiguous 128 rows/expert 256x128 gate_up 559.9 -> 527.3 with EARLY_G0; one warpgroup 0.94-1.00x."""
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
        nxt = dequant_group_regs(words, sring.index(0)._reinterpret(gl.bfloat16, [8 * BW], flat), 0, rows_l)
    for kt in range(nk):
        s = kt % STAGES
        if EARLY_G0:
            if not GATHER:
                mbarrier.wait(xready.index(s), (kt // STAGES) & 1)
            # group 0, dequantized under the previous step's last products, issued straight after
            # the CTA barrier and before the refill of the previous step's stage
            acc = warpgroup_mma(nxt, xs.index(s * GROUPS).permute((1, 0)), acc, is_async=True)
            prev = nxt
            if kt > 0:  # every warpgroup is done with step kt-1's stage (the barrier below)
                _refill_stage(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, ks, kt - 1, nk, wready,
                              xready, wring, sring, xs, STAGES, GATHER, x_l, K_TAIL)
        else:
            mbarrier.wait(wready.index(s), (kt // STAGES) & 1)
            if not GATHER:
                mbarrier.wait(xready.index(s), (kt // STAGES) & 1)
            words = wring.index(s).load(dot_a)
            prev = dequant_group_regs(words, sring.index(s)._reinterpret(gl.bfloat16, [8 * BW], flat), 0, rows_l)
            acc = warpgroup_mma(prev, xs.index(s * GROUPS).permute((1, 0)), acc, is_async=True)
        scales = sring.index(s)._reinterpret(gl.bfloat16, [8 * BW], flat)
        for g in gl.static_range(1, GROUPS):
            w = dequant_group_regs(words, scales, g, rows_l)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
            acc = warpgroup_mma(w, xs.index(s * GROUPS + g).permute((1, 0)), acc, is_async=True)
            prev = w
        if EARLY_G0:  # step k+1's group 0 while group 7's products run (past the last step: a stale stage, unused)
            s1 = (kt + 1) % STAGES
            mbarrier.wait(wready.index(s1), ((kt + 1) // STAGES) & 1, pred=kt + 1 < nk)
            words = wring.index(s1).load(dot_a)
            nxt = dequant_group_regs(words, sring.index(s1)._reinterpret(gl.bfloat16, [8 * BW], flat), 0, rows_l)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
        if GATHER:  # step k+1's rows: groups committed so far = STAGES + kt, the newest STAGES-2 may fly
            async_copy.wait_group(STAGES - 2)
            fence_async_shared()
        gl.thread_barrier()  # every warpgroup is done with stage s
        if not EARLY_G0:
            _refill_stage(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, ks, kt, nk, wready, xready,
                          wring, sring, xs, STAGES, GATHER, x_l, K_TAIL)
    rs_rings_done(wready, xready, STAGES, GATHER)
    return acc


@gluon.jit
def _load_half(x_desc, xh, h: gl.constexpr, a_rows, row_ok, K, r0, kt, bar, pred, GATHER: gl.constexpr,
               x_l: gl.constexpr):
    """Half `h` of K step `kt` (groups ``4h .. 4h+3``) into the ``[4, BR, 32]`` buffer `xh`: one
    TMA of a ``[4, BR, 32]`` box (`x_desc`, `act_desc` with ``groups=4``) arriving on `bar`, or,
    with GATHER, `gather_boxes`' cp.async of the routed rows as one commit group."""
    boxes = stage_boxes(xh, 0, 4)
    if GATHER:
        gather_boxes(boxes, a_rows, row_ok & pred, kt, K, x_l, 4 * h)
        async_copy.commit_group()
    else:
        mbarrier.expect(bar, x_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(x_desc, [kt * GROUPS + 4 * h, r0, 0], bar, boxes, pred=pred)


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
    three CTAs share an SM instead of two. Same arguments and result; without
    GATHER `x_desc`'s box is a half step (`act_desc` with ``groups=4``)."""
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows_l: gl.constexpr = gl.SliceLayout(1, dot_a)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    BW: gl.constexpr = w_desc.block_type.shape[0]
    # two allocations, not one: Triton's barrier pass then sees that a half's refill and the
    # other half's wgmmas touch different buffers (one buffer costs a CTA barrier more a half)
    if GATHER:
        x_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BR, 32], gl.bfloat16)
    else:
        x_sl: gl.constexpr = x_desc.layout
    xa = gl.allocate_shared_memory(gl.bfloat16, [4, BR, 32], x_sl)
    xb = gl.allocate_shared_memory(gl.bfloat16, [4, BR, 32], x_sl)
    xready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # TMA only
    for i in gl.static_range(2):
        mbarrier.init(xready.index(i), count=1)
    wring, sring, wready = weight_ring(w_desc, s_desc, STAGES)
    if nk is None:
        nk = gl.cdiv(K, 256)
    for i in gl.static_range(STAGES):
        load_weights(w_desc, s_desc, wrow, srow, n0, ks + i, wready.index(i), wring, sring, i, i < nk)
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
        prev = dequant_group_regs(words, scales, 0, rows_l)
        acc = warpgroup_mma(prev, xa.index(0).permute((1, 0)), acc, is_async=True)
        for g in gl.static_range(1, GROUPS):
            w = dequant_group_regs(words, scales, g, rows_l)
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
        load_weights(w_desc, s_desc, wrow, srow, n0, ks + kt + STAGES, wready.index(s), wring, sring, s,
                      kt + STAGES < nk)
        _load_half(x_desc, xb, 1, a_rows, row_ok, K, r0, ks + kt + 1, xready.index(1), more, GATHER, x_l)
    if GATHER:
        async_copy.wait_group(0)  # no copy may outlive the CTA's shared memory
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(wready.index(i))
    for i in gl.static_range(2):
        mbarrier.invalidate(xready.index(i))
    return acc
