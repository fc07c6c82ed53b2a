"""Time two versions of `lowbit.kernels.w4a16.hopper` side by side (a probe, not a benchmark).

    python scripts/probes/ab.py OLD_DIR [decode] [prefill] [grouped] [blocks]

OLD_DIR holds another version of the package (e.g. ``git archive REV src/lowbit/kernels/w4a16/hopper |
tar -x -C scratch`` gives ``scratch/src/lowbit/kernels/w4a16/hopper``; the device copy has no git
history, so save it in the tree first). Both run the register-A kernels on identical inputs, Kimi EP8 shapes (48 experts,
H 7168, I 2048), CUDA graph, L2 flushed; the outputs must be bit-identical when the
arithmetic is (a main-loop schedule change), and the probe says so. Extra tiles are timed on
the current version only (tiles the old one may lack).
  decode   indexed 16-row block, 1 / 4 / 20 tokens, gate_up and down
  prefill  indexed 64-row block at 256 tokens, 128-row block at 1024
  grouped  contiguous 128 rows/expert, masked 8 and 32 tok/expert (gate_up)
  blocks   decode on the current version only: 16-row against 8-row routing blocks
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants as v

from lowbit import routing
from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure
from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped

E, H, I = 48, 7168, 2048


def _us(fn) -> float:
    return measure(fn, cuda_graph=True, rep_ms=30).median_us


def _row(label: str, nbytes: float, flops: float, times: dict[str, float], same: bool | None) -> None:
    old = times.get("old")
    cells = "  ".join(f"{k} {t:7.1f} us" for k, t in times.items())
    new = times["new"]
    speed = f"{old / new:5.2f}x" if old else "      "
    print(f"{label:<34} {cells}  new/old {speed}  new {nbytes / new / 1e6:5.2f} TB/s {flops / new / 1e6:6.1f} TFLOP/s"
          f"  {'' if same is None else ('equal' if same else 'DIFFERENT')}", flush=True)


def _indexed(mods, extra_tiles, t: int, block: int, tile, gen) -> None:
    for proj, n, k, top_k in (("gate_up", 2 * I, H, 8), ("down", H, I, 1)):
        w = pack_w4a16(make_weight(E, n, k, "cuda"))
        ids = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:8] for _ in range(t)]).to(torch.int32)
        r = routing.moe_align_block_size(ids, block, E)
        hit = int(torch.unique(ids).numel())
        a = torch.randn(t if top_k == 8 else t * 8, k, generator=gen, device="cuda").to(torch.bfloat16)
        outs, times = {}, {}
        for name, mod in mods.items():
            out = torch.full((t * 8, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            fn = lambda: mod.w4a16_indexed_sm90_launch(a, w, r.sorted_token_ids, r.expert_ids,  # noqa: E731
                                                       r.num_tokens_post_padded, top_k, None, out, tile, True)
            fn()
            outs[name] = out.clone()
            times[name] = _us(fn)
        for xt in extra_tiles:
            out = torch.empty(t * 8, n, dtype=torch.bfloat16, device="cuda")
            times[f"{xt[0]}x{xt[1]}s{xt[3]}"] = _us(lambda: mods["new"].w4a16_indexed_sm90_launch(
                a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, None, out, xt, True))
        nbytes = hit * n * (k // 2 + k // 32 * 2) + a.numel() * 2 + t * 8 * n * 2
        same = torch.equal(outs["old"], outs["new"]) if "old" in outs else None
        _row(f"indexed {proj} t={t} {tile[0]}x{tile[1]}s{tile[3]}", nbytes, 2 * t * 8 * n * k, times, same)


def decode(mods) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    for t in (1, 4, 20):
        _indexed(mods, [(64, 16, 4, 4), (64, 16, 4, 6)], t, 16, (64, 16, 4, 3), gen)


def prefill(mods) -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    _indexed(mods, [], 256, 64, (128, 64, 8, 3), gen)
    _indexed(mods, [], 1024, 128, (128, 128, 8, 2), gen)


def small_blocks(mods) -> None:
    """Decode on the current version: the register-A 16-row tile against the 8-row-block
    tiles (wgmma N = 8: half the tensor work of N = 16 when an expert has <= 8 tokens);
    error = relative Frobenius distance to the 16-row output."""
    mod = mods["new"]
    gen = torch.Generator(device="cuda").manual_seed(2)
    for proj, n, k, top_k in (("gate_up", 2 * I, H, 8), ("down", H, I, 1)):
        w = pack_w4a16(make_weight(E, n, k, "cuda"))
        for t in (1, 4, 8, 20):
            ids = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:8] for _ in range(t)]).to(torch.int32)
            hit = int(torch.unique(ids).numel())
            a = torch.randn(t if top_k == 8 else t * 8, k, generator=gen, device="cuda").to(torch.bfloat16)
            cells, ref = [], None
            for tile in ((64, 16, 4, 3), (64, 8, 4, 3), (64, 8, 4, 4), (128, 8, 8, 3)):  # 8-row: ad-hoc tiles
                r = routing.moe_align_block_size(ids, tile[1], E)
                out = torch.full((t * 8, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                fn = lambda: mod.w4a16_indexed_sm90_launch(a, w, r.sorted_token_ids, r.expert_ids,  # noqa: E731
                                                           r.num_tokens_post_padded, top_k, None, out, tile, True)
                fn()
                got = out.float()
                ref = got if ref is None else ref
                err = float((got - ref).norm() / ref.norm())
                cells.append(f"{tile[0]}x{tile[1]}s{tile[3]} {_us(fn):6.1f} ({err:.0e})")
            nbytes = hit * n * (k // 2 + k // 32 * 2)
            print(f"blocks {proj:>7} t={t:<3} {nbytes / 4.5e6:5.1f} us at 4.5 TB/s | " + " | ".join(cells), flush=True)


def grouped(mods) -> None:
    n, k = 2 * I, H
    for mode, rows, tile in (("contiguous", 128, (128, 128, 8, 2)), ("masked", 8, (64, 16, 4, 4)),
                             ("masked", 32, (128, 64, 8, 3))):
        w = pack_w4a16_grouped(make_weight(E, n, k, "cuda"), mode=mode)
        if mode == "contiguous":
            a = torch.randn(E * rows, k, device="cuda").to(torch.bfloat16)
            route, max_m = torch.arange(E, device="cuda", dtype=torch.int32).repeat_interleave(rows), 0
        else:
            max_m = max(rows * 2, 64)
            a = torch.randn(E * max_m, k, device="cuda").to(torch.bfloat16)
            route, rows = torch.full((E,), rows, device="cuda", dtype=torch.int32), rows
        outs, times = {}, {}
        for name, mod in mods.items():
            out = torch.zeros(a.shape[0], n, dtype=torch.bfloat16, device="cuda")
            fn = lambda: mod.w4a16_grouped_sm90_launch(a, w, route, out, tile, max_m, regs_a=True)  # noqa: E731
            fn()
            outs[name] = out.clone()
            times[name] = _us(fn)
        nbytes = E * n * (k // 2 + k // 32 * 2) + E * rows * (k + n) * 2
        _row(f"{mode} {rows} rows/expert {tile[0]}x{tile[1]}s{tile[3]}", nbytes, 2 * E * rows * n * k, times,
             torch.equal(outs["old"], outs["new"]))


if __name__ == "__main__":
    mods = {"old": v.variant("ab_old", [], base=v.sources(sys.argv[1])), "new": v.variant("ab_new", [])}
    for what in sys.argv[2:] or ["decode", "prefill", "grouped"]:
        {"decode": decode, "prefill": prefill, "grouped": grouped, "blocks": small_blocks}[what](mods)
