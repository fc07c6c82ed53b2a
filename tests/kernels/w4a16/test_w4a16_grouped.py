"""W4A16 grouped contiguous / masked MoE GEMMs vs the FP32 reference (interpreter on CPU, native on GPU)."""

import pytest
import torch

from lowbit import reference, routing
from lowbit.formats import FormatError, QuantizedTensor, get_format
from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped
from lowbit.kernels.w4a16 import heuristics, tiles
from lowbit.kernels.w4a16.heuristics import avoid_miscompile, tile_config
from lowbit.kernels.w4a16.tiles import GLUON_RS_TILES, GLUON_TILES, GLUON_WS_TILES, VALIDATED_TILES
from lowbit.kernels.w4a16.grouped import (
    contiguous,
    explain_w4a16_grouped_config,
    masked,
    w4a16_grouped_config,
)
from lowbit.testing import assert_close, poison_, random_topk_ids

from helpers import int4_experts

INT4 = get_format("int4_g32")
TILES = sorted(VALIDATED_TILES)


def _weights(g, n, k, gen, mode, device):
    return int4_experts(g, n, k, gen, device, layout=mode)


def _contiguous_problem(t, top_k, g, k, gen, device, hot=None):
    ids = random_topk_ids(t, top_k, g, generator=gen, hot_expert=hot)  # expert g-1 gets no rows
    hidden = torch.randn(t, k, generator=gen).to(torch.bfloat16)
    r = routing.build_contiguous(ids, g, backend="torch")
    a2 = routing.gather_rows(hidden, r.row_to_route, top_k)
    return a2.to(device), r.m_indices.to(device), r


@pytest.mark.parametrize("bm", TILES)
@pytest.mark.parametrize("shape", [(5, 80, 288, 40, 2), (3, 64, 512, 1, 1)],
                         ids=lambda s: "G{}_N{}_K{}_T{}_k{}".format(*s))  # K, N off the tiles; one token
def test_contiguous_matches_reference(shape, bm, gen, device):
    g, n, k, t, top_k = shape
    wq, pw = _weights(g, n, k, gen, "contiguous", device)
    a2, m_idx, r = _contiguous_problem(t, top_k, g, k, gen, device)
    out = poison_(torch.empty(a2.shape[0], n, dtype=torch.bfloat16, device=device))
    contiguous(a2, pw, m_idx, out=out, config=tile_config(bm, "test"))
    ref = reference.w4a16_contiguous_ref(a2.cpu(), wq, m_idx.cpu())
    rows = (m_idx >= 0).cpu()
    assert_close(out.cpu()[rows].float(), ref[rows], "bf16_out", "valid rows")
    assert (out.cpu()[~rows].float() > 1e30).all(), "padding rows must not be written"


def test_contiguous_all_rows_on_one_expert(gen, device):
    g, n, k = 4, 48, 256
    wq, pw = _weights(g, n, k, gen, "contiguous", device)
    a2, m_idx, _ = _contiguous_problem(70, 1, g, k, gen, device, hot=2)
    out = contiguous(a2, pw, m_idx)
    rows = (m_idx >= 0).cpu()
    assert_close(out.cpu()[rows].float(), reference.w4a16_contiguous_ref(a2.cpu(), wq, m_idx.cpu())[rows], "bf16_out")


def _gluon_tiles():
    return ([("gluon", t) for t in GLUON_TILES] + [("gluon_rs", t) for t in GLUON_RS_TILES]
            + [("gluon_ws", t) for t in GLUON_WS_TILES])


def _tile_id(et):
    e, t = et
    return f"{e}-{t[0]}x{t[1]}w{t[2]}s{t[3]}"


@pytest.mark.sm90
@pytest.mark.parametrize("engine_tile", _gluon_tiles(), ids=_tile_id)
@pytest.mark.parametrize("shape", [(5, 80, 288, 40, 2), (3, 200, 1056, 70, 2), (4, 4096, 7168, 96, 2),
                                   (2, 72, 544, 150, 2)],
                         ids=lambda s: "G{}_N{}_K{}_T{}_k{}".format(*s))
