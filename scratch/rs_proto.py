import torch, triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from lowbit.kernels.w4a16_sm90 import _dequant_pair, _load_weight_step, _S_LAYOUT, _x_layout, _GROUPS


@gluon.jit
def _dequant_regs(wring, sring, st, dot_a: gl.constexpr):
    """Step held in stage `st`, dequantized straight into wgmma A fragments: eight ``[BW, 32]``
    bf16 tensors (group g = K ``32g ..`` of the step) in the register layout `dot_a`."""
    words = wring.index(st).load(dot_a)
    BW: gl.constexpr = wring.shape[1]
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    scales = sring.index(st)._reinterpret(gl.bfloat16, [8 * BW], flat)
    srow: gl.constexpr = gl.SliceLayout(1, dot_a)
    w0, w4 = _dequant_pair(words, scales.slice(0 * BW, BW).load(srow)[:, None], scales.slice(4 * BW, BW).load(srow)[:, None])
    w1, w5 = _dequant_pair(words >> 4, scales.slice(1 * BW, BW).load(srow)[:, None], scales.slice(5 * BW, BW).load(srow)[:, None])
    w2, w6 = _dequant_pair(words >> 8, scales.slice(2 * BW, BW).load(srow)[:, None], scales.slice(6 * BW, BW).load(srow)[:, None])
    w3, w7 = _dequant_pair(words >> 12, scales.slice(3 * BW, BW).load(srow)[:, None], scales.slice(7 * BW, BW).load(srow)[:, None])
    return w0, w1, w2, w3, w4, w5, w6, w7


@gluon.jit
def _issue_regs(xs, s, acc, w0, w1, w2, w3, w4, w5, w6, w7):
    acc = warpgroup_mma(w0, xs.index(s * _GROUPS + 0).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w1, xs.index(s * _GROUPS + 1).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w2, xs.index(s * _GROUPS + 2).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w3, xs.index(s * _GROUPS + 3).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w4, xs.index(s * _GROUPS + 4).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w5, xs.index(s * _GROUPS + 5).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w6, xs.index(s * _GROUPS + 6).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w7, xs.index(s * _GROUPS + 7).permute((1, 0)), acc, is_async=True)
    return acc


@gluon.jit
def _load_step(x_desc, w_desc, s_desc, r0, wrow, srow, n0, kt, bar, xs, wring, sring, st, pred):
    step_bytes: gl.constexpr = _GROUPS * x_desc.block_type.nbytes + w_desc.block_type.nbytes + s_desc.block_type.nbytes
    mbarrier.expect(bar, step_bytes, pred=pred)
    _load_weight_step(w_desc, s_desc, wrow, srow, n0, kt, bar, wring, sring, st, pred)
    for g in gl.static_range(_GROUPS):
        tma.async_copy_global_to_shared(x_desc, [r0, kt * 256 + g * 32], bar, xs.index(st * _GROUPS + g), pred=pred)


