"""FP8 activations x MXFP4 weights (DeepSeek's ``fp4_gemm``): E2M1 weights two a byte with one
E8M0 scale per 32 K, FP8 E4M3 activations with one scale per 128 (or 32) K, BF16 out.

Semantics (reference: `lowbit.reference.fp4_gemm_ref`)::

    fp4_gemm(a, a_s, b, b_s, act_block_size) -> c bf16 [M, N]
        a float8_e4m3fn [M, K], a_s fp32 [M, ceil(K/act_block_size)]   (act_block_size 128 or 32)
        b uint8 [N, K/2] (element 2j in the low nibble), b_s E8M0 uint8 [N, K/32]
        for m, n:
            acc = 0.0                                                    # FP32 running sum
            for g in range(K // 32):                                     # weight groups
                block = sum_k a[m, k] * e2m1(b[n, k])   over the 32 K of group g
                acc  += block * a_s[m, 32g // act_block_size] * 2**(b_s[n, g] - 127)
            c[m, n] = bf16(acc)

E8M0 byte 255 (NaN) is not a scale; the kernels do not check for it (that would need a host
sync), and results for such weights are unspecified. Byte 0 is 2**-127, as in the reference.

Engines (`BlockScaledConfig.engine`, chosen by `heuristics.fp4_gemm_config`), each equal to the
reference up to FP32 summation order:

- ``"triton"``: `portable`'s direct kernel (every tier), the weight upcast to FP8 in registers;
  k_step 128 folds the group scales into the operand exactly, k_step 32 promotes per group.
- ``"fold"`` (act_block_size 128, sm_90, TMA-able a): the weight folded once to FP8 with one
  scale per row and 128-K block (`portable.fold_weight`), `hopper_fp8`'s GEMM with per-row
  weight scales, then an exact fixup of the rare 64-row blocks where a group did not fold
  (`portable.fold_fixup`). No host readback (CUDA-graph capturable). `fold_fp4_weight` runs the
  fold once, at load time; its `FoldedFp4Weight` stands for ``(b, b_s)`` and takes this engine
  at every M.
- ``"mma"`` (act_block_size 128, M <= 64, K % 128 == 0, sm_90, aligned rows): `hopper_fp4`'s
  decode engine, f16 mma.sync on the exact E2M1 / E4M3 values, each group's scale applied to
  its partial in FP32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ...formats.base import FormatError
from ...formats.fp8 import e8m0_encode
from ...runtime.device import is_sm90_native, num_sms, require_sm90, tma_problem
from .fp8 import check_config, check_devices, check_fp8_operand, check_out, scales_fp32
from .heuristics import FP4_ENV_OVERRIDES, BlockScaledConfig, explain_fp4_gemm_config, fp4_gemm_config, mma_tile_problem
from .portable import fold_fixup, fold_weight, fp4_gemm_launch
from .tiles import SCALE_BLOCK

__all__ = [
    "fp4_gemm",
    "fold_fp4_weight",
    "FoldedFp4Weight",
    "fp4_gemm_config",
    "explain_fp4_gemm_config",
    "fold_capable",
    "mma_capable",
    "decode_mma_problem",
    "ENV_OVERRIDES",
    "WEIGHT_GROUP",
]

#: K elements per E8M0 weight scale (MXFP4).
WEIGHT_GROUP = 32
#: The tuning overrides read by `fp4_gemm_config` (each is part of the memo key).
ENV_OVERRIDES = FP4_ENV_OVERRIDES


# --------------------------------------------------------------------------- engine capability
def fold_capable(a: torch.Tensor) -> bool:
    """Whether the fold engine can run with these activations (sm_90 GPU, TMA-able a; the
    folded weight is allocated by the engine, so always TMA-able)."""
    return is_sm90_native(a.device) and tma_problem(a, "a") is None


def decode_mma_problem(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor,
                       act_block_size: int) -> str | None:
    """Why the mma engine cannot run these operands (None when it can): 128-K activation
    blocks, K a multiple of 128, and 16-byte aligned rows of a and b (4-byte for b_s), K
    contiguous."""
    if act_block_size != SCALE_BLOCK:
        return f"needs act_block_size {SCALE_BLOCK}, got {act_block_size}"
    k = a.shape[1]
    if k % SCALE_BLOCK:
        return f"needs K % {SCALE_BLOCK} == 0, got K={k}"
    for name, t, align in (("a", a, 16), ("b", b, 16), ("b_s", b_s, 4)):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % align or t.data_ptr() % align:
            return f"needs {name} K-contiguous with {align}-byte aligned rows"
    return None


def mma_capable(a: torch.Tensor, a_s: torch.Tensor, b: torch.Tensor, b_s: torch.Tensor, act_block_size: int) -> bool:
    """Whether the decode mma engine can run these (validated) operands: an sm_90 GPU and
    `decode_mma_problem` None."""
    return is_sm90_native(a.device) and decode_mma_problem(a, a_s, b, b_s, act_block_size) is None


# --------------------------------------------------------------------------- validation
def _weight_bytes(b, who: str) -> torch.Tensor:
    if not isinstance(b, torch.Tensor):
        raise TypeError(f"{who}: b must be a torch.Tensor, got {type(b).__name__}")
    if b.dtype == getattr(torch, "float4_e2m1fn_x2", None):
        b = b.view(torch.uint8)
    if b.dtype != torch.uint8:
        raise TypeError(f"{who}: b must be packed FP4 E2M1, uint8 or float4_e2m1fn_x2 [N, K/2], got {b.dtype}")
    if b.dim() != 2:
        raise ValueError(f"{who}: b must be 2-D [N, K/2], got shape {tuple(b.shape)}")
    if b.shape[1] > 1 and b.stride(1) != 1:
        raise ValueError(f"{who}: b must be contiguous along K, got strides {b.stride()}")
    return b


def _weight_scales(b_s, n: int, groups: int, who: str) -> torch.Tensor:
    if not isinstance(b_s, torch.Tensor):
        raise TypeError(f"{who}: b_s must be a torch.Tensor, got {type(b_s).__name__}")
    if b_s.dtype == getattr(torch, "float8_e8m0fnu", None):
        b_s = b_s.view(torch.uint8)
    elif b_s.dtype == torch.float32:
        try:  # decoded powers of two, as the reference accepts: re-encode (one torch op, a sync)
            b_s = e8m0_encode(b_s)
        except FormatError as exc:
            raise ValueError(f"{who}: float32 b_s must hold powers of two (E8M0 values): {exc}") from None
    elif b_s.dtype != torch.uint8:
        raise TypeError(f"{who}: b_s must be E8M0 (uint8 or float8_e8m0fnu) [N, K/32], got {b_s.dtype}")
    if tuple(b_s.shape) != (n, groups):
        raise ValueError(f"{who}: b_s must have shape {(n, groups)} ([N, K/32]: one E8M0 scale per 32 K), "
                         f"got {tuple(b_s.shape)}")
    return b_s


# --------------------------------------------------------------------------- folded weights
@dataclass(frozen=True, eq=False)
class FoldedFp4Weight:
    """An MXFP4 weight with the fold engine's first phase done (`fold_fp4_weight`).

    b: ``uint8 [N, K/2]`` and b_s: E8M0 ``uint8 [N, K/32]``, the weight as given (decode
    engines, the direct kernel and the exact fixup read it); w8: ``float8_e4m3fn [N, K]``,
    w8_s: ``fp32 [N, ceil(K/128)]`` (K-block-major), left: ``int32 [ceil(N/64)]``: the fold
    (`portable.fold_weight`); needs_fixup: whether any flag of `left` is set."""

    b: torch.Tensor
    b_s: torch.Tensor
    w8: torch.Tensor
    w8_s: torch.Tensor
    left: torch.Tensor
    needs_fixup: bool

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K) of the weight."""
        return self.b.shape[0], self.b.shape[1] * 2


