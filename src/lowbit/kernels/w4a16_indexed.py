"""W4A16 indexed MoE GEMM: BF16 activations x INT4 group-32 expert weights, vLLM routing.

Semantics (reference: `lowbit.reference.w4a16_indexed_ref`)::

    for block b < num_tokens_post_padded / BLOCK_M with e = expert_ids[b] >= 0:
        for id in sorted_token_ids[b*BLOCK_M : (b+1)*BLOCK_M] with id < M * top_k:
            out[id] = bf16( a[id // top_k] @ dequant(W[e])^T  (* topk_weights[id]) )

The routing block size *is* the kernel's M tile, so the caller builds the routing with
`w4a16_indexed_config(...).block_m` (vLLM does the same with its fused-MoE configs).

Kernel: one program per (routing block, N tile). Blocks past the device-side padded count and
``-1`` (remote expert) blocks return at once; sentinel rows are masked, so no host readback and
no out-of-bounds access. The K loop walks 256-wide tiles of the prepared layout
(`lowbit.formats.w4a16`): one load of 32 words per row gives 8 groups; a shift by ``4i`` exposes
groups ``i`` and ``i + 4``, dequantized two at a time by `int4_dequant.dequant_pair` (inline
PTX, ~2 instructions an element) with one scale per row, and fed to the tensor cores as
32-deep dots. ``SWAP_AB`` puts the dequantized weight on the MMA's M side
(``acc^T[BN, BM] += W[BN, 32] @ A^T``), for decode where BLOCK_M is tiny.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import lru_cache

import torch
import triton
import triton.language as tl

from ..formats.w4a16 import PACK_K, W4A16Weight
from . import numerics
from .int4_dequant import dequant_pair

__all__ = ["W4A16IndexedConfig", "w4a16_indexed", "w4a16_indexed_config", "explain_w4a16_indexed_config"]


@triton.jit
def _w4a16_indexed_kernel(
    a_ptr, qw_ptr, s_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, topk_w_ptr,
    N, K, num_routes, top_k,
    stride_am, stride_qe, stride_qn, stride_se, stride_sk, stride_cm,
    BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr, MUL_WEIGHT: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BM >= tl.load(ntpp_ptr):
        return
    e = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if e < 0:
        return
    rm = pid_m * BM + tl.arange(0, BM)
    ids = tl.load(sorted_ids_ptr + rm)
    valid = ids < num_routes
    a_row = tl.where(valid, ids // top_k, 0).to(tl.int64)
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    j = tl.arange(0, 32)
    qw_rows = qw_ptr + e * stride_qe + rn[:, None].to(tl.int64) * stride_qn + j[None, :]
    s_rows = s_ptr + e * stride_se + rn
    a_rows = a_ptr + a_row[:, None] * stride_am + j[None, :]
    if SWAP_AB:
        acc = tl.zeros([BN, BM], tl.float32)
    else:
        acc = tl.zeros([BM, BN], tl.float32)
    for kt in range(0, tl.cdiv(K, 256)):
        words = tl.load(qw_rows + kt * 32, mask=n_ok[:, None], other=0)
        for i in tl.static_range(4):
            # one shift serves two groups: i (low half-word) and i + 4 (high half-word)
            s_lo = tl.load(s_rows + (kt * 8 + i) * stride_sk, mask=n_ok, other=0.0)
            s_hi = tl.load(s_rows + (kt * 8 + i + 4) * stride_sk, mask=n_ok, other=0.0)
            w_lo, w_hi = dequant_pair(words >> (4 * i), s_lo[:, None], s_hi[:, None])
            k_lo = kt * 256 + i * 32
            k_hi = k_lo + 128
            a_lo = tl.load(a_rows + k_lo, mask=valid[:, None] & ((k_lo + j)[None, :] < K), other=0.0)
            a_hi = tl.load(a_rows + k_hi, mask=valid[:, None] & ((k_hi + j)[None, :] < K), other=0.0)
            if SWAP_AB:
                acc = numerics.dot(w_lo, tl.trans(a_lo), acc)
                acc = numerics.dot(w_hi, tl.trans(a_hi), acc)
            else:
                acc = numerics.dot(a_lo, tl.trans(w_lo), acc)
                acc = numerics.dot(a_hi, tl.trans(w_hi), acc)
    if SWAP_AB:
        acc = tl.trans(acc)
    if MUL_WEIGHT:
        acc = acc * tl.load(topk_w_ptr + ids, mask=valid, other=0.0)[:, None]
    c = c_ptr + ids[:, None].to(tl.int64) * stride_cm + rn[None, :]
    tl.store(c, numerics.to_bf16(acc), mask=valid[:, None] & n_ok[None, :])


# --------------------------------------------------------------------------- heuristics
@dataclass(frozen=True)
class W4A16IndexedConfig:
    """Launch choice. block_m is also the routing block size."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    swap_ab: bool
    reason: str = ""


