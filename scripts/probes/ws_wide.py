"""The four-warpgroup tile 256x64 warp-specialized (`_ws_groups_partition`: a producer partition
issues the loads, no CTA barrier a step) against its register-A kernel (`_rs_groups_mainloop`:
every warpgroup retires its step, a CTA barrier, then the refill), with and without its tails
(`WS_TAIL_TILES`: blocks of at most 32 / 48 live rows multiply only those) -- a probe,
not a benchmark.

    python scripts/probes/ws_wide.py [indexed] [masked] [split] [contiguous]

One process, identical inputs, interleaved CUDA-graph replays (`measure_interleaved`), L2
flushed; outputs compared bit for bit (valid rows for the grouped layouts). Kimi EP8 shapes:
indexed 256 / 384 tokens (64-row blocks, 43 / 64 routes an expert); masked 32 tok/expert
(counts 0.7-1.3x, max_m 256: the register-A kernel with its half tail and row-slot grid, the
warp-specialized one a program a block); `split`: masked 64 / 50 tok/expert on the split tiles
(96 / 80 rows) against the warp-specialized 96 and 64; contiguous 128 rows an expert (also
against the default 256x128 register-A tile).
"""
import contextlib
import sys

import torch

from lowbit import routing
from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped
from variants import KERNEL as sm90, tile_form

gen = torch.Generator(device="cuda").manual_seed(18)
H, I, E = 7168, 2048, 48
PROJ = (("gate_up", 2 * I, H, 8), ("down", H, I, 1))
TILE = (256, 64, 16, 3)
which = sys.argv[1:] or ["indexed", "masked", "contiguous"]


@contextlib.contextmanager
def no_tails():
    """The warp-specialized kernel without its tails (the table is read at launch, so at capture)."""
    with tile_form("masked", TILE, ws_tails=False), tile_form("indexed", TILE, ws_tails=False):
        yield


def report(label, outs, t, fl, valid=None):
    names = list(outs)
    ref = outs[names[0]] if valid is None else outs[names[0]][valid]
    cells = []
    for v in names:
        o = outs[v] if valid is None else outs[v][valid]
        same = "=" if torch.equal(o, ref) else f"rel {((o.float() - ref.float()).norm() / ref.float().norm()).item():.0e}"
        cells.append(f"{v} {t[v].median_us:7.1f} ({fl / t[v].median_us / 1e6:3.0f} TF, {same})")
    base = t[names[0]].median_us
    print(f"{label:28} " + "  ".join(cells) + "  x " + " ".join(f"{base / t[v].median_us:.3f}" for v in names[1:]),
          flush=True)


