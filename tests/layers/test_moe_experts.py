"""`lowbit.moe_experts` (the expert part of a MoE block on one set of prepared weights, on the
output-centric or the indexed path) and its elementwise kernels (`silu_mul`, `combine_topk`)
against the FP32 reference: both paths on the same routing edges, the automatic choice, bad
input; on the GPU, Kimi-like shapes and a CUDA-graph replay."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from lowbit import moe_experts, reference, routing
from lowbit.formats import get_format
from lowbit.formats.w4a16 import pack_w4a16
from lowbit.kernels.moe_elementwise import combine_topk, silu_mul
from lowbit.kernels.w4a16.indexed import w4a16_indexed
from lowbit.layers.moe import OUTPUT_CENTRIC_MAX_TOKENS, indexed_configs, moe_experts_path
from lowbit.runtime.pdl import ENV as PDL_ENV
from lowbit.runtime.pdl import launch_options, pdl_enabled
from lowbit.testing import (
    POISON_BF16,
    assert_bitwise_equal,
    assert_close,
    poison_,
    random_topk_ids,
    random_topk_weights,
)

from helpers import moe_edge_routing, moe_expert_weights

INT4 = get_format("int4_g32")


def _int4(e, h, inter, gen, device):
    """(w13, w2 packed for the indexed profile; the logical weights for the reference, on
    `device`: the GPU tests' Kimi-sized weights are quantized and referenced there)."""
    q13 = INT4.quantize((torch.randn(e, 2 * inter, h, generator=gen) * 0.05).to(device))
    q2 = INT4.quantize((torch.randn(e, h, inter, generator=gen) * 0.05).to(device))
    return pack_w4a16(q13).to(device), pack_w4a16(q2).to(device), q13, q2


@pytest.mark.parametrize("path", ["output_centric", "indexed"])
def test_paths_match_reference_with_routing_edges(path, gen, device):
    # E=6, H=160, I=96: not multiples of any tile; M=6 tokens share experts
    e, h, inter, m, k = 6, 160, 96, 6, 3
    w13, w2, q13, q2 = _int4(e, h, inter, gen, device)
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16)
    ids, tw, ref_ids = moe_edge_routing(m, k, e, gen)
    out = poison_(torch.empty(m, h, dtype=torch.bfloat16, device=device))
    res = moe_experts(hidden.to(device), ids.to(device), tw.to(device), w13, w2, out=out, path=path)
    assert res is out
    ref = reference.moe_experts_ref(hidden, ref_ids, tw, q13, q2, round_intermediate=True)
    assert_close(out.cpu().float(), ref, "bf16_chain", f"{path} vs FP32 of the quantized weights")


def test_auto_path_single_token_and_all_on_one_expert(gen, device):
    """M=1 and a batch past the crossover take the auto path's choice (every token's slots on
    the same two experts: the others get nothing) and match the reference."""
    e, h, inter, k = 4, 96, 64, 2
    w13, w2, q13, q2 = _int4(e, h, inter, gen, device)
    for m in (1, OUTPUT_CENTRIC_MAX_TOKENS + 3):
        hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16)
        ids = torch.tensor([[2, 0]] * m, dtype=torch.int32)
        tw = random_topk_weights(m, k, generator=gen)
        out = moe_experts(hidden.to(device), ids.to(device), tw.to(device), w13, w2)
        ref = reference.moe_experts_ref(hidden, ids, tw, q13, q2, round_intermediate=True)
        assert_close(out.cpu().float(), ref, "bf16_chain", f"auto, {m} tokens ({moe_experts_path(m)[0]})")


def test_path_choice_and_override(monkeypatch):
    if OUTPUT_CENTRIC_MAX_TOKENS >= 1:
        assert moe_experts_path(1)[0] == "output_centric"
        assert moe_experts_path(OUTPUT_CENTRIC_MAX_TOKENS)[0] == "output_centric"
    assert moe_experts_path(OUTPUT_CENTRIC_MAX_TOKENS + 1)[0] == "indexed"
    assert moe_experts_path(1)[0] == ("output_centric" if OUTPUT_CENTRIC_MAX_TOKENS >= 1 else "indexed")
    assert moe_experts_path(512, "mxfp8")[0] == "output_centric"
    monkeypatch.setenv("LOWBIT_MOE_PATH", "output_centric")
    assert moe_experts_path(64) == ("output_centric", "LOWBIT_MOE_PATH=output_centric")
    monkeypatch.setenv("LOWBIT_MOE_PATH", "indexed")
    assert moe_experts_path(1) == ("indexed", "LOWBIT_MOE_PATH=indexed")
    monkeypatch.setenv("LOWBIT_MOE_PATH", "fastest")
    with pytest.raises(ValueError, match="LOWBIT_MOE_PATH"):
        moe_experts_path(1)


