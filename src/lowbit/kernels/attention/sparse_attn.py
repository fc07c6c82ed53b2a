"""Index-gathered multi-query attention with a per-head sink (seed 004's ``sparse_attn``).

    sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale=None) -> out bf16 [b, s, h, d]

    for i < b, t < s, x < h:                     J = [j : 0 <= topk_idxs[i, t, j] < n]  (a list)
        z_j  = softmax_scale * q[i, t, x] . kv[i, topk_idxs[i, t, j]]        j in J
        out[i, t, x] = bf16( sum_j exp(z_j) kv[i, topk_idxs[i, t, j]]
                             / (sum_j exp(z_j) + exp(attn_sink[x])) )        (0 if J is empty)

Reference: `lowbit.reference.sparse_attn_ref` (FP32). MQA: one KV row per position shared by
every head, and the row is both key and value (DeepSeek V4: d = 512). ``-1`` marks an empty
slot; a row index named twice counts twice; the sink joins the denominator only.

Kernel design (one program = one query position ``(i, t)`` x one tile of ``HT`` heads):

- Heads are one MMA dimension, padded to 16 (``HT`` in 16 / 32 / 64; padded heads load
  q = 0 and are never stored), as DeepSeek's kernel pads heads to 16.
- Loop over the top-k list ``BK`` slots at a time: load the indices, gather the ``[BK, d]``
  KV rows (a masked load: empty or out-of-range slots are not read), scores
  ``S = q @ kv^T`` in FP32 from bf16 operands over the full d, online softmax in FP32 (base 2,
  ``log2(e)`` folded into the scale), ``P`` rounded to bf16, ``acc += P @ kv``. The gathered
  block serves both MMAs from shared memory: KV bytes are read once per head tile.
- ``SWAP_AB`` computes the transposed products instead (``S^T = kv @ q^T``,
  ``acc^T[d, HT] += kv^T @ P^T``) so that the MMA's M side is the KV block / d (64 and 512
  rows) rather than the heads: Triton emits Hopper wgmma (HGMMA) only when M >= 64, so for
  16 and 32 heads this is what turns mma.sync into wgmma. With 64 heads both forms use wgmma.
- d stays whole in one program. Splitting d across programs would make each program recompute
  the scores (they need the full d) and gather the full rows anyway; a two-pass design (scores
  to memory, then P @ V) would read the gathered KV twice, and this kernel is bound by those
  bytes. The ``[HT, 512]`` FP32 accumulator is spread over the warps instead: ``HT * 512 /
  (32 * num_warps)`` registers a thread, 128 at 64 heads with 8 warps (two warpgroups, each
  owning half of d in the P @ V wgmma). Shared memory: a ``[BK, 512]`` bf16 KV stage is
  ``BK`` KB (64 KB at BK = 64), double-buffered by the cp.async pipeline, plus q (HT KB).
- The running max starts at the finite ``-1e30`` (as DeepSeek's kernel does): a row whose
  slots are all empty keeps ``acc = 0`` and ``l = 0`` until the sink term; the divisor is
  replaced by 1 where ``l`` is still 0 (all empty and a ``-inf`` sink), so such a row is 0,
  never ``NaN``.
  A sink far above every score makes ``exp2(sink - m)`` overflow to ``inf`` on purpose: the
  output is then exactly 0, as the reference's is.
- Indices outside ``[-1, n)`` (which the reference rejects) are treated as empty slots:
  masked, never read out of bounds. Rejecting them needs a device readback, so it is opt-in
  (``validate=True``), like the NaN / +inf check of ``attn_sink``.

Grid: ``(cdiv(h, HT), b * s, split_kv)`` with the head tile fastest. ``split_kv > 1``
(flash-decoding): the programs of one query share its top-k list, each writes its unnormalized
FP32 share (``acc`` and the running max / sum per head) to a workspace, and
`_sparse_attn_combine_kernel` folds the shares and the sink into the output. The heuristic
takes the widest head tile and splits the top-k while the grid is short of the SMs (decode).

Measured on the H200 (sixth session, CUDA graph, decode point b=64 h=64 top-k 2048 d=512):
91.1 us with 64-head tiles split 2 ways, 124-149 us for the earlier 32-head tiles unsplit;
`_config_cached` has the sweep. The per-tile rows of `TILE_TABLE` come from the compile tier.

Engines (`SparseAttnConfig.engine`): ``"triton"`` (this kernel, every tier) and ``"gluon"``
(`lowbit.kernels.attention.hopper`: d = 512, 64-head tiles, the KV gather in its own warps;
the default on sm_90 for > 32 heads, `gluon_capable`; H200 fourteenth session: decode 62.5 us,
prefill b=1 s=1024 578 us, 1.45x / 1.9x this kernel). The Triton kernel's split shares go
through the workspace and `_sparse_attn_combine_kernel`; the Gluon kernel folds them itself
(the last share of a query waits on the others' through L2: no second kernel).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from functools import lru_cache

import torch
import triton
import triton.language as tl

from ...runtime import numerics, overrides
from ...runtime.device import num_sms

__all__ = [
    "sparse_attn",
    "gluon_capable",
    "SparseAttnConfig",
    "sparse_attn_config",
    "explain_sparse_attn_config",
    "ENV_OVERRIDES",
    "TILE_TABLE",
    "MAX_HEAD_DIM",
    "compile_configs",
]

LOG2E = 1.4426950408889634

#: Largest head dimension the launcher accepts (DeepSeek V4: 512). Register and shared-memory
#: budgets below are sized for it; larger d would need another tiling.
MAX_HEAD_DIM = 512


@triton.jit
def _sparse_attn_kernel(
    q_ptr, kv_ptr, sink_ptr, idx_ptr, out_ptr,
    H, N, TOPK, S,
    stride_qb, stride_qs, stride_qh,
    stride_kvb, stride_kvn,
    stride_ib, stride_is,
    stride_ob, stride_os, stride_oh,
    qk_scale, slots_per_split,
    D: tl.constexpr, BD: tl.constexpr, HT: tl.constexpr, BK: tl.constexpr, SWAP_AB: tl.constexpr,
    SPLIT_OUT: tl.constexpr,
):
    pid_h = tl.program_id(0)
    pid_t = tl.program_id(1)
    pid_s = tl.program_id(2)
    bi = (pid_t // S).to(tl.int64)
    si = (pid_t % S).to(tl.int64)
    heads = pid_h * HT + tl.arange(0, HT)
    h_ok = heads < H
    dd = tl.arange(0, BD)
    hd_ok = h_ok[:, None] & (dd < D)[None, :]
    q = tl.load(q_ptr + bi * stride_qb + si * stride_qs + heads[:, None] * stride_qh + dd[None, :],
                mask=hd_ok, other=0.0)
    kv_base = kv_ptr + bi * stride_kvb
    idx_base = idx_ptr + bi * stride_ib + si * stride_is

    # running max in log2 units: finite, so exp2(m_i - m_new) never sees inf - inf
    m_i = tl.full([HT], -1.0e30, tl.float32)
    l_i = tl.zeros([HT], tl.float32)
    if SWAP_AB:
        acc = tl.zeros([BD, HT], tl.float32)
    else:
        acc = tl.zeros([HT, BD], tl.float32)
    # this program's share of the slots (all of them without SPLIT_OUT)
    lo = pid_s * slots_per_split
    hi = tl.minimum(lo + slots_per_split, TOPK)
    for start in range(lo, hi, BK):
        j = start + tl.arange(0, BK)
        idx = tl.load(idx_base + j, mask=j < hi, other=-1)
        ok = (idx >= 0) & (idx < N)  # empty (-1), past topk, or out of range: not read
        if D == BD:
            kv_mask = ok[:, None]
        else:
            kv_mask = ok[:, None] & (dd < D)[None, :]
        kv = tl.load(kv_base + idx[:, None].to(tl.int64) * stride_kvn + dd[None, :], mask=kv_mask, other=0.0)
        if SWAP_AB:
            # scores^T [BK, HT]: the KV block is the wgmma M side
            st = numerics.dot(kv, tl.trans(q), tl.zeros([BK, HT], tl.float32)) * qk_scale
            st = tl.where(ok[:, None], st, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(st, 0))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(st - m_new[None, :])
            l_i = l_i * alpha + tl.sum(p, 0)
            acc = numerics.dot(tl.trans(kv), numerics.to_bf16(p), acc * alpha[None, :])
        else:
            st = numerics.dot(q, tl.trans(kv), tl.zeros([HT, BK], tl.float32)) * qk_scale
            st = tl.where(ok[None, :], st, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(st, 1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(st - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = numerics.dot(numerics.to_bf16(p), kv, acc * alpha[:, None])
        m_i = m_new

    if SPLIT_OUT:
        # unnormalized share: FP32 acc [HT, D] and (m, l) per head, combined (with the sink) by
        # `_sparse_attn_combine_kernel`; out_ptr is the FP32 workspace [b * s, splits, H, BD + 2]
        # (the row's last two columns hold m and l)
        row = (pid_t * tl.num_programs(2) + pid_s).to(tl.int64) * H + heads
        ws = out_ptr + row * (BD + 2)
        if SWAP_AB:
            tl.store(ws[:, None] + dd[None, :], tl.trans(acc), mask=hd_ok)
        else:
            tl.store(ws[:, None] + dd[None, :], acc, mask=hd_ok)
        tl.store(ws + BD, m_i, mask=h_ok)
        tl.store(ws + BD + 1, l_i, mask=h_ok)
        return

    # the sink joins the denominator only (padded heads: -inf, no contribution)
    sink = tl.load(sink_ptr + heads, mask=h_ok, other=float("-inf")) * 1.4426950408889634
    l_i = l_i + tl.math.exp2(sink - m_i)
    # l = 0 only when every slot is empty and the sink is -inf; acc = 0 there: 0 * 1, not 0 / 0
    inv = 1.0 / tl.where(l_i > 0.0, l_i, 1.0)
    if SWAP_AB:
        o = tl.trans(acc * inv[None, :])
    else:
        o = acc * inv[:, None]
    tl.store(out_ptr + bi * stride_ob + si * stride_os + heads[:, None] * stride_oh + dd[None, :],
             numerics.to_bf16(o), mask=hd_ok)


@triton.jit
def _sparse_attn_combine_kernel(
    ws_ptr, sink_ptr, out_ptr, H, S, SPLITS,
    stride_ob, stride_os, stride_oh,
    D: tl.constexpr, BD: tl.constexpr, HC: tl.constexpr,
):
    """Fold the ``SPLITS`` shares of one query's heads ``[HC]``: ``M = max m_s``,
    ``out = sum_s 2**(m_s - M) acc_s / (sum_s 2**(m_s - M) l_s + 2**(sink - M))`` (log2 units),
    with the single kernel's guards (finite initial max, a zero denominator -> 0)."""
    pid_t = tl.program_id(0)
    heads = tl.program_id(1) * HC + tl.arange(0, HC)
    h_ok = heads < H
    dd = tl.arange(0, BD)
    hd_ok = h_ok[:, None] & (dd < D)[None, :]
    m_all = tl.full([HC], -1.0e30, tl.float32)
    for sp in range(SPLITS):
        row = (pid_t * SPLITS + sp).to(tl.int64) * H + heads
        m_all = tl.maximum(m_all, tl.load(ws_ptr + row * (BD + 2) + BD, mask=h_ok, other=-1.0e30))
    l_all = tl.zeros([HC], tl.float32)
    acc = tl.zeros([HC, BD], tl.float32)
    for sp in range(SPLITS):
        row = (pid_t * SPLITS + sp).to(tl.int64) * H + heads
        w = ws_ptr + row * (BD + 2)
        scale = tl.math.exp2(tl.load(w + BD, mask=h_ok, other=-1.0e30) - m_all)
        l_all += scale * tl.load(w + BD + 1, mask=h_ok, other=0.0)
        acc += scale[:, None] * tl.load(w[:, None] + dd[None, :], mask=hd_ok, other=0.0)
    sink = tl.load(sink_ptr + heads, mask=h_ok, other=float("-inf")) * 1.4426950408889634
    l_all = l_all + tl.math.exp2(sink - m_all)
    inv = 1.0 / tl.where(l_all > 0.0, l_all, 1.0)
    bi = (pid_t // S).to(tl.int64)
    si = (pid_t % S).to(tl.int64)
    tl.store(out_ptr + bi * stride_ob + si * stride_os + heads[:, None] * stride_oh + dd[None, :],
             numerics.to_bf16(acc * inv[:, None]), mask=hd_ok)


#: Heads a program of the combine kernel folds (its FP32 [HC, 512] tile: 64 registers a thread
#: at 4 warps).
_COMBINE_HEADS = 16


# --------------------------------------------------------------------------- heuristics
@dataclass(frozen=True)
class SparseAttnConfig:
    """Launch choice: heads per program (the padded MMA side), KV slots per step, warps,
    pipeline stages, whether the products are computed transposed (see the module docstring)."""

    heads_per_program: int
    block_kv: int
    num_warps: int
    num_stages: int
    swap_ab: bool
    #: programs sharing one query's top-k list (> 1: FP32 shares in a workspace, folded by a
    #: second kernel; more programs in flight when queries x head tiles leave SMs idle)
    split_kv: int = 1
    reason: str = ""
    #: ``"triton"`` (this module's kernel, every tier) or ``"gluon"`` (`sparse_attn_sm90`: d =
    #: 512, 64-head tiles, the gather in a producer partition; sm_90 only)
    engine: str = "triton"


#: heads per program -> (block_kv, num_warps, num_stages, swap_ab), at d = 512. Chosen from the
#: sm_90a compile tier (2026-12, Triton 3.6; ptxas registers / stack / shared bytes), NOT from
#: GPU timing, which has not been run yet:
#:   16 heads, BK 64, 8 warps, swap:  142 regs, no stack, 150 KB smem, HGMMA (no swap: mma.sync)
#:   32 heads, BK 64, 8 warps, swap:  201 regs, no stack, 168 KB smem, HGMMA (4 warps: 255 + stack)
#:   64 heads, BK 64, 8 warps, plain: 255 regs, no stack, 197 KB smem, HGMMA (4 warps spill ~1 KB;
#:                                    swap at BK 64 has an 80-byte stack; swap at BK 32: 235 regs,
#:                                    103 KB, but half the KV bytes in flight per stage)
#: BK 64 keeps a 64 KB gather in flight while the previous block is multiplied: Little's law
#: wants ~30 KB a SM to cover HBM latency at full bandwidth.
TILE_TABLE: dict[int, tuple[int, int, int, bool]] = {
    16: (64, 8, 2, True),
    32: (64, 8, 2, True),
    64: (64, 8, 2, False),
}

_OVERRIDE_FIELDS = ("heads_per_program", "block_kv", "num_warps", "num_stages", "swap_ab", "split_kv", "engine")

#: ``LOWBIT_SPARSE_ATTN_HEADS_PER_PROGRAM`` ... : tuning overrides, each part of the memo key.
ENV_OVERRIDES = overrides.override_names("SPARSE_ATTN", _OVERRIDE_FIELDS)


def _env_key() -> tuple:
    return overrides.env_key("SPARSE_ATTN", _OVERRIDE_FIELDS)


def _check_config(cfg: SparseAttnConfig) -> SparseAttnConfig:
    if cfg.heads_per_program not in TILE_TABLE:
        raise ValueError(f"heads_per_program must be one of {sorted(TILE_TABLE)}, got {cfg.heads_per_program}")
    bk = cfg.block_kv
    if bk < 16 or bk > 128 or bk & (bk - 1):
        raise ValueError(f"block_kv must be a power of two in [16, 128], got {bk}")
    if cfg.num_warps not in (4, 8):
        raise ValueError(f"num_warps must be 4 or 8, got {cfg.num_warps}")
    if cfg.num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {cfg.num_stages}")
    if cfg.split_kv < 1:
        raise ValueError(f"split_kv must be >= 1, got {cfg.split_kv}")
    if cfg.engine not in ("triton", "gluon"):
        raise ValueError(f"engine must be 'triton' or 'gluon', got {cfg.engine!r}")
    if cfg.engine == "gluon":
        from .hopper import GLUON_TILES, HEADS  # noqa: PLC0415 (Gluon imported only when asked for)

        if cfg.heads_per_program != HEADS or (cfg.block_kv, cfg.num_stages) not in GLUON_TILES \
                or cfg.num_warps != 8 or cfg.swap_ab:
            raise ValueError(f"the gluon engine runs {HEADS}-head tiles, 8 warps, no swap_ab, (block_kv, "
                             f"num_stages) in {GLUON_TILES}; got {cfg}")
    return cfg


def _fit_engine(cfg: SparseAttnConfig) -> SparseAttnConfig:
    """``LOWBIT_SPARSE_ATTN_ENGINE=gluon`` as a global switch: the Gluon kernel's own tile
    (64 heads, 8 warps; the asked (block_kv, num_stages) if it has them, else its first)."""
    if cfg.engine != "gluon":
        return cfg
    from .hopper import GLUON_TILES, HEADS  # noqa: PLC0415

    bk, stages = (cfg.block_kv, cfg.num_stages) if (cfg.block_kv, cfg.num_stages) in GLUON_TILES else GLUON_TILES[0]
    return replace(cfg, heads_per_program=HEADS, block_kv=bk, num_stages=stages, num_warps=8, swap_ab=False)


def _apply_env_overrides(cfg: SparseAttnConfig) -> SparseAttnConfig:
    for name, field in zip(ENV_OVERRIDES, _OVERRIDE_FIELDS):
        v = os.environ.get(name)
        if not v:
            continue
        val = overrides.parse_override(name, v, getattr(cfg, field))
        if field == "heads_per_program" and val in TILE_TABLE:
            # a new head tile brings its own table row; later overrides still apply on top
            bk, warps, stages, swap = TILE_TABLE[val]
            cfg = replace(cfg, heads_per_program=val, block_kv=bk, num_warps=warps, num_stages=stages, swap_ab=swap)
        else:
            cfg = replace(cfg, **{field: val})
        cfg = replace(cfg, reason=cfg.reason + f"; {name}={v}")
    return _check_config(_fit_engine(cfg))


def _table_config(ht: int, why: str) -> SparseAttnConfig:
    bk, warps, stages, swap = TILE_TABLE[ht]
    return SparseAttnConfig(ht, bk, warps, stages, swap, reason=why)


#: KV slots a split share keeps at least (8 blocks of 64): the combine kernel's FP32 shares
#: (``splits * H * 2 KB`` a query) must stay small beside the gathered rows (2048 slots: 2 MB).
_MIN_SLOTS_PER_SPLIT = 512


@lru_cache(maxsize=4096)
def _config_cached(queries: int, h: int, topk: int, sms: int, env: tuple, gluon: bool = False) -> SparseAttnConfig:
    """Widest head tile (each gathered KV row feeds the most heads, read once per query), then
    split the top-k list while the grid is short of the SMs. H200, sixth session, decode point
    (64 queries x 64 heads, top-k 2048, d 512), CUDA graph, us (`scripts/sweeps/
    sparse_attn_split.json`): 64 heads x split 2 (128 programs) 91.1; split 4 106.7; 32 heads x
    split 1 (the previous rule: the two head tiles of a query re-read its rows through L2)
    124.2 at 4 warps, 148.7 at 8; 32 heads split 2 / 4: 121.5-147.9; 64 heads unsplit (64
    programs) 147.6.

    `gluon` (an sm_90 GPU, d = 512, aligned rows): the Gluon kernel's 64-head tile (BK 64, 2
    stages), same split rule. H200, twelfth session (`scripts/probes/sparse_attn_engines.py`,
    same process, us): decode split 1 / 2 / 4: 90.7 / **66.1** / 88.5 against the Triton
    kernel's 90.5 (split 2); BK 32 x 4 stages 124.9 / 80.8 / 102.2; prefill (b=1, s=1024) split
    1 **709.0** against 1095.2."""
    tiles = sorted(TILE_TABLE)
    # no point in a tile wider than the heads padded to 16 / a power of two
    ht = max(t for t in tiles if t <= max(tiles[0], triton.next_power_of_2(h)))
    cfg = _table_config(ht, f"{ht}-head tile (the widest for {h} heads: each gathered row serves them all)")
    if gluon and ht == 64:  # (fewer heads keep the narrower Triton tiles: not measured against it)
        cfg = SparseAttnConfig(64, 64, 8, 2, False, engine="gluon", reason=(
            "sm_90, d = 512: Gluon kernel (the KV gather in a producer partition, two warpgroups on alternate "
            "blocks), 64-head tiles, 64-slot blocks, 2 buffers (H200 decode 1.45x, prefill 1.9x the Triton kernel)"))
    progs = queries * triton.cdiv(h, ht)
    split = max(1, min(sms // max(progs, 1), topk // _MIN_SLOTS_PER_SPLIT))
    if split > 1:
        why = f"{progs} programs on {sms} SMs: top-k {topk} split {split} ways ({split * progs} programs)"
    else:
        why = f"{progs} programs on {sms} SMs, top-k {topk}: no split"
    return _apply_env_overrides(replace(cfg, split_kv=split, reason=f"{cfg.reason}; {why}"))


def sparse_attn_config(b: int, s: int, h: int, device: str | torch.device = "cpu", topk: int = 0,
                       gluon: bool = False) -> SparseAttnConfig:
    """Launch configuration for ``b * s`` queries of ``h`` heads over `topk` slots each,
    memoized per (queries, heads, top-k, SM count, `gluon`) and the ``LOWBIT_SPARSE_ATTN_*``
    overrides (`ENV_OVERRIDES`: HEADS_PER_PROGRAM, BLOCK_KV, NUM_WARPS, NUM_STAGES, SWAP_AB,
    SPLIT_KV, ENGINE). gluon: the Gluon engine may run (`gluon_capable`); it is then the default."""
    return _config_cached(b * s, h, topk, num_sms(torch.device(device)), _env_key(), gluon)


def gluon_capable(q: torch.Tensor, kv: torch.Tensor) -> bool:
    """Whether the Gluon engine can run: an sm_90 GPU (not the interpreter), d = 512, kv rows
    16-byte aligned."""
    from ...runtime.device import is_sm90_native  # noqa: PLC0415

    return (is_sm90_native(q.device) and q.shape[-1] == 512 and kv.stride(1) % 8 == 0
            and kv.data_ptr() % 16 == 0)


def explain_sparse_attn_config(b: int, s: int, h: int, device: str | torch.device = "cpu", topk: int = 0,
                               gluon: bool = False) -> str:
    c = sparse_attn_config(b, s, h, device, topk, gluon)
    return (f"sparse_attn b={b} s={s} h={h} topk={topk}: heads_per_program={c.heads_per_program} "
            f"block_kv={c.block_kv} warps={c.num_warps} stages={c.num_stages} swap_ab={c.swap_ab} "
            f"split_kv={c.split_kv} engine={c.engine} -- {c.reason}")


# --------------------------------------------------------------------------- launcher
def _validate_values(kv: torch.Tensor, attn_sink: torch.Tensor, topk_idxs: torch.Tensor) -> None:
    """The checks that read device data back (a sync): off by default."""
    n = kv.shape[1]
    if topk_idxs.numel() and (bool((topk_idxs < -1).any()) or bool((topk_idxs >= n).any())):
        lo, hi = int(topk_idxs.min()), int(topk_idxs.max())
        raise ValueError(f"topk_idxs must lie in [-1, n={n}) (-1 = empty slot), got range [{lo}, {hi}]")
    if bool(torch.isnan(attn_sink).any()) or bool(torch.isposinf(attn_sink).any()):
        raise ValueError("attn_sink must not contain NaN or +inf")


def kernel_args(q, kv, sink, topk_idxs, dst, out, qk_scale: float, per: int) -> tuple:
    """The runtime arguments both engines' kernels take, in their order (pointers, sizes,
    strides, the log2-unit scale, slots a share); `dst` is `out` or the split workspace."""
    _, s, h, _ = q.shape
    return (q, kv, sink, topk_idxs, dst,
            h, kv.shape[1], topk_idxs.shape[2], s,
            q.stride(0), q.stride(1), q.stride(2),
            kv.stride(0), kv.stride(1),
            topk_idxs.stride(0), topk_idxs.stride(1),
            out.stride(0), out.stride(1), out.stride(2),
            qk_scale, per)


def _launch_gluon(q, kv, sink, topk_idxs, out, qk_scale: float, per: int, splits: int,
                  config: SparseAttnConfig) -> None:
    """The Hopper Gluon kernel (`sparse_attn_sm90`): an sm_90 GPU, d = 512, 16-byte aligned rows."""
    from ...runtime.device import require_sm90  # noqa: PLC0415
    from .hopper import HEAD_DIM, sparse_attn_sm90_launch  # noqa: PLC0415

    require_sm90(q.device, "sparse_attn engine='gluon'")
    if q.shape[3] != HEAD_DIM:
        raise ValueError(f"sparse_attn: engine='gluon' needs d = {HEAD_DIM}, got {q.shape[3]}")
    if kv.stride(1) % 8 or kv.data_ptr() % 16:
        raise ValueError(f"sparse_attn: engine='gluon' gathers kv rows in 16-byte copies: rows must be 16-byte "
                         f"aligned (row stride {kv.stride(1)} elements)")
    sparse_attn_sm90_launch(q, kv, sink, topk_idxs, out, qk_scale, per, splits, config.block_kv,
                            config.num_stages)


def sparse_attn(
    q: torch.Tensor,
    kv: torch.Tensor,
    attn_sink: torch.Tensor,
    topk_idxs: torch.Tensor,
    softmax_scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    config: SparseAttnConfig | None = None,
    validate: bool = False,
) -> torch.Tensor:
    """Sparse multi-query attention over gathered KV rows (semantics: module docstring).

    q: ``bf16 [b, s, h, d]``, contiguous along d (any h >= 1, d <= 512);
    kv: ``bf16 [b, n, d]``, contiguous along d: keys = values, shared by all heads;
    attn_sink: ``float32 [h]``, one sink logit per head (``-inf``: no sink);
    topk_idxs: ``int32 [b, s, topk]``, contiguous along topk: KV row per slot, ``-1`` empty;
    softmax_scale: multiplies ``q . k``; ``None`` means ``1 / sqrt(d)``.
    out: optional ``bf16 [b, s, h, d]`` buffer (contiguous along d); config: a
    `SparseAttnConfig` instead of the heuristic; validate: also reject indices outside
    ``[-1, n)`` and a NaN / +inf sink, as the reference does (reads device data: a sync, not
    CUDA-graph capturable). Without it those indices count as empty slots (never read) and
    the sink is taken as given.

    Returns ``bf16 [b, s, h, d]``; a query whose slots are all empty gets exact zeros.
    """
    for name, t in (("q", q), ("kv", kv), ("attn_sink", attn_sink), ("topk_idxs", topk_idxs)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dtype != torch.bfloat16 or kv.dtype != torch.bfloat16:
        raise TypeError(f"q and kv must be bf16, got q {q.dtype}, kv {kv.dtype}")
    if attn_sink.dtype != torch.float32:
        raise TypeError(f"attn_sink must be float32 [h], got {attn_sink.dtype}")
    if topk_idxs.dtype != torch.int32:
        raise TypeError(f"topk_idxs must be int32 [b, s, topk], got {topk_idxs.dtype}")
    if q.dim() != 4:
        raise ValueError(f"q must be [b, s, h, d], got shape {tuple(q.shape)}")
    b, s, h, d = q.shape
    if kv.dim() != 3 or kv.shape[0] != b or kv.shape[2] != d:
        raise ValueError(f"kv must be [b, n, d] = [{b}, n, {d}] for q {tuple(q.shape)}, got {tuple(kv.shape)}")
    if tuple(attn_sink.shape) != (h,):
        raise ValueError(f"attn_sink must be [h] = [{h}], got {tuple(attn_sink.shape)}")
    if topk_idxs.dim() != 3 or tuple(topk_idxs.shape[:2]) != (b, s):
        raise ValueError(f"topk_idxs must be [b, s, topk] = [{b}, {s}, topk], got {tuple(topk_idxs.shape)}")
    topk = topk_idxs.shape[2]
    if d < 1 or d > MAX_HEAD_DIM:
        raise ValueError(f"head dim d={d} is not supported: 1 <= d <= {MAX_HEAD_DIM}")
    for name, t in (("q", q), ("kv", kv), ("topk_idxs", topk_idxs)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
        if t.numel() and t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along its last dim, got strides {t.stride()}")
    if attn_sink.device != q.device:
        raise ValueError(f"attn_sink is on {attn_sink.device}, q on {q.device}")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    softmax_scale = float(softmax_scale)
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    if validate:
        _validate_values(kv, attn_sink, topk_idxs)
    if out is None:
        out = torch.empty(b, s, h, d, dtype=torch.bfloat16, device=q.device)
    elif (out.dtype != torch.bfloat16 or tuple(out.shape) != (b, s, h, d) or out.device != q.device
          or (out.numel() and out.stride(-1) != 1)):
        raise ValueError(f"out must be bf16 [{b}, {s}, {h}, {d}] on {q.device}, contiguous along d; "
                         f"got {out.dtype} {tuple(out.shape)} strides {out.stride()} on {out.device}")
    if out.numel() == 0:
        return out
    config = (sparse_attn_config(b, s, h, q.device, topk, gluon_capable(q, kv)) if config is None
              else _check_config(config))
    sink = attn_sink.contiguous()
    ht = config.heads_per_program
    bd = max(16, triton.next_power_of_2(d))
    # each share a whole number of KV blocks; no empty share
    per = triton.cdiv(triton.cdiv(max(topk, 1), config.split_kv), config.block_kv) * config.block_kv
    splits = triton.cdiv(max(topk, 1), per)
    if config.engine == "gluon":  # split shares fold inside the kernel
        _launch_gluon(q, kv, sink, topk_idxs, out, softmax_scale * LOG2E, per, splits, config)
        return out
    dst = out
    if splits > 1:
        dst = torch.empty(b * s, splits, h, bd + 2, dtype=torch.float32, device=q.device)
    _sparse_attn_kernel[(triton.cdiv(h, ht), b * s, splits)](
        *kernel_args(q, kv, sink, topk_idxs, dst, out, softmax_scale * LOG2E, per),
        D=d, BD=bd, HT=ht, BK=config.block_kv, SWAP_AB=config.swap_ab, SPLIT_OUT=splits > 1,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if splits > 1:
        _sparse_attn_combine_kernel[(b * s, triton.cdiv(h, _COMBINE_HEADS))](
            dst, sink, out, h, s, splits, out.stride(0), out.stride(1), out.stride(2),
            D=d, BD=bd, HC=_COMBINE_HEADS, num_warps=4,
        )
    return out


def compile_configs():
    """Every configuration the heuristics can pick (d = 512, heads 16..128 -> tiles of 16, 32,
    64), unsplit and split (the FP32 share written to the workspace), and the combine kernel,
    for the compile tier."""
    from ..compile_tier import KernelConfig

    sig = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "sink_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*bf16",
           "H": "i32", "N": "i32", "TOPK": "i32", "S": "i32",
           "stride_qb": "i32", "stride_qs": "i32", "stride_qh": "i32",
           "stride_kvb": "i32", "stride_kvn": "i32",
           "stride_ib": "i32", "stride_is": "i32",
           "stride_ob": "i32", "stride_os": "i32", "stride_oh": "i32",
           "qk_scale": "fp32", "slots_per_split": "i32",
           "D": "constexpr", "BD": "constexpr", "HT": "constexpr", "BK": "constexpr", "SWAP_AB": "constexpr",
           "SPLIT_OUT": "constexpr"}
    cfgs = []
    for ht, (bk, warps, stages, swap) in TILE_TABLE.items():
        for split in (False, True):
            cfgs.append(KernelConfig(
                f"sparse_attn[D=512,HT={ht},BK={bk},w={warps},swap={int(swap)}{',split' if split else ''}]",
                _sparse_attn_kernel, dict(sig, out_ptr="*fp32") if split else sig,
                {"D": 512, "BD": 512, "HT": ht, "BK": bk, "SWAP_AB": swap, "SPLIT_OUT": split},
                num_warps=warps, num_stages=stages, expect_sass=("HGMMA",),
                # head count, KV length, top-k and the index row strides are arbitrary in production
                unaligned=("H", "N", "TOPK", "S", "stride_ib", "stride_is", "slots_per_split")))
    cfgs.append(KernelConfig(
        f"sparse_attn_combine[D=512,HC={_COMBINE_HEADS}]", _sparse_attn_combine_kernel,
        {"ws_ptr": "*fp32", "sink_ptr": "*fp32", "out_ptr": "*bf16", "H": "i32", "S": "i32", "SPLITS": "i32",
         "stride_ob": "i32", "stride_os": "i32", "stride_oh": "i32",
         "D": "constexpr", "BD": "constexpr", "HC": "constexpr"},
        {"D": 512, "BD": 512, "HC": _COMBINE_HEADS}, num_warps=4, num_stages=1,
        unaligned=("H", "S", "SPLITS")))
    return cfgs
