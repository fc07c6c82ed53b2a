"""The portable (Triton) bodies of the output-centric decode: the ``fma`` and ``dot`` engines of
`lowbit.kernels.moe_decode.op`, for INT4 (`W4A16Weight`, profile ``"indexed"``) and natural-layout
MXFP8 (`Mxfp8ExpertWeight`) weights. They run on any CUDA GPU and under the Triton interpreter.

``FMT`` is `tiles.FMT_INT4` (0) or `tiles.FMT_MXFP8` (1); ``DOT`` selects the dot engine.
INT4 scales are ``[E, Kp/32, N]`` and MXFP8's ``[E, N, K/32]``: the strides passed make both
read as (expert, row, group).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ...runtime import numerics
from ..w4a16.int4 import dequant_pair
from ..w4a16.portable import w4a16_tile

__all__ = ["gate_up_kernel", "down_kernel"]


@triton.jit
def _e8m0_to_fp32(b):
    """E8M0 bytes -> FP32 ``2**(b - 127)`` by building the exponent bits (byte 0 = 2^-127, an
    FP32 subnormal: only mantissa bit 22). Exact on both tiers."""
    bits = b.to(tl.int32) << 23
    bits = tl.where(b == 0, 0x400000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _mxfp8_group(w_rows, s_rows, row_ok, g, K, stride_sg):
    """FP32 ``[R, 32]``: K-group `g` (elements ``32g .. 32g+31``) of the rows, exact; groups
    past K read as 0. w_rows: ``[R, 1]`` pointers to the rows' codes; s_rows: ``[R]`` pointers
    to their scale bytes."""
    ok = row_ok & (g * 32 < K)
    codes = tl.load(w_rows + g * 32 + tl.arange(0, 32)[None, :], mask=ok[:, None], other=0.0)
    scale = _e8m0_to_fp32(tl.load(s_rows + g * stride_sg, mask=ok, other=127))
    return codes.to(tl.float32) * scale[:, None]


@triton.jit
def _mxfp8_step(w_rows, s_rows, row_ok, kt, K, stride_sg, x):
    """FP32 ``[R, 8]``: for each of the 8 K-groups of 256-wide step `kt` (``k = 256kt + 32g + j``),
    ``scale_g * sum_j code[g, j] * x[g, j]`` -- the group sum of exact code x activation
    products, then the power-of-two scale (exact). x: FP32 ``[1, 8, 32]``; groups past K are 0.
    The codes are one 256-byte row segment a row (16-byte loads): the fma engine's MXFP8 step."""
    g = kt * 8 + tl.arange(0, 8)
    ok = row_ok[:, None] & (g * 32 < K)[None, :]
    offs = (g * 32)[:, None] + tl.arange(0, 32)[None, :]
    codes = tl.load(w_rows[:, :, None] + offs[None, :, :], mask=ok[:, :, None], other=0.0)
    part = tl.sum(codes.to(tl.float32) * x, axis=2)
    scale = _e8m0_to_fp32(tl.load(s_rows[:, None] + g[None, :] * stride_sg, mask=ok, other=127))
    return part * scale


@triton.jit
def _load_step(FMT: tl.constexpr, w_rows, row_ok, kt):
    """INT4: the 32 words ``[R, 32]`` of 256-wide K tile `kt` (one 128-byte row segment, read
    with 16-byte loads). MXFP8 reads per group in `_weight_pair`: returns a placeholder."""
    if FMT == 0:
        words = tl.load(w_rows + kt * 32 + tl.arange(0, 32)[None, :], mask=row_ok[:, None], other=0)
    else:
        words = 0
    return words


