"""Op benchmark cases (decode layers and DeepSeek kernels): the registry entries of `lowbit.bench.ops`.

Kept free of imports from `lowbit.bench.cases` (which registers these into ``CASES``), so
either module can be imported first. `OpCase.projections` only serves listings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["COPY_CEILING_TBS", "FP8_CEILING_TFLOPS", "OpCase", "OP_CASES", "OP_CASE_NAMES", "DEFAULT_OP_CASE_NAMES"]


class Shape(NamedTuple):
    """What a listing shows of a case (same fields as `lowbit.bench.cases.Projection`)."""

    name: str
    n: int
    k: int
    top_k: int


#: Measured device-to-device copy bandwidth on the H200 (read + write), for the quantizers.
COPY_CEILING_TBS = 4.28
#: Dense FP8 tensor-core peak of the H200 SXM (TFLOP/s), the compute floor of the FP8/FP4 GEMMs.
FP8_CEILING_TFLOPS = 1979.0

MX_GROUP = 32


# -- cases ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpCase:
    """One op point. `projections` only serves listings (two shape descriptors); `params`
    holds the op's own sizes. `bw_tbs` / `tflops`: the ceilings of this case (None = the
    run's)."""

    name: str
    family: str
    label: str
    params: tuple[tuple[str, Any], ...]
    projections: tuple[Shape, Shape]
    seed: int = 0
    tags: frozenset[str] = field(default_factory=frozenset)
    smoke: bool = False
    num_experts: int = 0
    bw_tbs: float | None = None
    tflops: float | None = None

    @property
    def layout(self) -> str:
        return self.family

    @property
    def profile(self) -> str:
        return "smoke" if self.smoke else self.family

    @property
    def tokens(self) -> int:
        return int(self.p.get("tokens", self.p.get("m", 0)))

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def nominal_routed_rows(self) -> int:
        return self.tokens * int(self.p.get("top_k", 1))

    def describe(self) -> dict[str, Any]:
        return {"case": self.name, "label": self.label, "layout": self.family, "profile": self.profile,
                "num_experts": self.num_experts, "params": self.p}


def _shape(name: str, n: int, k: int, top_k: int = 1) -> tuple[Shape, Shape]:
    p = Shape(name, n, k, top_k)
    return (p, p)


def _decode_case(tokens: int, fmt: str, *, e: int, h: int, inter: int, top_k: int, smoke: bool = False) -> OpCase:
    name = f"{'smoke_' if smoke else ''}decode_oc_{fmt}_t{tokens}"
    return OpCase(
        name=name, family="decode_oc", label=f"EP8 decode layer {fmt.upper()} {tokens} tok (output-centric vs indexed)"
        if not smoke else f"smoke decode layer {fmt}",
        params=(("tokens", tokens), ("fmt", fmt), ("e", e), ("h", h), ("inter", inter), ("top_k", top_k)),
        projections=(Shape("gate_up", 2 * inter, h, top_k), Shape("down", h, inter, 1)),
        seed=100 + tokens, num_experts=e, smoke=smoke,
        tags=frozenset({"smoke"} if smoke else {"decode_oc", "decode_layer", fmt, "ep8"}),
    )


def _gemm_case(op: str, m: int, n: int, k: int, smoke: bool = False) -> OpCase:
    return OpCase(
        name=f"{'smoke_' if smoke else ''}{op}_m{m}_n{n}_k{k}", family=op,
        label=f"{op} M={m} N={n} K={k}" + (" (V4-Flash)" if not smoke else ""),
        params=(("m", m), ("n", n), ("k", k)), projections=_shape(op, n, k, m), seed=200 + m + n,
        smoke=smoke, tflops=FP8_CEILING_TFLOPS,
        tags=frozenset({"smoke"} if smoke else {"seed004", op, "gemm"}),
    )


