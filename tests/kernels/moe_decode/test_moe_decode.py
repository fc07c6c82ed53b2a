"""Output-centric MoE decode (gate_up + down) vs the FP32 reference, both weight formats and both
Triton engines (interpreter on the CPU tier, native on the GPU), the Hopper mma engine (sm_90),
bad input, heuristics, and a CUDA-graph replay on the GPU."""

import pytest
import torch
import torch.nn.functional as F

from lowbit import reference
from lowbit.formats import FormatError, QuantizedTensor, get_format, pack_mxfp8_experts
from lowbit.formats.w4a16 import pack_w4a16
from lowbit.kernels.moe_decode import heuristics, hopper
from lowbit.kernels.moe_decode import op as md
from lowbit.kernels.moe_decode.op import (
    DecodeConfig,
    moe_decode,
    moe_decode_config,
    moe_decode_down,
    moe_decode_gate_up,
)
from lowbit.reference.moe import expert_weight
from lowbit.testing import assert_close, poison_, random_topk_ids, random_topk_weights

from helpers import moe_edge_routing, moe_expert_weights

# Test tiles: as large as the test shapes, so the interpreter runs few programs; the default
# (production) tiles run in test_single_token_default_config and test_dot_engine_*.
BIG = {"fma": DecodeConfig("fma", 128, 256, 1, 4, 1), "dot": DecodeConfig("dot", 128, 256, 16, 4, 1)}


def _act_ref(hidden, ids, w13):
    """FP32 reference of the gate_up stage: ``bf16(SiLU(g) * u)``, 0 for dropped slots."""
    m, k = ids.shape
    e = (w13.codes if hasattr(w13, "codes") else w13).shape[0]
    inter = (w13.codes if hasattr(w13, "codes") else w13).shape[1] // 2
    act = torch.zeros(m, k, inter)
    for t in range(m):
        for j in range(k):
            ex = int(ids[t, j])
            if 0 <= ex < e:
                gu = hidden[t].float() @ expert_weight(w13, ex).T
                act[t, j] = F.silu(gu[:inter]) * gu[inter:]
    return act.to(torch.bfloat16).float()


def _run_edges(cfg, hidden, ids, tw, ref_ids, w13, w2, r13, r2, device):
    """Both stages on `_edge_routing` inputs with poisoned outputs; checks gate_up alone (against
    the kernel's effective weights: one bf16 rounding of the output), the dropped and repeated
    slots, and the whole path against the effective weights. Returns the output (CPU, fp32)."""
    m, k = ids.shape
    inter, h = r13.shape[1] // 2, r13.shape[2]
    act = poison_(torch.empty(m, k, inter, dtype=torch.bfloat16, device=device))
    moe_decode_gate_up(hidden.to(device), ids.to(device), w13, out=act, config=cfg)
    out = poison_(torch.empty(m, h, dtype=torch.bfloat16, device=device))
    moe_decode_down(act, ids.to(device), tw.to(device), w2, out=out, config=cfg)
    act, out = act.cpu().float(), out.cpu().float()
    assert_close(act, _act_ref(hidden, ref_ids, r13), "bf16_out", "act")
    assert (act[1, 2] == 0).all() and (act[4, 0] == 0).all(), "dropped slots: act rows are 0"
    assert torch.equal(act[3, 0], act[3, 1]), "a repeated expert gives both slots the same act row"
    assert_close(out, reference.moe_experts_ref(hidden, ref_ids, tw, r13, r2, round_intermediate=True),
                 "bf16_out", "out (effective weights)")
    return out


