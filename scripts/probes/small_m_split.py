"""fp8_gemm and fp4_gemm at small M (16, 64, 128) on the V4-Flash shapes, engine by engine and
K split by K split, in one process (CUDA graph, L2 flushed by a read, as the bench): fp8_gemm's
Triton kernel (its heuristic) and the 64x128 Gluon kernel split 1 / 2 / 4 / its heuristic / 2x
that; fp4_gemm's mma engine (its heuristic) and the fold engine on a weight folded once
(`fold_fp4_weight`) with the same splits; torch's per-tensor FP8 GEMM. Outputs checked against
the unsplit Gluon / mma result (relative Frobenius error).
Usage: python scripts/probes/small_m_split.py [M ...]"""
import sys
from dataclasses import replace

import torch

from lowbit.bench.timing import measure
from lowbit.kernels.block_scaled.fp4 import fold_fp4_weight, fp4_gemm, fp4_gemm_config
from lowbit.kernels.block_scaled.fp8 import BlockScaledConfig, fp8_gemm, fp8_gemm_config
from lowbit.kernels.block_scaled.heuristics import gluon_split_k
from lowbit.kernels.quant import act_quant, fp4_quant


def t(fn):
    return measure(fn, cuda_graph=True).median_us


def err(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def main():
    ms = [int(x) for x in sys.argv[1:]] or [16, 64, 128]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, k in ((2304, 5120), (5120, 2304)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        b4, b4_s = fp4_quant(w, 32)
        b8, b8_s = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn), \
            torch.rand((n + 127) // 128, (k + 127) // 128, device="cuda") + 0.5
        folded = fold_fp4_weight(b4, b4_s)
        one = torch.ones((), device="cuda")
        for m in ms:
            a, a_s = act_quant(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), 128)
            rows = []
            tri = fp8_gemm_config(m, n, k, sms, gluon=False)
            gsplit = gluon_split_k(m, n, (k + 127) // 128, sms)[0]
            gl0 = BlockScaledConfig(64, 128, 4, 4, False, split_k=1, engine="gluon")
            ref8 = fp8_gemm(a, a_s, b8, b8_s, config=gl0)
            rows.append(("torch per-tensor fp8", t(lambda: torch._scaled_mm(a, b8.t(), scale_a=one, scale_b=one,
                                                                          out_dtype=torch.bfloat16)), None))
            rows.append((f"fp8 triton split {tri.split_k}", t(lambda: fp8_gemm(a, a_s, b8, b8_s, config=tri)),
                         err(fp8_gemm(a, a_s, b8, b8_s, config=tri), ref8)))
            heur = fp8_gemm_config(m, n, k, sms, gluon=True)
            splits = sorted({1, 2, 3, 4, gsplit, 2 * gsplit})
            for s in splits:
                c = replace(gl0, split_k=s)
                tag = " (heuristic)" if heur.engine == "gluon" and heur.split_k == s else (" (rule)" if s == gsplit else "")
                rows.append((f"fp8 gluon 64x128 split {s}{tag}", t(lambda c=c: fp8_gemm(a, a_s, b8, b8_s, config=c)),
                             err(fp8_gemm(a, a_s, b8, b8_s, config=c), ref8)))
            mma = fp4_gemm_config(m, n, k, 128, sms, gluon=True, mma=True)
            ref4 = fp4_gemm(a, a_s, folded, config=mma) if mma.engine == "mma" else fp4_gemm(a, a_s, folded)
            if mma.engine == "mma":
                rows.append((f"fp4 mma split {mma.split_k}", t(lambda: fp4_gemm(a, a_s, folded, config=mma)), 0.0))
            fold0 = replace(gl0, engine="fold")
            for s in splits:
                c = replace(fold0, split_k=s)
                rows.append((f"fp4 folded 64x128 split {s}", t(lambda c=c: fp4_gemm(a, a_s, folded, config=c)),
                             err(fp4_gemm(a, a_s, folded, config=c), ref4)))
            for name, us, e in rows:
                print(f"M={m:4d} (N,K)=({n},{k}) {name:36s} {us:7.1f} us" + ("" if e is None else f"  err {e:.1e}"))


if __name__ == "__main__":
    main()
