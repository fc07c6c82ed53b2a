"""The warp-specialized register-A grouped W4A16 kernel against the plain one (a probe).

    python scripts/probes/ws_grouped.py     # on the H200: time + compare, Kimi EP8 contiguous

History: written in the fifth session as a stand-alone kernel; run in the sixth (1.13-1.20x,
bit-identical), it became the production engine ``gluon_ws`` (`w4a16_sm90._ws_mainloop`), so
this probe now times the two production paths, `w4a16_grouped_sm90_launch` with and without
``warp_specialize``, on identical inputs and compares their outputs bit for bit.

Why warp specialization helps: the plain main loop (`w4a16_sm90._rs_mainloop`) refills the
activation stage only after the step's wgmmas retire and every warp passes a CTA barrier, and
at the 128x128 prefill tile only 2 stages of 82 KB fit, so the next step's TMA is issued late
and the two consumer warpgroups wait for each other every step. With a producer warp released
by mbarriers no CTA barrier is left in the loop.
"""
# ruff: noqa: B023  (each closure is timed inside the iteration that builds it)
import torch

from lowbit.bench.cases import make_weight
from lowbit.bench.timing import measure
from lowbit.formats.w4a16 import pack_w4a16_grouped
from variants import KERNEL as k


def main() -> None:
    E, H, I = 48, 7168, 2048
    n, kk = 2 * I, H
    for rows, tile in ((128, (128, 128, 8, 2)), (128, (128, 64, 8, 3)), (256, (128, 128, 8, 2))):
        w = pack_w4a16_grouped(make_weight(E, n, kk, "cuda"), mode="contiguous")
        a = torch.randn(E * rows, kk, device="cuda").to(torch.bfloat16)
        route = torch.arange(E, device="cuda", dtype=torch.int32).repeat_interleave(rows)
        outs, us = {}, {}
        for name, ws in (("register-A", False), ("warp-specialized", True)):
            out = torch.full((a.shape[0], n), float("nan"), dtype=torch.bfloat16, device="cuda")

            def fn(o=out, ws=ws):
                k.w4a16_grouped_sm90_launch(a, w, route, o, tile, 0, regs_a=True, warp_specialize=ws)

            fn()
            torch.cuda.synchronize()
            outs[name] = out.clone()
            us[name] = measure(fn, cuda_graph=True, rep_ms=30).median_us
        flops = 2 * E * rows * n * kk
        same = torch.equal(outs["register-A"], outs["warp-specialized"])
        print(f"contiguous gate_up {rows} rows/expert {tile}: register-A {us['register-A']:.1f} us "
              f"({flops / us['register-A'] / 1e6:.0f} TFLOP/s), warp-specialized {us['warp-specialized']:.1f} us "
              f"({flops / us['warp-specialized'] / 1e6:.0f} TFLOP/s), "
              f"{us['register-A'] / us['warp-specialized']:.2f}x, {'bit-identical' if same else 'OUTPUTS DIFFER'}",
              flush=True)


if __name__ == "__main__":
    main()
