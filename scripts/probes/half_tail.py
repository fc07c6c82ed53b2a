"""The half-row tails (`tiles.RegisterATile.half_tail`) against another version of the
`lowbit.kernels.w4a16.hopper` package (a probe, not a benchmark).

    git archive REV src/lowbit/kernels/w4a16/hopper | tar -x -C scratch
    python scripts/probes/half_tail.py scratch/src/lowbit/kernels/w4a16/hopper [indexed] [masked] [split] [choice] [contiguous]

Both versions in one process on identical inputs, interleaved CUDA-graph replays
(`measure_interleaved`), L2 flushed; outputs compared bit for bit (on the valid rows for the
grouped layouts). Kimi EP8 shapes: indexed 1024 tokens (128-row blocks, ~170 routes an expert:
a full block and a half tail each) and TP8 8192 tokens, 256 tokens on 256x64, 70-150 tokens on
64x32 (32-row blocks); masked 16 / 32 tok/expert (counts 0.7-1.3x); contiguous segments of
exactly 128 rows (no tails) and of 0.7-1.3 x 128 / 256 rows padded to 128; `split`: the masked
split tiles at 64 tok/expert (`SPLIT_HI_TAIL_TILES`: a block whose rows end in its first 64 runs
the 64-row tile alone); `choice` (current module only, OLD_FILE unused but required): masked 64
tok/expert on the split 96 tile against 256x128 with a 64-row half tail (written in the
seventeenth session after its device time ran out: not yet run).
"""
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from variants import sources, tile_form, variant

from lowbit import routing
from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped
from variants import KERNEL as new

old = variant("old", [], base=sources(sys.argv[1]))
mods = {"old": old, "new": new}
gen = torch.Generator(device="cuda").manual_seed(17)
H, I, E = 7168, 2048, 48
PROJ = (("gate_up", 2 * I, H, 8), ("down", H, I, 1))
which = sys.argv[2:] or ["indexed", "masked", "split", "contiguous"]


def report(label, outs, t, fl, valid=None):
    o, n = outs["old"], outs["new"]
    if valid is not None:
        o, n = o[valid], n[valid]
    eq = torch.equal(o, n)
    err = ((n.float() - o.float()).norm() / o.float().norm()).item()
    print(f"{label:34} old {t['old'].median_us:8.1f} new {t['new'].median_us:8.1f} "
          f"x{t['old'].median_us / t['new'].median_us:.3f} {'equal' if eq else f'rel {err:.1e}'} "
          f"new {fl / t['new'].median_us / 1e6:.0f} TFLOP/s", flush=True)

if "indexed" in which:
    for t_tok, block, tile, ne, projs in ((1024, 128, (256, 128, 16, 2), E, PROJ),
                                          (8192, 128, (256, 128, 16, 2), 384, (("gate_up", 512, H, 8),)),
                                          (256, 64, (256, 64, 16, 3), E, PROJ), (150, 32, (64, 32, 4, 4), E, PROJ),
                                          (70, 32, (64, 32, 4, 4), E, PROJ)):
        ids = torch.stack([torch.randperm(ne, generator=gen, device="cuda")[:8] for _ in range(t_tok)]).to(torch.int32)
        r = routing.moe_align_block_size(ids, block, ne)
        for proj, n, kk, top_k in projs:
            w = pack_w4a16(make_weight(ne, n, kk, "cuda"))
            a = torch.randn(t_tok if top_k == 8 else t_tok * 8, kk, device="cuda").to(torch.bfloat16)
            outs = {v: torch.full((t_tok * 8, n), float("nan"), dtype=torch.bfloat16, device="cuda") for v in mods}
            fns = {v: (lambda m=m, o=outs[v]: m.w4a16_indexed_sm90_launch(a, w, r.sorted_token_ids, r.expert_ids,
                       r.num_tokens_post_padded, top_k, None, o, tile, True, False)) for v, m in mods.items()}
            report(f"indexed t{t_tok} {proj} {tile[0]}x{tile[1]}", outs, measure_interleaved(fns), 2 * t_tok * 8 * n * kk)
