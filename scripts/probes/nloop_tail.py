"""The N-loop kernel's half-row tail (`tiles.RegisterATile.nloop_half_tail`: a routing block with no
route in its second half runs the half-row tile) against the kernel without it -- a probe, not
a benchmark.

    python scripts/probes/nloop_tail.py

Kimi TP8 down (384 experts, N 7168, K 256: one K step, the N-loop kernel) through
`w4a16_indexed` with its heuristics' tile: the bench's ``tp8_indexed_t8192`` draw (171 routes an
expert: 128-row blocks, every other one ~43 routes), then random draws at 2048 / 4096 tokens
(64-row blocks), 1024 (32-row blocks: no tail) and 512 / 128 / 32 (16-row blocks). The "notail" variant
(`variants.tile_form`) turns the 128-row tile's tail off; "ntN" loops over N weight tiles a
program whatever the grid (`heuristics.nloop_n_tiles` picks from `tiles.NLOOP_N_TILES`). One process, interleaved CUDA-graph replays behind
an L2 flush; outputs compared bit for bit ("!" marks a difference)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants as v

import contextlib

from lowbit.kernels.w4a16 import heuristics, tiles


@contextlib.contextmanager
def n_tiles(n: int):
    """Every N-loop program over `n` weight tiles (the only count the tables offer)."""
    with v.patch(tiles, "NLOOP_N_TILES", (n,)), v.patch(heuristics, "NLOOP_N_TILES", (n,)):
        yield


MODS = {"kernel": v.KERNEL, "notail": lambda: v.tile_form("indexed", (128, 128, 8, 2), nloop_half_tail=False),
        **{f"nt{n}": (lambda n=n: n_tiles(n)) for n in (8, 14, 28, 56)}}


def main() -> None:
    v.compare_indexed(MODS, v.indexed_draws("tp8_indexed_t8192", (4096, 2048, 1024, 512, 128, 32), 384,
                                            {"down": (7168, 256)}, seed=7))


if __name__ == "__main__":
    main()
