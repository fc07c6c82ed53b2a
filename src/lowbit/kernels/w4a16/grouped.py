"""W4A16 grouped MoE GEMMs (DeepGEMM-style layouts): contiguous (prefill) and masked (decode).

    contiguous(a2, w, m_indices)            -> out [m, N]
        out[r] = bf16(a2[r] @ dequant(W[m_indices[r]])^T)    for rows with m_indices[r] >= 0
    masked(a3, w, masked_m, expected_m)     -> out [G * max_m, N]
        out[g*max_m + i] = bf16(a3[g, i] @ dequant(W[g])^T)  for i < masked_m[g]

References: `lowbit.reference.w4a16_contiguous_ref` / `w4a16_masked_ref`. Both share the main
loop of the indexed family (`w4a16_core.w4a16_tile`). Contiguous: each expert's segment is
padded to 128 rows and every M tile divides 128, so a tile belongs to one expert; a tile whose
first row is padding (``-1``) is all padding and returns at once, and padding rows are never
stored. Masked: programs past ``masked_m[g]`` return at once (no host readback: capturable in a
CUDA graph); ``expected_m`` only picks the M tile (and the engine).

Engines: these Triton kernels run everywhere (the interpreter too). On an sm_90 GPU with
TMA-able activations the heuristics pick the register-A Gluon kernel of `w4a16_sm90` where it
measured faster (contiguous; masked from ``expected_m`` 32): `_config_cached` holds the numbers.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import torch
import triton
import triton.language as tl

from ...formats.w4a16 import W4A16Weight
from ...routing.layouts import CONTIGUOUS_ALIGNMENT
from ...runtime import numerics
from ...runtime.device import is_sm90_native, require_sm90, tma_problem
from .portable import (
    GLUON_ENGINES,
    REGISTER_A_ENGINES,
    VALIDATED_TILES,
    W4A16Config,
    apply_env_overrides,
    avoid_miscompile,
    compile_configs_for,
    env_key,
    env_value,
    override_names,
    pick_gluon_tile,
    tile_config,
    w4a16_tile,
)

__all__ = ["ENV_OVERRIDES", "contiguous", "explain_w4a16_grouped_config", "masked", "w4a16_grouped_config"]

ENV_OVERRIDES = override_names("W4A16_GROUPED")


@triton.jit
def _w4a16_contiguous_kernel(
    a_ptr, qw_ptr, s_ptr, c_ptr, m_indices_ptr,
    M, N, K, stride_am, stride_qe, stride_qn, stride_se, stride_sk, stride_cm,
    BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(m_indices_ptr + pid_m * BM).to(tl.int64)
    if e < 0:  # segments start 128-aligned and BM divides 128: the whole tile is padding
        return
    rm = pid_m * BM + tl.arange(0, BM)
    row_ok = tl.load(m_indices_ptr + rm, mask=rm < M, other=-1) >= 0
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    acc = w4a16_tile(a_ptr, rm.to(tl.int64), row_ok, stride_am, qw_ptr, s_ptr, e, rn, n_ok,
                     stride_qe, stride_qn, stride_se, stride_sk, K, 0, tl.cdiv(K, 256), BM, BN, SWAP_AB)
    c = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :]
    tl.store(c, numerics.to_bf16(acc), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _w4a16_masked_kernel(
    a_ptr, qw_ptr, s_ptr, c_ptr, masked_m_ptr,
    max_m, N, K, stride_am, stride_qe, stride_qn, stride_se, stride_sk, stride_cm,
    BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr,
):
    g = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_n = tl.program_id(2)
    valid_m = tl.minimum(tl.load(masked_m_ptr + g), max_m)
    if pid_m * BM >= valid_m:
        return
    r = pid_m * BM + tl.arange(0, BM)
    row_ok = r < valid_m
    rows = g.to(tl.int64) * max_m + r
    rn = pid_n * BN + tl.arange(0, BN)
    n_ok = rn < N
    acc = w4a16_tile(a_ptr, rows, row_ok, stride_am, qw_ptr, s_ptr, g.to(tl.int64), rn, n_ok,
                     stride_qe, stride_qn, stride_se, stride_sk, K, 0, tl.cdiv(K, 256), BM, BN, SWAP_AB)
    c = c_ptr + rows[:, None] * stride_cm + rn[None, :]
    tl.store(c, numerics.to_bf16(acc), mask=row_ok[:, None] & n_ok[None, :])


# --------------------------------------------------------------------------- heuristics

def _tile_for_rows(rows: float) -> int:
    """Smallest validated M tile holding `rows` rows, capped at the largest."""
    fits = [bm for bm in sorted(VALIDATED_TILES) if bm >= rows]
    return fits[0] if fits else max(VALIDATED_TILES)


#: On a Hopper GPU with TMA-able operands the register-A Gluon kernel (`w4a16_sm90`, engine
#: "gluon_rs") is the default where it measured faster (H200, 2026-11-29, Kimi EP8 gate_up +
#: down, CUDA graph, L2 flushed; `GLUON_RS_TILES` has the tiles' numbers): contiguous at 128 and
#: 256 rows/expert 2.00x / 2.09x the Triton kernel; masked at 32 tok/expert 1.36x (860 vs 1173
#: us, 128x64). Masked decode (fourth session) with the small tiles, the M tile the Triton rule
#: picks: 8 tok/expert 64x16 600.0 vs Triton 621.3 us, 16 tok/expert 64x32 666.2 vs 701.0.
#: Every masked expected_m runs it; the tile comes from the heuristic's M tile (`_fit_engine`).
#: Contiguous and masked tiles of >= 64 rows ran it warp-specialized (engine "gluon_ws", a
#: producer warp issuing the TMA loads; only two-warpgroup tiles), bit-identical. Sixth session,
#: H200, CUDA graph, us, register-A vs warp-specialized (`scripts/sweeps/w4a16_masked_ws.json`):
#: EP8 masked 32 tok/expert 814.6 vs 744.5, 64 tok 1148.1 vs 1053.2; EP16 / EP32 masked 32
#: 419.5 / 222.5 vs 379.6 / 199.9; but 8 tok 528.9 vs 789.5 (the 4-warp 64x16 tile, 4 CTAs an
#: SM, against 128x16 with one) and 16 tok 629.3 vs 658.7: below 64 rows the plain kernel stays.
#: Eighth session: those row counts run the four-warpgroup register-A tiles instead (256 weight
#: rows a CTA: half the activation bytes a FLOP; `w4a16_sm90._rs_groups_mainloop`), H200,
#: `scripts/probes/wide_tile.py`, same process, bit-identical, us, 128-row warp-specialized vs
#: 256-row: contiguous 128 rows/expert gate_up 631.6 vs 635.7, down 372.4 vs 352.3; 256 rows
#: 1385.1 vs 1239.0 and 746.8 vs 669.1; 512 rows 2732.8 vs 2526.5 and 1470.8 vs 1375.1; masked
#: 32 tok/expert (x64 tiles) 485.6 vs 470.8 and 292.4 vs 245.6; 64 tok 705.5 vs 622.4 and
#: 386.5 vs 335.7. Twenty-first session: a masked expert whose expected rows (x1.3) fit one
#: 64-row tile runs the one-warpgroup 128x64 group loop instead (`w4a16_sm90.GROUP_LOOP_MAXNREG`:
#: masked 32 tok/expert EP8 / 16 / 32 1.04-1.18x the warp-specialized 256x64).
_WIDE_MIN_ROWS = 64
#: The masked heuristics' spread of real counts around expected_m (DeepGEMM's rule): the M tile
#: and the Gluon grid's programs an expert (`w4a16_sm90.masked_row_slots`) hold 1.3x expected_m.
MASKED_SPREAD = 1.3


@lru_cache(maxsize=4096)
def _config_cached(mode: str, m: int, n: int, k: int, g: int, expected_m: int, gluon: bool,
                   env: tuple) -> W4A16Config:
    if mode == "contiguous":
        # rows per expert >= 128 (segments are 128-aligned): the largest validated tile re-reads
        # each expert's weights the fewest times; grids here are thousands of programs
        bm = max(VALIDATED_TILES)
        why = f"contiguous: {m} rows over {g} experts; largest validated M tile"
    else:
        # DeepGEMM's masked rule, measured for the indexed family: one M tile should hold the
        # expected rows plus the 1.3x spread of real counts, so deep-K gate_up is read once
        bm = _tile_for_rows(MASKED_SPREAD * expected_m)
        why = f"masked: expected_m={expected_m} (x1.3 spread) -> one {bm}-row tile per expert"
    cfg = tile_config(bm, why)
    split, wide = 0, False
    if gluon and mode == "masked" and bm == 64 and MASKED_SPREAD * expected_m <= 64:
        cfg = replace(cfg, engine="gluon_rs", reason=f"{why}; sm_90: register-A Gluon kernel, 128 weight rows on one "
                      "warpgroup (H200 masked 32 tok/expert EP8 / 16 / 32: 1.04-1.18x the warp-specialized 256x64)")
    elif gluon and (mode == "contiguous" or bm >= _WIDE_MIN_ROWS):
        from .hopper import GLUON_WS_TILES, split_tile_rows, wide_tile_pays

        # masked past 64 expected rows: one split tile an expert (80 / 96 rows) instead of two 64-row ones
        split = split_tile_rows(MASKED_SPREAD * expected_m) if mode == "masked" else 0
        # the Gluon contiguous tile takes whole 128-row segments; masked: the live blocks of each expert
        row_blocks = m // CONTIGUOUS_ALIGNMENT if mode == "contiguous" else g * max(1, -(-expected_m // (split or bm)))
        wide = wide_tile_pays(row_blocks, n)
        # a masked four-warpgroup tile runs warp-specialized where that engine has it (`GLUON_WS_TILES`)
        wide_ws = mode == "masked" and not split and (256, bm) in {t[:2] for t in GLUON_WS_TILES}
        if wide and wide_ws and not env[0]:
            cfg = replace(cfg, engine="gluon_ws", reason=f"{why}; sm_90: warp-specialized register-A Gluon kernel, "
                          "256 weight rows a CTA (H200 EP8 masked 32 tok/expert: 1.03-1.09x the register-A one)")
        elif wide:
            cfg = replace(cfg, engine="gluon_rs", reason=f"{why}; sm_90: register-A Gluon kernel, 256 weight rows a "
                          "CTA (H200 EP8: 1.03-1.19x the warp-specialized 128-row tile, which is 1.09-1.20x the "
                          "register-A one)")
        else:
            cfg = replace(cfg, engine="gluon_ws", reason=f"{why}; sm_90: warp-specialized register-A Gluon kernel, "
                          "128 weight rows (under two waves of 256-row programs; H200: 1.09-1.20x the register-A "
                          "kernel)")
    elif gluon:
        cfg = replace(cfg, engine="gluon_rs", reason=f"{why}; sm_90: register-A Gluon kernel (H200: 1.04-1.36x "
                      "the Triton kernel at 8-32 tok/expert)")
    # the block_m override (first field of the env key) pins the Gluon tile's rows too; an
    # engine override replaces the default engine (the Triton tile is the base config)
    # masked decode grids: about one program an expert and N tile of 64 weight rows (`group_loop_tile`)
    programs = g * triton.cdiv(n, 64) if mode == "masked" else float("inf")
    cfg = _fit_engine(apply_env_overrides(cfg, "W4A16_GROUPED"), mode, env, wide, programs, k)
    if split and cfg.engine == "gluon_rs" and cfg.block_n == 256 and not env[0]:
        # the split tile only where the four-warpgroup kernel runs and no BLOCK_M was asked for;
        # its warp-specialized form where one holds the rows, unless an engine was asked for
        from .hopper import GLUON_SPLIT_WS_TILES

        ws_rows = min((t[1] for t in GLUON_SPLIT_WS_TILES if t[1] >= split), default=0)
        engine = "gluon_ws" if ws_rows and not env_value(env, "engine") else "gluon_rs"
        rows = ws_rows if engine == "gluon_ws" else split
        bw, br, warps, stages = pick_gluon_tile(_engine_tiles(engine, mode), rows, cfg, env)
        measured = "; warp-specialized (64 / 50 tok/expert: 1.05-1.08x the 96 / 80 register-A tiles)" \
            if engine == "gluon_ws" else ""
        cfg = replace(cfg, engine=engine, block_m=br, block_n=bw, num_warps=warps, num_stages=stages,
                      reason=f"{cfg.reason}; {br}-row split tile, one tile an expert instead of two 64-row ones "
                      f"(H200 EP8 64 tok/expert: 1.15-1.20x{measured}): {bw}x{br}, {stages} stages")
    if cfg.engine in GLUON_ENGINES:
        from .hopper import half_acts_note, tail_rows

        tile = (cfg.block_n, cfg.block_m, cfg.num_warps, cfg.num_stages)
        tail = tail_rows(tile, cfg.engine, mode)
        if tail:
            measured = "masked 32 tok/expert, with the three-quarter tail: 1.03-1.09x" if cfg.engine == "gluon_ws" \
                else "masked 16-64 tok/expert: 1.04-1.18x"
            cfg = replace(cfg, reason=f"{cfg.reason}; a block whose rows end within its first {tail} runs the "
                          f"{tail}-row tile (H200 {measured})")
        cfg = replace(cfg, reason=cfg.reason + half_acts_note(tile, cfg.engine, mode))
    return avoid_miscompile(cfg, n)


def _engine_tiles(engine: str, mode: str) -> tuple:
    """The (weight rows, rows, warps, stages) tiles a Gluon engine's kernel is built for; masked
    register-A and warp-specialized add their split tiles (rows not a power of two, which 128-row
    contiguous segments do not divide)."""
    from .hopper import GLUON_RS_TILES, GLUON_SPLIT_TILES, GLUON_SPLIT_WS_TILES, GLUON_TILES, GLUON_WS_TILES

    split = {"gluon_rs": GLUON_SPLIT_TILES, "gluon_ws": GLUON_SPLIT_WS_TILES}.get(engine, ()) if mode == "masked" else ()
    return {"gluon": GLUON_TILES, "gluon_rs": GLUON_RS_TILES, "gluon_ws": GLUON_WS_TILES}[engine] + split


def _fit_engine(cfg: W4A16Config, mode: str, env: tuple, wide: bool = False,
                programs: float = float("inf"), k: int = 0) -> W4A16Config:
    """``LOWBIT_W4A16_GROUPED_ENGINE=gluon`` / ``gluon_rs`` as a global switch: that kernel's
    tile with 128 rows for contiguous (a whole segment: each weight tile read once per segment),
    for masked the smallest tile rows holding the M tile the heuristic chose, or the rows that
    ``LOWBIT_W4A16_GROUPED_BLOCK_M`` asks for; ``_BLOCK_N`` (weight rows) and ``_NUM_STAGES``
    pick among that kernel's tiles when set. `wide`: the heuristics chose the four-warpgroup tile
    (256 weight rows), which then comes first. `programs`: the grid's size, about, for a
    group-loop tile (`w4a16_sm90.group_loop_tile`, unless a stage count is forced), and for
    masked its 128-row form where the grid allows (`w4a16_sm90.WIDE_DECODE_TILES`, unless weight
    rows are forced too); `k`: a short masked K runs `w4a16_sm90.SHORT_K_TILES`' form. The reason
    says what was chosen."""
    if cfg.engine == "triton":
        return cfg
    if cfg.engine not in GLUON_ENGINES:
        raise ValueError(f"LOWBIT_W4A16_GROUPED_ENGINE must be 'triton' or one of {GLUON_ENGINES}, got {cfg.engine!r}")
    tiles = _engine_tiles(cfg.engine, mode)
    if env[0] or mode == "masked":  # env[0]: the BLOCK_M override
        # the smallest tile row count holding the M tile (register-A: 16 to 128 rows)
        rows = min((t[1] for t in tiles if t[1] >= cfg.block_m), default=max(t[1] for t in tiles))
    else:
        rows = CONTIGUOUS_ALIGNMENT
    tile, note = pick_gluon_tile(tiles, rows, cfg, env, wide), ""
    if cfg.engine == "gluon_rs" and not env_value(env, "num_stages"):
        from .hopper import SHORT_K_STEPS, SHORT_K_TILES, group_loop_tile

        short = mode == "masked" and tile in SHORT_K_TILES and 0 < k <= 256 * SHORT_K_STEPS
        if short:
            tile = SHORT_K_TILES[tile]
        family = "masked" if mode == "masked" and not env_value(env, "block_n") else ""
        tile, note = group_loop_tile(tile, programs, k, family=family)
        if short:
            note += f" (K of at most {SHORT_K_STEPS} steps; H200 masked 16 tok/expert down 1.17-1.19x)"
    bw, br, warps, stages = tile
    return replace(cfg, block_m=br, block_n=bw, num_warps=warps, num_stages=stages, swap_ab=True, split_k=1,
                   reason=f"{cfg.reason}; {cfg.engine} tile {bw} weight rows x {br} rows, {stages} stages{note}")


def w4a16_grouped_config(mode: str, m: int, n: int, k: int, g: int, expected_m: int = 0,
                         gluon: bool = False) -> W4A16Config:
    """Launch configuration of the grouped kernels, memoized per (mode, M, N, K, G, expected_m)
    and the ``LOWBIT_W4A16_GROUPED_*`` overrides (BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES,
    SWAP_AB, ENGINE). Contiguous tiles must divide 128. gluon: the Hopper Gluon kernels can run
    the operands (`gluon_capable`); where they measured faster they are then the default."""
    if mode not in ("contiguous", "masked"):
        raise ValueError(f"mode must be 'contiguous' or 'masked', got {mode!r}")
    return _config_cached(mode, m, n, k, g, expected_m, gluon, env_key("W4A16_GROUPED"))


def gluon_capable(a: torch.Tensor, w: W4A16Weight) -> bool:
    """Whether the Gluon kernels can run these operands: an sm_90 GPU, TMA-able activation rows,
    N a multiple of 8 (the scales' TMA rows)."""
    return is_sm90_native(a.device) and tma_problem(a, "a") is None and w.n % 8 == 0


def explain_w4a16_grouped_config(mode: str, m: int, n: int, k: int, g: int, expected_m: int = 0,
                                 gluon: bool = False) -> str:
    c = w4a16_grouped_config(mode, m, n, k, g, expected_m, gluon)
    return (f"w4a16_grouped {mode} M={m} N={n} K={k} G={g}" + (f" expected_m={expected_m}" if mode == "masked" else "")
            + f": block_m={c.block_m} block_n={c.block_n} warps={c.num_warps} stages={c.num_stages} "
              f"swap_ab={c.swap_ab} engine={c.engine} -- {c.reason}")


# --------------------------------------------------------------------------- launchers
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
    """Grouped-contiguous W4A16 GEMM.

    a2: ``bf16 [m, K]``, rows concatenated per expert, each segment padded to 128 rows
    (`lowbit.routing.build_contiguous` + `gather_rows` build it); w: `W4A16Weight` packed with
    ``pack_w4a16_grouped(..., mode="contiguous")`` (``[G, N, K]``); m_indices: ``int32 [m]``,
    the expert of each row, ``-1`` on padding rows. Returns ``bf16 [m, N]``; padding rows are
    not written (their content is unspecified)."""
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
    grid = (m // config.block_m, triton.cdiv(w.n, config.block_n))
    _w4a16_contiguous_kernel[grid](
        a2, w.qweight, w.scales, out, m_indices,
        m, w.n, w.k, a2.stride(0), w.qweight.stride(0), w.qweight.stride(1), w.scales.stride(0),
        w.scales.stride(1), out.stride(0),
        BM=config.block_m, BN=config.block_n, SWAP_AB=config.swap_ab,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
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
    """The Hopper Gluon kernels (`w4a16_sm90`): a CUDA sm_90 device, TMA-able rows. engine
    ``gluon``: dequantized weights through shared memory; ``gluon_rs``: in registers;
    ``gluon_ws``: in registers, with a producer warp issuing the loads. Masked: a grid of
    programs for the expected rows (`masked_row_slots`), not for max_m."""
    require_sm90(a.device, mode)
    from .hopper import GLUON_SPLIT_TILES, masked_row_slots, w4a16_grouped_sm90_launch, w4a16_grouped_split_launch

    regs_a = config.engine in REGISTER_A_ENGINES
    tiles = _engine_tiles(config.engine, mode)
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
    """Grouped-masked W4A16 GEMM.

    a3: ``bf16 [G, max_m, K]`` or flat ``[G * max_m, K]``; w: `W4A16Weight` packed with
    ``pack_w4a16_grouped(..., mode="masked")`` (``[G, N, K]``); masked_m: ``int32 [G]`` on the
    device, the valid rows of each expert (values above max_m are clamped); expected_m: a
    positive Python int used only to choose the launch shape. Returns flat ``bf16
    [G * max_m, N]``; rows past ``masked_m[g]`` are unspecified."""
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
    grid = (g, triton.cdiv(max_m, config.block_m), triton.cdiv(w.n, config.block_n))
    _w4a16_masked_kernel[grid](
        a_flat, w.qweight, w.scales, out, masked_m,
        max_m, w.n, w.k, a_flat.stride(0), w.qweight.stride(0), w.qweight.stride(1), w.scales.stride(0),
        w.scales.stride(1), out.stride(0),
        BM=config.block_m, BN=config.block_n, SWAP_AB=config.swap_ab,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


w4a16_grouped_contiguous = contiguous
w4a16_grouped_masked = masked


def compile_configs():
    """Every configuration the grouped heuristics can pick, for the compile tier."""
    common = {"N": "i32", "K": "i32", "stride_am": "i32", "stride_qe": "i32", "stride_qn": "i32",
              "stride_se": "i32", "stride_sk": "i32", "stride_cm": "i32",
              "BM": "constexpr", "BN": "constexpr", "SWAP_AB": "constexpr"}
    ptrs = {"a_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*bf16", "c_ptr": "*bf16"}
    sig_c = {**ptrs, "m_indices_ptr": "*i32", "M": "i32", **common}
    sig_m = {**ptrs, "masked_m_ptr": "*i32", "max_m": "i32", **common}
    return (compile_configs_for(_w4a16_contiguous_kernel, sig_c, "w4a16_contiguous", [{}], ())
            + compile_configs_for(_w4a16_masked_kernel, sig_m, "w4a16_masked", [{}], ("max_m",)))
