"""fp8_gemm, fp4_gemm and linear() against the FP32 references of seed 004 (interpreter on CPU,
native on GPU).

Budgets. The references return FP32; the kernels round once to BF16, so every comparison uses
"bf16_out" (4e-3 relative Frobenius: one RNE rounding is at most 2**-8 relative per element).
On the interpreter the kernels' dots are IEEE FP32 with the reference's promotion structure,
so we also check every element against the half-ulp bound of that single rounding plus FP32
summation slack (`_check`); on the GPU the tensor cores' FP8 accumulation is not IEEE FP32
(DeepSeek-V3 report), which is why the elementwise bound is interpreter-only.
"""

from dataclasses import replace

import pytest
import torch

from lowbit.formats import FormatError
from lowbit.formats.fp4 import e2m1_to_float, quantize_mxfp4, unpack_fp4
from lowbit.formats.fp8 import e8m0_decode, e8m0_encode, quantize_fp8_blocks, quantize_fp8_groups
from lowbit.kernels.block_scaled import fp4 as fp4_mod
from lowbit.kernels.block_scaled import fp8 as fp8_mod
from lowbit.kernels.block_scaled.fp4 import fp4_gemm, fp4_gemm_config
from lowbit.kernels.block_scaled.fp8 import BlockScaledConfig, fp8_gemm, fp8_gemm_config, gluon_split_k, split_blocks
from lowbit.kernels.block_scaled.hopper_fp8 import GLUON_TILES, fp8_gemm_sm90_launch, ws_group_m
from lowbit.layers.linear import ACT_QUANT_BACKEND, linear, weight_kind
from lowbit.reference import act_quant_ref, fp4_gemm_ref, fp8_gemm_ref
from lowbit.reference.gemm import fp4_fold_ref
from lowbit.testing import assert_bitwise_equal, assert_close, interpreter_active, poison_

FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)
E8M0 = getattr(torch, "float8_e8m0fnu", None)


def _check(out: torch.Tensor, ref: torch.Tensor, name: str = "output") -> None:
    out = out.detach().float().cpu()
    assert_close(out, ref, "bf16_out", name)
    if interpreter_active():
        slack = 2.0**-8 * ref.abs() + 1e-6 * ref.abs().max()
        bad = (out - ref).abs() > slack
        assert not bad.any(), f"{name}: {int(bad.sum())} elements beyond half a bf16 ulp of the FP32 reference"


def _acts(m, k, gen, group=128, scale_fmt=None):
    """FP8 activations whose groups span several binades (scales differ group to group)."""
    x = torch.randn(m, k, generator=gen) * torch.exp2(torch.randint(-6, 7, (m, 1), generator=gen).float())
    x = x * torch.exp2(torch.randint(-3, 4, (1, k), generator=gen).float())
    return quantize_fp8_groups(x, group_size=group, scale_fmt=scale_fmt)


def _fp8_weight(n, k, gen, scale_fmt=None):
    return quantize_fp8_blocks(torch.randn(n, k, generator=gen) * 0.05, 128, scale_fmt)


