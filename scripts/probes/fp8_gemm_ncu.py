"""Run fp8_gemm (the engine from LOWBIT_FP8_GEMM_* env) and torch._scaled_mm (per-tensor FP8)
on one prefill shape, each twice, for ncu (`ncu --clock-control none -k regex:... --launch-skip 1`).
Usage: python scripts/probes/fp8_gemm_ncu.py M N K"""
import sys

import torch

from lowbit.kernels.block_scaled.fp8 import fp8_gemm

m, n, k = (int(x) for x in sys.argv[1:4])
g = torch.Generator(device="cuda").manual_seed(0)
a = (torch.randn(m, k, device="cuda", generator=g) * 0.5).to(torch.float8_e4m3fn)
b = (torch.randn(n, k, device="cuda", generator=g) * 0.5).to(torch.float8_e4m3fn)
a_s = torch.rand(m, (k + 127) // 128, device="cuda", generator=g) + 0.5
b_s = torch.rand((n + 127) // 128, (k + 127) // 128, device="cuda", generator=g) + 0.5
one = torch.ones((), device="cuda")
for _ in range(2):
    fp8_gemm(a, a_s, b, b_s)
    torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
torch.cuda.synchronize()
