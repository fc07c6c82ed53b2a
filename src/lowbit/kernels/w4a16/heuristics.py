"""W4A16 launch heuristics: pure functions of the problem shape returning a `W4A16Config` with its
reason, memoized per shape and ``LOWBIT_W4A16_*`` / ``LOWBIT_W4A16_GROUPED_*`` overrides
(`lowbit.runtime.overrides`). Imports the tile tables (`tiles`), never an engine.

Indexed layout (`w4a16_indexed_config`): the routing block (= the M tile) and the engine by
tokens per expert, ``tok_e = M * top_k / E``; the Hopper tile, its variant (group loop, tails,
N loop, pre-gathered rows) and the K shares. Grouped layouts (`w4a16_grouped_config`):
contiguous takes the largest tile, masked the tile holding ``1.3 x expected_m`` rows.

Provenance lines: H200, date, the commit that recorded the figure, the figure (us; Kimi K2
gate_up / down; EP8: 48 local experts, TP8: 384 experts of an eighth of N or K).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from functools import lru_cache

from ...routing.layouts import CONTIGUOUS_ALIGNMENT
from ...runtime import overrides
from ...runtime.device import H200_NUM_SMS
from ...runtime.overrides import parse_override
from .tiles import (
    GLUON_ENGINES,
    GLUON_RS_TILES,
    GLUON_SPLIT_TILES,
    GLUON_SPLIT_WS_TILES,
    GLUON_TILES,
    GLUON_WS_TILES,
    GROUP_LOOP_MAXNREG,
    INDEXED_RS_TILES,
    INDEXED_TILES,
    INDEXED_WS_TILES,
    NLOOP_CTAS_PER_SM,
    NLOOP_HALF_TAIL_TILES,
    NLOOP_N_TILES,
    NLOOP_TILES,
    PREGATHER_BLOCK_TILES,
    PREGATHER_TILES,
    REGISTER_A_ENGINES,
    SHORT_K_STEPS,
    SHORT_K_TILES,
    THIN_GRID_TILES,
    VALIDATED_TILES,
    half_acts,
    half_tail,
    k_split_ok,
    nloop_tile_counts,
    split_form,
    split_rows,
)

__all__ = [
    "GROUPED_ENV_OVERRIDES", "INDEXED_ENV_OVERRIDES", "MASKED_SPREAD", "PREGATHER_ENV", "W4A16Config",
    "W4A16IndexedConfig", "apply_env_overrides", "avoid_miscompile", "env_key", "env_value",
    "explain_w4a16_grouped_config", "explain_w4a16_indexed_config", "group_loop_tile", "grouped_engine_tiles",
    "half_acts_note", "indexed_engine_tiles", "masked_row_slots", "nloop_n_tiles", "nloop_tail_rows",
    "override_names", "pick_gluon_tile", "pregather_ok", "rs_splits", "runs_nloop", "split_tile_rows",
    "tail_rows", "tile_config", "w4a16_grouped_config", "w4a16_indexed_config", "wide_tile_pays",
]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class W4A16Config:
    """Launch choice of a W4A16 kernel: the M tile (for the indexed layout also the routing block
    size; for a Hopper engine the activation rows of its tile), the N tile (a Hopper tile's
    weight rows), warps, pipeline stages, whether the weight is the MMA's M side, and split-K
    (indexed layout only: K shares summed in FP32 by a second kernel)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    swap_ab: bool
    split_k: int = 1
    #: "triton" (every tier) or one of `tiles.GLUON_ENGINES` (the Hopper kernels of `hopper`,
    #: the default on sm_90 where they measured faster)
    engine: str = "triton"
    reason: str = ""
    #: indexed layout, engine "gluon_rs": gather the routed rows into the routing's slot order
    #: first (`lowbit.routing.kernels.gather_indexed_rows`) and load them by TMA (`tiles.PREGATHER_TILES`)
    pregather: bool = False


#: The indexed layout's configuration: `block_m` is also the routing block size.
W4A16IndexedConfig = W4A16Config

# --------------------------------------------------------------------------- overrides
_OVERRIDE_FIELDS = ("block_m", "block_n", "num_warps", "num_stages", "swap_ab", "split_k", "engine")


def override_names(family: str) -> list[str]:
    """``LOWBIT_<FAMILY>_BLOCK_M`` ... : the documented tuning overrides of a W4A16 family."""
    return overrides.override_names(family, _OVERRIDE_FIELDS)


def env_key(family: str) -> tuple:
    """The overrides' current values (part of every memo key)."""
    return overrides.env_key(family, _OVERRIDE_FIELDS)


def env_value(env: tuple, field: str) -> str:
    """The raw value of override `field` in an `env_key` tuple ("" when unset)."""
    return env[_OVERRIDE_FIELDS.index(field)]


def apply_env_overrides(cfg: W4A16Config, family: str) -> W4A16Config:
    """`cfg` with the family's ``LOWBIT_<FAMILY>_*`` overrides applied (each named in the reason)."""
    return overrides.apply_env_overrides(cfg, family, _OVERRIDE_FIELDS)


#: ``LOWBIT_W4A16_PREGATHER``: 1 pre-gathers the routed rows wherever the chosen tile can
#: (`pregather_ok`), 0 never; unset: `_PREGATHER_MIN_N` decides.
PREGATHER_ENV = "LOWBIT_W4A16_PREGATHER"
#: The indexed layout's environment overrides (each is part of the memo key).
INDEXED_ENV_OVERRIDES = override_names("W4A16") + [PREGATHER_ENV]
#: The grouped layouts' environment overrides.
GROUPED_ENV_OVERRIDES = override_names("W4A16_GROUPED")


# --------------------------------------------------------------------------- tiles
def pick_gluon_tile(tiles: tuple, rows: int, cfg: W4A16Config, env: tuple,
                    wide: bool = False) -> tuple[int, int, int, int]:
    """A Gluon engine's tile ``(weight rows, rows, warps, stages)`` with `rows` rows: the first
    one (each table lists its default first per row count; with `wide`, the heuristics chose the
    four-warpgroup tile, so its 256-weight-row tiles come first) that matches the ``_BLOCK_N``
    and ``_NUM_STAGES`` overrides set in `env` (the family's `env_key`, whose values `cfg`
    carries); the row count's default when none matches, the table's first tile when no tile has
    `rows`."""
    forced_n = env_value(env, "block_n")
    forced_stages = env_value(env, "num_stages")
    if wide:
        tiles = tuple(t for t in tiles if t[0] == 256) + tuple(tiles)
    same_rows = [t for t in tiles if t[1] == rows]
    fits = [t for t in same_rows
            if (not forced_n or t[0] == cfg.block_n) and (not forced_stages or t[3] == cfg.num_stages)]
    return (fits or same_rows or [tiles[0]])[0]


