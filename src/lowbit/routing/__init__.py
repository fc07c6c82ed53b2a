"""MoE routing layouts (SPEC section 2): builders from ``topk_ids`` and the inverse maps.

    moe_align_block_size(topk_ids, block_size, num_experts, expert_map=None) -> IndexedRouting
    build_contiguous(topk_ids, num_experts, expert_map=None, alignment=128) -> ContiguousRouting
    build_masked(topk_ids, num_experts, max_m, expert_map=None) -> MaskedRouting
    gather_rows(hidden, row_to_route, top_k)            -> activations in layout order
    combine_routes(y, route_to_row, topk_weights)        -> [T, N] weighted sum over each token's routes

``backend``: ``"triton"`` (device kernels, no host readback, CUDA-graph capturable),
``"torch"`` (the reference in `lowbit.reference.routing`), or ``"auto"`` (triton on CUDA
tensors and under the Triton interpreter, torch otherwise). Both give identical tensors.
"""

from __future__ import annotations

import torch

from ..runtime.env import interpreter_active
from .layouts import (
    CONTIGUOUS_ALIGNMENT,
    ContiguousRouting,
    IndexedRouting,
    MaskedRouting,
    check_expert_map,
    check_topk_ids,
    check_topk_routing,
    live_block_bound,
    max_contiguous_rows,
    max_num_tokens_padded,
)

__all__ = [
    "IndexedRouting",
    "ContiguousRouting",
    "MaskedRouting",
    "moe_align_block_size",
    "build_contiguous",
    "build_masked",
    "gather_rows",
    "combine_routes",
    "max_num_tokens_padded",
    "live_block_bound",
    "max_contiguous_rows",
    "check_topk_routing",
    "CONTIGUOUS_ALIGNMENT",
]


def _use_triton(backend: str, t: torch.Tensor) -> bool:
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    if backend == "auto":
        return t.is_cuda or interpreter_active()
    if backend == "triton" and not (t.is_cuda or interpreter_active()):
        raise ValueError("backend='triton' needs CUDA tensors or TRITON_INTERPRET=1")
    return backend == "triton"


def _check_positive(name: str, v: int) -> None:
    if not isinstance(v, int) or v < 1:
        raise ValueError(f"{name} must be a positive int, got {v!r}")


def _num_local(num_experts: int, expert_map: torch.Tensor | None, num_local_experts: int | None) -> int:
    if num_local_experts is not None:
        _check_positive("num_local_experts", num_local_experts)
        return num_local_experts
    if expert_map is None:
        return num_experts
    # a host read of a static config tensor: pass num_local_experts to avoid it in graphs
    return int(expert_map.max().item()) + 1


