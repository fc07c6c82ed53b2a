"""Hopper (sm_90a) Gluon kernel of `sparse_attn` for d = 512: the KV gather in its own warps,
and two consumer warpgroups that take alternate blocks' scores and share each block's
``P kv`` by halves of d, so one's softmax runs under the other's products.

The portable kernel issues the gather of block j + 1, then waits, multiplies ``S = q kv^T``,
takes the online softmax and multiplies ``P kv`` for block j, all in the same eight warps:
few warps are eligible to issue and the DRAM bandwidth is far from used. Here the gather runs
in a producer partition and the two consumers overlap each other's softmax with products.

Design (one program = one query position x 64 heads x one share of the top-k slots, as the
portable kernel's grid; the same FP32 online softmax in base 2). Blocks come in pairs: block 2t
is WG0's, block 2t + 1 WG1's (the "seesaw" schedule of FlashMLA's Hopper kernels, written here
from its description, not its code):

- Shared memory: q as two ``[64, 256]`` halves of d (64 KB), two KV buffers of ``[BK, 512]``
  rows (buffer 0 always WG0's block, buffer 1 WG1's), each as two ``[BK, 256]`` halves with
  their own ready / empty barriers (128 KB), two bf16 P tiles (16 KB) and two row vectors for
  the exchanged maxima and the final row sums.
- Gather partition (4 warps): q first, then cp.async of each half buffer once its consumer
  released it, in the order the previous pair releases them (each lane's copies arrive on the
  half's ready barrier: ``cp.async.mbarrier.arrive.noinc``, the barrier counts the 128 lanes);
  empty slots -- masked, past the share, out of range -- are zero-filled, never read.
- WG0 (the default partition; left half of d of the output): ``S0 = q kv0^T`` (wgmma from
  shared memory, both halves of d), the online softmax of its block at ``m0 = max(m, rowmax
  S0)``; P0 (bf16, at m0) and m0 handed to WG1 through shared memory; ``acc += P0 kv0[:, :256]``
  (P0 from registers); then, with WG1's ``m1`` (>= m0) and P1 (at m1) in, acc rescaled to m1
  and ``acc += P1 kv1[:, :256]`` from WG1's tile.
- WG1 (a worker partition; right half): ``S1 = q kv1^T`` issued first; once P0 and m0 are in,
  acc rescaled to m0 and ``acc += P0 kv0[:, 256:]`` from WG0's tile, its own softmax at ``m1 =
  max(m0, rowmax S1)`` under that product, P1 and m1 handed back, acc rescaled to m1 and ``acc
  += P1 kv1[:, 256:]`` from registers. Both of buffer 0's halves are thus released mid-pair,
  and the gather refills them under the rest of it. Both warpgroups end a pair at the same
  max; their row sums are added once, in the epilogue, where each stores its half of d.
- Heads are padded to 64 (q rows past h load as zeros, never stored).
- Split top-k (decode): the last share of a query (highest grid z, so launched after the
  others: waiting on them cannot deadlock) folds the others' FP32 (acc, max, sum) records
  into its own and stores the output; no second kernel. Each warpgroup of the other shares
  writes its half of d as a thread-major record (coalesced), fences, and counts on a flag; the
  folding warpgroup polls until every writer thread counted, fences, reads, and re-zeroes the
  flag (flags cached per device and stream, so no memset a call).
- The buffers' and q's indices go through a zero the compiler cannot prove (``t // (npairs +
  1)``): with constant indices it hoisted all 32 wgmma descriptors of the scores out of the
  loop and spilled them.

Gluon does not run under the Triton interpreter, where the portable kernel stays the path.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..compile_tier import KernelConfig
from .portable import kernel_args
from .tiles import GLUON_TILES, HEADS

__all__ = ["compile_configs", "sparse_attn_sm90_launch"]
#: Registers (setmaxnreg) of the second consumer warpgroup and of the gather partition; the
#: first consumer (the default partition) gets what is left of the 64K.
_WG1_REGS = gl.constexpr(208)
_LOAD_WARPS = gl.constexpr(4)
_LOAD_REGS = gl.constexpr(72)
#: Exchange barriers between the consumer warpgroups (one arrive a partition each).
_P0_READY = gl.constexpr(0)  # WG0's max m0 (m_smem[0]) and its P at m0 (p_smem[0]) are in
_P1_READY = gl.constexpr(1)  # WG1's max m1 (>= m0) and its P at m1 are in
_P0_FREE = gl.constexpr(2)   # WG1 is done with p_smem[0] / m_smem[0]
_P1_FREE = gl.constexpr(3)   # WG0 is done with p_smem[1] / m_smem[1]
_L0 = gl.constexpr(4)        # row sums in l_smem (epilogue)
_L1 = gl.constexpr(5)
_NBARS = gl.constexpr(6)


@gluon.jit
def _fill(kv_base, idx, ok, cols, stride_kvn, kv_ring, ready, empty, buf: gl.constexpr, half: gl.constexpr, phase):
    """One half of d of a block's rows into ring slot ``2 * buf + half`` once its consumer
    released it (empty rows zero-filled, never read)."""
    DH: gl.constexpr = kv_ring.shape[2]
    src = kv_base + idx.to(gl.int64)[:, None] * stride_kvn + (cols + half * DH)[None, :]
    mbarrier.wait(empty.index(2 * buf + half), phase)
    async_copy.async_copy_global_to_shared(kv_ring.index(2 * buf + half), src, mask=ok[:, None])
    async_copy.mbarrier_arrive(ready.index(2 * buf + half), increment_count=False)


@gluon.jit
def _gather_partition(kv_base, idx_base, N, lo, hi, npairs, stride_kvn, kv_ring, ready, empty,
                      q_base, stride_qh, heads_left, q_smem, q_bar, BK: gl.constexpr):
    """Producer: pair t's blocks 2t (WG0's, buffer 0) and 2t + 1 (WG1's, buffer 1), half
    buffers in the order the previous pair released them: buffer 0 mid-pair (WG0's own product
    and WG1's product on WG0's P both finish around WG1's softmax), buffer 1 at its end
    (the empty barriers start in phase 0, so waiting on phase 1 passes for the first pair).
    Slots past ``hi`` (the odd block of a pair) zero-fill."""
    DH: gl.constexpr = kv_ring.shape[2]
    g_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [_LOAD_WARPS, 1], [1, 0])  # 16-byte copies
    rows = gl.arange(0, BK, layout=gl.SliceLayout(1, g_l))
    cols = gl.arange(0, DH, layout=gl.SliceLayout(0, g_l))
    # q first, by the same copies (rows past h zero-filled): its load overlaps the first
    # blocks' instead of preceding them
    q_rows = gl.arange(0, q_smem.shape[1], layout=gl.SliceLayout(1, g_l))
    q_src = q_base + q_rows[:, None] * stride_qh + cols[None, :]
    for half in gl.static_range(2):
        async_copy.async_copy_global_to_shared(q_smem.index(half), q_src + half * DH,
                                               mask=(q_rows < heads_left)[:, None])
    async_copy.mbarrier_arrive(q_bar, increment_count=False)
    for t in range(npairs):
        phase = (t & 1) ^ 1
        slot0 = lo + 2 * t * BK + rows
        slot1 = slot0 + BK
        idx0 = gl.load(idx_base + slot0, mask=slot0 < hi, other=-1)
        idx1 = gl.load(idx_base + slot1, mask=slot1 < hi, other=-1)
        ok0 = (idx0 >= 0) & (idx0 < N)
        ok1 = (idx1 >= 0) & (idx1 < N)
        _fill(kv_base, idx0, ok0, cols, stride_kvn, kv_ring, ready, empty, 0, 0, phase)
        _fill(kv_base, idx0, ok0, cols, stride_kvn, kv_ring, ready, empty, 0, 1, phase)
        _fill(kv_base, idx1, ok1, cols, stride_kvn, kv_ring, ready, empty, 1, 1, phase)
        _fill(kv_base, idx1, ok1, cols, stride_kvn, kv_ring, ready, empty, 1, 0, phase)


@gluon.jit
def _scores_issue(q_smem, kv_ring, ready, buf, z, phase, s_l: gl.constexpr, FIRST: gl.constexpr):
    """Issue ``S = q kv^T`` of the block in buffer `buf` (half FIRST of d first: the one the
    gather refills first) as two async wgmma groups. `z` is a zero the compiler cannot prove
    (``t // (npairs + 1)``) that `buf` and q's half index carry: with constant indices it hoists
    all 32 wgmma descriptors out of the loop, 64 registers it then spills."""
    BK: gl.constexpr = kv_ring.shape[1]
    HT: gl.constexpr = q_smem.shape[1]
    qh = FIRST + z
    mbarrier.wait(ready.index(2 * buf + FIRST), phase)
    s = warpgroup_mma(q_smem.index(qh), kv_ring.index(2 * buf + FIRST).permute((1, 0)),
                      gl.zeros([HT, BK], gl.float32, s_l), use_acc=False, is_async=True)
    mbarrier.wait(ready.index(2 * buf + 1 - FIRST), phase)
    return warpgroup_mma(q_smem.index(1 - qh), kv_ring.index(2 * buf + 1 - FIRST).permute((1, 0)), s, is_async=True)


@gluon.jit
def _slot_mask(idx_base, N, lo, hi, j, BK: gl.constexpr, s_l: gl.constexpr):
    """Block j's slot validity ``[BK]`` in the score layout's columns: loaded once a slot, then
    spread (not once per column a thread holds)."""
    slot = lo + j * BK + gl.arange(0, BK, layout=gl.BlockedLayout([1], [32], [4], [0]))
    idx = gl.load(idx_base + slot, mask=slot < hi, other=-1)
    return gl.convert_layout((idx >= 0) & (idx < N), gl.SliceLayout(0, s_l))


#: A split share's record in the fold workspace (FP32): one consumer's ``[64, 256]`` acc, then
#: its 64 maxima and 64 row sums.
_REC = gl.constexpr(64 * 256 + 2 * 64)

# Cross-CTA hand-off of split shares (through L2, no second kernel), each step run once by every
# thread of a consumer warpgroup (`_flag_step`):
# - a writer: its share stores fenced, then one count on the flag (`_SIGNAL_PTX`);
# - the folder: poll until every writer thread counted ($2), then fence (`_WAIT_PTX`); its
#   workspace reads come after this side-effecting asm in program order, which neither LLVM
#   nor ptxas crosses;
# - the folder again, after its store: one more count; the thread whose count is the last
#   ($2 = writers' and folder's counts - 1) zeroes the flag for the next launch (`_DONE_PTX`).
#   Every thread passed its own wait before counting, and the count only grows until then.
# (The asm's output is unused: inline asm elementwise needs one.)
_SIGNAL_PTX = gl.constexpr("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.u32 [$1], 1;\n\tmov.u32 $0, 0;")
_WAIT_PTX = gl.constexpr("""{
\t.reg .pred %p;
\t.reg .u32 %v;
\tWAIT_SHARES:
\tld.relaxed.gpu.global.u32 %v, [$1];
\tsetp.lt.u32 %p, %v, $2;
\t@%p bra WAIT_SHARES;
\tfence.acq_rel.gpu;
\tmov.u32 $0, 0;
\t}""")
_DONE_PTX = gl.constexpr("""{
\t.reg .pred %p;
\tatom.relaxed.gpu.global.add.u32 $0, [$1], 1;
\tsetp.eq.u32 %p, $0, $2;
\t@%p st.relaxed.gpu.global.u32 [$1], 0;
\t}""")


@gluon.jit
def _flag_step(ptx: gl.constexpr, flag_ptr, value):
    """`ptx` on `flag_ptr` (operand $1, with `value` as $2) once by each of the warpgroup's 128
    threads."""
    one_l: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # one element a thread
    zero = gl.zeros([128], gl.int32, one_l)
    gl.inline_asm_elementwise(ptx, "=r,l,r", [flag_ptr + zero, zero + value], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _share_offsets(hh, cc, DH: gl.constexpr):
    """Where a share record keeps acc element (row, col) of the ``[64, DH]`` wgmma accumulator:
    thread-major (thread t's register pair j at ``2 (128 j + t)``), so that each store and load
    instruction of a warp covers 256 contiguous bytes instead of 32 bytes of 8 rows."""
    r = hh[:, None]
    c = cc[None, :]
    t = (r // 16) * 32 + (r % 8) * 4 + (c % 8) // 2  # the lane and warp holding (r, c)
    j = (c // 8) * 2 + (r % 16) // 8  # its register pair
    return (j * 128 + t) * 2 + c % 2


@gluon.jit
def _epilogue(acc, m_i, l_i, l_smem, bars, HALF: gl.constexpr, sink_ptr, out_ptr, rows0, H, stride_oh,
              ws_ptr, flag_ptr, rec0, pid_s, nsplit, FOLD: gl.constexpr):
    """A consumer's half of d: the two warpgroups' row sums added through shared memory, then
    the normalized bf16 rows. With FOLD (split top-k), shares ``0 .. nsplit - 2`` write their
    FP32 (acc, m, l) record to the workspace and count on the flag; the last share (launched
    after them, so waiting on them cannot deadlock) folds them into its own and stores."""
    o_l: gl.constexpr = acc.type.layout
    row_o: gl.constexpr = gl.SliceLayout(1, o_l)
    col_o: gl.constexpr = gl.SliceLayout(0, o_l)
    HT: gl.constexpr = acc.shape[0]
    DH: gl.constexpr = acc.shape[1]
    l_smem.slice(HALF * HT, HT).store(l_i)
    mbarrier.arrive(bars.index(_L0 + HALF), count=1)
    mbarrier.wait(bars.index(_L1 - HALF), 0)
    l_o = gl.convert_layout(l_i, row_o) + l_smem.slice((1 - HALF) * HT, HT).load(row_o)
    m_o = gl.convert_layout(m_i, row_o)
    hh = gl.arange(0, HT, layout=row_o)
    cc = gl.arange(0, DH, layout=col_o)
    rows = rows0 + hh
    dd = HALF * DH + cc
    if FOLD:
        off = _share_offsets(hh, cc, DH)
        if pid_s < nsplit - 1:
            rec = ws_ptr + (rec0 + 2 * pid_s + HALF).to(gl.int64) * _REC
            gl.store(rec + off, acc)
            gl.store(rec + HT * DH + hh, m_o)
            gl.store(rec + HT * DH + HT + hh, l_o)
            _flag_step(_SIGNAL_PTX, flag_ptr + HALF, 0)
        else:
            _flag_step(_WAIT_PTX, flag_ptr + HALF, 128 * (nsplit - 1))
            m_all = m_o
            for w in range(nsplit - 1):
                rec = ws_ptr + (rec0 + 2 * w + HALF).to(gl.int64) * _REC
                m_all = gl.maximum(m_all, gl.load(rec + HT * DH + hh, cache_modifier=".cg"))
            sc = gl.exp2(m_o - m_all)
            acc = acc * sc[:, None]
            l_o = l_o * sc
            for w in range(nsplit - 1):
                rec = ws_ptr + (rec0 + 2 * w + HALF).to(gl.int64) * _REC
                sc = gl.exp2(gl.load(rec + HT * DH + hh, cache_modifier=".cg") - m_all)
                l_o += sc * gl.load(rec + HT * DH + HT + hh, cache_modifier=".cg")
                acc += sc[:, None] * gl.load(rec + off, cache_modifier=".cg")
            _store_rows(acc, m_all, l_o, sink_ptr, out_ptr, rows, dd, H, stride_oh)
            _flag_step(_DONE_PTX, flag_ptr + HALF, 128 * nsplit - 1)
    else:
        _store_rows(acc, m_o, l_o, sink_ptr, out_ptr, rows, dd, H, stride_oh)


@gluon.jit
def _store_rows(acc, m, l, sink_ptr, out_ptr, rows, dd, H, stride_oh):
    """``acc / (l + 2^(sink - m))`` as bf16 rows (heads past H not stored). The sink joins the
    denominator only; l = 0 only when every slot is empty and the sink is -inf (acc = 0 there:
    0 * 1, not 0 / 0)."""
    h_ok = rows < H
    sink = gl.load(sink_ptr + rows, mask=h_ok, other=float("-inf")) * 1.4426950408889634
    l = l + gl.exp2(sink - m)
    inv = 1.0 / gl.where(l > 0.0, l, 1.0)
    o = out_ptr + rows[:, None].to(gl.int64) * stride_oh + dd[None, :]
    gl.store(o, (acc * inv[:, None]).to(gl.bfloat16), mask=h_ok[:, None])


@gluon.jit
def _consumer_start(q_bar, HT: gl.constexpr, DH: gl.constexpr, s_l: gl.constexpr, o_l: gl.constexpr):
    """A consumer's running max and row sum ``[HT]`` (score rows) and its ``[HT, DH]`` FP32
    accumulator, once q is in shared memory."""
    mbarrier.wait(q_bar, 0)
    return (gl.full([HT], -1.0e30, gl.float32, gl.SliceLayout(1, s_l)), gl.zeros([HT], gl.float32, gl.SliceLayout(1, s_l)),
            gl.zeros([HT, DH], gl.float32, o_l))


@gluon.jit
def _attend_even(q_smem, q_bar, kv_ring, ready, empty, p_smem, m_smem, l_smem, bars, idx_base, N, lo, hi, npairs, qk_scale,
                 sink_ptr, out_ptr, rows0, H, stride_oh, ws_ptr, flag_ptr, rec0, pid_s, nsplit, FOLD: gl.constexpr,
                 s_l: gl.constexpr, o_l: gl.constexpr):
    """Consumer WG0 (the default partition; left half of d): block 2t's scores and softmax at
    ``m0 = max(m, rowmax S0)``, its P (bf16, at m0) and m0 handed to WG1, ``acc += P0
    kv0[:, :256]`` from registers; then, with WG1's ``m1`` and P1 (at m1), ``acc`` rescaled to
    m1 and ``acc += P1 kv1[:, :256]`` from WG1's tile."""
    BK: gl.constexpr = kv_ring.shape[1]
    HT: gl.constexpr = q_smem.shape[1]
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_l)
    row_o: gl.constexpr = gl.SliceLayout(1, o_l)
    m_i, l_i, acc = _consumer_start(q_bar, HT, kv_ring.shape[2], s_l, o_l)
    for t in range(npairs):
        phase = t & 1
        z = t // (npairs + 1)
        s = _scores_issue(q_smem, kv_ring, ready, z, z, phase, s_l, 0)
        ok = _slot_mask(idx_base, N, lo, hi, 2 * t, BK, s_l)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        s = gl.where(ok[None, :], s * qk_scale, float("-inf"))
        m0 = gl.maximum(m_i, gl.max(s, 1))
        p = gl.exp2(s - m0[:, None])
        alpha = gl.exp2(m_i - m0)
        l_i = l_i * alpha + gl.sum(p, 1)
        pb = p.to(gl.bfloat16)
        mbarrier.wait(bars.index(_P0_FREE), phase ^ 1)
        m_smem.slice(0, HT).store(m0)
        p_smem.index(0).store(pb)
        fence_async_shared()
        mbarrier.arrive(bars.index(_P0_READY), count=1)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        pa = gl.convert_layout(pb, p_l)
        acc = warpgroup_mma(pa, kv_ring.index(2 * z), acc, is_async=True)
        # under that product: WG1's max m1 (>= m0) after its block
        mbarrier.wait(bars.index(_P1_READY), phase)
        m_i = m_smem.slice(HT, HT).load(row_s)
        beta = gl.exp2(m0 - m_i)
        l_i = l_i * beta
        acc, pa = warpgroup_mma_wait(num_outstanding=0, deps=(acc, pa))
        mbarrier.arrive(empty.index(2 * z), count=1)  # its block's left half
        acc = acc * gl.convert_layout(beta, row_o)[:, None]
        acc = warpgroup_mma(p_smem.index(1), kv_ring.index(2 + 2 * z), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(2 + 2 * z), count=1)  # WG1's block's left half
        mbarrier.arrive(bars.index(_P1_FREE), count=1)
    _epilogue(acc, m_i, l_i, l_smem, bars, 0, sink_ptr, out_ptr, rows0, H, stride_oh, ws_ptr, flag_ptr, rec0, pid_s, nsplit,
              FOLD)


@gluon.jit
def _attend_odd(q_smem, q_bar, kv_ring, ready, empty, p_smem, m_smem, l_smem, bars, idx_base, N, lo, hi, npairs, qk_scale,
                sink_ptr, out_ptr, rows0, H, stride_oh, ws_ptr, flag_ptr, rec0, pid_s, nsplit, FOLD: gl.constexpr,
                s_l: gl.constexpr, o_l: gl.constexpr):
    """Consumer WG1 (a worker partition; right half of d): block 2t + 1's scores issued first;
    then, as soon as WG0's P0 and m0 are in, ``acc`` rescaled to m0 and ``acc += P0
    kv0[:, 256:]`` from WG0's tile, its own softmax (at ``m1 = max(m0, rowmax S1)``) under
    that product, P1 and m1 handed to WG0, ``acc`` rescaled to m1 and ``acc += P1 kv1[:, 256:]``
    from registers. WG0's block is thus released mid-pair, and the gather refills it under
    the rest of the pair."""
    BK: gl.constexpr = kv_ring.shape[1]
    HT: gl.constexpr = q_smem.shape[1]
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_l)
    row_o: gl.constexpr = gl.SliceLayout(1, o_l)
    m_i, l_i, acc = _consumer_start(q_bar, HT, kv_ring.shape[2], s_l, o_l)
    for t in range(npairs):
        phase = t & 1
        z = t // (npairs + 1)
        s = _scores_issue(q_smem, kv_ring, ready, 1 + z, z, phase, s_l, 1)
        ok = _slot_mask(idx_base, N, lo, hi, 2 * t + 1, BK, s_l)
        mbarrier.wait(bars.index(_P0_READY), phase)
        m0 = m_smem.slice(0, HT).load(row_s)
        alpha = gl.exp2(m_i - m0)
        # (the scores complete before acc is touched: with them in flight ptxas would insert
        # that wait itself, C7517)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        acc = warpgroup_mma(p_smem.index(0), kv_ring.index(1 + 2 * z), acc, is_async=True)
        s = gl.where(ok[None, :], s * qk_scale, float("-inf"))
        m1 = gl.maximum(m0, gl.max(s, 1))
        p = gl.exp2(s - m1[:, None])
        beta = gl.exp2(m0 - m1)
        l_i = l_i * (alpha * beta) + gl.sum(p, 1)
        m_i = m1
        pb = p.to(gl.bfloat16)
        mbarrier.wait(bars.index(_P1_FREE), phase ^ 1)
        m_smem.slice(HT, HT).store(m1)
        p_smem.index(1).store(pb)
        fence_async_shared()
        mbarrier.arrive(bars.index(_P1_READY), count=1)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(1 + 2 * z), count=1)  # WG0's block's right half
        mbarrier.arrive(bars.index(_P0_FREE), count=1)
        acc = acc * gl.convert_layout(beta, row_o)[:, None]
        pa = gl.convert_layout(pb, p_l)
        acc = warpgroup_mma(pa, kv_ring.index(3 + 2 * z), acc, is_async=True)
        acc, pa = warpgroup_mma_wait(num_outstanding=0, deps=(acc, pa))
        mbarrier.arrive(empty.index(3 + 2 * z), count=1)  # its block's right half
    _epilogue(acc, m_i, l_i, l_smem, bars, 1, sink_ptr, out_ptr, rows0, H, stride_oh, ws_ptr, flag_ptr, rec0, pid_s, nsplit,
              FOLD)


@gluon.jit
def _sparse_attn_sm90_kernel(
    q_ptr, kv_ptr, sink_ptr, idx_ptr, out_ptr,
    H, N, TOPK, S,
    stride_qb, stride_qs, stride_qh,
    stride_kvb, stride_kvn,
    stride_ib, stride_is,
    stride_ob, stride_os, stride_oh,
    qk_scale, slots_per_split, ws_ptr, flag_ptr,
    BK: gl.constexpr, STAGES: gl.constexpr, FOLD: gl.constexpr, num_warps: gl.constexpr,
):
    """Program (head tile of 64, query ``(b, s)``, top-k share); ``out_ptr`` bf16 ``[b, s, h,
    512]``; with FOLD (more than one share), ``ws_ptr`` FP32 records ``[tiles, shares - 1, 2,
    _REC]`` and ``flag_ptr`` int32 ``[tiles, 2]`` (zero between launches).
    Three partitions of one warpgroup each: WG0 (even blocks, left half of d), WG1 (odd
    blocks, right half), the gather."""
    gl.static_assert(STAGES == 2, "two KV buffers: one a consumer warpgroup")
    gl.static_assert(num_warps == 4, "the default partition is one warpgroup")
    D: gl.constexpr = 512
    DH: gl.constexpr = D // 2
    HT: gl.constexpr = 64
    # each consumer warpgroup's wgmma layouts: its block's scores [64, BK], its half of acc [64, 256]
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BK, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, DH, 16])
    pid_h = gl.program_id(0)
    pid_t = gl.program_id(1)
    pid_s = gl.program_id(2)
    bi = (pid_t // S).to(gl.int64)
    si = (pid_t % S).to(gl.int64)
    lo = pid_s * slots_per_split
    hi = gl.minimum(lo + slots_per_split, TOPK)
    npairs = gl.cdiv(hi - lo, 2 * BK)
    idx_base = idx_ptr + bi * stride_ib + si * stride_is
    kv_base = kv_ptr + bi * stride_kvb

    half_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HT, DH], gl.bfloat16)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [2, HT, DH], half_l)
    q_base = q_ptr + bi * stride_qb + si * stride_qs + (pid_h * HT).to(gl.int64) * stride_qh
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=32 * _LOAD_WARPS.value)  # the gather partition copies q
    kv_ring = gl.allocate_shared_memory(gl.bfloat16, [4, BK, DH], gl.NVMMASharedLayout.get_default_for([BK, DH],
                                                                                                      gl.bfloat16))
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [2, HT, BK], gl.NVMMASharedLayout.get_default_for([HT, BK],
                                                                                                     gl.bfloat16))
    vec_l: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])  # [2 * 64]: one row vector a warpgroup
    m_smem = gl.allocate_shared_memory(gl.float32, [2 * HT], vec_l)
    l_smem = gl.allocate_shared_memory(gl.float32, [2 * HT], vec_l)
    ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [_NBARS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(4):
        mbarrier.init(ready.index(i), count=32 * _LOAD_WARPS.value)  # one cp.async arrive a producer lane
        mbarrier.init(empty.index(i), count=1)  # one consumer partition frees each half buffer
    for i in gl.static_range(_NBARS):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()  # the barriers' initialization before any partition uses them

    dst = out_ptr + bi * stride_ob + si * stride_os
    tile = pid_t * gl.cdiv(H, HT) + pid_h  # (query, head tile)
    nsplit = gl.cdiv(TOPK, slots_per_split)  # the grid's third dimension
    rec0 = tile * 2 * (nsplit - 1)  # this tile's first share record
    flags = flag_ptr + tile * 2  # one flag a half of d
    gl.warp_specialize([
        (_attend_even, (q_smem, q_bar, kv_ring, ready, empty, p_smem, m_smem, l_smem, bars, idx_base, N, lo, hi, npairs,
                        qk_scale, sink_ptr, dst, pid_h * HT, H, stride_oh, ws_ptr, flags, rec0, pid_s, nsplit, FOLD,
                        s_l, o_l)),
        (_attend_odd, (q_smem, q_bar, kv_ring, ready, empty, p_smem, m_smem, l_smem, bars, idx_base, N, lo, hi, npairs,
                       qk_scale, sink_ptr, dst, pid_h * HT, H, stride_oh, ws_ptr, flags, rec0, pid_s, nsplit, FOLD,
                       s_l, o_l)),
        (_gather_partition, (kv_base, idx_base, N, lo, hi, npairs, stride_kvn, kv_ring, ready, empty, q_base,
                             stride_qh, H - pid_h * HT, q_smem, q_bar, BK)),
    ], [4, _LOAD_WARPS.value], [_WG1_REGS.value, _LOAD_REGS.value])


def sparse_attn_sm90_launch(q, kv, sink, topk_idxs, out, qk_scale: float, per: int, splits: int,
                            block_kv: int, stages: int) -> None:
    """Launch the Gluon kernel (operands validated by `sparse_attn`; d = 512, kv rows 16-byte
    aligned) into ``out`` (bf16 ``[b, s, h, 512]``); `per` slots a share (a multiple of
    block_kv). With ``splits > 1`` the shares fold in the kernel: an FP32 workspace of
    ``splits - 1`` records a head tile and half of d (65 KB each), and zeroed int32 flags."""
    b, s, h, _ = q.shape
    ws = flags = out  # unread without split shares
    if splits > 1:
        tiles = triton.cdiv(h, HEADS) * b * s
        ws = torch.empty(tiles * 2 * (splits - 1), _REC.value, dtype=torch.float32, device=q.device)
        flags = _fold_flags(q.device, tiles * 2)
    _sparse_attn_sm90_kernel[(triton.cdiv(h, HEADS), b * s, splits)](
        *kernel_args(q, kv, sink, topk_idxs, out, out, qk_scale, per), ws, flags,
        BK=block_kv, STAGES=stages, FOLD=splits > 1, num_warps=4,
    )


#: Fold flags per (device, stream): zero between launches (each launch's folding warpgroups
#: zero theirs), so no memset a call. Per stream, because two launches running at once must not
#: share flags.
#: H200, 2026-11-30, commit 5c4410f: the memset cost 1.9 us in a CUDA graph.
_FLAGS: dict[tuple[int, int], torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []  # kept alive: a captured CUDA graph may still use them


def _fold_flags(device: torch.device, n: int) -> torch.Tensor:
    key = (device.index if device.index is not None else torch.cuda.current_device(),
           torch.cuda.current_stream(device).cuda_stream)
    flags = _FLAGS.get(key)
    if flags is None or flags.numel() < n:
        if flags is not None:
            _OUTGROWN.append(flags)
        flags = _FLAGS[key] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return flags


def compile_configs() -> list[KernelConfig]:
    """Every tile of `GLUON_TILES`, unsplit and split, for the compile tier."""
    sig = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "sink_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*bf16",
           "H": "i32", "N": "i32", "TOPK": "i32", "S": "i32",
           "stride_qb": "i32", "stride_qs": "i32", "stride_qh": "i32",
           "stride_kvb": "i32", "stride_kvn": "i32",
           "stride_ib": "i32", "stride_is": "i32",
           "stride_ob": "i32", "stride_os": "i32", "stride_oh": "i32",
           "qk_scale": "fp32", "slots_per_split": "i32", "ws_ptr": "*fp32", "flag_ptr": "*i32",
           "BK": "constexpr", "STAGES": "constexpr", "FOLD": "constexpr", "num_warps": "constexpr"}
    cfgs = []
    for bk, stages in GLUON_TILES:
        for split in (False, True):
            cfgs.append(KernelConfig(
                f"sparse_attn_sm90[BK={bk},stages={stages}{',split' if split else ''}]", _sparse_attn_sm90_kernel,
                sig, {"BK": bk, "STAGES": stages, "FOLD": split, "num_warps": 4},
                num_warps=4, num_stages=1, expect_sass=("HGMMA", "LDGSTS"),
                unaligned=("H", "N", "TOPK", "S", "stride_ib", "stride_is", "slots_per_split")))
    return cfgs
