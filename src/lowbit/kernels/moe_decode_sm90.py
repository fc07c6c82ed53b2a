"""Tensor-core output-centric MoE decode for INT4 group-32 weights (engine ``"mma"``, Gluon, sm_80+).

The same two stages and the same semantics as `moe_decode` (its module docstring and
`lowbit.reference.moe_experts_ref(..., round_intermediate=True)`), built for one thing: stream
the experts' weight bytes at the read bandwidth with one to a few tokens.

Why a separate engine. The Triton ``fma`` engine multiplies lane by lane on the CUDA cores
(~4-5 instructions a weight: issue-bound, 27% of the read bandwidth at one token) and the
W4A16 GEMM kernels stream weights through a TMA ring with a CTA barrier a step (the TMA
skeleton alone streams 3.1-3.5 TB/s, `scripts/probes/tma_stream.py`). Here nothing goes through
shared memory:

- Each warp owns 16 weight rows (the ``m16n8k16`` A operand; gate_up: 16 gate rows and the 16
  matching up rows). Its lanes load the packed words of a 256-wide K step straight from global
  memory into the A-fragment registers (the ``k256-group-nibbles`` layout of the indexed
  profile is already fragment-friendly: a word holds one weight of each of 8 groups, so word j
  of the step is K ``32g + j`` of group g), dequantize them in place with `int4_dequant`'s
  PTX (two instructions a weight), and issue ``mma.sync`` with the tokens on the N side.
- The loads of step ``k + 2`` are issued before step ``k`` is dequantized (a two-step register
  ring, unrolled so the ring never moves between registers): each warp keeps two steps of
  words and scales in flight with no barrier anywhere in the loop.
- Activations (the B operand, 8-32 token columns) are read from global memory in the B
  fragment layout: a few KB a token, L1/L2-resident.

gate_up: grid ``(I / BLOCK_I, routes)``. The program of route r owns the neuron block of its
expert when r is the expert's first route ("owner"); it gathers every route of that expert
(``TOKENS`` at a time) and computes ``SiLU(gate) * up`` for all of them in one pass over the
weight rows; other programs of that expert return at once.

down: grid ``(H / BLOCK_H, cdiv(M, TOKENS))``. A program owns ``BLOCK_H`` output dims of
``TOKENS`` tokens and visits each distinct expert of those tokens once (a histogram of their
``topk_ids``), in one flat loop over (expert, K step) so the register ring runs across expert
boundaries; after an expert's last step its partial product is scaled per token by
``sum_j topk_weights[t, j] [topk_ids[t, j] == e]`` into the FP32 accumulator (every slot of a
repeated expert counts, as in the reference). One write of the final output: no combine.

Gluon does not run under the Triton interpreter: the Triton engines stay the path on CPU and
the reference for the tests.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from .int4_dequant import dequant_byte_ptx
from .w4a16_sm90 import _dequant_byte, _gather_layout, _stage_boxes

__all__ = ["gate_up_mma_launch", "down_mma_launch", "ROUTE_CHUNK", "MMA_TILES"]


def _check_contiguous(w, who: str) -> None:
    if not (w.qweight.is_contiguous() and w.scales.is_contiguous()):
        raise ValueError(f"{who}: the mma decode engine reads contiguous packed words and scales")

#: Routes scanned at once when the gate_up owner looks for the routes sharing its expert.
ROUTE_CHUNK = 64


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _ring_fill(wring, sring, st, w_rows, s_rows, row_ok, s_ok, kt, live, stride_sg):
    """cp.async of 256-wide K step `kt` into stage `st`: the packed words ``[BW, 32]`` (`w_rows`,
    in the A-fragment layout: each thread copies the pieces it will read back) and the eight
    groups' scales ``[8, BW]`` (`s_rows`, 4-byte pieces); zero-filled when not `live`."""
    async_copy.async_copy_global_to_shared(wring.index(st), w_rows + kt * 32, mask=row_ok[:, None] & live)
    async_copy.async_copy_global_to_shared(sring.index(st), s_rows + kt * 8 * stride_sg, mask=s_ok & live)


