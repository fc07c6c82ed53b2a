"""How fast can TMA alone stream weight-shaped tiles on this GPU? (a probe)

    python scripts/probes/tma_stream.py

The W4A16 decode kernel's skeleton (TMA ring + barriers, no dequant, no wgmma) streamed only
2.85 TB/s at one token (`w4a16_bounds.py decode`), and a tiled weight layout did not help.
Here a CTA streams a band of `BR` rows along the columns, one ``[BR, BC]`` box a step, through
a `STAGES`-deep ring. It reads one word of each box so nothing is dead. This is the decode
kernel's access pattern with nothing else in it. Boxes of 64-256 rows x 128 bytes (the
kernel's), stages 2-6 and 1-4 CTAs a band (a split-K analog: more CTAs, fewer steps each)
are measured as TB/s of the bytes streamed, against 4.50 TB/s. 64x32 with 3 stages and one CTA
a band is the one-token gate_up grid of the decode kernel (512 CTAs, 28 steps each).
"""
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@gluon.jit
def _tma_stream_kernel(desc, out_ptr, n_cols, STAGES: gl.constexpr, num_warps: gl.constexpr):
    BR: gl.constexpr = desc.block_type.shape[0]
    BC: gl.constexpr = desc.block_type.shape[1]
    pid = gl.program_id(0)
    c0 = gl.program_id(1) * n_cols  # this CTA's share of the columns (a split-K analog)
    bufs = gl.allocate_shared_memory(desc.dtype, [STAGES, BR, BC], desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    steps = n_cols // BC
    for i in gl.static_range(STAGES):
        mbarrier.expect(bars.index(i), desc.block_type.nbytes, pred=i < steps)
        tma.async_copy_global_to_shared(desc, [pid * BR, c0 + i * BC], bars.index(i), bufs.index(i), pred=i < steps)
    box_l: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [num_warps, 1], [1, 0])
    acc = gl.zeros([BC], gl.int32, gl.SliceLayout(0, box_l))
    for j in range(steps):
        s = j % STAGES
        mbarrier.wait(bars.index(s), (j // STAGES) & 1)
        acc += gl.sum(bufs.index(s).load(box_l), axis=0)  # touch the box: nothing is dead
        gl.thread_barrier()  # every warp past stage s before it is refilled
        nxt = j + STAGES
        mbarrier.expect(bars.index(s), desc.block_type.nbytes, pred=nxt < steps)
        tma.async_copy_global_to_shared(desc, [pid * BR, c0 + nxt * BC], bars.index(s), bufs.index(s), pred=nxt < steps)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    cta = pid * gl.num_programs(1) + gl.program_id(1)
    gl.store(out_ptr + cta * BC + gl.arange(0, BC, layout=gl.SliceLayout(0, box_l)), acc)


def stream_us(t: torch.Tensor, box: tuple[int, int], stages: int, split: int = 1, num_warps: int = 4,
              flush_mode: str = "read") -> float:
    """Median us of streaming `t` (int32 ``[R, C]``, R a multiple of the box rows, C of the box
    columns times `split`) once; `split` CTAs share a band's columns."""
    from lowbit.bench.timing import measure

    br, bc = box
    layout = gl.NVMMASharedLayout.get_default_for([br, bc], gl.int32)
    desc = TensorDescriptor(t, list(t.shape), [t.stride(0), 1], [br, bc], layout)
    out = torch.empty(t.shape[0] // br * split, bc, dtype=torch.int32, device=t.device)
    return measure(lambda: _tma_stream_kernel[(t.shape[0] // br, split)](desc, out, t.shape[1] // split,
                                                                         STAGES=stages, num_warps=num_warps),
                   cuda_graph=True, rep_ms=30, flush_mode=flush_mode).median_us


def main() -> None:
    # Kimi EP8 gate_up weights of 8 experts: 8 x 4096 rows x 896 words (7168 INT4 values) = 117 MB
    t = torch.randint(0, 1 << 30, (8 * 4096, 896), dtype=torch.int32, device="cuda")
    nbytes = t.numel() * 4
    print(f"streaming {nbytes / 1e6:.0f} MB; 4.50 TB/s would take {nbytes / 4.5e6:.1f} us")
    from lowbit.bench.timing import measure

    for mode in ("write", "read"):  # L2 left dirty by the flush, or clean
        us = measure(lambda: t.sum(dtype=torch.int64), cuda_graph=True, rep_ms=30, flush_mode=mode).median_us
        print(f"flush {mode:5}  torch sum (reference read)       {us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s")
        for box in ((64, 32), (128, 32), (256, 32)):
            for stages in (2, 3, 4, 6):
                for split in (1, 2, 4):
                    if stages * box[0] * box[1] * 4 > 200 * 1024 or (mode == "write" and split > 1):
                        continue
                    us = stream_us(t, box, stages, split, flush_mode=mode)
                    print(f"flush {mode:5}  box {box[0]:>3}x{box[1]} i32  stages {stages}  split {split}  "
                          f"{us:8.1f} us  {nbytes / us / 1e6:5.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
