"""Index-gathered multi-query attention with a per-head sink (seed 004's ``sparse_attn``).

    sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale=None) -> out bf16 [b, s, h, d]

    for i < b, t < s, x < h:                     J = [j : 0 <= topk_idxs[i, t, j] < n]  (a list)
        z_j  = softmax_scale * q[i, t, x] . kv[i, topk_idxs[i, t, j]]        j in J
        out[i, t, x] = bf16( sum_j exp(z_j) kv[i, topk_idxs[i, t, j]]
                             / (sum_j exp(z_j) + exp(attn_sink[x])) )        (0 if J is empty)

Reference: `lowbit.reference.sparse_attn_ref` (FP32). MQA: one KV row per position shared by
every head, and the row is both key and value (DeepSeek V4: d = 512). ``-1`` marks an empty
slot; a row index named twice counts twice; the sink joins the denominator only. Indices
outside ``[-1, n)`` (which the reference rejects) count as empty slots, never read; rejecting
them needs a device readback, so it is opt-in (``validate=True``), like the NaN / +inf check of
``attn_sink``.

Engines (`SparseAttnConfig.engine`, chosen by `heuristics.sparse_attn_config`): ``"triton"``
(`portable`, every tier; split shares folded by a combine kernel) and ``"gluon"`` (`hopper`:
sm_90, d = 512, 64-head tiles, the KV gather in its own warps, split shares folded inside the
kernel; the default on sm_90 for more than 32 heads, `gluon_capable`). Both compute the scores
in FP32 from bf16 operands, an FP32 online softmax in base 2, and round P to bf16 for ``P kv``.
"""

from __future__ import annotations

import math

import torch
import triton

from ...runtime.device import is_sm90_native, require_sm90
from .heuristics import (
    ENV_OVERRIDES,
    SparseAttnConfig,
    check_config,
    explain_sparse_attn_config,
    sparse_attn_config,
)
from .portable import LOG2E, sparse_attn_launch
from .tiles import HEAD_DIM, MAX_HEAD_DIM, TILE_TABLE

__all__ = [
    "sparse_attn",
    "gluon_capable",
    "SparseAttnConfig",
    "sparse_attn_config",
    "explain_sparse_attn_config",
    "ENV_OVERRIDES",
    "TILE_TABLE",
    "MAX_HEAD_DIM",
]


def gluon_capable(q: torch.Tensor, kv: torch.Tensor) -> bool:
    """Whether the Gluon engine can run: an sm_90 GPU (not the interpreter), d = 512, kv rows
    16-byte aligned."""
    return (is_sm90_native(q.device) and q.shape[-1] == 512 and kv.stride(1) % 8 == 0
            and kv.data_ptr() % 16 == 0)



def _validate_values(kv: torch.Tensor, attn_sink: torch.Tensor, topk_idxs: torch.Tensor) -> None:
    """The checks that read device data back (a sync): off by default."""
    n = kv.shape[1]
    if topk_idxs.numel() and (bool((topk_idxs < -1).any()) or bool((topk_idxs >= n).any())):
        lo, hi = int(topk_idxs.min()), int(topk_idxs.max())
        raise ValueError(f"topk_idxs must lie in [-1, n={n}) (-1 = empty slot), got range [{lo}, {hi}]")
    if bool(torch.isnan(attn_sink).any()) or bool(torch.isposinf(attn_sink).any()):
        raise ValueError("attn_sink must not contain NaN or +inf")


def _launch_gluon(q, kv, sink, topk_idxs, out, qk_scale: float, per: int, splits: int,
                  config: SparseAttnConfig) -> None:
    """The Hopper Gluon kernel (`hopper`): an sm_90 GPU, d = 512, 16-byte aligned rows."""
    require_sm90(q.device, "sparse_attn engine='gluon'")
    from .hopper import sparse_attn_sm90_launch  # noqa: PLC0415 (Gluon imported only when asked for)

    if q.shape[3] != HEAD_DIM:
        raise ValueError(f"sparse_attn: engine='gluon' needs d = {HEAD_DIM}, got {q.shape[3]}")
    if kv.stride(1) % 8 or kv.data_ptr() % 16:
        raise ValueError(f"sparse_attn: engine='gluon' gathers kv rows in 16-byte copies: rows must be 16-byte "
                         f"aligned (row stride {kv.stride(1)} elements)")
    sparse_attn_sm90_launch(q, kv, sink, topk_idxs, out, qk_scale, per, splits, config.block_kv,
                            config.num_stages)


