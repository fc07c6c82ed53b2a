"""Activation quantizers of seed 004 (DeepSeek's ``act_quant`` and ``fp4_quant``) in Triton.

    act_quant(x, block_size=128, scale_fmt=None, inplace=False) -> (y, s)  or  x
        for every group g of block_size consecutive elements of x's last dim:
            s[g] = max(max |x_g|, 1e-4) * fp32(1/448)          (UE8M0: rounded up to 2**k)
            y_g  = e4m3(clamp(x_g / s[g], -448, 448))          (IEEE division, RNE cast)
        inplace: x_g <- x.dtype(float(y_g) * s[g]), nothing else is written; returns x

    fp4_quant(x, block_size=None, scale_fmt="ue8m0", inplace=False) -> (packed, s)  or  x
        "ue8m0" (MXFP4, groups of 32): s = ue8m0_round_up(max(amax, 6 * 2**-126) * fp32(1/6)),
                                       stored as E8M0 bytes uint8 [..., K/32]
        "e4m3"  (groups of 16):        s = e4m3(max(amax, 6 * 2**-9) / 6), float8_e4m3fn [..., K/16]
        code = e2m1(x / s): round to nearest even on {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at
               +-6, sign kept (-0 -> code 8); packed two a byte, element 2j in the low nibble
        inplace: x <- x.dtype(e2m1_value(code) * s); returns x

References (bit for bit, on both test tiers): `lowbit.reference.act_quant_ref` and
`fp4_quant_ref`; the rounding rules themselves live once in `lowbit.formats`.

Design (memory-bound: one read of x, one write of the codes and scales, one pass). The input is
seen as a flat list of groups (row ``g // groups_per_row``, column ``g % groups_per_row``), so a
program takes ``GROUPS`` whole groups whatever K is, rows of any stride included; a group is
``BLOCK`` contiguous elements (16-byte vector loads when the row stride and the base are
16-byte aligned, which Triton specializes on). Per group: FP32 amax, the scale, the codes; the
codes and scales of the flat group list are contiguous in the outputs. All arithmetic is FP32
or integer: a division by an FP32 or E4M3 scale is ``tl.div_rn`` (IEEE round-to-nearest, as
the PyTorch reference divides; Triton's ``/`` is an approximate division on the GPU), one by a
power-of-two scale is a product with its exact inverse (`inverse_pow2`: the same bits, no
division); the FP32 -> E4M3 / BF16 casts go through `numerics`; the UE8M0 and E2M1 roundings
are integer / comparison helpers below (`ue8m0_round_up`, `e2m1_code`, `e2m1_value`) that give
identical bits on the GPU and under the interpreter. Inputs must be finite: NaN / inf are not
checked (the references raise on NaN).

fp4_quant reads x as words of two elements (int32 for bf16/fp16, int64 for fp32), so the even
and odd elements of a group arrive as two tiles from the same 16-byte loads and the packed
byte ``even | odd << 4`` is formed in registers (a reshape + split of one tile went through a
shared-memory layout change in Triton 3.6).

Heuristics (`quant_config`): how many groups a program takes (16 KB of x down to 2 KB, halved
until the grid covers every SM twice; fp4_quant's bf16 MXFP4 path from 32 KB) and its warps
(`BYTES_PER_THREAD`: 64 bytes a thread, 256 on that path, measured), from the bytes to read; memoized,
``LOWBIT_ACT_QUANT_*`` / ``LOWBIT_FP4_QUANT_*`` overrides in the memo key.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl

from ..formats.base import FormatError
from ..formats.fp4 import MXFP4_AMAX_FLOOR, MXFP4_GROUP, NVFP4_DEEPSEEK_AMAX_FLOOR, NVFP4_GROUP
from ..formats.fp8 import FP8_AMAX_FLOOR, FP8_E4M3_MAX, FP8_GROUP_SIZES, FP8_SCALE_FMTS
from ..runtime import numerics, overrides
from ..runtime.numerics import INTERPRET
from ..runtime.device import H200_NUM_SMS
from .compile_tier import KernelConfig

__all__ = [
    "act_quant",
    "fp4_quant",
    "QuantConfig",
    "quant_config",
    "explain_quant_config",
    "ENV_OVERRIDES",
    "FP4_SCALE_FMTS",
    "ue8m0_round_up",
    "inverse_pow2",
    "e2m1_code",
    "e2m1_value",
]

#: fp4_quant's scale formats and the one block size each is defined for
FP4_SCALE_FMTS = {"ue8m0": MXFP4_GROUP, "e4m3": NVFP4_GROUP}

_INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# The format constants, as the kernels see them (Python floats become FP32 constants, rounded
# to nearest even exactly as ``torch.tensor(c, dtype=torch.float32)``).
_FP8_FLOOR: tl.constexpr = tl.constexpr(FP8_AMAX_FLOOR)
_FP8_MAX: tl.constexpr = tl.constexpr(FP8_E4M3_MAX)
_FP8_MAX_INV: tl.constexpr = tl.constexpr(1.0 / FP8_E4M3_MAX)
_MX_FLOOR: tl.constexpr = tl.constexpr(MXFP4_AMAX_FLOOR)
_NV_FLOOR: tl.constexpr = tl.constexpr(NVFP4_DEEPSEEK_AMAX_FLOOR)
_E2M1_MAX_INV: tl.constexpr = tl.constexpr(1.0 / 6.0)


# --------------------------------------------------------------------------- jit helpers
@triton.jit
def ue8m0_round_up(scale):
    """FP32 ``scale >= 0`` -> the smallest power of two ``>= scale``, on the IEEE bits (as
    `lowbit.formats.ue8m0_round_up`): exponent field + (mantissa != 0), rebuilt as ``k << 23``.
    0 -> 0, subnormals -> 2**-126, overflow -> inf, inf passes through."""
    bits = scale.to(tl.int32, bitcast=True)
    e = (bits >> 23) & 0xFF
    k = tl.minimum(e + ((bits & 0x7FFFFF) != 0).to(tl.int32), 255)
    return tl.where(e == 255, scale, (k << 23).to(tl.float32, bitcast=True))


@triton.jit
def inverse_pow2(s):
    """``1 / s``, exactly, for ``s`` an FP32 power of two in ``[2**-126, 2**127]`` (so
    ``x * inverse_pow2(s)`` is bit for bit ``x / s``, rounding included, without a division):
    exponent field ``254 - e``; ``2**-127`` is the subnormal ``1 << 22``."""
    e = (s.to(tl.int32, bitcast=True) >> 23) & 0xFF
    return tl.where(e < 254, (254 - e) << 23, 1 << 22).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_code(v):
    """FP32 values already divided by their scale -> E2M1 codes (int32, 0..15): round to
    nearest, ties to the even code, saturate at +-6 (inf too), sign bit 8 kept for -0 and
    negatives. A tie rounds up exactly when the upper neighbour's code is even: ``>=`` at
    0.75, 1.75, 3.5 and ``>`` at 0.25, 1.25, 2.5, 5. Comparisons only: exact on any tier."""
    a = tl.abs(v)
    # a chain of selects, not a sum of 0/1 compares: LLVM packs such a sum into a byte array
    # in local memory (seen as "spills" in the compile tier)
    c = tl.where(a > 0.25, 1, 0)
    c = tl.where(a >= 0.75, 2, c)
    c = tl.where(a > 1.25, 3, c)
    c = tl.where(a >= 1.75, 4, c)
    c = tl.where(a > 2.5, 5, c)
    c = tl.where(a >= 3.5, 6, c)
    c = tl.where(a > 5.0, 7, c)
    neg = v.to(tl.int32, bitcast=True) < 0
    return tl.where(neg, c | 8, c)


@triton.jit
def e2m1_value(code):
    """E2M1 codes (int32, 0..15) -> FP32 values (code 8 is -0.0)."""
    m = code & 7
    mag = tl.where(m < 4, m.to(tl.float32) * 0.5, tl.where(m == 7, 6.0, (m - 2).to(tl.float32)))
    return tl.where(code >= 8, mag * -1.0, mag)  # not -mag: Triton negates as 0 - x, losing -0


@triton.jit
def _cast_out(v, X_KIND: tl.constexpr):
    """FP32 -> the input's dtype (0 = bf16, 1 = fp16, 2 = fp32), round to nearest even."""
    if X_KIND == 0:
        return numerics.to_bf16(v)
    elif X_KIND == 1:
        return v.to(tl.float16)
    else:
        return v


