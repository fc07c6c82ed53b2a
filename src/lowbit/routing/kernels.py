"""Device builders for the three routing layouts: one stable counting sort, four launches.

Every layout is "sort routes by expert, stably, and place each at base(expert) + rank":
    1. `_route_count_kernel`   per chunk of CHUNK routes: histogram over experts; also fills
                               the layout's output buffers with their empty value (sentinel/-1).
    2. `_route_scan_kernel`    per tile of experts: exclusive scan of the chunk histograms
                               (where each chunk starts inside an expert) and expert totals.
    3. `_route_offsets_kernel` one program: per-expert bases for the layout (padded cumsum for
                               indexed/contiguous; ``g * max_m`` for masked), the device-side
                               counts (num_tokens_post_padded, num_rows, masked_m, num_dropped).
    4. `_route_scatter_kernel` per chunk: rank of each route among same-expert routes earlier
                               in its chunk (a CHUNK x CHUNK comparison), then the stores; its
                               grid also writes the indexed layout's per-block expert ids.
No atomics, so the result is deterministic and identical to the PyTorch reference
(`lowbit.reference.routing`), and nothing is read back to the host (CUDA-graph capturable).

Decode batches of the indexed layout (at most `SMALL_ROUTES` routes) take one launch instead,
`_route_small_kernel`: one program histograms the routes, scans the padded counts, sorts the
keys ``expert * R_PAD + route`` (a stable sort by expert) and places each route at
``padded_base(expert) + (its sorted index - unpadded_base(expert))``. At decode the four
launches above are latency, not work: a MoE layer's routing is 4 of its 6 glue kernels.

Heuristic (why these sizes): CHUNK=128 keeps the rank comparison at 16K lanes a program
(128 a thread at 4 warps); decode (T*top_k <= a few hundred routes) is 1-4 chunks, so the four
launches are latency-bound either way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .layouts import (
    ContiguousRouting,
    IndexedRouting,
    MaskedRouting,
    live_block_bound,
    max_contiguous_rows,
    max_num_tokens_padded,
)
from ..runtime import numerics
from ..runtime.pdl import launch_options, pdl_enabled, release_next, wait_prior

__all__ = ["moe_align_block_size_triton", "build_contiguous_triton", "build_masked_triton", "gather_indexed_rows"]

LAYOUT_INDEXED: tl.constexpr = tl.constexpr(0)
LAYOUT_CONTIGUOUS: tl.constexpr = tl.constexpr(1)
LAYOUT_MASKED: tl.constexpr = tl.constexpr(2)

CHUNK = 128  # routes per program in the count and scatter kernels
FILL = 1024  # buffer entries each program of the count kernel fills
SCAN_CHUNKS = 32  # chunk rows per step of the scan
SCAN_EXPERTS = 32  # experts per scan program
BLOCK_TILE = 32  # indexed blocks per program when writing expert_ids
#: The indexed layout's one-launch path (`_route_small_kernel`) up to this many routes (Kimi
#: decode: 128 tokens x top-8) and this expert padding; the sort and the histogram are one
#: program's registers.
SMALL_ROUTES = 1024
SMALL_E_PAD = 512


@triton.jit
def _route_count_kernel(
    topk_ids_ptr, counts_ptr, num_routes, num_experts,
    fill_a_ptr, fill_a_value, fill_b_ptr, fill_len, num_chunks,
    E_PAD: tl.constexpr, CHUNK: tl.constexpr, FILL: tl.constexpr, HAS_FILL_B: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(topk_ids_ptr + offs, mask=offs < num_routes, other=-1)
    # dropped routes (-1, out of range, past the end) go to the dump bin E_PAD - 1
    ids = tl.where((ids >= 0) & (ids < num_experts), ids, E_PAD - 1)
    hist = tl.histogram(ids, E_PAD)
    bins = tl.arange(0, E_PAD)
    # the grid also covers the fill, so it can be longer than the chunk count
    tl.store(counts_ptr + pid * E_PAD + bins, hist, mask=(bins < E_PAD) & (pid < num_chunks))
    f = pid * FILL + tl.arange(0, FILL)
    tl.store(fill_a_ptr + f, tl.full([FILL], fill_a_value, tl.int32), mask=f < fill_len)
    if HAS_FILL_B:
        tl.store(fill_b_ptr + f, tl.full([FILL], -1, tl.int32), mask=f < fill_len)


@triton.jit
def _route_scan_kernel(
    counts_ptr, chunk_start_ptr, totals_ptr, num_chunks,
    E_PAD: tl.constexpr, SCAN_CHUNKS: tl.constexpr, SCAN_EXPERTS: tl.constexpr,
):
    e = tl.program_id(0) * SCAN_EXPERTS + tl.arange(0, SCAN_EXPERTS)
    running = tl.zeros([SCAN_EXPERTS], tl.int32)
    for c0 in range(0, num_chunks, SCAN_CHUNKS):
        c = c0 + tl.arange(0, SCAN_CHUNKS)
        ptrs = c[:, None] * E_PAD + e[None, :]
        m = c[:, None] < num_chunks
        tile = tl.load(counts_ptr + ptrs, mask=m, other=0)
        inclusive = tl.cumsum(tile, axis=0)
        tl.store(chunk_start_ptr + ptrs, running[None, :] + inclusive - tile, mask=m)
        running += tl.sum(tile, axis=0)
    tl.store(totals_ptr + e, running)


@triton.jit
def _route_offsets_kernel(
    totals_ptr, expert_map_ptr, base_ptr, count_out_ptr, masked_m_ptr, num_experts, align, max_m,
    LAYOUT: tl.constexpr, HAS_MAP: tl.constexpr, E_PAD: tl.constexpr,
):
    e = tl.arange(0, E_PAD)
    real = e < num_experts
    n = tl.load(totals_ptr + e, mask=real, other=0)
    if HAS_MAP:
        local = tl.load(expert_map_ptr + e, mask=real, other=-1)
    else:
        local = tl.where(real, e, -1)
    if LAYOUT == LAYOUT_MASKED:
        # base = g * max_m; the scatter drops ranks >= max_m and they are counted here
        tl.store(base_ptr + e, local * max_m)
        tl.store(masked_m_ptr + local, tl.minimum(n, max_m), mask=local >= 0)
        tl.store(count_out_ptr, tl.sum(tl.where(local >= 0, tl.maximum(n - max_m, 0), 0), axis=0))
    else:
        if LAYOUT == LAYOUT_CONTIGUOUS:
            n = tl.where(local >= 0, n, 0)  # non-local routes take no rows
        padded = (n + align - 1) // align * align
        end = tl.cumsum(padded, axis=0)
        tl.store(base_ptr + e, end - padded)
        tl.store(count_out_ptr, tl.sum(padded, axis=0))


@triton.jit
def _route_scatter_kernel(
    topk_ids_ptr, chunk_start_ptr, base_ptr, expert_map_ptr,
    out_a_ptr, out_b_ptr, route_to_row_ptr, expert_ids_ptr,
    num_routes, num_experts, num_chunks, max_m, block_size, num_blocks, padded_count_ptr,
    LAYOUT: tl.constexpr, HAS_MAP: tl.constexpr, E_PAD: tl.constexpr,
    CHUNK: tl.constexpr, BLOCK_TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < num_chunks:
        i = tl.arange(0, CHUNK)
        route = pid * CHUNK + i
        ids = tl.load(topk_ids_ptr + route, mask=route < num_routes, other=-1)
        valid = (ids >= 0) & (ids < num_experts) & (route < num_routes)
        e = tl.where(valid, ids, E_PAD - 1)
        # stable rank inside the chunk: same-expert routes strictly before this one
        same = (e[None, :] == e[:, None]) & (i[None, :] < i[:, None])
        rank = tl.sum(same.to(tl.int32), axis=1)
        start = tl.load(chunk_start_ptr + pid * E_PAD + e)
        row = tl.load(base_ptr + e) + start + rank
        if HAS_MAP:
            local = tl.load(expert_map_ptr + e, mask=valid, other=-1)
        else:
            local = e
        if LAYOUT == LAYOUT_INDEXED:
            tl.store(out_a_ptr + row, route, mask=valid)
        else:
            keep = valid & (local >= 0)
            if LAYOUT == LAYOUT_MASKED:
                keep = keep & (start + rank < max_m)
            else:
                tl.store(out_a_ptr + row, local, mask=keep)  # m_indices
            tl.store(out_b_ptr + row, route, mask=keep)  # row_to_route
            tl.store(route_to_row_ptr + route, tl.where(keep, row, -1), mask=route < num_routes)
    if LAYOUT == LAYOUT_INDEXED:
        # expert of each block: the expert whose padded segment contains the block's first slot
        b = pid * BLOCK_TILE + tl.arange(0, BLOCK_TILE)
        slot = b * block_size
        ex = tl.arange(0, E_PAD)
        seg_start = tl.load(base_ptr + ex, mask=ex < num_experts, other=2147483647)
        owner = tl.sum((seg_start[None, :] <= slot[:, None]).to(tl.int32), axis=1) - 1
        owner = tl.maximum(owner, 0)
        if HAS_MAP:
            owner_local = tl.load(expert_map_ptr + owner)
        else:
            owner_local = owner
        total = tl.load(padded_count_ptr)
        tl.store(expert_ids_ptr + b, tl.where(slot < total, owner_local, -1), mask=b < num_blocks)


@triton.jit
def _route_small_kernel(
    topk_ids_ptr, expert_map_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr,
    num_routes, num_experts, block_size, size, num_blocks,
    HAS_MAP: tl.constexpr, R_PAD: tl.constexpr, E_PAD: tl.constexpr, FILL: tl.constexpr, PDL: tl.constexpr = False,
):
    """The whole indexed layout in one program for ``num_routes <= R_PAD``: empty values, then
    every valid route at ``padded_base(e) + rank``, the first route of each block writing its
    expert id, and the padded count. Stable: the sort key is ``expert * R_PAD + route``."""
    if PDL:  # launched with it (`pdl`): wait on the router's kernel first, then let gate_up start
        wait_prior()
        release_next()
    fill = tl.arange(0, FILL)
    for f0 in range(0, size, FILL):
        tl.store(sorted_ids_ptr + f0 + fill, tl.zeros([FILL], tl.int32) + num_routes, mask=f0 + fill < size)
    for b0 in range(0, num_blocks, FILL):
        tl.store(expert_ids_ptr + b0 + fill, tl.full([FILL], -1, tl.int32), mask=b0 + fill < num_blocks)
    r = tl.arange(0, R_PAD)
    ids = tl.load(topk_ids_ptr + r, mask=r < num_routes, other=-1)
    # dropped routes (-1, out of range) and the padding past num_routes: the dump bin, sorted last
    bins = tl.where((ids >= 0) & (ids < num_experts), ids, E_PAD - 1)
    counts = tl.histogram(bins, E_PAD)
    counts = tl.where(tl.arange(0, E_PAD) < num_experts, counts, 0)
    padded = (counts + block_size - 1) // block_size * block_size
    padded_base = tl.cumsum(padded, 0) - padded
    first = tl.cumsum(counts, 0) - counts  # index of each expert's first route in sorted order
    key = tl.sort(bins * R_PAD + r, 0)
    e = key // R_PAD
    live = e < num_experts
    rank = r - tl.gather(first, e, 0)
    pos = tl.gather(padded_base, e, 0) + rank
    tl.debug_barrier()  # every empty value stored before the routes overwrite theirs
    tl.store(sorted_ids_ptr + pos, key % R_PAD, mask=live)
    if HAS_MAP:
        local = tl.load(expert_map_ptr + e, mask=live, other=-1)
    else:
        local = e
    tl.store(expert_ids_ptr + pos // block_size, local, mask=live & (rank % block_size == 0))
    tl.store(ntpp_ptr, tl.sum(padded, 0))


def _e_pad(num_experts: int) -> int:
    # +1 for the dump bin of dropped routes; >= 32 so the scan tiles divide it
    return max(triton.next_power_of_2(num_experts + 1), SCAN_EXPERTS)


def _r_pad(num_routes: int) -> int:
    # a few compiled sizes: 128, 256, 512, 1024
    return max(triton.next_power_of_2(num_routes), CHUNK)


def _sort_routes(topk_ids, num_experts, fill_a, fill_a_value, fill_b):
    """Launch kernels 1-2 (histograms + buffer fill, chunk scan); returns
    (chunk_start, totals, base (filled by kernel 3), e_pad, num_chunks)."""
    dev = topk_ids.device
    num_routes = topk_ids.numel()
    e_pad = _e_pad(num_experts)
    num_chunks = max(triton.cdiv(num_routes, CHUNK), 1)
    counts = torch.empty((num_chunks, e_pad), dtype=torch.int32, device=dev)
    chunk_start = torch.empty_like(counts)
    totals = torch.empty(e_pad, dtype=torch.int32, device=dev)
    base = torch.empty(e_pad, dtype=torch.int32, device=dev)
    fill_len = fill_a.numel()
    grid1 = max(num_chunks, triton.cdiv(fill_len, FILL))
    _route_count_kernel[(grid1,)](
        topk_ids, counts, num_routes, num_experts, fill_a, fill_a_value,
        fill_b if fill_b is not None else fill_a, fill_len, num_chunks,
        E_PAD=e_pad, CHUNK=CHUNK, FILL=FILL, HAS_FILL_B=fill_b is not None,
    )
    _route_scan_kernel[(e_pad // SCAN_EXPERTS,)](
        counts, chunk_start, totals, num_chunks,
        E_PAD=e_pad, SCAN_CHUNKS=SCAN_CHUNKS, SCAN_EXPERTS=SCAN_EXPERTS,
    )
    return chunk_start, totals, base, e_pad, num_chunks


def moe_align_block_size_triton(
    topk_ids: torch.Tensor, block_size: int, num_experts: int, expert_map: torch.Tensor | None = None
) -> IndexedRouting:
    """Device version of `lowbit.reference.routing.moe_align_block_size_ref` (same outputs)."""
    dev = topk_ids.device
    num_routes = topk_ids.numel()
    size = max_num_tokens_padded(num_routes, num_experts, block_size)
    sorted_ids = torch.empty(size, dtype=torch.int32, device=dev)
    num_blocks = size // block_size
    expert_ids = torch.empty(num_blocks, dtype=torch.int32, device=dev)
    ntpp = torch.empty(1, dtype=torch.int32, device=dev)
    if num_routes <= SMALL_ROUTES and _e_pad(num_experts) <= SMALL_E_PAD:
        pdl = pdl_enabled(dev)
        _route_small_kernel[(1,)](
            topk_ids, expert_map if expert_map is not None else topk_ids, sorted_ids, expert_ids, ntpp,
            num_routes, num_experts, block_size, size, num_blocks,
            HAS_MAP=expert_map is not None, R_PAD=_r_pad(num_routes), E_PAD=_e_pad(num_experts), FILL=FILL,
            PDL=pdl, **launch_options(pdl),
        )
        return IndexedRouting(sorted_ids, expert_ids, ntpp, block_size, topk_ids.shape[0], topk_ids.shape[1])
    chunk_start, totals, base, e_pad, num_chunks = _sort_routes(topk_ids, num_experts, sorted_ids, num_routes, None)
    emap = expert_map if expert_map is not None else totals  # dummy pointer when HAS_MAP=False
    _route_offsets_kernel[(1,)](
        totals, emap, base, ntpp, ntpp, num_experts, block_size, 0,
        LAYOUT=0, HAS_MAP=expert_map is not None, E_PAD=e_pad,
    )
    grid = max(num_chunks, triton.cdiv(num_blocks, BLOCK_TILE))
    _route_scatter_kernel[(grid,)](
        topk_ids, chunk_start, base, emap, sorted_ids, sorted_ids, sorted_ids, expert_ids,
        num_routes, num_experts, num_chunks, 0, block_size, num_blocks, ntpp,
        LAYOUT=0, HAS_MAP=expert_map is not None, E_PAD=e_pad, CHUNK=CHUNK, BLOCK_TILE=BLOCK_TILE,
    )
    return IndexedRouting(sorted_ids, expert_ids, ntpp, block_size, topk_ids.shape[0], topk_ids.shape[1])


def build_contiguous_triton(
    topk_ids: torch.Tensor, num_experts: int, num_local_experts: int,
    expert_map: torch.Tensor | None = None, alignment: int = 128,
) -> ContiguousRouting:
    """Device version of `lowbit.reference.routing.build_contiguous_ref` (same outputs)."""
    dev = topk_ids.device
    num_routes = topk_ids.numel()
    size = max_contiguous_rows(num_routes, num_local_experts, alignment)
    m_indices = torch.empty(size, dtype=torch.int32, device=dev)
    row_to_route = torch.empty(size, dtype=torch.int32, device=dev)
    route_to_row = torch.empty(num_routes, dtype=torch.int32, device=dev)
    num_rows = torch.empty(1, dtype=torch.int32, device=dev)
    chunk_start, totals, base, e_pad, num_chunks = _sort_routes(topk_ids, num_experts, m_indices, -1, row_to_route)
    emap = expert_map if expert_map is not None else totals
    _route_offsets_kernel[(1,)](
        totals, emap, base, num_rows, num_rows, num_experts, alignment, 0,
        LAYOUT=1, HAS_MAP=expert_map is not None, E_PAD=e_pad,
    )
    _route_scatter_kernel[(num_chunks,)](
        topk_ids, chunk_start, base, emap, m_indices, row_to_route, route_to_row, m_indices,
        num_routes, num_experts, num_chunks, 0, 1, 0, num_rows,
        LAYOUT=1, HAS_MAP=expert_map is not None, E_PAD=e_pad, CHUNK=CHUNK, BLOCK_TILE=BLOCK_TILE,
    )
    return ContiguousRouting(m_indices, row_to_route, route_to_row, num_rows, alignment,
                             topk_ids.shape[0], topk_ids.shape[1])


def build_masked_triton(
    topk_ids: torch.Tensor, num_experts: int, num_local_experts: int, max_m: int,
    expert_map: torch.Tensor | None = None,
) -> MaskedRouting:
    """Device version of `lowbit.reference.routing.build_masked_ref`; routes past `max_m` on an
    expert are dropped and counted in ``num_dropped`` (the reference raises instead)."""
    dev = topk_ids.device
    num_routes = topk_ids.numel()
    masked_m = torch.zeros(num_local_experts, dtype=torch.int32, device=dev)
    row_to_route = torch.empty(num_local_experts * max_m, dtype=torch.int32, device=dev)
    route_to_row = torch.empty(num_routes, dtype=torch.int32, device=dev)
    num_dropped = torch.empty(1, dtype=torch.int32, device=dev)
    chunk_start, totals, base, e_pad, num_chunks = _sort_routes(topk_ids, num_experts, row_to_route, -1, None)
    emap = expert_map if expert_map is not None else totals
    _route_offsets_kernel[(1,)](
        totals, emap, base, num_dropped, masked_m, num_experts, 1, max_m,
        LAYOUT=2, HAS_MAP=expert_map is not None, E_PAD=e_pad,
    )
    _route_scatter_kernel[(num_chunks,)](
        topk_ids, chunk_start, base, emap, row_to_route, row_to_route, route_to_row, row_to_route,
        num_routes, num_experts, num_chunks, max_m, 1, 0, num_dropped,
        LAYOUT=2, HAS_MAP=expert_map is not None, E_PAD=e_pad, CHUNK=CHUNK, BLOCK_TILE=BLOCK_TILE,
    )
    return MaskedRouting(masked_m, row_to_route, route_to_row, num_dropped, max_m,
                         topk_ids.shape[0], topk_ids.shape[1])


@triton.jit
def _gather_indexed_rows_kernel(a_ptr, out_ptr, sorted_ids_ptr, expert_ids_ptr, ntpp_ptr, K, num_routes, top_k,
                                stride_am, stride_om, BLOCK: tl.constexpr, ROWS: tl.constexpr, BK: tl.constexpr,
                                SILU_MUL: tl.constexpr = False, PDL: tl.constexpr = False):
    """Program (p, k): rows ``p*ROWS ..`` of the slots, K columns ``k*BK ..``: out[slot] =
    a[sorted_ids[slot] // top_k] for every route slot of a live block (`BLOCK`: the routing's
    block size, a multiple of ROWS). `SILU_MUL`: `a` is a gate_up output ``[R, 2K]`` (gate, then
    up) and out[slot] = bf16(SiLU(gate) * up) of that row, in FP32 (`numerics.silu_mul`)."""
    if PDL:  # nothing is read before the wait: the next kernel may start at once (`pdl`)
        release_next()
        wait_prior()
    pid = tl.program_id(0)
    slot0 = pid * ROWS
    e = tl.load(expert_ids_ptr + slot0 // BLOCK)
    if (slot0 >= tl.load(ntpp_ptr)) | (e < 0):  # past the padded count, or another rank's expert
        return
    ids = tl.load(sorted_ids_ptr + slot0 + tl.arange(0, ROWS))
    ok = ids < num_routes
    src = tl.where(ok, ids // top_k, 0).to(tl.int64) * stride_am
    dst = (slot0 + tl.arange(0, ROWS)).to(tl.int64) * stride_om
    k = tl.program_id(1) * BK + tl.arange(0, BK)
    mask = ok[:, None] & (k < K)[None, :]
    x = tl.load(a_ptr + src[:, None] + k[None, :], mask=mask)
    if SILU_MUL:
        u = tl.load(a_ptr + src[:, None] + K + k[None, :], mask=mask)
        x = numerics.to_bf16(numerics.silu_mul(x.to(tl.float32), u.to(tl.float32)))
    tl.store(out_ptr + dst[:, None] + k[None, :], x, mask=mask)


#: `gather_indexed_rows`' program: ROWS slots x BK columns (16 KB of bf16 at 4 warps: 16-byte
#: accesses, 8 a thread).
_GATHER_ROWS = 32
_GATHER_BK = 256
_GATHER_WARPS = 4


def gather_indexed_rows(a: torch.Tensor, sorted_ids: torch.Tensor, expert_ids: torch.Tensor, ntpp: torch.Tensor,
                        top_k: int, out: torch.Tensor | None = None, *, silu_mul: bool = False) -> torch.Tensor:
    """The activation rows in the indexed layout's slot order: ``out[s] = a[sorted_ids[s] // top_k]``
    for every route slot ``s`` of a live block (before ``ntpp[0]``, expert id >= 0); sentinel
    slots and the other blocks' rows are left as they were (unspecified in a new buffer).

    a: ``[M, K]`` (any dtype, contiguous along K); sorted_ids ``int32 [P]``, expert_ids ``int32
    [P / B]``, ntpp ``int32 [1]`` (`lowbit.routing.moe_align_block_size`, block size B a multiple
    of 32); out optional ``[P, K]`` of a's dtype. Returns out. No host readback (CUDA-graph
    capturable). Why: a kernel that then reads a routing block's rows as one TMA box instead of
    gathering them row by row (`w4a16_indexed`'s pre-gathered engine).

    ``silu_mul=True``: `a` is a gate_up output ``bf16 [M, 2K]`` (gate columns, then up) and
    ``out[s] = bf16(SiLU(gate) * up)`` of its row (`moe_elementwise.silu_mul` with a routing:
    the SiLU and the down projection's gather in one pass)."""
    num_routes = a.shape[0] * top_k
    if sorted_ids.numel() % max(expert_ids.numel(), 1):
        raise ValueError(f"sorted_ids ({sorted_ids.numel()}) must be whole blocks of expert_ids ({expert_ids.numel()})")
    block = sorted_ids.numel() // expert_ids.numel()
    if block % _GATHER_ROWS:
        raise ValueError(f"gather_indexed_rows: the routing block size must be a multiple of {_GATHER_ROWS}, got {block}")
    if a.stride(1) != 1:
        raise ValueError("a must be contiguous along K")
    k = a.shape[1]
    if silu_mul:
        if a.dtype != torch.bfloat16 or k % 2:
            raise ValueError(f"silu_mul: a must be a bf16 gate_up output [M, 2I], got {a.dtype} {tuple(a.shape)}")
        k //= 2
    if out is None:
        out = torch.empty(sorted_ids.numel(), k, dtype=a.dtype, device=a.device)
    elif out.dtype != a.dtype or tuple(out.shape) != (sorted_ids.numel(), k) or out.stride(1) != 1:
        raise ValueError(f"out must be {a.dtype} [{sorted_ids.numel()}, {k}] contiguous along K, got {out.dtype} "
                         f"{tuple(out.shape)}")
    slots = live_block_bound(expert_ids.numel(), num_routes) * block
    pdl = silu_mul and pdl_enabled(a.device)  # between two PDL GEMMs in `moe_experts`
    _gather_indexed_rows_kernel[(slots // _GATHER_ROWS, triton.cdiv(k, _GATHER_BK))](
        a, out, sorted_ids, expert_ids, ntpp, k, num_routes, top_k, a.stride(0), out.stride(0),
        BLOCK=block, ROWS=_GATHER_ROWS, BK=_GATHER_BK, SILU_MUL=silu_mul, PDL=pdl, num_warps=_GATHER_WARPS,
        **launch_options(pdl))
    return out


def compile_configs():
    """Every configuration the builders launch, for the compile tier: expert-count paddings of
    the Kimi K2.x profiles (48 local -> 64, 384 global -> 512) x layouts x expert_map; the
    one-launch indexed path at its smallest and largest route padding."""
    from ..runtime.kernel_config import KernelConfig

    cfgs = []
    for e_pad in (64, 512):
        cfgs.append(KernelConfig(
            f"route_count[E_PAD={e_pad}]", _route_count_kernel,
            {"topk_ids_ptr": "*i32", "counts_ptr": "*i32", "num_routes": "i32", "num_experts": "i32",
             "fill_a_ptr": "*i32", "fill_a_value": "i32", "fill_b_ptr": "*i32", "fill_len": "i32",
             "num_chunks": "i32", "E_PAD": "constexpr", "CHUNK": "constexpr", "FILL": "constexpr",
             "HAS_FILL_B": "constexpr"},
            {"E_PAD": e_pad, "CHUNK": CHUNK, "FILL": FILL, "HAS_FILL_B": True}))
        cfgs.append(KernelConfig(
            f"route_scan[E_PAD={e_pad}]", _route_scan_kernel,
            {"counts_ptr": "*i32", "chunk_start_ptr": "*i32", "totals_ptr": "*i32", "num_chunks": "i32",
             "E_PAD": "constexpr", "SCAN_CHUNKS": "constexpr", "SCAN_EXPERTS": "constexpr"},
            {"E_PAD": e_pad, "SCAN_CHUNKS": SCAN_CHUNKS, "SCAN_EXPERTS": SCAN_EXPERTS}))
        for layout in (0, 1, 2):
            for has_map in (False, True):
                tag = f"[E_PAD={e_pad},layout={layout},map={int(has_map)}]"
                cfgs.append(KernelConfig(
                    "route_offsets" + tag, _route_offsets_kernel,
                    {"totals_ptr": "*i32", "expert_map_ptr": "*i32", "base_ptr": "*i32", "count_out_ptr": "*i32",
                     "masked_m_ptr": "*i32", "num_experts": "i32", "align": "i32", "max_m": "i32",
                     "LAYOUT": "constexpr", "HAS_MAP": "constexpr", "E_PAD": "constexpr"},
                    {"LAYOUT": layout, "HAS_MAP": has_map, "E_PAD": e_pad}))
                cfgs.append(KernelConfig(
                    "route_scatter" + tag, _route_scatter_kernel,
                    {"topk_ids_ptr": "*i32", "chunk_start_ptr": "*i32", "base_ptr": "*i32", "expert_map_ptr": "*i32",
                     "out_a_ptr": "*i32", "out_b_ptr": "*i32", "route_to_row_ptr": "*i32", "expert_ids_ptr": "*i32",
                     "num_routes": "i32", "num_experts": "i32", "num_chunks": "i32", "max_m": "i32",
                     "block_size": "i32", "num_blocks": "i32", "padded_count_ptr": "*i32",
                     "LAYOUT": "constexpr", "HAS_MAP": "constexpr", "E_PAD": "constexpr", "CHUNK": "constexpr",
                     "BLOCK_TILE": "constexpr"},
                    {"LAYOUT": layout, "HAS_MAP": has_map, "E_PAD": e_pad, "CHUNK": CHUNK, "BLOCK_TILE": BLOCK_TILE}))
        for r_pad in (128, 1024):
            for has_map in (False, True):
                cfgs.append(KernelConfig(
                    f"route_small[R_PAD={r_pad},E_PAD={e_pad},map={int(has_map)}]", _route_small_kernel,
                    {"topk_ids_ptr": "*i32", "expert_map_ptr": "*i32", "sorted_ids_ptr": "*i32",
                     "expert_ids_ptr": "*i32", "ntpp_ptr": "*i32", "num_routes": "i32", "num_experts": "i32",
                     "block_size": "i32", "size": "i32", "num_blocks": "i32", "HAS_MAP": "constexpr",
                     "R_PAD": "constexpr", "E_PAD": "constexpr", "FILL": "constexpr", "PDL": "constexpr"},
                    {"HAS_MAP": has_map, "R_PAD": r_pad, "E_PAD": e_pad, "FILL": FILL, "PDL": True},
                    expect_ptx=("griddepcontrol.wait", "griddepcontrol.launch_dependents")))
    for block in (64, 128):
        for silu in (False, True):  # the SiLU form: `moe_experts`' down input (PDL, as it launches there)
            cfgs.append(KernelConfig(
                f"gather_indexed_rows[BLOCK={block},SILU_MUL={int(silu)}]", _gather_indexed_rows_kernel,
                {"a_ptr": "*bf16", "out_ptr": "*bf16", "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32",
                 "ntpp_ptr": "*i32", "K": "i32", "num_routes": "i32", "top_k": "i32", "stride_am": "i32",
                 "stride_om": "i32", "BLOCK": "constexpr", "ROWS": "constexpr", "BK": "constexpr",
                 "SILU_MUL": "constexpr", "PDL": "constexpr"},
                {"BLOCK": block, "ROWS": _GATHER_ROWS, "BK": _GATHER_BK, "SILU_MUL": silu, "PDL": silu},
                num_warps=_GATHER_WARPS, unaligned=("num_routes", "top_k"),
                expect_ptx=("griddepcontrol.wait", "griddepcontrol.launch_dependents") if silu else ()))
    return cfgs
