"""FP8 x MXFP4 decode GEMM on mma.sync: `fp4_gemm`'s engine ``"mma"`` (Gluon, sm_90).

Same contract as `fp4_gemm` (``c = (a * a_s) @ (e2m1(b) * 2**(b_s - 127))^T``,
BF16 out; reference `lowbit.reference.fp4_gemm_ref`), for the decode shapes (M <= 64 rows,
activation scales per 128 K) where the direct Triton kernel's in-register FP4 -> FP8 fold and
its serialized wgmma leave it at a few % of the read bandwidth.

Why mma.sync on f16 operands. Every E2M1 value and every E4M3 value is exact in f16, and an
f16 x f16 product is exact in the FP32 accumulator, so one group of 32 K is summed exactly as
the reference's FP32 ``block`` up to the order of the additions; the weight group scale
``2**(e - 127)`` and the activation block scale are applied to that partial in FP32, as the
reference does (a power of two: exact). No fold, no leftover pass. The E2M1 code c becomes f16
bits ``(c & 7) << 9 | (c & 8) << 12``: its value times ``2**-14`` (subnormal for codes 0-1),
so the product is rescaled by ``2**14`` once at the end.

Layout trick (no register shuffles): a weight byte holds K ``2j`` (low nibble) and ``2j + 1``
(high nibble), and an activation pair ``a[m, 2j], a[m, 2j + 1]`` is one 16-bit word. A dot
product does not care how K is ordered, so each 32-K group runs as two mma.sync chains over
16 "pair" positions: low nibbles x even activations, high nibbles x odd ones. The weight
bytes ``[rows, 16]`` of a group load straight into the A fragment layout (two adjacent bytes a
register half), the activation pairs ``[16, cols]`` into the B fragment layout, and both
convert in inline PTX (a ``prmt`` and bit ops for four E2M1 pairs; ``cvt.rn.f16x2.e4m3x2``).
From 32 columns (`b_in_smem`) the CTA converts each step's activations to f16 once into
shared memory instead (even K, odd K) and the warps read f16 B fragments from there: each
warp converting its own fragments would cost more than its weights.

Program ``(n tile, K split)``: ``16 * num_warps`` weight rows (16 a warp, the mma's M side),
all M rows of ``a`` padded to COLS (the N side), K steps ``split * steps_per_split ..``
(128 K a step = one activation block). A STAGES-deep cp.async ring holds per step the weight
bytes (16-byte copies; 16-byte units XOR-swizzled by row mod 4), the four E8M0 scales of each
row (one 4-byte copy), the activations (16-byte copies; units swizzled by column mod 8, so the
B fragment reads are conflict-free) and the step's activation scales; one CTA barrier a step
(two with the shared f16 activations). Split K writes FP32 shares that
`splitk.splitk_reduce` sums (a second launch). Tiles: `tiles.DECODE_MMA_TILES`.

Gluon does not run under the Triton interpreter: the CPU tier runs the Triton kernel; the GPU
tests compare this engine with the FP32 reference.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from ..compile_tier import KernelConfig
from .splitk import split_blocks, splitk_destination, splitk_reduce
from .tiles import DECODE_MMA_TILES, SCALE_BLOCK

__all__ = ["STEP_K", "decode_mma_launch", "compile_configs"]

#: K a ring step: one activation scale block
STEP_K = SCALE_BLOCK
_STEP_K: gl.constexpr = gl.constexpr(STEP_K)
#: f16 bits of an E2M1 code encode its value times 2**-14
_E2M1_F16_RESCALE: gl.constexpr = gl.constexpr(2.0**14)


#: Four E2M1 code pairs -> f16: $4 = four weight bytes (element i in byte i; each byte holds
#: the codes of K 2j (low nibble) and 2j + 1); $0, $1 = the low nibbles of bytes 0-1, 2-3 as
#: f16x2, $2, $3 = the high nibbles. f16 bits of code c: ``(c & 7) << 9 | (c & 8) << 12`` =
#: its value times 2**-14 (exact; codes 0.5 and 0 are subnormal / zero).
def _e2m1x4_f16_ptx() -> str:
    """The PTX of `_E2M1X4_F16_PTX`: per output, mask the magnitude and sign bits of one nibble
    of two lanes and shift them into place (low nibbles: 9 and 12, high nibbles: 5 and 8)."""
    body = ["prmt.b32 x, $4, 0, 0x4140;", "prmt.b32 y, $4, 0, 0x4342;"]  # bytes 0-1 / 2-3 -> lanes
    for out, (src, nib) in enumerate([("x", 0), ("y", 0), ("x", 4), ("y", 4)]):
        body += [f"and.b32 t, {src}, {0x00070007 << nib:#010x};", f"and.b32 u, {src}, {0x00080008 << nib:#010x};",
                 f"shl.b32 t, t, {9 - nib};", f"shl.b32 u, u, {12 - nib};", f"or.b32 ${out}, t, u;"]
    return "\n{\n.reg .b32 x, y, t, u;\n" + "\n".join(body) + "\n}\n"


_E2M1X4_F16_PTX: gl.constexpr = gl.constexpr(_e2m1x4_f16_ptx())

#: Two activation pairs -> f16: $2 = two int16 words, each (E4M3 at K 2j, at 2j + 1); $0 = the
#: even elements as f16x2, $1 = the odd ones (exact).
_E4M3_PAIRS_F16_PTX: gl.constexpr = gl.constexpr("""
{
.reg .b32 t;
.reg .b16 lo, hi;
prmt.b32 t, $2, 0, 0x4420;
mov.b32 {lo, hi}, t;
cvt.rn.f16x2.e4m3x2 $0, lo;
prmt.b32 t, $2, 0, 0x4431;
mov.b32 {lo, hi}, t;
cvt.rn.f16x2.e4m3x2 $1, lo;
}
""")


@gluon.jit
def _weights_f16(byt):
    """Weight bytes ``[R, 16]`` (A fragment layout) -> (low nibbles, high nibbles) as f16."""
    return gl.inline_asm_elementwise(_E2M1X4_F16_PTX, "=r,=r,=r,=r,r", [byt], dtype=(gl.float16, gl.float16),
                                     is_pure=True, pack=4)


@gluon.jit
def _act_words_f16(words):
    """Activation words ``[C, 32]`` int32 (four E4M3 of K 4w..4w+3) -> (even K, odd K) f16x2 words."""
    return gl.inline_asm_elementwise(_E4M3_PAIRS_F16_PTX, "=r,=r,r", [words], dtype=(gl.int32, gl.int32),
                                     is_pure=True, pack=1)


@gluon.jit
def _acts_f16(pairs):
    """Activation pairs ``[16, C]`` int16 (B fragment layout) -> (even K, odd K) as f16."""
    return gl.inline_asm_elementwise(_E4M3_PAIRS_F16_PTX, "=r,=r,r", [pairs], dtype=(gl.float16, gl.float16),
                                     is_pure=True, pack=2)


@gluon.jit
def _fill(wring, sring, xring, aring, st, kt, live, b_ptr, bs_ptr, a_ptr, as_ptr, n0, N, M,
          stride_bn, stride_bsn, stride_am, stride_asm,
          w_l: gl.constexpr, x_l: gl.constexpr, v_l: gl.constexpr):
    """cp.async of K step `kt` into stage `st`, one commit group; zero-filled where not `live`,
    past N or past M. Pointers and strides in int32 words (fp32 for the activation scales)."""
    ROWS: gl.constexpr = wring.shape[1]
    COLS: gl.constexpr = xring.shape[1]
    r = gl.arange(0, ROWS, layout=gl.SliceLayout(1, w_l))
    c = gl.arange(0, 16, layout=gl.SliceLayout(0, w_l))
    ok = (n0 + r < N) & live
    async_copy.async_copy_global_to_shared(
        wring.index(st), b_ptr + (n0 + r).to(gl.int64)[:, None] * stride_bn + (kt * 16 + c)[None, :], mask=ok[:, None])
    rv = gl.arange(0, ROWS, layout=v_l)
    async_copy.async_copy_global_to_shared(sring.index(st), bs_ptr + (n0 + rv).to(gl.int64) * stride_bsn + kt,
                                           mask=(n0 + rv < N) & live)
    m = gl.arange(0, COLS, layout=gl.SliceLayout(1, x_l))
    j = gl.arange(0, 32, layout=gl.SliceLayout(0, x_l))
    async_copy.async_copy_global_to_shared(
        xring.index(st), a_ptr + m.to(gl.int64)[:, None] * stride_am + (kt * 32 + j)[None, :],
        mask=((m < M) & live)[:, None])
    mv = gl.arange(0, COLS, layout=v_l)
    async_copy.async_copy_global_to_shared(aring.index(st), as_ptr + mv.to(gl.int64) * stride_asm + kt,
                                           mask=(mv < M) & live)
    async_copy.commit_group()


@gluon.jit
def _step(wring, sring, xring, aring, xh, st, acc, dot_a: gl.constexpr, dot_b: gl.constexpr, x_l: gl.constexpr,
          B_SMEM: gl.constexpr):
    """acc += the stage's 128-K step: per 32-K group, ``(lo x even + hi x odd) * 2**(e - 127)``
    (two mma.sync chains), the step's sum times the activation scale per column. B_SMEM: the
    CTA converts the step's activations to f16 once into `xh` (even / odd K) and the warps read
    their B fragments from there; otherwise each warp converts its own fragments (cheaper while
    the activations are few: at 16 columns a fragment conversion is 2 instructions a warp)."""
    ROWS: gl.constexpr = wring.shape[1]
    COLS: gl.constexpr = xring.shape[1]
    mma: gl.constexpr = acc.type.layout
    swz: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])  # the x ring's 16-byte units, as 2-byte elements
    wb = wring.index(st)._reinterpret(gl.uint8, [ROWS, 64], gl.SwizzledSharedLayout(16, 1, 4, [1, 0]))
    if B_SMEM:
        ev, od = _act_words_f16(xring.index(st).load(x_l))
        xh.index(0).store(ev)
        xh.index(1).store(od)
        gl.thread_barrier()
        xe = xh.index(0)._reinterpret(gl.float16, [COLS, 64], swz).permute((1, 0))
        xo = xh.index(1)._reinterpret(gl.float16, [COLS, 64], swz).permute((1, 0))
    else:
        xp = xring.index(st)._reinterpret(gl.int16, [COLS, 64], swz).permute((1, 0))
    e4 = sring.index(st).load(gl.SliceLayout(1, mma))  # four E8M0 bytes a row
    a_s = aring.index(st).load(gl.SliceLayout(0, mma))
    blk = gl.zeros([ROWS, COLS], gl.float32, mma)
    for q in gl.static_range(4):
        w_lo, w_hi = _weights_f16(wb.slice(16 * q, 16, dim=1).load(dot_a))
        if B_SMEM:
            x_ev = xe.slice(16 * q, 16, dim=0).load(dot_b)
            x_od = xo.slice(16 * q, 16, dim=0).load(dot_b)
        else:
            x_ev, x_od = _acts_f16(xp.slice(16 * q, 16, dim=0).load(dot_b))
        p = mma_v2(w_lo, x_ev, gl.zeros([ROWS, COLS], gl.float32, mma))
        p = mma_v2(w_hi, x_od, p)
        e = (e4 >> (8 * q)) & 255
        s = gl.where(e == 0, 1 << 22, e << 23).to(gl.float32, bitcast=True)  # 2**(e - 127); 0 -> 2**-127
        blk += p * s[:, None]
    return acc + blk * a_s[None, :]


@gluon.jit
def _fp4_decode_kernel(
    a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr,
    M, N, K, steps_per_split,
    stride_am, stride_asm, stride_bn, stride_bsn, stride_cs, stride_cm,
    COLS: gl.constexpr, STAGES: gl.constexpr, SPLIT_OUT: gl.constexpr, B_SMEM: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Program (n tile, K split): ``c[:, n0 .. n0 + 16 num_warps]`` over the split's K steps. a, b
    and b_s as int32 words (strides in words), a_s FP32; c bf16 ``[M, N]`` or, with SPLIT_OUT,
    FP32 shares ``[S, M, N]``."""
    ROWS: gl.constexpr = 16 * num_warps
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 8])
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    dot_b: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    w_l: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [num_warps, 1], [1, 0])  # [ROWS, 16] words
    x_l: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])  # [COLS, 32] words
    v_l: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    n0 = gl.program_id(0) * ROWS
    pid_s = gl.program_id(1)
    k0 = pid_s * steps_per_split
    n_steps = gl.minimum(steps_per_split, gl.cdiv(K, _STEP_K) - k0)

    wring = gl.allocate_shared_memory(gl.int32, [STAGES, ROWS, 16], gl.SwizzledSharedLayout(4, 1, 4, [1, 0]))
    sring = gl.allocate_shared_memory(gl.int32, [STAGES, ROWS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    xring = gl.allocate_shared_memory(gl.int32, [STAGES, COLS, 32], gl.SwizzledSharedLayout(4, 1, 8, [1, 0]))
    aring = gl.allocate_shared_memory(gl.float32, [STAGES, COLS], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    # the step's activations as f16 (even K, odd K) when B_SMEM; one row otherwise (unused)
    xh = gl.allocate_shared_memory(gl.int32, [2, COLS if B_SMEM else 1, 32], gl.SwizzledSharedLayout(4, 1, 8, [1, 0]))

    for i in gl.static_range(STAGES - 1):
        _fill(wring, sring, xring, aring, i, k0 + i, i < n_steps, b_ptr, bs_ptr, a_ptr, as_ptr, n0, N, M,
              stride_bn, stride_bsn, stride_am, stride_asm, w_l, x_l, v_l)
    acc = gl.zeros([ROWS, COLS], gl.float32, mma)
    for i in range(0, n_steps):
        async_copy.wait_group(STAGES - 2)  # step i landed (this thread's copies)
        gl.thread_barrier()  # every thread's copies landed; the stage refilled next was read
        nxt = i + STAGES - 1
        _fill(wring, sring, xring, aring, nxt % STAGES, k0 + nxt, nxt < n_steps, b_ptr, bs_ptr, a_ptr, as_ptr, n0,
              N, M, stride_bn, stride_bsn, stride_am, stride_asm, w_l, x_l, v_l)
        acc = _step(wring, sring, xring, aring, xh, i % STAGES, acc, dot_a, dot_b, x_l, B_SMEM)
    async_copy.wait_group(0)

    acc = acc * _E2M1_F16_RESCALE
    rn = n0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma))
    cm = gl.arange(0, COLS, layout=gl.SliceLayout(0, mma))
    mask = (rn < N)[:, None] & (cm < M)[None, :]
    dst = c_ptr + pid_s.to(gl.int64) * stride_cs + cm.to(gl.int64)[None, :] * stride_cm + rn[:, None]
    if SPLIT_OUT:
        gl.store(dst, acc, mask=mask)
    else:
        gl.store(dst, acc.to(gl.bfloat16), mask=mask)


# =========================================================================== launcher
def b_in_smem(cols: int) -> bool:
    """Whether the CTA converts the activations to f16 once a step (`_step`'s B_SMEM): from 32
    columns, where each warp converting its own B fragments costs more than the weights."""
    return cols >= 32


def decode_mma_launch(a, a_s, b, b_s, out, cols: int, num_warps: int, stages: int, split_k: int) -> None:
    """Run the engine (operands validated by `fp4_gemm`, `fp4.decode_mma_problem` None): a
    ``float8_e4m3fn [M, K]``, a_s FP32 ``[M, K/128]``, b ``uint8 [N, K/2]``, b_s E8M0 ``uint8
    [N, K/32]``, out ``bf16 [M, N]``; cols >= M (a power of two >= 16), 16 * num_warps weight
    rows a program, stages the ring depth, split_k K splits (FP32 shares, then a reduction)."""
    m, k = a.shape
    n = b.shape[0]
    k_steps = k // STEP_K
    if a_s.stride(1) != 1:  # the kernel steps along a scale row with unit stride
        a_s = a_s.contiguous()
    per, split = split_blocks(k_steps, split_k, even=False)
    dst, stride_cs, stride_cm = splitk_destination(out, split)
    grid = (triton.cdiv(n, 16 * num_warps), split)
    a4, b4, bs4 = a.view(torch.int32), b.view(torch.int32), b_s.view(torch.int32)
    _fp4_decode_kernel[grid](
        a4, a_s, b4, bs4, dst, m, n, k, per,
        a4.stride(0), a_s.stride(0), b4.stride(0), bs4.stride(0), stride_cs, stride_cm,
        COLS=cols, STAGES=stages, SPLIT_OUT=split > 1, B_SMEM=b_in_smem(cols), num_warps=num_warps,
    )
    if split > 1:
        splitk_reduce(dst, out)


# =========================================================================== compile tier
def compile_configs() -> list[KernelConfig]:
    """The engine's tiles the heuristic picks (`tiles.DECODE_MMA_TILES`), direct and split
    output, for the compile tier (mma.sync in the SASS, no spills)."""
    sig = {"a_ptr": "*i32", "as_ptr": "*fp32", "b_ptr": "*i32", "bs_ptr": "*i32", "c_ptr": "*bf16",
           "M": "i32", "N": "i32", "K": "i32", "steps_per_split": "i32",
           "stride_am": "i32", "stride_asm": "i32", "stride_bn": "i32", "stride_bsn": "i32", "stride_cs": "i32",
           "stride_cm": "i32", "COLS": "constexpr", "STAGES": "constexpr", "SPLIT_OUT": "constexpr",
           "B_SMEM": "constexpr", "num_warps": "constexpr"}
    out = []
    for cols, warps, stages in sorted(set(DECODE_MMA_TILES.values())):
        for split in (False, True):
            s = dict(sig, c_ptr="*fp32") if split else sig
            out.append(KernelConfig(
                f"fp4_decode_mma[C={cols},w={warps},s={stages},split={int(split)}]", _fp4_decode_kernel, s,
                {"COLS": cols, "STAGES": stages, "SPLIT_OUT": split, "B_SMEM": b_in_smem(cols), "num_warps": warps},
                num_warps=warps, expect_sass=("HMMA",), unaligned=("M", "N", "steps_per_split", "stride_asm")))
    return out
