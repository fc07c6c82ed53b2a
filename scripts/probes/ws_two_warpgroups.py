"""256 weight rows on TWO consumer warpgroups (``num_warps=8``, 128 rows each) plus the 4-warp
gather producer, warp-specialized (`w4a16_sm90._ws_mainloop`, `_ws_groups_partition`) -- the
layout of Humming's prefill tile -- against the indexed defaults -- a probe, not a benchmark.

    python scripts/probes/ws_two_warpgroups.py compile   # no GPU needed
    python scripts/probes/ws_two_warpgroups.py           # H200: the A/B
    python scripts/probes/ws_two_warpgroups.py ncu ws256x128   # three launches of one variant, for ncu

Why: the four-warpgroup tiles cannot take a producer (20 warps leave a consumer 112 registers:
wgmmas serialized, C7512), and the 256x128 tile's top stall is its warpgroups' wait for their
own wgmma (ncu, twenty-eighth session). With two consumer warpgroups the producer's
``setmaxnreg`` leaves each consumer (65536 - 128 x 64) / 256 = 224 registers. Twenty-eighth
session, compile only (`compile`): (256, 128, 8, 2) and (256, 64, 8, 3) build at the 168-register
launch cap with no spills and no ptxas C75xx, 205 / 209 KB of shared memory; (256, 128, 8, 3)
does not fit. The PTX raises the consumers to 240 registers (``setmaxnreg.inc 240``) and the
256x128's SASS uses up to R210: the 128 accumulator registers a thread fit beside the words and
two group fragments. Its consumer loop is 550 instructions a K step (dequantization 384: twice a
four-warpgroup warp's rows), 4 partition barriers and 4 mbarrier ops; the producer's about 400.
Not yet timed (the session's device time ran out).

The A/B (one process, interleaved CUDA-graph replays behind an L2 flush; outputs compared bit
for bit with the first, "!" marks a difference), through `w4a16_sm90.w4a16_indexed_sm90_launch`
with the tables extended in memory: the bench's ``ep8_indexed_t1024`` gate_up / down and
``tp8_indexed_t8192`` gate_up draws; the 128-row block on 256x128 (16 warps, the old default)
and on the new 256x128 (8 warps + producer), the 64-row block on the 128x64 by halves (the
default since the twenty-eighth session) and on the new 256x64 (8 warps + producer, 3 stages)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from variants import KERNEL as m

NEW_TILES = ((256, 128, 8, 2), (256, 64, 8, 3))
m.INDEXED_WS_TILES = tuple(m.INDEXED_WS_TILES) + NEW_TILES  # the compile tier and the launcher read it
VARIANTS = (("rs256x128", 128, (256, 128, 16, 2), False), ("halves128x64", 64, (128, 64, 4, 2), False),
            ("ws256x128", 128, (256, 128, 8, 2), True), ("ws256x64", 64, (256, 64, 8, 3), True))


def compile_only() -> None:
    from lowbit.kernels import compile_tier as ct
    for cfg in ct.all_configs():
        if "gluon_ws" in cfg.name and "BW=256" in cfg.name and ",w=8," in cfg.name:
            r = ct.compile_sm90(cfg)
            print(f"{'ok ' if r.ok else 'BAD'} {cfg.name} regs {r.registers} smem {r.shared_bytes} spill "
                  f"{r.spill_bytes} {' '.join(r.ptxas_warnings)} {(r.error or '')[-200:]}", flush=True)


def ab() -> None:
    import variants as v

    from lowbit import routing
    from lowbit.bench.timing import measure_interleaved

    draws = v.indexed_draws("ep8_indexed_t1024", (), 48, {"gate_up": (4096, 7168), "down": (7168, 2048)}, seed=1)
    draws += v.indexed_draws("tp8_indexed_t8192", (), 384, {"gate_up": (512, 7168)}, seed=1)
    for label, a, w, ids in draws:
        top_k = ids.shape[1] if a.shape[0] == ids.shape[0] else 1
        fns, outs = {}, {}
        for name, block, tile, ws in VARIANTS:
            r = routing.moe_align_block_size(ids, block, w.num_experts)
            outs[name] = o = torch.full((a.shape[0] * top_k, w.n), float("nan"), dtype=torch.bfloat16, device="cuda")
            fns[name] = (lambda r=r, o=o, tile=tile, ws=ws: m.w4a16_indexed_sm90_launch(
                a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, None, o, tile, True, ws))
        t = measure_interleaved(fns, rounds=30)
        torch.cuda.synchronize()
        ref = VARIANTS[0][0]
        print(f"{label:28} " + "  ".join(f"{k} {t[k].median_us:7.1f}{'' if torch.equal(outs[ref], outs[k]) else ' !'}"
                                         for k in fns), flush=True)


def ncu(name: str, reps: int = 3) -> None:
    """`reps` launches of variant `name` on the bench's ``ep8_indexed_t1024`` gate_up draw (for
    ``ncu --launch-skip 1 --launch-count 1 -k regex:w4a16_indexed``)."""
    import variants as v

    from lowbit import routing
    _, block, tile, ws = next(x for x in VARIANTS if x[0] == name)
    label, a, w, ids = v.indexed_draws("ep8_indexed_t1024", (), 48, {"gate_up": (4096, 7168)}, seed=1)[0]
    r = routing.moe_align_block_size(ids, block, w.num_experts)
    o = torch.empty((a.shape[0] * ids.shape[1], w.n), dtype=torch.bfloat16, device="cuda")
    for _ in range(reps):
        m.w4a16_indexed_sm90_launch(a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, ids.shape[1],
                                    None, o, tile, True, ws)
    torch.cuda.synchronize()
    print(label, name, flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["ncu"]:
        ncu(sys.argv[2])
    else:
        compile_only() if sys.argv[1:] == ["compile"] else ab()
