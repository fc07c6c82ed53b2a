"""INT4 group-32 dequantization for the W4A16 kernels (the indexed and grouped layouts, and moe_decode).

In the prepared layout (`lowbit.formats.w4a16`) a word holds nibble ``i`` of group ``i`` for 8
groups; shifted right by ``4i`` (i < 4), its bits 0-3 and 16-19 are the codes of groups ``i``
and ``i + 4``. `dequant_pair` turns such a word into the two bf16 weights
``(q - 8) * s`` in about two instructions per element on the GPU:

    lop3   t = (w & 0x000F000F) | 0x43004300   -> two bf16 (128 + q): exact, q fits the mantissa
    fma    t = t * 1 - 136                      -> (q - 8), exact
    fma    t = t * (s_lo, s_hi) - 0             -> one rounding: bf16(RNE((q - 8) * s))

The result is bit-identical to ``bf16((q - 8) * s)`` computed in FP32, which is what the
interpreter path computes (inline PTX does not run under the interpreter).

The Gluon register-A consumers (wgmma / mma.sync A operands: `lowbit.kernels.w4a16.hopper`, the
output-centric `lowbit.kernels.moe_decode.hopper`, through `int4_gluon`) use the **subnormal form** instead. Their registers pair two
K-adjacent weights of one group: given the words at K ``k`` and ``k + 1`` and byte ``j`` (groups
``2j`` and ``2j + 1``), one ``prmt`` gathers both words' byte j, so its low nibbles are the pair
``(w[2j][k], w[2j][k+1])`` and its high nibbles ``(w[2j+1][k], w[2j+1][k+1])``. Masked in without
a magic exponent, a nibble is a bf16 subnormal: bits 0-3 of a half read ``q * 2^-133``; bits 4-7
read ``q * 2^-129`` (the nibble's top bit lands on the exponent's lowest bit, and the subnormal /
normal boundary keeps the value linear in q), so the high nibbles need no shift. One bf16x2
fma then gives

    fma    t * (s * 2^69  or  s * 2^65) + (-8 s * 2^-64)  ->  (q - 8) * s * 2^-64, one rounding

whose bits are ``bf16((q - 8) * s)``'s times 2^-64: a power-of-two scaling commutes with the
rounding while everything stays normal and finite, 2^-62 <= |s| < 2^58 or s = 0
(`lowbit.formats.w4a16.SCALE_RANGE`, checked by `pack_w4a16`). Four weights cost five
instructions (prmt, 2 and, 2 fma; the magic-exponent form took eight: prmt, shr, 2 lop3, 4 fma),
plus two bf16x2 multiplies a row and group for the factors (`scale_factors_ptx`). The kernel
multiplies its FP32 accumulator by `SUBNORMAL_ACC_SCALE` (2^64) once after the main loop: the
products and their sums are the magic form's times 2^-64, so the result is bit-identical
(`DEQUANT_PAIR_PTX` in the register-A role costs ~3 instructions a weight: prmt repacks, shifts).
H200, 2026-11-30, fa07611: the group-loop tiles 1.02-1.08x on the subnormal form.
"""

import triton
import triton.language as tl

from ...runtime import numerics

__all__ = ["DEQUANT_PAIR_PTX", "SUBNORMAL_ACC_SCALE", "dequant_byte_subnormal_ptx", "dequant_group_subnormal_ptx",
           "dequant_pair", "scale_factors_ptx"]

DEQUANT_PAIR_PTX = tl.constexpr("""
{
.reg .b32 t, s, c;
lop3.b32 t, $2, 0x000F000F, 0x43004300, 0xea;
mov.b32 s, 0x3F803F80;
mov.b32 c, 0xC308C308;
fma.rn.bf16x2 t, t, s, c;
mov.b32 s, {$3, $4};
mov.b32 c, 0x80008000;
fma.rn.bf16x2 t, t, s, c;
mov.b32 {$0, $1}, t;
}
""")



#: The register-A kernels' accumulators are 2^-64 times the product (subnormal form): multiply once.
SUBNORMAL_ACC_SCALE = 2.0 ** 64


