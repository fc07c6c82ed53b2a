"""Round-trip and rule tests of every registered number format (`lowbit.formats.FORMATS`),
plus the bit-level helpers (E4M3, E2M1, UE8M0/E8M0, nibble packing, INT4 words).

The generic tests run over the registry: registering a format is enough to get them, but it
must also get a row in `RULES` (its element grid and saturation limits), or they fail saying so.

Per-element error bound. With ``s`` the element's effective scale and ``y = x / s``:
- E4M3: ``|x - x_hat| <= s * max(ulp(y) / 2, |y| - 448)``, ``ulp(y) = 2**(max(floor(log2|y|), -6) - 3)``
  (3 mantissa bits, subnormals below 2**-6); the second term is saturation.
- E2M1: grid spacing 0.5 below 2, 1 in [2, 4), 2 in [4, 6]: half of it, or ``|y| - 6`` past 6
  (NVFP4's E4M3 block scale is itself rounded, so ``y`` can exceed 6 a little).
- INT4 ``(q - 8) * s``: ``max(1/2, y - 7, -8 - y)`` (the BF16 scale is rounded, so ``y`` can
  pass 7.5 and clamp at 7).
A relative ``2**-20`` of slack covers the FP32 division and multiplication.

Fresh random inputs every run; every failure message carries the seed
(``LOWBIT_TEST_SEED=<seed>`` replays it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from lowbit.formats import FORMATS, FormatError, QuantizedTensor, get_format
from lowbit.formats.fp4 import (
    dequantize_mxfp4,
    dequantize_nvfp4,
    e2m1_to_float,
    nvfp4_global_scale,
    pack_fp4,
    quantize_e2m1,
    quantize_mxfp4,
    quantize_nvfp4,
    unpack_fp4,
)
from lowbit.formats.fp8 import (
    dequantize_fp8_blocks,
    dequantize_fp8_groups,
    e8m0_decode,
    e8m0_encode,
    encode_e4m3,
    quantize_fp8_blocks,
    quantize_fp8_groups,
    ue8m0_round_up,
)
from lowbit.formats.int4 import check_compressed_tensors_scheme
from lowbit.formats.mxfp8 import dequantize_mxfp8, quantize_mxfp8
from lowbit.testing import assert_bitwise_equal, fresh_seed, make_generator

FP32_INV_448 = torch.tensor(1 / 448, dtype=torch.float32)
FP32_INV_6 = torch.tensor(1 / 6, dtype=torch.float32)


@pytest.fixture
def seed() -> int:
    return fresh_seed()


# ----------------------------------------------------------------------------- helpers
def e4m3_err_units(y: torch.Tensor) -> torch.Tensor:
    a = y.abs().clamp(max=448.0)
    _, exp = torch.frexp(a)  # a = m * 2**exp, m in [0.5, 1): floor(log2 a) = exp - 1
    ulp = torch.exp2((torch.clamp(exp - 1, min=-6) - 3).float())
    return torch.maximum(ulp / 2, y.abs() - 448.0)


def e2m1_err_units(y: torch.Tensor) -> torch.Tensor:
    a = y.abs()
    half_step = torch.where(a < 2, 0.25, torch.where(a < 4, 0.5, 1.0))
    return torch.maximum(half_step, a - 6.0)


def int4_err_units(y: torch.Tensor) -> torch.Tensor:
    return torch.maximum(torch.full_like(y, 0.5), torch.maximum(y - 7.0, -8.0 - y))


@dataclass(frozen=True)
class Rule:
    """What the generic tests need to know about a format's element grid."""

    unit_code: float  # the code that decodes to 1.0 (times the scale)
    err_units: Callable[[torch.Tensor], torch.Tensor]
    max_pos: float  # saturation limits, in scale units
    max_neg: float
    pow2_scales: bool  # are the (decoded) scales powers of two


_E4M3 = dict(unit_code=1.0, err_units=e4m3_err_units, max_pos=448.0, max_neg=-448.0)
_E2M1 = dict(unit_code=2, err_units=e2m1_err_units, max_pos=6.0, max_neg=-6.0)
RULES: dict[str, Rule] = {
    "int4_g32": Rule(unit_code=9, err_units=int4_err_units, max_pos=7.0, max_neg=-8.0, pow2_scales=False),
    "fp8_e4m3_g128": Rule(**_E4M3, pow2_scales=False),
    "fp8_e4m3_g32": Rule(**_E4M3, pow2_scales=False),
    "fp8_e4m3_g128_ue8m0": Rule(**_E4M3, pow2_scales=True),
    "fp8_e4m3_g32_ue8m0": Rule(**_E4M3, pow2_scales=True),
    "mxfp8": Rule(**_E4M3, pow2_scales=True),
    "mxfp4": Rule(**_E2M1, pow2_scales=True),
    "nvfp4": Rule(**_E2M1, pow2_scales=False),
}


