"""Compile tier: build every production kernel configuration for sm_90a without a GPU.

Each kernel module lists the configurations its launchers and heuristics can pick in a
``compile_configs()`` function returning `KernelConfig`s; `KERNEL_MODULES` names those
modules. For each configuration we compile to a cubin for ``GPUTarget("cuda", 90, 32)``
(Triton ships ptxas, so no driver is needed) and report what the hardware would refuse or
punish: shared memory over the 227 KB a block may use, register spills, ptxas warnings
(C7515 = wgmma serialized), and whether the SASS holds the instructions the kernel was
written to use (``HGMMA`` for a bf16 wgmma kernel, ``QGMMA`` for fp8).

Run ``python -m lowbit.kernels.compile_tier`` (JSON with ``--json``). It must run without
``TRITON_INTERPRET`` (the interpreter replaces the JIT functions), so the test tier calls it
in a subprocess.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from ..runtime.env import interpreter_active
from ..runtime.kernel_config import KernelConfig
from typing import Any

__all__ = ["KernelConfig", "CompileReport", "KERNEL_MODULES", "SMEM_LIMIT_SM90", "compile_sm90", "run_all"]

#: Largest dynamic shared memory one block may use on sm_90 (227 KB).
SMEM_LIMIT_SM90 = 232448

#: Modules with a ``compile_configs()`` function. A new kernel family adds itself here.
KERNEL_MODULES = [
    "lowbit.routing.kernels",
    "lowbit.kernels.w4a16.portable",
    "lowbit.kernels.attention.portable",
    "lowbit.kernels.attention.hopper",
    "lowbit.kernels.quant",
    "lowbit.kernels.sinkhorn",
    "lowbit.kernels.moe_decode.op",
    "lowbit.kernels.moe_decode.hopper",
    "lowbit.kernels.moe_elementwise",
    "lowbit.kernels.block_scaled.portable",
    "lowbit.kernels.block_scaled.splitk",
    "lowbit.kernels.block_scaled.hopper_fp8",
    "lowbit.kernels.w4a16.hopper.grouped",
    "lowbit.kernels.w4a16.hopper.indexed",
    "lowbit.kernels.w4a16.hopper.nloop",
    "lowbit.kernels.block_scaled.hopper_fp4",
]


@dataclass
class CompileReport:
    name: str
    ok: bool
    shared_bytes: int = 0
    registers: int = -1
    spill_bytes: int = -1
    sass_missing: list[str] = field(default_factory=list)
    ptx_missing: list[str] = field(default_factory=list)
    ptxas_warnings: list[str] = field(default_factory=list)
    error: str = ""


def _triton_bin(tool: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)


def compile_sm90(cfg: KernelConfig) -> CompileReport:
    """Compile `cfg` for sm_90a and inspect the cubin (registers, spills, SASS mnemonics)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    try:
        names = list(cfg.signature)
        attrs = {
            (i,): [["tt.divisibility", 16]]
            for i, nm in enumerate(names)
            if (cfg.signature[nm].startswith("*") or cfg.signature[nm] in ("i32", "i64")) and nm not in cfg.unaligned
        }
        is_gluon = getattr(cfg.fn, "is_gluon", lambda: False)()
        source = GluonASTSource if is_gluon else ASTSource
        src = source(fn=cfg.fn, signature=cfg.signature, constexprs=cfg.constexprs, attrs=attrs)
        k = triton.compile(
            src,
            target=GPUTarget("cuda", 90, 32),
            options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
                     **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {})},
        )
    except Exception as exc:  # report, do not crash the tier
        cause = f" (cause: {exc.__cause__!r})" if exc.__cause__ is not None else ""
        return CompileReport(cfg.name, ok=False, error=f"{type(exc).__name__}: {exc}{cause}"[-3000:])
    rep = CompileReport(cfg.name, ok=True, shared_bytes=int(k.metadata.shared))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        res = subprocess.run([_triton_bin("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True)
        m = re.search(r"REG:(\d+)", res.stdout)
        rep.registers = int(m.group(1)) if m else -1
        # spills land in the stack frame (STACK), local arrays in LOCAL: count both
        stack = re.search(r"STACK:(\d+)", res.stdout)
        local = re.search(r"LOCAL:(\d+)", res.stdout)
        rep.spill_bytes = int(stack.group(1)) + int(local.group(1)) if stack and local else -1
        sass = subprocess.run([_triton_bin("cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    rep.sass_missing = [op for op in cfg.expect_sass if op not in sass]
    rep.ptx_missing = [s for s in cfg.expect_ptx if s not in k.asm["ptx"]]
    # ptxas warnings (e.g. C7515: wgmma serialized) surface in the PTX->cubin step; re-run it
    # on the PTX only when wgmma is expected, since that is where they matter.
    if any("GMMA" in op for op in cfg.expect_sass):
        with tempfile.TemporaryDirectory() as d:
            ptx = os.path.join(d, "k.ptx")
            with open(ptx, "w") as f:
                f.write(k.asm["ptx"])
            res = subprocess.run(
                [_triton_bin("ptxas"), "-arch=sm_90a", "-v", ptx, "-o", os.path.join(d, "k.cubin")],
                capture_output=True, text=True,
            )
            # ptxas reports serialized wgmma (C7510-C7515) as "info", not "warning"
            rep.ptxas_warnings = [l for l in res.stderr.splitlines()
                                  if ("warning" in l.lower() or "(C75" in l)
                                  and not any(f"({code})" in l for code in cfg.allowed_ptxas)]
    rep.ok = (
        rep.shared_bytes <= SMEM_LIMIT_SM90
        and not rep.sass_missing
        and not rep.ptx_missing
        and rep.spill_bytes <= cfg.max_spill_bytes
        and not rep.ptxas_warnings
    )
    return rep


def all_configs() -> list[KernelConfig]:
    cfgs: list[KernelConfig] = []
    for mod in KERNEL_MODULES:
        cfgs.extend(importlib.import_module(mod).compile_configs())
    return cfgs


def run_all(pattern: str | None = None) -> list[CompileReport]:
    if interpreter_active():
        raise RuntimeError("the compile tier needs TRITON_INTERPRET unset (run it in its own process)")
    return [compile_sm90(c) for c in all_configs() if pattern is None or re.search(pattern, c.name)]


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the reports as JSON")
    ap.add_argument("--filter", default=None, help="regex on config names")
    args = ap.parse_args(argv)
    reports = run_all(args.filter)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in reports]))
    else:
        for r in reports:
            status = "ok  " if r.ok else "FAIL"
            print(f"{status} {r.name:60s} smem={r.shared_bytes:6d} regs={r.registers:4d} "
                  f"spill={r.spill_bytes} {r.error or ''}{' missing ' + str(r.sass_missing) if r.sass_missing else ''}"
                  f"{' ptx lacks ' + str(r.ptx_missing) if r.ptx_missing else ''}"
                  f"{' ' + '; '.join(r.ptxas_warnings) if r.ptxas_warnings else ''}")
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
