"""FP8 activations x MXFP4 weights (DeepSeek's ``fp4_gemm``): E2M1 weights two a byte with one
E8M0 scale per 32 K, FP8 E4M3 activations with one scale per 128 (or 32) K, BF16 out.

Semantics (reference: `lowbit.reference.fp4_gemm_ref`)::

    fp4_gemm(a, a_s, b, b_s, act_block_size) -> c bf16 [M, N]
        a float8_e4m3fn [M, K], a_s fp32 [M, ceil(K/act_block_size)]   (act_block_size 128 or 32)
        b uint8 [N, K/2] (element 2j in the low nibble), b_s E8M0 uint8 [N, K/32]
        for m, n:
            acc = 0.0                                                    # FP32 running sum
            for g in range(K // 32):                                     # weight groups
                block = sum_k a[m, k] * e2m1(b[n, k])   over the 32 K of group g
                acc  += block * a_s[m, 32g // act_block_size] * 2**(b_s[n, g] - 127)
            c[m, n] = bf16(acc)

The weight is upcast to FP8 E4M3 in registers (every E2M1 value is an E4M3 value) and
multiplied on the FP8 tensor cores. Two K steps, one per ``k_step`` (a `BlockScaledConfig`
field, chosen from act_block_size):

- ``k_step = 32`` (any act_block_size; the only choice for 32): DeepSeek's structure. Each
  step is one weight group: a fresh 32-deep FP8 product, scaled by ``a_s[m] * 2**(e[n]-127)``
  and promoted into the FP32 sum. Exact two-level accumulation, but the promotion costs a
  few CUDA-core operations per output element every 32 K.
- ``k_step = 128`` (act_block_size 128): the weight-group scales are folded into the B
  operand, exactly. Per weight row n and 128-K step, ``e_ref[n] = max(e_max[n] - 6, 1)``
  (``e_max`` over the step's groups with a nonzero code); group g's codes are converted to
  E4M3 as ``e2m1 * 2**(e[n,g] - e_ref[n])``. With the shift in [-5, 6] the result is a normal
  E4M3 number (exponent field 1..15, at most 1.5 * 2**8 = 384): no rounding, no subnormal
  weight operand, built by integer bit operations on the nibble (no float conversion).
  Then one 128-deep FP8 product per step, promoted with ``a_s[m] * 2**(e_ref[n] - 127)``.
  Multiplying a group's partial sum by a power of two is exact in FP32, so this equals the
  reference's per-group scaling up to FP32 summation order (the same freedom any tiling
  has); the tensor cores' limited-precision accumulation still sees at most 128 terms.
  A nonzero group more than 11 binades below the largest nonzero group of its row and step
  (``e < e_ref - 5``) cannot be shifted exactly: it is left out of the folded
  operand (the hot loop only ORs a ``[BN, 4]`` flag) and, if any was, a second pass over the
  program's K range folds the leftovers level by level under lower reference exponents (each
  level takes at least the largest group left in each row, so three more levels exhaust a
  step). Quantized real weights are not expected to take that pass (it needs neighbouring
  group maxima 2**11 apart with the smaller group nonzero); the tests force it.

E8M0 byte 255 (NaN) is not a scale; the kernel does not check for it (that would need a
host sync), and results for such weights are unspecified. Byte 0 is 2**-127, as in the
reference.

Fold engine (``engine="fold"``, act_block_size 128, sm_90 GPU, TMA-able a). The direct
kernel above is slow at large M: its in-register upcast of the weight serializes with the
wgmma (H200, M=4096 N=2304 K=5120: 752 us, 128 TFLOP/s, against 143 us for `fp8_gemm`'s Gluon
engine on FP8 weights of the same shape). The fold engine splits the work in two phases:

1. `_fp4_fold_kernel` writes the k_step 128 operand once per call, with the same jit helpers
   (`_load_fold_step`, `_fold_level` level 0, `_fold_operand`): ``w8 float8_e4m3fn [N, K]``,
   the row scales ``w8_s fp32 [N, ceil(K/128)] = 2**(e_ref - 127)`` and one flag per 64
   weight rows, set where a group of those rows was left out (``e < e_ref - 5``). That moves
   ~1.5 * N * K bytes (read N*K/2 + N*K/32, write N*K; 17.7 MB at N=2304 K=5120), measured
   18-19 us on the H200 (about a quarter of its bandwidth: room left), amortized over M rows;
   the GEMM then reads N*K bytes of weight instead of N*K/2.
2. `fp8_gemm_sm90`'s Gluon kernels with per-row weight scales (``B_SCALE_PER_ROW``): per 128-K
   block ``acc += (a @ w8^T) * a_s[m] * w8_s[n]``; each block's [BN] scale vector rides the
   TMA ring. H200 M=4096 (eleventh session): ~103 us against ~86 for the 128x128-block-scaled
   `fp8_gemm` on the same shapes (the per-row promotion is two operations an element).
3. Exactness: `_fp4_gemm_kernel` with ``FIXUP``, one program per 64 weight rows: it reads
   their flag and returns at once when it is 0, else recomputes those output columns exactly
   (the 128x64 prefill tile, k_step 128 with the leftover pass, M tile after M tile: slow, but
   real weights are not expected to set a flag) and overwrites them. No host readback
   anywhere (CUDA-graph capturable).

Phase 1 depends on the weight only: `fold_fp4_weight` runs it once (at weight-load time, as
Humming's ``transform()``) and returns a `FoldedFp4Weight` that `fp4_gemm` takes in place of
``(b, b_s)``; the call is then the GEMM alone, plus the fixup only where the fold left a group
out (read once, at preparation). On sm_90 it takes that engine at every M (decode too: its
GEMM alone beats the mma engine there); non-Hopper devices run their own engines on the
original weight the object keeps.

Heuristics (`fp4_gemm_config`): M <= 64: the swap-AB decode tile of `fp8_gemm` (64 weight
rows on the wgmma M side, 8 warps at 64 activation rows); larger M: 128x64 tiles, 8 warps
(128x128 spills with the upcast in registers); the split-K grid-fill rule on the weight's
bytes; k_step from act_block_size. With ``gluon=True`` (the launcher passes `fold_capable`),
act_block_size 128 and M > 64 (any M with ``folded=True``: a `FoldedFp4Weight`): the fold
engine on `fp8_gemm`'s Gluon tile and K split for the shape (`fp8_gemm.gluon_tile`); H200
(twelfth session, bench beside Humming's W4A8, folded weight): M=16 / 64 / 128 / 4096 1.13 /
1.15 / 1.21 / 1.23x at (2304, 5120), 1.17 / 1.22 / 1.35 / 1.10x at (5120, 2304); H200
(eleventh session, CUDA graph, beside Humming's W4A8): M=4096 (N, K) = (2304, 5120) / (5120,
2304) 120.1 / 122.5 us per call with the fold, 102.8 / 104.4 on a weight folded once
(`fold_fp4_weight`), Humming 122.3 / 116.9; M=128 38.7 / 31.4, folded 21.4 / 13.7, Humming
19.0 / 18.6. With ``mma=True`` (the launcher passes `mma_capable`: an sm_90 GPU, K % 128 ==
0, aligned rows), act_block_size 128, M <= 64 and a raw weight: the decode mma engine
(`lowbit.kernels.block_scaled.hopper_fp4`: f16 mma.sync on exact E2M1 / E4M3 values, each group's scale applied to its partial in FP32; tiles `DECODE_MMA_TILES`, K split
to ~3.5 programs an SM); H200 (tenth session, CUDA graph, beside Humming's W4A8): M=16 14.1 /
14.3 us against 35.4 / 43.2 for the direct kernel and 15.0 / 15.1 for Humming; M=64 19.6 /
19.3 against 67.0 / 59.2 and 16.4 / 16.8. Memoized with the ``LOWBIT_FP4_GEMM_*`` overrides
in the key (ENGINE included: ``fold`` / ``mma`` / ``triton`` force an engine where it can run).
The direct kernel's tiles come from the compile tier's register and shared-memory reports.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import torch
import triton
import triton.language as tl

from ...formats.fp8 import e8m0_encode
from ...formats.base import FormatError
from ...runtime import numerics
from .fp8 import (
    _UNIT_STRIDES,
    H200_NUM_SMS,
    BlockScaledConfig,
    check_config,
    check_devices,
    check_fp8_operand,
    check_out,
    decode_tile,
    gluon_tile,
    launch_block_scaled,
    num_sms,
    scales_fp32,
    split_blocks,
    split_k_for,
    store_block_scaled_tile,
)
from ...runtime.device import is_sm90_native, require_sm90, tma_problem
from ...runtime.overrides import apply_env_overrides, env_key, override_names, overridden

__all__ = ["fp4_gemm", "fold_fp4_weight", "FoldedFp4Weight", "fp4_gemm_config", "explain_fp4_gemm_config", "ENV_OVERRIDES", "WEIGHT_GROUP"]

#: K elements per E8M0 weight scale (MXFP4).
WEIGHT_GROUP = 32
#: Lowest exponent shift of a group folded into the FP8 operand (0.5 * 2**-5 = 2**-6, the
#: smallest normal E4M3 value); the highest is 6 (6 * 2**6 = 384 <= 448).
_FOLD_MIN_SHIFT = -5
_FOLD_MAX_SHIFT = 6


# --------------------------------------------------------------------------- kernels
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


# --------------------------------------------------------------------------- configuration
_FIELDS = ("block_m", "block_n", "num_warps", "num_stages", "swap_ab", "split_k", "k_step", "engine")
#: The tuning overrides read by `fp4_gemm_config` (each is part of the memo key).
ENV_OVERRIDES = override_names("FP4_GEMM", _FIELDS)

#: The fold engine's fixup tile: the direct kernel's prefill tile, exact k_step 128 path, no
#: split-K (it overwrites output tiles). Its block_n is also the fold's rows per leftover flag.
_FIX_TILE = BlockScaledConfig(128, 64, 8, 3, False, k_step=128)
#: The decode mma engine's tiles (`fp4_decode_sm90`), by padded activation rows (the MMA's N
#: side, a power of two >= 16): (cols, num_warps (16 weight rows each), ring stages). H200,
#: 2026-11-30, CUDA graph (`scripts/sweeps/fp4_gemm_mma.json`): M=16 (N, K) = (2304, 5120) /
#: (5120, 2304): 4 warps 14.0 / 14.0 us, 2 warps 15.0 / 14.3, 3 or 6 stages within 0.5 us;
#: M=64: 4 warps 4 stages 19.6 / 19.3, 3 stages 19.9 / 19.9, 2 warps 21.3-23.2. M=32: not
#: measured (the M=16 tile's shape with 32 columns).
DECODE_MMA_TILES = {16: (16, 4, 4), 32: (32, 4, 4), 64: (64, 4, 4)}


def _mma_tile_problem(cfg: BlockScaledConfig, m: int) -> str | None:
    """Why `cfg` is not a tile of the mma engine for M rows (None when it is): block_m (the
    padded activation rows) 16 / 32 / 64 and >= M, block_n = 16 * num_warps with 1-8 warps,
    2-8 stages, split_k >= 1 (overrides may reach tiles beside `DECODE_MMA_TILES`)."""
    if cfg.block_m not in DECODE_MMA_TILES or cfg.block_m < m:
        return f"block_m must be one of {sorted(DECODE_MMA_TILES)} and >= M={m}, got {cfg.block_m}"
    if cfg.num_warps not in (1, 2, 4, 8) or cfg.block_n != 16 * cfg.num_warps:
        return f"block_n must be 16 * num_warps (1-8 warps), got {cfg.block_n} with {cfg.num_warps} warps"
    if not 2 <= cfg.num_stages <= 8 or cfg.split_k < 1:
        return f"num_stages must be 2-8 and split_k >= 1, got {cfg.num_stages}, {cfg.split_k}"
    return None


def _direct_config(m: int, n: int, k: int, act_block_size: int, sms: int) -> BlockScaledConfig:
    """The Triton kernel's configuration (engine "triton"), before the overrides."""
    if act_block_size == 128:
        k_step, kwhy = 128, "k_step 128: group scales folded exactly into the FP8 weight operand"
    else:
        k_step, kwhy = 32, "k_step 32: 1x32 activation scales force a promotion per weight group"
    if m <= 64:
        bm, bn, why = decode_tile(m)
        # memory-bound: a 128-K step moves only 64 * 64 B of weight; 6 stages keep more bytes
        # in flight (smem per stage <= 12 KB). At BM=64 the in-register upcast of the weight
        # plus two [64, 64] FP32 accumulators spill with 4 warps (compile tier): 8 warps.
        cfg = BlockScaledConfig(bm, bn, 8 if bm >= 64 else 4, 6, True, reason=why)
    else:
        # 128x64, two warpgroups of 64 rows: each upcast weight row serves 128 activation rows
        # (64x128 would upcast every weight row twice as often), and 128x128 spills with the
        # upcast in registers (compile tier: 255 registers + spills at 8 warps)
        cfg = BlockScaledConfig(128, 64, 8, 3, False, reason=(
            f"M={m}: 128x64 tiles, two warpgroups; one upcast weight tile serves 128 rows"))
    steps = triton.cdiv(k, k_step)
    programs = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    split, swhy = split_k_for(programs, steps, sms, triton.cdiv(m, cfg.block_m) * cfg.block_m, n, n * k // 2,
                              min_steps=512 // k_step)
    return replace(cfg, split_k=split, k_step=k_step, reason=f"{cfg.reason}; {kwhy}; {swhy}")


def _fold_config(m: int, n: int, k: int, sms: int, reason: str) -> BlockScaledConfig:
    """The fold engine on the Gluon tile and K split `fp8_gemm` picks for the same shape
    (`fp8_gemm.gluon_tile`)."""
    bm, bn, warps, stages, split, why = gluon_tile(m, n, k, sms)
    return BlockScaledConfig(bm, bn, warps, stages, False, split_k=split, k_step=128, engine="fold",
                             reason=f"{reason}; {why}")


def _mma_config(m: int, n: int, k: int, sms: int) -> BlockScaledConfig:
    """The decode mma engine's configuration: `DECODE_MMA_TILES` by M; K split so the grid
    holds about 3.5 programs an SM, the splits equalized. H200, CUDA graph, M=16 (2026-11-30,
    `scripts/sweeps/fp4_gemm_mma.json`, before the inline-PTX conversions): (N, K) = (2304,
    5120) split 4 / 10 / 14 / 20: 19.0 / 15.8 / - / 17.7 us; (5120, 2304) split 2 / 6 / 9: 17.9 /
    15.2 / 16.0 us; after them, 14.0 (split 10) vs 14.6 (14), 14.0 (6) vs 14.1 (9); M=64 split
    4 instead of 7 / 4: 25.1 / 22.4 vs 21.3 / 21.1 us (2-warp tile)."""
    cols, warps, stages = DECODE_MMA_TILES[max(16, triton.next_power_of_2(m))]
    programs = triton.cdiv(n, 16 * warps)
    steps = k // 128
    per, split = split_blocks(steps, triton.cdiv(7 * sms, 2 * programs), even=False)
    return BlockScaledConfig(cols, 16 * warps, warps, stages, True, split_k=split, k_step=128, engine="mma", reason=(
        f"decode M={m} on sm_90: mma engine (f16 mma.sync on exact E2M1 / E4M3 values, group and block scales "
        f"in FP32), {16 * warps} weight rows x {cols} activation rows a program; {programs} programs x split K "
        f"{split} ({per} steps each): ~3.5 programs an SM"))


@lru_cache(maxsize=4096)
def _config_cached(m: int, n: int, k: int, act_block_size: int, sms: int, gluon: bool, mma: bool,
                   env: tuple, folded: bool = False) -> BlockScaledConfig:
    direct = _direct_config(m, n, k, act_block_size, sms)
    # A weight folded once (`fold_fp4_weight`) takes the fold engine at every M: its GEMM alone
    # beats the mma engine at decode. H200, twelfth session (`scripts/probes/small_m_split.py`),
    # us, (N, K) = (2304, 5120) / (5120, 2304), folded at `fp8_gemm.gluon_split_k`'s split vs mma:
    # M=16 13.5 / 12.9 vs 15.1 / 14.5; M=64 14.4 / 13.7 vs 24.5 / 22.0 (Humming W4A8 16.5 / 16.8).
    fold = gluon and act_block_size == 128 and (m > 64 or folded)
    use_mma = mma and act_block_size == 128 and m <= 64 and k % 128 == 0 and not fold
    if fold:
        # H200, sixth session, CUDA graph, us (fold engine vs the direct Triton kernel):
        #   M=4096 (N, K) = (2304, 5120) / (5120, 2304): 190.7 / 195.0 vs 754.6 / 714.1 (the
        #     Gluon GEMM with per-row scales 174-179, the fold 18-19, the empty fixup 5);
        #     Humming's W4A8 123.6 / 117.4, fp8_gemm on FP8 weights 145-153
        #   M=128: 51.6 / 37.6 vs 94.8 / 42.0 (`scripts/sweeps/fp4_gemm_fold.json`, measured
        #     before the per-row scales moved into the TMA ring, which took M=4096 from 223 to 191)
        # Decode (M <= 64) per call stays on the mma engine: the fold's ~18 us alone is more
        # than its GEMM.
        cfg = _fold_config(m, n, k, sms, f"M={m} on sm_90: fold engine (weight folded to FP8 once, `fp8_gemm_sm90` "
                                      f"with per-row scales, exact fixup of leftover groups; H200 M=4096 3.7-4.0x "
                                      f"the direct kernel, M=128 1.1-1.8x)")
    elif use_mma:
        cfg = _mma_config(m, n, k, sms)
    else:
        cfg = direct
    cfg = apply_env_overrides(cfg, "FP4_GEMM", _FIELDS)
    if (fold or use_mma) and cfg.engine == "triton":  # LOWBIT_FP4_GEMM_ENGINE=triton: the direct kernel's own tile
        cfg = apply_env_overrides(direct, "FP4_GEMM", _FIELDS)
    return _fit_engine(cfg, m, n, k, act_block_size, sms, use_mma, direct)


def _fit_engine(cfg: BlockScaledConfig, m: int, n: int, k: int, act_block_size: int, sms: int, mma_ok: bool,
                direct: BlockScaledConfig) -> BlockScaledConfig:
    """``LOWBIT_FP4_GEMM_ENGINE=fold`` / ``mma`` work as global switches (as fp8_gemm's
    ``gluon``): a shape the engine has no tile for runs the engine's own tile and split (fold:
    `_fold_config`, any M; mma: where `mma_ok`); other shapes stay on the Triton kernel, with
    the reason said."""
    if cfg.engine == "mma":
        if not mma_ok:
            return replace(direct, reason=f"{direct.reason}; the mma engine needs M <= 64, act_block_size 128, "
                                          f"K % 128 == 0 and an sm_90 GPU with aligned operands: triton")
        problem = _mma_tile_problem(cfg, m)
        if problem:
            base = _mma_config(m, n, k, sms)
            return replace(base, split_k=cfg.split_k, reason=f"{cfg.reason}; {problem}: mma tile {base.block_m} x "
                                                            f"{base.block_n}")
        return cfg
    if cfg.engine != "fold":
        return cfg
    if act_block_size != 128:
        return replace(cfg, engine="triton", reason=f"{cfg.reason}; fold needs act_block_size 128: triton")
    from .hopper_fp8 import GLUON_TILES  # noqa: PLC0415 (Gluon imported only when asked for)

    if (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) in GLUON_TILES and not cfg.swap_ab \
            and (cfg.split_k == 1 or cfg.block_m == 64) and cfg.k_step == 128:
        return cfg
    base = _fold_config(m, n, k, sms, f"{cfg.reason}; fold runs a tile of fp8_gemm_sm90.GLUON_TILES")
    if overridden("FP4_GEMM", "split_k") and base.block_m == 64:
        base = replace(base, split_k=cfg.split_k)  # an asked-for split survives onto the 64x128 tile
    return base


def fp4_gemm_config(m: int, n: int, k: int, act_block_size: int = 128, sms: int = H200_NUM_SMS,
                    gluon: bool = False, mma: bool = False, folded: bool = False) -> BlockScaledConfig:
    """Launch configuration of `fp4_gemm`, memoized per shape, act_block_size, SM count, `gluon`,
    `mma` and the ``LOWBIT_FP4_GEMM_*`` overrides (BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES,
    SWAP_AB, SPLIT_K, K_STEP, ENGINE). gluon: the fold engine may be chosen (a Hopper GPU,
    TMA-able activations); prefill shapes with act_block_size 128 then get it by default.
    mma: the decode mma engine may be chosen (a Hopper GPU, operands `fp4_decode_sm90` takes);
    decode shapes (M <= 64) with act_block_size 128 and K % 128 == 0 then get it. folded: the
    weight is a `FoldedFp4Weight`; with `gluon`, the fold engine (without its fold) at every M."""
    if act_block_size not in (32, 128):
        raise ValueError(f"act_block_size must be 32 or 128, got {act_block_size}")
    return _config_cached(m, n, k, act_block_size, sms, gluon, mma, env_key("FP4_GEMM", _FIELDS), folded)


def explain_fp4_gemm_config(m: int, n: int, k: int, act_block_size: int = 128, sms: int = H200_NUM_SMS,
                            gluon: bool = False, mma: bool = False, folded: bool = False) -> str:
    c = fp4_gemm_config(m, n, k, act_block_size, sms, gluon, mma, folded)
    return (f"fp4_gemm M={m} N={n} K={k} act_block={act_block_size}: block_m={c.block_m} block_n={c.block_n} "
            f"warps={c.num_warps} stages={c.num_stages} swap_ab={c.swap_ab} split_k={c.split_k} "
            f"k_step={c.k_step} engine={c.engine} -- {c.reason}")


def mma_capable(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor, act_block_size: int) -> bool:
    """Whether the decode mma engine can run these (validated) operands: an sm_90 GPU and
    `fp4_decode_sm90.decode_mma_problem` None."""
    if not is_sm90_native(a.device):
        return False
    from .hopper_fp4 import decode_mma_problem

    return decode_mma_problem(a, a_s, b, b_s, act_block_size) is None


def _launch_mma(a, a_s, b, b_s, out, config: BlockScaledConfig, act_block_size: int, who: str) -> None:
    """The decode mma engine, after checking what a hand-made config may get wrong."""
    require_sm90(a.device, f"{who} engine='mma'")
    from .hopper_fp4 import decode_mma_launch, decode_mma_problem

    problem = decode_mma_problem(a, a_s, b, b_s, act_block_size)
    if problem:
        raise ValueError(f"{who}: engine='mma' {problem}")
    problem = _mma_tile_problem(config, a.shape[0])
    if problem:
        raise ValueError(f"{who}: engine='mma': {problem}")
    decode_mma_launch(a, a_s, b, b_s, out, config.block_m, config.num_warps, config.num_stages, config.split_k)


def fold_capable(a: torch.Tensor) -> bool:
    """Whether the fold engine can run with these activations (sm_90 GPU, TMA-able a; the
    folded weight is allocated here, so always TMA-able)."""
    return is_sm90_native(a.device) and tma_problem(a, "a") is None


# --------------------------------------------------------------------------- launcher
def _weight_bytes(b, who: str) -> torch.Tensor:
    if not isinstance(b, torch.Tensor):
        raise TypeError(f"{who}: b must be a torch.Tensor, got {type(b).__name__}")
    if b.dtype == getattr(torch, "float4_e2m1fn_x2", None):
        b = b.view(torch.uint8)
    if b.dtype != torch.uint8:
        raise TypeError(f"{who}: b must be packed FP4 E2M1, uint8 or float4_e2m1fn_x2 [N, K/2], got {b.dtype}")
    if b.dim() != 2:
        raise ValueError(f"{who}: b must be 2-D [N, K/2], got shape {tuple(b.shape)}")
    if b.shape[1] > 1 and b.stride(1) != 1:
        raise ValueError(f"{who}: b must be contiguous along K, got strides {b.stride()}")
    return b


def _weight_scales(b_s, n: int, groups: int, who: str) -> torch.Tensor:
    if not isinstance(b_s, torch.Tensor):
        raise TypeError(f"{who}: b_s must be a torch.Tensor, got {type(b_s).__name__}")
    if b_s.dtype == getattr(torch, "float8_e8m0fnu", None):
        b_s = b_s.view(torch.uint8)
    elif b_s.dtype == torch.float32:
        try:  # decoded powers of two, as the reference accepts: re-encode (one torch op, a sync)
            b_s = e8m0_encode(b_s)
        except FormatError as exc:
            raise ValueError(f"{who}: float32 b_s must hold powers of two (E8M0 values): {exc}") from None
    elif b_s.dtype != torch.uint8:
        raise TypeError(f"{who}: b_s must be E8M0 (uint8 or float8_e8m0fnu) [N, K/32], got {b_s.dtype}")
    if tuple(b_s.shape) != (n, groups):
        raise ValueError(f"{who}: b_s must have shape {(n, groups)} ([N, K/32]: one E8M0 scale per 32 K), "
                         f"got {tuple(b_s.shape)}")
    return b_s


@dataclass(frozen=True, eq=False)
class FoldedFp4Weight:
    """An MXFP4 weight with the fold engine's first phase done (`fold_fp4_weight`).

    b: ``uint8 [N, K/2]`` and b_s: E8M0 ``uint8 [N, K/32]``, the weight as given (decode
    engines, the direct kernel and the exact fixup read it); w8: ``float8_e4m3fn [N, K]``,
    w8_s: ``fp32 [N, ceil(K/128)]`` (K-block-major), left: ``int32 [ceil(N/64)]``: the fold
    (`_fold_weight`); needs_fixup: whether any flag of `left` is set."""

    b: torch.Tensor
    b_s: torch.Tensor
    w8: torch.Tensor
    w8_s: torch.Tensor
    left: torch.Tensor
    needs_fixup: bool

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K) of the weight."""
        return self.b.shape[0], self.b.shape[1] * 2


def fold_fp4_weight(b: torch.Tensor, b_s: torch.Tensor) -> FoldedFp4Weight:
    """Prepare an MXFP4 weight for `fp4_gemm` once: b ``uint8`` / ``float4_e2m1fn_x2 [N, K/2]``
    (K a multiple of 32), b_s E8M0 ``uint8`` / ``float8_e8m0fnu [N, K/32]`` (or FP32 powers of
    two). Runs the fold (`_fp4_fold_kernel`; under the interpreter too) and reads its flags
    back once (a host sync: call it at load time, not inside a captured graph). The result
    stands for ``(b, b_s)`` in every `fp4_gemm` call and gives the same output."""
    who = "fold_fp4_weight"
    b = _weight_bytes(b, who)
    n, k = b.shape[0], b.shape[1] * 2
    if k % WEIGHT_GROUP:
        raise ValueError(f"{who}: K={k} must be a multiple of {WEIGHT_GROUP} (MXFP4 groups)")
    b_s = _weight_scales(b_s, n, k // WEIGHT_GROUP, who)
    check_devices(who, b=b, b_s=b_s)
    w8, w8_s, left = _fold_weight(b, b_s)
    return FoldedFp4Weight(b, b_s, w8, w8_s, left, bool(left.any()))


def fp4_gemm(
    a: torch.Tensor,
    a_s: torch.Tensor,
    b: torch.Tensor | FoldedFp4Weight,
    b_s: torch.Tensor | None = None,
    act_block_size: int = 128,
    *,
    out: torch.Tensor | None = None,
    config: BlockScaledConfig | None = None,
) -> torch.Tensor:
    """FP8 x MXFP4 GEMM ``c = (a * a_s) @ (e2m1(b) * 2**(b_s - 127))^T`` in BF16 (module doc).

    a: ``float8_e4m3fn [M, K]`` (K contiguous, K a multiple of 32); a_s:
    ``[M, ceil(K/act_block_size)]`` FP32 (or E8M0 bytes, decoded by a torch op); b: ``uint8``
    or ``float4_e2m1fn_x2 [N, K/2]``; b_s: E8M0 ``uint8`` / ``float8_e8m0fnu [N, K/32]`` (FP32
    powers of two are re-encoded on the host), or b a `FoldedFp4Weight` and b_s None (the fold
    engine then skips its first phase); act_block_size: 128 or 32. out: optional
    ``bf16 [M, N]``; config: a `BlockScaledConfig` instead of the heuristic's (k_step 128 needs
    act_block_size 128; engine ``"fold"`` needs act_block_size 128, an sm_90 GPU and TMA-able
    a). Returns ``bf16 [M, N]``."""
    who = "fp4_gemm"
    check_fp8_operand(a, "a", who)
    folded = None
    if isinstance(b, FoldedFp4Weight):
        if b_s is not None:
            raise ValueError(f"{who}: a FoldedFp4Weight carries its scales: pass b_s=None")
        folded, b, b_s = b, b.b, b.b_s
    elif b_s is None:
        raise TypeError(f"{who}: b_s is required unless b is a FoldedFp4Weight (fold_fp4_weight)")
    b = _weight_bytes(b, who)
    if act_block_size not in (32, 128):
        raise ValueError(f"{who}: act_block_size must be 32 or 128, got {act_block_size}")
    m, k = a.shape
    n = b.shape[0]
    if k % WEIGHT_GROUP:
        raise ValueError(f"{who}: K={k} (a {tuple(a.shape)}) must be a multiple of {WEIGHT_GROUP} (MXFP4 groups)")
    if b.shape[1] * 2 != k:
        raise ValueError(f"{who}: b {tuple(b.shape)} must be [N, K/2] = [{n}, {k // 2}] for a {tuple(a.shape)}")
    a_s = scales_fp32(a_s, "a_s", who, (m, triton.cdiv(k, act_block_size)),
                      f"[M, ceil(K/{act_block_size})]: activation scales")
    b_s = _weight_scales(b_s, n, k // WEIGHT_GROUP, who)
    check_devices(who, a=a, a_s=a_s, b=b, b_s=b_s)
    out = check_out(out, m, n, a.device, who)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if config is None:
        config = fp4_gemm_config(m, n, k, act_block_size, num_sms(a.device), fold_capable(a),
                                 mma_capable(a, a_s, b, b_s, act_block_size), folded is not None)
    if config.engine == "mma":
        _launch_mma(a, a_s, b, b_s, out, config, act_block_size, who)
        return out
    check_config(config, who, k_steps=(32, 128), engines=("triton", "fold"))
    if config.engine == "fold":
        if act_block_size != 128:
            raise ValueError(f"{who}: engine='fold' folds the weight scales over 128-K blocks and needs "
                             f"act_block_size=128, got {act_block_size}")
        if config.k_step != 128:
            raise ValueError(f"{who}: engine='fold' has 128-K steps (k_step=128), got k_step={config.k_step}")
        _launch_fold(a, a_s, b, b_s, out, config, who, folded)
        return out
    if config.k_step == 128 and act_block_size != 128:
        raise ValueError(f"{who}: k_step=128 folds the weight scales over a whole activation group and "
                         f"needs act_block_size=128, got {act_block_size}")
    launch_block_scaled(_fp4_gemm_kernel, (a, a_s, b, b_s), out, m, n, triton.cdiv(k, config.k_step), config,
                        (a.stride(0), a_s.stride(0), a_s.stride(1), b.stride(0), b_s.stride(0), b_s.stride(1)),
                        {"K_STEP": config.k_step, "ACT_BLOCK": act_block_size}, k)
    return out


def _fold_weight(b: torch.Tensor, b_s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fold engine's first phase (`_fp4_fold_kernel`, runs under the interpreter too).

    b: ``uint8 [N, K/2]``, b_s: E8M0 ``uint8 [N, K/32]`` (validated by `fp4_gemm`; K a
    multiple of 32). Returns ``w8 float8_e4m3fn [N, K]`` (per row and 128-K block, each group
    with a nonzero code as ``e2m1 * 2**(e - e_ref)``, ``e_ref = max(max e over those groups - 6,
    1)``, or 0 when ``e - e_ref < -5``: left out), ``w8_s fp32 [N, ceil(K/128)]`` =
    ``2**(e_ref - 127)``, stored K-block-major (strides ``(1, N4)``, N4 = N rounded up to 4: the GEMM TMAs a block's
    scales as one contiguous vector) and ``left int32 [ceil(N/64)]``, nonzero where a row of
    that block of 64 rows (the fixup tile's block_n) had a group left out."""
    n, k = b.shape[0], b.shape[1] * 2
    steps = triton.cdiv(k, 128)
    bn = _FIX_TILE.block_n
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


