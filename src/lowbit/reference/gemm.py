"""Reference block-scaled GEMMs of seed 004 (DeepSeek's ``fp8_gemm`` and ``fp4_gemm``).

Both compute ``C[M, N] = A[M, K] @ B[N, K]^T`` ("NT": both operands K-major) from quantized
operands, with the accumulation *structure* of the kernels made explicit: the FP8 (or FP4)
codes of one K block are multiplied and summed first, that partial product is multiplied by
the block's two scales, and only then added into an FP32 running sum. Because the scales
change from one K block to the next they cannot be folded into the tensor-core product, which
is why the kernels keep two accumulators (``C_local`` for the block, ``C_local_accum`` for
the total); here the two are the loop variables ``block`` and ``acc``.

Everything is computed in FP32 and returned as FP32; the kernels (and DeepSeek's wrappers)
write BF16, so callers cast with ``.to(torch.bfloat16)`` when they compare against one.

Scale tensors may be given as FP32 values (any positive value, or powers of two in the
``ue8m0`` case: the math is the same), as ``torch.float8_e8m0fnu``, or as ``uint8`` biased
exponents (E8M0, decoded with `lowbit.formats.fp8.e8m0_decode`).
"""

from __future__ import annotations

import torch

from ..formats.fp4 import e2m1_to_float, unpack_fp4
from ..formats.fp8 import e8m0_decode

__all__ = ["fp8_gemm_ref", "fp4_gemm_ref", "fp4_fold_ref", "FP8_GEMM_BLOCK", "FP4_WEIGHT_GROUP"]

#: K block of the activation scales and edge of the square weight-scale blocks of fp8_gemm.
FP8_GEMM_BLOCK = 128
#: K group of one E8M0 weight scale in fp4_gemm (MXFP4).
FP4_WEIGHT_GROUP = 32

_FP8 = torch.float8_e4m3fn


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _scales_fp32(s: torch.Tensor, name: str) -> torch.Tensor:
    """Scale tensor -> FP32 values. FP32 is taken as is; ``float8_e8m0fnu`` and ``uint8``
    (biased exponent) are decoded as E8M0 (``2 ** (e - 127)``)."""
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(s).__name__}")
    if s.dtype == torch.float32:
        return s
    if s.dtype in (torch.uint8, torch.float8_e8m0fnu):
        decoded = e8m0_decode(s)
        if bool(torch.isnan(decoded).any()):
            raise ValueError(f"{name}: E8M0 byte 255 encodes NaN, not a scale")
        return decoded
    raise TypeError(
        f"{name} must be float32, float8_e8m0fnu or uint8 (E8M0 biased exponent), got {s.dtype}"
    )


