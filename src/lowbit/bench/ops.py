"""Benchmark families beyond the W4A16 MoE GEMMs: one op (or one whole layer) per case.

Families (``--cases`` takes the family name, ``decode_oc`` / ``seed004``, or a case name / glob):

- ``decode_oc``: the expert part of a Kimi K2.x EP8 MoE layer at decode batches
  (48 experts, H=7168, I=2048, top-8; tokens 1, 2, 4, 8, 16, 32), INT4 group-32 and MXFP8
  weights, timed as one layer (``projection="layer"``). Providers:
  ``lowbit`` = `moe_decode` (output-centric gate_up + down, combine folded in);
  ``lowbit-indexed`` = `lowbit.moe_experts(path="indexed")`: routing
  (`lowbit.routing.moe_align_block_size`) + `w4a16_indexed` gate_up + `silu_mul` +
  `w4a16_indexed` down + `combine_topk`, INT4 only; ``lowbit-auto`` = `moe_experts` on the path
  it picks for the batch (INT4); ``humming-indexed`` = the same composition with Humming's
  indexed GEMMs (the same `silu_mul` / `combine_topk`), INT4 only.
  Reference: `moe_experts_ref(..., round_intermediate=True)`.
  Bytes: the weights of the experts actually hit (INT4 ``K*N/2 + K/32*N*2`` per expert and
  projection, MXFP8 ``K*N + K/32*N``), the hidden rows read and the output rows written.
- ``seed004`` (the DeepSeek kernels), each op with its own tag too:
  ``fp8_gemm`` (M 16/128/4096 x (N, K) = (2304, 5120), (5120, 2304); baseline ``torch-scaled-mm``
  = `torch._scaled_mm` with *per-tensor* scales on the same FP8 data: it cannot apply the
  1x128 / 128x128 block scales, so it is refchecked against the unscaled FP8 product and
  compared on throughput only);
  ``fp4_gemm`` (same shapes; baseline ``humming-w4a8`` = Humming's dense MXFP4-weight layer
  with dynamic 1x128 FP8 activation groups, fed the BF16 values of our FP8 activations: its
  time includes its own activation quantization);
  ``act_quant`` / ``fp4_quant`` (16384 x 7168 BF16; baseline ``torch-ref`` = the PyTorch
  reference ops on the GPU; bytes read + written against 4.28 TB/s copy bandwidth);
  ``sparse_attn`` (decode b=64 s=1 h=64 d=512 top-k 2048 over 64k KV, and a prefill point;
  bytes = the gathered KV rows + q + out + indices; baseline ``torch-gather`` = the reference
  math in plain torch ops, gathering in BF16);
  ``hc_split_sinkhorn`` (16384 tokens, hc 4, 20 iterations; baseline ``torch-ref``).

Every provider follows the W4A16 providers' protocol: ``prepare`` (untimed: packing,
quantization, routing where it is not part of the timed layer, compilation and warm-up) and
``run`` (timed); the driver refchecks before timing. Provider *groups* (``lowbit``,
``humming``, ``torch``) are what ``--providers`` selects.
"""

from __future__ import annotations

import importlib
import json
import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch

from ..formats.int4 import INT4_GROUP
from .. import routing
from ..testing import cos_diff, rel_fro_err
from .cases import BenchCase, ByteModel
from .opcases import COPY_CEILING_TBS, FP8_CEILING_TFLOPS, OP_CASE_NAMES, OP_CASES, OpCase

MX_GROUP = 32

__all__ = [
    "COPY_CEILING_TBS",
    "FP8_CEILING_TFLOPS",
    "OpCase",
    "OP_CASES",
    "OpProblem",
    "OpProvider",
    "FAMILIES",
    "OP_CASE_NAMES",
    "build_op_problem",
    "op_providers",
    "decode_bytes",
    "crossover_summary",
]

# -- problems ------------------------------------------------------------------------------
@dataclass
class OpProblem:
    """One op case's device data, built once and shared by every provider.

    inputs: the tensors the providers read. refs: reference outputs by key, computed lazily
    by `ref_fns` (``"default"`` is the op's FP32 / bit-exact reference).
    compare(out, ref) -> (rel_fro_err, cos_diff, note): how an output is measured.
    """

    case: OpCase
    device: torch.device
    inputs: dict[str, Any]
    bytes_model: ByteModel
    ref_fns: dict[str, Callable[[], Any]]
    compare: Callable[[Any, Any], tuple[float, float, str]]
    n: int | None = None
    k: int | None = None
    top_k: int | None = None
    routed_rows: int | None = None
    experts_hit: int | None = None
    refs: dict[str, Any] = field(default_factory=dict)

    @property
    def projection(self) -> str:
        return "layer" if self.case.family == "decode_oc" else "op"

    def reference(self, key: str = "default") -> Any:
        if key not in self.refs:
            self.refs[key] = self.ref_fns[key]()
        return self.refs[key]

    def bytes(self) -> ByteModel:
        return self.bytes_model


def _gen(seed: int, tag: str) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(zlib.crc32(f"{seed}/{tag}".encode()))
    return g


def _rel_cos(x: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    return rel_fro_err(x, ref), cos_diff(x, ref)


def _compare_dense(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, str]:
    if tuple(out.shape) != tuple(ref.shape):
        return float("inf"), float("inf"), f"output shape {tuple(out.shape)} != {tuple(ref.shape)}"
    rel, cos = _rel_cos(out.float(), ref.float())
    return rel, cos, ""


def _compare_tuple(out, ref) -> tuple[float, float, str]:
    """Tuples of tensors (sinkhorn): all parts concatenated."""
    if len(out) != len(ref) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(out, ref)):
        return float("inf"), float("inf"), "output shapes differ from the reference"
    cat = lambda ts: torch.cat([t.float().flatten() for t in ts])  # noqa: E731
    rel, cos = _rel_cos(cat(out), cat(ref))
    return rel, cos, ""


