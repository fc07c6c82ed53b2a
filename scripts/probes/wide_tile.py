"""256 weight rows a CTA against 128 on the W4A16 prefill kernels (a probe, not a benchmark).

    python scripts/probes/wide_tile.py [contiguous] [masked] [indexed] [fewer] [rows]
    python scripts/probes/wide_tile.py ab OLD_FILE    # another w4a16_sm90.py against this one

Same module, identical inputs, Kimi EP8 shapes (48 experts, H 7168, I 2048), CUDA graph, L2
flushed; outputs compared bit for bit (the two tiles do the same arithmetic in the same order).
The 128-row tiles are the production warp-specialized ones (`_ws_mainloop`); the 256-row
tiles are `_rs_groups_mainloop` (four warpgroups, one group's fragments at a time).

Why: a 128-weight-row tile re-reads each activation block once per 128 weight rows (64 KB of
activations beside 18 KB of weights a K step at 128 rows); at 256 the activation bytes a FLOP
halve. The seventh session's bounds: the 128x128 tile loses 24% to its activation loads.
"""
import os
import sys

import torch

from lowbit import routing
from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure
from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped
from variants import KERNEL as k

E, H, I = 48, 7168, 2048
PROJ = (("gate_up", 2 * I, H), ("down", H, I))


def _us(fn) -> float:
    return measure(fn, cuda_graph=True, rep_ms=30).median_us


def _report(label: str, flops: float, runs: dict) -> None:
    (na, (ta, oa)), (nb, (tb, ob)) = runs.items()
    same = torch.equal(oa, ob)
    print(f"{label:<36} {na} {ta:8.1f} us ({flops / ta / 1e6:5.0f} TFLOP/s)  {nb} {tb:8.1f} us "
          f"({flops / tb / 1e6:5.0f} TFLOP/s)  {ta / tb:5.2f}x  {'equal' if same else 'DIFFERENT'}", flush=True)


def contiguous(experts: int = E, rows_list=(128, 256, 512)) -> None:
    for rows in rows_list:
        for proj, n, kk in PROJ:
            w = pack_w4a16_grouped(make_weight(experts, n, kk, "cuda"), mode="contiguous")
            a = torch.randn(experts * rows, kk, device="cuda").to(torch.bfloat16)
            route = torch.arange(experts, device="cuda", dtype=torch.int32).repeat_interleave(rows)
            runs = {}
            for name, tile, ws in (("128x128ws", (128, 128, 8, 2), True), ("256x128", (256, 128, 16, 2), False)):
                out = torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")
                fn = lambda o=out, t=tile, ws=ws: k.w4a16_grouped_sm90_launch(a, w, route, o, t, 0, regs_a=True,  # noqa: E731
                                                                                warp_specialize=ws)
                fn()
                runs[name] = (_us(fn), out.clone())
            _report(f"contiguous E{experts} {rows} rows/expert {proj}", 2 * experts * rows * n * kk, runs)


def masked(experts: int = E, toks=(32, 64)) -> None:
    gen = torch.Generator(device="cuda").manual_seed(3)
    for tok in toks:
        max_m = 256
        counts = (tok * (0.7 + 0.6 * torch.rand(experts, generator=gen, device="cuda"))).round().to(torch.int32)
        for proj, n, kk in PROJ:
            w = pack_w4a16_grouped(make_weight(experts, n, kk, "cuda"), mode="masked")
            a = torch.randn(experts * max_m, kk, device="cuda").to(torch.bfloat16)
            runs = {}
            for name, tile, ws in (("128x64ws", (128, 64, 8, 3), True), ("256x64", (256, 64, 16, 3), False)):
                out = torch.zeros(a.shape[0], n, dtype=torch.bfloat16, device="cuda")
                fn = lambda o=out, t=tile, ws=ws: k.w4a16_grouped_sm90_launch(a, w, counts, o, t, max_m, regs_a=True,  # noqa: E731
                                                                                warp_specialize=ws)
                fn()
                runs[name] = (_us(fn), out.clone())
            _report(f"masked E{experts} {tok} tok/expert {proj}", 2 * int(counts.sum()) * n * kk, runs)


