"""Hopper (sm_90a) Gluon kernel of `fp8_gemm` for prefill tiles: the K-block promotion of block
``k - 1`` overlapped with the tensor-core product of block ``k``.

Why it exists. `fp8_gemm`'s Triton kernel computes, per 128-deep K block, ``blk = a @ b^T``
(FP8 wgmma, FP32 result) and then ``acc += blk * (a_s * b_s)`` on the CUDA cores. Triton 3.6
waits for every wgmma before any non-MMA use of its result (``wgmma.wait_group 0`` in the PTX
of every variant we tried: a loop-carried previous product, a 2x-unrolled loop, TMA loads,
``tl.range(warp_specialize=True)``), so the tensor cores idle while the promotion FMAs run and
while the next block is issued: the H200 measured 629-634 TFLOP/s at M=4096 against 1271-1325
for ``torch._scaled_mm``'s per-tensor FP8 GEMM (docs/performance.md). Gluon exposes the wait:
here block ``k``'s wgmma is issued asynchronously, ``warpgroup_mma_wait(num_outstanding=1)``
retires block ``k - 1`` only, and its promotion runs while block ``k`` is on the tensor cores.

Structure (one partition, no warp specialization): a ``STAGES``-deep ring of TMA-loaded A and B
tiles in shared memory, one mbarrier per stage; the stage of block ``k - 1`` is refilled with
block ``k + STAGES - 1`` right after block ``k - 1``'s wgmma retired. TMA zero-fills rows and K
columns past the tensor bounds, so M, N and K tails need no masks until the store.
Semantics are `fp8_gemm`'s (same promotion order: ``acc += blk * (a_s * b_s)`` per K block).
With ``B_SCALE_PER_ROW`` (`fp4_gemm`'s fold engine) the weight scale is per weight row and K
block, ``b_s fp32 [N, ceil(K/128)]``, and the promotion is ``acc += blk * a_s[m] * b_s[n]``;
the flag off compiles to the same instructions as before it existed.

Status: compiled for sm_90a by the compile tier (QGMMA in the SASS, ``wgmma.wait_group 1`` in
the PTX); correct on the H200 (GPU tests) and the default for prefill shapes (M > 128, a grid
the 64x128 tile fills) on sm_90 with TMA-able operands: H200 M=4096 the 64x128 tile 1.02-1.07x
the Triton 128x128 tile, the 128x128 Gluon tile 0.96-0.99x (2026-11-29). Gluon does not run
under the Triton interpreter: the Triton kernel stays the path on CPU.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

__all__ = ["GLUON_TILES", "compile_configs", "fp8_gemm_sm90_launch"]

#: (block_m, block_n, num_warps, stages) the Gluon kernel is built for. 128x128 with two
#: warpgroups: three live [128, 128] FP32 tiles (running sum, retiring product, product in
#: flight) are 192 registers a thread; 4 stages of 32 KB (A + B) are 128 KB of shared memory.
GLUON_TILES = ((128, 128, 8, 4), (64, 128, 4, 4))
_BK = 128


@gluon.jit
def _fp8_gemm_sm90_kernel(
    a_desc, b_desc, s_desc, as_ptr, bs_ptr, c_ptr,
    M, N, K,
    stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm,
    STAGES: gl.constexpr, num_warps: gl.constexpr, B_SCALE_PER_ROW: gl.constexpr,
):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    off_m = pid_m * BM
    off_n = pid_n * BN

    # wgmma m64nBNk32 per warpgroup; warps stacked along M (16 rows a warp)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BN, 32])
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    cols: gl.constexpr = gl.SliceLayout(0, mma)

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    if B_SCALE_PER_ROW:
        # per-row weight scales ([ceil(K/128), N] fp32, box [1, BN]) ride the same ring: a stage
        # holds its block's [BN] vector, read from shared memory at the promotion. Loaded from
        # global memory instead, the vector's latency sat in front of every promotion (H200,
        # M=4096: 204-210 us against 144-152 for the 128x128-block path).
        s_bufs = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 1, BN], s_desc.layout)
        tile_bytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + s_desc.block_type.nbytes
    else:
        tile_bytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes

    nk = gl.cdiv(K, BK)
    for i in gl.static_range(STAGES - 1):  # prologue: blocks 0 .. STAGES-2 in flight
        live = i < nk
        mbarrier.expect(ready.index(i), tile_bytes, pred=live)
        tma.async_copy_global_to_shared(a_desc, [off_m, i * BK], ready.index(i), a_bufs.index(i), pred=live)
        tma.async_copy_global_to_shared(b_desc, [off_n, i * BK], ready.index(i), b_bufs.index(i), pred=live)
        if B_SCALE_PER_ROW:
            tma.async_copy_global_to_shared(s_desc, [i, off_n], ready.index(i), s_bufs.index(i), pred=live)

    rm = off_m + gl.arange(0, BM, layout=rows)
    m_ok = rm < M
    as_rows = as_ptr + rm.to(gl.int64) * stride_asm
    bs_row = bs_ptr + (off_n // 128) * stride_bsn  # 128x128 blocks: BN divides 128, one scale row a tile
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # a stage's [1, BN] scale box as [BN]

    zero = gl.zeros([BM, BN], gl.float32, mma)
    acc = gl.zeros([BM, BN], gl.float32, mma)
    prev = warpgroup_mma_init(gl.zeros([BM, BN], gl.float32, mma))  # block k-1's product (0 before block 0)
    prev_scale = gl.zeros([BM], gl.float32, rows)  # block k-1's a_s * b_s (per-row b_s: a_s alone)
    for kb in range(nk):
        s = kb % STAGES
        # block kb's scales, used one iteration later (their load latency hides behind a wgmma)
        sa = gl.load(as_rows + kb * stride_ask, mask=m_ok, other=0.0)
        if not B_SCALE_PER_ROW:
            sb = gl.load(bs_row + kb * stride_bsk)
        mbarrier.wait(ready.index(s), (kb // STAGES) & 1)
        cur = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
        # retire block kb-1 only; block kb stays on the tensor cores during its promotion
        done = warpgroup_mma_wait(num_outstanding=1, deps=(prev,))
        nxt = kb + STAGES - 1
        ns = nxt % STAGES  # block kb-1's stage
        if B_SCALE_PER_ROW:
            # block kb-1's [BN] weight scales from its stage (none before block 0: the stage
            # holds no data yet, and 0 * NaN would poison the sum)
            prev_sb = s_bufs.index(ns)._reinterpret(gl.float32, [BN], flat).load(cols)
            prev_sb = gl.where(kb > 0, prev_sb, 0.0)
            acc = acc + done * prev_scale[:, None] * prev_sb[None, :]
            gl.thread_barrier()  # every warp has read the stage's scales before the TMA refill
        else:
            acc = acc + done * prev_scale[:, None]
        # block kb-1's stage is free now: refill it with block kb + STAGES - 1
        live = nxt < nk
        mbarrier.expect(ready.index(ns), tile_bytes, pred=live)
        tma.async_copy_global_to_shared(a_desc, [off_m, nxt * BK], ready.index(ns), a_bufs.index(ns), pred=live)
        tma.async_copy_global_to_shared(b_desc, [off_n, nxt * BK], ready.index(ns), b_bufs.index(ns), pred=live)
        if B_SCALE_PER_ROW:
            tma.async_copy_global_to_shared(s_desc, [nxt, off_n], ready.index(ns), s_bufs.index(ns), pred=live)
        prev = cur
        if B_SCALE_PER_ROW:
            prev_scale = sa
        else:
            prev_scale = sa * sb
    done = warpgroup_mma_wait(num_outstanding=0, deps=(prev,))
    if B_SCALE_PER_ROW:
        prev_sb = s_bufs.index((nk - 1) % STAGES)._reinterpret(gl.float32, [BN], flat).load(cols)
        acc = acc + done * prev_scale[:, None] * prev_sb[None, :]
    else:
        acc = acc + done * prev_scale[:, None]
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    rn = off_n + gl.arange(0, BN, layout=cols)
    c = c_ptr + rm[:, None].to(gl.int64) * stride_cm + rn[None, :]
    gl.store(c, acc.to(gl.bfloat16), mask=m_ok[:, None] & (rn < N)[None, :])


_S_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)  # plain fp32 rows


def _layouts(bm: int, bn: int):
    return (gl.NVMMASharedLayout.get_default_for([bm, _BK], gl.float8e4nv),
            gl.NVMMASharedLayout.get_default_for([bn, _BK], gl.float8e4nv))


def fp8_gemm_sm90_launch(a, a_s, b, b_s, out, m: int, n: int, k: int, block_m: int, block_n: int,
                         num_warps: int, stages: int, *, b_scale_per_row: bool = False) -> None:
    """Launch the Gluon kernel: a ``fp8 [M, K]``, a_s ``fp32 [M, ceil(K/128)]``, b ``fp8 [N, K]``,
    b_s ``fp32 [ceil(N/128), ceil(K/128)]`` (128x128 blocks, `fp8_gemm`) or, with
    `b_scale_per_row`, ``fp32 [N, ceil(K/128)]`` (one scale per weight row and K block:
    `fp4_gemm`'s fold engine), out ``bf16 [M, N]`` (all validated by the caller)."""
    la, lb = _layouts(block_m, block_n)
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [block_m, _BK], la)
    b_desc = TensorDescriptor(b, [n, k], [b.stride(0), 1], [block_n, _BK], lb)
    s_desc = b_desc  # unused without per-row scales
    if b_scale_per_row:  # the scales K-block-major, [ceil(K/128), N], rows 16-byte aligned
        st = b_s.t()
        if st.stride(1) != 1 or (st.stride(0) * 4) % 16:
            raise ValueError(f"per-row weight scales must be stored K-block-major with 16-byte aligned rows "
                             f"(b_s.t() strides {st.stride()})")
        s_desc = TensorDescriptor(st, list(st.shape), [st.stride(0), 1], [1, block_n], _S_LAYOUT)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _fp8_gemm_sm90_kernel[grid](
        a_desc, b_desc, s_desc, a_s, b_s, out, m, n, k,
        a_s.stride(0), a_s.stride(1), b_s.stride(0), b_s.stride(1), out.stride(0),
        STAGES=stages, num_warps=num_warps, B_SCALE_PER_ROW=b_scale_per_row,
    )


