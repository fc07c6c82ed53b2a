"""`Linear`: `lowbit.linear` as an ``nn.Module`` over FP8 block or MXFP4 weights.

    proj = Linear.from_checkpoint(ckpt, "model.layers.0.self_attn.q_a_proj", device="cuda")
    y = proj(x)                                            # bf16 [..., N]
"""

from __future__ import annotations

import torch

from ._buffers import PreparedBuffers

__all__ = ["Linear"]

_FP4_DTYPES = (torch.uint8,) + ((torch.float4_e2m1fn_x2,) if hasattr(torch, "float4_e2m1fn_x2") else ())
_E8M0_DTYPES = (torch.uint8,) + ((torch.float8_e8m0fnu,) if hasattr(torch, "float8_e8m0fnu") else ())
_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FP8_BLOCK = 128
_FP4_GROUP = 32


def _kind(weight: torch.Tensor) -> str:
    if weight.dtype == torch.float8_e4m3fn:
        return "fp8"
    if weight.dtype in _FP4_DTYPES:
        return "fp4"
    if weight.dtype in _FLOAT_DTYPES:
        return "torch"
    raise TypeError(f"Linear: weight must be float8_e4m3fn [N, K] (FP8 blocks), uint8 / float4_e2m1fn_x2 [N, K/2] "
                    f"(packed MXFP4) or bf16 / fp16 / fp32 [N, K], got {weight.dtype}")


class Linear(PreparedBuffers):
    """``y = x @ W^T`` by `lowbit.linear` (no bias), W in one of its formats:

    - ``"fp8"``: weight ``float8_e4m3fn [N, K]``, scale ``float32 [ceil(N/128), ceil(K/128)]``
      (one per 128x128 block; DeepSeek-V3's ``weight_scale_inv``); activations quantized to
      FP8 in groups of 128.
    - ``"fp4"``: weight packed MXFP4 ``uint8 [N, K/2]`` (element 2j in the low nibble) or
      ``float4_e2m1fn_x2``, scale E8M0 ``uint8 / float8_e8m0fnu [N, K/32]``; activations
      quantized to FP8 in groups of `act_block_size` (128 or 32).
    - ``"torch"``: weight bf16 / fp16 / fp32 ``[N, K]``, no scale (``F.linear``).

    Buffers ``weight`` and ``scale`` (or None) move with ``.to(device)`` and are saved by
    ``state_dict``; a dtype cast leaves the quantized ones as they are. Attributes:
    ``in_features`` (K), ``out_features`` (N), ``kind``, ``act_block_size``, ``scale_fmt``
    (None or ``"ue8m0"``: power-of-two activation scales). Output: bf16 for FP8 / FP4, x's
    dtype for ``"torch"``.
    """

    _prepared = ("weight", "scale")

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor | None = None, *, act_block_size: int = 128,
                 scale_fmt: str | None = None):
        """weight, scale: as the class docstring's table; act_block_size: 128, or 32 for FP4;
        scale_fmt: None or ``"ue8m0"``."""
        super().__init__()
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ValueError(f"Linear: weight must be a 2-D tensor, got "
                             f"{tuple(getattr(weight, 'shape', ())) or type(weight).__name__}")
        kind = _kind(weight)
        n = weight.shape[0]
        k = weight.shape[1] * 2 if kind == "fp4" else weight.shape[1]
        if scale_fmt not in (None, "ue8m0"):
            raise ValueError(f"Linear: scale_fmt must be None or 'ue8m0', got {scale_fmt!r}")
        if kind == "torch":
            if scale is not None:
                raise ValueError(f"Linear: a {weight.dtype} weight takes no scale")
        else:
            if kind == "fp8":
                want, dtypes, what = (-(-n // _FP8_BLOCK), -(-k // _FP8_BLOCK)), (torch.float32,), "float32"
                if act_block_size != _FP8_BLOCK:
                    raise ValueError(f"Linear: FP8 weights quantize activations in groups of 128, got "
                                     f"act_block_size={act_block_size}")
            else:
                want, dtypes, what = (n, k // _FP4_GROUP), _E8M0_DTYPES, "E8M0 uint8 / float8_e8m0fnu"
                if act_block_size not in (32, 128):
                    raise ValueError(f"Linear: act_block_size must be 32 or 128, got {act_block_size}")
            if not isinstance(scale, torch.Tensor) or scale.dtype not in dtypes or tuple(scale.shape) != want:
                raise ValueError(f"Linear: an {kind} weight [{n}, K={k}] needs a {what} scale of shape {want}, got "
                                 f"{getattr(scale, 'dtype', None)} {tuple(getattr(scale, 'shape', ()))}")
            if scale.device != weight.device:
                raise ValueError(f"Linear: weight on {weight.device}, scale on {scale.device}")
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        # a float weight is an ordinary parameter-like tensor: a model-wide cast must reach it
        self._prepared = () if kind == "torch" else ("weight", "scale")
        self.in_features, self.out_features, self.kind = k, n, kind
        self.act_block_size, self.scale_fmt = act_block_size, scale_fmt

    @classmethod
    def from_checkpoint(cls, ckpt, name: str, device: torch.device | str = "cpu", **kwargs) -> "Linear":
        """Linear layer `name` (a module name, or its ``.weight``) of a
        `lowbit.checkpoint.Checkpoint`: FP8 128x128 blocks, MXFP4 or a float weight
        (``ckpt.linear_weight``); keyword arguments as the constructor's."""
        weight, scale = ckpt.linear_weight(name, device=device)
        return cls(weight, scale, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[..., K]`` (bf16; fp16 / fp32 accepted by the quantizer). Returns ``[..., N]``."""
        if torch.compiler.is_compiling():
            from .. import ops  # noqa: F401  (registers torch.ops.lowbit)

            return torch.ops.lowbit.linear(x, self.weight, self.scale, self.act_block_size, self.scale_fmt)
        from ..layers.linear import linear

        return linear(x, self.weight, self.scale, act_block_size=self.act_block_size, scale_fmt=self.scale_fmt)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, kind={self.kind!r}, "
                f"act_block_size={self.act_block_size}, scale_fmt={self.scale_fmt!r}")