def _scale_factors_ptx(odd: int) -> str:
    """$0, $1 = the subnormal form's two bf16x2 factors of scale $2 (bf16, "h"), each value in
    both halves: ``s * 2^69`` (low nibbles, even groups) or ``s * 2^65`` (high nibbles, odd
    groups), and ``-8 s * 2^-64``. Both multiplies are by powers of two: exact in range."""
    factor = "0x60006000" if odd else "0x62006200"  # bf16 2^65, 2^69
    return f"""
{{
.reg .b32 d, f, c;
mov.b32 d, {{$2, $2}};
mov.b32 f, {factor};
mov.b32 c, 0xA100A100;
mul.rn.bf16x2 $0, d, f;
mul.rn.bf16x2 $1, d, c;
}}
"""


def _dequant_byte_subnormal_ptx(j: int) -> str:
    """The subnormal form of byte j: $0, $1 = packed bf16x2 weights (times 2^-64) of
    groups 2j, 2j+1 at K (k, k+1); $2, $3 = the words at k and k+1; $4 / $6 = the factor of group
    2j / 2j+1 and $8 / $10 their offsets (`scale_factors_ptx`; $5, $7, $9, $11 are the same values,
    ``pack=2`` passes each int32 operand twice). Five instructions for four weights."""
    sel = j | (j << 4) | ((4 + j) << 8) | ((4 + j) << 12)  # byte j of $2 -> bytes 0-1, of $3 -> bytes 2-3
    return f"""
{{
.reg .b32 t, lo, hi;
prmt.b32 t, $2, $3, {sel:#06x};
and.b32 lo, t, 0x000F000F;
and.b32 hi, t, 0x00F000F0;
fma.rn.bf16x2 $0, lo, $4, $8;
fma.rn.bf16x2 $1, hi, $6, $10;
}}
"""


def _dequant_group_subnormal_ptx(g: int) -> str:
    """One group g = 0..7 in the subnormal form (byte g // 2, low nibbles for even g, high for
    odd g), for consumers that hold one group's fragment at a time: $0 = packed bf16x2 weights
    (times 2^-64) at K (k, k+1); $1, $2 = the words at k and k+1; $3 = the factor, $5 = the offset
    (`scale_factors_ptx(g % 2)`; $4, $6 repeat them). The prmt is the same for groups 2j and 2j+1:
    ptxas shares it (SASS)."""
    j = g // 2
    sel = j | (j << 4) | ((4 + j) << 8) | ((4 + j) << 12)
    mask = "0x00F000F0" if g % 2 else "0x000F000F"
    return f"""
{{
.reg .b32 t;
prmt.b32 t, $1, $2, {sel:#06x};
and.b32 t, t, {mask};
fma.rn.bf16x2 $0, t, $3, $5;
}}
"""


#: The PTX text for a constant j / g inside a jitted function (a jitted function reads a plain
#: Python function only through `triton.constexpr_function`), ``pack=2``: byte j = 0..3 (groups
#: 2j, 2j+1), constraints "=r,=r" + ten "r"; group g = 0..7, "=r" + six "r"; the scale factors,
#: ``pack=1``, "=r,=r,h".
dequant_byte_subnormal_ptx = triton.constexpr_function(_dequant_byte_subnormal_ptx)
dequant_group_subnormal_ptx = triton.constexpr_function(_dequant_group_subnormal_ptx)
scale_factors_ptx = triton.constexpr_function(_scale_factors_ptx)


@triton.jit
def dequant_pair(words, s_lo, s_hi):
    """words: int32 (already shifted by 4i); s_lo, s_hi: bf16 scales of groups i and i + 4,
    broadcastable to `words`. Returns (bf16 weights of group i, of group i + 4)."""
    if numerics.INTERPRET:
        lo = numerics.to_bf16(((words & 0xF) - 8).to(tl.float32) * s_lo.to(tl.float32))
        hi = numerics.to_bf16((((words >> 16) & 0xF) - 8).to(tl.float32) * s_hi.to(tl.float32))
        return lo, hi
    else:
        s_lo_b = tl.broadcast_to(s_lo, words.shape)
        s_hi_b = tl.broadcast_to(s_hi, words.shape)
        return tl.inline_asm_elementwise(
            DEQUANT_PAIR_PTX, "=h,=h,r,h,h", [words, s_lo_b, s_hi_b],
            dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1,
        )
