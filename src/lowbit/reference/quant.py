"""References of DeepSeek's activation quantizers (seed 004): ``act_quant`` and ``fp4_quant``.

Both are thin wrappers over `lowbit.formats` (the rounding rules live there, once); this module
fixes the calling convention of the kernels they stand for, including the in-place
quantize-then-dequantize mode the model uses to simulate FP8/FP4 round-off on a BF16 tensor
(e.g. the sliding-window KV cache).
"""

from __future__ import annotations

import torch

from ..formats.base import FormatError
from ..formats.fp4 import (
    MXFP4_GROUP,
    NVFP4_DEEPSEEK_AMAX_FLOOR,
    NVFP4_GROUP,
    dequantize_mxfp4,
    dequantize_nvfp4,
    quantize_mxfp4,
    quantize_nvfp4,
)
from ..formats.fp8 import FP8_SCALE_FMTS, check_float_input, dequantize_fp8_groups, quantize_fp8_groups

__all__ = ["act_quant_ref", "fp4_quant_ref", "FP4_SCALE_FMTS"]

#: fp4_quant's scale formats and the one block size each is defined for
FP4_SCALE_FMTS = {"ue8m0": MXFP4_GROUP, "e4m3": NVFP4_GROUP}


def _check_whole_blocks(x: torch.Tensor, block_size: int, who: str) -> None:
    if x.shape[-1] % block_size:
        raise FormatError(
            f"{who}: last dim of {tuple(x.shape)} must be a multiple of block_size={block_size}"
        )


def act_quant_ref(
    x: torch.Tensor,
    block_size: int = 128,
    scale_fmt: str | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """Per-group FP8 E4M3 quantization of activations along the last dim (DeepSeek's
    ``act_quant``). For each group of ``block_size`` elements (128 or 32):

        amax = max(max |x_group|, 1e-4)
        s    = amax * fp32(1/448), rounded up to a power of two if scale_fmt == "ue8m0"
        y    = e4m3(clamp(x / s, -448, 448))           # round to nearest even

    x: ``[..., K]`` bfloat16 (the kernel's input; float32 / float16 accepted), K a multiple of
    block_size. scale_fmt: ``None`` or ``"ue8m0"``.
    Returns ``(y float8_e4m3fn [..., K], s float32 [..., K/block_size])``; with
    ``inplace=True`` it writes ``float(y) * s`` (cast to x.dtype) back into ``x`` and returns
    ``x`` itself.
    """
    who = "act_quant"
    check_float_input(x, who)
    if scale_fmt not in FP8_SCALE_FMTS:
        raise FormatError(f"{who}: unsupported scale_fmt {scale_fmt!r}; supported: {FP8_SCALE_FMTS}")
    _check_whole_blocks(x, block_size, who)
    y, s = quantize_fp8_groups(x, group_size=block_size, scale_fmt=scale_fmt)
    if not inplace:
        return y, s
    x.copy_(dequantize_fp8_groups(y, s, group_size=block_size).to(x.dtype))
    return x


def fp4_quant_ref(
    x: torch.Tensor,
    block_size: int | None = None,
    scale_fmt: str = "ue8m0",
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
    """Per-group FP4 E2M1 quantization along the last dim (DeepSeek's ``fp4_quant``), two codes
    a byte (element 2j in the low nibble). Two scale formats:

    - ``"ue8m0"`` (block 32, MXFP4; the indexer's q/k): ``s = ue8m0_round_up(max(amax,
      6 * 2**-126) * fp32(1/6))``, returned as E8M0 bytes ``uint8 [..., K/32]``.
    - ``"e4m3"`` (block 16; the compressed KV cache): ``s = e4m3(max(amax, 6 * 2**-9) / 6)``
      (RNE, saturating; never zero), returned as ``float8_e4m3fn [..., K/16]``. This is NVFP4
      with the global scale fixed at 1.

    Then ``code = e2m1(x / s)``: round to nearest even on the E2M1 grid, saturating at +-6.

    x: ``[..., K]`` bfloat16 (float32 / float16 accepted), K a multiple of the block.
    block_size: ``None`` takes the format's block (32 or 16); any other value raises.
    Returns ``(packed uint8 [..., K/2], scales)``; with ``inplace=True`` writes the dequantized
    values ``e2m1_value * s`` (cast to x.dtype) back into ``x`` and returns ``x``.
    """
    who = "fp4_quant"
    check_float_input(x, who)
    if scale_fmt not in FP4_SCALE_FMTS:
        raise FormatError(f"{who}: unsupported scale_fmt {scale_fmt!r}; supported: {sorted(FP4_SCALE_FMTS)}")
    block = FP4_SCALE_FMTS[scale_fmt]
    if block_size is not None and block_size != block:
        raise FormatError(f"{who}: scale_fmt={scale_fmt!r} uses blocks of {block}, got block_size={block_size}")
    _check_whole_blocks(x, block, who)
    if scale_fmt == "ue8m0":
        packed, scales = quantize_mxfp4(x)
    else:
        packed, scales, _ = quantize_nvfp4(x, global_scale=1.0, amax_floor=NVFP4_DEEPSEEK_AMAX_FLOOR)
    if not inplace:
        return packed, scales
    if scale_fmt == "ue8m0":
        values = dequantize_mxfp4(packed, scales)
    else:
        values = dequantize_nvfp4(packed, scales, 1.0)
    x.copy_(values.to(x.dtype))
    return x
