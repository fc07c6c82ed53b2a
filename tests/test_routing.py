"""Routing layouts: device builders (Triton; interpreter on the CPU tier) bit-equal to the
PyTorch reference, plus the layout invariants checked directly on the reference."""

import pytest
import torch

from lowbit import routing
from lowbit.testing import POISON_BF16, assert_bitwise_equal, poison_, random_topk_ids


# (T, top_k, num_experts, block_size): each comment names the edge the case covers
CASES = [
    (1, 8, 48, 16),     # one token (decode M=1)
    (20, 8, 48, 64),    # EP8 decode, 20 tokens
    (3, 1, 5, 4),       # top_k=1, tiny expert count, T*k < block
    (37, 2, 7, 8),      # prime expert count, routes not a multiple of the chunk
    (300, 8, 48, 64),   # several chunks (2400 routes), several blocks per expert
    (130, 6, 384, 16),  # 384 experts (TP8 profile), most experts empty
]
INDEXED_FIELDS = ("sorted_token_ids", "expert_ids", "num_tokens_post_padded")
CONTIG_FIELDS = ("m_indices", "row_to_route", "route_to_row", "num_rows")
MASKED_FIELDS = ("masked_m", "row_to_route", "route_to_row", "num_dropped")


def _expert_map(num_experts, device):
    """EP-style map: the upper half of the experts is local (ids 0..), the lower half remote."""
    m = torch.full((num_experts,), -1, dtype=torch.int32)
    half = num_experts // 2
    m[half:] = torch.arange(num_experts - half, dtype=torch.int32)
    return m.to(device)


def _draw(case, gen, device, variant):
    t, k, e, _ = case
    ids = random_topk_ids(t, k, e, generator=gen)
    if variant == "hot":  # all tokens on one expert
        ids = random_topk_ids(t, k, e, generator=gen, hot_expert=0)
    elif variant == "dropped":  # -1 sentinels and out-of-range ids are dropped routes
        ids.view(-1)[:: 3] = -1
        ids.view(-1)[1] = e + 5
    return ids.to(device)


def _same(a, b, fields):
    for f in fields:
        assert_bitwise_equal(getattr(a, f), getattr(b, f), f)


