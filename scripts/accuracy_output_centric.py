"""Accuracy of the output-centric MoE decode against the expert-centric paths.

The output-centric ("warp decode") design reports that its outputs are 1.4x closer to a full
32-bit reference than the classic expert-centric path (which quantizes activations to MXFP8
before each GEMM), with min cosine similarity > 0.999996. This script measures the same thing
for lowbit, on the CPU (or with ``--gpu-kernels`` on the GPU, the library's layers included),
against an FP64 reference of the *same quantized weights* (so weight quantization is not
counted; only what each path does to activations, intermediates and sums):

  ref  FP64: ``out[t] = sum_j w[t,j] * (SiLU(g) * u) @ W2[e]^T`` with ``g, u = hidden[t] @ W13[e]^T``;
       weights dequantized exactly, nothing rounded.
  (a)  output-centric (`lowbit.kernels.moe_decode.op`): BF16 hidden, the kernels' effective
       weights (INT4: ``bf16((q - 8) * s)`` from the shared dequantizer; MXFP8: exact), FP32
       accumulation, intermediate ``bf16(SiLU(g) * u)``, routing weights folded into one FP32
       accumulator, one final BF16 rounding.
  (a32) (a) with exactly dequantized weights: what an INT4 kernel that dequantizes in FP32
       instead of through `lowbit.kernels.w4a16.int4.dequant_pair` would give (for MXFP8 it is (a)).
  (b)  classic expert-centric, MXFP8 activations (the report's baseline): hidden quantized to
       MXFP8 (E4M3 + E8M0 per 32, `lowbit.formats.mxfp8`) before gate_up; gate_up output stored
       in BF16; ``bf16(SiLU(g) * u)`` quantized to MXFP8 before down; per-route down output
       stored in BF16 (the per-expert buffer); FP32 weighted combine; BF16 out. The weights
       enter exactly (FP8 tensor cores multiply MXFP8 x MXFP8 exactly; for INT4 weights this
       is the most favourable assumption for (b)).
  (c)  expert-centric with BF16 activations, the numerics of lowbit's indexed W4A16 path:
       BF16 hidden into the gate_up GEMM (effective weights as in (a)), BF16 gate_up output,
       ``bf16(SiLU(g) * u)``, BF16 per-route down output, FP32 weighted combine, BF16 out.

Each path is emulated in PyTorch (FP32 matmuls for the FP32-accumulated GEMMs; the kernels sum
in another order, which moves results by ~1e-7 relative, far below the BF16 effects measured
here). ``--kernel-check`` also runs the actual Triton kernels (`moe_decode`, both engines) on a
small shape -- natively on a GPU, else under the Triton interpreter -- and reports how far they
are from emulation (a).

``--gpu-kernels`` (a CUDA GPU) runs the whole study on the GPU instead -- weights drawn there (the
draws differ from the CPU ones), the FP64 reference and the emulations on the GPU -- and adds the
library's layers themselves on the full shape, each batch's output measured against the same
reference: `lowbit.moe_experts` output-centric (`moe_decode`, its sm_90 default engine) for both
formats, and indexed (`w4a16_indexed` gate_up, `silu_mul`, down, `combine_topk`) for INT4.

Metrics per batch: relative Frobenius error ``|out - ref| / |ref|``, the minimum over tokens of
the cosine similarity ``cos(out[t], ref[t])``, and the largest absolute difference.

Usage (the numbers in docs/accuracy.md)::

    python scripts/accuracy_output_centric.py --kernel-check --json accuracy.json
    python scripts/accuracy_output_centric.py --gpu-kernels --json accuracy_gpu.json   # on the H200
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

if not torch.cuda.is_available():  # the kernel check runs under the interpreter without a GPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch.nn.functional as F  # noqa: E402

from lowbit.formats import dequantize_mxfp8, get_format, quantize_mxfp8  # noqa: E402

PATHS = ("a", "b", "c", "a32")
PATH_NAMES = {
    "a": "output-centric (BF16 act, FP32 acc, bf16 intermediate)",
    "a32": "(a) with the weights dequantized exactly in FP32 (INT4: no bf16 rounding of (q - 8) * s)",
    "b": "expert-centric, MXFP8 activations (the classic path)",
    "c": "expert-centric, BF16 activations (indexed W4A16 numerics)",
}


def bf16(x: torch.Tensor) -> torch.Tensor:
    """Round to BF16 (RNE) and back to FP32."""
    return x.to(torch.bfloat16).float()


def mxfp8_round(x: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize along the last dim with `lowbit.formats.mxfp8` (FP32 result)."""
    codes, scales = quantize_mxfp8(x.float())
    return dequantize_mxfp8(codes, scales)