def avoid_miscompile(cfg: W4A16Config, n: int) -> W4A16Config:
    """The configuration to launch for N = `n`. Triton 3.6 builds a wrong kernel for the 64x64
    swap-AB tile (4 warps) at 2 and 3 pipeline stages when N is not a multiple of 16 (relative
    error ~1, indexed and contiguous alike; the GPU test ``test_tiles_with_n_off_16`` keeps the
    case): such shapes run the tile unpipelined. Production shapes (N = 4096 / 7168) are
    multiples of 16 and unaffected.
    H200, 2026-11-29, f71cfd2: wrong for N = 37, 72, 100, 136, 200; 1 and 4 stages correct."""
    if (cfg.engine == "triton" and n % 16 and cfg.block_m == 64 and cfg.block_n == 64 and cfg.swap_ab
            and cfg.num_stages in (2, 3)):
        return replace(cfg, num_stages=1, reason=f"{cfg.reason}; N={n} % 16 != 0: 1 stage (Triton 3.6 "
                       f"miscompiles this tile at {cfg.num_stages} stages)")
    return cfg


def tile_config(block_m: int, why: str) -> W4A16Config:
    """The Triton tile with M tile `block_m` (`tiles.VALIDATED_TILES`), `why` as its reason."""
    if block_m not in VALIDATED_TILES:
        raise ValueError(f"no GPU-validated W4A16 tile with block_m={block_m}; one of {sorted(VALIDATED_TILES)}")
    bn, warps, stages, swap = VALIDATED_TILES[block_m]
    return W4A16Config(block_m, bn, warps, stages, swap, reason=why)


# --------------------------------------------------------------------------- Hopper tile rules
#: The four-warpgroup (256 weight rows) tiles run one CTA an SM: below two waves of programs
#: their tail wave costs more than the halved activation traffic saves.
#: H200, 2026-11-30, b4f38fe: EP32 gate_up (192 programs) 0.87x contiguous, down (336) 1.11x.
WIDE_TILE_MIN_PROGRAMS = 2 * H200_NUM_SMS
#: A grid of fewer programs runs a group-loop tile's deeper-ring alternative (`THIN_GRID_TILES`).
#: H200, 2026-11-30, 3453016: EP8 1 token gate_up (512 programs) 64x8 2 stages 74.3, 3 stages 50.1.
GROUP_LOOP_MIN_PROGRAMS = 6 * H200_NUM_SMS
#: 128 weight rows on one warpgroup in place of a 64-row tile (tile -> (wide tile, max K steps,
#: the families it measured faster for, the measurement the reason quotes)).
#: H200, 2026-11-30, af23e00: EP8 8-row blocks down 4 / 8 / 16 tokens 57.4 -> 53.6, 95.2 -> 89.0, 106.6 -> 99.7.
#: H200, 2026-11-30, 2fe1684: 32-row block EP8 64 tokens 326.9 / 188.8 -> 251.2 / 137.8.
_WIDE_32 = ((128, 32, 4, 2), 1 << 30, ("EP", "TP", "masked"),
            "EP8 64-190 tokens, TP8 gate_up, masked 16 tok/expert on 12-48 experts: 1.16-1.37x the 64x32 step loop")
WIDE_DECODE_TILES = {
    (64, 8, 4, 2): ((128, 8, 4, 2), 8, ("EP",), "EP8 decode down 1.07x the 64-row tile"),
    (64, 16, 4, 2): ((128, 16, 4, 2), 1 << 30, ("EP", "masked"),
                     "EP8 32 / 50 tokens 1.07x, masked 8 tok/expert 0.98-1.23x the 64-row tiles"),
    (64, 32, 4, 4): _WIDE_32,
    (64, 32, 4, 2): _WIDE_32,
}
#: The 128-row programs a family's grid must keep for `WIDE_DECODE_TILES` (default
#: `GROUP_LOOP_MIN_PROGRAMS`); masked grids none.
#: H200, 2026-11-30, 0ffed85: indexed one-token gate_up 85.9 on 128x8 vs 50.2; masked 12 experts 8 tok 77.1 -> 62.5.
WIDE_MIN_PROGRAMS = {"masked": 0}
#: Waves of N-loop programs (over the SMs times `tiles.NLOOP_CTAS_PER_SM`) the grid must keep.
#: H200, 2026-12-01, c4ac772: TP8 down 8192 tokens 8 / 14 / 28 / 56 tiles a program 779.0 / 737.2 / 721.3 / 738.7.
NLOOP_MIN_WAVES = 2.0


def wide_tile_pays(row_blocks: float, n: int) -> bool:
    """Whether `row_blocks` blocks of activation rows over N outputs fill enough programs of 256
    weight rows for the four-warpgroup tile (`WIDE_TILE_MIN_PROGRAMS`)."""
    return row_blocks * _cdiv(n, 256) >= WIDE_TILE_MIN_PROGRAMS


def group_loop_tile(tile: tuple, programs: float, k: int = 0, family: str = "") -> tuple[tuple, str]:
    """The register-A tile to run in place of the heuristics' `tile` for a grid of about
    `programs` 64-row programs and this K, and a note for their reason: a group-loop tile
    (`tiles.GROUP_LOOP_MAXNREG`) on a grid under `GROUP_LOOP_MIN_PROGRAMS` runs its deeper-ring
    alternative (`tiles.THIN_GRID_TILES`); with `family` ("EP" / "TP": the indexed profile,
    "masked"; "": none, or the caller's overrides forbid it) among those its 128-weight-row form
    was measured for (`WIDE_DECODE_TILES`), one whose 128-row grid keeps the family's
    `WIDE_MIN_PROGRAMS` and whose K is short enough runs that form."""
    tile = tuple(tile)
    big, max_steps, families, measured = WIDE_DECODE_TILES.get(tile, (None, 0, (), ""))
    if (family in families and _cdiv(k, 256) <= max_steps
            and programs / 2 >= WIDE_MIN_PROGRAMS.get(family, GROUP_LOOP_MIN_PROGRAMS)):
        return big, (f"; 128 weight rows on one warpgroup, one K group at a time under {GROUP_LOOP_MAXNREG[big]} "
                     f"registers (H200 {measured})")
    if tile in THIN_GRID_TILES and programs < GROUP_LOOP_MIN_PROGRAMS:
        return THIN_GRID_TILES[tile], (f"; under {GROUP_LOOP_MIN_PROGRAMS} programs the whole-step loop, "
                                       f"{THIN_GRID_TILES[tile][3]} stages (H200 EP8 1 token gate_up: 50.1 us vs "
                                       f"74.3 at 2 stages)")
    if tile in GROUP_LOOP_MAXNREG:
        return tile, f"; one K group at a time under {GROUP_LOOP_MAXNREG[tile]} registers: more CTAs an SM"
    return tile, ""


