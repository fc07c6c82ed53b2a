"""sparse_attn's engines side by side in one process (CUDA graph, L2 flushed by a read, as the
bench): the Triton kernel (its heuristic) and the Gluon kernel (`sparse_attn_sm90`) at each of
its tiles and several top-k splits, at the decode point (b=64, s=1, h=64, d=512, top-k
2048 over 64k KV rows a batch) and the bench's prefill point (b=1, s=1024, same heads / top-k); outputs
compared with the Triton kernel's (relative Frobenius error). GB/s on the gathered bytes.
`bounds`: the Gluon kernel (its first tile, splits 1 and 2) at the decode point with pieces removed
(variants built by text edits, as `variants.py` does): no gather (the ring holds stale rows), no
PV products, the gather alone; then the random-row read ceiling (a Triton kernel that only
reads and sums the same rows).
`ab OLD_FILE`: another version of `sparse_attn_sm90` (its launcher, its own tile table) beside
the current one at both points, splits 1-3, outputs compared (save it first, e.g. `git show
REV:src/lowbit/kernels/attention/hopper.py > scratch/old.py`, and carry `scratch`; a version
from before the in-kernel fold gets its workspace and the combine kernel, `_with_combine`).
Usage: python scripts/probes/sparse_attn_engines.py [decode] [prefill] [bounds] [ab OLD_FILE]"""
import math
import sys
from dataclasses import replace

import torch

from lowbit.bench.timing import measure
from lowbit.kernels.attention.sparse_attn import SparseAttnConfig, sparse_attn, sparse_attn_config
from lowbit.kernels.attention.tiles import GLUON_TILES

POINTS = {"decode": (64, 1, 64, 2048, 65536), "prefill": (1, 1024, 64, 2048, 65536)}


#: The gather's cp.async dropped (the ring holds stale rows; barriers still pass).
NO_GATHER = [("    async_copy.async_copy_global_to_shared(kv_ring.index(2 * buf + half), src, mask=ok[:, None])\n", "")]
#: The consumers' P kv products dropped (scores and softmax stay).
NO_PV = [("        acc = warpgroup_mma(pa, kv_ring.index(2 * z), acc, is_async=True)\n", ""),
         ("        acc = warpgroup_mma(p_smem.index(1), kv_ring.index(2 + 2 * z), acc, is_async=True)\n", ""),
         ("        acc = warpgroup_mma(p_smem.index(0), kv_ring.index(1 + 2 * z), acc, is_async=True)\n", ""),
         ("        acc = warpgroup_mma(pa, kv_ring.index(3 + 2 * z), acc, is_async=True)\n", "")]


def _gather_only(src: str) -> list[tuple[str, str]]:
    """Each consumer's loop body replaced by: wait for the half buffers it frees, free them
    (WG0 frees both left halves, WG1 both right ones): the gather partition alone."""
    edits = []
    for fn, halves in (("_attend_even", (0, 2)), ("_attend_odd", (1, 3))):
        i = src.index("def " + fn)
        a = src.index("    for t in range(npairs):", i)
        body = src[a:src.index("    _epilogue(", a)]
        new = "    for t in range(npairs):\n        phase = t & 1\n" + "".join(
            f"        mbarrier.wait(ready.index({h}), phase)\n        mbarrier.arrive(empty.index({h}), count=1)\n"
            for h in halves)
        edits.append((body, new))
    return edits


def bounds():
    import lowbit.kernels.attention.hopper as sm90
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
    launch = sm90.sparse_attn_sm90_launch
    for name, edits in (("full", []), ("no gather", NO_GATHER), ("no PV", NO_PV), ("gather only", _gather_only(base))):
        sm90.sparse_attn_sm90_launch = variant("sa_" + name.replace(" ", "_"), edits, base).sparse_attn_sm90_launch
        for split in (1, 2):
            cfg = SparseAttnConfig(64, bk, 8, stages, False, split_kv=split, engine="gluon")
            us = measure(lambda cfg=cfg: sparse_attn(q, kv, sink, idx, config=cfg), cuda_graph=True).median_us
            print(f"bounds   gluon BK {bk} split {split}, {name:12s} {us:8.1f} us")
    sm90.sparse_attn_sm90_launch = launch
    ceiling(kv, idx)


