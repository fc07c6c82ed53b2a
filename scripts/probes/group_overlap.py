"""What bounds the four-warpgroup W4A16 main loop (`w4a16_sm90._rs_groups_mainloop`) on the
prefill tiles, and does keeping two groups' wgmmas in flight help (a probe, not a benchmark).

    python scripts/probes/group_overlap.py [compile | ws]

Variants of `w4a16_sm90` built by text edits (`variants.py`), timed interleaved
(`measure_interleaved`, CUDA graph, L2 flushed) on identical inputs, Kimi EP8 shapes:

- ``base``: the production loop (dequantize group g+1 under group g's wgmma, then
  ``wait_group 0``: one group in flight a warpgroup);
- ``wait1``: two groups in flight (dequantize group g while g-2 and g-1 run, ``wait_group 1``
  before issuing g); same arithmetic in the same order, so bit-identical;
- ``nodeq``: the dequantization replaced by a register move (garbage): MMA + loads alone;
- ``halfmma``: the odd groups' wgmmas dropped (garbage): is the tensor pipe the bound?

``compile`` only compiles the variants for sm_90a (no GPU) and prints ptxas's serialization
notes (C7510-C7515), registers and spills. ``ws``: the same questions of the warp-specialized
256x64 (`_ws_groups_partition`, with its tails) at indexed 256 tokens and masked 32 tok/expert:
``base``, ``nodeq``, ``halfmma`` (the odd groups' wgmmas dropped there), ``wait1`` (two groups'
wgmmas in flight a warpgroup, bit-identical).
"""
import sys

import torch

from variants import variant

_GROUPS_LOOP = """        prev = _dequant_group_regs(words, scales, 0, rows_l)
        acc = warpgroup_mma(prev, xs.index(s * _GROUPS).permute((1, 0)), acc, is_async=True)
        for g in gl.static_range(1, _GROUPS):
            w = _dequant_group_regs(words, scales, g, rows_l)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
            acc = warpgroup_mma(w, xs.index(s * _GROUPS + g).permute((1, 0)), acc, is_async=True)
            prev = w
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
        if GATHER:"""
WAIT1 = (_GROUPS_LOOP, """        p0 = _dequant_group_regs(words, scales, 0, rows_l)
        acc = warpgroup_mma(p0, xs.index(s * _GROUPS).permute((1, 0)), acc, is_async=True)
        p1 = _dequant_group_regs(words, scales, 1, rows_l)
        acc = warpgroup_mma(p1, xs.index(s * _GROUPS + 1).permute((1, 0)), acc, is_async=True)
        for g in gl.static_range(2, _GROUPS):
            w = _dequant_group_regs(words, scales, g, rows_l)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, p0))[0]
            acc = warpgroup_mma(w, xs.index(s * _GROUPS + g).permute((1, 0)), acc, is_async=True)
            p0 = p1
            p1 = w
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p0, p1))[0]
        if GATHER:""")
NODEQ = ('return gl.inline_asm_elementwise(PTX, "=r,r,r,r", [words, sc], dtype=gl.bfloat16, is_pure=True, pack=2)',
         'return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r,r,r", [words, sc], dtype=gl.bfloat16, '
         'is_pure=True, pack=2)')
HALFMMA = ("""            acc = warpgroup_mma(w, xs.index(s * _GROUPS + g).permute((1, 0)), acc, is_async=True)
            prev = w
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
        if GATHER:""", """            if g % 2 == 0:
                acc = warpgroup_mma(w, xs.index(s * _GROUPS + g).permute((1, 0)), acc, is_async=True)
            prev = w
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, prev))[0]
        if GATHER:""")

HALFMMA_WS = ("""            acc, acc2 = _issue_group_rows(w, xs.index(s * _GROUPS + g), acc, acc2, dot_a2, SPLIT)""",
              """            if g % 2 == 0:
                acc, acc2 = _issue_group_rows(w, xs.index(s * _GROUPS + g), acc, acc2, dot_a2, SPLIT)""")

