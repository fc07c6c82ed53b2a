"""Block-scaled FP8 x FP8 GEMM (DeepSeek's ``fp8_gemm``): 1x128 activation scales, 128x128
weight scales, BF16 out.

Semantics (reference: `lowbit.reference.fp8_gemm_ref`)::

    fp8_gemm(a, a_s, b, b_s) -> c bf16 [M, N]
        a float8_e4m3fn [M, K], a_s fp32 [M, ceil(K/128)]             (one scale per 1x128)
        b float8_e4m3fn [N, K], b_s fp32 [ceil(N/128), ceil(K/128)]   (one scale per 128x128)
        for m, n:
            acc = 0.0                                                  # FP32 running sum
            for kb in range(ceil(K / 128)):
                block = sum_k a[m, k] * b[n, k]   over the 128 K of block kb   (tensor cores)
                acc  += block * (a_s[m, kb] * b_s[n // 128, kb])       # promotion
            c[m, n] = bf16(acc)                                        # rounded once

Kernel: one program per (M tile, N tile, K split). The K step is 128, one scale block, so
every step is one FP8 tensor-core product into a fresh block accumulator, scaled by the
outer product of the step's activation scales and the tile's single weight scale (BLOCK_N
divides 128, so a tile never straddles two weight-scale rows) and added into the FP32 running
sum: DeepSeek's two accumulators (``C_local`` / ``C_local_accum``), which also keeps the
tensor cores' reduced-precision accumulation to at most 128 terms (DeepSeek-V3 report, FP8
"increasing accumulation precision"). K and N need not be multiples of 128 (masked loads,
zero padding contributes exact zeros); the last K block may be short, as in the reference.

``SWAP_AB`` (decode, M <= 64) computes ``c^T[BN, BM] = b @ a^T``: the weight rows fill the
64-row M side of wgmma and the few activation rows are its N side (>= 16). Both operands
are K-major in the NT layout, which FP8 wgmma requires, so the swap needs no transpose copy.

Split-K (small grids): each of ``split_k`` programs along K sums its share of the K steps
(each promoted as above) into an FP32 workspace ``[split_k, M, N]``; `_splitk_reduce_kernel`
adds the shares in a fixed order and rounds once to BF16 (deterministic; FP32 sums in a
different order from the reference, as any tiling is).

Heuristics (`fp8_gemm_config`): a pure function of (M, N, K, SM count), memoized with the
``LOWBIT_FP8_GEMM_*`` overrides in the key; tiles from the register / shared-memory budget
(compile tier) and the grid-fill rule below. Measured on the H200 (2026-11-29, CUDA-graph
replay, docs/performance.md): 14.5-20.5 us at M=16/128 (torch's per-tensor FP8 GEMM 10.8-12.3),
629-634 TFLOP/s at M=4096 (0.47-0.50x torch): the tensor cores idle during each K block's
promotion, which Triton cannot overlap. `lowbit.kernels.block_scaled.hopper_fp8` holds the Gluon kernels
that do: with ``gluon=True`` (a Hopper GPU, TMA-able operands) the default at every M
(`gluon_tile`: the persistent warp-specialized kernel where 128x128 tiles fill the SMs, else
the 64x128 kernel split along K by `gluon_split_k`; H200, twelfth session: M=4096 0.82-0.85x
torch's per-tensor FP8 GEMM, M=16 / 128 0.77-0.84x); ``engine="triton"`` elsewhere.
This module also holds what `lowbit.kernels.block_scaled.fp4` shares: the config type, the overrides,
the split-K rule and the split-K reduction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import torch
import triton
import triton.language as tl

from ...formats.fp8 import e8m0_decode
from ...runtime import numerics
from ...runtime.device import H200_NUM_SMS, is_sm90_native, num_sms, require_sm90, tma_problem
from ...runtime.overrides import apply_env_overrides, env_key, override_names, overridden

__all__ = [
    "ENV_OVERRIDES",
    "H200_NUM_SMS",
    "SCALE_BLOCK",
    "BlockScaledConfig",
    "explain_fp8_gemm_config",
    "fp8_gemm",
    "fp8_gemm_config",
]

#: K step = activation-scale group = edge of the weight-scale block.
SCALE_BLOCK = 128
_FP8 = torch.float8_e4m3fn


# --------------------------------------------------------------------------- kernels
@triton.jit
def store_block_scaled_tile(c_ptr, acc, rm, rn, m_ok, n_ok, pid_k, stride_cm, stride_cs,
                            SWAP_AB: tl.constexpr, SPLIT_OUT: tl.constexpr):
    """Epilogue of the FP8 and FP4 GEMMs: the FP32 tile (transposed back if SWAP_AB) to the
    split-K workspace share `pid_k`, or rounded once to bf16 into the output."""
    if SWAP_AB:
        acc = tl.trans(acc)
    mask = m_ok[:, None] & n_ok[None, :]
    if SPLIT_OUT:
        ws = c_ptr + pid_k.to(tl.int64) * stride_cs + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
        tl.store(ws, acc, mask=mask)
    else:
        c = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
        tl.store(c, numerics.to_bf16(acc), mask=mask)


@triton.jit
def _fp8_gemm_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr,
    M, N, K, steps_per_split,
    stride_am, stride_asm, stride_ask, stride_bn, stride_bsn, stride_bsk, stride_cs, stride_cm,
    BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr, SPLIT_OUT: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, 128)
    m_ok = rm < M
    n_ok = rn < N
    a_rows = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :]
    b_rows = b_ptr + rn[:, None].to(tl.int64) * stride_bn + rk[None, :]
    as_rows = as_ptr + rm.to(tl.int64) * stride_asm
    # BN divides 128: the whole tile shares one row of weight-scale blocks
    bs_row = bs_ptr + ((pid_n * BN) // 128) * stride_bsn
    kb_lo = pid_k * steps_per_split
    kb_hi = tl.minimum(kb_lo + steps_per_split, tl.cdiv(K, 128))
    if SWAP_AB:
        acc = tl.zeros([BN, BM], tl.float32)
    else:
        acc = tl.zeros([BM, BN], tl.float32)
    for kb in range(kb_lo, kb_hi):
        k_ok = (kb * 128 + rk) < K
        a = tl.load(a_rows + kb * 128, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_rows + kb * 128, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        sa = tl.load(as_rows + kb * stride_ask, mask=m_ok, other=0.0)
        sb = tl.load(bs_row + kb * stride_bsk)
        if SWAP_AB:
            blk = numerics.dot(b, tl.trans(a), tl.zeros([BN, BM], tl.float32))
            acc += blk * (sa * sb)[None, :]
        else:
            blk = numerics.dot(a, tl.trans(b), tl.zeros([BM, BN], tl.float32))
            acc += blk * (sa * sb)[:, None]
    store_block_scaled_tile(c_ptr, acc, rm, rn, m_ok, n_ok, pid_k, stride_cm, stride_cs, SWAP_AB, SPLIT_OUT)


@triton.jit(do_not_specialize=["M", "N"])  # M = 1 would become a constexpr int
def _splitk_reduce_kernel(ws_ptr, c_ptr, M, N, split_k, stride_cm, BLOCK: tl.constexpr):
    """``c[m, n] = bf16(sum_s ws[s, m, n])`` in the order s = 0, 1, ...; ws contiguous."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mn = M.to(tl.int64) * N
    ok = offs < mn
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(split_k):
        acc += tl.load(ws_ptr + s * mn + offs, mask=ok, other=0.0)
    row = offs // N
    tl.store(c_ptr + row * stride_cm + (offs - row * N), numerics.to_bf16(acc), mask=ok)


