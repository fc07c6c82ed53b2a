"""Hopper (sm_90a) Gluon kernels of `fp8_gemm` (also `fp4_gemm`'s fold engine): the K-block
promotion overlapped with tensor-core products.

Per 128-deep K block the GEMM computes ``blk = a @ b^T`` (FP8 wgmma, FP32 result) and then
``acc += blk * (a_s * b_s)`` on the CUDA cores. Triton 3.6 waits for every wgmma before any
non-MMA use of its result (``wgmma.wait_group 0``), so the portable kernel leaves the tensor
cores idle during each promotion. Gluon exposes the wait: blocks ``2j`` and ``2j + 1`` are
issued asynchronously, ``warpgroup_mma_wait(num_outstanding=1)`` retires block ``2j`` only, and
its promotion runs while block ``2j + 1`` is on the tensor cores. Two blocks an iteration, with
nothing in flight at the loop's back edge: a product carried across it is copied by the loop's
phi while the tensor cores still write it, and ptxas then serializes every wgmma (C7514).

Two kernels (tiles: `tiles.GLUON_TILES`):

- `_fp8_gemm_sm90_ws_kernel` (128 or 192 rows x 128 columns): persistent and warp-specialized.
  A producer warp streams every K block of the program's tiles through a TMA ring (A as one
  64-row box per consumer); two or three consumer warpgroups, each in its own partition so no
  barrier couples them, take 64 rows each. With two, each keeps two products in flight and
  promotes block 2j under block 2j+1's wgmma (PAIRS, `tiles.WS_PAIRS`); with three, the other
  warpgroups cover a promotion. Each finished tile leaves through shared memory and a TMA store
  that overlaps the next tile's K loop; operands beyond the L2 are visited in groups of 8 row
  tiles, M fastest (`ws_group_m`).
- `_fp8_gemm_sm90_kernel` (64x128, one partition): a ``STAGES``-deep ring of TMA-loaded A and B
  tiles, one mbarrier a stage, refilled with block ``k + STAGES`` as soon as block k is
  promoted. TMA zero-fills rows and K columns past the tensor bounds, so M, N and K tails need
  no masks until the store (an odd number of K blocks ends on a zero-filled block of scale 0).
  Split along K (a third grid axis; each split an even number of blocks, so only the last can
  end on the phantom block) it writes FP32 shares that `splitk.splitk_reduce` sums.

Semantics are `fp8_gemm`'s, with the same promotion order in both kernels (bit-identical
outputs). With ``B_SCALE_PER_ROW`` (`fp4_gemm`'s fold engine) the weight scale is per weight row
and K block, ``b_s fp32 [N, ceil(K/128)]``, and the promotion is ``acc += blk * a_s[m] * b_s[n]``;
the flag off compiles to the same instructions as before it existed. Gluon does not run under
the Triton interpreter: the portable kernels are the path on the CPU.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ...runtime.device import tma_problem
from ..compile_tier import KernelConfig
from .splitk import split_blocks, splitk_destination, splitk_reduce
from .tiles import GLUON_TILES, SCALE_BLOCK, WS_PAIRS

__all__ = ["compile_configs", "fp8_gemm_sm90_launch", "ws_group_m"]

_BK = SCALE_BLOCK
#: Registers (setmaxnreg) of the warp-specialized kernel's worker consumer warpgroup and of its
#: producer warp, two consumers: each holds three [64, BN] FP32 tiles with PAIRS (running sum,
#: two block products).
_WS_MMA_REGS = gl.constexpr(232)
_WS_LOAD_REGS = gl.constexpr(40)
#: ... with three consumer warpgroups (16 warps with the producer's, padded): 160 each (the
#: running sum and one block product; 65536 registers a CTA).
_WS3_MMA_REGS = gl.constexpr(160)


def ws_group_m(a_bytes: int, b_bytes: int) -> int:
    """Row tiles a group of the warp-specialized kernel's persistent tile order (`_ws_tile`).
    Operands larger than the H200's 60 MB L2: groups of 8 row tiles swept M fastest, so the ~132
    tiles resident at once cover 8 row tiles x ~17 column tiles and their blocks stay in L2.
    Smaller: plain N-fastest order (1)."""
    # H200, 2026-11-30, commit 6c37a14: 8192^3, 192 rows: group 8 1044.8 us, group 1 1109.3
    return 8 if a_bytes + b_bytes > 60 * 2**20 else 1


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
def _refill(a_desc, b_desc, s_desc, a_bufs, b_bufs, s_bufs, ready, blk, nblk, lo, off_m, off_n,
            tile_bytes: gl.constexpr, STAGES: gl.constexpr, B_SCALE_PER_ROW: gl.constexpr):
    """TMA of the split's block `blk` (K block lo + blk; if blk < nblk) into stage blk % STAGES."""
    st = blk % STAGES
    live = blk < nblk
    BK: gl.constexpr = a_desc.block_type.shape[1]
    mbarrier.expect(ready.index(st), tile_bytes, pred=live)
    tma.async_copy_global_to_shared(a_desc, [off_m, (lo + blk) * BK], ready.index(st), a_bufs.index(st), pred=live)
    tma.async_copy_global_to_shared(b_desc, [off_n, (lo + blk) * BK], ready.index(st), b_bufs.index(st), pred=live)
    if B_SCALE_PER_ROW:
        tma.async_copy_global_to_shared(s_desc, [lo + blk, off_n], ready.index(st), s_bufs.index(st), pred=live)


