"""``hc_split_sinkhorn`` of seed 004 (DeepSeek V4 Hyper-Connections mixing) in Triton.

    hc_split_sinkhorn(mixes [..., (2+hc)*hc], hc_scale [3], hc_base [(2+hc)*hc])
        -> pre [..., hc], post [..., hc], comb [..., hc, hc]         (all float32)
    per token (x = mixes, c = hc_base):
        pre[j]  = sigmoid(x[j] * hc_scale[0] + c[j]) + eps
        post[j] = 2 * sigmoid(x[hc + j] * hc_scale[1] + c[hc + j])
        comb    = softmax over k of (x[2hc + j*hc + k] * hc_scale[2] + c[2hc + j*hc + k]) + eps
        comb   /= column sums + eps
        repeat sinkhorn_iters - 1 times: comb /= row sums + eps; comb /= column sums + eps

Reference: `lowbit.reference.hc_split_sinkhorn_ref` (same operations in the same order). All
FP32. Divisions are ``tl.div_rn`` (IEEE, as PyTorch divides); the differences left are
``exp`` (the GPU's ``ex2.approx`` against the CPU's libm: a few ulp), FMA contraction of
``x * scale + base`` on the GPU and the summation order of 4-term sums: ~1e-6 relative.

Design: a program takes ``TOKENS`` tokens as one ``[TOKENS, HCP, HCP]`` tile (``HCP`` = hc
rounded up to a power of two; padded entries are held at exactly 0, so they add nothing to any
row or column sum). Nothing leaves registers during the iterations. Per token it reads 24 and
writes 24 floats (hc = 4): a latency-bound kernel for decode batches, a tiny memory-bound one
for prefill; heuristics (`sinkhorn_config`) only choose how many tokens share a program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl

from ..runtime import overrides
from ..runtime.device import H200_NUM_SMS
from .compile_tier import KernelConfig

__all__ = ["hc_split_sinkhorn", "SinkhornConfig", "sinkhorn_config", "explain_sinkhorn_config", "ENV_OVERRIDES"]

#: Largest hc_mult the kernel takes (DeepSeek V4 uses 4); the tile is TOKENS x hc x hc.
MAX_HC = 16


@triton.jit
def _sigmoid(z):
    return tl.div_rn(1.0, 1.0 + tl.exp(-z))


@triton.jit
def _hc_split_sinkhorn_kernel(
    mixes_ptr, scale_ptr, base_ptr, pre_ptr, post_ptr, comb_ptr,
    n, stride_mix, iters, eps,
    HC: tl.constexpr, HCP: tl.constexpr, TOKENS: tl.constexpr,
):
    t = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    t_ok = t < n
    t64 = t.to(tl.int64)
    h = tl.arange(0, HCP)
    h_ok = h < HC
    row = mixes_ptr + t64[:, None] * stride_mix  # [T, 1]

    # pre / post: [T, HCP]
    m2 = t_ok[:, None] & h_ok[None, :]
    s0 = tl.load(scale_ptr)
    s1 = tl.load(scale_ptr + 1)
    s2 = tl.load(scale_ptr + 2)
    x_pre = tl.load(row + h[None, :], mask=m2, other=0.0)
    x_post = tl.load(row + HC + h[None, :], mask=m2, other=0.0)
    b_pre = tl.load(base_ptr + h, mask=h_ok, other=0.0)
    b_post = tl.load(base_ptr + HC + h, mask=h_ok, other=0.0)
    pre = _sigmoid(x_pre * s0 + b_pre[None, :]) + eps
    post = 2.0 * _sigmoid(x_post * s1 + b_post[None, :])
    out2 = t64[:, None] * HC + h[None, :]
    tl.store(pre_ptr + out2, pre, mask=m2)
    tl.store(post_ptr + out2, post, mask=m2)

    # comb: [T, HCP (j), HCP (k)]
    jk = h[:, None] * HC + h[None, :]  # [HCP, HCP]
    jk_ok = h_ok[:, None] & h_ok[None, :]
    m3 = t_ok[:, None, None] & jk_ok[None, :, :]
    x_c = tl.load(row[:, :, None] + 2 * HC + jk[None, :, :], mask=m3, other=0.0)
    b_c = tl.load(base_ptr + 2 * HC + jk, mask=jk_ok, other=0.0)
    logits = tl.where(jk_ok[None, :, :], x_c * s2 + b_c[None, :, :], -1e30)
    e = tl.exp(logits - tl.max(logits, axis=2)[:, :, None])  # padded k: exp(-huge) = 0
    comb = tl.div_rn(e, tl.sum(e, axis=2)[:, :, None]) + eps
    comb = tl.where(jk_ok[None, :, :], comb, 0.0)  # padded rows / columns stay exactly 0
    comb = tl.div_rn(comb, tl.sum(comb, axis=1)[:, None, :] + eps)
    for _ in range(iters - 1):
        comb = tl.div_rn(comb, tl.sum(comb, axis=2)[:, :, None] + eps)
        comb = tl.div_rn(comb, tl.sum(comb, axis=1)[:, None, :] + eps)
    tl.store(comb_ptr + t64[:, None, None] * (HC * HC) + jk[None, :, :], comb, mask=m3)


# --------------------------------------------------------------------------- heuristics
#: (max tokens, tokens a program, warps) for hc = 4, first match wins:
#:  - up to 8 tokens a SM: one token a program, one warp (16 entries: every token on its own
#:    SM slot, the 20 serial Sinkhorn rounds of different tokens overlap across SMs);
#:  - up to 64 a SM: 8 tokens a program, one warp (128 entries, 4 a thread);
#:  - beyond: 32 tokens a program, 4 warps (512 entries, 4 a thread): fewer, fuller programs.
#: From the operation count (20 rounds x 2 normalizations, all in registers); not yet measured
#: on the H200.
SINKHORN_TABLE = ((8 * H200_NUM_SMS, 1, 1), (64 * H200_NUM_SMS, 8, 1), (None, 32, 4))

_FIELDS = ("tokens_per_program", "num_warps")
ENV_OVERRIDES = overrides.override_names("SINKHORN", _FIELDS)


@dataclass(frozen=True)
class SinkhornConfig:
    """Launch choice: tokens a program takes (a power of two) and warps."""

    tokens_per_program: int
    num_warps: int
    reason: str = ""


def _check_config(cfg: SinkhornConfig) -> None:
    t, w = cfg.tokens_per_program, cfg.num_warps
    if not isinstance(t, int) or t < 1 or t & (t - 1) or t > 1024:
        raise ValueError(f"hc_split_sinkhorn: tokens_per_program must be a power of two in [1, 1024], got {t!r}")
    if w not in (1, 2, 4, 8):
        raise ValueError(f"hc_split_sinkhorn: num_warps must be 1, 2, 4 or 8, got {w!r}")


@lru_cache(maxsize=4096)
def _config_cached(n: int, hc: int, env: tuple) -> SinkhornConfig:
    for limit, tokens, warps in SINKHORN_TABLE:
        if limit is None or n <= limit:
            break
    cfg = SinkhornConfig(tokens, warps, f"{n} tokens, hc={hc}: {tokens} a program, {warps} warp(s) "
                                        f"-> {triton.cdiv(n, tokens)} programs; op count, not yet measured on the H200")
    cfg = overrides.apply_env_overrides(cfg, "SINKHORN", _FIELDS)
    _check_config(cfg)
    return cfg


def sinkhorn_config(n: int, hc: int = 4) -> SinkhornConfig:
    """Launch configuration for ``n`` tokens; memoized per (n, hc) and the overrides
    ``LOWBIT_SINKHORN_TOKENS_PER_PROGRAM`` / ``LOWBIT_SINKHORN_NUM_WARPS``."""
    return _config_cached(int(n), int(hc), overrides.env_key("SINKHORN", _FIELDS))


def explain_sinkhorn_config(n: int, hc: int = 4) -> str:
    """`sinkhorn_config`'s choice for ``n`` tokens, as one line."""
    c = sinkhorn_config(n, hc)
    return f"hc_split_sinkhorn n={n} hc={hc}: tokens_per_program={c.tokens_per_program} warps={c.num_warps} -- {c.reason}"