def test_bad_input(gen, device):
    e, h, inter, m, k = 3, 64, 32, 2, 2
    w13, w2, _, _ = _int4(e, h, inter, gen, device)
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16).to(device)
    ids = random_topk_ids(m, k, e, generator=gen).to(device)
    tw = random_topk_weights(m, k, generator=gen).to(device)
    with pytest.raises(ValueError, match="path must be"):
        moe_experts(hidden, ids, tw, w13, w2, path="fastest")
    with pytest.raises(TypeError, match="bf16"):
        moe_experts(hidden.half(), ids, tw, w13, w2)
    with pytest.raises(ValueError, match="H=32"):
        moe_experts(hidden[:, :32].contiguous(), ids, tw, w13, w2)
    with pytest.raises(TypeError, match="topk_weights"):
        moe_experts(hidden, ids, None, w13, w2)
    with pytest.raises(TypeError, match="topk_ids"):
        moe_experts(hidden, ids.long(), tw, w13, w2)
    with pytest.raises(ValueError, match="must be"):
        moe_experts(hidden, ids, tw, w13, w13)  # w2 of the wrong shape
    x13, x2, _, _, _, _ = moe_expert_weights("mxfp8", e, h, inter, gen, device)
    with pytest.raises(ValueError, match="INT4"):
        moe_experts(hidden, ids, tw, x13, x2, path="indexed")


def test_silu_mul_and_combine_topk(gen, device):
    """The elementwise kernels against torch in FP32: widths not powers of two, a dropped slot
    and an out-of-range id (their rows hold NaN and must not be read), a token with none."""
    r, inter = 7, 1100
    gu = (torch.randn(r, 2 * inter, generator=gen) * 3).to(torch.bfloat16)
    got = silu_mul(gu.to(device), out=poison_(torch.empty(r, inter, dtype=torch.bfloat16, device=device)))
    want = F.silu(gu[:, :inter].float()) * gu[:, inter:].float()
    assert_close(got.cpu().float(), want, "bf16_out", "silu_mul")
    t, k, n, e = 4, 3, 1500, 5
    y = torch.randn(t * k, n, generator=gen).to(torch.bfloat16)
    ids = torch.tensor([[0, 1, 2], [3, -1, 4], [1, 7, 0], [-1, -1, -1]], dtype=torch.int32)
    y[4] = float("nan")  # (1, 1): dropped
    y[7] = float("nan")  # (2, 1): id >= E
    tw = random_topk_weights(t, k, generator=gen)
    got = combine_topk(y.to(device), ids.to(device), tw.to(device), e)
    valid = ((ids >= 0) & (ids < e)).float()
    want = (torch.nan_to_num(y.float()).view(t, k, n) * (tw * valid).unsqueeze(-1)).sum(1)
    assert_close(got.cpu().float(), want, "bf16_out", "combine_topk")
    assert bool((got[3] == 0).all()), "a token with no valid slot is zeros"
    with pytest.raises(ValueError, match="T\\*k"):
        combine_topk(y[:-1].to(device), ids.to(device), tw.to(device), e)
    with pytest.raises(ValueError, match="2\\*I"):
        silu_mul(gu[:, :-1].to(device))


