"""sparse_attn's engines side by side in one process, and the random-row read ceiling of its
decode point (a probe, not a benchmark).

    python scripts/probes/attention/sparse_attn_engines.py [decode] [prefill] [ceiling]

CUDA graph, L2 flushed by a read, as the bench. Points: decode (b=64, s=1, h=64, d=512, top-k
2048 over 64k KV rows a batch) and the bench's prefill (b=1, s=1024, same heads and top-k).
``decode`` / ``prefill``: the Triton kernel at its heuristic's config and the Gluon kernel at
each of its tiles and several top-k splits; outputs compared with the heuristic's (relative
Frobenius error); GB/s on the gathered bytes. ``ceiling``: a Triton kernel that only reads and
sums the decode point's gathered rows (many programs an SM), the bandwidth at which the H200
reads these random 1 KB rows (docs/measurements/attention.md). Default: all three."""
import math
import sys

import torch
import triton
import triton.language as tl

from lowbit.bench.timing import measure
from lowbit.kernels.attention.hopper import GLUON_TILES
from lowbit.kernels.attention.sparse_attn import SparseAttnConfig, sparse_attn, sparse_attn_config

#: (batch, queries a batch, heads, top-k, KV rows a batch)
POINTS = {"decode": (64, 1, 64, 2048, 65536), "prefill": (1, 1024, 64, 2048, 65536)}
D = 512


def inputs(name: str):
    """q ``bf16 [b, s, h, D]``, kv ``bf16 [b, n, D]``, sink ``fp32 [h]``, idx ``int32 [b, s, topk]``."""
    b, s, h, topk, n = POINTS[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, h, D, device="cuda", generator=g).to(torch.bfloat16)
    kv = torch.empty(b, n, D, dtype=torch.bfloat16, device="cuda")
    for i in range(b):
        kv[i] = torch.randn(n, D, device="cuda", generator=g).to(torch.bfloat16)
    sink = torch.randn(h, device="cuda", generator=g)
    idx = torch.randint(0, n, (b, s, topk), device="cuda", generator=g, dtype=torch.int32)
    return q, kv, sink, idx


def engines(name: str) -> None:
    b, s, h, topk, _ = POINTS[name]
    q, kv, sink, idx = inputs(name)
    scale = 1.0 / math.sqrt(D)
    gathered = b * s * topk * D * 2
    base = sparse_attn_config(b, s, h, "cuda", topk)
    ref = sparse_attn(q, kv, sink, idx, scale, config=base)
    rows = [(f"{base.engine} {base.heads_per_program} heads BK {base.block_kv} split {base.split_kv}", base)]
    for bk, stages in GLUON_TILES:
        for split in sorted({1, 2, 4, base.split_kv}):
            rows.append((f"gluon BK {bk} stages {stages} split {split}",
                         SparseAttnConfig(64, bk, 8, stages, False, split_kv=split, engine="gluon")))
    for label, cfg in rows:
        out = sparse_attn(q, kv, sink, idx, scale, config=cfg)
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        us = measure(lambda cfg=cfg: sparse_attn(q, kv, sink, idx, scale, config=cfg), cuda_graph=True).median_us
        print(f"{name:8s} {label:36s} {us:8.1f} us {gathered / us / 1e3:7.0f} GB/s "
              f"{4 * b * s * h * topk * D / us / 1e6:6.0f} TFLOP/s  diff {err:.1e}", flush=True)


@triton.jit
def _gather_sum(kv_ptr, idx_ptr, out_ptr, stride_b, TOPK, BK: tl.constexpr, DIM: tl.constexpr):
    bi = tl.program_id(0)
    j = tl.program_id(1)
    rows = tl.load(idx_ptr + bi * TOPK + j * BK + tl.arange(0, BK))
    x = tl.load(kv_ptr + bi.to(tl.int64) * stride_b + rows.to(tl.int64)[:, None] * DIM + tl.arange(0, DIM)[None, :])
    tl.store(out_ptr + bi * tl.num_programs(1) + j, tl.sum(x.to(tl.float32)))


def ceiling() -> None:
    """Read the decode point's gathered KV rows once (one program a 64-slot block) and sum them."""
    _, kv, _, idx = inputs("decode")
    b, _, topk = idx.shape
    out = torch.empty(b, topk // 64, device="cuda")
    for warps in (4, 8):
        fn = lambda warps=warps: _gather_sum[(b, topk // 64)](kv, idx, out, kv.stride(0), topk, 64, D,  # noqa: E731
                                                               num_warps=warps)
        us = measure(fn, cuda_graph=True).median_us
        print(f"ceiling  Triton gather-sum of the same rows, {warps} warps {us:8.1f} us "
              f"{b * topk * D * 2 / us / 1e6:6.2f} TB/s", flush=True)


def main() -> None:
    for what in sys.argv[1:] or ["decode", "prefill", "ceiling"]:
        if what == "ceiling":
            ceiling()
        else:
            engines(what)


if __name__ == "__main__":
    main()
