"""Benchmark cases: the Kimi K2.x MoE scenarios (SPEC section 5), their data, and the byte model.

A `BenchCase` names one scenario point (layout, expert count, token / row draw); it always
has two projections, ``gate_up`` and ``down``, benchmarked as separate rows and summed.
`build_problem` turns a (case, projection) into a `Problem`: the routing draw, the
activations in the layout's form, the INT4 group-32 weight, and a *route table* (which output
row is computed from which input row with which expert) that the reference, the torch
provider and the byte model share.

How routing is drawn (decided here, identical for every provider):

- **EP8** cases route each token top-8 among the **48 local experts** directly (the counting
  of SPEC section 5, Chord's and Humming's benchmarks): every one of the T*8 routes lands on
  this rank. Drawing over 384 global experts with an ``expert_map`` would leave only ~1/8 of
  the routes local, which is a different (smaller) problem than the published points.
  ``down`` sees the same draw flattened: input ``[8T, 2048]``, ``top_k = 1``, route ``t*8+j``
  keeps expert ``topk_ids[t, j]``.
- **TP8** cases route top-8 among all 384 experts.
- Token draws are a seeded CPU generator (``torch.Generator``, seed = the case's), uniform
  random scores -> top-k: distinct experts per token, as a router gives.
- **Grouped contiguous** (prefill): every one of the 48 experts gets exactly `rows_per_expert`
  rows, a multiple of 128, so no tile is spent on padding in any implementation (as Chord's
  grouped comparison does); rows are shuffled so that the gather into the layout is real.
- **Grouped masked** (decode): expert ``g`` gets ``masked_m[g]`` rows drawn uniformly in
  ``[0.7, 1.3] x rows_per_expert``; ``max_m = 256`` rows are reserved per expert.
- Activations: standard normal BF16 (seeded per case and projection). Weights: uniform INT4
  codes 0..15 and positive BF16 scales ~ 1/(4.6 sqrt(K)) (so outputs are O(1)), seeded per
  weight shape: all cases of a profile share the same weights, drawn once.

The byte model counts what a kernel must move at least (compulsory traffic):
``weight K*N/2 + scales (K/32)*N*2`` bytes for each expert with at least one routed row,
plus each distinct input row read once (``K*2`` bytes) and each routed output row written once
(``N*2`` bytes). FLOPs are ``2 * routed_rows * N * K`` (padding rows not counted).
"""

from __future__ import annotations

import fnmatch
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from ..formats import QuantizedTensor, get_format
from ..formats.int4 import INT4_GROUP
from ..reference.moe import w4a16_contiguous_ref, w4a16_indexed_ref, w4a16_masked_ref
from ..reference.routing import build_contiguous_ref, build_masked_ref, moe_align_block_size_ref
from ..routing import ContiguousRouting, IndexedRouting, MaskedRouting, gather_rows

__all__ = [
    "HBM_READ_CEILING_TBS",
    "BF16_CEILING_TFLOPS",
    "Projection",
    "BenchCase",
    "CASES",
    "DEFAULT_CASE_NAMES",
    "register_case",
    "select_cases",
    "ByteModel",
    "byte_model",
    "Problem",
    "build_problem",
    "make_weight",
    "clear_weight_cache",
]

#: Read-bandwidth ceiling used for %BW (TB/s, H200; a measured copy moves ~4.3 TB/s r+w).
HBM_READ_CEILING_TBS = 4.50
#: Dense BF16 tensor-core ceiling used for %FLOP (TFLOP/s, H200).
BF16_CEILING_TFLOPS = 678.0

LAYOUTS = ("indexed", "contiguous", "masked")


@dataclass(frozen=True)
class Projection:
    """One GEMM of the MoE block: ``y[rows, n] = x[rows, k] @ W_e[n, k]^T``.

    name: "gate_up" or "down"; n, k: the weight's shape per expert;
    top_k: routes per input row (indexed layout: 8 for gate_up, 1 for down; grouped: 1).
    """

    name: str
    n: int
    k: int
    top_k: int


