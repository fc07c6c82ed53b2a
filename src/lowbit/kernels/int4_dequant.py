"""INT4 group-32 dequantization for the W4A16 kernels (shared by the indexed and grouped families).

In the prepared layout (`lowbit.formats.w4a16`) a word holds nibble ``i`` of group ``i`` for 8
groups; shifted right by ``4i`` (i < 4), its bits 0-3 and 16-19 are the codes of groups ``i``
and ``i + 4``. `dequant_pair` turns such a word into the two bf16 weights
``(q - 8) * s`` in about two instructions per element on the GPU:

    lop3   t = (w & 0x000F000F) | 0x43004300   -> two bf16 (128 + q): exact, q fits the mantissa
    fma    t = t * 1 - 136                      -> (q - 8), exact
    fma    t = t * (s_lo, s_hi) - 0             -> one rounding: bf16(RNE((q - 8) * s))

The result is bit-identical to ``bf16((q - 8) * s)`` computed in FP32, which is what the
interpreter path computes (inline PTX does not run under the interpreter).

`dequant_byte_ptx(j)` is the same arithmetic for register-fragment consumers (the Gluon kernels'
wgmma / mma.sync A operand), whose registers pair two K-adjacent weights of one group: given
the words at K ``k`` and ``k + 1`` and byte ``j`` (groups ``2j`` and ``2j + 1``), one ``prmt``
gathers both words' byte j, and the low / high nibbles become the two packed registers
``(w[2j][k], w[2j][k+1])`` and ``(w[2j+1][k], w[2j+1][k+1])``; each is scaled by its group's
scale duplicated in both halves. Four weights cost eight instructions (prmt, shr, 2 lop3,
2 x 2 bf16x2 fma: 2 a weight, sm_90 SASS), and no register repacking follows;
`DEQUANT_PAIR_PTX` in that role cost ~3 instructions a weight, most on the half-rate integer
pipe (prmt repacks, shifts).
"""

import triton
import triton.language as tl

from . import numerics

__all__ = ["DEQUANT_PAIR_PTX", "dequant_byte_ptx", "dequant_group_ptx", "dequant_pair"]

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



def _dequant_byte_ptx(j: int) -> str:
    """$0, $1 = packed bf16x2 weights of groups 2j, 2j+1 at K (k, k+1); $2, $3 = the words at k
    and k+1; $4, $5 = the two groups' scales, each duplicated in both halves."""
    sel = j | (j << 4) | ((4 + j) << 8) | ((4 + j) << 12)  # byte j of $2 -> bytes 0-1, of $3 -> bytes 2-3
    return f"""
{{
.reg .b32 t, o, one, c, z;
prmt.b32 t, $2, $3, {sel:#06x};
shr.u32 o, t, 4;
lop3.b32 t, t, 0x000F000F, 0x43004300, 0xea;
lop3.b32 o, o, 0x000F000F, 0x43004300, 0xea;
mov.b32 one, 0x3F803F80;
mov.b32 c, 0xC308C308;
mov.b32 z, 0x80008000;
fma.rn.bf16x2 t, t, one, c;
fma.rn.bf16x2 o, o, one, c;
fma.rn.bf16x2 $0, t, $4, z;
fma.rn.bf16x2 $1, o, $5, z;
}}
"""


def _dequant_group_ptx(g: int) -> str:
    """`_dequant_byte_ptx` for one group g = 0..7 (byte g // 2, the low nibbles for even g, the high
    ones for odd g): $0 = packed bf16x2 weights at K (k, k+1); $1, $2 = the words at k and k+1;
    $3 = the group's scale duplicated in both halves. 4-5 instructions per two weights, for
    consumers that cannot hold two groups' fragments at once."""
    j = g // 2
    sel = j | (j << 4) | ((4 + j) << 8) | ((4 + j) << 12)
    shift = "shr.u32 t, t, 4;" if g % 2 else ""
    return f"""
{{
.reg .b32 t, one, c, z;
prmt.b32 t, $1, $2, {sel:#06x};
{shift}
lop3.b32 t, t, 0x000F000F, 0x43004300, 0xea;
mov.b32 one, 0x3F803F80;
mov.b32 c, 0xC308C308;
mov.b32 z, 0x80008000;
fma.rn.bf16x2 t, t, one, c;
fma.rn.bf16x2 $0, t, $3, z;
}}
"""


#: The PTX text for a constant j / g inside a jitted function (a jitted function reads a plain
#: Python function only through `triton.constexpr_function`): byte j = 0..3 (groups 2j, 2j+1),
#: ``pack=2``, constraints "=r,=r,r,r,r,r"; group g = 0..7, ``pack=2``, constraints "=r,r,r,r".
dequant_byte_ptx = triton.constexpr_function(_dequant_byte_ptx)
dequant_group_ptx = triton.constexpr_function(_dequant_group_ptx)


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