def ceiling(kv, idx):
    """The random-row read ceiling of the decode point: a Triton kernel that only reads the
    same gathered KV rows (one program a 64-slot block, many programs an SM) and sums them."""
    import triton
    import triton.language as tl

    @triton.jit
    def _gather_sum(kv_ptr, idx_ptr, out_ptr, N, stride_b, TOPK, BK: tl.constexpr, D: tl.constexpr):
        bi = tl.program_id(0)
        j = tl.program_id(1)
        rows = tl.load(idx_ptr + bi * TOPK + j * BK + tl.arange(0, BK))
        x = tl.load(kv_ptr + bi.to(tl.int64) * stride_b + rows.to(tl.int64)[:, None] * D + tl.arange(0, D)[None, :])
        tl.store(out_ptr + bi * tl.num_programs(1) + j, tl.sum(x.to(tl.float32)))

    b, _, topk = idx.shape
    out = torch.empty(b, topk // 64, device="cuda")
    for warps in (4, 8):
        fn = lambda warps=warps: _gather_sum[(b, topk // 64)](kv, idx, out, kv.shape[1], kv.stride(0), topk, 64, 512,
                                                               num_warps=warps)
        us = measure(fn, cuda_graph=True).median_us
        print(f"ceiling  Triton gather-sum of the same rows, {warps} warps {us:8.1f} us "
              f"{b * topk * 1024 / us / 1e6:6.2f} TB/s")


def _inputs(name):
    b, s, h, topk, n = POINTS[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, s, h, 512, device="cuda", generator=g).to(torch.bfloat16)
    kv = torch.empty(b, n, 512, dtype=torch.bfloat16, device="cuda")
    for i in range(b):
        kv[i] = torch.randn(n, 512, device="cuda", generator=g).to(torch.bfloat16)
    idx = torch.randint(0, n, (b, s, topk), device="cuda", generator=g, dtype=torch.int32)
    return q, kv, torch.randn(h, device="cuda", generator=g), idx


def _with_combine(launch):
    """A launcher from before the in-kernel fold (it took an FP32 workspace `dst` and left the
    split shares to `_sparse_attn_combine_kernel`) in the current launcher's signature."""
    import inspect

    import triton

    from lowbit.kernels.attention import portable
    from lowbit.kernels.attention.tiles import COMBINE_HEADS

    if "dst" not in inspect.signature(launch).parameters:
        return launch

    def run(q, kv, sink, idx, out, qk_scale, per, splits, block_kv, stages):
        b, s, h, d = q.shape
        dst = out if splits == 1 else torch.empty(b * s, splits, h, d + 2, dtype=torch.float32, device=q.device)
        launch(q, kv, sink, idx, dst, out, qk_scale, per, splits, block_kv, stages)
        if splits > 1:
            portable._sparse_attn_combine_kernel[(b * s, triton.cdiv(h, COMBINE_HEADS))](
                dst, sink, out, h, s, splits, out.stride(0), out.stride(1), out.stride(2),
                D=d, BD=d, HC=COMBINE_HEADS, num_warps=4)
    return run


def ab(old_file):
    import importlib.util

    import lowbit.kernels.attention.sparse_attn as sa
    import lowbit.kernels.attention.hopper as sm90

    spec = importlib.util.spec_from_file_location("lowbit.kernels.attention.hopper_old", old_file)  # relative imports resolve
    old = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = old
    spec.loader.exec_module(old)
    check, launch = sa.check_config, sm90.sparse_attn_sm90_launch
    sa.check_config = lambda c: c  # the old version's tiles are not the current table's
    for name in ("decode", "prefill"):
        q, kv, sink, idx = _inputs(name)
        b, s, h, topk, _ = POINTS[name]
        base = sparse_attn_config(b, s, h, "cuda", topk)
        ref = sparse_attn(q, kv, sink, idx, config=base)
        for tag, fn, tiles in (("old", _with_combine(old.sparse_attn_sm90_launch), getattr(old, "GLUON_TILES", GLUON_TILES)),
                               ("new", launch, GLUON_TILES)):
            sm90.sparse_attn_sm90_launch = fn
            for bk, stages in tiles:
                for split in (1, 2, 3):
                    cfg = SparseAttnConfig(64, bk, 8, stages, False, split_kv=split, engine="gluon")
                    out = sparse_attn(q, kv, sink, idx, config=cfg)
                    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    us = measure(lambda cfg=cfg: sparse_attn(q, kv, sink, idx, config=cfg), cuda_graph=True).median_us
                    print(f"ab {name:8s} {tag} BK {bk} stages {stages} split {split}  {us:8.1f} us  diff {err:.1e}")
    sa.check_config, sm90.sparse_attn_sm90_launch = check, launch


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
