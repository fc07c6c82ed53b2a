"""FP4 E2M1 elements, two a byte, with MXFP4 (E8M0 scale per 32) and NVFP4 (E4M3 scale per 16
plus an FP32 global scale) block scaling.

E2M1 code (4 bits, ``s e e m``): magnitudes ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` for codes 0..7, the
sign in bit 3 (code 8 is -0). Quantization rounds to the nearest grid value, ties to the even
code (mantissa bit 0), and saturates at +-6 -- what ``cvt.rn.satfinite.e2m1x2.f32`` does.

Packing (``uint8 [..., K/2]``): element ``2j`` in the LOW nibble of byte ``j``, element
``2j+1`` in the high nibble. This is the OCP MX layout and torch's ``float4_e2m1fn_x2``
(its header documents ``val1 : val0`` as bits ``7654 : 3210``); DeepSeek's FP4 weights use
that dtype, so the bytes are interchangeable (``packed.view(torch.float4_e2m1fn_x2)``).

MXFP4 (DeepSeek's ``fp4_quant`` with E8M0 scales), per group of 32:

    amax  = max(max |x_group|, 6 * 2**-126)     # keeps the scale a normal FP32 number
    scale = ue8m0_round_up(amax * fp32(1/6))    # a power of two, rounded UP, stored as E8M0
    code  = e2m1(x / scale)

(OCP's MX recipe instead takes ``2**(floor(log2 amax) - 2)``, which can saturate the largest
elements; rounding the scale up never saturates.)

NVFP4, per group of 16, with one FP32 global scale for the whole tensor:

    global = amax_tensor / (448 * 6)            # 1.0 for an all-zero tensor
    scale  = e4m3(min(max(amax_group, floor) / (6 * global), 448))   # RNE, saturating
    code   = e2m1(x / (float(scale) * global))  # a zero scale gives zero codes
    x_hat  = e2m1_value * (float(scale) * global)

DeepSeek's E4M3 ``fp4_quant`` (compressed KV cache) is this with ``global = 1`` and
``floor = 6 * 2**-9`` (so even an all-zero group keeps a nonzero scale): see
`quantize_nvfp4`'s arguments.
"""

from __future__ import annotations

from typing import Mapping

import torch

from .base import Format, FormatError, QuantizedTensor, expand_groups, group_view, register_format
from .fp8 import FP8_E4M3_MAX, check_float_input, e8m0_decode, e8m0_encode, encode_e4m3, ue8m0_round_up

__all__ = [
    "E2M1_MAX",
    "E2M1_VALUES",
    "MXFP4_GROUP",
    "NVFP4_GROUP",
    "MXFP4_AMAX_FLOOR",
    "NVFP4_DEEPSEEK_AMAX_FLOOR",
    "quantize_e2m1",
    "e2m1_to_float",
    "pack_fp4",
    "unpack_fp4",
    "quantize_mxfp4",
    "dequantize_mxfp4",
    "nvfp4_global_scale",
    "quantize_nvfp4",
    "dequantize_nvfp4",
]

E2M1_MAX = 6.0
#: value of each 4-bit code 0..15 (code 8 is -0.0)
E2M1_VALUES = torch.tensor(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=torch.float32,
)
_E2M1_SIGN_BIT = 8
MXFP4_GROUP = 32
NVFP4_GROUP = 16
#: DeepSeek's floor on an MXFP4 group's amax: the scale stays >= 2**-126
MXFP4_AMAX_FLOOR = 6 * 2.0**-126
#: DeepSeek's floor for E4M3-scaled FP4: the scale stays >= 2**-9 (E4M3's smallest subnormal)
NVFP4_DEEPSEEK_AMAX_FLOOR = 6 * 2.0**-9

_FP4_MAX_INV = torch.tensor(1.0 / E2M1_MAX, dtype=torch.float32)
_NVFP4_GLOBAL_DIVISOR = FP8_E4M3_MAX * E2M1_MAX  # 2688: the largest scale x the largest element


