"""W4A16 grouped MoE GEMMs (DeepGEMM-style layouts): contiguous (prefill) and masked (decode).

Semantics::

    contiguous(a2, w, m_indices)            -> out [m, N]
        out[r] = bf16(a2[r] @ dequant(W[m_indices[r]])^T)    for rows with m_indices[r] >= 0
    masked(a3, w, masked_m, expected_m)     -> out [G * max_m, N]
        out[g*max_m + i] = bf16(a3[g, i] @ dequant(W[g])^T)  for i < masked_m[g]

References: `lowbit.reference.w4a16_contiguous_ref` / `w4a16_masked_ref`. Contiguous: each
expert's segment is padded to 128 rows (padding rows are never stored). Masked: no host
readback (capturable in a CUDA graph); ``expected_m`` only picks the launch shape.

The ops validate, allocate and launch: the portable Triton kernels (`portable`, every tier) or
on sm_90 with TMA-able activations the Hopper engines (`hopper.grouped`), as the configuration
(`heuristics.w4a16_grouped_config`) says.
"""

from __future__ import annotations

import torch

from ...formats.w4a16 import W4A16Weight
from ...routing.layouts import CONTIGUOUS_ALIGNMENT
from ...runtime.device import is_sm90_native, require_sm90, tma_problem
from .heuristics import (
    GROUPED_ENV_OVERRIDES,
    MASKED_SPREAD,
    W4A16Config,
    avoid_miscompile,
    explain_w4a16_grouped_config,
    grouped_engine_tiles,
    masked_row_slots,
    w4a16_grouped_config,
)
from .portable import w4a16_contiguous_launch, w4a16_masked_launch
from .tiles import GLUON_ENGINES, GLUON_SPLIT_TILES, REGISTER_A_ENGINES, VALIDATED_TILES

__all__ = ["ENV_OVERRIDES", "contiguous", "explain_w4a16_grouped_config", "gluon_capable", "masked",
           "w4a16_grouped_config"]

#: Environment overrides of the grouped configuration (each is part of the memo key).
ENV_OVERRIDES = GROUPED_ENV_OVERRIDES


def gluon_capable(a: torch.Tensor, w: W4A16Weight) -> bool:
    """Whether the Gluon kernels can run these operands: an sm_90 GPU, TMA-able activation rows,
    N a multiple of 8 (the scales' TMA rows)."""
    return is_sm90_native(a.device) and tma_problem(a, "a") is None and w.n % 8 == 0


def _check_common(a: torch.Tensor, w: W4A16Weight, mode: str, name: str) -> None:
    if not isinstance(w, W4A16Weight):
        raise TypeError(f"w must be a W4A16Weight from pack_w4a16_grouped, got {type(w).__name__}")
    w.check(mode)
    if a.dtype != torch.bfloat16:
        raise TypeError(f"{name} must be bf16, got {a.dtype}")
    if a.shape[-1] != w.k:
        raise ValueError(f"{name} has K={a.shape[-1]}, the weight has K={w.k}")
    if a.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous along K")
    if a.device != w.qweight.device:
        raise ValueError(f"{name} is on {a.device}, the weight on {w.qweight.device}")


def _check_out(out: torch.Tensor | None, rows: int, n: int, device) -> torch.Tensor:
    if out is None:
        return torch.empty(rows, n, dtype=torch.bfloat16, device=device)
    if out.dtype != torch.bfloat16 or tuple(out.shape) != (rows, n) or out.stride(1) != 1:
        raise ValueError(f"out must be bf16 [{rows}, {n}] contiguous along N, got {out.dtype} {tuple(out.shape)}")
    return out