def test_contiguous_gluon_engine_matches_reference(shape, engine_tile, gen):
    """The Hopper Gluon kernels (`hopper.grouped`): N off the 64-row weight tile, K off the
    256-wide step (5 steps through a 2- or 3-deep ring), an expert with no rows, padding rows
    not written, ~150 rows an expert (full row blocks and half-row tails, `RegisterATile.half_tail`);
    and close to the Triton kernel's output."""
    from dataclasses import replace

    g, n, k, t, top_k = shape
    wq, pw = _weights(g, n, k, gen, "contiguous", "cuda")
    a2, m_idx, _ = _contiguous_problem(t, top_k, g, k, gen, "cuda")
    engine, (bw, br, warps, stages) = engine_tile
    cfg = replace(tile_config(64, "test"), block_m=br, block_n=bw, num_warps=warps, num_stages=stages, engine=engine)
    out = poison_(torch.empty(a2.shape[0], n, dtype=torch.bfloat16, device="cuda"))
    contiguous(a2, pw, m_idx, out=out, config=cfg)
    rows = (m_idx >= 0).cpu()
    ref = reference.w4a16_contiguous_ref(a2.cpu(), wq, m_idx.cpu())
    assert_close(out.cpu()[rows].float(), ref[rows], "bf16_out", "valid rows")
    assert (out.cpu()[~rows].float() > 1e30).all(), "padding rows must not be written"
    tri = contiguous(a2, pw, m_idx)
    assert_close(out.cpu()[rows].float(), tri.cpu()[rows].float(), "bf16_out", "gluon vs triton engine")


