"""sparse_attn's engines side by side in one process (CUDA graph, L2 flushed by a read, as the
bench): the Triton kernel (its heuristic) and the Gluon kernel (`sparse_attn_sm90`) at each of
its tiles and several top-k splits, at the issue-6 decode point (b=64, s=1, h=64, d=512, top-k
2048 over 64k KV rows a batch) and the bench's prefill point (b=1, s=1024, same heads / top-k); outputs
compared with the Triton kernel's (relative Frobenius error). GB/s on the gathered bytes.
`bounds`: the Gluon kernel (its first tile, split 2) at the decode point with pieces removed (variants
built by text edits, as `variants.py` does): no gather (the ring holds stale rows), no PV
product, no product at all (the softmax stays).
`ab OLD_FILE`: another version of `sparse_attn_sm90` (its launcher, its own tile table) beside
the current one at both points, outputs compared (save it first, e.g. `git show
REV:src/lowbit/kernels/sparse_attn_sm90.py > scratch/old.py`, and carry `scratch`).
Usage: python scripts/probes/sparse_attn_engines.py [decode] [prefill] [bounds] [ab OLD_FILE]"""
import math
import sys
from dataclasses import replace

import torch

from lowbit.bench.timing import measure
from lowbit.kernels.sparse_attn import SparseAttnConfig, sparse_attn, sparse_attn_config
from lowbit.kernels.sparse_attn_sm90 import GLUON_TILES

POINTS = {"decode": (64, 1, 64, 2048, 65536), "prefill": (1, 1024, 64, 2048, 65536)}


NO_GATHER = [("        async_copy.async_copy_global_to_shared(kv_ring.index(st), src, mask=ok[:, None])\n", "")]
NO_PV = [("""        acc = warpgroup_mma(gl.convert_layout(p.to(gl.bfloat16), p_l), blk, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
""", "")]
NO_MMA = NO_PV + [("s = warpgroup_mma(q_smem, blk.permute((1, 0)), gl.zeros([HT, BK], gl.float32, s_l), use_acc=False)",
                   "s = gl.zeros([HT, BK], gl.float32, s_l) + j.to(gl.float32)")]


def bounds():
    import lowbit.kernels.sparse_attn_sm90 as sm90
    from variants import variant

    base = open(sm90.__file__).read()
    b, s, h, topk, n = POINTS["decode"]
    d = 512
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, h, d, device="cuda", generator=g).to(torch.bfloat16)
    kv = torch.randn(b, n, d, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, n, (b, s, topk), device="cuda", generator=g, dtype=torch.int32)
    sink = torch.randn(h, device="cuda", generator=g)
    bk, stages = GLUON_TILES[0]
    cfg = SparseAttnConfig(64, bk, 8, stages, False, split_kv=2, engine="gluon")
    launch = sm90.sparse_attn_sm90_launch
    for name, edits in (("full", []), ("no gather", NO_GATHER), ("no PV", NO_PV), ("no products", NO_MMA)):
        sm90.sparse_attn_sm90_launch = variant("sa_" + name.replace(" ", "_"), edits, base).sparse_attn_sm90_launch
        us = measure(lambda: sparse_attn(q, kv, sink, idx, config=cfg), cuda_graph=True).median_us
        print(f"bounds   gluon BK {bk} split 2, {name:12s} {us:8.1f} us")
    sm90.sparse_attn_sm90_launch = launch


def _inputs(name):
    b, s, h, topk, n = POINTS[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, h, 512, device="cuda", generator=g).to(torch.bfloat16)
    kv = torch.empty(b, n, 512, dtype=torch.bfloat16, device="cuda")
    for i in range(b):
        kv[i] = torch.randn(n, 512, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, n, (b, s, topk), device="cuda", generator=g, dtype=torch.int32)
    return q, kv, torch.randn(h, device="cuda", generator=g), idx


def ab(old_file):
    import importlib.util

    import lowbit.kernels.sparse_attn as sa
    import lowbit.kernels.sparse_attn_sm90 as sm90

    spec = importlib.util.spec_from_file_location("lowbit.kernels.sparse_attn_sm90_old", old_file)  # relative imports resolve
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old
    spec.loader.exec_module(old)
    check, launch = sa._check_config, sm90.sparse_attn_sm90_launch
    sa._check_config = lambda c: c  # the old version's tiles are not the current table's
    for name in ("decode", "prefill"):
        q, kv, sink, idx = _inputs(name)
        b, s, h, topk, _ = POINTS[name]
        base = sparse_attn_config(b, s, h, "cuda", topk)
        ref = sparse_attn(q, kv, sink, idx, config=base)
        for tag, fn, tiles in (("old", old.sparse_attn_sm90_launch, old.GLUON_TILES),
                               ("new", launch, sm90.GLUON_TILES)):
            sm90.sparse_attn_sm90_launch = fn
            for bk, stages in tiles:
                for split in (1, 2):
                    cfg = SparseAttnConfig(64, bk, 8, stages, False, split_kv=split, engine="gluon")
                    out = sparse_attn(q, kv, sink, idx, config=cfg)
                    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    us = measure(lambda cfg=cfg: sparse_attn(q, kv, sink, idx, config=cfg), cuda_graph=True).median_us
                    print(f"ab {name:8s} {tag} BK {bk} stages {stages} split {split}  {us:8.1f} us  diff {err:.1e}")
    sa._check_config, sm90.sparse_attn_sm90_launch = check, launch


def main():
    args = sys.argv[1:] or ["decode", "prefill"]
    if "ab" in args:
        ab(args[args.index("ab") + 1])
        args = [a for a in args if a not in ("ab", args[args.index("ab") + 1])]
    if "bounds" in args:
        bounds()
    for name in [a for a in args if a != "bounds"]:
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