@pytest.mark.parametrize("block", [32, 64])
def test_silu_mul_in_slot_order(block, gen, device):
    """``silu_mul(gu, routing=r)``: slot s of a live block gets row ``sorted_ids[s]`` of
    ``silu_mul(gu)``, bit for bit; sentinel slots, a remote expert's blocks and an over-allocated
    buffer's blocks past the device-side count keep the poison; a routing of another route count
    is refused. I off the kernel's 256-column tile."""
    t, k, e, inter = 21, 3, 5, 200
    ids = random_topk_ids(t, k, e, generator=gen).to(device)
    emap = torch.tensor([0, 1, -1, 2, 3], dtype=torch.int32, device=device)  # expert 2 remote
    r = routing.moe_align_block_size(ids, block, e, emap)
    routes = ids.numel()
    r = replace(r, sorted_token_ids=torch.cat([r.sorted_token_ids, torch.full((block,), routes, dtype=torch.int32,
                                                                               device=device)]),
                expert_ids=torch.cat([r.expert_ids, torch.zeros(1, dtype=torch.int32, device=device)]))
    gu = (torch.randn(routes, 2 * inter, generator=gen) * 3).to(torch.bfloat16).to(device)
    out = poison_(torch.empty(r.sorted_token_ids.numel(), inter, dtype=torch.bfloat16, device=device))
    assert silu_mul(gu, out=out, routing=r) is out
    sid = r.sorted_token_ids.cpu()
    slot = torch.arange(sid.numel())
    live = (slot < r.num_tokens_post_padded.cpu()) & (r.expert_ids.cpu().repeat_interleave(block) >= 0) & (sid < routes)
    assert live.any() and (~live).any()
    assert_bitwise_equal(out.cpu()[live], silu_mul(gu).cpu()[sid[live].long()], "SiLU rows in slot order")
    assert (out.cpu()[~live] == POISON_BF16).all(), "slots without a live route must keep the poison"
    with pytest.raises(ValueError, match="routes"):
        silu_mul(gu[:-1], routing=r)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32])
def test_kimi_shapes_both_paths(m, gen):
    """Kimi-like expert shapes on the GPU (H 7168, I 2048, top-8, 12 experts to keep the
    weights small): both paths, the Gluon engines the heuristics pick, against the reference
    and each other."""
    e, h, inter, k = 12, 7168, 2048, 8
    w13, w2, q13, q2 = _int4(e, h, inter, gen, "cuda")
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16)
    ids = random_topk_ids(m, k, e, generator=gen)
    tw = random_topk_weights(m, k, generator=gen)
    ref = reference.moe_experts_ref(hidden.cuda(), ids.cuda(), tw.cuda(), q13, q2, round_intermediate=True).cpu()
    outs = {}
    for path in ("output_centric", "indexed"):
        out = poison_(torch.empty(m, h, dtype=torch.bfloat16, device="cuda"))
        moe_experts(hidden.cuda(), ids.cuda(), tw.cuda(), w13, w2, out=out, path=path)
        outs[path] = out.cpu().float()
        assert_close(outs[path], ref, "bf16_chain", f"{path}, {m} tokens")
    assert_close(outs["indexed"], outs["output_centric"], "bf16_chain", "indexed vs output-centric")


@pytest.mark.gpu
def test_cuda_graph_replay_indexed(gen):
    """The indexed path (routing, two GEMMs, SiLU, combine) captures into a CUDA graph with
    over-allocated routing buffers and replays with new routing."""
    e, h, inter, m, k = 8, 512, 256, 24, 4
    w13, w2, q13, q2 = _int4(e, h, inter, gen, "cuda")
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16).cuda()
    ids = random_topk_ids(m, k, e, generator=gen).cuda()
    tw = random_topk_weights(m, k, generator=gen).cuda()
    out = torch.empty(m, h, dtype=torch.bfloat16, device="cuda")
    moe_experts(hidden, ids, tw, w13, w2, out=out, path="indexed")  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moe_experts(hidden, ids, tw, w13, w2, out=out, path="indexed")
    for _ in range(2):
        ids.copy_(random_topk_ids(m, k, e, generator=gen).cuda())
        tw.copy_(random_topk_weights(m, k, generator=gen).cuda())
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = reference.moe_experts_ref(hidden, ids, tw, q13, q2, round_intermediate=True)
        assert_close(out.cpu().float(), ref.cpu(), "bf16_chain", "graph replay")