@pytest.mark.parametrize("variant", ["random", "hot", "dropped"])
@pytest.mark.parametrize("use_map", [False, True], ids=["no_map", "expert_map"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "T{}_k{}_E{}_B{}".format(*c))
def test_device_builders_match_reference(case, use_map, variant, gen, device, monkeypatch):
    """Each layout's device builder against the reference; the indexed one on both its paths
    (one launch up to `SMALL_ROUTES` routes, the four-launch counting sort beyond)."""
    from lowbit.routing import kernels as moe_routing

    t, k, e, block = case
    ids = _draw(case, gen, device, variant)
    emap = _expert_map(e, device) if use_map else None
    g = (e - e // 2) if use_map else e
    want = routing.moe_align_block_size(ids, block, e, emap, backend="torch")
    _same(routing.moe_align_block_size(ids, block, e, emap, backend="triton"), want, INDEXED_FIELDS)
    small = t * k <= moe_routing.SMALL_ROUTES
    monkeypatch.setattr(moe_routing, "SMALL_ROUTES", 0 if small else t * k)  # the other path
    _same(routing.moe_align_block_size(ids, block, e, emap, backend="triton"), want, INDEXED_FIELDS)
    monkeypatch.undo()
    _same(routing.build_contiguous(ids, e, emap, num_local_experts=g, backend="triton"),
          routing.build_contiguous(ids, e, emap, num_local_experts=g, backend="torch"), CONTIG_FIELDS)
    max_m = t * k  # never overflows
    _same(routing.build_masked(ids, e, max_m, emap, num_local_experts=g, backend="triton"),
          routing.build_masked(ids, e, max_m, emap, num_local_experts=g, backend="torch"), MASKED_FIELDS)


@pytest.mark.parametrize("case", CASES[:5], ids=lambda c: "T{}_k{}_E{}_B{}".format(*c))
def test_indexed_invariants(case, gen, device):
    t, k, e, block = case
    ids = _draw(case, gen, "cpu", "dropped")
    emap = _expert_map(e, "cpu")
    r = routing.moe_align_block_size(ids.to(device), block, e, emap.to(device))
    sorted_ids, expert_ids = r.sorted_token_ids.cpu(), r.expert_ids.cpu()
    ntpp = int(r.num_tokens_post_padded.item())
    n = t * k
    assert sorted_ids.numel() == routing.max_num_tokens_padded(n, e, block)
    assert ntpp % block == 0
    flat = ids.flatten()
    valid_routes = ((flat >= 0) & (flat < e)).nonzero().flatten()
    body = sorted_ids[:ntpp]
    real = body[body < n]
    # every valid route exactly once, nothing else
    assert torch.equal(real.sort().values, valid_routes.to(torch.int32))
    assert (sorted_ids[ntpp:] == n).all(), "sentinel past the padded count"
    # each block holds one expert's routes; its id is that expert's local id (-1 if remote)
    for b in range(ntpp // block):
        blk = body[b * block:(b + 1) * block]
        routes = blk[blk < n].long()
        assert routes.numel() > 0, "no block is all padding"
        experts = flat[routes].unique()
        assert experts.numel() == 1
        assert expert_ids[b] == emap[experts[0]]
    assert (expert_ids[ntpp // block:] == -1).all()
    # so the indexed kernels' grid (`live_block_bound` row blocks) covers every live block
    assert ntpp // block <= routing.live_block_bound(expert_ids.numel(), n)
    # padding per expert < block
    counts = torch.bincount(flat[valid_routes].long(), minlength=e)
    assert ntpp == int(((counts + block - 1) // block * block).sum())


@pytest.mark.parametrize("case", CASES[:5], ids=lambda c: "T{}_k{}_E{}_B{}".format(*c))
def test_contiguous_and_masked_invariants(case, gen, device):
    t, k, e, _ = case
    ids = _draw(case, gen, "cpu", "random")
    emap = _expert_map(e, "cpu")
    g = e - e // 2
    c = routing.build_contiguous(ids.to(device), e, emap.to(device), num_local_experts=g)
    m_idx, r2r, rt = c.m_indices.cpu(), c.row_to_route.cpu(), c.route_to_row.cpu()
    rows = int(c.num_rows.item())
    assert rows % 128 == 0 and m_idx.numel() == routing.max_contiguous_rows(t * k, g)
    local = emap[ids.flatten().long()]
    # rows <-> routes are inverse maps over the local routes
    assert torch.equal((rt >= 0), local >= 0)
    held = rt[rt >= 0].long()
    assert torch.equal(r2r[held], (rt >= 0).nonzero().flatten().to(torch.int32))
    assert torch.equal(m_idx[held], local[rt >= 0])
    assert ((m_idx == -1) == (r2r == -1)).all()
    assert (m_idx[rows:] == -1).all()
    for blk in m_idx[:rows].view(-1, 128):  # one expert per 128-row block
        assert blk[blk >= 0].unique().numel() == 1
    # masked: expert g's rows start at g*max_m, masked_m counts them, -1 after
    max_m = 64 if t * k > 64 else t * k
    if torch.bincount(local[local >= 0].long(), minlength=g).max() <= max_m:
        mk = routing.build_masked(ids.to(device), e, max_m, emap.to(device), num_local_experts=g)
        mm, r2r = mk.masked_m.cpu(), mk.row_to_route.cpu().view(g, max_m)
        assert torch.equal(mm, torch.bincount(local[local >= 0].long(), minlength=g).to(torch.int32))
        for grp in range(g):
            assert (r2r[grp, : mm[grp]] >= 0).all() and (r2r[grp, mm[grp]:] == -1).all()
            assert (local[r2r[grp, : mm[grp]].long()] == grp).all()


def test_masked_overflow(gen, device):
    ids = random_topk_ids(40, 4, 8, generator=gen, hot_expert=2).to(device)  # expert 2 gets 40 routes
    with pytest.raises(ValueError, match="max_m"):
        routing.build_masked(ids, 8, 16, backend="torch")
    r = routing.build_masked(ids, 8, 16, backend="triton")
    assert int(r.masked_m[2]) == 16
    assert int(r.num_dropped.item()) == int((torch.bincount(ids.flatten().long().cpu(), minlength=8) - 16).clamp(min=0).sum())


def test_gather_and_combine_roundtrip(gen, device):
    t, k, e, hdim = 9, 3, 6, 16
    ids = random_topk_ids(t, k, e, generator=gen).to(device)
    w = torch.rand(t, k, generator=gen).to(device)
    hidden = torch.randn(t, hdim, generator=gen).to(device)
    c = routing.build_contiguous(ids, e)
    a2 = routing.gather_rows(hidden, c.row_to_route, k)
    assert (a2[c.row_to_route < 0] == 0).all()
    # identity "expert": combine(gather(x)) == x * sum(weights)
    out = routing.combine_routes(a2, c.route_to_row, w)
    torch.testing.assert_close(out, hidden * w.sum(1, keepdim=True), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("block", [32, 64, 128])
def test_gather_indexed_rows_fills_the_route_slots_only(block, gen, device):
    """`gather_indexed_rows`: slot s of a live block gets row ``sorted_ids[s] // top_k`` of `a`
    (as `routing.gather_rows`, the torch form, gathers); sentinel slots, remote-expert (``-1``)
    blocks and an over-allocated buffer's blocks past the device-side count keep the poison. K
    is off the kernel's 256-column tile."""
    from lowbit.routing.kernels import gather_indexed_rows

    t, k, e, hdim = 37, 4, 6, 96 + 8
    ids = random_topk_ids(t, k, e, generator=gen).to(device)
    emap = torch.tensor([0, -1, 1, 2, -1, 3], dtype=torch.int32, device=device)  # experts 1 and 4 remote
    r = routing.moe_align_block_size(ids, block, e, emap)
    routes = ids.numel()
    sorted_ids = torch.cat([r.sorted_token_ids, torch.full((2 * block,), routes, dtype=torch.int32, device=device)])
    expert_ids = torch.cat([r.expert_ids, torch.zeros(2, dtype=torch.int32, device=device)])  # over-allocated
    a = torch.randn(t, hdim, generator=gen).to(torch.bfloat16).to(device)
    out = poison_(torch.empty(sorted_ids.numel(), hdim, dtype=torch.bfloat16, device=device))
    assert gather_indexed_rows(a, sorted_ids, expert_ids, r.num_tokens_post_padded, k, out=out) is out
    slot = torch.arange(sorted_ids.numel(), device=device)
    live = ((slot < r.num_tokens_post_padded) & (expert_ids.repeat_interleave(block) >= 0)
            & (sorted_ids < routes)).cpu()
    assert live.any() and (~live).any()
    want = routing.gather_rows(a, torch.where(sorted_ids < routes, sorted_ids, -1), k).cpu()
    assert_bitwise_equal(out.cpu()[live], want[live], "gathered route slots")
    assert (out.cpu()[~live] == POISON_BF16).all(), "slots without a live route must keep the poison"
    with pytest.raises(ValueError, match="multiple of 32"):
        r16 = routing.moe_align_block_size(ids, 16, e)
        gather_indexed_rows(a, r16.sorted_token_ids, r16.expert_ids, r16.num_tokens_post_padded, k)
    with pytest.raises(ValueError, match="out must be"):
        gather_indexed_rows(a, sorted_ids, expert_ids, r.num_tokens_post_padded, k, out=out[:, :64])


@pytest.mark.parametrize("bad, err, match", [
    (lambda ids: ids.long(), TypeError, "int32"),
    (lambda ids: ids.flatten(), ValueError, "2-D"),
    (lambda ids: ids.float(), TypeError, "int32"),
])
def test_bad_topk_ids(bad, err, match, gen):
    ids = random_topk_ids(4, 2, 8, generator=gen)
    with pytest.raises(err, match=match):
        routing.moe_align_block_size(bad(ids), 16, 8)
    with pytest.raises(err, match=match):
        routing.build_contiguous(bad(ids), 8)
    with pytest.raises(err, match=match):
        routing.build_masked(bad(ids), 8, 16)


def test_bad_arguments(gen):
    ids = random_topk_ids(4, 2, 8, generator=gen)
    with pytest.raises(ValueError, match="block_size"):
        routing.moe_align_block_size(ids, 0, 8)
    with pytest.raises(ValueError, match="expert_map"):
        routing.moe_align_block_size(ids, 16, 8, torch.zeros(7, dtype=torch.int32))
    with pytest.raises(ValueError, match="backend"):
        routing.moe_align_block_size(ids, 16, 8, backend="cuda")
    with pytest.raises(ValueError, match="max_m"):
        routing.build_masked(ids, 8, 0)


@pytest.mark.gpu
def test_indexed_routing_cuda_graph_replay(gen):
    """Capture the device builder once; replay it on new routing: no host readback inside."""
    t, k, e, block = 20, 8, 48, 64
    ids = random_topk_ids(t, k, e, generator=gen).cuda()
    routing.moe_align_block_size(ids, block, e)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = routing.moe_align_block_size(ids, block, e)
    for _ in range(3):
        ids.copy_(random_topk_ids(t, k, e, generator=gen).cuda())
        graph.replay()
        _same(out, routing.moe_align_block_size(ids, block, e, backend="torch"), INDEXED_FIELDS)
