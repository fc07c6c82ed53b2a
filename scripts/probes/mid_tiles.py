"""Indexed W4A16 tiles between decode and prefill, through the public API (a probe, not a
benchmark): the sixteenth session's evidence for `w4a16_indexed._GLUON_BLOCKS`' 32-row row and
the one-step-K N-loop preference of `_fit_engine`.

    python scripts/probes/mid_tiles.py

Kimi EP8 (48 experts) gate_up / down at 50-190 tokens: the heuristic's choice, the Triton
tile of its tok_e, the register-A 64x32 and 64x16 tiles; TP8 (384 experts) gate_up at 512 /
1024 tokens (64x32 vs 128x32) and down (K = 256) at 4-1024 tokens (64x16 vs the N-loop tiles).
Interleaved CUDA-graph replays (`measure_interleaved`), L2 flushed; the relative error is
against the first column's output (the same math: expect ~1e-5 or 0).
"""
import torch

from lowbit import routing
from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16
from lowbit.kernels.w4a16.heuristics import W4A16Config
from lowbit.kernels.w4a16.indexed import w4a16_indexed, w4a16_indexed_config

H = 7168


def _case(label: str, e: int, n: int, k: int, top_k: int, tokens: int, cfgs: dict, gen: torch.Generator) -> None:
    w = pack_w4a16(make_weight(e, n, k, "cuda"))
    ids = torch.stack([torch.randperm(e, generator=gen)[:8] for _ in range(tokens)]).to(torch.int32).cuda()
    a = torch.randn(tokens if top_k == 8 else tokens * 8, k, device="cuda").to(torch.bfloat16)
    fns, outs = {}, {}
    for name, cfg in cfgs.items():
        r = routing.moe_align_block_size(ids, cfg.block_m, e)
        out = torch.zeros(tokens * 8, n, dtype=torch.bfloat16, device="cuda")
        fns[name] = (lambda r, out, cfg: lambda: w4a16_indexed(  # noqa: E731
            a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, out=out, config=cfg))(r, out, cfg)
        outs[name] = out
    t = {name: tm.median_us for name, tm in measure_interleaved(fns).items()}
    first = next(iter(fns))
    ref = outs[first].float()
    cells = [f"{name} {t[name]:7.1f} ({t[first] / t[name]:.2f}x, "
             f"{((outs[name].float() - ref).norm() / ref.norm()).item():.0e})" for name in fns]
    print(f"{label:22} " + " | ".join(cells), flush=True)


def _rs(block_m: int, block_n: int, warps: int, stages: int) -> W4A16Config:
    return W4A16Config(block_m, block_n, warps, stages, True, engine="gluon_rs")


def main() -> None:
    gen = torch.Generator().manual_seed(3)
    for tokens in (50, 60, 100, 150, 190):
        for proj, n, k, top_k in (("gate_up", 4096, H, 8), ("down", H, 2048, 1)):
            cur = w4a16_indexed_config(tokens * 8, 48, n, k, gluon=True)
            tri = w4a16_indexed_config(tokens * 8, 48, n, k, gluon=False)
            _case(f"EP8 t={tokens} {proj}", 48, n, k, top_k, tokens,
                  {f"default {cur.engine} {cur.block_n}x{cur.block_m}": cur, f"triton {tri.block_m}-row": tri,
                   "64x32": _rs(32, 64, 4, 4), "64x16": _rs(16, 64, 4, 3)}, gen)
    for tokens in (512, 1024):
        _case(f"TP8 t={tokens} gate_up", 384, 512, H, 8, tokens, {"128x32": _rs(32, 128, 8, 4), "64x32": _rs(32, 64, 4, 4)},
              gen)
    for tokens in (4, 20, 50, 1024):
        _case(f"TP8 t={tokens} down", 384, H, 256, 1, tokens,
              {"64x16": _rs(16, 64, 4, 3), "128x16 N loop": _rs(16, 128, 8, 4), "128x32 N loop": _rs(32, 128, 8, 4)}, gen)


if __name__ == "__main__":
    main()