def contiguous(
    a2: torch.Tensor,
    w: W4A16Weight,
    m_indices: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: W4A16Config | None = None,
) -> torch.Tensor:
    """Grouped-contiguous W4A16 GEMM::

        out[r] = bf16(a2[r] @ dequant(W[m_indices[r]])^T)    for rows with m_indices[r] >= 0

    a2: ``bf16 [m, K]``, rows concatenated per expert, each segment padded to 128 rows
    (`lowbit.routing.build_contiguous` + `gather_rows` build it); w: `W4A16Weight` packed with
    ``pack_w4a16_grouped(..., mode="contiguous")`` (``[G, N, K]``); m_indices: ``int32 [m]``,
    the expert of each row, ``-1`` on padding rows; out: optional ``bf16 [m, N]`` contiguous
    along N; config: the launch configuration (default `w4a16_grouped_config`, with the Hopper
    engines where `gluon_capable`). Returns ``bf16 [m, N]``, equal on the valid rows to
    `lowbit.reference.w4a16_contiguous_ref`; padding rows are not written (their content is
    unspecified)."""
    _check_common(a2, w, "contiguous", "a2")
    if a2.dim() != 2:
        raise ValueError(f"a2 must be [m, K], got {tuple(a2.shape)}")
    m = a2.shape[0]
    if m_indices.dtype != torch.int32 or m_indices.shape != (m,):
        raise TypeError(f"m_indices must be int32 [{m}], got {m_indices.dtype} {tuple(m_indices.shape)}")
    if m_indices.device != a2.device:
        raise ValueError(f"m_indices is on {m_indices.device}, a2 on {a2.device}")
    if m % CONTIGUOUS_ALIGNMENT:
        raise ValueError(f"m={m} is not a multiple of {CONTIGUOUS_ALIGNMENT}: pad every expert segment to 128 rows")
    if config is None:
        config = w4a16_grouped_config("contiguous", m, w.n, w.k, w.num_experts, gluon=gluon_capable(a2, w))
    if config.split_k != 1:
        raise ValueError("split-K is implemented for the indexed W4A16 kernel only")
    if CONTIGUOUS_ALIGNMENT % config.block_m:
        raise ValueError(f"contiguous needs block_m dividing {CONTIGUOUS_ALIGNMENT}, got {config.block_m}")
    out = _check_out(out, m, w.n, a2.device)
    if m == 0:
        return out
    if config.engine in GLUON_ENGINES:
        _launch_gluon("contiguous", a2, w, m_indices, out, config)
        return out
    config = _triton_config(config, w.n)
    w4a16_contiguous_launch(a2, w, m_indices, out, block_m=config.block_m, block_n=config.block_n,
                            swap_ab=config.swap_ab, num_warps=config.num_warps, num_stages=config.num_stages)
    return out


def _triton_config(config: W4A16Config, n: int) -> W4A16Config:
    """`config` as the Triton kernels run it: a known engine and a GPU-validated row tile (an
    override such as ``LOWBIT_W4A16_GROUPED_BLOCK_M=48`` names a Gluon split tile, not one of
    these), the miscompile work-around applied."""
    if config.engine != "triton":
        raise ValueError(f"engine must be 'triton' or one of {GLUON_ENGINES}, got {config.engine!r}")
    if config.block_m not in VALIDATED_TILES:
        raise ValueError(f"the Triton grouped kernels run block_m in {sorted(VALIDATED_TILES)}, got {config.block_m} "
                         "(LOWBIT_W4A16_GROUPED_BLOCK_M?)")
    return avoid_miscompile(config, n)


def _launch_gluon(mode: str, a, w, route, out, config: W4A16Config, max_m: int = 0, expected_m: int = 0) -> None:
    """The Hopper Gluon kernels (`hopper.grouped`): a CUDA sm_90 device, TMA-able rows. engine
    ``gluon``: dequantized weights through shared memory; ``gluon_rs``: in registers;
    ``gluon_ws``: in registers, with a producer warp issuing the loads. Masked: a grid of
    programs for the expected rows (`heuristics.masked_row_slots`), not for max_m."""
    require_sm90(a.device, mode)
    # Gluon is imported only when a Hopper engine is asked for
    from .hopper.grouped import w4a16_grouped_sm90_launch, w4a16_grouped_split_launch

    regs_a = config.engine in REGISTER_A_ENGINES
    tiles = grouped_engine_tiles(config.engine, mode)
    tile = (config.block_n, config.block_m, config.num_warps, config.num_stages)
    if tile not in tiles or not config.swap_ab:
        raise ValueError(f"{mode}: the {config.engine} engine runs the tiles (weight rows, rows, warps, stages) in "
                         f"{tiles} with swap_ab, got {tile}, swap_ab={config.swap_ab}")
    why = tma_problem(a, "the activations")
    if why:
        raise ValueError(f"{mode}: engine='gluon' loads through TMA: {why}")
    ws = config.engine == "gluon_ws"  # the split and warp-specialized kernels run one program a row block
    if tile in GLUON_SPLIT_TILES:
        w4a16_grouped_split_launch(a, w, route, out, tile, max_m, warp_specialize=ws)
        return
    slots = masked_row_slots(MASKED_SPREAD * expected_m, max_m, config.block_m) if max_m and not ws else 0
    w4a16_grouped_sm90_launch(a, w, route, out, tile, max_m, regs_a, warp_specialize=ws, row_slots=slots)


