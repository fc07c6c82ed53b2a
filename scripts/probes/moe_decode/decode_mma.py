"""The tensor-core output-centric decode stages, one at a time (a probe, not a benchmark).

    python scripts/probes/moe_decode/decode_mma.py [mxfp8] [tokens ...]

Kimi EP8 (48 experts, H 7168, I 2048, top-8), CUDA graph, L2 flushed by a read. For each batch
and tile: gate_up and down of the ``mma`` engine alone, as us and TB/s of the bytes of the
experts hit (packed words + scales; the floor at 4.50 TB/s beside it), and the fma / dot
engine the Triton heuristics pick, on identical inputs; tiles are (MMA columns, gate_up warp
split, down warp split, ring stages), `*` the heuristic's. Outputs of the mma tiles are compared
with the Triton engine's (relative Frobenius error: same function, different summation order).
``mxfp8``: MXFP8 weights (the same codes natural for the Triton engine, k256-interleaved for the
mma engine); bytes = E4M3 codes + E8M0 scales of the experts hit (the mma engine reads bf16
multipliers instead of the E8M0 bytes: 1/32 more).
"""
import sys

import torch

from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure
from lowbit.formats import pack_mxfp8_experts
from lowbit.formats.w4a16 import pack_w4a16
from lowbit.kernels.moe_decode.op import DecodeConfig, moe_decode_config, moe_decode_down, moe_decode_gate_up
from lowbit.testing import random_topk_ids, random_topk_weights

E, H, I, K = 48, 7168, 2048, 8
BW = 4.50e12


def _us(fn) -> float:
    return measure(fn, cuda_graph=True, rep_ms=40).median_us


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def main() -> None:
    fp8 = "mxfp8" in sys.argv[1:]
    batches = [int(a) for a in sys.argv[1:] if a != "mxfp8"] or [1, 2, 4, 8, 16, 32]
    gen = torch.Generator().manual_seed(7)
    if fp8:
        nat = [pack_mxfp8_experts(torch.randn(E, n, k, generator=gen).mul(0.05).cuda()) for n, k in ((2 * I, H), (H, I))]
        w13_t, w2_t = nat
        w13, w2 = (pack_mxfp8_experts((w.codes, w.scales_e8m0), layout="k256-interleaved") for w in nat)
        fmt_t, fmt, per_w, per_g = "mxfp8", "mxfp8_k256", 1, 1
    else:
        w13 = w13_t = pack_w4a16(make_weight(E, 2 * I, H, "cuda"))
        w2 = w2_t = pack_w4a16(make_weight(E, H, I, "cuda"))
        fmt_t, fmt, per_w, per_g = "int4", "int4", 0.5, 2
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
        b_gu = hit * (2 * I * H * per_w + 2 * I * H // 32 * per_g)
        b_dn = hit * (H * I * per_w + H * I // 32 * per_g)
        tri = moe_decode_config(m, K, E, H, I, fmt_t, False)
        act_t = moe_decode_gate_up(hidden, ids, w13_t, config=tri)
        out_t = moe_decode_down(act_t, ids, tw, w2_t, config=tri)
        t_gu = _us(lambda: moe_decode_gate_up(hidden, ids, w13_t, out=act_t, config=tri))
        t_dn = _us(lambda: moe_decode_down(act_t, ids, tw, w2_t, out=out_t, config=tri))
        floor = (b_gu + b_dn) / BW * 1e6
        print(f"{m:>3} {hit:>4} {tri.engine + ' (triton)':>16} {t_gu:>10.1f} {b_gu / t_gu / 1e6:>5.2f} {t_dn:>8.1f} "
              f"{b_dn / t_dn / 1e6:>5.2f} {t_gu + t_dn:>7.1f} {floor:>6.1f}", flush=True)
        for tile in tiles.get(m, [None]):
            cfg = moe_decode_config(m, K, E, H, I, fmt, True)
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