def masked_ab(tok: int, tile, split: bool) -> None:
    """Masked, counts tok x 0.7-1.3, max_m 256: the register-A kernel or (split) a split tile."""
    counts = (tok * (0.7 + 0.6 * torch.rand(E, generator=gen, device="cuda"))).round().to(torch.int32)
    valid = (torch.arange(256, device="cuda")[None, :] < counts[:, None]).reshape(-1)
    for proj, n, kk, _ in PROJ:
        w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="masked")
        a = torch.randn(E * 256, kk, device="cuda").to(torch.bfloat16)
        outs = {v: torch.zeros(E * 256, n, dtype=torch.bfloat16, device="cuda") for v in mods}

        def launch(m, o):
            if split:
                return lambda: m.w4a16_grouped_split_launch(a, w, counts, o, tile, 256)
            return lambda: m.w4a16_grouped_sm90_launch(a, w, counts, o, tile, 256, regs_a=True,
                                                       row_slots=m.masked_row_slots(1.3 * tok, 256, tile[1]))
        fns = {v: launch(m, outs[v]) for v, m in mods.items()}
        report(f"masked {tok}{' split' if split else ''} {proj} {tile[0]}x{tile[1]}", outs, measure_interleaved(fns),
               2 * int(counts.sum()) * n * kk, valid)


if "masked" in which:
    for tok, tile in ((16, (64, 32, 4, 4)), (32, (256, 64, 16, 3))):
        masked_ab(tok, tile, False)
if "split" in which:
    for tok, tile in ((64, (256, 96, 16, 2)), (64, (256, 80, 16, 2))):
        masked_ab(tok, tile, True)
if "choice" in which:
    # masked 64 tok/expert (45-83 rows): the split 96 tile (its 64-row tail on) against the 256x128
    # tile with a 64-row half tail (not in its record: switched on around the launch, which the
    # graph capture records); outputs compared on the valid rows
    counts = (64 * (0.7 + 0.6 * torch.rand(E, generator=gen, device="cuda"))).round().to(torch.int32)
    valid = (torch.arange(256, device="cuda")[None, :] < counts[:, None]).reshape(-1)

    def wide_with_tail(a, w, o):
        with tile_form("masked", (256, 128, 16, 2), half_tail=True):
            new.w4a16_grouped_sm90_launch(a, w, counts, o, (256, 128, 16, 2), 256, regs_a=True,
                                          row_slots=new.masked_row_slots(1.3 * 64, 256, 128))
    for proj, n, kk, _ in PROJ:
        w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="masked")
        a = torch.randn(E * 256, kk, device="cuda").to(torch.bfloat16)
        outs = {v: torch.zeros(E * 256, n, dtype=torch.bfloat16, device="cuda") for v in ("old", "new")}
        fns = {"old": lambda o=outs["old"]: new.w4a16_grouped_split_launch(a, w, counts, o, (256, 96, 16, 2), 256),
               "new": lambda o=outs["new"]: wide_with_tail(a, w, o)}
        report(f"masked 64 {proj} split96 -> 256x128+tail", outs, measure_interleaved(fns),
               2 * int(counts.sum()) * n * kk, valid)
if "contiguous" in which:
    for rows, E, exact in ((128, 48, True), (128, 12, True), (128, 48, False), (256, 48, False)):
        counts = torch.full((E,), rows).int() if exact else (rows * (0.7 + 0.6 * torch.rand(E))).round().int()
        padded = ((counts + 127) // 128) * 128
        m_idx = torch.full((int(padded.sum()),), -1, dtype=torch.int32)
        off = 0
        for e_, (c, p) in enumerate(zip(counts.tolist(), padded.tolist())):
            m_idx[off:off + c] = e_
            off += p
        m_idx = m_idx.cuda()
        valid = m_idx >= 0
        for proj, n, kk, _ in PROJ:
            w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="contiguous")
            a = torch.randn(m_idx.numel(), kk, device="cuda").to(torch.bfloat16)
            outs = {v: torch.zeros(m_idx.numel(), n, dtype=torch.bfloat16, device="cuda") for v in mods}
            fns = {v: (lambda m=m, o=outs[v]: m.w4a16_grouped_sm90_launch(a, w, m_idx, o, (256, 128, 16, 2), 0,
                       regs_a=True)) for v, m in mods.items()}
            report(f"contiguous {rows}{'' if exact else ' jitter'} E{E} {proj} 256x128", outs, measure_interleaved(fns),
                   2 * int(counts.sum()) * n * kk, valid)
