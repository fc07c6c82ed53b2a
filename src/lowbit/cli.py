"""``python -m lowbit`` / ``lowbit``: the command line.

Subcommands:
- ``bench``: benchmark the Kimi K2.x W4A16 MoE shapes on the GPU (providers lowbit, humming,
  torch; refchecked, L2-cold timing; results.json + PNG + a table). Without a GPU it runs the
  small-shape correctness checks through the Triton interpreter instead.
- ``env``: versions, GPU, CUDA availability.
- ``show-config``: the kernel configuration lowbit picks per shape, and why.

Nothing here touches CUDA at import; ``bench`` decides CPU vs GPU when it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from .runtime.env import interpreter_active

__all__ = ["main", "build_parser"]

#: Modules that define Triton kernels (must be imported after TRITON_INTERPRET is set).
_KERNEL_MODULE_PREFIXES = ("lowbit.kernels",)


def _split(values: Sequence[str] | None) -> list[str]:
    """Accept ``--cases a b`` and ``--cases a,b``."""
    out: list[str] = []
    for v in values or ():
        out.extend(x for x in v.split(",") if x)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lowbit", description="lowbit: low-bit MoE kernels for Hopper")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="benchmark the W4A16 MoE cases (GPU) or run the CPU checks (no GPU)",
                       description="Benchmark the Kimi K2.x W4A16 MoE cases; without a GPU, run the "
                                   "small-shape correctness checks through the Triton interpreter.")
    b.add_argument("--cases", nargs="*", metavar="NAME",
                   help="case names or globs (ep8_indexed_*), tags (decode, prefill, grouped...), "
                        "'default' or 'all'; default: the headline points")
    b.add_argument("--list", action="store_true", help="list the cases and exit")
    b.add_argument("--providers", nargs="*", metavar="NAME", help="default: lowbit humming torch")
    b.add_argument("--out", default="bench_out", help="output folder for results.json and the plot (default bench_out/)")
    b.add_argument("--rep-ms", type=float, default=200.0, help="timed milliseconds per measurement (default 200)")
    b.add_argument("--warmup-ms", type=float, default=50.0, help="untimed warm-up milliseconds (default 50)")
    b.add_argument("--cuda-graph", action="store_true", help="time CUDA-graph replays (removes launch gaps)")
    b.add_argument("--no-l2-flush", action="store_true", help="do not flush L2 between repetitions (L2-hot numbers)")
    b.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                   help="time a problem's providers together, replayed in turn for ROUNDS rounds (CUDA graphs, "
                        "L2 flushed): the same clocks for every provider at the GPU's power cap (default 0: one "
                        "provider after another)")
    b.add_argument("--tol", type=float, default=None, help="refcheck relative Frobenius budget (default 1e-2)")
    b.add_argument("--bw-ceiling", type=float, default=None, help="bandwidth ceiling in TB/s (default 4.50)")
    b.add_argument("--flops-ceiling", type=float, default=None, help="BF16 ceiling in TFLOP/s (default 678)")
    b.add_argument("--no-plot", action="store_true", help="skip the PNG")
    b.add_argument("--cpu-checks", action="store_true", help="run the no-GPU correctness checks even with a GPU")
    b.add_argument("--checks", nargs="*", metavar="NAME", help="with the CPU path: only these checks")

    e = sub.add_parser("env", help="versions, GPU and CUDA availability")
    e.add_argument("--json", action="store_true", help="print JSON")

    sc = sub.add_parser("show-config", help="kernel configurations lowbit picks per shape, and why")
    sc.add_argument("--routes", type=int, help="routed rows M*top_k (with --experts --n --k: one shape)")
    sc.add_argument("--experts", type=int, help="experts of the weight")
    sc.add_argument("--n", type=int, help="output features N")
    sc.add_argument("--k", type=int, help="input features K")
    sc.add_argument("--no-sm90", action="store_true",
                    help="with one shape: the choice off Hopper (Triton engine) instead of on sm_90")
    return parser


def _ensure_interpreter(argv: Sequence[str]) -> None:
    """Kernels must be *defined* under TRITON_INTERPRET=1 to run on the CPU. Set it now if no
    Triton kernel module is loaded yet, else re-exec this command with it set."""
    if interpreter_active():
        return
    loaded = [m for m in sys.modules if m.startswith(_KERNEL_MODULE_PREFIXES)]
    os.environ["TRITON_INTERPRET"] = "1"
    if loaded:
        os.execv(sys.executable, [sys.executable, "-m", "lowbit", *argv])


def _cmd_list() -> int:
    from .bench.cases import CASES, DEFAULT_CASE_NAMES  # noqa: PLC0415

    print(f"{'case':22s} {'layout':10s} {'E':>4s}  {'gate_up N x K (top_k)':24s} {'down N x K':14s} label")
    for c in CASES.values():
        gu, dn = c.projections
        mark = "*" if c.name in DEFAULT_CASE_NAMES else " "
        print(f"{c.name:22s} {c.layout:10s} {c.num_experts:4d}  "
              f"{f'{gu.n} x {gu.k} ({gu.top_k})':24s} {f'{dn.n} x {dn.k}':14s} {c.label}{'  [default]' if mark == '*' else ''}")
    print("\n[default] = what `python -m lowbit bench` runs with no --cases")
    return 0


def interpreter_numpy_problem() -> str | None:
    """Why the Triton interpreter cannot run here (numpy missing or >= 2.4, whose array
    semantics break the interpreter's loops over runtime bounds), else None."""
    try:
        import numpy  # noqa: PLC0415
    except ImportError:
        return "numpy is not installed; the Triton interpreter needs numpy<2.4"
    major, minor = (int(x) for x in numpy.__version__.split(".")[:2])
    if (major, minor) >= (2, 4):
        return f"numpy {numpy.__version__} breaks the Triton interpreter; install 'numpy<2.4'"
    return None


def _cmd_cpu_checks(args: argparse.Namespace, reason: str) -> int:
    from .bench.driver import format_checks, run_cpu_checks  # noqa: PLC0415

    problem = interpreter_numpy_problem()
    if problem:
        print(f"warning: {problem}: interpreted kernel checks will fail", file=sys.stderr)
    results = run_cpu_checks(_split(args.checks) or None)
    print(format_checks(results))
    failed = [r for r in results if r["status"] == "FAIL"]
    print(f"\n{reason}: ran {len(results)} small-shape correctness checks "
          f"(Triton interpreter: TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}); "
          f"{len(failed)} failed. Timing needs a CUDA GPU (see docs/gpu.md).")
    return 1 if failed else 0


def _cmd_bench(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if args.list:
        return _cmd_list()
    import torch  # noqa: PLC0415

    if args.cpu_checks or not torch.cuda.is_available():
        _ensure_interpreter(argv)
        return _cmd_cpu_checks(args, "no CUDA GPU" if not torch.cuda.is_available() else "--cpu-checks")

    from .bench import cases as cases_mod  # noqa: PLC0415
    from .bench.driver import REFCHECK_TOL, collect_env, format_table, run_bench, write_results  # noqa: PLC0415
    from .bench.plot import plot_results  # noqa: PLC0415
    from .bench.providers import DEFAULT_PROVIDERS  # noqa: PLC0415

    try:
        cases = cases_mod.select_cases(_split(args.cases))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    providers = _split(args.providers) or list(DEFAULT_PROVIDERS)
    ceilings = (args.bw_ceiling or cases_mod.HBM_READ_CEILING_TBS, args.flops_ceiling or cases_mod.BF16_CEILING_TFLOPS)
    timing = {"rep_ms": args.rep_ms, "warmup_ms": args.warmup_ms, "cuda_graph": args.cuda_graph,
              "flush_l2": not args.no_l2_flush}
    try:
        if args.interleave < 0 or (args.interleave and args.no_l2_flush):
            raise ValueError("--interleave takes a positive round count and always flushes the L2")
        rows = run_bench(cases, providers, device="cuda", timing=timing,
                         tol=args.tol or REFCHECK_TOL, ceilings=ceilings,
                         on_row=lambda so_far: write_results(so_far, args.out),  # partial results survive a kill
                         interleave=args.interleave)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    meta = {"env": collect_env(), "argv": list(argv), "cases": [c.describe() for c in cases],
            "providers": providers, "timing": timing, "interleave_rounds": args.interleave,
            "ceilings_tbs_tflops": ceilings}
    path = write_results(rows, args.out, meta)
    png = None if args.no_plot else plot_results(rows, os.path.join(args.out, "bench.png"))
    print(format_table(rows))
    if png:
        note = f" and {png}"
    else:
        note = "" if args.no_plot else " (no plot: matplotlib missing or nothing timed)"
    print(f"\nwrote {path}{note}")
    bad = [r for r in rows if r["status"] in ("FAIL", "error")]
    return 1 if bad else 0


def _cmd_env(args: argparse.Namespace) -> int:
    from .bench.driver import collect_env  # noqa: PLC0415

    env = collect_env()
    if args.json:
        print(json.dumps(env, indent=1, default=str))
    else:
        width = max(len(k) for k in env)
        for key, value in env.items():
            print(f"{key:{width}s}  {value}")
    return 0


#: (label, routed rows, experts, N, K): the Kimi K2.x projections of the bench registry
_SHOW_CONFIG_SHAPES = [
    *[(f"EP8 {t} tok gate_up", 8 * t, 48, 4096, 7168) for t in (1, 4, 8, 16, 20, 32, 50, 256, 1024)],
    *[(f"EP8 {t} tok down", 8 * t, 48, 7168, 2048) for t in (1, 4, 8, 16, 20, 32, 50, 256, 1024)],
    *[(f"TP8 {t} tok gate_up", 8 * t, 384, 512, 7168) for t in (1024, 8192)],
    *[(f"TP8 {t} tok down", 8 * t, 384, 7168, 256) for t in (1024, 8192)],
]


def _show_config_sections():
    """(family, its override variables, [(label, explanation)]) for every kernel family, at the
    shapes the SPEC and the issues name (Kimi K2.x MoE, DeepSeek V4-Flash linears/attention)."""
    from lowbit.kernels import quant, sinkhorn
    from lowbit.kernels.attention import sparse_attn
    from lowbit.kernels.block_scaled import fp4 as fp4_gemm, fp8 as fp8_gemm
    from lowbit.kernels.moe_decode import heuristics as moe_decode
    from lowbit.kernels.w4a16 import grouped as w4a16_grouped, indexed as w4a16_indexed

    yield "w4a16_indexed", w4a16_indexed.ENV_OVERRIDES, [
        (f"{label} on sm_90", w4a16_indexed.explain_w4a16_indexed_config(routes, e, n, k, gluon=True))
        for label, routes, e, n, k in _SHOW_CONFIG_SHAPES]
    yield "w4a16_grouped", w4a16_grouped.ENV_OVERRIDES, [
        (f"EP8 contiguous 128 rows/expert {p} on sm_90",
         w4a16_grouped.explain_w4a16_grouped_config("contiguous", 6144, n, k, 48, gluon=True))
        for p, n, k in (("gate_up", 4096, 7168), ("down", 7168, 2048))] + [
        (f"EP8 masked {t} tok/expert {p} on sm_90",
         w4a16_grouped.explain_w4a16_grouped_config("masked", 48 * 256, n, k, 48, t, gluon=True))
        for t in (8, 16, 32, 64) for p, n, k in (("gate_up", 4096, 7168), ("down", 7168, 2048))]
    yield "moe_decode", moe_decode.ENV_OVERRIDES, [
        (f"EP8 {m} tok {fmt}", moe_decode.explain_moe_decode_config(m, 8, 48, 7168, 2048, fmt))
        for fmt in ("int4", "mxfp8") for m in (1, 2, 4, 8, 16, 32)]
    yield "fp8_gemm", fp8_gemm.ENV_OVERRIDES, [
        (f"M={m} N={n} K={k} on sm_90", fp8_gemm.explain_fp8_gemm_config(m, n, k, gluon=True))
        for m in (16, 128, 4096) for n, k in ((2304, 5120), (5120, 2304))]
    yield "fp4_gemm", fp4_gemm.ENV_OVERRIDES, [
        (f"M={m} N={n} K={k} on sm_90{', folded weight' if f else ''}",
         fp4_gemm.explain_fp4_gemm_config(m, n, k, gluon=True, mma=True, folded=f))
        for m in (16, 64, 128, 4096) for n, k in ((2304, 5120), (5120, 2304)) for f in (False, True)]
    yield "act_quant / fp4_quant", [*quant.ENV_OVERRIDES["act_quant"], *quant.ENV_OVERRIDES["fp4_quant"]], [
        ("act_quant 16384x7168", quant.explain_quant_config("act_quant", 16384, 7168, 128)),
        ("fp4_quant 16384x7168", quant.explain_quant_config("fp4_quant", 16384, 7168, 32))]
    yield "sparse_attn", sparse_attn.ENV_OVERRIDES, [
        (f"{name}{' on sm_90' if g else ''}", sparse_attn.explain_sparse_attn_config(b, s, 64, topk=2048, gluon=g))
        for name, b, s in (("decode b=64 s=1 h=64", 64, 1), ("prefill b=1 s=4096 h=64", 1, 4096)) for g in (False, True)]
    yield "hc_split_sinkhorn", sinkhorn.ENV_OVERRIDES, [
        (f"{n} tokens", sinkhorn.explain_sinkhorn_config(n)) for n in (64, 16384)]


def _cmd_show_config(args: argparse.Namespace) -> int:
    """Print the configuration each kernel family's heuristics pick per shape, with the reason
    (memoized heuristics, ``LOWBIT_*`` overrides applied). Compiles nothing."""
    from lowbit.kernels.w4a16.indexed import explain_w4a16_indexed_config

    one = [args.routes, args.experts, args.n, args.k]
    if any(v is not None for v in one):
        if any(v is None for v in one):
            print("show-config: give all of --routes --experts --n --k", file=sys.stderr)
            return 2
        print(explain_w4a16_indexed_config(args.routes, args.experts, args.n, args.k, gluon=not args.no_sm90))
        return 0
    for family, knobs, rows in _show_config_sections():
        active = {k: os.environ[k] for k in knobs if os.environ.get(k)}
        print(f"{family} (overrides set: {active or 'none'}; knobs: {', '.join(knobs)})")
        for label, text in rows:
            print(f"  {label:34s} {text}")
        print()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m lowbit`` and the ``lowbit`` script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return _cmd_bench(args, argv)
    if args.command == "env":
        return _cmd_env(args)
    return _cmd_show_config(args)
