"""The expert part of a MoE block on one set of prepared weights, routed to the faster of
lowbit's two paths for the batch (reference: `lowbit.reference.moe_experts_ref(...,
round_intermediate=True)`)::

    out[t] = sum_j topk_weights[t, j] * (SiLU(g) * u) @ W2[e]^T,  (g, u) = hidden[t] @ W13[e]^T,
    e = topk_ids[t, j] in [0, E) (``-1`` or an id >= E: a dropped slot, e.g. an expert on
    another EP rank)

Paths:

- ``"output_centric"``: `lowbit.kernels.moe_decode.op.moe_decode`. Two kernels organized around
  outputs, the combine folded into the second. INT4 (`W4A16Weight`, profile ``"indexed"``)
  or MXFP8 (`lowbit.formats.Mxfp8ExpertWeight`) weights.
- ``"indexed"``: routing (`lowbit.routing.moe_align_block_size`), `w4a16_indexed` gate_up,
  `silu_mul`, `w4a16_indexed` down, `combine_topk`. Five launches, INT4 only, on the same
  prepared weights. On Hopper they chain with programmatic dependent launch
  (`lowbit.runtime.pdl`): each starts while the previous one finishes, and down, whose routing
  was built before gate_up, streams its first weight steps before it waits for `silu_mul`
  (H200, 2026-11-30, commit f59fc99, Kimi EP8: 1.02-1.07x plain launches at 1-32 tokens). Where
  down runs on pre-gathered rows (prefill: `W4A16Config.pregather`), `silu_mul` writes its rows
  in down's slot order (``routing=``), which saves down's own gather.

``path="auto"`` (the default) picks by `moe_experts_path`: the output-centric path while an INT4
batch has at most `OUTPUT_CENTRIC_MAX_TOKENS` tokens, always for MXFP8 (the indexed GEMM takes
INT4 only). ``LOWBIT_MOE_PATH`` overrides the choice. Both paths run without a host readback,
so the layer can be captured in a CUDA graph.
"""

from __future__ import annotations

import os

import torch

from ..formats.experts import check_expert_weight_pair
from ..formats.moe_mxfp8 import Mxfp8ExpertWeight
from ..formats.w4a16 import W4A16Weight
from ..kernels.moe_decode.op import moe_decode
from ..kernels.moe_elementwise import combine_topk, silu_mul
from ..kernels.w4a16.indexed import W4A16IndexedConfig, gluon_capable, w4a16_indexed, w4a16_indexed_config
from ..routing import moe_align_block_size
from ..routing.layouts import check_topk_routing

__all__ = ["PATHS", "OUTPUT_CENTRIC_MAX_TOKENS", "indexed_configs", "moe_experts", "moe_experts_path"]

PATHS = ("output_centric", "indexed")

#: The largest INT4 batch (tokens) that takes the output-centric path; 0: the indexed path wins at every batch.
#: H200, 2026-11-30, commit 0f726b2 (Kimi EP8 layer, routing and combine included, CUDA graph): indexed 79.4 vs output-centric 82.4 us at 1 token, 125.0 vs 146.4 at 2
OUTPUT_CENTRIC_MAX_TOKENS = 0

_ENV = "LOWBIT_MOE_PATH"


def moe_experts_path(tokens: int, fmt: str = "int4") -> tuple[str, str]:
    """``(path, why)`` for a batch of `tokens` with weights of format `fmt` (``"int4"`` or
    ``"mxfp8"``); ``LOWBIT_MOE_PATH`` (``output_centric`` / ``indexed``) overrides."""
    forced = os.environ.get(_ENV, "")
    if forced:
        if forced not in PATHS:
            raise ValueError(f"{_ENV}={forced!r}: expected one of {PATHS}")
        return forced, f"{_ENV}={forced}"
    if fmt != "int4":
        return "output_centric", f"{fmt} weights: the indexed GEMM takes INT4 only"
    if tokens <= OUTPUT_CENTRIC_MAX_TOKENS:
        return "output_centric", f"{tokens} tokens <= {OUTPUT_CENTRIC_MAX_TOKENS} (H200 Kimi EP8 crossover)"
    return "indexed", f"{tokens} tokens > {OUTPUT_CENTRIC_MAX_TOKENS} (H200 Kimi EP8 crossover)"