def _fp4_weight(n, k, gen):
    w = torch.randn(n, k, generator=gen) * torch.exp2(torch.randint(-4, 3, (n, k // 32), generator=gen).float()
                                                      ).repeat_interleave(32, 1)
    return quantize_mxfp4(w)


def _run(fn, *args, m, n, device, **kw):
    out = poison_(torch.empty(m, n, dtype=torch.bfloat16, device=device))
    res = fn(*args, out=out, **kw)
    assert res is out
    return out


# ------------------------------------------------------------------------------------ fp8_gemm
FP8_CASES = {
    "M1_decode_N_off_tile": (1, 200, 384),        # M = 1, N not a multiple of 64 / 128
    "M37_K_ragged": (37, 136, 320),               # M not a tile multiple, K = 2.5 scale blocks
    "M130_prefill_tile": (130, 256, 256),         # 128x128 tiles, a 2-row second M tile
}


@pytest.mark.parametrize("shape", list(FP8_CASES.values()), ids=list(FP8_CASES))
def test_fp8_gemm_matches_reference(shape, gen, device):
    m, n, k = shape
    a, a_s = _acts(m, k, gen)
    b, b_s = _fp8_weight(n, k, gen)
    ref = fp8_gemm_ref(a, a_s, b, b_s)
    out = _run(fp8_gemm, a.to(device), a_s.to(device), b.to(device), b_s.to(device), m=m, n=n, device=device)
    _check(out, ref, f"fp8_gemm {shape}")


@pytest.mark.parametrize("tile", fp8_mod.production_tiles(), ids=lambda t: f"{t.block_m}x{t.block_n}")
def test_fp8_gemm_every_tile_and_split_k(tile, gen, device):
    """Each tile the heuristics can pick, direct and through the split-K workspace (2 ways over
    3 K blocks: uneven shares); M, N, K off every tile (one full M tile and a ragged one)."""
    m, n, k = tile.block_m + 5, 136, 320
    a, a_s = _acts(m, k, gen)
    b, b_s = _fp8_weight(n, k, gen)
    ref = fp8_gemm_ref(a, a_s, b, b_s)
    args = (a.to(device), a_s.to(device), b.to(device), b_s.to(device))
    for split in (1, 2):
        out = _run(fp8_gemm, *args, m=m, n=n, device=device, config=replace(tile, split_k=split))
        _check(out, ref, f"fp8_gemm tile {tile.block_m}x{tile.block_n} split {split}")


def test_fp8_gemm_ue8m0_scales_fp32_or_e8m0_bytes(gen, device):
    """Power-of-two scales (scale_fmt="ue8m0") as FP32 values or as E8M0 bytes (uint8 and
    float8_e8m0fnu): the same numbers, so bit-identical outputs."""
    m, n, k = 5, 192, 256
    a, a_s = _acts(m, k, gen, scale_fmt="ue8m0")
    b, b_s = _fp8_weight(n, k, gen, scale_fmt="ue8m0")
    ref = fp8_gemm_ref(a, a_s, b, b_s)
    a, b = a.to(device), b.to(device)
    out = fp8_gemm(a, a_s.to(device), b, b_s.to(device))
    _check(out, ref, "ue8m0 fp32")
    as8, bs8 = e8m0_encode(a_s), e8m0_encode(b_s)
    assert_bitwise_equal(fp8_gemm(a, as8.to(device), b, bs8.to(device)).cpu(), out.cpu(), "uint8 E8M0 scales")
    if E8M0 is not None:
        got = fp8_gemm(a, as8.view(E8M0).to(device), b, bs8.view(E8M0).to(device))
        assert_bitwise_equal(got.cpu(), out.cpu(), "float8_e8m0fnu scales")


def test_fp8_gemm_heuristics():
    d = fp8_gemm_config(1, 4096, 7168)
    assert d.swap_ab and d.block_m == 16 and d.block_n == 64 and d.split_k > 1, d
    p = fp8_gemm_config(4096, 4096, 7168)
    assert (p.block_m, p.block_n, p.swap_ab, p.split_k) == (128, 128, False, 1), p
    for m in (1, 17, 64, 65, 129, 8192):
        c = fp8_gemm_config(m, 2304, 5120)
        assert c.reason and 128 % c.block_n == 0 and c.split_k >= 1
        assert c.split_k <= triton_cdiv(5120, 128)


def triton_cdiv(a, b):
    return -(-a // b)


def test_fp8_gemm_env_overrides_are_in_the_memo_key(monkeypatch):
    base = fp8_gemm_config(3, 512, 1024)
    monkeypatch.setenv("LOWBIT_FP8_GEMM_BLOCK_N", "128")
    monkeypatch.setenv("LOWBIT_FP8_GEMM_SPLIT_K", "2")
    o = fp8_gemm_config(3, 512, 1024)
    assert (o.block_n, o.split_k) == (128, 2) and "LOWBIT_FP8_GEMM_BLOCK_N=128" in o.reason
    monkeypatch.delenv("LOWBIT_FP8_GEMM_BLOCK_N")
    monkeypatch.delenv("LOWBIT_FP8_GEMM_SPLIT_K")
    assert fp8_gemm_config(3, 512, 1024) == base
    assert set(fp8_mod.ENV_OVERRIDES) >= {"LOWBIT_FP8_GEMM_BLOCK_M", "LOWBIT_FP8_GEMM_SPLIT_K"}


def test_fp8_gemm_bad_input(gen):
    m, n, k = 4, 64, 256
    a, a_s = _acts(m, k, gen)
    b, b_s = _fp8_weight(n, k, gen)
    with pytest.raises(TypeError, match="a must be torch.float8_e4m3fn"):
        fp8_gemm(a.float().bfloat16(), a_s, b, b_s)
    with pytest.raises(TypeError, match="b must be torch.float8_e4m3fn"):
        fp8_gemm(a, a_s, b.view(torch.uint8), b_s)
    with pytest.raises(ValueError, match="must share K"):
        fp8_gemm(a, a_s, b[:, :128], b_s[:, :1])
    with pytest.raises(ValueError, match=r"a_s must have shape \(4, 2\)"):
        fp8_gemm(a, a_s[:, :1], b, b_s)
    with pytest.raises(ValueError, match=r"b_s must have shape \(1, 2\)"):
        fp8_gemm(a, a_s, b, torch.ones(64, 2))  # per-row instead of 128x128 blocks
    with pytest.raises(TypeError, match="b_s must be float32"):
        fp8_gemm(a, a_s, b, b_s.bfloat16())
    with pytest.raises(ValueError, match="contiguous along K"):
        fp8_gemm(a, a_s, torch.empty(k, n, dtype=torch.float8_e4m3fn).t(), b_s)
    with pytest.raises(ValueError, match="out must be bf16"):
        fp8_gemm(a, a_s, b, b_s, out=torch.empty(m, n + 1, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="block_n must divide 128"):
        fp8_gemm(a, a_s, b, b_s, config=BlockScaledConfig(16, 96, 4, 2, True))
    with pytest.raises(ValueError, match="2-D"):
        fp8_gemm(a[None], a_s, b, b_s)


GLUON_CASES = {
    "M300_N320_K1040": (300, 320, 1040),   # M, N and K tails (TMA zero fill), 9 K blocks > 4 stages
    "M128_N128_K128": (128, 128, 128),     # one block: the prologue and the drain only
    "M1024_N2304_K5120": (1024, 2304, 5120),  # V4-Flash shape, 40 K blocks through the ring
    "M4100_N1000_K304": (4100, 1000, 304),  # 264 128x128 tiles: persistent programs take two or more
    "M300_N300_K1040": (300, 300, 1040),    # out rows of 600 B: not TMA-able, the plain-store epilogue
}


@pytest.mark.gpu
@pytest.mark.parametrize("tile", GLUON_TILES, ids=lambda t: f"{t[0]}x{t[1]}s{t[3]}")
@pytest.mark.parametrize("shape", list(GLUON_CASES.values()), ids=list(GLUON_CASES))
def test_fp8_gemm_gluon_engine_matches_reference(shape, tile, gen):
    """The opt-in Hopper Gluon kernel (fp8_gemm_sm90): same budget as the Triton kernel, and
    close to the Triton kernel's own output (both promote per 128-K block in FP32)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the gluon engine is the sm_90 kernel")
    m, n, k = shape
    a, a_s = _acts(m, k, gen)
    b, b_s = _fp8_weight(n, k, gen)
    ref = fp8_gemm_ref(a, a_s, b, b_s)
    ops = (a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda())
    cfg = BlockScaledConfig(*tile, False, engine="gluon")
    out = _run(fp8_gemm, *ops, m=m, n=n, device="cuda", config=cfg)
    _check(out, ref, f"gluon {shape}")
    assert_close(out.float().cpu(), fp8_gemm(*ops).float().cpu(), "bf16_out", "gluon vs triton engine")


SPLIT_CASES = {
    "M300_N320_K1056": (300, 320, 1056),  # 9 K blocks (K tail): splits of 4 / 2 blocks, the last odd (phantom)
    "M16_N2304_K5120": (16, 2304, 5120),  # decode rows in a 64-row tile, V4-Flash K
    "M64_N300_K2304": (64, 300, 2304),    # N tail, 18 K blocks
}


@pytest.mark.gpu
@pytest.mark.parametrize("split", [2, 3, 7])
@pytest.mark.parametrize("shape", list(SPLIT_CASES.values()), ids=list(SPLIT_CASES))
def test_fp8_gemm_gluon_split_k_matches_reference(shape, split, gen):
    """The 64x128 Gluon kernel split along K (FP32 shares, then the reduction): the reference's
    budget, and close to the unsplit kernel; the fold engine on the same kernel with per-row
    weight scales likewise (fp4 weights, a planted left-out group)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the gluon engine is the sm_90 kernel")
    m, n, k = shape
    a, a_s = _acts(m, k, gen)
    b, b_s = _fp8_weight(n, k, gen)
    ops = (a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda())
    cfg = BlockScaledConfig(64, 128, 4, 4, False, split_k=split, engine="gluon")
    out = _run(fp8_gemm, *ops, m=m, n=n, device="cuda", config=cfg)
    _check(out, fp8_gemm_ref(a, a_s, b, b_s), f"gluon split {split} {shape}")
    whole = fp8_gemm(*ops, config=replace(cfg, split_k=1))
    assert_close(out.float().cpu(), whole.float().cpu(), "bf16_out", "split vs unsplit")
    for a, a_s, b, b_s, ref in _fold_problems(shape, gen):
        ops = (a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda())
        out = _run(fp4_gemm, *ops, 128, m=m, n=n, device="cuda", config=replace(cfg, engine="fold"))
        _check(out, ref, f"fold split {split} {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,warps", [(128, 8), (192, 12)])
def test_fp8_gemm_ws_tile_orders_agree(block_m, warps, gen):
    """The persistent kernel's grouped tile order (`ws_group_m`: only for operands beyond the L2,
    so no small case reaches it by default) writes the same bits as the N-fastest order, groups
    of 8 and of 3 (a partial last group: 33 or 22 row tiles)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the warp-specialized kernel is the sm_90 kernel")
    m, n, k = 4100, 1000, 304
    a, a_s = (t.cuda() for t in _acts(m, k, gen))
    b, b_s = (t.cuda() for t in _fp8_weight(n, k, gen))
    outs = {}
    for g in (1, 8, 3):
        outs[g] = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        fp8_gemm_sm90_launch(a, a_s, b, b_s, outs[g], m, n, k, block_m, 128, warps, 4, group_m=g)
    _check(outs[1].cpu(), fp8_gemm_ref(a.cpu(), a_s.cpu(), b.cpu(), b_s.cpu()), "ws order 1")
    assert torch.equal(outs[1], outs[8]) and torch.equal(outs[1], outs[3])


def test_gluon_split_k_rule():
    """The 64x128 kernel splits K only within one wave of programs and with >= 10 K blocks a
    split (the measured optimum at the V4-Flash shapes), an even number of blocks a split
    (pairs), and no empty split."""
    assert gluon_split_k(4096, 2304, 40, 132)[0] == 1
    assert gluon_split_k(16, 2304, 40, 132)[0] == 4  # 18 tiles: 10 blocks a split
    assert gluon_split_k(64, 2304, 40, 132)[0] == 4
    assert gluon_split_k(128, 2304, 40, 132)[0] == 3  # 36 tiles: 3 splits fit a wave, 14 blocks each
    assert gluon_split_k(16, 5120, 18, 132)[0] == 1  # 18 blocks: not two splits of 10
    assert gluon_split_k(128, 5120, 18, 132)[0] == 1
    assert gluon_split_k(16, 128, 3, 132)[0] == 1  # too little K to split
    for nk in range(1, 60):
        for want in range(1, 20):
            per, split = split_blocks(nk, want)
            assert per % 2 == 0 and (split - 1) * per < nk <= split * per and split <= max(1, want)
            per, split = split_blocks(nk, want, even=False)  # the Triton and mma engines' splits
            assert per == -(-nk // min(want, nk)) and (split - 1) * per < nk <= split * per
    assert split_blocks(10, 4, even=False) == (3, 4) and split_blocks(10, 4) == (4, 3)
    out = torch.empty(5, 7, dtype=torch.bfloat16)
    assert fp8_mod.splitk_destination(out, 1) == (out, 0, 7)
    ws, s_stride, m_stride = fp8_mod.splitk_destination(out, 3)
    assert ws.shape == (3, 5, 7) and ws.dtype == torch.float32 and (s_stride, m_stride) == (35, 7)


def test_ws_group_m_rule():
    """Grouped order only for operands beyond the 60 MB L2 (8192^3: 128 MB); N-fastest at the
    V4-Flash M=4096 shapes (33 and 21 MB), where it measured 1-4% faster."""
    assert ws_group_m(8192 * 8192, 8192 * 8192) == 8
    assert ws_group_m(4096 * 5120, 2304 * 5120) == 1
    assert ws_group_m(4096 * 2304, 5120 * 2304) == 1


def test_fp8_gemm_gluon_engine_contract(gen, monkeypatch):
    """engine='gluon': only its prefill tiles, never under the interpreter / on the CPU, never
    for fp4_gemm; LOWBIT_FP8_GEMM_ENGINE selects it and is part of the memo key."""
    a, a_s = _acts(4, 256, gen)
    b, b_s = _fp8_weight(128, 256, gen)
    with pytest.raises(ValueError, match="gluon engine runs the prefill tiles"):
        fp8_gemm(a, a_s, b, b_s, config=BlockScaledConfig(16, 64, 4, 4, True, engine="gluon"))
    with pytest.raises(ValueError, match="engine must be one of"):
        fp8_gemm(a, a_s, b, b_s, config=BlockScaledConfig(128, 128, 8, 4, False, engine="cuda"))
    if interpreter_active() or not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            fp8_gemm(a, a_s, b, b_s, config=BlockScaledConfig(128, 128, 8, 4, False, engine="gluon"))
    w, w_s = _fp4_weight(128, 256, gen)
    with pytest.raises(ValueError, match="engine must be one of"):
        fp4_gemm(a, a_s, w, w_s, config=BlockScaledConfig(128, 64, 8, 3, False, engine="gluon"))
    monkeypatch.setenv("LOWBIT_FP8_GEMM_ENGINE", "gluon")
    c = fp8_gemm_config(4096, 2304, 5120)
    assert c.engine == "gluon" and "LOWBIT_FP8_GEMM_ENGINE=gluon" in c.reason
    assert (c.block_m, c.block_n, c.num_warps, c.num_stages, c.swap_ab, c.split_k) == (128, 128, 8, 4, False, 1)
    mid = fp8_gemm_config(128, 2304, 5120)  # the Triton 64x128 tile -> the gluon 64x128, its split kept
    assert mid.engine == "gluon" and (mid.block_m, mid.swap_ab) == (64, False) and mid.split_k >= 1
    small = fp8_gemm_config(16, 2304, 5120)  # decode: the 64x128 kernel (TMA zero-fills the rows)
    assert small.engine == "gluon" and (small.block_m, small.swap_ab) == (64, False)
    g = fp8_gemm_config(16, 2304, 5120, sms=132, gluon=True)  # on a GPU: the heuristic's gluon split
    assert g.engine == "gluon" and (g.block_m, g.split_k) == (64, 4), g
    monkeypatch.setenv("LOWBIT_FP8_GEMM_SPLIT_K", "4")
    assert fp8_gemm_config(16, 2304, 5120, sms=132, gluon=True).split_k == 4
    monkeypatch.delenv("LOWBIT_FP8_GEMM_ENGINE")
    assert fp8_gemm_config(4096, 2304, 5120).engine == "triton"


def test_fp8_gemm_empty_dims(gen, device):
    b, b_s = _fp8_weight(64, 256, gen)
    a, a_s = _acts(1, 256, gen)
    assert fp8_gemm(a[:0].to(device), a_s[:0].to(device), b.to(device), b_s.to(device)).shape == (0, 64)


# ------------------------------------------------------------------------------------ fp4_gemm
FP4_CASES = {
    "M1_decode_N_off_tile": (1, 200, 288),        # M = 1, N off the tile, K = 2.25 steps of 128
    "M37_K_416": (37, 136, 416),                  # K a multiple of 32 but not of 128
    "M130_prefill": (130, 192, 256),              # 128x64 tiles, a 2-row second M tile
}


@pytest.mark.parametrize("act", [128, 32])
@pytest.mark.parametrize("shape", list(FP4_CASES.values()), ids=list(FP4_CASES))
def test_fp4_gemm_matches_reference(shape, act, gen, device):
    m, n, k = shape
    a, a_s = _acts(m, k, gen, group=act)
    b, b_s = _fp4_weight(n, k, gen)
    ref = fp4_gemm_ref(a, a_s, b, b_s, act)
    out = _run(fp4_gemm, a.to(device), a_s.to(device), b.to(device), b_s.to(device), act, m=m, n=n, device=device)
    _check(out, ref, f"fp4_gemm {shape} act {act}")


@pytest.mark.parametrize("tile", fp4_mod.production_tiles(), ids=lambda t: f"{t.block_m}x{t.block_n}")
def test_fp4_gemm_every_tile_k_step_and_split_k(tile, gen, device):
    """Each tile x k_step 128 (folded scales) / 32 (per-group promotion) x direct / split-K
    (uneven shares); M, N and K off the tiles."""
    m, n, k = tile.block_m + 3, 72, 288
    a, a_s = _acts(m, k, gen)
    b, b_s = _fp4_weight(n, k, gen)
    ref = fp4_gemm_ref(a, a_s, b, b_s, 128)
    args = (a.to(device), a_s.to(device), b.to(device), b_s.to(device))
    for k_step, split in ((128, 1), (128, 2), (32, 1), (32, 4)):
        cfg = replace(tile, k_step=k_step, split_k=split)
        out = _run(fp4_gemm, *args, m=m, n=n, device=device, config=cfg)
        _check(out, ref, f"fp4_gemm tile {tile.block_m}x{tile.block_n} k_step {k_step} split {split}")


def _spread_problem(gen, m=24, n=48, k=512):
    """Weights whose group scales inside one 128-K step span far more than the 11 binades the
    fold takes at once, built so that the groups left for each level dominate some outputs:
    a group whose codes alternate +1/-1 against activations constant over that group cancels
    exactly, leaving the smaller groups. Row types (n % 4):
      0: g0 cancels (2**20); g1 (2**0), g2 (2**-13), g3 (2**-26)            -> level 1 dominates
      1: g0 (2**20), g1 (2**5) cancel; g2 (2**-10), g3 (2**-22)             -> level 2 dominates
      2: g0, g1, g2 cancel (2**20, 2**7, 2**-6); g3 (2**-19)                -> level 3 dominates
      3: g0 all-zero codes with a huge scale (2**40); g1..g3 ordinary        -> no leftovers
    """
    x = torch.randn(m, k, generator=gen)
    xg = x.view(m, k // 32, 32)
    xg[:, :, :] = torch.where((torch.arange(k // 32) % 4 < 3)[None, :, None], xg[:, :, :1], xg)  # g0..g2 constant
    a, a_s = quantize_fp8_groups(x, group_size=128)
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    alt = torch.tensor([2, 10], dtype=torch.uint8).repeat(16)  # +1, -1, ...: sums to zero
    exps = torch.zeros(n, k // 32, dtype=torch.int32)
    table = {0: (20, 0, -13, -26), 1: (20, 5, -10, -22), 2: (20, 7, -6, -19), 3: (40, 0, -2, 1)}
    cancel = {0: (0,), 1: (0, 1), 2: (0, 1, 2), 3: ()}
    for r in range(n):
        t = r % 4
        for grp in range(k // 32):
            gi = grp % 4
            exps[r, grp] = 127 + table[t][gi]
            seg = slice(grp * 32, grp * 32 + 32)
            if gi in cancel[t]:
                codes[r, seg] = alt
            elif t == 3 and gi == 0:
                codes[r, seg] = 0
    b = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return a, a_s, b, exps.to(torch.uint8)


def test_fp4_gemm_scale_spread_beyond_one_fold(gen, device):
    """The leftover pass (levels 1..3) is exact: each row type is checked on its own, so the
    level that dominates it cannot hide under the Frobenius norm of the others."""
    a, a_s, b, b_s = _spread_problem(gen)
    ref = fp4_gemm_ref(a, a_s, b, b_s, 128)
    m, n = a.shape[0], b.shape[0]
    args = (a.to(device), a_s.to(device), b.to(device), b_s.to(device))
    for cfg in (replace(fp4_gemm_config(m, n, 512), split_k=2), BlockScaledConfig(128, 64, 8, 2, False)):
        out = _run(fp4_gemm, *args, 128, m=m, n=n, device=device, config=cfg).float().cpu()
        for t in range(4):
            _check(out[:, t::4], ref[:, t::4], f"row type {t}, config {cfg}")


def test_fp4_gemm_dtypes_and_ue8m0(gen, device):
    """float4_e2m1fn_x2 weights, float8_e8m0fnu / FP32 (powers of two) weight scales, ue8m0
    activation scales given as E8M0 bytes: the same numbers, bit-identical outputs."""
    m, n, k = 3, 128, 256
    a, a_s = _acts(m, k, gen, scale_fmt="ue8m0")
    b, b_s = _fp4_weight(n, k, gen)
    ref = fp4_gemm_ref(a, a_s, b, b_s)
    a, b = a.to(device), b.to(device)
    out = fp4_gemm(a, a_s.to(device), b, b_s.to(device))
    _check(out, ref, "uint8 weight")
    same = [fp4_gemm(a, e8m0_encode(a_s).to(device), b, b_s.to(device)),
            fp4_gemm(a, a_s.to(device), b, e8m0_decode(b_s).to(device))]
    if FP4X2 is not None:
        same.append(fp4_gemm(a, a_s.to(device), b.view(FP4X2), b_s.to(device)))
    if E8M0 is not None:
        same.append(fp4_gemm(a, a_s.to(device), b, b_s.view(E8M0).to(device)))
    for i, o in enumerate(same):
        assert_bitwise_equal(o.cpu(), out.cpu(), f"variant {i}")


def test_fp4_gemm_heuristics():
    d = fp4_gemm_config(1, 2304, 5120)
    assert d.swap_ab and d.k_step == 128 and d.split_k > 1, d
    assert fp4_gemm_config(1, 2304, 5120, act_block_size=32).k_step == 32
    p = fp4_gemm_config(4096, 5120, 2304)
    assert (p.block_m, p.block_n, p.swap_ab, p.split_k) == (128, 64, False, 1), p
    with pytest.raises(ValueError, match="act_block_size"):
        fp4_gemm_config(1, 64, 64, act_block_size=64)


def test_fp4_gemm_env_override_k_step(monkeypatch, gen, device):
    monkeypatch.setenv("LOWBIT_FP4_GEMM_K_STEP", "32")
    assert fp4_gemm_config(2, 64, 256).k_step == 32
    monkeypatch.setenv("LOWBIT_FP4_GEMM_K_STEP", "128")
    a, a_s = _acts(2, 256, gen, group=32)
    b, b_s = _fp4_weight(64, 256, gen)
    with pytest.raises(ValueError, match="needs act_block_size=128"):
        fp4_gemm(a.to(device), a_s.to(device), b.to(device), b_s.to(device), 32)


def test_fp4_gemm_bad_input(gen):
    m, n, k = 2, 64, 256
    a, a_s = _acts(m, k, gen)
    b, b_s = _fp4_weight(n, k, gen)
    with pytest.raises(TypeError, match="b must be packed FP4"):
        fp4_gemm(a, a_s, b.view(torch.int8), b_s)
    with pytest.raises(ValueError, match=r"must be \[N, K/2\]"):
        fp4_gemm(a, a_s, b[:, :64], b_s)
    with pytest.raises(ValueError, match="multiple of 32"):
        fp4_gemm(a[:, :80], a_s[:, :1], b[:, :40], b_s[:, :2])
    with pytest.raises(ValueError, match=r"b_s must have shape \(64, 8\)"):
        fp4_gemm(a, a_s, b, b_s[:, :4])
    with pytest.raises(ValueError, match="powers of two"):
        fp4_gemm(a, a_s, b, e8m0_decode(b_s) * 1.5)
    with pytest.raises(TypeError, match="b_s must be E8M0"):
        fp4_gemm(a, a_s, b, b_s.to(torch.int32))
    with pytest.raises(ValueError, match=r"a_s must have shape \(2, 8\)"):
        fp4_gemm(a, a_s, b, b_s, 32)  # 1x128 scales given with act_block_size=32
    with pytest.raises(ValueError, match="act_block_size must be 32 or 128"):
        fp4_gemm(a, a_s, b, b_s, 64)
    with pytest.raises(TypeError, match="a must be torch.float8_e4m3fn"):
        fp4_gemm(a.to(torch.bfloat16), a_s, b, b_s)


# ------------------------------------------------------------------------------------ fp4_gemm fold engine
FOLD = BlockScaledConfig(64, 128, 4, 4, False, engine="fold")


def _planted_weight(n, k, gen, rows=(70,)):
    """`_fp4_weight` with, in each of `rows`, groups 0 and 1 (the first 64 K) holding nonzero
    codes 30 binades apart: group 1 is left out of the fold (flag block ``row // 64``)."""
    b, b_s = _fp4_weight(n, k, gen)
    for r in rows:
        b[r, :32] = 0x22  # codes 2 (1.0) in both nibbles
        b_s[r, 0], b_s[r, 1] = 127 + 20, 127 - 10
    return b, b_s


def _spread_weight(gen, n, k):
    return _spread_problem(gen, m=4, n=n, k=k)[2:]


FOLD_WEIGHTS = {  # (builder(gen) -> (b, b_s), expected leftover flag per 64 weight rows)
    "random_N200_K416": (lambda g: _fp4_weight(200, 416, g), [0, 0, 0, 0]),      # N, K off 64 / 128
    "planted_N200_K416": (lambda g: _planted_weight(200, 416, g), [0, 1, 0, 0]),  # one flagged block
    "spread_N136_K416": (lambda g: _spread_weight(g, 136, 416), [1, 1, 1]),       # every level, 1-group tail
}


def _dequant_fp4(b, b_s):
    """e2m1(b) * 2**(b_s - 127), fp32 [N, K]."""
    return e2m1_to_float(unpack_fp4(b)) * e8m0_decode(b_s).repeat_interleave(32, dim=1)


@pytest.mark.parametrize("case", list(FOLD_WEIGHTS))
def test_fp4_fold_kernel_matches_model(case, gen, device):
    """The fold kernel against `fp4_fold_ref`, bit for bit, and the model against the plain
    dequantization: w8 * w8_s is the weight on every group not left out, left-out groups are
    0 in w8 and set their block's flag."""
    build, flags = FOLD_WEIGHTS[case]
    b, b_s = build(gen)
    n, k = b.shape[0], b.shape[1] * 2
    w8, w8_s, left = (t.cpu() for t in fp4_mod._fold_weight(b.to(device), b_s.to(device)))
    assert w8.dtype == torch.float8_e4m3fn and tuple(w8.shape) == (n, k)
    assert w8_s.dtype == torch.float32 and tuple(w8_s.shape) == (n, -(-k // 128))
    assert left.dtype == torch.int32 and tuple(left.shape) == (-(-n // 64),)
    r8, r8_s, rleft = fp4_fold_ref(b, b_s)
    assert_bitwise_equal(w8.float(), r8, "w8")
    assert_bitwise_equal(w8_s, r8_s, "w8_s")
    assert (left != 0).tolist() == rleft.tolist() == [bool(f) for f in flags], (left, rleft, flags)
    deq = _dequant_fp4(b, b_s)
    folded = r8 * r8_s.repeat_interleave(128, dim=1)[:, :k]
    kept = (folded != 0) | (deq == 0)  # left-out groups are the only other zeros
    assert torch.equal(folded[kept], deq[kept])
    lost = ~kept
    assert bool(lost.any()) == any(flags)
    lost_rows = lost.any(dim=1)
    assert all(flags[r // 64] for r in lost_rows.nonzero().flatten().tolist())


def _gemm_on_fold(a, a_s, w8, w8_s):
    """The Gluon GEMM's math in FP32: per 128-K block, (a @ w8^T) * a_s[m] * w8_s[n]."""
    k = a.shape[1]
    a32, w32, as32 = a.float(), w8.float(), a_s.float()
    acc = torch.zeros(a.shape[0], w8.shape[0])
    for kb in range(-(-k // 128)):
        ks = slice(kb * 128, min(kb * 128 + 128, k))
        acc += (a32[:, ks] @ w32[:, ks].T) * as32[:, kb, None] * w8_s[None, :, kb]
    return acc


@pytest.mark.parametrize("case", ["random_N200_K416", "planted_N200_K416"])
def test_fp4_fold_engine_math_matches_reference(case, gen, device):
    """The fold engine's semantics on the CPU: the GEMM on the fold's (w8, w8_s) gives the
    reference on every unflagged block of 64 output columns; flagged blocks are the fixup's."""
    b, b_s = FOLD_WEIGHTS[case][0](gen)
    n, k = b.shape[0], b.shape[1] * 2
    a, a_s = _acts(37, k, gen)
    ref = fp4_gemm_ref(a, a_s, b, b_s, 128)
    w8, w8_s, left = (t.cpu() for t in fp4_mod._fold_weight(b.to(device), b_s.to(device)))
    out = _gemm_on_fold(a, a_s, w8, w8_s)
    flagged = (left != 0).repeat_interleave(64)[:n]
    out[:, flagged] = ref[:, flagged]  # the fixup recomputes these exactly (next test)
    _check(out.to(torch.bfloat16), ref, f"fold GEMM math {case}")


def test_fp4_fold_gemm_alone_misses_leftovers(gen, device):
    """Without the fixup the folded GEMM is wrong where groups were left out (the spread
    weights make the left-out groups dominate): the fixup is not optional."""
    a, a_s, b, b_s = _spread_problem(gen)
    w8, w8_s, left = (t.cpu() for t in fp4_mod._fold_weight(b.to(device), b_s.to(device)))
    assert bool(left.all())
    with pytest.raises(AssertionError):
        assert_close(_gemm_on_fold(a, a_s, w8, w8_s), fp4_gemm_ref(a, a_s, b, b_s, 128), "bf16_out")


def test_fp4_fold_fixup_only_touches_flagged_blocks(gen, device):
    """The fixup launch of the direct kernel: flags all zero -> no write (the NaN poison
    stays); flags set -> those 64-column blocks are the exact reference (the spread weights
    take the leftover pass), the others untouched. Two M tiles, a ragged N block."""
    m, n, k = 130, 200, 416
    a, a_s, b, b_s = _spread_problem(gen, m=m, n=n, k=k)
    ref = fp4_gemm_ref(a, a_s, b, b_s, 128)
    args = (a.to(device), a_s.to(device), b.to(device), b_s.to(device))
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=device)
    fp4_mod._fold_fixup(*args, torch.zeros(4, dtype=torch.int32, device=device), out)
    assert bool(out.isnan().all()), "the fixup wrote with no flag set"
    flags = torch.tensor([1, 0, 0, 1], dtype=torch.int32, device=device)  # block 3: N 192..199, ragged
    fp4_mod._fold_fixup(*args, flags, out)
    out = out.float().cpu()
    written = (flags != 0).cpu().repeat_interleave(64)[:n]
    assert bool(out[:, ~written].isnan().all()), "the fixup wrote an unflagged block"
    for t in range(4):
        cols = written & (torch.arange(n) % 4 == t)
        _check(out[:, cols], ref[:, cols], f"fixup, row type {t}")


FOLD_CASES = {
    "M130_N200_K416": (130, 200, 416),    # two-row last M tile, N off the 128 tile, K 3.25 blocks
    "M300_N136_K288": (300, 136, 288),    # N one row past the tile, K 2.25 blocks
    "M4100_N72_K480": (4100, 72, 480),    # many M tiles, N below one tile, K 3.75 blocks
    "M400_N100_K480": (400, 100, 480),    # out rows of 200 B: the plain-store epilogue
}


def _fold_problems(shape, gen):
    """(a, a_s, b, b_s, ref) for a fold-engine case: random weights, then one planted left-out
    group in the last row (its 64 columns come from the fixup)."""
    m, n, k = shape
    a, a_s = _acts(m, k, gen)
    for b, b_s in (_fp4_weight(n, k, gen), _planted_weight(n, k, gen, rows=(n - 1,))):
        yield a, a_s, b, b_s, fp4_gemm_ref(a, a_s, b, b_s, 128)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", GLUON_TILES, ids=lambda t: f"{t[0]}x{t[1]}s{t[3]}")
@pytest.mark.parametrize("shape", list(FOLD_CASES.values()), ids=list(FOLD_CASES))
def test_fp4_gemm_fold_engine_matches_reference(shape, tile, gen):
    """The fold engine (fold + Gluon GEMM + fixup) against the reference, on random weights and
    with one planted left-out group (its 64 columns come from the fixup); and close to the
    direct Triton kernel's output."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the fold engine's GEMM is the sm_90 Gluon kernel")
    m, n, k = shape
    for a, a_s, b, b_s, ref in _fold_problems(shape, gen):
        ops = (a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda())
        out = _run(fp4_gemm, *ops, 128, m=m, n=n, device="cuda",
                   config=BlockScaledConfig(*tile, False, engine="fold"))
        _check(out, ref, f"fold {shape} {tile}")
        direct = fp4_gemm(*ops, 128, config=fp4_gemm_config(m, n, k))
        assert_close(out.float().cpu(), direct.float().cpu(), "bf16_out", "fold vs triton engine")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(FOLD_CASES.values()), ids=list(FOLD_CASES))
def test_fp4_gemm_folded_weight_on_gpu(shape, gen):
    """A weight folded once (`fold_fp4_weight`) through the default dispatch: bit-identical to
    the per-call fold engine (same GEMM), and to the reference within budget; a planted
    left-out group sets needs_fixup and still comes out exact, at decode M too (where a folded
    weight also takes the fold engine, K split, and its fixup)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the fold engine's GEMM is the sm_90 Gluon kernel")
    m, n, k = shape
    for a, a_s, b, b_s, ref in _fold_problems(shape, gen):
        ops = (a.cuda(), a_s.cuda())
        w = fp4_mod.fold_fp4_weight(b.cuda(), b_s.cuda())
        assert w.needs_fixup == bool(w.left.any())
        out = _run(fp4_gemm, *ops, w, m=m, n=n, device="cuda")
        _check(out, ref, f"folded {shape}")
        per_call = fp4_gemm(*ops, b.cuda(), b_s.cuda())
        assert_bitwise_equal(out.cpu(), per_call.cpu(), "folded vs per-call fold")
    w = fp4_mod.fold_fp4_weight(*(t.cuda() for t in _planted_weight(n, k, gen, rows=(n - 1,))))
    assert w.needs_fixup
    a1, a1_s = _acts(16, k, gen)
    ref = fp4_gemm_ref(a1, a1_s, w.b.cpu(), w.b_s.cpu(), 128)
    _check(_run(fp4_gemm, a1.cuda(), a1_s.cuda(), w, m=16, n=n, device="cuda"), ref, f"folded decode {shape}")


def test_fold_fp4_weight_contract(gen, device):
    """fold_fp4_weight on every tier: its fold equals `_fold_weight`'s, needs_fixup is the
    flags' any(), the object stands for (b, b_s) in fp4_gemm (same output bit for bit, where
    the CPU tier runs the direct kernel on the original weight), and misuse raises."""
    m, n, k = 24, 72, 320
    a, a_s = _acts(m, k, gen)
    b, b_s = _fp4_weight(n, k, gen)
    w = fp4_mod.fold_fp4_weight(b.to(device), b_s.to(device))
    w8, w8_s, left = fp4_mod._fold_weight(b.to(device), b_s.to(device))
    assert torch.equal(w.w8.view(torch.uint8).cpu(), w8.view(torch.uint8).cpu())
    assert torch.equal(w.w8_s.cpu(), w8_s.cpu()) and torch.equal(w.left.cpu(), left.cpu())
    assert w.needs_fixup == bool(left.any()) and w.shape == (n, k)
    ops = (a.to(device), a_s.to(device))
    # the engine a folded weight gets (the fold engine on a GPU, the direct kernel on the CPU
    # tier), forced on the raw weight: the same GEMM, with the fold done per call
    cfg = fp4_gemm_config(m, n, k, 128, fp8_mod.num_sms(ops[0].device), fp4_mod.fold_capable(ops[0]),
                          fp4_mod.mma_capable(*ops, b.to(device), b_s.to(device), 128), folded=True)
    assert_bitwise_equal(fp4_gemm(*ops, w).cpu(), fp4_gemm(*ops, b.to(device), b_s.to(device), config=cfg).cpu(),
                         "folded vs raw weight")
    spread = _spread_problem(gen)
    assert fp4_mod.fold_fp4_weight(spread[2].to(device), spread[3].to(device)).needs_fixup
    with pytest.raises(ValueError, match="carries its scales"):
        fp4_gemm(*ops, w, b_s.to(device))
    with pytest.raises(TypeError, match="b_s is required"):
        fp4_gemm(*ops, b.to(device))
    with pytest.raises(ValueError, match="multiple of 32"):
        fp4_mod.fold_fp4_weight(b[:, :8].contiguous(), b_s[:, :1].contiguous())
    with pytest.raises(ValueError, match=r"b_s must have shape"):
        fp4_mod.fold_fp4_weight(b, b_s[:, :-1])


@pytest.mark.gpu
def test_fp4_gemm_fold_engine_exact_on_spread_scales(gen):
    """The spread weights (every row block flagged): the fixup makes the fold engine exact;
    each row type checked on its own, as for the direct kernel."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the fold engine's GEMM is the sm_90 Gluon kernel")
    a, a_s, b, b_s = _spread_problem(gen, m=300, n=200, k=480)
    ref = fp4_gemm_ref(a, a_s, b, b_s, 128)
    out = _run(fp4_gemm, a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda(), 128, m=300, n=200, device="cuda",
               config=FOLD).float().cpu()
    for t in range(4):
        _check(out[:, t::4], ref[:, t::4], f"fold engine, row type {t}")


@pytest.mark.gpu
def test_fp4_gemm_fold_engine_default_and_tma(gen):
    """On an sm_90 GPU the launcher offers the fold engine (TMA-able a) and the heuristic takes
    it for prefill; an activation base off 16 bytes is refused with the reason."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the fold engine's GEMM is the sm_90 Gluon kernel")
    a, _ = _acts(4, 256, gen)
    assert fp4_mod.fold_capable(a.cuda())
    assert fp4_gemm_config(4096, 2304, 5120, gluon=fp4_mod.fold_capable(a.cuda())).engine == "fold"
    m, k = 256, 256
    wide, a_s = _acts(m, k + 32, gen)
    b, b_s = _fp4_weight(64, k, gen)
    a_off = wide.cuda()[:, 1:k + 1]  # contiguous along K, base 1 byte off
    assert not fp4_mod.fold_capable(a_off)
    with pytest.raises(ValueError, match="loads a through TMA"):
        fp4_gemm(a_off, a_s[:, :2].cuda(), b.cuda(), b_s.cuda(), config=FOLD)


def test_fp4_gemm_fold_engine_contract(gen):
    """engine='fold': act_block_size 128, k_step 128 and a Gluon tile only; never under the
    interpreter / on the CPU (a clear error naming the engine)."""
    a, a_s = _acts(4, 256, gen)
    a32, a32_s = _acts(4, 256, gen, group=32)
    b, b_s = _fp4_weight(128, 256, gen)
    with pytest.raises(ValueError, match="engine='fold' .* needs act_block_size=128"):
        fp4_gemm(a32, a32_s, b, b_s, 32, config=FOLD)
    with pytest.raises(ValueError, match="k_step=128"):
        fp4_gemm(a, a_s, b, b_s, config=replace(FOLD, k_step=32))
    with pytest.raises(ValueError, match="fold engine runs the prefill tiles"):
        fp4_gemm(a, a_s, b, b_s, config=BlockScaledConfig(128, 64, 8, 3, False, engine="fold"))
    if interpreter_active() or not torch.cuda.is_available():
        assert not fp4_mod.fold_capable(a)
        with pytest.raises(ValueError, match=r"engine='fold'.*needs a CUDA GPU"):
            fp4_gemm(a, a_s, b, b_s, config=FOLD)


def test_fp4_gemm_fold_heuristics():
    c = fp4_gemm_config(4096, 2304, 5120, gluon=True)
    assert c.engine == "fold", c
    assert (c.block_m, c.block_n, c.num_warps, c.num_stages, c.swap_ab, c.split_k, c.k_step) == \
        (192, 128, 12, 4, False, 1, 128)  # fp8_gemm's prefill tile for the shape
    assert "H200" in c.reason
    assert "engine=fold" in fp4_mod.explain_fp4_gemm_config(4096, 2304, 5120, gluon=True)
    direct = fp4_gemm_config(4096, 2304, 5120)  # gluon=False: the Triton kernel, as before
    assert direct.engine == "triton" and (direct.block_m, direct.block_n) == (128, 64), direct
    assert fp4_gemm_config(16, 2304, 5120, gluon=True).engine == "triton"    # decode
    assert fp4_gemm_config(64, 2304, 5120, gluon=True).engine == "triton"    # M <= 64: decode
    assert fp4_gemm_config(128, 2304, 5120, gluon=True).engine == "fold"     # H200: 1.1-1.8x at M=128
    assert fp4_gemm_config(4096, 2304, 5120, 32, gluon=True).engine == "triton"  # 1x32 act scales


def test_prefill_gluon_tile_rule():
    """`fp8_gemm.prefill_gluon_tile`: 64x128 while 128x128 tiles would not fill the SMs; else the
    warp-specialized kernel whose rounds x rows are fewer (ties to 128 rows); always a tile of
    GLUON_TILES, and fp8_gemm (gluon) and the fold engine agree."""
    rule = fp8_mod.prefill_gluon_tile
    assert rule(128, 2304, 132)[:4] == (64, 128, 4, 4)        # 18 tiles
    assert rule(4096, 2304, 132)[:4] == (192, 128, 12, 4)     # 396 tiles: 3 rounds x 192 < 5 x 128
    assert rule(4096, 5120, 132)[:4] == (128, 128, 8, 4)      # 10 x 128 < 7 x 192
    assert rule(1024, 2304, 132)[:4] == (192, 128, 12, 4)     # 1 x 192 < 2 x 128
    for m, n in ((129, 4096), (2048, 7168), (8192, 8192), (65536, 2048), (300, 17000)):
        tile = rule(m, n, 132)[:4]
        assert tile in GLUON_TILES
        assert fp8_gemm_config(m, n, 1024, 132, gluon=True).block_m == tile[0]
        assert fp4_gemm_config(m, n, 1024, gluon=True, sms=132).block_m == tile[0]


def test_fp4_gemm_env_override_engine(monkeypatch):
    """LOWBIT_FP4_GEMM_ENGINE is part of the memo key: ``fold`` forces the fold engine where it
    can run (its own tile), ``triton`` the direct kernel with its own tile."""
    assert "LOWBIT_FP4_GEMM_ENGINE" in fp4_mod.ENV_OVERRIDES
    base = fp4_gemm_config(4096, 2304, 5120)
    monkeypatch.setenv("LOWBIT_FP4_GEMM_ENGINE", "fold")
    c = fp4_gemm_config(4096, 2304, 5120)
    assert c.engine == "fold" and "LOWBIT_FP4_GEMM_ENGINE=fold" in c.reason
    assert (c.block_m, c.block_n, c.num_warps, c.num_stages, c.swap_ab, c.split_k) == (192, 128, 12, 4, False, 1)
    small = fp4_gemm_config(16, 2304, 5120)  # decode: the 64x128 Gluon tile, K split
    assert small.engine == "fold" and (small.block_m, small.swap_ab, small.split_k) == (64, False, 4), small
    monkeypatch.setenv("LOWBIT_FP4_GEMM_SPLIT_K", "3")  # an asked-for split survives onto the fold tile
    assert fp4_gemm_config(16, 2304, 5120).split_k == 3
    monkeypatch.delenv("LOWBIT_FP4_GEMM_SPLIT_K")
    act32 = fp4_gemm_config(4096, 2304, 5120, 32)
    assert act32.engine == "triton" and act32.k_step == 32 and "act_block_size 128" in act32.reason
    monkeypatch.setenv("LOWBIT_FP4_GEMM_ENGINE", "triton")
    t = fp4_gemm_config(4096, 2304, 5120, gluon=True)
    assert t.engine == "triton" and (t.block_m, t.block_n, t.num_warps) == (128, 64, 8), t
    monkeypatch.delenv("LOWBIT_FP4_GEMM_ENGINE")
    assert fp4_gemm_config(4096, 2304, 5120) == base


# ------------------------------------------------------------------------------------ fp4_gemm mma engine
MMA_CASES = {
    "M1_N_off_tile": (1, 200, 384),           # one row (15 dead MMA columns), N off the 64-row tile
    "M3_split_uneven": (3, 128, 640),         # 5 K steps: splits of 2 leave a short last share
    "M16_bench_K": (16, 320, 1024),
    "M33_cols64": (33, 72, 640),              # 64 padded columns, N not a multiple of 16
    "M64_full": (64, 136, 512),
}


def _mma(m, warps=4, stages=4, split=1):
    cols = max(16, 1 << (m - 1).bit_length())
    return BlockScaledConfig(cols, 16 * warps, warps, stages, True, split_k=split, engine="mma")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", list(MMA_CASES.values()), ids=list(MMA_CASES))
def test_fp4_gemm_mma_engine_matches_reference(shape, gen):
    """The decode mma engine (f16 mma.sync on exact values, scales in FP32) against the FP32
    reference: each shape direct and split (even and uneven shares), 2 and 8 warps, 2 and 6
    stages; poisoned outputs, so unwritten columns show."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the mma engine is an sm_90 Gluon kernel")
    m, n, k = shape
    a, a_s = _acts(m, k, gen)
    b, b_s = _fp4_weight(n, k, gen)
    ref = fp4_gemm_ref(a, a_s, b, b_s, 128)
    ops = (a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda())
    assert fp4_mod.mma_capable(*ops, 128)
    for cfg in (_mma(m), _mma(m, split=2), _mma(m, split=k // 128), _mma(m, warps=2, stages=2, split=3),
                _mma(m, warps=8, stages=6)):
        out = _run(fp4_gemm, *ops, 128, m=m, n=n, device="cuda", config=cfg)
        _check(out, ref, f"mma {shape} {cfg}")


@pytest.mark.gpu
def test_fp4_gemm_mma_engine_exact_on_spread_scales_and_default(gen):
    """Group scales 2**-26 .. 2**40 inside one 128-K step (the spread weights; each row type
    checked on its own): the engine applies each group's scale to that group's exact partial,
    so no level is lost. And on an sm_90 GPU decode shapes default to it."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the mma engine is an sm_90 Gluon kernel")
    a, a_s, b, b_s = _spread_problem(gen, m=24, n=48, k=512)
    ref = fp4_gemm_ref(a, a_s, b, b_s, 128)
    ops = (a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda())
    for cfg in (_mma(24), _mma(24, split=4)):
        out = _run(fp4_gemm, *ops, 128, m=24, n=48, device="cuda", config=cfg).float().cpu()
        for t in range(4):
            _check(out[:, t::4], ref[:, t::4], f"mma engine, row type {t}, split {cfg.split_k}")
    cfg = fp4_gemm_config(24, 48, 512, 128, 132, fp4_mod.fold_capable(ops[0]), fp4_mod.mma_capable(*ops, 128))
    assert cfg.engine == "mma", cfg
    default = fp4_gemm(*ops)  # the launcher's own choice: the same engine and tile, bit-identical
    assert_bitwise_equal(default.cpu(), fp4_gemm(*ops, config=cfg).cpu(), "default vs mma config")
    # a row base off 16 bytes: not capable, the default falls back to the Triton kernel (still right)
    wide, wa_s = _acts(24, 512 + 32, gen)
    a_off = wide.cuda()[:, 1:513]
    assert not fp4_mod.mma_capable(a_off, wa_s[:, :4].cuda(), ops[2], ops[3], 128)
    with pytest.raises(ValueError, match="engine='mma' needs a K-contiguous with 16-byte aligned rows"):
        fp4_gemm(a_off, wa_s[:, :4].cuda(), ops[2], ops[3], config=_mma(24))


def test_fp4_gemm_mma_engine_contract(gen):
    """engine='mma': act_block_size 128, K % 128 == 0, a tile it has (clear errors); never on
    the CPU / under the interpreter."""
    a, a_s = _acts(4, 256, gen)
    a32, a32_s = _acts(4, 256, gen, group=32)
    b, b_s = _fp4_weight(128, 256, gen)
    assert not fp4_mod.mma_capable(a, a_s, b, b_s, 128)  # CPU tensors
    from lowbit.kernels.block_scaled.hopper_fp4 import decode_mma_problem
    assert "act_block_size 128" in decode_mma_problem(a32, a32_s, b, b_s, 32)
    a3, a3_s = _acts(4, 288, gen)
    b3, b3_s = _fp4_weight(128, 288, gen)
    assert "K % 128" in decode_mma_problem(a3, a3_s, b3, b3_s, 128)
    assert decode_mma_problem(a, a_s, b, b_s, 128) is None
    if interpreter_active() or not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"engine='mma'.*needs a CUDA GPU"):
            fp4_gemm(a, a_s, b, b_s, config=_mma(4))
    bad = (replace(_mma(4), block_m=8), replace(_mma(4), block_n=32), replace(_mma(4), num_stages=9),
           replace(_mma(40), block_m=32))
    for cfg in bad:
        assert fp4_mod._mma_tile_problem(cfg, 40 if cfg.block_m == 32 else 4), cfg


def test_fp4_gemm_mma_heuristics(monkeypatch):
    """mma=True (an sm_90 GPU, operands the engine takes): decode shapes with 1x128 activation
    scales and K % 128 == 0 get the engine, split to ~3.5 programs an SM; the rest as before."""
    c = fp4_gemm_config(16, 2304, 5120, mma=True)
    assert (c.engine, c.block_m, c.block_n, c.num_warps, c.split_k) == ("mma", 16, 64, 4, 10), c
    assert fp4_gemm_config(16, 5120, 2304, mma=True).split_k == 6
    assert fp4_gemm_config(33, 2304, 5120, mma=True).block_m == 64
    assert fp4_gemm_config(16, 2304, 5120, 32, mma=True).engine == "triton"   # 1x32 act scales
    assert fp4_gemm_config(16, 200, 288, mma=True).engine == "triton"         # K % 128 != 0
    assert fp4_gemm_config(128, 2304, 5120, mma=True).engine == "triton"      # prefill
    assert fp4_gemm_config(16, 2304, 5120).engine == "triton"                 # not capable
    assert "engine=mma" in fp4_mod.explain_fp4_gemm_config(16, 2304, 5120, mma=True)
    monkeypatch.setenv("LOWBIT_FP4_GEMM_SPLIT_K", "3")
    assert fp4_gemm_config(16, 2304, 5120, mma=True).split_k == 3
    monkeypatch.setenv("LOWBIT_FP4_GEMM_ENGINE", "mma")
    forced = fp4_gemm_config(16, 2304, 5120)  # not capable: the Triton kernel, the reason said
    assert forced.engine == "triton" and "mma engine needs" in forced.reason
    monkeypatch.setenv("LOWBIT_FP4_GEMM_ENGINE", "triton")
    assert fp4_gemm_config(16, 2304, 5120, mma=True).engine == "triton"


# ------------------------------------------------------------------------------------ linear
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
    w, s = _fp8_weight(n, k, gen)
    y = linear(x.to(device), w.to(device), s.to(device), scale_fmt=scale_fmt)
    assert y.shape == (2, 3, n) and y.dtype == torch.bfloat16
    ref = _ref_linear(x, w, s, 128, scale_fmt, "fp8").view(2, 3, n)
    _check(y, ref, "linear fp8")


@pytest.mark.parametrize("act,scale_fmt", [(128, None), (32, "ue8m0")])
def test_linear_fp4_dispatch(act, scale_fmt, gen, device):
    k, n = 256, 80
    x = torch.randn(5, k, generator=gen).to(torch.bfloat16)
    w, s = _fp4_weight(n, k, gen)
    ref = _ref_linear(x, w, s, act, scale_fmt, "fp4")
    y = linear(x.to(device), w.to(device), s.to(device), act_block_size=act, scale_fmt=scale_fmt)
    assert y.shape == (5, n) and y.dtype == torch.bfloat16
    _check(y, ref, "linear fp4 uint8")
    if FP4X2 is not None:
        y2 = linear(x.to(device), w.view(FP4X2).to(device), s.to(device), act_block_size=act, scale_fmt=scale_fmt)
        assert_bitwise_equal(y2.cpu(), y.cpu(), "float4_e2m1fn_x2 weight")
    folded = fp4_mod.fold_fp4_weight(w.to(device), s.to(device))  # prepared once
    assert weight_kind(folded) == "fp4"
    y3 = linear(x.to(device).view(5, 1, k), folded, act_block_size=act, scale_fmt=scale_fmt)
    assert y3.shape == (5, 1, n)
    # on sm_90 a folded weight takes the fold engine at decode M (the raw one the mma engine):
    # the same budget, not the same bits
    _check(y3.view(5, n), ref, "linear fp4 folded weight")
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
    w8, s8 = _fp8_weight(64, 256, gen)
    w4, s4 = _fp4_weight(64, 256, gen)
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
