"""fp4_gemm (`lowbit.kernels.block_scaled.fp4`) against the FP32 reference of seed 004: the
direct Triton kernel (both K steps, the fold's leftover pass), the fold engine (its fold and
fixup on every tier, its Gluon GEMM on sm_90), the decode mma engine (sm_90), the heuristics.

Budget: the reference returns FP32, the kernels round once to BF16 (`helpers.check_bf16_gemm`).
"""

from dataclasses import replace

import pytest
import torch
from helpers import E8M0, FP4X2, check_bf16_gemm, fp4_weight, fp8_acts, run_into_poisoned

from lowbit.formats.fp4 import e2m1_to_float, unpack_fp4
from lowbit.formats.fp8 import e8m0_decode, e8m0_encode, quantize_fp8_groups
from lowbit.kernels.block_scaled import fp4 as fp4_mod
from lowbit.kernels.block_scaled.fp4 import decode_mma_problem, fp4_gemm, fp4_gemm_config
from lowbit.kernels.block_scaled.heuristics import BlockScaledConfig, mma_tile_problem
from lowbit.kernels.block_scaled.portable import fold_fixup, fold_weight
from lowbit.kernels.block_scaled.tiles import DECODE_MMA_TILES, FP4_TRITON_TILES, GLUON_TILES
from lowbit.reference import fp4_gemm_ref
from lowbit.reference.gemm import fp4_fold_ref
from lowbit.runtime.device import num_sms
from lowbit.testing import assert_bitwise_equal, assert_close, interpreter_active

FP4_CASES = {
    "M1_decode_N_off_tile": (1, 200, 288),        # M = 1, N off the tile, K = 2.25 steps of 128
    "M37_K_416": (37, 136, 416),                  # K a multiple of 32 but not of 128
    "M130_prefill": (130, 192, 256),              # 128x64 tiles, a 2-row second M tile
}


@pytest.mark.parametrize("act", [128, 32])
@pytest.mark.parametrize("shape", list(FP4_CASES.values()), ids=list(FP4_CASES))
def test_fp4_gemm_matches_reference(shape, act, gen, device):
    m, n, k = shape
    a, a_s = fp8_acts(m, k, gen, group=act)
    b, b_s = fp4_weight(n, k, gen)
    ref = fp4_gemm_ref(a, a_s, b, b_s, act)
    out = run_into_poisoned(fp4_gemm, a.to(device), a_s.to(device), b.to(device), b_s.to(device), act, m=m, n=n, device=device)
    check_bf16_gemm(out, ref, f"fp4_gemm {shape} act {act}")


@pytest.mark.parametrize("tile", [BlockScaledConfig(*t) for t in FP4_TRITON_TILES],
                         ids=lambda t: f"{t.block_m}x{t.block_n}")
def test_fp4_gemm_every_tile_k_step_and_split_k(tile, gen, device):
    """Each tile x k_step 128 (folded scales) / 32 (per-group promotion) x direct / split-K
    (uneven shares); M, N and K off the tiles."""
    m, n, k = tile.block_m + 3, 72, 288
    a, a_s = fp8_acts(m, k, gen)
    b, b_s = fp4_weight(n, k, gen)
    ref = fp4_gemm_ref(a, a_s, b, b_s, 128)
    args = (a.to(device), a_s.to(device), b.to(device), b_s.to(device))
    for k_step, split in ((128, 1), (128, 2), (32, 1), (32, 4)):
        cfg = replace(tile, k_step=k_step, split_k=split)
        out = run_into_poisoned(fp4_gemm, *args, m=m, n=n, device=device, config=cfg)
        check_bf16_gemm(out, ref, f"fp4_gemm tile {tile.block_m}x{tile.block_n} k_step {k_step} split {split}")


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
        out = run_into_poisoned(fp4_gemm, *args, 128, m=m, n=n, device=device, config=cfg).float().cpu()
        for t in range(4):
            check_bf16_gemm(out[:, t::4], ref[:, t::4], f"row type {t}, config {cfg}")


