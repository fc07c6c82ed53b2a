"""The N-loop kernel's half-row tail (`w4a16_sm90.NLOOP_HALF_TAIL_TILES`: a routing block with no
route in its second half runs the half-row tile) against the kernel without it -- a probe, not
a benchmark.

    python scripts/probes/nloop_tail.py

Kimi TP8 down (384 experts, N 7168, K 256: one K step, the N-loop kernel) through
`w4a16_indexed` with its heuristics' tile: the bench's ``tp8_indexed_t8192`` draw (171 routes an
expert: 128-row blocks, every other one ~43 routes), then random draws at 2048 / 4096 tokens
(64-row blocks), 1024 (32-row blocks: no tail) and 512 / 128 / 32 (16-row blocks). The "notail" variant
(`variants.py` text edit) empties the table; "ntN" loops over N weight tiles a program
whatever the grid (the kernel: `nloop_n_tiles` picks from `NLOOP_N_TILES`; 8 before). One process, interleaved CUDA-graph replays behind
an L2 flush; outputs compared bit for bit ("!" marks a difference)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants as v

from lowbit.kernels.w4a16 import hopper as base

_TABLE = "NLOOP_HALF_TAIL_TILES = tuple(t for t in NLOOP_TILES if t[1] == 128)"
_CHUNK = "NLOOP_N_TILES = (56, 28, 14, 8)\n"
MODS = {"kernel": base, "notail": v.variant("notail", [(_TABLE, "NLOOP_HALF_TAIL_TILES = ()")]),
        **{f"nt{n}": v.variant(f"nt{n}", [(_CHUNK, f"NLOOP_N_TILES = ({n},)\n")]) for n in (8, 14, 28, 56)}}


def main() -> None:
    v.compare_indexed(MODS, v.indexed_draws("tp8_indexed_t8192", (4096, 2048, 1024, 512, 128, 32), 384,
                                            {"down": (7168, 256)}, seed=7))


if __name__ == "__main__":
    main()
