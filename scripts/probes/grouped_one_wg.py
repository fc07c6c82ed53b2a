"""The grouped contiguous kernel's 128-row blocks on the one-warpgroup 128x128 tile (group loop at
240 registers, activations one step refilled by halves, two CTAs an SM) against their default
four-warpgroup 256x128 -- a probe, not a benchmark.

    python scripts/probes/grouped_one_wg.py [rows ...]      # rows an expert, default 128 256 512

Why (thirtieth session): on rows pre-gathered into the indexed routing's slot order -- the
contiguous kernel's load with the indexed epilogue -- that tile ran 1.03-1.11x the 256x128 at
Kimi EP8 768-2048 tokens (`pregather.py tiles`, `w4a16_sm90.PREGATHER_BLOCK_TILES`). The
contiguous kernel runs the 256x128 at one CTA an SM (ep8_contiguous_512: 0.92x Humming). The
tile refills its activations by halves in memory only (`variants.patch_all` of `tiles.half_acts`); compiled
offline in the thirtieth session: 238 registers, no spill, 100 KB of shared memory.

Kimi EP8 gate_up / down, 48 experts x `rows` rows (every segment full), one process,
interleaved CUDA-graph replays behind an L2 flush (`measure_interleaved`); outputs compared bit
for bit with the default tile's ("!" marks a difference).

Result (H200, thirty-first session, call 1, default / 128x128 us): 128 rows gate_up 519.3 / 543.3,
down 298.5 / 303.3; 256 rows 1026.3 / 1073.1, 578.6 / 574.0; 512 rows 2184.3 / 2216.4, 1156.0 /
1128.3 (0.96-1.03x, bit-identical): not adopted."""
import sys

import torch

from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16_grouped
from lowbit.kernels.w4a16 import tiles
from lowbit.kernels.w4a16.grouped import w4a16_grouped_config
from variants import KERNEL as m, patch_all

ONE_WG = (128, 128, 4, 2)


def _halves(tile, warp_specialize, layout, _rule=tiles.half_acts):
    """`tiles.half_acts`, and the one-warpgroup 128x128 refilled by halves on the contiguous layout too."""
    return _rule(tile, warp_specialize, layout) or (tuple(tile) == ONE_WG and tiles.group_loop(tile, warp_specialize))


def main(rows_list) -> None:
    gen = torch.Generator(device="cuda").manual_seed(30)
    for rows in rows_list:
        for proj, n, k in (("gate_up", 4096, 7168), ("down", 7168, 2048)):
            m_rows = 48 * rows
            a = torch.randn(m_rows, k, generator=gen, device="cuda").to(torch.bfloat16)
            w = pack_w4a16_grouped(make_weight(48, n, k, "cuda"), mode="contiguous")
            m_idx = torch.arange(48, device="cuda", dtype=torch.int32).repeat_interleave(rows)
            cfg = w4a16_grouped_config("contiguous", m_rows, n, k, 48, 0, gluon=True)
            tiles_ = {"default": (cfg.block_n, cfg.block_m, cfg.num_warps, cfg.num_stages), "128x128w4": ONE_WG}
            outs = {name: torch.full((m_rows, n), float("nan"), dtype=torch.bfloat16, device="cuda") for name in tiles_}
            def launch(t, o):
                with patch_all("half_acts", _halves):
                    m.w4a16_grouped_sm90_launch(a, w, m_idx, o, t, regs_a=True)
            fns = {name: (lambda t=t, o=outs[name]: launch(t, o)) for name, t in tiles_.items()}
            t = measure_interleaved(fns, rounds=30)
            for f in fns.values():
                f()
            torch.cuda.synchronize()
            same = torch.equal(outs["default"], outs["128x128w4"])
            d = t["default"].median_us
            print(f"contiguous {rows} rows/expert {proj:8} default {tiles_['default']} {d:7.1f}  128x128w4 "
                  f"{t['128x128w4'].median_us:7.1f} x{d / t['128x128w4'].median_us:.3f}{'' if same else ' !'}",
                  flush=True)


if __name__ == "__main__":
    main([int(r) for r in sys.argv[1:]] or [128, 256, 512])