def runs_nloop(tile: tuple, k: int) -> bool:
    """Whether a register-A indexed `tile` runs as the N-loop kernel for this K (one 256-wide
    step, a tile of `tiles.NLOOP_TILES`)."""
    return k <= 256 and tuple(tile) in NLOOP_TILES


def nloop_n_tiles(block_m: int, num_routes: int, num_experts: int, n: int, bw: int = 128,
                  num_sms: int = H200_NUM_SMS) -> int:
    """N tiles a program of the N-loop kernel loops over (`tiles.nloop_tile_counts`): the most
    whose grid keeps `NLOOP_MIN_WAVES` waves, for about ``num_routes / block_m + num_experts / 2``
    routing blocks (half a block of padding an expert) over N outputs in tiles of `bw` rows; the
    fewest if none does."""
    blocks = num_routes / block_m + min(num_experts, num_routes) / 2
    slots = num_sms * NLOOP_CTAS_PER_SM.get(block_m, 1)
    tiles = _cdiv(n, bw)
    for chunk in nloop_tile_counts(block_m):
        if blocks * _cdiv(tiles, chunk) >= NLOOP_MIN_WAVES * slots:
            return chunk
    return NLOOP_N_TILES[-1]


def nloop_tail_rows(tile) -> int:
    """The rows of the half-row tile that an N-loop block of `tile` (`runs_nloop`) whose second
    half holds no route runs instead (`tiles.NLOOP_HALF_TAIL_TILES`), 0 if none."""
    return tile[1] // 2 if tuple(tile) in NLOOP_HALF_TAIL_TILES else 0


def tail_rows(tile, engine: str, family: str) -> int:
    """The rows of the smaller tile that a block of `tile` whose live rows end early runs instead
    (`tiles.half_tail`, a split tile's BR_HI part), 0 if none: what the reasons report.
    `engine`: the Gluon engine; `family`: "masked", "contiguous" or "indexed"."""
    tile = tuple(tile)
    if engine not in REGISTER_A_ENGINES:
        return 0
    split = split_form(tile)
    if family == "masked" and split is not None and (engine == "gluon_rs" or split.ws) and split.hi_tail:
        return split_rows(tile[1])[0]
    return tile[1] // 2 if half_tail(tile, engine == "gluon_ws", family) else 0


def half_acts_note(tile, engine: str, family: str) -> str:
    """What the reasons say of a tile that refills its activations by halves (`tiles.half_acts`),
    "" for any other: `engine` the Gluon engine, `family` "indexed", "masked" or "contiguous"."""
    if engine != "gluon_rs" or not half_acts(tile, False, family):
        return ""
    if tuple(tile) in PREGATHER_BLOCK_TILES.values():
        return ("; one K step of activations refilled by halves: two CTAs an SM (H200 EP8 768-2048 tokens, "
                "pre-gathered: 1.03-1.11x the 256x128)")
    measured = "EP8 192-384 tokens: 1.08-1.14x" if family == "indexed" else "masked 32 tok/expert: 1.01-1.17x"
    return f"; one K step of activations refilled by halves: three CTAs an SM (H200 {measured})"


def pregather_ok(tile, k: int, warp_specialize: bool = False, split_k: int = 1, regs_a: bool = True) -> bool:
    """Whether `tile` can run on pre-gathered rows for this K: the register-A main loop (no warp
    specialization, no K shares), K past one step (one step runs the N loop), a tile of
    `tiles.PREGATHER_TILES`."""
    return regs_a and not warp_specialize and split_k == 1 and k > 256 and tuple(tile) in PREGATHER_TILES


def rs_splits(engine: str, tile: tuple, k: int, split: int) -> bool:
    """Whether the Gluon `engine` splits K `split` ways for `tile`: the register-A kernel's main
    loop only (not warp-specialized, not the one-step N loop), every share non-empty."""
    return engine == "gluon_rs" and not runs_nloop(tile, k) and k_split_ok(k, split)


def masked_row_slots(expected_rows: float, max_m: int, rows: int) -> int:
    """Programs an expert (for each N tile) of the masked Gluon kernels with `rows`-row tiles:
    enough row blocks for `expected_rows` (expected_m times `MASKED_SPREAD`), at most one a row
    block of max_m. A program loops over its expert's blocks, so a count past the expected one
    is still computed, by fewer programs.
    H200, 2026-11-30, c010493: masked 8 tok/expert 294.0 / 197.8 (a program a block of max_m) -> 287.7 / 153.7."""
    return max(1, min(_cdiv(max_m, rows), _cdiv(math.ceil(expected_rows), rows)))


def split_tile_rows(rows: float) -> int:
    """The masked split tile's row count for an expert of about `rows` rows (expected rows times
    the spread), 0 where a power-of-two tile serves: only past 64 rows, the smallest split tile
    that holds them.
    H200, 2026-11-30, b03d48e: 32 tok/expert 256x48 441.7 / 254.9 vs 256x64 429.5 / 246.0 (0.97x / 0.96x)."""
    if rows <= 64:
        return 0
    return min((t[1] for t in GLUON_SPLIT_TILES if t[1] >= rows), default=0)


