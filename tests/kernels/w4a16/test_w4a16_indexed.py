"""W4A16 indexed MoE GEMM vs the FP32 reference (interpreter on the CPU tier, native on the GPU)."""

from dataclasses import replace

import pytest
import torch

from lowbit import reference, routing
from lowbit.formats import FormatError, get_format
from lowbit.formats.w4a16 import pack_w4a16, unpack_w4a16
from lowbit.routing.kernels import gather_indexed_rows
from lowbit.kernels.w4a16 import heuristics
from lowbit.kernels.w4a16.heuristics import W4A16Config, tile_config
from lowbit.kernels.w4a16.indexed import w4a16_indexed, w4a16_indexed_config
from lowbit.kernels.w4a16.tiles import (
    GROUP_LOOP_MAXNREG,
    INDEXED_REGISTER_A,
    INDEXED_RS_TILES,
    INDEXED_SPLIT_TILES,
    INDEXED_TILES,
    INDEXED_WS_TILES,
    NLOOP_MAX_ROW_TILES,
    NLOOP_N_TILES,
    NLOOP_TILES,
    PREGATHER_TILES,
    VALIDATED_TILES,
)
from lowbit.testing import (
    assert_bitwise_equal,
    assert_close,
    poison_,
    random_topk_ids,
    random_topk_weights,
)

from helpers import indexed_problem as _problem

INT4 = get_format("int4_g32")
BLOCKS = sorted(VALIDATED_TILES)  # every M tile the heuristics can pick


def _rs(tile, engine="gluon_rs", **kw) -> W4A16Config:
    """The explicit configuration of a Hopper `tile` (weight rows, routing block, warps, stages)."""
    bw, block, warps, stages = tile
    return W4A16Config(block, bw, warps, stages, True, engine=engine, reason="test", **kw)


def _check(a, wq, pw, ids, block, top_k, device, emap=None, topk_weights=None, over_alloc=0, split_k=0,
           slot_order=False, config=None):
    """(out, FP32 reference) of `w4a16_indexed` on a fresh routing; `slot_order`: `a` handed over
    already in slot order (`gather_indexed_rows`, ``slot_order_routes``); `config`: the launch
    configuration (default: the heuristics' for the routing block)."""
    e = ids.max().item() + 1 if emap is None else emap.numel()
    r = routing.moe_align_block_size(ids, block, max(e, wq.codes.shape[0]) if emap is None else emap.numel(), emap)
    sorted_ids, expert_ids = r.sorted_token_ids, r.expert_ids
    if over_alloc:  # a bigger buffer than needed: the kernel must stop at the device-side count
        sorted_ids = torch.cat([sorted_ids, torch.full((over_alloc * block,), ids.numel(), dtype=torch.int32, device=device)])
        expert_ids = torch.cat([expert_ids, torch.zeros(over_alloc, dtype=torch.int32, device=device)])
    out = poison_(torch.empty(ids.numel(), pw.n, dtype=torch.bfloat16, device=device))
    cfg = config or w4a16_indexed_config(ids.numel(), pw.num_experts, pw.n, pw.k, block_m=block)
    if split_k:
        cfg = replace(cfg, split_k=split_k)
    if slot_order:
        a_slots = gather_indexed_rows(a, sorted_ids, expert_ids, r.num_tokens_post_padded, top_k)
        w4a16_indexed(a_slots, pw, sorted_ids, expert_ids, r.num_tokens_post_padded, 1, topk_weights=topk_weights,
                      out=out, config=cfg, slot_order_routes=ids.numel())
    else:
        w4a16_indexed(a, pw, sorted_ids, expert_ids, r.num_tokens_post_padded, top_k,
                      topk_weights=topk_weights, out=out, config=cfg)
    ref = reference.w4a16_indexed_ref(a.cpu(), wq, r.sorted_token_ids.cpu(), r.expert_ids.cpu(),
                                      r.num_tokens_post_padded.cpu(), top_k,
                                      None if topk_weights is None else topk_weights.cpu())
    return out.cpu(), ref


@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("shape", [
    (4, 80, 288, 5, 2),    # N, K not multiples of the tiles (K=288: 256 + a partial tile)
    (6, 64, 256, 1, 4),    # one token (M=1)
    (3, 32, 512, 20, 1),   # down-like top_k=1, more rows than a 16-row block
], ids=lambda s: "E{}_N{}_K{}_T{}_k{}".format(*s))
def test_matches_reference(shape, block, gen, device):
    e, n, k, t, top_k = shape
    wq, pw, a, ids = _problem(e, n, k, t, top_k, gen, device)
    out, ref = _check(a, wq, pw, ids, block, top_k, device)
    assert_close(out.float(), ref, "bf16_out")


@pytest.mark.parametrize("block", [16, 64])
def test_edges_hot_expert_weights_overalloc(block, gen, device):
    """All tokens on one expert + an empty expert + routing weights + over-allocated buffers."""
    wq, pw, a, ids = _problem(5, 48, 256, 24, 2, gen, device, hot=1)
    tw = random_topk_weights(24, 2, generator=gen).to(device)
    out, ref = _check(a, wq, pw, ids, block, 2, device, topk_weights=tw, over_alloc=3)
    assert_close(out.float(), ref, "bf16_out")


def test_remote_experts_and_dropped_routes_leave_rows_untouched(gen, device):
    e = 6
    wq, pw, a, ids = _problem(e, 40, 256, 9, 2, gen, device)
    ids.view(-1)[::5] = -1
    emap = torch.tensor([-1, -1, 0, 1, 2, 3], dtype=torch.int32, device=device)  # experts 0, 1 remote
    wq_local = INT4.quantize(wq.dequantize()[2:], wq.scales[2:])
    pw_local = pack_w4a16(wq_local).to(device)
    out, ref = _check(a, wq_local, pw_local, ids, 16, 2, device, emap=emap)
    untouched = (ids.flatten().cpu() < 2)
    assert untouched.any()
    assert (out[untouched].float() > 1e30).all(), "rows of remote/dropped routes must keep the poison"
    assert_close(out[~untouched].float(), ref[~untouched], "bf16_out")


