"""Test-only kernels that prove the CPU tier tells the truth (see test_numerics_canary.py).

`canary_gemm_kernel` is a small bf16 GEMM (C = A @ B, FP32 accumulation, bf16 out) in four
variants: the correct one (low-precision steps through `lowbit.runtime.numerics`), two that
use Triton's raw ops (right on a GPU, wrong under the 3.6 interpreter), and one with a real
bug (drops the last partial K tile), which must fail on every tier.
"""

import triton
import triton.language as tl

from lowbit.runtime import numerics

VARIANTS = {"correct": 0, "raw_dot": 1, "raw_cast": 2, "dropped_k_tail": 3}


@triton.jit
def canary_gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, VARIANT: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.float32)
    k_end = K
    if VARIANT == 3:
        k_end = K // BK * BK  # the bug: the tail tile is never read
    for k0 in range(0, k_end, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k0 + rk)[None, :],
                    mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k0 + rk)[:, None] * N + rn[None, :],
                    mask=((k0 + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        if VARIANT == 1:
            acc = tl.dot(a, b, acc)
        else:
            acc = numerics.dot(a, b, acc)
    if VARIANT == 2:
        c = acc.to(tl.bfloat16)
    else:
        c = numerics.to_bf16(acc)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], c, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def cast_kernel(x_ptr, bf16_ptr, fp8_ptr, a_ptr, b_ptr, prod_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(bf16_ptr + offs, numerics.to_bf16(x), mask=m)
    tl.store(fp8_ptr + offs, numerics.to_fp8e4m3(x), mask=m)
    a = tl.load(a_ptr + offs, mask=m)
    b = tl.load(b_ptr + offs, mask=m)
    tl.store(prod_ptr + offs, numerics.mul_bf16(a, b), mask=m)


def compile_configs():
    """For the compile-tier self-test: the correct canary must show bf16 wgmma (HGMMA)."""
    from lowbit.kernels.compile_tier import KernelConfig

    sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "VARIANT": "constexpr"}
    consts = {"BM": 64, "BN": 64, "BK": 32, "VARIANT": 0}
    return [
        KernelConfig("canary_gemm[expect HGMMA]", canary_gemm_kernel, sig, consts, expect_sass=("HGMMA",)),
        # deliberately wrong expectation: the checker must report QGMMA (fp8 wgmma) missing
        KernelConfig("canary_gemm[expect QGMMA]", canary_gemm_kernel, sig, consts, expect_sass=("QGMMA",)),
    ]