@triton.jit
def _group_tile(total_groups, groups_per_row, stride_xm, BLOCK: tl.constexpr, GROUPS: tl.constexpr):
    """This program's groups: their flat index ``g`` [GROUPS] (int64), validity, and the
    ``[GROUPS, BLOCK]`` element offsets into x."""
    g32 = tl.program_id(0) * GROUPS + tl.arange(0, GROUPS)
    g_ok = g32 < total_groups
    row = g32 // groups_per_row
    col = g32 - row * groups_per_row
    j = tl.arange(0, BLOCK)
    x_off = row.to(tl.int64)[:, None] * stride_xm + (col * BLOCK)[:, None] + j[None, :]
    return g32.to(tl.int64), g_ok, x_off


# --------------------------------------------------------------------------- kernels
@triton.jit
def _act_quant_kernel(
    x_ptr, y_ptr, s_ptr, total_groups, groups_per_row, stride_xm,
    BLOCK: tl.constexpr, GROUPS: tl.constexpr, UE8M0: tl.constexpr, INPLACE: tl.constexpr,
    X_KIND: tl.constexpr,
):
    g, g_ok, x_off = _group_tile(total_groups, groups_per_row, stride_xm, BLOCK, GROUPS)
    x = tl.load(x_ptr + x_off, mask=g_ok[:, None], other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), _FP8_FLOOR)
    s = amax * _FP8_MAX_INV  # multiply by fp32(1/448), as the reference does
    if UE8M0:
        s = ue8m0_round_up(s)
        v = x * inverse_pow2(s)[:, None]  # = x / s exactly (s >= 2**-126 by the floor)
    else:
        v = tl.div_rn(x, s[:, None])
    q = numerics.to_fp8e4m3(tl.minimum(tl.maximum(v, -_FP8_MAX), _FP8_MAX))
    if INPLACE:
        tl.store(x_ptr + x_off, _cast_out(q.to(tl.float32) * s[:, None], X_KIND), mask=g_ok[:, None])
    else:
        j = tl.arange(0, BLOCK)
        tl.store(y_ptr + g[:, None] * BLOCK + j[None, :], q, mask=g_ok[:, None])
        tl.store(s_ptr + g, s, mask=g_ok)


