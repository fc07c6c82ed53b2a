"""fp8_gemm (`lowbit.kernels.block_scaled.fp8`) against the FP32 reference of seed 004, its
heuristics and its engines (interpreter on CPU, native on GPU; the Gluon engine on sm_90).

Budget: the reference returns FP32, the kernels round once to BF16 (`helpers.check_bf16_gemm`).
"""

from dataclasses import replace

import pytest
import torch
from helpers import E8M0, check_bf16_gemm, fp4_weight, fp8_acts, fp8_weight, run_into_poisoned

from lowbit.formats.fp8 import e8m0_encode
from lowbit.kernels.block_scaled import fp8 as fp8_mod
from lowbit.kernels.block_scaled.fp4 import fp4_gemm, fp4_gemm_config
from lowbit.kernels.block_scaled.fp8 import BlockScaledConfig, fp8_gemm, fp8_gemm_config
from lowbit.kernels.block_scaled.heuristics import gluon_split_k, prefill_gluon_tile
from lowbit.kernels.block_scaled.hopper_fp8 import fp8_gemm_sm90_launch, ws_group_m
from lowbit.kernels.block_scaled.splitk import split_blocks, splitk_destination
from lowbit.kernels.block_scaled.tiles import FP8_TRITON_TILES, GLUON_TILES
from lowbit.reference import fp8_gemm_ref
from lowbit.testing import assert_bitwise_equal, assert_close, interpreter_active

FP8_CASES = {
    "M1_decode_N_off_tile": (1, 200, 384),        # M = 1, N not a multiple of 64 / 128
    "M37_K_ragged": (37, 136, 320),               # M not a tile multiple, K = 2.5 scale blocks
    "M130_prefill_tile": (130, 256, 256),         # 128x128 tiles, a 2-row second M tile
}


@pytest.mark.parametrize("shape", list(FP8_CASES.values()), ids=list(FP8_CASES))
def test_fp8_gemm_matches_reference(shape, gen, device):
    m, n, k = shape
    a, a_s = fp8_acts(m, k, gen)
    b, b_s = fp8_weight(n, k, gen)
    ref = fp8_gemm_ref(a, a_s, b, b_s)
    out = run_into_poisoned(fp8_gemm, a.to(device), a_s.to(device), b.to(device), b_s.to(device), m=m, n=n, device=device)
    check_bf16_gemm(out, ref, f"fp8_gemm {shape}")


@pytest.mark.parametrize("tile", [BlockScaledConfig(*t) for t in FP8_TRITON_TILES],
                         ids=lambda t: f"{t.block_m}x{t.block_n}")
def test_fp8_gemm_every_tile_and_split_k(tile, gen, device):
    """Each tile of the Triton kernel, direct and through the split-K workspace (2 ways over
    3 K blocks: uneven shares); M, N, K off every tile (one full M tile and a ragged one)."""
    m, n, k = tile.block_m + 5, 136, 320
    a, a_s = fp8_acts(m, k, gen)
    b, b_s = fp8_weight(n, k, gen)
    ref = fp8_gemm_ref(a, a_s, b, b_s)
    args = (a.to(device), a_s.to(device), b.to(device), b_s.to(device))
    for split in (1, 2):
        out = run_into_poisoned(fp8_gemm, *args, m=m, n=n, device=device, config=replace(tile, split_k=split))
        check_bf16_gemm(out, ref, f"fp8_gemm tile {tile.block_m}x{tile.block_n} split {split}")


def test_fp8_gemm_ue8m0_scales_fp32_or_e8m0_bytes(gen, device):
    """Power-of-two scales (scale_fmt="ue8m0") as FP32 values or as E8M0 bytes (uint8 and
    float8_e8m0fnu): the same numbers, so bit-identical outputs."""
    m, n, k = 5, 192, 256
    a, a_s = fp8_acts(m, k, gen, scale_fmt="ue8m0")
    b, b_s = fp8_weight(n, k, gen, scale_fmt="ue8m0")
    ref = fp8_gemm_ref(a, a_s, b, b_s)
    a, b = a.to(device), b.to(device)
    out = fp8_gemm(a, a_s.to(device), b, b_s.to(device))
    check_bf16_gemm(out, ref, "ue8m0 fp32")
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


def test_fp8_gemm_heuristics_pick_compiled_tiles():
    """Whatever the shape and SM count, the heuristic picks a tile the compile tier builds: a
    Triton tile of `FP8_TRITON_TILES`, or with gluon a tile of `GLUON_TILES`."""
    for m in (1, 2, 16, 17, 32, 33, 64, 65, 100, 128, 129, 4096, 8192):
        for n, k in ((2304, 5120), (5120, 2304), (200, 288)):
            for sms in (78, 132):
                c = fp8_gemm_config(m, n, k, sms)
                assert (c.engine, (c.block_m, c.block_n, c.num_warps, c.num_stages, c.swap_ab)) \
                    in {("triton", t) for t in FP8_TRITON_TILES}, c
                g = fp8_gemm_config(m, n, k, sms, gluon=True)
                assert g.engine == "gluon" and (g.block_m, g.block_n, g.num_warps, g.num_stages) in GLUON_TILES, g


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
    a, a_s = fp8_acts(m, k, gen)
    b, b_s = fp8_weight(n, k, gen)
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