def _compare_quant(dequant: Callable[[Any], torch.Tensor]) -> Callable[[Any, Any], tuple[float, float, str]]:
    """Quantizers: bit equality of codes and scales reported in the note; the pass / fail
    measure is the relative error of the dequantized values (0 when bit-exact)."""

    def cmp(out, ref) -> tuple[float, float, str]:
        (q, s), (rq, rs) = out, ref
        if tuple(q.shape) != tuple(rq.shape) or tuple(s.shape) != tuple(rs.shape):
            return float("inf"), float("inf"), "output shapes differ from the reference"
        qb, rqb = q.view(torch.uint8), rq.view(torch.uint8)
        sb = s.contiguous().view(torch.uint8)
        rsb = rs.contiguous().view(torch.uint8)
        bad_q = int((qb != rqb).sum())
        bad_s = int((sb != rsb).sum())
        rel, cos = _rel_cos(dequant(out), dequant(ref))
        note = "bit-exact" if not (bad_q or bad_s) else f"{bad_q} code bytes / {bad_s} scale bytes differ"
        return rel, cos, note

    return cmp


# decode_oc ---------------------------------------------------------------------------------
def decode_bytes(*, fmt: str, experts_hit: int, tokens: int, h: int, inter: int, top_k: int) -> ByteModel:
    """The decode layer's compulsory traffic: w13 ``[2I, H]`` and w2 ``[H, I]`` of each expert
    hit (INT4: ``K*N/2`` codes + ``K/32*N*2`` BF16 scales; MXFP8: ``K*N`` + ``K/32*N`` E8M0),
    the hidden rows read (``T*H*2``) and the output rows written (``T*H*2``).
    FLOPs: ``2 * T*top_k * (2I*H + H*I)``."""
    elems = 2 * inter * h + h * inter
    if fmt == "int4":
        w, s = elems // 2, elems // INT4_GROUP * 2
    elif fmt == "mxfp8":
        w, s = elems, elems // MX_GROUP
    else:
        raise ValueError(f"unknown decode weight format {fmt!r}")
    return ByteModel(weight_bytes=experts_hit * w, scale_bytes=experts_hit * s, act_bytes=tokens * h * 2,
                     out_bytes=tokens * h * 2, flops=2 * tokens * top_k * 3 * inter * h)


_MX_CACHE: dict[tuple, Any] = {}


