"""Output-centric MoE decode ("warp decode"): two kernels organized around outputs.

Semantics (reference: `lowbit.reference.moe_experts_ref(..., round_intermediate=True)`)::

    gate_up:  for each token t, slot j with e = topk_ids[t, j] a local expert (0 <= e < E):
                  g = hidden[t] . W13[e, i, :]          (FP32 accumulation, i < I)
                  u = hidden[t] . W13[e, I + i, :]
                  act[t, j, i] = bf16(SiLU(g) * u)
              act[t, j, :] = 0 for a dropped slot (id -1, or any id outside [0, E))
    down:     out[t, h] = bf16( sum_j topk_weights[t, j] * (act[t, j, :] . W2[e_j, h, :]) )
              over the slots j with a local expert; one FP32 accumulator per output.

``hidden bf16 [M, H]``, ``topk_ids int32 [M, k]``, ``topk_weights fp32 [M, k]`` (used as
given: not renormalized), ``W13 [E, 2I, H]`` (gate rows, then up rows), ``W2 [E, H, I]``;
``act bf16 [M, k, I]``; ``out bf16 [M, H]``. No padding, no scatter, no per-expert buffer, no
separate combine: the routing weight is folded into the down projection's accumulator.
Everything is read on the device (no host readback), so `moe_decode` can be captured in a
CUDA graph and replayed with new ``topk_ids`` / ``topk_weights``.

A token whose top-k lists an expert twice (a top-k router cannot, a hand-built routing can):
**each slot counts**, as in the reference: both slots get the same ``act`` row and the output
gets ``(w_j1 + w_j2) * expert_e(hidden[t])``.

Weight formats (activations stay BF16 throughout, weights are upcast in registers; the checks:
`lowbit.formats.check_expert_weight_pair`):

- INT4 group-32: a `lowbit.formats.w4a16.W4A16Weight` packed with ``profile="indexed"`` -- the
  very object the indexed W4A16 GEMM takes, so one loaded checkpoint serves both paths. Each
  256-wide K tile is dequantized with `lowbit.kernels.w4a16.int4.dequant_pair`, so the effective
  weight is ``bf16((q - 8) * s)``, the same as the indexed path's.
- MXFP8: a `lowbit.formats.Mxfp8ExpertWeight` (E4M3 codes + E8M0 byte per 32, see
  `lowbit.formats.pack_mxfp8_experts`). ``code * 2**(byte - 127)`` is exact in FP32 (and in
  BF16, for any scale in 2^-117..2^119). Two layouts of the same codes: ``"natural"`` (K order;
  the fma / dot engines) and ``"k256-interleaved"`` (the mma engine's, scales up to 2^7).

Three engines map outputs to programs (`DecodeConfig.engine`, picked by
`heuristics.moe_decode_config`; all give the same function up to FP32 summation order):

- ``"fma"`` (`portable`) -- one output unit per program, CUDA-core math. gate_up: a program
  owns one route (token, slot) x ``block_i`` neurons: ``block_i`` gate rows and ``block_i`` up
  rows stream through it in 256-wide K steps with 16-byte loads (INT4: 128 bytes a row a step,
  dequantized a group pair at a time; MXFP8: 256 bytes a row a step, each group's sum of exact
  code x activation products scaled by its power-of-two scale); each thread keeps FP32 partial
  sums of its lanes for both projections, one ``tl.sum`` per row at the end. down: a program
  owns one token x ``block_h`` output dims and loops over the token's k slots, multiplying each
  activation chunk by the routing weight, into one FP32 accumulator tile.
- ``"dot"`` (`portable`) -- the same outputs, but when several tokens hit one expert its weight
  rows are read once for all of them and the FMAs run on tensor cores (``numerics.dot``, FP32
  accumulation). gate_up: the program of route r is the *owner* of its (expert, neuron block)
  when no earlier route has the same expert; it gathers the routes that share the expert
  (compacted on the device from ``topk_ids``, ``tokens`` at a time) and computes their
  ``[block_i, tokens]`` outputs in one weight pass; the other programs of that expert return at
  once. down: a program owns ``tokens`` consecutive tokens x ``block_h`` output dims and visits
  each distinct expert of those tokens once (in first-occurrence order), folding
  ``sum_j w[t, j] [topk_ids[t, j] == e]`` into the accumulator of token t (INT4 runs the W4A16
  main loop `lowbit.kernels.w4a16.portable.w4a16_tile` there, tokens on the MMA's N side).
- ``"mma"`` (`hopper`, Gluon, sm_90) -- INT4 and k256-interleaved MXFP8: the dot engine's
  outputs and owner rule, rebuilt to stream weights through a cp.async ring, each warp
  dequantizing its 16 weight rows straight into mma.sync A fragments; at small batches the warps
  of a program split the work (gate_up: K; down: the expert visits) instead of the rows. The
  default for INT4 on sm_90 and the only engine of the interleaved MXFP8 layout.

Measured speed against the other paths: docs/performance.md.
"""