def _rounding_thresholds() -> list[tuple[float, bool]]:
    """(midpoint between magnitude codes i and i+1, whether a tie rounds up). A tie goes to
    the even code, i.e. up exactly when code i+1 is even."""
    mags = E2M1_VALUES[:8].tolist()
    return [((mags[i] + mags[i + 1]) / 2, (i + 1) % 2 == 0) for i in range(7)]


_THRESHOLDS = _rounding_thresholds()


def quantize_e2m1(x_scaled: torch.Tensor) -> torch.Tensor:
    """Values already divided by their scale (any float dtype, any shape) -> E2M1 codes
    ``uint8`` (same shape): round to nearest, ties to even, saturate at +-6. The sign is kept
    (a negative value that rounds to zero gives code 8, -0). NaN raises `FormatError`."""
    if not x_scaled.is_floating_point():
        raise FormatError(f"quantize_e2m1: expected a float tensor, got {x_scaled.dtype}")
    x = x_scaled.float()
    if bool(torch.isnan(x).any()):
        raise FormatError("quantize_e2m1: NaN has no E2M1 encoding")
    mag = x.abs()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for midpoint, tie_up in _THRESHOLDS:
        code += (mag >= midpoint if tie_up else mag > midpoint).to(torch.uint8)
    return code | (torch.signbit(x).to(torch.uint8) * _E2M1_SIGN_BIT)


def _check_codes(codes: torch.Tensor, who: str) -> None:
    if codes.dtype != torch.uint8:
        raise FormatError(f"{who}: FP4 codes must be uint8, got {codes.dtype}")
    if codes.numel() and int(codes.max()) > 15:
        raise FormatError(f"{who}: FP4 codes must be in 0..15, got {int(codes.max())}")


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes ``uint8`` in 0..15 -> float32 values, same shape."""
    _check_codes(codes, "e2m1_to_float")
    return E2M1_VALUES.to(codes.device)[codes.long()]


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """``uint8 [..., K]`` codes (0..15, K even) -> ``uint8 [..., K/2]``: element 2j in the low
    nibble of byte j, element 2j+1 in the high nibble."""
    _check_codes(codes, "pack_fp4")
    if codes.dim() < 1 or codes.shape[-1] % 2:
        raise FormatError(f"pack_fp4: last dim must be even, got shape {tuple(codes.shape)}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """``uint8 [..., K/2]`` (or ``torch.float4_e2m1fn_x2``) -> codes ``uint8 [..., K]``."""
    if packed.dtype == getattr(torch, "float4_e2m1fn_x2", None):
        packed = packed.view(torch.uint8)
    if packed.dtype != torch.uint8 or packed.dim() < 1:
        raise FormatError(f"unpack_fp4: expected uint8 [..., K/2], got {packed.dtype} {tuple(packed.shape)}")
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def _check_groups(x: torch.Tensor, group: int, who: str) -> torch.Tensor:
    check_float_input(x, who)
    if x.shape[-1] % group:
        raise FormatError(f"{who}: last dim of {tuple(x.shape)} is not a multiple of the group size {group}")
    return group_view(x.float(), group)


def _check_scales(scales: torch.Tensor, dtype: torch.dtype, want: tuple[int, ...], who: str) -> None:
    if scales.dtype != dtype or tuple(scales.shape) != want:
        raise FormatError(f"{who}: scales must be {dtype} {want}, got {scales.dtype} {tuple(scales.shape)}")


# -- MXFP4 ---------------------------------------------------------------------------------
def _check_mx_group(group_size: int, who: str) -> None:
    if group_size != MXFP4_GROUP:
        raise FormatError(f"{who}: MXFP4 uses groups of {MXFP4_GROUP}, got {group_size}")


def _mxfp4_codes(x: torch.Tensor, scales_e8m0: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    who = "quantize_mxfp4"
    groups = _check_groups(x, MXFP4_GROUP, who)
    if scales_e8m0 is None:
        amax = groups.abs().amax(dim=-1)
        if bool(torch.isnan(amax).any()):
            raise FormatError(f"{who}: input contains NaN, which E2M1 cannot encode")
        amax = amax.clamp_min(MXFP4_AMAX_FLOOR)
        scales_e8m0 = e8m0_encode(ue8m0_round_up(amax * _FP4_MAX_INV.to(amax.device)))
    else:
        _check_scales(scales_e8m0, torch.uint8, tuple(groups.shape[:-1]), who)
    scale = _decode_mx_scales(scales_e8m0, who)
    codes = quantize_e2m1(groups / scale.unsqueeze(-1))
    return codes.reshape(x.shape), scales_e8m0


def _decode_mx_scales(scales_e8m0: torch.Tensor, who: str) -> torch.Tensor:
    scale = e8m0_decode(scales_e8m0)
    if bool(torch.isnan(scale).any()):
        raise FormatError(f"{who}: E8M0 scale byte 255 is NaN")
    return scale


def quantize_mxfp4(
    x: torch.Tensor, group_size: int = MXFP4_GROUP, scales_e8m0: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., K]`` (float32/bf16/fp16, K a multiple of 32) to MXFP4 (rule in the
    module docstring). scales_e8m0: optional ``uint8 [..., K/32]`` to re-use.

    Returns ``(packed uint8 [..., K/2], scales_e8m0 uint8 [..., K/32])``.
    """
    _check_mx_group(group_size, "quantize_mxfp4")
    codes, scales_e8m0 = _mxfp4_codes(x, scales_e8m0)
    return pack_fp4(codes), scales_e8m0


