"""Hopper (sm_90a) Gluon kernel of `sparse_attn` for d = 512: the gather of KV rows in its own
warps, overlapped with the two products of the previous block.

Why it exists. The Triton kernel (`sparse_attn._sparse_attn_kernel`) runs one 197 KB CTA an SM
that issues the cp.async gather of block j + 1, then waits, multiplies ``S = q kv^T``, takes
the online softmax and multiplies ``P kv`` for block j, all in the same eight warps: ncu on
the H200 decode point (twelfth session) read 0.27 instructions issued a cycle per scheduler,
2 warps a scheduler of which 0.38 eligible, 35% of DRAM bandwidth, 83 us.

Design (one program = one query position x 64 heads x one share of the top-k slots, as the
Triton kernel's grid; the same FP32 online softmax in base 2 and the same workspace format
for split shares, folded by `sparse_attn._sparse_attn_combine_kernel`):

- A producer partition of 4 warps gathers each block's ``[BK, 512]`` bf16 rows by cp.async
  (masked slots -- empty, past the share, out of range -- are zero-filled, never read) into a
  ``STAGES``-deep ring in shared memory; each lane's copies arrive on the stage's ready barrier
  (``cp.async.mbarrier.arrive.noinc``: the barrier counts the partition's 128 lanes). A stage
  is refilled once the consumers release it (its empty barrier).
- The consumer partition is two warpgroups (8 warps) over the 64 heads: ``S = q kv^T``
  (wgmma, q and the block from shared memory, each warpgroup 32 of the block's slots), the
  online softmax over the whole row (the compiler exchanges the two halves' maxima and sums),
  ``P`` rounded to bf16 as the register A operand of ``acc += P kv`` (each warpgroup 256 of
  the 512 columns: a [64, 256] FP32 tile, 128 registers a thread). The block in shared memory
  serves both products (K-major for the first, N-major for the second), so each gathered row
  is read from HBM once per query for all heads.
- Heads are padded to 64 (q rows past h load as zeros, never stored).

Status: compiled for sm_90a by the compile tier (no spills: consumers 208 registers, the
producer 88); correct on the H200 (GPU tests); engine ``"gluon"`` of `sparse_attn`, its default
on sm_90 for d = 512 and more than 32 heads (``LOWBIT_SPARSE_ATTN_ENGINE`` overrides). H200,
twelfth session, beside the Triton kernel in one process (`scripts/probes/
sparse_attn_engines.py`): decode (b=64, h=64, top-k 2048) 65.2-66.1 us against 90.5 (split 2;
split 1 / 4: 90.7 / 88.5), prefill (b=1, s=1024) 709 against 1095; 32-slot blocks x 4 stages
80.5 / 984. What bounds it (decode, same probe): 64.4 us without the gather, 53.0 without
either product: the consumers' serial block sequence (scores, wait, two cross-warpgroup
exchanges, exp2, P through shared memory, PV, wait, release; about ten partition barriers a
block). Thirteenth session: the softmax row sums kept per element and reduced once after the
loop (one cross-warpgroup exchange a block fewer; 8 partition barriers a block in the PTX):
decode 65.3 -> 63.6 us, prefill 706.0 -> 663.6 (`sparse_attn_engines.py ab`, same process).
Passing P to the PV wgmma through shared memory as its A operand (stmatrix, 5 barriers a
block, 205 KB of shared memory) measured the same (63.9 / 657.5 us) and was not kept. Gluon
does not run under the Triton interpreter, where the Triton kernel stays the path.
"""

from __future__ import annotations

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

__all__ = ["GLUON_TILES", "HEADS", "HEAD_DIM", "compile_configs", "sparse_attn_sm90_launch"]

#: The only head dimension and head tile of this kernel (DeepSeek V4's MQA: d = 512).
HEAD_DIM = 512
HEADS = 64
#: (block_kv, stages) the kernel is built for: the KV ring is ``stages * block_kv`` KB beside
#: q's 64 KB.
GLUON_TILES = ((64, 2), (32, 4))
#: Producer partition: warps and registers (setmaxnreg); the consumers get the rest.
_LOAD_WARPS = gl.constexpr(4)
_LOAD_REGS = gl.constexpr(88)


