"""INT4 group-32 dequantization in Gluon: the register-level helpers of the Hopper register-A
kernels (`lowbit.kernels.w4a16.hopper`) and of the output-centric decode engine
(`lowbit.kernels.moe_decode.hopper`). The PTX and its arithmetic are `int4`'s.

The register-A forms produce bf16 weights 2^-64 times the true ones (the subnormal form): a main
loop multiplies its FP32 accumulator by `ACC_SCALE` once (`unscaled`), which is exact.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .int4 import DEQUANT_PAIR_PTX, SUBNORMAL_ACC_SCALE, dequant_byte_subnormal_ptx, scale_factors_ptx

__all__ = ["ACC_SCALE", "dequant_byte", "dequant_pair", "scale_factors", "unscaled"]

#: The register-A accumulators are 2^-64 times the product (subnormal form): multiply once.
ACC_SCALE = gl.constexpr(SUBNORMAL_ACC_SCALE)


@gluon.jit
def dequant_pair(words, s_lo, s_hi):
    """bf16 weights of groups i and i + 4 from words shifted by 4i (`int4` layout), the
    magic-exponent form (lop3 + two fma): the shared-memory engine's."""
    _, s_lo = gl.broadcast(words, s_lo)
    _, s_hi = gl.broadcast(words, s_hi)
    return gl.inline_asm_elementwise(DEQUANT_PAIR_PTX, "=h,=h,r,h,h", [words, s_lo, s_hi],
                                     dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=1)


@gluon.jit
def scale_factors(s, g: gl.constexpr):
    """Group g's bf16 scales `s` (any shape) as the subnormal dequantization's two factors
    (`int4.scale_factors_ptx`), each an int32 holding a bf16x2 pair: ``s * 2^69`` (even g) or
    ``s * 2^65`` (odd g), and ``-8 s * 2^-64``."""
    PTX: gl.constexpr = scale_factors_ptx(g % 2)
    return gl.inline_asm_elementwise(PTX, "=r,=r,h", [s], dtype=(gl.int32, gl.int32), is_pure=True, pack=1)


@gluon.jit
def unscaled(acc):
    """A register-A main loop's accumulator (its weights are 2^-64 times the true ones, the
    subnormal form) at the true scale: exact."""
    return acc * ACC_SCALE


@gluon.jit
def dequant_byte(words, s_even, s_odd, j: gl.constexpr):
    """Groups 2j and 2j + 1 (``int4.dequant_byte_subnormal_ptx(j)``: byte j of the words) in
    `words`' register layout, whose K-adjacent element pairs must share a register (a k_width-2
    dot operand): two bf16 tensors 2^-64 times the weights. `s_even`, `s_odd`: the two groups'
    bf16 scales, broadcastable to `words` (one a row)."""
    f_even, c_even = scale_factors(s_even, 0)
    f_odd, c_odd = scale_factors(s_odd, 1)
    _, f_even = gl.broadcast(words, f_even)
    _, f_odd = gl.broadcast(words, f_odd)
    _, c_even = gl.broadcast(words, c_even)
    _, c_odd = gl.broadcast(words, c_odd)
    PTX: gl.constexpr = dequant_byte_subnormal_ptx(j)
    return gl.inline_asm_elementwise(PTX, "=r,=r,r,r,r,r,r,r,r,r,r,r", [words, f_even, f_odd, c_even, c_odd],
                                     dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=2)
