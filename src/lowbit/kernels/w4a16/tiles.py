"""The tiles the W4A16 engines are compiled for, as data (no Triton, no Gluon).

A tile is ``(weight rows, activation rows, warps, stages)``: the weight rows are the MMA's M
side (the output columns), the activation rows its N side (for the indexed layout: the routing
block size). The Triton tiles (`VALIDATED_TILES`) are keyed by their M tile instead.

Each register-A tile is one `RegisterATile` record listing the forms it is compiled in; the
tuples and dicts below it (`INDEXED_RS_TILES`, `GROUP_LOOP_MAXNREG`, ...) are views of those
records. Adding a tile to an engine is one record: the launchers, the heuristics' tile lists
and the compile tier's configurations (``compile_configs()`` of the `hopper` modules) derive
from it. The first tile of an activation-row count in a table is that row count's default.

Provenance lines: H200, date, the commit that recorded the figure, the figure (us unless said;
"gate_up / down" are Kimi K2's two projections).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ALLOWED_SPILL_BYTES", "GLUON_ENGINES", "GLUON_RS_TILES", "GLUON_SPLIT_TILES", "GLUON_SPLIT_WS_TILES",
    "GLUON_TILES", "GLUON_WS_TILES", "GROUPED_REGISTER_A", "GROUPED_SPLIT", "GROUP_LOOP_MAXNREG",
    "INDEXED_REGISTER_A", "INDEXED_RS_TILES", "INDEXED_SPLIT_TILES", "INDEXED_TILES", "INDEXED_WS_TILES",
    "NLOOP_CTAS_PER_SM", "NLOOP_HALF_TAIL_TILES", "NLOOP_MAX_ROW_TILES", "NLOOP_N_TILES", "NLOOP_TILES",
    "PREGATHER_BLOCK_TILES", "PREGATHER_TILES", "REGISTER_A_ENGINES", "RegisterATile", "SHORT_K_STEPS",
    "SHORT_K_TILES", "SplitTile", "THIN_GRID_TILES", "Tile", "VALIDATED_TILES", "group_loop", "grouped_form",
    "half_acts", "half_tail", "indexed_form", "k_split_ok", "nloop_tile_counts", "quarter_tail", "split_form",
    "split_rows",
]

Tile = tuple[int, int, int, int]

#: The Hopper engines besides "triton": "gluon" (dequantized weights staged in shared memory),
#: "gluon_rs" (dequantized weights as the register A operand of wgmma) and "gluon_ws" (the
#: register-A kernel with a producer partition issuing every load).
GLUON_ENGINES = ("gluon", "gluon_rs", "gluon_ws")
#: The engines that run the register-A tiles.
REGISTER_A_ENGINES = ("gluon_rs", "gluon_ws")

# --------------------------------------------------------------------------- Triton (every tier)
#: The Triton kernels' tiles, block_m -> (block_n, num_warps, num_stages, swap_ab): each passed
#: the GPU correctness check and was the fastest measured in its regime; 128-row tiles were
#: slower or out of shared memory.
#: H200, 2026-11-29, ae5684e: EP8 20 tokens gate_up / down 16x256 363 / 190, 32x128 399 / 222, 64x64 617 / 386.
VALIDATED_TILES: dict[int, tuple[int, int, int, bool]] = {
    16: (256, 4, 3, True),
    32: (128, 8, 3, True),
    64: (64, 4, 3, True),
}
#: Stack bytes of register spills tolerated per Triton tile (with its serialized wgmmas, C7515):
#: the 16x256 decode tile spills at 255 registers yet is the fastest.
#: H200, 2026-11-29, 1d30cf3: EP8 20 tokens gate_up 363 us vs 378 for the spill-free 16x64.
ALLOWED_SPILL_BYTES: dict[int, int] = {16: 256}

# --------------------------------------------------------------------------- shared-memory engine
#: The shared-memory engine ("gluon"; a comparison point, not a default), grouped layouts: one
#: warpgroup, 64 weight rows; 227 KB of shared memory caps the stages.
#: H200, 2026-11-29, 158cc29: 0.35-0.84x the Triton kernels.
GLUON_TILES: tuple[Tile, ...] = ((64, 128, 4, 2), (64, 64, 4, 3))
#: ... indexed layout: 3 stages at 32 rows or fewer keep a CTA under 113 KB (two CTAs an SM).
INDEXED_TILES: tuple[Tile, ...] = ((64, 16, 4, 3), (64, 32, 4, 3), (64, 64, 4, 3), (64, 16, 4, 6))


# --------------------------------------------------------------------------- register-A engines
@dataclass(frozen=True)
class RegisterATile:
    """A register-A tile and the forms it is compiled in. Tails and refills by halves apply to
    the masked and indexed layouts (contiguous segments are whole 128-row blocks)."""

    shape: Tile
    #: One K group at a time under this ptxas register cap (one warpgroup); 0: the whole-step loop.
    #: H200, 2026-11-30, 3453016: EP8 8 tokens 64x8 group loop 2 stages (8 CTAs an SM) 187.6 / 99.6 vs 203.8 / 111.9.
    group_loop: int = 0
    #: A register cap of the whole-step loop (grouped layouts' row-block loop); 0: none.
    #: H200, 2026-11-30, c010493: masked 8 tok/expert 64x16 capped at 168: 287.7 / 153.7 vs 296.0 / 157.3.
    maxnreg: int = 0
    #: A row block whose second half holds no live row runs the half-row tile in the same program.
    #: H200, 2026-11-30, 11ae8fa: indexed 1024 tokens 256x128 1187.7 -> 1086.8 / 649.4 -> 593.9.
    half_tail: bool = False
    #: (group loop) One K step of activations refilled by halves instead of a ring: more CTAs an SM.
    #: H200, 2026-12-01, 6bd07e6: indexed EP8 256 tokens 128x64 364.7 -> 337.6 / 210.0 -> 184.0.
    half_acts: bool = False
    #: Two accumulators a step (grouped whole-step loop).
    #: H200, 2026-11-30, 7409a63: masked 16 tok/expert 64x32 359.0 -> 339.1 / 226.1 -> 209.6.
    split_acc: bool = False
    #: Has the warp-specialized form (engine "gluon_ws": a producer partition issues every load).
    #: H200, 2026-11-29, d79484b: contiguous 128 rows/expert gate_up 128x128 767.8 vs 894.7 register-A.
    ws: bool = False
    #: Its warp-specialized form has the half and three-quarter tails.
    #: H200, 2026-11-30, 68a2a62: indexed 384 tokens 572.5 / 313.2 -> 540.5 / 304.1 with both.
    ws_tails: bool = False
    #: (indexed) Runs with the in-kernel cp.async gather; False: on pre-gathered rows only.
    gather: bool = True
    #: (indexed) Has the pre-gathered form: rows in the routing's slot order, loaded by TMA.
    #: H200, 2026-12-01, abda502: EP8 gate_up 1024 tokens 256x128 1027.9 -> 956.1 (gather included).
    pregather: bool = False
    #: (indexed) The gather masks rows only, not K, when K is a multiple of 256.
    #: H200, 2026-12-01, ad460ba: EP8 2048 tokens 256x128 gate_up 1808.2 -> 1738.9, down 945.8 -> 911.4.
    even_k: bool = False
    #: (indexed) A K of one 256-wide step runs the N-loop kernel (8 to 56 weight tiles a program).
    nloop: bool = False
    #: (indexed) ... whose blocks with no route in their second half run the half-row tile.
    #: H200, 2026-12-01, 4b6e289: TP8 8192 tokens down 878.8 -> 770.0.
    nloop_half_tail: bool = False
    #: (indexed) The compile tier builds its K-share (split-K) form.
    split_k: bool = False
    #: (indexed) The PDL modes the compile tier builds for its register-A main loop ...
    pdl: tuple[int, ...] = ()
    #: ... and for its warp-specialized form.
    ws_pdl: tuple[int, ...] = ()
    #: Stack bytes tolerated where it spills at its register cap: the masked build with half-step
    #: activations (grouped), the pre-gathered build (indexed): epilogue scalars kept across the loop.
    #: H200, 2026-12-01, 6bd07e6 / f4204f1: measured faster as built (masked 32 tok/expert EP8 300.7 -> 293.0).
    spill_bytes: int = 0


#: The indexed layout's register-A tiles (a routing block's first tile is its default).
#: H200, 2026-11-29, 45e608c: 16-row block 1 / 4 / 20 tokens 64x16 3 stages 103.7 / 258.2 / 478.7, 128x16 136.2 / 360.4 / 692.9.
#: H200, 2026-11-30, 5d3072b: 32-row block TP8 512 / 1024 tokens gate_up 64x32 332.1 / 343.0 vs 128x32 383.3 / 396.0.
#: H200, 2026-11-30, bb25a26: 64- / 128-row blocks, four warpgroups: EP8 256 tokens gate_up 509.2 -> 468.2.
INDEXED_REGISTER_A: tuple[RegisterATile, ...] = (
    RegisterATile((64, 8, 4, 2), group_loop=64, split_k=True, pdl=(1, 2)),
    RegisterATile((64, 8, 4, 3), split_k=True, pdl=(1, 2)),
    RegisterATile((128, 8, 4, 2), group_loop=96),
    RegisterATile((64, 16, 4, 2), group_loop=72),
    RegisterATile((64, 16, 4, 3)),
    RegisterATile((64, 16, 4, 4)),
    RegisterATile((64, 16, 4, 6)),
    RegisterATile((128, 16, 8, 4), ws=True, nloop=True),
    RegisterATile((128, 16, 4, 2), group_loop=128),
    RegisterATile((64, 32, 4, 4)),
    RegisterATile((128, 32, 8, 4), ws=True, nloop=True),
    RegisterATile((128, 32, 4, 2), group_loop=128),
    RegisterATile((128, 64, 4, 2), group_loop=168, half_tail=True, half_acts=True, pregather=True, pdl=(1, 2),
                  spill_bytes=16),
    RegisterATile((256, 64, 16, 3), ws=True, ws_tails=True, even_k=True, ws_pdl=(1,)),
    RegisterATile((128, 64, 8, 3), ws=True, nloop=True),
    RegisterATile((64, 64, 4, 3)),
    RegisterATile((256, 128, 16, 2), half_tail=True, pregather=True, even_k=True, pdl=(1, 2)),
    RegisterATile((128, 128, 8, 2), ws=True, nloop=True, nloop_half_tail=True),
    RegisterATile((64, 128, 4, 2)),
    # the 128-row block on one warpgroup: pre-gathered rows only (with the in-kernel gather it spills)
    RegisterATile((128, 128, 4, 2), group_loop=240, half_tail=True, half_acts=True, gather=False, pregather=True),
)

#: The grouped layouts' (contiguous, masked) register-A tiles (a row count's first tile is its default).
#: H200, 2026-11-29, fc8b9e0: contiguous 128 rows/expert 128x128 1283, 128x64 1714, 64x128 1861, Triton 2560.
#: H200, 2026-11-30, 03578a1: four warpgroups, contiguous 256 rows/expert gate_up 1385.1 -> 1239.0.
GROUPED_REGISTER_A: tuple[RegisterATile, ...] = (
    RegisterATile((256, 128, 16, 2)),
    RegisterATile((128, 128, 8, 2), ws=True),
    RegisterATile((128, 64, 4, 2), group_loop=168, half_tail=True, half_acts=True, spill_bytes=64),
    RegisterATile((256, 64, 16, 3), half_tail=True, ws=True, ws_tails=True),
    RegisterATile((128, 64, 8, 3), ws=True),
    RegisterATile((64, 128, 4, 2)),
    RegisterATile((64, 128, 4, 3)),
    RegisterATile((64, 32, 4, 4), half_tail=True, split_acc=True),
    RegisterATile((64, 32, 4, 2), group_loop=128),
    RegisterATile((128, 32, 8, 4), ws=True),
    RegisterATile((128, 32, 4, 2), group_loop=128),
    RegisterATile((64, 16, 4, 2), group_loop=72),
    RegisterATile((64, 16, 4, 3), maxnreg=168),
    RegisterATile((64, 16, 4, 4)),
    RegisterATile((128, 16, 8, 4), ws=True),
    RegisterATile((128, 16, 4, 2), group_loop=128),
)


@dataclass(frozen=True)
class SplitTile:
    """A four-warpgroup masked tile whose rows are not a power of two (two accumulators:
    48 = 32 + 16, 80 = 64 + 16, 96 = 64 + 32; masked only: 128-row segments do not divide)."""

    shape: Tile
    #: Has the warp-specialized form (rows BR_HI + BR_HI / 2: three quarters of a 2 * BR_HI ring).
    ws: bool = False
    #: A block whose rows end within its first BR_HI runs the BR_HI-row tile alone.
    #: H200, 2026-11-30, f071a48: masked 64 tok/expert 256x96 524.8 -> 467.9 / 301.9 -> 263.5.
    hi_tail: bool = True


#: H200, 2026-11-30, b03d48e: masked 64 tok/expert 256x80 574.0 / 309.2 vs 256x64 687.2 / 365.1.
GROUPED_SPLIT: tuple[SplitTile, ...] = (
    SplitTile((256, 48, 16, 3), ws=True),
    SplitTile((256, 80, 16, 2)),
    SplitTile((256, 96, 16, 2), ws=True),
)


def _ws_first_two_warpgroups(tiles) -> tuple[Tile, ...]:
    # a row count's warp-specialized default is its two-warpgroup tile; the four-warpgroup one
    # runs where the heuristics ask for 256 weight rows (they put those first)
    return tuple(sorted(tiles, key=lambda t: t[2] > 8))


INDEXED_RS_TILES: tuple[Tile, ...] = tuple(t.shape for t in INDEXED_REGISTER_A if t.gather)
INDEXED_WS_TILES: tuple[Tile, ...] = _ws_first_two_warpgroups(t.shape for t in INDEXED_REGISTER_A if t.ws)
GLUON_RS_TILES: tuple[Tile, ...] = tuple(t.shape for t in GROUPED_REGISTER_A)
GLUON_WS_TILES: tuple[Tile, ...] = _ws_first_two_warpgroups(t.shape for t in GROUPED_REGISTER_A if t.ws)
GLUON_SPLIT_TILES: tuple[Tile, ...] = tuple(t.shape for t in GROUPED_SPLIT)
GLUON_SPLIT_WS_TILES: tuple[Tile, ...] = tuple(t.shape for t in GROUPED_SPLIT if t.ws)
#: The indexed tiles with a pre-gathered form.
PREGATHER_TILES: tuple[Tile, ...] = tuple(t.shape for t in INDEXED_REGISTER_A if t.pregather)
#: The indexed tiles whose K-share form the compile tier builds (any tile splits on request).
INDEXED_SPLIT_TILES: tuple[Tile, ...] = tuple(t.shape for t in INDEXED_REGISTER_A if t.split_k)
#: The indexed tiles that run as the N-loop kernel when K is one step (two warpgroups: the
#: 4- and 16-warp tiles spill in the N loop).
NLOOP_TILES: tuple[Tile, ...] = tuple(t.shape for t in INDEXED_REGISTER_A if t.nloop)
NLOOP_HALF_TAIL_TILES: tuple[Tile, ...] = tuple(t.shape for t in INDEXED_REGISTER_A if t.nloop_half_tail)

_INDEXED = {t.shape: t for t in INDEXED_REGISTER_A}
_GROUPED = {t.shape: t for t in GROUPED_REGISTER_A}
_SPLIT = {t.shape: t for t in GROUPED_SPLIT}


def _group_loop_caps() -> dict[Tile, int]:
    caps: dict[Tile, int] = {}
    for t in INDEXED_REGISTER_A + GROUPED_REGISTER_A:
        if t.group_loop:
            if caps.setdefault(t.shape, t.group_loop) != t.group_loop:
                raise ValueError(f"tile {t.shape}: group-loop register caps {caps[t.shape]} and {t.group_loop}")
    return caps


#: The group-loop tiles (one warpgroup) and their ptxas register caps, every layout.
GROUP_LOOP_MAXNREG: dict[Tile, int] = _group_loop_caps()

#: Masked tiles whose form for a K of at most `SHORT_K_STEPS` 256-wide steps is a group-loop tile.
#: H200, 2026-11-30, 109e3d9: masked 16 tok/expert down (K 8 steps) 1.17-1.19x, gate_up (K 28 steps) 0.99x.
SHORT_K_TILES: dict[Tile, Tile] = {(64, 32, 4, 4): (64, 32, 4, 2)}
SHORT_K_STEPS = 8
#: A group-loop tile's deeper-ring alternative (the whole-step loop, 3 stages) for a thin grid.
#: H200, 2026-11-30, 3453016: EP8 1 token gate_up 64x8 2 stages 74.3 us, 3 stages 50.1.
THIN_GRID_TILES: dict[Tile, Tile] = {(64, 8, 4, 2): (64, 8, 4, 3), (64, 16, 4, 2): (64, 16, 4, 3)}
#: The pre-gathered path's tile by routing block, where it differs from the block's default.
#: H200, 2026-12-01, f4204f1: EP8 gate_up 1024 tokens pre-gathered 128x128 one warpgroup 921.3 vs 256x128 991.3.
PREGATHER_BLOCK_TILES: dict[int, Tile] = {128: (128, 128, 4, 2)}

#: N tiles a program of the N-loop kernel may loop over (each a compiled variant), most first.
NLOOP_N_TILES: tuple[int, ...] = (56, 28, 14, 8)
#: A program's tiles times its routing block's rows at most: long programs leave the last wave uneven.
NLOOP_MAX_ROW_TILES = 128 * 28
#: CTAs an SM of each N-loop routing block's tile, by its registers and shared memory (the
#: compile tier's check: 16 / 32 rows 112-124 registers, 64 / 128 rows 150-178, 256 threads).
NLOOP_CTAS_PER_SM: dict[int, int] = {16: 2, 32: 2, 64: 1, 128: 1}


def indexed_form(tile) -> RegisterATile | None:
    """The indexed register-A record of `tile`, None if the engine has no such tile."""
    return _INDEXED.get(tuple(tile))


def grouped_form(tile) -> RegisterATile | None:
    """The grouped register-A record of `tile`, None if the engine has no such tile."""
    return _GROUPED.get(tuple(tile))


def split_form(tile) -> SplitTile | None:
    """The masked split-tile record of `tile`, None if it is not a split tile."""
    return _SPLIT.get(tuple(tile))


def _form(tile, layout: str) -> RegisterATile | None:
    if layout == "indexed":
        return indexed_form(tile)
    if layout == "masked":
        return grouped_form(tile)
    if layout == "contiguous":
        return None  # whole 128-row segments: no tails, no refills by halves
    raise ValueError(f"layout must be 'indexed', 'masked' or 'contiguous', got {layout!r}")


def group_loop(tile, warp_specialize: bool) -> bool:
    """Whether a register-A launch of `tile` runs the group loop (never the warp-specialized loop)."""
    return not warp_specialize and tuple(tile) in GROUP_LOOP_MAXNREG


def half_tail(tile, warp_specialize: bool, layout: str) -> bool:
    """Whether `tile`'s blocks with an empty second half run the half-row tile (`layout`:
    "indexed", "masked" or "contiguous"; warp-specialized: its tails' form)."""
    form = _form(tile, layout)
    return form is not None and (form.ws_tails if warp_specialize else form.half_tail)