@pytest.mark.sm90
@pytest.mark.parametrize("tile", GLUON_TILES, ids=lambda t: f"{t[0]}x{t[1]}s{t[3]}")
@pytest.mark.parametrize("shape", list(GLUON_CASES.values()), ids=list(GLUON_CASES))
def test_fp8_gemm_gluon_engine_matches_reference(shape, tile, gen):
    """The Hopper Gluon kernels (`hopper_fp8`): same budget as the Triton kernel, and
    close to the Triton kernel's own output (both promote per 128-K block in FP32)."""
    m, n, k = shape
    a, a_s = fp8_acts(m, k, gen)
    b, b_s = fp8_weight(n, k, gen)
    ref = fp8_gemm_ref(a, a_s, b, b_s)
    ops = (a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda())
    cfg = BlockScaledConfig(*tile, False, engine="gluon")
    out = run_into_poisoned(fp8_gemm, *ops, m=m, n=n, device="cuda", config=cfg)
    check_bf16_gemm(out, ref, f"gluon {shape}")
    assert_close(out.float().cpu(), fp8_gemm(*ops).float().cpu(), "bf16_out", "gluon vs triton engine")


SPLIT_CASES = {
    "M300_N320_K1056": (300, 320, 1056),  # 9 K blocks (K tail): splits of 4 / 2 blocks, the last odd (phantom)
    "M16_N2304_K5120": (16, 2304, 5120),  # decode rows in a 64-row tile, V4-Flash K
    "M64_N300_K2304": (64, 300, 2304),    # N tail, 18 K blocks
}


@pytest.mark.sm90
@pytest.mark.parametrize("split", [2, 3, 7])
@pytest.mark.parametrize("shape", list(SPLIT_CASES.values()), ids=list(SPLIT_CASES))
def test_fp8_gemm_gluon_split_k_matches_reference(shape, split, gen):
    """The 64x128 Gluon kernel split along K (FP32 shares, then the reduction): the reference's
    budget, and close to the unsplit kernel."""
    m, n, k = shape
    a, a_s = fp8_acts(m, k, gen)
    b, b_s = fp8_weight(n, k, gen)
    ops = (a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda())
    cfg = BlockScaledConfig(64, 128, 4, 4, False, split_k=split, engine="gluon")
    out = run_into_poisoned(fp8_gemm, *ops, m=m, n=n, device="cuda", config=cfg)
    check_bf16_gemm(out, fp8_gemm_ref(a, a_s, b, b_s), f"gluon split {split} {shape}")
    whole = fp8_gemm(*ops, config=replace(cfg, split_k=1))
    assert_close(out.float().cpu(), whole.float().cpu(), "bf16_out", "split vs unsplit")


@pytest.mark.sm90
@pytest.mark.parametrize("block_m,warps", [(128, 8), (192, 12)])
def test_fp8_gemm_ws_tile_orders_agree(block_m, warps, gen):
    """The persistent kernel's grouped tile order (`ws_group_m`: only for operands beyond the L2,
    so no small case reaches it by default) writes the same bits as the N-fastest order, groups
    of 8 and of 3 (a partial last group: 33 or 22 row tiles)."""
    m, n, k = 4100, 1000, 304
    a, a_s = (t.cuda() for t in fp8_acts(m, k, gen))
    b, b_s = (t.cuda() for t in fp8_weight(n, k, gen))
    outs = {}
    for g in (1, 8, 3):
        outs[g] = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        fp8_gemm_sm90_launch(a, a_s, b, b_s, outs[g], m, n, k, block_m, 128, warps, 4, group_m=g)
    check_bf16_gemm(outs[1].cpu(), fp8_gemm_ref(a.cpu(), a_s.cpu(), b.cpu(), b_s.cpu()), "ws order 1")
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
    assert splitk_destination(out, 1) == (out, 0, 7)
    ws, s_stride, m_stride = splitk_destination(out, 3)
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
    a, a_s = fp8_acts(4, 256, gen)
    b, b_s = fp8_weight(128, 256, gen)
    with pytest.raises(ValueError, match="gluon engine runs the prefill tiles"):
        fp8_gemm(a, a_s, b, b_s, config=BlockScaledConfig(16, 64, 4, 4, True, engine="gluon"))
    with pytest.raises(ValueError, match="engine must be one of"):
        fp8_gemm(a, a_s, b, b_s, config=BlockScaledConfig(128, 128, 8, 4, False, engine="cuda"))
    if interpreter_active() or not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            fp8_gemm(a, a_s, b, b_s, config=BlockScaledConfig(128, 128, 8, 4, False, engine="gluon"))
    w, w_s = fp4_weight(128, 256, gen)
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
    b, b_s = fp8_weight(64, 256, gen)
    a, a_s = fp8_acts(1, 256, gen)
    assert fp8_gemm(a[:0].to(device), a_s[:0].to(device), b.to(device), b_s.to(device)).shape == (0, 64)


def test_prefill_gluon_tile_rule():
    """`prefill_gluon_tile`: 64x128 while 128x128 tiles would not fill the SMs; else the
    warp-specialized kernel whose rounds x rows are fewer (ties to 128 rows); always a tile of
    GLUON_TILES, and fp8_gemm (gluon) and the fold engine agree."""
    rule = prefill_gluon_tile
    assert rule(128, 2304, 132)[:4] == (64, 128, 4, 4)        # 18 tiles
    assert rule(4096, 2304, 132)[:4] == (192, 128, 12, 4)     # 396 tiles: 3 rounds x 192 < 5 x 128
    assert rule(4096, 5120, 132)[:4] == (128, 128, 8, 4)      # 10 x 128 < 7 x 192
    assert rule(1024, 2304, 132)[:4] == (192, 128, 12, 4)     # 1 x 192 < 2 x 128
    for m, n in ((129, 4096), (2048, 7168), (8192, 8192), (65536, 2048), (300, 17000)):
        tile = rule(m, n, 132)[:4]
        assert tile in GLUON_TILES
        assert fp8_gemm_config(m, n, 1024, 132, gluon=True).block_m == tile[0]
        assert fp4_gemm_config(m, n, 1024, gluon=True, sms=132).block_m == tile[0]