def _fold_fixup(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor, left: torch.Tensor,
               out: torch.Tensor) -> None:
    """The fold engine's exactness pass: the direct kernel over `out` on the `_FIX_TILE` grid;
    programs whose ``left`` flag (``int32 [ceil(N/64)]``) is 0 return at once, the others
    recompute their 128x64 tile exactly and overwrite it. a ``fp8 [M, K]``, a_s ``fp32 [M,
    ceil(K/128)]``, b / b_s as `fp4_gemm` validates them, out ``bf16 [M, N]``."""
    m, k = a.shape
    n = b.shape[0]
    t = _FIX_TILE
    grid = (triton.cdiv(n, t.block_n),)  # one program per flag: M tiles looped inside
    _fp4_gemm_kernel[grid](
        a, a_s, b, b_s, out, m, n, k, triton.cdiv(k, 128),
        a.stride(0), a_s.stride(0), a_s.stride(1), b.stride(0), b_s.stride(0), b_s.stride(1), 0, out.stride(0),
        BM=t.block_m, BN=t.block_n, SWAP_AB=False, SPLIT_OUT=False, K_STEP=128, ACT_BLOCK=128,
        left_ptr=left, FIXUP=True, num_warps=t.num_warps, num_stages=t.num_stages,
    )


def _launch_fold(a, a_s, b, b_s, out, config: BlockScaledConfig, who: str,
                 folded: FoldedFp4Weight | None = None) -> None:
    """Fold, Gluon GEMM on the folded weight, fixup: three launches, no host sync; with a
    `FoldedFp4Weight` the GEMM, and the fixup only where it needs one."""
    require_sm90(a.device, f"{who} (engine='fold' runs a Gluon GEMM)")
    # Gluon imported only when asked for
    from .hopper_fp8 import fp8_gemm_sm90_launch

    why = tma_problem(a, "a")
    if why:
        raise ValueError(f"{who}: engine='fold' loads a through TMA: {why}")
    m, k = a.shape
    n = b.shape[0]
    if folded is None:
        w8, w8_s, left = _fold_weight(b, b_s)
    else:
        check_devices(who, a=a, w8=folded.w8)
        w8, w8_s, left = folded.w8, folded.w8_s, folded.left
    fp8_gemm_sm90_launch(a, a_s, w8, w8_s, out, m, n, k, config.block_m, config.block_n, config.num_warps,
                         config.num_stages, b_scale_per_row=True, split_k=config.split_k)
    if folded is None or folded.needs_fixup:
        _fold_fixup(a, a_s, b, b_s, left, out)