def sparse_attn(
    q: torch.Tensor,
    kv: torch.Tensor,
    attn_sink: torch.Tensor,
    topk_idxs: torch.Tensor,
    softmax_scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    config: SparseAttnConfig | None = None,
    validate: bool = False,
) -> torch.Tensor:
    """Sparse multi-query attention over gathered KV rows (semantics: module docstring; equals
    `lowbit.reference.sparse_attn_ref` up to the bf16 rounding of P and of the output).

    q: ``bf16 [b, s, h, d]``, contiguous along d (any h >= 1, d <= 512);
    kv: ``bf16 [b, n, d]``, contiguous along d: keys = values, shared by all heads;
    attn_sink: ``float32 [h]``, one sink logit per head (``-inf``: no sink);
    topk_idxs: ``int32 [b, s, topk]``, contiguous along topk: KV row per slot, ``-1`` empty;
    softmax_scale: multiplies ``q . k``; ``None`` means ``1 / sqrt(d)``.
    out: optional ``bf16 [b, s, h, d]`` buffer (contiguous along d); config: a
    `SparseAttnConfig` instead of the heuristic; validate: also reject indices outside
    ``[-1, n)`` and a NaN / +inf sink, as the reference does (reads device data: a sync, not
    CUDA-graph capturable). Without it those indices count as empty slots (never read) and
    the sink is taken as given.

    Returns ``bf16 [b, s, h, d]``; a query whose slots are all empty gets exact zeros.
    """
    for name, t in (("q", q), ("kv", kv), ("attn_sink", attn_sink), ("topk_idxs", topk_idxs)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dtype != torch.bfloat16 or kv.dtype != torch.bfloat16:
        raise TypeError(f"q and kv must be bf16, got q {q.dtype}, kv {kv.dtype}")
    if attn_sink.dtype != torch.float32:
        raise TypeError(f"attn_sink must be float32 [h], got {attn_sink.dtype}")
    if topk_idxs.dtype != torch.int32:
        raise TypeError(f"topk_idxs must be int32 [b, s, topk], got {topk_idxs.dtype}")
    if q.dim() != 4:
        raise ValueError(f"q must be [b, s, h, d], got shape {tuple(q.shape)}")
    b, s, h, d = q.shape
    if kv.dim() != 3 or kv.shape[0] != b or kv.shape[2] != d:
        raise ValueError(f"kv must be [b, n, d] = [{b}, n, {d}] for q {tuple(q.shape)}, got {tuple(kv.shape)}")
    if tuple(attn_sink.shape) != (h,):
        raise ValueError(f"attn_sink must be [h] = [{h}], got {tuple(attn_sink.shape)}")
    if topk_idxs.dim() != 3 or tuple(topk_idxs.shape[:2]) != (b, s):
        raise ValueError(f"topk_idxs must be [b, s, topk] = [{b}, {s}, topk], got {tuple(topk_idxs.shape)}")
    topk = topk_idxs.shape[2]
    if d < 1 or d > MAX_HEAD_DIM:
        raise ValueError(f"head dim d={d} is not supported: 1 <= d <= {MAX_HEAD_DIM}")
    for name, t in (("q", q), ("kv", kv), ("topk_idxs", topk_idxs)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
        if t.numel() and t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous along its last dim, got strides {t.stride()}")
    if attn_sink.device != q.device:
        raise ValueError(f"attn_sink is on {attn_sink.device}, q on {q.device}")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    softmax_scale = float(softmax_scale)
    if not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    if validate:
        _validate_values(kv, attn_sink, topk_idxs)
    if out is None:
        out = torch.empty(b, s, h, d, dtype=torch.bfloat16, device=q.device)
    elif (out.dtype != torch.bfloat16 or tuple(out.shape) != (b, s, h, d) or out.device != q.device
          or (out.numel() and out.stride(-1) != 1)):
        raise ValueError(f"out must be bf16 [{b}, {s}, {h}, {d}] on {q.device}, contiguous along d; "
                         f"got {out.dtype} {tuple(out.shape)} strides {out.stride()} on {out.device}")
    if out.numel() == 0:
        return out
    config = (sparse_attn_config(b, s, h, q.device, topk, gluon_capable(q, kv)) if config is None
              else check_config(config))
    sink = attn_sink.contiguous()
    # each share a whole number of KV blocks; no empty share
    per = triton.cdiv(triton.cdiv(max(topk, 1), config.split_kv), config.block_kv) * config.block_kv
    splits = triton.cdiv(max(topk, 1), per)
    if config.engine == "gluon":  # split shares fold inside the kernel
        _launch_gluon(q, kv, sink, topk_idxs, out, softmax_scale * LOG2E, per, splits, config)
        return out
    sparse_attn_launch(q, kv, sink, topk_idxs, out, softmax_scale * LOG2E, per, splits, config.heads_per_program,
                       config.block_kv, config.num_warps, config.num_stages, config.swap_ab)
    return out