@pytest.mark.parametrize("engine", ["fma", "dot"])
@pytest.mark.parametrize("fmt", ["int4", "mxfp8"])
def test_matches_reference_with_routing_edges(fmt, engine, gen, device):
    # E=6 with expert 5 empty; H=160 and I=96 are not multiples of the 256-wide K step nor of
    # any tile; M=5 tokens share experts
    e, h, inter, m, k = 6, 160, 96, 5, 3
    w13, w2, q13, q2, r13, r2 = moe_expert_weights(fmt, e, h, inter, gen, device)
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16)
    ids, tw, ref_ids = moe_edge_routing(m, k, e, gen)
    out = _run_edges(BIG[engine], hidden, ids, tw, ref_ids, w13, w2, r13, r2, device)
    assert_close(out, reference.moe_experts_ref(hidden, ref_ids, tw, q13, q2, round_intermediate=True),
                 "bf16_chain", "out (FP32 of the quantized weights)")


@pytest.mark.parametrize("fmt", ["int4", "mxfp8"])
def test_single_token_default_config(fmt, gen, device):
    """M=1 with the configuration the heuristics pick (the fma engine, production tiles); the
    experts the token does not choose have no tokens; H, I not multiples of the tiles."""
    e, h, inter, k = 4, 96, 64, 2
    assert moe_decode_config(1, k, e, h, inter).engine == "fma"
    w13, w2, _, _, r13, r2 = moe_expert_weights(fmt, e, h, inter, gen, device)
    hidden = torch.randn(1, h, generator=gen).to(torch.bfloat16)
    ids = random_topk_ids(1, k, e, generator=gen)
    tw = random_topk_weights(1, k, generator=gen)
    out = poison_(torch.empty(1, h, dtype=torch.bfloat16, device=device))
    moe_decode(hidden.to(device), ids.to(device), tw.to(device), w13, w2, out=out)
    ref = reference.moe_experts_ref(hidden, ids, tw, r13, r2, round_intermediate=True)
    assert_close(out.cpu().float(), ref, "bf16_out")


@pytest.mark.parametrize("fmt", ["int4", "mxfp8"])
def test_dot_engine_hot_expert_many_routes(fmt, gen, device):
    """Dot engine, production tiles, 16 tokens a pass: every token's first slot on expert 0, so
    its gate_up owner gathers 20 routes in two passes; 80 routes cross the 64-route scan chunk;
    the 20 tokens make two token groups in down; the last expert is empty."""
    e, h, inter, m, k = 5, 96, 64, 20, 4
    cfg = DecodeConfig("dot", 64, 32, 16, 4, 1)
    w13, w2, _, _, r13, r2 = moe_expert_weights(fmt, e, h, inter, gen, device)
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16)
    ids = random_topk_ids(m, k, e, generator=gen, hot_expert=0)
    tw = random_topk_weights(m, k, generator=gen)
    act = moe_decode_gate_up(hidden.to(device), ids.to(device), w13, config=cfg)
    out = moe_decode_down(act, ids.to(device), tw.to(device), w2, config=cfg)
    assert_close(act.cpu().float(), _act_ref(hidden, ids, r13), "bf16_out", "act")
    ref = reference.moe_experts_ref(hidden, ids, tw, r13, r2, round_intermediate=True)
    assert_close(out.cpu().float(), ref, "bf16_out")


@pytest.mark.parametrize("stages", [1, 3])
@pytest.mark.parametrize("fmt", ["int4", "mxfp8"])
def test_fma_engine_pipelined_k_loops(fmt, stages, gen, device):
    """The fma engine's K loops software-pipelined (``tl.range(num_stages=3)``: cp.async
    staging on the GPU; the interpreter runs the same loop unpipelined): H = 1056 and I = 608
    give 5 and 3 K steps (the last one short), so the steady state and the drain both run."""
    e, h, inter, m, k = 3, 1056, 608, 2, 2
    w13, w2, _, _, r13, r2 = moe_expert_weights(fmt, e, h, inter, gen, device)
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16)
    ids = random_topk_ids(m, k, e, generator=gen)
    tw = random_topk_weights(m, k, generator=gen)
    cfg = DecodeConfig("fma", 64, 64, 1, 8 if fmt == "int4" else 2, stages)
    out = poison_(torch.empty(m, h, dtype=torch.bfloat16, device=device))
    moe_decode(hidden.to(device), ids.to(device), tw.to(device), w13, w2, out=out, config=cfg)
    ref = reference.moe_experts_ref(hidden, ids, tw, r13, r2, round_intermediate=True)
    assert_close(out.cpu().float(), ref, "bf16_out", f"fma stages={stages}")