if "indexed" in which:
    for t_tok in (256, 384):
        ids = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:8] for _ in range(t_tok)]).to(torch.int32)
        r = routing.moe_align_block_size(ids, 64, E)
        for proj, n, kk, top_k in PROJ:
            w = pack_w4a16(make_weight(E, n, kk, "cuda"))
            a = torch.randn(t_tok if top_k == 8 else t_tok * 8, kk, device="cuda").to(torch.bfloat16)
            outs = {v: torch.full((t_tok * 8, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                    for v in ("rs", "ws", "ws_tail")}

            def launch(o, ws, tails=True):
                with contextlib.nullcontext() if tails else no_tails():
                    sm90.w4a16_indexed_sm90_launch(a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded,
                                                   top_k, None, o, TILE, True, ws)
            fns = {"rs": lambda o=outs["rs"]: launch(o, False), "ws": lambda o=outs["ws"]: launch(o, True, False),
                   "ws_tail": lambda o=outs["ws_tail"]: launch(o, True)}
            report(f"indexed t{t_tok} {proj}", outs, measure_interleaved(fns), 2 * t_tok * 8 * n * kk)

def masked_counts(tok):
    counts = (tok * (0.7 + 0.6 * torch.rand(E, generator=gen, device="cuda"))).round().to(torch.int32)
    return counts, (torch.arange(256, device="cuda")[None, :] < counts[:, None]).reshape(-1)


if "masked" in which:
    for tok in (32,):
        counts, valid = masked_counts(tok)
        for proj, n, kk, _ in PROJ:
            w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="masked")
            a = torch.randn(E * 256, kk, device="cuda").to(torch.bfloat16)
            outs = {v: torch.zeros(E * 256, n, dtype=torch.bfloat16, device="cuda")
                    for v in ("rs", "ws", "ws_tail")}

            def ws_launch(o, tails=True):
                with contextlib.nullcontext() if tails else no_tails():
                    sm90.w4a16_grouped_sm90_launch(a, w, counts, o, TILE, 256, regs_a=True, warp_specialize=True)
            fns = {"rs": lambda o=outs["rs"]: sm90.w4a16_grouped_sm90_launch(
                       a, w, counts, o, TILE, 256, regs_a=True, row_slots=sm90.masked_row_slots(1.3 * tok, 256, 64)),
                   "ws": lambda o=outs["ws"]: ws_launch(o, False),
                   "ws_tail": lambda o=outs["ws_tail"]: ws_launch(o)}
            report(f"masked {tok} {proj}", outs, measure_interleaved(fns), 2 * int(counts.sum()) * n * kk, valid)

if "split" in which:  # the split tiles (80 / 96 rows) against the warp-specialized 96 (`GLUON_SPLIT_WS_TILES`)
    for tok, rs_tile in ((64, (256, 96, 16, 2)), (50, (256, 80, 16, 2))):
        counts, valid = masked_counts(tok)
        for proj, n, kk, _ in PROJ:
            w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="masked")
            a = torch.randn(E * 256, kk, device="cuda").to(torch.bfloat16)
            outs = {v: torch.zeros(E * 256, n, dtype=torch.bfloat16, device="cuda")
                    for v in (f"split{rs_tile[1]}", "split96_ws", "ws64_tail")}
            fns = {f"split{rs_tile[1]}": lambda o=outs[f"split{rs_tile[1]}"]: sm90.w4a16_grouped_split_launch(
                       a, w, counts, o, rs_tile, 256),
                   "split96_ws": lambda o=outs["split96_ws"]: sm90.w4a16_grouped_split_launch(
                       a, w, counts, o, (256, 96, 16, 2), 256, warp_specialize=True),
                   "ws64_tail": lambda o=outs["ws64_tail"]: sm90.w4a16_grouped_sm90_launch(
                       a, w, counts, o, TILE, 256, regs_a=True, warp_specialize=True)}
            report(f"masked {tok} {proj}", outs, measure_interleaved(fns), 2 * int(counts.sum()) * n * kk, valid)

if "contiguous" in which:
    m_idx = torch.arange(E, dtype=torch.int32, device="cuda").repeat_interleave(128)
    for proj, n, kk, _ in PROJ:
        w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="contiguous")
        a = torch.randn(m_idx.numel(), kk, device="cuda").to(torch.bfloat16)
        outs = {v: torch.zeros(m_idx.numel(), n, dtype=torch.bfloat16, device="cuda") for v in ("rs", "ws", "rs128")}
        fns = {"rs": lambda o=outs["rs"]: sm90.w4a16_grouped_sm90_launch(a, w, m_idx, o, TILE, 0, regs_a=True),
               "ws": lambda o=outs["ws"]: sm90.w4a16_grouped_sm90_launch(a, w, m_idx, o, TILE, 0, regs_a=True,
                                                                         warp_specialize=True),
               "rs128": lambda o=outs["rs128"]: sm90.w4a16_grouped_sm90_launch(a, w, m_idx, o, (256, 128, 16, 2), 0,
                                                                              regs_a=True)}
        report(f"contiguous 128 {proj}", outs, measure_interleaved(fns), 2 * m_idx.numel() * n * kk)
