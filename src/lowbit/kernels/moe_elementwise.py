"""The elementwise steps of an expert-centric MoE layer, between and after its two GEMMs:

- `silu_mul(gu)`: ``bf16(SiLU(gate) * up)`` of the gate_up GEMM's rows ``[R, 2I]`` (gate
  columns first, then up, as ``w13 = [gate; up]``), FP32 math, one rounding.
- `combine_topk(y, topk_ids, topk_weights)`: each token's routes folded back,
  ``out[t] = bf16(sum_j w[t, j] * y[t * k + j])`` over the slots with ``0 <= topk_ids[t, j] <
  E``, in FP32. Rows of dropped slots are never read (the indexed GEMM leaves them unwritten).

Why kernels and not torch ops: in torch the two steps are five to seven launches with FP32
temporaries (``silu``, ``mul``, casts; a broadcast multiply, a masked sum), which a decode
layer of two GEMMs pays in full. Each is one launch here, reading its input once.

Grid: one program per (row, block of columns); the column block is a power of two up to
`BLOCK` wide, 4 warps. Both run under the Triton interpreter (the CPU tier).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..routing.kernels import gather_indexed_rows
from ..routing.layouts import IndexedRouting
from ..runtime import numerics
from ..runtime.pdl import launch_options, pdl_enabled, release_next, wait_prior
from .compile_tier import KernelConfig

__all__ = ["silu_mul", "combine_topk"]

#: Columns a program handles (16-byte bf16 vectors across 4 warps x 32 lanes x 8 = 1024).
BLOCK = 1024


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, I, stride_g, stride_o, BLOCK_I: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # nothing is read before the wait: the next kernel may start at once (`pdl`)
        release_next()
        wait_prior()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    ok = cols < I
    g = tl.load(gu_ptr + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_g + I + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, numerics.to_bf16(numerics.silu_mul(g, u)), mask=ok)


@triton.jit
def _combine_topk_kernel(y_ptr, ids_ptr, w_ptr, out_ptr, N, TOP_K, E, stride_y, stride_o,
                         BLOCK_N: tl.constexpr, K_PAD: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:  # as `_silu_mul_kernel`
        release_next()
        wait_prior()
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < N
    # all k rows in one [K_PAD, BLOCK_N] load: at decode the layer waits on this kernel, and k
    # dependent id -> row round trips (a loop with a branch a slot) cost microseconds
    j = tl.arange(0, K_PAD)
    route = t * TOP_K + j
    e = tl.load(ids_ptr + route, mask=j < TOP_K, other=-1)
    live = (e >= 0) & (e < E)  # a dropped slot's row was never written: masked, not read
    w = tl.load(w_ptr + route, mask=live, other=0.0)
    y = tl.load(y_ptr + route[:, None] * stride_y + cols[None, :], mask=live[:, None] & ok[None, :], other=0.0)
    acc = tl.sum(w[:, None] * y.to(tl.float32), axis=0)
    tl.store(out_ptr + t * stride_o + cols, numerics.to_bf16(acc), mask=ok)


def _block(n: int) -> int:
    return min(BLOCK, max(16, triton.next_power_of_2(n)))


def _combine_block(n: int, k_pad: int) -> int:
    """`combine_topk`'s column block: its ``[k_pad, block]`` tile stays within 8 x `BLOCK`
    elements (64 FP32 values a thread at 4 warps)."""
    return min(_block(n), max(16, 8 * BLOCK // k_pad))


def _out_rows(out: torch.Tensor | None, rows: int, cols: int, device: torch.device, what: str) -> torch.Tensor:
    """`out`, or a new ``bf16 [rows, cols]``, checked (contiguous along `what`, the columns)."""
    if out is None:
        return torch.empty(rows, cols, dtype=torch.bfloat16, device=device)
    if out.dtype != torch.bfloat16 or tuple(out.shape) != (rows, cols) or out.stride(1) != 1 or out.device != device:
        raise ValueError(f"out must be bf16 [{rows}, {cols}] on {device}, contiguous along {what}; got {out.dtype} "
                         f"{tuple(out.shape)}")
    return out


def silu_mul(gu: torch.Tensor, *, out: torch.Tensor | None = None, routing: IndexedRouting | None = None) -> torch.Tensor:
    """``bf16(SiLU(gu[:, :I]) * gu[:, I:])`` in FP32. gu ``bf16 [R, 2I]`` (contiguous along the
    columns); out optional ``bf16 [R, I]``. Returns ``bf16 [R, I]``.

    With `routing` (the down projection's `IndexedRouting`, its routes = gu's rows, top_k 1):
    the rows in that routing's slot order instead, ``out[s] = SiLU * up of gu[sorted_token_ids[s]]``
    for the route slots of live blocks (``bf16 [P, I]``, P = ``sorted_token_ids.numel()``; other
    rows unspecified): the input of `w4a16_indexed(..., slot_order_routes=R)`, whose pre-gathered
    engine then skips its own gather (`lowbit.routing.kernels.gather_indexed_rows`, one pass for
    both)."""
    if not isinstance(gu, torch.Tensor) or gu.dtype != torch.bfloat16 or gu.dim() != 2:
        raise TypeError(f"gu must be bf16 [R, 2I], got {getattr(gu, 'dtype', type(gu).__name__)} "
                        f"{tuple(getattr(gu, 'shape', ()))}")
    r, two_i = gu.shape
    if two_i % 2:
        raise ValueError(f"gu has {two_i} columns: must be 2*I (gate, then up)")
    if gu.stride(1) != 1:
        raise ValueError("gu must be contiguous along its columns")
    inter = two_i // 2
    if routing is not None:
        if routing.num_routes != r:
            raise ValueError(f"routing has {routing.num_routes} routes, gu has {r} rows (the down projection's "
                             f"routing: one route a gate_up row)")
        p = routing.sorted_token_ids.numel()
        out = _out_rows(out, p, inter, gu.device, "I")
        if r and inter:
            gather_indexed_rows(gu, routing.sorted_token_ids, routing.expert_ids, routing.num_tokens_post_padded, 1,
                                out, silu_mul=True)
        return out
    out = _out_rows(out, r, inter, gu.device, "I")
    if r and inter:
        b = _block(inter)
        pdl = pdl_enabled(gu.device)
        _silu_mul_kernel[(r, triton.cdiv(inter, b))](gu, out, inter, gu.stride(0), out.stride(0), BLOCK_I=b, PDL=pdl,
                                                      num_warps=4, **launch_options(pdl))
    return out


def combine_topk(y: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int, *,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Fold each token's routes: ``out[t] = sum_j topk_weights[t, j] * y[t * k + j]`` over the
    slots with ``0 <= topk_ids[t, j] < num_experts`` (the routes the routing kept), FP32 sums,
    one bf16 rounding. y ``bf16 [T * k, N]`` (the indexed GEMM's output: row = route); topk_ids
    ``int32 [T, k]``; topk_weights ``float32 [T, k]`` (applied as given); out optional
    ``bf16 [T, N]``. Returns ``bf16 [T, N]`` (a token with no valid slot gets zeros)."""
    if not isinstance(y, torch.Tensor) or y.dtype != torch.bfloat16 or y.dim() != 2:
        raise TypeError(f"y must be bf16 [T*k, N], got {getattr(y, 'dtype', type(y).__name__)} "
                        f"{tuple(getattr(y, 'shape', ()))}")
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype != torch.int32 or topk_ids.dim() != 2:
        raise TypeError("topk_ids must be int32 [T, k]")
    if not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32:
        raise TypeError("topk_weights must be float32 [T, k]")
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    t, k = topk_ids.shape
    if tuple(topk_weights.shape) != (t, k):
        raise ValueError(f"topk_weights {tuple(topk_weights.shape)} must match topk_ids {tuple(topk_ids.shape)}")
    if y.shape[0] != t * k:
        raise ValueError(f"y has {y.shape[0]} rows, expected T*k = {t * k}")
    for name, x in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if not x.is_contiguous() or x.device != y.device:
            raise ValueError(f"{name} must be contiguous and on {y.device}")
    if y.stride(1) != 1:
        raise ValueError("y must be contiguous along N")
    n = y.shape[1]
    out = _out_rows(out, t, n, y.device, "N")
    if t and n:
        k_pad = triton.next_power_of_2(k)
        b = _combine_block(n, k_pad)
        pdl = pdl_enabled(y.device)
        _combine_topk_kernel[(t, triton.cdiv(n, b))](y, topk_ids, topk_weights, out, n, k, num_experts, y.stride(0),
                                                     out.stride(0), BLOCK_N=b, K_PAD=k_pad, PDL=pdl, num_warps=4,
                                                     **launch_options(pdl))
    return out


