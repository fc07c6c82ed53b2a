"""The warp-specialized register-A main loop (engine ``gluon_ws``): a producer partition issues
every load (TMA rows and weights; for the indexed layout a 4-warp producer gathers the routed
rows by cp.async, signalled with ``cp.async.mbarrier.arrive.noinc``) as soon as the consumers
release a stage by mbarrier, so no CTA barrier is left in the loop. The consumers run
`mainloop`'s arithmetic in the same order: bit-identical results. Two-warpgroup tiles, and
four-warpgroup ones with their half and three-quarter tails (`tiles.RegisterATile.ws_tails`).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..int4_gluon import unscaled
from .common import GROUPS, act_ring, dequant_group_regs, dequant_regs, issue_regs, load_weights, weight_ring
from .mainloop import load_acts
from .routed import gather_async, gathered_rows

__all__ = ["WS_GATHER_WARPS", "ws_mainloop"]

#: Registers of the producer warp (setmaxnreg): it only computes TMA coordinates.
_WS_LOAD_REGS = gl.constexpr(40)
#: ... and of the indexed kernel's producer, which also holds its lanes' routed-row pointers
#: (up to 16 rows a lane at 128-row blocks) for the cp.async gather.
_WS_GATHER_REGS = gl.constexpr(64)
#: Warps of the indexed kernel's producer partition: a 128-row block's step is 4096 16-byte
#: copies, 128 a lane for one warp.
WS_GATHER_WARPS = gl.constexpr(4)


@gluon.jit
def ws_mainloop(x_desc, w_desc, s_desc, r0, wrow, srow, n0, K, mma: gl.constexpr, BR: gl.constexpr,
                 STAGES: gl.constexpr, GATHER: gl.constexpr = False, a_ptr=0, sorted_ids_ptr=0, pid_m=0,
                 num_routes=0, top_k=0, stride_am=0, x_l: gl.constexpr = None, mma2: gl.constexpr = None):
    """`rs_mainloop` warp-specialized: a producer partition (`_ws_load_partition`) issues every
    load as soon as its stage is released, the consumer warpgroups only wait, dequantize and multiply.
    No CTA barrier is left in the loop, so the next step's loads are not held back by the
    slowest warpgroup's products, and each warpgroup runs at its own pace. Same arithmetic in
    the same order as `rs_mainloop`: bit-identical results. BR: the ring's rows. `mma2`: the three-quarter tail
    (`_ws_groups_partition`). Returns the consumers' tuple: ``(acc,)``, or ``(acc, acc2)``."""
    BW: gl.constexpr = w_desc.block_type.shape[0]
    xs = act_ring(x_desc, BR, STAGES, GATHER)
    wring, sring, wready = weight_ring(w_desc, s_desc, STAGES)
    wempty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    xready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    xempty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(wempty.index(i), count=1)
        mbarrier.init(xready.index(i), count=32 * WS_GATHER_WARPS.value if GATHER else 1)  # gather: one a lane
        mbarrier.init(xempty.index(i), count=1)
    # (the argument tuples are written out per call: Gluon cannot hold layouts in a tuple variable)
    if GATHER:  # the gather needs more lanes and registers (row pointers) than TMA issue does
        return gl.warp_specialize([
            (_ws_mma_partition, (xs, wring, sring, wready, wempty, xready, xempty, K, mma, BW, BR, STAGES, True,
                                 mma2)),
            (_ws_load_partition, (x_desc, w_desc, s_desc, xs, wring, sring, wready, wempty, xready, xempty, r0, wrow,
                                  srow, n0, K, STAGES, True, a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k,
                                  stride_am, BR, x_l)),
        ], [WS_GATHER_WARPS.value], [_WS_GATHER_REGS.value])
    else:
        return gl.warp_specialize([
            (_ws_mma_partition, (xs, wring, sring, wready, wempty, xready, xempty, K, mma, BW, BR, STAGES, False,
                                 mma2)),
            (_ws_load_partition, (x_desc, w_desc, s_desc, xs, wring, sring, wready, wempty, xready, xempty, r0, wrow,
                                  srow, n0, K, STAGES, False, a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k,
                                  stride_am, BR, x_l)),
        ], [1], [_WS_LOAD_REGS.value])