def indexed(experts: int = E, cases=((256, 64), (1024, 128)), proj=PROJ) -> None:
    gen = torch.Generator(device="cuda").manual_seed(4)
    for t, block in cases:
        ids = torch.stack([torch.randperm(experts, generator=gen, device="cuda")[:8] for _ in range(t)]).to(torch.int32)
        r = routing.moe_align_block_size(ids, block, experts)
        for (proj_name, n, kk), top_k in zip(proj, (8, 1)):
            w = pack_w4a16(make_weight(experts, n, kk, "cuda"))
            a = torch.randn(t if top_k == 8 else t * 8, kk, generator=gen, device="cuda").to(torch.bfloat16)
            runs = {}
            for name, tile, ws in ((f"128x{block}ws", (128, block, 8, 2 if block == 128 else 3), True),
                                   (f"256x{block}", (256, block, 16, 2 if block == 128 else 3), False)):
                out = torch.full((t * 8, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                fn = lambda o=out, tl=tile, ws=ws: k.w4a16_indexed_sm90_launch(  # noqa: E731
                    a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, None, o, tl, True, ws)
                fn()
                runs[name] = (_us(fn), out.clone())
            _report(f"indexed E{experts} {t} tokens {proj_name}", 2 * t * 8 * n * kk, runs)


def fewer_experts() -> None:
    """EP16 / EP32 (24 and 12 local experts: half and a quarter of the grid), and TP8 gate_up
    (384 experts of N = 512: two 256-row weight tiles an expert)."""
    for experts in (24, 12):
        contiguous(experts, (128,))
        masked(experts, (32,))
    indexed(384, ((8192, 128),), (("gate_up", 512, H),))


def _masked_pair(experts: int, tok: int, tiles, gen) -> None:
    """Masked, counts tok x 0.7-1.3, max_m 256: two register-A tiles (weight rows, rows, warps,
    stages), no warp specialization; outputs compared on the valid rows only (a tile of fewer
    rows leaves other rows unwritten)."""
    max_m = 256
    counts = (tok * (0.7 + 0.6 * torch.rand(experts, generator=gen, device="cuda"))).round().to(torch.int32)
    valid = (torch.arange(max_m, device="cuda")[None, :] < counts[:, None]).reshape(-1)
    for proj, n, kk in PROJ:
        w = pack_w4a16_grouped(make_weight(experts, n, kk, "cuda"), mode="masked")
        a = torch.randn(experts * max_m, kk, device="cuda").to(torch.bfloat16)
        runs = {}
        for tile in tiles:
            out = torch.zeros(a.shape[0], n, dtype=torch.bfloat16, device="cuda")
            fn = lambda o=out, t=tile: k.w4a16_grouped_sm90_launch(a, w, counts, o, t, max_m, regs_a=True)  # noqa: E731
            fn()
            runs[f"{tile[0]}x{tile[1]}s{tile[3]}"] = (_us(fn), out[valid].clone())
        _report(f"masked E{experts} {tok} tok/expert {proj}", 2 * int(counts.sum()) * n * kk, runs)


def _indexed_blocks(experts: int, t: int, proj, tiles, gen) -> None:
    """Indexed, random top-8 routing of t tokens: register-A tiles of different routing blocks
    (the routing is built per block size); outputs compared bit for bit."""
    ids = torch.stack([torch.randperm(experts, generator=gen, device="cuda")[:8] for _ in range(t)]).to(torch.int32)
    for (proj_name, n, kk), top_k in proj:
        w = pack_w4a16(make_weight(experts, n, kk, "cuda"))
        a = torch.randn(t if top_k == 8 else t * 8, kk, generator=gen, device="cuda").to(torch.bfloat16)
        runs = {}
        for tile in tiles:
            r = routing.moe_align_block_size(ids, tile[1], experts)
            out = torch.full((t * 8, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            fn = lambda o=out, tl=tile, r=r: k.w4a16_indexed_sm90_launch(  # noqa: E731
                a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, None, o, tl, True, False)
            fn()
            runs[f"{tile[0]}x{tile[1]}s{tile[3]}"] = (_us(fn), out.clone())
        _report(f"indexed E{experts} {t} tokens {proj_name}", 2 * t * 8 * n * kk, runs)


def split() -> None:
    """Masked tiles of 48 / 80 / 96 rows (two accumulators)
    against the 64-row four-warpgroup tile, valid rows compared bit for bit."""
    gen = torch.Generator(device="cuda").manual_seed(7)
    max_m = 256
    for tok, tiles in ((32, ((256, 64, 16, 3), (256, 48, 16, 3))), (64, ((256, 64, 16, 3), (256, 80, 16, 2))),
                       (64, ((256, 64, 16, 3), (256, 96, 16, 2)))):
        counts = (tok * (0.7 + 0.6 * torch.rand(E, generator=gen, device="cuda"))).round().to(torch.int32)
        valid = (torch.arange(max_m, device="cuda")[None, :] < counts[:, None]).reshape(-1)
        for proj, n, kk in PROJ:
            w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="masked")
            a = torch.randn(E * max_m, kk, device="cuda").to(torch.bfloat16)
            runs = {}
            for tile in tiles:
                out = torch.zeros(a.shape[0], n, dtype=torch.bfloat16, device="cuda")
                if tile[1] & (tile[1] - 1):
                    fn = lambda o=out, t=tile: k.w4a16_grouped_split_launch(a, w, counts, o, t, max_m)  # noqa: E731
                else:
                    fn = lambda o=out, t=tile: k.w4a16_grouped_sm90_launch(a, w, counts, o, t, max_m, regs_a=True)  # noqa: E731
                fn()
                runs[f"{tile[0]}x{tile[1]}"] = (_us(fn), out[valid].clone())
            _report(f"masked {tok} tok/expert {proj}", 2 * int(counts.sum()) * n * kk, runs)


def rows() -> None:
    """The activation rows of a tile: fewer padded rows against more weight re-reads."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    _masked_pair(E, 8, ((64, 16, 4, 3), (256, 16, 16, 4)), gen)
    _masked_pair(E, 16, ((64, 32, 4, 4), (256, 32, 16, 4)), gen)
    _masked_pair(E, 32, ((256, 64, 16, 3), (256, 32, 16, 4)), gen)
    both = tuple(zip(PROJ, (8, 1)))
    _indexed_blocks(E, 20, both, ((64, 16, 4, 3), (256, 16, 16, 4)), gen)
    _indexed_blocks(E, 1024, both, ((256, 128, 16, 2), (256, 64, 16, 3)), gen)
    _indexed_blocks(384, 8192, ((("gate_up", 512, H), 8),), ((256, 128, 16, 2), (256, 64, 16, 3)), gen)


def ab(old_file: str) -> None:
    """Another version of `w4a16_sm90` (OLD_FILE, saved in the tree) against this one on the
    256-row tiles' cases, same inputs, outputs compared bit for bit."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import variants as v

    with open(old_file) as f:
        mods = {"old": v.variant("wide_old", [], base=f.read()), "new": v.variant("wide_new", [])}
    gen = torch.Generator(device="cuda").manual_seed(6)
    cases = [("masked", 32, (256, 64, 16, 3)), ("masked", 64, (256, 64, 16, 3)), ("contiguous", 128, (256, 128, 16, 2))]
    for mode, rows, tile in cases:
        max_m = 256 if mode == "masked" else 0
        counts = (rows * (0.7 + 0.6 * torch.rand(E, generator=gen, device="cuda"))).round().to(torch.int32)
        for proj, n, kk in PROJ:
            w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode=mode)
            if mode == "masked":
                a = torch.randn(E * max_m, kk, device="cuda").to(torch.bfloat16)
                route, useful = counts, int(counts.sum())
            else:
                a = torch.randn(E * rows, kk, device="cuda").to(torch.bfloat16)
                route, useful = torch.arange(E, device="cuda", dtype=torch.int32).repeat_interleave(rows), E * rows
            runs = {}
            for name, mod in mods.items():
                out = torch.zeros(a.shape[0], n, dtype=torch.bfloat16, device="cuda")
                fn = lambda o=out, m=mod: m.w4a16_grouped_sm90_launch(a, w, route, o, tile, max_m, regs_a=True)  # noqa: E731
                fn()
                runs[name] = (_us(fn), out.clone())
            _report(f"{mode} {rows} {proj} {tile[0]}x{tile[1]}", 2 * useful * n * kk, runs)
    ids = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:8] for _ in range(256)]).to(torch.int32)
    r = routing.moe_align_block_size(ids, 64, E)
    for (proj, n, kk), top_k in zip(PROJ, (8, 1)):
        w = pack_w4a16(make_weight(E, n, kk, "cuda"))
        a = torch.randn(256 if top_k == 8 else 2048, kk, generator=gen, device="cuda").to(torch.bfloat16)
        runs = {}
        for name, mod in mods.items():
            out = torch.full((2048, n), float("nan"), dtype=torch.bfloat16, device="cuda")
            fn = lambda o=out, m=mod: m.w4a16_indexed_sm90_launch(  # noqa: E731
                a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, None, o, (256, 64, 16, 3), True)
            fn()
            runs[name] = (_us(fn), out.clone())
        _report(f"indexed 256 tokens {proj} 256x64", 2 * 2048 * n * kk, runs)


if __name__ == "__main__":
    if sys.argv[1:2] == ["ab"]:
        ab(sys.argv[2])
    else:
        for what in sys.argv[1:] or ["contiguous", "masked", "indexed"]:
            {"contiguous": contiguous, "masked": masked, "indexed": indexed, "fewer": fewer_experts, "rows": rows,
             "split": split}[what]()
