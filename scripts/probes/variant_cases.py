"""The W4A16 register-A kernels' production tiles against text-edited variants of
`w4a16_sm90` (`variants.py`) -- a probe, not a benchmark.

    VARIANT_CASES=chain python scripts/probes/variant_cases.py [indexed] [grouped]
    VARIANT_CASES=nodeq,nogather,noacts python scripts/probes/variant_cases.py indexed
    VARIANT_CASES=old VARIANT_OLD=path/to/old_w4a16_sm90.py python scripts/probes/variant_cases.py
    VARIANT_CASES=late1,late3 VARIANT_TOKENS=1024,2048 VARIANT_BLOCK=128 python scripts/probes/variant_cases.py indexed

Every case runs the public entry points with their heuristics' tiles, once on the kernel module
and once on each variant (the module swapped in ``sys.modules`` around the call); one process,
identical inputs, interleaved CUDA-graph replays (`measure_interleaved`), L2 flushed; outputs
compared bit for bit against the kernel's (only "chain" keeps the arithmetic; the others are
bounds probes whose outputs are garbage). Variants:

- ``chain``: the group loop (`_rs_groups_mainloop`: four-warpgroup tiles and one-warpgroup
  group-loop tiles) issues group g + 1's wgmma behind g's and then waits with one group
  outstanding, instead of retiring g before issuing g + 1 (the tensor pipe no longer drains
  once a group; the same two fragments are live).
- ``nodeq``: the group loop's dequantization replaced by a register move (words and scales
  still loaded).
- ``nogather``: the indexed kernels' cp.async gather of the routed rows never copies (the
  ring keeps its zeros).
- ``noacts``: the grouped kernels' activation TMA only for the first two steps.
- ``evenk``: the cp.async gather without its K-bound check (a bound: valid for K % 256 == 0).
- ``widehalf``: the four-warpgroup indexed tiles' half-tail gather in 16-byte pieces.
- ``late1``, ``late3``, ``late6``: the four-warpgroup indexed tiles issue the next step's gather
  after group 1's / 3's / 6's dequantization instead of straight after group 0's wgmma.
- ``old``: another version of the module's source (the file `VARIANT_OLD`, e.g. the last
  commit's): a kernel change measured against what it replaces ("x" < 1: the change is faster).

H200, 2026-11-30 (twenty-second session): "chain" 0.96-1.04x (not adopted); without the
dequantization the one-warpgroup 128x32 / 128x64 tiles ran 1.23-1.33x faster, the 256x128
1.12x. That led to `int4_dequant`'s subnormal form, measured here first as a variant of the
group loop (its edits are gone with the change): 1.02-1.08x, bit-identical.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants as v

import lowbit
from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped
from variants import KERNEL as base

CHAIN = [("""            w = _dequant_group_regs(words, scales, g, rows_l)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
            acc = warpgroup_mma(w, xs.index(s * _GROUPS + g).permute((1, 0)), acc, is_async=True)
            prev = w""", """            w = _dequant_group_regs(words, scales, g, rows_l)
            acc = warpgroup_mma(w, xs.index(s * _GROUPS + g).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, prev))[0]
            prev = w""")]
NODEQ = [('return gl.inline_asm_elementwise(PTX, "=r,r,r,r,r,r,r", [words, f, c], dtype=gl.bfloat16, is_pure=True, '
          'pack=2)',
          'return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r,r,r,r,r", [words, f, c], dtype=gl.bfloat16, '
          'is_pure=True, pack=2)')]
#: The gather's K bound dropped (every bench K is a multiple of 256): what the per-copy check costs.
EVENK = [("mask=row_ok & (k0 < K))", "mask=row_ok)")]
#: The four-warpgroup tiles' half-tail gather in 16-byte pieces (`_gather_layout(wide_pieces=True)`),
#: where the default layout copies 8-byte pieces for 64 rows over 16 warps.
WIDEHALF = [('"X_HALF_LAYOUT": _gather_layout(br // 2, gather_warps, group_loop) if half else None,',
             '"X_HALF_LAYOUT": _gather_layout(br // 2, gather_warps, group_loop or warps == 16) if half else None,')]


def late_gather(g: int) -> list:
    """The four-warpgroup group loop (EARLY_G0) issuing its cp.async gather of the next rows after
    group `g`'s dequantization (before the wait on group g - 1's products) instead of straight
    after group 0's wgmma: the copies queue behind no dequantization's shared-memory loads."""
    return [("""            if kt > 0:  # every warpgroup is done with step kt-1's stage (the barrier below)
                _refill_stage(x_desc, a_rows, row_ok, w_desc, s_desc, r0, wrow, srow, n0, K, ks, kt - 1, nk, wready,
                              xready, wring, sring, xs, STAGES, GATHER, x_l, K_TAIL)""",
             """            if kt > 0:  # every warpgroup is done with step kt-1's stage (the barrier below)
                _load_weights(w_desc, s_desc, wrow, srow, n0, ks + kt - 1 + STAGES, wready.index((kt - 1) % STAGES),
                              wring, sring, (kt - 1) % STAGES, kt - 1 + STAGES < nk)
                if not GATHER:
                    _load_acts(x_desc, a_rows, row_ok, K, r0, ks + kt - 1 + STAGES, xready.index((kt - 1) % STAGES), xs,
                               (kt - 1) % STAGES, kt - 1 + STAGES < nk, GATHER, x_l, K_TAIL)"""),
            ("""            w = _dequant_group_regs(words, scales, g, rows_l)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
            acc = warpgroup_mma(w, xs.index(s * _GROUPS + g).permute((1, 0)), acc, is_async=True)""",
             f"""            w = _dequant_group_regs(words, scales, g, rows_l)
            if EARLY_G0 and GATHER and g == {g}:
                if kt > 0:
                    _load_acts(x_desc, a_rows, row_ok, K, r0, ks + kt - 1 + STAGES, xready.index((kt - 1) % STAGES),
                               xs, (kt - 1) % STAGES, kt - 1 + STAGES < nk, GATHER, x_l, K_TAIL)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
            acc = warpgroup_mma(w, xs.index(s * _GROUPS + g).permute((1, 0)), acc, is_async=True)""")]


EDITS = {"late1": late_gather(1), "late3": late_gather(3), "late6": late_gather(6), "chain": CHAIN, "evenk": EVENK, "widehalf": WIDEHALF, "evenk_widehalf": EVENK + WIDEHALF, "nodeq": NODEQ, "nogather": [v.NO_GATHER], "noacts": v.NO_ACT_LOADS,
         "nodeq_nogather": NODEQ + [v.NO_GATHER], "nodeq_noacts": NODEQ + v.NO_ACT_LOADS}
NAMES = os.environ.get("VARIANT_CASES", "chain").split(",")
if "old" in NAMES:  # the kernel module against another version of its source (VARIANT_OLD: a file)
    with open(os.environ["VARIANT_OLD"]) as f:
        OLD_SRC = f.read()
MODS = {"kernel": base, **{n: v.variant(n, [], base=OLD_SRC) if n == "old" else v.variant(n, EDITS[n])
                           for n in NAMES}}
gen = torch.Generator(device="cuda").manual_seed(29)
which = sys.argv[1:] or ["indexed", "grouped"]


def compare(label, make_call, out, nbytes, valid=None):
    fns = {}
    outs = {}
    for name, mod in MODS.items():
        o = out.clone()
        outs[name] = o

        def fn(mod=mod, o=o):
            with v.using(mod):
                make_call(o)
        fns[name] = fn
    t = measure_interleaved(fns)
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    ref = outs["kernel"] if valid is None else outs["kernel"][valid]
    k = t["kernel"].median_us
    cells = "  ".join(f"{n} {t[n].median_us:7.1f} x{k / t[n].median_us:.3f}"
                      f"{'' if torch.equal(outs[n] if valid is None else outs[n][valid], ref) else '!'}" for n in NAMES)
    print(f"{label:28} kernel {k:7.1f} ({nbytes / k / 1e6:.2f} TB/s)  {cells}", flush=True)


PROJ = (("gate_up", 4096, 7168), ("down", 7168, 2048))

if "indexed" in which:
    # VARIANT_TOKENS: only these token counts; VARIANT_BLOCK: the routing block pinned (its tile)
    only = {int(t) for t in os.environ["VARIANT_TOKENS"].split(",")} if os.environ.get("VARIANT_TOKENS") else None
    block = int(os.environ["VARIANT_BLOCK"]) if os.environ.get("VARIANT_BLOCK") else None
    for label, e, tok, projs in (("EP8", 48, 8, PROJ), ("EP8", 48, 50, PROJ), ("EP8", 48, 128, PROJ), ("EP8", 48, 256, PROJ),
                                 ("EP8", 48, 1024, PROJ), ("EP8", 48, 2048, PROJ), ("TP8", 384, 1024, (("gate_up", 512, 7168),)),
                                 ("TP8", 384, 8192, (("gate_up", 512, 7168),))):
        if (tok not in only) if only else tok == 8192:
            continue
        ids = torch.stack([torch.randperm(e, generator=gen, device="cuda")[:8] for _ in range(tok)]).to(torch.int32)
        hit = int(torch.unique(ids).numel())
        for i, (proj, n, kk) in enumerate(projs):
            top_k = 8 if i == 0 else 1
            cfg = lowbit.w4a16_indexed_config(tok * 8, e, n, kk, block_m=block, gluon=True)
            r = lowbit.moe_align_block_size(ids, cfg.block_m, e)
            w = pack_w4a16(make_weight(e, n, kk, "cuda"))
            a = torch.randn(tok if top_k == 8 else tok * 8, kk, device="cuda").to(torch.bfloat16)
            out = torch.full((tok * 8, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            call = (lambda o, a=a, w=w, r=r, top_k=top_k, cfg=cfg:
                    lowbit.w4a16_indexed(a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k,
                                         out=o, config=cfg))
            compare(f"{label} t{tok} {proj} {cfg.block_n}x{cfg.block_m}", call, out, hit * n * kk * (0.5 + 2 / 32))

if "grouped" in which:
    e = 48
    for proj, n, kk in PROJ:
        m = e * 128
        w = pack_w4a16_grouped(make_weight(e, n, kk, "cuda"), mode="contiguous")
        a = torch.randn(m, kk, device="cuda").to(torch.bfloat16)
        m_idx = torch.arange(e, device="cuda", dtype=torch.int32).repeat_interleave(128)
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        compare(f"contiguous 128 {proj}", lambda o, a=a, w=w, m_idx=m_idx: lowbit.w4a16_contiguous(a, w, m_idx, out=o),
                out, e * n * kk * (0.5 + 2 / 32))
    for tok in (16, 32, 64):
        counts = (tok * (0.7 + 0.6 * torch.rand(e, generator=gen, device="cuda"))).round().to(torch.int32)
        valid = (torch.arange(256, device="cuda")[None, :] < counts[:, None]).reshape(-1)
        for proj, n, kk in PROJ:
            w = pack_w4a16_grouped(make_weight(e, n, kk, "cuda"), mode="masked")
            a = torch.randn(e * 256, kk, device="cuda").to(torch.bfloat16)
            out = torch.zeros(e * 256, n, dtype=torch.bfloat16, device="cuda")
            compare(f"masked {tok} {proj}",
                    lambda o, a=a, w=w, counts=counts, tok=tok: lowbit.w4a16_masked(a, w, counts, tok, out=o),
                    out, e * n * kk * (0.5 + 2 / 32), valid)
