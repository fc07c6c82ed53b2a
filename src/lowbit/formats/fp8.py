"""FP8 E4M3 with per-group scales along the last dim, 128x128 block-scaled FP8 weights, and
the UE8M0 (power-of-two) scale helpers every microscaled format shares.

Element type: ``torch.float8_e4m3fn`` (finite range +-448, no infinities; 3 mantissa bits,
subnormals down to 2**-9). Casting onto it is round-to-nearest-even, after an explicit clamp to
+-448 (saturating, as ``cvt.rn.satfinite`` does on the GPU).

Scale rule (DeepSeek's ``act_quant``, followed to the bit so a kernel can match it):

    amax  = max(max |x_group|, 1e-4)            # the floor keeps all-zero groups finite
    scale = amax * fp32(1/448)                  # multiply by the FP32 reciprocal, not divide
    scale = ue8m0_round_up(scale)               # only for scale_fmt="ue8m0"
    code  = e4m3(clamp(x / scale, -448, 448))   # FP32 division, then RNE cast
    x_hat = float(code) * scale

UE8M0 scales are kept as FP32 tensors holding a power of two (what the kernels multiply by);
`e8m0_encode` / `e8m0_decode` convert them to and from the one-byte E8M0 form (the biased
exponent, ``2**(byte - 127)``, 255 = NaN), which is also ``torch.float8_e8m0fnu``'s bit layout.

Registered formats: ``fp8_e4m3_g128``, ``fp8_e4m3_g128_ue8m0``, ``fp8_e4m3_g32``,
``fp8_e4m3_g32_ue8m0``.
"""

from __future__ import annotations

from typing import ClassVar, Mapping

import torch

from .base import Format, FormatError, QuantizedTensor, expand_groups, group_view, register_format

__all__ = [
    "FP8_E4M3_MAX",
    "FP8_AMAX_FLOOR",
    "FP8_GROUP_SIZES",
    "FP8_SCALE_FMTS",
    "check_float_input",
    "ue8m0_round_up",
    "e8m0_encode",
    "e8m0_decode",
    "is_power_of_two",
    "fp8_scales_from_amax",
    "encode_e4m3",
    "quantize_fp8_groups",
    "dequantize_fp8_groups",
    "quantize_fp8_blocks",
    "dequantize_fp8_blocks",
]

FP8_E4M3_MAX = 448.0
#: lower bound on a group's amax (DeepSeek's ``T.max(amax, 1e-4)``)
FP8_AMAX_FLOOR = 1e-4
FP8_GROUP_SIZES = (128, 32)
FP8_BLOCK_SIZES = (128,)
#: ``None`` = plain FP32 scale; ``"ue8m0"`` = power of two rounded up
FP8_SCALE_FMTS = (None, "ue8m0")

# The kernels multiply by the FP32 reciprocal; FP32(1/448) is a hair above 1/448.
_FP8_MAX_INV = torch.tensor(1.0 / FP8_E4M3_MAX, dtype=torch.float32)

_FLOAT_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FP32_EXP_MASK = 0xFF
_FP32_MANTISSA_MASK = (1 << 23) - 1
_FP32_EXP_BIAS = 127
# 2**-127 is an FP32 subnormal: only the top mantissa bit set. E8M0 byte 0 stands for it.
_FP32_BITS_2_POW_M127 = 1 << 22
_FP32_BITS_QNAN = 0x7FC00000
_E8M0_NAN = 255


