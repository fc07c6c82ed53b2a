"""Helpers shared by the test files: problem builders and device checks that more than one
family's tests use. Family-specific builders stay beside their tests."""

import torch

from lowbit.formats.fp4 import quantize_mxfp4
from lowbit.formats.fp8 import quantize_fp8_blocks, quantize_fp8_groups
from lowbit.testing import assert_close, interpreter_active, poison_

# ------------------------------------------------------------------------- block-scaled GEMMs
# (the block_scaled kernels' tests and the linear layer's)
FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)
E8M0 = getattr(torch, "float8_e8m0fnu", None)


def check_bf16_gemm(out: torch.Tensor, ref: torch.Tensor, name: str = "output") -> None:
    """A BF16 GEMM output against its FP32 reference: "bf16_out" (one RNE rounding, at most
    2**-8 relative per element) in relative Frobenius norm; on the interpreter (IEEE FP32 dots
    with the reference's promotion structure) also every element within half a bf16 ulp plus FP32
    summation slack. On the GPU the tensor cores' FP8 accumulation is not IEEE FP32 (DeepSeek-V3
    report), hence the elementwise bound only on the interpreter."""
    out = out.detach().float().cpu()
    assert_close(out, ref, "bf16_out", name)
    if interpreter_active():
        slack = 2.0**-8 * ref.abs() + 1e-6 * ref.abs().max()
        bad = (out - ref).abs() > slack
        assert not bad.any(), f"{name}: {int(bad.sum())} elements beyond half a bf16 ulp of the FP32 reference"


def fp8_acts(m: int, k: int, gen: torch.Generator, group: int = 128, scale_fmt: str | None = None):
    """FP8 activations ``[m, k]`` whose groups span several binades (scales differ group to
    group), with their FP32 scales ``[m, k / group]``."""
    x = torch.randn(m, k, generator=gen) * torch.exp2(torch.randint(-6, 7, (m, 1), generator=gen).float())
    x = x * torch.exp2(torch.randint(-3, 4, (1, k), generator=gen).float())
    return quantize_fp8_groups(x, group_size=group, scale_fmt=scale_fmt)


def fp8_weight(n: int, k: int, gen: torch.Generator, scale_fmt: str | None = None):
    """An FP8 weight ``[n, k]`` with 128x128 block scales."""
    return quantize_fp8_blocks(torch.randn(n, k, generator=gen) * 0.05, 128, scale_fmt)


def fp4_weight(n: int, k: int, gen: torch.Generator):
    """An MXFP4 weight (packed ``uint8 [n, k/2]``, E8M0 ``uint8 [n, k/32]``) whose group scales
    span 2**-4 .. 2**2."""
    w = torch.randn(n, k, generator=gen) * torch.exp2(torch.randint(-4, 3, (n, k // 32), generator=gen).float()
                                                      ).repeat_interleave(32, 1)
    return quantize_mxfp4(w)


def run_into_poisoned(fn, *args, m: int, n: int, device, **kw) -> torch.Tensor:
    """``fn(*args, out=out, **kw)`` into a NaN-poisoned bf16 ``[m, n]`` (unwritten elements show);
    checks the op returns `out` itself."""
    out = poison_(torch.empty(m, n, dtype=torch.bfloat16, device=device))
    res = fn(*args, out=out, **kw)
    assert res is out
    return out