def quarter_tail(tile, warp_specialize: bool, layout: str) -> bool:
    """Whether `tile`'s warp-specialized blocks with an empty last quarter multiply only three quarters."""
    form = _form(tile, layout)
    return warp_specialize and form is not None and form.ws_tails


def half_acts(tile, warp_specialize: bool, layout: str) -> bool:
    """Whether a group-loop launch of `tile` refills one step of activations by halves."""
    form = _form(tile, layout)
    return group_loop(tile, warp_specialize) and form is not None and form.half_acts


def split_rows(br: int) -> tuple[int, int]:
    """A row tile that is not a power of two as (power of two, power-of-two remainder >= 8)."""
    hi = 1 << (br.bit_length() - 1)
    lo = br - hi
    if lo & (lo - 1) or lo < 8:
        raise ValueError(f"row tile {br} is not a power of two plus a power of two >= 8")
    return hi, lo


def nloop_tile_counts(block_m: int) -> tuple[int, ...]:
    """The tiles a program (`NLOOP_N_TILES`) a routing block of `block_m` rows may run in the N-loop
    kernel, most first: each a compiled variant, at most `NLOOP_MAX_ROW_TILES` rows x tiles."""
    return tuple(c for c in NLOOP_N_TILES if block_m * c <= NLOOP_MAX_ROW_TILES or c == NLOOP_N_TILES[-1])


def k_split_ok(k: int, split: int) -> bool:
    """Whether `split` shares of K's 256-wide steps are all non-empty (the register-A kernel's
    K shares: as equal as can be, each at least one step)."""
    return 1 <= split <= -(-k // 256)