def fold_fp4_weight(b: torch.Tensor, b_s: torch.Tensor) -> FoldedFp4Weight:
    """Prepare an MXFP4 weight for `fp4_gemm` once: b ``uint8`` / ``float4_e2m1fn_x2 [N, K/2]``
    (K a multiple of 32), b_s E8M0 ``uint8`` / ``float8_e8m0fnu [N, K/32]`` (or FP32 powers of
    two). Runs the fold (under the interpreter too) and reads its flags back once (a host sync:
    call it at load time, not inside a captured graph). The result stands for ``(b, b_s)`` in
    every `fp4_gemm` call and gives the same output."""
    who = "fold_fp4_weight"
    b = _weight_bytes(b, who)
    n, k = b.shape[0], b.shape[1] * 2
    if k % WEIGHT_GROUP:
        raise ValueError(f"{who}: K={k} must be a multiple of {WEIGHT_GROUP} (MXFP4 groups)")
    b_s = _weight_scales(b_s, n, k // WEIGHT_GROUP, who)
    check_devices(who, b=b, b_s=b_s)
    w8, w8_s, left = fold_weight(b, b_s)
    return FoldedFp4Weight(b, b_s, w8, w8_s, left, bool(left.any()))


# --------------------------------------------------------------------------- the op
def fp4_gemm(
    a: torch.Tensor,
    a_s: torch.Tensor,
    b: torch.Tensor | FoldedFp4Weight,
    b_s: torch.Tensor | None = None,
    act_block_size: int = 128,
    *,
    out: torch.Tensor | None = None,
    config: BlockScaledConfig | None = None,
) -> torch.Tensor:
    """FP8 x MXFP4 GEMM ``c = (a * a_s) @ (e2m1(b) * 2**(b_s - 127))^T`` in BF16 (module doc).

    a: ``float8_e4m3fn [M, K]`` (K contiguous, K a multiple of 32); a_s:
    ``[M, ceil(K/act_block_size)]`` FP32 (or E8M0 bytes, decoded by a torch op); b: ``uint8``
    or ``float4_e2m1fn_x2 [N, K/2]``; b_s: E8M0 ``uint8`` / ``float8_e8m0fnu [N, K/32]`` (FP32
    powers of two are re-encoded on the host), or b a `FoldedFp4Weight` and b_s None (the fold
    engine then skips its first phase); act_block_size: 128 or 32. out: optional
    ``bf16 [M, N]``; config: a `BlockScaledConfig` instead of the heuristic's (k_step 128 needs
    act_block_size 128; engine ``"fold"`` needs act_block_size 128, an sm_90 GPU and TMA-able
    a; engine ``"mma"`` an sm_90 GPU and operands `decode_mma_problem` accepts). Returns
    ``bf16 [M, N]``, equal to `lowbit.reference.fp4_gemm_ref` up to FP32 summation order and
    the one BF16 rounding."""
    who = "fp4_gemm"
    check_fp8_operand(a, "a", who)
    folded = None
    if isinstance(b, FoldedFp4Weight):
        if b_s is not None:
            raise ValueError(f"{who}: a FoldedFp4Weight carries its scales: pass b_s=None")
        folded, b, b_s = b, b.b, b.b_s
    elif b_s is None:
        raise TypeError(f"{who}: b_s is required unless b is a FoldedFp4Weight (fold_fp4_weight)")
    b = _weight_bytes(b, who)
    if act_block_size not in (32, 128):
        raise ValueError(f"{who}: act_block_size must be 32 or 128, got {act_block_size}")
    m, k = a.shape
    n = b.shape[0]
    if k % WEIGHT_GROUP:
        raise ValueError(f"{who}: K={k} (a {tuple(a.shape)}) must be a multiple of {WEIGHT_GROUP} (MXFP4 groups)")
    if b.shape[1] * 2 != k:
        raise ValueError(f"{who}: b {tuple(b.shape)} must be [N, K/2] = [{n}, {k // 2}] for a {tuple(a.shape)}")
    a_s = scales_fp32(a_s, "a_s", who, (m, triton.cdiv(k, act_block_size)),
                      f"[M, ceil(K/{act_block_size})]: activation scales")
    b_s = _weight_scales(b_s, n, k // WEIGHT_GROUP, who)
    check_devices(who, a=a, a_s=a_s, b=b, b_s=b_s)
    out = check_out(out, m, n, a.device, who)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if config is None:
        config = fp4_gemm_config(m, n, k, act_block_size, num_sms(a.device), fold_capable(a),
                                 mma_capable(a, a_s, b, b_s, act_block_size), folded is not None)
    if config.engine == "mma":
        _launch_mma(a, a_s, b, b_s, out, config, act_block_size, who)
        return out
    check_config(config, who, k_steps=(32, 128), engines=("triton", "fold"))
    if config.engine == "fold":
        if act_block_size != 128:
            raise ValueError(f"{who}: engine='fold' folds the weight scales over 128-K blocks and needs "
                             f"act_block_size=128, got {act_block_size}")
        if config.k_step != 128:
            raise ValueError(f"{who}: engine='fold' has 128-K steps (k_step=128), got k_step={config.k_step}")
        _launch_fold(a, a_s, b, b_s, out, config, who, folded)
        return out
    if config.k_step == 128 and act_block_size != 128:
        raise ValueError(f"{who}: k_step=128 folds the weight scales over a whole activation group and "
                         f"needs act_block_size=128, got {act_block_size}")
    fp4_gemm_launch(a, a_s, b, b_s, out, act_block_size, config.k_step, config.block_m, config.block_n,
                    config.num_warps, config.num_stages, config.swap_ab, config.split_k)
    return out


def _launch_fold(a, a_s, b, b_s, out, config: BlockScaledConfig, who: str,
                 folded: FoldedFp4Weight | None = None) -> None:
    """Fold, Gluon GEMM on the folded weight, fixup: three launches, no host sync; with a
    `FoldedFp4Weight` the GEMM, and the fixup only where it needs one."""
    require_sm90(a.device, f"{who} (engine='fold' runs a Gluon GEMM)")
    from .hopper_fp8 import fp8_gemm_sm90_launch  # noqa: PLC0415 (Gluon imported only when asked for)

    why = tma_problem(a, "a")
    if why:
        raise ValueError(f"{who}: engine='fold' loads a through TMA: {why}")
    m, k = a.shape
    n = b.shape[0]
    if folded is None:
        w8, w8_s, left = fold_weight(b, b_s)
    else:
        check_devices(who, a=a, w8=folded.w8)
        w8, w8_s, left = folded.w8, folded.w8_s, folded.left
    fp8_gemm_sm90_launch(a, a_s, w8, w8_s, out, m, n, k, config.block_m, config.block_n, config.num_warps,
                         config.num_stages, b_scale_per_row=True, split_k=config.split_k)
    if folded is None or folded.needs_fixup:
        fold_fixup(a, a_s, b, b_s, left, out)


def _launch_mma(a, a_s, b, b_s, out, config: BlockScaledConfig, act_block_size: int, who: str) -> None:
    """The decode mma engine, after checking what a hand-made config may get wrong."""
    require_sm90(a.device, f"{who} engine='mma'")
    from .hopper_fp4 import decode_mma_launch  # noqa: PLC0415 (Gluon imported only when asked for)

    problem = decode_mma_problem(a, a_s, b, b_s, act_block_size)
    if problem:
        raise ValueError(f"{who}: engine='mma' {problem}")
    problem = mma_tile_problem(config, a.shape[0])
    if problem:
        raise ValueError(f"{who}: engine='mma': {problem}")
    decode_mma_launch(a, a_s, b, b_s, out, config.block_m, config.num_warps, config.num_stages, config.split_k)
