"""Tests of `lowbit.reference.quant`: act_quant and fp4_quant (DeepSeek's activation quantizers).

Each is checked bit for bit against the format functions it wraps and against the rule
written out independently here (power-of-two rounding by float64 ``2**ceil(log2 s)`` instead
of the bit manipulation), plus the in-place quantize-dequantize contract and bad input.
Fresh random inputs every run; failure messages carry the seed
(``LOWBIT_TEST_SEED=<seed>`` replays it).
"""

from __future__ import annotations

import math

import pytest
import torch

from lowbit.formats import FormatError, get_format
from lowbit.formats.fp4 import dequantize_mxfp4, dequantize_nvfp4, pack_fp4, quantize_e2m1, quantize_mxfp4, unpack_fp4
from lowbit.formats.fp8 import dequantize_fp8_groups, e8m0_decode, quantize_fp8_groups
from lowbit.reference.quant import act_quant_ref as act_quant, fp4_quant_ref as fp4_quant
from lowbit.testing import assert_bitwise_equal, fresh_seed, make_generator

FP32_INV_448 = torch.tensor(1 / 448, dtype=torch.float32)
E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


@pytest.fixture
def seed() -> int:
    return fresh_seed()


def activations(seed: int, k: int, rows: tuple[int, ...] = (3, 5), dtype=torch.bfloat16) -> torch.Tensor:
    """bf16 activations with a few large outliers (as real activations have); no zeros."""
    gen = make_generator(seed)
    x = torch.randn(*rows, k, generator=gen)
    outliers = torch.rand(*rows, k, generator=gen) < 0.01
    x = torch.where(outliers, x * 50, x)
    return torch.where(x == 0, torch.full_like(x, 0.25), x).to(dtype)


def pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """2**ceil(log2 s) computed in float64 (independent of the bit trick under test)."""
    return torch.tensor([2.0 ** math.ceil(math.log2(v)) for v in s.double().flatten().tolist()]).reshape(s.shape).float()


def group_amax(x: torch.Tensor, block: int) -> torch.Tensor:
    return x.float().reshape(*x.shape[:-1], -1, block).abs().amax(-1)


def expand(s: torch.Tensor, block: int) -> torch.Tensor:
    return s.repeat_interleave(block, dim=-1)


# ----------------------------------------------------------------------------- act_quant
@pytest.mark.parametrize("block", [128, 32])
@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_act_quant_bit_exact(block, scale_fmt, seed):
    x = activations(seed, 4 * block)
    y, s = act_quant(x, block, scale_fmt)
    msg = f"block={block} scale_fmt={scale_fmt} seed={seed}"
    assert y.dtype == torch.float8_e4m3fn and y.shape == x.shape
    assert s.dtype == torch.float32 and s.shape == (*x.shape[:-1], 4)
    # the format functions it wraps
    y2, s2 = quantize_fp8_groups(x, block, scale_fmt)
    assert_bitwise_equal(y, y2, msg)
    assert_bitwise_equal(s, s2, msg)
    fmt = get_format(f"fp8_e4m3_g{block}" + ("_ue8m0" if scale_fmt else ""))
    assert_bitwise_equal(fmt.quantize(x).codes, y, msg)
    # the rule, written out
    want_s = group_amax(x, block).clamp_min(1e-4) * FP32_INV_448
    if scale_fmt:
        want_s = pow2_ceil(want_s)
    assert_bitwise_equal(s, want_s, msg)
    want_y = (x.float() / expand(want_s, block)).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert_bitwise_equal(y, want_y, msg)


def test_act_quant_pow2_scales_round_up(seed):
    x = activations(seed, 256)
    _, s = act_quant(x, 128, "ue8m0")
    need = group_amax(x, 128) / 448  # float64-exact enough: compared with slack of 2**-22
    mantissa, _ = torch.frexp(s)
    msg = f"seed={seed}"
    assert bool((mantissa == 0.5).all()), f"{msg}: scales are not powers of two"
    assert bool((s.double() >= need.double() * (1 - 2**-22)).all()), f"{msg}: scale below amax/448"
    assert bool((s.double() / 2 < need.double() * (1 + 2**-22)).all()), f"{msg}: not the next power of two"
    y, _ = act_quant(x, 128, "ue8m0")
    assert bool((y.float().abs() <= 448).all())


def test_act_quant_zero_and_tiny_groups():
    """amax is floored at 1e-4: an all-zero group gets a finite scale and zero codes."""
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    x[1] = 1e-6
    y, s = act_quant(x, 128)
    floor_scale = float(torch.tensor(1e-4) * FP32_INV_448)
    assert s.flatten().tolist() == [floor_scale, floor_scale]
    assert bool((y.float()[0] == 0).all())
    # 1e-6 (bf16 9.98e-7) / 2.23e-7 = 4.47 -> 4.5 (ulp 0.5 in [4, 8))
    assert bool((y.float()[1] == 4.5).all())