def make_expert(fmt: str, e: int, hidden: int, inter: int, seed: int, device: str = "cpu"):
    """Expert `e`'s quantized weights: (exact FP64 W13, W2; the kernels' effective FP32 W13, W2;
    the quantized W13, W2 as the packers take them: a `QuantizedTensor` (INT4) or a
    ``(codes, scales_e8m0)`` pair (MXFP8)). Real weights ~ N(0, 1/H) resp. N(0, 1/I), drawn from a
    per-expert seed on `device`."""
    g = torch.Generator(device=device).manual_seed(seed * 1000 + e)
    r13 = torch.randn(2 * inter, hidden, generator=g, device=device) / hidden**0.5
    r2 = torch.randn(hidden, inter, generator=g, device=device) / inter**0.5
    if fmt == "int4":
        f = get_format("int4_g32")
        q13, q2 = f.quantize(r13), f.quantize(r2)
        d13, d2 = q13.dequantize(), q2.dequantize()
        eff13, eff2 = bf16(d13), bf16(d2)  # lowbit.kernels.w4a16.int4.dequant_pair rounds (q - 8) * s to bf16
    else:
        q13, q2 = quantize_mxfp8(r13), quantize_mxfp8(r2)
        d13, d2 = dequantize_mxfp8(*q13), dequantize_mxfp8(*q2)
        eff13, eff2 = d13, d2  # E4M3 x 2^k is exact in FP32 and in BF16
    return d13.double(), d2.double(), eff13, eff2, q13, q2


def make_batch(m: int, hidden: int, num_experts: int, top_k: int, seed: int, device: str = "cpu"):
    """BF16 hidden ~ N(0, 1) with a few outlier channels (x8), distinct top-k experts per token,
    routing weights renormalized softmax (sum to 1), as a top-k router gives (drawn on the CPU,
    then moved to `device`)."""
    g = torch.Generator().manual_seed(seed * 7919 + m)
    x = torch.randn(m, hidden, generator=g)
    x[:, torch.randperm(hidden, generator=g)[:16]] *= 8.0
    logits = torch.randn(m, num_experts, generator=g)
    w, ids = logits.softmax(-1).topk(top_k, dim=-1)
    return x.to(torch.bfloat16).to(device), ids.to(device), (w / w.sum(-1, keepdim=True)).to(device)