def _check_fp8_2d(x: torch.Tensor, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != _FP8:
        raise TypeError(f"{name} must be torch.float8_e4m3fn, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(x.shape)}")


def _check_shape(s: torch.Tensor, name: str, expected: tuple[int, ...], what: str) -> None:
    if tuple(s.shape) != expected:
        raise ValueError(f"{name} must have shape {expected} ({what}), got {tuple(s.shape)}")


def fp8_gemm_ref(
    a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor
) -> torch.Tensor:
    """Block-scaled FP8 x FP8 GEMM, ``C = (A * a_s) @ (B * b_s)^T``, as DeepSeek's ``fp8_gemm``.

    Args:
        a: activations, ``float8_e4m3fn [M, K]``.
        a_s: activation scales, one per row and 128-wide K block (1x128),
            ``[M, ceil(K/128)]``; FP32, or E8M0 (``float8_e8m0fnu`` / ``uint8``).
        b: weight, ``float8_e4m3fn [N, K]`` (row n is output feature n).
        b_s: weight scales, one per 128x128 block, ``[ceil(N/128), ceil(K/128)]``; same
            dtypes as ``a_s``.

    Returns:
        ``float32 [M, N]``. The kernel writes BF16: cast the result to compare.

    Semantics (the last K block may be shorter than 128; a ragged N block simply has fewer rows)::

        for m, n:
            acc = 0.0                                       # FP32 running sum
            for kb in range(ceil(K / 128)):
                ks = range(128 * kb, min(128 * kb + 128, K))
                block = sum(float(a[m, k]) * float(b[n, k]) for k in ks)   # FP32
                acc += block * (a_s[m, kb] * b_s[n // 128, kb])
            C[m, n] = acc

    Each FP8 x FP8 product is exact in FP32 (4-bit x 4-bit significands); only the sums round.
    Power-of-two (``ue8m0``) scales change nothing here: they are just particular FP32 values.
    """
    _check_fp8_2d(a, "a")
    _check_fp8_2d(b, "b")
    M, K = a.shape
    N, Kb = b.shape
    if Kb != K:
        raise ValueError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must share K (NT layout)")
    blk = FP8_GEMM_BLOCK
    kblocks = _cdiv(K, blk)
    a_s32 = _scales_fp32(a_s, "a_s")
    b_s32 = _scales_fp32(b_s, "b_s")
    _check_shape(a_s32, "a_s", (M, kblocks), "[M, ceil(K/128)]: 1x128 activation scales")
    _check_shape(b_s32, "b_s", (_cdiv(N, blk), kblocks), "[ceil(N/128), ceil(K/128)]: 128x128 weight scales")

    a32 = a.float()
    b32 = b.float()
    # Per output column n, the row of weight-scale blocks it uses: b_s[n // 128, :].
    b_s_per_n = b_s32.repeat_interleave(blk, dim=0)[:N]  # [N, kblocks]
    acc = torch.zeros(M, N, dtype=torch.float32, device=a.device)
    for kb in range(kblocks):
        ks = slice(kb * blk, min((kb + 1) * blk, K))
        block = a32[:, ks] @ b32[:, ks].T  # [M, N], the FP8 product in FP32
        scale = a_s32[:, kb, None] * b_s_per_n[None, :, kb]  # [M, N]
        acc += block * scale
    return acc


def fp4_gemm_ref(
    a: torch.Tensor,
    a_s: torch.Tensor,
    b: torch.Tensor,
    b_s: torch.Tensor,
    act_block_size: int = 128,
) -> torch.Tensor:
    """FP8 activations x MXFP4 weights, ``C = (A * a_s) @ (B * b_s)^T``, as DeepSeek's ``fp4_gemm``.

    Args:
        a: activations, ``float8_e4m3fn [M, K]``; ``K`` a multiple of 32.
        a_s: activation scales, one per row and ``act_block_size`` consecutive K,
            ``[M, ceil(K/act_block_size)]``; FP32, or E8M0 (``float8_e8m0fnu`` / ``uint8``).
        b: weight, FP4 E2M1 codes two a byte along K, ``uint8 [N, K/2]`` (or
            ``torch.float4_e2m1fn_x2``, the same bytes); nibble order as `lowbit.formats.fp4`.
        b_s: weight scales, one E8M0 per row and 32 consecutive K, ``uint8 [N, K/32]`` (biased
            exponent; ``float8_e8m0fnu``, or the decoded FP32 values, also accepted).
        act_block_size: 128 (the model's linear layers) or 32 (a multiple of the weight group).

    Returns:
        ``float32 [M, N]``. The kernel writes BF16: cast the result to compare.

    Semantics (two-level accumulation; the kernel's K step is one weight group of 32)::

        for m, n:
            acc = 0.0                                       # FP32 running sum
            for kb in range(K // 32):
                ks = range(32 * kb, 32 * kb + 32)
                block = sum(float(a[m, k]) * e2m1(b[n, k]) for k in ks)    # FP32
                acc += block * a_s[m, (32 * kb) // act_block_size] * e8m0(b_s[n, kb])
            C[m, n] = acc

    The kernel upcasts each FP4 weight to FP8 E4M3 (through FP32) to use the FP8 tensor-core
    MMA. That upcast is exact: every E2M1 value (0, +-0.5, 1, 1.5, 2, 3, 4, 6) is an E4M3
    value, so the reference simply uses the E2M1 values. Scale product and accumulation order
    follow the kernel: ``(block * a_s) * b_s``, then added.
    """
    _check_fp8_2d(a, "a")
    if not isinstance(b, torch.Tensor):
        raise TypeError(f"b must be a torch.Tensor, got {type(b).__name__}")
    if b.dtype == torch.float4_e2m1fn_x2:
        b = b.view(torch.uint8)
    if b.dtype != torch.uint8:
        raise TypeError(f"b must be uint8 (two FP4 E2M1 codes a byte) [N, K/2], got {b.dtype}")
    if b.dim() != 2:
        raise ValueError(f"b must be 2-D [N, K/2], got shape {tuple(b.shape)}")
    if act_block_size not in (32, 128):
        raise ValueError(f"act_block_size must be 32 or 128, got {act_block_size}")
    M, K = a.shape
    N = b.shape[0]
    g = FP4_WEIGHT_GROUP
    if K % g:
        raise ValueError(f"K={K} (a {tuple(a.shape)}) must be a multiple of {g} for MXFP4 weights")
    if b.shape[1] * 2 != K:
        raise ValueError(f"b {tuple(b.shape)} must be [N, K/2] = [{N}, {K // 2}] for a {tuple(a.shape)}")
    a_s32 = _scales_fp32(a_s, "a_s")
    b_s32 = _scales_fp32(b_s, "b_s")
    _check_shape(
        a_s32, "a_s", (M, _cdiv(K, act_block_size)), f"[M, ceil(K/{act_block_size})]: activation scales"
    )
    _check_shape(b_s32, "b_s", (N, K // g), "[N, K/32]: one E8M0 weight scale per 32 K")

    a32 = a.float()
    w32 = e2m1_to_float(unpack_fp4(b))  # [N, K], the E2M1 values (no scale yet)
    acc = torch.zeros(M, N, dtype=torch.float32, device=a.device)
    for kb in range(K // g):
        ks = slice(kb * g, (kb + 1) * g)
        block = a32[:, ks] @ w32[:, ks].T  # [M, N]
        sa = a_s32[:, (kb * g) // act_block_size]  # [M]
        sb = b_s32[:, kb]  # [N]
        acc += block * sa[:, None] * sb[None, :]
    return acc


def fp4_fold_ref(
    b: torch.Tensor, b_s: torch.Tensor, flag_rows: int = 64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The weight fold of `fp4_gemm`'s fold engine (and of its k_step=128 path), as a model.

    Args:
        b: ``uint8 [N, K/2]`` E2M1 codes (element 2j in the low nibble); K a multiple of 32.
        b_s: ``uint8 [N, K/32]`` E8M0 biased exponents ``e``.
        flag_rows: weight rows per leftover flag (the fixup tile's block_n).

    Returns:
        ``w8 float32 [N, K]``: the FP8 operand's values; ``w8_s float32 [N, ceil(K/128)]``;
        ``left bool [ceil(N/flag_rows)]``.

    Semantics, per row n and 128-K block kb (groups past K are absent)::

        G = the groups g of block kb with a nonzero magnitude code
        e_ref = max(max(e[n, g] for g in G) - 6, 1)            # max over nothing = 0
        w8_s[n, kb] = 2**(e_ref - 127)
        for g in block kb:
            if g in G and e[n, g] - e_ref >= -5:                 # a normal E4M3 number, exact
                w8[n, g's K] = e2m1(b[n, g's K]) * 2**(e[n, g] - e_ref)
            else:                                                # zero codes, or left out
                w8[n, g's K] = 0
        left[i] = any group of rows i*flag_rows .. (i+1)*flag_rows - 1 was left out

    So ``w8 * w8_s`` equals the dequantized weight on every group not left out.
    """
    n, k = b.shape[0], b.shape[1] * 2
    g = FP4_WEIGHT_GROUP
    codes = unpack_fp4(b)  # [N, K]
    vals = e2m1_to_float(codes).view(n, k // g, g)
    e = b_s.to(torch.int64)  # [N, K/32]
    nonzero = ((codes & 7) != 0).view(n, k // g, g).any(dim=2)  # [N, K/32]
    blocks = _cdiv(k, FP8_GEMM_BLOCK)
    per = FP8_GEMM_BLOCK // g  # groups per 128-K block
    block_of = torch.arange(k // g, device=b.device) // per  # [K/32]
    e_max = torch.zeros(n, blocks, dtype=torch.int64, device=b.device)
    e_max = e_max.scatter_reduce(1, block_of.expand(n, -1), torch.where(nonzero, e, 0), "amax")
    e_ref = torch.clamp(e_max - 6, min=1)  # [N, blocks]
    shift = e - e_ref[:, block_of]  # [N, K/32]
    take = nonzero & (shift >= -5)
    w8 = torch.where(take[:, :, None], vals * torch.exp2(shift.float())[:, :, None], 0.0).view(n, k)
    w8_s = torch.exp2((e_ref - 127).float())
    left_rows = (nonzero & ~take).any(dim=1)  # [N]
    pad = _cdiv(n, flag_rows) * flag_rows - n
    left = torch.nn.functional.pad(left_rows, (0, pad)).view(-1, flag_rows).any(dim=1)
    return w8, w8_s, left
