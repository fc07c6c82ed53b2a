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
"""

import triton
import triton.language as tl

from . import numerics

__all__ = ["DEQUANT_PAIR_PTX", "dequant_pair"]

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