#: The M tile by tokens per expert (tok_e = routed rows / experts): the first row that fits.
#: Every row puts the dequantized weight on the MMA's M side (SWAP_AB): the words are staged
#: in shared memory by cp.async and read straight into the wgmma A-operand register layout,
#: dequantized there, so the weight never goes back through shared memory; the activations are
#: the B operand (N = block_m, a legal wgmma N from 16 up).
#: Provenance: H200, 2026-11-29, scripts/w4a16_sweep.py at a075672 (36 configs, median us,
#: L2 flushed; gate_up / down):
#:   EP8 20 tok (tok_e 3.3):    16x256 w4: 363 / 190   32x128 w8: 399 / 222   64x64 w4: 617 / 386
#:   TP8 8192 rows (tok_e 21):  32x128 w8: 455 / 394   16x256 w4: 653 / 526   64x64 w4: 694 / 695
#:   EP8 2048 rows (tok_e 43):  64x64 w4:  705 / 420   64x128 w8: 766 / 410   32x128 w8: 809 / 432
#: 128-row tiles were all slower (>= 1010 us on EP8 2048 gate_up) or out of shared memory.
#: Configs that failed the sweep's GPU correctness check (misaligned-address faults from
#: Triton 3.6 at some tile shapes, e.g. 64x256 w8 and 32x128 w4) must never enter this table.
_M_TILES = (
    # (max tok_e, block_m, block_n, num_warps, num_stages, swap_ab, why)
    (16, 16, 256, 4, 3, True, "decode: a few rows per expert; 256-row weight tiles, fastest at 3-16 tok_e"),
    (32, 32, 128, 8, 3, True, "small batches: 32-row tiles, fastest at TP8 tok_e 21"),
    (float("inf"), 64, 64, 4, 3, True, "prefill: 64-row tiles, fastest at EP8 tok_e 43; 128-row tiles measured slower"),
)

#: Environment overrides (each is part of the memo key).
ENV_OVERRIDES = {
    "LOWBIT_W4A16_BLOCK_M": "block_m",
    "LOWBIT_W4A16_BLOCK_N": "block_n",
    "LOWBIT_W4A16_NUM_WARPS": "num_warps",
    "LOWBIT_W4A16_NUM_STAGES": "num_stages",
    "LOWBIT_W4A16_SWAP_AB": "swap_ab",
}


def _env_key() -> tuple:
    return tuple(os.environ.get(k, "") for k in ENV_OVERRIDES)


@lru_cache(maxsize=4096)
def _config_cached(num_routes: int, num_experts: int, n: int, k: int, block_m: int | None, env: tuple) -> W4A16IndexedConfig:
    tok_e = num_routes / max(num_experts, 1)
    if block_m is None:
        row = next(r for r in _M_TILES if tok_e <= r[0])
    else:
        rows = [r for r in _M_TILES if r[1] == block_m]
        if not rows:  # only GPU-validated tiles are ever launched
            raise ValueError(
                f"no W4A16 indexed configuration with block_m={block_m}; build the routing with "
                f"one of {sorted({r[1] for r in _M_TILES})} (w4a16_indexed_config(...).block_m)"
            )
        row = rows[0]
    _, bm, bn, warps, stages, swap, why = row
    profile = "TP" if n * k < 4096 * 7168 // 2 and num_experts > 64 else "EP"
    cfg = W4A16IndexedConfig(bm, bn, warps, stages, swap, f"tok_e={tok_e:.1f} ({profile}): {why}")
    for var, field in ENV_OVERRIDES.items():
        v = os.environ.get(var)
        if v:
            val = v.lower() in ("1", "true", "yes") if field == "swap_ab" else int(v)
            cfg = replace(cfg, **{field: val}, reason=cfg.reason + f"; {var}={v}")
    return cfg


def w4a16_indexed_config(num_routes: int, num_experts: int, n: int, k: int, block_m: int | None = None) -> W4A16IndexedConfig:
    """The launch configuration for ``num_routes = M * top_k`` routed rows over `num_experts`
    experts of ``[n, k]`` weights. Memoized per shape descriptor and environment overrides
    (``LOWBIT_W4A16_BLOCK_M``, ``_BLOCK_N``, ``_NUM_WARPS``, ``_NUM_STAGES``, ``_SWAP_AB``).
    `block_m` pins the M tile (the routing was already built with that block size)."""
    return _config_cached(num_routes, num_experts, n, k, block_m, _env_key())


def explain_w4a16_indexed_config(num_routes: int, num_experts: int, n: int, k: int) -> str:
    c = w4a16_indexed_config(num_routes, num_experts, n, k)
    return (f"w4a16_indexed M*top_k={num_routes} E={num_experts} N={n} K={k}: block_m={c.block_m} "
            f"block_n={c.block_n} warps={c.num_warps} stages={c.num_stages} swap_ab={c.swap_ab} -- {c.reason}")


