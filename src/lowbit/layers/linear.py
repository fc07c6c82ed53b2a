"""``linear()``: the dtype dispatch of DeepSeek's model code (seed 004, ``model.py``'s ``linear``).

    linear(x, weight, scale=None, *, act_block_size=128, scale_fmt=None) -> y [..., N]

    weight FP4 (uint8 [N, K/2] packed E2M1, or torch.float4_e2m1fn_x2), scale E8M0 [N, K/32]:
        x_q, x_s = act_quant(x, act_block_size, scale_fmt);  y = fp4_gemm(x_q, x_s, weight, scale)
    weight a FoldedFp4Weight (`lowbit.kernels.block_scaled.fp4.fold_fp4_weight`, done once at load
    time), no scale: the same, with the fold engine's per-call fold skipped
    weight float8_e4m3fn [N, K], scale [ceil(N/128), ceil(K/128)] (FP32 or E8M0):
        x_q, x_s = act_quant(x, 128, scale_fmt);              y = fp8_gemm(x_q, x_s, weight, scale)
    any other weight dtype (bf16, fp16, fp32), no scale:
        y = torch.nn.functional.linear(x, weight)

x is ``[..., K]`` (leading dims flattened for the GEMM and restored on the way out); the
quantized paths return BF16 (the GEMMs' output), the torch path returns ``x.dtype``. A uint8
weight is always read as packed FP4: uint8 is not a dtype ``F.linear`` could use.

Activation quantizer: `lowbit.kernels.quant.act_quant` (the Triton kernel) when that module is
importable, else the PyTorch reference `lowbit.reference.act_quant_ref` (same results, slower,
with a host sync); `ACT_QUANT_BACKEND` says which one this process uses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels.block_scaled.fp4 import WEIGHT_GROUP, FoldedFp4Weight, fp4_gemm
from ..kernels.block_scaled.fp8 import SCALE_BLOCK, fp8_gemm

try:
    from ..kernels.quant import act_quant as _act_quant

    #: "triton" (lowbit.kernels.quant.act_quant) or "reference" (act_quant_ref, PyTorch)
    ACT_QUANT_BACKEND = "triton"
except ModuleNotFoundError as exc:  # only the module's absence; a broken module still raises
    if exc.name != __name__.rsplit(".", 1)[0] + ".kernels.quant":
        raise
    from ..reference.quant import act_quant_ref as _act_quant

    ACT_QUANT_BACKEND = "reference"

__all__ = ["linear", "weight_kind", "ACT_QUANT_BACKEND"]

_FP4_DTYPES = (torch.uint8,) + ((torch.float4_e2m1fn_x2,) if hasattr(torch, "float4_e2m1fn_x2") else ())


def weight_kind(weight: torch.Tensor | FoldedFp4Weight) -> str:
    """``"fp4"``, ``"fp8"`` or ``"torch"``: the path `linear` takes for this weight."""
    if isinstance(weight, FoldedFp4Weight) or weight.dtype in _FP4_DTYPES:
        return "fp4"
    if weight.dtype == torch.float8_e4m3fn:
        return "fp8"
    return "torch"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_scale(scale, want: tuple[int, int], what: str, kind: str) -> None:
    if scale is None:
        raise ValueError(f"linear: an {kind} weight needs its scale ({what}, shape {want}); got scale=None")
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"linear: scale must be a torch.Tensor, got {type(scale).__name__}")
    if tuple(scale.shape) != want:
        raise ValueError(f"linear: {kind} weight scale must have shape {want} ({what}), got {tuple(scale.shape)}")


def linear(
    x: torch.Tensor,
    weight: torch.Tensor | FoldedFp4Weight,
    scale: torch.Tensor | None = None,
    *,
    act_block_size: int = 128,
    scale_fmt: str | None = None,
) -> torch.Tensor:
    """``y = x @ W^T`` with W dequantized by its format (module doc for the three paths).

    x: ``[..., K]`` bf16 (fp16/fp32 also accepted by the quantizer). weight: packed FP4
    ``[N, K/2]``, FP8 ``[N, K]`` or a float ``[N, K]``. scale: the weight's scales (required for
    FP4 / FP8, must be None otherwise and with a `FoldedFp4Weight`, which carries its own).
    act_block_size: the activation group of the FP4 path
    (128 or 32; the FP8 path's is 128 by the fp8_gemm contract). scale_fmt: ``None`` or
    ``"ue8m0"`` (power-of-two activation scales). Returns ``[..., N]``."""
    if not isinstance(x, torch.Tensor) or not isinstance(weight, (torch.Tensor, FoldedFp4Weight)):
        raise TypeError(f"linear: x and weight must be tensors (or weight a FoldedFp4Weight), got "
                        f"{type(x).__name__}, {type(weight).__name__}")
    if x.dim() < 1:
        raise ValueError("linear: x must have at least one dim [..., K]")
    folded = isinstance(weight, FoldedFp4Weight)
    if not folded and weight.dim() != 2:
        raise ValueError(f"linear: weight must be 2-D, got shape {tuple(weight.shape)}")
    kind = weight_kind(weight)
    k = x.shape[-1]
    n = weight.shape[0]
    if kind == "torch":
        if scale is not None:
            raise ValueError(f"linear: a {weight.dtype} weight takes no scale (got one of shape {tuple(scale.shape)})")
        if weight.shape[1] != k:
            raise ValueError(f"linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} must share K")
        if x.dtype != weight.dtype:
            raise TypeError(f"linear: x ({x.dtype}) and an unquantized weight ({weight.dtype}) must share a dtype")
        return F.linear(x, weight)

    if kind == "fp4":
        if folded and weight.shape[1] != k:
            raise ValueError(f"linear: folded FP4 weight [N, K] = {weight.shape} and x {tuple(x.shape)} must share K")
        if not folded and weight.shape[1] * 2 != k:
            raise ValueError(f"linear: packed FP4 weight {tuple(weight.shape)} must be [N, K/2] = [{n}, {k // 2}] "
                             f"for x {tuple(x.shape)}")
        if act_block_size not in (32, 128):
            raise ValueError(f"linear: act_block_size must be 32 or 128, got {act_block_size}")
        if folded:
            if scale is not None:
                raise ValueError("linear: a FoldedFp4Weight carries its scales: pass scale=None")
        else:
            _check_scale(scale, (n, k // WEIGHT_GROUP), "[N, K/32]: one E8M0 scale per 32 K", "FP4")
    else:
        if weight.shape[1] != k:
            raise ValueError(f"linear: FP8 weight {tuple(weight.shape)} and x {tuple(x.shape)} must share K")
        if act_block_size != SCALE_BLOCK:
            raise ValueError(f"linear: the FP8 path quantizes activations in groups of {SCALE_BLOCK} "
                             f"(fp8_gemm's 1x128 scales), got act_block_size={act_block_size}")
        _check_scale(scale, (_cdiv(n, SCALE_BLOCK), _cdiv(k, SCALE_BLOCK)),
                     "[ceil(N/128), ceil(K/128)]: one scale per 128x128 block", "FP8")

    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    x_q, x_s = _act_quant(x2, block_size=act_block_size, scale_fmt=scale_fmt)
    if kind == "fp4":
        y = fp4_gemm(x_q, x_s, weight, scale, act_block_size)
    else:
        y = fp8_gemm(x_q, x_s, weight, scale)
    return y.view(*lead, n)