def rule_of(name: str) -> Rule:
    if name not in RULES:
        pytest.fail(f"format {name!r} is registered but has no row in tests/test_formats.py RULES")
    return RULES[name]


def random_input(gen: torch.Generator, group: int, shape=(2, 3), groups: int = 4, dtype=torch.float32) -> torch.Tensor:
    """``[*shape, groups*group]`` normal data whose groups differ in magnitude by up to
    ~e^4 either way (so scales vary); no zeros."""
    x = torch.randn(*shape, groups, group, generator=gen)
    x = x * torch.exp(2 * torch.randn(*shape, groups, 1, generator=gen))
    x = torch.where(x == 0, torch.full_like(x, 0.5), x)
    return x.reshape(*shape, groups * group).to(dtype)


def requantize(fmt, x: torch.Tensor, q: QuantizedTensor) -> QuantizedTensor:
    """quantize x with q's scales (and global scale, for the formats that have one)."""
    if q.global_scale is not None:
        return fmt.quantize(x, q.scales, global_scale=q.global_scale)
    return fmt.quantize(x, q.scales)


def elementwise_scale(fmt, q: QuantizedTensor) -> torch.Tensor:
    """The effective scale of every element: dequantize codes that all mean 1.0."""
    unit = torch.full(q.codes.shape, rule_of(fmt.name).unit_code).to(q.codes.dtype)
    return fmt.dequantize(QuantizedTensor(unit, q.scales, q.fmt, q.global_scale))


