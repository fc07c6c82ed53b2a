"""Record or compare the compile tier's table: every production kernel configuration compiled
for sm_90a, with its registers, spills, shared memory, matrix-instruction counts and a hash of
its SASS opcode stream (function names left out, so moving a kernel between modules keeps it).

    python scripts/compile_table.py --write docs/results/compile_table_sm90_triton-3.6.0.json
    python scripts/compile_table.py --check docs/results/compile_table_sm90_triton-3.6.0.json

A change that moves, splits or renames code must leave ``--check`` green; a change to a kernel
rewrites the table in the same commit, so the diff shows what the compiler now builds.

``--check`` exits 1 and prints the differing rows when any configuration changed. It runs
without ``TRITON_INTERPRET`` (the interpreter replaces the JIT functions).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

MATRIX_OPS = ("HGMMA", "QGMMA", "HMMA", "IMMA")


def _row(cfg) -> dict:
    import triton

    from lowbit.kernels.compile_tier import _triton_bin, compile_sm90

    rep = compile_sm90(cfg)
    row = {"name": rep.name, "ok": rep.ok, "registers": rep.registers, "spill_bytes": rep.spill_bytes,
           "shared_bytes": rep.shared_bytes, "triton": triton.__version__}
    if not rep.ok and rep.error:
        row["error"] = rep.error.splitlines()[0][:200]
        return row
    # recompile is cached by triton; re-read the cubin through the same path
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    names = list(cfg.signature)
    attrs = {(i,): [["tt.divisibility", 16]] for i, nm in enumerate(names)
             if (cfg.signature[nm].startswith("*") or cfg.signature[nm] in ("i32", "i64")) and nm not in cfg.unaligned}
    source = GluonASTSource if getattr(cfg.fn, "is_gluon", lambda: False)() else ASTSource
    k = triton.compile(source(fn=cfg.fn, signature=cfg.signature, constexprs=cfg.constexprs, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
                                **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {})})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        sass = subprocess.run([_triton_bin("cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    row["matrix_ops"] = {op: sum(o.startswith(op) for o in ops) for op in MATRIX_OPS if any(o.startswith(op) for o in ops)}
    row["sass_ops"] = len(ops)
    row["sass_hash"] = hashlib.sha256(" ".join(ops).encode()).hexdigest()[:16]
    return row


def table(pattern: str | None = None) -> list[dict]:
    from lowbit.kernels.compile_tier import all_configs

    return [_row(c) for c in all_configs() if pattern is None or re.search(pattern, c.name)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", metavar="JSON")
    g.add_argument("--check", metavar="JSON")
    ap.add_argument("--filter", default=None)
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("compile_table: unset TRITON_INTERPRET")
    rows = table(args.filter)
    if args.write:
        with open(args.write, "w") as f:
            json.dump(rows, f, indent=1, sort_keys=True)
        print(f"wrote {len(rows)} rows to {args.write}")
        return 0
    with open(args.check) as f:
        want = {r["name"]: r for r in json.load(f)}
    got = {r["name"]: r for r in rows}
    keys = ("ok", "registers", "spill_bytes", "shared_bytes", "matrix_ops", "sass_hash")
    bad = []
    for name in sorted(set(want) | set(got)):
        if args.filter and not re.search(args.filter, name):
            continue
        a, b = want.get(name), got.get(name)
        if a is None or b is None:
            bad.append(f"{name}: {'new' if a is None else 'gone'}")
        elif any(a.get(k) != b.get(k) for k in keys):
            bad.append(f"{name}: " + ", ".join(f"{k} {a.get(k)} -> {b.get(k)}" for k in keys if a.get(k) != b.get(k)))
    print("\n".join(bad) if bad else f"compile table unchanged ({len(got)} configurations)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
