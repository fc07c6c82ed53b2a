"""Triton act_quant / fp4_quant vs the references, bit for bit (interpreter on CPU, native on GPU).

Every comparison is `assert_bitwise_equal` against `act_quant_ref` / `fp4_quant_ref` on the
same input: codes, scales and in-place results. The data (`_groups`) mixes, group by group:
ordinary activations with magnitudes spread over many binades, groups with one large outlier
(the rest lands in E4M3 subnormals / zero; E4M3-scaled FP4 saturates its scale at 448 and its
codes at +-6), groups below the amax floor, exact ties on the E4M3 / E2M1 grids (built on
power-of-two and E4M3 scales, where ``x / s`` is exact), and a +-0 group. Output buffers are
poisoned first. Fresh random data every run (``LOWBIT_TEST_SEED`` replays a failure).
"""

from __future__ import annotations

import pytest
import torch

from lowbit.formats import FormatError
from lowbit.formats.fp4 import E2M1_VALUES
from lowbit.formats.fp8 import fp8_scales_from_amax
from lowbit.kernels import quant
from lowbit.kernels.quant import QuantConfig, act_quant, explain_quant_config, fp4_quant, quant_config
from lowbit.reference.quant import act_quant_ref, fp4_quant_ref
from lowbit.testing import assert_bitwise_equal

ACT_VARIANTS = [(b, f) for b in (128, 32) for f in (None, "ue8m0")]
FP4_FMTS = ["ue8m0", "e4m3"]
BLOCK_OF = {"ue8m0": 32, "e4m3": 16}

# An outlier near the bf16 maximum dequantizes to inf in place (MXFP4: 4 * 2**126 = 2**128;
# float16 outputs past 65504), in the reference exactly as in the kernel; numpy warns about it
# under the interpreter.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

#: all finite positive E4M3 values, ascending, and the midpoints between neighbours (ties)
_E4M3_POS = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
E4M3_TIES = ((_E4M3_POS[1:] + _E4M3_POS[:-1]) / 2)
E2M1_TIES = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def _groups(rows: int, k: int, block: int, gen: torch.Generator, dtype=torch.bfloat16, kind: str = "fp8") -> torch.Tensor:
    """``[rows, k]`` test activations, built group by group (see the module docstring)."""
    g = rows * k // block
    x = torch.randn(g, block, generator=gen)
    # magnitudes over many binades: group scales from 2**-20 to 2**20
    x *= torch.exp2(torch.randint(-20, 21, (g, 1), generator=gen).float())
    x = torch.where(x == 0, torch.full_like(x, 0.375), x)
    pick = torch.randperm(g, generator=gen)
    n_edge = max(1, g // 8)
    out_i, tiny_i, tie_i, zero_i = (pick[i * n_edge:(i + 1) * n_edge] for i in range(4))
    # outliers: one element far above the rest (1e5 or near the bf16 max)
    col = torch.randint(0, block, (len(out_i),), generator=gen)
    big = torch.where(torch.rand(len(out_i), generator=gen) < 0.5, 1e5, 3.0e38)
    x[out_i] = torch.randn(len(out_i), block, generator=gen)
    x[out_i, col] = big * torch.sign(torch.randn(len(out_i), generator=gen))
    # below the amax floor (1e-4 for FP8; 6 * 2**-9 for E4M3-scaled FP4)
    x[tiny_i] = torch.randn(len(tiny_i), block, generator=gen) * 1e-6
    # ties: s * midpoint, with the amax element pinning s to a known power of two (FP8 UE8M0,
    # MXFP4) so x / s is exact; the FP32-scale paths see them as ordinary values
    if kind == "fp8":
        s = torch.exp2(torch.randint(-8, 8, (len(tie_i), 1), generator=gen).float())
        mids = E4M3_TIES[E4M3_TIES <= 300]
        vals = mids[torch.randint(0, len(mids), (len(tie_i), block), generator=gen)] * s
        vals[:, 0] = 336 * s[:, 0]  # amax * fp32(1/448) = 0.75 s (1 + tiny): rounds up to s
    else:
        s = torch.exp2(torch.randint(-8, 8, (len(tie_i), 1), generator=gen).float())
        vals = E2M1_TIES[torch.randint(0, 7, (len(tie_i), block), generator=gen)] * s
        vals[:, 0] = 5.5 * s[:, 0]  # amax * fp32(1/6) = 0.917 s: rounds up to s
    sign = torch.where(torch.rand(vals.shape, generator=gen) < 0.5, -1.0, 1.0)
    x[tie_i] = vals * sign
    # +-0 group (the amax floor keeps its scale finite; -0 keeps its sign bit)
    x[zero_i[:1]] = torch.where(torch.arange(block) % 2 == 0, 0.0, -0.0)
    return x.reshape(rows, k).to(dtype)


def _poisoned_fp8(shape) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.uint8).fill_(0x7F).view(torch.float8_e4m3fn)  # NaN