@gluon.jit
def _fp8_gemm_sm90_kernel(
    a_desc, b_desc, s_desc, as_ptr, bs_ptr, c_ptr,
    M, N, K, blocks_per_split,
    stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cs, stride_cm,
    STAGES: gl.constexpr, num_warps: gl.constexpr, B_SCALE_PER_ROW: gl.constexpr, SPLIT_OUT: gl.constexpr,
):
    """Program (row tile, column tile, K split): K blocks ``lo .. hi`` of the tile, ``lo =
    pid_k * blocks_per_split`` (even, so only the last split can end on the zero-filled phantom
    block). c bf16 ``[M, N]``, or with SPLIT_OUT FP32 shares ``[splits, M, N]``."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    pid_k = gl.program_id(2)
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
        # holds its block's [BN] vector, read from shared memory at the promotion (loaded from
        # global memory, the vector's latency sat in front of every promotion)
        s_bufs = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 1, BN], s_desc.layout)
        tile_bytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes + s_desc.block_type.nbytes
    else:
        s_bufs = a_bufs  # unused
        tile_bytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes

    lo = pid_k * blocks_per_split
    hi = gl.minimum(lo + blocks_per_split, gl.cdiv(K, BK))
    nk2 = 2 * gl.cdiv(hi - lo, 2)  # an odd count (last split only) ends with a zero-filled block (scale 0)
    for i in gl.static_range(STAGES):  # prologue: the split's blocks 0 .. STAGES-1 in flight
        live = i < nk2
        mbarrier.expect(ready.index(i), tile_bytes, pred=live)
        tma.async_copy_global_to_shared(a_desc, [off_m, (lo + i) * BK], ready.index(i), a_bufs.index(i), pred=live)
        tma.async_copy_global_to_shared(b_desc, [off_n, (lo + i) * BK], ready.index(i), b_bufs.index(i), pred=live)
        if B_SCALE_PER_ROW:
            tma.async_copy_global_to_shared(s_desc, [lo + i, off_n], ready.index(i), s_bufs.index(i), pred=live)

    rm = off_m + gl.arange(0, BM, layout=rows)
    m_ok = rm < M
    as_rows = as_ptr + rm.to(gl.int64) * stride_asm
    bs_row = bs_ptr + (off_n // 128) * stride_bsn  # 128x128 blocks: BN divides 128, one scale row a tile
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # a stage's [1, BN] scale box as [BN]

    acc = gl.zeros([BM, BN], gl.float32, mma)
    zero = gl.zeros([BM, BN], gl.float32, mma)
    for j in range(nk2 // 2):
        kb = 2 * j  # within the split: stages and phases count from its first block
        s0 = _block_scale(as_rows, bs_row, lo + kb, hi, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW)
        s1 = _block_scale(as_rows, bs_row, lo + kb + 1, hi, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW)
        mbarrier.wait(ready.index(kb % STAGES), (kb // STAGES) & 1)
        c0 = warpgroup_mma(a_bufs.index(kb % STAGES), b_bufs.index(kb % STAGES).permute((1, 0)), zero,
                           use_acc=False, is_async=True)
        mbarrier.wait(ready.index((kb + 1) % STAGES), ((kb + 1) // STAGES) & 1)
        c1 = warpgroup_mma(a_bufs.index((kb + 1) % STAGES), b_bufs.index((kb + 1) % STAGES).permute((1, 0)), zero,
                           use_acc=False, is_async=True)
        d0 = warpgroup_mma_wait(num_outstanding=1, deps=(c0,))  # block kb retired, kb+1 in flight
        acc = _promote(acc, d0, s0, s_bufs, kb % STAGES, True, BN, cols, flat, B_SCALE_PER_ROW)
        _refill(a_desc, b_desc, s_desc, a_bufs, b_bufs, s_bufs, ready, kb + STAGES, nk2, lo, off_m, off_n,
                tile_bytes, STAGES, B_SCALE_PER_ROW)
        # nothing in flight at the loop's back edge: an in-flight product carried across it is
        # copied by the loop's phi while the tensor cores write it, and ptxas serializes every
        # wgmma (C7514)
        d1 = warpgroup_mma_wait(num_outstanding=0, deps=(c1,))
        acc = _promote(acc, d1, s1, s_bufs, (kb + 1) % STAGES, True, BN, cols, flat, B_SCALE_PER_ROW)
        _refill(a_desc, b_desc, s_desc, a_bufs, b_bufs, s_bufs, ready, kb + 1 + STAGES, nk2, lo, off_m, off_n,
                tile_bytes, STAGES, B_SCALE_PER_ROW)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    rn = off_n + gl.arange(0, BN, layout=cols)
    c = c_ptr + pid_k.to(gl.int64) * stride_cs + rm[:, None].to(gl.int64) * stride_cm + rn[None, :]
    if SPLIT_OUT:
        gl.store(c, acc, mask=m_ok[:, None] & (rn < N)[None, :])
    else:
        gl.store(c, acc.to(gl.bfloat16), mask=m_ok[:, None] & (rn < N)[None, :])


# --------------------------------------------------------------------------- warp-specialized
@gluon.jit
def _ws_tile(tile, num_tiles, tiles_n, group_m, BM: gl.constexpr, BN: gl.constexpr):
    """(off_m, off_n) of persistent tile `tile`, in groups of `group_m` row tiles swept M fastest
    (`ws_group_m`; 1 is plain N-fastest order)."""
    tiles_m = num_tiles // tiles_n
    per_group = group_m * tiles_n
    first_m = (tile // per_group) * group_m
    size_m = gl.minimum(tiles_m - first_m, group_m)
    r = tile % per_group
    return (first_m + r % size_m) * BM, (r // size_m) * BN


@gluon.jit
def _ws_load_partition(a_desc, b_desc, s_desc, a_bufs, b_bufs, s_bufs, ready, empty, K, num_tiles, tiles_n,
                       group_m, NUM_WG: gl.constexpr, STAGES: gl.constexpr, B_SCALE_PER_ROW: gl.constexpr,
                       PAIRS: gl.constexpr):
    """Producer warp: every K block of every tile this program owns into the ring (A as NUM_WG
    boxes of 64 rows, one a consumer), a stage as soon as every consumer warpgroup released it
    (empty barriers start in phase 0: waiting on phase 1 passes for the first STAGES blocks)."""
    ROWS: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    if B_SCALE_PER_ROW:
        tile_bytes: gl.constexpr = (NUM_WG * a_desc.block_type.nbytes + b_desc.block_type.nbytes
                                    + s_desc.block_type.nbytes)
    else:
        tile_bytes: gl.constexpr = NUM_WG * a_desc.block_type.nbytes + b_desc.block_type.nbytes
    nk = gl.cdiv(K, BK)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _ws_tile(tile, num_tiles, tiles_n, group_m, NUM_WG * ROWS, BN)
        for kb in range(2 * gl.cdiv(nk, 2) if PAIRS else nk):  # PAIRS: an odd K gets a zero-filled block
            st = it % STAGES
            mbarrier.wait(empty.index(st), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(st), tile_bytes)
            for w in gl.static_range(NUM_WG):
                tma.async_copy_global_to_shared(a_desc, [off_m + w * ROWS, kb * BK], ready.index(st),
                                                a_bufs.index(st * NUM_WG + w))
            tma.async_copy_global_to_shared(b_desc, [off_n, kb * BK], ready.index(st), b_bufs.index(st))
            if B_SCALE_PER_ROW:
                tma.async_copy_global_to_shared(s_desc, [kb, off_n], ready.index(st), s_bufs.index(st))
            it += 1


@gluon.jit
def _ws_promote(acc, blk, scale, s_bufs, st, empty, BN: gl.constexpr, cols: gl.constexpr, flat: gl.constexpr,
                B_SCALE_PER_ROW: gl.constexpr):
    """Stage `st`'s retired product into the running sum (``acc += blk * scale``, times the
    stage's per-row weight scales with B_SCALE_PER_ROW), the stage released once read."""
    if B_SCALE_PER_ROW:
        sb = s_bufs.index(st)._reinterpret(gl.float32, [BN], flat).load(cols)
        mbarrier.arrive(empty.index(st), count=1)
        return acc + blk * scale[:, None] * sb[None, :]
    else:
        mbarrier.arrive(empty.index(st), count=1)
        return acc + blk * scale[:, None]