VARIANTS = {"base": [], "wait1": [WAIT1], "nodeq": [NODEQ], "halfmma": [HALFMMA]}
WAIT1_WS = ("""        prev = _dequant_group_regs(words, scales, 0, rows_l)
        acc, acc2 = _issue_group_rows(prev, xs.index(s * _GROUPS), acc, acc2, dot_a2, SPLIT)
        for g in gl.static_range(1, _GROUPS):
            w = _dequant_group_regs(words, scales, g, rows_l)
            acc, acc2 = _retire_group_rows(acc, acc2, prev, SPLIT)
            acc, acc2 = _issue_group_rows(w, xs.index(s * _GROUPS + g), acc, acc2, dot_a2, SPLIT)
            prev = w
        fence_async_shared()  # generic-proxy reads of the stage ordered before the producer's TMA refill
        mbarrier.arrive(wempty.index(s), count=1)
        acc, acc2 = _retire_group_rows(acc, acc2, prev, SPLIT)""",
            """        p0 = _dequant_group_regs(words, scales, 0, rows_l)
        acc, acc2 = _issue_group_rows(p0, xs.index(s * _GROUPS), acc, acc2, dot_a2, SPLIT)
        p1 = _dequant_group_regs(words, scales, 1, rows_l)
        acc, acc2 = _issue_group_rows(p1, xs.index(s * _GROUPS + 1), acc, acc2, dot_a2, SPLIT)
        for g in gl.static_range(2, _GROUPS):
            w = _dequant_group_regs(words, scales, g, rows_l)
            if SPLIT:
                done = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc2, p0))
                acc = done[0]
                acc2 = done[1]
            else:
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, p0))[0]
            acc, acc2 = _issue_group_rows(w, xs.index(s * _GROUPS + g), acc, acc2, dot_a2, SPLIT)
            p0 = p1
            p1 = w
        fence_async_shared()  # generic-proxy reads of the stage ordered before the producer's TMA refill
        mbarrier.arrive(wempty.index(s), count=1)
        acc, acc2 = _retire_group_rows(acc, acc2, p1, SPLIT)""")
WS_VARIANTS = {"base": [], "nodeq": [NODEQ], "halfmma": [HALFMMA_WS], "wait1": [WAIT1_WS]}
E, H, I = 48, 7168, 2048
PROJ = (("gate_up", 2 * I, H, 8), ("down", H, I, 1))
WIDE = ((256, 64, 16, 3), (256, 128, 16, 2))


def compile_only() -> None:
    from lowbit.kernels import compile_tier as ct
    for name, edits in VARIANTS.items():
        mod = variant(name, edits)
        for c in mod.compile_configs():
            if not any(f"BW={t[0]},BR={t[1]},w={t[2]},stages={t[3]}" in c.name for t in WIDE):
                continue
            if "MUL_WEIGHT=1" in c.name or "contiguous" in c.name and "BR=64" in c.name:
                continue
            r = ct.compile_sm90(c)
            print(f"{name:8} {c.name:70} regs {r.registers} spill {r.spill_bytes} {r.ptxas_warnings}", flush=True)