@gluon.jit
def _ring_read(wring, sring, st, dot_a: gl.constexpr):
    """Stage `st`: the words in the A-fragment layout and the eight groups' ``[BW]`` scales in
    the fragments' row layout."""
    words = wring.index(st).load(dot_a)
    BW: gl.constexpr = wring.shape[1]
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    sc = sring.index(st)._reinterpret(gl.bfloat16, [8 * BW], flat)
    srow: gl.constexpr = gl.SliceLayout(1, dot_a)
    return words, (sc.slice(0, BW).load(srow), sc.slice(BW, BW).load(srow), sc.slice(2 * BW, BW).load(srow),
                   sc.slice(3 * BW, BW).load(srow), sc.slice(4 * BW, BW).load(srow), sc.slice(5 * BW, BW).load(srow),
                   sc.slice(6 * BW, BW).load(srow), sc.slice(7 * BW, BW).load(srow))


@gluon.jit
def _rings(BW: gl.constexpr, T: gl.constexpr, STAGES: gl.constexpr):
    """The STAGES-deep rings: words ``[STAGES, BW, 32]`` i32 (32-byte units XOR-swizzled by row
    mod 4: a half-warp's 8-byte fragment reads, 4 rows x 4 lanes, then hit all 32 banks once;
    an XOR of 8-byte units by row mod 8 left them 4-way conflicted), scales ``[STAGES, 8, BW]`` bf16 and
    the B rows ``[STAGES * 8, T, 32]`` bf16 (read back by ldmatrix)."""
    wring = gl.allocate_shared_memory(gl.int32, [STAGES, BW, 32], gl.SwizzledSharedLayout(8, 1, 4, [1, 0]))
    sring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 8, BW], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    xring = gl.allocate_shared_memory(gl.bfloat16, [STAGES * 8, T, 32],
                                      gl.NVMMASharedLayout.get_default_for([T, 32], gl.bfloat16))
    return wring, sring, xring


@gluon.jit
def _step_mma(words, scales, xring, st, dot_b: gl.constexpr, acc_e, acc_o):
    """One 256-wide K step: groups 2j / 2j + 1 into the even / odd accumulator (two chains, so
    consecutive mma.sync do not wait on each other); the B operands are stage `st` of the
    activation ring (eight ``[T, 32]`` boxes, read as ``[32, T]`` fragments)."""
    for j in gl.static_range(4):
        xe = xring.index(st * 8 + 2 * j).permute((1, 0)).load(dot_b)
        xo = xring.index(st * 8 + 2 * j + 1).permute((1, 0)).load(dot_b)
        w_e, w_o = _dequant_byte(words, scales[2 * j][:, None], scales[2 * j + 1][:, None], dequant_byte_ptx(j))
        acc_e = mma_v2(w_e, xe, acc_e)
        acc_o = mma_v2(w_o, xo, acc_o)
    return acc_e, acc_o


@gluon.jit
def _x_fill(xring, st, x_rows, x_ok, kt, K, live, x_l: gl.constexpr):
    """cp.async of K step `kt` of the B rows into stage `st` of the activation ring (eight
    ``[T, 32]`` boxes, group g = K ``256kt + 32g ..``); x_rows / x_ok: ``[1, T, 1]`` row
    pointers and live rows. Dead rows and K past the end are zero-filled. Committed with the
    weights' copies of the same step."""
    g = gl.arange(0, 8, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_l)))[:, None, None]
    j = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_l)))[None, None, :]
    k0 = kt * 256 + g * 32  # K is a multiple of 32: a group is all in or all out
    async_copy.async_copy_global_to_shared(_stage_boxes(xring, st), x_rows + (k0 + j), mask=x_ok & (k0 < K) & live)