@pytest.mark.parametrize("block", [16, 32])
def test_every_route_on_its_own_expert(block, gen, device):
    """As many live blocks as routes (each route alone on its expert: one-token decode): the
    grid's row blocks (`routing.live_block_bound`) are all live, none to spare, over a buffer
    over-allocated for 12 experts; and the bound itself."""
    wq = INT4.quantize(torch.randn(12, 40, 256, generator=gen) * 0.05)
    pw = pack_w4a16(wq).to(device)
    a = torch.randn(2, 256, generator=gen).to(torch.bfloat16).to(device)
    ids = torch.randperm(12, generator=gen)[:6].view(2, 3).to(torch.int32).to(device)
    out, ref = _check(a, wq, pw, ids, block, 3, device)
    assert_close(out.float(), ref, "bf16_out")
    assert routing.live_block_bound(routing.max_num_tokens_padded(6, 12, block) // block, 6) == 6
    assert routing.live_block_bound(5, 64) == 5 and routing.live_block_bound(5, 0) == 1


def test_reference_refuses_a_block_with_no_route(gen):
    """The layout contract the kernels' grid relies on: a block before num_tokens_post_padded
    that holds no route (an expert given a block without routes) is refused, not computed."""
    wq = INT4.quantize(torch.randn(4, 32, 256, generator=gen) * 0.05)
    a = torch.randn(2, 256, generator=gen).to(torch.bfloat16)
    r = routing.moe_align_block_size(torch.tensor([[1], [3]], dtype=torch.int32), 4, 4)
    sentinel = torch.full((4,), 2, dtype=torch.int32)
    sorted_ids = torch.cat([sentinel, r.sorted_token_ids])
    expert_ids = torch.cat([torch.zeros(1, dtype=torch.int32), r.expert_ids])
    with pytest.raises(ValueError, match="holds no route"):
        reference.w4a16_indexed_ref(a, wq, sorted_ids, expert_ids, r.num_tokens_post_padded + 4, 1)


def test_nloop_tiles_a_program_follow_the_grid():
    """The N-loop kernel's tiles a program (`nloop_n_tiles`): the measured best at Kimi TP8 down's
    bench sizes, the fewest (8) on a decode grid, never more than the row-tile cap."""
    nloop_n_tiles = heuristics.nloop_n_tiles
    for tokens, block, best in ((8192, 128, 28), (4096, 64, 56), (2048, 64, 56), (1024, 32, 28), (32, 16, 14),
                                (20, 16, 8)):
        assert nloop_n_tiles(block, tokens * 8, 384, 7168) == best, (tokens, block)
    for block in (16, 32, 64, 128):
        for routes in (8, 1000, 10 ** 5, 10 ** 7):
            chunk = nloop_n_tiles(block, routes, 384, 7168)
            assert chunk in NLOOP_N_TILES and (block * chunk <= NLOOP_MAX_ROW_TILES or chunk == NLOOP_N_TILES[-1])
    assert nloop_n_tiles(32, 8192, 384, 7168, num_sms=264) < nloop_n_tiles(32, 8192, 384, 7168)  # more SMs


@pytest.mark.sm90
@pytest.mark.parametrize("tile", NLOOP_TILES)
def test_nloop_long_programs_match_reference(tile, gen, monkeypatch):
    """The N loop with as many tiles a program as `nloop_n_tiles` allows (its wave floor lifted,
    so a small grid takes 28-56 tiles a program): one K step, N tiles past a chunk, experts of
    ~150 rows (full blocks and half tails) and a hot expert with routing weights."""
    monkeypatch.setattr(heuristics, "NLOOP_MIN_WAVES", 0)
    assert heuristics.nloop_n_tiles(tile[1], 300, 2, 7200) >= 28
    assert heuristics.runs_nloop(tile, 256)
    for e, n, t, hot in ((2, 7200, 150, None), (3, 4104, 40, 1)):  # 57 / 33 N tiles of 128
        wq, pw, a, ids = _problem(e, n, 256, t, 2, gen, "cuda", hot=hot)
        tw = random_topk_weights(t, 2, generator=gen).cuda() if hot is not None else None
        out, ref = _check(a, wq, pw, ids, tile[1], 2, "cuda", topk_weights=tw, over_alloc=2,
                          config=_rs(tile, "gluon_ws"))
        assert_close(out.float(), ref, "bf16_out", f"N loop {tile}, E{e} N{n} T{t}")


@pytest.mark.sm90
@pytest.mark.parametrize("block,engine", [(b, "gluon") for b in BLOCKS]
                         + [(b, "gluon_rs") for b in sorted({t[1] for t in INDEXED_RS_TILES})]
                         + [(b, "gluon_ws") for b in sorted({t[1] for t in INDEXED_WS_TILES})])
def test_gluon_engine_matches_reference(block, engine, gen, monkeypatch):
    """The Hopper Gluon kernels (engines gluon / gluon_rs / gluon_ws) through the same checks as
    the Triton kernel, every tile of the routing block (the register-A kernel also runs 128-row
    blocks): N and K off the tiles (5 K steps; 9 to wrap the ring), one token, experts of ~150
    rows (a 128-row block's full and half-row tiles, also on the one-K-step N loop) and of ~44 (a
    64-row block's full, half and three-quarter tiles), a hot expert with routing weights and
    over-allocated buffers, remote experts and dropped routes, and activations whose rows are
    not 16-byte aligned (refused, not misread). ``LOWBIT_W4A16_ENGINE`` picks the engine (the
    shared-memory one for a routing block the engine has no tile for)."""
    tiles = {"gluon": INDEXED_TILES, "gluon_rs": INDEXED_RS_TILES, "gluon_ws": INDEXED_WS_TILES}[engine]
    if not any(t[1] == block for t in tiles):
        engine, tiles = "gluon", INDEXED_TILES  # an engine without this routing block: the shared-memory kernel
    monkeypatch.setenv("LOWBIT_W4A16_ENGINE", engine)
    ran = w4a16_indexed_config(8, 4, 80, 288, block_m=block).engine
    assert ran == engine, ran
    monkeypatch.delenv("LOWBIT_W4A16_ENGINE")
    block_tiles = [t for t in tiles if t[1] == block]
    for tile in block_tiles:
        cfg = _rs(tile, engine)
        for e, n, k, t, top_k in ((4, 80, 288, 5, 2), (6, 64, 256, 1, 4), (3, 200, 1056, 40, 2),
                                  (2, 72, 2304, 6, 2),  # 9 K steps: the ring wraps several times
                                  (3, 1096, 256, 7, 2),  # one K step, 9 N tiles of 128: the N loop's chunks
                                  (2, 1096, 256, 150, 2),  # ... ~150 rows an expert: its full blocks and half tails
                                  (2, 136, 512, 150, 2),  # ~150 rows an expert: full blocks and half tails
                                  (4, 72, 544, 88, 2)):  # ~44 rows an expert: 64-row blocks' three tiles
            wq, pw, a, ids = _problem(e, n, k, t, top_k, gen, "cuda")
            out, ref = _check(a, wq, pw, ids, block, top_k, "cuda", config=cfg)
            assert_close(out.float(), ref, "bf16_out", f"E{e} N{n} K{k} T{t} tile {tile}")
        for t in (24, 150):  # 150: the hot expert's full 128-row blocks and its tail take the weights too
            wq, pw, a, ids = _problem(5, 48, 256, t, 2, gen, "cuda", hot=1)
            tw = random_topk_weights(t, 2, generator=gen).cuda()
            out, ref = _check(a, wq, pw, ids, block, 2, "cuda", topk_weights=tw, over_alloc=3, config=cfg)
            assert_close(out.float(), ref, "bf16_out", f"hot expert, weights, over-allocated, {t} tokens")
    cfg = _rs(block_tiles[0], engine)
    wq, pw, a, ids = _problem(2, 52, 256, 3, 2, gen, "cuda")  # N % 8: the scales' TMA rows misalign
    with pytest.raises(ValueError, match="multiple of 8"):
        _check(a, wq, pw, ids, block, 2, "cuda", config=cfg)
    wq, pw, a, ids = _problem(6, 40, 256, 9, 2, gen, "cuda")
    ids.view(-1)[::5] = -1
    emap = torch.tensor([-1, -1, 0, 1, 2, 3], dtype=torch.int32, device="cuda")
    wq_local = INT4.quantize(wq.dequantize()[2:], wq.scales[2:])
    out, ref = _check(a, wq_local, pack_w4a16(wq_local).to("cuda"), ids, block, 2, "cuda", emap=emap, config=cfg)
    untouched = ids.flatten().cpu() < 2
    assert (out[untouched].float() > 1e30).all(), "rows of remote/dropped routes must keep the poison"
    assert_close(out[~untouched].float(), ref[~untouched], "bf16_out", "EP map")
    if engine in ("gluon_rs", "gluon_ws"):  # rows 16-byte aligned or a clear error
        wq, pw, a, ids = _problem(3, 64, 256, 4, 2, gen, "cuda")
        a_odd = torch.empty(4, 260, dtype=torch.bfloat16, device="cuda")[:, :256]
        a_odd.copy_(a)
        with pytest.raises(ValueError, match="16-byte"):
            _check(a_odd, wq, pw, ids, block, 2, "cuda", config=cfg)


@pytest.mark.sm90
@pytest.mark.parametrize("tile", PREGATHER_TILES, ids=lambda t: "x".join(map(str, t)))
def test_pregather_matches_reference_and_the_in_kernel_gather(tile, gen):
    """Rows gathered into slot order, then loaded by TMA (``pregather``), on each tile that has
    the form: the reference's answer, bit for bit the in-kernel gather's on the tile of the same
    weight rows and stages (and the same again with the rows handed over in slot order,
    ``slot_order_routes``), on K off the step, ring wraps, ~150 and ~44 rows an expert (full
    blocks, half tails), a hot expert with routing weights and over-allocated buffers, and
    remote experts with dropped routes."""
    bw, block, _, stages = tile
    in_kernel = next(t for t in INDEXED_RS_TILES if (t[0], t[1], t[3]) == (bw, block, stages))

    def both(wq, pw, a, ids, top_k, what, **kw):
        outs = []
        for pre in ("0", "1", "slots"):
            cfg = _rs(in_kernel) if pre == "0" else _rs(tile, pregather=True)
            out, ref = _check(a, wq, pw, ids, block, top_k, "cuda", slot_order=pre == "slots", config=cfg, **kw)
            outs.append(out)
        assert_bitwise_equal(outs[1], outs[0], f"pre-gathered vs in-kernel gather, {what}")
        assert_bitwise_equal(outs[2], outs[1], f"rows handed over in slot order vs gathered by the launcher, {what}")
        return outs[1], ref

    for e, n, k, t, top_k in ((4, 80, 288, 5, 2), (3, 200, 1056, 40, 2), (2, 72, 2304, 6, 2),
                              (2, 136, 512, 150, 2), (4, 72, 544, 88, 2)):
        wq, pw, a, ids = _problem(e, n, k, t, top_k, gen, "cuda")
        out, ref = both(wq, pw, a, ids, top_k, f"E{e} N{n} K{k} T{t}")
        assert_close(out.float(), ref, "bf16_out", f"pre-gathered E{e} N{n} K{k} T{t} on {tile}")
    for t in (24, 150):
        wq, pw, a, ids = _problem(5, 48, 512, t, 2, gen, "cuda", hot=1)
        tw = random_topk_weights(t, 2, generator=gen).cuda()
        out, ref = both(wq, pw, a, ids, 2, f"hot, {t} tokens", topk_weights=tw, over_alloc=3)
        assert_close(out.float(), ref, "bf16_out", f"pre-gathered hot expert, weights, over-allocated, {t} tokens")
    wq, pw, a, ids = _problem(6, 40, 512, 9, 2, gen, "cuda")
    ids.view(-1)[::5] = -1
    emap = torch.tensor([-1, -1, 0, 1, 2, 3], dtype=torch.int32, device="cuda")
    wq_local = INT4.quantize(wq.dequantize()[2:], wq.scales[2:])
    out, ref = both(wq_local, pack_w4a16(wq_local).to("cuda"), a, ids, 2, "EP map", emap=emap)
    untouched = ids.flatten().cpu() < 2
    assert (out[untouched].float() > 1e30).all(), "rows of remote/dropped routes must keep the poison"
    assert_close(out[~untouched].float(), ref[~untouched], "bf16_out", "pre-gathered, EP map")


def test_pregather_heuristic_override_and_contract(gen, monkeypatch):
    """Pre-gathering is the default where the tile has the form and N is large (Kimi EP8 prefill
    gate_up / down), not for TP8 gate_up (N 512) nor decode; ``LOWBIT_W4A16_PREGATHER`` forces it
    either way where the tile can, and says so where it cannot; a config asking for it off the
    register-A engine is refused."""
    monkeypatch.delenv("LOWBIT_W4A16_PREGATHER", raising=False)
    for n, k in ((4096, 7168), (7168, 2048)):
        # EP8 256 / 512 tokens: the 64-row block's 128x64; 768-2048 tokens (tok_e 128-341, the
        # in-kernel gather's 64-row middle included): the 128-row block on one warpgroup
        for routes, tile in ((2048, (128, 64, 4, 2)), (4096, (128, 64, 4, 2)), (6144, (128, 128, 4, 2)),
                             (8192, (128, 128, 4, 2)), (16384, (128, 128, 4, 2))):
            c = w4a16_indexed_config(routes, 48, n, k, gluon=True)
            assert c.pregather and c.engine == "gluon_rs" and "pre-gathered" in c.reason, c
            assert (c.block_n, c.block_m, c.num_warps, c.num_stages) == tile, (routes, c)
            assert (tile[1] == 128) == ("x 128 routes on one warpgroup, 2 stages" in c.reason), c.reason
            assert (tile[1] == 128) == ("refilled by halves: two CTAs an SM" in c.reason), c.reason
        assert not w4a16_indexed_config(8192, 48, n, k).pregather  # no Hopper kernels: Triton
    monkeypatch.setenv("LOWBIT_W4A16_BLOCK_N", "256")  # a forced tile keeps its own pre-gathered form
    c = w4a16_indexed_config(8192, 48, 4096, 7168, gluon=True)
    assert c.pregather and (c.block_n, c.block_m, c.num_warps) == (256, 128, 16), c
    monkeypatch.setenv("LOWBIT_W4A16_ENGINE", "gluon_ws")  # a forced engine without the form keeps it
    c = w4a16_indexed_config(8192, 48, 4096, 7168, block_m=64, gluon=True)
    assert not c.pregather and c.engine == "gluon_ws", c
    monkeypatch.delenv("LOWBIT_W4A16_ENGINE")
    monkeypatch.delenv("LOWBIT_W4A16_BLOCK_N")
    assert not w4a16_indexed_config(65536, 384, 512, 7168, gluon=True).pregather  # TP8 gate_up
    assert not w4a16_indexed_config(65536, 384, 7168, 256, gluon=True).pregather  # one K step: the N loop
    assert not w4a16_indexed_config(160, 48, 4096, 7168, gluon=True).pregather  # decode
    monkeypatch.setenv("LOWBIT_W4A16_PREGATHER", "1")
    c = w4a16_indexed_config(65536, 384, 512, 7168, gluon=True)
    assert c.pregather and "LOWBIT_W4A16_PREGATHER=1" in c.reason, c
    c = w4a16_indexed_config(160, 48, 4096, 7168, gluon=True)
    assert not c.pregather and "cannot" in c.reason, c
    monkeypatch.setenv("LOWBIT_W4A16_PREGATHER", "0")
    assert not w4a16_indexed_config(8192, 48, 4096, 7168, gluon=True).pregather
    monkeypatch.setenv("LOWBIT_W4A16_PREGATHER", "maybe")
    with pytest.raises(ValueError, match="LOWBIT_W4A16_PREGATHER"):
        w4a16_indexed_config(8192, 48, 4096, 7168, gluon=True)
    monkeypatch.delenv("LOWBIT_W4A16_PREGATHER")
    wq, pw, a, ids = _problem(3, 64, 512, 2, 2, gen, "cpu")
    c = w4a16_indexed_config(4, 3, 64, 512, block_m=64)
    r = routing.moe_align_block_size(ids, c.block_m, 3)
    with pytest.raises(ValueError, match="pregather"):
        w4a16_indexed(a, pw, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, 2,
                      config=replace(c, pregather=True))
    # rows in slot order: one a slot, top_k 1, and only where the engine reads that layout
    a_slots = torch.randn(r.sorted_token_ids.numel(), 512, generator=gen).to(torch.bfloat16)
    with pytest.raises(ValueError, match="needs the pre-gathered engine"):
        w4a16_indexed(a_slots, pw, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, 1, config=c,
                      slot_order_routes=4)
    for bad_a, bad_k in ((a_slots, 2), (a_slots[:-1], 1)):
        with pytest.raises(ValueError, match="one row a routing slot"):
            w4a16_indexed(bad_a, pw, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, bad_k, config=c,
                          slot_order_routes=4)


def test_four_warpgroup_gather_drops_the_k_check_only_on_whole_steps():
    """The register-A indexed kernel's gather masks K per copy unless the tile is a four-warpgroup
    one of `EVEN_K_GATHER_TILES` (not warp-specialized) and K a multiple of 256 (K_TAIL)."""
    from lowbit.kernels.w4a16.hopper.indexed import rs_constexprs

    even_k = [t.shape for t in INDEXED_REGISTER_A if t.even_k]
    assert even_k and all(t[2] == 16 for t in even_k)
    for tile in even_k:
        assert not rs_constexprs(tile, False, 7168)["K_TAIL"]
        assert rs_constexprs(tile, False, 7200)["K_TAIL"]  # a K tail: zero-filled past K
        assert rs_constexprs(tile, False)["K_TAIL"]  # K unknown
    assert rs_constexprs((256, 64, 16, 3), True, 7168)["K_TAIL"]  # the producer's gather keeps it
    assert rs_constexprs((128, 64, 4, 2), False, 7168)["K_TAIL"]  # one-warpgroup tiles keep it


def test_gluon_engine_contract(gen, monkeypatch):
    """LOWBIT_W4A16_ENGINE=gluon: the Gluon tile for the routing block (no split-K, even where
    the heuristic splits), refused without a CUDA GPU, bad engine names refused."""
    monkeypatch.setenv("LOWBIT_W4A16_ENGINE", "gluon")
    c = w4a16_indexed_config(8, 48, 4096, 7168)  # the one-token grid: split-K 2 on Triton
    assert (c.engine, c.block_n, c.num_warps, c.split_k) == ("gluon", 64, 4, 1), c
    assert "LOWBIT_W4A16_ENGINE=gluon" in c.reason
    wq, pw, a, ids = _problem(3, 64, 256, 2, 2, gen, "cpu")
    r = routing.moe_align_block_size(ids, c.block_m, 3)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            w4a16_indexed(a, pw, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, 2,
                          config=w4a16_indexed_config(4, 3, 64, 256, block_m=c.block_m))
    with pytest.raises(ValueError, match="engine must be"):
        w4a16_indexed(a, pw, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, 2,
                      config=replace(c, engine="cuda"))
    monkeypatch.setenv("LOWBIT_W4A16_ENGINE", "gluon_ws")  # two-warpgroup tiles only; else register-A / gluon
    c = w4a16_indexed_config(8, 48, 4096, 7168, block_m=128)
    assert (c.engine, c.block_n, c.num_warps) == ("gluon_ws", 128, 8), c
    assert w4a16_indexed_config(8, 48, 4096, 7168, block_m=64).engine == "gluon_ws"
    monkeypatch.setenv("LOWBIT_W4A16_ENGINE", "cuda")
    with pytest.raises(ValueError, match="LOWBIT_W4A16_ENGINE"):
        w4a16_indexed_config(8, 48, 4096, 7168)


def test_one_hot_activations_give_the_weight(gen, device):
    """a = eye(K): each output row is the dequantized weight column, exactly (bf16-rounded)."""
    e, n, k = 2, 64, 256
    wq = INT4.quantize(torch.randn(e, n, k, generator=gen) * 0.05)
    pw = pack_w4a16(wq).to(device)
    a = torch.eye(k, dtype=torch.bfloat16, device=device)
    ids = torch.zeros(k, 1, dtype=torch.int32, device=device)  # every row to expert 0
    out, _ = _check(a, wq, pw, ids, 64, 1, device)
    assert_bitwise_equal(out, wq.select(0).dequantize().T.to(torch.bfloat16), "one-hot rows")


def test_pack_round_trip_and_profiles(gen):
    wq = INT4.quantize(torch.randn(2, 16, 96, generator=gen))
    pw = pack_w4a16(wq)
    assert pw.k_padded == 256
    u = unpack_w4a16(pw)
    assert_bitwise_equal(u.codes, wq.codes, "codes")
    assert_bitwise_equal(u.scales, wq.scales, "scales")
    # from compressed-tensors tensors directly
    ct = INT4.pack(wq)
    assert_bitwise_equal(pack_w4a16(ct["weight_packed"], ct["weight_scale"]).qweight, pw.qweight, "from checkpoint")
    with pytest.raises(FormatError, match="contiguous"):
        pack_w4a16(wq, profile="contiguous").check("indexed")


def test_pack_refuses_scales_the_kernels_cannot_reproduce(gen):
    """`pack_w4a16` keeps scales to 0 or magnitudes in `SCALE_RANGE` (the register-A kernels'
    exact dequantization, `lowbit.kernels.w4a16.int4`) and finite; the range's edges themselves are accepted."""
    from lowbit.formats.w4a16 import SCALE_RANGE

    wq = INT4.quantize(torch.randn(2, 16, 64, generator=gen))
    lo, hi = SCALE_RANGE
    for ok in (0.0, lo, -lo, hi * (1 - 2 ** -8)):
        s = wq.scales.clone()
        s[1, 3, 1] = ok
        pack_w4a16(wq.codes, s)
    for bad, why in ((lo / 2, "magnitude"), (-hi, "magnitude"), (float("inf"), "finite"), (float("nan"), "finite")):
        s = wq.scales.clone()
        s[0, 5, 0] = bad
        with pytest.raises(FormatError, match=why):
            pack_w4a16(wq.codes, s)


def test_bad_input(gen, device):
    wq, pw, a, ids = _problem(3, 32, 256, 4, 2, gen, device)
    r = routing.moe_align_block_size(ids, 16, 3)
    args = (r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, 2)
    with pytest.raises(TypeError, match="bf16"):
        w4a16_indexed(a.float(), pw, *args)
    with pytest.raises(ValueError, match="K="):
        w4a16_indexed(a[:, :128].contiguous(), pw, *args)
    with pytest.raises(TypeError, match="int32"):
        w4a16_indexed(a, pw, r.sorted_token_ids.long(), *args[1:])
    with pytest.raises(ValueError, match="block size"):
        w4a16_indexed(a, pw, *args, config=w4a16_indexed_config(8, 3, 32, 256, block_m=64))
    with pytest.raises(FormatError, match="masked"):
        w4a16_indexed(a, pack_w4a16(wq, profile="masked").to(device), *args)
    r24 = routing.moe_align_block_size(ids, 24, 3)  # a block size no engine has a tile for
    with pytest.raises(ValueError, match="block_m=24"):
        w4a16_indexed(a, pw, r24.sorted_token_ids, r24.expert_ids, r24.num_tokens_post_padded, 2)
    with pytest.raises(FormatError, match="group"):
        pack_w4a16(wq.codes, torch.ones(3, 32, 4, dtype=torch.bfloat16))  # group 64 scales
    with pytest.raises(FormatError, match="uint8"):
        pack_w4a16(wq.codes.float(), wq.scales)


@pytest.mark.gpu
def test_cuda_graph_decode_gate_up_and_down(gen):
    """Capture routing + gate_up + down for a decode shape; replay with new routing."""
    e, h, inter, t, top_k = 8, 256, 128, 4, 2
    w13 = INT4.quantize(torch.randn(e, 2 * inter, h, generator=gen) * 0.05)
    w2 = INT4.quantize(torch.randn(e, h, inter, generator=gen) * 0.05)
    p13, p2 = pack_w4a16(w13).to("cuda"), pack_w4a16(w2).to("cuda")
    hidden = torch.randn(t, h, generator=gen).to(torch.bfloat16).cuda()
    ids = random_topk_ids(t, top_k, e, generator=gen).cuda()
    block = w4a16_indexed_config(t * top_k, e, 2 * inter, h).block_m

    def step():
        r = routing.moe_align_block_size(ids, block, e)
        gu = w4a16_indexed(hidden, p13, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k)
        act = (torch.nn.functional.silu(gu[:, :inter].float()) * gu[:, inter:].float()).to(torch.bfloat16)
        return w4a16_indexed(act, p2, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, 1)

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = step()
    for _ in range(3):
        ids.copy_(random_topk_ids(t, top_k, e, generator=gen).cuda())
        graph.replay()
        torch.cuda.synchronize()
        ones = torch.ones(t, top_k, device="cuda")
        got = routing.combine_routes(y, torch.arange(t * top_k, dtype=torch.int32, device="cuda"), ones)
        want = reference.moe_experts_ref(hidden.cpu(), ids.cpu(), ones.cpu(), w13, w2, round_intermediate=True)
        assert_close(got.cpu(), want, "bf16_chain", "graph replay")


def test_heuristics_memo_env_overrides_and_show_config(monkeypatch):
    import subprocess
    import sys

    base = w4a16_indexed_config(160, 48, 4096, 7168)
    assert base.block_m == 16 and base is w4a16_indexed_config(160, 48, 4096, 7168), "memoized"
    monkeypatch.setenv("LOWBIT_W4A16_BLOCK_N", "128")
    over = w4a16_indexed_config(160, 48, 4096, 7168)
    assert over.block_n == 128 and "LOWBIT_W4A16_BLOCK_N=128" in over.reason, "override is part of the key"
    monkeypatch.delenv("LOWBIT_W4A16_BLOCK_N")
    assert w4a16_indexed_config(160, 48, 4096, 7168) is base
    assert w4a16_indexed_config(2048, 48, 4096, 7168).block_m == 64  # prefill tile
    # split-K only on the thin one-token EP8 grid (measured faster there, slower at 4 tokens)
    one_tok = w4a16_indexed_config(8, 48, 4096, 7168)
    assert one_tok.split_k == 2 and "K shares" in one_tok.reason
    assert w4a16_indexed_config(32, 48, 4096, 7168).split_k == 1 and base.split_k == 1
    monkeypatch.setenv("LOWBIT_W4A16_SPLIT_K", "1")
    assert w4a16_indexed_config(8, 48, 4096, 7168).split_k == 1
    monkeypatch.delenv("LOWBIT_W4A16_SPLIT_K")
    res = subprocess.run([sys.executable, "-m", "lowbit", "show-config"], capture_output=True, text=True)
    assert res.returncode == 0 and "EP8 20 tok gate_up" in res.stdout and "block_m=16" in res.stdout


@pytest.mark.parametrize("split", [2, 3])
def test_split_k_matches_reference_and_leaves_unrouted_rows(split, gen, device):
    """Split-K (LOWBIT_W4A16_SPLIT_K): FP32 shares reduced in a fixed order; with 3 shares of
    2 K tiles one program has an empty range. Remote/dropped routes keep the poison."""
    e = 5
    wq, pw, a, ids = _problem(e, 72, 512, 9, 2, gen, device)
    ids.view(-1)[::4] = -1
    tw = random_topk_weights(9, 2, generator=gen).to(device)
    r = routing.moe_align_block_size(ids, 16, e)
    cfg = replace(w4a16_indexed_config(ids.numel(), e, pw.n, pw.k, block_m=16), split_k=split)
    out = poison_(torch.empty(ids.numel(), pw.n, dtype=torch.bfloat16, device=device))
    w4a16_indexed(a, pw, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, 2,
                  topk_weights=tw, out=out, config=cfg)
    ref = reference.w4a16_indexed_ref(a.cpu(), wq, r.sorted_token_ids.cpu(), r.expert_ids.cpu(),
                                      r.num_tokens_post_padded.cpu(), 2, tw.cpu())
    dropped = (ids.flatten() < 0).cpu()
    assert (out.cpu()[dropped].float() > 1e30).all()
    assert_close(out.cpu()[~dropped].float(), ref[~dropped], "bf16_out", f"split_k={split}")


@pytest.mark.sm90
@pytest.mark.parametrize("split", [2, 3, 4])
@pytest.mark.parametrize("tile", INDEXED_SPLIT_TILES, ids=lambda t: "x".join(map(str, t)))
def test_gluon_rs_split_k_matches_reference(tile, split, gen):
    """K shares on the register-A kernel (every tile of `INDEXED_SPLIT_TILES`): K of 5 and 9
    steps (unequal shares, up to 4 of 5 steps; K off the step), one token, N off the tile, a hot expert
    with routing weights and over-allocated buffers, remote experts and dropped routes (poison
    kept)."""
    block, cfg = tile[1], _rs(tile)
    for e, n, k, t, top_k in ((4, 80, 1056, 5, 2), (6, 64, 2304, 1, 4), (3, 200, 1120, 40, 2)):
        wq, pw, a, ids = _problem(e, n, k, t, top_k, gen, "cuda")
        out, ref = _check(a, wq, pw, ids, block, top_k, "cuda", split_k=split, config=cfg)
        assert_close(out.float(), ref, "bf16_out", f"E{e} N{n} K{k} T{t} split {split}")
    wq, pw, a, ids = _problem(5, 48, 2304, 24, 2, gen, "cuda", hot=1)
    tw = random_topk_weights(24, 2, generator=gen).cuda()
    out, ref = _check(a, wq, pw, ids, block, 2, "cuda", topk_weights=tw, over_alloc=3, split_k=split,
                      config=cfg)
    assert_close(out.float(), ref, "bf16_out", f"hot expert, weights, over-allocated, split {split}")
    wq, pw, a, ids = _problem(6, 40, 1280, 9, 2, gen, "cuda")
    ids.view(-1)[::5] = -1
    emap = torch.tensor([-1, -1, 0, 1, 2, 3], dtype=torch.int32, device="cuda")
    wq_local = INT4.quantize(wq.dequantize()[2:], wq.scales[2:])
    out, ref = _check(a, wq_local, pack_w4a16(wq_local).to("cuda"), ids, block, 2, "cuda", emap=emap, split_k=split,
                      config=cfg)
    untouched = ids.flatten().cpu() < 2
    assert (out[untouched].float() > 1e30).all(), "rows of remote/dropped routes must keep the poison"
    assert_close(out[~untouched].float(), ref[~untouched], "bf16_out", f"EP map, split {split}")


def test_gluon_split_k_contract(gen, monkeypatch):
    """K shares run on the register-A kernel's main loop only, none of them empty: a split on the
    warp-specialized or shared-memory engine, on a one-step K, or with more shares than steps
    is refused before any launch (on any device)."""
    wq, pw, a, ids = _problem(3, 64, 512, 4, 2, gen, "cpu")
    r = routing.moe_align_block_size(ids, 8, 3)
    rs = replace(w4a16_indexed_config(8, 3, 64, 512, block_m=8, gluon=True), engine="gluon_rs", block_n=64,
                 num_warps=4, num_stages=3)
    for bad in (replace(rs, split_k=3), replace(rs, engine="gluon", num_stages=3, split_k=2)):
        with pytest.raises(ValueError, match="split-K only on gluon_rs"):
            w4a16_indexed(a, pw, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, 2, config=bad)
    r16 = routing.moe_align_block_size(ids, 128, 3)
    ws = replace(rs, engine="gluon_ws", block_m=128, block_n=128, num_warps=8, num_stages=2, split_k=2)
    with pytest.raises(ValueError, match="split-K only on gluon_rs"):
        w4a16_indexed(a, pw, r16.sorted_token_ids, r16.expert_ids, r16.num_tokens_post_padded, 2, config=ws)
    # the heuristics never keep a split the kernel cannot run (one K step: the N-loop tile)
    monkeypatch.setenv("LOWBIT_W4A16_SPLIT_K", "2")
    assert w4a16_indexed_config(160, 384, 7168, 256, gluon=True).split_k == 1
    c = w4a16_indexed_config(8, 48, 4096, 7168, gluon=True)
    assert (c.engine, c.split_k) == ("gluon_rs", 2) and "K in 2 shares" in c.reason, c


def test_split_k_is_indexed_only(gen, device):
    from lowbit.kernels.w4a16.grouped import contiguous

    wq = INT4.quantize(torch.randn(2, 32, 256, generator=gen) * 0.05)
    pc = pack_w4a16(wq, profile="contiguous").to(device)
    a2 = torch.randn(128, 256, generator=gen).to(torch.bfloat16).to(device)
    m_idx = torch.zeros(128, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="split-K"):
        contiguous(a2, pc, m_idx, config=replace(tile_config(64, "t"), split_k=2))


@pytest.mark.parametrize("block", BLOCKS)
def test_tiles_with_n_off_16(block, gen, device):
    """Every validated tile at every pipeline depth it can be given, N off 16 (37, 200): Triton
    3.6 miscompiles the 64x64 tile at 2-3 stages there (relative error ~1 on the H200), and
    `avoid_miscompile` must route around it (on the GPU; the interpreter has no stages)."""
    stages = (1, 2, 3, 4) if device == "cuda" else (tile_config(block, "").num_stages,)
    for n in (37, 200):
        wq, pw, a, ids = _problem(3, n, 288, 12, 2, gen, device)
        r = routing.moe_align_block_size(ids, block, 3)
        ref = reference.w4a16_indexed_ref(a.cpu(), wq, r.sorted_token_ids.cpu(), r.expert_ids.cpu(),
                                          r.num_tokens_post_padded.cpu(), 2)
        for st in stages:
            out = poison_(torch.empty(ids.numel(), n, dtype=torch.bfloat16, device=device))
            w4a16_indexed(a, pw, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, 2, out=out,
                          config=replace(tile_config(block, "test"), num_stages=st))
            assert_close(out.cpu().float(), ref, "bf16_out", f"N={n} stages={st}")
    assert w4a16_indexed_config(24, 3, 200, 288, block_m=64).num_stages == 1


def test_gluon_default_for_decode(monkeypatch):
    """With `gluon=True` (an sm_90 GPU, N % 8 == 0, aligned rows) the register-A Gluon kernel is
    the default at every tok_e (it measured faster everywhere): for EP the 8-row routing block up
    to tok_e 4 (the group-loop tile, or its 3-stage step-loop alternative where the grid is
    thin: one token's gate_up), the 16-row block up to tok_e 12 (from tok_e 0 for TP; its
    group-loop tile unless the grid is thin), the 32-row block (its 128x32 group loop) up to 22,
    the 64-row block from there (the one-warpgroup 128x64 with its half tail), the 128-row
    block past tok_e 90 (its half-empty blocks on the 64-row tile, said in the reason) except for
    tok_e 115-200 with K past one step (the 64-row block again). A one-step K (TP8 down) runs the
    block's N-loop tile. A routing block fixed by the caller stays; 8- and 128-row
    blocks exist only on the Gluon kernel; an engine override wins. These are the in-kernel
    gather's choices (``LOWBIT_W4A16_PREGATHER=0``); the pre-gathered prefill defaults:
    `test_pregather_heuristic_override_and_contract`."""
    monkeypatch.setenv("LOWBIT_W4A16_PREGATHER", "0")

    # EP8 1 / 1 / 4 / 20 tokens; the 20-token down (8 K steps, a full grid) on 128 weight rows
    for routes, n, k, stages, rows in ((8, 4096, 7168, 3, 64), (8, 7168, 2048, 2, 64), (32, 4096, 7168, 2, 64),
                                       (160, 7168, 2048, 2, 128)):
        c = w4a16_indexed_config(routes, 48, n, k, gluon=True)
        assert (c.engine, c.block_m, c.block_n, c.num_stages, c.split_k) == ("gluon_rs", 8, rows, stages, 1), c
        assert (rows == 128) == ("128 weight rows on one warpgroup" in c.reason), c.reason
        assert ((64, 8, 4, stages) in GROUP_LOOP_MAXNREG) == ("the whole-step loop" not in c.reason), c.reason
        assert "K shares" not in c.reason, c.reason  # no split-K on the Gluon kernel
        assert w4a16_indexed_config(routes, 48, n, k).block_m == 16  # off Hopper: the Triton decode tile
    monkeypatch.setenv("LOWBIT_W4A16_NUM_STAGES", "2")  # a forced stage count beats the thin-grid rule
    assert w4a16_indexed_config(8, 48, 4096, 7168, gluon=True).num_stages == 2
    monkeypatch.delenv("LOWBIT_W4A16_NUM_STAGES")
    for routes in (256, 400):  # EP8 32 / 50 tokens: the 16-row block's group loop on 128 weight rows
        c = w4a16_indexed_config(routes, 48, 4096, 7168, gluon=True)
        assert (c.engine, c.block_m, c.block_n, c.num_warps, c.num_stages, c.split_k) == ("gluon_rs", 16, 128, 4, 2, 1), c
        assert c.block_m == w4a16_indexed_config(routes, 48, 4096, 7168).block_m
    monkeypatch.setenv("LOWBIT_W4A16_BLOCK_N", "64")  # forced weight rows keep the 64-row tile
    assert w4a16_indexed_config(256, 48, 4096, 7168, gluon=True).block_n == 64
    monkeypatch.delenv("LOWBIT_W4A16_BLOCK_N")
    c = w4a16_indexed_config(8, 384, 512, 7168, gluon=True)  # TP8 1 token: the 16-row block
    assert (c.engine, c.block_m, c.block_n) == ("gluon_rs", 16, 64), c
    c = w4a16_indexed_config(160, 384, 7168, 256, gluon=True)  # TP8 20 tokens, down: one K step
    assert (c.engine, c.block_m, c.block_n, c.num_warps) == ("gluon_rs", 16, 128, 8) and "N-loop" in c.reason, c
    c = w4a16_indexed_config(512, 48, 4096, 7168, gluon=True)  # EP8 64 tokens (tok_e 10.7): still 16 rows
    assert (c.engine, c.block_m, c.block_n) == ("gluon_rs", 16, 128), c
    c = w4a16_indexed_config(8192, 384, 512, 7168, gluon=True)  # TP8 1024 tokens (tok_e 21)
    assert (c.engine, c.block_m, c.block_n, c.num_warps, c.num_stages) == ("gluon_rs", 32, 128, 4, 2), c
    assert "128 weight rows on one warpgroup" in c.reason, c  # the 128x32 group loop
    c = w4a16_indexed_config(8192, 384, 7168, 256, gluon=True)  # ... whose one-step down runs the N loop
    assert (c.engine, c.block_m, c.block_n) == ("gluon_rs", 32, 128) and "N-loop" in c.reason, c
    c = w4a16_indexed_config(1024, 48, 4096, 7168, gluon=True)  # EP8 128 tokens (tok_e 21.3)
    assert (c.engine, c.block_m, c.block_n, c.num_warps) == ("gluon_rs", 32, 128, 4), c
    assert w4a16_indexed_config(1024, 48, 4096, 7168).engine == "triton"  # off Hopper
    # the blocks' edges: tok_e 21.3 / 24 / 85.3 / 96
    for routes, block in ((1024, 32), (1152, 64), (4096, 64), (4608, 128)):
        assert w4a16_indexed_config(routes, 48, 4096, 7168, gluon=True).block_m == block, routes
    for routes in (1280, 2048, 3072):  # EP8 160 / 256 / 384 tokens (tok_e 27 / 43 / 64): one warpgroup, 128 rows
        c = w4a16_indexed_config(routes, 48, 4096, 7168, gluon=True)
        assert (c.engine, c.block_m, c.block_n, c.num_warps, c.num_stages) == ("gluon_rs", 64, 128, 4, 2), c
        assert "runs the 32-row tile (H200 EP8 384 / 512" in c.reason, c  # its half-row tail (`RegisterATile.half_tail`)
        assert "refilled by halves" in c.reason, c  # `RegisterATile.half_acts`
    for routes in (5120, 20480):  # EP8 640 / 2560 tokens (tok_e 107 / 427): the 128-row block
        c = w4a16_indexed_config(routes, 48, 4096, 7168, gluon=True)
        assert (c.engine, c.block_m, c.block_n, c.num_warps) == ("gluon_rs", 128, 256, 16), c
        assert "runs the 64-row tile" in c.reason, c  # the half-row tail (`RegisterATile.half_tail`)
        assert "refilled by halves" not in c.reason, c
    # ... and the 64-row block again in its middle (`_PREFILL_64_RANGE`), K past one step: edges tok_e 115 / 200
    for routes, block in ((5520, 128), (5568, 64), (8192, 64), (9600, 64), (9648, 128), (17280, 128)):
        c = w4a16_indexed_config(routes, 48, 4096, 7168, gluon=True)
        assert c.block_m == block, (routes, c)
        if block == 64:
            assert (c.engine, c.block_n, c.num_warps) == ("gluon_rs", 128, 4) and "refilled by halves" in c.reason, c
    c = w4a16_indexed_config(65536, 384, 512, 7168, gluon=True)  # TP8 8192 tokens gate_up: the same
    assert (c.block_m, c.block_n) == (64, 128), c
    c = w4a16_indexed_config(65536, 384, 7168, 256, gluon=True)  # TP8 8192 tokens, down: one K step
    assert (c.engine, c.block_m, c.block_n, c.num_warps) == ("gluon_ws", 128, 128, 8) and "N-loop" in c.reason, c
    assert "runs the 64-row tile (H200 TP8" in c.reason, c  # its half-row tail (`RegisterATile.nloop_half_tail`)
    assert "28 weight tiles a program" in c.reason, c  # `nloop_n_tiles`
    c = w4a16_indexed_config(16384, 384, 7168, 256, gluon=True)  # TP8 2048 tokens: the 64-row block, no tail
    assert (c.block_m, c.block_n) == (64, 128) and "N-loop" in c.reason and "runs the" not in c.reason, c
    # ... the 128-row block past tok_e 48 (`_NLOOP_128_FROM`), the 32-row one up to 30 (`_NLOOP_32_UNTIL`)
    for routes, block in ((10240, 32), (11520, 32), (11904, 64), (18432, 64), (18816, 128), (32768, 128)):
        c = w4a16_indexed_config(routes, 384, 7168, 256, gluon=True)
        assert (c.block_m, c.block_n) == (block, 128) and "N-loop" in c.reason, (routes, c)
    assert w4a16_indexed_config(10240, 384, 512, 7168, gluon=True).block_m == 64  # gate_up: the table's 64 from 22
    assert w4a16_indexed_config(8192, 48, 4096, 7168).block_m == 64  # off Hopper: the Triton tile
    assert w4a16_indexed_config(8192, 48, 4096, 7168, block_m=64, gluon=True).block_n == 128
    monkeypatch.setenv("LOWBIT_W4A16_BLOCK_N", "256")  # the override picks the four-warpgroup tile
    c = w4a16_indexed_config(3072, 48, 4096, 7168, gluon=True)
    assert (c.engine, c.block_m, c.block_n, c.num_warps) == ("gluon_rs", 64, 256, 16), c
    monkeypatch.setenv("LOWBIT_W4A16_ENGINE", "gluon_ws")  # ... warp-specialized, with its tails
    c = w4a16_indexed_config(3072, 48, 4096, 7168, gluon=True)
    assert (c.engine, c.block_m, c.block_n, c.num_warps) == ("gluon_ws", 64, 256, 16), c
    assert "runs the 32-row tile (H200 EP8 384 tokens" in c.reason, c  # `RegisterATile.ws_tails`
    monkeypatch.delenv("LOWBIT_W4A16_ENGINE")
    monkeypatch.delenv("LOWBIT_W4A16_BLOCK_N")
    assert w4a16_indexed_config(2048, 48, 4096, 7168, block_m=16, gluon=True).engine == "triton"
    with pytest.raises(ValueError, match="block_m=128"):
        w4a16_indexed_config(8192, 48, 4096, 7168, block_m=128)
    monkeypatch.setenv("LOWBIT_W4A16_ENGINE", "triton")
    c = w4a16_indexed_config(8, 48, 4096, 7168, gluon=True)
    assert (c.engine, c.split_k) == ("triton", 2), c