@triton.jit
def _unpack_pairs(w, X_KIND: tl.constexpr):
    """A word holding elements (2j, 2j+1) of x (int32 for 16-bit inputs, int64 for FP32;
    little-endian: element 2j in the low half) -> the two elements as FP32 (exact)."""
    if X_KIND == 0:  # bf16: the upper 16 bits of an FP32
        lo = (w << 16).to(tl.float32, bitcast=True)
        hi = (w & -65536).to(tl.float32, bitcast=True)
    elif X_KIND == 1:  # fp16
        lo = w.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    else:  # fp32
        lo = w.to(tl.int32).to(tl.float32, bitcast=True)
        hi = (w >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def _fp4_scaled(x, s, E4M3: tl.constexpr):
    """``x / s`` (a ``[GROUPS, n]`` tile by its group scales ``[GROUPS]``), IEEE-rounded."""
    if E4M3:
        return tl.div_rn(x, s[:, None])
    else:
        return x * inverse_pow2(s)[:, None]  # a power of two in [2**-126, 2**126]: exact


@triton.jit
def _fp4_scale(amax, E4M3: tl.constexpr):
    """A group's FP32 scale from its amax, and the form it is stored in (E4M3 or E8M0 byte)."""
    if E4M3:
        s8 = numerics.to_fp8e4m3(tl.div_rn(tl.maximum(amax, _NV_FLOOR), 6.0))  # never 0: >= 2**-9
        return s8.to(tl.float32), s8
    else:
        # rounded up to a power of two; the floor keeps it a normal number (>= 2**-126), so the
        # E8M0 byte is the exponent field
        s = ue8m0_round_up(tl.maximum(amax, _MX_FLOOR) * _E2M1_MAX_INV)
        return s, ((s.to(tl.int32, bitcast=True) >> 23) & 0xFF).to(tl.uint8)


#: MXFP4 codes of two bf16 elements in one instruction stream (sm_90 PTX; `_fp4_quant_kernel`'s
#: GPU path for bf16 input). $1: a word of two bf16 elements with their sign bits cleared
#: (element 2j in the low half; the amax pass computed it), $2: the group's exact inverse scale
#: 2**-e as a bf16 pair, $3: the same word with its signs. Returns the packed byte
#: ``code(2j) | code(2j+1) << 4``. The same rounding as `e2m1_code`, two lanes at a time:
#:   v = x * 2**-e                       exact (a power of two; |v| <= 6 by the scale's choice)
#:   |v| < 1: code = rint(2|v|)          fma(|v|, 2, 128) in bf16 rounds to the integer, ties even
#:   |v| >= 1: round the 7-bit mantissa to its top bit, ties to even (add 0x1F + that bit), and
#:             code = (exponent * 2 + bit) - 252; the paths meet as max(norm, min(sub, 2)),
#:             carried with a +252 bias so no 16-bit lane ever borrows from its neighbour
#:   saturate at 7; the sign bit of x (= that of v: the scale is positive) becomes bit 3
#: ~17 instructions for two elements where the compare chain takes ~28 for one (sm_90 SASS).
#: The CPU tests check the lane algorithm on every bf16 bit pattern.
_MX_CODES_BF16X2_PTX: tl.constexpr = tl.constexpr("""
{
.reg .b32 a, sg, t, n, b, two, c128, kt, k252, k254, k259;
mov.b32 two, 0x40004000;
mov.b32 c128, 0x43004300;
mov.b32 kt, 0x42044204;
mov.b32 k252, 0x00FC00FC;
mov.b32 k254, 0x00FE00FE;
mov.b32 k259, 0x01030103;
mul.rn.bf16x2 a, $1, $2;
shr.u32 sg, $3, 12;
fma.rn.bf16x2 t, a, two, c128;
sub.u32 t, t, kt;
min.u16x2 t, t, k254;
shr.u32 b, a, 6;
and.b32 b, b, 0x00010001;
add.u32 n, a, b;
add.u32 n, n, 0x001F001F;
shr.u32 n, n, 6;
and.b32 n, n, 0x03FF03FF;
max.u16x2 n, n, t;
min.u16x2 n, n, k259;
sub.u32 n, n, k252;
and.b32 sg, sg, 0x00080008;
or.b32 n, n, sg;
shr.u32 t, n, 12;
or.b32 n, n, t;
and.b32 $0, n, 0xFF;
}
""")



@triton.jit
def _max_u16x2(a, b):
    """Lane-wise max of two words of two u16 lanes (a `tl.reduce` combine)."""
    return tl.inline_asm_elementwise("max.u16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32, is_pure=True,
                                     pack=1)


@triton.jit
def _fp4_quant_kernel(
    x_ptr, q_ptr, s_ptr, total_groups, groups_per_row, stride_xm,
    BLOCK: tl.constexpr, GROUPS: tl.constexpr, E4M3: tl.constexpr, INPLACE: tl.constexpr,
    X_KIND: tl.constexpr,
):
    if INPLACE:
        g, g_ok, x_off = _group_tile(total_groups, groups_per_row, stride_xm, BLOCK, GROUPS)
        x = tl.load(x_ptr + x_off, mask=g_ok[:, None], other=0.0).to(tl.float32)
        s, _ = _fp4_scale(tl.max(tl.abs(x), axis=1), E4M3)
        code = e2m1_code(_fp4_scaled(x, s, E4M3))
        tl.store(x_ptr + x_off, _cast_out(e2m1_value(code) * s[:, None], X_KIND), mask=g_ok[:, None])
    else:
        # x_ptr addresses pairs of elements (stride_xm in pairs): the even and odd elements
        # arrive as two [GROUPS, BLOCK/2] tiles from one vector load, so the packed byte
        # (even | odd << 4) needs no reshape and no shared-memory layout change
        g, g_ok, w_off = _group_tile(total_groups, groups_per_row, stride_xm, BLOCK // 2, GROUPS)
        w = tl.load(x_ptr + w_off, mask=g_ok[:, None], other=0)
        if (not INTERPRET) and (X_KIND == 0) and (not E4M3):
            # amax on the bit patterns: sign-cleared bf16 lanes order like their values, and a
            # u16x2 max takes two lanes an instruction (the FP32 unpack took 5 a word)
            w_abs = w & 0x7FFF7FFF
            m = tl.reduce(w_abs, 1, _max_u16x2)
            amax = (tl.maximum(m & 0xFFFF, m >> 16) << 16).to(tl.float32, bitcast=True)
            s, s_stored = _fp4_scale(amax, E4M3)
            # bf16 MXFP4 on the GPU: both elements of a word in packed bf16 / u16x2 arithmetic
            # (the compare chain below bounds the kernel on this path)
            # H200, 2026-11-29, commit 895636f: the compare chain reached 0.41 of copy bandwidth
            inv16 = inverse_pow2(s).to(tl.int32, bitcast=True) >> 16  # a power of two: exact in bf16
            inv2 = tl.broadcast_to((inv16 | (inv16 << 16))[:, None], w.shape)
            byte = tl.inline_asm_elementwise(_MX_CODES_BF16X2_PTX, "=r,r,r,r", [w_abs, inv2, w], dtype=tl.int32,
                                             is_pure=True, pack=1)
        else:
            lo, hi = _unpack_pairs(w, X_KIND)
            s, s_stored = _fp4_scale(tl.max(tl.maximum(tl.abs(lo), tl.abs(hi)), axis=1), E4M3)
            c_lo = e2m1_code(_fp4_scaled(lo, s, E4M3))
            c_hi = e2m1_code(_fp4_scaled(hi, s, E4M3))
            byte = c_lo | (c_hi << 4)
        jj = tl.arange(0, BLOCK // 2)
        tl.store(q_ptr + g[:, None] * (BLOCK // 2) + jj[None, :], byte.to(tl.uint8), mask=g_ok[:, None])
        tl.store(s_ptr + g, s_stored, mask=g_ok)


# --------------------------------------------------------------------------- heuristics
#: bytes of x one program reads, largest first, per kernel path; the heuristic halves down to
#: the smallest. Paths: "act_quant"; "fp4_quant" = bf16 MXFP4 codes, two lanes an instruction
#: (`_MX_CODES_BF16X2_PTX`); "fp4_quant_fp32" = the FP32 element paths (E4M3 scales, fp16 / fp32
#: input, in place), which keep the byte model (at 256 B a thread the E4M3 in-place kernel spills).
#: H200, 2026-11-30, commit 42b5687: fp4_quant bf16 16384x7168 32 KB 4 warps 77.2 us, 16 KB 80.7, 64 KB 83.4.
#: H200, 2026-11-30, commit 761991f: act_quant at 16 KB / 64 B a thread, 99.7% of the copy bandwidth.
TILE_BYTES = {"act_quant": (16384, 8192, 4096, 2048), "fp4_quant": (32768, 16384, 8192, 4096, 2048),
              "fp4_quant_fp32": (16384, 8192, 4096, 2048)}
#: bytes of x a thread reads (in 16-byte vector loads), per path (measured with `TILE_BYTES`)
BYTES_PER_THREAD = {"act_quant": 64, "fp4_quant": 256, "fp4_quant_fp32": 64}


def fp4_path(dtype: torch.dtype, scale_fmt: str, inplace: bool) -> str:
    """The `TILE_BYTES` key of an fp4_quant call: the packed-lane path or the FP32 one."""
    return "fp4_quant" if dtype == torch.bfloat16 and scale_fmt == "ue8m0" and not inplace else "fp4_quant_fp32"


def warps_for_tile(path: str, tile: int) -> int:
    """Warps of a program reading `tile` bytes of x: `BYTES_PER_THREAD[path]` a thread."""
    return max(1, tile // (32 * BYTES_PER_THREAD[path]))


_FIELDS = ("groups_per_program", "num_warps")
ENV_OVERRIDES = {kind: overrides.override_names(kind.upper(), _FIELDS) for kind in ("act_quant", "fp4_quant")}


@dataclass(frozen=True)
class QuantConfig:
    """Launch choice of a quantizer: whole groups a program takes (a power of two) and warps."""

    groups_per_program: int
    num_warps: int
    reason: str = ""


def _env_key(kind: str) -> tuple:
    return overrides.env_key(kind.upper(), _FIELDS)


def _check_config(cfg: QuantConfig, block: int, who: str) -> None:
    gpp, w = cfg.groups_per_program, cfg.num_warps
    if not isinstance(gpp, int) or gpp < 1 or gpp & (gpp - 1):
        raise ValueError(f"{who}: groups_per_program must be a power of two >= 1, got {gpp!r}")
    if gpp * block > 65536:
        raise ValueError(f"{who}: groups_per_program={gpp} x block {block} exceeds 65536 elements a program")
    if w not in (1, 2, 4, 8, 16):
        raise ValueError(f"{who}: num_warps must be 1, 2, 4, 8 or 16, got {w!r}")


@lru_cache(maxsize=4096)
def _config_cached(kind: str, path: str, total_groups: int, block: int, elem_bytes: int, env: tuple) -> QuantConfig:
    # Memory-bound: each program should have enough bytes in flight to keep HBM busy (16-32 KB
    # of x a program, two or more programs resident per SM), but the grid should still cover
    # every SM twice; so start at the path's largest tile and halve while the grid is under
    # 2 x 132 programs, down to 2 KB (below that the launch dominates anyway: decode rows).
    # Warps follow from the bytes a thread (BYTES_PER_THREAD: measured on the H200).
    n_bytes = total_groups * block * elem_bytes
    for tile in TILE_BYTES[path]:
        if triton.cdiv(n_bytes, tile) >= 2 * H200_NUM_SMS:
            break
    gpp = max(1, tile // (block * elem_bytes))
    programs = triton.cdiv(total_groups, gpp)
    cfg = QuantConfig(
        gpp, warps_for_tile(path, tile),
        f"{total_groups} groups of {block} x {elem_bytes} B: {tile} B a program -> {programs} programs "
        f"({'>= 2 per SM' if programs >= 2 * H200_NUM_SMS else 'smallest tile; launch-bound'}), "
        f"{warps_for_tile(path, tile)} warps ({path} path: {BYTES_PER_THREAD[path]} B a thread, TILE_BYTES)")
    cfg = overrides.apply_env_overrides(cfg, kind.upper(), _FIELDS)
    _check_config(cfg, block, kind)
    return cfg


def quant_config(kind: str, total_groups: int, block: int, elem_bytes: int = 2, path: str | None = None) -> QuantConfig:
    """Launch configuration of ``kind`` ("act_quant" or "fp4_quant") for ``total_groups``
    groups of ``block`` elements of ``elem_bytes`` bytes (2 for bf16); path: the kernel path's
    `TILE_BYTES` key (default: ``kind``, i.e. fp4_quant's bf16 MXFP4 path; `fp4_path` gives it);
    memoized per those and the overrides ``LOWBIT_<KIND>_GROUPS_PER_PROGRAM`` /
    ``LOWBIT_<KIND>_NUM_WARPS``."""
    if kind not in ENV_OVERRIDES:
        raise ValueError(f"kind must be one of {sorted(ENV_OVERRIDES)}, got {kind!r}")
    path = path or kind
    if path not in TILE_BYTES or not path.startswith(kind):
        raise ValueError(f"path {path!r} is not a path of {kind} ({sorted(TILE_BYTES)})")
    return _config_cached(kind, path, int(total_groups), int(block), int(elem_bytes), _env_key(kind))


def explain_quant_config(kind: str, rows: int, k: int, block: int, elem_bytes: int = 2) -> str:
    """`quant_config`'s choice for ``rows`` rows of K elements in groups of `block`, as one line."""
    c = quant_config(kind, rows * (k // block), block, elem_bytes)
    return (f"{kind} rows={rows} K={k} block={block}: groups_per_program={c.groups_per_program} "
            f"warps={c.num_warps} -- {c.reason}")


# --------------------------------------------------------------------------- launchers
def _check_input(x, block: int, who: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise FormatError(f"{who}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _INPUT_DTYPES:
        raise FormatError(f"{who}: x must be bfloat16, float16 or float32, got {x.dtype} {tuple(x.shape)}")
    if x.dim() < 1:
        raise FormatError(f"{who}: x must be [..., K], got a scalar")
    if x.shape[-1] % block:
        raise FormatError(f"{who}: last dim of {tuple(x.shape)} must be a multiple of block_size={block}")


def _groups_view(x, block: int, inplace: bool, out, out_scale, who: str) -> tuple[torch.Tensor, int]:
    """The quantizers' shared input checks: x as ``[rows, K]`` (`_rows_view`) and its number of
    `block`-element groups (int32-indexable); in-place takes no output buffers."""
    _check_input(x, block, who)
    x2 = _rows_view(x, inplace, who)
    total = x2.numel() // block
    if total >= 2**31 // 2:
        raise FormatError(f"{who}: {total} groups exceed the kernel's int32 group index")
    if inplace and (out is not None or out_scale is not None):
        raise FormatError(f"{who}: inplace writes into x; do not pass out / out_scale")
    return x2, total


def _rows_view(x: torch.Tensor, inplace: bool, who: str) -> torch.Tensor:
    """x as [rows, K] with unit stride along K; in-place needs a view (no copy)."""
    k = x.shape[-1]
    if x.numel() and x.stride(-1) != 1:
        if inplace:
            raise FormatError(f"{who}: inplace needs x contiguous along its last dim, got strides {x.stride()}")
        x = x.contiguous()
    try:
        return x.view(-1, k)
    except RuntimeError:
        if inplace:
            raise FormatError(
                f"{who}: inplace needs x's leading dims to flatten to one row stride, got shape "
                f"{tuple(x.shape)} strides {x.stride()}") from None
        return x.reshape(-1, k)


def _check_out(t, dtype: torch.dtype, shape: tuple, device, name: str, who: str) -> torch.Tensor:
    if t is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or tuple(t.shape) != shape or not t.is_contiguous():
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise FormatError(f"{who}: {name} must be a contiguous {dtype} {shape}, got {got}")
    if t.device != device:
        raise FormatError(f"{who}: {name} is on {t.device}, x on {device}")
    return t


_X_KIND = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


_PAIR_WORD = {torch.bfloat16: torch.int32, torch.float16: torch.int32, torch.float32: torch.int64}


def _as_pairs(x2: torch.Tensor) -> torch.Tensor:
    """[rows, K] -> [rows, K/2] words of two elements each (copying x when its row stride or
    offset does not allow the reinterpretation)."""
    try:
        return x2.view(_PAIR_WORD[x2.dtype])
    except RuntimeError:
        return x2.contiguous().view(_PAIR_WORD[x2.dtype])


def _launch(kernel, x2, xk, q, s, block, total, config, **flags):
    """xk: what the kernel reads (x2 itself, or x2 as pair words); strides are in its units."""
    grid = (triton.cdiv(total, config.groups_per_program),)
    kernel[grid](
        xk, q, s, total, x2.shape[1] // block, xk.stride(0),
        BLOCK=block, GROUPS=config.groups_per_program, X_KIND=_X_KIND[x2.dtype], **flags,
        num_warps=config.num_warps,
    )


def act_quant(
    x: torch.Tensor,
    block_size: int = 128,
    scale_fmt: str | None = None,
    inplace: bool = False,
    *,
    out: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
    config: QuantConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """Per-group FP8 E4M3 quantization along the last dim (the module docstring has the rule).

    x: ``bfloat16 [..., K]`` (float16 / float32 accepted), K a multiple of block_size, unit
    stride along K (other layouts are copied first, except with ``inplace``).
    block_size: 128 or 32. scale_fmt: ``None`` (FP32 scales) or ``"ue8m0"`` (powers of two).
    inplace: quantize, dequantize and write ``float(y) * s`` back into x (x's dtype, RNE) in
    one pass; returns x. Needs x's leading dims to flatten to one row stride.
    out / out_scale: optional preallocated contiguous ``float8_e4m3fn [..., K]`` and
    ``float32 [..., K/block_size]``. config: a `QuantConfig` instead of the heuristic.
    Returns ``(y float8_e4m3fn [..., K], s float32 [..., K/block_size])`` or x.
    Raises `FormatError` (a ValueError) on a wrong dtype, block size, scale format or shape.
    """
    who = "act_quant"
    if block_size not in FP8_GROUP_SIZES:
        raise FormatError(f"{who}: unsupported block_size {block_size!r}; supported: {FP8_GROUP_SIZES}")
    if scale_fmt not in FP8_SCALE_FMTS:
        raise FormatError(f"{who}: unsupported scale_fmt {scale_fmt!r}; supported: {FP8_SCALE_FMTS}")
    x2, total = _groups_view(x, block_size, inplace, out, out_scale, who)
    if inplace:
        q = s = x2  # unused by the in-place kernel
    else:
        q = _check_out(out, torch.float8_e4m3fn, tuple(x.shape), x.device, "out", who)
        s = _check_out(out_scale, torch.float32, (*x.shape[:-1], x.shape[-1] // block_size), x.device,
                       "out_scale", who)
    if total:
        config = config or quant_config(who, total, block_size, x.element_size())
        _check_config(config, block_size, who)
        _launch(_act_quant_kernel, x2, x2, q, s, block_size, total, config,
                UE8M0=scale_fmt == "ue8m0", INPLACE=bool(inplace))
    return x if inplace else (q, s)


def fp4_quant(
    x: torch.Tensor,
    block_size: int | None = None,
    scale_fmt: str = "ue8m0",
    inplace: bool = False,
    *,
    out: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
    config: QuantConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """Per-group FP4 E2M1 quantization along the last dim, two codes a byte (module docstring).

    x: ``bfloat16 [..., K]`` (float16 / float32 accepted), K a multiple of the block.
    scale_fmt: ``"ue8m0"`` (MXFP4: block 32, E8M0 scale bytes ``uint8 [..., K/32]``) or
    ``"e4m3"`` (block 16, ``float8_e4m3fn [..., K/16]``; NVFP4 with the global scale 1).
    block_size: ``None`` takes the format's block; any other value than it raises.
    inplace: write the dequantized values ``e2m1_value * s`` back into x (x's dtype); returns x.
    out / out_scale: optional preallocated contiguous ``uint8 [..., K/2]`` and scale tensors.
    Returns ``(packed uint8 [..., K/2], scales)`` or x.
    Raises `FormatError` (a ValueError) on a wrong dtype, block size, scale format or shape.
    """
    who = "fp4_quant"
    if scale_fmt not in FP4_SCALE_FMTS:
        raise FormatError(f"{who}: unsupported scale_fmt {scale_fmt!r}; supported: {sorted(FP4_SCALE_FMTS)}")
    block = FP4_SCALE_FMTS[scale_fmt]
    if block_size is not None and block_size != block:
        raise FormatError(f"{who}: scale_fmt={scale_fmt!r} uses blocks of {block}, got block_size={block_size}")
    x2, total = _groups_view(x, block, inplace, out, out_scale, who)
    e4m3 = scale_fmt == "e4m3"
    if inplace:
        q = s = x2
    else:
        q = _check_out(out, torch.uint8, (*x.shape[:-1], x.shape[-1] // 2), x.device, "out", who)
        s = _check_out(out_scale, torch.float8_e4m3fn if e4m3 else torch.uint8,
                       (*x.shape[:-1], x.shape[-1] // block), x.device, "out_scale", who)
    if total:
        config = config or quant_config(who, total, block, x.element_size(), fp4_path(x.dtype, scale_fmt, inplace))
        _check_config(config, block, who)
        xk = x2 if inplace else _as_pairs(x2)
        _launch(_fp4_quant_kernel, x2, xk, q, s, block, total, config, E4M3=e4m3, INPLACE=bool(inplace))
    return x if inplace else (q, s)


# --------------------------------------------------------------------------- compile tier
def compile_configs() -> list[KernelConfig]:
    """Every configuration the heuristics pick (each tile x its warps) for each production
    variant: bf16 input x block x scale format x in-place; the float32-input variants at the
    largest tile."""
    def sig(x, q, s, flag):  # in the kernels' argument order
        return {"x_ptr": f"*{x}", q[0]: q[1], "s_ptr": s, "total_groups": "i32", "groups_per_row": "i32",
                "stride_xm": "i32", "BLOCK": "constexpr", "GROUPS": "constexpr", flag: "constexpr",
                "INPLACE": "constexpr", "X_KIND": "constexpr"}

    unaligned = ("total_groups", "groups_per_row")
    cfgs = []
    for dtype, kind, size, tile in [("bf16", 0, 2, t) for t in TILE_BYTES["act_quant"]] + [("fp32", 2, 4, 16384)]:
        warps = warps_for_tile("act_quant", tile)
        for block in FP8_GROUP_SIZES:
            gpp = tile // (block * size)
            for ue8m0 in (False, True):
                for inplace in (False, True):
                    cfgs.append(KernelConfig(
                        f"act_quant[{dtype},B={block},G={gpp},w={warps},ue8m0={int(ue8m0)},inplace={int(inplace)}]",
                        _act_quant_kernel, sig(dtype, ("y_ptr", "*fp8e4nv"), "*fp32", "UE8M0"),
                        {"BLOCK": block, "GROUPS": gpp, "UE8M0": ue8m0, "INPLACE": inplace, "X_KIND": kind},
                        num_warps=warps, unaligned=unaligned))
    fp4_variants = [("bf16", 0, 2, path, t) for path in ("fp4_quant", "fp4_quant_fp32") for t in TILE_BYTES[path]]
    for dtype, kind, size, path, tile in fp4_variants + [("fp32", 2, 4, "fp4_quant_fp32", 16384)]:
        warps = warps_for_tile(path, tile)
        for fmt, block in FP4_SCALE_FMTS.items():
            gpp = tile // (block * size)
            e4m3 = fmt == "e4m3"
            for inplace in (False, True):
                if fp4_path({"bf16": torch.bfloat16, "fp32": torch.float32}[dtype], fmt, inplace) != path:
                    continue
                x = dtype if inplace else {"bf16": "i32", "fp32": "i64"}[dtype]  # pair words
                cfgs.append(KernelConfig(
                    f"fp4_quant[{dtype},{fmt},G={gpp},w={warps},inplace={int(inplace)}]",
                    _fp4_quant_kernel, sig(x, ("q_ptr", "*u8"), "*fp8e4nv" if e4m3 else "*u8", "E4M3"),
                    {"BLOCK": block, "GROUPS": gpp, "E4M3": e4m3, "INPLACE": inplace, "X_KIND": kind},
                    num_warps=warps, unaligned=unaligned))
    return cfgs
