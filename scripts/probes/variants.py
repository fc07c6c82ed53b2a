"""Build a variant of the `lowbit.kernels.w4a16.hopper` package by exact text edits, as its own
package in a temporary folder: the probes' way to ask "how fast would this kernel be without X"
without adding switches to the library. Each edit must match once across the package's modules,
so a probe fails loudly when the kernel source moves on. `tile_form` and `patch_all` change a
tile's record or a module-level name in memory instead (no copy)."""
import contextlib
import dataclasses
import importlib
import importlib.util
import os
import re
import sys
import tempfile
import types

import lowbit.kernels.w4a16.hopper as _pkg
from lowbit.kernels.w4a16 import heuristics, tiles

_DIR = tempfile.mkdtemp(prefix="lowbit_probe_")
_PKG_DIR = os.path.dirname(_pkg.__file__)
#: the package's modules, in import order
MODULES = ("common", "routed", "mainloop", "warp_specialized", "grouped", "indexed", "nloop")
_NAME = _pkg.__name__


def sources(folder: str = _PKG_DIR) -> dict[str, str]:
    """{module: source} of a version of the package in `folder` (default: the installed one; another
    version e.g. from ``git archive REV src/lowbit/kernels/w4a16/hopper | tar -x -C scratch``), with
    the Gluon INT4 helpers beside it (``../int4_gluon.py``) as module ``int4_gluon`` of the copy."""
    srcs = {m: open(os.path.join(folder, f"{m}.py")).read() for m in MODULES}
    with open(os.path.join(folder, os.pardir, "int4_gluon.py")) as f:
        srcs["int4_gluon"] = f.read()
    return srcs


#: Dequantization replaced by register moves (garbage weights, no ALU work): the register-A
#: kernels' `int4_gluon.dequant_byte` (every production Gluon engine).
NO_DEQUANT = ('return gl.inline_asm_elementwise(PTX, "=r,=r,r,r,r,r,r,r,r,r,r,r", [words, f_even, f_odd, c_even, c_odd],',
              'return gl.inline_asm_elementwise("mov.b32 $0, $2; mov.b32 $1, $3;", "=r,=r,r,r,r,r,r,r,r,r,r,r", '
              '[words, f_even, f_odd, c_even, c_odd],')
#: Grouped kernels: the activation TMA only for the first two steps (stale activations after);
#: later steps arrive on the barrier without data, so the consumers' waits still pass.
NO_ACT_LOADS = [
    ("""        mbarrier.expect(bar, x_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(x_desc, [kt * GROUPS, r0, 0], bar, stage_boxes(xs, st), pred=pred)""",
     """        mbarrier.expect(bar, x_desc.block_type.nbytes, pred=pred & (kt < 2))
        tma.async_copy_global_to_shared(x_desc, [kt * GROUPS, r0, 0], bar, stage_boxes(xs, st), pred=pred & (kt < 2))
        mbarrier.arrive(bar, pred=pred & (kt >= 2))"""),
]
#: Indexed kernel: no cp.async gather of the routed rows.
NO_GATHER = ("gather_async(xs, st, a_rows, row_ok & pred, kt, K, x_l, K_TAIL)",
             "gather_async(xs, st, a_rows, row_ok & pred & (kt < 0), kt, K, x_l, K_TAIL)")
#: No wgmma (the dequantization then dies as dead code): the TMA + barrier skeleton alone.
NO_MMA = ("    acc = warpgroup_mma(w0, xs.index(s * GROUPS + 0).permute((1, 0)), acc, is_async=True)",
          "    return acc\n    acc = warpgroup_mma(w0, xs.index(s * GROUPS + 0).permute((1, 0)), acc, is_async=True)")
