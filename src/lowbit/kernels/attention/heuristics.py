"""Launch heuristics of `sparse_attn`: pure functions of the problem (queries, heads, top-k, SM
count, whether the Gluon engine can run) returning a `SparseAttnConfig` with the reason for it,
memoized with the ``LOWBIT_SPARSE_ATTN_*`` overrides in the key.

Rule: the widest head tile of `TILE_TABLE` for the heads (each gathered KV row is read once per
query and serves every head of the tile), then the top-k list split while the grid is short of
the SMs (decode), each share keeping at least `MIN_SLOTS_PER_SPLIT` slots. On sm_90 with d = 512
and more than 32 heads: the Gluon engine's 64-head tile with the same split rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import lru_cache

import torch
import triton

from ...runtime import overrides
from ...runtime.device import num_sms
from .tiles import GLUON_TILES, HEADS, TILE_TABLE

__all__ = [
    "SparseAttnConfig",
    "ENV_OVERRIDES",
    "MIN_SLOTS_PER_SPLIT",
    "check_config",
    "table_config",
    "sparse_attn_config",
    "explain_sparse_attn_config",
]


@dataclass(frozen=True)
class SparseAttnConfig:
    """Launch choice: heads per program (the padded MMA side), KV slots per step, warps,
    pipeline stages, whether the products are computed transposed (`portable`'s SWAP_AB)."""

    heads_per_program: int
    block_kv: int
    num_warps: int
    num_stages: int
    swap_ab: bool
    #: programs sharing one query's top-k list (> 1: FP32 shares, folded by a second kernel or,
    #: on the Gluon engine, inside the kernel; more programs in flight when queries x head tiles
    #: leave SMs idle)
    split_kv: int = 1
    reason: str = ""
    #: ``"triton"`` (`portable`'s kernel, every tier) or ``"gluon"`` (`hopper`: d = 512, 64-head
    #: tiles, the gather in a producer partition; sm_90 only)
    engine: str = "triton"


_OVERRIDE_FIELDS = ("heads_per_program", "block_kv", "num_warps", "num_stages", "swap_ab", "split_kv", "engine")

#: ``LOWBIT_SPARSE_ATTN_HEADS_PER_PROGRAM`` ... : tuning overrides, each part of the memo key.
ENV_OVERRIDES = overrides.override_names("SPARSE_ATTN", _OVERRIDE_FIELDS)

#: KV slots a split share keeps at least (8 blocks of 64): the combine kernel's FP32 shares
#: (``splits * H * 2 KB`` a query) must stay small beside the gathered rows (2048 slots: 2 MB).
MIN_SLOTS_PER_SPLIT = 512


def _env_key() -> tuple:
    return overrides.env_key("SPARSE_ATTN", _OVERRIDE_FIELDS)


def check_config(cfg: SparseAttnConfig) -> SparseAttnConfig:
    """`cfg` if an engine can run it, else a ValueError naming the field."""
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
    return check_config(_fit_engine(cfg))


def table_config(ht: int, why: str) -> SparseAttnConfig:
    """The Triton kernel's `TILE_TABLE` row for `ht` heads a program, unsplit, with reason `why`."""
    bk, warps, stages, swap = TILE_TABLE[ht]
    return SparseAttnConfig(ht, bk, warps, stages, swap, reason=why)


@lru_cache(maxsize=4096)
def _config_cached(queries: int, h: int, topk: int, sms: int, env: tuple, gluon: bool = False) -> SparseAttnConfig:
    """Widest head tile, then the top-k split while the grid is short of the SMs (module doc)."""
    # H200, 2026-11-30, commit 96b8296: 64 queries x 64 heads, top-k 2048: 64 heads split 2 91.1 us, 32 unsplit 124.2
    tiles = sorted(TILE_TABLE)
    # no point in a tile wider than the heads padded to 16 / a power of two
    ht = max(t for t in tiles if t <= max(tiles[0], triton.next_power_of_2(h)))
    cfg = table_config(ht, f"{ht}-head tile (the widest for {h} heads: each gathered row serves them all)")
    if gluon and ht == 64:  # (fewer heads keep the narrower Triton tiles: not measured against it)
        # H200, 2026-11-30, commit 71b7da1: decode 62.5 us, prefill b=1 s=1024 578 us (1.45x / 1.9x Triton)
        cfg = SparseAttnConfig(64, 64, 8, 2, False, engine="gluon", reason=(
            "sm_90, d = 512: Gluon kernel (the KV gather in a producer partition, two warpgroups on alternate "
            "blocks), 64-head tiles, 64-slot blocks, 2 buffers (H200 decode 1.45x, prefill 1.9x the Triton kernel)"))
    progs = queries * triton.cdiv(h, ht)
    split = max(1, min(sms // max(progs, 1), topk // MIN_SLOTS_PER_SPLIT))
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
    SPLIT_KV, ENGINE). gluon: the Gluon engine may run (`sparse_attn.gluon_capable`); it is
    then the default for more than 32 heads."""
    return _config_cached(b * s, h, topk, num_sms(torch.device(device)), _env_key(), gluon)


def explain_sparse_attn_config(b: int, s: int, h: int, device: str | torch.device = "cpu", topk: int = 0,
                               gluon: bool = False) -> str:
    """`sparse_attn_config`'s choice as one line, with its reason."""
    c = sparse_attn_config(b, s, h, device, topk, gluon)
    return (f"sparse_attn b={b} s={s} h={h} topk={topk}: heads_per_program={c.heads_per_program} "
            f"block_kv={c.block_kv} warps={c.num_warps} stages={c.num_stages} swap_ab={c.swap_ab} "
            f"split_kv={c.split_kv} engine={c.engine} -- {c.reason}")
