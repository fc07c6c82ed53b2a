"""W4A16 indexed MoE GEMM: BF16 activations x INT4 group-32 expert weights, vLLM routing.

Semantics (reference: `lowbit.reference.w4a16_indexed_ref`)::

    for block b < num_tokens_post_padded / BLOCK_M with e = expert_ids[b] >= 0:
        for id in sorted_token_ids[b*BLOCK_M : (b+1)*BLOCK_M] with id < M * top_k:
            out[id] = bf16( a[id // top_k] @ dequant(W[e])^T  (* topk_weights[id]) )

The routing block size *is* the kernel's M tile, so the caller builds the routing with
`w4a16_indexed_config(...).block_m` (vLLM does the same with its fused-MoE configs).

The op validates, allocates and launches: the portable Triton kernel (`portable`, every tier)
or on sm_90 one of the Hopper engines (`hopper.indexed`, `hopper.nloop`), as the configuration
(`heuristics.w4a16_indexed_config`) says.
"""

from __future__ import annotations

import torch

from ...formats.w4a16 import W4A16Weight
from ...runtime.device import is_sm90_native, num_sms, require_sm90
from ...runtime.pdl import pdl_enabled
from .heuristics import (
    INDEXED_ENV_OVERRIDES,
    W4A16Config,
    W4A16IndexedConfig,
    avoid_miscompile,
    explain_w4a16_indexed_config,
    indexed_engine_tiles,
    nloop_n_tiles,
    pregather_ok,
    rs_splits,
    runs_nloop,
    w4a16_indexed_config,
)
from .portable import splitk_reduce, w4a16_indexed_launch
from .tiles import GLUON_ENGINES, PREGATHER_TILES, REGISTER_A_ENGINES

__all__ = ["ENV_OVERRIDES", "W4A16IndexedConfig", "explain_w4a16_indexed_config", "gluon_capable", "w4a16_indexed",
           "w4a16_indexed_config"]

#: Environment overrides of the indexed configuration (each is part of the memo key).
ENV_OVERRIDES = INDEXED_ENV_OVERRIDES
#: Output columns a program of the Gluon path's share reduction sums (8-row routing blocks: 8 KB
#: of FP32 a share a program).
_RS_REDUCE_BN = 256


def gluon_capable(a: torch.Tensor, w: W4A16Weight) -> bool:
    """Whether the Gluon kernels can run these operands: an sm_90 GPU, N a multiple of 8 (the
    scales' TMA rows), activation rows 16-byte aligned (the register-A kernel gathers them
    with 16-byte cp.async)."""
    return is_sm90_native(a.device) and w.n % 8 == 0 and _rows_aligned(a)


