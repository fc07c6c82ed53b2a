"""Grouped masked W4A16 tiles side by side on the bench's masked draws: the heuristics' tile
against fixed alternatives (a probe, not a benchmark).

    python scripts/probes/w4a16/masked_tiles.py [ep8_masked_32 ...]

Alternatives (``block_n x block_m / warps / stages``, engine ``gluon_rs``): 128x64 / 4 / 2 (the
one-warpgroup group loop by halves), 128x32 / 4 / 2 (group loop), 256x48 / 16 / 3 (the split
tile: 32 + 16 rows), 256x64 / 16 / 3. One process, interleaved CUDA-graph replays behind an L2
flush; the valid rows compared bit for bit against the heuristics' ("!" marks a difference).
Each line: the heuristics' time, then each alternative's and heuristics / alternative (> 1: the
alternative is faster)."""
import dataclasses
import sys

import torch

from lowbit import w4a16_masked
from lowbit.bench.cases import build_problem, select_cases
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16_grouped
from lowbit.kernels.w4a16.grouped import w4a16_grouped_config

TILES = {"128x64": (128, 64, 4, 2), "128x32": (128, 32, 4, 2), "256x48": (256, 48, 16, 3), "256x64": (256, 64, 16, 3)}


def masked_draws(names):
    """(label, a, w, masked_m, expected_m, heuristics' config) of each bench case's projections."""
    for name in names:
        case = select_cases([name])[0]
        for proj in ("gate_up", "down"):
            p = build_problem(case, proj, "cuda")
            w = pack_w4a16_grouped(p.weight, mode="masked")
            cfg = w4a16_grouped_config("masked", p.a.shape[0], w.n, w.k, w.num_experts, p.expected_m, gluon=True)
            yield f"{name} {proj}", p.a, w, p.masked.masked_m, p.expected_m, cfg


def main(names) -> None:
    for label, a, w, mm, em, cfg in masked_draws(names):
        cfgs = {"heur": cfg}
        for k, (bn, bm, warps, stages) in TILES.items():
            cfgs[k] = dataclasses.replace(cfg, engine="gluon_rs", block_n=bn, block_m=bm, num_warps=warps,
                                          num_stages=stages)
        outs = {k: torch.full((a.shape[0], w.n), float("nan"), dtype=torch.bfloat16, device="cuda") for k in cfgs}
        t = measure_interleaved({k: (lambda k=k: w4a16_masked(a, w, mm, em, out=outs[k], config=cfgs[k])) for k in cfgs},
                                rounds=30)
        valid = (torch.arange(a.shape[0] // w.num_experts, device="cuda")[None, :] < mm[:, None]).reshape(-1)
        ref = t["heur"].median_us
        cells = "  ".join(f"{k} {t[k].median_us:6.1f} x{ref / t[k].median_us:.3f}"
                          f"{'' if torch.equal(outs['heur'][valid], outs[k][valid]) else ' !'}" for k in TILES)
        print(f"{label:24} heur {cfg.block_n}x{cfg.block_m} {ref:6.1f}  {cells}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ("ep8_masked_8", "ep8_masked_16", "ep8_masked_32", "ep16_masked_32", "ep32_masked_32",
                          "ep8_masked_64"))