@gluon.jit
def _ws_mma_partition(xs, wring, sring, wready, wempty, xready, xempty, K, mma: gl.constexpr, BW: gl.constexpr,
                      BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr, mma2: gl.constexpr):
    """Consumer warpgroups of `ws_mainloop`: `_ws_groups_partition` for four-warpgroup tiles (and
    its three-quarter tail, `mma2`), `_ws_steps_partition` otherwise (the split `rs_mainloop`
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
    """Consumer warpgroups of `ws_mainloop` (up to two): `mainloop._rs_steps_mainloop`'s arithmetic (dequantize step k+1
    while step k's products run), with every stage released by mbarrier instead of refilled by
    these warps: the words and scales once dequantized (Gluon puts a barrier over the
    partition's warps before each arrive), the activations once their wgmmas retire."""
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    nk = gl.cdiv(K, 256)
    acc = gl.zeros([BW, BR], gl.float32, mma)
    mbarrier.wait(wready.index(0), 0)
    w0, w1, w2, w3, w4, w5, w6, w7 = dequant_regs(wring, sring, 0, dot_a)
    fence_async_shared()  # generic-proxy reads of the stage ordered before the producer's TMA refill
    mbarrier.arrive(wempty.index(0), count=1)
    for kt in range(nk - 1):
        s = kt % STAGES
        mbarrier.wait(xready.index(s), (kt // STAGES) & 1)
        if GATHER:  # cp.async wrote the rows through the generic proxy; wgmma reads through the async one
            fence_async_shared()
        acc = issue_regs(xs, s, acc, w0, w1, w2, w3, w4, w5, w6, w7)
        s1 = (kt + 1) % STAGES
        mbarrier.wait(wready.index(s1), ((kt + 1) // STAGES) & 1)
        v0, v1, v2, v3, v4, v5, v6, v7 = dequant_regs(wring, sring, s1, dot_a)
        fence_async_shared()
        mbarrier.arrive(wempty.index(s1), count=1)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
        mbarrier.arrive(xempty.index(s), count=1)
        w0, w1, w2, w3, w4, w5, w6, w7 = v0, v1, v2, v3, v4, v5, v6, v7
    sl = (nk - 1) % STAGES
    mbarrier.wait(xready.index(sl), ((nk - 1) // STAGES) & 1)
    if GATHER:
        fence_async_shared()
    acc = issue_regs(xs, sl, acc, w0, w1, w2, w3, w4, w5, w6, w7)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
    return (unscaled(acc),)  # a partition returns a tuple (Triton 3.6 flattens it)


@gluon.jit
def _ws_groups_partition(xs, wring, sring, wready, wempty, xready, xempty, K, mma: gl.constexpr, BW: gl.constexpr,
                         BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr, mma2: gl.constexpr = None):
    """Consumer warpgroups of `ws_mainloop` for four-warpgroup tiles: `mainloop._rs_groups_mainloop`'s
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
        prev = dequant_group_regs(words, scales, 0, rows_l)
        acc, acc2 = _issue_group_rows(prev, xs.index(s * GROUPS), acc, acc2, dot_a2, SPLIT)
        for g in gl.static_range(1, GROUPS):
            w = dequant_group_regs(words, scales, g, rows_l)
            acc, acc2 = _retire_group_rows(acc, acc2, prev, SPLIT)
            acc, acc2 = _issue_group_rows(w, xs.index(s * GROUPS + g), acc, acc2, dot_a2, SPLIT)
            prev = w
        fence_async_shared()  # generic-proxy reads of the stage ordered before the producer's TMA refill
        mbarrier.arrive(wempty.index(s), count=1)
        acc, acc2 = _retire_group_rows(acc, acc2, prev, SPLIT)
        mbarrier.arrive(xempty.index(s), count=1)
    if SPLIT:
        res = (unscaled(acc), unscaled(acc2))
    else:
        res = (unscaled(acc),)
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
def _ws_load_partition(x_desc, w_desc, s_desc, xs, wring, sring, wready, wempty, xready, xempty, r0, wrow, srow, n0,
                       K, STAGES: gl.constexpr, GATHER: gl.constexpr, a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k,
                       stride_am, BR: gl.constexpr, x_l: gl.constexpr):
    """Producer partition of `ws_mainloop`: step k's words + scales into stage k % STAGES as
    soon as the consumers released it, then its activations once those are released (the empty
    barriers start in phase 0, so waiting on phase 1 passes for the first STAGES steps): TMA
    boxes of rows ``r0 ..``, or with GATHER the routed rows (row ``id // top_k`` of route
    ``id``) by cp.async (`gather_async`: sentinels and the K tail zero-filled), each lane's
    copies of a step signalled on that stage's ready barrier (``cp.async.mbarrier.arrive.noinc``:
    the barrier counts the partition's lanes)."""
    nk = gl.cdiv(K, 256)
    for kt in range(nk):
        s = kt % STAGES
        ph = (kt // STAGES) & 1
        mbarrier.wait(wempty.index(s), ph ^ 1)
        load_weights(w_desc, s_desc, wrow, srow, n0, kt, wready.index(s), wring, sring, s, True)
        if GATHER:
            # the row pointers are re-derived every step (the ids hit L1): held across the loop,
            # a 128-row block's 16 pointers a lane spill the producer's registers
            row_ok, a_rows = gathered_rows(a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k, stride_am, BR, x_l)
            mbarrier.wait(xempty.index(s), ph ^ 1)
            gather_async(xs, s, a_rows, row_ok, kt, K, x_l)
            async_copy.mbarrier_arrive(xready.index(s), increment_count=False)
        else:
            mbarrier.wait(xempty.index(s), ph ^ 1)
            load_acts(x_desc, 0, 0, K, r0, kt, xready.index(s), xs, s, True, False, x_l)