def moe_align_block_size(
    topk_ids: torch.Tensor,
    block_size: int,
    num_experts: int,
    expert_map: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> IndexedRouting:
    """vLLM's ``moe_align_block_size`` contract (see `IndexedRouting`).

    topk_ids: ``int32 [T, top_k]`` global expert ids (``-1`` = dropped route).
    block_size: rows per block of the indexed GEMM (its M tile).
    num_experts: global expert count; expert_map: optional ``int32 [num_experts]`` -> local id / -1.
    Returns over-allocated buffers sized `max_num_tokens_padded(T*top_k, num_experts, block_size)`
    and the device-side count ``num_tokens_post_padded``.
    """
    check_topk_ids(topk_ids)
    _check_positive("block_size", block_size)
    _check_positive("num_experts", num_experts)
    check_expert_map(expert_map, num_experts, topk_ids.device)
    if _use_triton(backend, topk_ids):
        from .kernels import moe_align_block_size_triton

        return moe_align_block_size_triton(topk_ids.contiguous(), block_size, num_experts, expert_map)
    from ..reference.routing import moe_align_block_size_ref

    return moe_align_block_size_ref(topk_ids, block_size, num_experts, expert_map)


def build_contiguous(
    topk_ids: torch.Tensor,
    num_experts: int,
    expert_map: torch.Tensor | None = None,
    *,
    alignment: int = CONTIGUOUS_ALIGNMENT,
    num_local_experts: int | None = None,
    backend: str = "auto",
) -> ContiguousRouting:
    """Grouped-contiguous layout (see `ContiguousRouting`): local routes as rows grouped by
    expert, each segment padded to `alignment` rows, ``m_indices = -1`` on padding rows.
    Buffers are sized `max_contiguous_rows(T*top_k, G, alignment)`; ``num_rows`` is on the device."""
    check_topk_ids(topk_ids)
    _check_positive("num_experts", num_experts)
    _check_positive("alignment", alignment)
    check_expert_map(expert_map, num_experts, topk_ids.device)
    g = _num_local(num_experts, expert_map, num_local_experts)
    if _use_triton(backend, topk_ids):
        from .kernels import build_contiguous_triton

        return build_contiguous_triton(topk_ids.contiguous(), num_experts, g, expert_map, alignment)
    from ..reference.routing import build_contiguous_ref

    return build_contiguous_ref(topk_ids, num_experts, g, expert_map, alignment)


def build_masked(
    topk_ids: torch.Tensor,
    num_experts: int,
    max_m: int,
    expert_map: torch.Tensor | None = None,
    *,
    num_local_experts: int | None = None,
    backend: str = "auto",
) -> MaskedRouting:
    """Grouped-masked layout (see `MaskedRouting`): local expert ``g`` gets rows
    ``[g*max_m, g*max_m + masked_m[g])``. The torch backend raises if an expert has more than
    `max_m` routes; the device backend drops them and counts ``num_dropped``."""
    check_topk_ids(topk_ids)
    _check_positive("num_experts", num_experts)
    _check_positive("max_m", max_m)
    check_expert_map(expert_map, num_experts, topk_ids.device)
    g = _num_local(num_experts, expert_map, num_local_experts)
    if _use_triton(backend, topk_ids):
        from .kernels import build_masked_triton

        return build_masked_triton(topk_ids.contiguous(), num_experts, g, max_m, expert_map)
    from ..reference.routing import build_masked_ref

    return build_masked_ref(topk_ids, num_experts, g, max_m, expert_map)


def gather_rows(hidden: torch.Tensor, row_to_route: torch.Tensor, top_k: int) -> torch.Tensor:
    """Activations in layout order: row ``r`` = ``hidden[row_to_route[r] // top_k]``, zeros
    where ``row_to_route[r] = -1``. hidden ``[T, K]``, row_to_route ``int32 [rows]`` -> ``[rows, K]``."""
    if row_to_route.dtype != torch.int32 or row_to_route.dim() != 1:
        raise TypeError(f"row_to_route must be int32 [rows], got {row_to_route.dtype} {tuple(row_to_route.shape)}")
    if hidden.dim() != 2:
        raise ValueError(f"hidden must be [T, K], got {tuple(hidden.shape)}")
    valid = row_to_route >= 0
    src = torch.where(valid, row_to_route // top_k, 0).long()
    return hidden[src] * valid.unsqueeze(1).to(hidden.dtype)


def combine_routes(y: torch.Tensor, route_to_row: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """Weighted combine of per-route results back to tokens, in FP32:
    ``out[t] = sum_j topk_weights[t, j] * y[route_to_row[t*top_k + j]]`` over routes with a row
    (``route_to_row >= 0``). y ``[rows, N]``; topk_weights ``float32 [T, top_k]`` -> ``float32 [T, N]``.
    For the indexed layout, whose output row *is* the route id, pass ``route_to_row = arange(T*top_k)``."""
    if topk_weights.dim() != 2:
        raise ValueError(f"topk_weights must be [T, top_k], got {tuple(topk_weights.shape)}")
    t, k = topk_weights.shape
    if route_to_row.dtype != torch.int32 or route_to_row.shape != (t * k,):
        raise TypeError(f"route_to_row must be int32 [{t * k}], got {route_to_row.dtype} {tuple(route_to_row.shape)}")
    valid = (route_to_row >= 0).view(t, k)
    rows = y.float()[torch.where(route_to_row >= 0, route_to_row, 0).long()].view(t, k, -1)
    w = topk_weights.float() * valid
    return (rows * w.unsqueeze(-1)).sum(1)
