"""Which validated W4A16 Triton tiles miscompute on the GPU for N off 16 (contiguous + indexed)."""
import torch, sys
from dataclasses import replace
sys.path.insert(0, "tests")
from test_w4a16_grouped import _weights, _contiguous_problem
import test_w4a16_indexed as ti
from lowbit import reference, routing
from lowbit.kernels.w4a16_grouped import contiguous
from lowbit.kernels.w4a16_indexed import w4a16_indexed
from lowbit.kernels.w4a16_core import tile_config, VALIDATED_TILES
from lowbit.testing import rel_fro_err
gen = torch.Generator().manual_seed(2)
k = 544
NS = [int(x) for x in sys.argv[1:]] or (200, 72, 136, 100, 37, 192)
for n in NS:
    wq, pw = _weights(3, n, k, gen, "contiguous", "cuda")
    a2, m_idx, _ = _contiguous_problem(70, 2, 3, k, gen, "cuda")
    rows = (m_idx >= 0).cpu()
    ref = reference.w4a16_contiguous_ref(a2.cpu(), wq, m_idx.cpu())
    res = []
    for bm in VALIDATED_TILES:
        for st in (1, 2, 3, 4):
            cfg = replace(tile_config(bm, "t"), num_stages=st)
            out = contiguous(a2, pw, m_idx, config=cfg)
            e = rel_fro_err(out.cpu()[rows].float(), ref[rows])
            res.append(f"{bm}s{st}={'ok' if e < 4e-3 else f'{e:.0e}'}")
    print(f"contiguous N{n}:", " ".join(res), flush=True)
    wq2, pw2, a, ids = ti._problem(3, n, k, 20, 2, gen, "cuda")
    res = []
    for bm in VALIDATED_TILES:
        r = routing.moe_align_block_size(ids, bm, 3)
        ref2 = reference.w4a16_indexed_ref(a.cpu(), wq2, r.sorted_token_ids.cpu(), r.expert_ids.cpu(), r.num_tokens_post_padded.cpu(), 2)
        for st in (1, 2, 3, 4):
            cfg = replace(tile_config(bm, "t"), num_stages=st)
            out = torch.empty(ids.numel(), n, dtype=torch.bfloat16, device="cuda")
            w4a16_indexed(a, pw2, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, 2, out=out, config=cfg)
            e = rel_fro_err(out.cpu().float(), ref2)
            res.append(f"{bm}s{st}={'ok' if e < 4e-3 else f'{e:.0e}'}")
    print(f"indexed    N{n}:", " ".join(res), flush=True)
