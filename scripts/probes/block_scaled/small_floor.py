"""What a small (decode) GEMM can cost at best in the bench's harness (CUDA graph, L2 flushed by
a read before each call), beside the fp4_gemm mma engine with its K split and without it.

Rows: an empty kernel (the harness floor); a Triton kernel reading the FP4 weight's bytes once
(16-byte loads, a few programs an SM: the bandwidth floor of the same bytes after a flush); the
split-K reduction alone (`splitk.splitk_reduce`, the engine's second launch); the mma engine
at the heuristic's split and at other splits. Usage: python scripts/probes/block_scaled/small_floor.py"""
import torch
import triton
import triton.language as tl

from lowbit.bench.timing import measure
from lowbit.kernels.block_scaled import fp4 as f4
from lowbit.kernels.block_scaled.hopper_fp4 import decode_mma_launch
from lowbit.kernels.block_scaled.splitk import splitk_reduce
from lowbit.kernels.quant import act_quant, fp4_quant


@triton.jit
def _empty(x_ptr):
    pass


@triton.jit
def _read(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(ITERS):
        offs = (pid * ITERS + i) * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(out_ptr + pid, tl.reduce_or(acc, 0) if hasattr(tl, "reduce_or") else tl.sum(acc, 0))


def t(fn):
    return measure(fn, cuda_graph=True).median_us


def main():
    dev = "cuda"
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    dummy = torch.zeros(1, device=dev)
    print(f"empty kernel                         {t(lambda: _empty[(1,)](dummy)):7.1f} us")
    for n, k in ((2304, 5120), (5120, 2304)):
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        b, b_s = fp4_quant(w, 32)
        words = b.view(torch.int32).reshape(-1)
        sink = torch.empty(4 * sms * 8, dtype=torch.int32, device=dev)
        nbytes = b.numel() + b_s.numel()
        for progs_per_sm in (2, 4, 8):
            block = 1024
            progs = progs_per_sm * sms
            iters = triton.cdiv(words.numel(), progs * block)
            us = t(lambda: _read[(triton.cdiv(words.numel(), iters * block),)](words, sink, words.numel(), BLOCK=block,
                                                                             ITERS=iters, num_warps=8))
            print(f"(N,K)=({n},{k}) read {nbytes / 1e6:.1f} MB, {progs_per_sm}/SM   {us:7.1f} us"
                  f" {nbytes / us / 1e6:5.2f} TB/s")
        for m in (16, 64):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            a, a_s = act_quant(x, 128)
            out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
            cfg = f4.fp4_gemm_config(m, n, k)
            for split in sorted({1, 2, cfg.split_k // 2 or 1, cfg.split_k, 2 * cfg.split_k}):
                us = t(lambda: decode_mma_launch(a, a_s, b, b_s, out, cfg.block_m, cfg.num_warps, cfg.num_stages,
                                                 split))
                tag = " (heuristic)" if split == cfg.split_k else ""
                print(f"(N,K)=({n},{k}) M={m} mma split {split:2d}{tag:12s} {us:7.1f} us {nbytes / us / 1e6:5.2f} TB/s")
            ws = torch.randn(cfg.split_k, m, n, device=dev)
            print(f"(N,K)=({n},{k}) M={m} splitk_reduce alone ({cfg.split_k})   {t(lambda: splitk_reduce(ws, out)):7.1f} us")


if __name__ == "__main__":
    main()
