"""Build a variant of `lowbit.kernels.w4a16_sm90` by exact text edits, as its own module in a
temporary folder: the probes' way to ask "how fast would this kernel be without X" without
adding switches to the library. Each edit must match once, so a probe fails loudly when the
kernel source moves on."""
import importlib.util
import os
import sys
import tempfile

import lowbit.kernels.w4a16_sm90 as _orig

_DIR = tempfile.mkdtemp(prefix="lowbit_probe_")
with open(_orig.__file__) as _f:
    _BASE = _f.read()
_BASE = _BASE.replace("from .int4_dequant import", "from lowbit.kernels.int4_dequant import")
_BASE = _BASE.replace("from .compile_tier import", "from lowbit.kernels.compile_tier import")

#: Dequantization replaced by register moves (garbage weights, no ALU work).
NO_DEQUANT = ('return gl.inline_asm_elementwise(DEQUANT_PAIR_PTX, "=h,=h,r,h,h", [words, s_lo, s_hi],',
              'return gl.inline_asm_elementwise("mov.b32 {$0, $1}, $2;", "=h,=h,r,h,h", [words, s_lo, s_hi],')
#: Grouped kernels: activation TMA only for the first two steps (stale activations after).
NO_ACT_LOADS = ("""        mbarrier.expect(bar, step_bytes_x, pred=pred)
        _load_weight_step(w_desc, s_desc, wrow, srow, n0, kt, bar, wring, sring, st, pred)
        for g in gl.static_range(_GROUPS):
            tma.async_copy_global_to_shared(x_desc, [r0, kt * 256 + g * 32], bar, xs.index(st * _GROUPS + g), pred=pred)""",
                """        step_bytes_w: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes
        mbarrier.expect(bar, step_bytes_x, pred=pred & (kt < 2))
        mbarrier.expect(bar, step_bytes_w, pred=pred & (kt >= 2))
        _load_weight_step(w_desc, s_desc, wrow, srow, n0, kt, bar, wring, sring, st, pred)
        for g in gl.static_range(_GROUPS):
            tma.async_copy_global_to_shared(x_desc, [r0, kt * 256 + g * 32], bar, xs.index(st * _GROUPS + g),
                                            pred=pred & (kt < 2))""")
#: Indexed kernel: no cp.async gather of the routed rows.
NO_GATHER = ("_gather_async(xs, st, a_rows, row_ok & pred, kt, K, x_l)",
             "_gather_async(xs, st, a_rows, row_ok & pred & (kt < 0), kt, K, x_l)")
#: No wgmma (the dequantization then dies as dead code): the TMA + barrier skeleton alone.
NO_MMA = ("    acc = warpgroup_mma(w0, xs.index(s * _GROUPS + 0).permute((1, 0)), acc, is_async=True)",
          "    return acc\n    acc = warpgroup_mma(w0, xs.index(s * _GROUPS + 0).permute((1, 0)), acc, is_async=True)")
#: Words and scales read from a tiled copy: each 64-row x 256-K step one contiguous block
#: (words ``[E, N/64, nk, 64, 32]``, scales ``[E, N/64, nk, 8, 64]``; 64-row tiles only).
TILED_WEIGHTS = [
    ("tma.async_copy_global_to_shared(w_desc, [wrow, kt * 32], bar, wring.index(st), pred=pred)",
     "tma.async_copy_global_to_shared(w_desc, [wrow + kt * 64, 0], bar, wring.index(st), pred=pred)"),
    ("    nk = gl.cdiv(K, 256)\n    for i in gl.static_range(STAGES):\n        _load_step(x_desc, a_rows",
     ("    nk = gl.cdiv(K, 256)\n    tid = wrow // 64\n    wrow = tid * nk * 64\n    srow = tid * nk * 8\n"
      "    n0 = n0 * 0\n    for i in gl.static_range(STAGES):\n        _load_step(x_desc, a_rows")),
]


def variant(name: str, edits: list[tuple[str, str]]):
    """The module `w4a16_sm90` with each ``(old, new)`` edit applied (each must match once)."""
    src = _BASE
    for old, new in edits:
        if src.count(old) != 1:
            raise RuntimeError(f"probe variant {name!r}: an edit matches {src.count(old)} times, not once")
        src = src.replace(old, new)
    path = os.path.join(_DIR, f"w4a16_sm90_{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"w4a16_sm90_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
