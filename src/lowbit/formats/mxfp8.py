"""MXFP8: FP8 E4M3 elements with one E8M0 (power-of-two) scale byte per 32 along the last dim.

It is the FP8 group-32 UE8M0 scheme of `lowbit.formats.fp8` (same amax floor, same
``ue8m0_round_up(amax * fp32(1/448))`` scale, same saturating RNE cast), with the scale stored
as its E8M0 byte ``2**(byte - 127)`` -- the form the output-centric decode kernels read.
"""

from __future__ import annotations

from typing import Mapping

import torch

from .base import Format, FormatError, QuantizedTensor, register_format
from .fp8 import FP8_E4M3_MAX, dequantize_fp8_groups, e8m0_decode, e8m0_encode, quantize_fp8_groups

__all__ = ["MXFP8_GROUP", "quantize_mxfp8", "dequantize_mxfp8"]

MXFP8_GROUP = 32


def _decode_scales(scales_e8m0: torch.Tensor, who: str) -> torch.Tensor:
    if scales_e8m0.dtype != torch.uint8:
        raise FormatError(f"{who}: scales_e8m0 must be uint8 E8M0 bytes, got {scales_e8m0.dtype}")
    scales = e8m0_decode(scales_e8m0)
    if bool(torch.isnan(scales).any()):
        raise FormatError(f"{who}: E8M0 scale byte 255 is NaN")
    return scales


def quantize_mxfp8(
    x: torch.Tensor, scales_e8m0: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., K]`` (float32/bf16/fp16, K a multiple of 32) to MXFP8.
    scales_e8m0: optional ``uint8 [..., K/32]`` to re-use.

    Returns ``(codes float8_e4m3fn [..., K], scales_e8m0 uint8 [..., K/32])``.
    """
    if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[-1] % MXFP8_GROUP:
        raise FormatError(f"quantize_mxfp8: last dim of {tuple(x.shape)} is not a multiple of {MXFP8_GROUP}")
    scales = None if scales_e8m0 is None else _decode_scales(scales_e8m0, "quantize_mxfp8")
    codes, scales = quantize_fp8_groups(x, MXFP8_GROUP, "ue8m0", scales=scales)
    return codes, e8m0_encode(scales)


def dequantize_mxfp8(codes: torch.Tensor, scales_e8m0: torch.Tensor) -> torch.Tensor:
    """``codes float8_e4m3fn [..., K]``, ``scales_e8m0 uint8 [..., K/32]`` -> float32
    ``[..., K]`` = ``float(code) * 2**(byte - 127)``."""
    if codes.dim() >= 1 and codes.shape[-1] % MXFP8_GROUP:
        raise FormatError(f"dequantize_mxfp8: last dim of {tuple(codes.shape)} is not a multiple of {MXFP8_GROUP}")
    return dequantize_fp8_groups(codes, _decode_scales(scales_e8m0, "dequantize_mxfp8"), MXFP8_GROUP)


@register_format
class Mxfp8(Format):
    """E4M3 codes, one E8M0 scale byte (``uint8``) per 32."""

    name = "mxfp8"
    group_size = MXFP8_GROUP
    code_dtype = torch.float8_e4m3fn
    scale_dtype = torch.uint8
    max_code_value = FP8_E4M3_MAX

    def quantize(self, x: torch.Tensor, scales: torch.Tensor | None = None) -> QuantizedTensor:
        codes, scales = quantize_mxfp8(x, scales)
        return QuantizedTensor(codes=codes, scales=scales, fmt=self.name)

    def dequantize(self, q: QuantizedTensor) -> torch.Tensor:
        self.check_quantized(q)
        return dequantize_mxfp8(q.codes, q.scales)

    def pack(self, q: QuantizedTensor) -> dict[str, torch.Tensor]:
        """Storage: ``codes`` (float8_e4m3fn) and ``scales_e8m0`` (uint8)."""
        self.check_quantized(q)
        return {"codes": q.codes, "scales_e8m0": q.scales}

    def unpack(self, packed: Mapping[str, torch.Tensor]) -> QuantizedTensor:
        if "codes" not in packed or "scales_e8m0" not in packed:
            raise FormatError(f"{self.name}: packed form needs 'codes' and 'scales_e8m0', got {sorted(packed)}")
        q = QuantizedTensor(codes=packed["codes"], scales=packed["scales_e8m0"], fmt=self.name)
        self.check_quantized(q)
        return q