def test_pdl_off_on_cpu_and_by_env(monkeypatch):
    """PDL launches only on a CUDA sm_90+ device with the interpreter off; ``LOWBIT_PDL=0``
    turns it off; the launch option is passed only for a PDL launch."""
    assert not pdl_enabled(torch.device("cpu"))
    monkeypatch.setenv(PDL_ENV, "0")
    if torch.cuda.is_available():
        assert not pdl_enabled(torch.device("cuda"))
    assert launch_options(False) == {} and launch_options(True) == {"launch_pdl": True}


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 40, 256])
def test_pdl_chain_matches_plain_launches(m, gen, monkeypatch):
    """The indexed path's kernels launched with PDL (routing, gate_up and the elementwise kernels
    waiting first, down streaming its first weights before its wait) give bit-identical outputs
    to plain launches, eagerly and over back-to-back graph replays with fresh routing (a missing
    wait would read a half-written intermediate)."""
    path = "indexed"
    e, h, inter, k = 12, 7168, 2048, 8
    w13, w2, q13, q2 = _int4(e, h, inter, gen, "cuda")
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16).cuda()
    draws = [(random_topk_ids(m, k, e, generator=gen).cuda(), random_topk_weights(m, k, generator=gen).cuda())
             for _ in range(4)]
    assert pdl_enabled(hidden.device)
    monkeypatch.setenv(PDL_ENV, "0")
    plain = [moe_experts(hidden, ids, tw, w13, w2, path=path) for ids, tw in draws]
    monkeypatch.setenv(PDL_ENV, "1")
    ids, tw = draws[0][0].clone(), draws[0][1].clone()
    out = poison_(torch.empty(m, h, dtype=torch.bfloat16, device="cuda"))
    moe_experts(hidden, ids, tw, w13, w2, out=out, path=path)
    torch.testing.assert_close(out, plain[0], rtol=0, atol=0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moe_experts(hidden, ids, tw, w13, w2, out=out, path=path)
    outs = []
    for _ in range(3):  # no synchronization between replays
        for d_ids, d_tw in draws:
            ids.copy_(d_ids)
            tw.copy_(d_tw)
            out.fill_(float("nan"))
            graph.replay()
            outs.append(out.clone())
    torch.cuda.synchronize()
    for i, o in enumerate(outs):
        torch.testing.assert_close(o, plain[i % len(draws)], rtol=0, atol=0, msg=f"replay {i}")
    ref = reference.moe_experts_ref(hidden, *draws[0], q13, q2, round_intermediate=True)
    assert_close(outs[0].cpu().float(), ref.cpu(), "bf16_chain", f"PDL chain, {path}, {m} tokens")


@pytest.mark.gpu
def test_prefill_layer_down_reads_silu_rows_in_slot_order(gen):
    """Where down runs on pre-gathered rows (Kimi-like prefill: 256 tokens on 12 experts), the
    layer's SiLU writes them in slot order and down skips its gather: bit for bit the layer
    built from the public pieces with down gathering its own rows, and the reference's answer."""
    e, h, inter, m, k = 12, 7168, 2048, 256, 8
    w13, w2, q13, q2 = _int4(e, h, inter, gen, "cuda")
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16).cuda()
    ids = random_topk_ids(m, k, e, generator=gen).cuda()
    tw = random_topk_weights(m, k, generator=gen).cuda()
    c1, c2 = indexed_configs(hidden, k, w13, w2)
    assert c2.pregather, c2
    out = poison_(torch.empty(m, h, dtype=torch.bfloat16, device="cuda"))
    moe_experts(hidden, ids, tw, w13, w2, out=out, path="indexed")
    r1 = routing.moe_align_block_size(ids, c1.block_m, e)
    r2 = routing.moe_align_block_size(ids, c2.block_m, e)
    gu = w4a16_indexed(hidden, w13, r1.sorted_token_ids, r1.expert_ids, r1.num_tokens_post_padded, k, config=c1)
    y = w4a16_indexed(silu_mul(gu), w2, r2.sorted_token_ids, r2.expert_ids, r2.num_tokens_post_padded, 1, config=c2)
    assert_bitwise_equal(out, combine_topk(y, ids, tw, e), "slot-order SiLU vs down's own gather")
    ref = reference.moe_experts_ref(hidden, ids, tw, q13, q2, round_intermediate=True)
    assert_close(out.cpu().float(), ref.cpu(), "bf16_chain", "prefill layer, SiLU rows in slot order")
