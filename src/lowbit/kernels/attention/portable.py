"""Portable Triton kernels of `sparse_attn` (every tier, the interpreter included) and their
launcher; `kernel_args` is the runtime argument list both engines' kernels take.

Kernel design (one program = one query position ``(i, t)`` x one tile of ``HT`` heads):

- Heads are one MMA dimension, padded to 16 (``HT`` in 16 / 32 / 64; padded heads load
  q = 0 and are never stored).
- Loop over the top-k list ``BK`` slots at a time: load the indices, gather the ``[BK, d]``
  KV rows (a masked load: empty or out-of-range slots are not read), scores
  ``S = q @ kv^T`` in FP32 from bf16 operands over the full d, online softmax in FP32 (base 2,
  ``log2(e)`` folded into the scale), ``P`` rounded to bf16, ``acc += P @ kv``. The gathered
  block serves both MMAs from shared memory: KV bytes are read once per head tile.
- ``SWAP_AB`` computes the transposed products instead (``S^T = kv @ q^T``,
  ``acc^T[d, HT] += kv^T @ P^T``) so that the MMA's M side is the KV block / d (64 and 512
  rows) rather than the heads: Triton emits Hopper wgmma (HGMMA) only when M >= 64, so for
  16 and 32 heads this is what turns mma.sync into wgmma. With 64 heads both forms use wgmma.
- d stays whole in one program: split across programs, each would recompute the scores (they
  need the full d) and gather the full rows anyway; a two-pass design (scores to memory, then
  P @ V) would read the gathered KV twice, and the kernel is bound by those bytes. The
  ``[HT, 512]`` FP32 accumulator is spread over the warps instead (128 registers a thread at
  64 heads with 8 warps). A ``[BK, 512]`` bf16 KV stage is ``BK`` KB, double-buffered by the
  cp.async pipeline, plus q (HT KB).
- The running max starts at the finite ``-1e30``: a row whose slots are all empty keeps
  ``acc = 0`` and ``l = 0`` until the sink term; the divisor is replaced by 1 where ``l`` is
  still 0 (all empty and a ``-inf`` sink), so such a row is 0, never ``NaN``. A sink far above
  every score makes ``exp2(sink - m)`` overflow to ``inf`` on purpose: the output is then
  exactly 0, as the reference's is.
- Indices outside ``[-1, n)`` are treated as empty slots: masked, never read out of bounds.

Grid: ``(cdiv(h, HT), b * s, split_kv)`` with the head tile fastest. With ``split_kv > 1`` the
programs of one query share its top-k list, each writes its unnormalized FP32 share (``acc`` and
the running max / sum per head) to a workspace, and `_sparse_attn_combine_kernel` folds the
shares and the sink into the output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...runtime import numerics
from ..compile_tier import KernelConfig
from .tiles import COMBINE_HEADS, TILE_TABLE

__all__ = ["LOG2E", "kernel_args", "sparse_attn_launch", "compile_configs"]

LOG2E = 1.4426950408889634


@triton.jit
def _sparse_attn_kernel(
    q_ptr, kv_ptr, sink_ptr, idx_ptr, out_ptr,
    H, N, TOPK, S,
    stride_qb, stride_qs, stride_qh,
    stride_kvb, stride_kvn,
    stride_ib, stride_is,
    stride_ob, stride_os, stride_oh,
    qk_scale, slots_per_split,
    D: tl.constexpr, BD: tl.constexpr, HT: tl.constexpr, BK: tl.constexpr, SWAP_AB: tl.constexpr,
    SPLIT_OUT: tl.constexpr,
):
    pid_h = tl.program_id(0)
    pid_t = tl.program_id(1)
    pid_s = tl.program_id(2)
    bi = (pid_t // S).to(tl.int64)
    si = (pid_t % S).to(tl.int64)
    heads = pid_h * HT + tl.arange(0, HT)
    h_ok = heads < H
    dd = tl.arange(0, BD)
    hd_ok = h_ok[:, None] & (dd < D)[None, :]
    q = tl.load(q_ptr + bi * stride_qb + si * stride_qs + heads[:, None] * stride_qh + dd[None, :],
                mask=hd_ok, other=0.0)
    kv_base = kv_ptr + bi * stride_kvb
    idx_base = idx_ptr + bi * stride_ib + si * stride_is

    # running max in log2 units: finite, so exp2(m_i - m_new) never sees inf - inf
    m_i = tl.full([HT], -1.0e30, tl.float32)
    l_i = tl.zeros([HT], tl.float32)
    if SWAP_AB:
        acc = tl.zeros([BD, HT], tl.float32)
    else:
        acc = tl.zeros([HT, BD], tl.float32)
    # this program's share of the slots (all of them without SPLIT_OUT)
    lo = pid_s * slots_per_split
    hi = tl.minimum(lo + slots_per_split, TOPK)
    for start in range(lo, hi, BK):
        j = start + tl.arange(0, BK)
        idx = tl.load(idx_base + j, mask=j < hi, other=-1)
        ok = (idx >= 0) & (idx < N)  # empty (-1), past topk, or out of range: not read
        if D == BD:
            kv_mask = ok[:, None]
        else:
            kv_mask = ok[:, None] & (dd < D)[None, :]
        kv = tl.load(kv_base + idx[:, None].to(tl.int64) * stride_kvn + dd[None, :], mask=kv_mask, other=0.0)
        if SWAP_AB:
            # scores^T [BK, HT]: the KV block is the wgmma M side
            st = numerics.dot(kv, tl.trans(q), tl.zeros([BK, HT], tl.float32)) * qk_scale
            st = tl.where(ok[:, None], st, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(st, 0))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(st - m_new[None, :])
            l_i = l_i * alpha + tl.sum(p, 0)
            acc = numerics.dot(tl.trans(kv), numerics.to_bf16(p), acc * alpha[None, :])
        else:
            st = numerics.dot(q, tl.trans(kv), tl.zeros([HT, BK], tl.float32)) * qk_scale
            st = tl.where(ok[None, :], st, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(st, 1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(st - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = numerics.dot(numerics.to_bf16(p), kv, acc * alpha[:, None])
        m_i = m_new

    if SPLIT_OUT:
        # unnormalized share: FP32 acc [HT, D] and (m, l) per head, combined (with the sink) by
        # `_sparse_attn_combine_kernel`; out_ptr is the FP32 workspace [b * s, splits, H, BD + 2]
        # (the row's last two columns hold m and l)
        row = (pid_t * tl.num_programs(2) + pid_s).to(tl.int64) * H + heads
        ws = out_ptr + row * (BD + 2)
        if SWAP_AB:
            tl.store(ws[:, None] + dd[None, :], tl.trans(acc), mask=hd_ok)
        else:
            tl.store(ws[:, None] + dd[None, :], acc, mask=hd_ok)
        tl.store(ws + BD, m_i, mask=h_ok)
        tl.store(ws + BD + 1, l_i, mask=h_ok)
        return

    # the sink joins the denominator only (padded heads: -inf, no contribution)
    sink = tl.load(sink_ptr + heads, mask=h_ok, other=float("-inf")) * 1.4426950408889634
    l_i = l_i + tl.math.exp2(sink - m_i)
    # l = 0 only when every slot is empty and the sink is -inf; acc = 0 there: 0 * 1, not 0 / 0
    inv = 1.0 / tl.where(l_i > 0.0, l_i, 1.0)
    if SWAP_AB:
        o = tl.trans(acc * inv[None, :])
    else:
        o = acc * inv[:, None]
    tl.store(out_ptr + bi * stride_ob + si * stride_os + heads[:, None] * stride_oh + dd[None, :],
             numerics.to_bf16(o), mask=hd_ok)


@triton.jit
def _sparse_attn_combine_kernel(
    ws_ptr, sink_ptr, out_ptr, H, S, SPLITS,
    stride_ob, stride_os, stride_oh,
    D: tl.constexpr, BD: tl.constexpr, HC: tl.constexpr,
):
    """Fold the ``SPLITS`` shares of one query's heads ``[HC]``: ``M = max m_s``,
    ``out = sum_s 2**(m_s - M) acc_s / (sum_s 2**(m_s - M) l_s + 2**(sink - M))`` (log2 units),
    with the single kernel's guards (finite initial max, a zero denominator -> 0)."""
    pid_t = tl.program_id(0)
    heads = tl.program_id(1) * HC + tl.arange(0, HC)
    h_ok = heads < H
    dd = tl.arange(0, BD)
    hd_ok = h_ok[:, None] & (dd < D)[None, :]
    m_all = tl.full([HC], -1.0e30, tl.float32)
    for sp in range(SPLITS):
        row = (pid_t * SPLITS + sp).to(tl.int64) * H + heads
        m_all = tl.maximum(m_all, tl.load(ws_ptr + row * (BD + 2) + BD, mask=h_ok, other=-1.0e30))
    l_all = tl.zeros([HC], tl.float32)
    acc = tl.zeros([HC, BD], tl.float32)
    for sp in range(SPLITS):
        row = (pid_t * SPLITS + sp).to(tl.int64) * H + heads
        w = ws_ptr + row * (BD + 2)
        scale = tl.math.exp2(tl.load(w + BD, mask=h_ok, other=-1.0e30) - m_all)
        l_all += scale * tl.load(w + BD + 1, mask=h_ok, other=0.0)
        acc += scale[:, None] * tl.load(w[:, None] + dd[None, :], mask=hd_ok, other=0.0)
    sink = tl.load(sink_ptr + heads, mask=h_ok, other=float("-inf")) * 1.4426950408889634
    l_all = l_all + tl.math.exp2(sink - m_all)
    inv = 1.0 / tl.where(l_all > 0.0, l_all, 1.0)
    bi = (pid_t // S).to(tl.int64)
    si = (pid_t % S).to(tl.int64)
    tl.store(out_ptr + bi * stride_ob + si * stride_os + heads[:, None] * stride_oh + dd[None, :],
             numerics.to_bf16(acc * inv[:, None]), mask=hd_ok)


def kernel_args(q, kv, sink, topk_idxs, dst, out, qk_scale: float, per: int) -> tuple:
    """The runtime arguments both engines' kernels take, in their order (pointers, sizes,
    strides, the log2-unit scale, slots a share); `dst` is `out` or the split workspace."""
    _, s, h, _ = q.shape
    return (q, kv, sink, topk_idxs, dst,
            h, kv.shape[1], topk_idxs.shape[2], s,
            q.stride(0), q.stride(1), q.stride(2),
            kv.stride(0), kv.stride(1),
            topk_idxs.stride(0), topk_idxs.stride(1),
            out.stride(0), out.stride(1), out.stride(2),
            qk_scale, per)


def sparse_attn_launch(q: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor, topk_idxs: torch.Tensor,
                       out: torch.Tensor, qk_scale: float, per: int, splits: int, heads_per_program: int,
                       block_kv: int, num_warps: int, num_stages: int, swap_ab: bool) -> None:
    """`_sparse_attn_kernel` (operands validated by `sparse_attn`): q ``bf16 [b, s, h, d]``, kv
    ``bf16 [b, n, d]``, sink ``fp32 [h]`` (contiguous), topk_idxs ``int32 [b, s, topk]``, out
    ``bf16 [b, s, h, d]``; qk_scale in log2 units; `per` slots a share (a multiple of block_kv),
    `splits` shares a query (> 1: an FP32 workspace, then the combine kernel)."""
    b, s, h, d = q.shape
    bd = max(16, triton.next_power_of_2(d))
    dst = out
    if splits > 1:
        dst = torch.empty(b * s, splits, h, bd + 2, dtype=torch.float32, device=q.device)
    _sparse_attn_kernel[(triton.cdiv(h, heads_per_program), b * s, splits)](
        *kernel_args(q, kv, sink, topk_idxs, dst, out, qk_scale, per),
        D=d, BD=bd, HT=heads_per_program, BK=block_kv, SWAP_AB=swap_ab, SPLIT_OUT=splits > 1,
        num_warps=num_warps, num_stages=num_stages,
    )
    if splits > 1:
        _sparse_attn_combine_kernel[(b * s, triton.cdiv(h, COMBINE_HEADS))](
            dst, sink, out, h, s, splits, out.stride(0), out.stride(1), out.stride(2),
            D=d, BD=bd, HC=COMBINE_HEADS, num_warps=4,
        )


def compile_configs() -> list[KernelConfig]:
    """Every row of `TILE_TABLE` at d = 512 (heads 16..128 -> tiles of 16, 32, 64), unsplit and
    split (the FP32 share written to the workspace), and the combine kernel, for the compile tier."""
    sig = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "sink_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*bf16",
           "H": "i32", "N": "i32", "TOPK": "i32", "S": "i32",
           "stride_qb": "i32", "stride_qs": "i32", "stride_qh": "i32",
           "stride_kvb": "i32", "stride_kvn": "i32",
           "stride_ib": "i32", "stride_is": "i32",
           "stride_ob": "i32", "stride_os": "i32", "stride_oh": "i32",
           "qk_scale": "fp32", "slots_per_split": "i32",
           "D": "constexpr", "BD": "constexpr", "HT": "constexpr", "BK": "constexpr", "SWAP_AB": "constexpr",
           "SPLIT_OUT": "constexpr"}
    cfgs = []
    for ht, (bk, warps, stages, swap) in TILE_TABLE.items():
        for split in (False, True):
            cfgs.append(KernelConfig(
                f"sparse_attn[D=512,HT={ht},BK={bk},w={warps},swap={int(swap)}{',split' if split else ''}]",
                _sparse_attn_kernel, dict(sig, out_ptr="*fp32") if split else sig,
                {"D": 512, "BD": 512, "HT": ht, "BK": bk, "SWAP_AB": swap, "SPLIT_OUT": split},
                num_warps=warps, num_stages=stages, expect_sass=("HGMMA",),
                # head count, KV length, top-k and the index row strides are arbitrary in production
                unaligned=("H", "N", "TOPK", "S", "stride_ib", "stride_is", "slots_per_split")))
    cfgs.append(KernelConfig(
        f"sparse_attn_combine[D=512,HC={COMBINE_HEADS}]", _sparse_attn_combine_kernel,
        {"ws_ptr": "*fp32", "sink_ptr": "*fp32", "out_ptr": "*bf16", "H": "i32", "S": "i32", "SPLITS": "i32",
         "stride_ob": "i32", "stride_os": "i32", "stride_oh": "i32",
         "D": "constexpr", "BD": "constexpr", "HC": "constexpr"},
        {"D": 512, "BD": 512, "HC": COMBINE_HEADS}, num_warps=4, num_stages=1,
        unaligned=("H", "S", "SPLITS")))
    return cfgs
