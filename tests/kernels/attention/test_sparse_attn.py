"""sparse_attn (seed 004) vs the FP32 reference `sparse_attn_ref` (interpreter on CPU,
native on GPU).

Error budget (relative Frobenius, `BUDGET`): the inputs are bf16 in both kernel and reference,
the scores are exact products summed in FP32 (relative error ~1e-7, invisible after exp), so
two roundings remain: P to bf16 before the P @ V MMA, and the output to bf16. Round-to-nearest
bf16 keeps 8 significant bits: the error of one rounding is uniform in +-ulp/2 with
``ulp = 2^-7 x`` for a mantissa ``x`` in [1, 2), an RMS relative error of
``2^-7 / sqrt(12) * sqrt(E[1/x^2]) = 2^-7 / sqrt(12) / sqrt(2) = 1.6e-3``. The P rounding
enters the output as ``sum_j delta_j p_j v_j / L``: independent errors with zero mean, the
same relative size as the sum they perturb when the v_j are random, so at most another
1.6e-3 in quadrature: ``sqrt(2) * 1.6e-3 = 2.3e-3`` expected (2.0e-3 measured on the shapes
below). Budget 5e-3, about twice that.
"""

import math
from dataclasses import replace

import pytest
import torch

from lowbit.kernels.attention.heuristics import table_config
from lowbit.kernels.attention.portable import compile_configs
from lowbit.kernels.attention.sparse_attn import (
    ENV_OVERRIDES,
    TILE_TABLE,
    SparseAttnConfig,
    explain_sparse_attn_config,
    sparse_attn,
    sparse_attn_config,
)
from lowbit.kernels.attention.tiles import GLUON_TILES
from lowbit.reference import sparse_attn_ref
from lowbit.testing import assert_close, poison_

BUDGET = 5e-3

# a sink far above the scores overflows exp2 to inf on purpose (output exactly 0); numpy says so
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp2:RuntimeWarning")

# both code paths (transposed products or not) at each head tile, with small KV blocks so that
# a short top-k still takes several steps; None = the heuristic's choice
VARIANTS = {
    "ht16_swap": SparseAttnConfig(16, 32, 4, 2, True),
    "ht16_plain": SparseAttnConfig(16, 16, 4, 2, False),
    "ht32_swap": SparseAttnConfig(32, 32, 4, 2, True),
    "ht64_plain": SparseAttnConfig(64, 32, 8, 2, False),
    # the top-k list shared by several programs (FP32 shares + the combine kernel); uneven shares
    "ht32_swap_split3": SparseAttnConfig(32, 16, 4, 2, True, split_kv=3),
    "ht64_plain_split2": SparseAttnConfig(64, 16, 8, 2, False, split_kv=2),
    "heuristic": None,
}


def _problem(b, s, h, d, n, topk, gen, device, p_empty=0.2):
    """Random data (never zeros): indices drawn with replacement (duplicates), a share of
    ``-1`` slots, sinks of either sign."""
    q = torch.randn(b, s, h, d, generator=gen).to(torch.bfloat16)
    kv = torch.randn(b, n, d, generator=gen).to(torch.bfloat16)
    sink = torch.randn(h, generator=gen)
    idx = torch.randint(0, n, (b, s, topk), generator=gen, dtype=torch.int32)
    idx[torch.rand(b, s, topk, generator=gen) < p_empty] = -1
    return q.to(device), kv.to(device), sink.to(device), idx.to(device)


def _run(q, kv, sink, idx, scale=None, config=None):
    out = poison_(torch.empty(q.shape, dtype=torch.bfloat16, device=q.device))
    res = sparse_attn(q, kv, sink, idx, scale, out=out, config=config)
    assert res is out
    return out.cpu()


def _ref(q, kv, sink, idx, scale=None):
    return sparse_attn_ref(q.cpu(), kv.cpu(), sink.cpu(), idx.cpu(), scale)


