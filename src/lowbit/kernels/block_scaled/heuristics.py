"""Launch heuristics of `fp8_gemm` and `fp4_gemm`: pure functions of the problem (M, N, K, SM
count, which engines the device can run) returning a `BlockScaledConfig` with the reason for
it, memoized with the ``LOWBIT_FP8_GEMM_*`` / ``LOWBIT_FP4_GEMM_*`` overrides in the key.

Tiles come from `tiles` (the compile tier's register and shared-memory budgets); splits from a
grid-fill rule (`split_k_for`, the Triton kernels) or the measured one-wave rule
(`gluon_split_k`, the 64x128 Gluon kernel); engines: ``"triton"`` (every tier), ``"gluon"``
(fp8_gemm on sm_90: the default at every M), ``"fold"`` (fp4_gemm on sm_90, act_block_size 128,
M > 64 or a folded weight) and ``"mma"`` (fp4_gemm on sm_90, decode M <= 64 on a raw weight).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import triton

from ...runtime.device import H200_NUM_SMS
from ...runtime.overrides import apply_env_overrides, env_key, override_names, overridden
from .splitk import split_blocks
from .tiles import (
    DECODE_MMA_TILES,
    FP4_DECODE_TILES,
    FP4_PREFILL_TILE,
    FP8_DECODE_TILES,
    FP8_MID_TILE,
    FP8_PREFILL_TILE,
    GLUON_TILES,
    SCALE_BLOCK,
)

__all__ = [
    "BlockScaledConfig",
    "FP8_ENV_OVERRIDES",
    "FP4_ENV_OVERRIDES",
    "fp8_gemm_config",
    "explain_fp8_gemm_config",
    "fp4_gemm_config",
    "explain_fp4_gemm_config",
    "gluon_tile",
    "prefill_gluon_tile",
    "gluon_split_k",
    "split_k_for",
    "mma_tile_problem",
]


@dataclass(frozen=True)
class BlockScaledConfig:
    """Launch choice of a block-scaled GEMM (fp8_gemm, fp4_gemm).

    block_m / block_n: the output tile (block_n divides 128: one weight-scale row per tile for
    fp8_gemm); swap_ab: weight rows on the MMA's M side (decode); split_k: programs along K
    (> 1 adds the FP32 workspace and the reduction); k_step: 128, or 32 for fp4_gemm's
    per-group path; engine: ``"triton"`` (the tl.dot kernels, every tier), ``"gluon"``
    (fp8_gemm only: `hopper_fp8`'s kernels, a tile of `GLUON_TILES`), ``"fold"`` (fp4_gemm
    only: the weight folded to FP8, then that Gluon kernel with per-row weight scales; block_*
    etc. describe its Gluon tile) or ``"mma"`` (fp4_gemm only: `hopper_fp4`'s decode engine;
    block_m = padded activation rows, block_n = 16 * num_warps weight rows); reason: why the
    heuristic chose it (and any override applied)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    swap_ab: bool
    split_k: int = 1
    k_step: int = 128
    engine: str = "triton"
    reason: str = ""


_FP8_FIELDS = ("block_m", "block_n", "num_warps", "num_stages", "swap_ab", "split_k", "engine")
_FP4_FIELDS = ("block_m", "block_n", "num_warps", "num_stages", "swap_ab", "split_k", "k_step", "engine")
#: The tuning overrides read by `fp8_gemm_config` / `fp4_gemm_config` (each part of the memo key).
FP8_ENV_OVERRIDES = override_names("FP8_GEMM", _FP8_FIELDS)
FP4_ENV_OVERRIDES = override_names("FP4_GEMM", _FP4_FIELDS)


def _tile(tile: tuple, reason: str, **kw) -> BlockScaledConfig:
    """A `BlockScaledConfig` from a Triton tile ``(block_m, block_n, num_warps, num_stages, swap_ab)``."""
    return BlockScaledConfig(*tile, reason=reason, **kw)