def group_amax(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.float().reshape(*x.shape[:-1], -1, group).abs().amax(-1)


def decoded_scales(fmt, scales: torch.Tensor) -> torch.Tensor:
    return e8m0_decode(scales) if fmt.scale_dtype == torch.uint8 else scales.float()


def is_pow2(t: torch.Tensor) -> torch.Tensor:
    m, _ = torch.frexp(t)
    return m == 0.5


ALL_FORMATS = sorted(FORMATS)


# ----------------------------------------------------------------------------- generic
@pytest.mark.parametrize("name", ALL_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pack_unpack_bit_exact(name, dtype, seed):
    fmt = get_format(name)
    x = random_input(make_generator(seed), fmt.group_size, dtype=dtype)
    q = fmt.quantize(x)
    packed = fmt.pack(q)
    q2 = fmt.unpack(packed)
    msg = f"{name} seed={seed}"
    assert q2.fmt == name
    assert_bitwise_equal(q2.codes, q.codes, f"{msg} codes")
    assert_bitwise_equal(q2.scales, q.scales, f"{msg} scales")
    if q.global_scale is not None:
        assert_bitwise_equal(q2.global_scale, q.global_scale, f"{msg} global_scale")
    assert_bitwise_equal(fmt.dequantize(q2), fmt.dequantize(q), f"{msg} dequantized")


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_requantize_dequantized_gives_same_codes(name, seed):
    fmt = get_format(name)
    x = random_input(make_generator(seed), fmt.group_size)
    q = fmt.quantize(x)
    q2 = requantize(fmt, fmt.dequantize(q), q)
    assert_bitwise_equal(q2.codes, q.codes, f"{name} seed={seed}: quantize(dequantize(q), q.scales)")


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_input_dtype_does_not_change_the_result(name, seed):
    """bf16 input is widened to FP32 exactly, so bf16 and its FP32 copy quantize alike."""
    fmt = get_format(name)
    x = random_input(make_generator(seed), fmt.group_size, dtype=torch.bfloat16)
    a, b = fmt.quantize(x), fmt.quantize(x.float())
    assert_bitwise_equal(a.codes, b.codes, f"{name} seed={seed} codes")
    assert_bitwise_equal(a.scales, b.scales, f"{name} seed={seed} scales")


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_dequantize_error_within_half_a_step(name, seed):
    fmt, rule = get_format(name), rule_of(name)
    x = random_input(make_generator(seed), fmt.group_size, shape=(3, 5))
    q = fmt.quantize(x)
    x_hat = fmt.dequantize(q)
    assert x_hat.dtype == torch.float32 and x_hat.shape == x.shape
    s = elementwise_scale(fmt, q)
    live = s > 0  # NVFP4 blocks whose scale underflowed hold values that dequantize to 0
    assert bool((x_hat[~live] == 0).all()), f"{name} seed={seed}: zero-scale block not zero"
    y = x[live] / s[live]
    bound = rule.err_units(y) * s[live] * (1 + 2**-20) + x[live].abs() * 2**-20
    err = (x[live] - x_hat[live]).abs()
    worst = int((err - bound).argmax())
    assert bool((err <= bound).all()), (
        f"{name} seed={seed}: error {float(err[worst]):.4g} > bound {float(bound[worst]):.4g} "
        f"at x={float(x[live][worst])!r}, scale={float(s[live][worst])!r}"
    )


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_scale_rules(name, seed):
    """Each format's scale from its group amax, exactly as its module documents it."""
    fmt, rule = get_format(name), rule_of(name)
    x = random_input(make_generator(seed), fmt.group_size)
    q = fmt.quantize(x)
    amax = group_amax(x, fmt.group_size)
    s = decoded_scales(fmt, q.scales)
    msg = f"{name} seed={seed}"
    if name == "int4_g32":
        want = (amax / 7.5).to(torch.bfloat16)
        assert_bitwise_equal(q.scales, want, msg)
    elif name == "nvfp4":
        g = x.abs().amax() / 2688.0
        assert_bitwise_equal(q.global_scale, g, f"{msg} global")
        assert_bitwise_equal(q.scales, (amax / (6.0 * g)).clamp(max=448).to(torch.float8_e4m3fn), msg)
    elif name.startswith("fp8") and not rule.pow2_scales:
        assert_bitwise_equal(q.scales, amax.clamp_min(1e-4) * FP32_INV_448, msg)
    else:
        assert rule.pow2_scales
        floor, inv = (6 * 2.0**-126, FP32_INV_6) if name == "mxfp4" else (1e-4, FP32_INV_448)
        need = amax.clamp_min(floor) * inv  # the scale before rounding up
        assert bool(is_pow2(s).all()), f"{msg}: scales not powers of two"
        assert bool((s >= need).all()), f"{msg}: a power-of-two scale is below amax / max_code"
        assert bool((s / 2 < need).all()), f"{msg}: a scale was rounded up further than the next power of two"
        assert bool((s.double() >= amax.double() / rule.max_pos * (1 - 2**-23)).all()), msg


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_values_out_of_range_saturate(name, seed):
    fmt, rule = get_format(name), rule_of(name)
    x = random_input(make_generator(seed), fmt.group_size)
    q = fmt.quantize(x)
    big = requantize(fmt, x * 1000, q)  # same scales, values far past the largest code
    s = elementwise_scale(fmt, q)
    y = x * 1000 / s
    big_hat = fmt.dequantize(big)
    msg = f"{name} seed={seed}"
    # dequantize multiplies code value by scale in FP32: so does this side
    for past, limit in ((y >= rule.max_pos + 1, rule.max_pos), (y <= rule.max_neg - 1, rule.max_neg)):
        assert bool((big_hat[past] == limit * s[past]).all()), msg
    assert bool((big_hat.abs() <= max(rule.max_pos, -rule.max_neg) * s).all()), msg
    assert bool(((y >= rule.max_pos + 1) | (y <= rule.max_neg - 1)).float().mean() > 0.5), msg


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_wrong_scale_shape_is_rejected(name, seed):
    fmt = get_format(name)
    x = random_input(make_generator(seed), fmt.group_size)
    q = fmt.quantize(x)
    # scales of twice the group size: half as many groups
    wrong = q.scales[..., ::2].contiguous()
    with pytest.raises(FormatError):
        fmt.dequantize(QuantizedTensor(q.codes, wrong, q.fmt, q.global_scale))
    with pytest.raises(FormatError):
        requantize(fmt, x, QuantizedTensor(q.codes, wrong, q.fmt, q.global_scale))


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_wrong_dtypes_are_rejected(name, seed):
    fmt = get_format(name)
    x = random_input(make_generator(seed), fmt.group_size)
    q = fmt.quantize(x)
    wrong_codes = q.codes.view(torch.int8)
    with pytest.raises(FormatError):
        fmt.dequantize(QuantizedTensor(wrong_codes, q.scales, q.fmt, q.global_scale))
    with pytest.raises(FormatError):
        fmt.dequantize(QuantizedTensor(q.codes, q.scales.to(torch.float16), q.fmt, q.global_scale))
    with pytest.raises(FormatError):  # last dim not a multiple of the group
        fmt.quantize(x[..., :-1])


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_integer_input_is_rejected(name):
    fmt = get_format(name)
    with pytest.raises(FormatError):
        fmt.quantize(torch.ones(2, fmt.group_size, dtype=torch.int32))


def test_unknown_format_name():
    with pytest.raises(FormatError, match="supported"):
        get_format("fp8_e5m2_g128")


# ----------------------------------------------------------------------------- golden vectors
def _group(values: list[float], group: int, fill: float) -> list[float]:
    return values + [fill] * (group - len(values))


# Hand-checked E4M3 roundings (scale 1): 126.2 -> 128 (ulp 8 in [64, 128));
# 124 is the 120|128 tie -> 128 (even mantissa); 3.125 is the 3.0|3.25 tie -> 3.0;
# 3.375 is the 3.25|3.5 tie -> 3.5; -17 is the 16|18 tie -> -16; 19 the 18|20 tie -> 20;
# 2**-10 is the 0|2**-9 tie -> 0; 3*2**-10 the 2**-9|2**-8 tie -> 2**-8;
# 0.1 -> 13 * 2**-7 = 0.1015625 (ulp 2**-7 in [2**-4, 2**-3)).
E4M3_IN = [126.2, 124.0, 3.125, 3.375, -17.0, 19.0, 2.0**-10, 3 * 2.0**-10, 0.1, -3.125]
E4M3_OUT = [128.0, 128.0, 3.0, 3.5, -16.0, 20.0, 0.0, 2.0**-8, 0.1015625, -3.0]


@pytest.mark.parametrize("group", [128, 32])
def test_fp8_fp32_scale_golden(group):
    fmt = get_format(f"fp8_e4m3_g{group}")
    # group 0: amax 448 -> scale 448 * fp32(1/448) == 1.0 exactly
    # group 1: all 2**-20, below the 1e-4 amax floor -> scale fp32(1e-4) * fp32(1/448);
    #          2**-20 / 2.2321e-7 = 4.27 -> 4.5 (ulp 0.5 in [4, 8))
    x = torch.tensor([_group([448.0] + E4M3_IN, group, 1.0), [2.0**-20] * group])
    q = fmt.quantize(x)
    assert q.scales.flatten().tolist() == [1.0, float(torch.tensor(1e-4) * FP32_INV_448)]
    assert q.codes.float()[0, : 1 + len(E4M3_OUT)].tolist() == [448.0] + E4M3_OUT
    assert bool((q.codes.float()[0, 1 + len(E4M3_OUT) :] == 1.0).all())
    assert bool((q.codes.float()[1] == 4.5).all())


@pytest.mark.parametrize("name", ["fp8_e4m3_g128_ue8m0", "fp8_e4m3_g32_ue8m0", "mxfp8"])
def test_pow2_fp8_golden(name):
    fmt = get_format(name)
    group = fmt.group_size
    # group 0: amax 300 -> 300/448 = 0.67 rounds up to scale 1; 300 -> 288 (ulp 32 in [256, 512))
    # group 1: amax 1000 -> 2.23 rounds up to 4; 1000/4 = 250 -> 256 (ulp 16); -7/4 = -1.75 exact
    x = torch.tensor([_group([300.0] + E4M3_IN, group, 1.0), _group([1000.0, -7.0], group, 4.0)])
    q = fmt.quantize(x)
    assert decoded_scales(fmt, q.scales).flatten().tolist() == [1.0, 4.0]
    if fmt.scale_dtype == torch.uint8:
        assert q.scales.flatten().tolist() == [127, 129]  # E8M0 bytes: 2**(byte - 127)
    assert q.codes.float()[0, : 1 + len(E4M3_OUT)].tolist() == [288.0] + E4M3_OUT
    assert q.codes.float()[1, :3].tolist() == [256.0, -1.75, 1.0]
    assert fmt.dequantize(q)[1, :2].tolist() == [1024.0, -7.0]


def test_fp8_saturation_golden():
    codes, _ = quantize_fp8_groups(torch.tensor([[1000.0, -500.0, 464.0, 447.0] + [1.0] * 28]), 32, scales=torch.ones(1, 1))
    assert codes.float()[0, :4].tolist() == [448.0, -448.0, 448.0, 448.0]


def test_mxfp4_golden():
    # group 0: amax 5 -> 5 * fp32(1/6) = 0.83 rounds up to scale 1 (byte 127)
    #   5 is the 4|6 tie -> 4 (code 6, even); 0.25 the 0|0.5 tie -> 0; 0.75 the 0.5|1 tie -> 1;
    #   1.25 -> 1; 1.75 -> 2; 2.5 -> 2; 3.5 -> 4; -5 -> -4 (code 14); -0.1 -> -0 (code 8);
    #   2.9 -> 3 (code 5); 0.3 -> 0.5 (code 1); filler 1.0 -> code 2
    # group 1: amax 7 -> 1.17 rounds up to 2 (byte 128); 7/2 = 3.5 tie -> 4 (code 6);
    #   -7 -> code 14; 1/2 = 0.5 -> code 1; 0.5/2 = 0.25 tie -> 0; filler 2/2 = 1 -> code 2
    g0 = [5.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, -5.0, -0.1, 2.9, 0.3]
    g1 = [7.0, -7.0, 1.0, 0.5]
    x = torch.tensor([_group(g0, 32, 1.0) + _group(g1, 32, 2.0)])
    packed, scales = quantize_mxfp4(x)
    assert scales.tolist() == [[127, 128]]
    codes = unpack_fp4(packed)[0]
    assert codes[:11].tolist() == [6, 0, 2, 2, 4, 4, 6, 14, 8, 5, 1]
    assert bool((codes[11:32] == 2).all())
    assert codes[32:36].tolist() == [6, 14, 1, 0]
    assert bool((codes[36:] == 2).all())
    assert packed[0, :2].tolist() == [0x06, 0x22]  # (code1 << 4) | code0
    assert dequantize_mxfp4(packed, scales)[0, 32:36].tolist() == [8.0, -8.0, 1.0, 0.0]


def test_nvfp4_golden():
    # tensor amax 2688 -> global scale 2688 / (448 * 6) = 1
    # block 0: amax 2688 -> scale e4m3(448) = 448; 2688/448 = 6 (code 7); 1344/448 = 3 (code 5);
    #          filler 1/448 -> 0
    # block 1: amax 100 -> 16.67 -> e4m3 16 (ulp 2 in [16, 32)); 100/16 = 6.25 saturates to 6 -> 96;
    #          filler 10/16 = 0.625 -> 0.5 (code 1) -> 8
    # block 2: amax 1 -> 0.1667 -> e4m3 11 * 2**-6 = 0.171875; 1/0.171875 = 5.82 -> 6 (code 7);
    #          -0.5 -> -2.91 -> -3 (code 13); filler 0.25 -> 1.45 -> 1.5 (code 3)
    # block 3: amax 1e-9 -> 1.7e-10 underflows E4M3 -> scale 0 -> all codes 0
    x = torch.tensor(
        [_group([2688.0, 1344.0], 16, 1.0) + _group([100.0], 16, 10.0) + _group([1.0, -0.5], 16, 0.25)
         + _group([1e-9, -1e-9], 16, 1e-9)]
    )
    packed, scales, g = quantize_nvfp4(x)
    assert float(g) == 1.0
    assert scales.float().tolist() == [[448.0, 16.0, 0.171875, 0.0]]
    codes = unpack_fp4(packed)[0]
    assert codes[:2].tolist() == [7, 5] and bool((codes[2:16] == 0).all())
    assert codes[16:18].tolist() == [7, 1]
    assert codes[32:35].tolist() == [7, 13, 3]
    assert bool((codes[48:] == 0).all())
    x_hat = dequantize_nvfp4(packed, scales, g)[0]
    assert x_hat[[0, 1, 16, 17, 32, 33, 34, 48]].tolist() == [2688.0, 1344.0, 96.0, 8.0, 1.03125, -0.515625, 0.2578125, 0.0]


def test_nvfp4_all_zero_tensor():
    x = torch.zeros(2, 32)
    packed, scales, g = quantize_nvfp4(x)
    assert float(g) == 1.0 and float(nvfp4_global_scale(x)) == 1.0
    assert bool((packed == 0).all()) and bool((scales.float() == 0).all())
    assert bool((dequantize_nvfp4(packed, scales, g) == 0).all())


def test_nvfp4_needs_global_scale_with_given_scales(seed):
    x = random_input(make_generator(seed), 16)
    fmt = get_format("nvfp4")
    q = fmt.quantize(x)
    with pytest.raises(FormatError, match="global_scale"):
        fmt.quantize(x, q.scales)
    with pytest.raises(FormatError):
        fmt.quantize(x, global_scale=-1.0)


def test_int4_golden():
    # amax 7.5 -> scale bf16(1.0); w = (q - 8) * s, round half to even, clamp to [-8, 7]
    # 7.5 -> 8 -> clamps to 7 (code 15); -7.5 -> -8 (code 0); 0.5 -> 0 (code 8); -0.5 -> -0
    # (code 8); 1.5 -> 2 (code 10); 2.4 -> 2 (code 10); filler 1.0 -> code 9
    fmt = get_format("int4_g32")
    x = torch.tensor([_group([7.5, -7.5, 0.5, -0.5, 1.5, 2.4], 32, 1.0)])
    q = fmt.quantize(x)
    assert q.scales.float().tolist() == [[1.0]]
    assert q.codes[0, :7].tolist() == [15, 0, 8, 8, 10, 10, 9]
    assert fmt.dequantize(q)[0, :6].tolist() == [7.0, -8.0, 0.0, 0.0, 2.0, 2.0]


def test_compressed_tensors_word_layout():
    """Element 8j+i of a row sits in bits 4i..4i+3 of word j (hand-built words)."""
    fmt = get_format("int4_g32")
    codes = torch.full((2, 32), 8, dtype=torch.uint8)
    codes[0, :8] = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])
    codes[1, 15] = 15  # word 1, nibble 7: the sign bit of the int32
    q = QuantizedTensor(codes, torch.ones(2, 1, dtype=torch.bfloat16), "int4_g32")
    words = fmt.pack(q)["weight_packed"]
    assert words.dtype == torch.int32 and words.shape == (2, 4)
    assert int(words[0, 0]) == 0x87654321 - 2**32
    assert int(words[1, 1]) == 0xF8888888 - 2**32
    assert int(words[1, 0]) == 0x88888888 - 2**32
    assert_bitwise_equal(fmt.unpack(fmt.pack(q)).codes, codes)