def compile_configs() -> list[KernelConfig]:
    """Both kernels at the Kimi K2.x widths (SiLU over I = 2048, combine over H = 7168), for
    the compile tier."""
    pdl_ptx = ("griddepcontrol.wait", "griddepcontrol.launch_dependents")
    return [cfg for pdl in (False, True) for cfg in (
        KernelConfig(f"moe_silu_mul[I=2048,PDL={int(pdl)}]", _silu_mul_kernel,
                     {"gu_ptr": "*bf16", "out_ptr": "*bf16", "I": "i32", "stride_g": "i32", "stride_o": "i32",
                      "BLOCK_I": "constexpr", "PDL": "constexpr"}, {"BLOCK_I": _block(2048), "PDL": pdl}, num_warps=4,
                     expect_ptx=pdl_ptx if pdl else ()),
        KernelConfig(f"moe_combine_topk[H=7168,PDL={int(pdl)}]", _combine_topk_kernel,
                     {"y_ptr": "*bf16", "ids_ptr": "*i32", "w_ptr": "*fp32", "out_ptr": "*bf16", "N": "i32",
                      "TOP_K": "i32", "E": "i32", "stride_y": "i32", "stride_o": "i32", "BLOCK_N": "constexpr",
                      "K_PAD": "constexpr", "PDL": "constexpr"},
                     {"BLOCK_N": _combine_block(7168, 8), "K_PAD": 8, "PDL": pdl}, num_warps=4, unaligned=("TOP_K", "E"),
                     expect_ptx=pdl_ptx if pdl else ()),
    )]
