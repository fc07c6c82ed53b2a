"""Time the fold engine of `fp4_gemm` phase by phase on the H200 (a probe, not a test).

    PYTHONPATH=src python scripts/probes/fp4_fold_phases.py

Phases: `portable.fold_weight` (FP4 -> FP8 + per-row scales + flags), the Gluon GEMM with per-row
scales, the fixup launch (all flags 0: every program exits), and for comparison `fp8_gemm`'s
Gluon GEMM with 128x128 block scales on the same shape. CUDA graph, L2 flushed by reads.
"""
# ruff: noqa: B023  (each closure is timed inside the iteration that builds it)
import torch

from lowbit.bench.timing import measure
from lowbit.kernels.block_scaled import fp4 as f4
from lowbit.kernels.block_scaled import portable
from lowbit.kernels.block_scaled.fp8 import fp8_gemm, fp8_gemm_config
from lowbit.kernels.block_scaled.hopper_fp8 import fp8_gemm_sm90_launch


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k in ((4096, 2304, 5120), (4096, 5120, 2304), (128, 2304, 5120)):
        a = torch.randn(m, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
        a_s = torch.rand(m, k // 128, device="cuda", generator=g) + 0.5
        b = torch.randint(0, 256, (n, k // 2), device="cuda", dtype=torch.uint8, generator=g)
        b_s = torch.randint(120, 130, (n, k // 32), device="cuda", dtype=torch.uint8, generator=g)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        cfg = f4.fp4_gemm_config(m, n, k, 128, 132, True)
        w8, w8_s, left = portable.fold_weight(b, b_s)
        b8 = torch.randn(n, k, device="cuda", generator=g).to(torch.float8_e4m3fn)
        b8_s = torch.rand((n + 127) // 128, k // 128, device="cuda", generator=g) + 0.5
        c8 = fp8_gemm_config(m, n, k, 132, True)
        t = {
            "fold": measure(lambda: portable.fold_weight(b, b_s), cuda_graph=True, rep_ms=20).median_us,
            "gemm_per_row": measure(lambda: fp8_gemm_sm90_launch(a, a_s, w8, w8_s, out, m, n, k, 64, 128, 4, 4,
                                                                 b_scale_per_row=True),
                                    cuda_graph=True, rep_ms=20).median_us,
            "fixup_empty": measure(lambda: portable.fold_fixup(a, a_s, b, b_s, left, out), cuda_graph=True,
                                   rep_ms=20).median_us,
            "fp4_gemm": measure(lambda: f4.fp4_gemm(a, a_s, b, b_s, 128, out=out), cuda_graph=True,
                                rep_ms=20).median_us,
            "fp8_gemm": measure(lambda: fp8_gemm(a, a_s, b8, b8_s, out=out, config=c8), cuda_graph=True,
                                rep_ms=20).median_us,
        }
        print(f"M={m} N={n} K={k} engine={cfg.engine} flags={int(left.sum())}: "
              + "  ".join(f"{kk} {v:.1f} us" for kk, v in t.items()), flush=True)


if __name__ == "__main__":
    main()
