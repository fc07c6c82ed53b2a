"""Decode tiles of the W4A16 register-A kernel by routing block and main loop -- a probe, not
a benchmark.

    python scripts/probes/decode_blocks.py [indexed] [masked]
    DECODE_BLOCKS_VARIANTS=8x2g,w8x2g python scripts/probes/decode_blocks.py indexed
    python scripts/probes/decode_blocks.py mid
    python scripts/probes/decode_blocks.py wide64
    python scripts/probes/decode_blocks.py big
    python scripts/probes/decode_blocks.py edges
    python scripts/probes/decode_blocks.py thin
    python scripts/probes/decode_blocks.py w256
    python scripts/probes/decode_blocks.py two

The step loop (`_rs_steps_mainloop`: a whole 256-wide K step's fragments held twice, ~128
registers, four CTAs an SM) against the group loop (`_rs_groups_mainloop` on one warpgroup:
one K group at a time under the `w4a16_sm90.GROUP_LOOP_MAXNREG` cap, six to eight CTAs an SM),
on 8- and 16-row routing blocks (indexed) and 16- and 32-row tiles (masked); "mid": the 32-row
routing block (EP8 64-190 tokens, TP8 1024 tokens gate_up) and masked 16 tok/expert with the
32-row tile's 128-row form (half tail included, as the 64-row tile has it); "wide64": the 64-row
routing block / masked 32 tok/expert, the warp-specialized four-warpgroup 256x64 against
one-warpgroup group loops of 64 and 128 weight rows, and the 16- against the 32-row block at
32-64 tokens; "big": the 128-row block's four-warpgroup 256x128 against the 64-row block's
one-warpgroup 128x64 (with its half tail) at EP8 512-1024 tokens and TP8 8192 tokens gate_up;
"edges": the routing blocks around their tok_e thresholds (32 vs 64 rows at EP8 160-224
tokens, 64 vs 128 rows at 320-512; other token counts with ``EDGES_32_64=128,144`` and
``EDGES_64_128=576,640``); "thin": masked 8 / 16 tok/expert on 24 and 12 experts, whose
grids of 128-row programs are under `GROUP_LOOP_MIN_PROGRAMS` (the 64-row tiles against their
128-row forms); "w256": 256 weight rows on one warpgroup (four m64 wgmmas a group, 168-232
registers: two CTAs an SM) against the 128-row forms; "two": 256 weight rows as two warpgroups
of 128 on the group loop (one activation ring for both) against one warpgroup of 128; "w" tiles: 128
weight rows on one warpgroup (two m64 wgmmas a group), the group loop under a cap. A tile runs the
group loop when it is in that table; the probe adds a tile to it for one launch to try it.
One process, identical inputs, interleaved CUDA-graph replays (`measure_interleaved`), L2
flushed; outputs compared bit for bit against the first variant (valid rows for masked; "!"
marks a difference, expected only against a SPLIT_ACC tile, whose odd groups sum apart).
Kimi EP8 shapes (48 experts; gate_up N 4096 K 7168, down N 7168 K 2048): indexed 1-50 tokens
top-8; masked 8 and 16 tok/expert (counts 0.7-1.3x, max_m 256, the row-slot grid).
"""
import contextlib
import os
import sys

import torch

from lowbit import routing
from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped

from variants import KERNEL as sm90, tile_form

gen = torch.Generator(device="cuda").manual_seed(19)
E = 48
PROJ = (("gate_up", 4096, 7168), ("down", 7168, 2048))
which = sys.argv[1:] or ["indexed", "masked"]

def V(tile, cap=None, ws=False, tail=None):
    """A variant: `tile`, the register cap of a group loop tried here (None: as the tables say),
    warp-specialized or not, its half tail on / off (None: as its tile record says)."""
    return tuple(tile), cap, ws, tail


# name: variant
INDEXED = {"16x3": V((64, 16, 4, 3)), "16x2g": V((64, 16, 4, 2), 72), "8x3": V((64, 8, 4, 3)),
           "8x2g": V((64, 8, 4, 2)), "8x3g": V((64, 8, 4, 3), 64),
           "w8x2g": V((128, 8, 4, 2), 96), "w16x2g": V((128, 16, 4, 2), 128)}
if os.environ.get("DECODE_BLOCKS_VARIANTS"):  # a subset, comma-separated names (the first is the reference)
    INDEXED = {v: INDEXED[v] for v in os.environ["DECODE_BLOCKS_VARIANTS"].split(",")}
MASKED = {8: {"16x3": V((64, 16, 4, 3)), "16x2g": V((64, 16, 4, 2)), "8x2g": V((64, 8, 4, 2), 64),
              "w16x2g": V((128, 16, 4, 2))},
          16: {"32x4": V((64, 32, 4, 4)), "32x2g": V((64, 32, 4, 2), 128), "32x3g": V((64, 32, 4, 3), 168),
               "16x2g": V((64, 16, 4, 2))}}
TP8 = (("gate_up", 512, 7168),)