def test_k256_layout_runs_on_the_mma_engine_only(gen):
    """The Triton engines refuse the k256-interleaved MXFP8 layout; its default engine is mma,
    which the CPU cannot run."""
    e, h, inter = 2, 64, 32
    w13, w2, _, _, _, _ = moe_expert_weights("mxfp8_k256", e, h, inter, gen, "cpu")
    hidden = torch.randn(1, h, generator=gen).to(torch.bfloat16)
    ids = torch.zeros(1, 1, dtype=torch.int32)
    for cfg in (BIG["fma"], BIG["dot"]):
        with pytest.raises(ValueError, match="mma engine only"):
            moe_decode_gate_up(hidden, ids, w13, config=cfg)
    assert moe_decode_config(1, 8, 48, 7168, 2048, "mxfp8_k256").engine == "mma"
    with pytest.raises(ValueError, match="CUDA"):  # its default engine, which the CPU cannot run
        moe_decode_gate_up(hidden, ids, w13)


def test_bad_input(gen, device):
    e, h, inter, m, k = 3, 64, 32, 2, 2
    w13, w2, q13, _, _, _ = moe_expert_weights("int4", e, h, inter, gen, device)
    m13, m2, _, _, _, _ = moe_expert_weights("mxfp8", e, h, inter, gen, device)
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16).to(device)
    ids = random_topk_ids(m, k, e, generator=gen).to(device)
    tw = random_topk_weights(m, k, generator=gen).to(device)
    with pytest.raises(TypeError, match="hidden must be bf16"):
        moe_decode(hidden.float(), ids, tw, w13, w2)
    with pytest.raises(TypeError, match="topk_ids must be int32"):
        moe_decode(hidden, ids.long(), tw, w13, w2)
    with pytest.raises(TypeError, match="topk_weights must be float32"):
        moe_decode(hidden, ids, tw.to(torch.bfloat16), w13, w2)
    with pytest.raises(ValueError, match="rows"):
        moe_decode(hidden, ids[:1], tw[:1], w13, w2)
    with pytest.raises(ValueError, match="must match topk_ids"):
        moe_decode(hidden, ids, tw[:, :1].contiguous(), w13, w2)
    with pytest.raises(ValueError, match=r"\[E, 64, 32\]"):  # hidden size of a different model
        moe_decode_gate_up(hidden[:, :32].contiguous(), ids, w13)
    with pytest.raises(ValueError, match="w2 must be"):
        moe_decode(hidden, ids, tw, w13, w13)
    with pytest.raises(FormatError, match="masked"):  # a weight packed for another kernel family
        moe_decode(hidden, ids, tw, pack_w4a16(q13, profile="masked").to(device), w2)
    with pytest.raises(FormatError, match="QuantizedTensor"):  # the logical weight, not prepared
        moe_decode(hidden, ids, tw, q13, w2)
    with pytest.raises(TypeError, match="W4A16Weight or an Mxfp8ExpertWeight"):
        moe_decode(hidden, ids, tw, torch.zeros(e, 2 * inter, h), w2)
    with pytest.raises(ValueError, match="slots"):
        moe_decode_down(torch.zeros(m, k + 1, inter, dtype=torch.bfloat16, device=device), ids, tw, w2)
    with pytest.raises(ValueError, match="out must be"):
        moe_decode(hidden, ids, tw, m13, m2, out=torch.empty(m, h + 1, dtype=torch.bfloat16, device=device))
    empty = moe_decode(hidden[:0], ids[:0], tw[:0], w13, w2)  # M=0: nothing to launch
    assert empty.shape == (0, h) and empty.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="tokens=8"):
        moe_decode(hidden, ids, tw, m13, m2, config=DecodeConfig("dot", 64, 32, 8, 4, 1))
    with pytest.raises(ValueError, match="block_i=24"):
        moe_decode(hidden, ids, tw, m13, m2, config=DecodeConfig("fma", 24, 32, 1, 4, 1))


