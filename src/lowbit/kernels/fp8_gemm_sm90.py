"""Hopper (sm_90a) Gluon kernel of `fp8_gemm` for prefill tiles: the K-block promotion of block
``2j`` overlapped with the tensor-core product of block ``2j + 1``.

Why it exists. `fp8_gemm`'s Triton kernel computes, per 128-deep K block, ``blk = a @ b^T``
(FP8 wgmma, FP32 result) and then ``acc += blk * (a_s * b_s)`` on the CUDA cores. Triton 3.6
waits for every wgmma before any non-MMA use of its result (``wgmma.wait_group 0`` in the PTX
of every variant we tried: a loop-carried previous product, a 2x-unrolled loop, TMA loads,
``tl.range(warp_specialize=True)``), so the tensor cores idle while the promotion FMAs run and
while the next block is issued: the H200 measured 629-634 TFLOP/s at M=4096 against 1271-1325
for ``torch._scaled_mm``'s per-tensor FP8 GEMM (docs/performance.md). Gluon exposes the wait:
here blocks ``2j`` and ``2j + 1`` are issued asynchronously, ``warpgroup_mma_wait(num_outstanding=1)``
retires block ``2j`` only, and its promotion runs while block ``2j + 1`` is on the tensor cores.

Why pairs. The first version kept one product in flight across the loop's back edge (block
``k``'s wgmma overlapping block ``k - 1``'s promotion every iteration). LLVM carries that product
through the loop's phi with register moves that read it while the tensor cores still write it,
and ptxas then serialized every wgmma (C7514, reported as an "info" line the compile tier did
not read until 2026-11-30): the overlap never reached the SASS. Two blocks an iteration with
nothing in flight at the back edge compile clean; every second promotion is exposed.

Two kernels. `_fp8_gemm_sm90_ws_kernel` (the 128x128 tiles, the default where they fill the
SMs) is persistent and warp-specialized: a producer warp streams every K block of the
program's tiles through a TMA ring, and two consumer warpgroups, each in its own partition so
no barrier couples them, take 64 rows each: one product a block, retired, the stage released,
the promotion on the CUDA cores while the other warpgroup's product runs. H200 (eleventh
session), M=4096: 111.2 / 120.4 us for (N, K) = (2304, 5120) / (5120, 2304), 1.05x / 1.02x the
64x128 kernel below, still 0.62-0.64x torch's per-tensor FP8 GEMM (nvjet 128x160 tiles, a 2-CTA
cluster). ncu at (5120, 2304): 0.29 instructions issued a cycle per scheduler, 44% of the stalls
at the partitions' named barriers, 6.6 TB/s from L2 (cuBLAS: 6.9 TB/s at 1.6x the FLOP rate).
256-wide tiles (two 128-column halves a warpgroup) were tried: with A from shared memory ptxas
spilled (174 / 148 us), with A through registers (wgmma RS) 127 / 116 us; not kept.

`_fp8_gemm_sm90_kernel` (64x128, one partition, no warp specialization): a ``STAGES``-deep ring of TMA-loaded A and B
tiles in shared memory, one mbarrier per stage; a block's stage is refilled with block
``k + STAGES`` as soon as its product is promoted. TMA zero-fills rows and K columns past the
tensor bounds, so M, N and K tails need no masks until the store (an odd number of K blocks
ends with a zero-filled block of scale 0).
Semantics are `fp8_gemm`'s (same promotion order: ``acc += blk * (a_s * b_s)`` per K block).
With ``B_SCALE_PER_ROW`` (`fp4_gemm`'s fold engine) the weight scale is per weight row and K
block, ``b_s fp32 [N, ceil(K/128)]``, and the promotion is ``acc += blk * a_s[m] * b_s[n]``;
the flag off compiles to the same instructions as before it existed.

Status: compiled for sm_90a by the compile tier (QGMMA in the SASS, ``wgmma.wait_group 1`` in
the PTX, no C75xx serialization info); correct on the H200 (GPU tests) and the default for M > 64
on sm_90 with TMA-able operands: H200, eighth session, M=4096 the 64x128 tile 0.60-0.61x
``torch._scaled_mm``'s per-tensor FP8 GEMM (816 / 778 TFLOP/s; 0.50x before the pairs), M=128
1.07-1.47x the Triton tile (`fp8_gemm._config_cached` has the numbers). Gluon does not run
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
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

__all__ = ["GLUON_TILES", "compile_configs", "fp8_gemm_sm90_launch"]

#: (block_m, block_n, num_warps, stages) the Gluon kernels are built for. 64x128, one warpgroup:
#: `_fp8_gemm_sm90_kernel` (two K blocks an iteration). 128x128, two warpgroups ("8 warps"):
#: the persistent warp-specialized `_fp8_gemm_sm90_ws_kernel` (two consumer warpgroups of 64
#: rows, 168 registers a thread, and a producer warp); 4 or 6 stages of 32 KB (A + B).
GLUON_TILES = ((128, 128, 8, 4), (128, 128, 8, 6), (64, 128, 4, 4))
_BK = 128
#: Registers (setmaxnreg) of the warp-specialized kernel's second consumer warpgroup and of its
#: producer warp: a consumer holds two [64, BN] FP32 tiles (running sum, block product).
_WS_MMA_REGS = gl.constexpr(232)
_WS_LOAD_REGS = gl.constexpr(40)


@gluon.jit
def _block_scale(as_rows, bs_row, kb, nk, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW: gl.constexpr):
    """Block kb's promotion scale per row: a_s * b_s (128x128 weight blocks) or a_s alone (per-row
    weight scales, applied at the promotion); 0 past K (the odd phantom block)."""
    live = kb < nk
    sa = gl.load(as_rows + kb * stride_ask, mask=m_ok & live, other=0.0)
    if B_SCALE_PER_ROW:
        return sa
    else:
        return sa * gl.load(bs_row + kb * stride_bsk, mask=live, other=0.0)


@gluon.jit
def _promote(acc, blk, scale, s_bufs, st, live, BN: gl.constexpr, cols: gl.constexpr, flat: gl.constexpr,
             B_SCALE_PER_ROW: gl.constexpr):
    """acc += blk * scale (per row), times the per-row weight scales of stage `st` with
    B_SCALE_PER_ROW (then a barrier: every warp has read them before the stage's refill)."""
    if B_SCALE_PER_ROW:
        sb = s_bufs.index(st)._reinterpret(gl.float32, [BN], flat).load(cols)
        sb = gl.where(live, sb, 0.0)  # no data before block 0: 0 * NaN would poison the sum
        acc = acc + blk * scale[:, None] * sb[None, :]
        gl.thread_barrier()
    else:
        acc = acc + blk * scale[:, None]
    return acc


@gluon.jit
def _refill(a_desc, b_desc, s_desc, a_bufs, b_bufs, s_bufs, ready, blk, nblk, off_m, off_n, tile_bytes: gl.constexpr,
            STAGES: gl.constexpr, B_SCALE_PER_ROW: gl.constexpr):
    """TMA of block `blk` (if < nblk) into its stage blk % STAGES."""
    st = blk % STAGES
    live = blk < nblk
    BK: gl.constexpr = a_desc.block_type.shape[1]
    mbarrier.expect(ready.index(st), tile_bytes, pred=live)
    tma.async_copy_global_to_shared(a_desc, [off_m, blk * BK], ready.index(st), a_bufs.index(st), pred=live)
    tma.async_copy_global_to_shared(b_desc, [off_n, blk * BK], ready.index(st), b_bufs.index(st), pred=live)
    if B_SCALE_PER_ROW:
        tma.async_copy_global_to_shared(s_desc, [blk, off_n], ready.index(st), s_bufs.index(st), pred=live)


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
        s_bufs = a_bufs  # unused
        tile_bytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes

    nk = gl.cdiv(K, BK)
    for i in gl.static_range(STAGES):  # prologue: blocks 0 .. STAGES-1 in flight
        live = i < 2 * gl.cdiv(nk, 2)
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

    acc = gl.zeros([BM, BN], gl.float32, mma)
    zero = gl.zeros([BM, BN], gl.float32, mma)
    nk2 = 2 * gl.cdiv(nk, 2)  # an odd K ends with a zero-filled block (scale 0)
    for j in range(nk2 // 2):
        kb = 2 * j
        s0 = _block_scale(as_rows, bs_row, kb, nk, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW)
        s1 = _block_scale(as_rows, bs_row, kb + 1, nk, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW)
        mbarrier.wait(ready.index(kb % STAGES), (kb // STAGES) & 1)
        c0 = warpgroup_mma(a_bufs.index(kb % STAGES), b_bufs.index(kb % STAGES).permute((1, 0)), zero,
                           use_acc=False, is_async=True)
        mbarrier.wait(ready.index((kb + 1) % STAGES), ((kb + 1) // STAGES) & 1)
        c1 = warpgroup_mma(a_bufs.index((kb + 1) % STAGES), b_bufs.index((kb + 1) % STAGES).permute((1, 0)), zero,
                           use_acc=False, is_async=True)
        d0 = warpgroup_mma_wait(num_outstanding=1, deps=(c0,))  # block kb retired, kb+1 in flight
        acc = _promote(acc, d0, s0, s_bufs, kb % STAGES, True, BN, cols, flat, B_SCALE_PER_ROW)
        _refill(a_desc, b_desc, s_desc, a_bufs, b_bufs, s_bufs, ready, kb + STAGES, nk2, off_m, off_n, tile_bytes,
                STAGES, B_SCALE_PER_ROW)
        # nothing in flight at the loop's back edge: an in-flight product carried across it is
        # copied by the loop's phi while the tensor cores write it, and ptxas serializes every
        # wgmma (C7514)
        d1 = warpgroup_mma_wait(num_outstanding=0, deps=(c1,))
        acc = _promote(acc, d1, s1, s_bufs, (kb + 1) % STAGES, True, BN, cols, flat, B_SCALE_PER_ROW)
        _refill(a_desc, b_desc, s_desc, a_bufs, b_bufs, s_bufs, ready, kb + 1 + STAGES, nk2, off_m, off_n, tile_bytes,
                STAGES, B_SCALE_PER_ROW)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    rn = off_n + gl.arange(0, BN, layout=cols)
    c = c_ptr + rm[:, None].to(gl.int64) * stride_cm + rn[None, :]
    gl.store(c, acc.to(gl.bfloat16), mask=m_ok[:, None] & (rn < N)[None, :])


# --------------------------------------------------------------------------- warp-specialized
@gluon.jit
def _ws_tile(tile, tiles_n, BM: gl.constexpr, BN: gl.constexpr):
    """(off_m, off_n) of persistent tile `tile`; N fastest, so the programs resident at once share
    A row blocks and sweep all of B (both fit in the H200's L2 at the prefill shapes)."""
    return (tile // tiles_n) * BM, (tile % tiles_n) * BN


@gluon.jit
def _ws_load_partition(a_desc, b_desc, s_desc, a_bufs, b_bufs, s_bufs, ready, empty, K, num_tiles, tiles_n,
                       STAGES: gl.constexpr, B_SCALE_PER_ROW: gl.constexpr):
    """Producer warp: every K block of every tile this program owns into the ring, a stage as soon
    as both consumer warpgroups released it (empty barriers start in phase 0: waiting on phase 1
    passes for the first STAGES blocks)."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    if B_SCALE_PER_ROW:
        tile_bytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + s_desc.block_type.nbytes
    else:
        tile_bytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    nk = gl.cdiv(K, BK)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _ws_tile(tile, tiles_n, BM, BN)
        for kb in range(nk):
            st = it % STAGES
            mbarrier.wait(empty.index(st), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(st), tile_bytes)
            tma.async_copy_global_to_shared(a_desc, [off_m, kb * BK], ready.index(st), a_bufs.index(st))
            tma.async_copy_global_to_shared(b_desc, [off_n, kb * BK], ready.index(st), b_bufs.index(st))
            if B_SCALE_PER_ROW:
                tma.async_copy_global_to_shared(s_desc, [kb, off_n], ready.index(st), s_bufs.index(st))
            it += 1


@gluon.jit
def _ws_mma_partition(a_bufs, b_bufs, s_bufs, ready, empty, as_ptr, bs_ptr, c_ptr, M, N, K, num_tiles, tiles_n,
                      stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm,
                      WG: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                      STAGES: gl.constexpr, B_SCALE_PER_ROW: gl.constexpr):
    """Consumer warpgroup WG (rows ``64 WG .. 64 WG + 63`` of every tile): per K block one wgmma
    product into fresh registers, retired, the stage released, then the promotion
    ``acc += blk * scale`` on the CUDA cores -- while the other warpgroup's wgmma keeps the
    tensor cores busy (the two warpgroups share no barrier, so they can drift apart). The next
    block's scales are loaded before this block's wait."""
    HALF: gl.constexpr = BM // 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    cols: gl.constexpr = gl.SliceLayout(0, mma)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # a stage's [1, BN] scale box as [BN]
    # the product lands in the registers of the previous one (``use_acc=False``; already promoted,
    # so dead): a loop-invariant zero tile instead would hold BN / 2 more registers a thread
    blk = gl.zeros([HALF, BN], gl.float32, mma)
    nk = gl.cdiv(K, BK)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _ws_tile(tile, tiles_n, BM, BN)
        rm = off_m + WG * HALF + gl.arange(0, HALF, layout=rows)
        m_ok = rm < M
        as_rows = as_ptr + rm.to(gl.int64) * stride_asm
        bs_row = bs_ptr + (off_n // 128) * stride_bsn
        s_next = _block_scale(as_rows, bs_row, 0, nk, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW)
        acc = gl.zeros([HALF, BN], gl.float32, mma)
        for kb in range(nk):
            st = it % STAGES
            scale = s_next
            s_next = _block_scale(as_rows, bs_row, kb + 1, nk, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW)
            mbarrier.wait(ready.index(st), (it // STAGES) & 1)
            blk = warpgroup_mma(a_bufs.index(st).slice(WG * HALF, HALF), b_bufs.index(st).permute((1, 0)), blk,
                                use_acc=False, is_async=True)
            blk = warpgroup_mma_wait(num_outstanding=0, deps=(blk,))
            if B_SCALE_PER_ROW:
                sb = s_bufs.index(st)._reinterpret(gl.float32, [BN], flat).load(cols)
                mbarrier.arrive(empty.index(st), count=1)
                acc = acc + blk * scale[:, None] * sb[None, :]
            else:
                mbarrier.arrive(empty.index(st), count=1)
                acc = acc + blk * scale[:, None]
            it += 1
        rn = off_n + gl.arange(0, BN, layout=cols)
        c = c_ptr + rm[:, None].to(gl.int64) * stride_cm + rn[None, :]
        gl.store(c, acc.to(gl.bfloat16), mask=m_ok[:, None] & (rn < N)[None, :])


@gluon.jit
def _fp8_gemm_sm90_ws_kernel(
    a_desc, b_desc, s_desc, as_ptr, bs_ptr, c_ptr,
    M, N, K, num_tiles, tiles_n,
    stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm,
    STAGES: gl.constexpr, num_warps: gl.constexpr, B_SCALE_PER_ROW: gl.constexpr,
):
    """Persistent, warp-specialized 128xBN tiles: a producer warp (TMA) and two consumer
    warpgroups in separate partitions, 64 rows each (`_ws_mma_partition`). Same promotion order
    as `_fp8_gemm_sm90_kernel` (one product a K block, ``acc += blk * scale``)."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    if B_SCALE_PER_ROW:
        s_bufs = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 1, BN], s_desc.layout)
    else:
        s_bufs = a_bufs  # unused
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # one arrive per consumer warpgroup
    gl.warp_specialize([
        (_ws_mma_partition, (a_bufs, b_bufs, s_bufs, ready, empty, as_ptr, bs_ptr, c_ptr, M, N, K, num_tiles, tiles_n,
                             stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm, 0, BM, BN, BK, STAGES,
                             B_SCALE_PER_ROW)),
        (_ws_mma_partition, (a_bufs, b_bufs, s_bufs, ready, empty, as_ptr, bs_ptr, c_ptr, M, N, K, num_tiles, tiles_n,
                             stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm, 1, BM, BN, BK, STAGES,
                             B_SCALE_PER_ROW)),
        (_ws_load_partition, (a_desc, b_desc, s_desc, a_bufs, b_bufs, s_bufs, ready, empty, K, num_tiles, tiles_n,
                              STAGES, B_SCALE_PER_ROW)),
    ], [4, 1], [_WS_MMA_REGS.value, _WS_LOAD_REGS.value])


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
    if block_m == 128:  # two warpgroups: the persistent warp-specialized kernel
        tiles_n = triton.cdiv(n, block_n)
        num_tiles = triton.cdiv(m, block_m) * tiles_n
        grid = (min(num_tiles, torch.cuda.get_device_properties(a.device).multi_processor_count),)
        _fp8_gemm_sm90_ws_kernel[grid](
            a_desc, b_desc, s_desc, a_s, b_s, out, m, n, k, num_tiles, tiles_n,
            a_s.stride(0), a_s.stride(1), b_s.stride(0), b_s.stride(1), out.stride(0),
            STAGES=stages, num_warps=4, B_SCALE_PER_ROW=b_scale_per_row,
        )
        return
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
            ws = bm == 128  # two warpgroups: the warp-specialized persistent kernel
            if ws:
                sig = dict(sig, num_tiles="i32", tiles_n="i32")
            consts = {"STAGES": stages, "num_warps": 4 if ws else warps, "B_SCALE_PER_ROW": per_row}
            cfgs.append(KernelConfig(
                f"fp8_gemm_sm90_gluon{'_ws' if ws else ''}[BM={bm},BN={bn},w={warps},stages={stages}"
                f"{',b_scale=row' if per_row else ''}]", _fp8_gemm_sm90_ws_kernel if ws else _fp8_gemm_sm90_kernel,
                sig, consts, num_warps=4 if ws else warps, num_stages=1, expect_sass=("QGMMA",),
                expect_ptx=() if ws else ("wgmma.wait_group.sync.aligned 1",),
                unaligned=("M", "N", "K", "stride_ask", "stride_bsk", "num_tiles", "tiles_n")))
    return cfgs
