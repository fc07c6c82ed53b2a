"""Block-scaled FP8 x FP8 GEMM (DeepSeek's ``fp8_gemm``): 1x128 activation scales, 128x128
weight scales, BF16 out.

Semantics (reference: `lowbit.reference.fp8_gemm_ref`)::

    fp8_gemm(a, a_s, b, b_s) -> c bf16 [M, N]
        a float8_e4m3fn [M, K], a_s fp32 [M, ceil(K/128)]             (one scale per 1x128)
        b float8_e4m3fn [N, K], b_s fp32 [ceil(N/128), ceil(K/128)]   (one scale per 128x128)
        for m, n:
            acc = 0.0                                                  # FP32 running sum
            for kb in range(ceil(K / 128)):
                block = sum_k a[m, k] * b[n, k]   over the 128 K of block kb   (tensor cores)
                acc  += block * (a_s[m, kb] * b_s[n // 128, kb])       # promotion
            c[m, n] = bf16(acc)                                        # rounded once

K and N need not be multiples of 128; the last K block may be short, as in the reference.
Engines (`BlockScaledConfig.engine`, chosen by `heuristics.fp8_gemm_config`): ``"triton"``
(`portable`, every tier, the interpreter included) and ``"gluon"`` (`hopper_fp8`: sm_90 with
TMA-able operands, the promotion of one K block overlapped with the next block's wgmma; the
default there at every M). Both promote per 128-K block in the reference's order; a split along
K sums FP32 shares in a fixed order (`splitk`).

This module also holds the operand checks `fp4` shares (the config check, FP8 operands, scales,
the output buffer, devices).
"""

from __future__ import annotations

import torch
import triton

from ...formats.fp8 import e8m0_decode
from ...runtime.device import H200_NUM_SMS, is_sm90_native, num_sms, require_sm90, tma_problem
from .heuristics import FP8_ENV_OVERRIDES, BlockScaledConfig, explain_fp8_gemm_config, fp8_gemm_config
from .portable import fp8_gemm_launch
from .tiles import GLUON_TILES, SCALE_BLOCK

__all__ = [
    "ENV_OVERRIDES",
    "H200_NUM_SMS",
    "SCALE_BLOCK",
    "BlockScaledConfig",
    "explain_fp8_gemm_config",
    "fp8_gemm",
    "fp8_gemm_config",
    "gluon_capable",
]

#: The tuning overrides read by `fp8_gemm_config` (each is part of the memo key).
ENV_OVERRIDES = FP8_ENV_OVERRIDES
_FP8 = torch.float8_e4m3fn


def gluon_capable(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the Gluon engine can run these operands (sm_90 GPU, TMA-able a and b)."""
    return is_sm90_native(a.device) and not (tma_problem(a, "a") or tma_problem(b, "b"))


# --------------------------------------------------------------------------- validation
def check_config(cfg: BlockScaledConfig, who: str, k_steps: tuple[int, ...] = (128,),
                 engines: tuple[str, ...] = ("triton",)) -> None:
    """Reject a hand-made `cfg` the engines cannot run (`who` names the op in the message)."""
    if not isinstance(cfg, BlockScaledConfig):
        raise TypeError(f"{who}: config must be a BlockScaledConfig, got {type(cfg).__name__}")
    if cfg.engine not in engines:
        raise ValueError(f"{who}: engine must be one of {engines}, got {cfg.engine!r}")
    if cfg.engine in ("gluon", "fold"):  # fold: fp4_gemm's engine around the same Gluon kernel
        tile = (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages)
        if cfg.swap_ab or (cfg.split_k != 1 and cfg.block_m != 64) or tile not in GLUON_TILES:
            raise ValueError(f"{who}: the {cfg.engine} engine runs the prefill tiles (block_m, block_n, num_warps, "
                             f"num_stages) in {GLUON_TILES} without swap_ab, and split_k only on the 64-row tile; "
                             f"got {tile}, swap_ab={cfg.swap_ab}, split_k={cfg.split_k}")
    elif cfg.block_m < 16 or cfg.block_m & (cfg.block_m - 1):
        raise ValueError(f"{who}: block_m must be a power of two >= 16, got {cfg.block_m}")
    if cfg.block_n not in (16, 32, 64, 128):
        raise ValueError(f"{who}: block_n must divide 128 (16, 32, 64 or 128), got {cfg.block_n}")
    if cfg.split_k < 1:
        raise ValueError(f"{who}: split_k must be >= 1, got {cfg.split_k}")
    if cfg.k_step not in k_steps:
        raise ValueError(f"{who}: k_step must be one of {k_steps}, got {cfg.k_step}")


def check_fp8_operand(x, name: str, who: str) -> None:
    """`x` must be a 2-D ``float8_e4m3fn`` tensor contiguous along K (its last dim)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype != _FP8:
        raise TypeError(f"{who}: {name} must be torch.float8_e4m3fn, got {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{who}: {name} must be 2-D, got shape {tuple(x.shape)}")
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"{who}: {name} must be contiguous along K (stride(1) == 1), got strides {x.stride()}")


