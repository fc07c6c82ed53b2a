"""Grouped contiguous on the one-warpgroup 128x64 tile with its activations refilled by halves
(`w4a16_sm90.HALF_ACT_TILES`, three CTAs an SM; 64-row M tiles, two a 128-row segment) against
its default, the four-warpgroup 256x128 -- a probe, not a benchmark.

    python scripts/probes/contiguous_halves.py

The bench's ``ep8_contiguous_128/256/512`` draws, gate_up and down, through `lowbit.contiguous`.
The "halves" variant (`variants.patch_all` of `tiles.half_acts`) refills the contiguous
128x64's activations by halves too; its call pins the 128x64 tile. One process, interleaved CUDA-graph replays
behind an L2 flush; the valid rows (``m_indices >= 0``) compared bit for bit."""
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants as v

from lowbit.bench.cases import build_problem, select_cases
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16_grouped
from lowbit.kernels.w4a16.grouped import contiguous, w4a16_grouped_config



def _halves(tile, warp_specialize, layout, _rule=v.tiles.half_acts):
    """`tiles.half_acts` with the contiguous layout's 128x64 as the masked one's."""
    return _rule(tile, warp_specialize, "masked" if layout == "contiguous" else layout)


def main() -> None:
    for name in ("ep8_contiguous_128", "ep8_contiguous_256", "ep8_contiguous_512"):
        case = select_cases([name])[0]
        for proj in ("gate_up", "down"):
            p = build_problem(case, proj, "cuda")
            w = pack_w4a16_grouped(p.weight, mode="contiguous")
            mi = p.contiguous.m_indices
            cfg = w4a16_grouped_config("contiguous", p.a.shape[0], w.n, w.k, w.num_experts, 0, gluon=True)
            c64 = dataclasses.replace(cfg, engine="gluon_rs", block_n=128, block_m=64, num_warps=4, num_stages=2)
            outs = {k: torch.full((p.a.shape[0], w.n), float("nan"), dtype=torch.bfloat16, device="cuda")
                    for k in ("default", "halves")}

            def halves(o=outs["halves"]):
                with v.patch_all("half_acts", _halves):
                    contiguous(p.a, w, mi, out=o, config=c64)
            t = measure_interleaved({"default": lambda: contiguous(p.a, w, mi, out=outs["default"], config=cfg),
                                     "halves": halves}, rounds=40)
            ok = mi >= 0
            same = torch.equal(outs["default"][ok], outs["halves"][ok])
            print(f"{name} {proj:8} {cfg.block_n}x{cfg.block_m} {t['default'].median_us:7.1f}  128x64h "
                  f"{t['halves'].median_us:7.1f}  x{t['default'].median_us / t['halves'].median_us:.3f}"
                  f"{'' if same else ' (outputs differ)'}", flush=True)


if __name__ == "__main__":
    main()
