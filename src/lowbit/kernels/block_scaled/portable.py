"""Portable Triton kernels of the block-scaled GEMMs (every tier, the interpreter included) and
their launchers: `fp8_gemm`'s kernel, `fp4_gemm`'s direct kernel, and the fold engine's fold and
exact fixup.

FP8 kernel (`_fp8_gemm_kernel`): one program per (M tile, N tile, K split). The K step is 128,
one scale block, so every step is one FP8 tensor-core product into a fresh block accumulator,
scaled by the outer product of the step's activation scales and the tile's single weight scale
(BLOCK_N divides 128, so a tile never straddles two weight-scale rows) and added into the FP32
running sum: DeepSeek's two accumulators, which also keep the tensor cores' reduced-precision
accumulation to at most 128 terms (DeepSeek-V3 report, FP8 "increasing accumulation precision").
K and N need not be multiples of 128 (masked loads; zero padding contributes exact zeros).
``SWAP_AB`` (decode) computes ``c^T[BN, BM] = b @ a^T``: the weight rows fill the 64-row M side
of wgmma and the few activation rows are its N side (>= 16). Both operands are K-major in the
NT layout, which FP8 wgmma requires, so the swap needs no transpose copy.

FP4 direct kernel (`_fp4_gemm_kernel`): the E2M1 weight is upcast to FP8 E4M3 in registers
(every E2M1 value is an E4M3 value) and multiplied on the FP8 tensor cores, with one of two K
steps (``K_STEP``):

- 32 (any activation block; the only choice for 32): each step is one weight group, a fresh
  32-deep product scaled by ``a_s[m] * 2**(e[n] - 127)`` and promoted into the FP32 sum.
- 128 (activation block 128): the group scales are folded into the B operand, exactly. Per
  weight row n and 128-K step, ``e_ref[n] = max(e_max[n] - 6, 1)`` (``e_max`` over the step's
  groups with a nonzero code); group g's codes become E4M3 ``e2m1 * 2**(e[n, g] - e_ref[n])``:
  with the shift in [-5, 6] a normal E4M3 number (at most 1.5 * 2**8 = 384), built by integer
  bit operations on the nibble. One 128-deep product per step, promoted with ``a_s[m] *
  2**(e_ref[n] - 127)``; scaling a group's partial sum by a power of two is exact in FP32, so
  this equals the reference up to FP32 summation order. A nonzero group more than 11 binades
  below its row's largest in the step (``e < e_ref - 5``) cannot be shifted exactly: it is left
  out of the folded operand and, if any was, a second pass over the program's K range folds
  the leftovers level by level under lower reference exponents (each level takes at least the
  largest group left in each row, so three more levels exhaust a step).

Fold engine, Triton side: `_fp4_fold_kernel` writes the K_STEP 128 operand once (``w8 fp8 [N,
K]``, row scales ``w8_s fp32 [N, ceil(K/128)]`` and one flag per 64 weight rows where a group was
left out); `hopper_fp8`'s GEMM multiplies it; `_fp4_gemm_kernel` with ``FIXUP`` (one program per
64 weight rows) returns at once where the flag is 0, else recomputes those output columns
exactly (k_step 128 with the leftover pass) and overwrites them. No host readback anywhere.

Split-K: the programs along K write FP32 shares that `splitk.splitk_reduce` sums.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...runtime import numerics
from ..compile_tier import KernelConfig
from .splitk import split_blocks, splitk_destination, splitk_reduce
from .tiles import FP4_FIX_TILE, FP4_TRITON_TILES, FP8_TRITON_TILES

__all__ = ["fp8_gemm_launch", "fp4_gemm_launch", "fold_weight", "fold_fixup", "compile_configs"]


# --------------------------------------------------------------------------- FP8 kernel

@triton.jit
def store_block_scaled_tile(c_ptr, acc, rm, rn, m_ok, n_ok, pid_k, stride_cm, stride_cs,
                            SWAP_AB: tl.constexpr, SPLIT_OUT: tl.constexpr):
    """Epilogue of the FP8 and FP4 GEMMs: the FP32 tile (transposed back if SWAP_AB) to the
    split-K workspace share `pid_k`, or rounded once to bf16 into the output."""
    if SWAP_AB:
        acc = tl.trans(acc)
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT_OUT:
        ws = c_ptr + pid_k.to(tl.int64) * stride_cs + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
        tl.store(ws, acc, mask=mask)
    else:
        c = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
        tl.store(c, numerics.to_bf16(acc), mask=mask)


@triton.jit
def _fp8_gemm_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr,
    M, N, K, steps_per_split,
    stride_am, stride_asm, stride_ask, stride_bn, stride_bsn, stride_bsk, stride_cs, stride_cm,
    BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr, SPLIT_OUT: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, 128)
    m_ok = rm < M
    n_ok = rn < N
    a_rows = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :]
    b_rows = b_ptr + rn[:, None].to(tl.int64) * stride_bn + rk[None, :]
    as_rows = as_ptr + rm.to(tl.int64) * stride_asm
    # BN divides 128: the whole tile shares one row of weight-scale blocks
    bs_row = bs_ptr + ((pid_n * BN) // 128) * stride_bsn
    kb_lo = pid_k * steps_per_split
    kb_hi = tl.minimum(kb_lo + steps_per_split, tl.cdiv(K, 128))
    if SWAP_AB:
        acc = tl.zeros([BN, BM], tl.float32)
    else:
        acc = tl.zeros([BM, BN], tl.float32)
    for kb in range(kb_lo, kb_hi):
        k_ok = (kb * 128 + rk) < K
        a = tl.load(a_rows + kb * 128, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_rows + kb * 128, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        sa = tl.load(as_rows + kb * stride_ask, mask=m_ok, other=0.0)
        sb = tl.load(bs_row + kb * stride_bsk)
        if SWAP_AB:
            blk = numerics.dot(b, tl.trans(a), tl.zeros([BN, BM], tl.float32))
            acc += blk * (sa * sb)[None, :]
        else:
            blk = numerics.dot(a, tl.trans(b), tl.zeros([BM, BN], tl.float32))
            acc += blk * (sa * sb)[:, None]
    store_block_scaled_tile(c_ptr, acc, rm, rn, m_ok, n_ok, pid_k, stride_cm, stride_cs, SWAP_AB, SPLIT_OUT)


# --------------------------------------------------------------------------- FP4 kernels
@triton.jit
def _e2m1_to_e4m3(code, shift, keep):
    """E2M1 codes (int32, 0..15) -> float8e4nv bits of ``e2m1(code) * 2**shift``, exactly, for
    shift in [-5, 6]; 0 where not `keep`. E2M1 magnitude codes 1..7 are 0.5, 1, 1.5, 2, 3, 4, 6:
    E4M3 exponent field ``6 + (mag >> 1) + shift``, mantissa ``100b`` for odd mag >= 3."""
    mag = code & 7
    bits = ((6 + (mag >> 1) + shift) << 3) | (tl.where(mag > 1, mag & 1, 0) << 2)
    bits = tl.where(mag == 0, 0, bits) | ((code & 8) << 4)
    bits = tl.where(keep, bits, 0)
    return bits.to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _unpack_e4m3(byt, shift, keep, R: tl.constexpr, C: tl.constexpr):
    """Packed bytes (two codes each, element 2j low) -> FP8 E4M3 ``[R, C]`` in K order."""
    lo = _e2m1_to_e4m3((byt & 0xF).to(tl.int32), shift, keep)
    hi = _e2m1_to_e4m3((byt >> 4).to(tl.int32), shift, keep)
    return tl.reshape(tl.join(lo, hi), [R, C])


@triton.jit
def _e8m0_to_fp32(e):
    """E8M0 biased exponents (int32) -> FP32 ``2**(e - 127)``; 0 -> 2**-127, 255 -> NaN."""
    bits = tl.where(e == 0, 0x400000, e << 23)
    bits = tl.where(e == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _scaled_product(a, w, acc, sa, sb, SWAP_AB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """``acc + (a @ w^T) * sa[m] * sb[n]`` (acc transposed under SWAP_AB)."""
    if SWAP_AB:
        blk = numerics.dot(w, tl.trans(a), tl.zeros([BN, BM], tl.float32))
        return acc + blk * sa[None, :] * sb[:, None]
    else:
        blk = numerics.dot(a, tl.trans(w), tl.zeros([BM, BN], tl.float32))
        return acc + blk * sa[:, None] * sb[None, :]


@triton.jit
def _load_fold_step(b_rows, bs_rows, n_ok, ks, K, stride_bsk, BN: tl.constexpr):
    """One 128-K step of the weight: packed bytes ``[BN, 4, 16]``, E8M0 exponents
    ``e [BN, 4]`` and which groups hold a nonzero magnitude (``nz [BN, 4]``)."""
    g = tl.arange(0, 4)
    j = tl.arange(0, 16)
    k0 = ks * 128
    g_ok = (k0 + g * 32) < K  # K is a multiple of 32: whole groups only
    byt = tl.load(b_rows[:, None, None] + (k0 // 2 + g * 16)[None, :, None] + j[None, None, :],
                  mask=n_ok[:, None, None] & g_ok[None, :, None], other=0)
    e = tl.load(bs_rows[:, None] + (ks * 4 + g)[None, :] * stride_bsk,
                mask=n_ok[:, None] & g_ok[None, :], other=0).to(tl.int32)
    nz = tl.max(((byt & 0x77) != 0).to(tl.int32), axis=2) > 0
    return byt, e, nz


@triton.jit
def _fold_level(e, rem):
    """One fold level over the groups `rem` (``[BN, 4]``): the row's reference exponent
    ``e_ref = max(max e over rem - 6, 1)`` and the groups it takes, those with
    ``e - e_ref >= -5`` (always the largest left in the row). Returns (e_ref, take, left)."""
    e_ref = tl.maximum(tl.max(tl.where(rem, e, 0), axis=1) - 6, 1)
    take = rem & ((e - e_ref[:, None]) >= -5)
    return e_ref, take, rem & (take == 0)


@triton.jit
def _fold_operand(byt, e, e_ref, take, BN: tl.constexpr):
    """The FP8 operand ``[BN, 128]``: codes * 2**(e - e_ref) for the groups taken, else 0;
    and the row scale ``2**(e_ref - 127)`` (e_ref >= 1: a normal FP32 value)."""
    shift = tl.minimum(tl.maximum(e - e_ref[:, None], -5), 6)
    w = _unpack_e4m3(byt, shift[:, :, None], take[:, :, None], BN, 128)
    return w, (e_ref << 23).to(tl.float32, bitcast=True)


@triton.jit
def _fp4_gemm_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr,
    M, N, K, steps_per_split,
    stride_am, stride_asm, stride_ask, stride_bn, stride_bsn, stride_bsk, stride_cs, stride_cm,
    BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr, SPLIT_OUT: tl.constexpr,
    K_STEP: tl.constexpr, ACT_BLOCK: tl.constexpr,
    left_ptr=None, FIXUP: tl.constexpr = False,
):
    if FIXUP:
        # The fold engine's exactness pass (module doc): one program per BN weight rows;
        # `left_ptr` holds their flag, nonzero where the fold left a group out. Unflagged rows
        # keep the Gluon GEMM's output (the program returns at once: the pass costs one small
        # launch); flagged ones are recomputed exactly (k_step 128, leftover pass included), M
        # tile after M tile, and overwritten.
        pid_n = tl.program_id(0)
        if tl.load(left_ptr + pid_n) != 0:
            for pid_m in range(0, tl.cdiv(M, BM)):
                _fp4_gemm_tile(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M, N, K, steps_per_split,
                               stride_am, stride_asm, stride_ask, stride_bn, stride_bsn, stride_bsk, stride_cs,
                               stride_cm, pid_m, pid_n, 0, BM, BN, SWAP_AB, SPLIT_OUT, K_STEP, ACT_BLOCK)
    else:
        _fp4_gemm_tile(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M, N, K, steps_per_split,
                       stride_am, stride_asm, stride_ask, stride_bn, stride_bsn, stride_bsk, stride_cs, stride_cm,
                       tl.program_id(0), tl.program_id(1), tl.program_id(2), BM, BN, SWAP_AB, SPLIT_OUT, K_STEP,
                       ACT_BLOCK)


@triton.jit
def _fp4_gemm_tile(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr,
    M, N, K, steps_per_split,
    stride_am, stride_asm, stride_ask, stride_bn, stride_bsn, stride_bsk, stride_cs, stride_cm,
    pid_m, pid_n, pid_k,
    BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr, SPLIT_OUT: tl.constexpr,
    K_STEP: tl.constexpr, ACT_BLOCK: tl.constexpr,
):
    """Output tile (pid_m, pid_n), K share pid_k (module doc)."""
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    m_ok = rm < M
    n_ok = rn < N
    rk = tl.arange(0, K_STEP)
    a_rows = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :]
    as_rows = as_ptr + rm.to(tl.int64) * stride_asm
    b_rows = b_ptr + rn.to(tl.int64) * stride_bn
    bs_rows = bs_ptr + rn.to(tl.int64) * stride_bsn
    s_lo = pid_k * steps_per_split
    s_hi = tl.minimum(s_lo + steps_per_split, tl.cdiv(K, K_STEP))
    if SWAP_AB:
        acc = tl.zeros([BN, BM], tl.float32)
    else:
        acc = tl.zeros([BM, BN], tl.float32)
    if K_STEP == 128:
        any_left = tl.zeros([BN, 4], tl.int32)
        for ks in range(s_lo, s_hi):
            k0 = ks * 128
            sa = tl.load(as_rows + ks * stride_ask, mask=m_ok, other=0.0)  # ACT_BLOCK == 128
            a = tl.load(a_rows + k0, mask=m_ok[:, None] & ((k0 + rk) < K)[None, :], other=0.0)
            byt, e, nz = _load_fold_step(b_rows, bs_rows, n_ok, ks, K, stride_bsk, BN)
            e_ref, take, left = _fold_level(e, nz)
            w, sb = _fold_operand(byt, e, e_ref, take, BN)
            acc = _scaled_product(a, w, acc, sa, sb, SWAP_AB, BM, BN)
            any_left = any_left | left.to(tl.int32)
        if tl.max(tl.max(any_left, axis=1), axis=0) > 0:
            # Groups more than 11 binades below their row's largest in the step (never the
            # case for real weights) are folded in a second pass, outside the hot loop, under
            # lower reference exponents: level L takes at least the largest group left in
            # each row, so levels 1..3 exhaust a step's four groups. One product per
            # iteration over (step, level), as in the main loop (several products in flight
            # at once would spill).
            for it in tl.range(s_lo * 3, s_hi * 3, num_stages=1):
                ks = it // 3
                k0 = ks * 128
                sa = tl.load(as_rows + ks * stride_ask, mask=m_ok, other=0.0)
                a = tl.load(a_rows + k0, mask=m_ok[:, None] & ((k0 + rk) < K)[None, :], other=0.0)
                byt, e, rem = _load_fold_step(b_rows, bs_rows, n_ok, ks, K, stride_bsk, BN)
                for _lvl in range(0, it % 3 + 1):  # drop the groups of levels 0 .. L-1
                    e_ref, take, rem = _fold_level(e, rem)
                e_ref, take, rem = _fold_level(e, rem)
                w, sb = _fold_operand(byt, e, e_ref, take, BN)
                acc = _scaled_product(a, w, acc, sa, sb, SWAP_AB, BM, BN)
    else:
        j = tl.arange(0, 16)
        for ks in range(s_lo, s_hi):
            k0 = ks * 32
            sa = tl.load(as_rows + (k0 // ACT_BLOCK) * stride_ask, mask=m_ok, other=0.0)
            a = tl.load(a_rows + k0, mask=m_ok[:, None], other=0.0)  # K % 32 == 0: no K mask
            byt = tl.load(b_rows[:, None] + (k0 // 2 + j)[None, :], mask=n_ok[:, None], other=0)
            e = tl.load(bs_rows + ks * stride_bsk, mask=n_ok, other=0).to(tl.int32)
            w = _unpack_e4m3(byt, 0, True, BN, 32)
            acc = _scaled_product(a, w, acc, sa, _e8m0_to_fp32(e), SWAP_AB, BM, BN)
    store_block_scaled_tile(c_ptr, acc, rm, rn, m_ok, n_ok, pid_k, stride_cm, stride_cs, SWAP_AB, SPLIT_OUT)


@triton.jit
def _fp4_fold_kernel(
    b_ptr, bs_ptr, w8_ptr, w8s_ptr, left_ptr,
    N, K,
    stride_bn, stride_bsn, stride_bsk, stride_wn, stride_wsn, stride_wsk,
    BN: tl.constexpr,
):
    """The fold engine's first phase: one program per (BN weight rows, 128-K block).

    b ``uint8 [N, K/2]``, bs E8M0 ``uint8 [N, K/32]`` -> w8 ``float8e4nv [N, K]`` (the k_step 128
    operand: level 0 of the fold, leftover groups written as 0), w8s ``fp32 [N, ceil(K/128)]``
    (``2**(e_ref - 127)``) and ``left int32 [ceil(N/BN)]``: set to 1 where a group of one of
    the program's rows was left out (zeroed by the launcher; every writer writes the same 1)."""
    pid_n = tl.program_id(0)
    ks = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    byt, e, nz = _load_fold_step(b_ptr + rn.to(tl.int64) * stride_bn, bs_ptr + rn.to(tl.int64) * stride_bsn,
                                 n_ok, ks, K, stride_bsk, BN)
    e_ref, take, left = _fold_level(e, nz)
    w, sb = _fold_operand(byt, e, e_ref, take, BN)
    rk = ks * 128 + tl.arange(0, 128)
    tl.store(w8_ptr + rn[:, None].to(tl.int64) * stride_wn + rk[None, :], w,
             mask=n_ok[:, None] & (rk < K)[None, :])
    tl.store(w8s_ptr + rn.to(tl.int64) * stride_wsn + ks * stride_wsk, sb, mask=n_ok)
    any_left = tl.max(tl.max(left.to(tl.int32), axis=1), axis=0)
    tl.store(left_ptr + pid_n, any_left, mask=any_left > 0)


