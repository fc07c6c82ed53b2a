"""What a wgmma N of 40 / 48 / 56 would buy the 64-row routing blocks -- an upper bound, not a
kernel (outputs of rows past N are wrong on purpose).

    python scripts/probes/wgmma_n.py [gemm] [masked] [offline]

Gluon tensors are powers of two, so the 128x64 group-loop tile (`_rs_halves_mainloop`) issues
``wgmma m64n64k16`` even where an expert's block holds 43 routes (Kimi EP8 256 tokens; Humming
runs 56-row blocks there). This probe compiles variants of `w4a16_sm90` whose PTX has every
``m64n64k16`` rewritten to ``m64nNk16`` on the first N/2 accumulator registers (a Triton
`add_stages_inspection_hook`, scoped to the variant modules by their file name in the LLVM
debug info); the rest of the kernel is unchanged. Every 64-row block then runs N rows: the time
a kernel with N-row tails could reach at most. ``x`` = variant time / kernel time (< 1: N rows
would be faster).

gemm    Kimi EP8 `w4a16_indexed` on the bench's ``ep8_indexed_t256`` draw and 192 / 384 tokens.
masked  `w4a16_masked` on the bench's ``ep8_masked_32`` / ``ep16_masked_32`` draws.
offline the rewritten PTX's wgmma census (no GPU needed: compile-tier configuration)."""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import variants as v

_WGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16 \{([^}]*)\}")
_DOC = '"""`_rs_groups_mainloop` (one warpgroup) with ONE step of activations instead of a'
NS = (40, 48, 56)


def rewrite(ptx: str, n: int) -> str:
    """Every ``m64n64k16`` bf16 wgmma of `ptx` as ``m64nNk16`` on its first N/2 accumulators."""
    def sub(m):
        regs = m.group(1).split(",")
        assert len(regs) == 32, regs
        return f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{','.join(regs[:n // 2])}}}"
    return _WGMMA.sub(sub, ptx)


def _hook(backend, stages, options, language, capability):
    make_ptx = stages["ptx"]

    def ptx(src, metadata):
        out = make_ptx(src, metadata)
        for n in NS:
            if f"w4a16_sm90_n{n}.py" in src:
                return rewrite(out, n)
        return out
    stages["ptx"] = ptx


def install() -> dict:
    from triton import knobs

    from variants import KERNEL as base
    knobs.runtime.add_stages_inspection_hook = _hook
    # the docstring edit gives each variant its own Triton cache key
    return {"kernel": base, **{f"n{n}": v.variant(f"n{n}", [(_DOC, _DOC.replace("ONE step", f"ONE step (n{n})"))])
                               for n in NS}}


def gemm(mods) -> None:
    v.compare_indexed(mods, v.indexed_draws("ep8_indexed_t256", (192, 384), 48,
                                            {"gate_up": (4096, 7168), "down": (7168, 2048)}, seed=5))


def masked(mods) -> None:
    import torch

    from half_acts import _masked_draws
    from lowbit.kernels.w4a16.grouped import masked as w4a16_masked
    for label, a, w, mm, em, cfg in _masked_draws(("ep8_masked_32", "ep16_masked_32")):
        out = torch.full((a.shape[0], w.n), float("nan"), dtype=torch.bfloat16, device="cuda")
        v.compare(mods, f"{label} {cfg.block_n}x{cfg.block_m}s{cfg.num_stages}",
                  lambda o, a=a, w=w, mm=mm, em=em, cfg=cfg: w4a16_masked(a, w, mm, em, out=o, config=cfg), out)


def offline(mods) -> None:
    """Compile the indexed 128x64 tile of each variant for sm_90a and count its wgmma shapes."""
    import collections

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from lowbit.kernels import compile_tier as ct
    cfg = next(c for c in ct.all_configs() if c.name.startswith("w4a16_indexed_sm90_gluon_rs[BW=128,BR=64,w=4,stages=2"))
    for name, mod in mods.items():
        fn = getattr(mod, cfg.fn.fn.__name__ if hasattr(cfg.fn, "fn") else cfg.fn.__name__)
        names = list(cfg.signature)
        attrs = {(i,): [["tt.divisibility", 16]] for i, nm in enumerate(names)
                 if (cfg.signature[nm].startswith("*") or cfg.signature[nm] in ("i32", "i64")) and nm not in cfg.unaligned}
        k = triton.compile(GluonASTSource(fn=fn, signature=cfg.signature, constexprs=cfg.constexprs, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps,
                                                                      "num_stages": cfg.num_stages})
        shapes = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)", k.asm["ptx"]))
        import subprocess, tempfile
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"])
            f.flush()
            res = subprocess.run([ct._triton_bin("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True)
            sass = subprocess.run([ct._triton_bin("cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
        usage = re.search(r"REG:\d+.*?STACK:\d+", res.stdout, re.S)
        hgmma = collections.Counter(re.findall(r"HGMMA\.(\d+x\d+x\d+)", sass))
        print(f"{name:8} ptx {dict(shapes)} sass {dict(hgmma)} {usage.group(0) if usage else '?'}", flush=True)


if __name__ == "__main__":
    mods = install()
    for mode in sys.argv[1:] or ["gemm", "masked"]:
        {"gemm": gemm, "masked": masked, "offline": offline}[mode](mods)