def test_heuristics_memo_and_env_overrides(monkeypatch):
    ep8 = (8, 48, 7168, 2048)
    one = moe_decode_config(1, *ep8)
    assert one.engine == "fma" and one is moe_decode_config(1, *ep8), "memoized"
    assert "1.00 routes/hit expert" in one.reason
    many = moe_decode_config(32, *ep8)
    assert many.engine == "dot" and many.tokens == 32
    assert moe_decode_config(8, *ep8).tokens == 16
    monkeypatch.setenv("LOWBIT_DECODE_ENGINE", "dot")
    monkeypatch.setenv("LOWBIT_DECODE_BLOCK_H", "64")
    over = moe_decode_config(1, *ep8)
    assert over.engine == "dot" and over.block_h == 64 and over.tokens == 16
    assert "LOWBIT_DECODE_BLOCK_H=64" in over.reason, "each override is part of the key and the reason"
    monkeypatch.setenv("LOWBIT_DECODE_TOKENS", "12")
    with pytest.raises(ValueError, match="tokens=12"):
        moe_decode_config(1, *ep8)
    monkeypatch.setenv("LOWBIT_DECODE_TOKENS", "many")
    with pytest.raises(ValueError, match="LOWBIT_DECODE_TOKENS"):
        moe_decode_config(1, *ep8)
    for name in heuristics.ENV_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    assert moe_decode_config(1, *ep8) is one
    assert "engine=fma" in heuristics.explain_moe_decode_config(1, *ep8, native=False)
    # on sm_90 (what show-config explains by default) INT4 runs the mma engine, MXFP8 does not
    assert "engine=mma" in heuristics.explain_moe_decode_config(1, *ep8)
    assert moe_decode_config(1, *ep8, native=True).engine == "mma"
    assert moe_decode_config(1, *ep8, fmt="mxfp8", native=True).engine == "fma"


def test_compile_configs_cover_every_heuristic_choice():
    names = [c.name for c in md.compile_configs()]
    assert len(names) == len(set(names))
    fmts = set()
    for fmt, c in heuristics.production_configs():
        if c.engine == "mma":  # Gluon kernels: checked below
            continue
        fmts.add(fmt)
        tail = f"T={c.tokens},w={c.num_warps},s={c.num_stages}]"
        assert f"moe_decode_gate_up[{fmt},{c.engine},BI={c.block_i},{tail}" in names
        assert f"moe_decode_down[{fmt},{c.engine},BH={c.block_h},{tail}" in names
    assert fmts == {"int4", "mxfp8"}
    # the mma engine (sm_90): every (columns, split, stages) its heuristics pick at M = 1..64
    mma_names = {c.name for c in hopper.compile_configs()}
    for fmt, tag in (("int4", ""), ("mxfp8_k256", ",fp8")):
        for m in range(1, 65):
            c = moe_decode_config(m, 8, 48, 7168, 2048, fmt, native=True)
            assert c.engine == "mma"
            assert (f"moe_decode_gate_up_mma[C={min(c.tokens, 16)},split={c.split_gate_up},s={c.num_stages}{tag}]"
                    in mma_names)
            assert f"moe_decode_down_mma[C={c.tokens},split={c.split_down},s={c.num_stages}{tag}]" in mma_names


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,engine", [("int4", "heuristic"), ("int4", "fma"),
                                        pytest.param("int4", "mma", marks=pytest.mark.sm90),
                                        ("mxfp8", "heuristic"), ("mxfp8", "fma"),
                                        pytest.param("mxfp8_k256", "heuristic", marks=pytest.mark.sm90)])