def run_expert(e, d13, d2, eff13, eff2, batch, acc):
    """Add expert e's contribution to every path's accumulators for the routes that chose it."""
    x, ids, w = batch
    inter = d2.shape[1]
    t_idx, j_idx = (ids == e).nonzero(as_tuple=True)
    if t_idx.numel() == 0:
        return
    xr = x[t_idx]  # bf16 [R, H]
    wr = w[t_idx, j_idx]  # fp32 [R]
    # reference: FP64 throughout
    gu = xr.double() @ d13.T
    y = (F.silu(gu[:, :inter]) * gu[:, inter:]) @ d2.T
    acc["ref"].index_add_(0, t_idx, y * wr.double()[:, None])
    # (a) output-centric: FP32 sums, bf16 intermediate, routing weight folded into FP32 acc
    gu = xr.float() @ eff13.T
    act = bf16(F.silu(gu[:, :inter]) * gu[:, inter:])
    acc["a"].index_add_(0, t_idx, (act @ eff2.T) * wr[:, None])
    gu = xr.float() @ d13.float().T
    act = bf16(F.silu(gu[:, :inter]) * gu[:, inter:])
    acc["a32"].index_add_(0, t_idx, (act @ d2.float().T) * wr[:, None])
    # (b) classic: MXFP8 activations before each GEMM, bf16 GEMM outputs, FP32 combine
    gu = bf16(mxfp8_round(xr.float()) @ d13.float().T)
    act = bf16(F.silu(gu[:, :inter]) * gu[:, inter:])
    y = bf16(mxfp8_round(act) @ d2.float().T)
    acc["b"].index_add_(0, t_idx, y * wr[:, None])
    # (c) indexed W4A16 numerics: bf16 activations, bf16 GEMM outputs, FP32 combine
    gu = bf16(xr.float() @ eff13.T)
    act = bf16(F.silu(gu[:, :inter]) * gu[:, inter:])
    y = bf16(act @ eff2.T)
    acc["c"].index_add_(0, t_idx, y * wr[:, None])


def metrics(out: torch.Tensor, ref: torch.Tensor) -> dict:
    out, ref = out.double(), ref.double()
    rel = float((out - ref).norm() / ref.norm())
    cos = F.cosine_similarity(out, ref, dim=1)
    return {"rel_err": rel, "min_cos": float(cos.min()), "max_abs": float((out - ref).abs().max())}


#: The library's layers that ``--gpu-kernels`` measures, by weight format: (name, `moe_experts` path).
GPU_LAYERS = {"int4": (("output_centric", "output_centric"), ("indexed", "indexed")),
              "mxfp8": (("output_centric", "output_centric"),)}
#: The emulated path whose numerics each layer has (module docstring).
LAYER_EMULATION = {"output_centric": "a", "indexed": "c"}


def pack_layer(fmt: str, q13s: list, q2s: list):
    """The experts' quantized weights stacked and packed as the layers take them: `pack_w4a16`
    (INT4, profile "indexed": both paths read it) or `pack_mxfp8_experts` (MXFP8) in the sm_90
    ``mma`` engine's k256-interleaved layout on a GPU, the natural one elsewhere (the
    interpreter's engines)."""
    from lowbit.formats.w4a16 import pack_w4a16
    from lowbit.formats import pack_mxfp8_experts

    if fmt == "int4":
        return tuple(pack_w4a16(torch.stack([q.codes for q in qs]), torch.stack([q.scales for q in qs]))
                     for qs in (q13s, q2s))
    layout = "k256-interleaved" if q13s[0][0].is_cuda else "natural"
    return tuple(pack_mxfp8_experts((torch.stack([c for c, _ in qs]), torch.stack([sc for _, sc in qs])),
                                    layout=layout) for qs in (q13s, q2s))


def measure(fmt, num_experts, hidden, inter, top_k, batches, seed, log=print, device="cpu", gpu_layers=False):
    """Every path's metrics for each batch; with `gpu_layers` (on a CUDA `device`) also the
    library's layers (`GPU_LAYERS`) on the same weights and batches, under ``row["layers"]``."""
    data = [make_batch(m, hidden, num_experts, top_k, seed, device) for m in batches]
    accs = [{p: torch.zeros(m, hidden, dtype=torch.float32, device=device) for p in PATHS} for m in batches]
    for a, m in zip(accs, batches):
        a["ref"] = torch.zeros(m, hidden, dtype=torch.float64, device=device)
    q13s, q2s = [], []
    t0 = time.time()
    for e in range(num_experts):
        d13, d2, eff13, eff2, q13, q2 = make_expert(fmt, e, hidden, inter, seed, device)
        for batch, acc in zip(data, accs):
            run_expert(e, d13, d2, eff13, eff2, batch, acc)
        if gpu_layers:
            q13s.append(q13)
            q2s.append(q2)
        log(f"  {fmt}: expert {e + 1}/{num_experts} done ({time.time() - t0:.0f} s)")
    layers = {}
    if gpu_layers:
        from lowbit import moe_experts

        w13, w2 = pack_layer(fmt, q13s, q2s)
        del q13s, q2s
        for name, path in GPU_LAYERS[fmt]:
            layers[name] = [moe_experts(x, ids.to(torch.int32), w.float(), w13, w2, path=path).float()
                            for x, ids, w in data]
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        log(f"  {fmt}: layers {sorted(layers)} done ({time.time() - t0:.0f} s)")
    rows = []
    for i, (m, acc) in enumerate(zip(batches, accs)):
        row = {"format": fmt, "tokens": m, "experts_hit": int(data[i][1].unique().numel()), "device": str(device)}
        for p in PATHS:
            row[p] = metrics(bf16(acc[p]), acc["ref"])  # every path ends in a bf16 output
        if layers:
            row["layers"] = {name: metrics(outs[i], acc["ref"]) for name, outs in layers.items()}
        rows.append(row)
    return rows


