"""Kernel timing: CUDA events around each call, L2 flushed before each call, robust statistics.

Why it is done this way:

- **CUDA events, one pair per repetition.** Launches are asynchronous; a host clock measures
  the launch, not the kernel. An event pair brackets exactly one call on the stream, so every
  repetition gives one sample and we can report a distribution, not just a mean.
- **L2 flushed before every repetition** (a 256 MiB buffer is read, more than four times the
  H200's 60 MiB L2). The flush *reads*: a zeroing flush leaves ~60 MB of dirty lines in L2,
  and the timed kernel then pays their write-back to HBM. On the H200 that made a pure TMA
  stream of 117 MB read 2.7 TB/s instead of the ~4.4 TB/s it reaches after a read flush
  (H200, 2026-11), so every bandwidth fraction was ~14 us too pessimistic
  (ratios between providers timed the same way were unaffected). ``flush_mode="write"``
  keeps the old behaviour for comparison. In serving, a MoE layer's weights were evicted by the 60 other layers
  that ran since; timing back-to-back calls on the same buffers would let small problems
  (TP8 down, decode activations) hit in L2 and report bandwidths above HBM's. The flush
  kernel also keeps the GPU busy while the host enqueues the next call, so host-side launch
  cost (Python dispatch, a library's config lookup) is hidden as long as it is shorter than
  the flush (~60-90 us); it is *not* part of the number. Use ``cuda_graph=True`` to also
  remove the launch gaps inside a multi-kernel call (the torch provider's gather + GEMM +
  scatter), as a serving engine's graph replay would.
- **Median, p20, p80 over many repetitions** (as triton's ``do_bench`` and Liger report):
  the median is insensitive to the occasional clock dip or preemption; p20-p80 shows the
  spread, so a difference between providers smaller than it is visibly noise.
- **Interleaved A/B** (`measure_interleaved`): variants that must be compared within a few
  percent are replayed in turn, in a fresh random order each round, so a drift of the GPU's
  clocks or an order effect lands on every variant alike. Timed one after another with
  `measure`, an unchanged kernel read 1.09x against itself in one probe (H200, 2026-11-30, 5d3072b);
  interleaved, two repeats of one probe agreed within 1%.
- **Warm-up outside the timed region**: JIT compilation (Triton, Humming's NVRTC), autotuning,
  allocator growth and lazy module loading happen in the first calls.

On a machine without CUDA, `measure` falls back to ``time.perf_counter`` around synchronous
CPU calls: the numbers are only good for exercising the harness, never for reporting.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

__all__ = ["Timing", "measure", "measure_interleaved", "L2_FLUSH_BYTES", "quantile"]

#: Size of the buffer zeroed before each repetition (4x the H200's 60 MiB L2, as do_bench).
L2_FLUSH_BYTES = 256 * 1024 * 1024


@dataclass
class Timing:
    """Statistics of one measured callable, in microseconds.

    median_us / p20_us / p80_us / min_us / mean_us: over `reps` repetitions.
    l2_flushed: the L2 was flushed before each repetition.
    cuda_graph: each repetition replayed a captured CUDA graph of the callable.
    clock: "cuda_event" on a GPU, "perf_counter" on the CPU fallback.
    """

    median_us: float
    p20_us: float
    p80_us: float
    min_us: float
    mean_us: float
    reps: int
    l2_flushed: bool
    cuda_graph: bool
    clock: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def quantile(samples: list[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty list (``q`` in [0, 1])."""
    if not samples:
        raise ValueError("quantile of an empty sample list")
    ordered = sorted(samples)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _summarize(samples_us: list[float], *, l2_flushed: bool, cuda_graph: bool, clock: str) -> Timing:
    return Timing(
        median_us=quantile(samples_us, 0.5),
        p20_us=quantile(samples_us, 0.2),
        p80_us=quantile(samples_us, 0.8),
        min_us=min(samples_us),
        mean_us=sum(samples_us) / len(samples_us),
        reps=len(samples_us),
        l2_flushed=l2_flushed,
        cuda_graph=cuda_graph,
        clock=clock,
    )


def _measure_cpu(fn: Callable[[], Any], reps: int) -> Timing:
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return _summarize(samples, l2_flushed=False, cuda_graph=False, clock="perf_counter")


