"""Gluon pieces every W4A16 Hopper kernel shares: the weight ring (packed words and scales by
TMA), the activation ring's boxes, the dequantization of a ring stage (into shared memory for
the shared-memory engine, into wgmma A fragments for the register-A engines), the wgmma issue
of a K step, the output transpose, the program order; and on the host the TMA descriptors.

Per 256-wide K step the words are ``[BW, 32]`` i32 of the ``[E * N, Kp / 8]`` view and the
scales ``[8, BW]`` bf16 of the ``[E * Kp / 32, N]`` view (unswizzled: group i is row i); a
grouped kernel's activations are eight ``[BR, 32]`` boxes (the packing pairs group i with group
i + 4 in one word, so each weight group meets the activation columns of its own group).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type

from ..int4 import dequant_group_subnormal_ptx
from ..int4_gluon import dequant_byte, dequant_pair, scale_factors

__all__ = ["GROUPS", "S_LAYOUT", "act_desc", "act_layout", "act_ring", "dequant_group_regs", "dequant_regs",
           "dequant_step", "issue_groups", "issue_regs", "issue_step", "load_weight_step", "load_weights",
           "n_fastest", "program_grid", "stage_boxes", "store_layout", "tile_ids", "transposed", "weight_desc_types",
           "weight_descs", "weight_ring"]

#: K groups of 32 in one 256-wide packed step.
GROUPS = gl.constexpr(8)


@gluon.jit
def load_weight_step(w_desc, s_desc, wrow, srow, n0, kt, bar, wring, sring, st, pred):
    """TMA of K step `kt`'s packed words (``[BW, 32]`` i32 at row `wrow`) and scales (``[8, BW]``
    bf16, rows ``srow + 8kt``, columns from `n0`) into stage `st`, arriving on `bar`."""
    tma.async_copy_global_to_shared(w_desc, [wrow, kt * 32], bar, wring.index(st), pred=pred)
    tma.async_copy_global_to_shared(s_desc, [srow + kt * 8, n0], bar, sring.index(st), pred=pred)


@gluon.jit
def weight_ring(w_desc, s_desc, STAGES: gl.constexpr):
    """The STAGES-deep ring of packed words and scales, and one initialized mbarrier a stage
    (a grouped kernel's activation boxes arrive on the same barrier)."""
    BW: gl.constexpr = w_desc.block_type.shape[0]
    wring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BW, 32], w_desc.layout)
    sring = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 8, BW], s_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    return wring, sring, ready


@gluon.jit
def load_weights(w_desc, s_desc, wrow, srow, n0, kt, bar, wring, sring, st, pred):
    """Step `kt`'s words and scales by TMA into stage `st` of the weight ring, arriving on `bar`."""
    step_bytes: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes
    mbarrier.expect(bar, step_bytes, pred=pred)
    load_weight_step(w_desc, s_desc, wrow, srow, n0, kt, bar, wring, sring, st, pred)


@gluon.jit
def tile_ids(N, BW: gl.constexpr, N_FASTEST: gl.constexpr):
    """(row block, N tile) of this program. N_FASTEST: the grid is one axis with the N tiles
    fastest, so the programs that share a row block's activations run side by side and read
    them from DRAM once; else a 2-D grid (row blocks, N tiles), the row blocks fastest, where a
    prefill whose activations outgrow the L2 (Kimi EP8 contiguous: 48 x 1.8 MB) re-reads them
    for every wave of N tiles. `n_fastest` chooses (launchers)."""
    if N_FASTEST:
        nt = gl.cdiv(N, BW)
        pid = gl.program_id(0)
        return pid // nt, pid % nt
    else:
        return gl.program_id(0), gl.program_id(1)


@gluon.jit
def dequant_step(wring, sring, st, deq, p, num_warps: gl.constexpr):
    """Dequantize the step held in stage `st` into buffer set `p` of `deq`: buffer ``8p + g``
    holds group g (K ``256kt + 32g ..``) of the rows, bf16 ``(q - 8) * s``."""
    words_l: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])  # 16 bytes a thread
    words = wring.index(st).load(words_l)
    # The [8, BW] scale box is unswizzled: viewed as a plain row-major buffer, group i is row i,
    # read as a [BW, 1] column (one scale a weight row, broadcast along K). Slicing the NVMMA
    # view directly reads with the wrong strides on Triton 3.6 (H200, 2026-11-29).
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    scales = sring.index(st)._reinterpret(gl.bfloat16, sring.index(st).shape, plain)
    for i in gl.static_range(4):
        s_lo = scales.slice(i, 1, dim=0).permute((1, 0)).load(words_l)
        s_hi = scales.slice(i + 4, 1, dim=0).permute((1, 0)).load(words_l)
        w_lo, w_hi = dequant_pair(words >> (4 * i), s_lo, s_hi)
        deq.index(p * GROUPS + i).store(w_lo)
        deq.index(p * GROUPS + i + 4).store(w_hi)


