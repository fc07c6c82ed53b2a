"""MXFP8 expert weights prepared for the output-centric MoE decode (`lowbit.kernels.moe_decode`).

`pack_mxfp8_experts` turns real expert weights, or MXFP8 codes and E8M0 scales
(`lowbit.formats.mxfp8.quantize_mxfp8`), into an `Mxfp8ExpertWeight`, once, offline. Two layouts
of the same codes:

- ``"natural"``: codes ``float8_e4m3fn [E, N, K]`` in K order, scales ``uint8 [E, N, K/32]``
  (the Triton engines and the reference read it).
- ``"k256-interleaved"``: the Hopper mma engine's. K is zero-padded to a multiple of 256; per
  256-wide K step, word c of a half step holds element c of that half's four groups, and bf16
  group multipliers ``2**(byte - 7)`` ``[E, Kp/32, N]`` come with it (scales up to 2^7).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import FormatError, QuantizedTensor
from .fp8 import e8m0_decode
from .mxfp8 import MXFP8_GROUP, quantize_mxfp8

__all__ = ["MXFP8_LAYOUTS", "MXFP8_MMA_MAX_E8M0", "Mxfp8ExpertWeight", "pack_mxfp8_experts"]

#: `Mxfp8ExpertWeight.layout` values (module docstring).
MXFP8_LAYOUTS = ("natural", "k256-interleaved")
#: The largest E8M0 byte the interleaved layout takes: its bf16 multipliers are ``2**(byte - 7)``
#: (the E4M3 bits land in bf16 as ``code * 2**-120``), whose exponent field ``byte + 120`` must
#: stay below 255: scales up to 2^7, weights up to 448 * 2^7.
MXFP8_MMA_MAX_E8M0 = 134


def _interleave_k256(codes: torch.Tensor) -> torch.Tensor:
    """``e4m3 [E, N, K]`` -> the interleaved ``[E, N, Kp]`` (K zero-padded to a multiple of 256):
    per 256-wide K step, half h and column c (the 32-bit word ``64 kt + 32 h + c``), byte o holds
    K ``256 kt + 32 (4h + o) + c``: element c of each of the half's four groups, so one ``prmt``
    of two K-adjacent words gathers a group's bf16x2 fragment pair (the INT4 indexed profile's
    idea: word j holds element j of every group)."""
    e, n, k = codes.shape
    kp = -(-k // 256) * 256
    b = torch.zeros(e, n, kp, dtype=torch.uint8, device=codes.device)
    b[..., :k] = codes.view(torch.uint8)
    b = b.view(e, n, kp // 256, 2, 4, 32).permute(0, 1, 2, 3, 5, 4).contiguous()
    return b.view(e, n, kp).view(torch.float8_e4m3fn)


def _deinterleave_k256(codes: torch.Tensor, k: int) -> torch.Tensor:
    """The inverse of `_interleave_k256`, cut back to K."""
    e, n, kp = codes.shape
    b = codes.view(torch.uint8).view(e, n, kp // 256, 2, 32, 4).permute(0, 1, 2, 3, 5, 4).contiguous()
    return b.view(e, n, kp)[..., :k].contiguous().view(torch.float8_e4m3fn)


def _mma_multipliers(scales_e8m0: torch.Tensor, kp: int) -> torch.Tensor:
    """bf16 ``[E, Kp/32, N]`` (the INT4 indexed profile's scale layout): ``2**(byte - 7)`` per
    group, 0 for the groups of the K padding. Exact: a power of two in bf16's normal range."""
    e, n, groups = scales_e8m0.shape
    out = torch.zeros(e, kp // 32, n, dtype=torch.bfloat16, device=scales_e8m0.device)
    out[:, :groups] = (e8m0_decode(scales_e8m0) * 2.0**120).to(torch.bfloat16).transpose(1, 2)
    return out


@dataclass(frozen=True)
class Mxfp8ExpertWeight:
    """MXFP8 expert weights as the decode kernels read them.

    codes: ``float8_e4m3fn [E, N, K]`` (K a multiple of 32, contiguous) in the natural layout,
    or ``[E, N, Kp]`` (Kp = K rounded up to 256, zero-padded) in the ``"k256-interleaved"``
    layout of the mma engine (`_interleave_k256`); scales_e8m0: ``uint8 [E, N, K/32]`` (E8M0
    bytes, ``2**(byte - 127)``; 255 = NaN is refused) in both; mma_scales: the interleaved
    layout's bf16 multipliers ``[E, Kp/32, N]`` (`_mma_multipliers`, built by
    `pack_mxfp8_experts`), None for natural. The constructor validates; `pack_mxfp8_experts`
    builds one from real weights or from `lowbit.formats.mxfp8.quantize_mxfp8` output.
    """

    codes: torch.Tensor
    scales_e8m0: torch.Tensor
    layout: str = "natural"
    mma_scales: torch.Tensor | None = None

    def __post_init__(self):
        c, s = self.codes, self.scales_e8m0
        if not isinstance(c, torch.Tensor) or not isinstance(s, torch.Tensor):
            raise FormatError("Mxfp8ExpertWeight: codes and scales_e8m0 must be tensors")
        if c.dtype != torch.float8_e4m3fn or c.dim() != 3:
            raise FormatError(f"Mxfp8ExpertWeight: codes must be float8_e4m3fn [E, N, K], got {c.dtype} {tuple(c.shape)}")
        if s.dtype != torch.uint8:
            raise FormatError(f"Mxfp8ExpertWeight: scales_e8m0 must be uint8 E8M0 bytes, got {s.dtype}")
        if self.layout not in MXFP8_LAYOUTS:
            raise FormatError(f"Mxfp8ExpertWeight: layout must be one of {MXFP8_LAYOUTS}, got {self.layout!r}")
        e, n, kc = c.shape
        k = s.shape[-1] * MXFP8_GROUP if s.dim() == 3 else -1
        if self.layout == "natural":
            if kc % MXFP8_GROUP:
                raise FormatError(f"Mxfp8ExpertWeight: K={kc} is not a multiple of {MXFP8_GROUP}")
            k = kc
        if tuple(s.shape) != (e, n, k // MXFP8_GROUP) or (self.layout != "natural" and kc != -(-k // 256) * 256):
            raise FormatError(f"Mxfp8ExpertWeight: codes {tuple(c.shape)} ({self.layout}) need scales [E, N, K/32] "
                              f"with K = {kc if self.layout == 'natural' else 'codes K - padding < 256'}, got "
                              f"{tuple(s.shape)}")
        if c.device != s.device:
            raise FormatError(f"Mxfp8ExpertWeight: codes on {c.device}, scales on {s.device}")
        if not c.is_contiguous() or not s.is_contiguous():
            raise FormatError("Mxfp8ExpertWeight: codes and scales must be contiguous")
        if s.numel() and bool((s == 255).any()):
            raise FormatError("Mxfp8ExpertWeight: E8M0 scale byte 255 (NaN) in the weight")
        if self.layout == "natural":
            if self.mma_scales is not None:
                raise FormatError("Mxfp8ExpertWeight: mma_scales belong to the k256-interleaved layout")
            return
        if s.numel() and int(s.max()) > MXFP8_MMA_MAX_E8M0:
            raise FormatError(f"Mxfp8ExpertWeight: the k256-interleaved layout takes E8M0 bytes <= "
                              f"{MXFP8_MMA_MAX_E8M0} (scales up to 2^7), got {int(s.max())}")
        m = self.mma_scales
        if (not isinstance(m, torch.Tensor) or m.dtype != torch.bfloat16 or tuple(m.shape) != (e, kc // 32, n)
                or not m.is_contiguous() or m.device != c.device):
            raise FormatError(f"Mxfp8ExpertWeight: the k256-interleaved layout needs mma_scales bf16 "
                              f"[E, Kp/32, N] = {(e, kc // 32, n)} (pack_mxfp8_experts builds them)")

    @property
    def num_experts(self) -> int:
        """E."""
        return self.codes.shape[0]

    @property
    def n(self) -> int:
        """N, the output rows of each expert."""
        return self.codes.shape[1]

    @property
    def k(self) -> int:
        """K, the logical reduction length (without the interleaved layout's padding)."""
        return self.scales_e8m0.shape[2] * MXFP8_GROUP

    def to(self, device: torch.device | str) -> "Mxfp8ExpertWeight":
        """The same weight, every tensor on `device`."""
        m = None if self.mma_scales is None else self.mma_scales.to(device)
        return Mxfp8ExpertWeight(self.codes.to(device), self.scales_e8m0.to(device), self.layout, m)

    def natural_codes(self) -> torch.Tensor:
        """``float8_e4m3fn [E, N, K]`` in K order, whatever the layout."""
        return self.codes if self.layout == "natural" else _deinterleave_k256(self.codes, self.k)

    def as_quantized(self) -> QuantizedTensor:
        """The logical ``mxfp8`` `QuantizedTensor` (what `lowbit.reference` takes)."""
        return QuantizedTensor(self.natural_codes(), self.scales_e8m0, "mxfp8")


def pack_mxfp8_experts(weight, scales_e8m0: torch.Tensor | None = None, *,
                       layout: str = "natural") -> Mxfp8ExpertWeight:
    """Build an `Mxfp8ExpertWeight`.

    weight: real expert weights ``[E, N, K]`` (float32/bf16/fp16; quantized with
    `quantize_mxfp8`); or a ``(codes, scales_e8m0)`` pair as `quantize_mxfp8` returns it; or
    codes ``float8_e4m3fn [E, N, K]`` with `scales_e8m0` ``uint8 [E, N, K/32]``; or a
    `QuantizedTensor` of format ``mxfp8``. layout: ``"natural"`` (every engine) or
    ``"k256-interleaved"`` (the sm_90 mma engine only, its fast path: the same bytes reordered
    once, K padded to 256, plus bf16 group multipliers, 1/16 of the codes' bytes).
    """
    if layout not in MXFP8_LAYOUTS:
        raise FormatError(f"pack_mxfp8_experts: layout must be one of {MXFP8_LAYOUTS}, got {layout!r}")
    if isinstance(weight, QuantizedTensor):
        if weight.fmt != "mxfp8":
            raise FormatError(f"pack_mxfp8_experts takes mxfp8 weights, got format {weight.fmt!r}")
        weight, scales_e8m0 = weight.codes, weight.scales
    elif isinstance(weight, tuple):
        if len(weight) != 2 or scales_e8m0 is not None:
            raise FormatError("pack_mxfp8_experts: give a (codes, scales_e8m0) pair, or codes and scales_e8m0")
        weight, scales_e8m0 = weight
    if not isinstance(weight, torch.Tensor):
        raise FormatError(f"pack_mxfp8_experts: expected a tensor, got {type(weight).__name__}")
    if weight.dtype != torch.float8_e4m3fn:
        if scales_e8m0 is not None:
            raise FormatError(f"pack_mxfp8_experts: codes must be float8_e4m3fn, got {weight.dtype}")
        if weight.dim() != 3:
            raise FormatError(f"pack_mxfp8_experts: expert weights must be [E, N, K], got {tuple(weight.shape)}")
        weight, scales_e8m0 = quantize_mxfp8(weight)
    elif scales_e8m0 is None:
        raise FormatError("pack_mxfp8_experts: float8_e4m3fn codes need their scales_e8m0")
    codes, scales_e8m0 = weight.contiguous(), scales_e8m0.contiguous()
    if layout == "natural":
        return Mxfp8ExpertWeight(codes, scales_e8m0)
    Mxfp8ExpertWeight(codes, scales_e8m0)  # the natural form's checks first
    inter = _interleave_k256(codes)
    return Mxfp8ExpertWeight(inter, scales_e8m0, layout, _mma_multipliers(scales_e8m0, inter.shape[2]))