def _dequantize_mxfp4_codes(codes: torch.Tensor, scales_e8m0: torch.Tensor, who: str) -> torch.Tensor:
    _check_codes(codes, who)
    want = (*codes.shape[:-1], codes.shape[-1] // MXFP4_GROUP)
    if codes.shape[-1] % MXFP4_GROUP:
        raise FormatError(f"{who}: K={codes.shape[-1]} is not a multiple of {MXFP4_GROUP}")
    _check_scales(scales_e8m0, torch.uint8, want, who)
    return e2m1_to_float(codes) * expand_groups(_decode_mx_scales(scales_e8m0, who), MXFP4_GROUP)


def dequantize_mxfp4(packed: torch.Tensor, scales_e8m0: torch.Tensor) -> torch.Tensor:
    """``packed uint8 [..., K/2]``, ``scales_e8m0 uint8 [..., K/32]`` -> float32 ``[..., K]``
    = ``e2m1_value * 2**(byte - 127)``."""
    return _dequantize_mxfp4_codes(unpack_fp4(packed), scales_e8m0, "dequantize_mxfp4")


# -- NVFP4 ---------------------------------------------------------------------------------
def nvfp4_global_scale(x: torch.Tensor) -> torch.Tensor:
    """The NVFP4 global scale of a tensor: ``amax(|x|) / (448 * 6)`` as a float32 0-dim
    tensor (1.0 when x is all zero, so nothing divides by zero)."""
    check_float_input(x, "nvfp4_global_scale")
    amax = x.float().abs().amax()
    return torch.where(amax > 0, amax / _NVFP4_GLOBAL_DIVISOR, torch.ones_like(amax))


def _as_global_scale(global_scale: torch.Tensor | float, device: torch.device, who: str) -> torch.Tensor:
    if not isinstance(global_scale, torch.Tensor):
        global_scale = torch.tensor(float(global_scale), dtype=torch.float32)
    if global_scale.dtype != torch.float32 or global_scale.numel() != 1:
        raise FormatError(
            f"{who}: global_scale must be one float32 value, got {global_scale.dtype} {tuple(global_scale.shape)}"
        )
    g = global_scale.reshape(()).to(device)
    if not (bool(torch.isfinite(g)) and float(g) > 0):
        raise FormatError(f"{who}: global_scale must be positive and finite, got {float(g)}")
    return g


def _nvfp4_codes(
    x: torch.Tensor,
    global_scale: torch.Tensor | float | None,
    scales: torch.Tensor | None,
    amax_floor: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    who = "quantize_nvfp4"
    groups = _check_groups(x, NVFP4_GROUP, who)
    if global_scale is None:
        if scales is not None:
            raise FormatError(f"{who}: given block scales need the global_scale they were made with")
        global_scale = nvfp4_global_scale(x)
    g = _as_global_scale(global_scale, x.device, who)
    if scales is None:
        amax = groups.abs().amax(dim=-1).clamp_min(amax_floor)
        scales = encode_e4m3(amax / (E2M1_MAX * g))
    else:
        _check_scales(scales, torch.float8_e4m3fn, tuple(groups.shape[:-1]), who)
        s = scales.float()
        if not bool((torch.isfinite(s) & (s >= 0)).all()):
            raise FormatError(f"{who}: E4M3 block scales must be non-negative and finite")
    effective = (scales.float() * g).unsqueeze(-1)
    # A block whose scale underflowed to 0 holds only values negligible next to the tensor's
    # amax: they quantize to 0 instead of dividing by zero.
    x_scaled = torch.where(effective > 0, groups / effective, torch.zeros_like(groups))
    return quantize_e2m1(x_scaled).reshape(x.shape), scales, g


def quantize_nvfp4(
    x: torch.Tensor,
    global_scale: torch.Tensor | float | None = None,
    scales: torch.Tensor | None = None,
    *,
    amax_floor: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., K]`` (float32/bf16/fp16, K a multiple of 16) to NVFP4 (rule in the
    module docstring).

    global_scale: ``None`` computes `nvfp4_global_scale(x)`; else a positive float32 value.
    scales: optional ``float8_e4m3fn [..., K/16]`` block scales to re-use (needs global_scale).
    amax_floor: lower bound on each block's amax (0 = NVIDIA's recipe; DeepSeek's E4M3
    ``fp4_quant`` uses ``global_scale=1.0, amax_floor=NVFP4_DEEPSEEK_AMAX_FLOOR``).
    Returns ``(packed uint8 [..., K/2], scales float8_e4m3fn [..., K/16], global_scale
    float32 0-dim)``.
    """
    codes, scales, g = _nvfp4_codes(x, global_scale, scales, amax_floor)
    return pack_fp4(codes), scales, g


def _as_row_global_scales(global_scale: torch.Tensor | float, codes: torch.Tensor, who: str) -> torch.Tensor:
    """One global scale for the tensor (`_as_global_scale`), or one per row: float32
    ``[..., N, 1]`` matching ``codes [..., N, K]`` (stacked tensors that each had their own, e.g.
    a checkpoint's experts, or gate rows and up rows). Positive and finite either way."""
    if isinstance(global_scale, torch.Tensor) and global_scale.numel() != 1:
        want = (*codes.shape[:-1], 1)
        if global_scale.dtype != torch.float32 or tuple(global_scale.shape) != want:
            raise FormatError(f"{who}: global_scale must be one float32 value or float32 {want} (one per row), "
                              f"got {global_scale.dtype} {tuple(global_scale.shape)}")
        g = global_scale.to(codes.device)
        if not bool((torch.isfinite(g) & (g > 0)).all()):
            raise FormatError(f"{who}: global_scale must be positive and finite")
        return g
    return _as_global_scale(global_scale, codes.device, who)


def _dequantize_nvfp4_codes(
    codes: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | float, who: str
) -> torch.Tensor:
    _check_codes(codes, who)
    if codes.shape[-1] % NVFP4_GROUP:
        raise FormatError(f"{who}: K={codes.shape[-1]} is not a multiple of {NVFP4_GROUP}")
    _check_scales(scales, torch.float8_e4m3fn, (*codes.shape[:-1], codes.shape[-1] // NVFP4_GROUP), who)
    g = _as_row_global_scales(global_scale, codes, who)
    return e2m1_to_float(codes) * expand_groups(scales.float() * g, NVFP4_GROUP)


def dequantize_nvfp4(
    packed: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor | float
) -> torch.Tensor:
    """``packed uint8 [..., K/2]``, ``scales float8_e4m3fn [..., K/16]``, float32
    ``global_scale`` (one value, or ``[..., N, 1]``: one per row) -> float32 ``[..., K]`` =
    ``e2m1_value * (float(scale) * global_scale)``."""
    return _dequantize_nvfp4_codes(unpack_fp4(packed), scales, global_scale, "dequantize_nvfp4")


# -- registered formats --------------------------------------------------------------------
@register_format
class Mxfp4(Format):
    """E2M1 codes (unpacked ``uint8`` 0..15), one E8M0 scale byte per 32."""

    name = "mxfp4"
    group_size = MXFP4_GROUP
    code_dtype = torch.uint8
    scale_dtype = torch.uint8
    max_code_value = E2M1_MAX

    def quantize(self, x: torch.Tensor, scales: torch.Tensor | None = None) -> QuantizedTensor:
        codes, scales = _mxfp4_codes(x, scales)
        return QuantizedTensor(codes=codes, scales=scales, fmt=self.name)

    def dequantize(self, q: QuantizedTensor) -> torch.Tensor:
        self.check_quantized(q)
        return _dequantize_mxfp4_codes(q.codes, q.scales, self.name)

    def pack(self, q: QuantizedTensor) -> dict[str, torch.Tensor]:
        """Storage: ``packed`` (uint8 ``[..., K/2]``) and ``scales_e8m0`` (uint8 ``[..., K/32]``)."""
        self.check_quantized(q)
        return {"packed": pack_fp4(q.codes), "scales_e8m0": q.scales}

    def unpack(self, packed: Mapping[str, torch.Tensor]) -> QuantizedTensor:
        if "packed" not in packed or "scales_e8m0" not in packed:
            raise FormatError(f"{self.name}: packed form needs 'packed' and 'scales_e8m0', got {sorted(packed)}")
        q = QuantizedTensor(codes=unpack_fp4(packed["packed"]), scales=packed["scales_e8m0"], fmt=self.name)
        self.check_quantized(q)
        return q


@register_format
class Nvfp4(Format):
    """E2M1 codes (unpacked ``uint8`` 0..15), one E4M3 scale per 16, one FP32 global scale
    (`quantize` makes one for the tensor; a stack of tensors may carry one per row,
    ``float32 [..., N, 1]``)."""

    name = "nvfp4"
    group_size = NVFP4_GROUP
    code_dtype = torch.uint8
    scale_dtype = torch.float8_e4m3fn
    max_code_value = E2M1_MAX

    def quantize(
        self,
        x: torch.Tensor,
        scales: torch.Tensor | None = None,
        global_scale: torch.Tensor | float | None = None,
    ) -> QuantizedTensor:
        """As `quantize_nvfp4`; re-using ``scales`` needs their ``global_scale`` too."""
        codes, scales, g = _nvfp4_codes(x, global_scale, scales, amax_floor=0.0)
        return QuantizedTensor(codes=codes, scales=scales, fmt=self.name, global_scale=g)

    def check_quantized(self, q: QuantizedTensor) -> None:
        super().check_quantized(q)
        if q.global_scale is None:
            raise FormatError(f"{self.name}: a QuantizedTensor needs its global_scale")
        _as_row_global_scales(q.global_scale, q.codes, self.name)

    def dequantize(self, q: QuantizedTensor) -> torch.Tensor:
        self.check_quantized(q)
        return _dequantize_nvfp4_codes(q.codes, q.scales, q.global_scale, self.name)

    def pack(self, q: QuantizedTensor) -> dict[str, torch.Tensor]:
        """Storage: ``packed`` (uint8 ``[..., K/2]``), ``scales`` (float8_e4m3fn
        ``[..., K/16]``), ``global_scale`` (float32 0-dim)."""
        self.check_quantized(q)
        return {"packed": pack_fp4(q.codes), "scales": q.scales, "global_scale": q.global_scale}

    def unpack(self, packed: Mapping[str, torch.Tensor]) -> QuantizedTensor:
        missing = {"packed", "scales", "global_scale"} - set(packed)
        if missing:
            raise FormatError(f"{self.name}: packed form lacks {sorted(missing)}")
        codes = unpack_fp4(packed["packed"])
        g = _as_row_global_scales(packed["global_scale"], codes, self.name)
        q = QuantizedTensor(codes=codes, scales=packed["scales"], fmt=self.name, global_scale=g)
        self.check_quantized(q)
        return q