@gluon.jit
def issue_step(deq, p, xs, s, acc):
    """The eight asynchronous wgmmas of one K step, ``[BW, 32] x [32, BR]`` each, chained on
    `acc`, after the shared-memory writes of this step are visible to the async proxy."""
    fence_async_shared()
    gl.thread_barrier()  # every thread's part of the tiles is in shared memory
    for g in gl.static_range(GROUPS):
        acc = warpgroup_mma(deq.index(p * GROUPS + g), xs.index(s * GROUPS + g).permute((1, 0)), acc,
                            is_async=True)
    return acc


@gluon.jit
def _dequant_pair_regs(words, scales, j: gl.constexpr, srow: gl.constexpr):
    """Groups 2j and 2j + 1 of a step as two ``[BW, 32]`` A fragments, 2^-64 times the weights
    (`dequant_byte`): `scales` the stage's ``[8 * BW]`` flat view, `srow` the fragments' row layout."""
    BW: gl.constexpr = words.shape[0]
    s_even = scales.slice((2 * j) * BW, BW).load(srow)[:, None]
    s_odd = scales.slice((2 * j + 1) * BW, BW).load(srow)[:, None]
    return dequant_byte(words, s_even, s_odd, j)


@gluon.jit
def dequant_regs(wring, sring, st, dot_a: gl.constexpr):
    """Step held in stage `st`, dequantized straight into wgmma / mma.sync A fragments: eight
    ``[BW, 32]`` bf16 tensors (group g = K ``32g ..`` of the step) in the register layout `dot_a`,
    2^-64 times the weights (the caller's accumulator goes through `unscaled`)."""
    words = wring.index(st).load(dot_a)
    BW: gl.constexpr = wring.shape[1]
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    scales = sring.index(st)._reinterpret(gl.bfloat16, [8 * BW], flat)
    srow: gl.constexpr = gl.SliceLayout(1, dot_a)
    w0, w1 = _dequant_pair_regs(words, scales, 0, srow)
    w2, w3 = _dequant_pair_regs(words, scales, 1, srow)
    w4, w5 = _dequant_pair_regs(words, scales, 2, srow)
    w6, w7 = _dequant_pair_regs(words, scales, 3, srow)
    return w0, w1, w2, w3, w4, w5, w6, w7


@gluon.jit
def dequant_group_regs(words, scales, g: gl.constexpr, srow: gl.constexpr):
    """Group g of a step (K ``32g ..``) as one ``[BW, 32]`` A fragment, 2^-64 times the weights
    (`dequant_regs` one group at a time): `scales` the stage's ``[8 * BW]`` flat view, `srow` the
    fragment's row layout."""
    BW: gl.constexpr = words.shape[0]
    f, c = scale_factors(scales.slice(g * BW, BW).load(srow)[:, None], g)
    _, f = gl.broadcast(words, f)
    _, c = gl.broadcast(words, c)
    PTX: gl.constexpr = dequant_group_subnormal_ptx(g)
    return gl.inline_asm_elementwise(PTX, "=r,r,r,r,r,r,r", [words, f, c], dtype=gl.bfloat16, is_pure=True, pack=2)


@gluon.jit
def issue_groups(xs, s, acc, acc2, ws, SPLIT: gl.constexpr):
    """Step k's eight asynchronous register-A wgmmas, ``[BW, 32] x [32, BR]`` each (`ws`: the
    eight A fragments), into `acc`; with SPLIT the odd groups go to `acc2` instead: two chains
    of dependent wgmmas a step, which the caller adds once after the loop (`tiles.RegisterATile.split_acc`
    says where that measured faster). Returns (acc, acc2)."""
    for g in gl.static_range(GROUPS):
        if SPLIT and g % 2 == 1:
            acc2 = warpgroup_mma(ws[g], xs.index(s * GROUPS + g).permute((1, 0)), acc2, is_async=True)
        else:
            acc = warpgroup_mma(ws[g], xs.index(s * GROUPS + g).permute((1, 0)), acc, is_async=True)
    return acc, acc2


@gluon.jit
def issue_regs(xs, s, acc, w0, w1, w2, w3, w4, w5, w6, w7):
    """`issue_groups` into one accumulator."""
    return issue_groups(xs, s, acc, acc, (w0, w1, w2, w3, w4, w5, w6, w7), False)[0]


@gluon.jit
def stage_boxes(xs, st, GROUPS: gl.constexpr = GROUPS):
    """Stage `st` of a ``[STAGES * GROUPS, BR, 32]`` activation ring as one ``[GROUPS, BR, 32]``
    view (a memdesc slice needs a constant start; BR is a multiple of the swizzle period, so the
    boxes stacked are the rows of one ``[GROUPS * BR, 32]`` box). GROUPS: 8 (a K step), or 4 (a
    half step, `mainloop`'s refill by halves)."""
    BR: gl.constexpr = xs.shape[1]
    STAGES: gl.constexpr = xs.shape[0] // GROUPS
    flat = xs._reinterpret(xs.dtype, [STAGES, GROUPS * BR, 32], xs.type.layout)
    return flat.index(st).reshape([GROUPS, BR, 32])