def _decode_rows(m: int) -> int:
    """M padded to a power of two >= 16: the key of the decode tile tables."""
    return max(16, triton.next_power_of_2(m))


def _decode_why(m: int) -> str:
    return (f"decode M={m}: swap-AB, 64 weight rows on the wgmma M side, {_decode_rows(m)} activation rows "
            f"as its N side; BN=64 (not 128) doubles the programs along N before splitting K")


def split_k_for(programs: int, k_steps: int, sms: int, m_pad: int, n: int, weight_bytes: int,
                min_steps: int = 4) -> tuple[int, str]:
    """Grid-fill rule of the Triton kernels (a model, not measured): split K only while the grid
    holds fewer programs than SMs; keep >= `min_steps` K steps per split (the promotion and the
    workspace amortized) and the FP32 workspace traffic (write + read, ``8 * split * m_pad * n``
    bytes) under half the weight bytes the GEMM must read anyway. Splits are equalized so none is
    empty. Returns (split, why)."""
    if programs >= sms:
        return 1, f"{programs} programs fill {sms} SMs"
    split = min(sms // programs, k_steps // min_steps, weight_bytes // (16 * m_pad * n) if n else 1)
    if split <= 1:
        return 1, f"{programs} programs < {sms} SMs, but K ({k_steps} steps) or the workspace budget allows no split"
    per = triton.cdiv(k_steps, split)
    split = triton.cdiv(k_steps, per)
    return split, f"{programs} programs < {sms} SMs: split K {split} ways ({per} steps each)"


def gluon_split_k(m: int, n: int, k_blocks: int, sms: int) -> tuple[int, str]:
    """Split-K of the 64x128 Gluon kernel (also the fold engine's GEMM) where its tiles leave SMs
    idle: as many splits as keep the grid within one wave (``sms // tiles``) and at least 10 K
    blocks a split (each split costs its share of the FP32 workspace and the reduction launch),
    blocks a split rounded up to even (`split_blocks`). Returns (split, why)."""
    # H200, 2026-11-30, commit e03f9ad: M=16 (N, K) = (2304, 5120) split 1 / 4 / 10: 16.6 / 13.1 / 13.9 us
    tiles = triton.cdiv(m, 64) * triton.cdiv(n, 128)
    want = min(sms // max(tiles, 1), k_blocks // 10)
    if want <= 1:
        return 1, f"; {tiles} 64x128 tiles, {k_blocks} K blocks: no split (one wave, >= 10 blocks a split)"
    per, split = split_blocks(k_blocks, want)
    return split, f"; {tiles} 64x128 tiles: split K {split} ways ({per} blocks each; one wave, >= 10 blocks a split)"


def prefill_gluon_tile(m: int, n: int, sms: int) -> tuple[int, int, int, int, str]:
    """(block_m, block_n, num_warps, stages, why) of the Gluon FP8 GEMM for M > 64 (also the fold
    engine of `fp4_gemm`). Where 128x128 tiles fill the SMs: the persistent warp-specialized
    kernel with two (128 rows) or three (192 rows) consumer warpgroups, whichever needs fewer
    rows of work: rounds of programs (``ceil(tiles / sms)``) x rows a tile, ties to 128 (equal
    per-block speed at 8192^3). Otherwise the 64x128 kernel (more programs)."""
    # H200, 2026-11-30, commit c70ca24: M=4096 (N, K) = (2304, 5120) 192 / 128 rows / 64x128: 86.8 / 88.4 / 114.4 us
    tiles128 = triton.cdiv(m, 128) * triton.cdiv(n, 128)
    if tiles128 < sms:
        return 64, 128, 4, 4, (f"{tiles128} 128x128 tiles < {sms} SMs: Gluon 64x128 (two K blocks an iteration, "
                               f"one's promotion under the other's wgmma)")
    work = {bm: triton.cdiv(triton.cdiv(m, bm) * triton.cdiv(n, 128), sms) * bm for bm in (128, 192)}
    bm = 192 if work[192] < work[128] else 128
    return bm, 128, bm // 16, 4, (
        f"persistent warp-specialized Gluon kernel, {bm // 64} consumer warpgroups ({bm}x128 tiles: "
        f"{work[bm] // bm} rounds of {sms} programs; 128 rows {work[128] // 128} rounds, 192 rows "
        f"{work[192] // 192}); H200 M=4096 0.80-0.85x torch's per-tensor FP8 GEMM")


def gluon_tile(m: int, n: int, k: int, sms: int) -> tuple[int, int, int, int, int, str]:
    """(block_m, block_n, num_warps, stages, split_k, why) of the Gluon FP8 GEMM for any M: decode
    (M <= 64) on the 64x128 kernel (TMA zero-fills the rows past M), larger M by
    `prefill_gluon_tile`; the 64x128 kernel split along K by `gluon_split_k`."""
    if m <= 64:
        bm, bn, warps, stages = 64, 128, 4, 4
        why = f"decode M={m}: Gluon 64x128 (one warpgroup, the weight read once a tile of N)"
    else:
        bm, bn, warps, stages, why = prefill_gluon_tile(m, n, sms)
    split, swhy = gluon_split_k(m, n, triton.cdiv(k, SCALE_BLOCK), sms) if bm == 64 else (1, "")
    return bm, bn, warps, stages, split, why + swhy


# --------------------------------------------------------------------------- fp8_gemm
@lru_cache(maxsize=4096)
def _fp8_config_cached(m: int, n: int, k: int, sms: int, gluon: bool, env: tuple) -> BlockScaledConfig:
    if m <= 64:
        cfg = _tile(FP8_DECODE_TILES[_decode_rows(m)], _decode_why(m))
    elif m <= 128:
        cfg = _tile(FP8_MID_TILE, f"M={m}: 64x128 tiles, one warpgroup (wgmma m64n128); two M tiles rather than "
                                  f"one half-empty 128-row tile")
    else:
        cfg = _tile(FP8_PREFILL_TILE, f"prefill M={m}: 128x128 tiles, two warpgroups of 64 rows; the two FP32 "
                                      f"accumulators (running sum + block product) take 128 registers a thread, "
                                      f"so 128x256 would spill")
    kb = triton.cdiv(k, SCALE_BLOCK)
    gcfg = None
    if gluon:
        # the Gluon kernels at every M on sm_90
        # H200, 2026-11-30, commit e03f9ad: M=128 (N, K) = (2304, 5120) Gluon 14.9 us, the Triton kernel 20.7
        bm, bn, warps, stages, split, why = gluon_tile(m, n, k, sms)
        gcfg = cfg = BlockScaledConfig(bm, bn, warps, stages, False, split_k=split, engine="gluon",
                                       reason=f"M={m} on sm_90: {why}")
    else:
        programs = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
        split, why = split_k_for(programs, kb, sms, triton.cdiv(m, cfg.block_m) * cfg.block_m, n, n * k)
        cfg = replace(cfg, split_k=split, reason=cfg.reason + "; " + why)
    return _fp8_fit_engine(apply_env_overrides(cfg, "FP8_GEMM", _FP8_FIELDS), m, gcfg)


def _fp8_fit_engine(cfg: BlockScaledConfig, m: int, gluon_cfg: BlockScaledConfig | None = None) -> BlockScaledConfig:
    """``LOWBIT_FP8_GEMM_ENGINE=gluon`` works as a global switch: a shape whose tile the Gluon
    kernel does not have gets the Gluon configuration the heuristic has for it (`gluon_cfg`,
    decode shapes included: the 64x128 tile with its K split; an asked-for split is kept), or
    without one its nearest Gluon tile, with the reason said."""
    if cfg.engine != "gluon":
        return cfg
    if (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) in GLUON_TILES and not cfg.swap_ab \
            and (cfg.split_k == 1 or cfg.block_m == 64):
        return cfg
    if gluon_cfg is not None:
        split = gluon_cfg.split_k
        if overridden("FP8_GEMM", "split_k") and gluon_cfg.block_m == 64:
            split = cfg.split_k
        return replace(gluon_cfg, split_k=split, reason=f"{cfg.reason}; gluon: {gluon_cfg.reason}, split_k {split}")
    bm, bn, warps, stages = next(t for t in GLUON_TILES if t[0] == (128 if m > 128 else 64))
    split = cfg.split_k if bm == 64 else 1  # an asked-for split survives onto the 64x128 tile
    return replace(cfg, block_m=bm, block_n=bn, num_warps=warps, num_stages=stages, swap_ab=False, split_k=split,
                   reason=f"{cfg.reason}; gluon tile {bm}x{bn}, {warps} warps, {stages} stages, split_k {split}")


def fp8_gemm_config(m: int, n: int, k: int, sms: int = H200_NUM_SMS, gluon: bool = False) -> BlockScaledConfig:
    """Launch configuration of `fp8_gemm` for ``[m, k] x [n, k]^T`` on a GPU with `sms` SMs,
    memoized per shape and the ``LOWBIT_FP8_GEMM_*`` overrides (BLOCK_M, BLOCK_N, NUM_WARPS,
    NUM_STAGES, SWAP_AB, SPLIT_K, ENGINE). gluon: the Gluon sm_90 engine may be chosen (a
    Hopper GPU, TMA-able operands); every shape then gets it by default."""
    return _fp8_config_cached(m, n, k, sms, gluon, env_key("FP8_GEMM", _FP8_FIELDS))


def explain_fp8_gemm_config(m: int, n: int, k: int, sms: int = H200_NUM_SMS, gluon: bool = False) -> str:
    """`fp8_gemm_config`'s choice for the shape as one line, with its reason."""
    c = fp8_gemm_config(m, n, k, sms, gluon)
    return (f"fp8_gemm M={m} N={n} K={k}: block_m={c.block_m} block_n={c.block_n} warps={c.num_warps} "
            f"stages={c.num_stages} swap_ab={c.swap_ab} split_k={c.split_k} engine={c.engine} -- {c.reason}")


# --------------------------------------------------------------------------- fp4_gemm
def mma_tile_problem(cfg: BlockScaledConfig, m: int) -> str | None:
    """Why `cfg` is not a tile of the mma engine for M rows (None when it is): block_m (the
    padded activation rows) 16 / 32 / 64 and >= M, block_n = 16 * num_warps with 1-8 warps,
    2-8 stages, split_k >= 1 (overrides may reach tiles beside `DECODE_MMA_TILES`)."""
    if cfg.block_m not in DECODE_MMA_TILES or cfg.block_m < m:
        return f"block_m must be one of {sorted(DECODE_MMA_TILES)} and >= M={m}, got {cfg.block_m}"
    if cfg.num_warps not in (1, 2, 4, 8) or cfg.block_n != 16 * cfg.num_warps:
        return f"block_n must be 16 * num_warps (1-8 warps), got {cfg.block_n} with {cfg.num_warps} warps"
    if not 2 <= cfg.num_stages <= 8 or cfg.split_k < 1:
        return f"num_stages must be 2-8 and split_k >= 1, got {cfg.num_stages}, {cfg.split_k}"
    return None


def _fp4_direct_config(m: int, n: int, k: int, act_block_size: int, sms: int) -> BlockScaledConfig:
    """The direct Triton kernel's configuration (engine "triton"), before the overrides."""
    if act_block_size == 128:
        k_step, kwhy = 128, "k_step 128: group scales folded exactly into the FP8 weight operand"
    else:
        k_step, kwhy = 32, "k_step 32: 1x32 activation scales force a promotion per weight group"
    if m <= 64:
        cfg = _tile(FP4_DECODE_TILES[_decode_rows(m)], _decode_why(m))
    else:
        cfg = _tile(FP4_PREFILL_TILE, f"M={m}: 128x64 tiles, two warpgroups; one upcast weight tile serves 128 rows")
    steps = triton.cdiv(k, k_step)
    programs = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    split, swhy = split_k_for(programs, steps, sms, triton.cdiv(m, cfg.block_m) * cfg.block_m, n, n * k // 2,
                              min_steps=512 // k_step)
    return replace(cfg, split_k=split, k_step=k_step, reason=f"{cfg.reason}; {kwhy}; {swhy}")


def _fp4_fold_config(m: int, n: int, k: int, sms: int, reason: str) -> BlockScaledConfig:
    """The fold engine on the Gluon tile and K split fp8_gemm picks for the same shape (`gluon_tile`)."""
    bm, bn, warps, stages, split, why = gluon_tile(m, n, k, sms)
    return BlockScaledConfig(bm, bn, warps, stages, False, split_k=split, k_step=128, engine="fold",
                             reason=f"{reason}; {why}")


def _fp4_mma_config(m: int, n: int, k: int, sms: int) -> BlockScaledConfig:
    """The decode mma engine's configuration: `DECODE_MMA_TILES` by M; K split so the grid
    holds about 3.5 programs an SM, the splits equalized."""
    # H200, 2026-11-30, commit 023b217: M=16 (N, K) = (2304, 5120) split 10 14.0 us, split 14 14.6
    cols, warps, stages = DECODE_MMA_TILES[_decode_rows(m)]
    programs = triton.cdiv(n, 16 * warps)
    steps = k // 128
    per, split = split_blocks(steps, triton.cdiv(7 * sms, 2 * programs), even=False)
    return BlockScaledConfig(cols, 16 * warps, warps, stages, True, split_k=split, k_step=128, engine="mma", reason=(
        f"decode M={m} on sm_90: mma engine (f16 mma.sync on exact E2M1 / E4M3 values, group and block scales "
        f"in FP32), {16 * warps} weight rows x {cols} activation rows a program; {programs} programs x split K "
        f"{split} ({per} steps each): ~3.5 programs an SM"))


@lru_cache(maxsize=4096)
def _fp4_config_cached(m: int, n: int, k: int, act_block_size: int, sms: int, gluon: bool, mma: bool,
                       env: tuple, folded: bool = False) -> BlockScaledConfig:
    direct = _fp4_direct_config(m, n, k, act_block_size, sms)
    # A weight folded once takes the fold engine at every M: its GEMM alone beats the mma engine
    # at decode. Per call at decode the fold alone (~18 us) costs more than its GEMM: mma engine.
    # H200, 2026-11-30, commit e03f9ad: M=64 (N, K) = (2304, 5120) folded weight 14.4 us, mma engine 24.5
    # H200, 2026-11-30, commit cfa29c4: M=4096 (N, K) = (2304, 5120) fold engine 190.7 us, direct kernel 754.6
    fold = gluon and act_block_size == 128 and (m > 64 or folded)
    use_mma = mma and act_block_size == 128 and m <= 64 and k % 128 == 0 and not fold
    if fold:
        cfg = _fp4_fold_config(m, n, k, sms, f"M={m} on sm_90: fold engine (weight folded to FP8 once, the Gluon "
                                             f"FP8 GEMM with per-row scales, exact fixup of leftover groups; H200 "
                                             f"M=4096 3.7-4.0x the direct kernel, M=128 1.1-1.8x)")
    elif use_mma:
        cfg = _fp4_mma_config(m, n, k, sms)
    else:
        cfg = direct
    cfg = apply_env_overrides(cfg, "FP4_GEMM", _FP4_FIELDS)
    if (fold or use_mma) and cfg.engine == "triton":  # LOWBIT_FP4_GEMM_ENGINE=triton: the direct kernel's own tile
        cfg = apply_env_overrides(direct, "FP4_GEMM", _FP4_FIELDS)
    return _fp4_fit_engine(cfg, m, n, k, act_block_size, sms, use_mma, direct)


def _fp4_fit_engine(cfg: BlockScaledConfig, m: int, n: int, k: int, act_block_size: int, sms: int, mma_ok: bool,
                    direct: BlockScaledConfig) -> BlockScaledConfig:
    """``LOWBIT_FP4_GEMM_ENGINE=fold`` / ``mma`` work as global switches (as fp8_gemm's
    ``gluon``): a shape the engine has no tile for runs the engine's own tile and split (fold:
    `_fp4_fold_config`, any M; mma: where `mma_ok`); other shapes stay on the Triton kernel,
    with the reason said."""
    if cfg.engine == "mma":
        if not mma_ok:
            return replace(direct, reason=f"{direct.reason}; the mma engine needs M <= 64, act_block_size 128, "
                                          f"K % 128 == 0 and an sm_90 GPU with aligned operands: triton")
        problem = mma_tile_problem(cfg, m)
        if problem:
            base = _fp4_mma_config(m, n, k, sms)
            return replace(base, split_k=cfg.split_k, reason=f"{cfg.reason}; {problem}: mma tile {base.block_m} x "
                                                            f"{base.block_n}")
        return cfg
    if cfg.engine != "fold":
        return cfg
    if act_block_size != 128:
        return replace(cfg, engine="triton", reason=f"{cfg.reason}; fold needs act_block_size 128: triton")
    if (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) in GLUON_TILES and not cfg.swap_ab \
            and (cfg.split_k == 1 or cfg.block_m == 64) and cfg.k_step == 128:
        return cfg
    base = _fp4_fold_config(m, n, k, sms, f"{cfg.reason}; fold runs a tile of GLUON_TILES")
    if overridden("FP4_GEMM", "split_k") and base.block_m == 64:
        base = replace(base, split_k=cfg.split_k)  # an asked-for split survives onto the 64x128 tile
    return base


def fp4_gemm_config(m: int, n: int, k: int, act_block_size: int = 128, sms: int = H200_NUM_SMS,
                    gluon: bool = False, mma: bool = False, folded: bool = False) -> BlockScaledConfig:
    """Launch configuration of `fp4_gemm`, memoized per shape, act_block_size, SM count, `gluon`,
    `mma` and the ``LOWBIT_FP4_GEMM_*`` overrides (BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES,
    SWAP_AB, SPLIT_K, K_STEP, ENGINE). gluon: the fold engine may be chosen (a Hopper GPU,
    TMA-able activations); M > 64 with act_block_size 128 then gets it by default. mma: the
    decode mma engine may be chosen (a Hopper GPU, operands it takes); decode shapes (M <= 64)
    with act_block_size 128 and K % 128 == 0 then get it. folded: the weight is a
    `FoldedFp4Weight`; with `gluon`, the fold engine (without its fold) at every M."""
    if act_block_size not in (32, 128):
        raise ValueError(f"act_block_size must be 32 or 128, got {act_block_size}")
    return _fp4_config_cached(m, n, k, act_block_size, sms, gluon, mma, env_key("FP4_GEMM", _FP4_FIELDS), folded)


def explain_fp4_gemm_config(m: int, n: int, k: int, act_block_size: int = 128, sms: int = H200_NUM_SMS,
                            gluon: bool = False, mma: bool = False, folded: bool = False) -> str:
    """`fp4_gemm_config`'s choice for the shape as one line, with its reason."""
    c = fp4_gemm_config(m, n, k, act_block_size, sms, gluon, mma, folded)
    return (f"fp4_gemm M={m} N={n} K={k} act_block={act_block_size}: block_m={c.block_m} block_n={c.block_n} "
            f"warps={c.num_warps} stages={c.num_stages} swap_ab={c.swap_ab} split_k={c.split_k} "
            f"k_step={c.k_step} engine={c.engine} -- {c.reason}")