def test_cuda_graph_capture_and_replay_with_new_routing(fmt, engine, gen):
    """Capture moe_decode (no host readback), replay with new topk_ids / topk_weights (one
    replay with a dropped slot). M=4 over 8 experts: the heuristics pick the mma engine for
    INT4 and k256-interleaved MXFP8 on sm_90, the Triton engines for natural MXFP8."""
    e, h, inter, m, k = 8, 256, 128, 4, 3
    cfg = {"heuristic": None, "fma": DecodeConfig("fma", 16, 16, 1, 4, 2),
           "mma": DecodeConfig("mma", 16, 16, 8, 4, 6, split_gate_up=2, split_down=2)}[engine]
    w13, w2, q13, q2, _, _ = moe_expert_weights(fmt, e, h, inter, gen, "cuda")
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16).cuda()
    ids = random_topk_ids(m, k, e, generator=gen).cuda()
    tw = random_topk_weights(m, k, generator=gen).cuda()
    moe_decode(hidden, ids, tw, w13, w2, config=cfg)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = moe_decode(hidden, ids, tw, w13, w2, config=cfg)
    for step in range(3):
        new_ids = random_topk_ids(m, k, e, generator=gen)
        if step == 1:
            new_ids[0, 1] = -1
        ids.copy_(new_ids.cuda())
        tw.copy_(random_topk_weights(m, k, generator=gen).cuda())
        graph.replay()
        torch.cuda.synchronize()
        ref_ids = ids.cpu()
        want = reference.moe_experts_ref(hidden.cpu(), ref_ids, tw.cpu(), q13, q2, round_intermediate=True)
        assert_close(y.cpu().float(), want, "bf16_chain", f"replay {step}")


# --------------------------------------------------------------------------- mma engine (sm_90)
@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("tokens,split_gu,split_dn,stages", [(8, 4, 8, 4), (8, 8, 4, 3), (8, 2, 2, 6), (16, 1, 1, 4),
                                                            (32, 2, 4, 8), (8, 1, 1, 5)])
@pytest.mark.parametrize("h,inter", [(160, 96), (608, 288)])
@pytest.mark.parametrize("fmt", ["int4", "mxfp8_k256"])
def test_mma_engine_matches_reference_with_routing_edges(fmt, h, inter, tokens, split_gu, split_dn, stages, gen):
    """The Gluon tensor-core engine against the reference with the routing edges of the Triton
    engines' test; K of one step (H=160, I=96: past-K activations masked; MXFP8: K padded with
    zero codes) and of several (H=608: three steps, split over up to 8 warps, some warps'
    chunks empty; I=288: two), neuron and output counts that are not multiples of 16; ring
    depths 3 to 8; warp splits from 1 to 8 (several member passes and token blocks where the
    columns a warp are few). MXFP8 rings take twice the words: a tile over 227 KB of shared
    memory must be a clear error."""
    e, m, k = 6, 5, 3
    cfg = DecodeConfig("mma", 16, 16, tokens, 4, stages, split_gate_up=split_gu, split_down=split_dn)
    w13, w2, q13, q2, r13, r2 = moe_expert_weights(fmt, e, h, inter, gen, "cuda")
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16)
    ids, tw, ref_ids = moe_edge_routing(m, k, e, gen)
    fp8 = fmt != "int4"
    smem = [hopper.smem_bytes(rows, cols, stages, fp8) for rows, cols in ((32 * split_gu, min(tokens, 16)),
                                                                    (16 * split_dn, tokens))]
    if max(smem) > hopper.SMEM_LIMIT:
        with pytest.raises(ValueError, match="shared memory"):
            _run_edges(cfg, hidden, ids, tw, ref_ids, w13, w2, r13, r2, "cuda")
        return
    _run_edges(cfg, hidden, ids, tw, ref_ids, w13, w2, r13, r2, "cuda")