@dataclass(frozen=True)
class BenchCase:
    """A benchmark scenario point.

    name: unique id used by ``--cases`` (globs allowed).
    layout: "indexed" | "contiguous" | "masked".
    profile: "ep8" | "ep16" | "ep32" | "tp8" | "smoke" (which weight set; smoke = tiny shapes
    for checks).
    num_experts: experts on this GPU (48 for EP8, 384 for TP8).
    tokens: indexed: tokens T routed top-k (gate_up input ``[T, K]``); grouped: 0.
    rows_per_expert: grouped: rows per expert (contiguous exact, masked nominal).
    max_m: masked: rows reserved per expert.
    projections: (gate_up, down).
    label: the human name of the point ("EP8 decode 20 tok/GPU").
    seed: routing / activation seed.
    """

    name: str
    layout: str
    profile: str
    num_experts: int
    projections: tuple[Projection, Projection]
    tokens: int = 0
    rows_per_expert: int = 0
    max_m: int = 0
    masked_jitter: tuple[float, float] = (0.7, 1.3)
    label: str = ""
    seed: int = 0
    tags: frozenset[str] = field(default_factory=frozenset)

    @property
    def nominal_routed_rows(self) -> int:
        """Routed rows of gate_up (= rows of down) before drawing: T*top_k or E*rows."""
        if self.layout == "indexed":
            return self.tokens * self.projections[0].top_k
        return self.num_experts * self.rows_per_expert

    def describe(self) -> dict[str, Any]:
        return {
            "case": self.name,
            "label": self.label,
            "layout": self.layout,
            "profile": self.profile,
            "num_experts": self.num_experts,
            "tokens": self.tokens,
            "rows_per_expert": self.rows_per_expert,
            "max_m": self.max_m,
            "nominal_routed_rows": self.nominal_routed_rows,
        }


# -- the Kimi K2.x shapes (SPEC section 5) -------------------------------------------------
HIDDEN = 7168
EP8_EXPERTS, EP8_INTER = 48, 2048
TP8_EXPERTS, TP8_INTER = 384, 256
TOP_K = 8


def _ep8_indexed() -> tuple[Projection, Projection]:
    return (Projection("gate_up", 2 * EP8_INTER, HIDDEN, TOP_K), Projection("down", HIDDEN, EP8_INTER, 1))


def _tp8_indexed() -> tuple[Projection, Projection]:
    return (Projection("gate_up", 2 * TP8_INTER, HIDDEN, TOP_K), Projection("down", HIDDEN, TP8_INTER, 1))


def _ep8_grouped() -> tuple[Projection, Projection]:
    return (Projection("gate_up", 2 * EP8_INTER, HIDDEN, 1), Projection("down", HIDDEN, EP8_INTER, 1))


CASES: dict[str, BenchCase] = {}


def register_case(case: BenchCase) -> BenchCase:
    """Add a case to the registry (names are unique; layout must be known)."""
    if case.name in CASES:
        raise ValueError(f"benchmark case {case.name!r} registered twice")
    if case.layout not in LAYOUTS:
        raise ValueError(f"case {case.name!r}: layout must be one of {LAYOUTS}, got {case.layout!r}")
    CASES[case.name] = case
    return case


#: 128 and 384 tokens: between decode and prefill (the 32- and 64-row routing blocks' middles)
_EP8_TOKENS = (1, 4, 8, 16, 20, 32, 50, 128, 256, 384, 1024)
for _t in _EP8_TOKENS:
    _phase = "prefill" if _t >= 256 else "decode" if _t <= 50 else "mid"
    _label = f"EP8 indexed {_phase} " + (f"{_t * TOP_K} rows ({_t} tok)" if _t >= 256 else f"{_t} tok/GPU")
    register_case(BenchCase(
        name=f"ep8_indexed_t{_t}", layout="indexed", profile="ep8", num_experts=EP8_EXPERTS,
        projections=_ep8_indexed(), tokens=_t, label=_label, seed=_t,
        tags=frozenset({"ep8", "indexed", _phase}),
    ))