def test_fp4_gemm_dtypes_and_ue8m0(gen, device):
    """float4_e2m1fn_x2 weights, float8_e8m0fnu / FP32 (powers of two) weight scales, ue8m0
    activation scales given as E8M0 bytes: the same numbers, bit-identical outputs."""
    m, n, k = 3, 128, 256
    a, a_s = fp8_acts(m, k, gen, scale_fmt="ue8m0")
    b, b_s = fp4_weight(n, k, gen)
    ref = fp4_gemm_ref(a, a_s, b, b_s)
    a, b = a.to(device), b.to(device)
    out = fp4_gemm(a, a_s.to(device), b, b_s.to(device))
    check_bf16_gemm(out, ref, "uint8 weight")
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


def test_fp4_gemm_env_override_k_step(monkeypatch):
    monkeypatch.setenv("LOWBIT_FP4_GEMM_K_STEP", "32")
    assert fp4_gemm_config(2, 64, 256).k_step == 32


def test_fp4_gemm_k_step_128_needs_act_block_128(gen, device):
    a, a_s = fp8_acts(2, 256, gen, group=32)
    b, b_s = fp4_weight(64, 256, gen)
    cfg = replace(fp4_gemm_config(2, 64, 256, 32), k_step=128)
    with pytest.raises(ValueError, match="needs act_block_size=128"):
        fp4_gemm(a.to(device), a_s.to(device), b.to(device), b_s.to(device), 32, config=cfg)


def test_fp4_gemm_heuristics_pick_compiled_tiles():
    """Whatever the shape, SM count and engines offered, the heuristic picks a tile the compile
    tier builds: the direct kernel's `FP4_TRITON_TILES`, the fold engine's `GLUON_TILES`, the mma
    engine's `DECODE_MMA_TILES`."""
    mma_tiles = {(cols, 16 * warps, warps, stages) for cols, warps, stages in DECODE_MMA_TILES.values()}
    for m in (1, 2, 16, 17, 32, 33, 64, 65, 128, 4096):
        for n, k in ((2304, 5120), (5120, 2304), (200, 288)):
            for act in (32, 128):
                for gluon, mma, folded in ((False, False, False), (True, True, False), (True, True, True)):
                    c = fp4_gemm_config(m, n, k, act, 132, gluon, mma, folded)
                    tile = (c.block_m, c.block_n, c.num_warps, c.num_stages)
                    if c.engine == "triton":
                        assert (*tile, c.swap_ab) in FP4_TRITON_TILES, c
                    elif c.engine == "fold":
                        assert tile in GLUON_TILES, c
                    else:
                        assert c.engine == "mma" and tile in mma_tiles, c


def test_fp4_gemm_bad_input(gen):
    m, n, k = 2, 64, 256
    a, a_s = fp8_acts(m, k, gen)
    b, b_s = fp4_weight(n, k, gen)
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
    b, b_s = fp4_weight(n, k, gen)
    for r in rows:
        b[r, :32] = 0x22  # codes 2 (1.0) in both nibbles
        b_s[r, 0], b_s[r, 1] = 127 + 20, 127 - 10
    return b, b_s


def _spread_weight(gen, n, k):
    return _spread_problem(gen, m=4, n=n, k=k)[2:]


