"""The indexed MoE layer with the SiLU writing down's rows in slot order against down gathering
them itself -- a probe, not a benchmark.

    python scripts/probes/slot_order_silu.py [TOKENS ...]   (default 256 512 1024 2048)

Why (thirty-second session): where down runs on pre-gathered rows (`W4A16Config.pregather`,
Kimi EP8 prefill), `moe_experts` used to write ``SiLU * up`` in route order and down's launcher
then gathered those rows into slot order (`moe_routing.gather_indexed_rows`): one more read and
write of ``[M * k, I]`` bf16 (2 x 34 MB at 1024 tokens). ``silu_mul(gu, routing=r)`` writes them
in slot order in the SiLU's own pass, and down takes them with ``slot_order_routes``.

Kimi K2.x EP8 (48 experts, H 7168, I 2048, top-8), random INT4 weights and routing; both layers
whole (routing, gate_up, SiLU, down, combine), one process, interleaved CUDA-graph replays
behind an L2 flush (`measure_interleaved`); outputs compared bit for bit ("!" on a difference)."""
import sys

import torch

from lowbit import moe_experts, routing
from lowbit.bench.timing import measure_interleaved
from lowbit.formats import get_format
from lowbit.formats.w4a16 import pack_w4a16
from lowbit.kernels.moe_elementwise import combine_topk, silu_mul
from lowbit.kernels.w4a16.indexed import w4a16_indexed
from lowbit.layers.moe import indexed_configs
from lowbit.testing import random_topk_ids, random_topk_weights

E, H, I, K = 48, 7168, 2048, 8


def gather_layer(hidden, ids, tw, w13, w2, out):
    """The layer as it was: SiLU in route order, down gathering its own rows."""
    c1, c2 = indexed_configs(hidden, K, w13, w2)
    r1 = routing.moe_align_block_size(ids, c1.block_m, E)
    r2 = r1 if c2.block_m == c1.block_m else routing.moe_align_block_size(ids, c2.block_m, E)
    gu = w4a16_indexed(hidden, w13, r1.sorted_token_ids, r1.expert_ids, r1.num_tokens_post_padded, K, config=c1)
    y = w4a16_indexed(silu_mul(gu), w2, r2.sorted_token_ids, r2.expert_ids, r2.num_tokens_post_padded, 1,
                      config=c2, routing_ready=True)
    return combine_topk(y, ids, tw, E, out=out)


def main(tokens) -> None:
    gen = torch.Generator().manual_seed(32)
    fmt = get_format("int4_g32")
    w13 = pack_w4a16(fmt.quantize(torch.randn(E, 2 * I, H, device="cuda") * 0.05)).to("cuda")
    w2 = pack_w4a16(fmt.quantize(torch.randn(E, H, I, device="cuda") * 0.05)).to("cuda")
    print(f"{'tokens':>6}  {'down tile':>14}  {'gather us':>9}  {'slots us':>8}  x", flush=True)
    for m in tokens:
        hidden = torch.randn(m, H, generator=gen).to(torch.bfloat16).cuda()
        ids = random_topk_ids(m, K, E, generator=gen).cuda()
        tw = random_topk_weights(m, K, generator=gen).cuda()
        _, c2 = indexed_configs(hidden, K, w13, w2)
        outs = {k: torch.empty(m, H, dtype=torch.bfloat16, device="cuda") for k in ("gather", "slots")}
        fns = {"gather": lambda: gather_layer(hidden, ids, tw, w13, w2, outs["gather"]),
               "slots": lambda: moe_experts(hidden, ids, tw, w13, w2, out=outs["slots"], path="indexed")}
        t = measure_interleaved(fns, rounds=30)
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        same = "" if torch.equal(outs["gather"], outs["slots"]) else " !"
        g, s = t["gather"].median_us, t["slots"].median_us
        tile = f"{c2.block_n}x{c2.block_m}{'+pre' if c2.pregather else ''}"
        print(f"{m:6d}  {tile:>14}  {g:9.1f}  {s:8.1f}  {g / s:.3f}{same}", flush=True)


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [256, 512, 1024, 2048])
