"""Run sparse_attn at the issue-6 decode point (b=64, s=1, h=64, d=512, top-k 2048 over 64k KV
rows a batch) three times, for ncu: `ncu --clock-control none -k regex:sparse_attn
--launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats ...`.
Usage: python scripts/probes/sparse_attn_ncu.py [b h topk n]"""
import math
import sys

import torch

from lowbit.kernels.attention.sparse_attn import sparse_attn

b, h, topk, n = (int(x) for x in sys.argv[1:5]) if len(sys.argv) > 4 else (64, 64, 2048, 65536)
d = 512
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(b, 1, h, d, device="cuda", generator=g).to(torch.bfloat16)
kv = torch.randn(b, n, d, device="cuda", generator=g).to(torch.bfloat16)
idx = torch.randint(0, n, (b, 1, topk), device="cuda", generator=g, dtype=torch.int32)
sink = torch.randn(h, device="cuda", generator=g)
for _ in range(3):
    sparse_attn(q, kv, sink, idx, 1.0 / math.sqrt(d))
torch.cuda.synchronize()
