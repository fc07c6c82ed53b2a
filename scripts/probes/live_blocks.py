"""The indexed grid's row blocks at decode (a probe, not a benchmark).

    python scripts/probes/live_blocks.py [trim] [ab]

trim  the heuristics' kernel on a decode routing (per-token random experts, 1-50 tokens) as
      built (over-allocated) and trimmed on the host to its live blocks: what programs past the
      live blocks cost (twenty-fourth session, before `routing.live_block_bound`: 1.04x / 1.11x
      at one token gate_up / down; after it 1.00x).
ab    the bench's own draws (``ep8_indexed_t1`` .. ``t50``) with the launcher's bound against a
      program a block of the buffer (the bound swapped in the module namespace), interleaved.

Kimi EP8 (48 experts, H 7168, I 2048, top-8), CUDA graph, L2 flushed by a read; outputs
compared bit for bit."""
import sys

import torch

from lowbit import routing
from lowbit.bench.cases import build_problem, make_weight, select_cases
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16
from variants import patch_all
from lowbit.kernels.w4a16.indexed import w4a16_indexed, w4a16_indexed_config

E, H, I = 48, 7168, 2048


def _time(a, w, routings: dict, top_k: int, cfg, bounds: dict | None = None) -> tuple[dict, bool]:
    """Median us of each named routing ``(sorted_ids, expert_ids, ntpp)``, and whether the outputs agree."""
    outs = {k: torch.full((a.shape[0] * top_k, w.n), float("nan"), dtype=torch.bfloat16, device="cuda")
            for k in routings}
    def run(name):
        def f():
            if bounds:
                with patch_all("live_block_bound", bounds[name]):
                    w4a16_indexed(a, w, *routings[name], top_k, out=outs[name], config=cfg)
            else:
                w4a16_indexed(a, w, *routings[name], top_k, out=outs[name], config=cfg)
        return f

    res = measure_interleaved({k: run(k) for k in routings}, rounds=80)
    first = next(iter(outs.values()))
    return {k: v.median_us for k, v in res.items()}, all(torch.equal(first, o) for o in outs.values())


def trim() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = {"gate_up": pack_w4a16(make_weight(E, 2 * I, H, "cuda")), "down": pack_w4a16(make_weight(E, H, I, "cuda"))}
    print("tokens proj      blocks (allocated -> live)   full us  trimmed us  full/trimmed")
    for t in (1, 2, 4, 8, 20, 50):
        ids = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:8] for _ in range(t)]).to(torch.int32)
        for proj, top_k in (("gate_up", 8), ("down", 1)):
            w = ws[proj]
            cfg = w4a16_indexed_config(t * 8, E, w.n, w.k, gluon=True)
            r = routing.moe_align_block_size(ids, cfg.block_m, E)
            live = int(r.num_tokens_post_padded.item()) // cfg.block_m
            a = torch.randn(t if top_k == 8 else t * 8, w.k, generator=gen, device="cuda").to(torch.bfloat16)
            m, same = _time(a, w, {"full": (r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded),
                                   "trim": (r.sorted_token_ids[:live * cfg.block_m].clone(),
                                            r.expert_ids[:live].clone(), r.num_tokens_post_padded)}, top_k, cfg)
            print(f"{t:<6} {proj:<9} {r.expert_ids.numel():>4} -> {live:<4} {m['full']:22.1f} {m['trim']:11.1f} "
                  f"{m['full'] / m['trim']:13.3f}  {'equal' if same else 'DIFFERENT'}", flush=True)


def ab() -> None:
    print("case             proj     blocks (allocated -> live; grid)  a program a block  bound  old/new")
    for name in ("ep8_indexed_t1", "ep8_indexed_t4", "ep8_indexed_t8", "ep8_indexed_t20", "ep8_indexed_t50"):
        case = select_cases([name])[0]
        for proj in ("gate_up", "down"):
            p = build_problem(case, proj, "cuda")
            w = pack_w4a16(p.weight)
            ids = p.topk_ids.to(torch.int32)
            cfg = w4a16_indexed_config(ids.numel(), w.num_experts, w.n, w.k, gluon=True)
            r = routing.moe_align_block_size(ids, cfg.block_m, w.num_experts)
            rt = (r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded)
            m, same = _time(p.a, w, {"old": rt, "new": rt}, ids.shape[1], cfg,
                            bounds={"old": lambda blocks, routes: blocks, "new": routing.live_block_bound})
            live = int(r.num_tokens_post_padded.item()) // cfg.block_m
            grid = routing.live_block_bound(r.expert_ids.numel(), ids.numel())
            print(f"{name:16} {proj:8} {r.expert_ids.numel():>4} -> {live:<3}; {grid:<18} {m['old']:12.1f} "
                  f"{m['new']:8.1f} {m['old'] / m['new']:7.3f}  {'equal' if same else 'DIFFERENT'}", flush=True)


if __name__ == "__main__":
    modes = sys.argv[1:] or ["trim", "ab"]
    for mode in modes:
        {"trim": trim, "ab": ab}[mode]()