#: Half the wgmmas of a step (groups 4-7 dropped; their fragments stay alive through the wait's
#: deps, so the dequantization is unchanged): is the tensor pipe the bound at small N?
HALF_MMA = ("""    acc = warpgroup_mma(w4, xs.index(s * GROUPS + 4).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w5, xs.index(s * GROUPS + 5).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w6, xs.index(s * GROUPS + 6).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(w7, xs.index(s * GROUPS + 7).permute((1, 0)), acc, is_async=True)
""", "")
#: Words and scales read from a tiled copy: each 64-row x 256-K step one contiguous block
#: (words ``[E, N/64, nk, 64, 32]``, scales ``[E, N/64, nk, 8, 64]``; 64-row tiles only).
TILED_WEIGHTS = [
    ("tma.async_copy_global_to_shared(w_desc, [wrow, kt * 32], bar, wring.index(st), pred=pred)",
     "tma.async_copy_global_to_shared(w_desc, [wrow + kt * 64, 0], bar, wring.index(st), pred=pred)"),
    ("    nk = gl.cdiv(K, 256)\n    for i in gl.static_range(STAGES):\n        load_weights(",
     ("    nk = gl.cdiv(K, 256)\n    tid = wrow // 64\n    wrow = tid * nk * 64\n    srow = tid * nk * 8\n"
      "    n0 = n0 * 0\n    for i in gl.static_range(STAGES):\n        load_weights(")),
]


def _namespace(mods: dict) -> types.SimpleNamespace:
    """The modules' public names in one namespace (later modules win), plus the tile tables and
    heuristics the probes read, and ``modules``."""
    ns = {}
    for src in (tiles, heuristics, *mods.values()):
        ns.update({k: getattr(src, k) for k in dir(src) if not k.startswith("__")})
    return types.SimpleNamespace(**ns, modules=dict(mods))


#: The package itself (`using` it changes nothing).
KERNEL = _namespace({m: importlib.import_module(f"{_NAME}.{m}") for m in MODULES})


def _absolute_imports(src: str) -> str:
    """The package copy's imports of the rest of lowbit as absolute ones (``from .x`` stays: the
    copy is a package, with its own `int4_gluon`)."""
    src = src.replace("from ..int4_gluon import", "from .int4_gluon import")
    src = src.replace("from .int4 import", "from lowbit.kernels.w4a16.int4 import")
    src = re.sub(r"^(\s*)from \.\.\.\.([\w.]+) import", r"\1from lowbit.\2 import", src, flags=re.M)
    return re.sub(r"^(\s*)from \.\.(\w[\w.]*) import", r"\1from lowbit.kernels.w4a16.\2 import", src, flags=re.M)


def variant(name: str, edits: list[tuple[str, str]], base: dict[str, str] | str | None = None):
    """The package (or the sources `base`, another version of it: `sources`) with each
    ``(old, new)`` edit applied (each must match once across its modules), as a namespace. A
    string `base` is one module's source (another family's Gluon module): that module alone."""
    if isinstance(base, str):
        return _module_variant(name, edits, base)
    srcs = {m: _absolute_imports(s) for m, s in (base or sources()).items()}
    for old, new in edits:
        hits = {m: s.count(old) for m, s in srcs.items() if old in s}
        if sum(hits.values()) != 1:
            raise RuntimeError(f"probe variant {name!r}: an edit matches {sum(hits.values())} times, not once")
        (mod,) = hits
        srcs[mod] = srcs[mod].replace(old, new)
    pkg = f"lowbit_probe_{name}"
    os.makedirs(os.path.join(_DIR, pkg), exist_ok=True)
    open(os.path.join(_DIR, pkg, "__init__.py"), "w").close()
    for m, src in srcs.items():
        with open(os.path.join(_DIR, pkg, f"{m}.py"), "w") as f:
            f.write(src)
    if _DIR not in sys.path:
        sys.path.insert(0, _DIR)
    importlib.import_module(f"{pkg}.int4_gluon")
    return _namespace({m: importlib.import_module(f"{pkg}.{m}") for m in MODULES})