@contextlib.contextmanager
def group_loop(tile, cap, masked_half_tail=None, indexed_half_tail=None):
    """Run `tile` on the group loop under `cap` registers (None: as the tables say), with or
    without the half tail of each layout (None: as its `tiles.RegisterATile` record says)."""
    saved = dict(sm90.GROUP_LOOP_MAXNREG)  # (the dict the launchers read: changed in place)
    if cap:
        sm90.GROUP_LOOP_MAXNREG[tuple(tile)] = cap
    try:
        with contextlib.ExitStack() as stack:
            for layout, on in (("masked", masked_half_tail), ("indexed", indexed_half_tail)):
                if on is not None:
                    stack.enter_context(tile_form(layout, tile, half_tail=on))
            yield
    finally:
        sm90.GROUP_LOOP_MAXNREG.clear()
        sm90.GROUP_LOOP_MAXNREG.update(saved)


def report(label, outs, t, byts, valid=None):
    names = list(outs)
    ref = outs[names[0]] if valid is None else outs[names[0]][valid]
    cells = "  ".join(f"{v} {t[v].median_us:6.1f}{'' if torch.equal(outs[v] if valid is None else outs[v][valid], ref) else '!'}"
                      for v in names)
    best = min(names, key=lambda v: t[v].median_us)
    print(f"{label:20} {cells}  best {best} x{t[names[0]].median_us / t[best].median_us:.3f} "
          f"({byts / t[best].median_us / 1e6:.2f} TB/s)", flush=True)

def indexed_case(label, e, tok, projs, plan):
    """Every variant of `plan` on one top-8 routing draw of `tok` tokens over `e` experts, for
    each projection (gate_up top_k 8, down top_k 1), interleaved; one line a projection."""
    ids = torch.stack([torch.randperm(e, generator=gen, device="cuda")[:8] for _ in range(tok)]).to(torch.int32)
    rts = {br: routing.moe_align_block_size(ids, br, e) for br in {v[0][1] for v in plan.values()}}
    hit = int(torch.unique(ids).numel())
    for i, (proj, n, kk) in enumerate(projs):
        top_k = 8 if i == 0 else 1
        w = pack_w4a16(make_weight(e, n, kk, "cuda"))
        a = torch.randn(tok if top_k == 8 else tok * 8, kk, device="cuda").to(torch.bfloat16)
        outs = {v: torch.full((tok * 8, n), float("nan"), dtype=torch.bfloat16, device="cuda") for v in plan}

        def launch(v):
            tile, cap, ws, tail = plan[v]
            r = rts[tile[1]]
            with group_loop(tile, cap, indexed_half_tail=tail):
                sm90.w4a16_indexed_sm90_launch(a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded,
                                               top_k, None, outs[v], tile, True, ws)
        report(f"{label} t{tok} {proj}", outs, measure_interleaved({v: (lambda v=v: launch(v)) for v in plan}),
               hit * n * kk * (0.5 + 2 / 32))


def masked_case(label, e, tok, plan):
    """Every variant of `plan` on masked counts of 0.7-1.3x `tok` over `e` experts (max_m 256,
    the row-slot grid of 1.3x `tok`; the warp-specialized kernel one program a block), both
    projections; valid rows compared."""
    counts = (tok * (0.7 + 0.6 * torch.rand(e, generator=gen, device="cuda"))).round().to(torch.int32)
    valid = (torch.arange(256, device="cuda")[None, :] < counts[:, None]).reshape(-1)
    for proj, n, kk in PROJ:
        w = pack_w4a16_grouped(make_weight(e, n, kk, "cuda"), mode="masked")
        a = torch.randn(e * 256, kk, device="cuda").to(torch.bfloat16)
        outs = {v: torch.zeros(e * 256, n, dtype=torch.bfloat16, device="cuda") for v in plan}

        def launch(v):
            tile, cap, ws, tail = plan[v]
            slots = 0 if ws else sm90.masked_row_slots(1.3 * tok, 256, tile[1])
            with group_loop(tile, cap, masked_half_tail=tail):
                sm90.w4a16_grouped_sm90_launch(a, w, counts, outs[v], tile, 256, regs_a=True, warp_specialize=ws,
                                               row_slots=slots)
        report(f"{label} {tok} {proj}", outs, measure_interleaved({v: (lambda v=v: launch(v)) for v in plan}),
               e * n * kk * (0.5 + 2 / 32), valid)


if "indexed" in which:
    for tok in (1, 4, 8, 16, 32, 50):
        indexed_case("indexed", E, tok, PROJ, INDEXED)

if "masked" in which:
    for tok, plan in MASKED.items():
        masked_case("masked", E, tok, plan)

if "mid" in which:
    MID = {"32x4": V((64, 32, 4, 4)), "32x2g": V((64, 32, 4, 2)), "w32x2g": V((128, 32, 4, 2), 128),
           "w32x3g": V((128, 32, 4, 3), 128)}
    for label, e, tok, projs in (("EP8", E, 64, PROJ), ("EP8", E, 100, PROJ), ("EP8", E, 150, PROJ),
                                 ("EP8", E, 190, PROJ), ("TP8", 384, 1024, TP8), ("TP8", 384, 512, TP8)):
        indexed_case(label, e, tok, projs, MID)
    plan = {"32x4": V((64, 32, 4, 4), tail=False), "32x2g": V((64, 32, 4, 2), tail=False),
            "w32x2g": V((128, 32, 4, 2), 128, tail=True), "w32x2g-nt": V((128, 32, 4, 2), 128, tail=False)}
    for tok in (16, 24):
        masked_case("masked", E, tok, plan)

