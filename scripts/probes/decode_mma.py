"""The tensor-core output-centric decode stages, one at a time (a probe, not a benchmark).

    python scripts/probes/decode_mma.py [tokens ...]

Kimi EP8 (48 experts, H 7168, I 2048, top-8), CUDA graph, L2 flushed by a read. For each batch
and tile: gate_up and down of the ``mma`` engine alone, as us and TB/s of the bytes of the
experts hit (packed words + scales; the floor at 4.50 TB/s beside it), and the fma / dot
engine the Triton heuristics pick, on identical inputs; tiles are (MMA columns, gate_up warp
split, down warp split, ring stages), `*` the heuristic's. Outputs of the mma tiles are compared
with the Triton engine's (relative Frobenius error: same function, different summation order).
"""
import sys

import torch

from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure
from lowbit.formats.w4a16 import pack_w4a16
from lowbit.kernels.moe_decode import DecodeConfig, moe_decode_config, moe_decode_down, moe_decode_gate_up
from lowbit.testing import random_topk_ids, random_topk_weights

E, H, I, K = 48, 7168, 2048, 8
BW = 4.50e12


def _us(fn) -> float:
    return measure(fn, cuda_graph=True, rep_ms=40).median_us


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def main() -> None:
    batches = [int(a) for a in sys.argv[1:]] or [1, 2, 4, 8, 16, 32]
    w13 = pack_w4a16(make_weight(E, 2 * I, H, "cuda"))
    w2 = pack_w4a16(make_weight(E, H, I, "cuda"))
    gen = torch.Generator().manual_seed(7)
    # (tokens, split_gate_up, split_down, stages); None = the heuristic's own choice
    tiles = {1: [None, (8, 2, 4, 3), (8, 2, 4, 5), (8, 2, 8, 3), (8, 1, 2, 4)],
             2: [None, (8, 2, 2, 3), (8, 2, 4, 4)],
             4: [None, (8, 2, 2, 3), (8, 1, 2, 4)],
             8: [None, (8, 2, 2, 3)]}
    import os
    if os.environ.get("DECODE_MMA_TILES"):  # e.g. "1:8,2,4,4;2:8,2,2,4"
        tiles = {}
        for item in os.environ["DECODE_MMA_TILES"].split(";"):
            mm, t = item.split(":")
            tiles.setdefault(int(mm), [None]).append(tuple(int(v) for v in t.split(",")))
    print(f"{'M':>3} {'hit':>4} {'tile':>16} {'gate_up us':>10} {'TB/s':>5} {'down us':>8} {'TB/s':>5} "
          f"{'sum':>7} {'floor':>6} {'err act':>8} {'err out':>8}", flush=True)
    for m in batches:
        ids = random_topk_ids(m, K, E, generator=gen).cuda()
        tw = random_topk_weights(m, K, generator=gen).cuda()
        hidden = torch.randn(m, H, generator=gen).to(torch.bfloat16).cuda()
        hit = int(torch.unique(ids).numel())
        b_gu = hit * (2 * I * H // 2 + 2 * I * H // 32 * 2)
        b_dn = hit * (H * I // 2 + H * I // 32 * 2)
        tri = moe_decode_config(m, K, E, H, I, "int4", False)
        act_t = moe_decode_gate_up(hidden, ids, w13, config=tri)
        out_t = moe_decode_down(act_t, ids, tw, w2, config=tri)
        t_gu = _us(lambda: moe_decode_gate_up(hidden, ids, w13, out=act_t, config=tri))
        t_dn = _us(lambda: moe_decode_down(act_t, ids, tw, w2, out=out_t, config=tri))
        floor = (b_gu + b_dn) / BW * 1e6
        print(f"{m:>3} {hit:>4} {tri.engine + ' (triton)':>16} {t_gu:>10.1f} {b_gu / t_gu / 1e6:>5.2f} {t_dn:>8.1f} "
              f"{b_dn / t_dn / 1e6:>5.2f} {t_gu + t_dn:>7.1f} {floor:>6.1f}", flush=True)
        for tile in tiles.get(m, [None]):
            cfg = moe_decode_config(m, K, E, H, I, "int4", True)
            if tile is not None:
                tk, sg, sd, stg = tile
                cfg = DecodeConfig("mma", 16, 16, tk, 4, stg, split_gate_up=sg, split_down=sd)
            act = moe_decode_gate_up(hidden, ids, w13, config=cfg)
            out = moe_decode_down(act_t, ids, tw, w2, config=cfg)
            t_gu = _us(lambda: moe_decode_gate_up(hidden, ids, w13, out=act, config=cfg))
            t_dn = _us(lambda: moe_decode_down(act_t, ids, tw, w2, out=out, config=cfg))
            name = f"mma {cfg.tokens}/{cfg.split_gate_up}/{cfg.split_down}/s{cfg.num_stages}" + ("*" if tile is None else "")
            print(f"{m:>3} {hit:>4} {name:>16} {t_gu:>10.1f} {b_gu / t_gu / 1e6:>5.2f} "
                  f"{t_dn:>8.1f} {b_dn / t_dn / 1e6:>5.2f} {t_gu + t_dn:>7.1f} {floor:>6.1f} "
                  f"{_rel(act, act_t):>8.1e} {_rel(out, out_t):>8.1e}", flush=True)


if __name__ == "__main__":
    main()