def main() -> None:
    from lowbit import routing
    from lowbit.bench.cases import make_weight
    from lowbit.bench.timing import measure_interleaved
    from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped

    mods = {name: variant(name, edits) for name, edits in VARIANTS.items()}
    gen = torch.Generator(device="cuda").manual_seed(11)

    def run(label, flops, make_fn, n_rows, n):
        outs = {v: torch.zeros(n_rows, n, dtype=torch.bfloat16, device="cuda") for v in mods}
        fns = {v: make_fn(m, outs[v]) for v, m in mods.items()}
        t = measure_interleaved(fns)
        same = torch.equal(outs["base"], outs["wait1"])
        cells = "  ".join(f"{v} {t[v].median_us:7.1f}" for v in mods)
        print(f"{label:34} {cells}  wait1 x{t['base'].median_us / t['wait1'].median_us:.3f} "
              f"{'equal' if same else 'DIFFERENT'}  base {flops / t['base'].median_us / 1e6:4.0f} TFLOP/s", flush=True)

    for t_tok, block, tile in ((256, 64, (256, 64, 16, 3)), (1024, 128, (256, 128, 16, 2))):
        ids = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:8] for _ in range(t_tok)]).to(torch.int32)
        r = routing.moe_align_block_size(ids, block, E)
        for proj, n, kk, top_k in PROJ:
            w = pack_w4a16(make_weight(E, n, kk, "cuda"))
            a = torch.randn(t_tok if top_k == 8 else t_tok * 8, kk, device="cuda").to(torch.bfloat16)
            run(f"indexed t{t_tok} {proj} {tile[0]}x{tile[1]}", 2 * t_tok * 8 * n * kk,
                lambda m, o, w=w, a=a, r=r, top_k=top_k, tile=tile: (lambda: m.w4a16_indexed_sm90_launch(
                    a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, None, o, tile, True, False)),
                t_tok * 8, n)
    for tok in (32,):
        counts = (tok * (0.7 + 0.6 * torch.rand(E, generator=gen, device="cuda"))).round().to(torch.int32)
        for proj, n, kk, _ in PROJ:
            w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="masked")
            a = torch.randn(E * 256, kk, device="cuda").to(torch.bfloat16)
            run(f"masked {tok} {proj} 256x64", 2 * int(counts.sum()) * n * kk,
                lambda m, o, w=w, a=a, c=counts: (lambda: m.w4a16_grouped_sm90_launch(
                    a, w, c, o, (256, 64, 16, 3), 256, regs_a=True, row_slots=m.masked_row_slots(1.3 * 32, 256, 64))),
                E * 256, n)
    for rows in (128,):
        for proj, n, kk, _ in PROJ:
            w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="contiguous")
            a = torch.randn(E * rows, kk, device="cuda").to(torch.bfloat16)
            route = torch.arange(E, device="cuda", dtype=torch.int32).repeat_interleave(rows)
            run(f"contiguous {rows} {proj} 256x128", 2 * E * rows * n * kk,
                lambda m, o, w=w, a=a, route=route: (lambda: m.w4a16_grouped_sm90_launch(
                    a, w, route, o, (256, 128, 16, 2), 0, regs_a=True)),
                E * rows, n)


def main_ws() -> None:
    from lowbit import routing
    from lowbit.bench.cases import make_weight
    from lowbit.bench.timing import measure_interleaved
    from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped

    mods = {name: variant(f"ws_{name}", edits) for name, edits in WS_VARIANTS.items()}
    gen = torch.Generator(device="cuda").manual_seed(11)
    tile = (256, 64, 16, 3)

    def run(label, flops, make_fn, n_rows, n):
        outs = {v: torch.zeros(n_rows, n, dtype=torch.bfloat16, device="cuda") for v in mods}
        t = measure_interleaved({v: make_fn(m, outs[v]) for v, m in mods.items()})
        cells = "  ".join(f"{v} {t[v].median_us:7.1f}" for v in mods)
        same = "equal" if torch.equal(outs["base"], outs["wait1"]) else "DIFFERENT"
        print(f"{label:34} {cells}  wait1 x{t['base'].median_us / t['wait1'].median_us:.3f} {same}  "
              f"base {flops / t['base'].median_us / 1e6:4.0f} TFLOP/s", flush=True)

    ids = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:8] for _ in range(256)]).to(torch.int32)
    r = routing.moe_align_block_size(ids, 64, E)
    for proj, n, kk, top_k in PROJ:
        w = pack_w4a16(make_weight(E, n, kk, "cuda"))
        a = torch.randn(256 if top_k == 8 else 256 * 8, kk, device="cuda").to(torch.bfloat16)
        run(f"ws indexed t256 {proj} 256x64", 2 * 256 * 8 * n * kk,
            lambda m, o, w=w, a=a, top_k=top_k: (lambda: m.w4a16_indexed_sm90_launch(
                a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, None, o, tile, True, True)),
            256 * 8, n)
    counts = (32 * (0.7 + 0.6 * torch.rand(E, generator=gen, device="cuda"))).round().to(torch.int32)
    for proj, n, kk, _ in PROJ:
        w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="masked")
        a = torch.randn(E * 256, kk, device="cuda").to(torch.bfloat16)
        run(f"ws masked 32 {proj} 256x64", 2 * int(counts.sum()) * n * kk,
            lambda m, o, w=w, a=a: (lambda: m.w4a16_grouped_sm90_launch(a, w, counts, o, tile, 256, regs_a=True,
                                                                        warp_specialize=True)),
            E * 256, n)


if __name__ == "__main__":
    if "compile" in sys.argv[1:]:
        compile_only()
    elif "ws" in sys.argv[1:]:
        main_ws()
    else:
        main()