def _rows_aligned(a: torch.Tensor) -> bool:
    return a.data_ptr() % 16 == 0 and a.stride(0) % 8 == 0


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
    config: W4A16Config | None = None,
    routing_ready: bool = False,
    slot_order_routes: int | None = None,
) -> torch.Tensor:
    """W4A16 MoE GEMM on the indexed (vLLM ``moe_align_block_size``) layout.

    a: ``bf16 [M, K]`` (row ``id // top_k`` feeds route ``id``); w: `W4A16Weight` packed with
    ``profile="indexed"`` (``[E, N, K]``); sorted_ids ``int32 [P]``, expert_ids ``int32 [P / B]``,
    num_tokens_post_padded ``int32 [1]`` from `lowbit.routing.moe_align_block_size` with block
    size ``B = config.block_m``; topk_weights optional ``fp32 [M, top_k]`` multiplied in the
    epilogue; out optional ``bf16 [M * top_k, N]`` (rows of unrouted/remote routes are left as
    they were). Returns ``out``, equal to `lowbit.reference.w4a16_indexed_ref` (bf16 rounding of
    the FP32 products; bit-identical across engines for the same tile order of K).

    Every block before ``num_tokens_post_padded`` must hold a route (`IndexedRouting`: an
    expert with no route has no block): the grid has ``min(P / B, M * top_k)`` row blocks
    (`lowbit.routing.live_block_bound`), not one a block of the over-allocated buffer.

    config: the launch configuration (default `w4a16_indexed_config` for the problem, with the
    Hopper engines where `gluon_capable`). On sm_90 the register-A kernels launch with
    programmatic dependent launch (`lowbit.runtime.pdl`; off with ``LOWBIT_PDL=0``): they start
    while the previous kernel on the stream finishes and wait for it before reading anything.
    ``routing_ready=True`` promises that the routing tensors were written two launches or more
    before this call (``moe_experts``: routing, gate_up, ``silu_mul``, down): the kernel then
    also streams its first weight steps before that wait.

    ``slot_order_routes=R``: `a` is already in the routing's slot order, ``bf16 [P, K]`` with row
    s the activations of slot s (`lowbit.routing.kernels.gather_indexed_rows`, or ``silu_mul(gu,
    routing=...)``), for R routes (out ``[R, N]``; `top_k` must be 1). Only the pre-gathered
    engine reads that layout (``config.pregather``), and it then skips its own gather.
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
    if slot_order_routes is not None:
        if top_k != 1 or a.shape[0] != sorted_ids.numel() or slot_order_routes < 0:
            raise ValueError(f"slot_order_routes: a must hold one row a routing slot ([{sorted_ids.numel()}, K]) with "
                             f"top_k 1 and a route count >= 0; got a {tuple(a.shape)}, top_k {top_k}, "
                             f"{slot_order_routes} routes")
        m = num_routes = slot_order_routes
    else:
        m = a.shape[0]
        num_routes = m * top_k
    if config is None:
        config = w4a16_indexed_config(num_routes, w.num_experts, w.n, w.k, block_m=block, gluon=gluon_capable(a, w))
    if config.block_m != block:
        raise ValueError(f"routing was built with block size {block}, config.block_m={config.block_m}")
    if slot_order_routes is not None and not config.pregather:
        raise ValueError(f"slot_order_routes: a in slot order needs the pre-gathered engine (config.pregather); "
                         f"this config ({config.engine}, tile {config.block_n}x{config.block_m}) gathers rows itself")
    if topk_weights is not None and (topk_weights.dtype != torch.float32 or topk_weights.numel() != num_routes):
        raise TypeError(f"topk_weights must be float32 [M, top_k] = [{m}, {top_k}], got {topk_weights.dtype} {tuple(topk_weights.shape)}")
    if out is None:
        out = torch.empty(num_routes, w.n, dtype=torch.bfloat16, device=a.device)
    elif out.dtype != torch.bfloat16 or tuple(out.shape) != (num_routes, w.n) or out.stride(1) != 1:
        raise ValueError(f"out must be bf16 [{num_routes}, {w.n}] contiguous along N, got {out.dtype} {tuple(out.shape)}")
    if config.split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {config.split_k}")
    if config.pregather and config.engine != "gluon_rs":
        raise ValueError(f"w4a16_indexed: pregather runs on the gluon_rs engine only, got engine={config.engine!r}")
    if config.engine in GLUON_ENGINES:
        _launch_gluon(a, w, sorted_ids, expert_ids, num_tokens_post_padded, top_k, topk_weights, out, config,
                      routing_ready, slot_order=slot_order_routes is not None)
        return out
    if config.engine != "triton":
        raise ValueError(f"w4a16_indexed: engine must be 'triton' or one of {GLUON_ENGINES}, got {config.engine!r}")
    config = avoid_miscompile(config, w.n)
    w4a16_indexed_launch(a, w, sorted_ids, expert_ids, num_tokens_post_padded, top_k, topk_weights, out,
                         block_m=config.block_m, block_n=config.block_n, swap_ab=config.swap_ab,
                         num_warps=config.num_warps, num_stages=config.num_stages, split_k=config.split_k)
    return out


def _launch_gluon(a, w, sorted_ids, expert_ids, ntpp, top_k, topk_weights, out, config: W4A16Config,
                  routing_ready: bool = False, slot_order: bool = False) -> None:
    """The Hopper Gluon kernels (`hopper`) for `config`: a CUDA sm_90 device, one of the engine's
    tiles. A one-step K on an N-loop tile runs the N-loop kernel, ``pregather`` the pre-gathered
    kernel, anything else the engine's main-loop kernel (``gluon``: dequantized weights through
    shared memory; ``gluon_rs`` / ``gluon_ws``: in registers)."""
    # Gluon is imported only when a Hopper engine is asked for
    from .hopper.indexed import w4a16_indexed_pregathered_launch, w4a16_indexed_sm90_launch
    from .hopper.nloop import w4a16_indexed_nloop_launch

    regs_a = config.engine in REGISTER_A_ENGINES
    tiles = indexed_engine_tiles(config.engine) + (PREGATHER_TILES if config.pregather else ())
    tile = (config.block_n, config.block_m, config.num_warps, config.num_stages)
    split = config.split_k
    if tile not in tiles or not config.swap_ab or (split != 1 and not rs_splits(config.engine, tile, w.k, split)):
        raise ValueError(f"w4a16_indexed: the {config.engine} engine runs the tiles (weight rows, routing block, warps, "
                         f"stages) in {tiles} with swap_ab, split-K only on gluon_rs into non-empty shares of "
                         f"K's 256-wide steps; got {tile}, split_k={split}, K={w.k}")
    require_sm90(a.device, "w4a16_indexed")
    if regs_a and not _rows_aligned(a):
        raise ValueError(f"w4a16_indexed: the gluon_rs engine gathers activation rows with 16-byte copies: a needs a "
                         f"16-byte aligned base and a row stride that is a multiple of 8 elements, got stride "
                         f"{a.stride(0)} (use engine='triton' or a contiguous copy)")
    if config.pregather and not pregather_ok(tile, w.k, split_k=split):
        raise ValueError(f"pregather: the register-A kernel's main loop (no warp specialization, no K shares, K past "
                         f"one step) on a tile of {PREGATHER_TILES}; got {tile}, split_k={split}, K={w.k}")
    if regs_a and runs_nloop(tile, w.k):
        n_tiles = nloop_n_tiles(config.block_m, out.shape[0], w.num_experts, w.n, config.block_n, num_sms(a.device))
        w4a16_indexed_nloop_launch(a, w, sorted_ids, expert_ids, ntpp, top_k, topk_weights, out, tile, n_tiles)
        return
    pdl = (2 if routing_ready else 1) if pdl_enabled(a.device) else 0
    if config.pregather:
        w4a16_indexed_pregathered_launch(a, w, sorted_ids, expert_ids, ntpp, top_k, topk_weights, out, tile, pdl,
                                         slot_order)
        return
    # split-K: FP32 shares, summed in a fixed order by the Triton kernel's reduction
    dst = out if split == 1 else torch.empty(split, out.shape[0], w.n, dtype=torch.float32, device=a.device)
    w4a16_indexed_sm90_launch(a, w, sorted_ids, expert_ids, ntpp, top_k, topk_weights, dst, tile, regs_a,
                              warp_specialize=config.engine == "gluon_ws", split_k=split, pdl=pdl)
    if split > 1:
        splitk_reduce(dst, out, sorted_ids, expert_ids, ntpp, config.block_m, _RS_REDUCE_BN)