def _quant_case(op: str, m: int, k: int, smoke: bool = False) -> OpCase:
    return OpCase(
        name=f"{'smoke_' if smoke else ''}{op}_{m}x{k}", family=op,
        label=f"{op} {m}x{k} bf16 (vs {COPY_CEILING_TBS} TB/s copy)" if not smoke else f"smoke {op}",
        params=(("m", m), ("k", k)), projections=_shape(op, k, m), seed=300 + m, smoke=smoke,
        bw_tbs=COPY_CEILING_TBS, tags=frozenset({"smoke"} if smoke else {"seed004", op, "quant"}),
    )


def _attn_case(phase: str, b: int, s: int, h: int, d: int, topk: int, n: int, smoke: bool = False) -> OpCase:
    return OpCase(
        name=f"{'smoke_' if smoke else ''}sparse_attn_{phase}", family="sparse_attn",
        label=f"sparse_attn {phase} b={b} s={s} h={h} d={d} topk={topk} kv={n}",
        params=(("b", b), ("s", s), ("h", h), ("d", d), ("topk", topk), ("n", n), ("phase", phase)),
        projections=_shape("sparse_attn", d, topk, b * s), seed=400 + s, smoke=smoke,
        tags=frozenset({"smoke"} if smoke else {"seed004", "sparse_attn", phase}),
    )


def _sinkhorn_case(tokens: int, smoke: bool = False) -> OpCase:
    return OpCase(
        name=f"{'smoke_' if smoke else ''}hc_split_sinkhorn_t{tokens}", family="hc_split_sinkhorn",
        label=f"hc_split_sinkhorn {tokens} tokens, hc 4, 20 iters", params=(("tokens", tokens), ("hc", 4), ("iters", 20)),
        projections=_shape("sinkhorn", 24, tokens), seed=500, smoke=smoke,
        tags=frozenset({"smoke"} if smoke else {"seed004", "hc_split_sinkhorn", "sinkhorn"}),
    )


def _all_cases() -> list[OpCase]:
    out = []
    for fmt in ("int4", "mxfp8"):
        for t in (1, 2, 4, 8, 16, 32):
            out.append(_decode_case(t, fmt, e=48, h=7168, inter=2048, top_k=8))
    for op in ("fp8_gemm", "fp4_gemm"):
        for n, k in ((2304, 5120), (5120, 2304)):
            for m in (16, 64, 128, 4096) if op == "fp4_gemm" else (16, 128, 4096):  # fp4: the M <= 64 target
                out.append(_gemm_case(op, m, n, k))
    out.append(_quant_case("act_quant", 16384, 7168))
    out.append(_quant_case("fp4_quant", 16384, 7168))
    out.append(_attn_case("decode", 64, 1, 64, 512, 2048, 65536))
    out.append(_attn_case("prefill", 1, 1024, 64, 512, 2048, 65536))
    out.append(_sinkhorn_case(16384))
    # tiny shapes for the no-GPU checks (interpreter) and the CPU harness tests
    out.append(_decode_case(3, "int4", e=8, h=256, inter=64, top_k=4, smoke=True))
    out.append(_decode_case(3, "mxfp8", e=8, h=256, inter=64, top_k=4, smoke=True))
    out.append(_gemm_case("fp8_gemm", 16, 256, 256, smoke=True))
    out.append(_gemm_case("fp4_gemm", 16, 256, 256, smoke=True))
    out.append(_quant_case("act_quant", 8, 256, smoke=True))
    out.append(_quant_case("fp4_quant", 8, 256, smoke=True))
    out.append(_attn_case("decode", 2, 1, 16, 64, 64, 256, smoke=True))
    out.append(_sinkhorn_case(37, smoke=True))
    return out


OP_CASES: list[OpCase] = _all_cases()
OP_CASE_NAMES: tuple[str, ...] = tuple(c.name for c in OP_CASES)


#: Op cases that join ``python -m lowbit bench``'s default set: the two ends of the INT4
#: decode batch range (about 1-2 min on the H200 with compilation, see docs/gpu.md).
DEFAULT_OP_CASE_NAMES: tuple[str, ...] = ("decode_oc_int4_t1", "decode_oc_int4_t32")
