"""The indexed MoE layer with and without programmatic dependent launch -- a probe, not a
benchmark.

    python scripts/probes/pdl_chain.py [TOKENS ...]     (default 1 2 4 8 16 32 128 256)
    PDL_CHAIN=gemm python scripts/probes/pdl_chain.py [TOKENS ...]
    PDL_CHAIN=parts python scripts/probes/pdl_chain.py [TOKENS ...]

`lowbit.moe_experts(path="indexed")` (routing, gate_up, silu_mul, down, combine) on Kimi K2.x
EP8 shapes (48 experts, H 7168, I 2048, top-8), captured with ``LOWBIT_PDL=0`` (plain
launches) and with PDL (`lowbit.runtime.pdl`: down streams its first weight steps before its
wait), and "prerouted": the PDL chain without its routing (built outside the graph), beside Humming's indexed GEMMs in the same composition (the bench's
``humming-indexed`` provider), interleaved CUDA-graph replays behind an L2 flush
(`measure_interleaved`); the lowbit outputs compared bit for bit ("!" marks a difference).
``gemm``: each projection's `w4a16_indexed` alone (gate_up, then down; the L2 flush before it
is its only predecessor), plain against PDL (waiting first): what a lone call pays for the launch
attribute.
Twenty-third session, also measured and not kept: down prefetching its whole weight tile into L2
(``cp.async.bulk.prefetch.L2``) before its wait, 0.93-0.99x plain launches at 1-256 tokens.
``parts``: the layer's three small launches alone (routing, `silu_mul`, `combine_topk`), plain
launches, what each adds to the chain's critical path.
The output-centric path's two kernels waiting first under PDL measured 0.99-1.00x plain
launches (twenty-third session, INT4 and MXFP8, 1-32 tokens): not kept, so not probed here.
"""
import os
import sys

import torch

from lowbit.bench.opcases import OP_CASES, _decode_case
from lowbit.bench.ops import DecodeHummingIndexed, DecodeLowbitIndexed, build_op_problem
from lowbit.bench.timing import measure_interleaved
from lowbit.bench.cases import make_weight
from lowbit.formats.w4a16 import pack_w4a16
from lowbit.kernels.moe_elementwise import combine_topk, silu_mul
from lowbit.runtime.pdl import ENV
from lowbit.kernels.w4a16.indexed import w4a16_indexed, w4a16_indexed_config
from lowbit.layers.moe import indexed_configs
from lowbit.routing import moe_align_block_size

tokens = [int(t) for t in sys.argv[1:]] or [1, 2, 4, 8, 16, 32, 128, 256]


def gemm_case(t):
    """`w4a16_indexed` gate_up and down alone, plain vs PDL, one line each."""
    e = 48
    ids = torch.stack([torch.randperm(e, device="cuda")[:8] for _ in range(t)]).to(torch.int32)
    for proj, n, k, top_k in (("gate_up", 4096, 7168, 8), ("down", 7168, 2048, 1)):
        w = pack_w4a16(make_weight(e, n, k, "cuda"))
        a = torch.randn(t if top_k == 8 else t * 8, k, device="cuda").to(torch.bfloat16)
        cfg = w4a16_indexed_config(t * 8, e, n, k, gluon=True)
        r = moe_align_block_size(ids, cfg.block_m, e)
        fns, outs = {}, {}
        for label, env in (("plain", "0"), ("pdl", "1")):
            outs[label] = torch.zeros(t * 8, n, dtype=torch.bfloat16, device="cuda")
            fns[label] = with_env(env, lambda o=outs[label]: w4a16_indexed(
                a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, out=o, config=cfg))
        tm = measure_interleaved(fns, rounds=80)
        same = "" if torch.equal(outs["plain"], outs["pdl"]) else "!"
        p, q = tm["plain"].median_us, tm["pdl"].median_us
        print(f"gemm {t:>5} {proj:8} plain {p:7.1f} pdl {q:7.1f}{same}  pdl/plain {p / q:.3f}", flush=True)


def with_env(value, fn):
    """`fn` run with ``LOWBIT_PDL=value`` (a dict: several variables)."""
    env = value if isinstance(value, dict) else {ENV: value}

    def call():
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return fn()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v
    return call


