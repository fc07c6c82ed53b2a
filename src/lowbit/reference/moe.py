"""Pure-PyTorch FP32 references of the W4A16 MoE GEMM (three routing layouts) and a whole MoE block.

Expert weights ``w`` are either a `QuantizedTensor` (codes ``[E, N, K]``, e.g. INT4 group-32:
``W[e] = (q - 8) * s``) or a real tensor ``[E, N, K]``; either way the math is
``Y = A @ W[e]^T`` in FP32 on the BF16 activations, written as one matmul per expert.
Rows a layout does not write (sentinel slots, ``-1`` blocks, padding) are 0 in the result.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..formats import QuantizedTensor

__all__ = [
    "expert_weight",
    "w4a16_indexed_ref",
    "w4a16_contiguous_ref",
    "w4a16_masked_ref",
    "router_topk_ref",
    "moe_experts_ref",
    "moe_block_ref",
]

def expert_weight(w: QuantizedTensor | torch.Tensor, e: int) -> torch.Tensor:
    """FP32 ``[N, K]`` weight of expert `e`."""
    if isinstance(w, QuantizedTensor):
        return w.select(e).dequantize()
    return w[e].float()


def _out_features(w: QuantizedTensor | torch.Tensor) -> int:
    return (w.codes if isinstance(w, QuantizedTensor) else w).shape[1]


def _grouped_rows_matmul(a_rows: torch.Tensor, experts: torch.Tensor, w, n: int) -> torch.Tensor:
    """``out[i] = a_rows[i] @ W[experts[i]]^T`` in FP32 (one matmul per distinct expert)."""
    out = torch.zeros(a_rows.shape[0], n, dtype=torch.float32, device=a_rows.device)
    for e in torch.unique(experts).tolist():
        sel = experts == e
        out[sel] = a_rows[sel].float() @ expert_weight(w, e).to(a_rows.device).T
    return out


def w4a16_indexed_ref(
    a: torch.Tensor,
    w: QuantizedTensor | torch.Tensor,
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    top_k: int,
    topk_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Indexed (vLLM ``moe_align_block_size``) MoE GEMM.

    a: ``bf16 [M, K]``; w: experts ``[E, N, K]``; routing as `lowbit.routing.IndexedRouting`
    (block size = ``len(sorted_token_ids) // len(expert_ids)``); topk_weights ``fp32 [M, top_k]``.
    Returns ``fp32 [M * top_k, N]``::

        for block b < num_tokens_post_padded / block_size with e = expert_ids[b] >= 0:
            for id in sorted_token_ids[block b] with id < M * top_k:
                out[id] = a[id // top_k] @ W[e]^T  (* topk_weights.flatten()[id] if given)

    Every block before ``num_tokens_post_padded`` must hold a route (ValueError otherwise): the
    kernels launch no program past the route count (`lowbit.routing.live_block_bound`).
    """
    m = a.shape[0]
    num_routes = m * top_k
    block = sorted_token_ids.numel() // expert_ids.numel()
    used = int(num_tokens_post_padded.item())
    ids = sorted_token_ids[:used].long()
    experts = expert_ids[: used // block].long().repeat_interleave(block)
    empty = ((ids >= num_routes).view(-1, block).all(dim=1)).nonzero().flatten()
    if empty.numel():  # the kernels launch `routing.live_block_bound` programs: their grid relies on it
        raise ValueError(f"block {empty[0].item()} before num_tokens_post_padded holds no route: an expert with no "
                         "route must have no block (moe_align_block_size's layout)")
    valid = (ids < num_routes) & (experts >= 0)
    ids, experts = ids[valid], experts[valid]
    out = torch.zeros(num_routes, _out_features(w), dtype=torch.float32, device=a.device)
    y = _grouped_rows_matmul(a[ids // top_k], experts, w, out.shape[1])
    if topk_weights is not None:
        y = y * topk_weights.flatten()[ids].float().unsqueeze(1)
    out[ids] = y
    return out


def w4a16_contiguous_ref(a2: torch.Tensor, w: QuantizedTensor | torch.Tensor, m_indices: torch.Tensor) -> torch.Tensor:
    """Grouped-contiguous MoE GEMM (DeepGEMM ``m_grouped_*_contiguous``).

    a2: ``bf16 [m, K]``; m_indices: ``int32 [m]`` (expert of each row, ``-1`` = padding).
    Returns ``fp32 [m, N]``: ``out[r] = a2[r] @ W[m_indices[r]]^T``, 0 on padding rows."""
    valid = m_indices >= 0
    out = torch.zeros(a2.shape[0], _out_features(w), dtype=torch.float32, device=a2.device)
    out[valid] = _grouped_rows_matmul(a2[valid], m_indices[valid].long(), w, out.shape[1])
    return out


def w4a16_masked_ref(a3: torch.Tensor, w: QuantizedTensor | torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
    """Grouped-masked MoE GEMM (DeepGEMM ``m_grouped_*_masked``).

    a3: ``bf16 [G, max_m, K]`` or flat ``[G * max_m, K]``; masked_m: ``int32 [G]``.
    Returns flat ``fp32 [G * max_m, N]``: rows ``g*max_m + i`` for ``i < masked_m[g]`` hold
    ``a3[g, i] @ W[g]^T``; the other rows are 0 (garbage by the kernels' contract)."""
    g = masked_m.shape[0]
    a3 = a3.reshape(g, -1, a3.shape[-1])
    max_m = a3.shape[1]
    out = torch.zeros(g, max_m, _out_features(w), dtype=torch.float32, device=a3.device)
    for e, n in enumerate(masked_m.tolist()):
        if n > 0:
            out[e, :n] = a3[e, :n].float() @ expert_weight(w, e).to(a3.device).T
    return out.reshape(g * max_m, -1)


def router_topk_ref(router_logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax router: ``p = softmax(logits)`` in FP32, the `top_k` largest per token,
    renormalized to sum to 1 if asked. logits ``[T, E]`` -> (topk_weights ``fp32 [T, top_k]``,
    topk_ids ``int32 [T, top_k]``)."""
    p = router_logits.float().softmax(dim=-1)
    w, ids = p.topk(top_k, dim=-1)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return w, ids.to(torch.int32)


def moe_experts_ref(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: QuantizedTensor | torch.Tensor,
    w2: QuantizedTensor | torch.Tensor,
    *,
    round_intermediate: bool = False,
) -> torch.Tensor:
    """The expert part of a MoE block, in FP32::

        for each token t, slot j with e = topk_ids[t, j] >= 0:
            g, u = split(hidden[t] @ W13[e]^T)            # W13 = [gate; up], [E, 2I, H]
            out[t] += topk_weights[t, j] * (SiLU(g) * u) @ W2[e]^T   # W2 [E, H, I]

    hidden ``bf16 [T, H]``; topk_ids ``int32 [T, k]``; topk_weights ``fp32 [T, k]`` (not
    renormalized here). `round_intermediate` rounds the SiLU*up activation to BF16, as a
    kernel pipeline that stores it in BF16 does. Returns ``fp32 [T, H]``."""
    t, k = topk_ids.shape
    flat = topk_ids.flatten().long()
    valid = flat >= 0
    routes = torch.nonzero(valid).flatten()
    experts = flat[routes]
    x = hidden[routes // k]
    gu = _grouped_rows_matmul(x, experts, w13, _out_features(w13))
    inter = gu.shape[1] // 2
    act = F.silu(gu[:, :inter]) * gu[:, inter:]
    if round_intermediate:
        act = act.to(torch.bfloat16).float()
    y = _grouped_rows_matmul(act, experts, w2, _out_features(w2))
    y = y * topk_weights.flatten()[routes].float().unsqueeze(1)
    out = torch.zeros(t, y.shape[1], dtype=torch.float32, device=hidden.device)
    out.index_add_(0, routes // k, y)
    return out


def moe_block_ref(
    hidden: torch.Tensor,
    router_logits: torch.Tensor,
    w13: QuantizedTensor | torch.Tensor,
    w2: QuantizedTensor | torch.Tensor,
    top_k: int,
    *,
    renormalize: bool = True,
    round_intermediate: bool = False,
) -> torch.Tensor:
    """A whole MoE block: router top-k -> gate_up -> SiLU(gate) * up -> down -> weighted combine.
    hidden ``bf16 [T, H]``, router_logits ``[T, E]`` -> ``fp32 [T, H]``."""
    topk_weights, topk_ids = router_topk_ref(router_logits, top_k, renormalize)
    return moe_experts_ref(hidden, topk_ids, topk_weights, w13, w2, round_intermediate=round_intermediate)
