"""fp8_gemm_sm90 variants side by side in one process (CUDA graph replays, L2 flushed by a read
between replays is not done here: the operands of one call, 33-45 MB, stay L2-resident either
way): the 64x128 kernel, the warp-specialized kernel with two (128 rows; one product a block or
PAIRS) or three (192 rows) consumer warpgroups, plain or TMA-store epilogue, and torch's
per-tensor FP8 GEMM. Outputs compared with the 64x128 kernel's (same promotion order).
Usage: python scripts/probes/fp8_ws.py"""
import torch

from lowbit.kernels.block_scaled.hopper_fp8 import fp8_gemm_sm90_launch


def bench(fn, reps=50):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps // 10 + 5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 100)  # us per call (10 calls a replay)
    ts.sort()
    return ts[len(ts) // 2]


for m, n, k in ((4096, 2304, 5120), (4096, 5120, 2304), (8192, 8192, 8192)):
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.randn(m, k, device="cuda", generator=gen) * 0.5).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, device="cuda", generator=gen) * 0.5).to(torch.float8_e4m3fn)
    a_s = torch.rand(m, (k + 127) // 128, device="cuda", generator=gen) + 0.5
    b_s = torch.rand((n + 127) // 128, (k + 127) // 128, device="cuda", generator=gen) + 0.5
    ref = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    fp8_gemm_sm90_launch(a, a_s, b, b_s, ref, m, n, k, 64, 128, 4, 4)  # the 64x128 kernel: same promotion order
    ref = ref.float()
    one = torch.ones((), device="cuda")
    rows = {"torch per-tensor": lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)}
    variants = {"64x128": (64, 4, None, None, None)}
    for g in (1, 8):  # the persistent tile order: N-fastest (1) or groups of 8 row tiles
        variants[f"ws128 group {g}"] = (128, 8, True, True, g)
        variants[f"ws192 group {g}"] = (192, 12, False, True, g)
    for name, (bm, w, pairs, store, g) in variants.items():
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        rows[name] = (lambda out=out, bm=bm, w=w, pairs=pairs, store=store, g=g:
                      fp8_gemm_sm90_launch(a, a_s, b, b_s, out, m, n, k, bm, 128, w, 4, pairs=pairs,
                                           tma_store=store, group_m=g))
        rows[name]()
        torch.cuda.synchronize()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        rows[name].err = err
    flops = 2 * m * n * k
    for name, fn in rows.items():
        us = bench(fn)
        print(f"M={m} N={n} K={k} {name:18s} {us:8.1f} us {flops / us / 1e6:7.1f} TFLOP/s"
              f"{'' if name.startswith('torch') else f'  diff vs 64x128 {fn.err:.1e}'}")
