"""INT4 group-32 weights (W4A16) and the compressed-tensors "pack-quantized" checkpoint form.

Logical form: codes ``uint8 [..., N, K]`` in 0..15, scales ``bf16 [..., N, K/32]``;
the weight is ``w = (q - 8) * s`` (subtract, then scale).

Checkpoint form (compressed-tensors, symmetric, group 32, as Kimi K2.x ships it):
``weight_packed int32 [N, K/8]`` -- eight nibbles a word, element ``8j+i`` in bits
``4i..4i+3``, stored as the signed value + 8 (which is exactly the code ``q``);
``weight_scale bf16 [N, K/32]``; ``weight_shape int64 [2]`` = ``(N, K)``.
On a little-endian host the eight nibbles of a word are also its four bytes in memory order,
low nibble first, so (un)packing is a byte view plus nibble ops (no 64-bit intermediates).

Only the symmetric scheme is served: an asymmetric checkpoint's ``weight_zero_point`` (and the
``weight_g_idx`` of activation reordering) changes what the codes mean, so every entry point
that could be handed one refuses it instead of dequantizing as if it were absent.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

import torch

from .base import Format, FormatError, QuantizedTensor, expand_groups, group_view, register_format

__all__ = [
    "Int4G32",
    "INT4_GROUP",
    "from_compressed_tensors",
    "check_compressed_tensors_scheme",
    "resolve_compressed_tensors_args",
    "pack_int4_words",
    "unpack_int4_words",
]

INT4_GROUP = 32
_NIBBLE_SHIFTS = torch.arange(8, dtype=torch.int64) * 4
_LITTLE_ENDIAN = sys.byteorder == "little"


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
        words = pack_int4_words(c)
        return {
            "weight_packed": words,
            "weight_scale": q.scales,
            "weight_shape": torch.tensor(list(c.shape[-2:]), dtype=torch.int64),
        }

    def unpack(self, packed: Mapping[str, torch.Tensor]) -> QuantizedTensor:
        """compressed-tensors tensors of one module (``weight_packed``, ``weight_scale``,
        optional ``weight_shape``) -> logical form. A ``weight_zero_point`` or ``weight_g_idx``
        among them raises `FormatError` (asymmetric / reordered schemes are not served)."""
        missing = [key for key in ("weight_packed", "weight_scale") if key not in packed]
        if missing:
            raise FormatError(f"{self.name}: packed form lacks {missing}, got {sorted(packed)}")
        return from_compressed_tensors(
            packed["weight_packed"],
            packed["weight_scale"],
            packed.get("weight_shape"),
            weight_zero_point=packed.get("weight_zero_point"),
            weight_g_idx=packed.get("weight_g_idx"),
        )


def pack_int4_words(codes: torch.Tensor) -> torch.Tensor:
    """codes ``uint8 [..., K]`` (0..15, K a multiple of 8) -> ``int32 [..., K/8]``: element
    ``8j+i`` in bits ``4i..4i+3`` of word ``j``."""
    if _LITTLE_ENDIAN:
        pairs = (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()
        return pairs.view(torch.int32)
    words = (group_view(codes, 8).to(torch.int64) << _NIBBLE_SHIFTS.to(codes.device)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_int4_words(words: torch.Tensor) -> torch.Tensor:
    """``int32 [..., K/8]`` -> codes ``uint8 [..., K]`` (element ``8j+i`` from bits ``4i..4i+3``)."""
    if _LITTLE_ENDIAN:
        pairs = words.contiguous().view(torch.uint8)
        return torch.stack((pairs & 0xF, pairs >> 4), dim=-1).reshape(*words.shape[:-1], words.shape[-1] * 8)
    w = words.to(torch.int64) & 0xFFFFFFFF
    nib = (w.unsqueeze(-1) >> _NIBBLE_SHIFTS.to(words.device)) & 0xF
    return nib.reshape(*words.shape[:-1], words.shape[-1] * 8).to(torch.uint8)


def refuse_zero_point(zero_point: Any, who: str) -> None:
    """Raise `FormatError` when a zero point is given (``None`` passes): the INT4 kernels compute
    ``(q - 8) * s``, and an asymmetric weight is ``(q - 8 - z) * s``."""
    if zero_point is not None:
        raise FormatError(
            f"{who}: got a zero point (weight_zero_point {tuple(getattr(zero_point, 'shape', ()))}): "
            "asymmetric INT4 is not supported; lowbit serves symmetric group-32 weights, w = (q - 8) * s"
        )


def from_compressed_tensors(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_shape: torch.Tensor | None = None,
    *,
    weight_zero_point: torch.Tensor | None = None,
    weight_g_idx: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Read a compressed-tensors pack-quantized INT4 group-32 weight.

    weight_packed: ``int32 [..., N, K/8]``; weight_scale: ``bf16 [..., N, K/32]``;
    weight_shape: optional ``int64 [2]`` ``(N, K)``, checked when given.
    weight_zero_point / weight_g_idx: must be None (an asymmetric or activation-reordered
    checkpoint raises `FormatError` rather than dequantizing wrongly).
    Returns the logical `QuantizedTensor` (codes ``uint8 [..., N, K]``).
    """
    refuse_zero_point(weight_zero_point, "from_compressed_tensors")
    if weight_g_idx is not None:
        raise FormatError("from_compressed_tensors: got weight_g_idx (activation reordering, actorder='group'): "
                          "its permuted groups are not supported")
    if not isinstance(weight_packed, torch.Tensor) or not isinstance(weight_scale, torch.Tensor):
        raise FormatError("from_compressed_tensors: weight_packed and weight_scale must be tensors")
    if weight_packed.dim() < 2:
        raise FormatError(f"weight_packed must be int32 [..., N, K/8], got shape {tuple(weight_packed.shape)}")
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


