"""The prepared (kernel-side) physical layout of INT4 group-32 expert weights for the W4A16 kernels.

`pack_w4a16` turns the logical INT4 weight (codes + BF16 group-32 scales, or a
compressed-tensors checkpoint) into a `W4A16Weight`, once, offline:

- ``qweight int32 [E, N, Kp/8]``: K padded to a multiple of ``PACK_K = 256``; inside each
  256-wide K tile, word ``j`` (0..31) holds elements ``k = 32*i + j`` in nibble ``i`` (bits
  ``4i..4i+3``). Shifting a tile of 32 words by ``4i`` and masking gives the 32 consecutive
  codes of group ``i`` of the tile: the kernel dequantizes one whole group (one scale per row)
  per shift, with no interleave and no shuffle. Padding codes are 8 (weight 0).
- ``scales bf16 [E, Kp/32, N]``: transposed so a tile's scales for one group are one
  contiguous, coalesced row of N.

The layout name and the *profile* (which kernel family it was packed for) are recorded:
kernels check both and refuse a weight prepared for someone else.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import FormatError, QuantizedTensor
from .int4 import _LITTLE_ENDIAN, INT4_GROUP, Int4G32, from_compressed_tensors, refuse_zero_point

__all__ = ["W4A16Weight", "pack_w4a16", "pack_w4a16_grouped", "unpack_w4a16", "PACK_K", "LAYOUT_K256_GROUP_NIBBLES", "PROFILES",
           "SCALE_RANGE"]

PACK_K = 256
LAYOUT_K256_GROUP_NIBBLES = "k256-group-nibbles"
#: kernel families a prepared weight can be packed for
PROFILES = ("indexed", "contiguous", "masked")
#: Nonzero scale magnitudes a prepared weight may hold: [2^-62, 2^58). The Hopper register-A
#: kernels dequantize to ``(q - 8) * s * 2^-64`` (`lowbit.kernels.w4a16.int4`, subnormal form),
#: bit for bit the true weight scaled, only while that stays a normal bf16 (|s| >= 2^-62) and
#: ``s * 2^69`` stays finite (|s| < 2^58). Real checkpoints' group scales are ~1e-4 .. 1.
SCALE_RANGE = (2.0 ** -62, 2.0 ** 58)


@dataclass(frozen=True)
class W4A16Weight:
    """INT4 group-32 expert weights in the kernels' layout (see the module docstring).

    qweight: ``int32 [E, N, Kp/8]``; scales: ``bf16 [E, Kp/32, N]``; n, k: logical shape;
    layout: physical layout name; profile: the kernel family it was packed for.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    n: int
    k: int
    layout: str
    profile: str

    @property
    def num_experts(self) -> int:
        return self.qweight.shape[0]

    @property
    def k_padded(self) -> int:
        return self.qweight.shape[2] * 8

    def to(self, device: torch.device | str) -> "W4A16Weight":
        return W4A16Weight(self.qweight.to(device), self.scales.to(device), self.n, self.k, self.layout, self.profile)

    def check(self, profile: str) -> None:
        """Raise unless this weight was prepared in our layout for `profile`."""
        if self.layout != LAYOUT_K256_GROUP_NIBBLES:
            raise FormatError(f"W4A16 weight has layout {self.layout!r}; kernels expect {LAYOUT_K256_GROUP_NIBBLES!r}")
        if self.profile != profile:
            raise FormatError(
                f"W4A16 weight was packed for the {self.profile!r} kernels, not {profile!r}: "
                f"pack it again with pack_w4a16(..., profile={profile!r})"
            )


def _logical(weight, scale) -> QuantizedTensor:
    if isinstance(weight, QuantizedTensor):
        if weight.fmt != Int4G32.name:
            raise FormatError(f"pack_w4a16 takes int4_g32 weights, got format {weight.fmt!r}")
        return weight
    if scale is None:
        raise FormatError("pack_w4a16: give a QuantizedTensor, or codes/weight_packed together with scale")
    if weight.dtype == torch.int32:  # compressed-tensors weight_packed [E, N, K/8]
        return from_compressed_tensors(weight, scale)
    if weight.dtype != torch.uint8:
        raise FormatError(f"pack_w4a16: codes must be uint8 [E, N, K] or int32 weight_packed, got {weight.dtype}")
    q = QuantizedTensor(weight, scale, Int4G32.name)
    Int4G32().check_quantized(q)
    return q


def _check_scale_range(scales: torch.Tensor) -> None:
    """Scales must be finite, and 0 or of magnitude in `SCALE_RANGE` (one device reduction, at pack time)."""
    if not scales.numel():
        return
    mag = scales.float().abs()
    if not bool(torch.isfinite(mag).all()):
        raise FormatError("pack_w4a16: scales must be finite")
    lo, hi = SCALE_RANGE
    bad = (mag > 0) & ((mag < lo) | (mag >= hi))
    if bool(bad.any()):
        raise FormatError(f"pack_w4a16: nonzero scales must have magnitude in [2^-62, 2^58) (the Hopper kernels' "
                          f"exact dequantization), got {float(mag[bad][0]):.3e}")