from __future__ import annotations

import torch
import triton

from ...formats.experts import check_expert_weight, check_expert_weight_pair
from ...formats.moe_mxfp8 import Mxfp8ExpertWeight
from ...formats.w4a16 import W4A16Weight
from ...routing.layouts import check_topk_routing
from ...runtime.device import is_sm90_native, require_sm90
from ..compile_tier import KernelConfig
from .heuristics import (
    ENV_OVERRIDES,
    DecodeConfig,
    explain_moe_decode_config,
    moe_decode_config,
    production_configs,
    validate_config,
)
from .portable import down_kernel, gate_up_kernel
from .tiles import FMT_INT4, FMT_MXFP8, MMA_FORMATS, ROUTE_CHUNK

__all__ = [
    "DecodeConfig",
    "moe_decode_config",
    "explain_moe_decode_config",
    "moe_decode",
    "moe_decode_gate_up",
    "moe_decode_down",
    "ENV_OVERRIDES",
    "compile_configs",
]


# =========================================================================== validate, launch
def _weight_args(w, who: str, n: int, k: int):
    """(format code, codes, scales, stride_we, stride_wn, stride_se, stride_sn, stride_sg) of a
    prepared expert weight expected to be ``[E, n, k]``."""
    check_expert_weight(w, who)
    if isinstance(w, W4A16Weight):
        w.check("indexed")
        fmt, codes, scales = FMT_INT4, w.qweight, w.scales
        # scales [E, Kp/32, N]: rows are contiguous, groups N apart
        s_strides = (scales.stride(0), scales.stride(2), scales.stride(1))
    else:
        # (the k256-interleaved layout passes through: `_pick_config` keeps it on the mma engine)
        fmt, codes, scales = FMT_MXFP8, w.codes, w.scales_e8m0
        s_strides = (scales.stride(0), scales.stride(1), scales.stride(2))
    shape = (w.num_experts, w.n, w.k)
    if shape[1:] != (n, k):
        raise ValueError(f"{who}: expected [E, {n}, {k}] expert weights, got {list(shape)}")
    if codes.stride(-1) != 1:
        raise ValueError(f"{who}: weight codes must be contiguous along K")
    return fmt, codes, scales, codes.stride(0), codes.stride(1), *s_strides


def _weight_format(w) -> str:
    """``"int4"``, ``"mxfp8"`` or ``"mxfp8_k256"`` (the interleaved layout): the heuristics'
    name of a prepared weight's format."""
    if isinstance(w, Mxfp8ExpertWeight):
        return "mxfp8" if w.layout == "natural" else "mxfp8_k256"
    return "int4"