def kernel_check(fmt, seed, log=print):
    """Run the Triton kernels on a small shape and compare with emulation (a) and the reference."""
    from lowbit.formats.w4a16 import pack_w4a16
    from lowbit.formats import pack_mxfp8_experts
    from lowbit.kernels.moe_decode.op import DecodeConfig, moe_decode

    e_n, h, inter, m, k = 8, 512, 256, 4, 4
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(seed)
    r13 = torch.randn(e_n, 2 * inter, h, generator=gen) / h**0.5
    r2 = torch.randn(e_n, h, inter, generator=gen) / inter**0.5
    if fmt == "int4":
        f = get_format("int4_g32")
        q13, q2 = f.quantize(r13), f.quantize(r2)
        w13, w2 = pack_w4a16(q13).to(dev), pack_w4a16(q2).to(dev)
    else:
        w13, w2 = pack_mxfp8_experts(r13).to(dev), pack_mxfp8_experts(r2).to(dev)
        q13, q2 = w13.to("cpu").as_quantized(), w2.to("cpu").as_quantized()
    batch = make_batch(m, h, e_n, k, seed)
    acc = {p: torch.zeros(m, h) for p in PATHS}
    acc["ref"] = torch.zeros(m, h, dtype=torch.float64)
    for e in range(e_n):
        d13, d2 = q13.select(e).dequantize(), q2.select(e).dequantize()
        eff13, eff2 = (bf16(d13), bf16(d2)) if fmt == "int4" else (d13, d2)
        run_expert(e, d13.double(), d2.double(), eff13, eff2, batch, acc)
    emul = bf16(acc["a"])
    x, ids, w = batch
    res = {"format": fmt, "shape": f"E={e_n} H={h} I={inter} M={m} k={k}", "device": dev,
           "emulation_a": metrics(emul, acc["ref"])}
    for engine, cfg in (("fma", DecodeConfig("fma", 128, 256, 1, 4, 1)), ("dot", DecodeConfig("dot", 128, 256, 16, 4, 1))):
        t0 = time.time()
        out = moe_decode(x.to(dev), ids.to(torch.int32).to(dev), w.float().to(dev), w13, w2, config=cfg).cpu().float()
        res[f"kernel_{engine}"] = metrics(out, acc["ref"])
        res[f"kernel_{engine}_vs_emulation_rel"] = float((out - emul).norm() / emul.norm())
        res[f"kernel_{engine}_bitwise_equal_emulation"] = bool(torch.equal(out, emul))
        log(f"  kernel check {fmt} {engine}: {time.time() - t0:.1f} s")
    return res