# --------------------------------------------------------------------------- indexed layout
#: The Triton M tile by tokens per expert: (max tok_e, block_m, why), the first row that fits.
#: H200, 2026-11-29, ae5684e: EP8 20 tokens 16x256 363 / 190; TP8 tok_e 21 32x128 455 / 394; EP8 tok_e 43 64x64 705 / 420.
_M_TILES = (
    (16, 16, "decode: a few rows per expert; 256-row weight tiles, fastest at 3-16 tok_e"),
    (32, 32, "small batches: 32-row tiles, fastest at TP8 tok_e 21"),
    (float("inf"), 64, "prefill: 64-row tiles, fastest at EP8 tok_e 43; 128-row tiles measured slower"),
)
#: The Triton kernel's K shares by tokens per expert (first row that fits): a thin decode grid
#: leaves most SMs' bandwidth unused.
#: H200, 2026-11-29, 6376853: EP8 1 token 174.4 -> 154.0 with 2 shares; 4 tokens 321.7 -> 386.3 (slower).
_SPLIT_K = (
    (0.25, 2, "thin decode grid: 2 K shares (H200 EP8 1 token: 174.4 -> 154.0 us)"),
    (float("inf"), 1, ""),
)
#: The register-A kernel splits K only when asked (``LOWBIT_W4A16_SPLIT_K``).
#: H200, 2026-11-30, d1f170e: EP8 1 token 64x8 3 stages 49.8 / 31.9 unsplit, 54.4 / 37.5 in 2 shares.
_RS_SPLIT_K = 1
#: Rows are pre-gathered into the routing's slot order from this N (the weight rows a gathered byte meets).
#: H200, 2026-12-01, abda502: EP8 gate_up 1024 tokens 256x128 1027.9 -> 956.1; TP8 gate_up (N 512) 0.83-0.88x.
_PREGATHER_MIN_N = (2048, "rows pre-gathered into the routing's slot order, loaded by TMA (H200 Kimi EP8 "
                          "gate_up / down 1.01-1.11x; TP8 gate_up, N 512: 0.83-0.88x)")
#: The register-A kernel's routing block by tok_e on sm_90: (max tok_e, block, why), the first
#: row that fits; EP and TP share it (a one-step K runs the block's N-loop tile).
#: H200, 2026-11-29, 11ddb02: EP8 tok_e 43 64-row 866.0 vs Triton 1195.9; tok_e 171 128-row 2484.5 vs Triton 3520.7.
#: H200, 2026-12-01, 3d16f8f: the edges, 32- vs 64-row at tok_e 26.7 281.9 / 153.4 vs 274.3 / 149.7, 64- vs 128-row level at 96.
_GLUON_BLOCKS = (
    (12, 16, "sm_90 decode: register-A Gluon kernel, 16-row routing block (H200 EP8 1-64 tokens: "
             "1.15-1.49x the Triton kernel; 1.09-1.12x the 32-row block at tok_e 10.7)"),
    (22, 32, "sm_90 between decode and prefill: register-A Gluon kernel, 32-row routing block (H200 EP8 "
             "tok_e 17-32: 1.19-1.34x the Triton 32-row tiles; 1.02-1.03x the 64-row block at tok_e 21.3, "
             "0.97-0.99x at 24)"),
    (90, 64, "sm_90 prefill: register-A Gluon kernel, 64-row routing block (H200 EP8 tok_e 43: 866 us vs "
             "Triton 1196 with 128 weight rows; with its activations refilled by halves 1.06x the 128-row "
             "block at tok_e 75, 1.02x at 85, level at 96)"),
    (float("inf"), 128, "sm_90 large prefill: register-A Gluon kernel, 128-row routing block (H200 tok_e 171: EP8 "
                        "2485 us, TP8 3686 vs Triton 3521 / 4963 with 128 weight rows, 64-row block 2576 / 4065; "
                        "256 weight rows 1.10-1.14x that)"),
)
#: Past the 64-row block's range, the 128-row block's middle where a K past one step takes the
#: 64-row block again: (min tok_e exclusive, max tok_e, why). Not measured for a one-step K.
#: H200, 2026-12-01, d0a7cde: EP8 gate_up / down tok_e 128 814.8 -> 797.5 / 470.2 -> 437.5 (128-row -> 64-row).
_PREFILL_64_RANGE = (115, 200, "sm_90 prefill, K past one step: register-A Gluon kernel, 64-row routing "
                               "block (H200 Kimi EP8 tok_e 128-171: 1.04-1.11x the 128-row block, level at "
                               "192; TP8 gate_up tok_e 128-171: 1.03-1.04x)")
#: A one-step K (TP8 down: the N loop) takes the 128-row block from this tok_e (exclusive) where the table says 64.
#: H200, 2026-12-01, efafc5d: TP8 down 2560 tokens (tok_e 53) 279.7 (128-row) vs 323.7 (64-row).
_NLOOP_128_FROM = (48, "sm_90 prefill, one K step: register-A Gluon N loop, 128-row routing block (H200 Kimi TP8 "
                       "down tok_e 53-85: 1.13-1.18x the 64-row block, level at 32-43)")
#: ... and keeps the 32-row block up to this tok_e (the table's 32-row edge is 22).
#: H200, 2026-12-01, 294de0b: TP8 down 1280 tokens (tok_e 26.7) 32 / 64 / 128-row 180.7 / 235.9 / 238.4.
_NLOOP_32_UNTIL = (30, "sm_90 between decode and prefill, one K step: register-A Gluon N loop, 32-row routing "
                       "block (H200 Kimi TP8 down tok_e 26.7: 1.31x the 64-row block, level at 32)")
#: EP decode up to this tok_e: 8-row routing blocks on the group-loop tile (TP keeps the 16-row
#: block: its one-step down runs the 16-row N-loop tile).
#: H200, 2026-11-30, 3453016: EP8 8 tokens 64x8 group loop 187.6 / 99.6 vs 64x16 203.8 / 111.9.
_EP_DECODE_BLOCK = (4, 8, "sm_90 EP decode: register-A Gluon kernel, 8-row routing block, one K group at a "
                          "time at 64 registers, 8 CTAs an SM (H200 EP8 4-16 tokens: 1.08-1.13x the 16-row block)")
#: Prefill routing blocks that run the register-A kernel warp-specialized (a producer partition
#: gathers the rows) unless their four-warpgroup tile runs plainly.
#: H200, 2026-11-30, e3122f1: EP8 256 tokens 820.0 -> 761.4, TP8 8192 tokens 3523.2 -> 3422.8.
_WS_BLOCKS = (64, 128)
#: Routing blocks whose K past one step runs the one-warpgroup 128x64 group loop (with its half
#: tail) instead of the warp-specialized 256x64.
#: H200, 2026-11-30, 45d3c7c: EP8 256 tokens 388.4 / 230.3 -> 375.7 / 219.3.
_GROUP_LOOP_BLOCKS = (64,)