SHAPES = {
    # b, s, h, d, n, topk
    "h3_s4_topk70": (2, 4, 3, 64, 50, 70),  # heads < 16 (padded), prefill-like s, topk % BK != 0
    "h1_d40": (1, 2, 1, 40, 20, 33),  # one head; d not a power of two (masked columns)
    "h16_topk16": (1, 2, 16, 32, 40, 16),  # exactly one 16-head tile; topk = one small block
    "h40_d128": (1, 2, 40, 128, 64, 45),  # 40 heads: a partial second tile at 16 / 32 heads
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_matches_reference(shape, variant, gen, device):
    b, s, h, d, n, topk = SHAPES[shape]
    q, kv, sink, idx = _problem(b, s, h, d, n, topk, gen, device)
    assert_close(_run(q, kv, sink, idx, config=VARIANTS[variant]).float(), _ref(q, kv, sink, idx), BUDGET)


def test_d512_heads32_heuristic(gen, device):
    """The model's head dim (d = 512) with 32 heads, through the production table row."""
    q, kv, sink, idx = _problem(1, 2, 32, 512, 300, 100, gen, device)
    cfg = sparse_attn_config(1, 2, 32, device)
    assert cfg.heads_per_program in TILE_TABLE and cfg.block_kv == TILE_TABLE[cfg.heads_per_program][0]
    assert_close(_run(q, kv, sink, idx).float(), _ref(q, kv, sink, idx), BUDGET)


@pytest.mark.parametrize("variant", ["ht16_swap", "ht64_plain", "ht32_swap_split3"])
@pytest.mark.parametrize("sink_kind", ["finite", "-inf", "huge"])
def test_all_invalid_rows_are_exact_zeros(variant, sink_kind, gen, device):
    b, s, h, d, n, topk = 2, 3, 5, 32, 30, 40
    q, kv, sink, idx = _problem(b, s, h, d, n, topk, gen, device)
    sink = {"finite": sink, "-inf": torch.full_like(sink, -math.inf), "huge": torch.full_like(sink, 1e4)}[sink_kind]
    idx[0, 1] = -1
    idx[1, 2] = -1
    out = _run(q, kv, sink, idx, config=VARIANTS[variant])
    assert not torch.isnan(out).any()
    assert (out[0, 1] == 0).all() and (out[1, 2] == 0).all()
    ref = _ref(q, kv, sink, idx)
    if sink_kind == "huge":  # exp(sink) swamps every score: the output is 0 everywhere
        assert (out == 0).all() and (ref == 0).all()
    else:
        assert_close(out.float(), ref, BUDGET)


@pytest.mark.parametrize("sink_kind", ["finite", "-inf"])
def test_topk_zero_gives_zeros(sink_kind, gen, device):
    q, kv, sink, _ = _problem(1, 2, 3, 32, 10, 1, gen, device)
    if sink_kind == "-inf":
        sink = torch.full_like(sink, -math.inf)
    idx = torch.empty(1, 2, 0, dtype=torch.int32, device=device)
    out = _run(q, kv, sink, idx)
    assert (out == 0).all()


def test_duplicated_indices_count_twice(gen, device):
    """A row named k times gets k times its weight: heavy duplicates (n = 3 rows, 50 slots)
    match the reference, and one row repeated everywhere equals the closed form."""
    q, kv, sink, idx = _problem(2, 2, 4, 64, 3, 50, gen, device, p_empty=0.1)
    assert_close(_run(q, kv, sink, idx).float(), _ref(q, kv, sink, idx), BUDGET)
    # every slot = row 1, k = 37 copies: out = kv_1 * k e^z / (k e^z + e^sink)
    k = 37
    idx1 = torch.ones(2, 2, k, dtype=torch.int32, device=device)
    out = _run(q, kv, sink, idx1).float()
    z = torch.einsum("bshd,bd->bsh", q.cpu().float(), kv.cpu()[:, 1].float()) / math.sqrt(64)
    w = k * torch.exp(z) / (k * torch.exp(z) + torch.exp(sink.cpu()))
    closed = w[..., None] * kv.cpu()[:, None, None, 1].float()
    assert_close(out, closed, BUDGET, "37 copies of one row")


def test_large_and_minus_inf_like_sinks(gen, device):
    q, kv, sink, idx = _problem(1, 3, 6, 64, 40, 50, gen, device)
    # a large sink shrinks the output (by ~e^-30) but keeps it representable: still relative
    big = torch.full_like(sink, 30.0)
    out = _run(q, kv, big, idx).float()
    ref = _ref(q, kv, big, idx)
    assert ref.abs().max() < 1e-9
    assert_close(out, ref, BUDGET, "sink = 30")
    # -inf and -1e30 sinks both give plain softmax attention
    for val in (-math.inf, -1e30):
        neg = torch.full_like(sink, val)
        assert_close(_run(q, kv, neg, idx).float(), _ref(q, kv, neg, idx), BUDGET, f"sink = {val}")
    # mixed per-head sinks, one head with no sink
    mixed = sink.clone()
    mixed[2] = -math.inf
    mixed[4] = 8.0
    assert_close(_run(q, kv, mixed, idx).float(), _ref(q, kv, mixed, idx), BUDGET, "mixed sinks")


def test_explicit_softmax_scale_sharp(gen, device):
    """A large scale makes the softmax nearly one-hot (tests the running-max rescaling)."""
    q, kv, sink, idx = _problem(1, 2, 5, 64, 60, 90, gen, device)
    for scale in (0.02, 1.0):
        assert_close(_run(q, kv, sink, idx, scale).float(), _ref(q, kv, sink, idx, scale), BUDGET, f"scale={scale}")


def test_out_of_range_indices_are_empty_slots(gen, device):
    """The kernel never reads outside kv: indices >= n or < -1 count as empty (the reference
    rejects them, and so does validate=True)."""
    b, s, h, d, n, topk = 1, 3, 4, 32, 20, 40
    q, kv, sink, idx = _problem(b, s, h, d, n, topk, gen, device)
    bad = idx.clone()
    bad[0, 0, :5] = n
    bad[0, 1, 3] = 10**9
    bad[0, 2, 7] = -7
    bad[0, 2, 8] = -(2**31)
    as_empty = torch.where((bad >= 0) & (bad < n), bad, torch.full_like(bad, -1))
    assert_close(_run(q, kv, sink, bad).float(), _ref(q, kv, sink, as_empty), BUDGET)
    with pytest.raises(ValueError, match=r"\[-1, n=20\)"):
        sparse_attn(q, kv, sink, bad, validate=True)
    nan_sink = sink.clone()
    nan_sink[1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        sparse_attn(q, kv, nan_sink, idx, validate=True)
    sparse_attn(q, kv, sink, idx, validate=True)  # good input passes


def test_strided_views(gen, device):
    """Views with non-packed strides (a head slice of q, an index slice, an out slice) are read
    and written in place; what lies outside the out view stays untouched."""
    b, s, h, d, n, topk = 2, 2, 5, 32, 30, 24
    q_big, kv, sink, idx_big = _problem(b, s, h + 3, d, n, topk + 9, gen, device)
    q, sink = q_big[:, :, 2:2 + h], sink[:h]
    idx = idx_big[:, :, 4:4 + topk]
    out_big = poison_(torch.empty(b, s, h + 2, d, dtype=torch.bfloat16, device=device))
    out = out_big[:, :, 1:1 + h]
    sparse_attn(q, kv, sink, idx, out=out)
    assert_close(out.cpu().float(), _ref(q, kv, sink, idx), BUDGET)
    assert (out_big[:, :, 0].cpu().float() > 1e30).all() and (out_big[:, :, -1].cpu().float() > 1e30).all()


def test_empty_batch_and_queries(gen, device):
    q, kv, sink, idx = _problem(2, 3, 4, 32, 10, 8, gen, device)
    assert sparse_attn(q[:0], kv[:0], sink, idx[:0]).shape == (0, 3, 4, 32)
    assert sparse_attn(q[:, :0], kv, sink, idx[:, :0]).shape == (2, 0, 4, 32)


def test_heuristics(monkeypatch):
    for name in ENV_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    # decode point: 64 queries x 64 heads, top-k 2048: the widest tile (64 programs), the top-k
    # split 2 ways to fill 132 SMs (H200: 91.1 us vs 124-149 for two 32-head tiles unsplit)
    dec = sparse_attn_config(64, 1, 64, topk=2048)
    assert (dec.heads_per_program, dec.split_kv) == (64, 2), dec
    assert sparse_attn_config(64, 1, 64).split_kv == 1  # top-k unknown / short: no split
    assert sparse_attn_config(64, 1, 64, topk=600).split_kv == 1  # shares keep >= 512 slots
    assert sparse_attn_config(64, 1, 128, topk=2048).heads_per_program == 64
    assert sparse_attn_config(1, 4096, 64, topk=2048).split_kv == 1  # prefill fills the GPU
    assert sparse_attn_config(1, 4096, 64).heads_per_program == 64  # prefill: widest tile
    assert sparse_attn_config(1, 4096, 3).heads_per_program == 16  # padded to 16, never wider
    assert sparse_attn_config(1, 4096, 20).heads_per_program == 32
    one = sparse_attn_config(1, 1, 64, topk=2048)
    assert (one.heads_per_program, one.split_kv) == (64, 4) and "split" in one.reason
    for ht, c in ((16, sparse_attn_config(1, 1, 3)), (64, sparse_attn_config(8, 512, 128))):
        assert (c.block_kv, c.num_warps, c.num_stages, c.swap_ab) == TILE_TABLE[ht]
    assert "heads_per_program=64" in explain_sparse_attn_config(64, 1, 64, topk=2048)
    # overrides are part of the memo key; a new head tile brings its table row
    monkeypatch.setenv("LOWBIT_SPARSE_ATTN_HEADS_PER_PROGRAM", "64")
    c = sparse_attn_config(64, 1, 64)
    assert c.heads_per_program == 64 and c.swap_ab == TILE_TABLE[64][3] and "HEADS_PER_PROGRAM=64" in c.reason
    monkeypatch.setenv("LOWBIT_SPARSE_ATTN_SWAP_AB", "1")
    monkeypatch.setenv("LOWBIT_SPARSE_ATTN_BLOCK_KV", "32")
    c = sparse_attn_config(64, 1, 64)
    assert (c.heads_per_program, c.block_kv, c.swap_ab) == (64, 32, True)
    monkeypatch.setenv("LOWBIT_SPARSE_ATTN_BLOCK_KV", "24")
    with pytest.raises(ValueError, match="block_kv"):
        sparse_attn_config(64, 1, 64)
    monkeypatch.setenv("LOWBIT_SPARSE_ATTN_BLOCK_KV", "x")
    with pytest.raises(ValueError, match="LOWBIT_SPARSE_ATTN_BLOCK_KV"):
        sparse_attn_config(64, 1, 64)
    monkeypatch.delenv("LOWBIT_SPARSE_ATTN_BLOCK_KV")
    monkeypatch.setenv("LOWBIT_SPARSE_ATTN_SPLIT_KV", "4")
    assert sparse_attn_config(64, 1, 64).split_kv == 4
    monkeypatch.setenv("LOWBIT_SPARSE_ATTN_SPLIT_KV", "0")
    with pytest.raises(ValueError, match="split_kv"):
        sparse_attn_config(64, 1, 64)
    monkeypatch.delenv("LOWBIT_SPARSE_ATTN_SPLIT_KV")
    monkeypatch.setenv("LOWBIT_SPARSE_ATTN_HEADS_PER_PROGRAM", "8")
    with pytest.raises(ValueError, match="heads_per_program"):
        sparse_attn_config(64, 1, 64)


def test_env_override_reaches_the_launch(monkeypatch, gen, device):
    for name in ENV_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    q, kv, sink, idx = _problem(1, 2, 5, 32, 20, 30, gen, device)
    ref = _ref(q, kv, sink, idx)
    monkeypatch.setenv("LOWBIT_SPARSE_ATTN_HEADS_PER_PROGRAM", "32")
    monkeypatch.setenv("LOWBIT_SPARSE_ATTN_BLOCK_KV", "16")
    monkeypatch.setenv("LOWBIT_SPARSE_ATTN_SWAP_AB", "0")
    assert_close(_run(q, kv, sink, idx).float(), ref, BUDGET)


def test_compile_configs_cover_the_table():
    """Every tile, unsplit and split (the heuristic splits decode's top-k), plus the combine kernel."""
    all_cfgs = compile_configs()
    cfgs = [c for c in all_cfgs if "HT" in c.constexprs]
    assert sorted(c.constexprs["HT"] for c in cfgs if not c.constexprs["SPLIT_OUT"]) == sorted(TILE_TABLE)
    assert sorted(c.constexprs["HT"] for c in cfgs if c.constexprs["SPLIT_OUT"]) == sorted(TILE_TABLE)
    assert [c.name for c in all_cfgs if "HT" not in c.constexprs] == ["sparse_attn_combine[D=512,HC=16]"]
    for c in cfgs:
        assert c.constexprs["D"] == 512 and c.expect_sass == ("HGMMA",)
        bk, warps, stages, swap = TILE_TABLE[c.constexprs["HT"]]
        assert (c.constexprs["BK"], c.num_warps, c.num_stages, c.constexprs["SWAP_AB"]) == (bk, warps, stages, swap)


def test_bad_input(gen, device):
    q, kv, sink, idx = _problem(1, 2, 4, 32, 10, 8, gen, device)
    with pytest.raises(TypeError, match="bf16"):
        sparse_attn(q.float(), kv, sink, idx)
    with pytest.raises(TypeError, match="bf16"):
        sparse_attn(q, kv.half(), sink, idx)
    with pytest.raises(TypeError, match="float32"):
        sparse_attn(q, kv, sink.bfloat16(), idx)
    with pytest.raises(TypeError, match="int32"):
        sparse_attn(q, kv, sink, idx.long())
    with pytest.raises(TypeError, match="torch.Tensor"):
        sparse_attn(q, kv, [0.0] * 4, idx)
    with pytest.raises(ValueError, match=r"\[b, s, h, d\]"):
        sparse_attn(q[0], kv, sink, idx)
    with pytest.raises(ValueError, match="kv must be"):
        sparse_attn(q, torch.cat([kv, kv]), sink, idx)  # batch mismatch
    with pytest.raises(ValueError, match="kv must be"):
        sparse_attn(q, kv[..., :16], sink, idx)  # d mismatch
    with pytest.raises(ValueError, match="attn_sink"):
        sparse_attn(q, kv, sink[:3], idx)
    with pytest.raises(ValueError, match="topk_idxs"):
        sparse_attn(q, kv, sink, idx[:, :1])
    with pytest.raises(ValueError, match="topk_idxs"):
        sparse_attn(q, kv, sink, idx[0])
    with pytest.raises(ValueError, match="d=640"):
        big = torch.randn(1, 1, 1, 640, generator=gen).to(torch.bfloat16).to(device)
        sparse_attn(big, big[:, 0], sink[:1], idx[:, :1])
    with pytest.raises(ValueError, match="contiguous"):
        sparse_attn(q.transpose(2, 3).contiguous().transpose(2, 3), kv, sink, idx)
    with pytest.raises(ValueError, match="contiguous"):
        sparse_attn(q, kv, sink, idx.transpose(1, 2).contiguous().transpose(1, 2))
    with pytest.raises(ValueError, match="out must be"):
        sparse_attn(q, kv, sink, idx, out=torch.empty(1, 2, 4, 16, dtype=torch.bfloat16, device=device))
    with pytest.raises(ValueError, match="out must be"):
        sparse_attn(q, kv, sink, idx, out=torch.empty(q.shape, dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match="softmax_scale"):
        sparse_attn(q, kv, sink, idx, float("nan"))
    with pytest.raises(ValueError, match="heads_per_program"):
        sparse_attn(q, kv, sink, idx, config=SparseAttnConfig(8, 32, 4, 2, True))
    with pytest.raises(ValueError, match="num_warps"):
        sparse_attn(q, kv, sink, idx, config=SparseAttnConfig(16, 32, 2, 2, True))


@pytest.mark.gpu
@pytest.mark.parametrize("h", [16, 32, 64, 128])
def test_production_tiles_d512_on_gpu(h, gen):
    """Every table row at d = 512 with a long top-k (several pipeline stages), natively."""
    q, kv, sink, idx = _problem(4, 1, h, 512, 65536, 2048, gen, "cuda", p_empty=0.05)
    for ht in TILE_TABLE:
        for split in (1, 3):  # 3 shares of 2048 slots: uneven (704, 704, 640 at BK 64)
            cfg = replace(table_config(ht, "test"), split_kv=split)
            assert_close(_run(q, kv, sink, idx, config=cfg).float(), _ref(q, kv, sink, idx), BUDGET,
                         f"HT={ht} split {split}")


@pytest.mark.gpu
def test_cuda_graph_replay(gen):
    """No host readback on the default path: the launch captures into a CUDA graph, and a
    replay with new indices (written in place) gives the new answer."""
    q, kv, sink, idx = _problem(2, 1, 64, 512, 4096, 256, gen, "cuda")
    out = torch.empty(q.shape, dtype=torch.bfloat16, device="cuda")
    sparse_attn(q, kv, sink, idx, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_attn(q, kv, sink, idx, out=out)
    idx.copy_(torch.randint(-1, 4096, idx.shape, generator=gen, dtype=torch.int32).cuda())
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out.cpu().float(), _ref(q, kv, sink, idx), BUDGET)


@pytest.mark.sm90
@pytest.mark.parametrize("h", [16, 64, 100, 128])
@pytest.mark.parametrize("split", [1, 3])
def test_gluon_engine_matches_reference(h, split, gen):
    """The Hopper Gluon kernel (`hopper`, the gather in a producer partition) at d =
    512, every tile of its table: heads padded to 64 (16, 100) or two head tiles (128), a top-k
    that is not a multiple of the block (1000 slots), empty slots, uneven split shares, and a
    query whose slots are all empty (exact zeros)."""
    q, kv, sink, idx = _problem(3, 2, h, 512, 8192, 1000, gen, "cuda", p_empty=0.1)
    idx[1, 0] = -1
    ref = _ref(q, kv, sink, idx)
    for bk, stages in GLUON_TILES:
        cfg = SparseAttnConfig(64, bk, 8, stages, False, split_kv=split, engine="gluon")
        out = _run(q, kv, sink, idx, config=cfg)
        assert_close(out.float(), ref, BUDGET, f"gluon BK={bk} stages={stages} split {split}")
        assert bool((out[1, 0] == 0).all()), "all-empty query must be exact zeros"


@pytest.mark.sm90
def test_gluon_engine_cuda_graph_replay(gen):
    """The Gluon path (split shares folded in the kernel) captures into a CUDA graph and
    replays with new indices, several times (the fold flags re-zero themselves)."""
    q, kv, sink, idx = _problem(2, 1, 64, 512, 4096, 512, gen, "cuda")
    cfg = SparseAttnConfig(64, 64, 8, 2, False, split_kv=2, engine="gluon")
    out = torch.empty(q.shape, dtype=torch.bfloat16, device="cuda")
    sparse_attn(q, kv, sink, idx, out=out, config=cfg)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sparse_attn(q, kv, sink, idx, out=out, config=cfg)
    for _ in range(3):
        idx.copy_(torch.randint(-1, 4096, idx.shape, generator=gen, dtype=torch.int32).cuda())
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out.cpu().float(), _ref(q, kv, sink, idx), BUDGET)


@pytest.mark.sm90
def test_gluon_fold_flags_rezero(gen):
    """The in-kernel fold of split shares leaves its flags at zero after every launch (so the
    next launch's wait counts from zero), over split counts and head tiles; eager calls repeat
    the right answer."""
    import lowbit.kernels.attention.hopper as sm90

    q, kv, sink, idx = _problem(3, 1, 128, 512, 8192, 1500, gen, "cuda", p_empty=0.05)
    ref = _ref(q, kv, sink, idx)
    for split in (2, 3, 4, 2):
        cfg = SparseAttnConfig(64, 64, 8, 2, False, split_kv=split, engine="gluon")
        for _ in range(2):
            out = sparse_attn(q, kv, sink, idx, config=cfg)
            torch.cuda.synchronize()
            assert_close(out.cpu().float(), ref, BUDGET, f"split {split}")
            flags = [f for (dev, _), f in sm90._FLAGS.items() if dev == torch.cuda.current_device()]
            assert flags and all(int(f.abs().sum()) == 0 for f in flags), f"split {split}: fold flags left non-zero"


def test_gluon_engine_contract(monkeypatch, gen, device):
    """engine='gluon': only its own tiles; never on the CPU / under the interpreter; d = 512
    only; LOWBIT_SPARSE_ATTN_ENGINE=gluon switches a heuristic config onto its tile."""
    q, kv, sink, idx = _problem(1, 1, 8, 64, 32, 16, gen, device)
    with pytest.raises(ValueError, match="gluon engine runs 64-head tiles"):
        sparse_attn(q, kv, sink, idx, config=SparseAttnConfig(32, 64, 8, 2, False, engine="gluon"))
    with pytest.raises(ValueError, match="engine must be"):
        sparse_attn(q, kv, sink, idx, config=SparseAttnConfig(64, 64, 8, 2, False, engine="cuda"))
    cfg = SparseAttnConfig(64, 64, 8, 2, False, engine="gluon")
    if torch.device(device).type != "cuda" or torch.cuda.get_device_capability()[0] != 9:
        with pytest.raises(ValueError, match="needs a CUDA GPU|sm_90"):
            sparse_attn(q, kv, sink, idx, config=cfg)
    else:
        with pytest.raises(ValueError, match="needs d = 512"):
            sparse_attn(q, kv, sink, idx, config=cfg)
    monkeypatch.setenv("LOWBIT_SPARSE_ATTN_ENGINE", "gluon")
    c = sparse_attn_config(4, 1, 16, topk=2048)
    assert (c.engine, c.heads_per_program, c.num_warps, c.swap_ab) == ("gluon", 64, 8, False)
    assert "LOWBIT_SPARSE_ATTN_ENGINE=gluon" in c.reason


def test_gluon_default_rule():
    """On an sm_90 GPU (gluon=True) the Gluon engine is the default where the Triton heuristic
    takes 64-head tiles (> 32 heads), with the same split rule; fewer heads keep the Triton tiles."""
    dec = sparse_attn_config(64, 1, 64, topk=2048, gluon=True)
    assert (dec.engine, dec.heads_per_program, dec.block_kv, dec.num_stages, dec.split_kv) == ("gluon", 64, 64, 2, 2)
    assert sparse_attn_config(1, 1024, 128, topk=2048, gluon=True).split_kv == 1
    assert sparse_attn_config(64, 1, 16, topk=2048, gluon=True).engine == "triton"
    assert sparse_attn_config(64, 1, 64, topk=2048).engine == "triton"
