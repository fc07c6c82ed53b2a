"""linear() (`lowbit.layers.linear`): the FP8 / FP4 / torch dispatch of seed 004's model code
against act_quant_ref + the GEMM references (interpreter on CPU, native on GPU)."""

import pytest
import torch
from helpers import FP4X2, check_bf16_gemm, fp4_weight, fp8_weight

from lowbit.formats import FormatError
from lowbit.kernels.block_scaled.fp4 import fold_fp4_weight
from lowbit.layers.linear import ACT_QUANT_BACKEND, linear, weight_kind
from lowbit.reference import act_quant_ref, fp4_gemm_ref, fp8_gemm_ref
from lowbit.testing import assert_bitwise_equal


def _ref_linear(x, weight, scale, act, scale_fmt, kind):
    x2 = x.reshape(-1, x.shape[-1])
    xq, xs = act_quant_ref(x2, act, scale_fmt)
    if kind == "fp4":
        return fp4_gemm_ref(xq, xs, weight, scale, act)
    return fp8_gemm_ref(xq, xs, weight, scale)


@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_linear_fp8_dispatch_3d(scale_fmt, gen, device):
    k, n = 256, 96
    x = torch.randn(2, 3, k, generator=gen).to(torch.bfloat16)
    w, s = fp8_weight(n, k, gen)
    y = linear(x.to(device), w.to(device), s.to(device), scale_fmt=scale_fmt)
    assert y.shape == (2, 3, n) and y.dtype == torch.bfloat16
    ref = _ref_linear(x, w, s, 128, scale_fmt, "fp8").view(2, 3, n)
    check_bf16_gemm(y, ref, "linear fp8")


@pytest.mark.parametrize("act,scale_fmt", [(128, None), (32, "ue8m0")])
def test_linear_fp4_dispatch(act, scale_fmt, gen, device):
    k, n = 256, 80
    x = torch.randn(5, k, generator=gen).to(torch.bfloat16)
    w, s = fp4_weight(n, k, gen)
    ref = _ref_linear(x, w, s, act, scale_fmt, "fp4")
    y = linear(x.to(device), w.to(device), s.to(device), act_block_size=act, scale_fmt=scale_fmt)
    assert y.shape == (5, n) and y.dtype == torch.bfloat16
    check_bf16_gemm(y, ref, "linear fp4 uint8")
    if FP4X2 is not None:
        y2 = linear(x.to(device), w.view(FP4X2).to(device), s.to(device), act_block_size=act, scale_fmt=scale_fmt)
        assert_bitwise_equal(y2.cpu(), y.cpu(), "float4_e2m1fn_x2 weight")
    folded = fold_fp4_weight(w.to(device), s.to(device))  # prepared once
    assert weight_kind(folded) == "fp4"
    y3 = linear(x.to(device).view(5, 1, k), folded, act_block_size=act, scale_fmt=scale_fmt)
    assert y3.shape == (5, 1, n)
    # on sm_90 a folded weight takes the fold engine at decode M (the raw one the mma engine):
    # the same budget, not the same bits
    check_bf16_gemm(y3.view(5, n), ref, "linear fp4 folded weight")
    with pytest.raises(ValueError, match="carries its scales"):
        linear(x.to(device), folded, s.to(device))
    with pytest.raises(ValueError, match="must share K"):
        linear(x[:, :128].to(device), folded)


def test_linear_torch_fallback(gen, device):
    x = torch.randn(2, 4, 64, generator=gen).to(torch.bfloat16).to(device)
    w = torch.randn(48, 64, generator=gen).to(torch.bfloat16).to(device)
    assert weight_kind(w) == "torch"
    assert_bitwise_equal(linear(x, w).cpu(), torch.nn.functional.linear(x, w).cpu(), "F.linear")
    with pytest.raises(ValueError, match="takes no scale"):
        linear(x, w, torch.ones(1, 1, device=device))
    with pytest.raises(TypeError, match="must share a dtype"):
        linear(x, w.float())


def test_linear_bad_input(gen):
    x = torch.randn(3, 256, generator=gen).to(torch.bfloat16)
    w8, s8 = fp8_weight(64, 256, gen)
    w4, s4 = fp4_weight(64, 256, gen)
    assert (weight_kind(w8), weight_kind(w4)) == ("fp8", "fp4")
    with pytest.raises(ValueError, match="needs its scale"):
        linear(x, w8)
    with pytest.raises(ValueError, match="needs its scale"):
        linear(x, w4)
    with pytest.raises(ValueError, match=r"FP8 weight scale must have shape \(1, 2\)"):
        linear(x, w8, s8.repeat(2, 1))
    with pytest.raises(ValueError, match=r"FP4 weight scale must have shape \(64, 8\)"):
        linear(x, w4, s4[:, :4])
    with pytest.raises(ValueError, match="must share K"):
        linear(x[:, :128], w8, s8)
    with pytest.raises(ValueError, match=r"must be \[N, K/2\]"):
        linear(x[:, :128], w4, s4)
    with pytest.raises(ValueError, match="act_block_size=32"):
        linear(x, w8, s8, act_block_size=32)
    with pytest.raises(ValueError, match="act_block_size must be 32 or 128"):
        linear(x, w4, s4, act_block_size=64)
    with pytest.raises((ValueError, FormatError)):
        linear(x, w8, s8, scale_fmt="e5m2")
    assert ACT_QUANT_BACKEND in ("triton", "reference")