def _pick_config(config, m, top_k, e, h, inter, fmt: str, device) -> DecodeConfig:
    if config is None:
        config = moe_decode_config(m, top_k, e, h, inter, fmt, is_sm90_native(device))
    elif not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
    validate_config(config)
    if config.engine == "mma":
        if fmt not in MMA_FORMATS:
            raise ValueError(f"decode engine 'mma' takes INT4 (W4A16Weight) or k256-interleaved MXFP8 weights, got "
                             f"{fmt} (pack_mxfp8_experts(..., layout='k256-interleaved'))")
        require_sm90(device, "moe_decode engine 'mma'")
    elif fmt == "mxfp8_k256":
        raise ValueError(f"decode engine {config.engine!r}: the k256-interleaved MXFP8 layout runs on the mma engine "
                         "only")
    return config


def moe_decode_gate_up(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: W4A16Weight | Mxfp8ExpertWeight,
    *,
    out: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """The gate_up stage: ``act[t, j, i] = bf16(SiLU(hidden[t] . W13[e, i]) * (hidden[t] . W13[e, I+i]))``
    for ``e = topk_ids[t, j]``; 0 for dropped slots (module docstring).

    hidden: ``bf16 [M, H]`` (contiguous along H); topk_ids: ``int32 [M, k]``; w13: ``[E, 2I, H]``
    as a `W4A16Weight` (profile ``"indexed"``) or an `Mxfp8ExpertWeight`; out: optional
    ``bf16 [M, k, I]`` contiguous. Returns ``act bf16 [M, k, I]``.
    """
    if not isinstance(hidden, torch.Tensor) or hidden.dtype != torch.bfloat16 or hidden.dim() != 2:
        raise TypeError(f"hidden must be bf16 [M, H], got {getattr(hidden, 'dtype', type(hidden).__name__)} "
                        f"{tuple(getattr(hidden, 'shape', ()))}")
    if hidden.stride(1) != 1:
        raise ValueError("hidden must be contiguous along H")
    m, h = hidden.shape
    top_k = check_topk_routing(topk_ids, None, m, hidden.device)
    if isinstance(w13, (W4A16Weight, Mxfp8ExpertWeight)) and w13.n % 2:
        raise ValueError(f"w13 has N={w13.n} rows: must be 2*I (gate rows, then up rows)")
    inter = getattr(w13, "n", 0) // 2
    fmt, codes, scales, swe, swn, sse, ssn, ssg = _weight_args(w13, "w13", 2 * inter, h)
    w_fmt = _weight_format(w13)
    if codes.device != hidden.device:
        raise ValueError(f"w13 is on {codes.device}, hidden on {hidden.device}")
    e = w13.num_experts
    config = _pick_config(config, m, top_k, e, h, inter, w_fmt, hidden.device)
    if out is None:
        out = torch.empty(m, top_k, inter, dtype=torch.bfloat16, device=hidden.device)
    elif (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16
          or tuple(out.shape) != (m, top_k, inter) or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous bf16 [M, k, I] = [{m}, {top_k}, {inter}] tensor, got "
                         f"{getattr(out, 'dtype', None)} {tuple(getattr(out, 'shape', ()))}")
    if m == 0 or inter == 0:
        return out
    if config.engine == "mma":
        from .hopper import gate_up_mma_launch  # Gluon is imported only when its engine runs

        gate_up_mma_launch(hidden, topk_ids, w13, out, min(config.tokens, 16), config.split_gate_up, config.num_stages)
        return out
    grid = (triton.cdiv(inter, config.block_i), m * top_k)
    gate_up_kernel[grid](
        hidden, topk_ids, codes, scales, out,
        m * top_k, top_k, e, h, inter,
        hidden.stride(0), swe, swn, sse, ssn, ssg, inter,
        FMT=fmt, DOT=config.engine == "dot", BLOCK_I=config.block_i, TOKENS=config.tokens,
        ROUTE_CHUNK=ROUTE_CHUNK, LOOP_STAGES=config.num_stages, num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out


def moe_decode_down(
    act: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w2: W4A16Weight | Mxfp8ExpertWeight,
    *,
    out: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """The down stage with the weighted combine folded in:
    ``out[t] = bf16(sum_j topk_weights[t, j] * act[t, j] @ W2[topk_ids[t, j]]^T)`` over the
    slots with a local expert (module docstring).

    act: ``bf16 [M, k, I]`` contiguous (`moe_decode_gate_up`'s output); topk_ids ``int32 [M, k]``;
    topk_weights ``float32 [M, k]`` (used as given); w2: ``[E, H, I]`` as a `W4A16Weight`
    (profile ``"indexed"``) or an `Mxfp8ExpertWeight`; out: optional ``bf16 [M, H]``
    contiguous along H. Returns ``out``.
    """
    if not isinstance(act, torch.Tensor) or act.dtype != torch.bfloat16 or act.dim() != 3:
        raise TypeError(f"act must be bf16 [M, k, I], got {getattr(act, 'dtype', type(act).__name__)} "
                        f"{tuple(getattr(act, 'shape', ()))}")
    if not act.is_contiguous():
        raise ValueError("act must be contiguous")
    m, k_act, inter = act.shape
    top_k = check_topk_routing(topk_ids, topk_weights, m, act.device)
    if k_act != top_k:
        raise ValueError(f"act has {k_act} slots per token, topk_ids has k={top_k}")
    h = getattr(w2, "n", 0)
    fmt, codes, scales, swe, swn, sse, ssn, ssg = _weight_args(w2, "w2", h, inter)
    w_fmt = _weight_format(w2)
    if codes.device != act.device:
        raise ValueError(f"w2 is on {codes.device}, act on {act.device}")
    e = w2.num_experts
    config = _pick_config(config, m, top_k, e, h, inter, w_fmt, act.device)
    if out is None:
        out = torch.empty(m, h, dtype=torch.bfloat16, device=act.device)
    elif (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16
          or tuple(out.shape) != (m, h) or out.stride(1) != 1):
        raise ValueError(f"out must be bf16 [M, H] = [{m}, {h}] contiguous along H, got "
                         f"{getattr(out, 'dtype', None)} {tuple(getattr(out, 'shape', ()))}")
    if m == 0 or h == 0:
        return out
    if config.engine == "mma":
        from .hopper import down_mma_launch  # Gluon is imported only when its engine runs

        down_mma_launch(act, topk_ids, topk_weights, w2, out, config.tokens, config.split_down, config.num_stages)
        return out
    dot = config.engine == "dot"
    grid = (triton.cdiv(h, config.block_h), triton.cdiv(m, config.tokens) if dot else m)
    down_kernel[grid](
        act, topk_ids, topk_weights, codes, scales, out,
        m, top_k, e, h, inter,
        inter, swe, swn, sse, ssn, ssg, out.stride(0),
        FMT=fmt, DOT=dot, BLOCK_H=config.block_h, TOKENS=config.tokens,
        TOPK_P2=triton.next_power_of_2(top_k), LOOP_STAGES=config.num_stages, num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out


def moe_decode(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: W4A16Weight | Mxfp8ExpertWeight,
    w2: W4A16Weight | Mxfp8ExpertWeight,
    *,
    out: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """The expert part of a MoE block for decode batches, output-centric (module docstring).

    hidden ``bf16 [M, H]``; topk_ids ``int32 [M, k]`` (``-1`` = dropped slot); topk_weights
    ``float32 [M, k]`` (applied as given); w13 ``[E, 2I, H]`` and w2 ``[E, H, I]``, each a
    `W4A16Weight` (profile ``"indexed"``) or an `Mxfp8ExpertWeight`; out optional
    ``bf16 [M, H]``. Returns ``bf16 [M, H]``. Two launches, no host readback: capturable in a
    CUDA graph.
    """
    check_expert_weight_pair(w13, w2)
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
        raise TypeError(f"hidden must be bf16 [M, H], got {type(hidden).__name__} {tuple(getattr(hidden, 'shape', ()))}")
    m = hidden.shape[0]
    top_k = check_topk_routing(topk_ids, topk_weights, m, hidden.device)
    if config is None:
        config = moe_decode_config(m, top_k, w13.num_experts, w13.k, w13.n // 2, _weight_format(w13),
                                   is_sm90_native(hidden.device))
    act = moe_decode_gate_up(hidden, topk_ids, w13, config=config)
    return moe_decode_down(act, topk_ids, topk_weights, w2, out=out, config=config)


# =========================================================================== compile tier
_GATE_UP_SIG = {
    "x_ptr": "*bf16", "ids_ptr": "*i32", "w_ptr": None, "s_ptr": None, "act_ptr": "*bf16",
    "num_routes": "i32", "top_k": "i32", "num_experts": "i32", "H": "i32", "I": "i32",
    "stride_xm": "i32", "stride_we": "i64", "stride_wn": "i32", "stride_se": "i32", "stride_sn": "i32",
    "stride_sg": "i32", "stride_am": "i32",
    "FMT": "constexpr", "DOT": "constexpr", "BLOCK_I": "constexpr", "TOKENS": "constexpr", "ROUTE_CHUNK": "constexpr",
    "LOOP_STAGES": "constexpr",
}
_DOWN_SIG = {
    "act_ptr": "*bf16", "ids_ptr": "*i32", "tw_ptr": "*fp32", "w_ptr": None, "s_ptr": None, "out_ptr": "*bf16",
    "M": "i32", "top_k": "i32", "num_experts": "i32", "H": "i32", "I": "i32",
    "stride_am": "i32", "stride_we": "i64", "stride_wn": "i32", "stride_se": "i32", "stride_sn": "i32",
    "stride_sg": "i32", "stride_om": "i32",
    "FMT": "constexpr", "DOT": "constexpr", "BLOCK_H": "constexpr", "TOKENS": "constexpr", "TOPK_P2": "constexpr",
    "LOOP_STAGES": "constexpr",
}
_FMT_PTRS = {FMT_INT4: ("*i32", "*bf16"), FMT_MXFP8: ("*fp8e4nv", "*u8")}


def compile_configs() -> list[KernelConfig]:
    """Every Triton kernel configuration the heuristics can pick for the production shapes, in
    both weight formats, for the compile tier (the mma engine's: `hopper.compile_configs`)."""
    out, done = [], set()
    for fname, cfg in production_configs():
        if cfg.engine == "mma":
            continue
        dot = cfg.engine == "dot"
        fmt = FMT_INT4 if fname == "int4" else FMT_MXFP8
        w_t, s_t = _FMT_PTRS[fmt]
        # (stage, kernel, signature, tile tag, tile constexpr, tile, extra constexprs, unaligned ints)
        stages = (
            ("gate_up", gate_up_kernel, _GATE_UP_SIG, "BI", "BLOCK_I", cfg.block_i, {"ROUTE_CHUNK": ROUTE_CHUNK},
             ("num_routes", "top_k", "stride_sn")),
            ("down", down_kernel, _DOWN_SIG, "BH", "BLOCK_H", cfg.block_h, {"TOPK_P2": 8}, ("M", "top_k", "stride_sn")),
        )
        for stage, fn, sig, tag, tile_name, tile, extra, unaligned in stages:
            key = (stage, fmt, cfg.engine, tile, cfg.tokens, cfg.num_warps, cfg.num_stages)
            if key in done:
                continue
            done.add(key)
            # the MMA instruction: wgmma when the weight (M) side is >= 64 rows, mma.sync below
            sass = (("HGMMA",) if tile >= 64 else ("HMMA",)) if dot else ()
            out.append(KernelConfig(
                f"moe_decode_{stage}[{fname},{cfg.engine},{tag}={tile},T={cfg.tokens},w={cfg.num_warps},s={cfg.num_stages}]",
                fn, {**sig, "w_ptr": w_t, "s_ptr": s_t},
                {"FMT": fmt, "DOT": dot, tile_name: tile, "TOKENS": cfg.tokens, "LOOP_STAGES": cfg.num_stages, **extra},
                num_warps=cfg.num_warps, num_stages=cfg.num_stages, expect_sass=sass, unaligned=unaligned))
    return out