@triton.jit
def _weight_pair(FMT: tl.constexpr, words, w_rows, s_rows, row_ok, kt, i: tl.constexpr, K, stride_sg,
                 AS_BF16: tl.constexpr):
    """The weights of K-groups ``8kt + i`` and ``8kt + i + 4`` of the rows (``k = 256kt + 32i + j``
    and ``k + 128``): two ``[R, 32]`` tiles. INT4: bf16 ``(q - 8) * s`` from `dequant_pair`.
    MXFP8: exact FP32, or the same values as bf16 (exact) when `AS_BF16`."""
    g_lo = kt * 8 + i
    if FMT == 0:
        s_lo = tl.load(s_rows + g_lo * stride_sg, mask=row_ok, other=0.0)
        s_hi = tl.load(s_rows + (g_lo + 4) * stride_sg, mask=row_ok, other=0.0)
        w_lo, w_hi = dequant_pair(words >> (4 * i), s_lo[:, None], s_hi[:, None])
    else:
        w_lo = _mxfp8_group(w_rows, s_rows, row_ok, g_lo, K, stride_sg)
        w_hi = _mxfp8_group(w_rows, s_rows, row_ok, g_lo + 4, K, stride_sg)
        if AS_BF16:
            w_lo = numerics.to_bf16(w_lo)
            w_hi = numerics.to_bf16(w_hi)
    return w_lo, w_hi


