"""Sweep W4A16 indexed launch configurations on the GPU (a tuning aid, not a test).

    python scripts/w4a16_sweep.py [--cases a,b] [--out rows.json]

Each configuration runs in its own process (a config that faults -- Triton 3.6 has produced
misaligned-address kernels for some tile shapes -- must not take the sweep down): the child
first checks the config against the FP32 reference, then times every case with
triton.testing.do_bench (L2 flushed between reps). Bytes: INT4 weights + scales of the experts
hit, activations read once, output written once. Prints the best passing config per case.
"""

import argparse
import itertools
import json
import os
import subprocess
import sys

READ_BW = 4.50e12

CASES = {
    # name: (rows fed to the GEMM, top_k, experts, N, K)
    "ep8_t1_gate_up": (1, 8, 48, 4096, 7168),
    "ep8_t1_down": (8, 1, 48, 7168, 2048),
    "ep8_t4_gate_up": (4, 8, 48, 4096, 7168),
    "ep8_t20_gate_up": (20, 8, 48, 4096, 7168),
    "ep8_t20_down": (160, 1, 48, 7168, 2048),
    "ep8_t256_gate_up": (256, 8, 48, 4096, 7168),
    "ep8_t256_down": (2048, 1, 48, 7168, 2048),
    "tp8_t1024_gate_up": (1024, 8, 384, 512, 7168),
    "tp8_t1024_down": (8192, 1, 384, 7168, 256),
}


def candidates():
    """(bm, bn, warps, stages, swap, split_k). Split-K only for the decode tiles, where the grid
    is thin (EP8 1 token: 8 experts x N/bn programs)."""
    stages = int(os.environ.get("SWEEP_STAGES", "3"))
    for bm, bn, warps, swap in itertools.product((16, 32, 64, 128), (64, 128, 256), (4, 8), (True, False)):
        if not swap and bm < 64:  # measured: 3-4x slower than swap-AB at these M tiles
            continue
        yield bm, bn, warps, stages, swap, 1
    for bm, bn, warps, split in itertools.product((16, 32), (64, 128, 256), (4, 8), (2, 4)):
        yield bm, bn, warps, stages, True, split


def _cfg(cfg_s):
    from lowbit.kernels.w4a16.heuristics import W4A16Config as W4A16IndexedConfig

    bm, bn, warps, stages, swap, split = (int(x) for x in cfg_s.split(","))
    return W4A16IndexedConfig(bm, bn, warps, stages, bool(swap), split_k=split)


def child_check(cfg_s: str) -> None:
    """Correctness of one config against the FP32 reference (odd shape: N, K off the tiles)."""
    import torch

    from lowbit import reference, routing
    from lowbit.formats import get_format
    from lowbit.formats.w4a16 import pack_w4a16
    from lowbit.kernels.w4a16.indexed import w4a16_indexed
    from lowbit.testing import make_generator, random_topk_ids, rel_fro_err

    cfg = _cfg(cfg_s)
    g = make_generator(1)
    e, n, k, t, top_k = 8, 320, 1312, 37, 4
    wq = get_format("int4_g32").quantize(torch.randn(e, n, k, generator=g) * 0.05)
    pw = pack_w4a16(wq).to("cuda")
    a = torch.randn(t, k, generator=g).to(torch.bfloat16).cuda()
    ids = random_topk_ids(t, top_k, e, generator=g).cuda()
    r = routing.moe_align_block_size(ids, cfg.block_m, e)
    out = w4a16_indexed(a, pw, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, config=cfg)
    wq_gpu = type(wq)(wq.codes.cuda(), wq.scales.cuda(), wq.fmt)
    ref = reference.w4a16_indexed_ref(a, wq_gpu, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k)
    print(json.dumps({"check": cfg_s, "rel_err": rel_fro_err(out.float(), ref)}), flush=True)


