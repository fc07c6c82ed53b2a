"""What bounds the register-A W4A16 kernels on the GPU (a probe, not a test or a benchmark).

    python scripts/probes/w4a16_bounds.py [contiguous] [decode] [tiled]

Times variants of the same Gluon kernel (`variants.py`: text edits of `w4a16_sm90`), Kimi EP8
shapes, CUDA-graph replay, L2 flushed:
  contiguous  gate_up, 128 rows/expert, warp-specialized and register-A: as built / no activation
              loads / no dequant / neither
  decode      64x16 indexed tile, 1 and 20 tokens: as built / no dequant / no gather / half the
              wgmmas / no wgmma
  tiled       the indexed decode tile reading a tiled weight copy (each step's words one
              contiguous 8 KB block) against the production layout; outputs must be equal
Outputs of the "no X" variants are garbage; only their time means something.
"""
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants as v

from lowbit import routing
from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure
from lowbit.formats.w4a16 import pack_w4a16, pack_w4a16_grouped
from variants import KERNEL as orig

E, H, I = 48, 7168, 2048  # Kimi K2.x EP8: 48 local experts
DECODE_TILE = (64, 16, 4, 3)


def _us(fn) -> float:
    return measure(fn, cuda_graph=True, rep_ms=30).median_us


def _indexed_us(mod, a, w, r, top_k, out, tile) -> float:
    return _us(lambda: mod.w4a16_indexed_sm90_launch(a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded,
                                                     top_k, None, out, tile, True))


def _indexed_rs_us(mod, descs, a, n, k, r, top_k, out) -> float:
    """The register-A indexed kernel on explicit weight descriptors (the tiled probe's views)."""
    bw, br, warps, stages = DECODE_TILE
    wd, sd = descs
    return _us(lambda: mod._w4a16_indexed_rs_kernel[(r.expert_ids.numel(), triton.cdiv(n, bw))](
        a, wd, sd, out, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, out,
        n, k, a.shape[0] * top_k, top_k, a.stride(0), out.stride(0),
        BR=br, STAGES=stages, MUL_WEIGHT=False, X_LAYOUT=orig.gather_layout(br, warps), WARP_SPECIALIZE=False,
        N_FASTEST=False, num_warps=warps))


def _grouped_us(mod, a, w, m_idx, out, tile, ws: bool = False) -> float:
    return _us(lambda: mod.w4a16_grouped_sm90_launch(a, w, m_idx, out, tile, 0, regs_a=True, warp_specialize=ws))


def _routing(t: int, gen: torch.Generator):
    ids = torch.stack([torch.randperm(E, generator=gen, device="cuda")[:8] for _ in range(t)]).to(torch.int32)
    return routing.moe_align_block_size(ids, DECODE_TILE[1], E), int(torch.unique(ids).numel())


def contiguous() -> None:
    mods = {"as built": v.variant("c_orig", []), "no act loads": v.variant("c_noact", v.NO_ACT_LOADS),
            "no dequant": v.variant("c_nodeq", [v.NO_DEQUANT]),
            "neither": v.variant("c_both", v.NO_ACT_LOADS + [v.NO_DEQUANT])}
    n, k, rows = 2 * I, H, 128
    w = pack_w4a16_grouped(make_weight(E, n, k, "cuda"), mode="contiguous")
    a = torch.randn(E * rows, k, device="cuda").to(torch.bfloat16)
    m_idx = torch.arange(E, device="cuda", dtype=torch.int32).repeat_interleave(rows)
    out = torch.empty(E * rows, n, dtype=torch.bfloat16, device="cuda")
    flops = 2 * E * rows * n * k
    for tile, ws in (((128, 128, 8, 2), True), ((128, 128, 8, 2), False), ((128, 64, 8, 3), True)):
        base = None
        for name, mod in mods.items():
            us = _grouped_us(mod, a, w, m_idx, out, tile, ws)
            base = base or us
            print(f"contiguous gate_up {tile!s:>16} {'ws' if ws else 'rs'} {name:>13} {us:8.1f} us "
                  f"{flops / us / 1e6:6.1f} TFLOP/s {base / us:5.2f}x", flush=True)


def decode() -> None:
    mods = {"as built": v.variant("d_orig", []), "no dequant": v.variant("d_nodeq", [v.NO_DEQUANT]),
            "no gather": v.variant("d_nogather", [v.NO_GATHER]), "half wgmma": v.variant("d_halfmma", [v.HALF_MMA]),
            "no wgmma": v.variant("d_nomma", [v.NO_MMA])}
    gen = torch.Generator(device="cuda").manual_seed(0)
    for proj, n, k, top_k in (("gate_up", 2 * I, H, 8), ("down", H, I, 1)):
        w = pack_w4a16(make_weight(E, n, k, "cuda"))
        for t in (1, 20):
            r, hit = _routing(t, gen)
            a = torch.randn(t if top_k == 8 else t * 8, k, generator=gen, device="cuda").to(torch.bfloat16)
            out = torch.empty(t * 8, n, dtype=torch.bfloat16, device="cuda")
            nbytes = hit * n * (k // 2 + k // 32 * 2)
            for name, mod in mods.items():
                us = _indexed_us(mod, a, w, r, top_k, out, DECODE_TILE)
                print(f"decode {proj:>7} t={t:<3} {name:>10} {us:8.1f} us {nbytes / us / 1e6:6.2f} TB/s", flush=True)


def tiled() -> None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    mod = v.variant("t_tiled", v.TILED_WEIGHTS)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for proj, n, k, top_k in (("gate_up", 2 * I, H, 8), ("down", H, I, 1)):
        w = pack_w4a16(make_weight(E, n, k, "cuda"))
        e, _, kw = w.qweight.shape
        nk = kw // 32
        words = w.qweight.view(e, n // 64, 64, nk, 32).permute(0, 1, 3, 2, 4).contiguous().view(-1, 32)
        scales = w.scales.view(e, nk, 8, n // 64, 64).permute(0, 3, 1, 2, 4).contiguous().view(-1, 64)
        tiled_descs = (TensorDescriptor(words, list(words.shape), [32, 1], [64, 32],
                                        gl.NVMMASharedLayout.get_default_for([64, 32], gl.int32)),
                       TensorDescriptor(scales, list(scales.shape), [64, 1], [8, 64], orig.S_LAYOUT))
        for t in (1, 4, 20, 50):
            r, hit = _routing(t, gen)
            a = torch.randn(t if top_k == 8 else t * 8, k, generator=gen, device="cuda").to(torch.bfloat16)
            outs = [torch.zeros(t * 8, n, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
            times = [_indexed_rs_us(m, descs, a, n, k, r, top_k, out) for descs, m, out in
                     ((orig.weight_descs(w, DECODE_TILE[0]), orig, outs[0]), (tiled_descs, mod, outs[1]))]
            nbytes = hit * n * (k // 2 + k // 32 * 2)
            print(f"tiled {proj:>7} t={t:<3} production {times[0]:8.1f} us ({nbytes / times[0] / 1e6:.2f} TB/s)  tiled "
                  f"{times[1]:8.1f} us ({nbytes / times[1] / 1e6:.2f} TB/s)  {times[0] / times[1]:.2f}x  "
                  f"equal={torch.equal(outs[0], outs[1])}", flush=True)


if __name__ == "__main__":
    for what in sys.argv[1:] or ["contiguous", "decode", "tiled"]:
        {"contiguous": contiguous, "decode": decode, "tiled": tiled}[what]()
