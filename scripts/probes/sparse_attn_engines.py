"""sparse_attn's engines side by side in one process (CUDA graph, L2 flushed by a read, as the
bench): the Triton kernel (its heuristic) and the Gluon kernel (`sparse_attn_sm90`) at each of
its tiles and several top-k splits, at the issue-6 decode point (b=64, s=1, h=64, d=512, top-k
2048 over 64k KV rows a batch) and the bench's prefill point (b=1, s=1024, same heads / top-k); outputs
compared with the Triton kernel's (relative Frobenius error). GB/s on the gathered bytes.
Usage: python scripts/probes/sparse_attn_engines.py [decode] [prefill]"""
import math
import sys
from dataclasses import replace

import torch

from lowbit.bench.timing import measure
from lowbit.kernels.sparse_attn import SparseAttnConfig, sparse_attn, sparse_attn_config
from lowbit.kernels.sparse_attn_sm90 import GLUON_TILES

POINTS = {"decode": (64, 1, 64, 2048, 65536), "prefill": (1, 1024, 64, 2048, 65536)}


def main():
    for name in sys.argv[1:] or ["decode", "prefill"]:
        b, s, h, topk, n = POINTS[name]
        d = 512
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, s, h, d, device="cuda", generator=g).to(torch.bfloat16)
        kv = torch.empty(b, n, d, dtype=torch.bfloat16, device="cuda")
        for i in range(b):
            kv[i] = torch.randn(n, d, device="cuda", generator=g).to(torch.bfloat16)
        idx = torch.randint(0, n, (b, s, topk), device="cuda", generator=g, dtype=torch.int32)
        sink = torch.randn(h, device="cuda", generator=g)
        scale = 1.0 / math.sqrt(d)
        gathered = b * s * topk * d * 2
        base = sparse_attn_config(b, s, h, "cuda", topk)
        ref = sparse_attn(q, kv, sink, idx, scale, config=base)
        rows = [(f"triton {base.heads_per_program} heads BK {base.block_kv} split {base.split_kv}", base)]
        for bk, stages in GLUON_TILES:
            for split in sorted({1, 2, 4, base.split_kv}):
                rows.append((f"gluon BK {bk} stages {stages} split {split}",
                             SparseAttnConfig(64, bk, 8, stages, False, split_kv=split, engine="gluon")))
        for label, cfg in rows:
            out = sparse_attn(q, kv, sink, idx, scale, config=cfg)
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            us = measure(lambda cfg=cfg: sparse_attn(q, kv, sink, idx, scale, config=cfg), cuda_graph=True).median_us
            print(f"{name:8s} {label:36s} {us:8.1f} us {gathered / us / 1e3:7.0f} GB/s "
                  f"{4 * b * s * h * topk * d / us / 1e6:6.0f} TFLOP/s  diff {err:.1e}")


if __name__ == "__main__":
    main()