def check_float_input(x: torch.Tensor, who: str) -> None:
    """Raise `FormatError` unless ``x`` is a float32 / bfloat16 / float16 tensor of rank >= 1."""
    if not isinstance(x, torch.Tensor):
        raise FormatError(f"{who}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_INPUT_DTYPES:
        raise FormatError(
            f"{who}: input must be float32, bfloat16 or float16, got {x.dtype} {tuple(x.shape)}"
        )
    if x.dim() < 1:
        raise FormatError(f"{who}: expected a tensor with at least one dim, got a scalar")


def _check_group_size(group_size: int, who: str) -> None:
    if group_size not in FP8_GROUP_SIZES:
        raise FormatError(f"{who}: unsupported group size {group_size}; supported: {FP8_GROUP_SIZES}")


def _check_scale_fmt(scale_fmt: str | None, who: str) -> None:
    if scale_fmt not in FP8_SCALE_FMTS:
        raise FormatError(f"{who}: unsupported scale_fmt {scale_fmt!r}; supported: {FP8_SCALE_FMTS}")


# -- power-of-two scales (UE8M0) -----------------------------------------------------------
def ue8m0_round_up(scale: torch.Tensor) -> torch.Tensor:
    """Round FP32 scales up to a power of two, on the IEEE-754 bits (DeepSeek's
    ``fast_pow2(fast_log2_ceil(s))``): ``ceil(log2 s) = exponent - 127 + (mantissa != 0)``,
    then ``2**k`` is rebuilt as the bits ``(k + 127) << 23``. A power of two is returned as is.

    scale: float32, any shape, values >= 0. Returns float32, same shape.
    Edge cases: 0 -> 0; subnormals -> 2**-126; above 2**127 -> inf; inf / NaN pass through.
    Negative scales raise `FormatError`.
    """
    if scale.dtype != torch.float32:
        raise FormatError(f"ue8m0_round_up: scale must be float32, got {scale.dtype}")
    if bool((scale < 0).any()):
        raise FormatError("ue8m0_round_up: scales must be >= 0")
    bits = scale.contiguous().view(torch.int32)
    exponent = (bits >> 23) & _FP32_EXP_MASK
    log2_ceil = exponent - _FP32_EXP_BIAS + ((bits & _FP32_MANTISSA_MASK) != 0).to(torch.int32)
    # k = 128 gives exponent field 255 with a zero mantissa: +inf, the right overflow.
    rounded = ((log2_ceil + _FP32_EXP_BIAS).clamp(max=_FP32_EXP_MASK) << 23).view(torch.float32)
    return torch.where(exponent == _FP32_EXP_MASK, scale, rounded)


def is_power_of_two(scale: torch.Tensor) -> torch.Tensor:
    """Elementwise: is this FP32 value an exact positive power of two in E8M0's range
    ``[2**-127, 2**127]``? Returns a bool tensor of the same shape."""
    if scale.dtype != torch.float32:
        raise FormatError(f"is_power_of_two: scale must be float32, got {scale.dtype}")
    bits = scale.contiguous().view(torch.int32)
    exponent = (bits >> 23) & _FP32_EXP_MASK
    normal = (bits & ~(_FP32_EXP_MASK << 23)) == 0  # sign and mantissa clear
    normal &= (exponent >= 1) & (exponent <= 254)
    return normal | (bits == _FP32_BITS_2_POW_M127)


def e8m0_encode(scale: torch.Tensor, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """FP32 powers of two -> E8M0 bytes (the biased exponent: ``2**(byte - 127)``).

    scale: float32 powers of two in ``[2**-127, 2**127]`` (anything else raises `FormatError`).
    dtype: ``torch.uint8`` (default) or ``torch.float8_e8m0fnu`` (same bits, torch's dtype).
    """
    if dtype not in (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8)):
        raise FormatError(f"e8m0_encode: dtype must be uint8 or float8_e8m0fnu, got {dtype}")
    ok = is_power_of_two(scale)
    if not bool(ok.all()):
        bad = scale[~ok].flatten()[:4].tolist()
        raise FormatError(f"e8m0_encode: scales must be powers of two in [2**-127, 2**127], got {bad}")
    bits = scale.contiguous().view(torch.int32)
    byte = torch.where(bits == _FP32_BITS_2_POW_M127, 0, (bits >> 23) & _FP32_EXP_MASK)
    return byte.to(torch.uint8).view(dtype)


def e8m0_decode(byte: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes (``uint8`` or ``torch.float8_e8m0fnu``) -> float32 ``2**(byte - 127)``;
    byte 0 is 2**-127 (an FP32 subnormal), byte 255 is NaN."""
    if byte.dtype == getattr(torch, "float8_e8m0fnu", None):
        byte = byte.view(torch.uint8)
    if byte.dtype != torch.uint8:
        raise FormatError(f"e8m0_decode: expected uint8 or float8_e8m0fnu bytes, got {byte.dtype}")
    e = byte.to(torch.int32)
    bits = torch.where(e == 0, _FP32_BITS_2_POW_M127, e << 23)
    bits = torch.where(e == _E8M0_NAN, _FP32_BITS_QNAN, bits)
    return bits.view(torch.float32)


def fp8_scales_from_amax(amax: torch.Tensor, scale_fmt: str | None = None) -> torch.Tensor:
    """The FP8 scale rule: ``max(amax, 1e-4) * fp32(1/448)``, rounded up to a power of two
    when ``scale_fmt == "ue8m0"``. amax: float32, any shape -> float32 scales, same shape."""
    _check_scale_fmt(scale_fmt, "fp8_scales_from_amax")
    scale = amax.float().clamp_min(FP8_AMAX_FLOOR) * _FP8_MAX_INV.to(amax.device)
    return ue8m0_round_up(scale) if scale_fmt == "ue8m0" else scale


def encode_e4m3(x_scaled: torch.Tensor) -> torch.Tensor:
    """float32 values already divided by their scale -> ``float8_e4m3fn``: saturate to +-448,
    then round to nearest even. NaN stays NaN."""
    return x_scaled.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


# -- per-group (1 x g) FP8 ---------------------------------------------------------------
def _check_group_scales(scales: torch.Tensor, want: tuple[int, ...], scale_fmt: str | None, who: str) -> None:
    if scales.dtype != torch.float32 or tuple(scales.shape) != want:
        raise FormatError(
            f"{who}: scales must be float32 {want}, got {scales.dtype} {tuple(scales.shape)}"
        )
    if not bool(((scales > 0) & torch.isfinite(scales)).all()):
        raise FormatError(f"{who}: scales must be positive and finite")
    if scale_fmt == "ue8m0" and not bool(is_power_of_two(scales).all()):
        raise FormatError(f"{who}: ue8m0 scales must be powers of two")


def _num_groups(k: int, group_size: int) -> int:
    return -(-k // group_size)


def quantize_fp8_groups(
    x: torch.Tensor,
    group_size: int = 128,
    scale_fmt: str | None = None,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., K]`` (float32/bf16/fp16) to FP8 E4M3 with one scale per
    ``group_size`` consecutive elements of the last dim (the module docstring has the rule).

    group_size: 128 or 32. scale_fmt: ``None`` (FP32 scale) or ``"ue8m0"`` (power of two).
    K need not be a multiple of the group size: the last group is then partial (its amax is
    over the elements that exist), which is the ``[M, ceil(K/128)]`` scale layout fp8_gemm
    reads. The registered formats and ``act_quant`` require whole groups.
    scales: optional float32 ``[..., ceil(K/group_size)]`` to re-use instead of computing them.
    Returns ``(codes float8_e4m3fn [..., K], scales float32 [..., ceil(K/group_size)])``.
    """
    who = "quantize_fp8_groups"
    _check_group_size(group_size, who)
    _check_scale_fmt(scale_fmt, who)
    check_float_input(x, who)
    k = x.shape[-1]
    padded_k = _num_groups(k, group_size) * group_size
    # Zero padding does not change a group's amax.
    groups = group_view(torch.nn.functional.pad(x.float(), (0, padded_k - k)), group_size)
    if scales is None:
        scales = fp8_scales_from_amax(groups.abs().amax(dim=-1), scale_fmt)
    else:
        _check_group_scales(scales, tuple(groups.shape[:-1]), scale_fmt, who)
    codes = encode_e4m3(groups / scales.unsqueeze(-1)).reshape(*x.shape[:-1], padded_k)
    return codes[..., :k].contiguous(), scales


def dequantize_fp8_groups(codes: torch.Tensor, scales: torch.Tensor, group_size: int = 128) -> torch.Tensor:
    """``codes float8_e4m3fn [..., K]``, ``scales float32 [..., ceil(K/group_size)]`` ->
    float32 ``[..., K]`` = ``float(code) * scale``."""
    who = "dequantize_fp8_groups"
    _check_group_size(group_size, who)
    if codes.dtype != torch.float8_e4m3fn or codes.dim() < 1:
        raise FormatError(f"{who}: codes must be float8_e4m3fn [..., K], got {codes.dtype} {tuple(codes.shape)}")
    k = codes.shape[-1]
    want = (*codes.shape[:-1], _num_groups(k, group_size))
    if tuple(scales.shape) != want or scales.dtype != torch.float32:
        raise FormatError(
            f"{who}: codes {tuple(codes.shape)} with group {group_size} need float32 scales {want}, "
            f"got {scales.dtype} {tuple(scales.shape)}"
        )
    return codes.float() * expand_groups(scales, group_size)[..., :k]


# -- 128 x 128 block-scaled FP8 weights ----------------------------------------------------
def _check_block(block: int, who: str) -> None:
    if block not in FP8_BLOCK_SIZES:
        raise FormatError(f"{who}: unsupported block size {block}; supported: {FP8_BLOCK_SIZES}")


def _block_scales_shape(n: int, k: int, block: int) -> tuple[int, int]:
    return (-(-n // block), -(-k // block))


def quantize_fp8_blocks(
    w: torch.Tensor, block: int = 128, scale_fmt: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize weights ``w [..., N, K]`` to FP8 E4M3 with one scale per ``block x block`` tile
    (the FP8 scale rule above, amax over the tile). N and K need not be multiples of the
    block: edge tiles are partial and their scale covers only the elements that exist.

    Returns ``(codes float8_e4m3fn [..., N, K], scales float32 [..., ceil(N/b), ceil(K/b)])``.
    """
    who = "quantize_fp8_blocks"
    _check_block(block, who)
    _check_scale_fmt(scale_fmt, who)
    check_float_input(w, who)
    if w.dim() < 2:
        raise FormatError(f"{who}: expected weights [..., N, K], got shape {tuple(w.shape)}")
    n, k = w.shape[-2:]
    nb, kb = _block_scales_shape(n, k, block)
    # Zero padding does not change a tile's amax.
    padded = torch.nn.functional.pad(w.float(), (0, kb * block - k, 0, nb * block - n))
    tiles = padded.reshape(*w.shape[:-2], nb, block, kb, block)
    scales = fp8_scales_from_amax(tiles.abs().amax(dim=(-3, -1)), scale_fmt)
    codes = encode_e4m3(tiles / scales[..., :, None, :, None])
    codes = codes.reshape(*w.shape[:-2], nb * block, kb * block)[..., :n, :k].contiguous()
    return codes, scales


def dequantize_fp8_blocks(codes: torch.Tensor, scales: torch.Tensor, block: int = 128) -> torch.Tensor:
    """``codes float8_e4m3fn [..., N, K]``, ``scales float32 [..., ceil(N/b), ceil(K/b)]`` ->
    float32 ``[..., N, K]`` = ``float(code) * scale of its tile``."""
    who = "dequantize_fp8_blocks"
    _check_block(block, who)
    if codes.dtype != torch.float8_e4m3fn or codes.dim() < 2:
        raise FormatError(f"{who}: codes must be float8_e4m3fn [..., N, K], got {codes.dtype} {tuple(codes.shape)}")
    n, k = codes.shape[-2:]
    want = (*codes.shape[:-2], *_block_scales_shape(n, k, block))
    if scales.dtype != torch.float32 or tuple(scales.shape) != want:
        raise FormatError(
            f"{who}: codes {tuple(codes.shape)} need float32 block scales {want}, "
            f"got {scales.dtype} {tuple(scales.shape)}"
        )
    full = scales.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
    return codes.float() * full[..., :n, :k]


# -- registered formats --------------------------------------------------------------------
class _Fp8GroupFormat(Format):
    """FP8 E4M3 codes with one FP32 scale per group along the last dim."""

    scale_fmt: ClassVar[str | None]
    code_dtype = torch.float8_e4m3fn
    scale_dtype = torch.float32
    max_code_value = FP8_E4M3_MAX

    def quantize(self, x: torch.Tensor, scales: torch.Tensor | None = None) -> QuantizedTensor:
        self.check_groups(x)  # whole groups only (the functions also take a partial last one)
        codes, scales = quantize_fp8_groups(x, self.group_size, self.scale_fmt, scales=scales)
        return QuantizedTensor(codes=codes, scales=scales, fmt=self.name)

    def dequantize(self, q: QuantizedTensor) -> torch.Tensor:
        self.check_quantized(q)
        return dequantize_fp8_groups(q.codes, q.scales, self.group_size)

    def pack(self, q: QuantizedTensor) -> dict[str, torch.Tensor]:
        """Storage: ``codes`` (float8_e4m3fn) and ``scales`` (float32), or for UE8M0 formats
        ``scales_e8m0`` (one uint8 byte a group instead of four)."""
        self.check_quantized(q)
        if self.scale_fmt == "ue8m0":
            return {"codes": q.codes, "scales_e8m0": e8m0_encode(q.scales)}
        return {"codes": q.codes, "scales": q.scales}

    def unpack(self, packed: Mapping[str, torch.Tensor]) -> QuantizedTensor:
        key = "scales_e8m0" if self.scale_fmt == "ue8m0" else "scales"
        if "codes" not in packed or key not in packed:
            raise FormatError(f"{self.name}: packed form needs 'codes' and {key!r}, got {sorted(packed)}")
        scales = e8m0_decode(packed[key]) if key == "scales_e8m0" else packed[key]
        q = QuantizedTensor(codes=packed["codes"], scales=scales, fmt=self.name)
        self.check_quantized(q)
        return q


@register_format
class Fp8E4M3G128(_Fp8GroupFormat):
    name = "fp8_e4m3_g128"
    group_size = 128
    scale_fmt = None


@register_format
class Fp8E4M3G128Ue8m0(_Fp8GroupFormat):
    name = "fp8_e4m3_g128_ue8m0"
    group_size = 128
    scale_fmt = "ue8m0"


@register_format
class Fp8E4M3G32(_Fp8GroupFormat):
    name = "fp8_e4m3_g32"
    group_size = 32
    scale_fmt = None


@register_format
class Fp8E4M3G32Ue8m0(_Fp8GroupFormat):
    name = "fp8_e4m3_g32_ue8m0"
    group_size = 32
    scale_fmt = "ue8m0"
