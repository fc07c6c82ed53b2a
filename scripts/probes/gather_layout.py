"""The register-A indexed kernel's cp.async gather layout -- a probe, not a benchmark.

    python scripts/probes/gather_layout.py [tokens ...]

`hopper.routed.gather_layout` forced to its default pieces ("old": warps along the rows only,
4- or 8-byte pieces for 8- and 16-row blocks, each repeated over the eight boxes) or to its
`wide_pieces` form ("new": 16-byte pieces, warps along the boxes once the rows run out), for
whatever tile the heuristics pick, swapped in the module for a launch (the launchers read it
by name). Kimi EP8 (48 experts; gate_up N 4096 K
7168 top-8, down N 7168 K 2048), each projection on the heuristics' config. One process,
identical inputs, interleaved CUDA-graph replays, L2 flushed; outputs compared bit for bit.
"""
import contextlib
import sys

import torch
from triton.experimental.gluon import language as gl

from lowbit import routing
from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16
from variants import KERNEL as sm90, patch_all
from lowbit.kernels.w4a16.indexed import w4a16_indexed, w4a16_indexed_config

AS_BUILT = sm90.gather_layout


def old_gather_layout(br: int, num_warps: int, wide_pieces: bool = False) -> gl.BlockedLayout:
    return AS_BUILT(br, num_warps, False)


def new_gather_layout(br: int, num_warps: int, wide_pieces: bool = False) -> gl.BlockedLayout:
    return AS_BUILT(br, num_warps, True)


@contextlib.contextmanager
def layout(fn):
    with patch_all("gather_layout", fn):
        yield


gen = torch.Generator(device="cuda").manual_seed(20)
E = 48
PROJ = (("gate_up", 4096, 7168), ("down", 7168, 2048))
tokens = [int(t) for t in sys.argv[1:]] or [1, 4, 8, 20, 50]
for tok in tokens:
    ids = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:8] for _ in range(tok)]).to(torch.int32)
    hit = int(torch.unique(ids).numel())
    for i, (proj, n, kk) in enumerate(PROJ):
        top_k = 8 if i == 0 else 1
        cfg = w4a16_indexed_config(tok * 8, E, n, kk, gluon=True)
        r = routing.moe_align_block_size(ids, cfg.block_m, E)
        w = pack_w4a16(make_weight(E, n, kk, "cuda"))
        a = torch.randn(tok if top_k == 8 else tok * 8, kk, device="cuda").to(torch.bfloat16)
        variants = {"old": old_gather_layout, "new": new_gather_layout}
        outs = {v: torch.full((tok * 8, n), float("nan"), dtype=torch.bfloat16, device="cuda") for v in variants}

        def launch(v):
            with layout(variants[v]):
                w4a16_indexed(a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k,
                              out=outs[v], config=cfg)
        t = measure_interleaved({v: (lambda v=v: launch(v)) for v in variants})
        same = torch.equal(outs["old"], outs["new"])
        print(f"t{tok} {proj:8} {cfg.engine} {cfg.block_n}x{cfg.block_m}x{cfg.num_stages}: old {t['old'].median_us:6.1f}"
              f"  new {t['new'].median_us:6.1f}  x{t['old'].median_us / t['new'].median_us:.3f}"
              f"  {'bit-identical' if same else 'DIFFERENT'}  ({hit * n * kk * (0.5 + 2 / 32) / t['new'].median_us / 1e6:.2f} TB/s)",
              flush=True)
