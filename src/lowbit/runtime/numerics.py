"""Numerics helpers that make a Triton kernel compute the GPU's answer under the interpreter.

Triton 3.6's interpreter (``TRITON_INTERPRET=1``, the CPU test tier) gets low-precision math
silently wrong: ``tl.dot`` and ``tl.sum`` on bf16 return garbage, bf16 arithmetic is wrong,
fp32 -> bf16 casts truncate instead of rounding to nearest even, and fp32 -> fp8 casts drop
the mantissa carry (126.2 -> 64 instead of 128). Loads and upcasts (bf16/fp8 -> fp32) and FP32
arithmetic are exact. So every production kernel routes its low-precision steps through
these helpers:

- `dot(a, b, acc)`: bf16/fp8 operands, FP32 accumulator. GPU: the tensor-core ``tl.dot``.
  Interpreter: operands upcast to FP32 (exact) and an IEEE FP32 dot -- exact products and FP32
  sums, which is what the tensor cores compute up to summation order.
- `to_bf16(x)` / `to_fp8e4m3(x)`: FP32 -> bf16 / e4m3 with round-to-nearest-even (e4m3 also
  saturates to +-448, as ``cvt.rn.satfinite`` does). GPU: the native cast. Interpreter: the
  rounding done on the FP32 bits, then a cast that is exact because nothing is left to round.
- `mul_bf16(a, b)`: the bf16 product rounded once (exact FP32 product, then `to_bf16`).
- `silu_mul(g, u)`: ``SiLU(g) * u`` in FP32 (the MoE activation; one definition for every
  kernel that applies it).
- Sums: always reduce in FP32 (``tl.sum(x.to(tl.float32))``); there is no bf16 sum helper on
  purpose.

`tests/test_numerics_canary.py` proves the layer: the helpers are bit-exact against torch's
casts, and a deliberately wrong kernel fails on the CPU tier.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .env import interpreter_active

__all__ = ["INTERPRET", "dot", "to_bf16", "to_fp8e4m3", "mul_bf16", "silu_mul"]

#: Fixed when this module is first imported: set ``TRITON_INTERPRET`` before importing kernels.
INTERPRET: tl.constexpr = tl.constexpr(interpreter_active())


@triton.jit
def dot(a, b, acc):
    """``acc + a @ b`` with FP32 accumulation; `a`, `b` bf16 or fp8 tiles."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def to_bf16(x):
    """FP32 -> bf16, round to nearest even."""
    if INTERPRET:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True).to(tl.bfloat16)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def to_fp8e4m3(x):
    """FP32 -> float8 e4m3 (fn), round to nearest even, saturating at +-448."""
    if INTERPRET:
        ax = tl.minimum(tl.abs(x), 448.0)
        # normals (>= 2^-6): keep 3 mantissa bits of 23
        bits = ax.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000
        normal = bits.to(tl.float32, bitcast=True)
        # subnormals: multiples of 2^-9; adding 2^14 (whose ulp is 2^-9) rounds to nearest even
        sub = (ax + 16384.0) - 16384.0
        r = tl.where(ax >= 0.015625, normal, sub)
        # restore the sign on the bits so that -0.0 stays -0.0, as the hardware cast keeps it
        sign = x.to(tl.uint32, bitcast=True) & 0x80000000
        r = (r.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)
        return r.to(tl.float8e4nv)
    else:
        return x.to(tl.float8e4nv)


@triton.jit
def mul_bf16(a, b):
    """bf16 * bf16 rounded once to bf16 (the exact product fits FP32)."""
    return to_bf16(a.to(tl.float32) * b.to(tl.float32))


@triton.jit
def silu_mul(g, u):
    """``SiLU(g) * u = g / (1 + exp(-g)) * u`` in FP32 (g, u FP32; a very negative g gives -0)."""
    return g / (1.0 + tl.exp(-g)) * u