FOLD_WEIGHTS = {  # (builder(gen) -> (b, b_s), expected leftover flag per 64 weight rows)
    "random_N200_K416": (lambda g: fp4_weight(200, 416, g), [0, 0, 0, 0]),      # N, K off 64 / 128
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
    w8, w8_s, left = (t.cpu() for t in fold_weight(b.to(device), b_s.to(device)))
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
    a, a_s = fp8_acts(37, k, gen)
    ref = fp4_gemm_ref(a, a_s, b, b_s, 128)
    w8, w8_s, left = (t.cpu() for t in fold_weight(b.to(device), b_s.to(device)))
    out = _gemm_on_fold(a, a_s, w8, w8_s)
    flagged = (left != 0).repeat_interleave(64)[:n]
    out[:, flagged] = ref[:, flagged]  # the fixup recomputes these exactly (next test)
    check_bf16_gemm(out.to(torch.bfloat16), ref, f"fold GEMM math {case}")


def test_fp4_fold_gemm_alone_misses_leftovers(gen, device):
    """Without the fixup the folded GEMM is wrong where groups were left out (the spread
    weights make the left-out groups dominate): the fixup is not optional."""
    a, a_s, b, b_s = _spread_problem(gen)
    w8, w8_s, left = (t.cpu() for t in fold_weight(b.to(device), b_s.to(device)))
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
    fold_fixup(*args, torch.zeros(4, dtype=torch.int32, device=device), out)
    assert bool(out.isnan().all()), "the fixup wrote with no flag set"
    flags = torch.tensor([1, 0, 0, 1], dtype=torch.int32, device=device)  # block 3: N 192..199, ragged
    fold_fixup(*args, flags, out)
    out = out.float().cpu()
    written = (flags != 0).cpu().repeat_interleave(64)[:n]
    assert bool(out[:, ~written].isnan().all()), "the fixup wrote an unflagged block"
    for t in range(4):
        cols = written & (torch.arange(n) % 4 == t)
        check_bf16_gemm(out[:, cols], ref[:, cols], f"fixup, row type {t}")


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
    a, a_s = fp8_acts(m, k, gen)
    for b, b_s in (fp4_weight(n, k, gen), _planted_weight(n, k, gen, rows=(n - 1,))):
        yield a, a_s, b, b_s, fp4_gemm_ref(a, a_s, b, b_s, 128)


@pytest.mark.sm90
@pytest.mark.parametrize("tile", GLUON_TILES, ids=lambda t: f"{t[0]}x{t[1]}s{t[3]}")
@pytest.mark.parametrize("shape", list(FOLD_CASES.values()), ids=list(FOLD_CASES))
def test_fp4_gemm_fold_engine_matches_reference(shape, tile, gen):
    """The fold engine (fold + Gluon GEMM + fixup) against the reference, on random weights and
    with one planted left-out group (its 64 columns come from the fixup); and close to the
    direct Triton kernel's output."""
    m, n, k = shape
    for a, a_s, b, b_s, ref in _fold_problems(shape, gen):
        ops = (a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda())
        out = run_into_poisoned(fp4_gemm, *ops, 128, m=m, n=n, device="cuda",
                   config=BlockScaledConfig(*tile, False, engine="fold"))
        check_bf16_gemm(out, ref, f"fold {shape} {tile}")
        direct = fp4_gemm(*ops, 128, config=fp4_gemm_config(m, n, k))
        assert_close(out.float().cpu(), direct.float().cpu(), "bf16_out", "fold vs triton engine")


@pytest.mark.sm90
@pytest.mark.parametrize("split", [2, 3, 7])
@pytest.mark.parametrize("shape", [(300, 320, 1056), (16, 2304, 5120), (64, 300, 2304)],
                         ids=["M300_N320_K1056", "M16_N2304_K5120", "M64_N300_K2304"])
def test_fp4_gemm_fold_engine_split_k_matches_reference(shape, split, gen):
    """The fold engine on the 64x128 Gluon kernel split along K (per-row weight scales, FP32
    shares, then the reduction): the reference's budget on random weights and with a planted
    left-out group."""
    m, n, _ = shape
    cfg = BlockScaledConfig(64, 128, 4, 4, False, split_k=split, engine="fold")
    for a, a_s, b, b_s, ref in _fold_problems(shape, gen):
        ops = (a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda())
        out = run_into_poisoned(fp4_gemm, *ops, 128, m=m, n=n, device="cuda", config=cfg)
        check_bf16_gemm(out, ref, f"fold split {split} {shape}")


@pytest.mark.sm90
@pytest.mark.parametrize("shape", list(FOLD_CASES.values()), ids=list(FOLD_CASES))
def test_fp4_gemm_folded_weight_on_gpu(shape, gen):
    """A weight folded once (`fold_fp4_weight`) through the default dispatch: bit-identical to
    the per-call fold engine (same GEMM), and to the reference within budget; a planted
    left-out group sets needs_fixup and still comes out exact, at decode M too (where a folded
    weight also takes the fold engine, K split, and its fixup)."""
    m, n, k = shape
    for a, a_s, b, b_s, ref in _fold_problems(shape, gen):
        ops = (a.cuda(), a_s.cuda())
        w = fp4_mod.fold_fp4_weight(b.cuda(), b_s.cuda())
        assert w.needs_fixup == bool(w.left.any())
        out = run_into_poisoned(fp4_gemm, *ops, w, m=m, n=n, device="cuda")
        check_bf16_gemm(out, ref, f"folded {shape}")
        per_call = fp4_gemm(*ops, b.cuda(), b_s.cuda())
        assert_bitwise_equal(out.cpu(), per_call.cpu(), "folded vs per-call fold")
    w = fp4_mod.fold_fp4_weight(*(t.cuda() for t in _planted_weight(n, k, gen, rows=(n - 1,))))
    assert w.needs_fixup
    a1, a1_s = fp8_acts(16, k, gen)
    ref = fp4_gemm_ref(a1, a1_s, w.b.cpu(), w.b_s.cpu(), 128)
    check_bf16_gemm(run_into_poisoned(fp4_gemm, a1.cuda(), a1_s.cuda(), w, m=16, n=n, device="cuda"), ref, f"folded decode {shape}")


def test_fold_fp4_weight_contract(gen, device):
    """fold_fp4_weight on every tier: its fold equals `fold_weight`'s, needs_fixup is the
    flags' any(), the object stands for (b, b_s) in fp4_gemm (same output bit for bit, where
    the CPU tier runs the direct kernel on the original weight), and misuse raises."""
    m, n, k = 24, 72, 320
    a, a_s = fp8_acts(m, k, gen)
    b, b_s = fp4_weight(n, k, gen)
    w = fp4_mod.fold_fp4_weight(b.to(device), b_s.to(device))
    w8, w8_s, left = fold_weight(b.to(device), b_s.to(device))
    assert torch.equal(w.w8.view(torch.uint8).cpu(), w8.view(torch.uint8).cpu())
    assert torch.equal(w.w8_s.cpu(), w8_s.cpu()) and torch.equal(w.left.cpu(), left.cpu())
    assert w.needs_fixup == bool(left.any()) and w.shape == (n, k)
    ops = (a.to(device), a_s.to(device))
    # the engine a folded weight gets (the fold engine on a GPU, the direct kernel on the CPU
    # tier), forced on the raw weight: the same GEMM, with the fold done per call
    cfg = fp4_gemm_config(m, n, k, 128, num_sms(ops[0].device), fp4_mod.fold_capable(ops[0]),
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


@pytest.mark.sm90
def test_fp4_gemm_fold_engine_exact_on_spread_scales(gen):
    """The spread weights (every row block flagged): the fixup makes the fold engine exact;
    each row type checked on its own, as for the direct kernel."""
    a, a_s, b, b_s = _spread_problem(gen, m=300, n=200, k=480)
    ref = fp4_gemm_ref(a, a_s, b, b_s, 128)
    out = run_into_poisoned(fp4_gemm, a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda(), 128, m=300, n=200, device="cuda",
               config=FOLD).float().cpu()
    for t in range(4):
        check_bf16_gemm(out[:, t::4], ref[:, t::4], f"fold engine, row type {t}")


@pytest.mark.sm90
def test_fp4_gemm_fold_engine_default_and_tma(gen):
    """On an sm_90 GPU the launcher offers the fold engine (TMA-able a) and the heuristic takes
    it for prefill; an activation base off 16 bytes is refused with the reason."""
    a, _ = fp8_acts(4, 256, gen)
    assert fp4_mod.fold_capable(a.cuda())
    assert fp4_gemm_config(4096, 2304, 5120, gluon=fp4_mod.fold_capable(a.cuda())).engine == "fold"
    m, k = 256, 256
    wide, a_s = fp8_acts(m, k + 32, gen)
    b, b_s = fp4_weight(64, k, gen)
    a_off = wide.cuda()[:, 1:k + 1]  # contiguous along K, base 1 byte off
    assert not fp4_mod.fold_capable(a_off)
    with pytest.raises(ValueError, match="loads a through TMA"):
        fp4_gemm(a_off, a_s[:, :2].cuda(), b.cuda(), b_s.cuda(), config=FOLD)


def test_fp4_gemm_fold_engine_contract(gen):
    """engine='fold': act_block_size 128, k_step 128 and a Gluon tile only; never under the
    interpreter / on the CPU (a clear error naming the engine)."""
    a, a_s = fp8_acts(4, 256, gen)
    a32, a32_s = fp8_acts(4, 256, gen, group=32)
    b, b_s = fp4_weight(128, 256, gen)
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


@pytest.mark.sm90
@pytest.mark.parametrize("shape", list(MMA_CASES.values()), ids=list(MMA_CASES))
def test_fp4_gemm_mma_engine_matches_reference(shape, gen):
    """The decode mma engine (f16 mma.sync on exact values, scales in FP32) against the FP32
    reference: each shape direct and split (even and uneven shares), 2 and 8 warps, 2 and 6
    stages; poisoned outputs, so unwritten columns show."""
    m, n, k = shape
    a, a_s = fp8_acts(m, k, gen)
    b, b_s = fp4_weight(n, k, gen)
    ref = fp4_gemm_ref(a, a_s, b, b_s, 128)
    ops = (a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda())
    assert fp4_mod.mma_capable(*ops, 128)
    for cfg in (_mma(m), _mma(m, split=2), _mma(m, split=k // 128), _mma(m, warps=2, stages=2, split=3),
                _mma(m, warps=8, stages=6)):
        out = run_into_poisoned(fp4_gemm, *ops, 128, m=m, n=n, device="cuda", config=cfg)
        check_bf16_gemm(out, ref, f"mma {shape} {cfg}")


@pytest.mark.sm90
def test_fp4_gemm_mma_engine_exact_on_spread_scales_and_default(gen):
    """Group scales 2**-26 .. 2**40 inside one 128-K step (the spread weights; each row type
    checked on its own): the engine applies each group's scale to that group's exact partial,
    so no level is lost. And on an sm_90 GPU decode shapes default to it."""
    a, a_s, b, b_s = _spread_problem(gen, m=24, n=48, k=512)
    ref = fp4_gemm_ref(a, a_s, b, b_s, 128)
    ops = (a.cuda(), a_s.cuda(), b.cuda(), b_s.cuda())
    for cfg in (_mma(24), _mma(24, split=4)):
        out = run_into_poisoned(fp4_gemm, *ops, 128, m=24, n=48, device="cuda", config=cfg).float().cpu()
        for t in range(4):
            check_bf16_gemm(out[:, t::4], ref[:, t::4], f"mma engine, row type {t}, split {cfg.split_k}")
    cfg = fp4_gemm_config(24, 48, 512, 128, 132, fp4_mod.fold_capable(ops[0]), fp4_mod.mma_capable(*ops, 128))
    assert cfg.engine == "mma", cfg
    default = fp4_gemm(*ops)  # the launcher's own choice: the same engine and tile, bit-identical
    assert_bitwise_equal(default.cpu(), fp4_gemm(*ops, config=cfg).cpu(), "default vs mma config")
    # a row base off 16 bytes: not capable, the default falls back to the Triton kernel (still right)
    wide, wa_s = fp8_acts(24, 512 + 32, gen)
    a_off = wide.cuda()[:, 1:513]
    assert not fp4_mod.mma_capable(a_off, wa_s[:, :4].cuda(), ops[2], ops[3], 128)
    with pytest.raises(ValueError, match="engine='mma' needs a K-contiguous with 16-byte aligned rows"):
        fp4_gemm(a_off, wa_s[:, :4].cuda(), ops[2], ops[3], config=_mma(24))


def test_fp4_gemm_mma_engine_contract(gen):
    """engine='mma': act_block_size 128, K % 128 == 0, a tile it has (clear errors); never on
    the CPU / under the interpreter."""
    a, a_s = fp8_acts(4, 256, gen)
    a32, a32_s = fp8_acts(4, 256, gen, group=32)
    b, b_s = fp4_weight(128, 256, gen)
    assert not fp4_mod.mma_capable(a, a_s, b, b_s, 128)  # CPU tensors
    assert "act_block_size 128" in decode_mma_problem(a32, a32_s, b, b_s, 32)
    a3, a3_s = fp8_acts(4, 288, gen)
    b3, b3_s = fp4_weight(128, 288, gen)
    assert "K % 128" in decode_mma_problem(a3, a3_s, b3, b3_s, 128)
    assert decode_mma_problem(a, a_s, b, b_s, 128) is None
    if interpreter_active() or not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"engine='mma'.*needs a CUDA GPU"):
            fp4_gemm(a, a_s, b, b_s, config=_mma(4))
    bad = (replace(_mma(4), block_m=8), replace(_mma(4), block_n=32), replace(_mma(4), num_stages=9),
           replace(_mma(40), block_m=32))
    for cfg in bad:
        assert mma_tile_problem(cfg, 40 if cfg.block_m == 32 else 4), cfg


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

