"""The decode tile 64x16 warp-specialized (`_ws_groups_partition` on one warpgroup: a producer
partition issues the loads, the consumers dequantize one K group at a time under a register cap,
`w4a16_sm90.WS_MAXNREG`) against the register-A kernel the heuristics run there
(`_rs_steps_mainloop`: a whole step's fragments held twice, a CTA barrier a step) -- a probe,
not a benchmark.

    python scripts/probes/ws_decode.py [indexed] [masked] [caps]

One process, identical inputs, interleaved CUDA-graph replays (`measure_interleaved`), L2
flushed; outputs compared bit for bit (valid rows for masked). Kimi EP8 shapes (48 experts,
gate_up N 4096 K 7168 top-8, down N 7168 K 2048): indexed 1-50 tokens on 16-row routing blocks;
masked 8 tok/expert (counts 0.7-1.3x, max_m 256; the register-A kernel on its row-slot grid).
``caps``: the 3-stage tile at 64 / 72 / 80 registers (4 / 3 / 3 CTAs an SM).
"""
import contextlib
import sys

import torch

from lowbit import routing
from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped
from lowbit.kernels import w4a16_sm90 as sm90

gen = torch.Generator(device="cuda").manual_seed(19)
H, I, E = 7168, 2048, 48
PROJ = (("gate_up", 2 * I, H, 8), ("down", H, I, 1))
RS, WS3, WS4 = (64, 16, 4, 3), (64, 16, 4, 3), (64, 16, 4, 4)
W3, W4 = (256, 16, 16, 3), (256, 16, 16, 4)  # four warpgroups, one CTA an SM
which = sys.argv[1:] or ["indexed", "masked"]


@contextlib.contextmanager
def cap(tile, regs):
    saved = dict(sm90.WS_MAXNREG)
    sm90.WS_MAXNREG[tile] = regs
    try:
        yield
    finally:
        sm90.WS_MAXNREG.clear()
        sm90.WS_MAXNREG.update(saved)


def report(label, outs, t, byts, valid=None):
    names = list(outs)
    ref = outs[names[0]] if valid is None else outs[names[0]][valid]
    cells = []
    for v in names:
        o = outs[v] if valid is None else outs[v][valid]
        same = "=" if torch.equal(o, ref) else f"rel {((o.float() - ref.float()).norm() / ref.float().norm()).item():.0e}"
        cells.append(f"{v} {t[v].median_us:7.1f} ({byts / t[v].median_us / 1e6:4.2f} TB/s, {same})")
    base = t[names[0]].median_us
    print(f"{label:24} " + "  ".join(cells) + "  x " + " ".join(f"{base / t[v].median_us:.3f}" for v in names[1:]),
          flush=True)


def weight_bytes(n, kk, experts):
    return experts * n * kk * (0.5 + 2 / 32)


if "indexed" in which or "caps" in which:
    toks = (1, 4, 8, 16, 32, 50) if "indexed" in which else (1, 8, 32)
    for t_tok in toks:
        ids = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:8] for _ in range(t_tok)]).to(torch.int32)
        r = routing.moe_align_block_size(ids, 16, E)
        hit = int(torch.unique(ids).numel())
        for proj, n, kk, top_k in PROJ:
            w = pack_w4a16(make_weight(E, n, kk, "cuda"))
            a = torch.randn(t_tok if top_k == 8 else t_tok * 8, kk, device="cuda").to(torch.bfloat16)

            def launch(o, tile, ws, regs=None):
                with cap(tile, regs) if regs else contextlib.nullcontext():
                    sm90.w4a16_indexed_sm90_launch(a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded,
                                                   top_k, None, o, tile, True, ws)
            if "indexed" in which:
                plan = {"rs3": (RS, False, None), "ws256_3": (W3, True, None), "ws256_4": (W4, True, None),
                        "rs256_3": (W3, False, None)}
            else:
                plan = {"rs3": (RS, False, None), "ws3_64": (WS3, True, 64), "ws3_72": (WS3, True, 72),
                        "ws3_80": (WS3, True, 80)}
            outs = {v: torch.full((t_tok * 8, n), float("nan"), dtype=torch.bfloat16, device="cuda") for v in plan}
            fns = {v: (lambda o=outs[v], p=p: launch(o, *p)) for v, p in plan.items()}
            report(f"indexed t{t_tok} {proj}", outs, measure_interleaved(fns), weight_bytes(n, kk, hit))

if "masked" in which:
    for tok in (8,):
        counts = (tok * (0.7 + 0.6 * torch.rand(E, generator=gen, device="cuda"))).round().to(torch.int32)
        valid = (torch.arange(256, device="cuda")[None, :] < counts[:, None]).reshape(-1)
        for proj, n, kk, _ in PROJ:
            w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="masked")
            a = torch.randn(E * 256, kk, device="cuda").to(torch.bfloat16)
            outs = {v: torch.zeros(E * 256, n, dtype=torch.bfloat16, device="cuda") for v in ("rs3", "ws256_3", "ws256_4")}
            fns = {"rs3": lambda o=outs["rs3"]: sm90.w4a16_grouped_sm90_launch(
                       a, w, counts, o, RS, 256, regs_a=True, row_slots=sm90.masked_row_slots(1.3 * tok, 256, 16)),
                   "ws256_3": lambda o=outs["ws256_3"]: sm90.w4a16_grouped_sm90_launch(
                       a, w, counts, o, W3, 256, regs_a=True, warp_specialize=True),
                   "ws256_4": lambda o=outs["ws256_4"]: sm90.w4a16_grouped_sm90_launch(
                       a, w, counts, o, W4, 256, regs_a=True, warp_specialize=True)}
            report(f"masked {tok} {proj}", outs, measure_interleaved(fns), weight_bytes(n, kk, E), valid)
