"""The three MoE routing layouts (SPEC section 2) as typed results, and their size rules.

All builders take ``topk_ids int32 [T, top_k]`` (global expert ids; ``-1`` = a dropped route)
and sort routes *stably* by expert: inside an expert, routes keep their flat order
``t * top_k + j``. Both backends (PyTorch reference, Triton kernels) produce identical
tensors, of the same over-allocated sizes, so that nothing depends on a host readback and
everything can be captured in a CUDA graph.

Expert parallelism: ``expert_map int32 [num_experts]`` maps a global expert to its local id,
``-1`` when the expert lives on another rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "IndexedRouting",
    "ContiguousRouting",
    "MaskedRouting",
    "max_num_tokens_padded",
    "live_block_bound",
    "max_contiguous_rows",
    "check_topk_ids",
    "check_topk_routing",
    "check_expert_map",
    "CONTIGUOUS_ALIGNMENT",
]

#: DeepGEMM's M alignment for grouped contiguous layouts.
CONTIGUOUS_ALIGNMENT = 128


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def max_num_tokens_padded(num_routes: int, num_experts: int, block_size: int) -> int:
    """Size of ``sorted_token_ids`` (vLLM's rule, rounded up to whole blocks): every expert
    can waste at most ``block_size - 1`` padding slots."""
    return _cdiv(num_routes + num_experts * (block_size - 1), block_size) * block_size


def live_block_bound(num_blocks: int, num_routes: int) -> int:
    """The row-block programs an indexed kernel launches for a routing of `num_blocks` blocks
    (``expert_ids.numel()``) and `num_routes` routes: ``min(num_blocks, num_routes)``. Every
    block before ``num_tokens_post_padded`` holds a route (`IndexedRouting`'s contract, checked
    by `lowbit.reference.w4a16_indexed_ref`), so no live block lies past it, while at decode the
    over-allocated count is far higher (Kimi EP8, one token: 8 routes, 43 blocks).

    Why not a program a block: each program past the live blocks is still scheduled, reads the
    count and exits, thousands of them at decode (H200, 2026-12-01, 838560c, the bench's draws: one token
    gate_up + down 74.0 -> 69.5 us; from four tokens on, where the bound is the allocated count
    or near it, 1.00x).
    A loop over the blocks inside the kernels, which would not need the contract, raised the
    register-A tiles' registers (the one-token tile 113 -> 153: a CTA an SM fewer; compile
    tier)."""
    return max(1, min(num_blocks, num_routes))


def max_contiguous_rows(num_routes: int, num_local_experts: int, alignment: int = CONTIGUOUS_ALIGNMENT) -> int:
    """Rows of an over-allocated contiguous layout: all routes local, each expert's segment
    padded to `alignment`."""
    return _cdiv(num_routes + num_local_experts * (alignment - 1), alignment) * alignment


@dataclass
class IndexedRouting:
    """vLLM ``moe_align_block_size`` layout.

    sorted_token_ids: ``int32 [max_num_tokens_padded]``: flat route ids ``t*top_k + j`` grouped
        by expert (global id order, stable inside an expert), each expert padded to a multiple
        of `block_size` with the sentinel ``num_routes = T * top_k``; also sentinel past
        ``num_tokens_post_padded``.
    expert_ids: ``int32 [max_num_tokens_padded // block_size]``: the (local) expert of each
        block; ``-1`` for blocks of experts not on this rank and for blocks past the end.
    num_tokens_post_padded: ``int32 [1]`` on the device: the padded route count (blocks past it
        are not to be read).

    Every block before ``num_tokens_post_padded`` holds at least one route (an expert with no
    route has no block, as in vLLM's kernel): the indexed kernels launch `live_block_bound`
    row-block programs, not one a block of the over-allocated buffer.
    """

    sorted_token_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_tokens_post_padded: torch.Tensor
    block_size: int
    num_tokens: int
    top_k: int

    @property
    def num_routes(self) -> int:
        return self.num_tokens * self.top_k


@dataclass
class ContiguousRouting:
    """DeepGEMM grouped-contiguous layout (prefill).

    m_indices: ``int32 [m]``: local expert of each row, ``-1`` on padding rows (each expert's
        segment padded to `alignment` rows; the tail of the over-allocated buffer is padding).
    row_to_route: ``int32 [m]``: the flat route id ``t*top_k + j`` that row holds, ``-1`` on padding.
    route_to_row: ``int32 [T*top_k]``: the row of each route, ``-1`` if it is not on this rank.
    num_rows: ``int32 [1]`` on the device: rows up to the end of the last segment.
    """

    m_indices: torch.Tensor
    row_to_route: torch.Tensor
    route_to_row: torch.Tensor
    num_rows: torch.Tensor
    alignment: int
    num_tokens: int
    top_k: int


@dataclass
class MaskedRouting:
    """DeepGEMM grouped-masked layout (decode).

    masked_m: ``int32 [G]``: valid rows of each local expert (at most `max_m`).
    row_to_route: ``int32 [G * max_m]``: flat route id of row ``g * max_m + i``, ``-1`` past
        ``masked_m[g]``.
    route_to_row: ``int32 [T*top_k]``: row of each route, ``-1`` if not local or dropped.
    num_dropped: ``int32 [1]``: routes that did not fit in `max_m` (must be 0 for a correct
        layer; the device builder cannot raise without a host sync, so check it off the hot path).
    """

    masked_m: torch.Tensor
    row_to_route: torch.Tensor
    route_to_row: torch.Tensor
    num_dropped: torch.Tensor
    max_m: int
    num_tokens: int
    top_k: int

    @property
    def num_groups(self) -> int:
        return self.masked_m.shape[0]


def check_topk_ids(topk_ids: torch.Tensor) -> None:
    """``topk_ids`` must be ``int32 [T, top_k]``."""
    if not isinstance(topk_ids, torch.Tensor):
        raise TypeError(f"topk_ids must be a torch.Tensor, got {type(topk_ids).__name__}")
    if topk_ids.dtype != torch.int32:
        raise TypeError(f"topk_ids must be int32 [T, top_k], got {topk_ids.dtype} (use .to(torch.int32))")
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be 2-D [T, top_k], got shape {tuple(topk_ids.shape)}")
    if topk_ids.shape[1] < 1:
        raise ValueError(f"topk_ids needs top_k >= 1, got shape {tuple(topk_ids.shape)}")


def check_topk_routing(topk_ids: torch.Tensor, topk_weights: torch.Tensor | None, num_tokens: int,
                       device: torch.device) -> int:
    """Check a MoE block's routing against its activations and return ``top_k``.

    topk_ids: ``int32 [num_tokens, top_k]``, contiguous, on `device`; topk_weights: ``float32``
    of the same shape, contiguous, on `device`, or None (not checked: a stage that reads no
    weights). TypeError for a wrong type or dtype, ValueError for a wrong shape, layout or device.
    """
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype != torch.int32 or topk_ids.dim() != 2:
        raise TypeError(f"topk_ids must be int32 [M, k], got {getattr(topk_ids, 'dtype', type(topk_ids).__name__)} "
                        f"{tuple(getattr(topk_ids, 'shape', ()))}")
    if topk_ids.shape[0] != num_tokens:
        raise ValueError(f"topk_ids has {topk_ids.shape[0]} rows, the activations have M={num_tokens}")
    top_k = topk_ids.shape[1]
    if top_k < 1:
        raise ValueError("topk_ids must have at least one slot per token")
    if not topk_ids.is_contiguous():
        raise ValueError("topk_ids must be contiguous")
    if topk_ids.device != device:
        raise ValueError(f"topk_ids is on {topk_ids.device}, the activations on {device}")
    if topk_weights is not None:
        if not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32:
            raise TypeError("topk_weights must be float32 [M, k], got "
                            f"{getattr(topk_weights, 'dtype', type(topk_weights).__name__)}")
        if tuple(topk_weights.shape) != tuple(topk_ids.shape):
            raise ValueError(f"topk_weights {tuple(topk_weights.shape)} must match topk_ids {tuple(topk_ids.shape)}")
        if not topk_weights.is_contiguous() or topk_weights.device != device:
            raise ValueError(f"topk_weights must be contiguous and on {device}")
    return top_k


def check_expert_map(expert_map: torch.Tensor | None, num_experts: int, device: torch.device) -> None:
    if expert_map is None:
        return
    if expert_map.dtype != torch.int32 or expert_map.dim() != 1 or expert_map.shape[0] != num_experts:
        raise ValueError(
            f"expert_map must be int32 [{num_experts}] (global -> local id or -1), got "
            f"{expert_map.dtype} {tuple(expert_map.shape)}"
        )
    if expert_map.device != device:
        raise ValueError(f"expert_map is on {expert_map.device}, topk_ids on {device}")
