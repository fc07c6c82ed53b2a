"""The prepared expert weights the MoE layer and the output-centric decode take, and their checks.

An expert weight ``[E, N, K]`` is an INT4 `W4A16Weight` packed with ``profile="indexed"`` or an
MXFP8 `Mxfp8ExpertWeight`; a MoE block is a pair ``w13 [E, 2I, H]`` (gate rows, then up rows)
and ``w2 [E, H, I]``.
"""

from __future__ import annotations

from .base import FormatError, QuantizedTensor
from .moe_mxfp8 import Mxfp8ExpertWeight
from .w4a16 import W4A16Weight

__all__ = ["check_expert_weight", "check_expert_weight_pair"]


def check_expert_weight(w: object, who: str) -> None:
    """Raise unless `w` is a prepared expert weight (`W4A16Weight` or `Mxfp8ExpertWeight`):
    `FormatError` for a logical `QuantizedTensor` (not prepared yet), TypeError otherwise.
    `who` names the argument in the message."""
    if isinstance(w, QuantizedTensor):
        raise FormatError(f"{who}: got a logical QuantizedTensor ({w.fmt}); prepare it with "
                          "pack_w4a16(..., profile='indexed') (int4_g32) or pack_mxfp8_experts (mxfp8)")
    if not isinstance(w, (W4A16Weight, Mxfp8ExpertWeight)):
        raise TypeError(f"{who}: expected a W4A16Weight or an Mxfp8ExpertWeight, got {type(w).__name__}")


def check_expert_weight_pair(w13: W4A16Weight | Mxfp8ExpertWeight,
                             w2: W4A16Weight | Mxfp8ExpertWeight) -> tuple[int, int, int]:
    """``(E, H, I)`` of a MoE block's weights ``w13 [E, 2I, H]`` and ``w2 [E, H, I]``, each a
    prepared expert weight (`check_expert_weight`), checked against each other (ValueError)."""
    for who, w in (("w13", w13), ("w2", w2)):
        check_expert_weight(w, who)
    if w13.n % 2:
        raise ValueError(f"w13 has N={w13.n} rows: must be 2*I (gate rows, then up rows)")
    e, h, inter = w13.num_experts, w13.k, w13.n // 2
    if w2.num_experts != e or (w2.n, w2.k) != (h, inter):
        raise ValueError(f"w2 must be [E, H, I] = [{e}, {h}, {inter}] to match w13 [{e}, {2 * inter}, {h}], "
                         f"got [{w2.num_experts}, {w2.n}, {w2.k}]")
    return e, h, inter