def child_time(cfgs: list[str], cases: list[str]) -> None:
    """Time passing configs on every case; one JSON line per row, streamed."""
    import torch
    import triton

    from lowbit import routing
    from lowbit.formats.w4a16 import LAYOUT_K256_GROUP_NIBBLES, W4A16Weight
    from lowbit.kernels.w4a16.indexed import w4a16_indexed
    from lowbit.testing import make_generator, random_topk_ids

    g = make_generator(1)
    problems = {}
    for name in cases:
        t, top_k, e, n, k = CASES[name]
        w = W4A16Weight(torch.randint(-2**31, 2**31 - 1, (e, n, k // 8), dtype=torch.int32, device="cuda"),
                        (torch.rand(e, k // 32, n, device="cuda") * 0.01 + 0.001).to(torch.bfloat16),
                        n, k, LAYOUT_K256_GROUP_NIBBLES, "indexed")
        a = torch.randn(t, k, device="cuda").to(torch.bfloat16)
        ids = (random_topk_ids(t // 8, 8, e, generator=g).view(-1, 1) if top_k == 1
               else random_topk_ids(t, top_k, e, generator=g)).cuda()
        hit = ids.unique().numel()
        bytes_ = hit * (n * k // 2 + n * k // 16) + t * k * 2 + ids.numel() * n * 2
        problems[name] = (w, a, ids, top_k, e, bytes_, 2 * ids.numel() * n * k)
    for cfg_s in cfgs:
        cfg = _cfg(cfg_s)
        print(json.dumps({"start": cfg_s}), flush=True)
        for name, (w, a, ids, top_k, e, bytes_, flops) in problems.items():
            r = routing.moe_align_block_size(ids, cfg.block_m, e)
            fn = lambda: w4a16_indexed(a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, config=cfg)
            us = triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median") * 1e3
            print(json.dumps(dict(case=name, cfg=cfg_s, us=us, tbps=bytes_ / us / 1e6,
                                  bw=bytes_ / (us * 1e-6) / READ_BW, tflops=flops / us / 1e6)), flush=True)


def _run(args, timeout=600):
    return subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout)


def main():
    from concurrent.futures import ThreadPoolExecutor

    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--check", default=None)
    ap.add_argument("--time", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cases = args.cases.split(",")
    if args.check:
        return child_check(args.check)
    if args.time:
        return child_time(args.time.split(";"), cases)
    cfgs = [",".join(str(int(x)) for x in c) for c in candidates()]
    # phase 1 (parallel: compile-bound): a config that faults or is wrong never gets timed
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda c: (c, _run(["--check", c], 300)), cfgs))
    passing, bad = [], []
    for c, res in results:
        chk = next((json.loads(l) for l in res.stdout.splitlines() if l.startswith("{")), None)
        if res.returncode == 0 and chk and chk["rel_err"] < 4e-3:
            passing.append(c)
        else:
            tail = res.stderr.strip().splitlines()[-1:] if res.stderr.strip() else []
            bad.append((c, chk and chk["rel_err"], tail))
            print(f"FAIL {c}: err={chk and chk['rel_err']} {tail}", flush=True)
    # phase 2 (serial: the GPU is timed); a process that dies loses only the config it was on
    rows, todo = [], list(passing)
    while todo:
        res = _run(["--time", ";".join(todo), "--cases", args.cases])
        current = None
        for l in res.stdout.splitlines():
            if not l.startswith("{"):
                continue
            d = json.loads(l)
            if "start" in d:
                current = d["start"]
                todo.remove(current)
            else:
                rows.append(d)
        if res.returncode != 0:
            bad.append((current, None, res.stderr.strip().splitlines()[-1:]))
            print(f"FAIL (timing) {current}: {res.stderr.strip().splitlines()[-1:]}", flush=True)
            if current is None:
                break
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "failed": bad}, f)
    print("\nbest passing config per case (bm,bn,warps,stages,swap,split_k):")
    for name in cases:
        rs = sorted((r for r in rows if r["case"] == name), key=lambda r: r["us"])
        for r in rs[:3]:
            print(f"{name:20s} {r['cfg']:16s} {r['us']:8.1f} us {r['tbps']:5.2f} TB/s ({100 * r['bw']:4.1f}% BW) {r['tflops']:6.1f} TFLOP/s")


if __name__ == "__main__":
    main()