#: the layer's variants: plain launches, PDL; ``PDL_CHAIN_EXTRA="name:VAR=value,VAR=value;..."``
#: adds PDL variants under other environment overrides (e.g. a tile knob of `docs/tuning.md`)
CHAIN = {"plain": {ENV: "0"}, "pdl": {ENV: "1"}}
for spec in filter(None, os.environ.get("PDL_CHAIN_EXTRA", "").split(";")):
    label, assigns = spec.split(":", 1)
    CHAIN[label] = {ENV: "1", **dict(a.split("=", 1) for a in assigns.split(","))}


def parts_case(t):
    """The layer's small launches alone at `t` tokens (plain launches), one line."""
    e, k = 48, 8
    ids = torch.stack([torch.randperm(e, device="cuda")[:k] for _ in range(t)]).to(torch.int32)
    tw = torch.rand(t, k, device="cuda")
    gu = torch.randn(t * k, 4096, device="cuda").to(torch.bfloat16)
    y = torch.randn(t * k, 7168, device="cuda").to(torch.bfloat16)
    block = w4a16_indexed_config(t * k, e, 4096, 7168, gluon=True).block_m
    fns = {"routing": lambda: moe_align_block_size(ids, block, e), "silu_mul": lambda: silu_mul(gu),
           "combine": lambda: combine_topk(y, ids, tw, e)}
    tm = measure_interleaved({n: with_env("0", f) for n, f in fns.items()}, rounds=80)
    print(f"parts {t:>5} " + "  ".join(f"{n} {tm[n].median_us:6.1f}" for n in fns), flush=True)


if os.environ.get("PDL_CHAIN") == "parts":
    for t in tokens:
        parts_case(t)
    sys.exit(0)
if os.environ.get("PDL_CHAIN") == "gemm":
    for t in tokens:
        gemm_case(t)
    sys.exit(0)
print(f"{'tokens':>6} " + " ".join(f"{v:>8}" for v in (*CHAIN, "prerouted")) + f" {'humming':>8}  vs plain / x humming",
      flush=True)
for t in tokens:
    name = f"decode_oc_int4_t{t}"
    case = next((c for c in OP_CASES if c.name == name), None) or _decode_case(t, "int4", e=48, h=7168, inter=2048,
                                                                                top_k=8)
    problem = build_op_problem(case, "cuda")
    fns, outs = {}, {}
    for label, env in CHAIN.items():
        prov = DecodeLowbitIndexed()
        with_env(env, lambda prov=prov: prov.prepare(problem))()
        outs[label] = with_env(env, prov.run)().clone()
        fns[label] = with_env(env, prov.run)
    # the same chain with its routing built outside the graph: what routing adds to the layer
    i = problem.inputs
    w13, w2 = DecodeLowbitIndexed()._int4_packed(problem)
    hidden, ids, tw = i["hidden"], i["topk_ids"], i["topk_weights"]
    c1, c2 = indexed_configs(hidden, ids.shape[1], w13, w2)
    r1 = moe_align_block_size(ids, c1.block_m, w13.num_experts)
    r2 = r1 if c2.block_m == c1.block_m else moe_align_block_size(ids, c2.block_m, w13.num_experts)

    def prerouted():
        gu = w4a16_indexed(hidden, w13, r1.sorted_token_ids, r1.expert_ids, r1.num_tokens_post_padded, ids.shape[1],
                           config=c1)
        y = w4a16_indexed(silu_mul(gu), w2, r2.sorted_token_ids, r2.expert_ids, r2.num_tokens_post_padded, 1,
                          config=c2, routing_ready=True)
        return combine_topk(y, ids, tw, w13.num_experts)
    outs["prerouted"] = with_env("1", prerouted)().clone()
    fns["prerouted"] = with_env("1", prerouted)
    hum = DecodeHummingIndexed()
    if hum.unavailable_reason() is None:
        hum.prepare(problem)
        fns["humming"] = hum.run
    tm = measure_interleaved(fns, rounds=80)
    p = tm["plain"].median_us
    h = tm["humming"].median_us if "humming" in tm else float("nan")
    cells = " ".join(f"{tm[v].median_us:7.1f}{'' if torch.equal(outs[v], outs['plain']) else '!'}"
                     for v in (*CHAIN, "prerouted"))
    ratios = " ".join(f"{v} {p / tm[v].median_us:.3f} / {h / tm[v].median_us:.3f}" for v in CHAIN)
    print(f"{t:>6} {cells} {h:8.1f}  {ratios}", flush=True)
