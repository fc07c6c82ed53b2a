"""Reference ``hc_split_sinkhorn`` of seed 004 (DeepSeek V4's Hyper-Connections mixing).

DeepSeek V4 carries the residual stream as ``hc_mult`` (= 4) parallel copies. Before each
attention / FFN block a small projection of those copies gives ``(2 + hc_mult) * hc_mult``
logits per token ("mixes"); ``hc_split_sinkhorn`` turns them into

- ``pre  [hc]``: weights that mix the copies into the block's single input,
- ``post [hc]``: weights that spread the block's output back over the copies,
- ``comb [hc, hc]``: the copy-to-copy residual mixing matrix, pushed towards doubly
  stochastic (rows and columns summing to 1) by Sinkhorn-Knopp iterations.

How the model uses them (DeepSeek V4 ``inference/model.py``, ``hc_pre`` / ``hc_post``)::

    block_in       = sum_j pre[j] * residual[j]
    new_residual[k] = post[k] * block_out + sum_j comb[j, k] * residual[j]
"""

from __future__ import annotations

import torch

__all__ = ["hc_split_sinkhorn_ref"]


def hc_split_sinkhorn_ref(
    mixes: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    hc_mult: int = 4,
    sinkhorn_iters: int = 20,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the Hyper-Connection logits into ``pre``, ``post`` and a Sinkhorn-normalised ``comb``.

    Args:
        mixes: ``float32 [..., (2 + hc) * hc]`` logits, any leading shape (the model passes
            ``[b, s, 24]``; the kernel sees it flattened to ``[n, 24]``). Laid out as
            ``[pre logits (hc) | post logits (hc) | comb logits (hc * hc, row-major [j, k])]``.
        hc_scale: ``float32 [3]``: one multiplier for each of the three parts.
        hc_base: ``float32 [(2 + hc) * hc]``: an additive bias per logit, same layout as ``mixes``.
        hc_mult: ``hc``, the number of residual copies (4 in DeepSeek V4).
        sinkhorn_iters: number of Sinkhorn rounds, >= 1 (20 in DeepSeek V4). The first round is
            the softmax plus one column normalisation, each further round a row then a column
            normalisation.
        eps: stabiliser (1e-6 in DeepSeek V4), used exactly where the kernel uses it.

    Returns:
        ``(pre [..., hc], post [..., hc], comb [..., hc, hc])``, all float32, with
        ``pre`` in ``(eps, 1 + eps)``, ``post`` in ``(0, 2)``, ``comb`` positive, its columns
        summing to ``1 - O(eps)`` and its rows to 1 up to the Sinkhorn convergence error.

    Semantics (per token; ``x = mixes``, ``c = hc_base``; the same operations, in the same
    order, as DeepSeek V4 ``inference/kernel.py`` ``hc_split_sinkhorn_kernel``)::

        pre[j]     = sigmoid(x[j] * hc_scale[0] + c[j]) + eps
        post[j]    = 2 * sigmoid(x[hc + j] * hc_scale[1] + c[hc + j])
        L[j, k]    = x[2hc + j*hc + k] * hc_scale[2] + c[2hc + j*hc + k]
        comb       = softmax(L, over k) + eps          # each row: softmax, then + eps
        comb[j, k] /= sum_j' comb[j', k] + eps         # columns
        repeat sinkhorn_iters - 1 times:
            comb[j, k] /= sum_k' comb[j, k'] + eps     # rows
            comb[j, k] /= sum_j' comb[j', k] + eps     # columns

    The iteration ends on a column normalisation, so columns are the tighter constraint.
    """
    for name, t in (("mixes", mixes), ("hc_scale", hc_scale), ("hc_base", hc_base)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be a float32 tensor, got {t.dtype}")
    if not isinstance(hc_mult, int) or hc_mult < 1:
        raise ValueError(f"hc_mult must be a positive int, got {hc_mult!r}")
    if not isinstance(sinkhorn_iters, int) or sinkhorn_iters < 1:
        raise ValueError(f"sinkhorn_iters must be an int >= 1, got {sinkhorn_iters!r}")
    hc = hc_mult
    mix_hc = (2 + hc) * hc
    if mixes.dim() < 1 or mixes.shape[-1] != mix_hc:
        raise ValueError(
            f"mixes must be [..., (2 + hc_mult) * hc_mult] = [..., {mix_hc}], got {tuple(mixes.shape)}"
        )
    if tuple(hc_scale.shape) != (3,):
        raise ValueError(f"hc_scale must be [3], got {tuple(hc_scale.shape)}")
    if tuple(hc_base.shape) != (mix_hc,):
        raise ValueError(f"hc_base must be [{mix_hc}], got {tuple(hc_base.shape)}")

    x = mixes.float()
    scale = hc_scale.float()
    base = hc_base.float()
    pre = torch.sigmoid(x[..., :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(x[..., hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    logits = x[..., 2 * hc :] * scale[2] + base[2 * hc :]
    logits = logits.reshape(*x.shape[:-1], hc, hc)  # [..., j, k]

    comb = torch.softmax(logits, dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb
