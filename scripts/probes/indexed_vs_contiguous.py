"""The indexed kernel's 128-row block against the contiguous kernel on the same rows: what the
gather, the scattered rows and the half-tail pass cost apart -- a probe, not a benchmark.

    python scripts/probes/indexed_vs_contiguous.py
    python scripts/probes/indexed_vs_contiguous.py ncu contiguous|in_order   # three gate_up launches, for ncu

Why (twenty-ninth session): the bench's contiguous 128 rows/expert gate_up takes 536 us on
256x128 (one pass over each weight tile an expert), the indexed 1024-token gate_up about 1014 us
on the same tile (two passes an expert: a 128-row block and a 64-row half tail), and the
twenty-second session's `gathered_prefill.py` found the contiguous kernel on the same rows
padded to whole blocks level with the indexed one: either an indexed pass is slower or the
half tail saves nothing. This separates the two on equal rows. Kimi EP8 shapes
(gate_up N 4096 K 7168, down N 7168 K 2048), 6144 rows each way:

- ``contiguous``: 48 experts x 128 rows, `lowbit.contiguous` (TMA activations), its tile;
- ``in_order``: the same rows as routes (top_k 1), the indexed kernel's 128-row block: every
  block full, the gather reads rows in order, the epilogue writes them in order;
- ``scattered``: the same expert counts on permuted rows: scattered gather and epilogue;
- ``tails``: 32 experts x 192 rows: each expert one full block and one half-tail pass.

One process, interleaved CUDA-graph replays behind an L2 flush (`measure_interleaved`); the
in-order indexed output compared bit for bit with the contiguous one."""
import torch

from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped
from lowbit.kernels.w4a16.grouped import contiguous, w4a16_grouped_config
from lowbit.kernels.w4a16.indexed import w4a16_indexed, w4a16_indexed_config
from lowbit.routing import moe_align_block_size

ROWS = 6144


def indexed_call(a, wq, ids, out):
    """`w4a16_indexed` on the 128-row block (top_k 1) for routes `ids` ``[ROWS, 1]``."""
    w = pack_w4a16(wq)
    cfg = w4a16_indexed_config(ids.numel(), w.num_experts, w.n, w.k, block_m=128, gluon=True)
    r = moe_align_block_size(ids, 128, w.num_experts)
    return cfg, (lambda: w4a16_indexed(a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, 1,
                                       out=out, config=cfg))


def main(only: str | None = None) -> None:
    """Time the four ways on both projections; `only`: three launches of that one on gate_up
    (for ``ncu --launch-skip 1 --launch-count 1``)."""
    gen = torch.Generator(device="cuda").manual_seed(29)
    for proj, n, k in (("gate_up", 4096, 7168), ("down", 7168, 2048))[:1 if only else 2]:
        a = torch.randn(ROWS, k, generator=gen, device="cuda").to(torch.bfloat16)
        outs = {name: torch.full((ROWS, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                for name in ("contiguous", "in_order", "scattered", "tails")}
        wq = make_weight(48, n, k, "cuda")
        wc = pack_w4a16_grouped(wq, mode="contiguous")
        m_idx = torch.arange(48, device="cuda", dtype=torch.int32).repeat_interleave(ROWS // 48)
        ccfg = w4a16_grouped_config("contiguous", ROWS, n, k, 48, 0, gluon=True)
        fns = {"contiguous": lambda: contiguous(a, wc, m_idx, out=outs["contiguous"], config=ccfg)}
        icfg, fns["in_order"] = indexed_call(a, wq, m_idx[:, None], outs["in_order"])
        perm = torch.randperm(ROWS, generator=gen, device="cuda")
        _, fns["scattered"] = indexed_call(a, wq, m_idx[perm][:, None], outs["scattered"])
        tail_ids = torch.arange(32, device="cuda", dtype=torch.int32).repeat_interleave(ROWS // 32)
        _, fns["tails"] = indexed_call(a, make_weight(32, n, k, "cuda"), tail_ids[:, None], outs["tails"])
        if only:
            for _ in range(3):
                fns[only]()
            torch.cuda.synchronize()
            return
        t = measure_interleaved(fns, rounds=40)
        torch.cuda.synchronize()
        same = torch.equal(outs["contiguous"], outs["in_order"])
        c = t["contiguous"].median_us
        print(f"{proj:8} contiguous {ccfg.block_n}x{ccfg.block_m} {c:7.1f}  indexed {icfg.block_n}x{icfg.block_m}: "
              + "  ".join(f"{name} {t[name].median_us:7.1f} (x{c / t[name].median_us:.3f})"
                          for name in ("in_order", "scattered", "tails"))
              + ("" if same else "  (in-order output differs from contiguous)"), flush=True)


if __name__ == "__main__":
    import sys
    main(sys.argv[2] if sys.argv[1:2] == ["ncu"] else None)