@pytest.mark.sm90
@pytest.mark.parametrize("engine_tile", _gluon_tiles(), ids=_tile_id)
def test_gluon_dequantization_is_exact_across_the_scale_range(engine_tile, gen):
    """Every Gluon tile reads back ``bf16((q - 8) * s)`` exactly: one-hot activations (row k
    of ``a2`` is e_k), so output row k is the dequantized weight column k; every code, and scales
    at both ends of `SCALE_RANGE`, negative, zero and random. The register-A kernels dequantize to
    bf16 subnormals scaled by 2^-64 and rescale the accumulator (`lowbit.kernels.w4a16.int4`): a device that
    flushed subnormals, or a range edge off by one binade, fails here."""
    from dataclasses import replace

    from lowbit.formats.w4a16 import SCALE_RANGE

    n, k = 256, 256
    codes = torch.randint(0, 16, (1, n, k), generator=gen, dtype=torch.uint8)
    codes[0, :, :16] = torch.arange(16, dtype=torch.uint8)  # every code in every row
    lo, hi = SCALE_RANGE
    edge = torch.tensor([lo, -lo, hi * (1 - 2 ** -8), -hi * (1 - 2 ** -8), 0.0, 3.0, -1e-3, 2 ** -40])
    scales = (torch.rand(1, n, k // 32, generator=gen) * 0.02 + 1e-4) * torch.where(
        torch.rand(1, n, k // 32, generator=gen) < 0.5, -1.0, 1.0)
    scales.view(-1)[: edge.numel() * 8] = edge.repeat_interleave(8)
    wq = QuantizedTensor(codes, scales.to(torch.bfloat16), INT4.name)
    pw = pack_w4a16_grouped(wq, mode="contiguous").to("cuda")
    a2 = torch.eye(k, dtype=torch.bfloat16, device="cuda")
    m_idx = torch.zeros(k, dtype=torch.int32, device="cuda")
    engine, (bw, br, warps, stages) = engine_tile
    cfg = replace(tile_config(64, "test"), block_m=br, block_n=bw, num_warps=warps, num_stages=stages, engine=engine)
    out = contiguous(a2, pw, m_idx, out=poison_(torch.empty(k, n, dtype=torch.bfloat16, device="cuda")), config=cfg)
    want = ((codes[0].float() - 8) * wq.scales[0].float().repeat_interleave(32, dim=1)).to(torch.bfloat16)
    got = out.cpu().t()
    bad = (got.float() != want.float()).nonzero()  # as values: a GEMM's sum of zeros is +0, not -0
    assert bad.numel() == 0, f"{bad.shape[0]} weights differ, first at (n, k) = {bad[0].tolist()}: " \
                             f"{got[tuple(bad[0])].item()} != {want[tuple(bad[0])].item()}"


@pytest.mark.sm90
@pytest.mark.parametrize("engine_tile", _gluon_tiles(), ids=_tile_id)
@pytest.mark.parametrize("flat", [False, True], ids=["3d", "flat"])
def test_masked_gluon_engine_matches_reference(flat, engine_tile, gen):
    """Masked layout through the Gluon kernel: max_m = 80 is not a multiple of the row tile
    (a tile crosses into the next expert's slab, whose rows must not be written), counts 0,
    max_m, a few rows, 45 and a count above max_m (clamped); K off the 256-wide step."""
    from dataclasses import replace

    g, n, k, max_m = 5, 136, 544, 80
    wq, pw = _weights(g, n, k, gen, "masked", "cuda")
    # 45 rows: a 64-row block's three-quarter tail (`RegisterATile.ws_tails`); 7 and 80 - 64: half tails
    a3, mm = _masked_problem(g, max_m, k, [0, max_m, 7, 45, max_m + 9], gen, "cuda")
    engine, (bw, br, warps, stages) = engine_tile
    cfg = replace(tile_config(64, "test"), block_m=br, block_n=bw, num_warps=warps, num_stages=stages, engine=engine)
    out = poison_(torch.empty(g * max_m, n, dtype=torch.bfloat16, device="cuda"))
    masked(a3.view(g * max_m, k) if flat else a3, pw, mm, 32, out=out, config=cfg)
    ref = reference.w4a16_masked_ref(a3.cpu(), wq, mm.cpu())
    valid = (torch.arange(max_m)[None, :] < mm.cpu().clamp(max=max_m)[:, None]).reshape(-1)
    assert_close(out.cpu()[valid].float(), ref.reshape(g * max_m, n)[valid], "bf16_out", "valid rows")
    assert (out.cpu()[~valid].float() > 1e30).all(), "rows past masked_m must not be written"


@pytest.mark.sm90
@pytest.mark.parametrize("tile,ws", [((256, 48, 16, 3), False), ((256, 80, 16, 2), False), ((256, 96, 16, 2), False),
                                     ((256, 48, 16, 3), True), ((256, 96, 16, 2), True)],
                         ids=lambda v: f"{v[1]}rows" if isinstance(v, tuple) else ("ws" if v else "rs"))
def test_masked_split_tiles_match_reference(tile, ws, gen):
    """The masked tiles whose rows are not a power of two
    (`hopper.grouped.w4a16_grouped_split_launch`, two accumulators of BR_HI + BR_LO rows; `ws`: the
    warp-specialized form, `GLUON_SPLIT_WS_TILES`): max_m = 200
    is not a multiple of the tile (a tile crosses into the next slab), counts 0, max_m, a few rows,
    one row past a tile and one above max_m (blocks on both accumulators, and blocks whose rows end
    in the first part, run alone: `SplitTile.hi_tail`); K off the 256-wide step; N off the weight
    tile."""
    from lowbit.kernels.w4a16.hopper.grouped import w4a16_grouped_split_launch

    g, n, k, max_m = 5, 264, 800, 200
    wq, pw = _weights(g, n, k, gen, "masked", "cuda")
    a3, mm = _masked_problem(g, max_m, k, [0, max_m, 7, tile[1] + 1, max_m + 9], gen, "cuda")
    out = poison_(torch.empty(g * max_m, n, dtype=torch.bfloat16, device="cuda"))
    w4a16_grouped_split_launch(a3.view(g * max_m, k), pw, mm, out, tile, max_m, warp_specialize=ws)
    ref = reference.w4a16_masked_ref(a3.cpu(), wq, mm.cpu())
    valid = (torch.arange(max_m)[None, :] < mm.cpu().clamp(max=max_m)[:, None]).reshape(-1)
    assert_close(out.cpu()[valid].float(), ref.reshape(g * max_m, n)[valid], "bf16_out", f"{tile[1]}-row tile")
    assert (out.cpu()[~valid].float() > 1e30).all(), "rows past masked_m must not be written"


def test_gluon_engine_contract(gen, monkeypatch):
    """engine='gluon': never under the interpreter / on the CPU; the
    LOWBIT_W4A16_GROUPED_ENGINE switch maps each mode to a Gluon tile (128 rows contiguous,
    the heuristic's 64 rows masked)."""
    from dataclasses import replace

    wq, pw = _weights(2, 64, 256, gen, "contiguous", "cpu")
    a2, m_idx, _ = _contiguous_problem(3, 1, 2, 256, gen, "cpu")
    cfg = replace(tile_config(64, "t"), block_n=64, block_m=128, num_warps=4, num_stages=2, engine="gluon")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            contiguous(a2, pw, m_idx, config=cfg)
    with pytest.raises(ValueError, match="engine must be"):
        contiguous(a2, pw, m_idx, config=replace(cfg, engine="cuda"))
    _, pm = _weights(2, 64, 256, gen, "masked", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            masked(torch.zeros(2, 16, 256, dtype=torch.bfloat16), pm, torch.tensor([3, 0], dtype=torch.int32), 4,
                   config=replace(cfg, block_m=64, num_stages=3))
    with pytest.raises(ValueError, match="engine must be"):
        masked(torch.zeros(2, 16, 256, dtype=torch.bfloat16), pm, torch.tensor([3, 0], dtype=torch.int32), 4,
               config=replace(cfg, engine="cuda"))
    monkeypatch.setenv("LOWBIT_W4A16_GROUPED_ENGINE", "gluon")
    c = w4a16_grouped_config("contiguous", 6144, 4096, 7168, 48)
    assert (c.engine, c.block_n, c.block_m, c.num_warps, c.swap_ab) == ("gluon", 64, 128, 4, True), c
    assert "LOWBIT_W4A16_GROUPED_ENGINE=gluon" in c.reason
    mk = w4a16_grouped_config("masked", 48 * 256, 4096, 7168, 48, expected_m=32)
    assert (mk.engine, mk.block_n, mk.block_m, mk.num_stages) == ("gluon", 64, 64, 3), mk
    monkeypatch.setenv("LOWBIT_W4A16_GROUPED_ENGINE", "gluon_rs")  # register-A kernel: its own tiles
    c = w4a16_grouped_config("contiguous", 6144, 4096, 7168, 48)
    assert (c.engine, c.block_n, c.block_m, c.num_warps, c.num_stages) == ("gluon_rs", 256, 128, 16, 2), c
    monkeypatch.setenv("LOWBIT_W4A16_GROUPED_BLOCK_N", "64")
    c = w4a16_grouped_config("contiguous", 6144, 4096, 7168, 48)
    assert (c.block_n, c.block_m, c.num_warps) == (64, 128, 4), c
    monkeypatch.setenv("LOWBIT_W4A16_GROUPED_ENGINE", "gluon_ws")  # only two-warpgroup tiles: BLOCK_N 64 has none
    c = w4a16_grouped_config("contiguous", 6144, 4096, 7168, 48)
    assert (c.engine, c.block_n, c.block_m, c.num_warps) == ("gluon_ws", 128, 128, 8), c
    mk = w4a16_grouped_config("masked", 48 * 256, 4096, 7168, 48, expected_m=8)
    assert (mk.engine, mk.block_n, mk.block_m, mk.num_warps) == ("gluon_ws", 128, 16, 8), mk
    monkeypatch.delenv("LOWBIT_W4A16_GROUPED_BLOCK_N")
    monkeypatch.setenv("LOWBIT_W4A16_GROUPED_ENGINE", "cuda")
    with pytest.raises(ValueError, match="LOWBIT_W4A16_GROUPED_ENGINE"):
        w4a16_grouped_config("contiguous", 6144, 4096, 7168, 48)
    monkeypatch.delenv("LOWBIT_W4A16_GROUPED_ENGINE")
    assert w4a16_grouped_config("contiguous", 6144, 4096, 7168, 48).engine == "triton"


def test_masked_split_tile_choice(gen, monkeypatch):
    """Past 64 expected rows (x1.3 spread) a masked expert takes one split tile on the
    four-warpgroup kernel, the warp-specialized 96-row one (`GLUON_SPLIT_WS_TILES`; with an engine
    override the register-A 80 or 96); at 32 tok/expert the 64-row tile stays (the 48-row one
    measured slower); a BLOCK_M override pins the rows (48 picks the split tile on sm_90, and is
    a clear error for the Triton kernels, which have no such tile)."""
    shape = ("masked", 48 * 256, 4096, 7168, 48)
    rows = {em: w4a16_grouped_config(*shape, expected_m=em, gluon=True).block_m for em in (32, 48, 50, 64, 74)}
    assert rows == {32: 64, 48: 64, 50: 96, 64: 96, 74: 64}, rows
    c = w4a16_grouped_config(*shape, expected_m=64, gluon=True)
    assert (c.engine, c.block_n, c.num_warps) == ("gluon_ws", 256, 16) and "split tile" in c.reason, c
    assert "runs the 64-row tile" in c.reason, c  # its HI_TAIL
    monkeypatch.setenv("LOWBIT_W4A16_GROUPED_ENGINE", "gluon_rs")
    c = w4a16_grouped_config(*shape, expected_m=50, gluon=True)
    assert (c.engine, c.block_n, c.block_m) == ("gluon_rs", 256, 80), c
    monkeypatch.delenv("LOWBIT_W4A16_GROUPED_ENGINE")
    assert w4a16_grouped_config(*shape, expected_m=64, gluon=False).block_m == 64  # off Hopper: Triton's tiles
    assert w4a16_grouped_config("contiguous", 6144, 4096, 7168, 48, gluon=True).block_m == 128
    monkeypatch.setenv("LOWBIT_W4A16_GROUPED_BLOCK_M", "48")
    c = w4a16_grouped_config(*shape, expected_m=32, gluon=True)
    assert (c.engine, c.block_n, c.block_m) == ("gluon_rs", 256, 48), c
    _, pm = _weights(2, 64, 256, gen, "masked", "cpu")
    with pytest.raises(ValueError, match="Triton grouped kernels run block_m"):
        masked(torch.randn(2, 16, 256).to(torch.bfloat16), pm, torch.tensor([3, 5], dtype=torch.int32), 8)


def _masked_problem(g, max_m, k, counts, gen, device):
    a3 = torch.randn(g, max_m, k, generator=gen).to(torch.bfloat16)
    return a3.to(device), torch.tensor(counts, dtype=torch.int32, device=device)


@pytest.mark.parametrize("bm", TILES)
@pytest.mark.parametrize("flat", [False, True], ids=["3d", "flat"])
def test_masked_matches_reference(bm, flat, gen, device):
    g, n, k, max_m = 4, 80, 288, 48
    wq, pw = _weights(g, n, k, gen, "masked", device)
    counts = [0, 48, 17, 1]  # an empty expert, a full one (masked_m = max_m), odd counts
    a3, mm = _masked_problem(g, max_m, k, counts, gen, device)
    out = poison_(torch.empty(g * max_m, n, dtype=torch.bfloat16, device=device))
    masked(a3.view(g * max_m, k) if flat else a3, pw, mm, 16, out=out, config=tile_config(bm, "test"))
    ref = reference.w4a16_masked_ref(a3.cpu(), wq, mm.cpu())
    valid = torch.cat([torch.arange(max_m) < c for c in counts])
    assert_close(out.cpu()[valid].float(), ref[valid], "bf16_out", "valid rows")


def test_masked_expected_m_far_from_counts(gen, device):
    """expected_m only picks the launch shape: 1 or 1000 give the same valid rows."""
    g, n, k, max_m = 3, 64, 256, 40
    wq, pw = _weights(g, n, k, gen, "masked", device)
    a3, mm = _masked_problem(g, max_m, k, [40, 3, 22], gen, device)
    valid = torch.cat([torch.arange(max_m) < c for c in (40, 3, 22)])
    ref = reference.w4a16_masked_ref(a3.cpu(), wq, mm.cpu())[valid]
    for expected in (1, 1000):
        assert_close(masked(a3, pw, mm, expected).cpu()[valid].float(), ref, "bf16_out", f"expected_m={expected}")


def test_masked_row_slots():
    """The Gluon masked grid: programs an expert for the expected rows (expected_m x 1.3), at
    least one, at most one a row block of max_m; 0 asks for every block; out of range raises."""
    from lowbit.kernels.w4a16.hopper.grouped import checked_row_slots as _slots, w4a16_grouped_sm90_launch

    masked_row_slots = heuristics.masked_row_slots
    assert masked_row_slots(1.3 * 8, 256, 16) == 1  # Kimi masked 8 tok/expert: 16 blocks -> 1 program
    assert masked_row_slots(1.3 * 32, 256, 16) == 3
    assert masked_row_slots(1.3 * 1000, 256, 64) == 4  # capped at cdiv(max_m, 64)
    assert masked_row_slots(0.5, 40, 16) == 1
    assert _slots(256, 16, 0) == 16 and _slots(256, 16, 3) == 3 and _slots(0, 16, 0) == 1
    with pytest.raises(ValueError, match="row_slots"):
        _slots(256, 16, 17)

    with pytest.raises(ValueError, match="warp-specialized"):  # refused before anything is built
        w4a16_grouped_sm90_launch(None, None, None, None, (128, 64, 8, 3), 256, True, warp_specialize=True, row_slots=2)


def test_heuristics():
    assert w4a16_grouped_config("contiguous", 6144, 4096, 7168, 48).block_m == max(VALIDATED_TILES)
    assert w4a16_grouped_config("masked", 48 * 256, 4096, 7168, 48, expected_m=32).block_m == 64  # 1.3 x 32 > 32
    assert w4a16_grouped_config("masked", 48 * 256, 4096, 7168, 48, expected_m=8).block_m == 16
    assert "expected_m=32" in explain_w4a16_grouped_config("masked", 48 * 256, 4096, 7168, 48, 32)
    with pytest.raises(ValueError, match="mode"):
        w4a16_grouped_config("indexed", 1, 1, 1, 1)


def test_bad_input(gen, device):
    g, n, k = 3, 32, 256
    wq, pc = _weights(g, n, k, gen, "contiguous", device)
    pm = pack_w4a16_grouped(wq, mode="masked").to(device)
    a2 = torch.randn(128, k, generator=gen).to(torch.bfloat16).to(device)
    m_idx = torch.zeros(128, dtype=torch.int32, device=device)
    with pytest.raises(FormatError, match="masked"):
        contiguous(a2, pm, m_idx)  # weight packed for the other mode
    with pytest.raises(FormatError, match="contiguous"):
        masked(a2[:96].view(g, 32, k), pc, torch.zeros(g, dtype=torch.int32, device=device), 8)
    with pytest.raises(FormatError, match="indexed"):
        contiguous(a2, pack_w4a16(wq).to(device), m_idx)
    with pytest.raises(ValueError, match="multiple of 128"):
        contiguous(a2[:100], pc, m_idx[:100])
    with pytest.raises(TypeError, match="int32"):
        contiguous(a2, pc, m_idx.long())
    with pytest.raises(TypeError, match="bf16"):
        contiguous(a2.float(), pc, m_idx)
    with pytest.raises(ValueError, match="K="):
        contiguous(a2[:, :128].contiguous(), pc, m_idx)
    a3 = torch.randn(g, 16, k, generator=gen).to(torch.bfloat16).to(device)
    mm = torch.full((g,), 4, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="expected_m"):
        masked(a3, pm, mm, 0)
    with pytest.raises(TypeError, match="masked_m"):
        masked(a3, pm, mm[:2], 4)
    with pytest.raises(ValueError, match="multiple of G"):
        masked(a3.view(-1, k)[:47], pm, mm, 4)
    with pytest.raises(FormatError, match="mode"):
        pack_w4a16_grouped(wq, mode="indexed")


@pytest.mark.gpu
def test_masked_cuda_graph_with_changing_masked_m(gen):
    g, n, k, max_m = 4, 128, 512, 32
    wq, pw = _weights(g, n, k, gen, "masked", "cuda")
    a3 = torch.randn(g, max_m, k, generator=gen).to(torch.bfloat16).cuda()
    mm = torch.tensor([3, 0, 32, 9], dtype=torch.int32, device="cuda")
    masked(a3, pw, mm, 16)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = masked(a3, pw, mm, 16)
    for counts in ([1, 31, 0, 17], [32, 32, 32, 32], [0, 0, 5, 0]):
        mm.copy_(torch.tensor(counts, dtype=torch.int32))
        a3.normal_()
        graph.replay()
        torch.cuda.synchronize()
        valid = torch.cat([torch.arange(max_m) < c for c in counts])
        ref = reference.w4a16_masked_ref(a3.cpu(), wq, mm.cpu())
        assert_close(out.cpu()[valid].float(), ref[valid], "bf16_out", f"replay {counts}")


@pytest.mark.parametrize("bm", TILES)
def test_tiles_with_n_off_16(bm, gen, device):
    """Every validated tile at every pipeline depth it can be given, N off 16 (37, 200), both
    layouts: Triton 3.6 miscompiles the 64x64 tile at 2-3 stages there, and `avoid_miscompile`
    must route around it (on the GPU; the interpreter has no stages)."""
    from dataclasses import replace

    stages = (1, 2, 3, 4) if device == "cuda" else (tile_config(bm, "").num_stages,)
    for n in (37, 200):
        wq, pw = _weights(3, n, 288, gen, "contiguous", device)
        a2, m_idx, _ = _contiguous_problem(20, 2, 3, 288, gen, device)
        rows = (m_idx >= 0).cpu()
        ref = reference.w4a16_contiguous_ref(a2.cpu(), wq, m_idx.cpu())
        wqm, pwm = _weights(2, n, 288, gen, "masked", device)
        a3, mm = _masked_problem(2, 40, 288, [40, 13], gen, device)
        refm = reference.w4a16_masked_ref(a3.cpu(), wqm, mm.cpu())
        valid = (torch.arange(40)[None, :] < mm.cpu()[:, None]).reshape(-1)
        for st in stages:
            cfg = replace(tile_config(bm, "test"), num_stages=st)
            out = contiguous(a2, pw, m_idx, config=cfg)
            assert_close(out.cpu()[rows].float(), ref[rows], "bf16_out", f"contiguous N={n} stages={st}")
            out = masked(a3, pwm, mm, 16, config=cfg)
            assert_close(out.cpu()[valid].float(), refm.reshape(-1, n)[valid], "bf16_out", f"masked N={n} stages={st}")
    assert avoid_miscompile(tile_config(64, ""), 200).num_stages == 1
    assert avoid_miscompile(tile_config(64, ""), 192) == tile_config(64, "")


def test_gluon_default_where_measured_faster(monkeypatch):
    """With `gluon=True` (an sm_90 GPU, TMA-able operands) the register-A Gluon kernel is the
    default for contiguous and masked (16-, 32- or 64-row activation tiles by expected_m); Triton
    off Hopper; an engine override wins either way and gets a tile of its own engine."""
    c = w4a16_grouped_config("contiguous", 6144, 4096, 7168, 48, gluon=True)  # four warpgroups, 256 weight rows
    assert (c.engine, c.block_n, c.block_m, c.num_warps) == ("gluon_rs", 256, 128, 16), c
    assert w4a16_grouped_config("contiguous", 6144, 4096, 7168, 48).engine == "triton"
    for mode, m, n, k, ex, engine in (("contiguous", 1536, 4096, 7168, 0, "gluon_ws"),  # EP32 gate_up: 192 programs
                                      ("contiguous", 1536, 7168, 2048, 0, "gluon_rs"),  # EP32 down: 336
                                      ("masked", 24 * 256, 4096, 7168, 64, "gluon_ws")):  # EP16 masked 64: split 96
        c = w4a16_grouped_config(mode, m, n, k, m // 128 if mode == "contiguous" else m // 256, ex, gluon=True)
        wide = engine == "gluon_rs" or mode == "masked"  # the masked four-warpgroup tile runs warp-specialized
        assert c.engine == engine and c.block_n == (256 if wide else 128), (mode, m, n, c)
    for g in (48, 24, 12):  # masked 32 tok/expert: the 64-row tile on one warpgroup, with its half tail
        m32 = w4a16_grouped_config("masked", g * 256, 4096, 7168, g, 32, gluon=True)
        assert (m32.engine, m32.block_n, m32.block_m, m32.num_warps) == ("gluon_rs", 128, 64, 4), m32
        assert "runs the 32-row tile" in m32.reason, m32  # `RegisterATile.half_tail`
        assert "refilled by halves" in m32.reason, m32  # `RegisterATile.half_acts`
    m64 = w4a16_grouped_config("masked", 48 * 256, 4096, 7168, 48, 64, gluon=True)  # past one 64-row tile
    assert (m64.engine, m64.block_n, m64.block_m) == ("gluon_ws", 256, 96), m64
    for em, rows in ((8, 16), (16, 32)):  # the 16- / 32-row group loops on 128 weight rows
        c = w4a16_grouped_config("masked", 48 * 256, 4096, 7168, 48, em, gluon=True)
        assert (c.engine, c.block_n, c.block_m, c.num_warps) == ("gluon_rs", 128, rows, 4), c
    assert w4a16_grouped_config("masked", 48 * 256, 4096, 7168, 48, 8).engine == "triton"


def test_masked_decode_group_loop_tiles(monkeypatch):
    """Masked decode tiles (`tiles.GROUP_LOOP_MAXNREG`): 8 tok/expert runs the 16-row tile on
    the group loop (2 stages) on 128 weight rows (`WIDE_DECODE_TILES`; masked grids need no
    minimum, `WIDE_MIN_PROGRAMS`: 12 experts too), unless a stage count or the weight rows are
    forced; 16 tok/expert the 32-row tile's 128-row group loop, whose 64-row forms (`BLOCK_N=64`)
    are the step loop (4 stages, two accumulators) at gate_up's long K and the group loop at
    down's K of 8 steps (`SHORT_K_TILES`); 32 tok/expert the one-warpgroup 128x64. Every tile
    picked is one the kernel is built for."""
    sm90 = tiles
    # (the pre-gathered indexed kernel's own tile included: `PREGATHER_BLOCK_TILES`)
    assert set(sm90.GROUP_LOOP_MAXNREG) <= (set(sm90.GLUON_RS_TILES) | set(sm90.INDEXED_RS_TILES)
                                            | set(sm90.PREGATHER_TILES))
    assert all(t[2] == 4 for t in sm90.GROUP_LOOP_MAXNREG)  # one warpgroup: the loop's register budget
    assert set(sm90.THIN_GRID_TILES) <= set(sm90.GROUP_LOOP_MAXNREG)
    assert set(sm90.SHORT_K_TILES.values()) <= set(sm90.GROUP_LOOP_MAXNREG) & set(sm90.GLUON_RS_TILES)
    cases = ((48, 8, 4096, 7168, (128, 16, 4, 2)), (48, 8, 7168, 2048, (128, 16, 4, 2)),
             (24, 8, 4096, 7168, (128, 16, 4, 2)), (12, 8, 4096, 7168, (128, 16, 4, 2)),  # thin grids too
             (48, 16, 4096, 7168, (128, 32, 4, 2)), (48, 16, 7168, 2048, (128, 32, 4, 2)),
             (12, 16, 4096, 7168, (128, 32, 4, 2)), (12, 16, 7168, 2048, (128, 32, 4, 2)),
             (48, 32, 4096, 7168, (128, 64, 4, 2)), (12, 32, 7168, 2048, (128, 64, 4, 2)))
    for g, em, n, k, tile in cases:
        c = w4a16_grouped_config("masked", g * 256, n, k, g, em, gluon=True)
        assert (c.block_n, c.block_m, c.num_warps, c.num_stages) == tile, (g, em, n, k, c)
        assert ("one K group at a time" in c.reason) == (tile in sm90.GROUP_LOOP_MAXNREG), c.reason
    monkeypatch.setenv("LOWBIT_W4A16_GROUPED_BLOCK_N", "64")
    c = w4a16_grouped_config("masked", 48 * 256, 4096, 7168, 48, 8, gluon=True)
    assert (c.block_n, c.block_m, c.num_stages) == (64, 16, 2), c
    c = w4a16_grouped_config("masked", 12 * 256, 4096, 7168, 12, 8, gluon=True)  # 12 x 64 programs: thin
    assert (c.block_n, c.block_m, c.num_stages) == (64, 16, 3), c
    for n, k, tile in ((4096, 7168, (64, 32, 4, 4)), (7168, 2048, (64, 32, 4, 2))):
        c = w4a16_grouped_config("masked", 48 * 256, n, k, 48, 16, gluon=True)
        assert (c.block_n, c.block_m, c.num_warps, c.num_stages) == tile, c
    monkeypatch.delenv("LOWBIT_W4A16_GROUPED_BLOCK_N")
    monkeypatch.setenv("LOWBIT_W4A16_GROUPED_NUM_STAGES", "3")
    c = w4a16_grouped_config("masked", 48 * 256, 4096, 7168, 48, 8, gluon=True)
    assert (c.block_m, c.num_stages) == (16, 3), c
    monkeypatch.setenv("LOWBIT_W4A16_GROUPED_ENGINE", "triton")
    t = w4a16_grouped_config("contiguous", 6144, 4096, 7168, 48, gluon=True)
    assert (t.engine, t.block_m) == ("triton", 64), t


def test_tail_tiles_are_offered_and_reported():
    """The tail tables name tiles their kernels are built for (the warp-specialized ones: only its
    four-warpgroup tiles), contiguous segments have none, and the heuristics' reason says when
    a tail runs (masked 16 / 32 / 64 tok/expert on Kimi EP8, the split tile at 64)."""
    from lowbit.kernels.w4a16.hopper.grouped import w4a16_grouped_split_launch

    records = tiles.GROUPED_REGISTER_A + tiles.INDEXED_REGISTER_A
    assert all(t.ws and t.shape[0] == 256 for t in records if t.ws_tails)  # four-warpgroup tails only
    assert all(t.group_loop for t in records if t.half_acts)  # refills by halves: the group loop's
    assert all(t.ws and t.shape[2] == 8 for t in tiles.INDEXED_REGISTER_A if t.nloop)  # two warpgroups
    assert all(t.nloop for t in tiles.INDEXED_REGISTER_A if t.nloop_half_tail)
    assert set(tiles.PREGATHER_BLOCK_TILES.values()) <= set(tiles.PREGATHER_TILES)
    assert all(t.pregather for t in tiles.INDEXED_REGISTER_A if not t.gather)  # every tile runs somewhere
    tail_rows = heuristics.tail_rows
    assert tail_rows((256, 64, 16, 3), "gluon_ws", "masked") == 32
    assert tail_rows((128, 64, 8, 3), "gluon_ws", "masked") == 0
    assert tail_rows((256, 96, 16, 2), "gluon_ws", "masked") == 64
    assert set(tiles.GLUON_SPLIT_WS_TILES) <= set(tiles.GLUON_SPLIT_TILES)
    with pytest.raises(ValueError, match="no warp-specialized form"):  # 80 = 64 + 16 is not 3/4 of a ring
        w4a16_grouped_split_launch(None, None, None, None, (256, 80, 16, 2), 256, warp_specialize=True)
    assert tail_rows((256, 64, 16, 3), "gluon_rs", "masked") == 32
    assert tail_rows((256, 96, 16, 2), "gluon_rs", "masked") == 64
    assert tail_rows((256, 128, 16, 2), "gluon_rs", "contiguous") == 0
    assert tail_rows((256, 128, 16, 2), "gluon_ws", "indexed") == 0
    assert tail_rows((64, 32, 4, 4), "gluon_rs", "masked") == 16  # the 32-row tile's 64-row form
    assert tail_rows((128, 64, 4, 2), "gluon_rs", "indexed") == 32
    for g, em, rows, tail in ((48, 32, 64, 32), (12, 32, 64, 32), (48, 64, 96, 64)):
        c = w4a16_grouped_config("masked", g * 256, 4096, 7168, g, em, gluon=True)
        assert c.block_m == rows and f"runs the {tail}-row tile" in c.reason, c
    for em in (8, 16):  # the 16- and 32-row tiles on 128 weight rows: no tail (16 tok/expert: measured level)
        c = w4a16_grouped_config("masked", 48 * 256, 4096, 7168, 48, em, gluon=True)
        assert "-row tile (H200 masked" not in c.reason, c


def test_gluon_capable_needs_hopper():
    """Off an sm_90 GPU (the CPU tier, the interpreter) the Gluon engines are never chosen."""
    from lowbit.kernels.w4a16 import grouped as w4a16_grouped, indexed as w4a16_indexed

    pw = pack_w4a16_grouped(INT4.quantize(torch.randn(2, 64, 256) * 0.05), mode="contiguous")
    a = torch.zeros(128, 256, dtype=torch.bfloat16)
    assert not w4a16_grouped.gluon_capable(a, pw)
    assert not w4a16_indexed.gluon_capable(a, pack_w4a16(INT4.quantize(torch.randn(2, 64, 256) * 0.05)))
