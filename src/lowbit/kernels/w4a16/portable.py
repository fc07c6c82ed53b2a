"""What the W4A16 kernel families share: the main loop over K, the launch configuration type,
the GPU-validated tile table and the environment overrides.

`w4a16_tile` computes one ``[BM, BN]`` output tile ``A[rows] @ dequant(W[e, cols])^T`` in FP32
from the prepared layout (`lowbit.formats.w4a16`): per 256-wide K tile, one load of 32 words
per weight row; a shift by ``4i`` exposes groups ``i`` and ``i + 4``, dequantized two at a time
by `int4_dequant.dequant_pair` with one scale per row, then two 32-deep tensor-core dots.
``SWAP_AB`` puts the dequantized weight on the MMA's M side (``acc^T[BN, BM] += W @ A^T``):
the words go from shared memory straight into the wgmma A-operand registers, are dequantized
there, and never return to shared memory; the activations are the B operand.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import triton
import triton.language as tl

from ...runtime import numerics, overrides
from .int4 import dequant_pair

__all__ = ["GLUON_ENGINES", "REGISTER_A_ENGINES", "VALIDATED_TILES", "W4A16Config", "apply_env_overrides", "avoid_miscompile", "env_key", "env_value",
           "override_names", "pick_gluon_tile", "w4a16_tile"]


@triton.jit
def w4a16_tile(a_ptr, a_row, row_ok, stride_am, qw_ptr, s_ptr, e, rn, n_ok,
               stride_qe, stride_qn, stride_se, stride_sk, K, kt_lo, kt_hi,
               BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr):
    """FP32 ``[BM, BN]``: rows `a_row` (int64 ``[BM]``, masked by `row_ok`) of A (bf16, row
    stride `stride_am`) times expert `e`'s dequantized weight rows `rn` (masked by `n_ok`),
    summed over the 256-wide K tiles ``kt_lo <= kt < kt_hi`` (all of K: ``0, cdiv(K, 256)``;
    a split-K share otherwise)."""
    j = tl.arange(0, 32)
    qw_rows = qw_ptr + e * stride_qe + rn[:, None].to(tl.int64) * stride_qn + j[None, :]
    s_rows = s_ptr + e * stride_se + rn
    a_rows = a_ptr + a_row[:, None] * stride_am + j[None, :]
    if SWAP_AB:
        acc = tl.zeros([BN, BM], tl.float32)
    else:
        acc = tl.zeros([BM, BN], tl.float32)
    for kt in range(kt_lo, kt_hi):
        words = tl.load(qw_rows + kt * 32, mask=n_ok[:, None], other=0)
        for i in tl.static_range(4):
            # one shift serves two groups: i (low half-word) and i + 4 (high half-word)
            s_lo = tl.load(s_rows + (kt * 8 + i) * stride_sk, mask=n_ok, other=0.0)
            s_hi = tl.load(s_rows + (kt * 8 + i + 4) * stride_sk, mask=n_ok, other=0.0)
            w_lo, w_hi = dequant_pair(words >> (4 * i), s_lo[:, None], s_hi[:, None])
            k_lo = kt * 256 + i * 32
            k_hi = k_lo + 128
            a_lo = tl.load(a_rows + k_lo, mask=row_ok[:, None] & ((k_lo + j)[None, :] < K), other=0.0)
            a_hi = tl.load(a_rows + k_hi, mask=row_ok[:, None] & ((k_hi + j)[None, :] < K), other=0.0)
            if SWAP_AB:
                acc = numerics.dot(w_lo, tl.trans(a_lo), acc)
                acc = numerics.dot(w_hi, tl.trans(a_hi), acc)
            else:
                acc = numerics.dot(a_lo, tl.trans(w_lo), acc)
                acc = numerics.dot(a_hi, tl.trans(w_hi), acc)
    if SWAP_AB:
        acc = tl.trans(acc)
    return acc


@dataclass(frozen=True)
class W4A16Config:
    """Launch choice of a W4A16 kernel: the M tile (for the indexed family also the routing
    block size), the N tile, warps, pipeline stages, whether the weight is the MMA's M side,
    and split-K (indexed family only: K shares summed in FP32 by a second kernel)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    swap_ab: bool
    split_k: int = 1
    #: "triton" (every tier) or one of `GLUON_ENGINES` (`w4a16_sm90`, the Hopper kernels that
    #: overlap dequant with wgmma; the heuristics' choice on sm_90 where measured faster)
    engine: str = "triton"
    reason: str = ""
    #: indexed family, engine "gluon_rs": gather the routed rows into the routing's slot order
    #: first (`moe_routing.gather_indexed_rows`) and load them by TMA (`w4a16_sm90.PREGATHER_TILES`)
    pregather: bool = False


