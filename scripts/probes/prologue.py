"""The indexed register-A kernel's prologue: the padded count and the expert id loaded side
by side or one after the other (a probe, not a benchmark).

    python scripts/probes/prologue.py [gemm] [layer]

The kernels (`w4a16_sm90._block_expert`) load the count and the block's expert id together and
test them once; the "serial" variant (`variants.py` text edit) restores the order before the
twenty-fifth session: the count, its exit test, then the expert id (SASS: two dependent global
loads before the first weight TMA, against one). ``x`` = variant time / kernel time (> 1: the
kernel is faster).

gemm   the bench's own draws (``ep8_indexed_t1`` .. ``t50``) and a two-token draw, each
       projection's `w4a16_indexed` alone with its heuristics' tile.
layer  `lowbit.moe_experts(path="indexed")` (PDL chain) at 1-32 tokens.

Kimi EP8 (48 experts, H 7168, I 2048, top-8), one process, interleaved CUDA-graph replays behind
an L2 flush (`measure_interleaved`); outputs compared bit for bit ("!" marks a difference).

H200, twenty-fifth session (calls 2-4): serial / side by side 1.013-1.023 at one token (gate_up
and down; 64x8 tiles), 0.99-1.01 from four tokens on and in the layer. Also measured then and
not kept: the block's sorted ids loaded before the exit test too (the activation gather one
latency earlier): one-token gate_up 1.015x more, but the 128x16 down at 32-50 tokens 0.986-0.991x
and the layer at 8 tokens 0.988x."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants as v

from lowbit.bench.cases import build_problem, make_weight, select_cases
from lowbit.formats.w4a16 import pack_w4a16
from variants import KERNEL as base

SERIAL = [("""    ntpp = gl.load(ntpp_ptr)
    e = gl.load(expert_ids_ptr + pid_m)  # in bounds: the grid has at most the buffer's blocks
""", """    ntpp = gl.load(ntpp_ptr)
    e = -1
    if pid_m * BR < ntpp:
        e = gl.load(expert_ids_ptr + pid_m)
""")]
MODS = {"kernel": base, "serial": v.variant("serial", SERIAL)}
E, H, I = 48, 7168, 2048


def gemm() -> None:
    gen = torch.Generator(device="cuda").manual_seed(2)
    draws = []
    for name in ("ep8_indexed_t1", "ep8_indexed_t4", "ep8_indexed_t8", "ep8_indexed_t16", "ep8_indexed_t20",
                 "ep8_indexed_t32", "ep8_indexed_t50"):
        case = select_cases([name])[0]
        for proj in ("gate_up", "down"):
            p = build_problem(case, proj, "cuda")
            draws.append((f"{name} {proj}", p.a, pack_w4a16(p.weight), p.topk_ids.to(torch.int32)))
    ids2 = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:8] for _ in range(2)]).to(torch.int32)
    for proj, n, k in (("gate_up", 2 * I, H), ("down", H, I)):
        rows = 2 if proj == "gate_up" else 16
        a = torch.randn(rows, k, generator=gen, device="cuda").to(torch.bfloat16)
        draws.append((f"two tokens {proj}", a, pack_w4a16(make_weight(E, n, k, "cuda")), ids2))
    v.compare_indexed(MODS, draws, rounds=80)


def layer() -> None:
    v.compare_layer(MODS, (1, 2, 4, 8, 16, 32), seed=3, rounds=80)


if __name__ == "__main__":
    for mode in sys.argv[1:] or ["gemm", "layer"]:
        {"gemm": gemm, "layer": layer}[mode]()