_REDUCE_BLOCK = 1024


def splitk_destination(out: torch.Tensor, split: int) -> tuple[torch.Tensor, int, int]:
    """Where a split-K kernel writes: ``out`` itself (one split: bf16, no share stride) or a
    fresh FP32 workspace ``[split, M, N]`` that `splitk_reduce` then sums into ``out``.
    Returns (dst, share stride, row stride)."""
    if split == 1:
        return out, 0, out.stride(0)
    ws = torch.empty(split, *out.shape, dtype=torch.float32, device=out.device)
    return ws, ws.stride(0), ws.stride(1)


def splitk_reduce(ws: torch.Tensor, out: torch.Tensor) -> None:
    """Sum the FP32 shares ``ws [S, M, N]`` (contiguous) into ``out`` (bf16, rows strided)."""
    s, m, n = ws.shape
    grid = (triton.cdiv(m * n, _REDUCE_BLOCK),)
    _splitk_reduce_kernel[grid](ws, out, m, n, s, out.stride(0), BLOCK=_REDUCE_BLOCK, num_warps=4)


# --------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class BlockScaledConfig:
    """Launch choice of a block-scaled GEMM (fp8_gemm, fp4_gemm).

    block_m / block_n: the output tile (block_n divides 128: one weight-scale row per tile for
    fp8_gemm); swap_ab: weight rows on the MMA's M side (decode); split_k: programs along K
    (> 1 adds the FP32 workspace and the reduction); k_step: 128, or 32 for fp4_gemm's
    per-group path; engine: ``"triton"`` (the tl.dot kernel, every tier), ``"gluon"``
    (fp8_gemm only: the Hopper kernel of `fp8_gemm_sm90`, prefill tiles; the heuristic's
    choice for prefill on sm_90) or ``"fold"`` (fp4_gemm only: the weight folded to FP8, then
    that Gluon kernel with per-row weight scales; block_* etc. describe its Gluon tile);
    reason: why the heuristic chose it (and any override applied)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    swap_ab: bool
    split_k: int = 1
    k_step: int = 128
    engine: str = "triton"
    reason: str = ""


_FIELDS = ("block_m", "block_n", "num_warps", "num_stages", "swap_ab", "split_k", "engine")
#: The tuning overrides read by `fp8_gemm_config` (each is part of the memo key).
ENV_OVERRIDES = override_names("FP8_GEMM", _FIELDS)


def decode_tile(m: int) -> tuple[int, int, str]:
    """(block_m, block_n, why) of the swap-AB decode tile for M <= 64 rows."""
    bm = max(16, triton.next_power_of_2(m))
    return bm, 64, (f"decode M={m}: swap-AB, 64 weight rows on the wgmma M side, {bm} activation rows "
                    f"as its N side; BN=64 (not 128) doubles the programs along N before splitting K")


def split_k_for(programs: int, k_steps: int, sms: int, m_pad: int, n: int, weight_bytes: int,
                min_steps: int = 4) -> tuple[int, str]:
    """Grid-fill rule (a model, not measured): split K only while the grid holds fewer programs
    than SMs; keep >= `min_steps` K steps per split (the promotion and the workspace amortized)
    and the FP32 workspace traffic (write + read, ``8 * split * m_pad * n`` bytes) under half the
    weight bytes the GEMM must read anyway. Splits are equalized so none is empty."""
    if programs >= sms:
        return 1, f"{programs} programs fill {sms} SMs"
    split = min(sms // programs, k_steps // min_steps, weight_bytes // (16 * m_pad * n) if n else 1)
    if split <= 1:
        return 1, f"{programs} programs < {sms} SMs, but K ({k_steps} steps) or the workspace budget allows no split"
    per = triton.cdiv(k_steps, split)
    split = triton.cdiv(k_steps, per)
    return split, f"{programs} programs < {sms} SMs: split K {split} ways ({per} steps each)"


def split_blocks(k_blocks: int, split_k: int, even: bool = True) -> tuple[int, int]:
    """(blocks a split, splits) for `k_blocks` K steps and `split_k` splits asked: the splits
    equalized, none empty; with `even`, an even count a split (`fp8_gemm_sm90`'s 64x128 kernel
    multiplies blocks in pairs, so only the last split may end on the zero-filled phantom
    block)."""
    per = triton.cdiv(k_blocks, max(1, min(split_k, k_blocks)))
    per += per % 2 if even else 0
    return per, triton.cdiv(k_blocks, per)


def gluon_split_k(m: int, n: int, k_blocks: int, sms: int) -> tuple[int, str]:
    """Split-K of `fp8_gemm_sm90`'s 64x128 kernel (also the fold engine's GEMM) where its tiles
    leave SMs idle: as many splits as keep the grid within one wave (``sms // tiles``) and at
    least 10 K blocks a split (each split costs its share of the FP32 workspace and the
    reduction launch), blocks a split rounded up to even (`split_blocks`). Returns (split, why).

    H200, twelfth session (`scripts/probes/small_m_split.py`, one process, CUDA graph, L2
    flushed), us, fp8_gemm / fp4_gemm on a folded weight, split 1 / 2 / 3 / 4 / 10:
    (N, K) = (2304, 5120) (18 tiles at M <= 64, 40 blocks): M=16 16.6 / 14.5 / 13.5 / **13.1** /
    13.9 and 20.5 / 15.9 / 14.3 / **13.5** / 14.6; M=64 17.9 / 15.4 / 14.4 / **13.7** / 14.8 and
    21.8 / 16.8 / 15.3 / **14.4** / 15.8; M=128 (36 tiles) 18.0 / 15.7 / **14.9** / 15.6 (split 7:
    16.0) and 21.7 / 17.2 / **15.6** / 17.5. (5120, 2304) (40 / 80 tiles, 18 blocks): split 1
    best everywhere: M=16 **11.2** vs 12.3-12.6, M=64 **12.4** vs 13.6-13.8, M=128 **12.4** vs
    15.6-15.8 (fp4 folded 12.9 / 13.7 / 13.8, splits within +0.4 / +0.3 / +3.1)."""
    tiles = triton.cdiv(m, 64) * triton.cdiv(n, 128)
    want = min(sms // max(tiles, 1), k_blocks // 10)
    if want <= 1:
        return 1, f"; {tiles} 64x128 tiles, {k_blocks} K blocks: no split (one wave, >= 10 blocks a split)"
    per, split = split_blocks(k_blocks, want)
    return split, f"; {tiles} 64x128 tiles: split K {split} ways ({per} blocks each; one wave, >= 10 blocks a split)"


def gluon_tile(m: int, n: int, k: int, sms: int) -> tuple[int, int, int, int, int, str]:
    """(block_m, block_n, num_warps, stages, split_k, why) of `fp8_gemm_sm90` for any M: decode
    (M <= 64) on the 64x128 kernel (TMA zero-fills the rows past M), prefill by
    `prefill_gluon_tile`; the 64x128 kernel split along K by `gluon_split_k`."""
    if m <= 64:
        bm, bn, warps, stages = 64, 128, 4, 4
        why = f"decode M={m}: Gluon 64x128 (one warpgroup, the weight read once a tile of N)"
    else:
        bm, bn, warps, stages, why = prefill_gluon_tile(m, n, sms)
    split, swhy = gluon_split_k(m, n, triton.cdiv(k, SCALE_BLOCK), sms) if bm == 64 else (1, "")
    return bm, bn, warps, stages, split, why + swhy


def prefill_gluon_tile(m: int, n: int, sms: int) -> tuple[int, int, int, int, str]:
    """(block_m, block_n, num_warps, stages, why) of `fp8_gemm_sm90` for a prefill GEMM (also the
    fold engine of `fp4_gemm`). Where 128x128 tiles fill the SMs: the persistent warp-specialized
    kernel with two (128 rows, PAIRS) or three (192 rows) consumer warpgroups, whichever needs
    fewer rows of work: rounds of programs (``ceil(tiles / sms)``) x rows a tile, ties to 128
    (a per-block speed of the two kernels measured equal at 8192^3). Otherwise the 64x128 kernel
    (more programs). H200, eleventh session, same process (`scripts/probes/fp8_ws.py`, final
    kernel), us, against torch's per-tensor FP8 GEMM: M=4096 (N, K) = (2304, 5120): 192 rows
    86.8, 128 rows 88.4, the 64x128 kernel 114.4, torch 69.0; (5120, 2304): 85.4 / 83.1 / 120.2,
    torch 73.2; 8192^3: 1028.1 / 1026.0 / 1343.7, torch 800.8. (M=128: the 64x128 kernel
    1.07-1.47x the Triton tile, eighth session.)"""
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


@lru_cache(maxsize=4096)
def _config_cached(m: int, n: int, k: int, sms: int, gluon: bool, env: tuple) -> BlockScaledConfig:
    if m <= 64:
        bm, bn, why = decode_tile(m)
        # smem per stage: (bm + 64) * 128 B <= 16 KB; 4 stages hide DRAM latency on a
        # memory-bound shape (the weight is read once, the activations are tiny)
        cfg = BlockScaledConfig(bm, bn, 4, 4, True, reason=why)
    elif m <= 128:
        cfg = BlockScaledConfig(64, 128, 4, 4, False, reason=(
            f"M={m}: 64x128 tiles, one warpgroup (wgmma m64n128); two M tiles rather than one "
            f"half-empty 128-row tile"))
    else:
        cfg = BlockScaledConfig(128, 128, 8, 3, False, reason=(
            f"prefill M={m}: 128x128 tiles, two warpgroups of 64 rows; the two FP32 accumulators "
            f"(running sum + block product) take 128 registers a thread, so 128x256 would spill"))
    kb = triton.cdiv(k, SCALE_BLOCK)
    gcfg = None
    if gluon:
        # The Gluon kernels on sm_90 at every M. H200, twelfth session (`scripts/probes/
        # small_m_split.py`, CUDA graph), us, (N, K) = (2304, 5120) / (5120, 2304), Gluon 64x128 at
        # `gluon_split_k`'s split vs the Triton kernel's heuristic: M=16 13.1 / 11.2 vs 13.2 /
        # 13.5; M=64 13.7 / 12.4 vs 16.0 / 14.3; M=128 14.9 / 12.4 vs 20.7 / 18.1 (torch's
        # per-tensor FP8 GEMM 9.3-11.6). Prefill: `prefill_gluon_tile`.
        bm, bn, warps, stages, split, why = gluon_tile(m, n, k, sms)
        gcfg = cfg = BlockScaledConfig(bm, bn, warps, stages, False, split_k=split, engine="gluon",
                                       reason=f"M={m} on sm_90: {why}")
    else:
        programs = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
        split, why = split_k_for(programs, kb, sms, triton.cdiv(m, cfg.block_m) * cfg.block_m, n, n * k)
        cfg = replace(cfg, split_k=split, reason=cfg.reason + "; " + why)
    return _fit_engine(apply_env_overrides(cfg, "FP8_GEMM", _FIELDS), m, gcfg)


def _fit_engine(cfg: BlockScaledConfig, m: int, gluon_cfg: BlockScaledConfig | None = None) -> BlockScaledConfig:
    """``LOWBIT_FP8_GEMM_ENGINE=gluon`` works as a global switch: a shape whose tile the Gluon
    kernel does not have gets the Gluon configuration the heuristic has for it (`gluon_cfg`,
    decode shapes included: the 64x128 tile with its K split; an asked-for split is kept), or
    without one its nearest Gluon tile, with the reason said."""
    if cfg.engine != "gluon":
        return cfg
    from .hopper_fp8 import GLUON_TILES  # noqa: PLC0415 (Gluon imported only when asked for)

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
    Hopper GPU, TMA-able operands); prefill shapes then get it by default."""
    return _config_cached(m, n, k, sms, gluon, env_key("FP8_GEMM", _FIELDS))


def gluon_capable(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the Gluon engine can run these operands (sm_90 GPU, TMA-able a and b)."""
    return is_sm90_native(a.device) and not (tma_problem(a, "a") or tma_problem(b, "b"))


def explain_fp8_gemm_config(m: int, n: int, k: int, sms: int = H200_NUM_SMS, gluon: bool = False) -> str:
    c = fp8_gemm_config(m, n, k, sms, gluon)
    return (f"fp8_gemm M={m} N={n} K={k}: block_m={c.block_m} block_n={c.block_n} warps={c.num_warps} "
            f"stages={c.num_stages} swap_ab={c.swap_ab} split_k={c.split_k} engine={c.engine} -- {c.reason}")


def check_config(cfg: BlockScaledConfig, who: str, k_steps: tuple[int, ...] = (128,),
                 engines: tuple[str, ...] = ("triton",)) -> None:
    if not isinstance(cfg, BlockScaledConfig):
        raise TypeError(f"{who}: config must be a BlockScaledConfig, got {type(cfg).__name__}")
    if cfg.engine not in engines:
        raise ValueError(f"{who}: engine must be one of {engines}, got {cfg.engine!r}")
    if cfg.engine in ("gluon", "fold"):  # fold: fp4_gemm's engine around the same Gluon kernel
        from .hopper_fp8 import GLUON_TILES

        tile = (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages)
        if cfg.swap_ab or (cfg.split_k != 1 and cfg.block_m != 64) or tile not in GLUON_TILES:
            raise ValueError(f"{who}: the {cfg.engine} engine runs the prefill tiles (block_m, block_n, num_warps, "
                             f"num_stages) in {GLUON_TILES} without swap_ab, and split_k only on the 64-row tile; "
                             f"got {tile}, swap_ab={cfg.swap_ab}, split_k={cfg.split_k}")
    if cfg.engine in ("gluon", "fold"):
        pass  # a tile of GLUON_TILES (checked above), 192 rows included
    elif cfg.block_m < 16 or cfg.block_m & (cfg.block_m - 1):
        raise ValueError(f"{who}: block_m must be a power of two >= 16, got {cfg.block_m}")
    if cfg.block_n not in (16, 32, 64, 128):
        raise ValueError(f"{who}: block_n must divide 128 (16, 32, 64 or 128), got {cfg.block_n}")
    if cfg.split_k < 1:
        raise ValueError(f"{who}: split_k must be >= 1, got {cfg.split_k}")
    if cfg.k_step not in k_steps:
        raise ValueError(f"{who}: k_step must be one of {k_steps}, got {cfg.k_step}")


# --------------------------------------------------------------------------- validation
def check_fp8_operand(x, name: str, who: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != _FP8:
        raise TypeError(f"{who}: {name} must be torch.float8_e4m3fn, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{who}: {name} must be 2-D, got shape {tuple(x.shape)}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"{who}: {name} must be contiguous along K (stride(1) == 1), got strides {x.stride()}")


def scales_fp32(s, name: str, who: str, shape: tuple[int, int], what: str) -> torch.Tensor:
    """FP32 scales as given; E8M0 (``uint8`` / ``float8_e8m0fnu``) decoded by one torch op."""
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(s).__name__}")
    if s.dtype in (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8)):
        s = e8m0_decode(s)
    elif s.dtype != torch.float32:
        raise TypeError(f"{who}: {name} must be float32, float8_e8m0fnu or uint8 (E8M0), got {s.dtype}")
    if tuple(s.shape) != shape:
        raise ValueError(f"{who}: {name} must have shape {shape} ({what}), got {tuple(s.shape)}")
    return s


def check_out(out, m: int, n: int, device: torch.device, who: str) -> torch.Tensor:
    if out is None:
        return torch.empty(m, n, dtype=torch.bfloat16, device=device)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or tuple(out.shape) != (m, n) \
            or (n > 1 and out.stride(1) != 1):
        desc = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"{who}: out must be bf16 [{m}, {n}] contiguous along N, got {desc}")
    if out.device != device:
        raise ValueError(f"{who}: out is on {out.device}, a on {device}")
    return out


def check_devices(who: str, **tensors: torch.Tensor) -> None:
    devs = {k: v.device for k, v in tensors.items()}
    if len(set(devs.values())) > 1:
        raise ValueError(f"{who}: all operands must be on one device, got {devs}")


# --------------------------------------------------------------------------- launcher
def fp8_gemm(
    a: torch.Tensor,
    a_s: torch.Tensor,
    b: torch.Tensor,
    b_s: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: BlockScaledConfig | None = None,
) -> torch.Tensor:
    """Block-scaled FP8 GEMM ``c = (a * a_s) @ (b * b_s)^T`` in BF16 (semantics: module doc).

    a: ``float8_e4m3fn [M, K]`` (rows may be strided, K contiguous); a_s: ``[M, ceil(K/128)]``
    scales; b: ``float8_e4m3fn [N, K]`` (K contiguous); b_s: ``[ceil(N/128), ceil(K/128)]``.
    Scales are FP32 (powers of two from ``scale_fmt="ue8m0"`` included) or E8M0 bytes
    (``uint8`` / ``float8_e8m0fnu``, decoded to FP32 by a torch op before the launch).
    out: optional ``bf16 [M, N]`` (N contiguous); config: a `BlockScaledConfig` instead of the
    heuristic's. Returns ``bf16 [M, N]``."""
    who = "fp8_gemm"
    check_fp8_operand(a, "a", who)
    check_fp8_operand(b, "b", who)
    m, k = a.shape
    n, kb_ = b.shape
    if kb_ != k:
        raise ValueError(f"{who}: a {tuple(a.shape)} and b {tuple(b.shape)} must share K (both [*, K], NT layout)")
    kblocks = triton.cdiv(k, SCALE_BLOCK)
    a_s = scales_fp32(a_s, "a_s", who, (m, kblocks), "[M, ceil(K/128)]: 1x128 activation scales")
    b_s = scales_fp32(b_s, "b_s", who, (triton.cdiv(n, SCALE_BLOCK), kblocks),
                      "[ceil(N/128), ceil(K/128)]: 128x128 weight scales")
    check_devices(who, a=a, a_s=a_s, b=b, b_s=b_s)
    out = check_out(out, m, n, a.device, who)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if config is None:
        config = fp8_gemm_config(m, n, k, num_sms(a.device), gluon_capable(a, b))
    check_config(config, who, engines=("triton", "gluon"))
    if config.engine == "gluon":
        _launch_gluon(a, a_s, b, b_s, out, m, n, k, config, who)
        return out
    launch_block_scaled(_fp8_gemm_kernel, (a, a_s, b, b_s), out, m, n, kblocks, config,
                        (a.stride(0), a_s.stride(0), a_s.stride(1), b.stride(0), b_s.stride(0), b_s.stride(1)),
                        {}, k)
    return out


def _launch_gluon(a, a_s, b, b_s, out, m, n, k, config: BlockScaledConfig, who: str) -> None:
    """The Hopper Gluon kernel (`fp8_gemm_sm90`): a CUDA sm_90 device, TMA-able operands."""
    require_sm90(a.device, who)
    from .hopper_fp8 import fp8_gemm_sm90_launch

    why = tma_problem(a, "a") or tma_problem(b, "b")
    if why:
        raise ValueError(f"{who}: engine='gluon' loads through TMA: {why}")
    fp8_gemm_sm90_launch(a, a_s, b, b_s, out, m, n, k, config.block_m, config.block_n,
                         config.num_warps, config.num_stages, split_k=config.split_k)


def launch_block_scaled(kernel, operands, out, m, n, k_steps, config, strides, constexprs, k) -> None:
    """Launch `kernel` over (M tiles, N tiles, K splits); with split_k > 1 into an FP32
    workspace, then `splitk_reduce` into `out`. Shared by fp8_gemm and fp4_gemm."""
    per, split = split_blocks(k_steps, config.split_k, even=False)
    grid = (triton.cdiv(m, config.block_m), triton.cdiv(n, config.block_n), split)
    dst, stride_cs, stride_cm = splitk_destination(out, split)
    kernel[grid](
        *operands, dst, m, n, k, per, *strides, stride_cs, stride_cm,
        BM=config.block_m, BN=config.block_n, SWAP_AB=config.swap_ab, SPLIT_OUT=split > 1,
        **constexprs, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if split > 1:
        splitk_reduce(dst, out)


# --------------------------------------------------------------------------- compile tier
#: The scale tensors are contiguous in production: their K stride is 1, which Triton's
#: launcher specializes as the constant 1, so the compile tier does the same.
_UNIT_STRIDES = {"stride_ask": 1, "stride_bsk": 1}

def production_tiles() -> list[BlockScaledConfig]:
    """Every tile the heuristics can pick (split_k is a runtime value; SPLIT_OUT is not)."""
    tiles = [_config_cached(m, 4096, 7168, 10**6, False, ()) for m in (1, 17, 33, 100, 4096)]
    return [replace(t, split_k=1, reason="") for t in tiles]


def compile_configs():
    """Every configuration `fp8_gemm_config` can pick (x direct / split-K output) and the
    split-K reduction, for the compile tier. wgmma (QGMMA) is expected wherever the MMA's M
    side is >= 64: the weight tile (BN = 64) under swap-AB, the activation tile otherwise."""
    from ..compile_tier import KernelConfig

    sig = {"a_ptr": "*fp8e4nv", "as_ptr": "*fp32", "b_ptr": "*fp8e4nv", "bs_ptr": "*fp32", "c_ptr": "*bf16",
           "M": "i32", "N": "i32", "K": "i32", "steps_per_split": "i32",
           "stride_am": "i32", "stride_asm": "i32", "stride_ask": "constexpr", "stride_bn": "i32",
           "stride_bsn": "i32", "stride_bsk": "constexpr", "stride_cs": "i32", "stride_cm": "i32",
           "BM": "constexpr", "BN": "constexpr", "SWAP_AB": "constexpr", "SPLIT_OUT": "constexpr"}
    cfgs = []
    for t in production_tiles():
        for split in (False, True):
            s = dict(sig, c_ptr="*fp32") if split else sig
            mma_m = t.block_n if t.swap_ab else t.block_m
            cfgs.append(KernelConfig(
                f"fp8_gemm[BM={t.block_m},BN={t.block_n},w={t.num_warps},s={t.num_stages},"
                f"swap={int(t.swap_ab)},split={int(split)}]",
                _fp8_gemm_kernel, s, {"BM": t.block_m, "BN": t.block_n, "SWAP_AB": t.swap_ab, "SPLIT_OUT": split,
                                         **_UNIT_STRIDES},
                num_warps=t.num_warps, num_stages=t.num_stages,
                expect_sass=("QGMMA",) if mma_m >= 64 else (),
                # M, steps_per_split and the scale strides (ceil(K/128), 1) are arbitrary
                unaligned=("M", "steps_per_split", "stride_asm", "stride_bsn", "stride_cs")))
    cfgs.append(KernelConfig(
        "splitk_reduce[BLOCK=1024]", _splitk_reduce_kernel,
        {"ws_ptr": "*fp32", "c_ptr": "*bf16", "M": "i32", "N": "i32", "split_k": "i32", "stride_cm": "i32",
         "BLOCK": "constexpr"}, {"BLOCK": _REDUCE_BLOCK}, num_warps=4, unaligned=("M", "split_k")))
    return cfgs
