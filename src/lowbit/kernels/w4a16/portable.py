"""The portable W4A16 kernels (Triton: every tier, the interpreter too): the shared main loop over
K, the indexed, contiguous and masked kernels, the split-K reduction, their launchers and their
compile-tier configurations.

`w4a16_tile` computes one ``[BM, BN]`` output tile ``A[rows] @ dequant(W[e, cols])^T`` in FP32
from the prepared layout (`lowbit.formats.w4a16`): per 256-wide K tile, one load of 32 words
per weight row; a shift by ``4i`` exposes groups ``i`` and ``i + 4``, dequantized two at a time
by `int4.dequant_pair` with one scale per row, then two 32-deep tensor-core dots.
``SWAP_AB`` puts the dequantized weight on the MMA's M side (``acc^T[BN, BM] += W @ A^T``):
the words go from shared memory straight into the wgmma A-operand registers, are dequantized
there, and never return to shared memory; the activations are the B operand.

Indexed kernel: one program per (routing block, N tile); blocks past the device-side padded
count and ``-1`` (remote expert) blocks return at once; sentinel rows are masked, so no host
readback and no out-of-bounds access. Contiguous: each expert's segment is padded to 128 rows
and every M tile divides 128, so a tile whose first row is padding is all padding. Masked:
programs past ``masked_m[g]`` return at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...routing.layouts import live_block_bound
from ...runtime import numerics
from ...runtime.kernel_config import KernelConfig
from .int4 import dequant_pair
from .tiles import ALLOWED_SPILL_BYTES, VALIDATED_TILES

__all__ = ["compile_configs", "splitk_reduce", "w4a16_contiguous_launch", "w4a16_indexed_launch",
           "w4a16_masked_launch", "w4a16_tile"]


@triton.jit
def w4a16_tile(a_ptr, a_row, row_ok, stride_am, qw_ptr, s_ptr, e, rn, n_ok,
               stride_qe, stride_qn, stride_se, stride_sk, K, kt_lo, kt_hi,
               BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr):
    """FP32 ``[BM, BN]``: rows `a_row` (int64 ``[BM]``, masked by `row_ok`) of A (bf16, row
    stride `stride_am`) times expert `e`'s dequantized weight rows `rn` (masked by `n_ok`),
    summed over the 256-wide K tiles ``kt_lo <= kt < kt_hi`` (all of K: ``0, cdiv(K, 256)``;
    a split-K share otherwise)."""
    j = tl.arange(0, 32)
    qw_rows = qw_ptr + e * stride_qe + rn[:, None].to(tl.int64) * stride_qn + j[None, :]
    s_rows = s_ptr + e * stride_se + rn
    a_rows = a_ptr + a_row[:, None] * stride_am + j[None, :]
    if SWAP_AB:
        acc = tl.zeros([BN, BM], tl.float32)
    else:
        acc = tl.zeros([BM, BN], tl.float32)
    for kt in range(kt_lo, kt_hi):
        words = tl.load(qw_rows + kt * 32, mask=n_ok[:, None], other=0)
        for i in tl.static_range(4):
            # one shift serves two groups: i (low half-word) and i + 4 (high half-word)
            s_lo = tl.load(s_rows + (kt * 8 + i) * stride_sk, mask=n_ok, other=0.0)
            s_hi = tl.load(s_rows + (kt * 8 + i + 4) * stride_sk, mask=n_ok, other=0.0)
            w_lo, w_hi = dequant_pair(words >> (4 * i), s_lo[:, None], s_hi[:, None])
            k_lo = kt * 256 + i * 32
            k_hi = k_lo + 128
            a_lo = tl.load(a_rows + k_lo, mask=row_ok[:, None] & ((k_lo + j)[None, :] < K), other=0.0)
            a_hi = tl.load(a_rows + k_hi, mask=row_ok[:, None] & ((k_hi + j)[None, :] < K), other=0.0)
            if SWAP_AB:
                acc = numerics.dot(w_lo, tl.trans(a_lo), acc)
                acc = numerics.dot(w_hi, tl.trans(a_hi), acc)
            else:
                acc = numerics.dot(a_lo, tl.trans(w_lo), acc)
                acc = numerics.dot(a_hi, tl.trans(w_hi), acc)
    if SWAP_AB:
        acc = tl.trans(acc)
    return acc


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


@triton.jit
def _w4a16_contiguous_kernel(
    a_ptr, qw_ptr, s_ptr, c_ptr, m_indices_ptr,
    M, N, K, stride_am, stride_qe, stride_qn, stride_se, stride_sk, stride_cm,
    BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(m_indices_ptr + pid_m * BM).to(tl.int64)
    if e < 0:  # segments start 128-aligned and BM divides 128: the whole tile is padding
        return
    rm = pid_m * BM + tl.arange(0, BM)
    row_ok = tl.load(m_indices_ptr + rm, mask=rm < M, other=-1) >= 0
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    acc = w4a16_tile(a_ptr, rm.to(tl.int64), row_ok, stride_am, qw_ptr, s_ptr, e, rn, n_ok,
                     stride_qe, stride_qn, stride_se, stride_sk, K, 0, tl.cdiv(K, 256), BM, BN, SWAP_AB)
    c = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    tl.store(c, numerics.to_bf16(acc), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _w4a16_masked_kernel(
    a_ptr, qw_ptr, s_ptr, c_ptr, masked_m_ptr,
    max_m, N, K, stride_am, stride_qe, stride_qn, stride_se, stride_sk, stride_cm,
    BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr,
):
    g = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_n = tl.program_id(2)
    valid_m = tl.minimum(tl.load(masked_m_ptr + g), max_m)
    if pid_m * BM >= valid_m:
        return
    r = pid_m * BM + tl.arange(0, BM)
    row_ok = r < valid_m
    rows = g.to(tl.int64) * max_m + r
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    acc = w4a16_tile(a_ptr, rows, row_ok, stride_am, qw_ptr, s_ptr, g.to(tl.int64), rn, n_ok,
                     stride_qe, stride_qn, stride_se, stride_sk, K, 0, tl.cdiv(K, 256), BM, BN, SWAP_AB)
    c = c_ptr + rows[:, None] * stride_cm + rn[None, :]
    tl.store(c, numerics.to_bf16(acc), mask=row_ok[:, None] & n_ok[None, :])


def w4a16_indexed_launch(a: torch.Tensor, w, sorted_ids: torch.Tensor, expert_ids: torch.Tensor,
                         ntpp: torch.Tensor, top_k: int, topk_weights: torch.Tensor | None, out: torch.Tensor, *,
                         block_m: int, block_n: int, swap_ab: bool, num_warps: int, num_stages: int,
                         split_k: int = 1) -> None:
    """The Triton indexed kernel on operands `lowbit.kernels.w4a16.indexed` has validated (its
    docstring has the shapes): ``out [M * top_k, N]`` bf16; with `split_k` > 1 the K shares go to
    an FP32 workspace, summed in a fixed order by `splitk_reduce`."""
    num_routes, n = out.shape
    dst = out if split_k == 1 else torch.empty(split_k, num_routes, n, dtype=torch.float32, device=a.device)
    _w4a16_indexed_kernel[(live_block_bound(expert_ids.numel(), num_routes), triton.cdiv(n, block_n), split_k)](
        a, w.qweight, w.scales, dst, sorted_ids, expert_ids, ntpp,
        topk_weights if topk_weights is not None else a,
        n, w.k, num_routes, top_k,
        a.stride(0), w.qweight.stride(0), w.qweight.stride(1), w.scales.stride(0), w.scales.stride(1),
        dst.stride(-2), dst.stride(0) if split_k > 1 else 0,
        BM=block_m, BN=block_n, SWAP_AB=swap_ab, MUL_WEIGHT=topk_weights is not None,
        SPLIT_K=split_k, num_warps=num_warps, num_stages=num_stages,
    )
    if split_k > 1:
        splitk_reduce(dst, out, sorted_ids, expert_ids, ntpp, block_m, block_n)


def splitk_reduce(ws: torch.Tensor, out: torch.Tensor, sorted_ids: torch.Tensor, expert_ids: torch.Tensor,
                  ntpp: torch.Tensor, block_m: int, block_n: int) -> None:
    """``out[id] = bf16(sum_s ws[s, id])`` for the routed rows of the FP32 shares ``ws [S, rows, N]``
    (routing blocks of `block_m` slots; `block_n` output columns a program)."""
    n = out.shape[1]
    _w4a16_indexed_splitk_reduce_kernel[(live_block_bound(expert_ids.numel(), out.shape[0]), triton.cdiv(n, block_n))](
        ws, out, sorted_ids, expert_ids, ntpp, n, out.shape[0], ws.stride(0), ws.stride(1), out.stride(0),
        BM=block_m, BN=block_n, SPLIT_K=ws.shape[0], num_warps=4,
    )


def w4a16_contiguous_launch(a2: torch.Tensor, w, m_indices: torch.Tensor, out: torch.Tensor, *, block_m: int,
                            block_n: int, swap_ab: bool, num_warps: int, num_stages: int) -> None:
    """The Triton contiguous kernel on operands `lowbit.kernels.w4a16.grouped.contiguous` has
    validated: ``a2 [m, K]`` bf16 (m a multiple of 128), ``m_indices [m]`` int32, ``out [m, N]`` bf16."""
    m = a2.shape[0]
    grid = (m // block_m, triton.cdiv(w.n, block_n))
    _w4a16_contiguous_kernel[grid](
        a2, w.qweight, w.scales, out, m_indices,
        m, w.n, w.k, a2.stride(0), w.qweight.stride(0), w.qweight.stride(1), w.scales.stride(0),
        w.scales.stride(1), out.stride(0),
        BM=block_m, BN=block_n, SWAP_AB=swap_ab, num_warps=num_warps, num_stages=num_stages,
    )


def w4a16_masked_launch(a_flat: torch.Tensor, w, masked_m: torch.Tensor, out: torch.Tensor, max_m: int, *,
                        block_m: int, block_n: int, swap_ab: bool, num_warps: int, num_stages: int) -> None:
    """The Triton masked kernel on operands `lowbit.kernels.w4a16.grouped.masked` has validated:
    ``a_flat [G * max_m, K]`` bf16, ``masked_m [G]`` int32, ``out [G * max_m, N]`` bf16."""
    grid = (w.num_experts, triton.cdiv(max_m, block_m), triton.cdiv(w.n, block_n))
    _w4a16_masked_kernel[grid](
        a_flat, w.qweight, w.scales, out, masked_m,
        max_m, w.n, w.k, a_flat.stride(0), w.qweight.stride(0), w.qweight.stride(1), w.scales.stride(0),
        w.scales.stride(1), out.stride(0),
        BM=block_m, BN=block_n, SWAP_AB=swap_ab, num_warps=num_warps, num_stages=num_stages,
    )


def _configs_for(fn, signature: dict, name: str, extra_constexprs: list[dict], unaligned: tuple[str, ...]):
    """KernelConfigs of every validated tile x each extra-constexpr variant."""
    cfgs = []
    for bm, (bn, warps, stages, swap) in VALIDATED_TILES.items():
        for extra in extra_constexprs:
            tag = ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in extra.items())
            cfgs.append(KernelConfig(
                f"{name}[BM={bm},BN={bn},w={warps},swap={int(swap)}{',' + tag if tag else ''}]", fn, signature,
                {"BM": bm, "BN": bn, "SWAP_AB": swap, **extra}, num_warps=warps, num_stages=stages,
                expect_sass=("HGMMA",) if (bn if swap else bm) >= 64 else ("HMMA",), unaligned=unaligned,
                max_spill_bytes=ALLOWED_SPILL_BYTES.get(bm, 0),
                allowed_ptxas=("C7515",) if bm in ALLOWED_SPILL_BYTES else ()))
    return cfgs


def compile_configs() -> list[KernelConfig]:
    """Every Triton configuration the heuristics can pick (indexed, contiguous, masked), plus the
    indexed split-K path and its reduction (reachable through ``LOWBIT_W4A16_SPLIT_K``)."""
    sig = {"a_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*bf16", "c_ptr": "*bf16", "sorted_ids_ptr": "*i32",
           "expert_ids_ptr": "*i32", "ntpp_ptr": "*i32", "topk_w_ptr": "*fp32",
           "N": "i32", "K": "i32", "num_routes": "i32", "top_k": "i32",
           "stride_am": "i32", "stride_qe": "i32", "stride_qn": "i32", "stride_se": "i32", "stride_sk": "i32",
           "stride_cm": "i32", "stride_ws": "i32",
           "BM": "constexpr", "BN": "constexpr", "SWAP_AB": "constexpr", "MUL_WEIGHT": "constexpr",
           "SPLIT_K": "constexpr"}
    cfgs = _configs_for(_w4a16_indexed_kernel, sig, "w4a16_indexed",
                        [{"MUL_WEIGHT": False, "SPLIT_K": 1}, {"MUL_WEIGHT": True, "SPLIT_K": 1}],
                        ("num_routes", "top_k"))
    sig_split = {**sig, "c_ptr": "*fp32"}
    cfgs += _configs_for(_w4a16_indexed_kernel, sig_split, "w4a16_indexed_splitk",
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
    common = {"N": "i32", "K": "i32", "stride_am": "i32", "stride_qe": "i32", "stride_qn": "i32",
              "stride_se": "i32", "stride_sk": "i32", "stride_cm": "i32",
              "BM": "constexpr", "BN": "constexpr", "SWAP_AB": "constexpr"}
    ptrs = {"a_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*bf16", "c_ptr": "*bf16"}
    sig_c = {**ptrs, "m_indices_ptr": "*i32", "M": "i32", **common}
    sig_m = {**ptrs, "masked_m_ptr": "*i32", "max_m": "i32", **common}
    return (cfgs + _configs_for(_w4a16_contiguous_kernel, sig_c, "w4a16_contiguous", [{}], ())
            + _configs_for(_w4a16_masked_kernel, sig_m, "w4a16_masked", [{}], ("max_m",)))