def _rs_block(tok_e: float, k: int, profile: str, pregathered: bool = False) -> tuple[int, str]:
    """The register-A kernel's routing block and its reason at this tok_e: `_GLUON_BLOCKS`, the EP
    decode block (`_EP_DECODE_BLOCK`), the 64-row block's second range for K past one step
    (`_PREFILL_64_RANGE`; not on `pregathered` rows, where the 128-row block's one-warpgroup tile
    wins: `tiles.PREGATHER_BLOCK_TILES`), and a one-step K's N-loop edges (`_NLOOP_128_FROM`,
    `_NLOOP_32_UNTIL`)."""
    _, block, why = next(r for r in _GLUON_BLOCKS if tok_e <= r[0])
    if profile == "EP" and tok_e <= _EP_DECODE_BLOCK[0]:
        _, block, why = _EP_DECODE_BLOCK
    if k > 256 and not pregathered and _PREFILL_64_RANGE[0] < tok_e <= _PREFILL_64_RANGE[1]:
        block, why = 64, _PREFILL_64_RANGE[2]
    if k <= 256 and block == 64 and tok_e > _NLOOP_128_FROM[0]:
        block, why = 128, _NLOOP_128_FROM[1]
    if k <= 256 and block == 64 and tok_e <= _NLOOP_32_UNTIL[0]:
        block, why = 32, _NLOOP_32_UNTIL[1]
    return block, why


def _gluon_runs(block_m: int, tok_e: float, k: int, profile: str) -> bool:
    """Whether the register-A kernel is the default for a routing block at this tok_e: the
    block `_GLUON_BLOCKS` or `_rs_block` picks; in the table's prefill range either prefill block
    (both measured faster than Triton there); a block only it runs."""
    _, table_block, _ = next(r for r in _GLUON_BLOCKS if tok_e <= r[0])
    prefill = (64, 128)
    return (block_m in (table_block, _rs_block(tok_e, k, profile)[0])
            or (table_block in prefill and block_m in prefill) or block_m not in VALIDATED_TILES)


def w4a16_indexed_config(num_routes: int, num_experts: int, n: int, k: int, block_m: int | None = None,
                         gluon: bool = False) -> W4A16Config:
    """The launch configuration for ``num_routes = M * top_k`` routed rows over `num_experts`
    experts of ``[n, k]`` weights. Memoized per shape descriptor and environment overrides
    (``LOWBIT_W4A16_BLOCK_M``, ``_BLOCK_N``, ``_NUM_WARPS``, ``_NUM_STAGES``, ``_SWAP_AB``,
    ``_SPLIT_K``, ``_ENGINE``, ``_PREGATHER``). `block_m` pins the M tile (the routing was already built with
    that block size; `gluon` never changes it). gluon: the Hopper Gluon kernels can run (an
    sm_90 GPU, N a multiple of 8, aligned rows); where they measured faster they are then the default."""
    return _indexed_config_cached(num_routes, num_experts, n, k, block_m, gluon,
                                  env_key("W4A16") + (os.environ.get(PREGATHER_ENV, ""),))


def explain_w4a16_indexed_config(num_routes: int, num_experts: int, n: int, k: int, gluon: bool = False) -> str:
    """`w4a16_indexed_config`'s choice and reason in one line."""
    c = w4a16_indexed_config(num_routes, num_experts, n, k, gluon=gluon)
    return (f"w4a16_indexed M*top_k={num_routes} E={num_experts} N={n} K={k}: block_m={c.block_m} "
            f"block_n={c.block_n} warps={c.num_warps} stages={c.num_stages} swap_ab={c.swap_ab} split_k={c.split_k} engine={c.engine} "
            f"pregather={c.pregather} "
            f"-- {c.reason}")


@lru_cache(maxsize=4096)
def _indexed_config_cached(num_routes: int, num_experts: int, n: int, k: int, block_m: int | None, gluon: bool,
                           env: tuple) -> W4A16Config:
    tok_e = num_routes / max(num_experts, 1)
    profile = "TP" if num_experts > 64 and n * k < 4096 * 7168 // 2 else "EP"
    rs_blocks = sorted({t[1] for t in INDEXED_RS_TILES})
    # an engine override other than gluon_rs: the routing block as for that engine
    gluon = gluon and env_value(env, "engine") in ("", *REGISTER_A_ENGINES)
    if block_m is None:
        _, block_m, why = next(r for r in _M_TILES if tok_e <= r[0])
        rs_block, rs_why = _rs_block(tok_e, k, profile, _pregather_wanted(n, k, env[-1]))
        if gluon:
            block_m, why = rs_block, rs_why
    else:
        why = "block_m fixed by the routing"
        rs_only = block_m in rs_blocks and (gluon or env_value(env, "engine") in REGISTER_A_ENGINES)
        if block_m not in VALIDATED_TILES and not rs_only:  # only GPU-validated tiles are ever launched
            raise ValueError(
                f"no W4A16 indexed configuration with block_m={block_m}; build the routing with "
                f"one of {sorted(VALIDATED_TILES)} (on sm_90 also {rs_blocks}) (w4a16_indexed_config(...).block_m)"
            )
    _, split, split_why = next(r for r in _SPLIT_K if tok_e <= r[0])
    rs = gluon and _gluon_runs(block_m, tok_e, k, profile)
    if rs:  # the register-A kernel splits K only when asked (`_RS_SPLIT_K`)
        split, split_why = _RS_SPLIT_K, ""
    why = f"tok_e={tok_e:.2f} ({profile}): {why}" + (f"; {split_why}" if split_why else "")
    if block_m in VALIDATED_TILES:
        cfg = replace(tile_config(block_m, why), split_k=split)
    else:  # a routing block only the register-A Gluon kernel runs
        cfg = W4A16Config(block_m, 128, 8, 2, True, engine="gluon_rs", reason=why)
    programs = float("inf")
    if rs:  # prefill blocks: the four-warpgroup tile (the 256 weight rows' grid permitting), or for a
        # one-step K the N loop (warp-specialized 128-row tiles)
        blocks = num_routes / block_m + min(num_experts, num_routes)  # routed blocks + padding blocks, about
        # a 64-row block with K past one step: the one-warpgroup 128x64 (`_GROUP_LOOP_BLOCKS`)
        group_loop_64 = block_m in _GROUP_LOOP_BLOCKS and k > 256
        wide = k > 256 and wide_tile_pays(blocks, n) and not group_loop_64
        programs = blocks * _cdiv(n, 64)  # (a group-loop tile's 64-row grid)
        # a four-warpgroup tile runs warp-specialized where that engine has it
        ws = (block_m in _WS_BLOCKS and not group_loop_64
              and (not wide or (256, block_m) in {t[:2] for t in INDEXED_WS_TILES}))
        cfg = replace(cfg, engine="gluon_ws" if ws else "gluon_rs")
        if group_loop_64:
            cfg = replace(cfg, reason=f"{cfg.reason}; 128 weight rows on one warpgroup (H200 EP8 tok_e 43-85: "
                          "1.01-1.05x the warp-specialized 256x64)")
    else:
        wide = False
    pregather = _pregather_wanted(n, k, env[-1])
    cfg = avoid_miscompile(_fit_indexed_engine(apply_env_overrides(cfg, "W4A16"), env, k, wide, programs, profile,
                                               (num_routes, num_experts, n), pregather), n)
    return _with_pregather(cfg, k, env[-1], pregather)