#: The Hopper engines besides "triton": "gluon" (dequantized weights staged in shared memory),
#: "gluon_rs" (dequantized weights as the register A operand of wgmma) and "gluon_ws" (the
#: register-A kernel with a producer partition issuing every load: TMA for the grouped layouts,
#: the indexed kernel's routed rows by cp.async; two-warpgroup tiles only).
GLUON_ENGINES = ("gluon", "gluon_rs", "gluon_ws")
#: The engines that run the register-A tiles (`w4a16_sm90.GLUON_RS_TILES` / `INDEXED_RS_TILES`).
REGISTER_A_ENGINES = ("gluon_rs", "gluon_ws")

#: Tiles that passed the GPU correctness check of `scripts/w4a16_sweep.py` and are the fastest
#: measured in their regime (H200, 2026-11-29, sweep at a075672, median us, L2 flushed;
#: gate_up / down of the indexed kernel):
#:   EP8 20 tok (tok_e 3.3):    16x256 w4: 363 / 190   32x128 w8: 399 / 222   64x64 w4: 617 / 386
#:   TP8 8192 rows (tok_e 21):  32x128 w8: 455 / 394   16x256 w4: 653 / 526   64x64 w4: 694 / 695
#:   EP8 2048 rows (tok_e 43):  64x64 w4:  705 / 420   64x128 w8: 766 / 410   32x128 w8: 809 / 432
#: 128-row tiles were all slower (>= 1010 us on EP8 2048 gate_up) or out of shared memory.
#: Triton 3.6 built kernels that fault (misaligned address) for some other tiles (64x256 w8,
#: 32x128 w4): a tile enters this table only after passing the GPU check.
#: block_m -> (block_n, num_warps, num_stages, swap_ab)
VALIDATED_TILES: dict[int, tuple[int, int, int, bool]] = {
    16: (256, 4, 3, True),
    32: (128, 8, 3, True),
    64: (64, 4, 3, True),
}

#: Register spills (stack bytes, sm_90a compile) tolerated per tile: the 16x256 decode tile
#: spills 104-176 B at 255 registers yet measured fastest (EP8 20 tok gate_up 363 us vs 378 us
#: for the spill-free 16x64 tile, same sweep); every other tile must not spill. The same tile's
#: wgmmas are serialized (ptxas C7515, part of that measurement): tolerated with the spills.
ALLOWED_SPILL_BYTES: dict[int, int] = {16: 256}

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
    return overrides.apply_env_overrides(cfg, family, _OVERRIDE_FIELDS)


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
    swap-AB tile (4 warps) at 2 and 3 pipeline stages when N is not a multiple of 16: relative
    error ~1 on the H200, indexed and contiguous alike, for N = 37, 72, 100, 136, 200 (1 and 4
    stages and the 16- and 32-row tiles correct; N = 192 correct everywhere; probe of 2026-11-29,
    kept as the GPU test ``test_tiles_with_n_off_16``). Such shapes run the tile unpipelined:
    correct first (production shapes, N = 4096 / 7168, are multiples of 16 and unaffected)."""
    if (cfg.engine == "triton" and n % 16 and cfg.block_m == 64 and cfg.block_n == 64 and cfg.swap_ab
            and cfg.num_stages in (2, 3)):
        return replace(cfg, num_stages=1, reason=f"{cfg.reason}; N={n} % 16 != 0: 1 stage (Triton 3.6 "
                       f"miscompiles this tile at {cfg.num_stages} stages)")
    return cfg


def tile_config(block_m: int, why: str) -> W4A16Config:
    if block_m not in VALIDATED_TILES:
        raise ValueError(f"no GPU-validated W4A16 tile with block_m={block_m}; one of {sorted(VALIDATED_TILES)}")
    bn, warps, stages, swap = VALIDATED_TILES[block_m]
    return W4A16Config(block_m, bn, warps, stages, swap, reason=why)


def compile_configs_for(fn, signature: dict, name: str, extra_constexprs: list[dict], unaligned: tuple[str, ...]):
    """KernelConfigs of every validated tile x each extra-constexpr variant (compile tier)."""
    from ..compile_tier import KernelConfig

    cfgs = []
    for bm, (bn, warps, stages, swap) in VALIDATED_TILES.items():
        for extra in extra_constexprs:
            tag = ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in extra.items())
            cfgs.append(KernelConfig(
                f"{name}[BM={bm},BN={bn},w={warps},swap={int(swap)}{',' + tag if tag else ''}]", fn, signature,
                {"BM": bm, "BN": bn, "SWAP_AB": swap, **extra}, num_warps=warps, num_stages=stages,
                expect_sass=("HGMMA",) if (bn if swap else bm) >= 64 else ("HMMA",), unaligned=unaligned,
                max_spill_bytes=ALLOWED_SPILL_BYTES.get(bm, 0),
                allowed_ptxas=("C7515",) if bm in ALLOWED_SPILL_BYTES else ()))
    return cfgs
