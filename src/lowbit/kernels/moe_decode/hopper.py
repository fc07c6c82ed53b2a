"""Tensor-core output-centric MoE decode for INT4 group-32 and MXFP8 weights (engine ``"mma"``, Gluon, sm_90).

The same two stages and the same semantics as `lowbit.kernels.moe_decode.op.moe_decode` (its
docstring and `lowbit.reference.moe_experts_ref(..., round_intermediate=True)`), built to stream
the experts' weight bytes with one to a few tokens, where the Triton ``fma`` engine spends 4-5
CUDA-core instructions a weight.

The main loop, both kernels (`_fill`, `_tile_step`):

- A STAGES-deep cp.async ring in shared memory holds, per 256-wide K step, the packed words
  (16-byte copies), the scales (4-byte copies of row pairs) and the B rows (the tokens'
  activations, ``[8, COLS, 32]`` boxes, zero-filled for dead columns and the K tail). Each step:
  wait for this thread's copies, one CTA barrier, refill the stage read a step ago, then compute.
  Why not a register ring: ptxas sank its loads to the end of the loop body, so every step waited
  a full memory latency (H200, 2026-11-30, commit e0b1760: 1.4-2.0 TB/s). Why not TMA: the W4A16
  GEMMs' TMA skeleton streams 3.1-3.5 TB/s at most (H200, 2026-11-30, commit cdf8ae9).
- Each warp owns 16 weight rows (the ``m16n8k16`` A operand): it reads the step's words straight
  into A fragments (the ``k256-group-nibbles`` layout of the indexed profile is fragment-ready:
  word j of a step is K ``32g + j`` of group g), dequantizes them in place with W4A16's
  `dequant_byte` (the subnormal form of `lowbit.kernels.w4a16.int4`: 1.25 instructions a weight,
  ``bf16((q - 8) * s)`` times 2^-64, so the INT4 partial sums are rescaled once, `_unscale`) and
  issues mma.sync against ldmatrix'd B fragments, FP32 accumulation.
  MXFP8 in the k256-interleaved layout (`lowbit.formats.Mxfp8ExpertWeight`) is the same idea a
  byte wide: 64 words a step (two 32-word tiles in the ring), word c of half step h holding
  element c of groups 4h .. 4h + 3, turned into four bf16 fragments by `E4M3_QUAD_PTX` (2.5
  instructions a weight, exact: every E4M3 code times a power of two is a bf16 number), the
  scales read as bf16 multipliers like INT4's.
- Small batches leave most MMA columns empty, and 16-row blocks alone give too few warps at one
  token, so the ``SPLIT`` warps of a program split the *work* on the same 16 rows: each warp takes
  ``COLS / SPLIT`` of the MMA columns for its share (the mma layout replicates B across warps,
  so columns are where the warps can differ), and `_diagonal_sum` adds the warps' partials once
  at the end through shared memory.

gate_up (`_gate_up_mma_kernel`): grid ``(cdiv(I, 16), routes)``. The program of route r owns 16
neurons of its expert when r is the expert's first route (the dot engine's owner rule); it
gathers that expert's routes, ``COLS / SPLIT`` a pass; 2 SPLIT warps hold the gate rows (warps
< SPLIT) and the up rows, each over its K chunk, then ``SiLU(gate) * up`` of the summed
partials. Other programs of that expert return at once.

down (`_down_mma_kernel`): grid ``(cdiv(H, 16), cdiv(M, COLS / SPLIT))``. A program owns 16
output dims of ``COLS / SPLIT`` tokens and visits each distinct local expert of those tokens once
(a histogram of their ``topk_ids``), SPLIT visits a round (warp w: visit ``round * SPLIT + w``),
in one flat loop over (round, K step) so the ring runs across expert boundaries; after a round's
last step each warp scales its partial per token by ``sum_j topk_weights[t, j]
[topk_ids[t, j] == e]`` into its FP32 accumulator (every slot of a repeated expert counts, as in
the reference). One write of the final output: no padding, no scatter, no combine.

Gluon does not run under the Triton interpreter: the Triton engines stay the path on CPU (and
for natural-layout MXFP8), and the GPU tests compare this engine with the FP32 reference.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from ...formats.moe_mxfp8 import Mxfp8ExpertWeight
from ..compile_tier import KernelConfig
from ..w4a16.int4_gluon import ACC_SCALE, dequant_byte
from .tiles import MMA_EXTRA_TILES, MMA_SPLITS, MMA_SPLITS_MXFP8, ROUTE_CHUNK, TILES

__all__ = ["gate_up_mma_launch", "down_mma_launch", "SMEM_LIMIT", "smem_bytes", "compile_configs"]


def _operands(w, who: str):
    """(words ``int32 [E, N, nk * words a step]``, scales ``bf16 [E, nk * 8, N]``, nk, FP8): an
    INT4 `W4A16Weight` (32 words a 256-wide K step) or a k256-interleaved `Mxfp8ExpertWeight`
    (64: its E4M3 bytes, and its bf16 group multipliers)."""
    if isinstance(w, Mxfp8ExpertWeight):
        if w.layout != "k256-interleaved":
            raise ValueError(f"{who}: the mma decode engine reads MXFP8 in the k256-interleaved layout")
        words, scales, fp8 = w.codes.view(torch.int32), w.mma_scales, True
    else:
        words, scales, fp8 = w.qweight, w.scales, False
    if not (words.is_contiguous() and scales.is_contiguous()):
        raise ValueError(f"{who}: the mma decode engine reads contiguous packed words and scales")
    return words, scales, scales.shape[1] // 8, fp8


#: E4M3 -> bf16 for register fragments, four groups at once: $4 / $5 are the K-adjacent words
#: c, c + 1 of a half step of the k256-interleaved layout (byte o = element c of group o), $6-$9
#: the four groups' multipliers ``2**(E8M0 - 7)`` (duplicated in both halves); $0-$3 the groups'
#: bf16x2 pairs. Per pair: ``prmt`` puts byte o of each word in bytes 1 and 3 (bytes 0 and 2 are
#: don't-cares, masked away), the sign stays at bit 15 / 31, the other seven bits move right by
#: 4 into bf16's exponent and mantissa fields: that is ``code * 2**-120`` exactly (subnormal
#: codes land on bf16 subnormals), so one multiply by the group's ``2**(E8M0 - 7)`` gives
#: ``code * 2**(E8M0 - 127)`` exactly. Five instructions per two weights.
def _e4m3_quad_ptx() -> str:
    body = []
    for o in range(4):
        sel = o | (o << 4) | ((4 + o) << 8) | ((4 + o) << 12)
        body.append(f"prmt.b32 y, $4, $5, {sel:#06x};\nshr.u32 z, y, 4;\nand.b32 z, z, 0x07F007F0;\n"
                    f"lop3.b32 y, y, z, 0x80008000, 0xEC;\nfma.rn.bf16x2 ${o}, y, ${6 + o}, nz;")
    return "{\n.reg .b32 y, z, nz;\nmov.b32 nz, 0x80008000;\n" + "\n".join(body) + "\n}"


E4M3_QUAD_PTX = gl.constexpr(_e4m3_quad_ptx())


@gluon.jit
def _dequant_e4m3(words, s0, s1, s2, s3):
    """The four bf16 A fragments (groups 4h .. 4h + 3 of half step h) of `words` (``[rows, 32]``
    i32 of the k256-interleaved layout, a k_width-2 dot operand layout); s0-s3 ``[rows, 1]``."""
    _, s0 = gl.broadcast(words, s0)
    _, s1 = gl.broadcast(words, s1)
    _, s2 = gl.broadcast(words, s2)
    _, s3 = gl.broadcast(words, s3)
    return gl.inline_asm_elementwise(E4M3_QUAD_PTX, "=r,=r,=r,=r,r,r,r,r,r,r", [words, s0, s1, s2, s3],
                                     dtype=(gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16), is_pure=True, pack=2)



@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _unscale(FP8: gl.constexpr):
    """The factor taking a `_tile_step` accumulator to the true scale: INT4 fragments are 2^-64
    times the weights (exact either way)."""
    if FP8:
        f: gl.constexpr = 1.0
    else:
        f: gl.constexpr = ACC_SCALE
    return f


@gluon.jit
def _rings(ROWS: gl.constexpr, COLS: gl.constexpr, STAGES: gl.constexpr, HALVES: gl.constexpr):
    """The STAGES-deep cp.async rings: packed words ``[STAGES * HALVES, ROWS, 32]`` i32 (HALVES
    = 1 for INT4, 2 for MXFP8: 32 words a tile; 32-byte units XOR-swizzled by row mod 4: a
    half-warp's 8-byte fragment reads, 4 rows x 4 lanes, then hit all 32 banks once; 8-byte
    units by row mod 8 left them 4-way conflicted), scales ``[STAGES, 8, ROWS]`` bf16 and the B
    rows ``[STAGES * 8, COLS, 32]`` bf16 (ldmatrix reads)."""
    wring = gl.allocate_shared_memory(gl.int32, [STAGES * HALVES, ROWS, 32], gl.SwizzledSharedLayout(8, 1, 4, [1, 0]))
    sring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 8, ROWS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    xring = gl.allocate_shared_memory(gl.bfloat16, [STAGES * 8, COLS, 32],
                                      gl.NVMMASharedLayout.get_default_for([COLS, 32], gl.bfloat16))
    return wring, sring, xring


@gluon.jit
def _fill(wring, sring, xring, st, kt, w_rows, w_ok, s_ptr, s_rows, s_ok, s_step, x_rows, x_k0, x_ok, K,
          wc_l: gl.constexpr, sc_l: gl.constexpr, x_l: gl.constexpr):
    """cp.async of K step `kt` into stage `st` of the rings, one commit group. Per row (row
    vectors, so no pointer tile stays live across the loop): w_rows ``[ROWS]`` pointers to each
    weight row's K step 0 (its warp's K chunk included) and w_ok, in ``SliceLayout(1, wc_l)``;
    s_rows / s_ok the same for the scales as element offsets from `s_ptr` (``SliceLayout(0,
    sc_l)``, `s_step` elements a K step);
    x_rows / x_ok ``[COLS]`` the B rows (``SliceLayout(0, SliceLayout(2, x_l))``), group g = K
    ``x_k0 + 256kt + 32g ..``, zero past `K`. Words go in 16-byte pieces, scales in 4-byte
    ones (two adjacent rows), the ``[8, COLS, 32]`` B boxes in 16-byte ones. Dead rows and steps
    are zero-filled: they add exact zeros. The copies need not land where the reading thread
    wants them: the consumer waits for its own groups, then a CTA barrier."""
    COLS: gl.constexpr = xring.shape[1]
    STAGES: gl.constexpr = xring.shape[0] // 8
    HALVES: gl.constexpr = wring.shape[0] // STAGES
    cols = gl.arange(0, 32, layout=gl.SliceLayout(0, wc_l))
    for h in gl.static_range(HALVES):  # MXFP8: a step's 64 words as two 32-word tiles
        async_copy.async_copy_global_to_shared(wring.index(st * HALVES + h),
                                               w_rows[:, None] + ((kt * HALVES + h) * 32 + cols)[None, :],
                                               mask=w_ok[:, None])
    g_s = gl.arange(0, 8, layout=gl.SliceLayout(1, sc_l))
    s_off = s_rows[None, :] + (kt * s_step + g_s * (s_step // 8))[:, None]
    # a row pair never straddles a 16-row block: its two scales are adjacent and share the mask
    s_off = gl.max_contiguous(gl.multiple_of(s_off, [1, 2]), [1, 2])
    async_copy.async_copy_global_to_shared(sring.index(st), s_ptr + s_off, mask=gl.max_constancy(s_ok[None, :], [1, 2]))
    g = gl.arange(0, 8, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_l)))[:, None, None]
    j = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_l)))[None, None, :]
    boxes = xring._reinterpret(gl.bfloat16, [STAGES, 8 * COLS, 32], xring.type.layout).index(st).reshape([8, COLS, 32])
    k = x_k0[None, :, None] + kt * 256 + g * 32  # K is a multiple of 32: a group is all in or all out
    async_copy.async_copy_global_to_shared(boxes, x_rows[None, :, None] + (k + j), mask=x_ok[None, :, None] & (k < K))
    async_copy.commit_group()


@gluon.jit
def _member_routes(ids_ptr, e, r, num_routes, want, ROUTE_CHUNK: gl.constexpr, scan: gl.constexpr,
                   flat: gl.constexpr):
    """The routes of expert e from route r on, by rank: ``route[i]`` = the ``want[i]``-th (0 for a
    rank past the last). want: ``[T]`` in ``SliceLayout(1, scan)``."""
    rr_l: gl.constexpr = gl.SliceLayout(0, scan)
    route = gl.zeros_like(want)
    base = gl.sum(gl.zeros([ROUTE_CHUNK], gl.int32, rr_l), axis=0)
    for c in range(r // ROUTE_CHUNK, gl.cdiv(num_routes, ROUTE_CHUNK)):
        rr = c * ROUTE_CHUNK + gl.arange(0, ROUTE_CHUNK, layout=rr_l)
        hit = (gl.load(ids_ptr + rr, mask=rr < num_routes, other=-1) == e) & (rr >= r)
        # the scan runs in a 1-D blocked layout (Triton 3.6 cannot scan a sliced one)
        rank = gl.associative_scan(gl.convert_layout(hit.to(gl.int32), flat), 0, _add)
        rank = base + gl.convert_layout(rank, rr_l) - 1
        sel = hit[None, :] & (rank[None, :] == want[:, None])
        route += gl.sum(gl.where(sel, rr[None, :], 0), axis=1)
        base += gl.sum(hit.to(gl.int32), axis=0)
    return route


@gluon.jit
def _tile_step(wring, sring, xring, st, row0: gl.constexpr, BW: gl.constexpr, dot_a: gl.constexpr,
               dot_b: gl.constexpr, acc_e, acc_o, FP8: gl.constexpr):
    """One 256-wide K step of the ``[BW, COLS]`` tile whose words are rows ``row0 .. row0+BW`` of
    stage `st`: dequantized straight into A fragments (INT4: W4A16's `dequant_byte`, 2^-64 times
    the weights;
    MXFP8: `_dequant_e4m3`, a half step's four groups at once), times the stage's B boxes;
    groups 2j / 2j + 1 into the even / odd accumulator (two mma.sync chains)."""
    ROWS: gl.constexpr = wring.shape[1]
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    sc = sring.index(st)._reinterpret(gl.bfloat16, [8 * ROWS], plain)
    srow: gl.constexpr = gl.SliceLayout(1, dot_a)
    if FP8:
        for h in gl.static_range(2):
            words = wring.index(st * 2 + h).slice(row0, BW, dim=0).load(dot_a)
            s0 = sc.slice((4 * h) * ROWS + row0, BW).load(srow)
            s1 = sc.slice((4 * h + 1) * ROWS + row0, BW).load(srow)
            s2 = sc.slice((4 * h + 2) * ROWS + row0, BW).load(srow)
            s3 = sc.slice((4 * h + 3) * ROWS + row0, BW).load(srow)
            w0, w1, w2, w3 = _dequant_e4m3(words, s0[:, None], s1[:, None], s2[:, None], s3[:, None])
            acc_e = mma_v2(w0, xring.index(st * 8 + 4 * h).permute((1, 0)).load(dot_b), acc_e)
            acc_o = mma_v2(w1, xring.index(st * 8 + 4 * h + 1).permute((1, 0)).load(dot_b), acc_o)
            acc_e = mma_v2(w2, xring.index(st * 8 + 4 * h + 2).permute((1, 0)).load(dot_b), acc_e)
            acc_o = mma_v2(w3, xring.index(st * 8 + 4 * h + 3).permute((1, 0)).load(dot_b), acc_o)
    else:
        words = wring.index(st).slice(row0, BW, dim=0).load(dot_a)
        for j in gl.static_range(4):
            s_e = sc.slice((2 * j) * ROWS + row0, BW).load(srow)
            s_o = sc.slice((2 * j + 1) * ROWS + row0, BW).load(srow)
            xe = xring.index(st * 8 + 2 * j).permute((1, 0)).load(dot_b)
            xo = xring.index(st * 8 + 2 * j + 1).permute((1, 0)).load(dot_b)
            w_e, w_o = dequant_byte(words, s_e[:, None], s_o[:, None], j)
            acc_e = mma_v2(w_e, xe, acc_e)
            acc_o = mma_v2(w_o, xo, acc_o)
    return acc_e, acc_o


@gluon.jit
def _diagonal_sum(red, SPLIT: gl.constexpr, row0: gl.constexpr, out_l: gl.constexpr):
    """``[16, COLS / SPLIT]`` from the shared copy `red` of an accumulator ``[rows, COLS]``: the
    sum over w < SPLIT of the rows ``row0 + 16 w ..`` (warp ``row0 / 16 + w``) x column block w --
    each warp's partial of the same outputs (the caller stores `red` between two barriers)."""
    COLS: gl.constexpr = red.shape[1]
    MB: gl.constexpr = COLS // SPLIT
    total = red.slice(row0, 16, dim=0).slice(0, MB, dim=1).load(out_l)
    for w in gl.static_range(1, SPLIT):
        total += red.slice(row0 + 16 * w, 16, dim=0).slice(w * MB, MB, dim=1).load(out_l)
    return total


@gluon.jit
def _gate_up_mma_kernel(
    x_ptr, ids_ptr, w_ptr, s_ptr, act_ptr,
    num_routes, top_k, num_experts, H, I, nk,
    stride_xm, stride_am,
    COLS: gl.constexpr, ROUTE_CHUNK: gl.constexpr, STAGES: gl.constexpr, X_LAYOUT: gl.constexpr,
    FP8: gl.constexpr, num_warps: gl.constexpr,
):
    """Program (ib, r): neurons ``16 ib ..`` of the routes of expert ``topk_ids.flat[r]`` when r is
    that expert's first route. W13 words ``[E, 2I, nk * WPS]`` (WPS = 32 words a K step for
    INT4, 64 for k256-interleaved MXFP8), scales ``[E, nk * 8, 2I]``.

    The num_warps = 2 SPLIT warps: warp w < SPLIT holds the 16 gate rows, warp SPLIT + w the 16
    up rows, both over K steps ``w * CK ..`` (CK = cdiv(nk, SPLIT)), against their own block of
    ``MB = COLS / SPLIT`` B columns (the members' hidden rows at that K chunk): the mma layout
    replicates B across warps, so the columns are where the warps differ. One tile a warp keeps
    the registers down (two tiles a warp: 216-248 registers, 2 warps a scheduler). The warps'
    partials are summed at the end (`_diagonal_sum`), then SiLU(gate) * up."""
    SPLIT: gl.constexpr = num_warps // 2
    MB: gl.constexpr = COLS // SPLIT
    BW: gl.constexpr = 16 * SPLIT
    HALVES: gl.constexpr = 2 if FP8 else 1
    WPS: gl.constexpr = 32 * HALVES
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    dot_b: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    scan: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    wc_l: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [num_warps, 1], [1, 0])  # [2 BW, 32] word copies
    sc_l: gl.constexpr = gl.BlockedLayout([1, 2], [4, 8], [1, num_warps], [1, 0])  # [8, 2 BW] scale copies
    out_l: gl.constexpr = gl.BlockedLayout([1, 1], [32 // MB, MB], [num_warps, 1], [1, 0])  # [16, MB]
    xrow_l: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, X_LAYOUT))
    pid_i = gl.program_id(0)
    r = gl.program_id(1)
    i0 = pid_i * 16
    e = gl.load(ids_ptr + r)
    if (e < 0) | (e >= num_experts):  # dropped slot: its act row is defined as 0
        ri = i0 + gl.arange(0, 16, layout=flat)
        gl.store(act_ptr + r.to(gl.int64) * stride_am + ri, gl.zeros([16], gl.bfloat16, flat), mask=ri < I)
        return
    # owner rule: the first route of expert e computes every route of expert e
    rr_l: gl.constexpr = gl.SliceLayout(0, scan)
    earlier = gl.sum(gl.zeros([ROUTE_CHUNK], gl.int32, rr_l), axis=0)
    for c in range(0, gl.cdiv(r, ROUTE_CHUNK)):
        rr = c * ROUTE_CHUNK + gl.arange(0, ROUTE_CHUNK, layout=rr_l)
        earlier += gl.sum((gl.load(ids_ptr + rr, mask=rr < r, other=-1) == e).to(gl.int32), axis=0)
    if earlier > 0:
        return
    n_members = gl.sum(gl.zeros([ROUTE_CHUNK], gl.int32, rr_l), axis=0)
    for c in range(r // ROUTE_CHUNK, gl.cdiv(num_routes, ROUTE_CHUNK)):
        rr = c * ROUTE_CHUNK + gl.arange(0, ROUTE_CHUNK, layout=rr_l)
        hit = (gl.load(ids_ptr + rr, mask=rr < num_routes, other=-1) == e) & (rr >= r)
        n_members += gl.sum(hit.to(gl.int32), axis=0)

    e64 = e.to(gl.int64)
    CK = gl.cdiv(nk, SPLIT)
    # word copies: row m = (projection m // BW, warp (m % BW) // 16, neuron i0 + m % 16)
    m_w = gl.arange(0, 2 * BW, layout=gl.SliceLayout(1, wc_l))
    n_w = i0 + m_w % 16
    k0_w = ((m_w % BW) // 16) * CK  # the warp's first K step
    w_rows = w_ptr + (e64 * (2 * I) + (m_w // BW) * I + n_w) * (nk * WPS) + k0_w * WPS
    # scale copies: [8 groups, 2 BW rows], rows as the words
    m_s = gl.arange(0, 2 * BW, layout=gl.SliceLayout(0, sc_l))
    n_s = i0 + m_s % 16
    k0_s = ((m_s % BW) // 16) * CK
    s_rows = e64 * (nk * 8) * (2 * I) + (k0_s * 8) * (2 * I) + (m_s // BW) * I + n_s
    # B rows: column c = (warp c // MB, member c % MB); x rows and their K chunk
    cx = gl.arange(0, COLS, layout=xrow_l)
    k0_x = (cx // MB) * CK
    wring, sring, xring = _rings(2 * BW, COLS, STAGES, HALVES)
    red = gl.allocate_shared_memory(gl.float32, [2 * BW, COLS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    want_l: gl.constexpr = gl.SliceLayout(1, scan)
    x_k0 = k0_x * 256
    for grp in range(0, gl.cdiv(n_members, MB)):
        # column c: the member route of rank grp * MB + c % MB, at warp c // MB's K chunk
        want = grp * MB + gl.arange(0, COLS, layout=want_l) % MB
        route = _member_routes(ids_ptr, e, r, num_routes, want, ROUTE_CHUNK, scan, flat)
        route_x = gl.convert_layout(route, xrow_l)
        x_rows = x_ptr + (route_x // top_k).to(gl.int64) * stride_xm
        x_ok = gl.convert_layout(want < n_members, xrow_l)

        acc_e = gl.zeros([2 * BW, COLS], gl.float32, mma)
        acc_o = gl.zeros([2 * BW, COLS], gl.float32, mma)
        for st in gl.static_range(STAGES - 1):
            _fill(wring, sring, xring, st, st, w_rows, (n_w < I) & (k0_w + st < nk) & (st < CK), s_ptr, s_rows,
                  (n_s < I) & (k0_s + st < nk) & (st < CK), 8 * 2 * I, x_rows, x_k0, x_ok & (st < CK), H,
                  wc_l, sc_l, X_LAYOUT)
        for kt in range(0, CK):
            async_copy.wait_group(STAGES - 2)  # step kt landed (this thread's copies)
            gl.thread_barrier()  # every thread's copies landed; the stage refilled next was read
            nxt = kt + STAGES - 1
            _fill(wring, sring, xring, nxt % STAGES, nxt, w_rows, (n_w < I) & (k0_w + nxt < nk) & (nxt < CK), s_ptr,
                  s_rows,
                  (n_s < I) & (k0_s + nxt < nk) & (nxt < CK), 8 * 2 * I, x_rows, x_k0, x_ok & (nxt < CK), H,
                  wc_l, sc_l, X_LAYOUT)
            acc_e, acc_o = _tile_step(wring, sring, xring, kt % STAGES, 0, 2 * BW, dot_a, dot_b, acc_e, acc_o, FP8)
        async_copy.wait_group(0)
        gl.thread_barrier()  # `red` may hold the previous pass's tile
        red.store((acc_e + acc_o) * _unscale(FP8))
        gl.thread_barrier()
        g = _diagonal_sum(red, SPLIT, 0, out_l)
        u = _diagonal_sum(red, SPLIT, BW, out_l)
        act = (g / (1.0 + gl.exp(-g)) * u).to(gl.bfloat16)
        rows_o = i0 + gl.arange(0, 16, layout=gl.SliceLayout(1, out_l))
        want_o = grp * MB + gl.arange(0, MB, layout=want_l)
        route_o = gl.convert_layout(_member_routes(ids_ptr, e, r, num_routes, want_o, ROUTE_CHUNK, scan, flat),
                                    gl.SliceLayout(0, out_l))
        ok_o = gl.convert_layout(want_o < n_members, gl.SliceLayout(0, out_l))
        a = act_ptr + route_o.to(gl.int64)[None, :] * stride_am + rows_o[:, None]
        gl.store(a, act, mask=(rows_o < I)[:, None] & ok_o[None, :])
        gl.thread_barrier()  # the next pass refills the rings


@gluon.jit
def _round_experts(rf, present, rank, bins, SPLIT: gl.constexpr, flat: gl.constexpr):
    """``[SPLIT]`` in `flat`: the experts of round `rf`'s visits ``rf * SPLIT + w`` (the v-th
    present expert; -1 past the last)."""
    v = rf * SPLIT + gl.arange(0, SPLIT, layout=flat)
    e = gl.zeros([SPLIT], gl.int32, flat) - 1
    for w in gl.static_range(SPLIT):
        hit = present & (rank == rf * SPLIT + w)
        e_w = gl.where(gl.max(hit.to(gl.int32), axis=0) > 0, gl.sum(gl.where(hit, bins, 0), axis=0), -1)
        e = gl.where(v == rf * SPLIT + w, e_w, e)
    return e


@gluon.jit
def _pick(e_w, idx, layout: gl.constexpr):
    """``e_w[idx]`` for a vector of indices idx < SPLIT in `layout` (a select over the SPLIT <= 8
    entries of e_w, a `flat` vector)."""
    SPLIT: gl.constexpr = e_w.shape[0]
    out = gl.zeros(idx.shape, gl.int32, layout)
    sel = gl.arange(0, SPLIT, layout=e_w.type.layout)
    for w in gl.static_range(SPLIT):
        out = gl.where(idx == w, gl.sum(gl.where(sel == w, e_w, 0), axis=0), out)
    return out


@gluon.jit
def _round_sources(rf, present, rank, bins, h0, H, nk, w_ptr, s_ptr, act_ptr, ids_ptr, t0, M, top_k, I,
                   MB: gl.constexpr, WPS: gl.constexpr, wc_l: gl.constexpr, sc_l: gl.constexpr, x2_l: gl.constexpr,
                   flat: gl.constexpr):
    """Copy sources of round `rf` (row vectors for `_fill`): warp w's 16 output rows of W2[e_w] and
    its MB B columns (each token's act row of its first slot with e_w, dead for tokens without
    it), for visit ``rf * SPLIT + w``."""
    SPLIT: gl.constexpr = wc_l.warps_per_cta[0]
    BW: gl.constexpr = 16 * SPLIT
    COLS: gl.constexpr = MB * SPLIT
    e_w = _round_experts(rf, present, rank, bins, SPLIT, flat)
    m_w = gl.arange(0, BW, layout=gl.SliceLayout(1, wc_l))
    ew = _pick(e_w, m_w // 16, gl.SliceLayout(1, wc_l))
    h_w = h0 + m_w % 16
    w_rows = w_ptr + (ew.to(gl.int64) * H + h_w) * (nk * WPS)
    w_ok = (ew >= 0) & (h_w < H)
    m_s = gl.arange(0, BW, layout=gl.SliceLayout(0, sc_l))
    es = _pick(e_w, m_s // 16, gl.SliceLayout(0, sc_l))
    h_s = h0 + m_s % 16
    s_rows = es.to(gl.int64) * (nk * 8 * H) + h_s
    s_ok = (es >= 0) & (h_s < H)
    c_x = gl.arange(0, COLS, layout=gl.SliceLayout(0, x2_l))
    ex = _pick(e_w, c_x // MB, gl.SliceLayout(0, x2_l))
    tok = t0 + c_x % MB
    jx = gl.arange(0, 32, layout=gl.SliceLayout(1, x2_l))
    ids_x = gl.load(ids_ptr + tok[None, :] * top_k + jx[:, None], mask=(jx < top_k)[:, None] & (tok < M)[None, :],
                    other=-1)
    slot = gl.min(gl.where(ids_x == ex[None, :], jx[:, None], 32), axis=0)
    x_ok = (slot < 32) & (tok < M) & (ex >= 0)
    x_rows = act_ptr + ((tok * top_k + gl.where(x_ok, slot, 0)) * I).to(gl.int64)
    return w_rows, w_ok, s_rows, s_ok, gl.convert_layout(x_rows, gl.SliceLayout(0, x2_l)), x_ok


@gluon.jit
def _advance_fill(rf, kf, sources, present, rank, bins, h0, H, nk, w_ptr, s_ptr, act_ptr, ids_ptr, t0, M, top_k, I,
                  MB: gl.constexpr, WPS: gl.constexpr, wc_l: gl.constexpr, sc_l: gl.constexpr, x2_l: gl.constexpr,
                  flat: gl.constexpr):
    """The fill side's next (round, K step): past a round's last step, the next round's copy
    sources (`_round_sources`); `sources` otherwise."""
    w_rows, w_ok, s_rows, s_ok, x_rows, x_ok = sources
    kf += 1
    if kf == nk:
        rf += 1
        kf = 0
        w_rows, w_ok, s_rows, s_ok, x_rows, x_ok = _round_sources(
            rf, present, rank, bins, h0, H, nk, w_ptr, s_ptr, act_ptr, ids_ptr, t0, M, top_k, I, MB, WPS, wc_l, sc_l,
            x2_l, flat)
    return rf, kf, w_rows, w_ok, s_rows, s_ok, x_rows, x_ok


@gluon.jit
def _down_mma_kernel(
    act_ptr, ids_ptr, tw_ptr, w_ptr, s_ptr, out_ptr,
    M, top_k, num_experts, H, I, nk,
    stride_om,
    COLS: gl.constexpr, POS: gl.constexpr, E_P2: gl.constexpr, STAGES: gl.constexpr, X_LAYOUT: gl.constexpr,
    FP8: gl.constexpr, num_warps: gl.constexpr,
):
    """Program (hb, tb): outputs ``16 hb ..`` of tokens ``tb * MB ..`` (MB = COLS / num_warps).
    W2 words ``[E, H, nk * 32]``, scales ``[E, nk * 8, H]``; act ``[M, top_k, I]`` contiguous.

    The distinct local experts of the MB tokens (a histogram of their ids) are visited in
    rounds: in round it, warp w runs visit ``it * num_warps + w`` over all of K (its 16 rows of
    W2[e], its block of MB B columns: the tokens' act rows for e), then folds the routing weights
    ``sum_j topk_weights[t, j] [topk_ids[t, j] == e]`` into its accumulator per token. The warps'
    accumulators hold partials of the same outputs, summed at the end (`_diagonal_sum`). One
    flat loop over (round, K step), so the ring runs across expert boundaries."""
    SPLIT: gl.constexpr = num_warps
    MB: gl.constexpr = COLS // SPLIT
    BW: gl.constexpr = 16 * SPLIT
    HALVES: gl.constexpr = 2 if FP8 else 1
    WPS: gl.constexpr = 32 * HALVES  # words a 256-wide K step
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    dot_b: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    wc_l: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [num_warps, 1], [1, 0])  # [BW, 32] word copies
    sc_l: gl.constexpr = gl.BlockedLayout([1, 2], [4, 8], [1, num_warps], [1, 0])  # [8, BW] scale copies
    out_l: gl.constexpr = gl.BlockedLayout([1, 1], [32 // MB, MB], [num_warps, 1], [1, 0])  # [16, MB]
    x2_l: gl.constexpr = gl.SliceLayout(2, X_LAYOUT)  # [rows, COLS]: the B columns' parent
    pid_h = gl.program_id(0)
    t0 = gl.program_id(1) * MB
    h0 = pid_h * 16
    n_pos = gl.minimum(M - t0, MB) * top_k
    # the distinct local experts of these tokens: a histogram of their ids
    p = gl.arange(0, POS, layout=flat)
    ids_p = gl.load(ids_ptr + t0 * top_k + p, mask=p < n_pos, other=-1)
    ok_p = (ids_p >= 0) & (ids_p < num_experts) & (p < n_pos)
    present = gl.histogram(ids_p, E_P2, mask=ok_p, layout=flat) > 0
    rank = gl.associative_scan(present.to(gl.int32), 0, _add) - 1
    bins = gl.arange(0, E_P2, layout=flat)
    n_steps = gl.cdiv(gl.sum(present.to(gl.int32), axis=0), SPLIT) * nk
    wring, sring, xring = _rings(BW, COLS, STAGES, HALVES)
    red = gl.allocate_shared_memory(gl.float32, [BW, COLS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    x_k0 = gl.zeros([COLS], gl.int32, gl.SliceLayout(0, x2_l))

    acc = gl.zeros([BW, COLS], gl.float32, mma)
    part_e = gl.zeros([BW, COLS], gl.float32, mma)
    part_o = gl.zeros([BW, COLS], gl.float32, mma)
    # the fill side walks (round rf, step kf) STAGES - 1 steps ahead of the compute side
    rf = 0
    kf = 0
    w_rows, w_ok, s_rows, s_ok, x_rows, x_ok = _round_sources(0, present, rank, bins, h0, H, nk, w_ptr, s_ptr, act_ptr,
                                                              ids_ptr, t0, M, top_k, I, MB, WPS, wc_l, sc_l, x2_l, flat)
    for st in gl.static_range(STAGES - 1):
        live = st < n_steps
        _fill(wring, sring, xring, st, kf, w_rows, w_ok & live, s_ptr, s_rows, s_ok & live, 8 * H, x_rows, x_k0,
              x_ok & live, I, wc_l, sc_l, X_LAYOUT)
        rf, kf, w_rows, w_ok, s_rows, s_ok, x_rows, x_ok = _advance_fill(
            rf, kf, (w_rows, w_ok, s_rows, s_ok, x_rows, x_ok), present, rank, bins, h0, H, nk, w_ptr, s_ptr, act_ptr,
            ids_ptr, t0, M, top_k, I, MB, WPS, wc_l, sc_l, x2_l, flat)
    kt = 0
    it = 0
    for st in range(0, n_steps):
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()
        live = st + STAGES - 1 < n_steps
        _fill(wring, sring, xring, (st + STAGES - 1) % STAGES, kf, w_rows, w_ok & live, s_ptr, s_rows, s_ok & live,
              8 * H, x_rows, x_k0, x_ok & live, I, wc_l, sc_l, X_LAYOUT)
        rf, kf, w_rows, w_ok, s_rows, s_ok, x_rows, x_ok = _advance_fill(
            rf, kf, (w_rows, w_ok, s_rows, s_ok, x_rows, x_ok), present, rank, bins, h0, H, nk, w_ptr, s_ptr, act_ptr,
            ids_ptr, t0, M, top_k, I, MB, WPS, wc_l, sc_l, x2_l, flat)
        part_e, part_o = _tile_step(wring, sring, xring, st % STAGES, 0, BW, dot_a, dot_b, part_e, part_o, FP8)
        kt += 1
        if kt == nk:  # the round's last step: fold each visit's routing weights in, per column
            e_c = _pick(_round_experts(it, present, rank, bins, SPLIT, flat),
                        gl.arange(0, COLS, layout=gl.SliceLayout(0, mma)) // MB, gl.SliceLayout(0, mma))
            jm = gl.arange(0, 32, layout=gl.SliceLayout(1, mma))
            tok_m = t0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, mma)) % MB
            okm = (jm < top_k)[:, None] & (tok_m < M)[None, :]
            ids_m = gl.load(ids_ptr + tok_m[None, :] * top_k + jm[:, None], mask=okm, other=-1)
            tw_m = gl.load(tw_ptr + tok_m[None, :] * top_k + jm[:, None], mask=okm, other=0.0)
            coef = gl.sum(gl.where((ids_m == e_c[None, :]) & (e_c >= 0)[None, :], tw_m, 0.0), axis=0)
            acc += (part_e + part_o) * (coef * _unscale(FP8))[None, :]
            part_e = gl.zeros([BW, COLS], gl.float32, mma)
            part_o = gl.zeros([BW, COLS], gl.float32, mma)
            kt = 0
            it += 1
    async_copy.wait_group(0)
    red.store(acc)
    gl.thread_barrier()
    y = _diagonal_sum(red, SPLIT, 0, out_l)
    rows_o = h0 + gl.arange(0, 16, layout=gl.SliceLayout(1, out_l))
    tok_o = t0 + gl.arange(0, MB, layout=gl.SliceLayout(0, out_l))
    o = out_ptr + tok_o.to(gl.int64)[None, :] * stride_om + rows_o[:, None]
    gl.store(o, y.to(gl.bfloat16), mask=(rows_o < H)[:, None] & (tok_o < M)[None, :])


# =========================================================================== launchers
def _maxnreg(stage: str) -> dict:
    """Experiment knob, not a tuned default: ``LOWBIT_DECODE_MMA_MAXNREG_<STAGE>`` caps the
    registers a thread (occupancy experiments)."""
    v = os.environ.get(f"LOWBIT_DECODE_MMA_MAXNREG_{stage}")
    return {"maxnreg": int(v)} if v else {}


#: Shared memory a CTA may hold on sm_90 (227 KB).
SMEM_LIMIT = 227 * 1024


def smem_bytes(rows: int, cols: int, stages: int, fp8: bool) -> int:
    """Shared memory of a program: the rings (`_rings`: words, scales, B boxes a stage) plus
    the FP32 partials' buffer; MXFP8 words take twice INT4's."""
    return stages * (rows * 128 * (2 if fp8 else 1) + 16 * rows + 512 * cols) + 4 * rows * cols


def _check_smem(who: str, rows: int, cols: int, stages: int, fp8: bool) -> None:
    """A clear error for an override whose `smem_bytes` exceed what a CTA may hold."""
    need = smem_bytes(rows, cols, stages, fp8)
    if need > SMEM_LIMIT:
        raise ValueError(f"{who}: {rows} weight rows x {cols} columns x {stages} stages need {need // 1024} KB of "
                         f"shared memory ({'MXFP8' if fp8 else 'INT4'}), over {SMEM_LIMIT // 1024} KB: fewer split "
                         "warps or stages")


@lru_cache(maxsize=None)
def _x_layout(cols: int, num_warps: int) -> gl.BlockedLayout:
    """The B copies' layout for a stage's ``[8, cols, 32]`` bf16 boxes: 16-byte pieces, warps
    along the groups (each warp copies whole boxes, no thread copies a piece twice)."""
    return gl.BlockedLayout([1, 1, 8], [1, 8, 4], [num_warps, 1, 1], [2, 1, 0])


def gate_up_mma_launch(hidden, topk_ids, w13, out, cols: int, split: int, stages: int) -> None:
    """`moe_decode_gate_up` on the mma engine (arguments checked by the caller). hidden
    ``bf16 [M, H]``; topk_ids ``int32 [M, k]``; w13 ``[E, 2I, H]``, a `W4A16Weight` or a
    k256-interleaved `Mxfp8ExpertWeight`; out ``bf16 [M, k, I]`` contiguous; cols B columns (8
    or 16), split warps splitting K (members a pass = cols / split); stages the ring depth."""
    words, scales, nk, fp8 = _operands(w13, "w13")
    m, h = hidden.shape
    top_k = topk_ids.shape[1]
    inter = w13.n // 2
    _check_smem("moe_decode_gate_up (mma)", 32 * split, cols, stages, fp8)
    grid = (triton.cdiv(inter, 16), m * top_k)
    _gate_up_mma_kernel[grid](
        hidden, topk_ids, words, scales, out,
        m * top_k, top_k, w13.num_experts, h, inter, nk,
        hidden.stride(0), inter,
        COLS=cols, ROUTE_CHUNK=ROUTE_CHUNK, STAGES=stages, X_LAYOUT=_x_layout(cols, 2 * split), FP8=fp8,
        num_warps=2 * split, **_maxnreg("GATE_UP"),
    )


def down_mma_launch(act, topk_ids, topk_weights, w2, out, cols: int, split: int, stages: int) -> None:
    """`moe_decode_down` on the mma engine (arguments checked by the caller). act ``bf16 [M, k, I]``
    contiguous; topk_ids ``int32 [M, k]``; topk_weights ``fp32 [M, k]``; w2 ``[E, H, I]``, a
    `W4A16Weight` or a k256-interleaved `Mxfp8ExpertWeight`; out ``bf16 [M, H]`` contiguous
    along H; cols B columns, split warps splitting the expert visits (tokens a program = cols /
    split); stages the ring depth."""
    words, scales, nk, fp8 = _operands(w2, "w2")
    m, top_k, inter = act.shape
    h = w2.n
    if top_k > 32:
        raise ValueError(f"the mma decode engine takes top_k <= 32, got {top_k}")
    mb = cols // split
    _check_smem("moe_decode_down (mma)", 16 * split, cols, stages, fp8)
    grid = (triton.cdiv(h, 16), triton.cdiv(m, mb))
    _down_mma_kernel[grid](
        act, topk_ids, topk_weights, words, scales, out,
        m, top_k, w2.num_experts, h, inter, nk,
        out.stride(0),
        COLS=cols, POS=triton.next_power_of_2(mb * top_k), E_P2=triton.next_power_of_2(w2.num_experts),
        STAGES=stages, X_LAYOUT=_x_layout(cols, split), FP8=fp8, num_warps=split, **_maxnreg("DOWN"),
    )


# =========================================================================== compile tier
def compile_configs() -> list[KernelConfig]:
    """Every tile of both kernels for the compile tier (mma.sync in the SASS, no spills): the
    heuristics' picks (`tiles.MMA_SPLITS`, `tiles.MMA_SPLITS_MXFP8`) and `tiles.MMA_EXTRA_TILES`."""
    gate_up_sig = {"x_ptr": "*bf16", "ids_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*bf16", "act_ptr": "*bf16",
                   "num_routes": "i32", "top_k": "i32", "num_experts": "i32", "H": "i32", "I": "i32", "nk": "i32",
                   "stride_xm": "i32", "stride_am": "i32",
                   "COLS": "constexpr", "ROUTE_CHUNK": "constexpr", "STAGES": "constexpr", "X_LAYOUT": "constexpr",
                   "FP8": "constexpr", "num_warps": "constexpr"}
    down_sig = {"act_ptr": "*bf16", "ids_ptr": "*i32", "tw_ptr": "*fp32", "w_ptr": "*i32", "s_ptr": "*bf16",
                "out_ptr": "*bf16", "M": "i32", "top_k": "i32", "num_experts": "i32", "H": "i32", "I": "i32",
                "nk": "i32", "stride_om": "i32", "COLS": "constexpr", "POS": "constexpr", "E_P2": "constexpr",
                "STAGES": "constexpr", "X_LAYOUT": "constexpr", "FP8": "constexpr", "num_warps": "constexpr"}
    stages = TILES["mma", "int4"][3]
    if stages != TILES["mma", "mxfp8_k256"][3]:
        raise ValueError("tiles.TILES: the mma engine's INT4 and MXFP8 rows must share one ring depth")
    picks = MMA_SPLITS + MMA_SPLITS_MXFP8
    gate_up = {(min(t, 16), sg) for _, t, sg, _ in picks} | {(c, w) for c, w in MMA_EXTRA_TILES if c <= 16}
    down = {(t, sd) for _, t, _, sd in picks} | set(MMA_EXTRA_TILES)
    out = []
    for fp8 in (False, True):  # INT4, k256-interleaved MXFP8 (the same tiles)
        tag = ",fp8" if fp8 else ""
        for cols, split in sorted(t for t in gate_up if not fp8 or t[1] <= 4):  # MXFP8 split 8: over 227 KB
            out.append(KernelConfig(
                f"moe_decode_gate_up_mma[C={cols},split={split},s={stages}{tag}]", _gate_up_mma_kernel, gate_up_sig,
                {"COLS": cols, "ROUTE_CHUNK": ROUTE_CHUNK, "STAGES": stages, "X_LAYOUT": _x_layout(cols, 2 * split),
                 "FP8": fp8, "num_warps": 2 * split},
                num_warps=2 * split, expect_sass=("HMMA",), unaligned=("num_routes", "top_k", "nk")))
        for cols, split in sorted(down):
            out.append(KernelConfig(
                f"moe_decode_down_mma[C={cols},split={split},s={stages}{tag}]", _down_mma_kernel, down_sig,
                {"COLS": cols, "POS": triton.next_power_of_2(cols // split * 8), "E_P2": 64, "STAGES": stages,
                 "X_LAYOUT": _x_layout(cols, split), "FP8": fp8, "num_warps": split},
                num_warps=split, expect_sass=("HMMA",), unaligned=("M", "top_k", "nk")))
    return out