@gluon.jit
def _ws_mma_partition(a_bufs, b_bufs, s_bufs, c_bufs, ready, empty, c_desc, as_ptr, bs_ptr, c_ptr, M, N, K,
                      num_tiles, tiles_n, group_m, stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm,
                      WG: gl.constexpr, NUM_WG: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                      STAGES: gl.constexpr, B_SCALE_PER_ROW: gl.constexpr, PAIRS: gl.constexpr,
                      TMA_STORE: gl.constexpr):
    """Consumer warpgroup WG: rows ``64 WG .. 64 WG + 63`` of every tile. Per K block one wgmma
    product into fresh registers, retired, the stage released, then the promotion
    ``acc += blk * scale`` on the CUDA cores, while the other warpgroups' products keep the
    tensor cores busy: each warpgroup is its own partition, so no barrier couples them. With
    PAIRS two blocks are in flight and block 2j's promotion also runs under block 2j+1's wgmma
    (the 64x128 kernel's pairing; 192 registers of FP32 tiles, so two warpgroups only). The
    next blocks' scales are loaded before the current block's wait. With TMA_STORE the tile
    leaves through shared memory and a TMA store that overlaps the next tile's K loop."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32])
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    cols: gl.constexpr = gl.SliceLayout(0, mma)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # a stage's [1, BN] scale box as [BN]
    # each product lands in the registers of an earlier one (``use_acc=False``; already promoted,
    # so dead): a loop-invariant zero tile instead would hold BN / 2 more registers a thread
    blk = gl.zeros([64, BN], gl.float32, mma)
    blk2 = gl.zeros([64, BN], gl.float32, mma)
    nk = gl.cdiv(K, BK)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        off_m, off_n = _ws_tile(tile, num_tiles, tiles_n, group_m, NUM_WG * 64, BN)
        rm = off_m + WG * 64 + gl.arange(0, 64, layout=rows)
        m_ok = rm < M
        as_rows = as_ptr + rm.to(gl.int64) * stride_asm
        bs_row = bs_ptr + (off_n // 128) * stride_bsn
        acc = gl.zeros([64, BN], gl.float32, mma)
        if PAIRS:
            s0n = _block_scale(as_rows, bs_row, 0, nk, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW)
            s1n = _block_scale(as_rows, bs_row, 1, nk, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW)
            for j in range(gl.cdiv(nk, 2)):
                st0 = it % STAGES
                st1 = (it + 1) % STAGES
                s0 = s0n
                s1 = s1n
                s0n = _block_scale(as_rows, bs_row, 2 * j + 2, nk, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW)
                s1n = _block_scale(as_rows, bs_row, 2 * j + 3, nk, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW)
                mbarrier.wait(ready.index(st0), (it // STAGES) & 1)
                blk = warpgroup_mma(a_bufs.index(st0 * NUM_WG + WG), b_bufs.index(st0).permute((1, 0)), blk,
                                    use_acc=False, is_async=True)
                mbarrier.wait(ready.index(st1), ((it + 1) // STAGES) & 1)
                blk2 = warpgroup_mma(a_bufs.index(st1 * NUM_WG + WG), b_bufs.index(st1).permute((1, 0)), blk2,
                                     use_acc=False, is_async=True)
                blk = warpgroup_mma_wait(num_outstanding=1, deps=(blk,))
                acc = _ws_promote(acc, blk, s0, s_bufs, st0, empty, BN, cols, flat, B_SCALE_PER_ROW)
                blk2 = warpgroup_mma_wait(num_outstanding=0, deps=(blk2,))
                acc = _ws_promote(acc, blk2, s1, s_bufs, st1, empty, BN, cols, flat, B_SCALE_PER_ROW)
                it += 2
        else:
            s_next = _block_scale(as_rows, bs_row, 0, nk, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW)
            for kb in range(nk):
                st = it % STAGES
                scale = s_next
                s_next = _block_scale(as_rows, bs_row, kb + 1, nk, stride_ask, stride_bsk, m_ok, B_SCALE_PER_ROW)
                mbarrier.wait(ready.index(st), (it // STAGES) & 1)
                blk = warpgroup_mma(a_bufs.index(st * NUM_WG + WG), b_bufs.index(st).permute((1, 0)), blk,
                                    use_acc=False, is_async=True)
                blk = warpgroup_mma_wait(num_outstanding=0, deps=(blk,))
                acc = _ws_promote(acc, blk, scale, s_bufs, st, empty, BN, cols, flat, B_SCALE_PER_ROW)
                it += 1
        if TMA_STORE:
            tma.store_wait(0)  # the previous tile's store has read this warpgroup's buffer
            c_bufs.index(WG).store(acc.to(gl.bfloat16))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(c_desc, [off_m + WG * 64, off_n], c_bufs.index(WG))
        else:
            rn = off_n + gl.arange(0, BN, layout=cols)
            c = c_ptr + rm[:, None].to(gl.int64) * stride_cm + rn[None, :]
            gl.store(c, acc.to(gl.bfloat16), mask=m_ok[:, None] & (rn < N)[None, :])
    if TMA_STORE:
        tma.store_wait(0)


@gluon.jit
def _fp8_gemm_sm90_ws_kernel(
    a_desc, b_desc, s_desc, c_desc, as_ptr, bs_ptr, c_ptr,
    M, N, K, num_tiles, tiles_n, group_m,
    stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm,
    STAGES: gl.constexpr, num_warps: gl.constexpr, B_SCALE_PER_ROW: gl.constexpr, NUM_WG: gl.constexpr,
    PAIRS: gl.constexpr, TMA_STORE: gl.constexpr,
):
    """Persistent, warp-specialized ``(64 NUM_WG) x BN`` tiles: a producer warp (TMA) and NUM_WG
    (2 or 3) consumer warpgroups in separate partitions (`_ws_mma_partition`). Same promotion
    order as `_fp8_gemm_sm90_kernel` (one product a K block, ``acc += blk * scale``): the
    outputs are bit-identical."""
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES * NUM_WG, 64, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BN, BK], b_desc.layout)
    if B_SCALE_PER_ROW:
        s_bufs = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 1, BN], s_desc.layout)
    else:
        s_bufs = a_bufs  # unused
    if TMA_STORE:
        c_bufs = gl.allocate_shared_memory(c_desc.dtype, [NUM_WG, 64, BN], c_desc.layout)
    else:
        c_bufs = a_bufs  # unused
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=NUM_WG)  # one arrive per consumer warpgroup
    # (the partition lists are written out per NUM_WG: Gluon cannot build them in a loop)
    if NUM_WG == 3:
        gl.warp_specialize([
            (_ws_mma_partition, (a_bufs, b_bufs, s_bufs, c_bufs, ready, empty, c_desc, as_ptr, bs_ptr, c_ptr, M, N,
                                 K, num_tiles, tiles_n, group_m, stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm, 0,
                                 NUM_WG, BN, BK, STAGES, B_SCALE_PER_ROW, PAIRS, TMA_STORE)),
            (_ws_mma_partition, (a_bufs, b_bufs, s_bufs, c_bufs, ready, empty, c_desc, as_ptr, bs_ptr, c_ptr, M, N,
                                 K, num_tiles, tiles_n, group_m, stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm, 1,
                                 NUM_WG, BN, BK, STAGES, B_SCALE_PER_ROW, PAIRS, TMA_STORE)),
            (_ws_mma_partition, (a_bufs, b_bufs, s_bufs, c_bufs, ready, empty, c_desc, as_ptr, bs_ptr, c_ptr, M, N,
                                 K, num_tiles, tiles_n, group_m, stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm, 2,
                                 NUM_WG, BN, BK, STAGES, B_SCALE_PER_ROW, PAIRS, TMA_STORE)),
            (_ws_load_partition, (a_desc, b_desc, s_desc, a_bufs, b_bufs, s_bufs, ready, empty, K, num_tiles,
                                  tiles_n, group_m, NUM_WG, STAGES, B_SCALE_PER_ROW, PAIRS)),
        ], [4, 4, 1], [_WS3_MMA_REGS.value, _WS3_MMA_REGS.value, _WS_LOAD_REGS.value])
    else:
        gl.warp_specialize([
            (_ws_mma_partition, (a_bufs, b_bufs, s_bufs, c_bufs, ready, empty, c_desc, as_ptr, bs_ptr, c_ptr, M, N,
                                 K, num_tiles, tiles_n, group_m, stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm, 0,
                                 NUM_WG, BN, BK, STAGES, B_SCALE_PER_ROW, PAIRS, TMA_STORE)),
            (_ws_mma_partition, (a_bufs, b_bufs, s_bufs, c_bufs, ready, empty, c_desc, as_ptr, bs_ptr, c_ptr, M, N,
                                 K, num_tiles, tiles_n, group_m, stride_asm, stride_ask, stride_bsn, stride_bsk, stride_cm, 1,
                                 NUM_WG, BN, BK, STAGES, B_SCALE_PER_ROW, PAIRS, TMA_STORE)),
            (_ws_load_partition, (a_desc, b_desc, s_desc, a_bufs, b_bufs, s_bufs, ready, empty, K, num_tiles,
                                  tiles_n, group_m, NUM_WG, STAGES, B_SCALE_PER_ROW, PAIRS)),
        ], [4, 1], [_WS_MMA_REGS.value, _WS_LOAD_REGS.value])


_S_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)  # plain fp32 rows


def _layouts(bm: int, bn: int):
    return (gl.NVMMASharedLayout.get_default_for([bm, _BK], gl.float8e4nv),
            gl.NVMMASharedLayout.get_default_for([bn, _BK], gl.float8e4nv))


def fp8_gemm_sm90_launch(a, a_s, b, b_s, out, m: int, n: int, k: int, block_m: int, block_n: int,
                         num_warps: int, stages: int, *, b_scale_per_row: bool = False, pairs: bool | None = None,
                         tma_store: bool | None = None, group_m: int | None = None, split_k: int = 1) -> None:
    """Launch the Gluon kernel: a ``fp8 [M, K]``, a_s ``fp32 [M, ceil(K/128)]``, b ``fp8 [N, K]``,
    b_s ``fp32 [ceil(N/128), ceil(K/128)]`` (128x128 blocks, `fp8_gemm`) or, with
    `b_scale_per_row`, ``fp32 [N, ceil(K/128)]`` (one scale per weight row and K block:
    `fp4_gemm`'s fold engine), out ``bf16 [M, N]`` (all validated by the caller). `pairs`,
    `tma_store` and `group_m` override the warp-specialized kernel's choices: `WS_PAIRS` per
    consumer count, a TMA-store epilogue wherever `out` is TMA-able, and `ws_group_m`'s tile
    order. `split_k` (the 64x128 kernel only): programs along K, each an even number of 128-K
    blocks, FP32 shares summed by `splitk_reduce`."""
    la, lb = _layouts(min(block_m, 128), block_n)
    b_desc = TensorDescriptor(b, [n, k], [b.stride(0), 1], [block_n, _BK], lb)
    s_desc = b_desc  # unused without per-row scales
    if b_scale_per_row:  # the scales K-block-major, [ceil(K/128), N], rows 16-byte aligned
        st = b_s.t()
        if st.stride(1) != 1 or (st.stride(0) * 4) % 16:
            raise ValueError(f"per-row weight scales must be stored K-block-major with 16-byte aligned rows "
                             f"(b_s.t() strides {st.stride()})")
        s_desc = TensorDescriptor(st, list(st.shape), [st.stride(0), 1], [1, block_n], _S_LAYOUT)
    if block_m in (128, 192):  # two or three warpgroups: the persistent warp-specialized kernel
        num_wg = block_m // 64
        a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [64, _BK], _layouts(64, block_n)[0])
        tma_store = tma_problem(out, "out") is None if tma_store is None else tma_store
        if num_wg == 3 and b_scale_per_row and not tma_store:
            num_wg, block_m = 2, 128  # three warpgroups with per-row scales spill without the TMA store
        c_desc = (TensorDescriptor(out, [m, n], [out.stride(0), 1], [64, block_n],
                                   gl.NVMMASharedLayout.get_default_for([64, block_n], gl.bfloat16))
                  if tma_store else a_desc)
        tiles_n = triton.cdiv(n, block_n)
        num_tiles = triton.cdiv(m, block_m) * tiles_n
        grid = (min(num_tiles, torch.cuda.get_device_properties(a.device).multi_processor_count),)
        _fp8_gemm_sm90_ws_kernel[grid](
            a_desc, b_desc, s_desc, c_desc, a_s, b_s, out, m, n, k, num_tiles, tiles_n,
            ws_group_m(a.numel(), b.numel()) if group_m is None else group_m, a_s.stride(0), a_s.stride(1), b_s.stride(0), b_s.stride(1), out.stride(0),
            STAGES=stages, num_warps=4, B_SCALE_PER_ROW=b_scale_per_row, NUM_WG=num_wg,
            PAIRS=WS_PAIRS[num_wg] if pairs is None else pairs, TMA_STORE=tma_store,
        )
        return
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [block_m, _BK], la)
    per, split = split_blocks(triton.cdiv(k, _BK), split_k)
    dst, stride_cs, stride_cm = splitk_destination(out, split)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    _fp8_gemm_sm90_kernel[grid](
        a_desc, b_desc, s_desc, a_s, b_s, dst, m, n, k, per,
        a_s.stride(0), a_s.stride(1), b_s.stride(0), b_s.stride(1), stride_cs, stride_cm,
        STAGES=stages, num_warps=num_warps, B_SCALE_PER_ROW=b_scale_per_row, SPLIT_OUT=split > 1,
    )
    if split > 1:
        splitk_reduce(dst, out)


def compile_configs() -> list[KernelConfig]:
    """The Gluon tiles for the compile tier (descriptor types as the launcher builds them), with
    128x128-block weight scales (`fp8_gemm`) and per-row ones (`fp4_gemm`'s fold engine); the
    warp-specialized tiles with the TMA-store epilogue and the plain-store one."""
    from triton.runtime.jit import mangle_type

    probe = torch.empty(16, 16, dtype=torch.float8_e4m3fn)  # types only: dtype, block, layout
    scales = torch.empty(16, 16, dtype=torch.float32)

    def desc(t, block, layout):
        return mangle_type(TensorDescriptor(t, [16, 16], [16, 1], block, layout))

    common = {"as_ptr": "*fp32", "bs_ptr": "*fp32", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
              "stride_asm": "i32", "stride_ask": "i32", "stride_bsn": "i32", "stride_bsk": "i32",
              "stride_cm": "i32", "STAGES": "constexpr", "num_warps": "constexpr", "B_SCALE_PER_ROW": "constexpr"}
    unaligned = ("M", "N", "K", "stride_ask", "stride_bsk", "num_tiles", "tiles_n", "group_m")
    cfgs = []
    for bm, bn, warps, stages in GLUON_TILES:
        ws = bm in (128, 192)
        la, lb = _layouts(64 if ws else bm, bn)
        b_type = desc(probe, [bn, _BK], lb)
        for per_row in (False, True):
            s_type = desc(scales, [1, bn], _S_LAYOUT) if per_row else b_type
            name = f"BM={bm},BN={bn},w={warps},stages={stages}{',b_scale=row' if per_row else ''}"
            if not ws:
                for split in (False, True):
                    sig = {"a_desc": desc(probe, [bm, _BK], la), "b_desc": b_type, "s_desc": s_type, **common,
                           "c_ptr": "*fp32" if split else "*bf16", "blocks_per_split": "i32", "stride_cs": "i32",
                           "SPLIT_OUT": "constexpr"}
                    cfgs.append(KernelConfig(
                        f"fp8_gemm_sm90_gluon[{name}{',split' if split else ''}]", _fp8_gemm_sm90_kernel, sig,
                        {"STAGES": stages, "num_warps": warps, "B_SCALE_PER_ROW": per_row, "SPLIT_OUT": split},
                        num_warps=warps, num_stages=1, expect_sass=("QGMMA",),
                        expect_ptx=("wgmma.wait_group.sync.aligned 1",),
                        unaligned=unaligned + ("blocks_per_split", "stride_cs")))
                continue
            num_wg = bm // 64
            for tma_store in (True, False):
                if num_wg == 3 and per_row and not tma_store:
                    continue  # the launcher runs two warpgroups there (three spill)
                c_type = (desc(torch.empty(16, 16, dtype=torch.bfloat16), [64, bn],
                               gl.NVMMASharedLayout.get_default_for([64, bn], gl.bfloat16)) if tma_store
                          else desc(probe, [64, _BK], la))
                sig = {"a_desc": desc(probe, [64, _BK], la), "b_desc": b_type, "s_desc": s_type, "c_desc": c_type,
                       **common, "num_tiles": "i32", "tiles_n": "i32", "group_m": "i32", "NUM_WG": "constexpr", "PAIRS": "constexpr",
                       "TMA_STORE": "constexpr"}
                pairs = WS_PAIRS[num_wg]
                cfgs.append(KernelConfig(
                    f"fp8_gemm_sm90_gluon_ws[{name}{',pairs' if pairs else ''}{',tma_store' if tma_store else ''}]",
                    _fp8_gemm_sm90_ws_kernel, sig,
                    {"STAGES": stages, "num_warps": 4, "B_SCALE_PER_ROW": per_row, "NUM_WG": num_wg, "PAIRS": pairs,
                     "TMA_STORE": tma_store}, num_warps=4, num_stages=1, expect_sass=("QGMMA",),
                    expect_ptx=("wgmma.wait_group.sync.aligned 1",) if pairs else (), unaligned=unaligned))
    return cfgs
