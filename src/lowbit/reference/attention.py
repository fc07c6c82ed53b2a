"""Reference sparse attention of seed 004 (DeepSeek V4's ``sparse_attn``).

Each query position attends only to the KV rows its ``topk_idxs`` names (a sliding window
plus the indexer's picks among the compressed KV, concatenated by the model). Attention is
multi-query: one latent KV row per position, shared by every head, and that same row is both
the key and the value (DeepSeek V4: ``d = 512``; the model un-rotates the RoPE part of the
output afterwards). A learned per-head ``attn_sink`` logit joins the softmax denominator only.

The kernel gathers the rows block by block with an online (running max / running sum)
softmax; the reference computes the same quantity directly in FP32.
"""

from __future__ import annotations

import math

import torch

__all__ = ["sparse_attn_ref"]

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def sparse_attn_ref(
    q: torch.Tensor,
    kv: torch.Tensor,
    attn_sink: torch.Tensor,
    topk_idxs: torch.Tensor,
    softmax_scale: float | None = None,
) -> torch.Tensor:
    """Index-gathered multi-query attention with a per-head sink logit.

    Args:
        q: queries, ``[b, s, h, d]``, bf16 (fp16/fp32 accepted). Any number of heads
            ``h >= 1`` (the kernel pads fewer than 16 heads to 16; that is its business).
        kv: keys = values, ``[b, n, d]``, same dtype family as ``q``; one row per KV position,
            shared by all heads of batch element ``b``.
        attn_sink: ``float32 [h]``, one sink logit per head; ``-inf`` means no sink. Must not
            be NaN or ``+inf``.
        topk_idxs: ``int32 [b, s, topk]`` (int64 accepted): KV row of each slot, or ``-1`` for
            an empty slot. Other values outside ``[-1, n)`` raise ``ValueError``.
        softmax_scale: multiplies ``q . k``; ``None`` means ``1 / sqrt(d)``.

    Returns:
        ``float32 [b, s, h, d]``. The kernel writes bf16 (cast to compare with it).

    Semantics, per batch ``i``, query ``t`` and head ``x`` (``J`` = the valid slots
    ``j`` with ``topk_idxs[i, t, j] != -1``, as a list: a row index named twice counts twice)::

        k_j = v_j = kv[i, topk_idxs[i, t, j]]
        z_j = softmax_scale * dot(q[i, t, x], k_j)                 for j in J
        m   = max(max_j z_j, attn_sink[x])
        out[i, t, x] = sum_j exp(z_j - m) * v_j / (sum_j exp(z_j - m) + exp(attn_sink[x] - m))
        out[i, t, x] = 0                                          if J is empty

    that is ``softmax([z_J, sink])`` with the sink's probability thrown away: the sink is
    added to the denominator only (DeepSeek V4 ``inference/kernel.py``:
    ``sum_exp += exp(attn_sink - scores_max)`` after the last KV block, then
    ``acc_o /= sum_exp``). A very large sink drives the output to 0; ``-inf`` gives plain
    softmax attention. A row with no valid slot returns exactly zeros (the kernel starts its
    running max at a finite ``-1e30`` so that case yields ``0 / (0 + exp(sink + 1e30)) = 0``
    instead of NaN).

    Precision notes for kernel comparisons: the kernel rounds the probabilities to bf16 before
    the ``P @ V`` MMA and writes bf16; this reference keeps both in FP32.
    """
    for name, t in (("q", q), ("kv", kv), ("attn_sink", attn_sink), ("topk_idxs", topk_idxs)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dtype not in _FLOATS or kv.dtype not in _FLOATS:
        raise TypeError(f"q and kv must be bf16/fp16/fp32, got q {q.dtype}, kv {kv.dtype}")
    if not attn_sink.dtype.is_floating_point:
        raise TypeError(f"attn_sink must be float32 [h], got {attn_sink.dtype}")
    if topk_idxs.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_idxs must be int32 (or int64) [b, s, topk], got {topk_idxs.dtype}")
    if q.dim() != 4:
        raise ValueError(f"q must be [b, s, h, d], got shape {tuple(q.shape)}")
    b, s, h, d = q.shape
    if kv.dim() != 3 or kv.shape[0] != b or kv.shape[2] != d:
        raise ValueError(
            f"kv must be [b, n, d] = [{b}, n, {d}] for q {tuple(q.shape)}, got {tuple(kv.shape)}"
        )
    n = kv.shape[1]
    if tuple(attn_sink.shape) != (h,):
        raise ValueError(f"attn_sink must be [h] = [{h}], got {tuple(attn_sink.shape)}")
    if topk_idxs.dim() != 3 or tuple(topk_idxs.shape[:2]) != (b, s):
        raise ValueError(
            f"topk_idxs must be [b, s, topk] = [{b}, {s}, topk], got {tuple(topk_idxs.shape)}"
        )
    if topk_idxs.numel() and (bool((topk_idxs < -1).any()) or bool((topk_idxs >= n).any())):
        lo, hi = int(topk_idxs.min()), int(topk_idxs.max())
        raise ValueError(f"topk_idxs must lie in [-1, n={n}) (-1 = empty slot), got range [{lo}, {hi}]")
    sink = attn_sink.float()
    if bool(torch.isnan(sink).any()) or bool(torch.isposinf(sink).any()):
        raise ValueError("attn_sink must not contain NaN or +inf")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)

    valid = topk_idxs >= 0  # [b, s, topk]
    rows = topk_idxs.long().clamp(min=0)
    batch = torch.arange(b, device=kv.device).view(b, 1, 1)
    kv_sel = kv.float()[batch, rows]  # [b, s, topk, d]: the gathered keys (= values)

    z = torch.einsum("bshd,bstd->bsht", q.float(), kv_sel) * softmax_scale  # [b, s, h, topk]
    z = z.masked_fill(~valid[:, :, None, :], float("-inf"))
    sink_b = sink.view(1, 1, h).expand(b, s, h)
    has_any = valid.any(dim=-1)[:, :, None].expand(b, s, h)  # [b, s, h]
    if z.shape[-1] == 0:  # topk == 0: every row is empty
        return torch.zeros(b, s, h, d, dtype=torch.float32, device=q.device)
    # m is finite whenever a row has a valid slot (scores are finite; the sink is not +inf);
    # empty rows get any finite m: their output is replaced by zeros at the end.
    m = torch.maximum(z.amax(dim=-1), sink_b)
    m = torch.where(has_any, m, torch.zeros_like(m))
    p = torch.exp(z - m[..., None])  # exp(-inf) = 0 on empty slots
    denom = p.sum(dim=-1) + torch.exp(sink_b - m)
    out = torch.einsum("bsht,bstd->bshd", p, kv_sel) / denom[..., None]
    return torch.where(has_any[..., None], out, torch.zeros_like(out))