for _t in (1024, 8192):
    register_case(BenchCase(
        name=f"tp8_indexed_t{_t}", layout="indexed", profile="tp8", num_experts=TP8_EXPERTS,
        projections=_tp8_indexed(), tokens=_t, label=f"TP8 indexed {_t * TOP_K} rows ({_t} tok)",
        seed=_t + 1, tags=frozenset({"tp8", "indexed", "prefill"}),
    ))
for _rows in (128, 256, 512):
    register_case(BenchCase(
        name=f"ep8_contiguous_{_rows}", layout="contiguous", profile="ep8", num_experts=EP8_EXPERTS,
        projections=_ep8_grouped(), rows_per_expert=_rows, label=f"EP8 grouped contiguous {_rows} rows/expert",
        seed=3 + _rows, tags=frozenset({"ep8", "grouped", "contiguous", "prefill"}),
    ))
for _rows in (8, 16, 32, 64):
    register_case(BenchCase(
        name=f"ep8_masked_{_rows}", layout="masked", profile="ep8", num_experts=EP8_EXPERTS,
        projections=_ep8_grouped(), rows_per_expert=_rows, max_m=256,
        label=f"EP8 grouped masked {_rows} tok/expert (0.7-1.3x), max_m 256",
        seed=5 + _rows, tags=frozenset({"ep8", "grouped", "masked", "decode"}),
    ))

# Kimi K2.x over 16 and 32 GPUs (the grouped expert-count sweep): the same expert shapes, 24 and
# 12 local experts, at the headline grouped points.
for _ep, _experts in ((16, 24), (32, 12)):
    register_case(BenchCase(
        name=f"ep{_ep}_contiguous_128", layout="contiguous", profile=f"ep{_ep}", num_experts=_experts,
        projections=_ep8_grouped(), rows_per_expert=128, label=f"EP{_ep} grouped contiguous 128 rows/expert",
        seed=7 + _ep, tags=frozenset({f"ep{_ep}", "grouped", "contiguous", "prefill"}),
    ))
    register_case(BenchCase(
        name=f"ep{_ep}_masked_32", layout="masked", profile=f"ep{_ep}", num_experts=_experts,
        projections=_ep8_grouped(), rows_per_expert=32, max_m=256,
        label=f"EP{_ep} grouped masked 32 tok/expert (0.7-1.3x), max_m 256",
        seed=9 + _ep, tags=frozenset({f"ep{_ep}", "grouped", "masked", "decode"}),
    ))

# Tiny shapes: exercise every layout end to end in seconds (CPU harness tests, GPU smoke).
_SMOKE_GATE_UP = Projection("gate_up", 128, 256, 4)
_SMOKE_DOWN = Projection("down", 256, 128, 1)
register_case(BenchCase(
    name="smoke_indexed", layout="indexed", profile="smoke", num_experts=8,
    projections=(_SMOKE_GATE_UP, _SMOKE_DOWN), tokens=7, label="smoke indexed", seed=11,
    tags=frozenset({"smoke"}),
))
register_case(BenchCase(
    name="smoke_contiguous", layout="contiguous", profile="smoke", num_experts=4,
    projections=(Projection("gate_up", 128, 256, 1), _SMOKE_DOWN), rows_per_expert=128,
    label="smoke contiguous", seed=12, tags=frozenset({"smoke"}),
))
register_case(BenchCase(
    name="smoke_masked", layout="masked", profile="smoke", num_experts=4,
    projections=(Projection("gate_up", 128, 256, 1), _SMOKE_DOWN), rows_per_expert=8, max_m=16,
    label="smoke masked", seed=13, tags=frozenset({"smoke"}),
))

#: What ``python -m lowbit bench`` runs with no flags: the seed's headline points.
DEFAULT_CASE_NAMES: tuple[str, ...] = (
    "ep8_indexed_t20",      # EP8 decode 20 tok/GPU
    "ep8_indexed_t50",      # EP8 decode 50 tok/GPU
    "ep8_indexed_t256",     # EP8 prefill "2048 tokens" = 2048 routed rows
    "ep8_indexed_t1024",    # EP8 prefill 8192 routed rows
    "tp8_indexed_t1024",    # TP8 8192 routed rows
    "tp8_indexed_t8192",    # TP8 65536 routed rows
    "ep8_contiguous_128",   # EP8 grouped prefill 128 rows/expert
    "ep8_masked_32",        # EP8 grouped decode 32 tok/expert
)