def _capture_graph(fn: Callable[[], Any], device: torch.device) -> Callable[[], None]:
    """Capture `fn` (already warm) into a CUDA graph; return its replay."""
    stream = torch.cuda.Stream(device=device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn()  # one eager call on the side stream, as capture requires warm allocator state
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize(device)
    return graph.replay


def measure(
    fn: Callable[[], Any],
    *,
    device: torch.device | str | None = None,
    warmup_ms: float = 50.0,
    rep_ms: float = 200.0,
    min_reps: int = 20,
    max_reps: int = 2000,
    flush_l2: bool = True,
    cuda_graph: bool = False,
    flush_mode: str = "read",
) -> Timing:
    """Time `fn` (a no-argument callable that launches the work) on `device`.

    The number of repetitions is chosen so that the timed calls take about `rep_ms` in total,
    clamped to ``[min_reps, max_reps]``; a first call and about `warmup_ms` of calls run
    untimed. With `cuda_graph`, `fn` is captured once and each repetition replays the graph
    (`fn` must then be capturable: no host syncs, no allocation-size changes).
    `flush_mode` is ``"read"`` (L2 left holding clean lines; the default) or ``"write"`` (L2 left
    dirty, as after a kernel that wrote 60 MB).
    Returns a `Timing` in microseconds. Without CUDA (or with a CPU `device`) it times with
    ``time.perf_counter`` for `min_reps` calls (harness testing only).
    """
    if flush_mode not in ("read", "write"):
        raise ValueError(f"flush_mode must be 'read' or 'write', got {flush_mode!r}")
    dev = torch.device(device) if device is not None else None
    if dev is None:
        dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    if dev.type != "cuda":
        return _measure_cpu(fn, min_reps)

    call: Callable[[], Any] = fn
    fn()  # compile / load / allocate outside everything that is timed
    torch.cuda.synchronize(dev)
    if cuda_graph:
        call = _capture_graph(fn, dev)

    flush_buf = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=dev) if flush_l2 else None

    def flush() -> None:
        if flush_buf is None:
            return
        if flush_mode == "write":
            flush_buf.zero_()
        else:
            flush_buf.sum(dtype=torch.int64)  # reads 256 MiB: evicts everything, dirties nothing

    # Estimate one call's time (without the flush) to size warm-up and repetitions.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        call()
    end.record()
    torch.cuda.synchronize(dev)
    est_ms = max(start.elapsed_time(end) / 3, 1e-3)
    for _ in range(max(1, int(warmup_ms / est_ms))):
        call()
    reps = int(min(max(rep_ms / est_ms, min_reps), max_reps))

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush()
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize(dev)
    samples = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return _summarize(samples, l2_flushed=flush_l2, cuda_graph=cuda_graph, clock="cuda_event")


def measure_interleaved(fns: dict[str, Callable[[], Any]], *, rounds: int = 60,
                        device: torch.device | str | None = None) -> dict[str, Timing]:
    """Time several callables against one another (GPU only): each is warmed up and captured
    into a CUDA graph, then every round replays each graph once, in a fresh random order,
    behind a read flush of the L2 (as `measure`). Returns a `Timing` per name (`rounds`
    samples each). For A/B comparisons of kernel variants, where `measure` run one after the
    other picks up clock drift and order effects of a few percent."""
    import random

    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if dev.type != "cuda":
        raise ValueError("measure_interleaved needs a CUDA device")
    calls = {}
    for name, fn in fns.items():
        fn()
        torch.cuda.synchronize(dev)
        calls[name] = _capture_graph(fn, dev)
    flush_buf = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=dev)
    names = list(calls)
    order, events = [], []
    for _ in range(rounds):
        random.shuffle(names)
        for name in names:
            flush_buf.sum(dtype=torch.int64)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            calls[name]()
            end.record()
            order.append(name)
            events.append((start, end))
    torch.cuda.synchronize(dev)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for name, (start, end) in zip(order, events):
        samples[name].append(start.elapsed_time(end) * 1e3)
    return {name: _summarize(v, l2_flushed=True, cuda_graph=True, clock="cuda_event") for name, v in samples.items()}