def _tile_words(codes: torch.Tensor) -> torch.Tensor:
    """codes ``uint8 [E, N, Kp]`` (Kp a multiple of 256) -> ``int32 [E, N, Kp/8]``: inside each
    256-wide tile, word j = sum_i code[32i + j] << 4i."""
    e, n, kp = codes.shape
    c = codes.view(e, n, kp // PACK_K, 8, 32)
    if _LITTLE_ENDIAN:
        # byte b of word j holds groups 2b (low nibble) and 2b + 1 (high nibble)
        pairs = c[:, :, :, 0::2, :] | (c[:, :, :, 1::2, :] << 4)
        return pairs.transpose(-1, -2).contiguous().view(torch.int32).reshape(e, n, kp // 8)
    c = c.to(torch.int64)
    shifts = (torch.arange(8, device=c.device, dtype=torch.int64) * 4).view(1, 1, 1, 8, 1)
    words = (c << shifts).sum(dim=3)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).reshape(e, n, kp // 8)


def pack_w4a16(
    weight: QuantizedTensor | torch.Tensor,
    scale: torch.Tensor | None = None,
    *,
    profile: str = "indexed",
    zero_point: torch.Tensor | None = None,
) -> W4A16Weight:
    """Prepare INT4 group-32 expert weights for the W4A16 kernels.

    weight: a `QuantizedTensor` of format ``int4_g32`` with codes ``uint8 [E, N, K]``; or codes
        ``uint8 [E, N, K]`` (values 0..15) with `scale`; or compressed-tensors ``weight_packed
        int32 [E, N, K/8]`` with `scale`. scale: ``bf16 [E, N, K/32]``.
    profile: the kernel family: ``"indexed"``, ``"contiguous"`` or ``"masked"``.
    zero_point: must be None: a checkpoint's ``weight_zero_point`` (an asymmetric scheme) raises
        `FormatError`, since the kernels compute ``(q - 8) * s``.
    Returns a `W4A16Weight` on the weight's device.
    """
    refuse_zero_point(zero_point, "pack_w4a16")
    if profile not in PROFILES:
        raise FormatError(f"unknown W4A16 profile {profile!r}; one of {PROFILES}")
    q = _logical(weight, scale)
    codes, scales = q.codes, q.scales
    if codes.dim() != 3:
        raise FormatError(f"pack_w4a16 expects expert weights [E, N, K], got codes {tuple(codes.shape)}")
    if codes.numel() and int(codes.max()) > 15:
        raise FormatError("pack_w4a16: codes must be 0..15")
    _check_scale_range(scales)
    e, n, k = codes.shape
    kp = -(-k // PACK_K) * PACK_K
    if kp != k:
        codes = torch.nn.functional.pad(codes, (0, kp - k), value=8)
        scales = torch.nn.functional.pad(scales, (0, (kp - k) // INT4_GROUP), value=1.0)
    qweight = _tile_words(codes.contiguous())
    return W4A16Weight(qweight, scales.transpose(1, 2).contiguous(), n, k, LAYOUT_K256_GROUP_NIBBLES, profile)


def pack_w4a16_grouped(
    weight: QuantizedTensor | torch.Tensor,
    scale: torch.Tensor | None = None,
    mode: str = "contiguous",
    *,
    zero_point: torch.Tensor | None = None,
) -> W4A16Weight:
    """`pack_w4a16` for the grouped kernels: the same physical layout, recorded for `mode`
    (``"contiguous"`` or ``"masked"``), so a weight packed for one mode fed to the other mode's
    kernel raises. weight: codes ``uint8 [G, N, K]`` / compressed-tensors ``int32 [G, N, K/8]``
    / a `QuantizedTensor`; scale ``bf16 [G, N, K/32]``."""
    if mode not in ("contiguous", "masked"):
        raise FormatError(f"pack_w4a16_grouped: mode must be 'contiguous' or 'masked', got {mode!r}")
    return pack_w4a16(weight, scale, profile=mode, zero_point=zero_point)


def unpack_w4a16(w: W4A16Weight) -> QuantizedTensor:
    """Inverse of `pack_w4a16` (for tests and debugging): the logical int4_g32 weight."""
    e, n, kw = w.qweight.shape
    kp = kw * 8
    words = w.qweight.to(torch.int64).view(e, n, kp // PACK_K, 1, 32) & 0xFFFFFFFF
    shifts = (torch.arange(8, device=words.device, dtype=torch.int64) * 4).view(1, 1, 1, 8, 1)
    codes = ((words >> shifts) & 0xF).to(torch.uint8).reshape(e, n, kp)[..., : w.k]
    scales = w.scales.transpose(1, 2)[..., : w.k // INT4_GROUP].contiguous()
    return QuantizedTensor(codes.contiguous(), scales, Int4G32.name)