if "wide64" in which:
    BLOCKS = {"w16x2g": V((128, 16, 4, 2)), "w32x2g": V((128, 32, 4, 2), 128)}
    WIDE = {"ws256x64": V((256, 64, 16, 3), ws=True), "w64x2g": V((128, 64, 4, 2), 168, tail=False),
            "w64x2g-t": V((128, 64, 4, 2), 168, tail=True)}
    plans = [(t, BLOCKS) for t in (32, 50, 64)] + [(t, WIDE) for t in (256, 320, 384, 512)]
    if os.environ.get("WIDE64_TOKENS"):  # a subset, comma-separated token counts
        plans = [(t, p) for t, p in plans if str(t) in os.environ["WIDE64_TOKENS"].split(",")]
    for tok, plan in plans:
        indexed_case("EP8", E, tok, PROJ, plan)
    plan = {"ws256x64": V((256, 64, 16, 3), ws=True), "w64x2g": V((128, 64, 4, 2), 168, tail=True)}
    for e, tok in ((E, 32), (E, 40), (24, 32), (12, 32)) if not os.environ.get("WIDE64_TOKENS") else ():
        masked_case(f"masked E{e}", e, tok, plan)

if "big" in which:
    plan = {"rs256x128": V((256, 128, 16, 2)), "w64x2g-t": V((128, 64, 4, 2))}
    for label, e, tok, projs in (("EP8", E, 512, PROJ), ("EP8", E, 768, PROJ), ("EP8", E, 1024, PROJ),
                                 ("TP8", 384, 8192, TP8)):
        indexed_case(label, e, tok, projs, plan)

if "edges" in which:
    VARIANTS = {"w32x2g": V((128, 32, 4, 2)), "w64x2g-t": V((128, 64, 4, 2)), "rs256x128": V((256, 128, 16, 2))}
    lo = [int(t) for t in os.environ.get("EDGES_32_64", "160,192,224").split(",")]
    hi = [int(t) for t in os.environ.get("EDGES_64_128", "320,384,448,512").split(",")]
    for tok, names in ([(t, ("w32x2g", "w64x2g-t")) for t in lo] + [(t, ("w64x2g-t", "rs256x128")) for t in hi]):
        indexed_case("EP8", E, tok, PROJ, {v: VARIANTS[v] for v in names})

if "thin" in which:
    PLANS = {8: {"16x3": V((64, 16, 4, 3)), "16x2g": V((64, 16, 4, 2)), "w16x2g": V((128, 16, 4, 2))},
             16: {"32x4": V((64, 32, 4, 4)), "32x2g": V((64, 32, 4, 2)), "w32x2g": V((128, 32, 4, 2))}}
    for e in (24, 12):
        for tok, plan in PLANS.items():
            masked_case(f"masked E{e}", e, tok, plan)

if "w256" in which:
    for tok, plan in ((8, {"8x2g": V((64, 8, 4, 2)), "w8x2g": V((128, 8, 4, 2)), "w256x8": V((256, 8, 4, 2), 168)}),
                      (50, {"w16x2g": V((128, 16, 4, 2)), "w256x16": V((256, 16, 4, 2), 200)}),
                      (100, {"w32x2g": V((128, 32, 4, 2)), "w256x32": V((256, 32, 4, 2), 232)}),
                      (150, {"w32x2g": V((128, 32, 4, 2)), "w256x32": V((256, 32, 4, 2), 232)})):
        indexed_case("EP8", E, tok, PROJ, plan)
    plan = {"w32x2g": V((128, 32, 4, 2)), "w256x32": V((256, 32, 4, 2), 232)}
    indexed_case("TP8", 384, 1024, TP8, plan)
    masked_case("masked", E, 16, {"w32x2g": V((128, 32, 4, 2)), "w256x32": V((256, 32, 4, 2), 232, tail=False)})

if "two" in which:
    W32 = {"w32x2g": V((128, 32, 4, 2)), "2w256x32": V((256, 32, 8, 2), 128)}
    for tok in (100, 150):
        indexed_case("EP8", E, tok, PROJ, W32)
    indexed_case("TP8", 384, 1024, TP8, W32)
    indexed_case("EP8", E, 256, PROJ, {"w64x2g-t": V((128, 64, 4, 2)), "2w256x64": V((256, 64, 8, 2), 168)})
    masked_case("masked", E, 16, {"w32x2g": V((128, 32, 4, 2)), "2w256x32": V((256, 32, 8, 2), 128, tail=False)})
    masked_case("masked", E, 32, {"w64x2g-t": V((128, 64, 4, 2)), "2w256x64-t": V((256, 64, 8, 2), 168, tail=True)})