# --------------------------------------------------------------------------- launcher
def w4a16_indexed(
    a: torch.Tensor,
    w: W4A16Weight,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    top_k: int,
    *,
    topk_weights: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: W4A16IndexedConfig | None = None,
) -> torch.Tensor:
    """W4A16 MoE GEMM on the indexed (vLLM ``moe_align_block_size``) layout.

    a: ``bf16 [M, K]`` (row ``id // top_k`` feeds route ``id``); w: `W4A16Weight` packed with
    ``profile="indexed"`` (``[E, N, K]``); sorted_ids ``int32 [P]``, expert_ids ``int32 [P / B]``,
    num_tokens_post_padded ``int32 [1]`` from `lowbit.routing.moe_align_block_size` with block
    size ``B = config.block_m``; topk_weights optional ``fp32 [M, top_k]`` multiplied in the
    epilogue; out optional ``bf16 [M * top_k, N]`` (rows of unrouted/remote routes are left as
    they were). Returns ``out``.
    """
    w.check("indexed")
    if a.dtype != torch.bfloat16 or a.dim() != 2:
        raise TypeError(f"a must be bf16 [M, K], got {a.dtype} {tuple(a.shape)}")
    if a.shape[1] != w.k:
        raise ValueError(f"a has K={a.shape[1]}, the weight has K={w.k}")
    if a.stride(1) != 1:
        raise ValueError("a must be contiguous along K")
    for name, t in (("sorted_ids", sorted_ids), ("expert_ids", expert_ids), ("num_tokens_post_padded", num_tokens_post_padded)):
        if t.dtype != torch.int32 or t.dim() != 1:
            raise TypeError(f"{name} must be int32 1-D, got {t.dtype} {tuple(t.shape)}")
        if t.device != a.device:
            raise ValueError(f"{name} is on {t.device}, a on {a.device}")
    if expert_ids.numel() == 0 or sorted_ids.numel() % expert_ids.numel():
        raise ValueError(f"sorted_ids ({sorted_ids.numel()}) must be whole blocks of expert_ids ({expert_ids.numel()})")
    block = sorted_ids.numel() // expert_ids.numel()
    m = a.shape[0]
    num_routes = m * top_k
    if config is None:
        config = w4a16_indexed_config(num_routes, w.num_experts, w.n, w.k, block_m=block)
    if config.block_m != block:
        raise ValueError(f"routing was built with block size {block}, config.block_m={config.block_m}")
    if topk_weights is not None and (topk_weights.dtype != torch.float32 or topk_weights.numel() != num_routes):
        raise TypeError(f"topk_weights must be float32 [M, top_k] = [{m}, {top_k}], got {topk_weights.dtype} {tuple(topk_weights.shape)}")
    if out is None:
        out = torch.empty(num_routes, w.n, dtype=torch.bfloat16, device=a.device)
    elif out.dtype != torch.bfloat16 or tuple(out.shape) != (num_routes, w.n) or out.stride(1) != 1:
        raise ValueError(f"out must be bf16 [{num_routes}, {w.n}] contiguous along N, got {out.dtype} {tuple(out.shape)}")
    grid = (expert_ids.numel(), triton.cdiv(w.n, config.block_n))
    _w4a16_indexed_kernel[grid](
        a, w.qweight, w.scales, out, sorted_ids, expert_ids, num_tokens_post_padded,
        topk_weights if topk_weights is not None else a,
        w.n, w.k, num_routes, top_k,
        a.stride(0), w.qweight.stride(0), w.qweight.stride(1), w.scales.stride(0), w.scales.stride(1), out.stride(0),
        BM=config.block_m, BN=config.block_n, SWAP_AB=config.swap_ab, MUL_WEIGHT=topk_weights is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


def compile_configs():
    """Every configuration the heuristic table can pick, for the compile tier."""
    from .compile_tier import KernelConfig

    sig = {"a_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*bf16", "c_ptr": "*bf16", "sorted_ids_ptr": "*i32",
           "expert_ids_ptr": "*i32", "ntpp_ptr": "*i32", "topk_w_ptr": "*fp32",
           "N": "i32", "K": "i32", "num_routes": "i32", "top_k": "i32",
           "stride_am": "i32", "stride_qe": "i32", "stride_qn": "i32", "stride_se": "i32", "stride_sk": "i32",
           "stride_cm": "i32", "BM": "constexpr", "BN": "constexpr", "SWAP_AB": "constexpr", "MUL_WEIGHT": "constexpr"}
    cfgs = []
    for _, bm, bn, warps, stages, swap, _why in _M_TILES:
        for mul in (False, True):
            cfgs.append(KernelConfig(
                f"w4a16_indexed[BM={bm},BN={bn},swap={int(swap)},mulw={int(mul)}]", _w4a16_indexed_kernel, sig,
                {"BM": bm, "BN": bn, "SWAP_AB": swap, "MUL_WEIGHT": mul}, num_warps=warps, num_stages=stages,
                expect_sass=("HGMMA",) if (bn if swap else bm) >= 64 else ("HMMA",),
                unaligned=("num_routes", "top_k")))
    return cfgs
