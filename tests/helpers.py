"""Helpers shared by the test files: problem builders and device checks that more than one
family's tests use. Family-specific builders stay beside their tests."""

from __future__ import annotations

import torch

from lowbit.formats import QuantizedTensor, get_format, pack_mxfp8_experts
from lowbit.formats.fp4 import quantize_mxfp4
from lowbit.formats.fp8 import quantize_fp8_blocks, quantize_fp8_groups
from lowbit.formats.w4a16 import W4A16Weight, pack_w4a16, pack_w4a16_grouped
from lowbit.testing import assert_close, interpreter_active, poison_, random_topk_ids, random_topk_weights


# --------------------------------------------------------------------------- MoE experts
def moe_expert_weights(fmt: str, e: int, h: int, inter: int, gen: torch.Generator, device):
    """Random expert weights ``w13 [E, 2I, H]``, ``w2 [E, H, I]`` prepared for the MoE kernels.

    fmt: ``"int4"`` (`pack_w4a16`, profile "indexed"), ``"mxfp8"`` (natural layout) or
    ``"mxfp8_k256"`` (the mma engine's interleaved layout of the same codes). Returns (w13, w2
    prepared on `device`; q13, q2 the logical `QuantizedTensor`s on the CPU; r13, r2 the
    kernels' effective real weights on the CPU: INT4 dequantized to ``bf16((q - 8) * s)``,
    MXFP8 exactly)."""
    r13 = torch.randn(e, 2 * inter, h, generator=gen) * 0.05
    r2 = torch.randn(e, h, inter, generator=gen) * 0.05
    if fmt == "int4":
        int4 = get_format("int4_g32")
        q13, q2 = int4.quantize(r13), int4.quantize(r2)
        k13, k2 = pack_w4a16(q13).to(device), pack_w4a16(q2).to(device)
        eff = lambda q: q.dequantize().to(torch.bfloat16).float()  # noqa: E731
    else:
        layout = "k256-interleaved" if fmt == "mxfp8_k256" else "natural"
        k13 = pack_mxfp8_experts(r13, layout=layout).to(device)
        k2 = pack_mxfp8_experts(r2, layout=layout).to(device)
        q13, q2 = k13.as_quantized(), k2.as_quantized()
        eff = lambda q: q.dequantize()  # noqa: E731
    q13, q2 = (QuantizedTensor(q.codes.cpu(), q.scales.cpu(), q.fmt) for q in (q13, q2))
    return k13, k2, q13, q2, eff(q13), eff(q2)


def moe_edge_routing(m: int, k: int, e: int, gen: torch.Generator):
    """``(topk_ids int32 [m, k], topk_weights fp32 [m, k], ref_ids)``: distinct experts per token
    among the first E - 1 (the last expert gets no route), then the edges: a dropped slot (-1,
    token 1), an id past the local experts (token 4: dropped too), a token listing one expert
    twice (token 3: each slot counts), weights not summing to 1 (one negative, token 2).
    ref_ids: the ids with every dropped slot as -1 (what the reference takes). Needs m >= 5, k >= 3."""
    ids = random_topk_ids(m, k, e - 1, generator=gen)
    ids[1, 2] = -1
    ids[4, 0] = e + 3
    ids[3, 1] = ids[3, 0]
    tw = random_topk_weights(m, k, generator=gen) * 1.7
    tw[2, 1] = -0.4
    ref_ids = torch.where((ids >= 0) & (ids < e), ids, -1)
    return ids, tw, ref_ids

# ------------------------------------------------------------------------- block-scaled GEMMs
# (the block_scaled kernels' tests and the linear layer's)
FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)
E8M0 = getattr(torch, "float8_e8m0fnu", None)


