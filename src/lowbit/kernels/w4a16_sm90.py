"""Hopper (sm_90a) Gluon kernels of the W4A16 GEMMs (grouped contiguous, grouped masked,
indexed): the dequantization of K step ``k + 1`` overlapped with the tensor-core products of
step ``k``.

Why it exists. Every Triton W4A16 kernel of this library (indexed, contiguous, masked; every
tile) compiles to ``wgmma.wait_group 0`` after each K step: Triton retires a step's wgmma
before the next step's dequantization starts, so the CUDA cores (dequant) and the tensor cores
(wgmma) take turns (docs/performance.md). Gluon exposes the wait. Here, per 256-wide K step:

1. the next step's INT4 words are loaded from global memory into registers (in flight while
   this step runs), this step's words are dequantized (`int4_dequant`'s lop3 + fma.bf16x2
   PTX, the same bits as every other path) and stored into a shared-memory buffer;
2. the eight ``[64 weight rows, 32]`` x ``[32, BR activation rows]`` products of the step
   are issued as asynchronous wgmmas on one accumulator (weight rows on the M side, as the
   Triton kernels' swap-AB tiles);
3. ``warpgroup_mma_wait(8)`` retires the *previous* step's products only: the step just issued
   keeps the tensor cores busy while the next iteration dequantizes.

Grouped layouts: activations come by TMA, one ``[BR, 32]`` box per K group (the packed weight
pairs group i with group i + 4 in one word, so the K order inside a step is the packing's, and
each weight group meets the activation columns of the same group), through a ``STAGES``-deep
ring. Dequantized
weights ping-pong between two sets of eight ``[64, 32]`` buffers: a set is rewritten two steps
after its products were issued, by which time the wait above has retired them.

Indexed layout: the routed rows (row ``id // top_k`` of route ``id``) are gathered with
16-byte loads into a second pair of buffer sets, one step ahead, right after the wait that
freed them; outputs go to row ``id`` (times the routing weight when given); sentinel slots,
``-1`` expert blocks and blocks past the device-side padded count are skipped as in the
Triton kernel.

Status: compiled for sm_90a by the compile tier (HGMMA in the SASS, ``wgmma.wait_group 8`` in
the PTX); NOT yet run on a GPU, so it is opt-in (``LOWBIT_W4A16_ENGINE=gluon``,
``LOWBIT_W4A16_GROUPED_ENGINE=gluon`` or ``W4A16Config(engine="gluon")``) until the GPU tests
and the benchmark have run it. Gluon does not run under the Triton interpreter: the Triton
kernels stay the path on CPU.
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

from .int4_dequant import DEQUANT_PAIR_PTX

__all__ = ["GLUON_TILES", "INDEXED_TILES", "compile_configs", "w4a16_grouped_sm90_launch",
           "w4a16_indexed_sm90_launch"]

#: (weight rows, activation rows, num_warps, stages): one warpgroup, 64 weight rows on the
#: wgmma M side; 128 activation rows = one contiguous segment. Shared memory: the activation
#: ring (8 boxes of [BR, 32] bf16 a stage: 64 KB at BR 128) + two sets of dequantized weights
#: (2 x 8 x 4 KB).
GLUON_TILES = ((64, 128, 4, 2), (64, 64, 4, 3))
#: The indexed kernel's tiles, (weight rows, routing block size, num_warps): its two buffer sets
#: (dequantized weights and gathered rows) ping-pong, so it has no stage count.
INDEXED_TILES = ((64, 16, 4), (64, 32, 4), (64, 64, 4))
_GROUPS = gl.constexpr(8)  # K groups of 32 in one 256-wide packed step


@gluon.jit
def _dequant_pair(words, s_lo, s_hi):
    """bf16 weights of groups i and i + 4 from words shifted by 4i (`int4_dequant` layout)."""
    _, s_lo = gl.broadcast(words, s_lo)
    _, s_hi = gl.broadcast(words, s_hi)
    return gl.inline_asm_elementwise(DEQUANT_PAIR_PTX, "=h,=h,r,h,h", [words, s_lo, s_hi],
                                     dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=1)


@gluon.jit
def _weight_rows(qw_ptr, s_ptr, e, n0, N, stride_qe, stride_qn, stride_se, BW: gl.constexpr,
                 num_warps: gl.constexpr):
    """Expert `e`'s weight rows ``n0 .. n0+BW``: word pointers ``[BW, 32]`` of K step 0 (a
    step is 32 words a row), scale pointers ``[BW]`` of group 0, the row mask."""
    words_l: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])  # 16-byte loads
    rn = n0 + gl.arange(0, BW, layout=gl.SliceLayout(1, words_l))
    n_ok = rn < N
    j = gl.arange(0, 32, layout=gl.SliceLayout(0, words_l))
    qw_rows = qw_ptr + e.to(gl.int64) * stride_qe + rn[:, None].to(gl.int64) * stride_qn + j[None, :]
    return qw_rows, s_ptr + e.to(gl.int64) * stride_se + rn, n_ok


@gluon.jit
def _dequant_step(words, s_rows, n_ok, kt, stride_sk, deq, p):
    """Dequantize K step `kt` (`words` ``[BW, 32]``) into buffer set `p` of `deq`: buffer
    ``8p + g`` holds group g (K ``256kt + 32g ..``) of the rows, bf16 ``(q - 8) * s``."""
    for i in gl.static_range(4):
        s_lo = gl.load(s_rows + (kt * 8 + i) * stride_sk, mask=n_ok, other=0.0)
        s_hi = gl.load(s_rows + (kt * 8 + i + 4) * stride_sk, mask=n_ok, other=0.0)
        w_lo, w_hi = _dequant_pair(words >> (4 * i), s_lo[:, None], s_hi[:, None])
        deq.index(p * _GROUPS + i).store(w_lo)
        deq.index(p * _GROUPS + i + 4).store(w_hi)


@gluon.jit
def _issue_step(deq, p, xs, s, acc):
    """The eight asynchronous wgmmas of one K step, ``[BW, 32] x [32, BR]`` each, chained on
    `acc`, after the shared-memory writes of this step are visible to the async proxy."""
    fence_async_shared()
    gl.thread_barrier()  # every thread's part of the tiles is in shared memory
    for g in gl.static_range(_GROUPS):
        acc = warpgroup_mma(deq.index(p * _GROUPS + g), xs.index(s * _GROUPS + g).permute((1, 0)), acc,
                            is_async=True)
    return acc


@gluon.jit
def _w4a16_grouped_sm90_kernel(
    x_desc, qw_ptr, s_ptr, c_ptr, route_ptr,
    N, K, max_m,
    stride_qe, stride_qn, stride_se, stride_sk, stride_cm,
    BW: gl.constexpr, STAGES: gl.constexpr, MASKED: gl.constexpr, num_warps: gl.constexpr,
):
    """Contiguous (MASKED=0): grid (m / BR, N tiles), route_ptr = m_indices, the expert of each
    row (-1 = padding). Masked (MASKED=1): grid (G * cdiv(max_m, BR), N tiles), route_ptr =
    masked_m, the valid rows of each expert's max_m-row slab."""
    BR: gl.constexpr = x_desc.block_type.shape[0]
    pid_r = gl.program_id(0)
    pid_n = gl.program_id(1)
    if MASKED:
        blocks = gl.cdiv(max_m, BR)
        e = pid_r // blocks
        rb = (pid_r % blocks) * BR  # first row inside the expert's slab
        valid = gl.minimum(gl.load(route_ptr + e), max_m)
        if rb >= valid:  # past this expert's rows: nothing to compute
            return
        r0 = e * max_m + rb
    else:
        r0 = pid_r * BR
        e = gl.load(route_ptr + r0)
        if e < 0:  # a padding block: its rows are never read
            return
    n0 = pid_n * BW

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR, 16])

    deq_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BW, 32], gl.bfloat16)
    deq = gl.allocate_shared_memory(gl.bfloat16, [2 * _GROUPS, BW, 32], deq_l)
    xs = gl.allocate_shared_memory(x_desc.dtype, [STAGES * _GROUPS, BR, 32], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)

    nk = gl.cdiv(K, 256)
    step_bytes: gl.constexpr = _GROUPS * x_desc.block_type.nbytes
    for i in gl.static_range(STAGES - 1):  # prologue: activation steps 0 .. STAGES-2 in flight
        live = i < nk
        mbarrier.expect(ready.index(i), step_bytes, pred=live)
        for g in gl.static_range(_GROUPS):
            tma.async_copy_global_to_shared(x_desc, [r0, i * 256 + g * 32], ready.index(i),
                                            xs.index(i * _GROUPS + g), pred=live)

    qw_rows, s_rows, n_ok = _weight_rows(qw_ptr, s_ptr, e, n0, N, stride_qe, stride_qn, stride_se, BW, num_warps)
    words = gl.load(qw_rows, mask=n_ok[:, None], other=0)  # step 0

    acc = gl.zeros([BW, BR], gl.float32, mma)
    for kt in range(nk):
        # the next step's words travel while this step is dequantized and multiplied
        words_next = gl.load(qw_rows + (kt + 1) * 32, mask=n_ok[:, None] & (kt + 1 < nk), other=0)
        p = kt % 2
        _dequant_step(words, s_rows, n_ok, kt, stride_sk, deq, p)
        s = kt % STAGES
        mbarrier.wait(ready.index(s), (kt // STAGES) & 1)
        acc = _issue_step(deq, p, xs, s, acc)
        # retire step kt-1's eight products; step kt's stay on the tensor cores
        acc = warpgroup_mma_wait(num_outstanding=_GROUPS, deps=(acc,))
        nxt = kt + STAGES - 1  # its stage held step kt-1, retired just now
        ns = nxt % STAGES
        live = nxt < nk
        mbarrier.expect(ready.index(ns), step_bytes, pred=live)
        for g in gl.static_range(_GROUPS):
            tma.async_copy_global_to_shared(x_desc, [r0, nxt * 256 + g * 32], ready.index(ns),
                                            xs.index(ns * _GROUPS + g), pred=live)
        words = words_next
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    # acc[i, r] = out[r0 + r, n0 + i]: the weight rows are the output columns
    orow_l: gl.constexpr = gl.SliceLayout(1, mma)
    ocol_l: gl.constexpr = gl.SliceLayout(0, mma)
    on = n0 + gl.arange(0, BW, layout=orow_l)
    orr = r0 + gl.arange(0, BR, layout=ocol_l)
    if MASKED:
        row_live = orr - e * max_m < valid  # rows past masked_m[e] are not written
    else:
        row_live = gl.load(route_ptr + orr) >= 0  # padding rows are not written
    c = c_ptr + orr[None, :].to(gl.int64) * stride_cm + on[:, None]
    gl.store(c, acc.to(gl.bfloat16), mask=(on < N)[:, None] & row_live[None, :])


@gluon.jit
def _gather_step(a_rows, row_ok, kt, K, xs, p, x_l: gl.constexpr):
    """Gather K step `kt` of the routed activation rows into buffer set `p` of `xs` (one
    ``[BR, 32]`` buffer a group); columns past K read as 0."""
    jx = gl.arange(0, 32, layout=gl.SliceLayout(0, x_l))
    for g in gl.static_range(_GROUPS):
        k = kt * 256 + g * 32 + jx
        x = gl.load(a_rows + k[None, :], mask=row_ok[:, None] & (k < K)[None, :], other=0.0)
        xs.index(p * _GROUPS + g).store(x)


@gluon.jit
def _w4a16_indexed_sm90_kernel(
    a_ptr, qw_ptr, s_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, topk_w_ptr,
    N, K, num_routes, top_k,
    stride_am, stride_qe, stride_qn, stride_se, stride_sk, stride_cm,
    BR: gl.constexpr, BW: gl.constexpr, MUL_WEIGHT: gl.constexpr, num_warps: gl.constexpr,
):
    """Indexed layout (`moe_align_block_size` routing with block size BR): grid (routing
    blocks, N tiles). The routed rows are gathered (row ``id // top_k`` for route ``id``) into
    shared memory a step ahead, as the weights are dequantized a step ahead; output row ``id``."""
    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    if pid_m * BR >= gl.load(ntpp_ptr):  # past the device-side padded count
        return
    e = gl.load(expert_ids_ptr + pid_m)
    if e < 0:  # a block of another rank's expert (EP)
        return
    n0 = pid_n * BW

    x_l: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [num_warps, 1], [1, 0])  # 16-byte row loads
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR, 16])
    deq_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BW, 32], gl.bfloat16)
    x_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BR, 32], gl.bfloat16)
    deq = gl.allocate_shared_memory(gl.bfloat16, [2 * _GROUPS, BW, 32], deq_l)
    xs = gl.allocate_shared_memory(gl.bfloat16, [2 * _GROUPS, BR, 32], x_sl)

    ids = gl.load(sorted_ids_ptr + pid_m * BR + gl.arange(0, BR, layout=gl.SliceLayout(1, x_l)))
    row_ok = ids < num_routes  # sentinel slots are not routes
    a_rows = a_ptr + gl.where(row_ok, ids // top_k, 0).to(gl.int64)[:, None] * stride_am
    qw_rows, s_rows, n_ok = _weight_rows(qw_ptr, s_ptr, e, n0, N, stride_qe, stride_qn, stride_se, BW, num_warps)

    nk = gl.cdiv(K, 256)
    words = gl.load(qw_rows, mask=n_ok[:, None], other=0)  # step 0
    _gather_step(a_rows, row_ok, 0, K, xs, 0, x_l)
    acc = gl.zeros([BW, BR], gl.float32, mma)
    for kt in range(nk):
        words_next = gl.load(qw_rows + (kt + 1) * 32, mask=n_ok[:, None] & (kt + 1 < nk), other=0)
        p = kt % 2
        _dequant_step(words, s_rows, n_ok, kt, stride_sk, deq, p)
        acc = _issue_step(deq, p, xs, p, acc)
        # retire step kt-1's products: its buffer sets (1 - p) are free for step kt+1
        acc = warpgroup_mma_wait(num_outstanding=_GROUPS, deps=(acc,))
        if kt + 1 < nk:
            _gather_step(a_rows, row_ok, kt + 1, K, xs, 1 - p, x_l)
        words = words_next
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    # acc[i, r] = out[ids[r], n0 + i]
    on = n0 + gl.arange(0, BW, layout=gl.SliceLayout(1, mma))
    oid = gl.load(sorted_ids_ptr + pid_m * BR + gl.arange(0, BR, layout=gl.SliceLayout(0, mma)))
    o_ok = oid < num_routes
    out = acc
    if MUL_WEIGHT:
        out = out * gl.load(topk_w_ptr + oid, mask=o_ok, other=0.0)[None, :]
    c = c_ptr + oid[None, :].to(gl.int64) * stride_cm + on[:, None]
    gl.store(c, out.to(gl.bfloat16), mask=(on < N)[:, None] & o_ok[None, :])


def _x_layout(br: int):
    return gl.NVMMASharedLayout.get_default_for([br, 32], gl.bfloat16)


def w4a16_grouped_sm90_launch(a, w, route, out, tile, max_m: int = 0) -> None:
    """Launch on operands `w4a16_grouped` has validated. Contiguous (``max_m == 0``): a
    ``bf16 [m, K]``, route = m_indices ``int32 [m]``. Masked (``max_m > 0``): a the flat
    ``bf16 [G * max_m, K]``, route = masked_m ``int32 [G]``. w: the mode's `W4A16Weight`; out
    ``bf16 [rows, N]``; tile one of `GLUON_TILES`."""
    bw, br, warps, stages = tile
    rows = a.shape[0]
    x_desc = TensorDescriptor(a, [rows, w.k], [a.stride(0), 1], [br, 32], _x_layout(br))
    blocks = w.num_experts * triton.cdiv(max_m, br) if max_m else rows // br
    _w4a16_grouped_sm90_kernel[(blocks, triton.cdiv(w.n, bw))](
        x_desc, w.qweight, w.scales, out, route, w.n, w.k, max_m,
        w.qweight.stride(0), w.qweight.stride(1), w.scales.stride(0), w.scales.stride(1), out.stride(0),
        BW=bw, STAGES=stages, MASKED=bool(max_m), num_warps=warps,
    )


def w4a16_indexed_sm90_launch(a, w, sorted_ids, expert_ids, ntpp, top_k: int, topk_weights, out, tile) -> None:
    """Launch on operands `w4a16_indexed` has validated (its docstring has the shapes); tile one
    of `INDEXED_TILES`, whose routing block size the routing was built with."""
    bw, br, warps = tile
    _w4a16_indexed_sm90_kernel[(expert_ids.numel(), triton.cdiv(w.n, bw))](
        a, w.qweight, w.scales, out, sorted_ids, expert_ids, ntpp, out if topk_weights is None else topk_weights,
        w.n, w.k, a.shape[0] * top_k, top_k,
        a.stride(0), w.qweight.stride(0), w.qweight.stride(1), w.scales.stride(0), w.scales.stride(1), out.stride(0),
        BR=br, BW=bw, MUL_WEIGHT=topk_weights is not None, num_warps=warps,
    )


def compile_configs():
    """The Gluon tiles for the compile tier."""
    from triton.runtime.jit import mangle_type

    from .compile_tier import KernelConfig

    cfgs = []
    for bw, br, warps, stages in GLUON_TILES:
        probe = torch.empty(16, 16, dtype=torch.bfloat16)  # types only: dtype, block, layout
        sig = {
            "x_desc": mangle_type(TensorDescriptor(probe, [16, 16], [16, 1], [br, 32], _x_layout(br))),
            "qw_ptr": "*i32", "s_ptr": "*bf16", "c_ptr": "*bf16", "route_ptr": "*i32", "N": "i32", "K": "i32",
            "max_m": "i32", "stride_qe": "i32", "stride_qn": "i32", "stride_se": "i32", "stride_sk": "i32",
            "stride_cm": "i32", "BW": "constexpr", "STAGES": "constexpr", "MASKED": "constexpr", "num_warps": "constexpr",
        }
        for masked in (False, True):
            cfgs.append(KernelConfig(
                f"w4a16_{'masked' if masked else 'contiguous'}_sm90_gluon[BW={bw},BR={br},w={warps},stages={stages}]",
                _w4a16_grouped_sm90_kernel, sig, {"BW": bw, "STAGES": stages, "MASKED": masked, "num_warps": warps},
                num_warps=warps, num_stages=1, expect_sass=("HGMMA",),
                expect_ptx=(f"wgmma.wait_group.sync.aligned {_GROUPS.value}",), unaligned=("N", "K", "max_m")))
    isig = {
        "a_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*bf16", "c_ptr": "*bf16", "sorted_ids_ptr": "*i32",
        "expert_ids_ptr": "*i32", "ntpp_ptr": "*i32", "topk_w_ptr": "*fp32", "N": "i32", "K": "i32",
        "num_routes": "i32", "top_k": "i32", "stride_am": "i32", "stride_qe": "i32", "stride_qn": "i32",
        "stride_se": "i32", "stride_sk": "i32", "stride_cm": "i32",
        "BR": "constexpr", "BW": "constexpr", "MUL_WEIGHT": "constexpr", "num_warps": "constexpr",
    }
    for bw, br, warps in INDEXED_TILES:
        for mul in (False, True):
            cfgs.append(KernelConfig(
                f"w4a16_indexed_sm90_gluon[BW={bw},BR={br},w={warps},MUL_WEIGHT={int(mul)}]", _w4a16_indexed_sm90_kernel,
                isig, {"BR": br, "BW": bw, "MUL_WEIGHT": mul, "num_warps": warps}, num_warps=warps, num_stages=1,
                expect_sass=("HGMMA",), expect_ptx=(f"wgmma.wait_group.sync.aligned {_GROUPS.value}",),
                unaligned=("N", "K", "num_routes", "top_k")))
    return cfgs
