"""The output-centric decode's launch choice: a pure function of the problem (tokens, top-k,
experts, sizes, weight format, whether the Gluon engine can run) returning a `DecodeConfig` and
its reason, memoized per shape and per value of the ``LOWBIT_DECODE_*`` overrides.

The engine: INT4 on sm_90 and k256-interleaved MXFP8 run the mma engine; otherwise the expected
routes per expert hit, ``M*k / (E * (1 - (1 - k/E)**M))`` (Kimi EP8: 1.00, 1.09, 1.29, 1.74,
2.82, 5.35 at M = 1, 2, 4, 8, 16, 32), picks fma (little to share) or dot (shared experts).
Tiles and splits come from `tiles`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ...runtime import overrides
from .tiles import MMA_SPLITS, MMA_SPLITS_MXFP8, TILES, WEIGHT_FORMATS

__all__ = [
    "DecodeConfig",
    "ENV_OVERRIDES",
    "PRODUCTION_SHAPES",
    "PRODUCTION_BATCHES",
    "validate_config",
    "moe_decode_config",
    "explain_moe_decode_config",
    "production_configs",
]


@dataclass(frozen=True)
class DecodeConfig:
    """Launch choice of the two decode kernels.

    engine: ``"fma"`` (one route / token per program, CUDA cores), ``"dot"`` (weight rows read
    once for the tokens sharing an expert, tensor cores) or ``"mma"`` (INT4 and k256-interleaved
    MXFP8 on sm_90, Gluon: `lowbit.kernels.moe_decode.hopper`); block_i: gate_up neurons per
    program (as many gate rows and up rows; 16 on mma); block_h: down output dims per program (16
    on mma); tokens: columns per MMA (dot: gate_up routes per weight pass, down tokens per
    program; mma: split among the warps, see split_*), 1 for fma; num_stages: the K loops'
    pipelining (mma: the cp.async ring's depth).
    """

    engine: str
    block_i: int
    block_h: int
    tokens: int
    num_warps: int
    num_stages: int
    reason: str = ""
    #: mma engine only: warps splitting gate_up's K and down's expert visits (each warp its own
    #: block of ``tokens / split`` MMA columns)
    split_gate_up: int = 1
    split_down: int = 1


#: The engine by expected routes per hit expert: (max routes per hit expert, engine, why), the
#: first row that fits; the mma engine is picked before this table (`_config_cached`).
#: H200, 2026-11-29, commit 03c2eac (INT4 Kimi EP8 layer, CUDA graph, L2 flushed): fma 530.9 vs dot 600.7 us at M=4 (1.29), dot 800.3 vs fma 1003.3 at M=8 (1.74)
_ENGINES = (
    (1.5, "fma", "< 1.5 routes per hit expert: little to share, one output unit per program on the CUDA cores "
                 "(H200: fma 531 us vs dot 601 us at Kimi EP8 M=4)"),
    (float("inf"), "dot", "experts shared by several tokens: weight rows read once for all of them "
                          "(H200: dot 800 us vs fma 1003 us at Kimi EP8 M=8)"),
)
#: Why INT4 on sm_90 takes the mma engine.
#: H200, 2026-11-30, commit 1f915eb: mma 89 vs fma 168 us at M=1, 1037 vs dot 1287 at M=32 (Kimi EP8)
_MMA_INT4_WHY = ("INT4 on sm_90: the tensor-core engine, faster than fma / dot at every M of 1-32 "
                 "(H200, Kimi EP8: 89 vs 168 us at M=1, 1037 vs 1287 at M=32)")

_ENV_FIELDS = ("engine", "block_i", "block_h", "tokens", "num_warps", "num_stages", "split_gate_up", "split_down")
#: Environment overrides, each part of the memo key: LOWBIT_DECODE_ENGINE (fma|dot|mma),
#: LOWBIT_DECODE_BLOCK_I, _BLOCK_H, _TOKENS, _NUM_WARPS, _NUM_STAGES, _SPLIT_GATE_UP, _SPLIT_DOWN.
ENV_OVERRIDES = overrides.override_names("DECODE", _ENV_FIELDS)

#: The production shapes the heuristics are enumerated over for the compile tier (Kimi K2.x,
#: SPEC section 5): (name, num_experts, hidden, inter, top_k), and the decode batches.
PRODUCTION_SHAPES = (("ep8", 48, 7168, 2048, 8), ("tp8", 384, 7168, 256, 8))
PRODUCTION_BATCHES = tuple(range(1, 65))


def _env_key() -> tuple:
    return overrides.env_key("DECODE", _ENV_FIELDS)


def _routes_per_hit_expert(m: int, top_k: int, num_experts: int) -> float:
    hit = num_experts * (1.0 - (1.0 - min(top_k, num_experts) / num_experts) ** m)
    return m * top_k / max(hit, 1.0)


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def validate_config(cfg: DecodeConfig) -> None:
    """The whole constraint set of a configuration (raises ValueError naming the field)."""
    if cfg.engine not in ("fma", "dot", "mma"):
        raise ValueError(f"decode engine must be 'fma', 'dot' or 'mma', got {cfg.engine!r}")
    if cfg.engine == "mma":
        gu_cols = min(cfg.tokens, 16)
        if (cfg.block_i != 16 or cfg.block_h != 16 or cfg.tokens not in (8, 16, 32)
                or cfg.split_gate_up not in (1, 2, 4, 8) or gu_cols % cfg.split_gate_up
                or cfg.split_down not in (1, 2, 4, 8) or cfg.tokens % cfg.split_down):
            raise ValueError(f"decode engine 'mma': block_i = block_h = 16, tokens (MMA columns) in (8, 16, 32), "
                             f"split_gate_up / split_down in (1, 2, 4, 8) dividing the columns (gate_up uses "
                             f"min(tokens, 16)), got block_i={cfg.block_i} block_h={cfg.block_h} tokens={cfg.tokens} "
                             f"split_gate_up={cfg.split_gate_up} split_down={cfg.split_down}")
        if cfg.num_stages not in (3, 4, 5, 6, 8):
            raise ValueError(f"decode engine 'mma': num_stages (the cp.async ring) in 3..8, got {cfg.num_stages}")
        return
    for name in ("block_i", "block_h"):
        v = getattr(cfg, name)
        if not _is_pow2(v) or v < 16:
            raise ValueError(f"decode {name}={v}: must be a power of two >= 16")
    if cfg.engine == "dot" and (not _is_pow2(cfg.tokens) or cfg.tokens < 16):
        raise ValueError(f"decode tokens={cfg.tokens}: the dot engine needs a power of two >= 16 (tl.dot's minimum)")
    if cfg.engine == "fma" and cfg.tokens != 1:
        raise ValueError(f"decode tokens={cfg.tokens}: the fma engine computes one route per program (tokens=1)")
    if cfg.num_warps not in (1, 2, 4, 8, 16) or cfg.num_stages < 1:
        raise ValueError(f"decode num_warps={cfg.num_warps} num_stages={cfg.num_stages}")


@lru_cache(maxsize=4096)
def _config_cached(m: int, top_k: int, num_experts: int, hidden: int, inter: int, fmt: str, env: tuple,
                   native: bool = False) -> DecodeConfig:
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"moe_decode weight format must be one of {WEIGHT_FORMATS}, got {fmt!r}")
    rpe = _routes_per_hit_expert(m, top_k, num_experts)
    env_vals = dict(zip(_ENV_FIELDS, env))
    if env_vals["engine"]:
        engine, why = env_vals["engine"].lower(), f"LOWBIT_DECODE_ENGINE={env_vals['engine']}"
    elif fmt == "mxfp8_k256":
        engine, why = "mma", "k256-interleaved MXFP8: the layout of the mma engine (sm_90), the only one reading it"
    elif native and fmt == "int4":
        engine, why = "mma", _MMA_INT4_WHY
    else:
        _, engine, why = next(row for row in _ENGINES if rpe <= row[0])
    if (engine, fmt) not in TILES:
        raise ValueError(f"LOWBIT_DECODE_ENGINE must be 'fma', 'dot' or 'mma' (mma: INT4 or k256-interleaved "
                         f"MXFP8; that layout: mma only), got {env_vals['engine']!r} for {fmt}")
    block_i, block_h, warps, stages, measured = TILES[engine, fmt]
    # dot: 16 tokens per program covers M <= 16 in one pass over the hit experts; beyond, 32.
    # mma: the down kernel's token block covers M <= 32 in one pass (each expert read once)
    splits = {}
    if engine == "mma":
        table = MMA_SPLITS if fmt == "int4" else MMA_SPLITS_MXFP8
        _, tokens, split_gu, split_dn = next(row for row in table if m <= row[0])
        splits = {"split_gate_up": split_gu, "split_down": split_dn}
    else:
        tokens = 1 if engine == "fma" else (16 if m <= 16 else 32)
    cfg = DecodeConfig(engine, block_i, block_h, tokens, warps, stages,
                       f"M={m} k={top_k} E={num_experts}: {rpe:.2f} routes/hit expert: {why}; "
                       f"{fmt} {engine} tile {measured}", **splits)
    # the engine override was applied above (it picks the tile row); the others on top of it
    cfg = overrides.apply_env_overrides(cfg, "DECODE", _ENV_FIELDS[1:])
    validate_config(cfg)
    return cfg


def moe_decode_config(m: int, top_k: int, num_experts: int, hidden: int, inter: int,
                      fmt: str = "int4", native: bool = False) -> DecodeConfig:
    """The launch configuration for `m` tokens routed top-`top_k` over `num_experts` experts of
    hidden size `hidden` and intermediate size `inter`, weights in `fmt` (``"int4"``,
    ``"mxfp8"``, or ``"mxfp8_k256"``: MXFP8 in the interleaved layout, mma only); `native`: the
    data is on an sm_90 GPU with the interpreter off (the Gluon ``mma`` engine can run).
    Memoized per shape and per value of the ``LOWBIT_DECODE_*`` overrides (`ENV_OVERRIDES`), so
    the host side costs a dict lookup."""
    return _config_cached(m, top_k, num_experts, hidden, inter, fmt, _env_key(), native)


def explain_moe_decode_config(m: int, top_k: int, num_experts: int, hidden: int, inter: int,
                              fmt: str = "int4", native: bool = True) -> str:
    """One line: the configuration `moe_decode_config` picks (on sm_90 by default) and why."""
    c = moe_decode_config(m, top_k, num_experts, hidden, inter, fmt, native)
    split = f" split_gate_up={c.split_gate_up} split_down={c.split_down}" if c.engine == "mma" else ""
    return (f"moe_decode {fmt} M={m} k={top_k} E={num_experts} H={hidden} I={inter}: engine={c.engine} "
            f"block_i={c.block_i} block_h={c.block_h} tokens={c.tokens} warps={c.num_warps} "
            f"stages={c.num_stages}{split} -- {c.reason}")


def production_configs() -> list[tuple[str, DecodeConfig]]:
    """Every distinct (weight format, configuration) the heuristics pick for `PRODUCTION_SHAPES`
    at `PRODUCTION_BATCHES` without overrides, off sm_90 (``native=False``: the Triton engines,
    and the mma engine for k256-interleaved MXFP8). The mma engine's tiles on sm_90 come from
    `tiles` directly (`lowbit.kernels.moe_decode.hopper.compile_configs`)."""
    seen: dict[tuple, tuple[str, DecodeConfig]] = {}
    for _, e, h, inter, k in PRODUCTION_SHAPES:
        for m in PRODUCTION_BATCHES:
            for fmt in WEIGHT_FORMATS:
                c = _config_cached(m, k, e, h, inter, fmt, ("",) * len(ENV_OVERRIDES))
                seen.setdefault((fmt, c.engine, c.block_i, c.block_h, c.tokens, c.num_warps, c.num_stages), (fmt, c))
    return list(seen.values())