def moe_experts(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: W4A16Weight | Mxfp8ExpertWeight,
    w2: W4A16Weight | Mxfp8ExpertWeight,
    *,
    out: torch.Tensor | None = None,
    path: str = "auto",
) -> torch.Tensor:
    """The expert part of a MoE block (module docstring).

    hidden ``bf16 [M, H]``; topk_ids ``int32 [M, k]`` (``-1``: dropped slot); topk_weights
    ``float32 [M, k]`` (applied as given, not renormalized); w13 ``[E, 2I, H]`` (gate rows, then
    up rows) and w2 ``[E, H, I]``: both `W4A16Weight` (``pack_w4a16(..., profile="indexed")``)
    or both `Mxfp8ExpertWeight` (output-centric path only); out optional ``bf16 [M, H]``;
    path ``"auto"``, ``"output_centric"`` or ``"indexed"``. Returns ``bf16 [M, H]``.
    """
    if path != "auto" and path not in PATHS:
        raise ValueError(f"path must be 'auto' or one of {PATHS}, got {path!r}")
    check_expert_weight_pair(w13, w2)
    if not isinstance(hidden, torch.Tensor) or hidden.dtype != torch.bfloat16 or hidden.dim() != 2:
        raise TypeError(f"hidden must be bf16 [M, H], got {getattr(hidden, 'dtype', type(hidden).__name__)} "
                        f"{tuple(getattr(hidden, 'shape', ()))}")
    if hidden.shape[1] != w13.k:
        raise ValueError(f"hidden has H={hidden.shape[1]}, w13 expects H={w13.k}")
    m = hidden.shape[0]
    check_topk_routing(topk_ids, topk_weights, m, hidden.device)
    if topk_weights is None:
        raise TypeError("topk_weights must be float32 [M, k], got None")
    fmt = "int4" if isinstance(w13, W4A16Weight) else "mxfp8"
    if path == "auto":
        path, _ = moe_experts_path(m, fmt)
    if path == "output_centric":
        return moe_decode(hidden, topk_ids, topk_weights, w13, w2, out=out)
    if not (isinstance(w13, W4A16Weight) and isinstance(w2, W4A16Weight)):
        raise ValueError(f"path 'indexed' takes INT4 weights (W4A16Weight), got {fmt}")
    return _indexed(hidden, topk_ids, topk_weights, w13, w2, out)


def indexed_configs(hidden: torch.Tensor, top_k: int, w13: W4A16Weight,
                    w2: W4A16Weight) -> tuple[W4A16IndexedConfig, W4A16IndexedConfig]:
    """The `w4a16_indexed` configurations (gate_up, down) of the indexed path for `hidden`
    ``[M, H]`` routed `top_k` ways (memoized by the GEMM's heuristics)."""
    routes = hidden.shape[0] * top_k
    # down's activations are a fresh contiguous [routes, I] tensor: 16-byte aligned rows iff I % 8 == 0
    down_gluon = gluon_capable(hidden, w2) and w2.k % 8 == 0
    return (w4a16_indexed_config(routes, w13.num_experts, w13.n, w13.k, gluon=gluon_capable(hidden, w13)),
            w4a16_indexed_config(routes, w2.num_experts, w2.n, w2.k, gluon=down_gluon))


def _indexed(hidden, topk_ids, topk_weights, w13: W4A16Weight, w2: W4A16Weight, out):
    """Routing, gate_up, SiLU * up, down, combine (the expert-centric layer)."""
    m, top_k = topk_ids.shape
    e = w13.num_experts
    if m == 0:
        return out if out is not None else torch.empty(0, w2.n, dtype=torch.bfloat16, device=hidden.device)
    c1, c2 = indexed_configs(hidden, top_k, w13, w2)
    r1 = moe_align_block_size(topk_ids, c1.block_m, e)
    # both routings before gate_up: down then reads its routing three launches after it was
    # written, so it streams its first weights while gate_up and silu_mul finish (`lowbit.runtime.pdl`)
    r2 = r1 if c2.block_m == c1.block_m else moe_align_block_size(topk_ids, c2.block_m, e)
    gu = w4a16_indexed(hidden, w13, r1.sorted_token_ids, r1.expert_ids, r1.num_tokens_post_padded, top_k, config=c1)
    # down: route r reads act row r (its own gate_up row), so the same sorted ids serve with top_k 1.
    # A pre-gathered down reads its rows in slot order: the SiLU writes them there, in the same
    # pass (no second gather of the [M * k, I] rows)
    slots = c2.pregather
    act = silu_mul(gu, routing=r2 if slots else None)
    y = w4a16_indexed(act, w2, r2.sorted_token_ids, r2.expert_ids, r2.num_tokens_post_padded, 1, config=c2,
                      routing_ready=True, slot_order_routes=m * top_k if slots else None)
    return combine_topk(y, topk_ids, topk_weights, e, out=out)
