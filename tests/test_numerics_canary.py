"""The CPU tier tells the truth.

Triton 3.6's interpreter computes bf16 dots, bf16 casts and fp8 casts wrongly. Production
kernels route those steps through `lowbit.runtime.numerics`; these tests show (1) the helpers
are bit-exact against torch's casts, (2) a kernel written with them is bit-exact against the
FP32 reference on inputs whose products and sums are exact in FP32 (so any GEMM must round to
the very same bf16), and (3) the canaries: a kernel with a real bug fails on every tier, and
kernels using the raw ops fail on the interpreter tier, which is why the layer exists.
"""

import pytest
import torch
import triton

from lowbit.testing import assert_bitwise_equal, interpreter_active

from canary_kernels import VARIANTS, canary_gemm_kernel, cast_kernel


def _exact_operands(m, n, k, gen, device):
    # a in {-8..7}/8, b in {-8..7}/16: products are multiples of 2^-7, |sum| < K/2, so every
    # FP32 sum is exact whatever the order, yet needs ~12 bits: bf16 rounding is exercised.
    a = (torch.randint(-8, 8, (m, k), generator=gen) / 8).to(torch.bfloat16)
    b = (torch.randint(-8, 8, (k, n), generator=gen) / 16).to(torch.bfloat16)
    return a.to(device), b.to(device)


def _run_canary(variant, a, b):
    m, k = a.shape
    n = b.shape[1]
    c = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=a.device)
    grid = (triton.cdiv(m, 64), triton.cdiv(n, 64))
    canary_gemm_kernel[grid](a, b, c, m, n, k, BM=64, BN=64, BK=32, VARIANT=VARIANTS[variant])
    return c


def _reference(a, b):
    return (a.double().cpu() @ b.double().cpu()).float().to(torch.bfloat16)


def test_casts_bit_exact(gen, device):
    n = 4096
    x = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-12, 10, (n,), generator=gen).float())
    # edges: 126.2 -> 128 in e4m3 (mantissa carry), saturation, e4m3 subnormals, bf16 ties
    x[:8] = torch.tensor([126.2, -126.2, 500.0, -1e6, 0.001953125 * 1.5, 3e-4, 1.00390625, 1.01171875])
    a = (torch.randn(n, generator=gen)).to(torch.bfloat16)
    b = (torch.randn(n, generator=gen)).to(torch.bfloat16)
    xd, ad, bd = x.to(device), a.to(device), b.to(device)
    out_bf16 = torch.empty(n, dtype=torch.bfloat16, device=device)
    out_fp8 = torch.empty(n, dtype=torch.float8_e4m3fn, device=device)
    out_prod = torch.empty(n, dtype=torch.bfloat16, device=device)
    cast_kernel[(triton.cdiv(n, 1024),)](xd, out_bf16, out_fp8, ad, bd, out_prod, n, BLOCK=1024)
    assert_bitwise_equal(out_bf16.cpu(), x.to(torch.bfloat16), "fp32->bf16")
    assert_bitwise_equal(out_fp8.cpu(), x.clamp(-448, 448).to(torch.float8_e4m3fn), "fp32->e4m3")
    assert_bitwise_equal(out_prod.cpu(), (a.float() * b.float()).to(torch.bfloat16), "bf16*bf16")
    assert out_fp8[0].item() == 128.0


@pytest.mark.parametrize("shape", [(64, 64, 64), (70, 50, 40), (1, 130, 96)], ids=str)
def test_canary_correct_kernel_bit_exact(shape, gen, device):
    m, n, k = shape
    a, b = _exact_operands(m, n, k, gen, device)
    assert_bitwise_equal(_run_canary("correct", a, b).cpu(), _reference(a, b), "canary gemm")


def test_canary_real_bug_fails_on_every_tier(gen, device):
    a, b = _exact_operands(64, 64, 40, gen, device)  # K=40: a partial tail tile of 8
    c = _run_canary("dropped_k_tail", a, b)
    with pytest.raises(AssertionError, match="elements differ"):
        assert_bitwise_equal(c.cpu(), _reference(a, b), "buggy canary")


@pytest.mark.parametrize("variant", ["raw_dot", "raw_cast"])
def test_canary_raw_ops(variant, gen, device):
    """Raw bf16 ops: right on the GPU, wrong on the interpreter (why `numerics` exists)."""
    a, b = _exact_operands(64, 64, 64, gen, device)
    c = _run_canary(variant, a, b).cpu()
    if interpreter_active():
        with pytest.raises(AssertionError, match="elements differ"):
            assert_bitwise_equal(c, _reference(a, b), variant)
    else:
        assert_bitwise_equal(c, _reference(a, b), variant)
