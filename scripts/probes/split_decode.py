"""K shares (split-K) of the W4A16 register-A indexed kernel at decode -- a probe, not a benchmark.

    python scripts/probes/split_decode.py [tokens ...]
    SPLIT_DECODE_VARIANTS=8x3,w8x2g,w8x2gs2 python scripts/probes/split_decode.py 1 2

Kimi EP8 (48 experts; gate_up N 4096 K 7168 top-8, down N 7168 K 2048), 8-row routing blocks:
the public `w4a16_indexed` with the heuristics' config and with its tile / stage count / K
shares replaced (FP32 shares in a workspace, summed by the reduction kernel, both timed). One
process, identical inputs, interleaved CUDA-graph replays (`measure_interleaved`), L2 flushed.
Each output's relative Frobenius difference from the first variant's is printed after its time
(shares sum in another order: ~1e-3 of bf16 rounding, never more).
"""
import os
import sys
from dataclasses import replace

import torch

from lowbit import routing
from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16
from lowbit.kernels.w4a16.indexed import w4a16_indexed, w4a16_indexed_config

gen = torch.Generator(device="cuda").manual_seed(20)
E = 48
PROJ = (("gate_up", 4096, 7168), ("down", 7168, 2048))
# name: (weight rows, routing block, warps, stages, split_k); "heur" = the heuristics' choice
# "w": 128 weight rows on one warpgroup (the group loop), a whole-grid answer to the one-token
# grid's 256 programs of 128 rows
VARIANTS = {"heur": None, "8x3": (64, 8, 4, 3, 1), "8x3s2": (64, 8, 4, 3, 2), "8x3s3": (64, 8, 4, 3, 3),
            "8x3s4": (64, 8, 4, 3, 4), "8x2gs2": (64, 8, 4, 2, 2), "8x2gs4": (64, 8, 4, 2, 4),
            "w8x2g": (128, 8, 4, 2, 1), "w8x2gs2": (128, 8, 4, 2, 2), "w8x2gs3": (128, 8, 4, 2, 3)}
if os.environ.get("SPLIT_DECODE_VARIANTS"):  # a subset, comma-separated ("heur" always first)
    VARIANTS = {v: VARIANTS[v] for v in ["heur"] + os.environ["SPLIT_DECODE_VARIANTS"].split(",")}
tokens = [int(t) for t in sys.argv[1:]] or [1, 2, 4, 8]

for tok in tokens:
    ids = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:8] for _ in range(tok)]).to(torch.int32)
    r = routing.moe_align_block_size(ids, 8, E)
    hit = int(torch.unique(ids).numel())
    for i, (proj, n, kk) in enumerate(PROJ):
        top_k = 8 if i == 0 else 1
        w = pack_w4a16(make_weight(E, n, kk, "cuda"))
        a = torch.randn(tok if top_k == 8 else tok * 8, kk, device="cuda").to(torch.bfloat16)
        base = w4a16_indexed_config(tok * 8, E, n, kk, block_m=8, gluon=True)
        cfgs = {v: base if t is None else replace(base, engine="gluon_rs", block_n=t[0], num_warps=t[2],
                                                   num_stages=t[3], split_k=t[4])
                for v, t in VARIANTS.items()}
        outs = {v: torch.full((tok * 8, n), float("nan"), dtype=torch.bfloat16, device="cuda") for v in cfgs}

        def launch(v):
            w4a16_indexed(a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k,
                          out=outs[v], config=cfgs[v])
        t = measure_interleaved({v: (lambda v=v: launch(v)) for v in cfgs})
        ref = outs["heur"].float()
        cells = "  ".join(f"{v} {t[v].median_us:6.1f} ({(outs[v].float() - ref).norm() / ref.norm():.0e})"
                          for v in cfgs)
        best = min(cfgs, key=lambda v: t[v].median_us)
        print(f"t{tok} {proj:8} {cells}  best {best} x{t['heur'].median_us / t[best].median_us:.3f} "
              f"({hit * n * kk * (0.5 + 2 / 32) / t[best].median_us / 1e6:.2f} TB/s)", flush=True)
    print(f"t{tok} heuristics: {base.reason}", flush=True)
