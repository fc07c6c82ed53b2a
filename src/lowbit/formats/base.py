"""The format object model and the one registry every format is declared in.

A *format* turns a real tensor into a `QuantizedTensor` (logical codes + scales) and back,
and turns that logical form into its storage form (a dict of packed tensors) and back.
Registering a format is all it takes to get the round-trip test suite
(`tests/test_formats.py` iterates over `FORMATS`).

Conventions every format follows:
- the quantized axis is the last one; groups are consecutive elements along it;
- `quantize` works in FP32 whatever the input dtype, and is deterministic;
- `quantize(x, scales=q.scales)` re-uses given scales (so `quantize(dequantize(q), q.scales)`
  gives back `q.codes` bit for bit: the round trip the tests check);
- `dequantize` returns FP32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import FormatError

__all__ = [
    "FormatError",
    "QuantizedTensor",
    "Format",
    "FORMATS",
    "register_format",
    "get_format",
]




@dataclass
class QuantizedTensor:
    """Logical (unpacked) quantized tensor.

    codes: the element codes, one per element, shape ``[..., K]`` (``uint8`` for 4-bit codes,
        ``torch.float8_e4m3fn`` for FP8 elements).
    scales: one scale per group, shape ``[..., K // group_size]`` (dtype is the format's).
    global_scale: optional FP32 tensor (NVFP4's second level): one value, or ``[..., N, 1]``
        (one per row, for stacked tensors that each had their own), else ``None``.
    fmt: the registered format name.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    fmt: str
    global_scale: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def dequantize(self) -> torch.Tensor:
        return get_format(self.fmt).dequantize(self)

    def select(self, index: int) -> "QuantizedTensor":
        """The slice ``[index]`` along the leading (expert) dim, codes and scales together
        (and a per-row global scale with them)."""
        g = self.global_scale
        if g is not None and g.dim() == self.codes.dim():
            g = g[index]
        return QuantizedTensor(self.codes[index], self.scales[index], self.fmt, g)


class Format:
    """Base class of a registered number format. Subclasses set the class attributes and
    implement `quantize`, `dequantize`, `pack`, `unpack`."""

    name: ClassVar[str]
    group_size: ClassVar[int]
    #: dtype of `QuantizedTensor.codes`
    code_dtype: ClassVar[torch.dtype]
    #: dtype of `QuantizedTensor.scales`
    scale_dtype: ClassVar[torch.dtype]
    #: largest finite magnitude of a dequantized element divided by its scale
    max_code_value: ClassVar[float]

    def quantize(self, x: torch.Tensor, scales: torch.Tensor | None = None) -> QuantizedTensor:
        raise NotImplementedError

    def dequantize(self, q: QuantizedTensor) -> torch.Tensor:
        raise NotImplementedError

    def pack(self, q: QuantizedTensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def unpack(self, packed: dict[str, torch.Tensor]) -> QuantizedTensor:
        raise NotImplementedError

    # -- shared checks -------------------------------------------------------------------
    def check_groups(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise FormatError(
                f"{self.name}: quantize takes a float32/bfloat16/float16 tensor, got "
                f"{getattr(x, 'dtype', type(x).__name__)}"
            )
        if x.dim() < 1:
            raise FormatError(f"{self.name}: expected a tensor with at least one dim, got a scalar")
        if x.shape[-1] % self.group_size != 0:
            raise FormatError(
                f"{self.name}: last dim {x.shape[-1]} is not a multiple of the group size "
                f"{self.group_size}"
            )

    def check_quantized(self, q: QuantizedTensor) -> None:
        if q.fmt != self.name:
            raise FormatError(f"{self.name}: got a QuantizedTensor of format {q.fmt!r}")
        if q.codes.dtype != self.code_dtype:
            raise FormatError(f"{self.name}: codes must be {self.code_dtype}, got {q.codes.dtype}")
        if q.scales.dtype != self.scale_dtype:
            raise FormatError(f"{self.name}: scales must be {self.scale_dtype}, got {q.scales.dtype}")
        want = (*q.codes.shape[:-1], q.codes.shape[-1] // self.group_size)
        if q.codes.shape[-1] % self.group_size or tuple(q.scales.shape) != want:
            raise FormatError(
                f"{self.name}: codes {tuple(q.codes.shape)} need group-{self.group_size} scales {want}, "
                f"got {tuple(q.scales.shape)}"
            )

    def __repr__(self) -> str:
        return f"<format {self.name} group={self.group_size}>"


FORMATS: dict[str, Format] = {}


def register_format(cls: type[Format]) -> type[Format]:
    """Class decorator: instantiate and register a format under ``cls.name``."""
    if cls.name in FORMATS:
        raise ValueError(f"format {cls.name!r} registered twice")
    FORMATS[cls.name] = cls()
    return cls


def get_format(name: str) -> Format:
    """Look a format up by name; unknown names raise `FormatError` listing the known ones."""
    try:
        return FORMATS[name]
    except KeyError:
        raise FormatError(
            f"unsupported format {name!r}; supported: {sorted(FORMATS)}"
        ) from None


def group_view(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[..., K]`` -> ``[..., K // group_size, group_size]`` (no copy)."""
    return x.reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size)


def expand_groups(s: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[..., G]`` -> ``[..., G * group_size]``: each group scale repeated over its elements."""
    return s.repeat_interleave(group_size, dim=-1)
