"""A warp-specialized register-A grouped W4A16 kernel, against the production one (a probe).

    python scripts/probes/ws_grouped.py            # on the H200: time + compare, Kimi EP8 contiguous
    python scripts/probes/ws_grouped.py --compile  # anywhere: build for sm_90a, report registers

Status: written in the fifth session after the device budget was spent; it compiles for sm_90a
(`--compile`) but **has not run on a GPU**. Run it first next time.

Why. The production main loop (`w4a16_sm90._rs_mainloop`) refills the activation stage only
after the step's wgmmas retire and every warp passes a CTA barrier, and at the 128x128 prefill
tile only 2 stages of 82 KB fit. So the next step's TMA is issued late and the two consumer
warpgroups wait for each other every step. The probes found the prefill skeleton without loads
and dequantization at 87% of the BF16 rate, and the kernel itself at 63% (fifth session). Here
one producer warp issues every TMA as soon as its stage is released by *mbarriers*: the weight
stage is released once it is dequantized, the activation stage once the wgmmas that read it
retire. No CTA barrier is left in the loop, and each consumer warpgroup runs at its own pace.
The arithmetic is the production kernel's (same dequantization, same wgmma order), so the
outputs must be bit-identical; the probe checks that.

Reuses `w4a16_sm90`'s helpers (`_load_weights`, `_load_acts`, `_dequant_regs`, `_issue_regs`,
`_grouped_block`, `_grouped_store`, `_weight_descs`, `_x_layout`); contiguous and masked layouts.
"""
import os
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from lowbit.kernels import w4a16_sm90 as k


