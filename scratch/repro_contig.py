import torch, sys, itertools
from dataclasses import replace
sys.path.insert(0, "tests")
from test_w4a16_grouped import _weights, _contiguous_problem
from lowbit.kernels.w4a16_grouped import contiguous, w4a16_grouped_config
from lowbit.kernels.w4a16_core import tile_config
from lowbit import reference
from lowbit.testing import rel_fro_err
gen = torch.Generator().manual_seed(1)
for (g, n, k, t) in [(3, 200, 1056, 70), (3, 192, 1056, 70), (3, 200, 1024, 70), (3, 256, 1280, 70), (3, 200, 288, 70), (5, 80, 288, 40)]:
    wq, pw = _weights(g, n, k, gen, "contiguous", "cuda")
    a2, m_idx, _ = _contiguous_problem(t, 2, g, k, gen, "cuda")
    rows = (m_idx >= 0).cpu()
    ref = reference.w4a16_contiguous_ref(a2.cpu(), wq, m_idx.cpu())
    base = w4a16_grouped_config("contiguous", a2.shape[0], n, k, g)
    res = []
    for bm, bn, st, wp in [(64, 64, 3, 4), (64, 64, 2, 4), (64, 64, 1, 4), (32, 128, 3, 8), (16, 256, 3, 4)]:
        cfg = replace(base, block_m=bm, block_n=bn, num_stages=st, num_warps=wp)
        try:
            out = contiguous(a2, pw, m_idx, config=cfg)
            torch.cuda.synchronize()
            res.append(f"{bm}x{bn}s{st}={rel_fro_err(out.cpu()[rows].float(), ref[rows]):.1e}")
        except Exception as e:
            res.append(f"{bm}x{bn}s{st}=ERR {str(e)[:60]}")
    print(f"G{g} N{n} K{k}:", " ".join(res), flush=True)
    # the gluon engine on the same inputs
    gcfg = replace(tile_config(64, "t"), block_m=128, block_n=64, num_warps=4, num_stages=2, engine="gluon")
    out = contiguous(a2, pw, m_idx, config=gcfg)
    print("   gluon", f"{rel_fro_err(out.cpu()[rows].float(), ref[rows]):.1e}", flush=True)
