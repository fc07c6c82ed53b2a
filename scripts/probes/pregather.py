"""The indexed prefill tiles on rows gathered by cp.async inside the kernel against rows
pre-gathered into the routing's slot order and loaded by TMA -- a probe, not a benchmark. It
set `w4a16_indexed._PREGATHER`.

    python scripts/probes/pregather.py [ep8] [tp8] [gather] [gathersweep] [tiles]

Why (thirtieth session): `indexed_vs_contiguous.py` found the indexed 256x128 0.86-0.87x the
contiguous kernel on the same rows in order (Kimi EP8 shapes: gate_up 589.7 vs 514.9 us, down
348.1 vs 300.9), and ncu put the difference on the gather (LDGSTS: 11% of the warp samples,
MIO-throttled, delaying the words' shared-memory loads behind them). Pre-gathering writes every
routed row once more (`moe_routing.gather_indexed_rows`) and pays when the weight rows a byte
of activation meets are many (large N).

Each draw (the bench's ``ep8_indexed_t1024`` / ``tp8_indexed_t8192`` and random top-8 draws,
`variants.indexed_draws`) runs both routing blocks (64, 128) on their heuristics' tiles through
`hopper.indexed`'s launchers, without and with the pre-gathered rows; one process,
interleaved CUDA-graph replays behind an L2 flush (`measure_interleaved`); outputs compared bit
for bit with the in-kernel gather's ("!" marks a difference). ``gather``: the gather alone."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants as v

from lowbit import routing
from lowbit.bench.timing import measure_interleaved
from variants import KERNEL as m
from lowbit.routing.kernels import gather_indexed_rows
from lowbit.kernels.w4a16.indexed import w4a16_indexed_config


def report(head: str, fns: dict, outs: dict) -> None:
    """Time `fns` interleaved, then print each against the first, "!" where its output (`outs`,
    if it has one) differs bit for bit from the first's."""
    t = measure_interleaved(fns, rounds=30)
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    ref = next(iter(t))
    cells = "  ".join(f"{k} {t[k].median_us:7.1f} x{t[ref].median_us / t[k].median_us:.3f}"
                      f"{'' if k not in outs or torch.equal(outs[ref], outs[k]) else ' !'}" for k in t)
    print(f"{head}  {cells}", flush=True)


def compare(draws) -> None:
    for label, a, w, ids in draws:
        top_k = ids.shape[1] if a.shape[0] == ids.shape[0] else 1
        fns, outs = {}, {}
        for block in (64, 128):
            cfg = w4a16_indexed_config(ids.numel(), w.num_experts, w.n, w.k, block_m=block, gluon=True)
            tile = (cfg.block_n, block, cfg.num_warps, cfg.num_stages)
            r = routing.moe_align_block_size(ids, block, w.num_experts)
            for pre in (False, True):
                if pre and not m.pregather_ok(tile, w.k):
                    continue
                key = f"{tile[0]}x{block}{'+pre' if pre else ''}"
                o = torch.full((a.shape[0] * top_k, w.n), float("nan"), dtype=torch.bfloat16, device="cuda")
                outs[key] = o
                fns[key] = (lambda a=a, w=w, r=r, tile=tile, o=o, pre=pre, ws=cfg.engine == "gluon_ws":
                            (m.w4a16_indexed_pregathered_launch(a, w, r.sorted_token_ids, r.expert_ids,
                                                                r.num_tokens_post_padded, top_k, None, o, tile)
                             if pre else m.w4a16_indexed_sm90_launch(a, w, r.sorted_token_ids, r.expert_ids,
                                                                     r.num_tokens_post_padded, top_k, None, o, tile,
                                                                     True, ws)))
            if "gather" in sys.argv[1:]:
                fns[f"gather{block}"] = (lambda a=a, r=r: gather_indexed_rows(
                    a, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k))
        report(f"{label:28} tok_e {ids.numel() / w.num_experts:6.1f}", fns, outs)


def tiles() -> None:
    """The pre-gathered path's tiles side by side (``PREGATHER_CMP``: tiles as BWxBRxWARPSxSTAGES,
    comma-separated; the first is the reference) on the EP8 draws."""
    spec = os.environ.get("PREGATHER_CMP", "128x64x4x2,256x128x16x2,128x128x4x2")
    cmp = [tuple(int(x) for x in t.split("x")) for t in spec.split(",")]
    for label, a, w, ids in v.indexed_draws("ep8_indexed_t1024", (512, 768, 1536, 2048), 48,
                                            {"gate_up": (4096, 7168), "down": (7168, 2048)}, seed=13):
        top_k = ids.shape[1] if a.shape[0] == ids.shape[0] else 1
        fns, outs, routes = {}, {}, {}
        for tile in cmp:
            if tile[1] not in routes:
                routes[tile[1]] = routing.moe_align_block_size(ids, tile[1], w.num_experts)
            r = routes[tile[1]]
            key = "x".join(map(str, tile[:2])) + f"w{tile[2]}"
            o = torch.full((a.shape[0] * top_k, w.n), float("nan"), dtype=torch.bfloat16, device="cuda")
            outs[key] = o
            fns[key] = (lambda a=a, w=w, r=r, tile=tile, o=o: m.w4a16_indexed_pregathered_launch(
                a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, None, o, tile))
        report(f"{label:28} tok_e {ids.numel() / w.num_experts:6.1f}", fns, outs)


def gathersweep() -> None:
    """`gather_indexed_rows`' program shape (rows, columns, warps) on the bench's EP8 1024-token draws."""
    from lowbit.routing import kernels as mr

    for label, a, w, ids in v.indexed_draws("ep8_indexed_t1024", (), 48, {"gate_up": (4096, 7168),
                                                                          "down": (7168, 2048)}, seed=13):
        top_k = ids.shape[1] if a.shape[0] == ids.shape[0] else 1
        r = routing.moe_align_block_size(ids, 64, w.num_experts)
        fns = {}
        for rows, bk, warps in ((32, 256, 4), (16, 512, 4), (32, 512, 8), (64, 256, 8), (64, 128, 4), (8, 1024, 4)):
            def fn(rows=rows, bk=bk, warps=warps):
                mr._GATHER_ROWS, mr._GATHER_BK, mr._GATHER_WARPS = rows, bk, warps
                gather_indexed_rows(a, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k)
            fns[f"{rows}x{bk}w{warps}"] = fn
        t = measure_interleaved(fns, rounds=30)
        print(f"{label:28} gather " + "  ".join(f"{k} {t[k].median_us:6.1f}" for k in t), flush=True)


def ep8() -> None:
    compare(v.indexed_draws("ep8_indexed_t1024", (256, 384, 512, 768, 1152, 1536, 2048), 48,
                            {"gate_up": (4096, 7168), "down": (7168, 2048)}, seed=13))


def tp8() -> None:
    compare(v.indexed_draws("tp8_indexed_t8192", (6144, 12288), 384, {"gate_up": (512, 7168)}, seed=13))


if __name__ == "__main__":
    for part in [p for p in sys.argv[1:] if p != "gather"] or ("ep8", "tp8"):
        {"ep8": ep8, "tp8": tp8, "gathersweep": gathersweep, "tiles": tiles}[part]()