def _check_act(x, block, fmt, device, config=None):
    """Kernel vs reference: codes, scales (poisoned buffers) and the in-place result."""
    k = x.shape[-1]
    yr, sr = act_quant_ref(x, block, fmt)
    out = _poisoned_fp8(x.shape).to(device)
    out_s = torch.full((*x.shape[:-1], k // block), float("nan")).to(device)
    y, s = act_quant(x.to(device), block, fmt, out=out, out_scale=out_s, config=config)
    assert y is out and s is out_s
    assert_bitwise_equal(s.cpu(), sr, f"scales block={block} fmt={fmt}")
    assert_bitwise_equal(y.cpu(), yr, f"codes block={block} fmt={fmt}")
    xi = x.to(device).clone()
    assert act_quant(xi, block, fmt, inplace=True, config=config) is xi
    assert_bitwise_equal(xi.cpu(), act_quant_ref(x.clone(), block, fmt, inplace=True), "inplace")


def _check_fp4(x, fmt, device, config=None):
    block = BLOCK_OF[fmt]
    k = x.shape[-1]
    qr, sr = fp4_quant_ref(x, None, fmt)
    out = torch.full((*x.shape[:-1], k // 2), 0xA5, dtype=torch.uint8).to(device)
    if fmt == "e4m3":
        out_s = _poisoned_fp8((*x.shape[:-1], k // block)).to(device)
    else:
        out_s = torch.full((*x.shape[:-1], k // block), 255, dtype=torch.uint8).to(device)  # E8M0 NaN
    q, s = fp4_quant(x.to(device), None, fmt, out=out, out_scale=out_s, config=config)
    assert q is out and s is out_s
    assert_bitwise_equal(s.cpu(), sr, f"scales fmt={fmt}")
    assert_bitwise_equal(q.cpu(), qr, f"packed codes fmt={fmt}")
    xi = x.to(device).clone()
    assert fp4_quant(xi, None, fmt, inplace=True, config=config) is xi
    assert_bitwise_equal(xi.cpu(), fp4_quant_ref(x.clone(), None, fmt, inplace=True), "inplace")


# ----------------------------------------------------------------------------- act_quant
@pytest.mark.parametrize("block,fmt", ACT_VARIANTS, ids=lambda v: str(v))
def test_act_quant_bit_exact(block, fmt, gen, device):
    # 37 rows (odd), 3 groups a row; 8 groups a program: groups straddle rows, last program partial
    x = _groups(37, 3 * block, block, gen)
    _check_act(x, block, fmt, device, QuantConfig(8, 1))


@pytest.mark.parametrize("block,fmt", ACT_VARIANTS, ids=lambda v: str(v))
def test_act_quant_edges_hit(block, fmt, gen):
    """The data really holds what the tests claim: saturated codes, floored scales, ties."""
    x = _groups(16, 4 * block, block, gen)
    y, s = act_quant_ref(x, block, fmt)
    if fmt is None:
        assert (y.float().abs() == 448).any(), "no group max on +-448"
    else:
        assert (y.float().abs() > 224).any(), "no group max in (224, 448]"
    assert (s == fp8_scales_from_amax(torch.zeros(1), fmt)).any(), "no scale at the amax floor"
    if fmt == "ue8m0":
        v = x.float() / s.repeat_interleave(block, -1)
        assert torch.isin(v.abs(), E4M3_TIES).any(), "no exact E4M3 tie"
    assert ((y.view(torch.uint8) == 0x80)).any(), "-0 lost"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_act_quant_other_input_dtypes(dtype, gen, device):
    x = _groups(9, 256, 128, gen, dtype=torch.float32)
    x = (x.clamp(-6e4, 6e4) if dtype == torch.float16 else x).to(dtype)
    for fmt in (None, "ue8m0"):
        _check_act(x, 128, fmt, device)


@pytest.mark.parametrize("shape", [(1, 128), (2, 3, 256), (5, 1, 32)], ids=["one_group", "3d", "k_is_block"])
def test_act_quant_shapes(shape, gen, device):
    block = 32 if shape[-1] == 32 else 128
    x = _groups(int(torch.tensor(shape[:-1]).prod()), shape[-1], block, gen).reshape(shape)
    _check_act(x, block, "ue8m0", device)
    y, s = act_quant(x.to(device), block)
    assert y.shape == shape and s.shape == (*shape[:-1], shape[-1] // block)


def test_act_quant_strided_rows_and_copies(gen, device):
    """Row-strided views are read in place (and quantized in place); a view whose last dim
    is not contiguous is copied first (and refused in place)."""
    wide = _groups(7, 512, 128, gen).to(device)
    view = wide[:, 128:384]  # row stride 512, offset 128
    y, s = act_quant(view, 128, "ue8m0")
    yr, sr = act_quant_ref(view.cpu(), 128, "ue8m0")
    assert_bitwise_equal(y.cpu(), yr, "codes (strided rows)")
    assert_bitwise_equal(s.cpu(), sr, "scales (strided rows)")
    before = wide.clone()
    act_quant(view, 128, None, inplace=True)
    assert_bitwise_equal(view.cpu(), act_quant_ref(before[:, 128:384].cpu().clone(), 128, None, inplace=True))
    assert torch.equal(wide[:, :128], before[:, :128]) and torch.equal(wide[:, 384:], before[:, 384:]), \
        "in-place wrote outside the view"
    t = _groups(128, 8, 128, gen).to(device).t()  # [8, 128] with unit stride along dim 0
    y, s = act_quant(t, 128)
    assert_bitwise_equal(y.cpu(), act_quant_ref(t.cpu(), 128)[0], "codes (transposed input)")
    with pytest.raises(FormatError, match="contiguous along its last dim"):
        act_quant(t, 128, inplace=True)


def test_act_quant_empty(device):
    y, s = act_quant(torch.empty(0, 256, dtype=torch.bfloat16, device=device))
    assert y.shape == (0, 256) and s.shape == (0, 2)


# ----------------------------------------------------------------------------- fp4_quant
@pytest.mark.parametrize("fmt", FP4_FMTS)
def test_fp4_quant_bit_exact(fmt, gen, device):
    block = BLOCK_OF[fmt]
    x = _groups(37, 3 * block, block, gen, kind="fp4")
    _check_fp4(x, fmt, device, QuantConfig(8, 1))


@pytest.mark.parametrize("fmt", FP4_FMTS)
def test_fp4_quant_edges_hit(fmt, gen):
    block = BLOCK_OF[fmt]
    x = _groups(16, 8 * block, block, gen, kind="fp4")
    q, s = fp4_quant_ref(x, None, fmt)
    codes = torch.stack((q & 0xF, q >> 4), -1).flatten(-2)
    assert ((codes & 7) == 7).any(), "no code saturated at +-6"
    assert (codes == 8).any(), "-0 lost"
    if fmt == "e4m3":
        assert (s.float() == 448).any(), "no E4M3 scale saturated at 448"
        assert (s.float() == 2.0**-9).any(), "no scale at the amax floor"
    else:
        scale = torch.exp2(s.float() - 127).repeat_interleave(block, -1)
        assert torch.isin((x.float() / scale).abs(), E2M1_TIES).any(), "no exact E2M1 tie"


def test_fp4_quant_e4m3_ties(gen, device):
    """Exact E2M1 ties under E4M3 scales: x = s * midpoint with s an E4M3 value."""
    g = 24
    s = _E4M3_POS[torch.randint(40, 100, (g, 1), generator=gen)]  # normal E4M3 scales
    vals = E2M1_TIES[torch.randint(0, 7, (g, 16), generator=gen)] * s
    vals[:, 0] = 6 * s[:, 0]  # amax / 6 = s exactly
    x = (vals * torch.where(torch.rand(g, 16, generator=gen) < 0.5, -1.0, 1.0)).reshape(3, 128).bfloat16()
    _, sr = fp4_quant_ref(x, None, "e4m3")
    assert torch.equal(sr.float().flatten(), s.flatten()), "scales not pinned"
    _check_fp4(x, "e4m3", device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_fp4_quant_other_input_dtypes(dtype, gen, device):
    x = _groups(9, 256, 32, gen, kind="fp4")
    if dtype == torch.float16:
        x = x.float().clamp(-6e4, 6e4)
    x = x.to(dtype)
    for fmt in FP4_FMTS:
        _check_fp4(x, fmt, device)


@pytest.mark.parametrize("fmt", FP4_FMTS)
def test_fp4_quant_shapes_and_layouts(fmt, gen, device):
    block = BLOCK_OF[fmt]
    x3 = _groups(6, block, block, gen, kind="fp4").reshape(2, 3, block)  # 3-D, K = one group
    _check_fp4(x3, fmt, device)
    wide = _groups(5, 8 * block + 2, 2, gen, kind="fp4").to(device)
    for view in (wide[:, 2:2 + 4 * block], wide[:, 1:1 + 4 * block]):  # even / odd element offset
        q, s = fp4_quant(view, None, fmt)
        qr, sr = fp4_quant_ref(view.cpu(), None, fmt)
        assert_bitwise_equal(q.cpu(), qr, "packed (strided view)")
        assert_bitwise_equal(s.cpu(), sr, "scales (strided view)")
    before = wide.clone()
    view = wide[:, 1:1 + 4 * block]  # odd offset: the in-place path reads elements, not pairs
    fp4_quant(view, None, fmt, inplace=True)
    assert_bitwise_equal(view.cpu(), fp4_quant_ref(before[:, 1:1 + 4 * block].cpu().clone(), None, fmt, inplace=True))
    assert torch.equal(wide[:, 0], before[:, 0]) and torch.equal(wide[:, 1 + 4 * block:], before[:, 1 + 4 * block:])


def test_fp4_values_roundtrip_grid(device):
    """Every E2M1 magnitude and sign survives quantize -> in-place dequantize unchanged."""
    # amax 6 -> MXFP4 scale 1 (6 * fp32(1/6) rounds to 1.0), so x / s is the grid value
    v = torch.cat([E2M1_VALUES, E2M1_VALUES.flip(0)]).reshape(1, 32).bfloat16()
    xi = v.to(device).clone()
    fp4_quant(xi, None, "ue8m0", inplace=True)
    assert_bitwise_equal(xi.cpu(), v, "E2M1 grid")


# ----------------------------------------------------------------------------- heuristics
def _mx_codes_lane_model(x_bits: torch.Tensor, inv_bits: torch.Tensor) -> torch.Tensor:
    """The integer steps of `quant._MX_CODES_BF16X2_PTX` for one 16-bit lane (int64 tensors of
    bf16 bit patterns): x times the inverse scale, the two rounding paths, saturation, sign."""
    as_bf16 = lambda b: b.to(torch.int16).view(torch.bfloat16)  # noqa: E731
    sg = x_bits & 0x8000  # the sign from x; |x| (sign cleared) times the positive inverse scale
    v = (as_bf16(x_bits & 0x7FFF).float() * as_bf16(inv_bits).float()).to(torch.bfloat16)  # mul.rn.bf16x2
    a = v.view(torch.int16).to(torch.int64) & 0xFFFF
    assert bool((a < 0x8000).all())
    t = ((as_bf16(a).float() * 2 + 128).to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF) - 0x4204
    assert bool((t >= 0).all()), "a lane would borrow"
    t = torch.clamp(t, max=254)  # rint(2|v|) + 252, at most 2 + 252
    n = ((a + ((a >> 6) & 1) + 0x1F) >> 6) & 0x3FF
    return torch.maximum(n, t).clamp(max=259) - 252 | (sg >> 12)


def test_mx_codes_lane_algorithm_exhaustive():
    """The GPU's bf16 MXFP4 encoder (`quant._MX_CODES_BF16X2_PTX`, inline PTX: it runs only on
    the GPU tier) follows this lane model; the model must equal the reference rounding for every
    finite bf16 x and every scale the kernel can pick for a group holding x (|x| 2**-e <= 6)."""
    from lowbit.formats.fp4 import quantize_e2m1

    bits = torch.arange(0, 1 << 16, dtype=torch.int64)
    x = bits.to(torch.int16).view(torch.bfloat16)
    bits, x = bits[torch.isfinite(x)], x[torch.isfinite(x)]
    # the smallest exponent e with |x| * 2**-e <= 6 (x is the amax of its group at e_min)
    e_min = torch.ceil(torch.log2(torch.clamp(x.float().abs(), min=2.0**-126) / 6)).to(torch.int64)
    for de in (0, 1, 2, 3, 5, 9, 40):
        e = torch.clamp(e_min + de, min=-126, max=126)
        keep = (x.float().abs() * torch.exp2(-e.float())) <= 6
        inv = torch.exp2(-e.float()).to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
        got = _mx_codes_lane_model(bits[keep], inv[keep])
        want = quantize_e2m1(x[keep].float() * torch.exp2(-e[keep].float())).to(torch.int64)
        bad = (got != want).nonzero()
        assert bad.numel() == 0, (f"de={de}: x={x[keep][bad[:5, 0]].tolist()} got {got[bad[:5, 0]].tolist()} "
                                  f"want {want[bad[:5, 0]].tolist()}")


def test_quant_config_table():
    # a big prefill tensor: 16 KB tiles (64 groups of 128 bf16), 8 warps
    c = quant_config("act_quant", 16384 * 56, 128)
    assert (c.groups_per_program, c.num_warps) == (64, 8)
    # one decode row (56 groups): the smallest tile, launch-bound
    c = quant_config("act_quant", 56, 128)
    assert (c.groups_per_program, c.num_warps) == (8, 1) and "launch-bound" in c.reason
    # fp32 input: the same bytes a program, half the elements
    assert quant_config("act_quant", 16384 * 56, 128, 4).groups_per_program == 32
    # every bf16 choice is one of the tiles the compile tier builds
    for groups in (1, 56, 600, 5000, 50000, 10**6):
        for kind, block in (("act_quant", 128), ("act_quant", 32), ("fp4_quant", 32), ("fp4_quant", 16)):
            c = quant_config(kind, groups, block)
            assert c.groups_per_program * block * 2 in quant.TILE_BYTES[kind]
            assert quant.warps_for_tile(kind, c.groups_per_program * block * 2) == c.num_warps
        c = quant_config("fp4_quant", groups, 16, path="fp4_quant_fp32")  # the FP32 element path
        assert (c.groups_per_program * 32 in quant.TILE_BYTES["fp4_quant_fp32"]
                and quant.warps_for_tile("fp4_quant_fp32", c.groups_per_program * 32) == c.num_warps)
    assert quant.fp4_path(torch.bfloat16, "ue8m0", False) == "fp4_quant"
    assert {quant.fp4_path(torch.bfloat16, "e4m3", False), quant.fp4_path(torch.float32, "ue8m0", False),
            quant.fp4_path(torch.bfloat16, "ue8m0", True)} == {"fp4_quant_fp32"}
    with pytest.raises(ValueError, match="not a path of act_quant"):
        quant_config("act_quant", 100, 128, path="fp4_quant")
    assert "groups_per_program" in explain_quant_config("fp4_quant", 4, 7168, 32)


def test_quant_config_env_override(monkeypatch):
    base = quant_config("fp4_quant", 10**6, 32)
    monkeypatch.setenv("LOWBIT_FP4_QUANT_GROUPS_PER_PROGRAM", "16")
    monkeypatch.setenv("LOWBIT_FP4_QUANT_NUM_WARPS", "2")
    c = quant_config("fp4_quant", 10**6, 32)
    assert (c.groups_per_program, c.num_warps) == (16, 2) and "LOWBIT_FP4_QUANT_NUM_WARPS=2" in c.reason
    assert quant_config("act_quant", 10**6, 128).groups_per_program != 16  # per-kernel overrides
    monkeypatch.setenv("LOWBIT_FP4_QUANT_GROUPS_PER_PROGRAM", "12")
    with pytest.raises(ValueError, match="power of two"):
        quant_config("fp4_quant", 10**6, 32)
    monkeypatch.setenv("LOWBIT_FP4_QUANT_GROUPS_PER_PROGRAM", "x")
    with pytest.raises(ValueError, match="not an integer"):
        quant_config("fp4_quant", 10**6, 32)
    monkeypatch.delenv("LOWBIT_FP4_QUANT_GROUPS_PER_PROGRAM")
    monkeypatch.delenv("LOWBIT_FP4_QUANT_NUM_WARPS")
    assert quant_config("fp4_quant", 10**6, 32) == base


# ----------------------------------------------------------------------------- bad input
def test_act_quant_bad_input(device):
    x = torch.randn(4, 256).bfloat16().to(device)
    cases = [
        (dict(x=x.to(torch.int32)), "bfloat16, float16 or float32"),
        (dict(x=x.float().to(torch.float8_e4m3fn)), "bfloat16, float16 or float32"),
        (dict(x=x[:, :200]), "multiple of block_size=128"),
        (dict(x=x, block_size=64), "unsupported block_size 64"),
        (dict(x=x, scale_fmt="e4m3"), "unsupported scale_fmt"),
        (dict(x=x, out=torch.empty(4, 256, dtype=torch.bfloat16, device=device)), "out must be a contiguous"),
        (dict(x=x, out_scale=torch.empty(4, 3, device=device)), "out_scale must be a contiguous"),
        (dict(x=x, inplace=True, out=torch.empty(4, 256, dtype=torch.float8_e4m3fn, device=device)),
         "do not pass out"),
        (dict(x=x, config=QuantConfig(3, 1)), "power of two"),
        (dict(x=x, config=QuantConfig(4, 3)), "num_warps"),
        (dict(x=torch.tensor(1.0)), "scalar"),
        (dict(x=[1.0] * 128), "torch.Tensor"),
    ]
    for kwargs, msg in cases:
        with pytest.raises(FormatError if "config" not in kwargs else ValueError, match=msg):
            act_quant(**kwargs)
    wide = torch.randn(8, 256).bfloat16().to(device)
    bad_view = wide.reshape(2, 4, 256)[:, :3]  # leading dims do not flatten to one stride
    act_quant(bad_view)  # copied: fine
    with pytest.raises(FormatError, match="flatten to one row stride"):
        act_quant(bad_view, inplace=True)


def test_fp4_quant_bad_input(device):
    x = torch.randn(4, 64).bfloat16().to(device)
    cases = [
        (dict(x=x.to(torch.float64)), "bfloat16, float16 or float32"),
        (dict(x=x, scale_fmt="ue4m3"), "unsupported scale_fmt"),
        (dict(x=x, scale_fmt=None), "unsupported scale_fmt"),
        (dict(x=x, block_size=16), "uses blocks of 32"),
        (dict(x=x, scale_fmt="e4m3", block_size=32), "uses blocks of 16"),
        (dict(x=x[:, :48]), "multiple of block_size=32"),
        (dict(x=x, out=torch.empty(4, 64, dtype=torch.uint8, device=device)), "out must be a contiguous"),
        (dict(x=x, out_scale=torch.empty(4, 2, dtype=torch.float8_e4m3fn, device=device)), "out_scale"),
        (dict(x=x, scale_fmt="e4m3", out_scale=torch.empty(4, 4, dtype=torch.uint8, device=device)), "out_scale"),
    ]
    for kwargs, msg in cases:
        with pytest.raises(FormatError, match=msg):
            fp4_quant(**kwargs)