def compile_configs():
    """The Gluon tiles for the compile tier (descriptor types as the launcher builds them), with
    128x128-block weight scales (`fp8_gemm`) and per-row ones (`fp4_gemm`'s fold engine)."""
    from triton.runtime.jit import mangle_type

    from .compile_tier import KernelConfig

    cfgs = []
    for bm, bn, warps, stages in GLUON_TILES:
        for per_row in (False, True):
            la, lb = _layouts(bm, bn)
            probe = torch.empty(16, 16, dtype=torch.float8_e4m3fn)  # types only: dtype, block, layout
            b_type = mangle_type(TensorDescriptor(probe, [16, 16], [16, 1], [bn, _BK], lb))
            scales = torch.empty(16, 16, dtype=torch.float32)
            sig = {
                "a_desc": mangle_type(TensorDescriptor(probe, [16, 16], [16, 1], [bm, _BK], la)),
                "b_desc": b_type,
                "s_desc": mangle_type(TensorDescriptor(scales, [16, 16], [16, 1], [1, bn], _S_LAYOUT)) if per_row
                else b_type,
                "as_ptr": "*fp32", "bs_ptr": "*fp32", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
                "stride_asm": "i32", "stride_ask": "i32", "stride_bsn": "i32", "stride_bsk": "i32",
                "stride_cm": "i32", "STAGES": "constexpr", "num_warps": "constexpr", "B_SCALE_PER_ROW": "constexpr",
            }
            consts = {"STAGES": stages, "num_warps": warps, "B_SCALE_PER_ROW": per_row}
            cfgs.append(KernelConfig(
                f"fp8_gemm_sm90_gluon[BM={bm},BN={bn},w={warps},stages={stages}"
                f"{',b_scale=row' if per_row else ''}]", _fp8_gemm_sm90_kernel, sig, consts, num_warps=warps,
                num_stages=1, expect_sass=("QGMMA",), expect_ptx=("wgmma.wait_group.sync.aligned 1",),
                unaligned=("M", "N", "K", "stride_ask", "stride_bsk"),
                # known defect (found 2026-11-30 when the tier began reading ptxas's C75xx infos):
                # ptxas serializes these wgmmas (C7514), so the promotion overlap this kernel was
                # built for does not reach the SASS; H200 M=4096 ~0.5x torch's per-tensor FP8 GEMM
                allowed_ptxas=("C7514",)))
    return cfgs
