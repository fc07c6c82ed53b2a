"""Indexed prefill: the gathering kernel against a gather pass + the TMA-fed contiguous kernel
-- a probe, not a benchmark.

    python scripts/probes/gathered_prefill.py [tokens ...]

The indexed register-A kernel gathers its routed rows by cp.async (`_gather_async`); the grouped
contiguous kernel reads the same 256x128 tile's rows by TMA. This times, on one routing draw
(Kimi EP8 gate_up / down, 48 experts, top-8; TP8 384 experts at 8192 tokens):

- ``indexed<B>``: `lowbit.w4a16_indexed` on the routing block its heuristics choose for gate_up;
- ``indexed``: the same on the 128-row block (256x128, the contiguous kernel's tile);
- ``gather``: the indexed routing's padded row order (128-row blocks) materialized by a torch
  gather (``a[sorted_ids // top_k]``, zero rows for sentinels);
- ``contig``: `lowbit.w4a16_contiguous` over that gathered buffer (``m_indices`` from
  ``expert_ids``, -1 on sentinel rows), as its heuristics choose; no scatter of the output.

One process, identical inputs, interleaved CUDA-graph replays (`measure_interleaved`), L2
flushed. The contiguous rows are compared to the indexed output rows they stand for.
"""
import sys

import torch

import lowbit
from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure_interleaved
from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped

gen = torch.Generator(device="cuda").manual_seed(23)
PROJ = (("gate_up", 4096, 7168), ("down", 7168, 2048))
CASES = [("EP8", 48, int(t), PROJ) for t in (sys.argv[1:] or (256, 384, 1024))] + [
    ("TP8", 384, 8192, (("gate_up", 512, 7168), ("down", 7168, 256)))]

for label, e, tok, projs in CASES:
    ids = torch.stack([torch.randperm(e, generator=gen, device="cuda")[:8] for _ in range(tok)]).to(torch.int32)
    r = lowbit.moe_align_block_size(ids, 128, e)
    bm = lowbit.w4a16_indexed_config(tok * 8, e, 4096, 7168, gluon=True).block_m  # the heuristics' block
    rb = lowbit.moe_align_block_size(ids, bm, e)
    ntpp = int(r.num_tokens_post_padded.item())
    sid = r.sorted_token_ids[:ntpp]
    blk_e = r.expert_ids[: ntpp // 128]
    for i, (proj, n, kk) in enumerate(projs):
        top_k = 8 if i == 0 else 1
        rows_in = tok if top_k == 8 else tok * 8
        q = make_weight(e, n, kk, "cuda")
        wi, wc = pack_w4a16(q), pack_w4a16_grouped(q, mode="contiguous")
        a = torch.randn(rows_in, kk, device="cuda").to(torch.bfloat16)
        a0 = torch.cat([a, torch.zeros(1, kk, device="cuda", dtype=a.dtype)])  # row rows_in = zeros
        valid = sid < tok * 8
        src = torch.where(valid, sid // top_k, rows_in).long()
        m_idx = torch.where(valid, blk_e.repeat_interleave(128), -1).to(torch.int32)
        gathered = a0[src]
        out_i = torch.empty(tok * 8, n, device="cuda", dtype=torch.bfloat16)
        out_c = torch.empty(ntpp, n, device="cuda", dtype=torch.bfloat16)
        out_b = torch.empty(tok * 8, n, device="cuda", dtype=torch.bfloat16)
        fns = {
            f"indexed{bm}": lambda: lowbit.w4a16_indexed(a, wi, rb.sorted_token_ids, rb.expert_ids,
                                                         rb.num_tokens_post_padded, top_k, out=out_b),
            "indexed": lambda: lowbit.w4a16_indexed(a, wi, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded,
                                                    top_k, out=out_i),
            "gather": lambda: torch.index_select(a0, 0, src, out=gathered),
            "contig": lambda: lowbit.w4a16_contiguous(gathered, wc, m_idx, out=out_c),
        }
        t = measure_interleaved(fns)
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        err = ((out_c[valid].float() - out_i[sid[valid].long()].float()).norm() / out_i[sid[valid].long()].float().norm()).item()
        ti, tg, tc = (t[v].median_us for v in ("indexed", "gather", "contig"))
        print(f"{label} t{tok} {proj:8} rows {ntpp:6d}  indexed{bm} {t[f'indexed{bm}'].median_us:7.1f}  indexed {ti:7.1f}  gather {tg:6.1f}  contig {tc:7.1f}  "
              f"gather+contig {tg + tc:7.1f}  x{ti / (tg + tc):.3f}  (contig alone x{ti / tc:.3f})  diff {err:.1e}",
              flush=True)
