"""The indexed MoE layer with and without programmatic dependent launch -- a probe, not a
benchmark.

    python scripts/probes/pdl_chain.py [TOKENS ...]     (default 1 2 4 8 16 32 128 256)

`lowbit.moe_experts(path="indexed")` (routing, gate_up, silu_mul, down, combine) on Kimi K2.x
EP8 shapes (48 experts, H 7168, I 2048, top-8), captured once with ``LOWBIT_PDL=0`` (plain
launches) and once with PDL (`lowbit.kernels.pdl`: down streams its first weight steps before
its wait), beside Humming's indexed GEMMs in the same composition (the bench's
``humming-indexed`` provider), interleaved CUDA-graph replays behind an L2 flush
(`measure_interleaved`); the two lowbit outputs compared bit for bit ("!" marks a difference).
The output-centric path's two kernels waiting first under PDL measured 0.99-1.00x plain
launches (twenty-third session, INT4 and MXFP8, 1-32 tokens): not kept, so not probed here.
"""
import os
import sys

import torch

from lowbit.bench.opcases import OP_CASES, _decode_case
from lowbit.bench.ops import DecodeHummingIndexed, DecodeLowbitIndexed, build_op_problem
from lowbit.bench.timing import measure_interleaved
from lowbit.kernels.pdl import ENV

tokens = [int(t) for t in sys.argv[1:]] or [1, 2, 4, 8, 16, 32, 128, 256]


def with_env(value, fn):
    def call():
        saved = os.environ.get(ENV)
        os.environ[ENV] = value
        try:
            return fn()
        finally:
            if saved is None:
                os.environ.pop(ENV)
            else:
                os.environ[ENV] = saved
    return call


print(f"{'tokens':>6} {'plain us':>9} {'pdl us':>8} {'humming us':>10} {'pdl/plain':>9} {'x hum plain':>11} "
      f"{'x hum pdl':>9}", flush=True)
for t in tokens:
    name = f"decode_oc_int4_t{t}"
    case = next((c for c in OP_CASES if c.name == name), None) or _decode_case(t, "int4", e=48, h=7168, inter=2048,
                                                                                top_k=8)
    problem = build_op_problem(case, "cuda")
    fns, outs = {}, {}
    for label, env in (("plain", "0"), ("pdl", "1")):
        prov = DecodeLowbitIndexed()
        with_env(env, lambda prov=prov: prov.prepare(problem))()
        outs[label] = with_env(env, prov.run)().clone()
        fns[label] = with_env(env, prov.run)
    hum = DecodeHummingIndexed()
    if hum.unavailable_reason() is None:
        hum.prepare(problem)
        fns["humming"] = hum.run
    tm = measure_interleaved(fns, rounds=80)
    same = "" if torch.equal(outs["plain"], outs["pdl"]) else "!"
    p, q = tm["plain"].median_us, tm["pdl"].median_us
    h = tm["humming"].median_us if "humming" in tm else float("nan")
    print(f"{t:>6} {p:9.1f} {q:8.1f}{same} {h:10.1f} {p / q:9.3f} {h / p:11.3f} {h / q:9.3f}", flush=True)