@gluon.jit
def _ws_consumer(xs, wring, sring, wready, wempty, xready, xempty, K, mma: gl.constexpr, BW: gl.constexpr,
                 BR: gl.constexpr, STAGES: gl.constexpr):
    """Dequantize step k+1 while step k's wgmmas run (as `_rs_mainloop`), releasing each stage by
    mbarrier: the words and scales once dequantized, the activations once their wgmmas retire."""
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    nk = gl.cdiv(K, 256)
    acc = gl.zeros([BW, BR], gl.float32, mma)
    mbarrier.wait(wready.index(0), 0)
    w0, w1, w2, w3, w4, w5, w6, w7 = k._dequant_regs(wring, sring, 0, dot_a)
    fence_async_shared()  # generic-proxy reads of stage 0 ordered before the producer's TMA refill
    mbarrier.arrive(wempty.index(0), count=1)
    for kt in range(nk - 1):
        s = kt % STAGES
        mbarrier.wait(xready.index(s), (kt // STAGES) & 1)
        acc = k._issue_regs(xs, s, acc, w0, w1, w2, w3, w4, w5, w6, w7)
        s1 = (kt + 1) % STAGES
        mbarrier.wait(wready.index(s1), ((kt + 1) // STAGES) & 1)
        v0, v1, v2, v3, v4, v5, v6, v7 = k._dequant_regs(wring, sring, s1, dot_a)
        fence_async_shared()
        mbarrier.arrive(wempty.index(s1), count=1)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
        mbarrier.arrive(xempty.index(s), count=1)
        w0, w1, w2, w3, w4, w5, w6, w7 = v0, v1, v2, v3, v4, v5, v6, v7
    sl = (nk - 1) % STAGES
    mbarrier.wait(xready.index(sl), ((nk - 1) // STAGES) & 1)
    acc = k._issue_regs(xs, sl, acc, w0, w1, w2, w3, w4, w5, w6, w7)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
    return (acc,)  # a partition returns a tuple (Triton 3.6 flattens it)


@gluon.jit
def _ws_producer(x_desc, w_desc, s_desc, xs, wring, sring, wready, wempty, xready, xempty, r0, wrow, srow, n0, K,
                 STAGES: gl.constexpr):
    """One warp: step k's words + scales into stage k % STAGES once the consumers released it,
    then its activation boxes once theirs is released (mbarriers start with phase 1 complete,
    so the first STAGES waits pass)."""
    nk = gl.cdiv(K, 256)
    x_l: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, 1], [1, 0])  # unused without GATHER
    for kt in range(nk):
        s = kt % STAGES
        ph = (kt // STAGES) & 1
        mbarrier.wait(wempty.index(s), ph ^ 1)
        k._load_weights(w_desc, s_desc, wrow, srow, n0, kt, wready.index(s), wring, sring, s, True)
        mbarrier.wait(xempty.index(s), ph ^ 1)
        k._load_acts(x_desc, 0, 0, K, r0, kt, xready.index(s), xs, s, True, False, x_l)


@gluon.jit
def _w4a16_grouped_ws_kernel(
    x_desc, w_desc, s_desc, c_ptr, route_ptr,
    N, K, max_m, stride_cm,
    STAGES: gl.constexpr, MASKED: gl.constexpr, num_warps: gl.constexpr,
):
    """`w4a16_sm90._w4a16_grouped_rs_kernel` with a producer warp (same grid, routing, output)."""
    BR: gl.constexpr = x_desc.block_type.shape[0]
    BW: gl.constexpr = w_desc.block_type.shape[0]
    e, r0, valid, live = k._grouped_block(route_ptr, gl.program_id(0), max_m, BR, MASKED)
    if not live:
        return
    n0 = gl.program_id(1) * BW
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR, 16])
    xs = gl.allocate_shared_memory(x_desc.dtype, [STAGES * 8, BR, 32], x_desc.layout)
    wring, sring, wready = k._weight_ring(w_desc, s_desc, STAGES)
    wempty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    xready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    xempty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(wempty.index(i), count=1)
        mbarrier.init(xready.index(i), count=1)
        mbarrier.init(xempty.index(i), count=1)
    wrow = e * N + n0
    srow = e * gl.cdiv(K, 256) * 8
    acc = gl.warp_specialize([
        (_ws_consumer, (xs, wring, sring, wready, wempty, xready, xempty, K, mma, BW, BR, STAGES)),
        (_ws_producer, (x_desc, w_desc, s_desc, xs, wring, sring, wready, wempty, xready, xempty, r0, wrow, srow, n0,
                        K, STAGES)),
    ], [1], [40])[0]
    k._grouped_store(acc, c_ptr, route_ptr, r0, n0, e, max_m, valid, N, stride_cm, MASKED)


def ws_launch(a, w, route, out, tile, max_m: int = 0) -> None:
    """Same operands as `w4a16_sm90.w4a16_grouped_sm90_launch` (a `GLUON_RS_TILES` tile)."""
    bw, br, warps, stages = tile
    x_desc = TensorDescriptor(a, [a.shape[0], w.k], [a.stride(0), 1], [br, 32], k._x_layout(br))
    w_desc, s_desc = k._weight_descs(w, bw)
    blocks = w.num_experts * triton.cdiv(max_m, br) if max_m else a.shape[0] // br
    _w4a16_grouped_ws_kernel[(blocks, triton.cdiv(w.n, bw))](
        x_desc, w_desc, s_desc, out, route, w.n, w.k, max_m, out.stride(0),
        STAGES=stages, MASKED=bool(max_m), num_warps=warps)


def compile_report() -> None:
    """Build the probe kernel for sm_90a (no GPU needed) with the compile tier's checks."""
    from lowbit.kernels.compile_tier import KernelConfig, compile_sm90

    base = {c.name: c for c in k.compile_configs()}
    for bw, br, warps, stages in ((128, 128, 8, 2), (128, 64, 8, 3)):
        ref = base[f"w4a16_contiguous_sm90_gluon_rs[BW={bw},BR={br},w={warps},stages={stages}]"]
        cfg = KernelConfig(f"ws_contiguous[BW={bw},BR={br},w={warps},stages={stages}]", _w4a16_grouped_ws_kernel,
                           ref.signature, ref.constexprs, num_warps=warps, num_stages=1, expect_sass=("HGMMA",),
                           unaligned=ref.unaligned)
        r = compile_sm90(cfg)
        print(r.name, "ok" if r.ok else "FAILED", f"registers {r.registers} spills {r.spill_bytes} "
              f"smem {r.shared_bytes}", (r.error or "")[-2000:])


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from lowbit.bench.cases import make_weight
    from lowbit.bench.timing import measure
    from lowbit.formats.w4a16 import pack_w4a16_grouped

    E, H, I = 48, 7168, 2048
    n, kk = 2 * I, H
    for rows, tile in ((128, (128, 128, 8, 2)), (128, (128, 64, 8, 3)), (256, (128, 128, 8, 2))):
        w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="contiguous")
        a = torch.randn(E * rows, kk, device="cuda").to(torch.bfloat16)
        route = torch.arange(E, device="cuda", dtype=torch.int32).repeat_interleave(rows)
        outs, us = {}, {}
        ops = (a, w, route, tile)
        for name, fn in (("production", lambda o, p=ops: k.w4a16_grouped_sm90_launch(*p[:3], o, p[3], 0, regs_a=True)),
                         ("warp-specialized", lambda o, p=ops: ws_launch(*p[:3], o, p[3], 0))):
            out = torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
            fn(out)
            torch.cuda.synchronize()
            outs[name] = out.clone()
            us[name] = measure(lambda: fn(out), cuda_graph=True, rep_ms=30).median_us  # noqa: B023
        flops = 2 * E * rows * n * kk
        same = torch.equal(outs["production"], outs["warp-specialized"])
        print(f"contiguous gate_up {rows} rows/expert {tile}: production {us['production']:.1f} us "
              f"({flops / us['production'] / 1e6:.0f} TFLOP/s), warp-specialized {us['warp-specialized']:.1f} us "
              f"({flops / us['warp-specialized'] / 1e6:.0f} TFLOP/s), {us['production'] / us['warp-specialized']:.2f}x, "
              f"{'bit-identical' if same else 'OUTPUTS DIFFER'}", flush=True)


if __name__ == "__main__":
    compile_report() if "--compile" in sys.argv else main()