@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_act_quant_inplace(scale_fmt, dtype, seed):
    x = activations(seed, 256, dtype=dtype)
    original = x.clone()
    y, s = act_quant(original, 128, scale_fmt)
    out = act_quant(x, 128, scale_fmt, inplace=True)
    msg = f"scale_fmt={scale_fmt} {dtype} seed={seed}"
    assert out is x, "inplace returns x itself"
    assert_bitwise_equal(x, dequantize_fp8_groups(y, s, 128).to(dtype), msg)
    assert_bitwise_equal(original, activations(seed, 256, dtype=dtype), f"{msg}: non-inplace call wrote its input")
    if scale_fmt == "ue8m0":
        # code * 2**k fits bf16 exactly and keeps every group's amax: a second pass changes nothing
        again = x.clone()
        act_quant(again, 128, scale_fmt, inplace=True)
        assert_bitwise_equal(again, x, f"{msg}: not idempotent")


def test_act_quant_bad_input():
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    with pytest.raises(FormatError, match="scale_fmt"):
        act_quant(x, 128, "foo")
    with pytest.raises(FormatError, match="multiple"):
        act_quant(x[:, :200], 128)
    with pytest.raises(FormatError, match="group size"):
        act_quant(x, 64)
    with pytest.raises(FormatError, match="int32"):
        act_quant(torch.ones(2, 128, dtype=torch.int32))
    with pytest.raises(FormatError):
        act_quant(x.double())
    with pytest.raises(FormatError):
        act_quant(torch.tensor(1.0))


# ----------------------------------------------------------------------------- fp4_quant
def test_fp4_quant_ue8m0_is_mxfp4(seed):
    x = activations(seed, 128)
    packed, scales = fp4_quant(x)
    packed2, scales2 = quantize_mxfp4(x)
    msg = f"seed={seed}"
    assert packed.dtype == torch.uint8 and packed.shape == (3, 5, 64)
    assert scales.dtype == torch.uint8 and scales.shape == (3, 5, 4)
    assert_bitwise_equal(packed, packed2, msg)
    assert_bitwise_equal(scales, scales2, msg)
    assert_bitwise_equal(fp4_quant(x, 32, "ue8m0")[0], packed, msg)
    # the rule, written out: s = 2**ceil(log2(max(amax, 6 * 2**-126) * fp32(1/6))), E8M0 byte = log2 s + 127
    s = pow2_ceil(group_amax(x, 32).clamp_min(6 * 2.0**-126) * torch.tensor(1 / 6, dtype=torch.float32))
    assert_bitwise_equal(scales, (torch.log2(s) + 127).to(torch.uint8), msg)
    assert_bitwise_equal(packed, pack_fp4(quantize_e2m1(x.float() / expand(s, 32))), msg)


def test_fp4_quant_e4m3(seed):
    x = activations(seed, 64)
    x[0, 0, :16] = 0  # an all-zero group keeps a nonzero scale (the 6 * 2**-9 amax floor)
    packed, scales = fp4_quant(x, scale_fmt="e4m3")
    msg = f"seed={seed}"
    assert packed.shape == (3, 5, 32) and scales.dtype == torch.float8_e4m3fn and scales.shape == (3, 5, 4)
    want_s = (group_amax(x, 16).clamp_min(6 * 2.0**-9) / 6).to(torch.float8_e4m3fn)
    assert_bitwise_equal(scales, want_s, msg)
    assert float(scales[0, 0, 0].float()) == 2.0**-9
    assert bool((scales.float() > 0).all())
    want_codes = quantize_e2m1(x.float() / expand(want_s.float(), 16))
    assert_bitwise_equal(unpack_fp4(packed), want_codes, msg)


@pytest.mark.parametrize("scale_fmt", ["ue8m0", "e4m3"])
def test_fp4_quant_inplace(scale_fmt, seed):
    x = activations(seed, 64)
    packed, scales = fp4_quant(x.clone(), scale_fmt=scale_fmt)
    out = fp4_quant(x, scale_fmt=scale_fmt, inplace=True)
    assert out is x
    if scale_fmt == "ue8m0":
        want = dequantize_mxfp4(packed, scales)
    else:
        want = dequantize_nvfp4(packed, scales, 1.0)
    assert_bitwise_equal(x, want.to(torch.bfloat16), f"{scale_fmt} seed={seed}")
    # E2M1 value x scale has at most 6 significant bits: exact in bf16, so x / s is on the grid
    block = 32 if scale_fmt == "ue8m0" else 16
    s = e8m0_decode(scales) if scale_fmt == "ue8m0" else scales.float()
    on_grid = torch.isin((x.float() / expand(s, block)).abs(), E2M1_MAGNITUDES)
    assert bool(on_grid.all()), f"{scale_fmt} seed={seed}: in-place values off the E2M1 grid"


def test_fp4_quant_bad_input():
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with pytest.raises(FormatError, match="scale_fmt"):
        fp4_quant(x, scale_fmt="foo")
    with pytest.raises(FormatError, match="block"):
        fp4_quant(x, block_size=16, scale_fmt="ue8m0")
    with pytest.raises(FormatError, match="block"):
        fp4_quant(x, block_size=32, scale_fmt="e4m3")
    with pytest.raises(FormatError, match="multiple"):
        fp4_quant(x[:, :48])
    with pytest.raises(FormatError):
        fp4_quant(torch.ones(2, 64, dtype=torch.int8))
    with pytest.raises(FormatError, match="NaN"):
        fp4_quant(torch.full((1, 32), float("nan")))
