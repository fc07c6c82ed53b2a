"""Grouped masked tiles side by side on the bench's masked draws: the heuristics' tile against
fixed alternatives -- a probe, not a benchmark.

    python scripts/probes/masked_tiles.py [ep8_masked_32 ...]

Alternatives (``block_n x block_m / warps / stages``, engine ``gluon_rs``): 128x64 / 4 / 2 (the
one-warpgroup group loop by halves), 128x32 / 4 / 2 (group loop), 256x48 / 16 / 3 (the split
tile: 32 + 16 rows), 256x64 / 16 / 3. One process, interleaved CUDA-graph replays behind an L2
flush; the valid rows compared bit for bit against the heuristics' ("!" marks a difference)."""
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from half_acts import _masked_draws

from lowbit.bench.timing import measure_interleaved
from lowbit.kernels.w4a16.grouped import masked

TILES = {"128x64": (128, 64, 4, 2), "128x32": (128, 32, 4, 2), "256x48": (256, 48, 16, 3), "256x64": (256, 64, 16, 3)}


def main(names) -> None:
    for label, a, w, mm, em, cfg in _masked_draws(names):
        cfgs = {"heur": cfg}
        for k, (bn, bm, warps, stages) in TILES.items():
            cfgs[k] = dataclasses.replace(cfg, engine="gluon_rs", block_n=bn, block_m=bm, num_warps=warps,
                                          num_stages=stages)
        outs = {k: torch.full((a.shape[0], w.n), float("nan"), dtype=torch.bfloat16, device="cuda") for k in cfgs}
        t = measure_interleaved({k: (lambda k=k: masked(a, w, mm, em, out=outs[k], config=cfgs[k])) for k in cfgs},
                                rounds=30)
        valid = (torch.arange(a.shape[0] // w.num_experts, device="cuda")[None, :] < mm[:, None]).reshape(-1)
        ref = t["heur"].median_us
        cells = "  ".join(f"{k} {t[k].median_us:6.1f} x{ref / t[k].median_us:.3f}"
                          f"{'' if torch.equal(outs['heur'][valid], outs[k][valid]) else ' !'}" for k in TILES)
        print(f"{label:24} heur {cfg.block_n}x{cfg.block_m} {ref:6.1f}  {cells}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ("ep8_masked_16", "ep8_masked_32", "ep16_masked_32", "ep32_masked_32", "ep8_masked_64"))