# The op families (`lowbit.bench.opcases` / `lowbit.bench.ops`): decode
# layers (tag ``decode_oc``) and the seed-004 kernels (tag ``seed004``, or each op's name).
from .opcases import DEFAULT_OP_CASE_NAMES, OP_CASES  # noqa: E402

for _c in OP_CASES:
    if _c.name in CASES:
        raise ValueError(f"benchmark case {_c.name!r} registered twice")
    CASES[_c.name] = _c  # type: ignore[assignment]  (OpCase: same listing attributes)
DEFAULT_CASE_NAMES = DEFAULT_CASE_NAMES + DEFAULT_OP_CASE_NAMES


def select_cases(patterns: list[str] | None) -> list[BenchCase]:
    """Cases whose name matches any of `patterns` (fnmatch globs, or "default" / "all" /
    a tag such as "decode", "decode_oc", "seed004", "fp8_gemm"), in registry order; no patterns =
    the default set. Entries are `BenchCase` (W4A16 MoE GEMMs) or `lowbit.bench.opcases.OpCase`.
    Raises ValueError naming the known cases when a pattern matches nothing."""
    if not patterns:
        return [CASES[n] for n in DEFAULT_CASE_NAMES]
    chosen: list[str] = []
    for pat in patterns:
        if pat == "default":
            hits = list(DEFAULT_CASE_NAMES)
        elif pat == "all":
            hits = [n for n, c in CASES.items() if c.profile != "smoke"]
        else:
            hits = [n for n, c in CASES.items() if fnmatch.fnmatchcase(n, pat) or pat in c.tags]
        if not hits:
            raise ValueError(f"no benchmark case matches {pat!r}; known: {', '.join(CASES)}")
        chosen.extend(h for h in hits if h not in chosen)
    order = list(CASES)
    return [CASES[n] for n in sorted(chosen, key=order.index)]


# -- byte / FLOP model ---------------------------------------------------------------------
@dataclass(frozen=True)
class ByteModel:
    """Compulsory traffic and work of one projection (see the module docstring)."""

    weight_bytes: int
    scale_bytes: int
    act_bytes: int
    out_bytes: int
    flops: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.scale_bytes + self.act_bytes + self.out_bytes

    def floor_us(self, bw_tbs: float = HBM_READ_CEILING_TBS, tflops: float = BF16_CEILING_TFLOPS) -> float:
        """Roofline lower bound: the larger of the memory and the compute time, in us."""
        return max(self.total_bytes / (bw_tbs * 1e12), self.flops / (tflops * 1e12)) * 1e6


