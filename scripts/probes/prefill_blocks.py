"""The indexed prefill routing blocks by tokens per expert: 128 rows (the four-warpgroup 256x128
with its 64-row half tail) against 64 rows (the one-warpgroup 128x64 by halves with its 32-row
tail, three CTAs an SM) -- a probe, not a benchmark. It set
`w4a16_indexed._PREFILL_64_RANGE`.

    PREFILL_BLOCKS=128,64 python scripts/probes/prefill_blocks.py [ep8] [tp8] [tp8mid] [tp8small] [tp8down]

Kimi shapes through `w4a16_indexed` with each block's heuristics' tile (`block_m` pinned): the
bench's own ``ep8_indexed_t1024`` / ``tp8_indexed_t8192`` draws first, then random top-8 draws
(`variants.indexed_draws`). One process, interleaved CUDA-graph replays behind an L2 flush;
outputs compared bit for bit against the 128-row block's ("!" marks a difference)."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants as v

from lowbit import routing
from lowbit.bench.timing import measure_interleaved
from lowbit.kernels.w4a16.indexed import w4a16_indexed, w4a16_indexed_config

BLOCKS = tuple(int(b) for b in os.environ.get("PREFILL_BLOCKS", "128,64").split(","))  # the first: the reference


def compare(draws) -> None:
    for label, a, w, ids in draws:
        top_k = ids.shape[1] if a.shape[0] == ids.shape[0] else 1
        fns, outs, tiles = {}, {}, {}
        for b in BLOCKS:
            cfg = w4a16_indexed_config(ids.numel(), w.num_experts, w.n, w.k, block_m=b, gluon=True)
            r = routing.moe_align_block_size(ids, b, w.num_experts)
            outs[b] = torch.full((a.shape[0] * top_k, w.n), float("nan"), dtype=torch.bfloat16, device="cuda")
            tiles[b] = f"{cfg.block_n}x{b}"
            fns[b] = (lambda a=a, w=w, r=r, cfg=cfg, o=outs[b]: w4a16_indexed(
                a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, out=o, config=cfg))
        t = measure_interleaved(fns, rounds=40)
        torch.cuda.synchronize()
        ref = BLOCKS[0]
        cells = "  ".join(f"{tiles[b]} {t[b].median_us:7.1f} x{t[ref].median_us / t[b].median_us:.3f}"
                          f"{'' if torch.equal(outs[ref], outs[b]) else ' !'}" for b in BLOCKS)
        print(f"{label:32} tok_e {ids.numel() / w.num_experts:6.1f}  {cells}", flush=True)


def ep8() -> None:
    compare(v.indexed_draws("ep8_indexed_t1024", (640, 768, 896, 1152, 1280, 1536, 2048), 48,
                            {"gate_up": (4096, 7168), "down": (7168, 2048)}, seed=13))


def tp8() -> None:
    compare(v.indexed_draws("tp8_indexed_t8192", (6144, 9216, 10240, 12288), 384, {"gate_up": (512, 7168)}, seed=13))


def tp8mid() -> None:
    """TP8 gate_up between the decode and prefill blocks (tok_e 32-107)."""
    compare(v.indexed_draws("tp8_indexed_t1024", (1536, 2048, 3072, 4096, 5120), 384, {"gate_up": (512, 7168)},
                            seed=13)[1:])


def tp8small() -> None:
    """TP8 at 768-1280 tokens (tok_e 16-27: the 32-row block), gate_up and down."""
    compare(v.indexed_draws("tp8_indexed_t1024", (768, 1280), 384, {"gate_up": (512, 7168), "down": (7168, 256)},
                            seed=13))


def tp8down() -> None:
    """TP8 down (K = 256: the N-loop kernel's blocks); ``TP8DOWN_TOKENS`` picks the token counts."""
    tokens = tuple(int(t) for t in os.environ.get("TP8DOWN_TOKENS", "1536,2048,2560,3072,3584,4096,6144,12288").split(","))
    compare(v.indexed_draws("tp8_indexed_t8192", tokens, 384, {"down": (7168, 256)}, seed=13))


if __name__ == "__main__":
    for part in sys.argv[1:] or ("ep8", "tp8"):
        {"ep8": ep8, "tp8": tp8, "tp8mid": tp8mid, "tp8small": tp8small, "tp8down": tp8down}[part]()