def fmt_table(rows) -> str:
    lines = ["| weights | tokens | experts hit | rel err (a) | rel err (b) | rel err (c) | rel err (a32) | (b)/(a) "
             "| (c)/(a) | min cos (a) | min cos (b) | min cos (c) | min cos (a32) | max abs (a) | max abs (b) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        a, b, c, a32 = r["a"], r["b"], r["c"], r["a32"]
        lines.append(
            f"| {r['format']} | {r['tokens']} | {r['experts_hit']} | {a['rel_err']:.3e} | {b['rel_err']:.3e} | "
            f"{c['rel_err']:.3e} | {a32['rel_err']:.3e} | {b['rel_err'] / a['rel_err']:.1f}x | "
            f"{c['rel_err'] / a['rel_err']:.2f}x | {a['min_cos']:.7f} | {b['min_cos']:.7f} | {c['min_cos']:.7f} | "
            f"{a32['min_cos']:.7f} | {a['max_abs']:.2e} | {b['max_abs']:.2e} |")
    return "\n".join(lines)


def fmt_layer_table(rows) -> str:
    """The library's layers (``--gpu-kernels``) beside the emulated paths of the same draw."""
    lines = ["| weights | tokens | experts hit | layer | rel err | min cos | max abs | (b) rel err / this | "
             "its emulated path's rel err |", "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        for name, m in r.get("layers", {}).items():
            emu = LAYER_EMULATION[name]
            lines.append(f"| {r['format']} | {r['tokens']} | {r['experts_hit']} | {name} | {m['rel_err']:.3e} | "
                         f"{m['min_cos']:.7f} | {m['max_abs']:.2e} | {r['b']['rel_err'] / m['rel_err']:.1f}x | "
                         f"({emu}) {r[emu]['rel_err']:.3e} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="mxfp8,int4")
    ap.add_argument("--experts", type=int, default=48, help="experts of the layer (default 48: Kimi K2.x EP8)")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--batches", default="1,2,4,8,16,32")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kernel-check", action="store_true", help="also run the Triton kernels on a small shape")
    ap.add_argument("--gpu-kernels", action="store_true",
                    help="run the study on the GPU and measure the library's layers (moe_experts) on the full shape")
    ap.add_argument("--json", default=None, help="write all results to this file")
    args = ap.parse_args(argv)
    if args.gpu_kernels and not torch.cuda.is_available():
        ap.error("--gpu-kernels needs a CUDA GPU")
    device = "cuda" if args.gpu_kernels else "cpu"
    batches = [int(b) for b in args.batches.split(",")]
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    rows, checks = [], []
    t0 = time.time()
    for fmt in args.formats.split(","):
        rows += measure(fmt, args.experts, args.hidden, args.inter, args.top_k, batches, args.seed, log,
                        device, args.gpu_kernels)
        if args.kernel_check:
            checks.append(kernel_check(fmt, args.seed, log))
    cmd = "python scripts/accuracy_output_centric.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"# {datetime.date.today()} -- {cmd} -- E={args.experts} H={args.hidden} I={args.inter} "
          f"top_k={args.top_k} seed={args.seed}, {time.time() - t0:.0f} s on the {'GPU' if args.gpu_kernels else 'CPU'}\n")
    for p in PATHS:
        print(f"({p}) {PATH_NAMES[p]}")
    print()
    print(fmt_table(rows))
    if args.gpu_kernels:
        print(f"\nThe library's layers on the same draws ({torch.cuda.get_device_name()}):\n")
        print(fmt_layer_table(rows))
    for c in checks:
        print(f"\nkernel check {c['format']} ({c['shape']}, {c['device']}): emulation (a) rel err "
              f"{c['emulation_a']['rel_err']:.3e}; " + "; ".join(
                  f"{eng} kernel rel err {c[f'kernel_{eng}']['rel_err']:.3e}, min cos {c[f'kernel_{eng}']['min_cos']:.7f}, "
                  f"vs emulation {c[f'kernel_{eng}_vs_emulation_rel']:.2e} (bitwise equal: {c[f'kernel_{eng}_bitwise_equal_emulation']})"
                  for eng in ("fma", "dot")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": str(datetime.date.today()), "command": cmd, "args": vars(args), "rows": rows,
                       "kernel_checks": checks}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
