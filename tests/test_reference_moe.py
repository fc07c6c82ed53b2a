"""The W4A16 MoE references agree with each other (three routing layouts of one draw) and with a
naive per-route float64 loop; the one-hot activation test makes the GEMM return the weight."""

import pytest
import torch
import torch.nn.functional as F

from lowbit import reference, routing
from lowbit.formats import get_format
from lowbit.testing import assert_close, random_topk_ids, random_topk_weights

INT4 = get_format("int4_g32")


def _weights(e, n, k, gen):
    return INT4.quantize(torch.randn(e, n, k, generator=gen) * 0.05)


def _naive_route(a_row, w, e):
    return a_row.double() @ w.select(e).dequantize().double().T


@pytest.mark.parametrize("t, k, e, n, kdim", [(1, 2, 4, 48, 64), (9, 3, 6, 40, 96), (16, 4, 8, 32, 32)])
def test_three_layouts_agree(t, k, e, n, kdim, gen):
    w = _weights(e, n, kdim, gen)
    a = torch.randn(t, kdim, generator=gen).to(torch.bfloat16)
    ids = random_topk_ids(t, k, e, generator=gen)
    tw = random_topk_weights(t, k, generator=gen)
    # naive: one route at a time, float64
    naive = torch.stack([_naive_route(a[r // k], w, int(ids.flatten()[r])) for r in range(t * k)])

    ir = routing.moe_align_block_size(ids, 16, e, backend="torch")
    y_idx = reference.w4a16_indexed_ref(a, w, ir.sorted_token_ids, ir.expert_ids, ir.num_tokens_post_padded, k)
    assert_close(y_idx, naive, "fp32", "indexed")
    y_w = reference.w4a16_indexed_ref(a, w, ir.sorted_token_ids, ir.expert_ids, ir.num_tokens_post_padded, k, tw)
    assert_close(y_w, naive * tw.flatten()[:, None].double(), "fp32", "indexed * topk_weights")

    cr = routing.build_contiguous(ids, e, backend="torch")
    a2 = routing.gather_rows(a, cr.row_to_route, k)
    y_c = reference.w4a16_contiguous_ref(a2, w, cr.m_indices)
    assert (y_c[cr.m_indices < 0] == 0).all()
    assert_close(y_c[cr.route_to_row.long()], naive, "fp32", "contiguous")

    mr = routing.build_masked(ids, e, t, backend="torch")
    a3 = routing.gather_rows(a, mr.row_to_route, k).view(e, t, kdim)
    y_m = reference.w4a16_masked_ref(a3, w, mr.masked_m)
    assert torch.equal(y_m, reference.w4a16_masked_ref(a3.view(e * t, kdim), w, mr.masked_m)), "3-D == flat"
    assert_close(y_m[mr.route_to_row.long()], naive, "fp32", "masked")


def test_indexed_skips_remote_blocks_and_sentinels(gen):
    t, k, e = 12, 2, 6
    w = _weights(e, 32, 64, gen)
    a = torch.randn(t, 64, generator=gen).to(torch.bfloat16)
    ids = random_topk_ids(t, k, e, generator=gen)
    emap = torch.tensor([-1, -1, -1, 0, 1, 2], dtype=torch.int32)  # experts 0-2 remote
    ir = routing.moe_align_block_size(ids, 8, e, emap, backend="torch")
    w_local = INT4.quantize(w.dequantize()[3:], w.scales[3:])
    y = reference.w4a16_indexed_ref(a, w_local, ir.sorted_token_ids, ir.expert_ids, ir.num_tokens_post_padded, k)
    remote = ids.flatten() < 3
    assert (y[remote] == 0).all()
    local_rows = (~remote).nonzero().flatten()
    want = torch.stack([_naive_route(a[r // k], w, int(ids.flatten()[r])) for r in local_rows.tolist()])
    assert_close(y[local_rows], want, "fp32", "local routes")


def test_one_hot_activations_return_the_weight(gen):
    """a = rows of eye(K): the GEMM output is the dequantized weight itself, exactly."""
    e, n, kdim = 3, 40, 64
    w = _weights(e, n, kdim, gen)
    a = torch.eye(kdim, dtype=torch.bfloat16)
    masked_m = torch.tensor([kdim, 0, kdim], dtype=torch.int32)  # expert 1 empty
    y = reference.w4a16_masked_ref(a.repeat(e, 1), w, masked_m).view(e, kdim, n)
    for g in (0, 2):
        assert torch.equal(y[g], w.select(g).dequantize().T)
    assert (y[1] == 0).all()


def test_moe_block_matches_naive_loop(gen):
    t, e, k, hdim, inter = 7, 8, 2, 64, 32
    w13 = _weights(e, 2 * inter, hdim, gen)
    w2 = _weights(e, hdim, inter, gen)
    hidden = torch.randn(t, hdim, generator=gen).to(torch.bfloat16)
    logits = torch.randn(t, e, generator=gen)
    out = reference.moe_block_ref(hidden, logits, w13, w2, k)
    p = logits.double().softmax(-1)
    want = torch.zeros(t, hdim, dtype=torch.float64)
    for i in range(t):
        top = p[i].topk(k)
        for wt, ex in zip((top.values / top.values.sum()).tolist(), top.indices.tolist()):
            gu = hidden[i].double() @ w13.select(ex).dequantize().double().T
            act = F.silu(gu[:inter]) * gu[inter:]
            want[i] += wt * (act @ w2.select(ex).dequantize().double().T)
    assert_close(out, want, "fp32", "moe block")
    # rounding the intermediate to bf16 (what a kernel pipeline stores) stays within bf16 budgets
    assert_close(reference.moe_block_ref(hidden, logits, w13, w2, k, round_intermediate=True), want, "bf16_out")


def test_router_topk(gen):
    logits = torch.randn(5, 16, generator=gen)
    w, ids = reference.router_topk_ref(logits, 4)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    torch.testing.assert_close(w.sum(-1), torch.ones(5))
    assert torch.equal(ids.long(), logits.topk(4).indices)
