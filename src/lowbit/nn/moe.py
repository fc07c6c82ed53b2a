"""`MoEExperts`: the routed experts of one MoE layer as an ``nn.Module`` over `lowbit.moe_experts`.

    experts = MoEExperts.from_checkpoint(ckpt, layer=3, experts=range(48 * rank, 48 * rank + 48), device="cuda")
    out = experts(hidden, topk_ids, topk_weights)          # bf16 [T, H]

The call has the signature of a Hugging Face experts module (``DeepseekV3Experts``:
``experts(hidden_states, top_k_index, top_k_weights)``), so an instance replaces one in place
(`lowbit.nn.hf.replace_experts`): the router and the shared experts stay the model's.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from ..formats.base import FormatError
from ..formats.w4a16 import LAYOUT_K256_GROUP_NIBBLES, W4A16Weight
from ._buffers import PreparedBuffers

__all__ = ["MoEExperts", "remap_expert_ids"]

_PROFILE = "indexed"


def remap_expert_ids(topk_ids: torch.Tensor, expert_map: torch.Tensor) -> torch.Tensor:
    """Global expert ids to local ones, on the device (no host sync; CUDA-graph capturable).

    topk_ids: int ``[..., k]`` global ids; ``-1`` and ids outside ``[0, E_global)`` are dropped
    slots. expert_map: ``int32 [E_global]``, the local id of each global expert, ``-1`` for an
    expert held elsewhere. Returns ``int32 [..., k]``: the local id, ``-1`` for a dropped slot
    or a remote expert."""
    e_global = expert_map.shape[0]
    valid = (topk_ids >= 0) & (topk_ids < e_global)
    local = expert_map[topk_ids.clamp(0, e_global - 1).long()]
    return torch.where(valid, local, -1).to(torch.int32)


def _check_pair(w13: Any, w2: Any) -> None:
    for name, w in (("w13", w13), ("w2", w2)):
        if not isinstance(w, W4A16Weight):
            raise TypeError(f"MoEExperts: {name} must be a W4A16Weight (pack_w4a16(..., profile='indexed') or "
                            f"lowbit.checkpoint's experts()), got {type(w).__name__}")
        w.check(_PROFILE)
    if w13.num_experts != w2.num_experts:
        raise ValueError(f"MoEExperts: w13 has {w13.num_experts} experts, w2 has {w2.num_experts}")
    if w13.n % 2 or w13.n // 2 != w2.k or w13.k != w2.n:
        raise ValueError(f"MoEExperts: w13 must be [E, 2I, H] and w2 [E, H, I]; got w13 [N={w13.n}, K={w13.k}], "
                         f"w2 [N={w2.n}, K={w2.k}]")
    devices = {w13.qweight.device, w13.scales.device, w2.qweight.device, w2.scales.device}
    if len(devices) != 1:
        raise ValueError(f"MoEExperts: w13 and w2 must be on one device, got {sorted(map(str, devices))}")


def _check_expert_map(expert_map: torch.Tensor, device: torch.device, who: str) -> None:
    if not isinstance(expert_map, torch.Tensor) or expert_map.dtype != torch.int32 or expert_map.dim() != 1:
        raise TypeError(f"{who}: expert_map must be int32 [E_global], got "
                        f"{getattr(expert_map, 'dtype', type(expert_map).__name__)} "
                        f"{tuple(getattr(expert_map, 'shape', ()))}")
    if expert_map.device != device:
        raise ValueError(f"{who}: expert_map is on {expert_map.device}, the weights on {device}")


class MoEExperts(PreparedBuffers):
    """The routed experts of a MoE layer on INT4 group-32 weights (`lowbit.moe_experts`)::

        out[t] = sum_j topk_weights[t, j] * (SiLU(g) * u) @ W2[e]^T,  (g, u) = hidden[t] @ W13[e]^T,
        e = local id of topk_ids[t, j]  (a remote expert or a dropped slot adds nothing)

    Buffers (moved by ``.to(device)``, saved by ``state_dict``; a dtype cast leaves them as
    they are): ``w13_qweight int32 [E, 2I, Kp/8]``, ``w13_scales bf16 [E, Kp/32, 2I]`` (gate
    rows, then up rows; K = H), ``w2_qweight int32 [E, H, Ip/8]``, ``w2_scales bf16 [E, Ip/32,
    H]`` (the `W4A16Weight` layout, profile ``"indexed"``), and ``expert_map int32 [E_global]``
    (global -> local id, ``-1`` remote) or None.

    Attributes: ``num_experts`` (E, local), ``hidden_size`` (H), ``intermediate_size`` (I),
    ``global_experts`` (the global id of each local expert, or None), ``path`` (passed to
    `lowbit.moe_experts`: ``"auto"``, ``"indexed"`` or ``"output_centric"``).
    """

    _prepared = ("w13_qweight", "w13_scales", "w2_qweight", "w2_scales")

    def __init__(self, w13: W4A16Weight, w2: W4A16Weight, *, expert_map: torch.Tensor | None = None,
                 global_experts: Iterable[int] | None = None, path: str = "auto"):
        """w13 ``[E, 2I, H]``, w2 ``[E, H, I]``: `W4A16Weight` packed for ``"indexed"``;
        expert_map: optional ``int32 [E_global]`` (global -> local id, ``-1`` remote), used
        when `forward` is given none; global_experts: the global id of each local expert
        (information only); path: `lowbit.moe_experts`'s ``path``."""
        super().__init__()
        _check_pair(w13, w2)
        if path not in ("auto", "indexed", "output_centric"):
            raise ValueError(f"MoEExperts: path must be 'auto', 'indexed' or 'output_centric', got {path!r}")
        device = w13.qweight.device
        if expert_map is not None:
            _check_expert_map(expert_map, device, "MoEExperts")
            # checked once here (a host read): a per-call map cannot be checked without a sync
            lo, hi = (int(v) for v in torch.aminmax(expert_map)) if expert_map.numel() else (-1, -1)
            if lo < -1 or hi >= w13.num_experts:
                raise ValueError(f"MoEExperts: expert_map values must be -1 or local ids in [0, {w13.num_experts}), "
                                 f"got values in [{lo}, {hi}]")
        self.register_buffer("w13_qweight", w13.qweight)
        self.register_buffer("w13_scales", w13.scales)
        self.register_buffer("w2_qweight", w2.qweight)
        self.register_buffer("w2_scales", w2.scales)
        self.register_buffer("expert_map", expert_map)
        self.num_experts = w13.num_experts
        self.hidden_size = w13.k
        self.intermediate_size = w2.k
        self.global_experts = tuple(int(e) for e in global_experts) if global_experts is not None else None
        self.path = path
        self._views: tuple[W4A16Weight, W4A16Weight] | None = None

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_weights(cls, w13: W4A16Weight, w2: W4A16Weight, **kwargs) -> "MoEExperts":
        """From prepared weights (`lowbit.pack_w4a16`, profile ``"indexed"``); keyword
        arguments as the constructor's."""
        return cls(w13, w2, **kwargs)

    @classmethod
    def from_checkpoint(cls, ckpt, layer: int, experts: Iterable[int] | None = None,
                        device: torch.device | str = "cpu", *, path: str = "auto",
                        progress: bool | None = None) -> "MoEExperts":
        """The routed experts of MoE layer `layer` of a `lowbit.checkpoint.Checkpoint` (INT4
        group-32, compressed-tensors ``pack-quantized``), built on `device`.

        experts: None (all), or the global ids this module holds (expert parallelism); local
        expert j is then ``experts[j]`` and the module's ``expert_map`` (``int32
        [ckpt.num_experts]``) maps global ids to local ones, so `forward` takes the router's
        global ids as they are."""
        ids = None if experts is None else [int(e) for e in experts]
        w13, w2 = ckpt.experts(layer, experts=ids, device=device, profile=_PROFILE, progress=progress)
        if not isinstance(w13, W4A16Weight):
            raise FormatError(f"MoEExperts.from_checkpoint: layer {layer}'s experts are stored as "
                              f"{ckpt.expert_format}; MoEExperts runs INT4 group-32 experts (int4_g32)")
        expert_map = None
        if ids is not None:
            total = ckpt.num_experts if ckpt.num_experts else max(ids) + 1
            expert_map = torch.full((total,), -1, dtype=torch.int32)
            expert_map[torch.tensor(ids, dtype=torch.long)] = torch.arange(len(ids), dtype=torch.int32)
            expert_map = expert_map.to(w13.qweight.device)
        return cls(w13, w2, expert_map=expert_map, global_experts=ids, path=path)

    # -- the prepared weights ------------------------------------------------------------
    def weights(self) -> tuple[W4A16Weight, W4A16Weight]:
        """``(w13, w2)``: `W4A16Weight` views of the buffers (built once; rebuilt only after
        the buffers were moved or replaced)."""
        v = self._views
        if (v is None or v[0].qweight is not self.w13_qweight or v[0].scales is not self.w13_scales
                or v[1].qweight is not self.w2_qweight or v[1].scales is not self.w2_scales):
            v = (W4A16Weight(self.w13_qweight, self.w13_scales, 2 * self.intermediate_size, self.hidden_size,
                             LAYOUT_K256_GROUP_NIBBLES, _PROFILE),
                 W4A16Weight(self.w2_qweight, self.w2_scales, self.hidden_size, self.intermediate_size,
                             LAYOUT_K256_GROUP_NIBBLES, _PROFILE))
            self._views = v
        return v

    def _prepared_changed(self) -> None:
        self._views = None

    # -- the call ------------------------------------------------------------------------
    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                expert_map: torch.Tensor | None = None) -> torch.Tensor:
        """hidden ``[..., H]`` (bf16; fp16 / fp32 are computed in bf16 and returned in their
        dtype); topk_ids ``[..., k]`` int32 or int64 global ids (``-1``: a dropped slot);
        topk_weights ``[..., k]`` float32 (bf16 / fp16 are widened), applied as given;
        expert_map: optional ``int32 [E_global]`` (global -> local id, ``-1`` remote; values
        must be ``-1`` or in ``[0, E)``), else the module's. Returns ``[..., H]`` in hidden's
        dtype. No host sync: the call can be captured in a CUDA graph."""
        if not isinstance(hidden, torch.Tensor) or hidden.dim() < 1 or hidden.shape[-1] != self.hidden_size:
            raise ValueError(f"MoEExperts: hidden must be [..., H={self.hidden_size}], got "
                             f"{tuple(getattr(hidden, 'shape', ())) or type(hidden).__name__}")
        if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() < 1 or topk_ids.dtype not in (torch.int32,
                                                                                                   torch.int64):
            raise TypeError(f"MoEExperts: topk_ids must be int32 or int64 [..., k], got "
                            f"{getattr(topk_ids, 'dtype', type(topk_ids).__name__)}")
        if not isinstance(topk_weights, torch.Tensor):
            raise TypeError(f"MoEExperts: topk_weights must be a float32 tensor [..., k], got {type(topk_weights).__name__}")
        top_k = topk_ids.shape[-1]
        x = hidden.reshape(-1, self.hidden_size)
        if topk_ids.numel() != x.shape[0] * top_k or topk_weights.shape != topk_ids.shape:
            raise ValueError(f"MoEExperts: topk_ids {tuple(topk_ids.shape)} and topk_weights "
                             f"{tuple(topk_weights.shape)} must both be [..., k] for hidden {tuple(hidden.shape)}")
        ids = topk_ids.reshape(-1, top_k)
        weights = topk_weights.reshape(-1, top_k)
        if x.dtype != torch.bfloat16:
            x = x.to(torch.bfloat16)
        if weights.dtype != torch.float32:
            weights = weights.float()
        emap = expert_map if expert_map is not None else self.expert_map
        if emap is not None:
            if expert_map is not None:
                _check_expert_map(expert_map, self.w13_qweight.device, "MoEExperts.forward")
            ids = remap_expert_ids(ids, emap)
        elif ids.dtype != torch.int32:
            ids = ids.to(torch.int32)
        if torch.compiler.is_compiling():
            from .. import ops  # noqa: F401  (registers torch.ops.lowbit)

            y = torch.ops.lowbit.moe_experts(x, ids, weights, self.w13_qweight, self.w13_scales,
                                             2 * self.intermediate_size, self.hidden_size, self.w2_qweight,
                                             self.w2_scales, self.hidden_size, self.intermediate_size, self.path)
        else:
            from ..layers.moe import moe_experts

            w13, w2 = self.weights()
            y = moe_experts(x, ids, weights, w13, w2, path=self.path)
        if y.dtype != hidden.dtype:
            y = y.to(hidden.dtype)
        return y.view(hidden.shape)

    def extra_repr(self) -> str:
        where = f", global_experts={len(self.global_experts)} of {self.expert_map.shape[0]}" \
            if self.global_experts is not None and self.expert_map is not None else ""
        return (f"num_experts={self.num_experts}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size}, int4_g32{where}, path={self.path!r}")
