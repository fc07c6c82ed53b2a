"""INT4 group-32 weights (W4A16) and the compressed-tensors "pack-quantized" checkpoint form.

Logical form: codes ``uint8 [..., N, K]`` in 0..15, scales ``bf16 [..., N, K/32]``;
the weight is ``w = (q - 8) * s`` (subtract, then scale).

Checkpoint form (compressed-tensors, symmetric, group 32, as Kimi K2.x ships it):
``weight_packed int32 [N, K/8]`` -- eight nibbles a word, element ``8j+i`` in bits
``4i..4i+3``, stored as the signed value + 8 (which is exactly the code ``q``);
``weight_scale bf16 [N, K/32]``; ``weight_shape int64 [2]`` = ``(N, K)``.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from .base import Format, FormatError, QuantizedTensor, expand_groups, group_view, register_format

__all__ = ["Int4G32", "INT4_GROUP", "from_compressed_tensors", "check_compressed_tensors_scheme"]

INT4_GROUP = 32
_NIBBLE_SHIFTS = torch.arange(8, dtype=torch.int64) * 4


@register_format
class Int4G32(Format):
    name = "int4_g32"
    group_size = INT4_GROUP
    code_dtype = torch.uint8
    scale_dtype = torch.bfloat16
    max_code_value = 8.0

    def quantize(self, x: torch.Tensor, scales: torch.Tensor | None = None) -> QuantizedTensor:
        """Symmetric group-32 quantization: ``s = bf16(amax / 7.5)`` (compressed-tensors' rule),
        ``q = clamp(round(x / s), -8, 7) + 8``. An all-zero group gets scale 1."""
        self.check_groups(x)
        g = group_view(x.float(), self.group_size)
        if scales is None:
            amax = g.abs().amax(dim=-1)
            scales = (amax / 7.5).to(torch.bfloat16)
            scales = torch.where(scales == 0, torch.ones_like(scales), scales)
        elif scales.dtype != torch.bfloat16 or tuple(scales.shape) != tuple(g.shape[:-1]):
            raise FormatError(
                f"{self.name}: scales must be bf16 {tuple(g.shape[:-1])}, "
                f"got {scales.dtype} {tuple(scales.shape)}"
            )
        q = torch.round(g / scales.float().unsqueeze(-1)).clamp(-8, 7) + 8
        return QuantizedTensor(codes=q.to(torch.uint8).reshape(x.shape), scales=scales, fmt=self.name)

    def dequantize(self, q: QuantizedTensor) -> torch.Tensor:
        self.check_quantized(q)
        return (q.codes.float() - 8.0) * expand_groups(q.scales.float(), self.group_size)

    def pack(self, q: QuantizedTensor) -> dict[str, torch.Tensor]:
        """Logical -> compressed-tensors tensors (``weight_packed``, ``weight_scale``, ``weight_shape``)."""
        self.check_quantized(q)
        c = q.codes
        if c.shape[-1] % 8:
            raise FormatError(f"{self.name}: K={c.shape[-1]} must be a multiple of 8 to pack")
        words = (group_view(c, 8).to(torch.int64) << _NIBBLE_SHIFTS.to(c.device)).sum(-1)
        words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
        return {
            "weight_packed": words,
            "weight_scale": q.scales,
            "weight_shape": torch.tensor(list(c.shape[-2:]), dtype=torch.int64),
        }

    def unpack(self, packed: Mapping[str, torch.Tensor]) -> QuantizedTensor:
        return from_compressed_tensors(
            packed["weight_packed"], packed["weight_scale"], packed.get("weight_shape")
        )


def unpack_int4_words(words: torch.Tensor) -> torch.Tensor:
    """``int32 [..., K/8]`` -> codes ``uint8 [..., K]`` (element ``8j+i`` from bits ``4i..4i+3``)."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    nib = (w.unsqueeze(-1) >> _NIBBLE_SHIFTS.to(words.device)) & 0xF
    return nib.reshape(*words.shape[:-1], words.shape[-1] * 8).to(torch.uint8)


def from_compressed_tensors(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_shape: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Read a compressed-tensors pack-quantized INT4 group-32 weight.

    weight_packed: ``int32 [..., N, K/8]``; weight_scale: ``bf16 [..., N, K/32]``;
    weight_shape: optional ``int64 [2]`` ``(N, K)``, checked when given.
    Returns the logical `QuantizedTensor` (codes ``uint8 [..., N, K]``).
    """
    if weight_packed.dtype != torch.int32:
        raise FormatError(f"weight_packed must be int32, got {weight_packed.dtype}")
    if weight_scale.dtype != torch.bfloat16:
        raise FormatError(f"weight_scale must be bfloat16, got {weight_scale.dtype}")
    n, k8 = weight_packed.shape[-2:]
    k = k8 * 8
    if weight_shape is not None:
        ws = [int(v) for v in weight_shape.flatten().tolist()]
        if ws != [n, k]:
            raise FormatError(f"weight_shape {ws} does not match weight_packed {tuple(weight_packed.shape)} (N={n}, K={k})")
    if k % INT4_GROUP:
        raise FormatError(f"K={k} is not a multiple of the group size {INT4_GROUP}")
    want = (*weight_packed.shape[:-1], k // INT4_GROUP)
    if tuple(weight_scale.shape) != want:
        hint = ""
        if weight_scale.shape[-1] and k % weight_scale.shape[-1] == 0:
            hint = f" (that is group size {k // weight_scale.shape[-1]}; only {INT4_GROUP} is supported)"
        raise FormatError(
            f"weight_scale {tuple(weight_scale.shape)} does not match group-{INT4_GROUP} scales "
            f"{want} for weight_packed {tuple(weight_packed.shape)}{hint}"
        )
    return QuantizedTensor(codes=unpack_int4_words(weight_packed), scales=weight_scale, fmt=Int4G32.name)


def check_compressed_tensors_scheme(weights_cfg: Mapping[str, Any]) -> None:
    """Validate a compressed-tensors ``weights`` quantization args dict (from a checkpoint's
    ``quantization_config.config_groups[*].weights``). Only the scheme our kernels serve
    passes: 4-bit int, symmetric, group strategy, group size 32. Anything else raises
    `FormatError` naming the offending field, so no kernel is ever picked for it."""
    want = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": INT4_GROUP}
    for key, val in want.items():
        got = weights_cfg.get(key)
        if got != val:
            raise FormatError(
                f"unsupported INT4 scheme: {key}={got!r} (lowbit serves num_bits=4, type=int, "
                f"symmetric, strategy=group, group_size={INT4_GROUP})"
            )