@gluon.jit
def _gather_partition(kv_base, idx_base, N, lo, hi, stride_kvn, kv_ring, ready, empty,
                      BK: gl.constexpr, STAGES: gl.constexpr):
    """Producer: block j's rows into stage j % STAGES once the consumers released it (the empty
    barriers start in phase 0, so waiting on phase 1 passes for the first STAGES blocks)."""
    D: gl.constexpr = kv_ring.shape[2]
    g_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [_LOAD_WARPS, 1], [1, 0])  # 16-byte copies
    rows = gl.arange(0, BK, layout=gl.SliceLayout(1, g_l))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, g_l))
    nblk = gl.cdiv(hi - lo, BK)
    for j in range(nblk):
        st = j % STAGES
        mbarrier.wait(empty.index(st), ((j // STAGES) & 1) ^ 1)
        slot = lo + j * BK + rows
        idx = gl.load(idx_base + slot, mask=slot < hi, other=-1)
        ok = (idx >= 0) & (idx < N)
        src = kv_base + idx.to(gl.int64)[:, None] * stride_kvn + cols[None, :]
        async_copy.async_copy_global_to_shared(kv_ring.index(st), src, mask=ok[:, None])
        async_copy.mbarrier_arrive(ready.index(st), increment_count=False)


@gluon.jit
def _attend_partition(q_smem, kv_ring, ready, empty, idx_base, N, lo, hi, qk_scale,
                      BK: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """Consumers (two warpgroups): per block, scores, online softmax, ``acc += P kv``; returns
    the unnormalized ``acc [64, 512]`` and the running max / sum per head (log2 units)."""
    D: gl.constexpr = kv_ring.shape[2]
    HT: gl.constexpr = q_smem.shape[0]
    s_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BK // 2, 16])
    o_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, D // 2, 16])
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    slots = gl.arange(0, BK, layout=gl.SliceLayout(0, s_l))
    m_i = gl.full([HT], -1.0e30, gl.float32, gl.SliceLayout(1, s_l))
    # the row sums kept per element and reduced once after the loop: a row's 64 slots span both
    # warpgroups, so a per-block sum would cost a cross-warpgroup exchange (two barriers) a block
    l_blk = gl.zeros([HT, BK], gl.float32, s_l)
    acc = gl.zeros([HT, D], gl.float32, o_l)
    nblk = gl.cdiv(hi - lo, BK)
    for j in range(nblk):
        st = j % STAGES
        slot = lo + j * BK + slots
        idx = gl.load(idx_base + slot, mask=slot < hi, other=-1)
        ok = (idx >= 0) & (idx < N)
        mbarrier.wait(ready.index(st), (j // STAGES) & 1)
        blk = kv_ring.index(st)
        s = warpgroup_mma(q_smem, blk.permute((1, 0)), gl.zeros([HT, BK], gl.float32, s_l), use_acc=False)
        s = gl.where(ok[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_blk = l_blk * alpha[:, None] + p
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_l))[:, None]
        acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_l), blk, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(st), count=1)  # (Gluon syncs the partition's warps first)
    l_i = gl.sum(l_blk, 1)
    return acc, gl.convert_layout(m_i, gl.SliceLayout(1, o_l)), gl.convert_layout(l_i, gl.SliceLayout(1, o_l))


@gluon.jit
def _sparse_attn_sm90_kernel(
    q_ptr, kv_ptr, sink_ptr, idx_ptr, out_ptr,
    H, N, TOPK, S,
    stride_qb, stride_qs, stride_qh,
    stride_kvb, stride_kvn,
    stride_ib, stride_is,
    stride_ob, stride_os, stride_oh,
    qk_scale, slots_per_split,
    BK: gl.constexpr, STAGES: gl.constexpr, SPLIT_OUT: gl.constexpr, num_warps: gl.constexpr,
):
    """Program (head tile of 64, query ``(b, s)``, top-k share); ``out_ptr`` bf16 ``[b, s, h,
    512]`` or, with SPLIT_OUT, the FP32 workspace ``[b * s, splits, H, 514]`` (acc, m, l)."""
    D: gl.constexpr = 512
    HT: gl.constexpr = 64
    pid_h = gl.program_id(0)
    pid_t = gl.program_id(1)
    pid_s = gl.program_id(2)
    bi = (pid_t // S).to(gl.int64)
    si = (pid_t % S).to(gl.int64)
    lo = pid_s * slots_per_split
    hi = gl.minimum(lo + slots_per_split, TOPK)
    idx_base = idx_ptr + bi * stride_ib + si * stride_is
    kv_base = kv_ptr + bi * stride_kvb

    q_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    heads = pid_h * HT + gl.arange(0, HT, layout=gl.SliceLayout(1, q_l))
    dq = gl.arange(0, D, layout=gl.SliceLayout(0, q_l))
    q = gl.load(q_ptr + bi * stride_qb + si * stride_qs + heads[:, None] * stride_qh + dq[None, :],
                mask=(heads < H)[:, None], other=0.0)
    smem_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BK, D], gl.bfloat16)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [HT, D], gl.NVMMASharedLayout.get_default_for([HT, D], gl.bfloat16),
                                       q)
    kv_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BK, D], smem_l)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=32 * _LOAD_WARPS.value)  # one cp.async arrive a producer lane
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()  # q's generic-proxy store before the wgmmas read it

    acc, m_i, l_i = gl.warp_specialize([
        (_attend_partition, (q_smem, kv_ring, ready, empty, idx_base, N, lo, hi, qk_scale, BK, STAGES, num_warps)),
        (_gather_partition, (kv_base, idx_base, N, lo, hi, stride_kvn, kv_ring, ready, empty, BK, STAGES)),
    ], [_LOAD_WARPS.value], [_LOAD_REGS.value])

    o_l: gl.constexpr = acc.type.layout
    rows = pid_h * HT + gl.arange(0, HT, layout=gl.SliceLayout(1, o_l))
    dd = gl.arange(0, D, layout=gl.SliceLayout(0, o_l))
    h_ok = rows < H
    if SPLIT_OUT:
        row = (pid_t * gl.num_programs(2) + pid_s).to(gl.int64) * H + rows
        ws = out_ptr + row * (D + 2)
        gl.store(ws[:, None] + dd[None, :], acc, mask=h_ok[:, None])
        gl.store(ws + D, m_i, mask=h_ok)
        gl.store(ws + D + 1, l_i, mask=h_ok)
    else:
        # the sink joins the denominator only; l = 0 only when every slot is empty and the sink
        # is -inf (acc = 0 there: 0 * 1, not 0 / 0)
        sink = gl.load(sink_ptr + rows, mask=h_ok, other=float("-inf")) * 1.4426950408889634
        l_i = l_i + gl.exp2(sink - m_i)
        inv = 1.0 / gl.where(l_i > 0.0, l_i, 1.0)
        o = out_ptr + bi * stride_ob + si * stride_os + rows[:, None].to(gl.int64) * stride_oh + dd[None, :]
        gl.store(o, (acc * inv[:, None]).to(gl.bfloat16), mask=h_ok[:, None])


