"""Two accumulators in the register-A main loop (`w4a16_sm90.SPLIT_ACC_TILES`) against one, on
the grouped masked kernel (a probe, not a benchmark).

    python scripts/probes/split_acc.py

Kimi EP8 masked gate_up / down (48 experts, counts 0.7-1.3x the nominal, max_m 256) with the
64x16, 64x32 and 128x64 register-A tiles, each with and without the split; interleaved CUDA-graph
replays (`measure_interleaved`), L2 flushed. The relative error is against the unsplit output
(the FP32 sums are regrouped: ~1e-4 at bf16 output).
"""
import torch

from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16_grouped
from variants import KERNEL as sm90, tile_form

E, H, I, MAX_M = 48, 7168, 2048, 256


def _launch(a, w, counts, out, tile, split: bool):
    def fn():
        with tile_form("masked", tile, split_acc=split):
            sm90.w4a16_grouped_sm90_launch(a, w, counts, out, tile, MAX_M, regs_a=True)
    return fn


def main() -> None:
    gen = torch.Generator().manual_seed(5)
    for rows, tile in ((8, (64, 16, 4, 3)), (16, (64, 32, 4, 4)), (32, (128, 64, 8, 3)), (64, (128, 64, 8, 3))):
        counts = torch.randint(int(0.7 * rows + 0.999), int(1.3 * rows) + 1, (E,), generator=gen).to(torch.int32).cuda()
        for proj, n, k in (("gate_up", 2 * I, H), ("down", H, I)):
            w = pack_w4a16_grouped(make_weight(E, n, k, "cuda"), mode="masked")
            a = torch.randn(E * MAX_M, k, device="cuda").to(torch.bfloat16)
            outs = {s: torch.zeros(a.shape[0], n, dtype=torch.bfloat16, device="cuda") for s in (False, True)}
            t = measure_interleaved({s: _launch(a, w, counts, outs[s], tile, s) for s in (False, True)})
            err = ((outs[True].float() - outs[False].float()).norm() / outs[False].float().norm()).item()
            print(f"masked {rows:>2} tok/expert {proj:7} {tile[0]}x{tile[1]}s{tile[3]}: one accumulator "
                  f"{t[False].median_us:7.1f} us, two {t[True].median_us:7.1f} us "
                  f"({t[False].median_us / t[True].median_us:.2f}x, rel {err:.0e})", flush=True)


if __name__ == "__main__":
    main()