# --------------------------------------------------------------------------- launchers
def _launch_split(kernel, operands: tuple, strides: tuple, out: torch.Tensor, m: int, n: int, k: int, k_steps: int,
                  block_m: int, block_n: int, num_warps: int, num_stages: int, swap_ab: bool, split_k: int,
                  **constexprs) -> None:
    """`kernel` over (M tiles, N tiles, K splits); with more than one split into an FP32
    workspace, then `splitk_reduce` into `out`."""
    per, split = split_blocks(k_steps, split_k, even=False)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    dst, stride_cs, stride_cm = splitk_destination(out, split)
    kernel[grid](
        *operands, dst, m, n, k, per, *strides, stride_cs, stride_cm,
        BM=block_m, BN=block_n, SWAP_AB=swap_ab, SPLIT_OUT=split > 1,
        **constexprs, num_warps=num_warps, num_stages=num_stages,
    )
    if split > 1:
        splitk_reduce(dst, out)


def fp8_gemm_launch(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor, out: torch.Tensor,
                    block_m: int, block_n: int, num_warps: int, num_stages: int, swap_ab: bool,
                    split_k: int = 1) -> None:
    """`_fp8_gemm_kernel` (operands validated by `fp8_gemm`): a ``fp8 [M, K]``, a_s ``fp32 [M,
    ceil(K/128)]``, b ``fp8 [N, K]``, b_s ``fp32 [ceil(N/128), ceil(K/128)]``, out ``bf16 [M, N]``;
    block_n divides 128; `split_k` programs along K (FP32 shares, then the reduction)."""
    m, k = a.shape
    n = b.shape[0]
    _launch_split(_fp8_gemm_kernel, (a, a_s, b, b_s),
                  (a.stride(0), a_s.stride(0), a_s.stride(1), b.stride(0), b_s.stride(0), b_s.stride(1)),
                  out, m, n, k, triton.cdiv(k, 128), block_m, block_n, num_warps, num_stages, swap_ab, split_k)


