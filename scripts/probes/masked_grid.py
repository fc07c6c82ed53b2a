"""The masked Gluon grid: one program a row block of max_m (``row_slots=0``) against the
expected-rows rule (`w4a16_sm90.masked_row_slots`), on the current kernels (a probe, not a
benchmark).

    python scripts/probes/masked_grid.py

Kimi EP8 masked gate_up / down (48 experts, counts 0.7-1.3x the nominal, max_m 256) on the
heuristic's tile for 8, 16 and 32 tok/expert; interleaved CUDA-graph replays
(`measure_interleaved`), L2 flushed; the valid rows must be bit-identical. The sixteenth
session's numbers (`masked_row_slots`' docstring) came from an A/B of the commit before the
change against the one after; this probe repeats the comparison within one version.
"""
import torch

from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16_grouped
from variants import KERNEL as sm90
from lowbit.kernels.w4a16.grouped import MASKED_SPREAD

E, H, I, MAX_M = 48, 7168, 2048, 256


def main() -> None:
    gen = torch.Generator().manual_seed(5)
    for rows, tile in ((8, (64, 16, 4, 3)), (16, (64, 32, 4, 4)), (32, (256, 64, 16, 3))):
        counts = torch.randint(int(0.7 * rows + 0.999), int(1.3 * rows) + 1, (E,), generator=gen).to(torch.int32).cuda()
        slots = sm90.masked_row_slots(MASKED_SPREAD * rows, MAX_M, tile[1])
        valid = torch.cat([torch.arange(e * MAX_M, e * MAX_M + int(c)) for e, c in enumerate(counts.tolist())]).cuda()
        for proj, n, k in (("gate_up", 2 * I, H), ("down", H, I)):
            w = pack_w4a16_grouped(make_weight(E, n, k, "cuda"), mode="masked")
            a = torch.randn(E * MAX_M, k, device="cuda").to(torch.bfloat16)
            outs = {s: torch.zeros(a.shape[0], n, dtype=torch.bfloat16, device="cuda") for s in (0, slots)}
            fns = {s: (lambda s: lambda: sm90.w4a16_grouped_sm90_launch(a, w, counts, outs[s], tile, MAX_M, True,
                                                                        row_slots=s))(s) for s in outs}
            t = measure_interleaved(fns)
            same = torch.equal(outs[0][valid], outs[slots][valid])
            print(f"masked {rows:>2} tok/expert {proj:7} {tile[0]}x{tile[1]}: a program a block of max_m "
                  f"{t[0].median_us:7.1f} us, {slots} a expert {t[slots].median_us:7.1f} us "
                  f"({t[0].median_us / t[slots].median_us:.2f}x, {'equal' if same else 'DIFFERENT'})", flush=True)


if __name__ == "__main__":
    main()
