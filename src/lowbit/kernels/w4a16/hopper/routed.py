"""The indexed layout's routing blocks in Gluon: whether a block runs and its expert, which slots
hold routes and their activation rows (row ``id // top_k`` of route ``id``), the cp.async gather
of those rows into the activation ring (sentinels and the K tail zero-filled), and the store
of a tile to its routes' output rows (times the routing weights when asked).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .common import stage_boxes, transposed

__all__ = ["block_expert", "gather_async", "gather_boxes", "gather_layout", "gathered_rows", "indexed_store",
           "routed_rows"]


@gluon.jit
def block_expert(ntpp_ptr, expert_ids_ptr, pid_m, BR: gl.constexpr):
    """(expert, runs) of indexed routing block `pid_m`; `runs` is False past the device-side
    padded count and on another rank's expert (``-1``, EP). The count and the expert id are
    loaded side by side and tested once: one global-load latency before the first TMA instead
    of two."""
    ntpp = gl.load(ntpp_ptr)
    e = gl.load(expert_ids_ptr + pid_m)  # in bounds: the grid has at most the buffer's blocks
    return e, (pid_m * BR < ntpp) & (e >= 0)


@gluon.jit
def routed_rows(a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k, stride_am, BR: gl.constexpr,
                 rows_l: gl.constexpr):
    """Routing block `pid_m`'s rows in the 1-D layout `rows_l`: which slots hold routes
    (sentinels do not) and the row pointers ``a[id // top_k]`` (sentinels point at row 0)."""
    ids = gl.load(sorted_ids_ptr + pid_m * BR + gl.arange(0, BR, layout=rows_l))
    row_ok = ids < num_routes
    return row_ok, a_ptr + gl.where(row_ok, ids // top_k, 0).to(gl.int64) * stride_am


@gluon.jit
def gathered_rows(a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k, stride_am, BR: gl.constexpr, x_l: gl.constexpr):
    """`routed_rows` for the cp.async gather's 3-D ``[8, BR, 32]`` layout `x_l` (`gather_layout`):
    ``[1, BR, 1]`` row flags and row pointers."""
    row_ok, a_rows = routed_rows(a_ptr, sorted_ids_ptr, pid_m, num_routes, top_k, stride_am, BR,
                                  gl.SliceLayout(0, gl.SliceLayout(2, x_l)))
    return row_ok[None, :, None], a_rows[None, :, None]


@gluon.jit
def gather_boxes(boxes, a_rows, row_ok, kt, K, x_l: gl.constexpr, g0: gl.constexpr = 0, K_TAIL: gl.constexpr = True):
    """cp.async of the routed activation rows into `boxes`, a ``[G, BR, 32]`` view
    (`stage_boxes`): box i gets group ``g0 + i`` of K step `kt` (K ``256kt + 32(g0 + i) ..``), in
    one copy op; masked rows and K past the end are zero-filled, so sentinel slots and the K tail
    multiply as zeros. No registers hold the rows. One op, not one a group: Triton's barrier pass
    orders every shared-memory write after the previous one, so eight ops would cost eight CTA
    barriers a step. `a_rows`, `row_ok`: ``[1, BR, 1]`` (`gathered_rows`). The rows must be
    16-byte aligned (the op checks). Without K_TAIL (K a multiple of 256,
    `tiles.RegisterATile.even_k`) only the rows are masked."""
    G: gl.constexpr = boxes.shape[0]
    g = gl.arange(0, G, layout=gl.SliceLayout(1, gl.SliceLayout(2, x_l)))[:, None, None] + g0
    j = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, x_l)))[None, None, :]
    k0 = kt * 256 + g * 32  # K is a multiple of 32 (group size): a group is all in or all out
    if K_TAIL:
        async_copy.async_copy_global_to_shared(boxes, a_rows + (k0 + j), mask=row_ok & (k0 < K))
    else:
        async_copy.async_copy_global_to_shared(boxes, a_rows + (k0 + j), mask=row_ok)


@gluon.jit
def gather_async(xs, st, a_rows, row_ok, kt, K, x_l: gl.constexpr, K_TAIL: gl.constexpr = True):
    """`gather_boxes` of K step `kt` into stage `st` of the ring `xs` (eight ``[BR, 32]`` boxes)."""
    gather_boxes(stage_boxes(xs, st), a_rows, row_ok, kt, K, x_l, 0, K_TAIL)


@gluon.jit
def indexed_store(acc, c_ptr, sorted_ids_ptr, topk_w_ptr, pid_m, n0, N, num_routes, stride_cm,
                   MUL_WEIGHT: gl.constexpr, num_warps: gl.constexpr):
    """Store ``acc[i, r] = out[ids[r], n0 + i]`` (times the routing weight with MUL_WEIGHT);
    sentinel slots unwritten. `c_ptr`: bf16 output, or an FP32 split-K share's rows."""
    mma: gl.constexpr = acc.type.layout
    BR: gl.constexpr = acc.shape[1]
    if MUL_WEIGHT:
        wid = gl.load(sorted_ids_ptr + pid_m * BR + gl.arange(0, BR, layout=gl.SliceLayout(0, mma)))
        acc = acc * gl.load(topk_w_ptr + wid, mask=wid < num_routes, other=0.0)[None, :]
    out = transposed(acc, num_warps, c_ptr.dtype.element_ty)
    st_l: gl.constexpr = out.type.layout
    oid = gl.load(sorted_ids_ptr + pid_m * BR + gl.arange(0, BR, layout=gl.SliceLayout(1, st_l)))
    on = n0 + gl.arange(0, out.shape[1], layout=gl.SliceLayout(0, st_l))
    c = c_ptr + oid[:, None].to(gl.int64) * stride_cm + on[None, :]
    gl.store(c, out, mask=(oid < num_routes)[:, None] & (on < N)[None, :])


def gather_layout(br: int, num_warps: int, wide_pieces: bool = False) -> gl.BlockedLayout:
    """The cp.async gather's layout for a stage's ``[8, br, 32]`` bf16 boxes.

    Default: every thread a distinct piece of each box (16 bytes when the box is big enough,
    4-8 bytes for small routing blocks), warps along the rows; a thread copies several rows
    when 8 elements a thread do not cover the box, and the same piece of all eight boxes.
    `wide_pieces` (the group-loop tiles, `tiles.GROUP_LOOP_MAXNREG`): 16-byte pieces always, a
    row's four in four lanes, up to eight rows a warp, warps along the rows while there are rows
    left, then along the boxes; an 8- or 16-row block then copies 2 or 4 pieces a thread a step
    instead of 8. Not for the whole-step loop tiles: they then take 167-175 registers, one CTA
    an SM fewer.
    H200, 2026-11-30, 174a529: group-loop tiles 1.01-1.07x at 1-50 tokens; one-token gate_up 64x8x3 49.5 -> 56.7."""
    if wide_pieces:
        tr = min(br, 8)  # lanes along the rows
        wr = min(num_warps, max(1, br // tr))  # warps along the rows
        return gl.BlockedLayout([1, 1, 8], [8 // tr, tr, 4], [num_warps // wr, wr, 1], [2, 1, 0])
    vec = max(2, min(8, br * 32 // (32 * num_warps)))
    return gl.BlockedLayout([1, 1, vec], [1, 32 * vec // 32, 32 // vec], [1, num_warps, 1], [2, 1, 0])