@gluon.jit
def act_ring(x_desc, BR: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr):
    """The STAGES-deep activation ring, eight ``[BR, 32]`` bf16 boxes a stage: in `x_desc`'s
    TMA layout, or (GATHER: rows copied by cp.async) the default NVMMA layout for wgmma."""
    if GATHER:
        xs = gl.allocate_shared_memory(gl.bfloat16, [STAGES * GROUPS, BR, 32],
                                       gl.NVMMASharedLayout.get_default_for([BR, 32], gl.bfloat16))
    else:
        xs = gl.allocate_shared_memory(x_desc.dtype, [STAGES * GROUPS, BR, 32], x_desc.layout)
    return xs


@triton.constexpr_function
def store_layout(BR: int, BW: int, num_warps: int) -> gl.BlockedLayout:
    """``[BR, BW]`` output tile, 8 columns (16 bytes) a thread, a row's BW columns in BW / 8 lanes."""
    lanes = min(BW // 8, 32)
    return gl.BlockedLayout([1, 8], [32 // lanes, lanes], [num_warps, 1], [1, 0])


@gluon.jit
def transposed(acc, num_warps: gl.constexpr, dtype: gl.constexpr = gl.bfloat16):
    """`dtype` (bf16; FP32 for a split-K share) ``[BR, BW]`` of the ``[BW, BR]`` accumulator
    (weight rows = output columns), in 8-column row pieces: stored straight from wgmma's layout,
    a warp's store hit 2-byte elements of eight rows (half of each 32-byte sector wasted); the
    transpose goes through shared memory."""
    st_l: gl.constexpr = store_layout(acc.shape[1], acc.shape[0], num_warps)
    return gl.convert_layout(gl.permute(acc.to(dtype), (1, 0)), st_l)


def n_fastest(br: int) -> bool:
    """The program order (`tile_ids`): N tiles fastest for prefill tiles (>= 64 activation rows:
    their activations outgrow the L2 otherwise), row blocks fastest for decode tiles.
    H200, 2026-11-30, 6db97ec: contiguous 128 rows/expert 870.7 -> 776.3 us N fastest; masked 8 tok/expert 258.4 -> 283.9."""
    return br >= 64


def program_grid(blocks: int, n_tiles: int, n_fastest: bool) -> tuple[int, ...]:
    """The launch grid of `tile_ids`: one axis with the N tiles fastest, or (row blocks, N tiles)."""
    return (blocks * n_tiles,) if n_fastest else (blocks, n_tiles)


def act_layout(br: int) -> gl.NVMMASharedLayout:
    """The shared layout of a ``[br, 32]`` bf16 activation box (TMA and wgmma)."""
    return gl.NVMMASharedLayout.get_default_for([br, 32], gl.bfloat16)


def act_desc(a: torch.Tensor, k: int, br: int, groups: int = 8) -> TensorDescriptor:
    """TMA descriptor of the activations ``bf16 [rows, K]`` seen as ``[K / 32, rows, 32]`` (group,
    row, column; strides 32, row stride, 1): one box ``[8, br, 32]`` is a K step's eight
    ``[br, 32]`` group boxes, stacked as the activation ring holds them (``groups=4``: half a
    step: `mainloop`'s refill by halves). Groups past K read 0."""
    return TensorDescriptor(a, [k // 32, a.shape[0], 32], [32, a.stride(0), 1], [groups, br, 32], act_layout(br))


S_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)  # plain rows: sliced by group


def weight_descs(w, bw: int) -> tuple[TensorDescriptor, TensorDescriptor]:
    """TMA descriptors of a prepared weight: words ``[E * N, Kp / 8]`` (box ``[bw, 32]``, one
    K step of `bw` rows) and scales ``[E * Kp / 32, N]`` (box ``[8, bw]``, one step's groups).
    A box past row N of an expert reads the next expert's rows: those outputs are masked."""
    e, n, kw = w.qweight.shape
    if n % 8:
        raise ValueError(f"engine='gluon' loads the scales ([E * Kp/32, N] bf16) through TMA, whose row "
                         f"stride must be a multiple of 16 bytes: N={n} is not a multiple of 8 (use engine='triton')")
    words = w.qweight.view(e * n, kw)
    scales = w.scales.view(-1, n)
    w_desc = TensorDescriptor(words, list(words.shape), [kw, 1], [bw, 32],
                              gl.NVMMASharedLayout.get_default_for([bw, 32], gl.int32))
    s_desc = TensorDescriptor(scales, list(scales.shape), [n, 1], [8, bw], S_LAYOUT)
    return w_desc, s_desc


def weight_desc_types(bw: int) -> dict[str, str]:
    """The compile tier's signature types of `weight_descs`' two descriptors (dtype, box, layout)."""
    words = torch.empty(64, 64, dtype=torch.int32)
    scales = torch.empty(64, 64, dtype=torch.bfloat16)
    return {"w_desc": mangle_type(TensorDescriptor(words, [64, 64], [64, 1], [bw, 32],
                                                   gl.NVMMASharedLayout.get_default_for([bw, 32], gl.int32))),
            "s_desc": mangle_type(TensorDescriptor(scales, [64, 64], [64, 1], [8, bw], S_LAYOUT))}
