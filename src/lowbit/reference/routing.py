"""PyTorch reference of the routing builders (ground truth for `lowbit.routing.kernels`).

Written as plain loops over experts for clarity. Semantics shared with the device builders:
routes are sorted stably by global expert id (inside an expert, by flat route id
``t * top_k + j``); ``-1`` and out-of-range ids are dropped routes; the output tensors have the
same over-allocated sizes as the device builders' (see `lowbit.routing.layouts`).
"""

from __future__ import annotations

import torch

from ..routing.layouts import (
    ContiguousRouting,
    IndexedRouting,
    MaskedRouting,
    max_contiguous_rows,
    max_num_tokens_padded,
)

__all__ = ["moe_align_block_size_ref", "build_contiguous_ref", "build_masked_ref", "routes_by_expert"]


def routes_by_expert(topk_ids: torch.Tensor, num_experts: int) -> list[torch.Tensor]:
    """For each global expert ``e``, the flat route ids routed to it, ascending (int64, CPU)."""
    flat = topk_ids.flatten().cpu().long()
    return [torch.nonzero(flat == e).flatten() for e in range(num_experts)]


def _local_ids(expert_map: torch.Tensor | None, num_experts: int) -> list[int]:
    return list(range(num_experts)) if expert_map is None else expert_map.cpu().tolist()


def moe_align_block_size_ref(
    topk_ids: torch.Tensor, block_size: int, num_experts: int, expert_map: torch.Tensor | None = None
) -> IndexedRouting:
    """vLLM's ``moe_align_block_size``: see `IndexedRouting`.

    for e in 0..num_experts-1 (global order):
        routes(e) -> sorted_token_ids, padded with the sentinel T*top_k to a multiple of block_size
        one expert_ids entry per block: expert_map[e] (or e), -1 if not local
    """
    num_routes = topk_ids.numel()
    size = max_num_tokens_padded(num_routes, num_experts, block_size)
    sorted_ids = torch.full((size,), num_routes, dtype=torch.int32)
    expert_ids = torch.full((size // block_size,), -1, dtype=torch.int32)
    local = _local_ids(expert_map, num_experts)
    pos = 0
    for e, routes in enumerate(routes_by_expert(topk_ids, num_experts)):
        n = routes.numel()
        if n == 0:
            continue
        sorted_ids[pos : pos + n] = routes.to(torch.int32)
        padded = -(-n // block_size) * block_size
        expert_ids[pos // block_size : (pos + padded) // block_size] = local[e]
        pos += padded
    dev = topk_ids.device
    return IndexedRouting(
        sorted_token_ids=sorted_ids.to(dev),
        expert_ids=expert_ids.to(dev),
        num_tokens_post_padded=torch.tensor([pos], dtype=torch.int32, device=dev),
        block_size=block_size,
        num_tokens=topk_ids.shape[0],
        top_k=topk_ids.shape[1],
    )


def build_contiguous_ref(
    topk_ids: torch.Tensor,
    num_experts: int,
    num_local_experts: int,
    expert_map: torch.Tensor | None = None,
    alignment: int = 128,
) -> ContiguousRouting:
    """Grouped-contiguous layout: for each local expert (in global id order) its routes as
    consecutive rows, the segment padded with ``m_indices = -1`` rows to a multiple of
    `alignment`; experts with no routes take no rows."""
    num_routes = topk_ids.numel()
    size = max_contiguous_rows(num_routes, num_local_experts, alignment)
    m_indices = torch.full((size,), -1, dtype=torch.int32)
    row_to_route = torch.full((size,), -1, dtype=torch.int32)
    route_to_row = torch.full((num_routes,), -1, dtype=torch.int32)
    local = _local_ids(expert_map, num_experts)
    row = 0
    for e, routes in enumerate(routes_by_expert(topk_ids, num_experts)):
        n = routes.numel()
        if n == 0 or local[e] < 0:
            continue
        m_indices[row : row + n] = local[e]
        row_to_route[row : row + n] = routes.to(torch.int32)
        route_to_row[routes] = torch.arange(row, row + n, dtype=torch.int32)
        row += -(-n // alignment) * alignment
    dev = topk_ids.device
    return ContiguousRouting(
        m_indices=m_indices.to(dev),
        row_to_route=row_to_route.to(dev),
        route_to_row=route_to_row.to(dev),
        num_rows=torch.tensor([row], dtype=torch.int32, device=dev),
        alignment=alignment,
        num_tokens=topk_ids.shape[0],
        top_k=topk_ids.shape[1],
    )


def build_masked_ref(
    topk_ids: torch.Tensor,
    num_experts: int,
    num_local_experts: int,
    max_m: int,
    expert_map: torch.Tensor | None = None,
) -> MaskedRouting:
    """Grouped-masked layout: local expert ``g``'s routes fill rows ``g*max_m ...`` in order;
    ``masked_m[g]`` counts them. More than `max_m` routes on one expert raises ValueError
    (the device builder drops them and counts ``num_dropped`` instead)."""
    num_routes = topk_ids.numel()
    masked_m = torch.zeros(num_local_experts, dtype=torch.int32)
    row_to_route = torch.full((num_local_experts * max_m,), -1, dtype=torch.int32)
    route_to_row = torch.full((num_routes,), -1, dtype=torch.int32)
    local = _local_ids(expert_map, num_experts)
    for e, routes in enumerate(routes_by_expert(topk_ids, num_experts)):
        g, n = local[e], routes.numel()
        if n == 0 or g < 0:
            continue
        if n > max_m:
            raise ValueError(f"expert {e} (local {g}) has {n} routes > max_m={max_m}")
        masked_m[g] = n
        rows = torch.arange(g * max_m, g * max_m + n, dtype=torch.int32)
        row_to_route[rows.long()] = routes.to(torch.int32)
        route_to_row[routes] = rows
    dev = topk_ids.device
    return MaskedRouting(
        masked_m=masked_m.to(dev),
        row_to_route=row_to_route.to(dev),
        route_to_row=route_to_row.to(dev),
        num_dropped=torch.zeros(1, dtype=torch.int32, device=dev),
        max_m=max_m,
        num_tokens=topk_ids.shape[0],
        top_k=topk_ids.shape[1],
    )