# --------------------------------------------------------------------------- compile tier
def production_tiles() -> list[BlockScaledConfig]:
    """Every tile the heuristics can pick (k_step and split_k vary at runtime), k_step 128."""
    tiles = [_config_cached(m, 4096, 7168, 128, 10**6, False, False, ()) for m in (1, 17, 33, 4096)]
    return [replace(t, split_k=1, reason="") for t in tiles]


def compile_configs():
    """Every configuration `fp4_gemm_config` can pick: each M tile x (k_step 128 with
    act_block 128, k_step 32 with act_block 32 and 128) x (direct, split-K) output; and the
    fold engine's own kernels: the fold and the fixup (the prefill tile behind its flag; its
    Gluon GEMM is `fp8_gemm_sm90`'s per-row variant). QGMMA is expected wherever the MMA's M
    side is >= 64 (every production tile)."""
    from ..compile_tier import KernelConfig

    sig = {"a_ptr": "*fp8e4nv", "as_ptr": "*fp32", "b_ptr": "*u8", "bs_ptr": "*u8", "c_ptr": "*bf16",
           "M": "i32", "N": "i32", "K": "i32", "steps_per_split": "i32",
           "stride_am": "i32", "stride_asm": "i32", "stride_ask": "constexpr", "stride_bn": "i32",
           "stride_bsn": "i32", "stride_bsk": "constexpr", "stride_cs": "i32", "stride_cm": "i32",
           "BM": "constexpr", "BN": "constexpr", "SWAP_AB": "constexpr", "SPLIT_OUT": "constexpr",
           "K_STEP": "constexpr", "ACT_BLOCK": "constexpr", "left_ptr": "constexpr", "FIXUP": "constexpr"}
    unaligned = ("M", "steps_per_split", "stride_asm", "stride_bsn", "stride_cs")
    cfgs = []
    for t in production_tiles():
        for k_step, act in ((128, 128), (32, 128), (32, 32)):
            for split in (False, True):
                s = dict(sig, c_ptr="*fp32") if split else sig
                mma_m = t.block_n if t.swap_ab else t.block_m
                cfgs.append(KernelConfig(
                    f"fp4_gemm[BM={t.block_m},BN={t.block_n},w={t.num_warps},s={t.num_stages},"
                    f"swap={int(t.swap_ab)},kstep={k_step},act={act},split={int(split)}]",
                    _fp4_gemm_kernel, s,
                    {"BM": t.block_m, "BN": t.block_n, "SWAP_AB": t.swap_ab, "SPLIT_OUT": split,
                     "K_STEP": k_step, "ACT_BLOCK": act, "left_ptr": None, "FIXUP": False, **_UNIT_STRIDES},
                    num_warps=t.num_warps, num_stages=t.num_stages,
                    expect_sass=("QGMMA",) if mma_m >= 64 else (), unaligned=unaligned))
    t = _FIX_TILE
    cfgs.append(KernelConfig(
        f"fp4_gemm_fold_fixup[BM={t.block_m},BN={t.block_n},w={t.num_warps},s={t.num_stages}]", _fp4_gemm_kernel,
        dict(sig, left_ptr="*i32"),
        {"BM": t.block_m, "BN": t.block_n, "SWAP_AB": False, "SPLIT_OUT": False, "K_STEP": 128, "ACT_BLOCK": 128,
         "FIXUP": True, **_UNIT_STRIDES},
        num_warps=t.num_warps, num_stages=t.num_stages, expect_sass=("QGMMA",), unaligned=unaligned))
    cfgs.append(KernelConfig(
        f"fp4_gemm_fold[BN={t.block_n},w=4]", _fp4_fold_kernel,
        {"b_ptr": "*u8", "bs_ptr": "*u8", "w8_ptr": "*fp8e4nv", "w8s_ptr": "*fp32", "left_ptr": "*i32",
         "N": "i32", "K": "i32", "stride_bn": "i32", "stride_bsn": "i32", "stride_bsk": "constexpr",
         "stride_wn": "i32", "stride_wsn": "constexpr", "stride_wsk": "i32", "BN": "constexpr"},
        # b_s contiguous, w8_s K-block-major: unit strides, specialized as at runtime
        {"stride_bsk": 1, "stride_wsn": 1, "BN": t.block_n}, num_warps=4,
        unaligned=("N", "stride_bsn", "stride_wsk")))
    return cfgs