@triton.jit
def gate_up_kernel(
    x_ptr, ids_ptr, w_ptr, s_ptr, act_ptr,
    num_routes, top_k, num_experts, H, I,
    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_sg, stride_am,
    FMT: tl.constexpr, DOT: tl.constexpr, BLOCK_I: tl.constexpr, TOKENS: tl.constexpr,
    ROUTE_CHUNK: tl.constexpr, LOOP_STAGES: tl.constexpr,
):
    """Grid ``(cdiv(I, BLOCK_I), num_routes)``: program (ib, r) owns act[r, ib-th neuron block]."""
    pid_i = tl.program_id(0)
    r = tl.program_id(1)
    ri = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    i_ok = ri < I
    e = tl.load(ids_ptr + r)
    if (e < 0) | (e >= num_experts):  # dropped slot: its act row is defined as 0
        tl.store(act_ptr + r.to(tl.int64) * stride_am + ri, tl.zeros([BLOCK_I], tl.bfloat16), mask=i_ok)
        return
    e64 = e.to(tl.int64)
    j = tl.arange(0, 32)
    # gate rows ri and up rows I + ri of W13[e]; INT4 scales are [E, Kp/32, N], MXFP8 [E, N, K/32]
    wg_rows = w_ptr + e64 * stride_we + ri[:, None].to(tl.int64) * stride_wn
    wu_rows = w_ptr + e64 * stride_we + (I + ri)[:, None].to(tl.int64) * stride_wn
    sg_rows = s_ptr + e64 * stride_se + ri.to(tl.int64) * stride_sn
    su_rows = s_ptr + e64 * stride_se + (I + ri).to(tl.int64) * stride_sn
    if DOT:
        # Owner rule: the first route with expert e computes every route with expert e.
        earlier = tl.zeros([ROUTE_CHUNK], tl.int32)
        for c in range(0, tl.cdiv(r, ROUTE_CHUNK)):
            rr = c * ROUTE_CHUNK + tl.arange(0, ROUTE_CHUNK)
            earlier += (tl.load(ids_ptr + rr, mask=rr < r, other=-1) == e).to(tl.int32)
        if tl.sum(earlier) > 0:
            return
        members = tl.zeros([ROUTE_CHUNK], tl.int32)
        for c in range(r // ROUTE_CHUNK, tl.cdiv(num_routes, ROUTE_CHUNK)):
            rr = c * ROUTE_CHUNK + tl.arange(0, ROUTE_CHUNK)
            hit = (tl.load(ids_ptr + rr, mask=rr < num_routes, other=-1) == e) & (rr >= r)
            members += hit.to(tl.int32)
        n_members = tl.sum(members)
        cols = tl.arange(0, TOKENS)
        for grp in range(0, tl.cdiv(n_members, TOKENS)):
            # compact the member routes of rank grp*TOKENS .. +TOKENS-1 into `route`
            want = grp * TOKENS + cols
            route = tl.zeros([TOKENS], tl.int32)
            base = tl.sum(tl.zeros([ROUTE_CHUNK], tl.int32))
            for c in range(r // ROUTE_CHUNK, tl.cdiv(num_routes, ROUTE_CHUNK)):
                rr = c * ROUTE_CHUNK + tl.arange(0, ROUTE_CHUNK)
                hit = (tl.load(ids_ptr + rr, mask=rr < num_routes, other=-1) == e) & (rr >= r)
                rank = base + tl.cumsum(hit.to(tl.int32), 0) - 1
                sel = hit[None, :] & (rank[None, :] == want[:, None])
                route += tl.sum(tl.where(sel, rr[None, :], 0), axis=1)
                base += tl.sum(hit.to(tl.int32))
            col_ok = want < n_members
            x_rows = x_ptr + (route // top_k)[:, None].to(tl.int64) * stride_xm + j[None, :]
            acc_g = tl.zeros([BLOCK_I, TOKENS], tl.float32)
            acc_u = tl.zeros([BLOCK_I, TOKENS], tl.float32)
            for kt in range(0, tl.cdiv(H, 256)):
                words_g = _load_step(FMT, wg_rows, i_ok, kt)
                words_u = _load_step(FMT, wu_rows, i_ok, kt)
                for i in tl.static_range(4):
                    g_lo, g_hi = _weight_pair(FMT, words_g, wg_rows, sg_rows, i_ok, kt, i, H, stride_sg, True)
                    u_lo, u_hi = _weight_pair(FMT, words_u, wu_rows, su_rows, i_ok, kt, i, H, stride_sg, True)
                    k_lo = kt * 256 + i * 32
                    k_hi = k_lo + 128
                    # the hidden rows are read once and feed both projections
                    x_lo = tl.load(x_rows + k_lo, mask=col_ok[:, None] & ((k_lo + j) < H)[None, :], other=0.0)
                    x_hi = tl.load(x_rows + k_hi, mask=col_ok[:, None] & ((k_hi + j) < H)[None, :], other=0.0)
                    acc_g = numerics.dot(g_lo, tl.trans(x_lo), acc_g)
                    acc_g = numerics.dot(g_hi, tl.trans(x_hi), acc_g)
                    acc_u = numerics.dot(u_lo, tl.trans(x_lo), acc_u)
                    acc_u = numerics.dot(u_hi, tl.trans(x_hi), acc_u)
            act = numerics.to_bf16(numerics.silu_mul(acc_g, acc_u))
            a = act_ptr + route[None, :].to(tl.int64) * stride_am + ri[:, None]
            tl.store(a, act, mask=i_ok[:, None] & col_ok[None, :])
    else:
        x_row = x_ptr + (r // top_k).to(tl.int64) * stride_xm
        # each thread keeps FP32 partial sums of its lanes (products of upcast weights and bf16
        # activations are exact in FP32); one reduction a row at the end
        if FMT == 0:
            acc_g = tl.zeros([BLOCK_I, 32], tl.float32)
            acc_u = tl.zeros([BLOCK_I, 32], tl.float32)
            for kt in tl.range(0, tl.cdiv(H, 256), num_stages=LOOP_STAGES):
                words_g = _load_step(FMT, wg_rows, i_ok, kt)
                words_u = _load_step(FMT, wu_rows, i_ok, kt)
                for i in tl.static_range(4):
                    g_lo, g_hi = _weight_pair(FMT, words_g, wg_rows, sg_rows, i_ok, kt, i, H, stride_sg, False)
                    u_lo, u_hi = _weight_pair(FMT, words_u, wu_rows, su_rows, i_ok, kt, i, H, stride_sg, False)
                    k_lo = kt * 256 + i * 32
                    k_hi = k_lo + 128
                    x_lo = tl.load(x_row + k_lo + j, mask=(k_lo + j) < H, other=0.0).to(tl.float32)
                    x_hi = tl.load(x_row + k_hi + j, mask=(k_hi + j) < H, other=0.0).to(tl.float32)
                    acc_g += g_lo.to(tl.float32) * x_lo[None, :] + g_hi.to(tl.float32) * x_hi[None, :]
                    acc_u += u_lo.to(tl.float32) * x_lo[None, :] + u_hi.to(tl.float32) * x_hi[None, :]
            g = tl.sum(acc_g, axis=1)
            u = tl.sum(acc_u, axis=1)
        else:
            acc_g = tl.zeros([BLOCK_I, 8], tl.float32)
            acc_u = tl.zeros([BLOCK_I, 8], tl.float32)
            x_offs = tl.arange(0, 8)[:, None] * 32 + j[None, :]
            for kt in tl.range(0, tl.cdiv(H, 256), num_stages=LOOP_STAGES):
                x = tl.load(x_row + kt * 256 + x_offs, mask=(kt * 256 + x_offs) < H, other=0.0).to(tl.float32)
                acc_g += _mxfp8_step(wg_rows, sg_rows, i_ok, kt, H, stride_sg, x[None, :, :])
                acc_u += _mxfp8_step(wu_rows, su_rows, i_ok, kt, H, stride_sg, x[None, :, :])
            g = tl.sum(acc_g, axis=1)
            u = tl.sum(acc_u, axis=1)
        act = numerics.to_bf16(numerics.silu_mul(g, u))
        tl.store(act_ptr + r.to(tl.int64) * stride_am + ri, act, mask=i_ok)


@triton.jit
def down_kernel(
    act_ptr, ids_ptr, tw_ptr, w_ptr, s_ptr, out_ptr,
    M, top_k, num_experts, H, I,
    stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_sg, stride_om,
    FMT: tl.constexpr, DOT: tl.constexpr, BLOCK_H: tl.constexpr, TOKENS: tl.constexpr,
    TOPK_P2: tl.constexpr, LOOP_STAGES: tl.constexpr,
):
    """Grid ``(cdiv(H, BLOCK_H), M)`` (fma) or ``(cdiv(H, BLOCK_H), cdiv(M, TOKENS))`` (dot)."""
    pid_h = tl.program_id(0)
    pid_t = tl.program_id(1)
    rh = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = rh < H
    j = tl.arange(0, 32)
    if DOT:
        toks = pid_t * TOKENS + tl.arange(0, TOKENS)
        jj = tl.arange(0, TOPK_P2)
        route2 = toks[:, None] * top_k + jj[None, :]  # [TOKENS, TOPK_P2] flat route ids
        slot_ok = (toks < M)[:, None] & (jj < top_k)[None, :]
        ids2 = tl.load(ids_ptr + route2, mask=slot_ok, other=-1)
        ids2 = tl.where((ids2 >= 0) & (ids2 < num_experts), ids2, -1)
        tw2 = tl.load(tw_ptr + route2, mask=slot_ok, other=0.0)
        base = pid_t * TOKENS * top_k
        n_pos = tl.minimum(M - pid_t * TOKENS, TOKENS) * top_k
        acc = tl.zeros([TOKENS, BLOCK_H], tl.float32)
        for p in range(0, n_pos):
            e = tl.load(ids_ptr + base + p)
            # visit each distinct expert of these tokens once: at its first occurrence
            seen = tl.sum(((ids2 == e) & (route2 - base < p)).to(tl.int32))
            if (e >= 0) & (e < num_experts) & (seen == 0):
                match = ids2 == e
                coef = tl.sum(tl.where(match, tw2, 0.0), axis=1)  # every slot with e counts
                slot = tl.min(tl.where(match, jj[None, :], TOPK_P2), axis=1)
                has = slot < TOPK_P2
                a_row = (toks * top_k + tl.where(has, slot, 0)).to(tl.int64)
                e64 = e.to(tl.int64)
                if FMT == 0:  # the W4A16 main loop, tokens on the MMA's N side
                    part = w4a16_tile(act_ptr, a_row, has, stride_am, w_ptr, s_ptr, e64, rh, h_ok,
                                      stride_we, stride_wn, stride_se, stride_sg, I, 0, tl.cdiv(I, 256), TOKENS, BLOCK_H, True)
                else:
                    w_rows = w_ptr + e64 * stride_we + rh[:, None].to(tl.int64) * stride_wn
                    s_rows = s_ptr + e64 * stride_se + rh.to(tl.int64) * stride_sn
                    a_rows = act_ptr + a_row[:, None] * stride_am + j[None, :]
                    part_t = tl.zeros([BLOCK_H, TOKENS], tl.float32)
                    for kt in range(0, tl.cdiv(I, 256)):
                        for i in tl.static_range(4):
                            w_lo, w_hi = _weight_pair(FMT, 0, w_rows, s_rows, h_ok, kt, i, I, stride_sg, True)
                            k_lo = kt * 256 + i * 32
                            k_hi = k_lo + 128
                            a_lo = tl.load(a_rows + k_lo, mask=has[:, None] & ((k_lo + j) < I)[None, :], other=0.0)
                            a_hi = tl.load(a_rows + k_hi, mask=has[:, None] & ((k_hi + j) < I)[None, :], other=0.0)
                            part_t = numerics.dot(w_lo, tl.trans(a_lo), part_t)
                            part_t = numerics.dot(w_hi, tl.trans(a_hi), part_t)
                    part = tl.trans(part_t)
                acc += part * coef[:, None]
        o = out_ptr + toks[:, None].to(tl.int64) * stride_om + rh[None, :]
        tl.store(o, numerics.to_bf16(acc), mask=(toks < M)[:, None] & h_ok[None, :])
    else:
        t = pid_t
        # INT4 accumulates [BLOCK_H, 32] lanes, MXFP8 [BLOCK_H, 8, 32] (one 256-wide step)
        if FMT == 0:
            acc = tl.zeros([BLOCK_H, 32], tl.float32)
        else:
            acc = tl.zeros([BLOCK_H, 8], tl.float32)
        a_offs = tl.arange(0, 8)[:, None] * 32 + j[None, :]
        for slot in range(0, top_k):
            route = t * top_k + slot
            e = tl.load(ids_ptr + route)
            if (e >= 0) & (e < num_experts):
                e64 = e.to(tl.int64)
                rw = tl.load(tw_ptr + route)
                w_rows = w_ptr + e64 * stride_we + rh[:, None].to(tl.int64) * stride_wn
                s_rows = s_ptr + e64 * stride_se + rh.to(tl.int64) * stride_sn
                a_row = act_ptr + route.to(tl.int64) * stride_am
                # the routing weight is folded into the activation, so every expert accumulates
                # into the same FP32 registers: no separate combine
                for kt in tl.range(0, tl.cdiv(I, 256), num_stages=LOOP_STAGES):
                    if FMT == 0:
                        words = _load_step(FMT, w_rows, h_ok, kt)
                        for i in tl.static_range(4):
                            w_lo, w_hi = _weight_pair(FMT, words, w_rows, s_rows, h_ok, kt, i, I, stride_sg, False)
                            k_lo = kt * 256 + i * 32
                            k_hi = k_lo + 128
                            a_lo = tl.load(a_row + k_lo + j, mask=(k_lo + j) < I, other=0.0).to(tl.float32) * rw
                            a_hi = tl.load(a_row + k_hi + j, mask=(k_hi + j) < I, other=0.0).to(tl.float32) * rw
                            acc += w_lo.to(tl.float32) * a_lo[None, :] + w_hi.to(tl.float32) * a_hi[None, :]
                    else:
                        a = tl.load(a_row + kt * 256 + a_offs, mask=(kt * 256 + a_offs) < I, other=0.0).to(tl.float32) * rw
                        acc += _mxfp8_step(w_rows, s_rows, h_ok, kt, I, stride_sg, a[None, :, :])
        y = tl.sum(acc, axis=1)
        tl.store(out_ptr + t.to(tl.int64) * stride_om + rh, numerics.to_bf16(y), mask=h_ok)