@gluon.jit
def _w4a16_grouped_rs_kernel(
    x_desc, w_desc, s_desc, c_ptr, route_ptr,
    N, K, max_m, stride_cm,
    STAGES: gl.constexpr, MASKED: gl.constexpr, num_warps: gl.constexpr,
):
    BR: gl.constexpr = x_desc.block_type.shape[0]
    BW: gl.constexpr = w_desc.block_type.shape[0]
    pid_r = gl.program_id(0)
    pid_n = gl.program_id(1)
    if MASKED:
        blocks = gl.cdiv(max_m, BR)
        e = pid_r // blocks
        rb = (pid_r % blocks) * BR
        valid = gl.minimum(gl.load(route_ptr + e), max_m)
        if rb >= valid:
            return
        r0 = e * max_m + rb
    else:
        r0 = pid_r * BR
        e = gl.load(route_ptr + r0)
        if e < 0:
            return
    n0 = pid_n * BW

    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BR, 16])
    dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    xs = gl.allocate_shared_memory(x_desc.dtype, [STAGES * _GROUPS, BR, 32], x_desc.layout)
    wring = gl.allocate_shared_memory(w_desc.dtype, [STAGES, BW, 32], w_desc.layout)
    sring = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 8, BW], s_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)

    nk = gl.cdiv(K, 256)
    wrow = e * N + n0
    srow = e * nk * 8
    for i in gl.static_range(STAGES):
        _load_step(x_desc, w_desc, s_desc, r0, wrow, srow, n0, i, ready.index(i), xs, wring, sring, i, i < nk)

    acc = gl.zeros([BW, BR], gl.float32, mma)
    mbarrier.wait(ready.index(0), 0)
    w0, w1, w2, w3, w4, w5, w6, w7 = _dequant_regs(wring, sring, 0, dot_a)
    for kt in range(nk - 1):
        s = kt % STAGES
        acc = _issue_regs(xs, s, acc, w0, w1, w2, w3, w4, w5, w6, w7)
        # step kt+1 dequantized into registers while step kt's products run
        s1 = (kt + 1) % STAGES
        mbarrier.wait(ready.index(s1), ((kt + 1) // STAGES) & 1)
        v0, v1, v2, v3, v4, v5, v6, v7 = _dequant_regs(wring, sring, s1, dot_a)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
        gl.thread_barrier()  # every warpgroup is done with stage s before it is refilled
        _load_step(x_desc, w_desc, s_desc, r0, wrow, srow, n0, kt + STAGES, ready.index(s), xs, wring, sring, s,
                   kt + STAGES < nk)
        w0, w1, w2, w3, w4, w5, w6, w7 = v0, v1, v2, v3, v4, v5, v6, v7
    acc = _issue_regs(xs, (nk - 1) % STAGES, acc, w0, w1, w2, w3, w4, w5, w6, w7)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, w0, w1, w2, w3, w4, w5, w6, w7))[0]
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    on = n0 + gl.arange(0, BW, layout=gl.SliceLayout(1, mma))
    orr = r0 + gl.arange(0, BR, layout=gl.SliceLayout(0, mma))
    if MASKED:
        row_live = orr - e * max_m < valid
    else:
        row_live = gl.load(route_ptr + orr) >= 0
    c = c_ptr + orr[None, :].to(gl.int64) * stride_cm + on[:, None]
    gl.store(c, acc.to(gl.bfloat16), mask=(on < N)[:, None] & row_live[None, :])


if __name__ == "__main__":
    import sys
    from triton.runtime.jit import mangle_type
    from lowbit.kernels.compile_tier import KernelConfig, compile_sm90
    for bw, br, warps, stages in [(64, 128, 4, 2), (64, 128, 4, 3), (128, 128, 8, 2), (128, 64, 8, 3), (64, 64, 4, 4)]:
        words = torch.empty(64, 64, dtype=torch.int32); scales = torch.empty(64, 64, dtype=torch.bfloat16)
        probe = torch.empty(16, 16, dtype=torch.bfloat16)
        sig = {"x_desc": mangle_type(TensorDescriptor(probe, [16, 16], [16, 1], [br, 32], _x_layout(br))),
               "w_desc": mangle_type(TensorDescriptor(words, [64, 64], [64, 1], [bw, 32], gl.NVMMASharedLayout.get_default_for([bw, 32], gl.int32))),
               "s_desc": mangle_type(TensorDescriptor(scales, [64, 64], [64, 1], [8, bw], _S_LAYOUT)),
               "c_ptr": "*bf16", "route_ptr": "*i32", "N": "i32", "K": "i32", "max_m": "i32", "stride_cm": "i32",
               "STAGES": "constexpr", "MASKED": "constexpr", "num_warps": "constexpr"}
        cfg = KernelConfig(f"rs[{bw},{br},{warps},{stages}]", _w4a16_grouped_rs_kernel, sig,
                           {"STAGES": stages, "MASKED": False, "num_warps": warps}, num_warps=warps, num_stages=1,
                           expect_sass=("HGMMA",), expect_ptx=("wgmma.wait_group.sync.aligned 0",), unaligned=("N", "K", "max_m"))
        r = compile_sm90(cfg)
        print(r.name, r.ok, "regs", r.registers, "spill", r.spill_bytes, "smem", r.shared_bytes, r.ptxas_warnings[:2], r.error[-1500:])
