import torch, triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

S_L = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)

@gluon.jit
def probe(w_desc, s_desc, wout, sA, sB, sC, num_warps: gl.constexpr):
    BW: gl.constexpr = 64
    words_l: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])
    wr = gl.allocate_shared_memory(w_desc.dtype, [BW, 32], w_desc.layout)
    sr = gl.allocate_shared_memory(s_desc.dtype, [8, BW], s_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, w_desc.block_type.nbytes + s_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(w_desc, [0, 0], bar, wr)
    tma.async_copy_global_to_shared(s_desc, [0, 0], bar, sr)
    mbarrier.wait(bar, 0)
    words = wr.load(words_l)
    r = gl.arange(0, BW, layout=gl.SliceLayout(1, words_l))
    c = gl.arange(0, 32, layout=gl.SliceLayout(0, words_l))
    gl.store(wout + r[:, None] * 32 + c[None, :], words)
    plain: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    sp = sr._reinterpret(gl.bfloat16, [8, BW], plain)
    c1 = gl.arange(0, 1, layout=gl.SliceLayout(0, words_l))
    for i in gl.static_range(8):
        a = sr.slice(i, 1, dim=0).permute((1, 0)).load(words_l)
        gl.store(sA + i * BW + r[:, None] + c1[None, :], a)
        b = sp.slice(i, 1, dim=0).permute((1, 0)).load(words_l)
        gl.store(sB + i * BW + r[:, None] + c1[None, :], b)
    full_l: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, num_warps], [1, 0])
    t = sr.load(full_l)
    ri = gl.arange(0, 8, layout=gl.SliceLayout(1, full_l))
    ci = gl.arange(0, BW, layout=gl.SliceLayout(0, full_l))
    gl.store(sC + ri[:, None] * BW + ci[None, :], t)

w = torch.randint(-2**31, 2**31 - 1, (64, 32), dtype=torch.int32, device="cuda")
s = torch.randn(8, 64, device="cuda").to(torch.bfloat16)
wd = TensorDescriptor(w, [64, 32], [32, 1], [64, 32], gl.NVMMASharedLayout.get_default_for([64, 32], gl.int32))
sd = TensorDescriptor(s, [8, 64], [64, 1], [8, 64], S_L)
wo = torch.zeros_like(w); sA = torch.zeros(8, 64, dtype=torch.bfloat16, device="cuda"); sB = torch.zeros_like(sA); sC = torch.zeros_like(sA)
probe[(1,)](wd, sd, wo, sA, sB, sC, num_warps=4)
torch.cuda.synchronize()
print("words ok", torch.equal(wo, w))
print("scales A (nvmma slice+permute) ok", torch.equal(sA, s))
print("scales B (plain reinterpret) ok", torch.equal(sB, s))
print("scales C (full tile) ok", torch.equal(sC, s))
if not torch.equal(sA, s):
    print(s[:2, :8]); print(sA[:2, :8])