def _pregather_wanted(n: int, k: int, forced: str) -> bool:
    """Whether a projection's rows are to be pre-gathered, tile permitting: ``LOWBIT_W4A16_PREGATHER``
    (`forced`, "" when unset), else `_PREGATHER_MIN_N`; never for a one-step K (the N loop)."""
    if forced:
        return parse_override(PREGATHER_ENV, forced, False) and k > 256
    return n >= _PREGATHER_MIN_N[0] and k > 256


def _with_pregather(cfg: W4A16Config, k: int, forced: str, want: bool) -> W4A16Config:
    """`cfg` with `pregather` set where `want` (`_pregather_wanted`) and its tile has the form
    (`pregather_ok`; `_fit_indexed_engine` picked that tile), the reason saying why or why not."""
    tile = (cfg.block_n, cfg.block_m, cfg.num_warps, cfg.num_stages)
    can = cfg.engine == "gluon_rs" and pregather_ok(tile, k, split_k=cfg.split_k)
    if forced:
        why = f"{PREGATHER_ENV}={forced}" + ("" if can or not want else ": this tile cannot (no pre-gathered form)")
    else:
        why = _PREGATHER_MIN_N[1] if want and can else ""
    if not why:
        return cfg
    return replace(cfg, pregather=want and can, reason=f"{cfg.reason}; {why}")


def indexed_engine_tiles(engine: str) -> tuple:
    """The (weight rows, routing block, warps, stages) tiles an indexed Gluon engine is built for
    (with the in-kernel gather)."""
    return {"gluon": INDEXED_TILES, "gluon_rs": INDEXED_RS_TILES, "gluon_ws": INDEXED_WS_TILES}[engine]


def _fit_indexed_engine(cfg: W4A16Config, env: tuple, k: int, wide: bool = False,
                        programs: float = float("inf"), profile: str = "", grid: tuple | None = None,
                        pregather: bool = False) -> W4A16Config:
    """``LOWBIT_W4A16_ENGINE=gluon`` / ``gluon_rs`` as a global switch: that kernel's tile with
    the same routing block size (a split-K kept only where the register-A kernel splits:
    `rs_splits`); ``LOWBIT_W4A16_BLOCK_N`` (weight rows) and ``_NUM_STAGES`` pick among its
    tiles when set. A routing block the register-A kernel has no tile for runs the
    shared-memory Gluon kernel. `wide`: the heuristics chose the routing block's four-warpgroup
    tile (256 weight rows), which then comes first. `programs`: the grid's size, about, for
    `group_loop_tile` (unless a stage count is forced), whose 128-row form `profile` ("EP" /
    "TP") may take unless weight rows are forced. `grid`: (routes, experts, N), for the N-loop
    kernel's tiles a program (`nloop_n_tiles`, on an H200's SMs; the launch counts the GPU's).
    `pregather` (`_pregather_wanted`): the tile for rows pre-gathered, the routing block's own
    (`tiles.PREGATHER_BLOCK_TILES`, on the register-A engine) unless the engine or the tile is
    forced, else on ``gluon_rs`` the pre-gathered form of the tile picked (same weight rows and
    stages). The reason says what was chosen."""
    if cfg.engine == "triton":
        return cfg
    if cfg.engine not in GLUON_ENGINES:
        raise ValueError(f"LOWBIT_W4A16_ENGINE must be 'triton' or one of {GLUON_ENGINES}, got {cfg.engine!r}")
    engine = cfg.engine
    if engine == "gluon_ws" and not any(t[1] == cfg.block_m for t in indexed_engine_tiles("gluon_ws")):
        engine = "gluon_rs"
    if engine == "gluon_rs" and not any(t[1] == cfg.block_m for t in indexed_engine_tiles("gluon_rs")):
        engine = "gluon"
    tiles = indexed_engine_tiles(engine)
    if engine in REGISTER_A_ENGINES and k <= 256:
        # one K step: the routing block's N-loop tile first
        # (H200, 2026-11-30, 5d3072b: TP8 down 4-50 tokens 128x16 1.50-1.65x the 64x16 tile)
        tiles = tuple(t for t in tiles if runs_nloop(t, k)) + tiles
    tile, note = pick_gluon_tile(tiles, cfg.block_m, cfg, env, wide), ""
    if engine == "gluon_rs" and not env_value(env, "num_stages"):
        tile, note = group_loop_tile(tile, programs, k, family="" if env_value(env, "block_n") else profile)
    if pregather and k > 256 and engine in REGISTER_A_ENGINES:
        forced = env_value(env, "engine") or env_value(env, "block_n") or env_value(env, "num_stages")
        if not forced and cfg.block_m in PREGATHER_BLOCK_TILES:
            engine, tile, note = "gluon_rs", PREGATHER_BLOCK_TILES[cfg.block_m], ""
        elif engine == "gluon_rs":
            tile = next((t for t in PREGATHER_TILES if (t[0], t[1], t[3]) == (tile[0], cfg.block_m, tile[3])), tile)
    bw, _, warps, stages = tile
    tile = (bw, cfg.block_m, warps, stages)  # (the routing's block even where no tile has it: refused at launch)
    if engine in REGISTER_A_ENGINES and runs_nloop(tile, k):
        chunk = nloop_n_tiles(cfg.block_m, *grid, bw) if grid else "8-56"
        variant = (f"; K <= 256 (one step): the N-loop kernel, {chunk} weight tiles a program by the grid "
                   "(H200 TP8 down 32-8192 tokens: 1.05-1.18x a fixed 8)")
        if tail := nloop_tail_rows(tile):
            variant += (f"; a block with no route past slot {tail} runs the {tail}-row tile (H200 TP8 8192 tokens "
                        "down: 1.14x)")
    elif tail := tail_rows(tile, engine, "indexed"):
        measured = ("384 tokens: 1.03-1.06x" if engine == "gluon_ws"
                    else "384 / 512 tokens: 1.04-1.10x" if cfg.block_m == 64
                    else "1024 tokens: 1.09x" if bw == 256 else "1024 tokens, on the 256x128: 1.09x")
        variant = f"; a block with no route past slot {tail} runs the {tail}-row tile (H200 EP8 {measured})"
        variant += half_acts_note(tile, engine, "indexed")
    else:
        variant = note + half_acts_note(tile, engine, "indexed")
    split = cfg.split_k if rs_splits(engine, tile, k, cfg.split_k) else 1
    if split > 1:
        variant += f"; K in {split} shares (FP32, summed by a second kernel)"
    one_wg = " on one warpgroup" if warps == 4 and cfg.block_m == 128 else ""
    return replace(cfg, engine=engine, block_n=bw, num_warps=warps, num_stages=stages, swap_ab=True, split_k=split,
                   reason=f"{cfg.reason}; {engine} tile {bw} weight rows x {cfg.block_m} routes{one_wg}, {stages} "
                          f"stages{variant}")