@gluon.jit
def _gate_up_mma_kernel(
    x_ptr, ids_ptr, w_ptr, s_ptr, act_ptr,
    num_routes, top_k, num_experts, H, I, nk,
    stride_xm, stride_am,
    TOKENS: gl.constexpr, ROUTE_CHUNK: gl.constexpr, STAGES: gl.constexpr, X_LAYOUT: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Program (ib, r): neurons ``ib * BLOCK_I ..`` of the routes of expert ``topk_ids.flat[r]``
    when r is that expert's first route. W13 words ``[E, 2I, nk * 32]``, scales ``[E, nk * 8, 2I]``.
    The tile's first num_warps / 2 warps hold the gate rows, the others the matching up rows
    (one projection a warp keeps the register ring at two steps); SiLU(gate) * up pairs them
    through shared memory once, at the end."""
    BW: gl.constexpr = 16 * num_warps
    BLOCK_I: gl.constexpr = BW // 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    dot_b: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    scan: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [num_warps, 1], [1, 0])
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    out_l: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, num_warps], [0, 1])  # [BLOCK_I, TOKENS]
    s_l: gl.constexpr = gl.BlockedLayout([1, 2], [4, 8], [1, num_warps], [1, 0])  # [8, BW] scale copies
    pid_i = gl.program_id(0)
    r = gl.program_id(1)
    i0 = pid_i * BLOCK_I
    e = gl.load(ids_ptr + r)
    if (e < 0) | (e >= num_experts):  # dropped slot: its act row is defined as 0
        ri = i0 + gl.arange(0, BLOCK_I, layout=flat)
        gl.store(act_ptr + r.to(gl.int64) * stride_am + ri, gl.zeros([BLOCK_I], gl.bfloat16, flat), mask=ri < I)
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
    stride_wn = nk * 32
    stride_sg = 2 * I
    m_a = gl.arange(0, BW, layout=gl.SliceLayout(1, dot_a))
    neuron = i0 + m_a % BLOCK_I
    w_row = gl.where(m_a < BLOCK_I, neuron, I + neuron)  # gate rows, then up rows
    row_ok = neuron < I
    cols_a = gl.arange(0, 32, layout=gl.SliceLayout(0, dot_a))
    w_rows = w_ptr + e64 * (2 * I) * stride_wn + w_row.to(gl.int64)[:, None] * stride_wn + cols_a[None, :]
    # the scales' copy layout: [8 groups, BW rows], two rows (4 bytes) a piece
    m_s = gl.arange(0, BW, layout=gl.SliceLayout(0, s_l))
    n_s = i0 + m_s % BLOCK_I
    s_row = gl.where(m_s < BLOCK_I, n_s, I + n_s)
    g_s = gl.arange(0, 8, layout=gl.SliceLayout(1, s_l))
    s_rows = s_ptr + e64 * (nk * 8) * stride_sg + g_s[:, None] * stride_sg + s_row[None, :]
    s_ok = (n_s < I)[None, :] & (g_s < 8)[:, None]
    wring, sring, xring = _rings(BW, TOKENS, STAGES)
    pair = gl.allocate_shared_memory(gl.float32, [BW, TOKENS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    want_l: gl.constexpr = gl.SliceLayout(1, scan)
    for grp in range(0, gl.cdiv(n_members, TOKENS)):
        # compact the member routes of rank grp*TOKENS .. +TOKENS-1 into `route`
        want = grp * TOKENS + gl.arange(0, TOKENS, layout=want_l)
        route = gl.zeros([TOKENS], gl.int32, want_l)
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
        col_ok = want < n_members
        xrow_l: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, X_LAYOUT))
        route_x = gl.convert_layout(route, xrow_l)
        x_rows = (x_ptr + (route_x // top_k).to(gl.int64) * stride_xm)[None, :, None]
        x_ok = gl.convert_layout(col_ok, xrow_l)[None, :, None]

        acc_e = gl.zeros([BW, TOKENS], gl.float32, mma)
        acc_o = gl.zeros([BW, TOKENS], gl.float32, mma)
        for st in gl.static_range(STAGES - 1):
            _ring_fill(wring, sring, st, w_rows, s_rows, row_ok, s_ok, st, st < nk, stride_sg)
            _x_fill(xring, st, x_rows, x_ok, st, H, st < nk, X_LAYOUT)
            async_copy.commit_group()
        for kt in range(0, nk):
            async_copy.wait_group(STAGES - 2)  # step kt landed (this thread's copies)
            gl.thread_barrier()  # every thread's copies landed; stage (kt - 1) % STAGES is read
            nxt = kt + STAGES - 1
            _ring_fill(wring, sring, nxt % STAGES, w_rows, s_rows, row_ok, s_ok, nxt, nxt < nk, stride_sg)
            _x_fill(xring, nxt % STAGES, x_rows, x_ok, nxt, H, nxt < nk, X_LAYOUT)
            async_copy.commit_group()
            words, scales = _ring_read(wring, sring, kt % STAGES, dot_a)
            acc_e, acc_o = _step_mma(words, scales, xring, kt % STAGES, dot_b, acc_e, acc_o)
        async_copy.wait_group(0)
        gl.thread_barrier()  # the next member group refills the rings
        pair.store(acc_e + acc_o)
        gl.thread_barrier()
        g = pair.slice(0, BLOCK_I, dim=0).load(out_l)
        u = pair.slice(BLOCK_I, BLOCK_I, dim=0).load(out_l)
        gl.thread_barrier()  # the next group overwrites `pair`
        act = (g / (1.0 + gl.exp(-g)) * u).to(gl.bfloat16)
        rows_o = i0 + gl.arange(0, BLOCK_I, layout=gl.SliceLayout(1, out_l))
        route_o = gl.convert_layout(route, gl.SliceLayout(0, out_l))
        ok_o = gl.convert_layout(col_ok, gl.SliceLayout(0, out_l))
        a = act_ptr + route_o.to(gl.int64)[None, :] * stride_am + rows_o[:, None]
        gl.store(a, act, mask=(rows_o < I)[:, None] & ok_o[None, :])


@gluon.jit
def _visit_expert(present, rank, bins, s, nk):
    """The expert of flat step `s` (visit ``s // nk``: the ``s // nk``-th present expert)."""
    return gl.sum(gl.where(present & (rank == s // nk), bins, 0), axis=0)


@gluon.jit
def _visit_rows(present, rank, bins, v, w_rows0, w_e, s_rows0, s_e, ids_x, jx, tok_x, M, top_k, act_ptr, I):
    """Expert visit `v`'s copy sources: its words and scales pointers and, for each token of
    the block, the act row of its first slot with that expert (``x_ok`` false: the token does
    not use it, the row is zero-filled)."""
    e64 = gl.sum(gl.where(present & (rank == v), bins, 0), axis=0).to(gl.int64)
    slot = gl.min(gl.where(ids_x == e64.to(gl.int32), jx[:, None], 32), axis=0)
    x_ok = (slot < 32) & (tok_x < M)
    x_rows = act_ptr + ((tok_x * top_k + gl.where(x_ok, slot, 0)) * I).to(gl.int64)
    return w_rows0 + e64 * w_e, s_rows0 + e64 * s_e, x_rows[None, :, None], x_ok[None, :, None]


@gluon.jit
def _down_fill(wring, sring, xring, st, kt, live, w_rows, s_rows, x_rows, x_ok, row_ok, s_ok, stride_sg, I,
               X_LAYOUT: gl.constexpr):
    """The copies of flat step `st` (K step `kt` of its expert visit, sources from `_visit_rows`)
    into its stage. One commit group."""
    STAGES: gl.constexpr = wring.shape[0]
    _ring_fill(wring, sring, st % STAGES, w_rows, s_rows, row_ok, s_ok, kt, live, stride_sg)
    _x_fill(xring, st % STAGES, x_rows, x_ok, kt, I, live, X_LAYOUT)
    async_copy.commit_group()


@gluon.jit
def _down_mma_kernel(
    act_ptr, ids_ptr, tw_ptr, w_ptr, s_ptr, out_ptr,
    M, top_k, num_experts, H, I, nk,
    stride_om,
    TOKENS: gl.constexpr, POS: gl.constexpr, E_P2: gl.constexpr, STAGES: gl.constexpr, X_LAYOUT: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Program (hb, tb): outputs ``hb * BLOCK_H ..`` of tokens ``tb * TOKENS ..``. W2 words
    ``[E, H, nk * 32]``, scales ``[E, nk * 8, H]``; act ``[M, top_k, I]`` contiguous."""
    BLOCK_H: gl.constexpr = 16 * num_warps
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    dot_b: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    tile: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, num_warps], [0, 1])  # [32 slots, TOKENS]
    s_l: gl.constexpr = gl.BlockedLayout([1, 2], [4, 8], [1, num_warps], [1, 0])  # [8, BLOCK_H] scale copies
    pid_h = gl.program_id(0)
    t0 = gl.program_id(1) * TOKENS
    h0 = pid_h * BLOCK_H
    n_pos = gl.minimum(M - t0, TOKENS) * top_k
    # the distinct local experts of these tokens: a histogram of their ids
    p = gl.arange(0, POS, layout=flat)
    ids_p = gl.load(ids_ptr + t0 * top_k + p, mask=p < n_pos, other=-1)
    ok_p = (ids_p >= 0) & (ids_p < num_experts) & (p < n_pos)
    present = gl.histogram(ids_p, E_P2, mask=ok_p, layout=flat) > 0
    rank = gl.associative_scan(present.to(gl.int32), 0, _add) - 1
    bins = gl.arange(0, E_P2, layout=flat)
    n_steps = gl.sum(present.to(gl.int32), axis=0) * nk
    # slot j x token c of the block: the routing weights (`tile`) and, in the B copies' row
    # layout, the ids (which act row of each token an expert reads)
    jj = gl.arange(0, 32, layout=gl.SliceLayout(1, tile))
    cc = gl.arange(0, TOKENS, layout=gl.SliceLayout(0, tile))
    slot_ok = (jj < top_k)[:, None] & ((t0 + cc) < M)[None, :]
    ids2 = gl.load(ids_ptr + (t0 + cc)[None, :] * top_k + jj[:, None], mask=slot_ok, other=-1)
    tw2 = gl.load(tw_ptr + (t0 + cc)[None, :] * top_k + jj[:, None], mask=slot_ok, other=0.0)
    ids_x_l: gl.constexpr = gl.SliceLayout(2, X_LAYOUT)
    jx = gl.arange(0, 32, layout=gl.SliceLayout(1, ids_x_l))
    tok_x = t0 + gl.arange(0, TOKENS, layout=gl.SliceLayout(0, ids_x_l))
    ids_x = gl.load(ids_ptr + tok_x[None, :] * top_k + jx[:, None], mask=(jx < top_k)[:, None] & (tok_x < M)[None, :],
                    other=-1)

    stride_wn = nk * 32
    stride_sg = H
    rows_a = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, dot_a))
    cols_a = gl.arange(0, 32, layout=gl.SliceLayout(0, dot_a))
    row_ok = rows_a < H
    w_rows0 = w_ptr + rows_a.to(gl.int64)[:, None] * stride_wn + cols_a[None, :]
    h_s = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, s_l))
    g_s = gl.arange(0, 8, layout=gl.SliceLayout(1, s_l))
    s_rows0 = s_ptr + g_s[:, None] * stride_sg + h_s[None, :]
    s_ok = (h_s < H)[None, :] & (g_s < 8)[:, None]
    w_e = H.to(gl.int64) * stride_wn  # words a expert
    s_e = nk * 8 * stride_sg
    wring, sring, xring = _rings(BLOCK_H, TOKENS, STAGES)

    acc = gl.zeros([BLOCK_H, TOKENS], gl.float32, mma)
    part_e = gl.zeros([BLOCK_H, TOKENS], gl.float32, mma)
    part_o = gl.zeros([BLOCK_H, TOKENS], gl.float32, mma)
    # one flat loop over (expert visit, K step), so the ring runs across expert boundaries
    # the fill side walks (visit vf, step kf) STAGES - 1 steps ahead of the compute side
    vf = 0
    kf = 0
    w_rows, s_rows, x_rows, x_ok = _visit_rows(present, rank, bins, 0, w_rows0, w_e, s_rows0, s_e, ids_x, jx, tok_x,
                                               M, top_k, act_ptr, I)
    for st in gl.static_range(STAGES - 1):
        _down_fill(wring, sring, xring, st, kf, st < n_steps, w_rows, s_rows, x_rows, x_ok, row_ok, s_ok, stride_sg,
                   I, X_LAYOUT)
        kf += 1
        if kf == nk:
            vf += 1
            kf = 0
            w_rows, s_rows, x_rows, x_ok = _visit_rows(present, rank, bins, vf, w_rows0, w_e, s_rows0, s_e, ids_x, jx,
                                                       tok_x, M, top_k, act_ptr, I)
    kt = 0
    for st in range(0, n_steps):
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()
        _down_fill(wring, sring, xring, st + STAGES - 1, kf, st + STAGES - 1 < n_steps, w_rows, s_rows, x_rows,
                   x_ok, row_ok, s_ok, stride_sg, I, X_LAYOUT)
        kf += 1
        if kf == nk:
            vf += 1
            kf = 0
            w_rows, s_rows, x_rows, x_ok = _visit_rows(present, rank, bins, vf, w_rows0, w_e, s_rows0, s_e, ids_x, jx,
                                                       tok_x, M, top_k, act_ptr, I)
        words, scales = _ring_read(wring, sring, st % STAGES, dot_a)
        part_e, part_o = _step_mma(words, scales, xring, st % STAGES, dot_b, part_e, part_o)
        kt += 1
        if kt == nk:  # the expert's last step: fold its routing weights in, per token
            kt = 0
            match = ids2 == _visit_expert(present, rank, bins, st, nk)
            coef = gl.sum(gl.where(match, tw2, 0.0), axis=0)
            coef_m = gl.convert_layout(coef, gl.SliceLayout(0, mma))
            acc += (part_e + part_o) * coef_m[None, :]
            part_e = gl.zeros([BLOCK_H, TOKENS], gl.float32, mma)
            part_o = gl.zeros([BLOCK_H, TOKENS], gl.float32, mma)
    async_copy.wait_group(0)
    rows_m = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, mma))
    tok_m = t0 + gl.arange(0, TOKENS, layout=gl.SliceLayout(0, mma))
    o = out_ptr + tok_m.to(gl.int64)[None, :] * stride_om + rows_m[:, None]
    gl.store(o, acc.to(gl.bfloat16), mask=(rows_m < H)[:, None] & (tok_m < M)[None, :])


# =========================================================================== launchers
def gate_up_mma_launch(hidden, topk_ids, w13, out, tokens: int, num_warps: int, stages: int) -> None:
    """`moe_decode_gate_up` on the mma engine (arguments checked by the caller). hidden
    ``bf16 [M, H]``; topk_ids ``int32 [M, k]``; w13 a `W4A16Weight` ``[E, 2I, H]``; out
    ``bf16 [M, k, I]`` contiguous."""
    _check_contiguous(w13, "w13")
    m, h = hidden.shape
    top_k = topk_ids.shape[1]
    inter = w13.n // 2
    nk = w13.k_padded // 256
    grid = (triton.cdiv(inter, 8 * num_warps), m * top_k)
    _gate_up_mma_kernel[grid](
        hidden, topk_ids, w13.qweight, w13.scales, out,
        m * top_k, top_k, w13.num_experts, h, inter, nk,
        hidden.stride(0), inter,
        TOKENS=tokens, ROUTE_CHUNK=ROUTE_CHUNK, STAGES=stages, X_LAYOUT=_gather_layout(tokens, num_warps),
        num_warps=num_warps,
    )


def down_mma_launch(act, topk_ids, topk_weights, w2, out, tokens: int, num_warps: int, stages: int) -> None:
    """`moe_decode_down` on the mma engine (arguments checked by the caller). act ``bf16 [M, k, I]``
    contiguous; topk_ids ``int32 [M, k]``; topk_weights ``fp32 [M, k]``; w2 a `W4A16Weight`
    ``[E, H, I]``; out ``bf16 [M, H]`` contiguous along H."""
    _check_contiguous(w2, "w2")
    m, top_k, inter = act.shape
    h = w2.n
    nk = w2.k_padded // 256
    if top_k > 32:
        raise ValueError(f"the mma decode engine takes top_k <= 32, got {top_k}")
    grid = (triton.cdiv(h, 16 * num_warps), triton.cdiv(m, tokens))
    _down_mma_kernel[grid](
        act, topk_ids, topk_weights, w2.qweight, w2.scales, out,
        m, top_k, w2.num_experts, h, inter, nk,
        out.stride(0),
        TOKENS=tokens, POS=triton.next_power_of_2(tokens * top_k), E_P2=triton.next_power_of_2(w2.num_experts),
        STAGES=stages, X_LAYOUT=_gather_layout(tokens, num_warps), num_warps=num_warps,
    )


# =========================================================================== compile tier
#: (tokens, num_warps) tiles the heuristics can pick, per stage.
MMA_TILES = ((8, 1), (8, 2), (8, 4), (16, 1), (16, 2), (16, 4), (32, 1), (32, 2), (32, 4))
MMA_STAGES = (4, 6)


def compile_configs():
    """Every tile of both kernels for the compile tier (mma.sync in the SASS, no spills)."""
    from .compile_tier import KernelConfig

    gate_up_sig = {"x_ptr": "*bf16", "ids_ptr": "*i32", "w_ptr": "*i32", "s_ptr": "*bf16", "act_ptr": "*bf16",
                   "num_routes": "i32", "top_k": "i32", "num_experts": "i32", "H": "i32", "I": "i32", "nk": "i32",
                   "stride_xm": "i32", "stride_am": "i32",
                   "TOKENS": "constexpr", "ROUTE_CHUNK": "constexpr", "STAGES": "constexpr",
                   "X_LAYOUT": "constexpr", "num_warps": "constexpr"}
    down_sig = {"act_ptr": "*bf16", "ids_ptr": "*i32", "tw_ptr": "*fp32", "w_ptr": "*i32", "s_ptr": "*bf16",
                "out_ptr": "*bf16", "M": "i32", "top_k": "i32", "num_experts": "i32", "H": "i32", "I": "i32",
                "nk": "i32", "stride_om": "i32", "TOKENS": "constexpr", "POS": "constexpr", "E_P2": "constexpr",
                "STAGES": "constexpr", "X_LAYOUT": "constexpr", "num_warps": "constexpr"}
    out = []
    for (tokens, warps), stages in ((t, st) for t in MMA_TILES for st in MMA_STAGES):
        tag = f"T={tokens},w={warps},s={stages}"
        if warps > 1 and tokens == 8:  # gate_up gathers 8 routes a pass; two or four warps
            out.append(KernelConfig(f"moe_decode_gate_up_mma[{tag}]", _gate_up_mma_kernel, gate_up_sig,
                                    {"TOKENS": tokens, "ROUTE_CHUNK": ROUTE_CHUNK, "STAGES": stages,
                                     "X_LAYOUT": _gather_layout(tokens, warps), "num_warps": warps},
                                    num_warps=warps, expect_sass=("HMMA",), unaligned=("num_routes", "top_k", "nk")))
        out.append(KernelConfig(f"moe_decode_down_mma[{tag}]", _down_mma_kernel, down_sig,
                                {"TOKENS": tokens, "POS": triton.next_power_of_2(tokens * 8), "E_P2": 64,
                                 "STAGES": stages, "X_LAYOUT": _gather_layout(tokens, warps), "num_warps": warps},
                                num_warps=warps, expect_sass=("HMMA",), unaligned=("M", "top_k", "nk")))
    return out
