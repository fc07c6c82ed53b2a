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

Heuristics (`fp4_gemm_config`): M <= 64: the swap-AB decode tile of `fp8_gemm` (64 weight
rows on the wgmma M side, 8 warps at 64 activation rows); larger M: 128x64 tiles, 8 warps
(128x128 spills with the upcast in registers); the split-K grid-fill rule on the weight's
bytes; k_step from act_block_size. Memoized with the ``LOWBIT_FP4_GEMM_*`` overrides in the
key. **Nothing here has run on a GPU yet**: the tiles are chosen from the compile tier's
register and shared-memory reports only, and need a measured sweep.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import torch
import triton
import triton.language as tl

from ..formats.fp8 import e8m0_encode
from ..formats.base import FormatError
from . import numerics
from .fp8_gemm import (
    _UNIT_STRIDES,
    H200_NUM_SMS,
    BlockScaledConfig,
    check_config,
    check_devices,
    check_fp8_operand,
    check_out,
    decode_tile,
    launch_block_scaled,
    num_sms,
    scales_fp32,
    split_k_for,
    store_block_scaled_tile,
)
from .tuning import apply_env_overrides, env_key, override_names

__all__ = ["fp4_gemm", "fp4_gemm_config", "explain_fp4_gemm_config", "ENV_OVERRIDES", "WEIGHT_GROUP"]

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
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
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


# --------------------------------------------------------------------------- configuration
_FIELDS = ("block_m", "block_n", "num_warps", "num_stages", "swap_ab", "split_k", "k_step")
#: The tuning overrides read by `fp4_gemm_config` (each is part of the memo key).
ENV_OVERRIDES = override_names("FP4_GEMM", _FIELDS)


@lru_cache(maxsize=4096)
def _config_cached(m: int, n: int, k: int, act_block_size: int, sms: int, env: tuple) -> BlockScaledConfig:
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
    cfg = replace(cfg, split_k=split, k_step=k_step, reason=f"{cfg.reason}; {kwhy}; {swhy}")
    return apply_env_overrides(cfg, "FP4_GEMM", _FIELDS)


def fp4_gemm_config(m: int, n: int, k: int, act_block_size: int = 128, sms: int = H200_NUM_SMS) -> BlockScaledConfig:
    """Launch configuration of `fp4_gemm`, memoized per shape, act_block_size, SM count and the
    ``LOWBIT_FP4_GEMM_*`` overrides (BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES, SWAP_AB, SPLIT_K,
    K_STEP)."""
    if act_block_size not in (32, 128):
        raise ValueError(f"act_block_size must be 32 or 128, got {act_block_size}")
    return _config_cached(m, n, k, act_block_size, sms, env_key("FP4_GEMM", _FIELDS))


def explain_fp4_gemm_config(m: int, n: int, k: int, act_block_size: int = 128, sms: int = H200_NUM_SMS) -> str:
    c = fp4_gemm_config(m, n, k, act_block_size, sms)
    return (f"fp4_gemm M={m} N={n} K={k} act_block={act_block_size}: block_m={c.block_m} block_n={c.block_n} "
            f"warps={c.num_warps} stages={c.num_stages} swap_ab={c.swap_ab} split_k={c.split_k} "
            f"k_step={c.k_step} -- {c.reason}")


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


def fp4_gemm(
    a: torch.Tensor,
    a_s: torch.Tensor,
    b: torch.Tensor,
    b_s: torch.Tensor,
    act_block_size: int = 128,
    *,
    out: torch.Tensor | None = None,
    config: BlockScaledConfig | None = None,
) -> torch.Tensor:
    """FP8 x MXFP4 GEMM ``c = (a * a_s) @ (e2m1(b) * 2**(b_s - 127))^T`` in BF16 (module doc).

    a: ``float8_e4m3fn [M, K]`` (K contiguous, K a multiple of 32); a_s:
    ``[M, ceil(K/act_block_size)]`` FP32 (or E8M0 bytes, decoded by a torch op); b: ``uint8``
    or ``float4_e2m1fn_x2 [N, K/2]``; b_s: E8M0 ``uint8`` / ``float8_e8m0fnu [N, K/32]`` (FP32
    powers of two are re-encoded on the host); act_block_size: 128 or 32. out: optional
    ``bf16 [M, N]``; config: a `BlockScaledConfig` instead of the heuristic's (k_step 128 needs
    act_block_size 128). Returns ``bf16 [M, N]``."""
    who = "fp4_gemm"
    check_fp8_operand(a, "a", who)
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
        config = fp4_gemm_config(m, n, k, act_block_size, num_sms(a.device))
    check_config(config, who, k_steps=(32, 128))
    if config.k_step == 128 and act_block_size != 128:
        raise ValueError(f"{who}: k_step=128 folds the weight scales over a whole activation group and "
                         f"needs act_block_size=128, got {act_block_size}")
    launch_block_scaled(_fp4_gemm_kernel, (a, a_s, b, b_s), out, m, n, triton.cdiv(k, config.k_step), config,
                        (a.stride(0), a_s.stride(0), a_s.stride(1), b.stride(0), b_s.stride(0), b_s.stride(1)),
                        {"K_STEP": config.k_step, "ACT_BLOCK": act_block_size}, k)
    return out


# --------------------------------------------------------------------------- compile tier
def production_tiles() -> list[BlockScaledConfig]:
    """Every tile the heuristics can pick (k_step and split_k vary at runtime), k_step 128."""
    tiles = [_config_cached(m, 4096, 7168, 128, 10**6, ()) for m in (1, 17, 33, 4096)]
    return [replace(t, split_k=1, reason="") for t in tiles]


def compile_configs():
    """Every configuration `fp4_gemm_config` can pick: each M tile x (k_step 128 with
    act_block 128, k_step 32 with act_block 32 and 128) x (direct, split-K) output. QGMMA is
    expected wherever the MMA's M side is >= 64 (every production tile)."""
    from .compile_tier import KernelConfig

    sig = {"a_ptr": "*fp8e4nv", "as_ptr": "*fp32", "b_ptr": "*u8", "bs_ptr": "*u8", "c_ptr": "*bf16",
           "M": "i32", "N": "i32", "K": "i32", "steps_per_split": "i32",
           "stride_am": "i32", "stride_asm": "i32", "stride_ask": "constexpr", "stride_bn": "i32",
           "stride_bsn": "i32", "stride_bsk": "constexpr", "stride_cs": "i32", "stride_cm": "i32",
           "BM": "constexpr", "BN": "constexpr", "SWAP_AB": "constexpr", "SPLIT_OUT": "constexpr",
           "K_STEP": "constexpr", "ACT_BLOCK": "constexpr"}
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
                     "K_STEP": k_step, "ACT_BLOCK": act, **_UNIT_STRIDES},
                    num_warps=t.num_warps, num_stages=t.num_stages,
                    expect_sass=("QGMMA",) if mma_m >= 64 else (),
                    unaligned=("M", "steps_per_split", "stride_asm", "stride_bsn", "stride_cs")))
    return cfgs