def masked(
    a3: torch.Tensor,
    w: W4A16Weight,
    masked_m: torch.Tensor,
    expected_m: int,
    *,
    out: torch.Tensor | None = None,
    config: W4A16Config | None = None,
) -> torch.Tensor:
    """Grouped-masked W4A16 GEMM::

        out[g*max_m + i] = bf16(a3[g, i] @ dequant(W[g])^T)  for i < min(masked_m[g], max_m)

    a3: ``bf16 [G, max_m, K]`` or flat ``[G * max_m, K]``; w: `W4A16Weight` packed with
    ``pack_w4a16_grouped(..., mode="masked")`` (``[G, N, K]``); masked_m: ``int32 [G]`` on the
    device, the valid rows of each expert (values above max_m are clamped); expected_m: a
    positive Python int used only to choose the launch shape; out: optional ``bf16
    [G * max_m, N]``; config: as for `contiguous`. Returns flat ``bf16 [G * max_m, N]``, equal on
    the valid rows to `lowbit.reference.w4a16_masked_ref`; rows past ``masked_m[g]`` are
    unspecified."""
    _check_common(a3, w, "masked", "a3")
    g = w.num_experts
    if masked_m.dtype != torch.int32 or masked_m.shape != (g,):
        raise TypeError(f"masked_m must be int32 [{g}], got {masked_m.dtype} {tuple(masked_m.shape)}")
    if masked_m.device != a3.device:
        raise ValueError(f"masked_m is on {masked_m.device}, a3 on {a3.device}")
    if a3.dim() == 3:
        if a3.shape[0] != g:
            raise ValueError(f"a3 has {a3.shape[0]} groups, the weight {g}")
        max_m = a3.shape[1]
        if a3.stride(0) != max_m * a3.stride(1):
            raise ValueError("a3 [G, max_m, K] must have its groups back to back (a flat row stride)")
        a_flat = a3.view(g * max_m, w.k) if a3.is_contiguous() else a3.reshape(g * max_m, w.k)
    elif a3.dim() == 2:
        if a3.shape[0] % g:
            raise ValueError(f"flat a3 has {a3.shape[0]} rows, not a multiple of G={g}")
        max_m = a3.shape[0] // g
        a_flat = a3
    else:
        raise ValueError(f"a3 must be [G, max_m, K] or [G*max_m, K], got {tuple(a3.shape)}")
    if not isinstance(expected_m, int) or expected_m < 1:
        raise ValueError(f"expected_m must be a positive int, got {expected_m!r}")
    if config is None:
        config = w4a16_grouped_config("masked", g * max_m, w.n, w.k, g, expected_m, gluon=gluon_capable(a_flat, w))
    if config.split_k != 1:
        raise ValueError("split-K is implemented for the indexed W4A16 kernel only")
    out = _check_out(out, g * max_m, w.n, a3.device)
    if max_m == 0:
        return out
    if config.engine in GLUON_ENGINES:
        _launch_gluon("masked", a_flat, w, masked_m, out, config, max_m, expected_m)
        return out
    config = _triton_config(config, w.n)
    w4a16_masked_launch(a_flat, w, masked_m, out, max_m, block_m=config.block_m, block_n=config.block_n,
                        swap_ab=config.swap_ab, num_warps=config.num_warps, num_stages=config.num_stages)
    return out


w4a16_grouped_contiguous = contiguous
w4a16_grouped_masked = masked