def _mxfp8_weight(e: int, n: int, k: int, device: torch.device):
    """Seeded random MXFP8 ``[E, N, K]`` (E4M3 codes ~ 2*N(0,1), E8M0 scales around
    ``1/(2 sqrt K)``), drawn one expert at a time; the two most recent shapes are cached."""
    key = (e, n, k, str(device))
    if key in _MX_CACHE:
        return _MX_CACHE[key]
    while len(_MX_CACHE) >= 2:
        _MX_CACHE.pop(next(iter(_MX_CACHE)))
    gen = torch.Generator(device=device)
    gen.manual_seed(zlib.crc32(f"mx{e}x{n}x{k}".encode()))
    codes = torch.empty(e, n, k, dtype=torch.float8_e4m3fn, device=device)
    for i in range(e):
        codes[i] = (torch.randn(n, k, generator=gen, device=device) * 2).to(torch.float8_e4m3fn)
    base = 127 + round(math.log2(1.0 / (2.0 * 2.0 * math.sqrt(k))))
    scales = (base + torch.randint(-1, 1, (e, n, k // MX_GROUP), generator=gen, device=device)).to(torch.uint8)
    from ..formats.moe_mxfp8 import Mxfp8ExpertWeight  # noqa: PLC0415

    w = Mxfp8ExpertWeight(codes, scales)
    _MX_CACHE[key] = w
    return w


def _build_decode(case: OpCase, device: torch.device) -> OpProblem:
    from ..reference.moe import moe_experts_ref, router_topk_ref  # noqa: PLC0415
    from .cases import make_weight  # noqa: PLC0415

    p = case.p
    t, e, h, inter, top_k, fmt = p["tokens"], p["e"], p["h"], p["inter"], p["top_k"], p["fmt"]
    g = _gen(case.seed, "route")
    weights, ids = router_topk_ref(torch.randn(t, e, generator=g), top_k)
    hidden = torch.randn(t, h, generator=_gen(case.seed, "hidden")).to(torch.bfloat16).to(device)
    ids, weights = ids.to(device), weights.to(device)
    if fmt == "int4":
        w13, w2 = make_weight(e, 2 * inter, h, device), make_weight(e, h, inter, device)
        q13, q2 = w13, w2
    else:
        w13, w2 = _mxfp8_weight(e, 2 * inter, h, device), _mxfp8_weight(e, h, inter, device)
        q13, q2 = w13.as_quantized(), w2.as_quantized()
    hit = int(torch.unique(ids).numel())

    def ref() -> torch.Tensor:
        return moe_experts_ref(hidden, ids, weights, q13, q2, round_intermediate=True)

    return OpProblem(
        case=case, device=device,
        inputs={"hidden": hidden, "topk_ids": ids, "topk_weights": weights, "w13": w13, "w2": w2, "fmt": fmt},
        bytes_model=decode_bytes(fmt=fmt, experts_hit=hit, tokens=t, h=h, inter=inter, top_k=top_k),
        ref_fns={"default": ref}, compare=_compare_dense, n=h, k=inter, top_k=top_k, routed_rows=t * top_k,
        experts_hit=hit,
    )


# GEMMs -------------------------------------------------------------------------------------
def gemm_bytes(op: str, m: int, n: int, k: int) -> ByteModel:
    """fp8_gemm: weight ``N*K`` + scales ``4*(ceil(N/128)*ceil(K/128) + M*ceil(K/128))``;
    fp4_gemm: weight ``N*K/2`` + scales ``N*K/32 + 4*M*ceil(K/128)``; both: activations
    ``M*K`` FP8 read, output ``M*N*2`` written; FLOPs ``2*M*N*K``."""
    kb = -(-k // 128)
    if op == "fp8_gemm":
        w, s = n * k, 4 * (-(-n // 128) * kb + m * kb)
    else:
        w, s = n * k // 2, n * k // 32 + 4 * m * kb
    return ByteModel(weight_bytes=w, scale_bytes=s, act_bytes=m * k, out_bytes=m * n * 2, flops=2 * m * n * k)


def _fp8_activations(m: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 activations whose every 1x128 group holds one +-448 code and a power-of-two scale:
    their BF16 values ``code * scale`` are exact, and a dynamic amax/448 re-quantization
    (Humming's) gives back the same codes, so every provider sees the same numbers."""
    x = (torch.randn(m, k, generator=g) * 64).clamp(-448, 448)
    x[:, ::128] = 448.0 * torch.sign(torch.randn(m, -(-k // 128), generator=g)).clamp(min=0).mul(2).sub(1)
    a = x.to(torch.float8_e4m3fn)
    a_s = torch.exp2(torch.randint(-12, -8, (m, -(-k // 128)), generator=g).float())
    return a, a_s


def _build_gemm(case: OpCase, device: torch.device) -> OpProblem:
    from ..reference.gemm import fp4_gemm_ref, fp8_gemm_ref  # noqa: PLC0415

    p = case.p
    m, n, k, op = p["m"], p["n"], p["k"], case.family
    g = _gen(case.seed, op)
    a, a_s = _fp8_activations(m, k, g)
    inputs: dict[str, Any] = {"m": m, "n": n, "k": k}
    if op == "fp8_gemm":
        b = (torch.randn(n, k, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
        b_s = torch.exp2(torch.randint(-10, -6, (-(-n // 128), -(-k // 128)), generator=g).float())
    else:
        b = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
        b_s = torch.randint(118, 122, (n, k // 32), generator=g, dtype=torch.uint8)
    a, a_s, b, b_s = (t.to(device) for t in (a, a_s, b, b_s))
    inputs.update(a=a, a_s=a_s, b=b, b_s=b_s)
    if op == "fp8_gemm":
        refs = {"default": lambda: fp8_gemm_ref(a, a_s, b, b_s),
                # what a per-tensor-scaled GEMM of the same FP8 data computes (unit scales)
                "unscaled": lambda: a.float() @ b.float().T}
    else:
        refs = {"default": lambda: fp4_gemm_ref(a, a_s, b, b_s)}
    return OpProblem(case=case, device=device, inputs=inputs, bytes_model=gemm_bytes(op, m, n, k),
                     ref_fns=refs, compare=_compare_dense, n=n, k=k, routed_rows=m)


# quantizers --------------------------------------------------------------------------------
def quant_bytes(op: str, m: int, k: int) -> ByteModel:
    """act_quant (block 128, FP32 power-of-two scales): read ``2*M*K``, write ``M*K`` codes
    + ``4*M*K/128`` scales; fp4_quant (MXFP4, block 32): read ``2*M*K``, write ``M*K/2``
    + ``M*K/32`` E8M0 bytes."""
    if op == "act_quant":
        return ByteModel(weight_bytes=0, scale_bytes=4 * m * k // 128, act_bytes=2 * m * k, out_bytes=m * k, flops=0)
    return ByteModel(weight_bytes=0, scale_bytes=m * k // 32, act_bytes=2 * m * k, out_bytes=m * k // 2, flops=0)


def _build_quant(case: OpCase, device: torch.device) -> OpProblem:
    from ..formats.fp4 import dequantize_mxfp4  # noqa: PLC0415
    from ..formats.fp8 import dequantize_fp8_groups  # noqa: PLC0415
    from ..reference.quant import act_quant_ref, fp4_quant_ref  # noqa: PLC0415

    p = case.p
    m, k, op = p["m"], p["k"], case.family
    x = (torch.randn(m, k, generator=_gen(case.seed, op)) * 3).to(torch.bfloat16).to(device)
    if op == "act_quant":
        ref = lambda: act_quant_ref(x, 128, "ue8m0")  # noqa: E731
        deq = lambda o: dequantize_fp8_groups(o[0], o[1], 128)  # noqa: E731
    else:
        ref = lambda: fp4_quant_ref(x, None, "ue8m0")  # noqa: E731
        deq = lambda o: dequantize_mxfp4(o[0], o[1])  # noqa: E731
    return OpProblem(case=case, device=device, inputs={"x": x}, bytes_model=quant_bytes(op, m, k),
                     ref_fns={"default": ref}, compare=_compare_quant(deq), n=k, k=k, routed_rows=m)


# sparse attention --------------------------------------------------------------------------
def attn_bytes(b: int, s: int, h: int, d: int, topk: int) -> ByteModel:
    """Gathered KV rows ``b*s*topk*d*2`` (every slot's row counted, as the kernel reads them),
    q ``b*s*h*d*2`` and indices ``b*s*topk*4`` read, out ``b*s*h*d*2`` written.
    FLOPs ``4*b*s*h*topk*d`` (QK^T and PV)."""
    return ByteModel(weight_bytes=b * s * topk * d * 2, scale_bytes=b * s * topk * 4, act_bytes=b * s * h * d * 2,
                     out_bytes=b * s * h * d * 2, flops=4 * b * s * h * topk * d)


def _build_attn(case: OpCase, device: torch.device) -> OpProblem:
    from ..reference.attention import sparse_attn_ref  # noqa: PLC0415

    p = case.p
    b, s, h, d, topk, n = p["b"], p["s"], p["h"], p["d"], p["topk"], p["n"]
    gd = torch.Generator(device=device)
    gd.manual_seed(case.seed)
    q = torch.randn(b, s, h, d, generator=gd, device=device).to(torch.bfloat16)
    kv = torch.empty(b, n, d, dtype=torch.bfloat16, device=device)
    for i in range(b):
        kv[i] = torch.randn(n, d, generator=gd, device=device).to(torch.bfloat16)
    idx = torch.randint(0, n, (b, s, topk), generator=gd, device=device, dtype=torch.int32)
    sink = torch.randn(h, generator=gd, device=device)
    scale = 1.0 / math.sqrt(d)
    inputs = {"q": q, "kv": kv, "attn_sink": sink, "topk_idxs": idx, "softmax_scale": scale}
    return OpProblem(case=case, device=device, inputs=inputs, bytes_model=attn_bytes(b, s, h, d, topk),
                     ref_fns={"default": lambda: sparse_attn_ref(q, kv, sink, idx, scale)},
                     compare=_compare_dense, n=d, k=topk, routed_rows=b * s)


# sinkhorn ----------------------------------------------------------------------------------
def sinkhorn_bytes(tokens: int, hc: int = 4) -> ByteModel:
    """Read ``tokens*(2+hc)*hc*4`` logits, write pre + post + comb ``tokens*(2hc + hc^2)*4``."""
    mix = (2 + hc) * hc
    return ByteModel(weight_bytes=0, scale_bytes=0, act_bytes=tokens * mix * 4, out_bytes=tokens * mix * 4, flops=0)


def _build_sinkhorn(case: OpCase, device: torch.device) -> OpProblem:
    from ..reference.sinkhorn import hc_split_sinkhorn_ref  # noqa: PLC0415

    p = case.p
    t, hc, iters = p["tokens"], p["hc"], p["iters"]
    g = _gen(case.seed, "hc")
    mix = (2 + hc) * hc
    mixes = torch.randn(t, mix, generator=g).to(device)
    hc_scale = (0.5 + torch.rand(3, generator=g)).to(device)
    hc_base = (0.1 * torch.randn(mix, generator=g)).to(device)
    inputs = {"mixes": mixes, "hc_scale": hc_scale, "hc_base": hc_base, "hc": hc, "iters": iters}
    return OpProblem(case=case, device=device, inputs=inputs, bytes_model=sinkhorn_bytes(t, hc),
                     ref_fns={"default": lambda: hc_split_sinkhorn_ref(mixes, hc_scale, hc_base, hc, iters)},
                     compare=_compare_tuple, n=mix, routed_rows=t)


_BUILDERS: dict[str, Callable[[OpCase, torch.device], OpProblem]] = {
    "decode_oc": _build_decode, "fp8_gemm": _build_gemm, "fp4_gemm": _build_gemm,
    "act_quant": _build_quant, "fp4_quant": _build_quant, "sparse_attn": _build_attn,
    "hc_split_sinkhorn": _build_sinkhorn,
}


def build_op_problem(case: OpCase, device: torch.device | str) -> OpProblem:
    return _BUILDERS[case.family](case, torch.device(device))


def clear_op_caches() -> None:
    _MX_CACHE.clear()


# -- providers -----------------------------------------------------------------------------
class OpProvider:
    """Same protocol as `lowbit.bench.providers.Provider`, for one op family.

    group: what ``--providers`` matches (``lowbit`` / ``humming`` / ``torch``);
    baseline: this provider is the family's comparison point (``speedup_vs_baseline``);
    ref_key: which reference of the problem its output is checked against."""

    name: ClassVar[str] = ""
    group: ClassVar[str] = "lowbit"
    baseline: ClassVar[bool] = False
    ref_key: ClassVar[str] = "default"
    needs_cuda: ClassVar[bool] = False
    graph_capturable: ClassVar[bool] = True  # as `lowbit.bench.providers.Provider.graph_capturable`

    def __init__(self) -> None:
        self._call: Callable[[], Any] | None = None
        self._config: dict[str, Any] = {}

    def unavailable_reason(self) -> str | None:
        if self.needs_cuda and not torch.cuda.is_available():
            return "needs a CUDA GPU"
        return None

    def supports(self, problem: OpProblem) -> str | None:
        if self.needs_cuda and problem.device.type != "cuda":
            return "needs CUDA tensors"
        return None

    def prepare(self, problem: OpProblem) -> None:
        raise NotImplementedError

    def _warm(self, problem: OpProblem) -> None:
        if problem.device.type == "cuda":
            self._call()  # compile / JIT outside the timed region
            torch.cuda.synchronize(problem.device)

    def run(self) -> Any:
        if self._call is None:
            raise RuntimeError(f"provider {self.name}: run() before prepare()")
        return self._call()

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def release(self) -> None:
        self._call = None

    def clear(self) -> None:
        self._call = None


def _cfg_dict(cfg: Any) -> dict[str, Any]:
    if cfg is None:
        return {}
    if hasattr(cfg, "__dataclass_fields__"):
        return {k: getattr(cfg, k) for k in cfg.__dataclass_fields__}
    return {"config": str(cfg)}


# decode_oc ---------------------------------------------------------------------------------
class _DecodeBase(OpProvider):
    _packed: dict[tuple, Any]

    def _cached_pack(self, problem: OpProblem, tag: str, pack) -> tuple[Any, Any]:
        """(pack(w13), pack(w2)) of the problem's weights, re-packed only when they change."""
        w13, w2 = problem.inputs["w13"], problem.inputs["w2"]
        key = (tag, w13.codes.data_ptr(), w2.codes.data_ptr())
        if key not in self._packed:
            self._packed.clear()
            self._packed[key] = (pack(w13), pack(w2))
        return self._packed[key]

    def _int4_packed(self, problem: OpProblem) -> tuple[Any, Any]:
        from ..formats.w4a16 import pack_w4a16  # noqa: PLC0415

        return self._cached_pack(problem, "indexed", lambda w: pack_w4a16(w, profile="indexed"))

    def _mxfp8_interleaved(self, problem: OpProblem) -> tuple[Any, Any]:
        from ..formats.moe_mxfp8 import pack_mxfp8_experts  # noqa: PLC0415

        return self._cached_pack(problem, "k256", lambda w: pack_mxfp8_experts((w.codes, w.scales_e8m0),
                                                                                layout="k256-interleaved"))

    def clear(self) -> None:
        super().clear()
        self._packed.clear()


class DecodeLowbit(_DecodeBase):
    """`moe_decode`: output-centric gate_up + down, combine folded into down."""

    name = "lowbit"

    def __init__(self) -> None:
        super().__init__()
        self._packed = {}

    def prepare(self, problem: OpProblem) -> None:
        from ..kernels.moe_decode.op import moe_decode, moe_decode_config  # noqa: PLC0415
        from ..runtime.device import is_sm90_native  # noqa: PLC0415

        i = problem.inputs
        native = is_sm90_native(i["hidden"].device)
        fmt = i["fmt"]
        if fmt == "int4":
            w13, w2 = self._int4_packed(problem)
        elif native:  # MXFP8 on sm_90: the mma engine's layout of the same codes, re-laid once
            w13, w2 = self._mxfp8_interleaved(problem)
            fmt = "mxfp8_k256"
        else:
            w13, w2 = i["w13"], i["w2"]
        hidden, ids, tw = i["hidden"], i["topk_ids"], i["topk_weights"]
        cfg = moe_decode_config(hidden.shape[0], ids.shape[1], w13.num_experts, w13.k, w13.n // 2, fmt, native)
        self._config = _cfg_dict(cfg)
        out = torch.empty(hidden.shape, dtype=torch.bfloat16, device=hidden.device)
        self._call = lambda: moe_decode(hidden, ids, tw, w13, w2, out=out, config=cfg)
        self._warm(problem)


class DecodeLowbitIndexed(_DecodeBase):
    """`lowbit.moe_experts` on its indexed path: routing + `w4a16_indexed` gate_up + `silu_mul` +
    down + `combine_topk`, all in the timed call (INT4 only). ``lowbit-auto``: the path the
    layer picks for the batch (`moe_experts_path`)."""

    name = "lowbit-indexed"
    path = "indexed"

    def __init__(self) -> None:
        super().__init__()
        self._packed = {}

    def supports(self, problem: OpProblem) -> str | None:
        return None if problem.inputs["fmt"] == "int4" else "the indexed W4A16 GEMM takes INT4 weights only"

    def prepare(self, problem: OpProblem) -> None:
        from ..layers.moe import indexed_configs, moe_experts, moe_experts_path  # noqa: PLC0415

        i = problem.inputs
        w13, w2 = self._int4_packed(problem)
        hidden, ids, tw = i["hidden"], i["topk_ids"], i["topk_weights"]
        path = self.path if self.path != "auto" else moe_experts_path(hidden.shape[0])[0]
        self._config = {"path": path}
        if path == "indexed":
            c1, c2 = indexed_configs(hidden, ids.shape[1], w13, w2)
            self._config.update(gate_up=_cfg_dict(c1), down=_cfg_dict(c2))
        out = torch.empty(hidden.shape, dtype=torch.bfloat16, device=hidden.device)
        self._call = lambda: moe_experts(hidden, ids, tw, w13, w2, out=out, path=path)
        self._warm(problem)


class DecodeLowbitAuto(DecodeLowbitIndexed):
    name = "lowbit-auto"
    path = "auto"


class DecodeHummingIndexed(OpProvider):
    """Humming's indexed GEMMs in the same layer composition as ``lowbit-indexed`` (routing by
    lowbit's builder with Humming's heuristic block sizes, lowbit's `silu_mul` and
    `combine_topk` between and after them: only the GEMMs differ)."""

    name = "humming-indexed"
    group = "humming"
    baseline = True
    needs_cuda = True

    def __init__(self) -> None:
        super().__init__()
        self._layers: dict[tuple, Any] = {}

    def unavailable_reason(self) -> str | None:
        from .providers import HummingProvider  # noqa: PLC0415

        return HummingProvider().unavailable_reason()

    def supports(self, problem: OpProblem) -> str | None:
        r = super().supports(problem)
        return r or (None if problem.inputs["fmt"] == "int4" else "Humming provider set up for INT4 only")

    def _layer(self, q, device):
        from .providers import humming_weight_tensors  # noqa: PLC0415

        key = (q.codes.data_ptr(), tuple(q.codes.shape))
        if key not in self._layers:
            if len(self._layers) >= 2:
                self._layers.pop(next(iter(self._layers)))
            layer_mod = importlib.import_module("humming.layer")
            e, n, k = q.codes.shape
            with torch.device(device):
                layer = layer_mod.HummingLayer(
                    shape_n=n, shape_k=k, num_experts=e, torch_dtype=torch.bfloat16,
                    weight_config={"dtype": "uint4", "group_size": 32, "scale_dtype": "bfloat16"})
            layer.load_from_tensors(humming_weight_tensors(q))
            layer.transform()
            torch.cuda.synchronize(device)
            self._layers[key] = layer
        return self._layers[key]

    def prepare(self, problem: OpProblem) -> None:
        from ..kernels.moe_elementwise import combine_topk, silu_mul  # noqa: PLC0415

        tune = importlib.import_module("humming.tune")
        i = problem.inputs
        hidden, ids, tw = i["hidden"], i["topk_ids"], i["topk_weights"]
        t, top_k = ids.shape
        e = problem.case.num_experts
        l1, l2 = self._layer(i["w13"], problem.device), self._layer(i["w2"], problem.device)
        routes = t * top_k
        tun1 = tune.get_heuristics_config(l1.humming_config, shape_m=routes, gemm_type="indexed")
        tun2 = tune.get_heuristics_config(l2.humming_config, shape_m=routes, gemm_type="indexed")
        b1, b2 = int(tun1["block_shape"][0]), int(tun2["block_shape"][0])
        self._config = {"gate_up_block_shape": list(tun1.get("block_shape", [])),
                        "down_block_shape": list(tun2.get("block_shape", []))}
        j1, j2, comp = json.dumps(tun1), json.dumps(tun2), json.dumps({"gemm_type": "indexed"})
        n1, n2 = i["w13"].codes.shape[1], i["w2"].codes.shape[1]
        gu = torch.empty(routes, n1, dtype=torch.bfloat16, device=hidden.device)
        y = torch.empty(routes, n2, dtype=torch.bfloat16, device=hidden.device)

        def call() -> torch.Tensor:
            r1 = routing.moe_align_block_size(ids, b1, e)
            r2 = r1 if b2 == b1 else routing.moe_align_block_size(ids, b2, e)
            l1(hidden, outputs=gu, compute_config=comp, tuning_config=j1, sorted_ids=r1.sorted_token_ids,
               expert_ids=r1.expert_ids, num_tokens_padded=r1.num_tokens_post_padded, top_k=top_k)
            act = silu_mul(gu)
            l2(act, outputs=y, compute_config=comp, tuning_config=j2, sorted_ids=r2.sorted_token_ids,
               expert_ids=r2.expert_ids, num_tokens_padded=r2.num_tokens_post_padded, top_k=1)
            return combine_topk(y, ids, tw, e)

        self._call = call
        self._warm(problem)

    def clear(self) -> None:
        super().clear()
        self._layers.clear()


# GEMMs -------------------------------------------------------------------------------------
class Fp8GemmLowbit(OpProvider):
    name = "lowbit"

    def prepare(self, problem: OpProblem) -> None:
        from ..kernels.block_scaled.fp8 import fp8_gemm, fp8_gemm_config, gluon_capable  # noqa: PLC0415
        from ..runtime.device import num_sms  # noqa: PLC0415

        i = problem.inputs
        cfg = (fp8_gemm_config(i["m"], i["n"], i["k"], num_sms(i["a"].device), gluon_capable(i["a"], i["b"]))
               if problem.device.type == "cuda" else None)
        self._config = _cfg_dict(cfg)
        out = torch.empty(i["m"], i["n"], dtype=torch.bfloat16, device=problem.device)
        a, a_s, b, b_s = i["a"], i["a_s"], i["b"], i["b_s"]
        self._call = lambda: fp8_gemm(a, a_s, b, b_s, out=out, config=cfg)
        self._warm(problem)


class Fp8GemmScaledMM(OpProvider):
    """``torch._scaled_mm`` with per-tensor (unit) scales on the same FP8 data: the library
    FP8 GEMM of this torch. It cannot apply DeepSeek's 1x128 / 128x128 block scales, so its
    output is checked against the unscaled FP8 product and only its throughput compares."""

    name = "torch-scaled-mm"
    group = "torch"
    baseline = True
    ref_key = "unscaled"
    needs_cuda = True

    def prepare(self, problem: OpProblem) -> None:
        i = problem.inputs
        one = torch.ones((), dtype=torch.float32, device=problem.device)
        a, bt = i["a"], i["b"].t()  # [K, N] column-major, as _scaled_mm wants its second operand
        self._config = {"scales": "per-tensor (block scales not supported by torch._scaled_mm)"}
        self._call = lambda: torch._scaled_mm(a, bt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        self._warm(problem)


class Fp4GemmLowbit(OpProvider):
    name = "lowbit"

    def prepare(self, problem: OpProblem) -> None:
        from ..kernels.block_scaled.fp4 import fold_capable, fp4_gemm, fp4_gemm_config, mma_capable  # noqa: PLC0415
        from ..runtime.device import num_sms  # noqa: PLC0415

        i = problem.inputs
        cfg = (fp4_gemm_config(i["m"], i["n"], i["k"], 128, num_sms(i["a"].device), fold_capable(i["a"]),
                               mma_capable(i["a"], i["a_s"], i["b"], i["b_s"], 128))
               if problem.device.type == "cuda" else None)
        self._config = _cfg_dict(cfg)
        out = torch.empty(i["m"], i["n"], dtype=torch.bfloat16, device=problem.device)
        a, a_s, b, b_s = i["a"], i["a_s"], i["b"], i["b_s"]
        self._call = lambda: fp4_gemm(a, a_s, b, b_s, 128, out=out, config=cfg)
        self._warm(problem)


class Fp4GemmLowbitFolded(OpProvider):
    """`fp4_gemm` on a weight folded once outside the timed region (`fold_fp4_weight`, as
    Humming's ``transform()`` prepares its weight at load time): the call is the GEMM, plus
    the exact fixup only where the fold left a group out."""

    name = "lowbit-folded"

    def prepare(self, problem: OpProblem) -> None:
        from ..kernels.block_scaled.fp4 import fold_fp4_weight, fp4_gemm  # noqa: PLC0415

        i = problem.inputs
        w = fold_fp4_weight(i["b"], i["b_s"])
        out = torch.empty(i["m"], i["n"], dtype=torch.bfloat16, device=problem.device)
        a, a_s = i["a"], i["a_s"]
        self._config = {"weight": f"folded once (needs_fixup={w.needs_fixup})"}
        self._call = lambda: fp4_gemm(a, a_s, w, None, 128, out=out)
        self._warm(problem)


class Fp4GemmHumming(OpProvider):
    """Humming 0.1.20 dense W4A8: ``HummingLayer`` with ``weight_config={"quant_method":
    "mxfp4"}`` (``uint8 [N, K/2]`` E2M1 pairs, E8M0 ``uint8 [N, K/32]``) and ``input_config``
    FP8 E4M3 with dynamic 1x128 groups; fed the exact BF16 values of our FP8 activations
    (`_fp8_activations` makes its re-quantization give back the same codes), so its timed
    call includes its own activation quantization."""

    name = "humming-w4a8"
    group = "humming"
    baseline = True
    needs_cuda = True

    def unavailable_reason(self) -> str | None:
        from .providers import HummingProvider  # noqa: PLC0415

        return HummingProvider().unavailable_reason()

    def prepare(self, problem: OpProblem) -> None:
        layer_mod = importlib.import_module("humming.layer")
        tune = importlib.import_module("humming.tune")
        i = problem.inputs
        m, n, k = i["m"], i["n"], i["k"]
        with torch.device(problem.device):
            layer = layer_mod.HummingLayer(
                shape_n=n, shape_k=k, torch_dtype=torch.bfloat16, weight_config={"quant_method": "mxfp4"},
                input_config={"quant_method": "humming", "dtype": "float8e4m3", "group_size": 128,
                              "quant_mode": "dynamic_group"})
        layer.load_from_tensors({"weight": i["b"].clone(), "weight_scale": i["b_s"].clone()})
        layer.transform()
        tuning = tune.get_heuristics_config(layer.humming_config, shape_m=m, gemm_type="dense")
        self._config = {"block_shape": list(tuning.get("block_shape", [])),
                        "tuning": json.loads(json.dumps(tuning, default=str)),
                        "note": "time includes Humming's dynamic FP8 quantization of the BF16 input"}
        a_s_full = i["a_s"].repeat_interleave(128, dim=1)[:, :k]
        x = (i["a"].float() * a_s_full).to(torch.bfloat16)
        out = torch.empty(m, n, dtype=torch.bfloat16, device=problem.device)
        tj, cj = json.dumps(tuning), json.dumps({"gemm_type": "dense"})
        self._layer = layer
        self._call = lambda: layer(x, outputs=out, compute_config=cj, tuning_config=tj)
        self._warm(problem)

    def clear(self) -> None:
        super().clear()
        self._layer = None


# quantizers --------------------------------------------------------------------------------
class QuantLowbit(OpProvider):
    name = "lowbit"

    def prepare(self, problem: OpProblem) -> None:
        from ..kernels.quant import act_quant, fp4_quant  # noqa: PLC0415

        x = problem.inputs["x"]
        m, k = x.shape
        if problem.case.family == "act_quant":
            q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
            s = torch.empty(m, k // 128, dtype=torch.float32, device=x.device)
            self._call = lambda: act_quant(x, 128, "ue8m0", out=q, out_scale=s)
        else:
            q = torch.empty(m, k // 2, dtype=torch.uint8, device=x.device)
            s = torch.empty(m, k // 32, dtype=torch.uint8, device=x.device)
            self._call = lambda: fp4_quant(x, None, "ue8m0", out=q, out_scale=s)
        self._config = {"block": 128 if problem.case.family == "act_quant" else 32, "scale_fmt": "ue8m0"}
        self._warm(problem)


class QuantTorchRef(OpProvider):
    """The PyTorch reference quantizer, run on the problem's device (the plain-torch baseline)."""

    name = "torch-ref"
    group = "torch"
    baseline = True
    # the references check their input on the host (a NaN readback), which graph capture refuses
    graph_capturable = False

    def prepare(self, problem: OpProblem) -> None:
        from ..reference.quant import act_quant_ref, fp4_quant_ref  # noqa: PLC0415

        x = problem.inputs["x"]
        if problem.case.family == "act_quant":
            self._call = lambda: act_quant_ref(x, 128, "ue8m0")
        else:
            self._call = lambda: fp4_quant_ref(x, None, "ue8m0")
        self._warm(problem)


# sparse attention --------------------------------------------------------------------------
class AttnLowbit(OpProvider):
    name = "lowbit"

    def prepare(self, problem: OpProblem) -> None:
        from ..kernels.attention.sparse_attn import gluon_capable, sparse_attn, sparse_attn_config  # noqa: PLC0415

        i = problem.inputs
        b, s, h, _ = i["q"].shape
        cfg = sparse_attn_config(b, s, h, problem.device, i["topk_idxs"].shape[2], gluon_capable(i["q"], i["kv"]))
        self._config = _cfg_dict(cfg)
        out = torch.empty(i["q"].shape, dtype=torch.bfloat16, device=problem.device)
        self._call = lambda: sparse_attn(i["q"], i["kv"], i["attn_sink"], i["topk_idxs"], i["softmax_scale"],
                                         out=out, config=cfg)
        self._warm(problem)


def sparse_attn_torch(q, kv, attn_sink, topk_idxs, softmax_scale) -> torch.Tensor:
    """The reference's math in plain torch ops, gathering the KV rows in BF16 first (the
    reference converts the whole KV cache to FP32, which measures that conversion instead)."""
    b, s, h, d = q.shape
    valid = topk_idxs >= 0
    rows = topk_idxs.long().clamp(min=0)
    batch = torch.arange(b, device=kv.device).view(b, 1, 1)
    kv_sel = kv[batch, rows].float()  # [b, s, topk, d]
    z = torch.einsum("bshd,bstd->bsht", q.float(), kv_sel) * softmax_scale
    z = z.masked_fill(~valid[:, :, None, :], float("-inf"))
    sink = attn_sink.float().view(1, 1, h)
    m = torch.maximum(z.amax(dim=-1), sink)
    p = torch.exp(z - m[..., None])
    denom = p.sum(dim=-1) + torch.exp(sink - m)
    out = torch.einsum("bsht,bstd->bshd", p, kv_sel) / denom[..., None]
    return out.to(torch.bfloat16)


class AttnTorch(OpProvider):
    name = "torch-gather"
    group = "torch"
    baseline = True

    def prepare(self, problem: OpProblem) -> None:
        i = problem.inputs
        self._config = {"impl": "lowbit.bench.ops.sparse_attn_torch (reference math, BF16 gather)"}
        self._call = lambda: sparse_attn_torch(i["q"], i["kv"], i["attn_sink"], i["topk_idxs"], i["softmax_scale"])
        self._warm(problem)


# sinkhorn ----------------------------------------------------------------------------------
class SinkhornLowbit(OpProvider):
    name = "lowbit"

    def prepare(self, problem: OpProblem) -> None:
        from ..kernels.sinkhorn import hc_split_sinkhorn, sinkhorn_config  # noqa: PLC0415

        i = problem.inputs
        cfg = sinkhorn_config(i["mixes"].shape[0], i["hc"])
        self._config = _cfg_dict(cfg)
        self._call = lambda: hc_split_sinkhorn(i["mixes"], i["hc_scale"], i["hc_base"], i["hc"], i["iters"], config=cfg)
        self._warm(problem)


class SinkhornTorchRef(OpProvider):
    name = "torch-ref"
    group = "torch"
    baseline = True

    def prepare(self, problem: OpProblem) -> None:
        from ..reference.sinkhorn import hc_split_sinkhorn_ref  # noqa: PLC0415

        i = problem.inputs
        self._call = lambda: hc_split_sinkhorn_ref(i["mixes"], i["hc_scale"], i["hc_base"], i["hc"], i["iters"])
        self._warm(problem)


#: family -> its providers, in table order
FAMILIES: dict[str, tuple[type[OpProvider], ...]] = {
    "decode_oc": (DecodeLowbit, DecodeLowbitIndexed, DecodeLowbitAuto, DecodeHummingIndexed),
    "fp8_gemm": (Fp8GemmLowbit, Fp8GemmScaledMM),
    "fp4_gemm": (Fp4GemmLowbit, Fp4GemmLowbitFolded, Fp4GemmHumming),
    "act_quant": (QuantLowbit, QuantTorchRef),
    "fp4_quant": (QuantLowbit, QuantTorchRef),
    "sparse_attn": (AttnLowbit, AttnTorch),
    "hc_split_sinkhorn": (SinkhornLowbit, SinkhornTorchRef),
}


def op_providers(family: str, groups: list[str] | tuple[str, ...] | None = None) -> list[type[OpProvider]]:
    """The provider classes of `family` whose group is in `groups` (all when None)."""
    return [p for p in FAMILIES[family] if groups is None or p.group in groups or p.name in groups]


# -- summaries -----------------------------------------------------------------------------
def crossover_summary(rows: list[dict[str, Any]]) -> str:
    """For the INT4 decode cases: per token count, the output-centric (``lowbit``), indexed
    (``lowbit-indexed``) and automatic (``lowbit-auto``) layer times, which of the first two
    wins, and the first batch from which the
    indexed path wins. fp4_gemm vs fp8_gemm on the same (M, N, K) too. '' when no such rows."""
    lines = []
    dec: dict[int, dict[str, float]] = {}
    for r in rows:
        if r.get("layout") == "decode_oc" and r.get("status") == "ok" and "int4" in r["case"] and r.get("median_us"):
            dec.setdefault(int(r["tokens"]), {})[r["provider"]] = r["median_us"]
    if dec:
        lines.append("decode_oc INT4 layer: tokens  output-centric us  indexed us  auto us  humming-indexed us  faster")
        first = None
        for t in sorted(dec):
            d = dec[t]
            oc, ix, au, hu = d.get("lowbit"), d.get("lowbit-indexed"), d.get("lowbit-auto"), d.get("humming-indexed")
            win = "-" if oc is None or ix is None else ("indexed" if ix < oc else "output-centric")
            if win == "indexed" and first is None:
                first = t
            f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
            lines.append(f"  {t:>5d}  {f(oc):>17s}  {f(ix):>10s}  {f(au):>7s}  {f(hu):>18s}  {win}")
        lines.append(f"  crossover: indexed path first faster at {first} tokens" if first is not None
                     else "  crossover: the output-centric path is faster at every measured batch (or not measured)")
    fp8 = {(r["tokens"], r["n"], r["k"]): r["median_us"] for r in rows
           if r.get("layout") == "fp8_gemm" and r["provider"] == "lowbit" and r.get("median_us")}
    fp4 = [r for r in rows if r.get("layout") == "fp4_gemm" and r["provider"] == "lowbit" and r.get("median_us")]
    if fp8 and fp4:
        lines.append("fp4_gemm / fp8_gemm rate (lowbit, same M N K; target >= 0.70 compute-bound):")
        for r in fp4:
            base = fp8.get((r["tokens"], r["n"], r["k"]))
            if base:
                lines.append(f"  M={r['tokens']} N={r['n']} K={r['k']}: fp8 {base:.1f} us, fp4 {r['median_us']:.1f} us, "
                             f"fp4 rate = {base / r['median_us']:.2f} x fp8")
    return "\n".join(lines)


def is_op_case(case: Any) -> bool:
    return isinstance(case, OpCase)


def is_moe_case(case: Any) -> bool:
    return isinstance(case, BenchCase)
