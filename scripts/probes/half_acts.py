"""The indexed 128x64 group-loop tile with one step of activations refilled by halves
(`w4a16_sm90._rs_halves_mainloop`, 68 KB: three CTAs an SM) against the two-stage activation
ring it replaced (100 KB: two CTAs an SM) -- a probe, not a benchmark.

    python scripts/probes/half_acts.py [gemm] [masked] [masked64] [layer]

The "ring" variant (`variants.py` text edit) empties `HALF_ACT_TILES`. ``x`` = variant time /
kernel time (> 1: the kernel is faster).

gemm   Kimi EP8 `w4a16_indexed` with its heuristics' tile at 192-512 tokens (the bench's own
       ``ep8_indexed_t256`` draw first), gate_up and down.
masked `lowbit.w4a16_masked` on the bench's ``ep8_masked_16/32``, ``ep16_masked_32``, ``ep32_masked_32``
       draws (gate_up and down).
masked64  the bench's ``ep8_masked_64`` draw: its split 96 tile against the 128x64 by halves.
layer  `lowbit.moe_experts(path="indexed")` at 256 and 384 tokens.

"halves32" also refills the 128x32 group-loop tile by halves (52 KB: four CTAs an SM by shared
memory; 128 registers allow four).

One process, interleaved CUDA-graph replays behind an L2 flush (`measure_interleaved`);
outputs compared bit for bit ("!" marks a difference)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants as v

from lowbit.bench.cases import build_problem, select_cases
from variants import KERNEL as base

_TABLE = 'HALF_ACT_TILES = {"indexed": ((128, 64, 4, 2),), "masked": ((128, 64, 4, 2),), "contiguous": ()}'
RING = [(_TABLE, 'HALF_ACT_TILES = {"indexed": (), "masked": (), "contiguous": ()}')]
WIDE32 = [(_TABLE, 'HALF_ACT_TILES = {"indexed": ((128, 64, 4, 2), (128, 32, 4, 2)), '
                   '"masked": ((128, 64, 4, 2), (128, 32, 4, 2)), "contiguous": ()}')]
MODS = {"kernel": base, "ring": v.variant("ring", RING), "halves32": v.variant("halves32", WIDE32)}
E, H, I = 48, 7168, 2048


def gemm() -> None:
    v.compare_indexed(MODS, v.indexed_draws("ep8_indexed_t256", (96, 160, 192, 384, 512), E,
                                            {"gate_up": (2 * I, H), "down": (H, I)}, seed=5))


def _masked_draws(names):
    """(label, a, w, masked_m, expected_m, heuristics' config) of each bench case's projections."""
    from lowbit.formats.w4a16 import pack_w4a16_grouped
    from lowbit.kernels.w4a16.grouped import w4a16_grouped_config
    for name in names:
        case = select_cases([name])[0]
        for proj in ("gate_up", "down"):
            p = build_problem(case, proj, "cuda")
            w = pack_w4a16_grouped(p.weight, mode="masked")
            cfg = w4a16_grouped_config("masked", p.a.shape[0], w.n, w.k, w.num_experts, p.expected_m, gluon=True)
            yield f"{name} {proj}", p.a, w, p.masked.masked_m, p.expected_m, cfg


def masked() -> None:
    from lowbit.kernels.w4a16.grouped import masked as w4a16_masked
    for label, a, w, mm, em, cfg in _masked_draws(("ep8_masked_16", "ep8_masked_32", "ep16_masked_32",
                                                   "ep32_masked_32")):
        out = torch.full((a.shape[0], w.n), float("nan"), dtype=torch.bfloat16, device="cuda")
        v.compare(MODS, f"{label} {cfg.block_n}x{cfg.block_m}s{cfg.num_stages}",
                  lambda o, a=a, w=w, mm=mm, em=em, cfg=cfg: w4a16_masked(a, w, mm, em, out=o, config=cfg), out)


def masked64() -> None:
    """Masked 64 tok/expert (45-83 rows): its split 96 tile (heuristics) against the 128x64 by
    halves (two row blocks for an expert past 64 rows, the second on its half tail), current
    kernel only, valid rows compared."""
    from dataclasses import replace

    from lowbit.bench.timing import measure_interleaved
    from lowbit.kernels.w4a16.grouped import masked as w4a16_masked
    for label, a, w, mm, em, cfg in _masked_draws(("ep8_masked_64",)):
        cfgs = {f"{cfg.block_n}x{cfg.block_m}": cfg,
                "128x64h": replace(cfg, engine="gluon_rs", block_n=128, block_m=64, num_warps=4, num_stages=2)}
        outs = {k: torch.full((a.shape[0], w.n), float("nan"), dtype=torch.bfloat16, device="cuda") for k in cfgs}
        t = measure_interleaved({k: (lambda k=k: w4a16_masked(a, w, mm, em, out=outs[k], config=cfgs[k]))
                                 for k in cfgs}, rounds=60)
        valid = (torch.arange(a.shape[0] // w.num_experts, device="cuda")[None, :] < mm[:, None]).reshape(-1)
        ref, other = list(cfgs)
        same = torch.equal(outs[ref][valid], outs[other][valid])
        print(f"{label:22} " + "  ".join(f"{k} {t[k].median_us:7.1f}" for k in cfgs)
              + f"  x{t[ref].median_us / t[other].median_us:.3f}{'' if same else ' (outputs differ)'}", flush=True)


def layer() -> None:
    v.compare_layer(MODS, (256, 384), seed=6)


if __name__ == "__main__":
    for mode in sys.argv[1:] or ["gemm", "masked", "layer"]:
        {"gemm": gemm, "masked": masked, "masked64": masked64, "layer": layer}[mode]()