def fp4_gemm_launch(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor, out: torch.Tensor,
                    act_block: int, k_step: int, block_m: int, block_n: int, num_warps: int, num_stages: int,
                    swap_ab: bool, split_k: int = 1) -> None:
    """`_fp4_gemm_kernel` (operands validated by `fp4_gemm`): a ``fp8 [M, K]``, a_s ``fp32 [M,
    ceil(K/act_block)]``, b ``uint8 [N, K/2]``, b_s E8M0 ``uint8 [N, K/32]``, out ``bf16 [M, N]``;
    k_step 32, or 128 (act_block 128 only); `split_k` programs along K."""
    m, k = a.shape
    n = b.shape[0]
    _launch_split(_fp4_gemm_kernel, (a, a_s, b, b_s),
                  (a.stride(0), a_s.stride(0), a_s.stride(1), b.stride(0), b_s.stride(0), b_s.stride(1)),
                  out, m, n, k, triton.cdiv(k, k_step), block_m, block_n, num_warps, num_stages, swap_ab, split_k,
                  K_STEP=k_step, ACT_BLOCK=act_block)


def fold_weight(b: torch.Tensor, b_s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fold engine's first phase (`_fp4_fold_kernel`, runs under the interpreter too).

    b: ``uint8 [N, K/2]``, b_s: E8M0 ``uint8 [N, K/32]`` (validated by the caller; K a
    multiple of 32). Returns ``w8 float8_e4m3fn [N, K]`` (per row and 128-K block, each group
    with a nonzero code as ``e2m1 * 2**(e - e_ref)``, ``e_ref = max(max e over those groups - 6,
    1)``, or 0 when ``e - e_ref < -5``: left out), ``w8_s fp32 [N, ceil(K/128)]`` =
    ``2**(e_ref - 127)``, stored K-block-major (strides ``(1, N4)``, N4 = N rounded up to 4: the
    GEMM TMAs a block's scales as one contiguous vector) and ``left int32 [ceil(N/64)]``, nonzero
    where a row of that block of 64 rows (the fixup tile's block_n) had a group left out."""
    n, k = b.shape[0], b.shape[1] * 2
    steps = triton.cdiv(k, 128)
    bn = FP4_FIX_TILE[1]
    w8 = torch.empty(n, k, dtype=torch.float8_e4m3fn, device=b.device)
    # K-block-major with rows padded to 16 bytes: the GEMM streams one block's [BN] vector a
    # pipeline stage by TMA
    w8_s = torch.empty(steps, triton.cdiv(n, 4) * 4, dtype=torch.float32, device=b.device)[:, :n].t()
    left = torch.zeros(triton.cdiv(n, bn), dtype=torch.int32, device=b.device)
    if n and k:
        _fp4_fold_kernel[(triton.cdiv(n, bn), steps)](
            b, b_s, w8, w8_s, left, n, k,
            b.stride(0), b_s.stride(0), b_s.stride(1), w8.stride(0), w8_s.stride(0), w8_s.stride(1),
            BN=bn, num_warps=4,
        )
    return w8, w8_s, left


def fold_fixup(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor, left: torch.Tensor,
               out: torch.Tensor) -> None:
    """The fold engine's exactness pass: the direct kernel over `out` on the `FP4_FIX_TILE`
    grid; programs whose ``left`` flag (``int32 [ceil(N/64)]``) is 0 return at once, the others
    recompute their 128x64 tile exactly and overwrite it. a ``fp8 [M, K]``, a_s ``fp32 [M,
    ceil(K/128)]``, b / b_s as `fp4_gemm` validates them, out ``bf16 [M, N]``."""
    m, k = a.shape
    n = b.shape[0]
    bm, bn, warps, stages, _ = FP4_FIX_TILE
    grid = (triton.cdiv(n, bn),)  # one program per flag: M tiles looped inside
    _fp4_gemm_kernel[grid](
        a, a_s, b, b_s, out, m, n, k, triton.cdiv(k, 128),
        a.stride(0), a_s.stride(0), a_s.stride(1), b.stride(0), b_s.stride(0), b_s.stride(1), 0, out.stride(0),
        BM=bm, BN=bn, SWAP_AB=False, SPLIT_OUT=False, K_STEP=128, ACT_BLOCK=128,
        left_ptr=left, FIXUP=True, num_warps=warps, num_stages=stages,
    )


# --------------------------------------------------------------------------- compile tier
#: The scale tensors are contiguous in production: their K stride is 1, which Triton's
#: launcher specializes as the constant 1, so the compile tier does the same.
_UNIT_STRIDES = {"stride_ask": 1, "stride_bsk": 1}


def compile_configs() -> list[KernelConfig]:
    """Every Triton tile of `tiles` x direct / split-K output, for the compile tier: fp8_gemm's
    kernel; fp4_gemm's direct kernel at each tile x (k_step 128 with act_block 128, k_step 32
    with act_block 32 and 128); the fold engine's fold and fixup. wgmma (QGMMA) is expected
    wherever the MMA's M side is >= 64: the weight tile (BN = 64) under swap-AB, the activation
    tile otherwise."""
    sig8 = {"a_ptr": "*fp8e4nv", "as_ptr": "*fp32", "b_ptr": "*fp8e4nv", "bs_ptr": "*fp32", "c_ptr": "*bf16",
            "M": "i32", "N": "i32", "K": "i32", "steps_per_split": "i32",
            "stride_am": "i32", "stride_asm": "i32", "stride_ask": "constexpr", "stride_bn": "i32",
            "stride_bsn": "i32", "stride_bsk": "constexpr", "stride_cs": "i32", "stride_cm": "i32",
            "BM": "constexpr", "BN": "constexpr", "SWAP_AB": "constexpr", "SPLIT_OUT": "constexpr"}
    # M, steps_per_split and the scale strides (ceil(K/128), 1) are arbitrary
    unaligned = ("M", "steps_per_split", "stride_asm", "stride_bsn", "stride_cs")
    cfgs = []
    for bm, bn, warps, stages, swap in FP8_TRITON_TILES:
        for split in (False, True):
            cfgs.append(KernelConfig(
                f"fp8_gemm[BM={bm},BN={bn},w={warps},s={stages},swap={int(swap)},split={int(split)}]",
                _fp8_gemm_kernel, dict(sig8, c_ptr="*fp32") if split else sig8,
                {"BM": bm, "BN": bn, "SWAP_AB": swap, "SPLIT_OUT": split, **_UNIT_STRIDES},
                num_warps=warps, num_stages=stages,
                expect_sass=("QGMMA",) if (bn if swap else bm) >= 64 else (), unaligned=unaligned))
    sig4 = dict(sig8, b_ptr="*u8", bs_ptr="*u8", K_STEP="constexpr", ACT_BLOCK="constexpr", left_ptr="constexpr",
                FIXUP="constexpr")
    for bm, bn, warps, stages, swap in FP4_TRITON_TILES:
        for k_step, act in ((128, 128), (32, 128), (32, 32)):
            for split in (False, True):
                cfgs.append(KernelConfig(
                    f"fp4_gemm[BM={bm},BN={bn},w={warps},s={stages},swap={int(swap)},kstep={k_step},act={act},"
                    f"split={int(split)}]",
                    _fp4_gemm_kernel, dict(sig4, c_ptr="*fp32") if split else sig4,
                    {"BM": bm, "BN": bn, "SWAP_AB": swap, "SPLIT_OUT": split, "K_STEP": k_step, "ACT_BLOCK": act,
                     "left_ptr": None, "FIXUP": False, **_UNIT_STRIDES},
                    num_warps=warps, num_stages=stages,
                    expect_sass=("QGMMA",) if (bn if swap else bm) >= 64 else (), unaligned=unaligned))
    bm, bn, warps, stages, _ = FP4_FIX_TILE
    cfgs.append(KernelConfig(
        f"fp4_gemm_fold_fixup[BM={bm},BN={bn},w={warps},s={stages}]", _fp4_gemm_kernel, dict(sig4, left_ptr="*i32"),
        {"BM": bm, "BN": bn, "SWAP_AB": False, "SPLIT_OUT": False, "K_STEP": 128, "ACT_BLOCK": 128, "FIXUP": True,
         **_UNIT_STRIDES},
        num_warps=warps, num_stages=stages, expect_sass=("QGMMA",), unaligned=unaligned))
    cfgs.append(KernelConfig(
        f"fp4_gemm_fold[BN={bn},w=4]", _fp4_fold_kernel,
        {"b_ptr": "*u8", "bs_ptr": "*u8", "w8_ptr": "*fp8e4nv", "w8s_ptr": "*fp32", "left_ptr": "*i32",
         "N": "i32", "K": "i32", "stride_bn": "i32", "stride_bsn": "i32", "stride_bsk": "constexpr",
         "stride_wn": "i32", "stride_wsn": "constexpr", "stride_wsk": "i32", "BN": "constexpr"},
        # b_s contiguous, w8_s K-block-major: unit strides, specialized as at runtime
        {"stride_bsk": 1, "stride_wsn": 1, "BN": bn}, num_warps=4,
        unaligned=("N", "stride_bsn", "stride_wsk")))
    return cfgs