def scales_fp32(s, name: str, who: str, shape: tuple[int, int], what: str) -> torch.Tensor:
    """FP32 scales of `shape` as given; E8M0 (``uint8`` / ``float8_e8m0fnu``) decoded by one torch op."""
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{who}: {name} must be a torch.Tensor, got {type(s).__name__}")
    if s.dtype in (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8)):
        s = e8m0_decode(s)
    elif s.dtype != torch.float32:
        raise TypeError(f"{who}: {name} must be float32, float8_e8m0fnu or uint8 (E8M0), got {s.dtype}")
    if tuple(s.shape) != shape:
        raise ValueError(f"{who}: {name} must have shape {shape} ({what}), got {tuple(s.shape)}")
    return s


def check_out(out, m: int, n: int, device: torch.device, who: str) -> torch.Tensor:
    """`out` as given (bf16 ``[m, n]``, N contiguous, on `device`) or a fresh one when None."""
    if out is None:
        return torch.empty(m, n, dtype=torch.bfloat16, device=device)
    if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or tuple(out.shape) != (m, n) \
            or (n > 1 and out.stride(1) != 1):
        desc = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"{who}: out must be bf16 [{m}, {n}] contiguous along N, got {desc}")
    if out.device != device:
        raise ValueError(f"{who}: out is on {out.device}, a on {device}")
    return out


def check_devices(who: str, **tensors: torch.Tensor) -> None:
    """All `tensors` on one device."""
    devs = {k: v.device for k, v in tensors.items()}
    if len(set(devs.values())) > 1:
        raise ValueError(f"{who}: all operands must be on one device, got {devs}")


# --------------------------------------------------------------------------- the op
def fp8_gemm(
    a: torch.Tensor,
    a_s: torch.Tensor,
    b: torch.Tensor,
    b_s: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: BlockScaledConfig | None = None,
) -> torch.Tensor:
    """Block-scaled FP8 GEMM ``c = (a * a_s) @ (b * b_s)^T`` in BF16 (semantics: module doc).

    a: ``float8_e4m3fn [M, K]`` (rows may be strided, K contiguous); a_s: ``[M, ceil(K/128)]``
    scales; b: ``float8_e4m3fn [N, K]`` (K contiguous); b_s: ``[ceil(N/128), ceil(K/128)]``.
    Scales are FP32 (powers of two from ``scale_fmt="ue8m0"`` included) or E8M0 bytes
    (``uint8`` / ``float8_e8m0fnu``, decoded to FP32 by a torch op before the launch).
    out: optional ``bf16 [M, N]`` (N contiguous); config: a `BlockScaledConfig` instead of the
    heuristic's. Returns ``bf16 [M, N]``, equal to `lowbit.reference.fp8_gemm_ref` up to FP32
    summation order and the one BF16 rounding."""
    who = "fp8_gemm"
    check_fp8_operand(a, "a", who)
    check_fp8_operand(b, "b", who)
    m, k = a.shape
    n, kb_ = b.shape
    if kb_ != k:
        raise ValueError(f"{who}: a {tuple(a.shape)} and b {tuple(b.shape)} must share K (both [*, K], NT layout)")
    kblocks = triton.cdiv(k, SCALE_BLOCK)
    a_s = scales_fp32(a_s, "a_s", who, (m, kblocks), "[M, ceil(K/128)]: 1x128 activation scales")
    b_s = scales_fp32(b_s, "b_s", who, (triton.cdiv(n, SCALE_BLOCK), kblocks),
                      "[ceil(N/128), ceil(K/128)]: 128x128 weight scales")
    check_devices(who, a=a, a_s=a_s, b=b, b_s=b_s)
    out = check_out(out, m, n, a.device, who)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if config is None:
        config = fp8_gemm_config(m, n, k, num_sms(a.device), gluon_capable(a, b))
    check_config(config, who, engines=("triton", "gluon"))
    if config.engine == "gluon":
        _launch_gluon(a, a_s, b, b_s, out, m, n, k, config, who)
        return out
    fp8_gemm_launch(a, a_s, b, b_s, out, config.block_m, config.block_n, config.num_warps, config.num_stages,
                    config.swap_ab, config.split_k)
    return out


def _launch_gluon(a, a_s, b, b_s, out, m, n, k, config: BlockScaledConfig, who: str) -> None:
    """The Hopper Gluon kernels (`hopper_fp8`): a CUDA sm_90 device, TMA-able operands."""
    require_sm90(a.device, who)
    from .hopper_fp8 import fp8_gemm_sm90_launch  # noqa: PLC0415 (Gluon imported only when asked for)

    why = tma_problem(a, "a") or tma_problem(b, "b")
    if why:
        raise ValueError(f"{who}: engine='gluon' loads through TMA: {why}")
    fp8_gemm_sm90_launch(a, a_s, b, b_s, out, m, n, k, config.block_m, config.block_n,
                         config.num_warps, config.num_stages, split_k=config.split_k)