def byte_model(*, experts_hit: int, n: int, k: int, act_rows: int, routed_rows: int) -> ByteModel:
    """INT4 group-32 weights (``k*n/2`` bytes) + BF16 scales (``k/32*n*2``) per expert hit,
    BF16 activations read once per distinct input row, BF16 outputs written once per routed row."""
    return ByteModel(
        weight_bytes=experts_hit * n * k // 2,
        scale_bytes=experts_hit * n * (k // INT4_GROUP) * 2,
        act_bytes=act_rows * k * 2,
        out_bytes=routed_rows * n * 2,
        flops=2 * routed_rows * n * k,
    )


# -- data ----------------------------------------------------------------------------------
_WEIGHT_CACHE: dict[tuple, QuantizedTensor] = {}
_WEIGHT_CACHE_SIZE = 2  # gate_up + down of one profile: consecutive cases reuse them


def clear_weight_cache() -> None:
    """Drop the cached benchmark weights (frees device memory between profiles)."""
    _WEIGHT_CACHE.clear()


def make_weight(num_experts: int, n: int, k: int, device: torch.device | str) -> QuantizedTensor:
    """Seeded random INT4 group-32 weight ``[E, N, K]`` (codes uint8 0..15, scales bf16
    ``[E, N, K/32]``), drawn on `device` and cached (the two most recent shapes)."""
    device = torch.device(device)
    key = (num_experts, n, k, str(device))
    if key in _WEIGHT_CACHE:
        return _WEIGHT_CACHE[key]
    while len(_WEIGHT_CACHE) >= _WEIGHT_CACHE_SIZE:
        _WEIGHT_CACHE.pop(next(iter(_WEIGHT_CACHE)))
    gen = torch.Generator(device=device)
    gen.manual_seed(zlib.crc32(f"w{num_experts}x{n}x{k}".encode()))
    codes = torch.randint(0, 16, (num_experts, n, k), generator=gen, device=device, dtype=torch.uint8)
    # (q - 8) has std ~4.6; this scale keeps each output's std ~ the activations'.
    base = 1.0 / (4.6 * k**0.5)
    scales = ((0.5 + torch.rand((num_experts, n, k // INT4_GROUP), generator=gen, device=device)) * base)
    q = QuantizedTensor(codes=codes, scales=scales.to(torch.bfloat16), fmt="int4_g32")
    get_format("int4_g32").check_quantized(q)
    _WEIGHT_CACHE[key] = q
    return q


def _draw_topk(tokens: int, num_experts: int, top_k: int, gen: torch.Generator) -> torch.Tensor:
    scores = torch.rand(tokens, num_experts, generator=gen)
    return scores.topk(top_k, dim=-1).indices.to(torch.int32)


def _draw_grouped_ids(case: BenchCase, gen: torch.Generator) -> torch.Tensor:
    """Expert id of each routed row (``int32 [R, 1]``, shuffled) for a grouped case."""
    e = case.num_experts
    if case.layout == "contiguous":
        counts = torch.full((e,), case.rows_per_expert, dtype=torch.int64)
    else:
        lo_f, hi_f = case.masked_jitter
        lo = max(0, int(-(-lo_f * case.rows_per_expert // 1)))
        hi = min(case.max_m, int(hi_f * case.rows_per_expert))
        counts = torch.randint(lo, hi + 1, (e,), generator=gen)
    ids = torch.repeat_interleave(torch.arange(e, dtype=torch.int32), counts)
    return ids[torch.randperm(ids.numel(), generator=gen)].reshape(-1, 1)


def moe_align_block_size(topk_ids: torch.Tensor, block_size: int, num_experts: int) -> IndexedRouting:
    """Indexed routing (vLLM contract) of `topk_ids` with `block_size`, built by lowbit's
    PyTorch reference builder: benchmark setup is untimed, and the ground truth keeps a
    provider's failure from being a routing builder's."""
    return moe_align_block_size_ref(topk_ids, block_size, num_experts)


@dataclass
class Problem:
    """One (case, projection) with all its device data. Built once, shared by all providers.

    topk_ids: ``int32 [rows_in, top_k]`` routing draw of this projection (local expert ids).
    hidden: ``bf16 [rows_in, K]`` token-major activations (the indexed layout's input).
    a: the layout's input: indexed = `hidden`; contiguous ``bf16 [m, K]``;
        masked ``bf16 [G*max_m, K]`` (rows past ``masked_m[g]`` are zero).
    weight: `QuantizedTensor` codes ``uint8 [E, N, K]``, scales ``bf16 [E, N, K/32]``.
    contiguous / masked: the grouped routing layouts (None for other layouts).
    route_out / route_in / route_expert: ``int64 [R]`` device tensors, one per routed row,
        sorted by expert (stable): output row, input row (of `a`), expert.
    out_rows: rows of the layout's output (``rows_in*top_k``, ``m`` or ``G*max_m``).
    """

    case: BenchCase
    proj: Projection
    device: torch.device
    topk_ids: torch.Tensor
    hidden: torch.Tensor
    a: torch.Tensor
    weight: QuantizedTensor
    route_out: torch.Tensor
    route_in: torch.Tensor
    route_expert: torch.Tensor
    out_rows: int
    contiguous: ContiguousRouting | None = None
    masked: MaskedRouting | None = None
    _reference: torch.Tensor | None = None

    @property
    def num_experts(self) -> int:
        return self.case.num_experts

    @property
    def routed_rows(self) -> int:
        return int(self.route_out.numel())

    @property
    def experts_hit(self) -> int:
        return int(torch.unique(self.route_expert).numel())

    @property
    def expected_m(self) -> int:
        """Masked: mean valid rows per expert (the launch-shape hint); else 0."""
        return max(1, -(-self.routed_rows // self.num_experts)) if self.case.layout == "masked" else 0

    def bytes(self) -> ByteModel:
        return byte_model(
            experts_hit=self.experts_hit, n=self.proj.n, k=self.proj.k,
            act_rows=int(torch.unique(self.route_in).numel()), routed_rows=self.routed_rows,
        )

    def reference(self) -> torch.Tensor:
        """FP32 ``[out_rows, N]`` reference (rows that are not routed are 0); cached."""
        if self._reference is None:
            self._reference = reference_output(self)
        return self._reference


def build_problem(case: BenchCase, proj_name: str, device: torch.device | str) -> Problem:
    """Draw the routing and activations of (`case`, `proj_name`) and fetch its weight."""
    device = torch.device(device)
    proj = next((p for p in case.projections if p.name == proj_name), None)
    if proj is None:
        raise ValueError(f"case {case.name!r} has no projection {proj_name!r}")
    gen = torch.Generator()
    gen.manual_seed(case.seed)
    e = case.num_experts

    if case.layout == "indexed":
        gate_ids = _draw_topk(case.tokens, e, case.projections[0].top_k, gen)
        # down consumes the gate_up routes as rows, one route each
        topk_ids = gate_ids if proj.top_k > 1 else gate_ids.reshape(-1, 1)
    else:
        topk_ids = _draw_grouped_ids(case, gen)
    rows_in = topk_ids.shape[0]
    act_gen = torch.Generator()
    act_gen.manual_seed(zlib.crc32(f"a{case.name}/{proj.name}".encode()))
    hidden = torch.randn(rows_in, proj.k, generator=act_gen).to(torch.bfloat16).to(device)
    topk_ids = topk_ids.to(device)
    weight = make_weight(e, proj.n, proj.k, device)

    contiguous = masked = None
    if case.layout == "indexed":
        flat = topk_ids.flatten().long()
        route_out = torch.arange(flat.numel(), device=device)
        route_in = route_out // proj.top_k
        route_expert = flat
        a = hidden
        out_rows = flat.numel()
    else:
        if case.layout == "contiguous":
            contiguous = build_contiguous_ref(topk_ids, e, e)
            row_to_route, experts_of_row = contiguous.row_to_route, contiguous.m_indices
        else:
            masked = build_masked_ref(topk_ids, e, e, case.max_m)
            row_to_route = masked.row_to_route
            experts_of_row = torch.arange(e, device=device, dtype=torch.int32).repeat_interleave(case.max_m)
        a = gather_rows(hidden, row_to_route, 1)  # zeros on padding rows
        rows = torch.nonzero(row_to_route >= 0).flatten()
        route_out = rows
        route_in = rows
        route_expert = experts_of_row[rows].long()
        out_rows = row_to_route.numel()

    order = torch.sort(route_expert, stable=True).indices
    return Problem(
        case=case, proj=proj, device=device, topk_ids=topk_ids, hidden=hidden, a=a, weight=weight,
        route_out=route_out[order], route_in=route_in[order], route_expert=route_expert[order],
        out_rows=out_rows, contiguous=contiguous, masked=masked,
    )


def reference_output(problem: Problem) -> torch.Tensor:
    """FP32 reference ``[out_rows, N]`` of a problem (`lowbit.reference.moe`); rows the layout
    does not write are 0."""
    p, layout = problem, problem.case.layout
    if layout == "indexed":
        r = moe_align_block_size(p.topk_ids, 16, p.num_experts)
        return w4a16_indexed_ref(p.a, p.weight, r.sorted_token_ids, r.expert_ids,
                                 r.num_tokens_post_padded, p.proj.top_k)
    if layout == "contiguous":
        return w4a16_contiguous_ref(p.a, p.weight, p.contiguous.m_indices)
    return w4a16_masked_ref(p.a, p.weight, p.masked.masked_m)