def sparse_attn_sm90_launch(q, kv, sink, topk_idxs, dst, out, qk_scale: float, per: int, splits: int,
                            block_kv: int, stages: int) -> None:
    """Launch the Gluon kernel (operands validated by `sparse_attn`; d = 512, kv rows 16-byte
    aligned): ``dst`` is ``out`` (bf16 ``[b, s, h, 512]``) or, with ``splits > 1``, the FP32
    workspace ``[b * s, splits, h, 514]``; `per` slots a share (a multiple of block_kv)."""
    from .sparse_attn import kernel_args  # noqa: PLC0415 (the Triton engine's module imports this one lazily)

    b, s, h, _ = q.shape
    _sparse_attn_sm90_kernel[(triton.cdiv(h, HEADS), b * s, splits)](
        *kernel_args(q, kv, sink, topk_idxs, dst, out, qk_scale, per),
        BK=block_kv, STAGES=stages, SPLIT_OUT=splits > 1, num_warps=8,
    )


def compile_configs():
    """Every tile of `GLUON_TILES`, unsplit and split, for the compile tier."""
    from .compile_tier import KernelConfig

    sig = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "sink_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*bf16",
           "H": "i32", "N": "i32", "TOPK": "i32", "S": "i32",
           "stride_qb": "i32", "stride_qs": "i32", "stride_qh": "i32",
           "stride_kvb": "i32", "stride_kvn": "i32",
           "stride_ib": "i32", "stride_is": "i32",
           "stride_ob": "i32", "stride_os": "i32", "stride_oh": "i32",
           "qk_scale": "fp32", "slots_per_split": "i32",
           "BK": "constexpr", "STAGES": "constexpr", "SPLIT_OUT": "constexpr", "num_warps": "constexpr"}
    cfgs = []
    for bk, stages in GLUON_TILES:
        for split in (False, True):
            cfgs.append(KernelConfig(
                f"sparse_attn_sm90[BK={bk},stages={stages}{',split' if split else ''}]", _sparse_attn_sm90_kernel,
                dict(sig, out_ptr="*fp32") if split else sig,
                {"BK": bk, "STAGES": stages, "SPLIT_OUT": split, "num_warps": 8},
                num_warps=8, num_stages=1, expect_sass=("HGMMA", "LDGSTS"),
                unaligned=("H", "N", "TOPK", "S", "stride_ib", "stride_is", "slots_per_split")))
    return cfgs
