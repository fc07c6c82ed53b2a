"""Split-K shared by every block-scaled GEMM engine (the Triton kernels, the Gluon FP8 kernel,
the FP4 mma engine): how K blocks are divided among programs, where each share is written and
the deterministic reduction of the shares.

A split GEMM writes FP32 shares ``ws [split, M, N]``; `splitk_reduce` adds them in the order
s = 0, 1, ... and rounds once to BF16 (deterministic; FP32 sums in a different order from the
reference, as any tiling is).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...runtime import numerics
from ..compile_tier import KernelConfig

__all__ = ["split_blocks", "splitk_destination", "splitk_reduce", "compile_configs"]

#: Elements of the output a reduction program sums.
_REDUCE_BLOCK = 1024


def split_blocks(k_blocks: int, split_k: int, even: bool = True) -> tuple[int, int]:
    """(blocks a split, splits) for `k_blocks` K steps and `split_k` splits asked: the splits
    equalized, none empty; with `even`, an even count a split (`hopper_fp8`'s 64x128 kernel
    multiplies blocks in pairs, so only the last split may end on the zero-filled phantom
    block)."""
    per = triton.cdiv(k_blocks, max(1, min(split_k, k_blocks)))
    per += per % 2 if even else 0
    return per, triton.cdiv(k_blocks, per)


@triton.jit(do_not_specialize=["M", "N"])  # M = 1 would become a constexpr int
def _splitk_reduce_kernel(ws_ptr, c_ptr, M, N, split_k, stride_cm, BLOCK: tl.constexpr):
    """``c[m, n] = bf16(sum_s ws[s, m, n])`` in the order s = 0, 1, ...; ws contiguous."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mn = M.to(tl.int64) * N
    ok = offs < mn
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(split_k):
        acc += tl.load(ws_ptr + s * mn + offs, mask=ok, other=0.0)
    row = offs // N
    tl.store(c_ptr + row * stride_cm + (offs - row * N), numerics.to_bf16(acc), mask=ok)


def splitk_destination(out: torch.Tensor, split: int) -> tuple[torch.Tensor, int, int]:
    """Where a split-K kernel writes: ``out`` itself (one split: bf16 ``[M, N]``, no share
    stride) or a fresh FP32 workspace ``[split, M, N]`` that `splitk_reduce` then sums into
    ``out``. Returns (dst, share stride, row stride)."""
    if split == 1:
        return out, 0, out.stride(0)
    ws = torch.empty(split, *out.shape, dtype=torch.float32, device=out.device)
    return ws, ws.stride(0), ws.stride(1)


def splitk_reduce(ws: torch.Tensor, out: torch.Tensor) -> None:
    """Sum the FP32 shares ``ws [S, M, N]`` (contiguous) into ``out`` (bf16 ``[M, N]``, rows
    strided, N contiguous)."""
    s, m, n = ws.shape
    grid = (triton.cdiv(m * n, _REDUCE_BLOCK),)
    _splitk_reduce_kernel[grid](ws, out, m, n, s, out.stride(0), BLOCK=_REDUCE_BLOCK, num_warps=4)


def compile_configs() -> list[KernelConfig]:
    """The split-K reduction, for the compile tier."""
    return [KernelConfig(
        "splitk_reduce[BLOCK=1024]", _splitk_reduce_kernel,
        {"ws_ptr": "*fp32", "c_ptr": "*bf16", "M": "i32", "N": "i32", "split_k": "i32", "stride_cm": "i32",
         "BLOCK": "constexpr"}, {"BLOCK": _REDUCE_BLOCK}, num_warps=4, unaligned=("M", "split_k"))]