def test_compressed_tensors_scheme_check():
    ok = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
    check_compressed_tensors_scheme(ok)
    for key, bad in [("group_size", 128), ("symmetric", False), ("num_bits", 8), ("strategy", "channel"), ("type", "float")]:
        with pytest.raises(FormatError, match=key):
            check_compressed_tensors_scheme({**ok, key: bad})


# ----------------------------------------------------------------------------- E4M3 / E2M1
def test_e4m3_exhaustive_and_ties():
    """Every finite E4M3 byte survives decode -> encode; every midpoint between neighbours
    rounds to the one with an even mantissa (last bit 0)."""
    byte = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    finite = (byte & 0x7F) != 0x7F
    values = byte[finite].view(torch.float8_e4m3fn).float()
    assert_bitwise_equal(encode_e4m3(values).view(torch.uint8), byte[finite])
    pos = torch.arange(0, 0x7F, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (pos[:-1] + pos[1:]) / 2  # exact in FP32
    got = encode_e4m3(mids).view(torch.uint8).to(torch.int32)
    lower = torch.arange(0, 0x7E, dtype=torch.int32)
    want = torch.where(lower % 2 == 0, lower, lower + 1)
    assert torch.equal(got, want)
    assert encode_e4m3(torch.tensor([1e9, -1e9, float("inf")])).float().tolist() == [448.0, -448.0, 448.0]


E2M1_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_e2m1_exhaustive():
    codes = torch.arange(16, dtype=torch.uint8)
    values = e2m1_to_float(codes)
    assert values.tolist() == E2M1_TABLE + [-v for v in E2M1_TABLE]
    assert bool(torch.signbit(values[8]))  # code 8 is -0
    assert_bitwise_equal(quantize_e2m1(values), codes)
    # midpoints: the tie goes to the even code; just off the midpoint goes to the nearer one
    for i in range(7):
        mid = (E2M1_TABLE[i] + E2M1_TABLE[i + 1]) / 2
        even = i if i % 2 == 0 else i + 1
        got = quantize_e2m1(torch.tensor([mid, -mid, mid * (1 - 1e-6), mid * (1 + 1e-6)]))
        assert got.tolist() == [even, even | 8, i, i + 1], f"tie at {mid}"
    sat = quantize_e2m1(torch.tensor([6.5, 100.0, float("inf"), -float("inf"), -0.0]))
    assert sat.tolist() == [7, 7, 7, 15, 8]
    with pytest.raises(FormatError, match="NaN"):
        quantize_e2m1(torch.tensor([float("nan")]))
    with pytest.raises(FormatError):
        e2m1_to_float(torch.tensor([16], dtype=torch.uint8))


def test_fp4_nibble_order(seed):
    assert pack_fp4(torch.tensor([1, 2, 15, 0], dtype=torch.uint8)).tolist() == [0x21, 0x0F]
    codes = torch.randint(0, 16, (3, 64), generator=make_generator(seed), dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.shape == (3, 32)
    assert_bitwise_equal(unpack_fp4(packed), codes, f"seed={seed}")
    # torch's float4_e2m1fn_x2 holds the same bytes (val0 in bits 3..0)
    assert_bitwise_equal(unpack_fp4(packed.view(torch.float4_e2m1fn_x2)), codes, f"seed={seed}")
    with pytest.raises(FormatError):
        pack_fp4(codes[:, :3])
    with pytest.raises(FormatError):
        pack_fp4(codes + 16)


# ----------------------------------------------------------------------------- UE8M0 / E8M0
def test_ue8m0_round_up_matches_exact_ceil_log2(seed):
    gen = make_generator(seed)
    s = torch.exp2(torch.empty(4096).uniform_(-125, 126, generator=gen)).float()
    got = ue8m0_round_up(s)
    want = torch.tensor([2.0 ** math.ceil(math.log2(v)) if v != 2.0 ** round(math.log2(v)) else v for v in s.double().tolist()])
    assert_bitwise_equal(got, want.float(), f"seed={seed}")


def test_ue8m0_round_up_edges():
    p = torch.tensor([2.0**-126, 0.25, 1.0, 4.0, 2.0**127])
    assert_bitwise_equal(ue8m0_round_up(p), p)  # powers of two unchanged
    above = torch.nextafter(p[:-1], torch.tensor(float("inf")))
    assert_bitwise_equal(ue8m0_round_up(above), p[:-1] * 2)  # one ulp above: next power
    s = torch.tensor([3.0, 0.75, 0.0, 1e-45, 2.0**127 * 1.5, float("inf")])
    assert ue8m0_round_up(s).tolist() == [4.0, 1.0, 0.0, 2.0**-126, float("inf"), float("inf")]
    with pytest.raises(FormatError):
        ue8m0_round_up(torch.tensor([-1.0]))
    with pytest.raises(FormatError):
        ue8m0_round_up(torch.tensor([1.0], dtype=torch.float64))


def test_e8m0_encode_decode():
    byte = torch.arange(255, dtype=torch.int32).to(torch.uint8)
    value = e8m0_decode(byte)
    assert value.tolist() == [2.0 ** (b - 127) for b in range(255)]
    assert_bitwise_equal(e8m0_encode(value), byte)
    assert math.isnan(float(e8m0_decode(torch.tensor([255], dtype=torch.uint8))))
    # torch's float8_e8m0fnu: same bits
    assert_bitwise_equal(byte.view(torch.float8_e8m0fnu).float(), value)
    assert_bitwise_equal(e8m0_encode(value, dtype=torch.float8_e8m0fnu).view(torch.uint8), byte)
    assert_bitwise_equal(e8m0_decode(byte.view(torch.float8_e8m0fnu)), value)
    for bad in (3.0, 0.0, -1.0, float("inf"), 2.0**-128):
        with pytest.raises(FormatError):
            e8m0_encode(torch.tensor([bad]))


# ----------------------------------------------------------------------------- FP8 functions
def test_fp8_group_scheme_errors():
    x = torch.randn(2, 128)
    with pytest.raises(FormatError, match="scale_fmt"):
        quantize_fp8_groups(x, 128, scale_fmt="foo")
    with pytest.raises(FormatError, match="group size"):
        quantize_fp8_groups(x, 64)
    with pytest.raises(FormatError):
        quantize_fp8_groups(x.to(torch.int32), 128)
    with pytest.raises(FormatError):  # given scales that are not powers of two
        quantize_fp8_groups(x, 128, "ue8m0", scales=torch.full((2, 1), 3.0))
    with pytest.raises(FormatError):  # zero scale
        quantize_fp8_groups(x, 128, scales=torch.zeros(2, 1))
    with pytest.raises(FormatError):
        dequantize_fp8_groups(x.to(torch.float8_e4m3fn), torch.ones(2, 2), 128)


@pytest.mark.parametrize("k", [300, 96])
def test_fp8_groups_partial_last_group(k, seed):
    """K not a multiple of the group: scales [..., ceil(K/g)], the last group partial."""
    x = random_input(make_generator(seed), k, groups=1, shape=(4,))
    codes, scales = quantize_fp8_groups(x, 128)
    ng = -(-k // 128)
    assert codes.shape == (4, k) and scales.shape == (4, ng)
    padded = torch.nn.functional.pad(x, (0, ng * 128 - k))
    want_c, want_s = quantize_fp8_groups(padded, 128)
    assert_bitwise_equal(scales, want_s, f"seed={seed}")
    assert_bitwise_equal(codes, want_c[:, :k], f"seed={seed}")
    assert_bitwise_equal(dequantize_fp8_groups(codes, scales, 128), dequantize_fp8_groups(want_c, want_s, 128)[:, :k])


@pytest.mark.parametrize("shape", [(200, 300), (2, 130, 128), (128, 128)])
@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_fp8_blocks(shape, scale_fmt, seed):
    gen = make_generator(seed)
    w = torch.randn(*shape, generator=gen) * torch.exp(torch.randn((), generator=gen))
    codes, scales = quantize_fp8_blocks(w, 128, scale_fmt)
    n, k = shape[-2:]
    nb, kb = -(-n // 128), -(-k // 128)
    assert codes.shape == w.shape and codes.dtype == torch.float8_e4m3fn
    assert scales.shape == (*shape[:-2], nb, kb) and scales.dtype == torch.float32
    msg = f"shape={shape} seed={seed}"
    for i in range(nb):
        for j in range(kb):
            tile = w[..., i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]
            amax = tile.abs().amax(dim=(-2, -1))
            want_s = amax.clamp_min(1e-4) * FP32_INV_448
            if scale_fmt:
                want_s = ue8m0_round_up(want_s)
            assert_bitwise_equal(scales[..., i, j], want_s, msg)
            want_c = encode_e4m3(tile / want_s[..., None, None])
            assert_bitwise_equal(codes[..., i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128], want_c, msg)
    w_hat = dequantize_fp8_blocks(codes, scales, 128)
    s_full = scales.repeat_interleave(128, -2).repeat_interleave(128, -1)[..., :n, :k]
    bound = e4m3_err_units(w / s_full) * s_full * (1 + 2**-20) + w.abs() * 2**-20
    assert bool(((w - w_hat).abs() <= bound).all()), msg
    with pytest.raises(FormatError):
        quantize_fp8_blocks(w, 64)
    with pytest.raises(FormatError):
        dequantize_fp8_blocks(codes, scales[..., :-1, :], 128)


def test_mxfp8_functions_match_fp8_g32_ue8m0(seed):
    x = random_input(make_generator(seed), 32, dtype=torch.bfloat16)
    codes, scales_e8m0 = quantize_mxfp8(x)
    c2, s2 = quantize_fp8_groups(x, 32, "ue8m0")
    assert_bitwise_equal(codes, c2, f"seed={seed}")
    assert_bitwise_equal(e8m0_decode(scales_e8m0), s2, f"seed={seed}")
    assert_bitwise_equal(dequantize_mxfp8(codes, scales_e8m0), dequantize_fp8_groups(c2, s2, 32))
    with pytest.raises(FormatError):
        dequantize_mxfp8(codes, torch.full_like(scales_e8m0, 255))


def test_mxfp4_scheme_errors(seed):
    x = random_input(make_generator(seed), 32)
    with pytest.raises(FormatError):
        quantize_mxfp4(x, group_size=16)
    with pytest.raises(FormatError):
        quantize_mxfp4(x.to(torch.int32))
    packed, scales = quantize_mxfp4(x)
    with pytest.raises(FormatError):
        dequantize_mxfp4(packed, scales[..., :-1])