#: compressed-tensors' ``QuantizationArgs`` fields, and the defaults it gives absent ones
#: (``strategy`` absent is inferred from ``group_size``)
_CT_ARGS_DEFAULTS: dict[str, Any] = {
    "num_bits": 8,
    "type": "int",
    "symmetric": True,
    "group_size": None,
    "strategy": None,
    "block_structure": None,
    "dynamic": False,
    "actorder": None,
    "scale_dtype": None,
    "zp_dtype": None,
    "observer": None,
    "observer_kwargs": None,
}
#: actorder values that only change calibration, not what is stored
_CT_STORAGE_NEUTRAL_ACTORDER = (None, False, "weight", "static")
_CT_BF16_NAMES = (None, "bfloat16", "torch.bfloat16")


def resolve_compressed_tensors_args(args: Mapping[str, Any], where: str = "weights") -> dict[str, Any]:
    """A compressed-tensors quantization-args dict with the defaults compressed-tensors applies
    (``num_bits`` 8, ``type`` int, ``symmetric`` true, ``dynamic`` false, ``strategy`` from
    ``group_size``: absent -> tensor, > 0 -> group, -1 -> channel), strings lower-cased.
    Unknown keys raise `FormatError` (compressed-tensors forbids them too)."""
    if not isinstance(args, Mapping):
        raise FormatError(f"{where}: expected a quantization-args mapping, got {type(args).__name__}")
    unknown = sorted(set(args) - set(_CT_ARGS_DEFAULTS))
    if unknown:
        raise FormatError(f"{where}: unknown quantization-args field(s) {unknown}; known: {sorted(_CT_ARGS_DEFAULTS)}")
    out = {**_CT_ARGS_DEFAULTS, **args}
    for key in ("type", "strategy", "actorder", "dynamic"):
        if isinstance(out[key], str):
            out[key] = out[key].lower()
    if out["strategy"] is None:
        gs = out["group_size"]
        out["strategy"] = "tensor" if gs is None else ("channel" if gs == -1 else "group")
    return out


def check_compressed_tensors_scheme(weights_cfg: Mapping[str, Any], where: str = "weights") -> dict[str, Any]:
    """Validate a compressed-tensors ``weights`` quantization args dict (from a checkpoint's
    ``quantization_config.config_groups[*].weights``), after compressed-tensors' defaults
    (`resolve_compressed_tensors_args`; so ``{"num_bits": 4, "group_size": 32}`` passes). Only
    the scheme our kernels serve passes: 4-bit int, symmetric, group strategy, group size 32,
    static, no group reordering, BF16 scales. Anything else raises `FormatError` naming the
    offending field, so no kernel is ever picked for it. Returns the resolved args."""
    got = resolve_compressed_tensors_args(weights_cfg, where)
    want = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": INT4_GROUP}
    for key, val in want.items():
        if got[key] != val:
            raise FormatError(
                f"unsupported INT4 scheme ({where}): {key}={got[key]!r} (lowbit serves num_bits=4, type=int, "
                f"symmetric, strategy=group, group_size={INT4_GROUP})"
            )
    if got["dynamic"] not in (False, None):
        raise FormatError(f"unsupported INT4 scheme ({where}): dynamic={got['dynamic']!r}; weights must be static")
    if got["actorder"] not in _CT_STORAGE_NEUTRAL_ACTORDER:
        raise FormatError(f"unsupported INT4 scheme ({where}): actorder={got['actorder']!r} stores permuted "
                          "groups (weight_g_idx); only None / 'weight' / 'static' are served")
    if got["block_structure"] is not None:
        raise FormatError(f"unsupported INT4 scheme ({where}): block_structure={got['block_structure']!r}")
    if got["scale_dtype"] not in _CT_BF16_NAMES:
        raise FormatError(f"unsupported INT4 scheme ({where}): scale_dtype={got['scale_dtype']!r}; "
                          "the kernels take bfloat16 group scales")
    return got