def _module_variant(name: str, edits: list[tuple[str, str]], src: str):
    """`variant` of a single module's source `src` (relative imports made absolute from
    ``lowbit.kernels``), loaded as its own module."""
    src = re.sub(r"^(\s*)from \.\.([\w.]+) import", r"\1from lowbit.\2 import", src, flags=re.M)
    src = re.sub(r"^(\s*)from \.(\w+) import", r"\1from lowbit.kernels.\2 import", src, flags=re.M)
    for old, new in edits:
        if src.count(old) != 1:
            raise RuntimeError(f"probe variant {name!r}: an edit matches {src.count(old)} times, not once")
        src = src.replace(old, new)
    path = os.path.join(_DIR, f"probe_{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"probe_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def using(mod: types.SimpleNamespace):
    """Run the block with `mod` (a `variant`, or `KERNEL`) in place of the package's modules in
    ``sys.modules``: the ops (`w4a16_indexed`, `w4a16_grouped`) import their launchers when called,
    so they launch its kernels."""
    saved = {m: sys.modules[f"{_NAME}.{m}"] for m in MODULES}
    sys.modules.update({f"{_NAME}.{m}": mod.modules[m] for m in MODULES})
    try:
        yield
    finally:
        sys.modules.update({f"{_NAME}.{m}": v for m, v in saved.items()})


@contextlib.contextmanager
def tile_form(layout: str, tile, **fields):
    """Run the block with `tile`'s `tiles.RegisterATile` record of `layout` ("indexed", or
    "masked" / "contiguous": the grouped table) changed by `fields` (e.g. ``half_tail=False``), in
    memory: the launchers and heuristics read the records at each call. A tile the table lacks
    gets a record of its own for the block."""
    table = tiles._INDEXED if layout == "indexed" else tiles._GROUPED
    key = tuple(tile)
    saved = table.get(key)
    table[key] = dataclasses.replace(saved or tiles.RegisterATile(key), **fields)
    try:
        yield
    finally:
        if saved is None:
            del table[key]
        else:
            table[key] = saved


@contextlib.contextmanager
def patch(module, name: str, value):
    """Run the block with `module`'s attribute `name` set to `value`."""
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


@contextlib.contextmanager
def patch_all(name: str, value, mod: types.SimpleNamespace = KERNEL):
    """Run the block with module-level `name` set to `value` in every module of `mod` that has it
    (a helper and each module that imported it)."""
    saved = {m: getattr(x, name) for m, x in mod.modules.items() if hasattr(x, name)}
    if not saved:
        raise RuntimeError(f"no module of the package has {name!r}")
    for m in saved:
        setattr(mod.modules[m], name, value)
    try:
        yield
    finally:
        for m, v in saved.items():
            setattr(mod.modules[m], name, v)


def compare(mods: dict, label: str, call, out, rounds: int = 60) -> None:
    """Time ``call(o)`` under each entry of `mods` (name -> a `variant` or `KERNEL`, or a function
    returning a context manager such as `tile_form`'s; the first is the reference, usually `KERNEL`), interleaved CUDA-graph replays behind an L2 flush
    (`lowbit.bench.timing.measure_interleaved`), each writing its own copy of `out`; print one
    line: the reference's median us, then each other's and its ratio to the reference (> 1: the
    reference is faster), "!" where its output differs bit for bit (NaN compared as 0)."""
    import torch

    from lowbit.bench.timing import measure_interleaved

    outs = {n: out.clone() for n in mods}
    fns = {}
    for name, mod in mods.items():
        def fn(mod=mod, o=outs[name]):
            with (using(mod) if isinstance(mod, types.SimpleNamespace) else mod()):
                call(o)
        fns[name] = fn
    t = measure_interleaved(fns, rounds=rounds)
    torch.cuda.synchronize()
    ref, *others = list(mods)
    k = t[ref].median_us
    cells = "  ".join(f"{n} {t[n].median_us:7.1f} x{t[n].median_us / k:.3f}"
                      f"{'' if torch.equal(outs[ref].nan_to_num(), outs[n].nan_to_num()) else ' !'}" for n in others)
    print(f"{label:40} {ref} {k:7.1f}  {cells}", flush=True)


def compare_indexed(mods: dict, draws, rounds: int = 60) -> None:
    """`compare` on Kimi-style indexed draws ``(label, a, w, topk_ids)`` (``top_k`` from the
    shapes: a row a token is gate_up, a row a route is down), each through the public
    `w4a16_indexed` with its heuristics' tile; NaN-poisoned outputs."""
    import torch

    from lowbit import routing
    from lowbit.kernels.w4a16.indexed import w4a16_indexed, w4a16_indexed_config

    for label, a, w, ids in draws:
        top_k = ids.shape[1] if a.shape[0] == ids.shape[0] else 1
        cfg = w4a16_indexed_config(ids.numel(), w.num_experts, w.n, w.k, gluon=True)
        r = routing.moe_align_block_size(ids, cfg.block_m, w.num_experts)
        out = torch.full((a.shape[0] * top_k, w.n), float("nan"), dtype=torch.bfloat16, device="cuda")
        compare(mods, f"{label} {cfg.block_n}x{cfg.block_m}s{cfg.num_stages}",
                lambda o, a=a, w=w, r=r, top_k=top_k, cfg=cfg: w4a16_indexed(
                    a, w, r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded, top_k, out=o, config=cfg),
                out, rounds)


def compare_layer(mods: dict, tokens, seed: int, rounds: int = 60, experts: int = 48, hidden: int = 7168,
                  inter: int = 2048) -> None:
    """`compare` on `lowbit.moe_experts(path="indexed")` (Kimi EP8 shapes by default, top-8, random
    weights and routing drawn from `seed`) at each token count."""
    import torch

    from lowbit import moe_experts
    from lowbit.bench.cases import make_weight
    from lowbit.formats.w4a16 import pack_w4a16

    gen = torch.Generator(device="cuda").manual_seed(seed)
    w13 = pack_w4a16(make_weight(experts, 2 * inter, hidden, "cuda"))
    w2 = pack_w4a16(make_weight(experts, hidden, inter, "cuda"))
    for t in tokens:
        ids = torch.stack([torch.randperm(experts, generator=gen, device="cuda")[:8] for _ in range(t)])
        ids = ids.to(torch.int32)
        wts = torch.rand(t, 8, generator=gen, device="cuda")
        x = torch.randn(t, hidden, generator=gen, device="cuda").to(torch.bfloat16)
        out = torch.empty(t, hidden, dtype=torch.bfloat16, device="cuda")
        compare(mods, f"moe_experts indexed {t} tokens",
                lambda o, x=x, ids=ids, wts=wts: moe_experts(x, ids, wts, w13, w2, out=o, path="indexed"), out,
                rounds)


def indexed_draws(case: str, tokens, experts: int, shapes: dict, seed: int) -> list:
    """Kimi-style draws ``(label, a, w, topk_ids)`` for `compare_indexed`: the bench case `case`'s
    own draw of each projection in `shapes` (name -> (N, K)), then, on one random weight a
    projection, random top-8 routing over `experts` and activations at each token count of
    `tokens` (from `seed`)."""
    import torch

    from lowbit.bench.cases import build_problem, make_weight, select_cases
    from lowbit.formats.w4a16 import pack_w4a16

    gen = torch.Generator(device="cuda").manual_seed(seed)
    bench = select_cases([case])[0]
    draws = []
    for proj in shapes:
        p = build_problem(bench, proj, "cuda")
        draws.append((f"{case} {proj}", p.a, pack_w4a16(p.weight), p.topk_ids.to(torch.int32)))
    for proj, (n, k) in shapes.items():
        w = pack_w4a16(make_weight(experts, n, k, "cuda"))
        for t in tokens:
            ids = torch.stack([torch.randperm(experts, generator=gen, device="cuda")[:8] for _ in range(t)])
            a = torch.randn(t if proj == "gate_up" else t * 8, k, generator=gen, device="cuda").to(torch.bfloat16)
            draws.append((f"t{t} {proj}", a, w, ids.to(torch.int32)))
    return draws