# --------------------------------------------------------------------------- grouped layouts
#: Masked M tiles of at least these rows run the four-warpgroup (256 weight rows) or the
#: warp-specialized register-A tiles; fewer rows, the plain register-A kernel.
#: H200, 2026-11-29, b9b3bc8: masked 8 tok/expert warp-specialized 789.5 vs register-A 528.9.
_WIDE_MIN_ROWS = 64
#: The masked heuristics' spread of real counts around expected_m (DeepGEMM's rule): the M tile
#: and the Gluon grid's programs an expert (`masked_row_slots`) hold 1.3x expected_m.
MASKED_SPREAD = 1.3


def _tile_for_rows(rows: float) -> int:
    """Smallest validated M tile holding `rows` rows, capped at the largest."""
    fits = [bm for bm in sorted(VALIDATED_TILES) if bm >= rows]
    return fits[0] if fits else max(VALIDATED_TILES)


def w4a16_grouped_config(mode: str, m: int, n: int, k: int, g: int, expected_m: int = 0,
                         gluon: bool = False) -> W4A16Config:
    """Launch configuration of the grouped kernels, memoized per (mode, M, N, K, G, expected_m)
    and the ``LOWBIT_W4A16_GROUPED_*`` overrides (BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES,
    SWAP_AB, ENGINE). Contiguous tiles must divide 128. gluon: the Hopper Gluon kernels can run
    the operands (an sm_90 GPU, TMA-able rows); where they measured faster they are then the default."""
    if mode not in ("contiguous", "masked"):
        raise ValueError(f"mode must be 'contiguous' or 'masked', got {mode!r}")
    return _grouped_config_cached(mode, m, n, k, g, expected_m, gluon, env_key("W4A16_GROUPED"))


def explain_w4a16_grouped_config(mode: str, m: int, n: int, k: int, g: int, expected_m: int = 0,
                                 gluon: bool = False) -> str:
    """`w4a16_grouped_config`'s choice and reason in one line."""
    c = w4a16_grouped_config(mode, m, n, k, g, expected_m, gluon)
    return (f"w4a16_grouped {mode} M={m} N={n} K={k} G={g}" + (f" expected_m={expected_m}" if mode == "masked" else "")
            + f": block_m={c.block_m} block_n={c.block_n} warps={c.num_warps} stages={c.num_stages} "
              f"swap_ab={c.swap_ab} engine={c.engine} -- {c.reason}")