@pytest.mark.gpu
@pytest.mark.sm90
def test_mma_engine_mxfp8_weights_are_exact():
    """Every finite E4M3 code (subnormals, both signs, 448) under E8M0 scales from 2^-27 to 2^7
    (the layout's range), read back through the down stage with one-hot activations (one token
    per input column, routing weight 1): out[t, h] = W2[e, h, t] exactly, since the products
    by 1 and the FP32 sums are exact and every such weight is a bf16 number."""
    g = torch.Generator().manual_seed(123)
    e, h, inter = 2, 48, 512
    codes = torch.randint(0, 256, (e, h, inter), generator=g, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x42  # no NaN codes
    codes[0, 0, :254] = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    scales = torch.randint(100, 135, (e, h, inter // 32), generator=g, dtype=torch.uint8)
    scales[0, 0, :2] = torch.tensor([100, 134], dtype=torch.uint8)
    codes = codes.view(torch.float8_e4m3fn)
    w2 = pack_mxfp8_experts(codes, scales, layout="k256-interleaved").to("cuda")
    want = get_format("mxfp8").dequantize(QuantizedTensor(codes, scales, "mxfp8"))  # [E, H, I] FP32, exact
    for ex in range(e):
        m = inter
        act = torch.eye(inter, dtype=torch.bfloat16, device="cuda").view(m, 1, inter).contiguous()
        ids = torch.full((m, 1), ex, dtype=torch.int32, device="cuda")
        tw = torch.ones(m, 1, dtype=torch.float32, device="cuda")
        out = poison_(torch.empty(m, h, dtype=torch.bfloat16, device="cuda"))
        moe_decode_down(act, ids, tw, w2, out=out)
        assert torch.equal(out.cpu().float(), want[ex].T.to(torch.bfloat16).float()), f"expert {ex}"


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("m,tokens", [(1, 8), (4, 8), (16, 16)])
def test_mma_engine_mxfp8_default_matches_reference(m, tokens, gen):
    """k256-interleaved MXFP8 on its default (heuristic) mma configuration at decode batches,
    against the reference on the same codes; hidden and intermediate sizes off the K step."""
    e, h, inter, k = 8, 800, 352, 4
    w13, w2, _, _, r13, r2 = moe_expert_weights("mxfp8_k256", e, h, inter, gen, "cuda")
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16)
    ids = random_topk_ids(m, k, e, generator=gen)
    tw = random_topk_weights(m, k, generator=gen)
    out = poison_(torch.empty(m, h, dtype=torch.bfloat16, device="cuda"))
    moe_decode(hidden.cuda(), ids.cuda(), tw.cuda(), w13, w2, out=out)
    ref = reference.moe_experts_ref(hidden, ids, tw, r13, r2, round_intermediate=True)
    assert_close(out.cpu().float(), ref, "bf16_out")


@pytest.mark.gpu
@pytest.mark.sm90
@pytest.mark.parametrize("m,tokens,split", [(1, 8, 8), (20, 16, 1), (40, 32, 1), (6, 8, 2)])
@pytest.mark.parametrize("fmt", ["int4", "mxfp8_k256"])
def test_mma_engine_hot_expert_and_token_blocks(fmt, m, tokens, split, gen):
    """Every token's first slot on expert 0: its gate_up owner gathers m routes in passes of
    tokens / split; 40 tokens x 4 slots cross the 64-route scan chunk; m > tokens / split makes
    several down token blocks; the last expert is empty."""
    e, h, inter, k = 5, 544, 224, 4
    gu = min(split, min(tokens, 16), 4 if fmt != "int4" else 8)  # MXFP8 gate_up at 8 warps: over 227 KB
    cfg = DecodeConfig("mma", 16, 16, tokens, 4, 4, split_gate_up=gu, split_down=split)
    w13, w2, _, _, r13, r2 = moe_expert_weights(fmt, e, h, inter, gen, "cuda")
    hidden = torch.randn(m, h, generator=gen).to(torch.bfloat16)
    ids = random_topk_ids(m, k, e - 1, generator=gen, hot_expert=0)
    tw = random_topk_weights(m, k, generator=gen)
    act = moe_decode_gate_up(hidden.cuda(), ids.cuda(), w13, config=cfg)
    out = poison_(torch.empty(m, h, dtype=torch.bfloat16, device="cuda"))
    moe_decode_down(act, ids.cuda(), tw.cuda(), w2, out=out, config=cfg)
    assert_close(act.cpu().float(), _act_ref(hidden, ids, r13), "bf16_out", "act")
    ref = reference.moe_experts_ref(hidden, ids, tw, r13, r2, round_intermediate=True)
    assert_close(out.cpu().float(), ref, "bf16_out")


@pytest.mark.gpu
@pytest.mark.sm90
def test_mma_engine_is_the_int4_default_on_sm90(gen):
    """On an sm_90 GPU the heuristics pick the mma engine for INT4 (MXFP8 keeps the Triton
    engines), and the default path matches the reference at one token."""
    assert moe_decode_config(1, 8, 48, 7168, 2048, "int4", native=True).engine == "mma"
    assert moe_decode_config(1, 8, 48, 7168, 2048, "mxfp8", native=True).engine != "mma"
    e, h, inter, k = 8, 512, 256, 4
    w13, w2, _, _, r13, r2 = moe_expert_weights("int4", e, h, inter, gen, "cuda")
    hidden = torch.randn(1, h, generator=gen).to(torch.bfloat16)
    ids = random_topk_ids(1, k, e, generator=gen)
    tw = random_topk_weights(1, k, generator=gen)
    out = poison_(torch.empty(1, h, dtype=torch.bfloat16, device="cuda"))
    moe_decode(hidden.cuda(), ids.cuda(), tw.cuda(), w13, w2, out=out)
    ref = reference.moe_experts_ref(hidden, ids, tw, r13, r2, round_intermediate=True)
    assert_close(out.cpu().float(), ref, "bf16_out")


def test_mma_engine_refusals(gen):
    """The mma engine: tiles outside its set, MXFP8 weights, and (on the CPU tier) a device
    that cannot run Gluon are refused with clear errors."""
    with pytest.raises(ValueError, match="engine 'mma'"):
        heuristics.validate_config(DecodeConfig("mma", 64, 16, 8, 4, 6))
    with pytest.raises(ValueError, match="engine 'mma'"):
        heuristics.validate_config(DecodeConfig("mma", 16, 16, 4, 4, 6))
    with pytest.raises(ValueError, match="split_down"):
        heuristics.validate_config(DecodeConfig("mma", 16, 16, 8, 4, 6, split_down=3))
    with pytest.raises(ValueError, match="num_stages"):
        heuristics.validate_config(DecodeConfig("mma", 16, 16, 8, 4, 2))
    e, h, inter, k = 2, 64, 32, 1
    w13, w2, _, _, _, _ = moe_expert_weights("mxfp8", e, h, inter, gen, "cpu")
    hidden = torch.randn(1, h, generator=gen).to(torch.bfloat16)
    ids = torch.zeros(1, k, dtype=torch.int32)
    with pytest.raises(ValueError, match="k256-interleaved"):
        moe_decode_gate_up(hidden, ids, w13, config=DecodeConfig("mma", 16, 16, 8, 4, 6))
    w13, w2, _, _, _, _ = moe_expert_weights("int4", e, h, inter, gen, "cpu")
    with pytest.raises(ValueError, match="CUDA"):
        moe_decode_gate_up(hidden, ids, w13, config=DecodeConfig("mma", 16, 16, 8, 4, 6))