def check_bf16_gemm(out: torch.Tensor, ref: torch.Tensor, name: str = "output") -> None:
    """A BF16 GEMM output against its FP32 reference: "bf16_out" (one RNE rounding, at most
    2**-8 relative per element) in relative Frobenius norm; on the interpreter (IEEE FP32 dots
    with the reference's promotion structure) also every element within half a bf16 ulp plus FP32
    summation slack. On the GPU the tensor cores' FP8 accumulation is not IEEE FP32 (DeepSeek-V3
    report), hence the elementwise bound only on the interpreter."""
    out = out.detach().float().cpu()
    assert_close(out, ref, "bf16_out", name)
    if interpreter_active():
        slack = 2.0**-8 * ref.abs() + 1e-6 * ref.abs().max()
        bad = (out - ref).abs() > slack
        assert not bad.any(), f"{name}: {int(bad.sum())} elements beyond half a bf16 ulp of the FP32 reference"


def fp8_acts(m: int, k: int, gen: torch.Generator, group: int = 128, scale_fmt: str | None = None):
    """FP8 activations ``[m, k]`` whose groups span several binades (scales differ group to
    group), with their FP32 scales ``[m, k / group]``."""
    x = torch.randn(m, k, generator=gen) * torch.exp2(torch.randint(-6, 7, (m, 1), generator=gen).float())
    x = x * torch.exp2(torch.randint(-3, 4, (1, k), generator=gen).float())
    return quantize_fp8_groups(x, group_size=group, scale_fmt=scale_fmt)


def fp8_weight(n: int, k: int, gen: torch.Generator, scale_fmt: str | None = None):
    """An FP8 weight ``[n, k]`` with 128x128 block scales."""
    return quantize_fp8_blocks(torch.randn(n, k, generator=gen) * 0.05, 128, scale_fmt)


def fp4_weight(n: int, k: int, gen: torch.Generator):
    """An MXFP4 weight (packed ``uint8 [n, k/2]``, E8M0 ``uint8 [n, k/32]``) whose group scales
    span 2**-4 .. 2**2."""
    w = torch.randn(n, k, generator=gen) * torch.exp2(torch.randint(-4, 3, (n, k // 32), generator=gen).float()
                                                      ).repeat_interleave(32, 1)
    return quantize_mxfp4(w)


def run_into_poisoned(fn, *args, m: int, n: int, device, **kw) -> torch.Tensor:
    """``fn(*args, out=out, **kw)`` into a NaN-poisoned bf16 ``[m, n]`` (unwritten elements show);
    checks the op returns `out` itself."""
    out = poison_(torch.empty(m, n, dtype=torch.bfloat16, device=device))
    res = fn(*args, out=out, **kw)
    assert res is out
    return out


# --------------------------------------------------------------------------- W4A16 GEMMs
INT4 = get_format("int4_g32")


def int4_experts(e: int, n: int, k: int, gen: torch.Generator, device, layout: str = "indexed",
                 scale: float = 0.05) -> tuple[QuantizedTensor, W4A16Weight]:
    """E experts of ``[n, k]`` INT4 group-32 weights (normal draws times `scale`, quantized on the
    CPU) and their prepared form for `layout` ("indexed", or "contiguous" / "masked") on `device`."""
    wq = INT4.quantize(torch.randn(e, n, k, generator=gen) * scale)
    packed = pack_w4a16(wq) if layout == "indexed" else pack_w4a16_grouped(wq, mode=layout)
    return wq, packed.to(device)


def indexed_problem(e: int, n: int, k: int, t: int, top_k: int, gen: torch.Generator, device,
                    hot: int | None = None) -> tuple[QuantizedTensor, W4A16Weight, torch.Tensor, torch.Tensor]:
    """An indexed MoE GEMM problem: (logical INT4 weights ``[e, n, k]``, packed on `device`,
    activations ``bf16 [t, k]``, top-k expert ids ``int32 [t, top_k]`` with distinct experts a
    token, all on expert `hot` when given)."""
    wq, pw = int4_experts(e, n, k, gen, device)
    a = torch.randn(t, k, generator=gen).to(torch.bfloat16)
    ids = random_topk_ids(t, top_k, e, generator=gen, hot_expert=hot)
    return wq, pw, a.to(device), ids.to(device)