@lru_cache(maxsize=4096)
def _grouped_config_cached(mode: str, m: int, n: int, k: int, g: int, expected_m: int, gluon: bool,
                           env: tuple) -> W4A16Config:
    if mode == "contiguous":
        # rows per expert >= 128 (segments are 128-aligned): the largest validated tile re-reads
        # each expert's weights the fewest times; grids here are thousands of programs
        bm = max(VALIDATED_TILES)
        why = f"contiguous: {m} rows over {g} experts; largest validated M tile"
    else:
        # DeepGEMM's masked rule, measured for the indexed family: one M tile should hold the
        # expected rows plus the 1.3x spread of real counts, so deep-K gate_up is read once
        bm = _tile_for_rows(MASKED_SPREAD * expected_m)
        why = f"masked: expected_m={expected_m} (x1.3 spread) -> one {bm}-row tile per expert"
    cfg = tile_config(bm, why)
    split, wide = 0, False
    if gluon and mode == "masked" and bm == 64 and MASKED_SPREAD * expected_m <= 64:
        cfg = replace(cfg, engine="gluon_rs", reason=f"{why}; sm_90: register-A Gluon kernel, 128 weight rows on one "
                      "warpgroup (H200 masked 32 tok/expert EP8 / 16 / 32: 1.04-1.18x the warp-specialized 256x64)")
    elif gluon and (mode == "contiguous" or bm >= _WIDE_MIN_ROWS):
        # masked past 64 expected rows: one split tile an expert (80 / 96 rows) instead of two 64-row ones
        split = split_tile_rows(MASKED_SPREAD * expected_m) if mode == "masked" else 0
        # the Gluon contiguous tile takes whole 128-row segments; masked: the live blocks of each expert
        row_blocks = m // CONTIGUOUS_ALIGNMENT if mode == "contiguous" else g * max(1, -(-expected_m // (split or bm)))
        wide = wide_tile_pays(row_blocks, n)
        # a masked four-warpgroup tile runs warp-specialized where that engine has it
        wide_ws = mode == "masked" and not split and (256, bm) in {t[:2] for t in GLUON_WS_TILES}
        if wide and wide_ws and not env[0]:
            cfg = replace(cfg, engine="gluon_ws", reason=f"{why}; sm_90: warp-specialized register-A Gluon kernel, "
                          "256 weight rows a CTA (H200 EP8 masked 32 tok/expert: 1.03-1.09x the register-A one)")
        elif wide:
            cfg = replace(cfg, engine="gluon_rs", reason=f"{why}; sm_90: register-A Gluon kernel, 256 weight rows a "
                          "CTA (H200 EP8: 1.03-1.19x the warp-specialized 128-row tile, which is 1.09-1.20x the "
                          "register-A one)")
        else:
            cfg = replace(cfg, engine="gluon_ws", reason=f"{why}; sm_90: warp-specialized register-A Gluon kernel, "
                          "128 weight rows (under two waves of 256-row programs; H200: 1.09-1.20x the register-A "
                          "kernel)")
    elif gluon:
        cfg = replace(cfg, engine="gluon_rs", reason=f"{why}; sm_90: register-A Gluon kernel (H200: 1.04-1.36x "
                      "the Triton kernel at 8-32 tok/expert)")
    # the block_m override (first field of the env key) pins the Gluon tile's rows too; an
    # engine override replaces the default engine (the Triton tile is the base config)
    # masked decode grids: about one program an expert and N tile of 64 weight rows (`group_loop_tile`)
    programs = g * _cdiv(n, 64) if mode == "masked" else float("inf")
    cfg = _fit_grouped_engine(apply_env_overrides(cfg, "W4A16_GROUPED"), mode, env, wide, programs, k)
    if split and cfg.engine == "gluon_rs" and cfg.block_n == 256 and not env[0]:
        # the split tile only where the four-warpgroup kernel runs and no BLOCK_M was asked for;
        # its warp-specialized form where one holds the rows, unless an engine was asked for
        ws_rows = min((t[1] for t in GLUON_SPLIT_WS_TILES if t[1] >= split), default=0)
        engine = "gluon_ws" if ws_rows and not env_value(env, "engine") else "gluon_rs"
        rows = ws_rows if engine == "gluon_ws" else split
        bw, br, warps, stages = pick_gluon_tile(grouped_engine_tiles(engine, mode), rows, cfg, env)
        measured = "; warp-specialized (64 / 50 tok/expert: 1.05-1.08x the 96 / 80 register-A tiles)" \
            if engine == "gluon_ws" else ""
        cfg = replace(cfg, engine=engine, block_m=br, block_n=bw, num_warps=warps, num_stages=stages,
                      reason=f"{cfg.reason}; {br}-row split tile, one tile an expert instead of two 64-row ones "
                      f"(H200 EP8 64 tok/expert: 1.15-1.20x{measured}): {bw}x{br}, {stages} stages")
    if cfg.engine in GLUON_ENGINES:
        tile = (cfg.block_n, cfg.block_m, cfg.num_warps, cfg.num_stages)
        tail = tail_rows(tile, cfg.engine, mode)
        if tail:
            measured = "masked 32 tok/expert, with the three-quarter tail: 1.03-1.09x" if cfg.engine == "gluon_ws" \
                else "masked 16-64 tok/expert: 1.04-1.18x"
            cfg = replace(cfg, reason=f"{cfg.reason}; a block whose rows end within its first {tail} runs the "
                          f"{tail}-row tile (H200 {measured})")
        cfg = replace(cfg, reason=cfg.reason + half_acts_note(tile, cfg.engine, mode))
    return avoid_miscompile(cfg, n)


def grouped_engine_tiles(engine: str, mode: str) -> tuple:
    """The (weight rows, rows, warps, stages) tiles a grouped Gluon engine's kernel is built for;
    masked register-A and warp-specialized add their split tiles (rows not a power of two, which
    128-row contiguous segments do not divide)."""
    split = {"gluon_rs": GLUON_SPLIT_TILES, "gluon_ws": GLUON_SPLIT_WS_TILES}.get(engine, ()) if mode == "masked" else ()
    return {"gluon": GLUON_TILES, "gluon_rs": GLUON_RS_TILES, "gluon_ws": GLUON_WS_TILES}[engine] + split


def _fit_grouped_engine(cfg: W4A16Config, mode: str, env: tuple, wide: bool = False,
                        programs: float = float("inf"), k: int = 0) -> W4A16Config:
    """``LOWBIT_W4A16_GROUPED_ENGINE=gluon`` / ``gluon_rs`` as a global switch: that kernel's
    tile with 128 rows for contiguous (a whole segment: each weight tile read once per segment),
    for masked the smallest tile rows holding the M tile the heuristic chose, or the rows that
    ``LOWBIT_W4A16_GROUPED_BLOCK_M`` asks for; ``_BLOCK_N`` (weight rows) and ``_NUM_STAGES``
    pick among that kernel's tiles when set. `wide`: the heuristics chose the four-warpgroup tile
    (256 weight rows), which then comes first. `programs`: the grid's size, about, for
    `group_loop_tile` (unless a stage count is forced; for masked its 128-row form, unless weight
    rows are forced too); `k`: a short masked K runs `tiles.SHORT_K_TILES`' form. The reason says
    what was chosen."""
    if cfg.engine == "triton":
        return cfg
    if cfg.engine not in GLUON_ENGINES:
        raise ValueError(f"LOWBIT_W4A16_GROUPED_ENGINE must be 'triton' or one of {GLUON_ENGINES}, got {cfg.engine!r}")
    tiles = grouped_engine_tiles(cfg.engine, mode)
    if env[0] or mode == "masked":  # env[0]: the BLOCK_M override
        # the smallest tile row count holding the M tile (register-A: 16 to 128 rows)
        rows = min((t[1] for t in tiles if t[1] >= cfg.block_m), default=max(t[1] for t in tiles))
    else:
        rows = CONTIGUOUS_ALIGNMENT
    tile, note = pick_gluon_tile(tiles, rows, cfg, env, wide), ""
    if cfg.engine == "gluon_rs" and not env_value(env, "num_stages"):
        short = mode == "masked" and tile in SHORT_K_TILES and 0 < k <= 256 * SHORT_K_STEPS
        if short:
            tile = SHORT_K_TILES[tile]
        family = "masked" if mode == "masked" and not env_value(env, "block_n") else ""
        tile, note = group_loop_tile(tile, programs, k, family=family)
        if short:
            note += f" (K of at most {SHORT_K_STEPS} steps; H200 masked 16 tok/expert down 1.17-1.19x)"
    bw, br, warps, stages = tile
    return replace(cfg, block_m=br, block_n=bw, num_warps=warps, num_stages=stages, swap_ab=True, split_k=1,
                   reason=f"{cfg.reason}; {cfg.engine} tile {bw} weight rows x {br} rows, {stages} stages{note}")