# --------------------------------------------------------------------------- launcher
def hc_split_sinkhorn(
    mixes: torch.Tensor,
    hc_scale: torch.Tensor,
    hc_base: torch.Tensor,
    hc_mult: int = 4,
    sinkhorn_iters: int = 20,
    eps: float = 1e-6,
    *,
    config: SinkhornConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the Hyper-Connection logits into ``pre``, ``post`` and a Sinkhorn-normalised
    ``comb`` (the module docstring has the math; `hc_split_sinkhorn_ref` is the reference).

    mixes: ``float32 [..., (2 + hc) * hc]`` (any leading shape, unit stride along the last dim
    or it is copied); hc_scale: ``float32 [3]``; hc_base: ``float32 [(2 + hc) * hc]``, on
    mixes' device. hc_mult: 1..16 (4 in DeepSeek V4). sinkhorn_iters: >= 1. eps: finite float.
    config: a `SinkhornConfig` instead of the heuristic.
    Returns ``(pre [..., hc], post [..., hc], comb [..., hc, hc])``, float32, contiguous.
    Raises TypeError on wrong types / dtypes and ValueError on wrong shapes or arguments.
    """
    for name, t in (("mixes", mixes), ("hc_scale", hc_scale), ("hc_base", hc_base)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"hc_split_sinkhorn: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise TypeError(f"hc_split_sinkhorn: {name} must be float32, got {t.dtype} {tuple(t.shape)}")
    if isinstance(hc_mult, bool) or not isinstance(hc_mult, int) or not 1 <= hc_mult <= MAX_HC:
        raise ValueError(f"hc_split_sinkhorn: hc_mult must be an int in [1, {MAX_HC}], got {hc_mult!r}")
    if isinstance(sinkhorn_iters, bool) or not isinstance(sinkhorn_iters, int) or sinkhorn_iters < 1:
        raise ValueError(f"hc_split_sinkhorn: sinkhorn_iters must be an int >= 1, got {sinkhorn_iters!r}")
    if not isinstance(eps, (int, float)) or not math.isfinite(eps):
        raise ValueError(f"hc_split_sinkhorn: eps must be a finite float, got {eps!r}")
    hc = hc_mult
    mix_hc = (2 + hc) * hc
    if mixes.dim() < 1 or mixes.shape[-1] != mix_hc:
        raise ValueError(
            f"hc_split_sinkhorn: mixes must be [..., (2 + hc_mult) * hc_mult] = [..., {mix_hc}], "
            f"got {tuple(mixes.shape)}")
    if tuple(hc_scale.shape) != (3,):
        raise ValueError(f"hc_split_sinkhorn: hc_scale must be [3], got {tuple(hc_scale.shape)}")
    if tuple(hc_base.shape) != (mix_hc,):
        raise ValueError(f"hc_split_sinkhorn: hc_base must be [{mix_hc}], got {tuple(hc_base.shape)}")
    for name, t in (("hc_scale", hc_scale), ("hc_base", hc_base)):
        if t.device != mixes.device:
            raise ValueError(f"hc_split_sinkhorn: {name} is on {t.device}, mixes on {mixes.device}")

    lead = tuple(mixes.shape[:-1])
    m2 = mixes.reshape(-1, mix_hc)
    if m2.stride(-1) != 1:
        m2 = m2.contiguous()
    n = m2.shape[0]
    pre = torch.empty(*lead, hc, dtype=torch.float32, device=mixes.device)
    post = torch.empty_like(pre)
    comb = torch.empty(*lead, hc, hc, dtype=torch.float32, device=mixes.device)
    if n == 0:
        return pre, post, comb
    if n >= 2**31 // mix_hc:
        raise ValueError(f"hc_split_sinkhorn: {n} tokens exceed the kernel's int32 token index")
    config = config or sinkhorn_config(n, hc)
    _check_config(config)
    grid = (triton.cdiv(n, config.tokens_per_program),)
    _hc_split_sinkhorn_kernel[grid](
        m2, hc_scale.contiguous(), hc_base.contiguous(), pre, post, comb,
        n, m2.stride(0), sinkhorn_iters, float(eps),
        HC=hc, HCP=triton.next_power_of_2(hc), TOKENS=config.tokens_per_program,
        num_warps=config.num_warps,
    )
    return pre, post, comb


# --------------------------------------------------------------------------- compile tier
def compile_configs() -> list[KernelConfig]:
    """Every row of `SINKHORN_TABLE` for DeepSeek V4's hc = 4 (other hc compile on first use)."""
    sig = {"mixes_ptr": "*fp32", "scale_ptr": "*fp32", "base_ptr": "*fp32", "pre_ptr": "*fp32",
           "post_ptr": "*fp32", "comb_ptr": "*fp32", "n": "i32", "stride_mix": "i32", "iters": "i32",
           "eps": "fp32", "HC": "constexpr", "HCP": "constexpr", "TOKENS": "constexpr"}
    return [
        KernelConfig(f"hc_split_sinkhorn[hc=4,T={tokens},w={warps}]", _hc_split_sinkhorn_kernel, sig,
                     {"HC": 4, "HCP": 4, "TOKENS": tokens}, num_warps=warps,
                     # 24 floats a token: the row stride is 24, not a multiple of 16
                     unaligned=("n", "stride_mix", "iters"))
        for _, tokens, warps in SINKHORN_TABLE
    ]
