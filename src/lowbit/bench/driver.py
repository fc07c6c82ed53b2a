"""The benchmark driver: cases x projections x providers -> refchecked, timed JSON rows.

For every case and projection one `Problem` (routing draw, activations, weight) is built and
given unchanged to every provider; each provider's output is compared with the FP32
reference on the routed rows (relative Frobenius error and DeepGEMM's cos diff); a provider
that fails the check is reported ``FAIL`` and is not timed. Rows carry the measured time,
the byte / FLOP model and the achieved fractions of the ceilings, and the environment.

Without a GPU, `run_cpu_checks` runs the registered small-shape correctness checks (kernels
through the Triton interpreter); later kernels add theirs with `register_cpu_check`.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..testing import cos_diff, rel_fro_err
from .cases import (
    BF16_CEILING_TFLOPS,
    HBM_READ_CEILING_TBS,
    CASES,
    BenchCase,
    Problem,
    build_problem,
    clear_weight_cache,
)
from .. import routing
from .ops import FAMILIES, OP_CASES, build_op_problem, clear_op_caches, crossover_summary, is_op_case, op_providers
from .providers import PROVIDERS, Provider
from .timing import Timing, measure, measure_interleaved

__all__ = [
    "REFCHECK_TOL",
    "ROW_KEYS",
    "collect_env",
    "refcheck",
    "run_bench",
    "format_table",
    "write_results",
    "CpuCheck",
    "CPU_CHECKS",
    "register_cpu_check",
    "run_cpu_checks",
    "format_checks",
]

#: Relative Frobenius budget of a provider's BF16 output vs the FP32 reference: one BF16
#: rounding of the output (~1.1e-3 RMS) plus BF16 products in a different order, with margin.
REFCHECK_TOL = 1e-2

#: Keys of every JSON result row (values may be None when not applicable).
ROW_KEYS = (
    "case", "label", "layout", "profile", "projection", "provider", "status", "message",
    "num_experts", "tokens", "n", "k", "top_k", "routed_rows", "experts_hit",
    "median_us", "p20_us", "p80_us", "min_us", "reps", "l2_flushed", "cuda_graph",
    "weight_bytes", "scale_bytes", "act_bytes", "out_bytes", "total_bytes", "flops",
    "floor_us", "tb_per_s", "bw_fraction", "tflop_per_s", "flops_fraction", "speedup_vs_humming",
    "family", "baseline", "speedup_vs_baseline",
    "rel_fro_err", "cos_diff", "refcheck_tol", "provider_config",
    "gpu", "torch", "triton", "humming", "lowbit", "lowbit_commit", "date",
)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- environment ---------------------------------------------------------------------------
def _git_commit() -> str | None:
    if os.environ.get("LOWBIT_COMMIT"):
        return os.environ["LOWBIT_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "describe", "--always", "--dirty", "--abbrev=12"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _humming_info() -> tuple[str | None, str | None]:
    """(version, error): the version when humming imports, else None and why."""
    try:
        mod = importlib.import_module("humming")
        return str(getattr(mod, "__version__", "unknown")), None
    except Exception as exc:  # noqa: BLE001
        try:
            dist = importlib.metadata.version("humming-kernels")
            return None, f"installed ({dist}) but not importable: {type(exc).__name__}: {exc}"
        except importlib.metadata.PackageNotFoundError:
            return None, "not installed"


def collect_env(device: torch.device | None = None) -> dict[str, Any]:
    """Versions and the GPU, for ``python -m lowbit env`` and every result row.
    Touches CUDA only if it is available (this is called from the CLI, never at import)."""
    from .._version import __version__  # noqa: PLC0415

    try:
        import triton  # noqa: PLC0415

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    humming_version, humming_error = _humming_info()
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton_version,
        "lowbit": __version__,
        "lowbit_commit": _git_commit(),
        "humming": humming_version,
        "humming_note": humming_error,
        "cuda_available": torch.cuda.is_available(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
        "gpu": None,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if torch.cuda.is_available():
        dev = device if device is not None else torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(dev)
        env.update(
            gpu=props.name,
            gpu_count=torch.cuda.device_count(),
            sm_count=props.multi_processor_count,
            compute_capability=f"{props.major}.{props.minor}",
            memory_gib=round(props.total_memory / 2**30, 1),
            l2_mib=round(getattr(props, "L2_cache_size", 0) / 2**20, 1) or None,
        )
    return env


# -- correctness ---------------------------------------------------------------------------
def refcheck(out: torch.Tensor, problem: Problem, tol: float = REFCHECK_TOL) -> tuple[bool, float, float, str]:
    """Compare the routed rows of a provider's output ``[out_rows, N]`` with the FP32
    reference. Returns (passed, rel_fro_err, cos_diff, message)."""
    want = (problem.out_rows, problem.proj.n)
    if tuple(out.shape) != want:
        return False, float("inf"), float("inf"), f"output shape {tuple(out.shape)} != {want}"
    rows = problem.route_out
    got = out.index_select(0, rows).float()
    ref = problem.reference().index_select(0, rows)
    rel, cos = rel_fro_err(got, ref), cos_diff(got, ref)
    ok = rel <= tol
    return ok, rel, cos, "" if ok else f"rel_fro_err {rel:.3e} > {tol:.0e}"


# -- rows ----------------------------------------------------------------------------------
def _prepare_and_check(prov, row: dict[str, Any], problem, check, device, say) -> bool:
    """Untimed `prepare` (packing, compile, warm-up), then one run checked against the reference
    by `check(out) -> (ok, rel, cos, msg)`. Fills `row`'s check fields (status FAIL / error when
    not ok) and returns whether the provider may be timed; a provider that raises becomes an
    error row, never the end of the run. The provider stays prepared either way (the caller
    releases it)."""
    try:
        prov.prepare(problem)
        out = prov.run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ok, rel, cos, msg = check(out)
        row.update(rel_fro_err=rel, cos_diff=cos, message=msg, provider_config=prov.config() or None)
        del out
        if not ok:
            row["status"] = "FAIL"
        return ok
    except Exception as exc:  # noqa: BLE001  (one provider's crash must not end the run)
        row.update(status="error", message=f"{type(exc).__name__}: {exc}"[:500])
        say("".join(traceback.format_exception_only(type(exc), exc)).strip())
        return False


def _fill_timing(row: dict[str, Any], t: Timing, ceilings: tuple[float, float]) -> None:
    row.update(status="ok", median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us, min_us=t.min_us, reps=t.reps,
               l2_flushed=t.l2_flushed, cuda_graph=t.cuda_graph)
    _fill_rates(row, ceilings)


def _check_then_time(entries: list[tuple[Any, dict[str, Any], Any, Callable, tuple[float, float]]], device,
                     timing, say, interleave: int = 0) -> None:
    """The one measuring protocol of every provider. `entries`: ``(provider, row, problem,
    check, ceilings)`` of one problem. Each provider is prepared and checked
    (`_prepare_and_check`) and timed only if the check passed, then released. `interleave`
    (rounds, 0: off; CUDA only): the providers that passed are timed together by
    `timing.measure_interleaved` (CUDA-graph replays in turn, a fresh order each round, the L2
    flushed by a read before each), so each sees the same clocks; otherwise one after another
    with `timing.measure` (kwargs `timing`), each releasing before the next prepares. A provider
    that is not ``graph_capturable`` (a host-syncing reference) is always timed alone with eager
    launches; its row's ``cuda_graph`` is then False."""
    eager = dict(timing or {}, cuda_graph=False)
    if interleave and device.type == "cuda":
        ready = {}  # entry index -> (provider, row, ceilings)
        try:
            for i, (prov, row, problem, check, cl) in enumerate(entries):
                if not getattr(prov, "graph_capturable", True):  # timed alone, eagerly
                    _time_one(prov, row, problem, check, cl, device, eager, say)
                    continue
                if _prepare_and_check(prov, row, problem, check, device, say):
                    ready[i] = (prov, row, cl)
            if ready:
                try:
                    ts = measure_interleaved({i: p.run for i, (p, _, _) in ready.items()}, rounds=interleave,
                                             device=device)
                    for i, (_, row, cl) in ready.items():
                        _fill_timing(row, ts[i], cl)
                except Exception as exc:  # noqa: BLE001
                    for _, row, _ in ready.values():
                        row.update(status="error", message=f"interleaved timing: {type(exc).__name__}: {exc}"[:500])
                    say(f"interleaved timing: {type(exc).__name__}: {exc}")
        finally:
            for prov, *_ in entries:
                prov.release()
        return
    for prov, row, problem, check, cl in entries:
        try:
            _time_one(prov, row, problem, check, cl, device,
                      (timing or {}) if getattr(prov, "graph_capturable", True) else eager, say)
        finally:
            prov.release()


def _time_one(prov, row: dict[str, Any], problem, check, cl, device, timing: dict[str, Any], say) -> None:
    """Prepare, check and (if the check passed) time one provider with `timing.measure`."""
    if _prepare_and_check(prov, row, problem, check, device, say):
        try:
            _fill_timing(row, measure(prov.run, device=device, **timing), cl)
        except Exception as exc:  # noqa: BLE001
            row.update(status="error", message=f"{type(exc).__name__}: {exc}"[:500])
            say("".join(traceback.format_exception_only(type(exc), exc)).strip())


def _base_row(problem: Problem, provider: str, env: dict[str, Any], ceilings: tuple[float, float]) -> dict[str, Any]:
    c, p = problem.case, problem.proj
    bm = problem.bytes()
    row = dict.fromkeys(ROW_KEYS)
    row.update(
        case=c.name, label=c.label, layout=c.layout, profile=c.profile, projection=p.name, provider=provider,
        family="w4a16_moe", baseline="humming",
        num_experts=c.num_experts, tokens=c.tokens or None, n=p.n, k=p.k, top_k=p.top_k,
        routed_rows=problem.routed_rows, experts_hit=problem.experts_hit,
        weight_bytes=bm.weight_bytes, scale_bytes=bm.scale_bytes, act_bytes=bm.act_bytes,
        out_bytes=bm.out_bytes, total_bytes=bm.total_bytes, flops=bm.flops,
        floor_us=bm.floor_us(*ceilings), refcheck_tol=REFCHECK_TOL,
        gpu=env.get("gpu"), torch=env.get("torch"), triton=env.get("triton"), humming=env.get("humming"),
        lowbit=env.get("lowbit"), lowbit_commit=env.get("lowbit_commit"), date=env.get("date"),
    )
    return row


def _fill_rates(row: dict[str, Any], ceilings: tuple[float, float]) -> None:
    us = row.get("median_us")
    if not us:
        return
    bw, tf = ceilings
    row["tb_per_s"] = row["total_bytes"] / (us * 1e-6) / 1e12
    row["bw_fraction"] = row["tb_per_s"] / bw
    row["tflop_per_s"] = row["flops"] / (us * 1e-6) / 1e12
    row["flops_fraction"] = row["tflop_per_s"] / tf


def _sum_rows(rows: list[dict[str, Any]], ceilings: tuple[float, float]) -> list[dict[str, Any]]:
    """One ``projection="sum"`` row per (case, provider) holding gate_up + down."""
    out = []
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault((r["case"], r["provider"]), []).append(r)
    for (case, prov), parts in by_key.items():
        if len(parts) != 2:
            continue
        s = dict(parts[0])
        s.update(projection="sum", n=None, k=None, top_k=None, provider_config=None,
                 p20_us=None, p80_us=None, min_us=None, reps=None, rel_fro_err=None, cos_diff=None,
                 tb_per_s=None, bw_fraction=None, tflop_per_s=None, flops_fraction=None)
        ok = all(p["status"] == "ok" for p in parts)
        s["status"] = "ok" if ok else next(p["status"] for p in parts if p["status"] != "ok")
        s["message"] = "" if ok else "; ".join(f"{p['projection']}: {p['message']}" for p in parts if p["message"])
        for key in ("weight_bytes", "scale_bytes", "act_bytes", "out_bytes", "total_bytes", "flops", "floor_us"):
            s[key] = sum(p[key] for p in parts)
        s["routed_rows"] = parts[0]["routed_rows"]
        s["median_us"] = sum(p["median_us"] for p in parts) if ok else None
        s["experts_hit"] = max(p["experts_hit"] for p in parts)
        _fill_rates(s, ceilings)
        out.append(s)
    return out


def _speedups(rows: list[dict[str, Any]]) -> None:
    """speedup_vs_humming: a Humming provider's time (``humming``, or an op family's
    ``humming-*``) over this row's; speedup_vs_baseline: the row's `baseline` provider's."""
    base = {(r["case"], r["projection"]): r["median_us"] for r in rows
            if r["provider"].startswith("humming") and r["status"] == "ok"}
    times = {(r["case"], r["projection"], r["provider"]): r["median_us"] for r in rows
             if r["status"] == "ok" and r.get("median_us")}
    for r in rows:
        h = base.get((r["case"], r["projection"]))
        r["speedup_vs_humming"] = h / r["median_us"] if h and r.get("median_us") else None
        b = times.get((r["case"], r["projection"], r.get("baseline")))
        r["speedup_vs_baseline"] = b / r["median_us"] if b and r.get("median_us") else None


def run_bench(
    cases: Iterable[BenchCase],
    provider_names: Iterable[str],
    *,
    device: torch.device | str = "cuda",
    timing: dict[str, Any] | None = None,
    tol: float = REFCHECK_TOL,
    ceilings: tuple[float, float] = (HBM_READ_CEILING_TBS, BF16_CEILING_TFLOPS),
    progress: Callable[[str], None] | None = _log,
    on_row: Callable[[list[dict[str, Any]]], None] | None = None,
    interleave: int = 0,
) -> list[dict[str, Any]]:
    """Run every (case, projection, provider); return the JSON rows (with sum rows).

    interleave: rounds of interleaved timing (0: off), CUDA only: the providers of one problem
    are prepared together and replayed in turn (`timing.measure_interleaved`: CUDA graphs, the
    L2 flushed by a read before each call; `timing` is then unused), so each sees the same
    clocks. The H200 runs these kernels at its 700 W power cap, where a kernel timed alone sets
    its own clock: one kernel read 1090 and 1155 us in two back-to-back `measure` runs
    (H200, 2026-12-01, 011640b). On the CPU it is ignored.

    timing: keyword arguments of `lowbit.bench.timing.measure` (rep_ms, cuda_graph...).
    on_row: called with the rows so far after each new row (e.g. to save partial results of
    a long run).
    Providers that are unavailable, or that do not support a problem, produce no row (the
    reason is reported through `progress`); a provider that raises gives a row with status
    ``error``; one that fails the reference check gives ``FAIL`` and is not timed.
    """

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    say = progress or (lambda _m: None)
    all_cases = list(cases)
    op_cases = [c for c in all_cases if is_op_case(c)]
    cases = [c for c in all_cases if not is_op_case(c)]
    provider_names = list(provider_names)
    env = collect_env(device if device.type == "cuda" else None)
    op_names = {p.name for provs in FAMILIES.values() for p in provs}
    providers: dict[str, Provider] = {}
    for name in provider_names:
        if name not in PROVIDERS:
            if name in op_names:
                continue  # an op family's provider (ops.FAMILIES), picked up by _run_op_cases
            raise ValueError(f"unknown provider {name!r}; known: {', '.join(PROVIDERS)} "
                             f"(op families: {', '.join(sorted(op_names))})")
        prov = PROVIDERS[name]()
        reason = prov.unavailable_reason()
        if reason:
            say(f"provider {name}: unavailable: {reason}")
            continue
        providers[name] = prov

    rows: list[dict[str, Any]] = []
    total = sum(len(c.projections) for c in cases) * max(1, len(providers))
    step = 0
    last_profile = None
    t_start = time.time()
    for case in cases:
        if last_profile is not None and case.profile != last_profile:
            for prov in providers.values():
                prov.clear()
            clear_weight_cache()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        last_profile = case.profile
        for proj in case.projections:
            problem = build_problem(case, proj.name, device)
            problem.reference()
            entries, tags = [], []
            for name, prov in providers.items():
                step += 1
                tag = f"[{step}/{total} {time.time() - t_start:6.1f}s] {case.name} {proj.name} {name}"
                reason = prov.supports(problem)
                if reason:
                    say(f"{tag}: skipped ({reason})")
                    continue
                row = _base_row(problem, name, env, ceilings)
                row["refcheck_tol"] = tol
                entries.append((prov, row, problem, lambda out, p=problem: refcheck(out, p, tol), ceilings))
                tags.append(tag)
            _check_then_time(entries, device, timing, say, interleave)
            for (_, row, *_), tag in zip(entries, tags):
                rows.append(row)
                us = f"{row['median_us']:.1f} us" if row.get("median_us") else "-"
                rel = f"rel={row['rel_fro_err']:.1e}" if row.get("rel_fro_err") is not None else ""
                cfg = row.get("provider_config") or {}
                brief = {k: v for k, v in cfg.items() if k in ("mode", "block_shape", "gemm_type")}
                say(f"{tag}: {row['status']} {us} {rel} {row['message'] or ''} {brief or ''}".rstrip())
            if on_row is not None and entries:
                on_row(rows)
            del problem
    for prov in providers.values():
        prov.clear()
    clear_weight_cache()
    rows.extend(_sum_rows(rows, ceilings))
    if op_cases:
        rows.extend(_run_op_cases(op_cases, provider_names, device=device, env=env, timing=timing, tol=tol,
                                  ceilings=ceilings, say=say, done=rows, on_row=on_row, interleave=interleave))
    order = {c.name: i for i, c in enumerate(all_cases)}
    proj_order = {"gate_up": 0, "down": 1, "sum": 2}
    prov_order = {n: i for i, n in enumerate(provider_names)}
    op_rank = {(fam, p.name): i for fam, provs in FAMILIES.items() for i, p in enumerate(provs)}

    def rank(r: dict[str, Any]) -> tuple:
        if r.get("family") in FAMILIES:
            return (order[r["case"]], 0, op_rank.get((r["family"], r["provider"]), 9))
        return (order[r["case"]], proj_order.get(r["projection"], 9), prov_order.get(r["provider"], 9))

    rows.sort(key=rank)
    _speedups(rows)
    return rows


def _op_row(problem: Any, provider: Any, env: dict[str, Any], ceilings: tuple[float, float], tol: float) -> dict[str, Any]:
    c = problem.case
    bm = problem.bytes()
    row = dict.fromkeys(ROW_KEYS)
    row.update(
        case=c.name, label=c.label, layout=c.family, profile=c.profile, projection=problem.projection,
        provider=provider.name, family=c.family, num_experts=c.num_experts or None, tokens=c.tokens or None,
        n=problem.n, k=problem.k, top_k=problem.top_k, routed_rows=problem.routed_rows,
        experts_hit=problem.experts_hit, weight_bytes=bm.weight_bytes, scale_bytes=bm.scale_bytes,
        act_bytes=bm.act_bytes, out_bytes=bm.out_bytes, total_bytes=bm.total_bytes, flops=bm.flops,
        floor_us=bm.floor_us(*ceilings), refcheck_tol=tol,
        gpu=env.get("gpu"), torch=env.get("torch"), triton=env.get("triton"), humming=env.get("humming"),
        lowbit=env.get("lowbit"), lowbit_commit=env.get("lowbit_commit"), date=env.get("date"),
    )
    return row


def op_case_ceilings(case: Any, ceilings: tuple[float, float]) -> tuple[float, float]:
    """An op case's own (bandwidth, compute) ceilings where it has them (copy bandwidth for
    the quantizers, the FP8 tensor-core peak for the FP8 / FP4 GEMMs), else the run's."""
    return (case.bw_tbs or ceilings[0], case.tflops or ceilings[1])


def check_op_output(problem: Any, provider: Any, out: Any, tol: float) -> tuple[bool, float, float, str]:
    """(passed, rel_fro_err, cos_diff, message) of an op provider's output vs its reference."""
    rel, cos, note = problem.compare(out, problem.reference(provider.ref_key))
    ok = rel <= tol
    msg = note if ok else f"rel_fro_err {rel:.3e} > {tol:.0e}" + (f" ({note})" if note else "")
    return ok, rel, cos, msg


def _run_op_cases(
    op_cases: list[Any],
    provider_names: list[str],
    *,
    device: torch.device,
    env: dict[str, Any],
    timing: dict[str, Any] | None,
    tol: float,
    ceilings: tuple[float, float],
    say: Callable[[str], None],
    done: list[dict[str, Any]],
    on_row: Callable[[list[dict[str, Any]]], None] | None,
    interleave: int = 0,
) -> list[dict[str, Any]]:
    """The op families (`lowbit.bench.ops`): one problem per case, one row per provider whose
    group (lowbit / humming / torch) or name is in `provider_names`; same statuses as the
    W4A16 rows (``ok`` / ``FAIL`` not timed / ``error``), baseline named on every row."""

    rows: list[dict[str, Any]] = []
    instances: dict[str, list[Any]] = {}
    t_start = time.time()
    total = sum(len(op_providers(c.family, provider_names)) for c in op_cases)
    step = 0
    last_family = None
    for case in op_cases:
        if last_family is not None and case.family != last_family:
            for provs in instances.values():
                for prov in provs:
                    prov.clear()
            instances.clear()
            clear_weight_cache()
            clear_op_caches()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        last_family = case.family
        if case.family not in instances:
            instances[case.family] = []
            for cls in op_providers(case.family, provider_names):
                prov = cls()
                reason = prov.unavailable_reason()
                if reason:
                    say(f"provider {case.family}/{cls.name}: unavailable: {reason}")
                    continue
                instances[case.family].append(prov)
        cl = op_case_ceilings(case, ceilings)
        baseline = next((p.name for p in FAMILIES[case.family] if p.baseline), None)
        try:
            problem = build_op_problem(case, device)
            problem.reference()
        except Exception as exc:  # noqa: BLE001  (a case that cannot be built: one error row, go on)
            say(f"{case.name}: could not build the problem: {type(exc).__name__}: {exc}")
            row = dict.fromkeys(ROW_KEYS)
            row.update(case=case.name, label=case.label, layout=case.family, profile=case.profile,
                       projection="layer" if case.family == "decode_oc" else "op", provider="-",
                       family=case.family, status="error", message=f"setup: {type(exc).__name__}: {exc}"[:500],
                       gpu=env.get("gpu"), torch=env.get("torch"), lowbit_commit=env.get("lowbit_commit"),
                       date=env.get("date"))
            rows.append(row)
            continue
        entries, tags = [], []
        for prov in instances[case.family]:
            step += 1
            tag = f"[op {step}/{total} {time.time() - t_start:6.1f}s] {case.name} {prov.name}"
            reason = prov.supports(problem)
            if reason:
                say(f"{tag}: skipped ({reason})")
                continue
            row = _op_row(problem, prov, env, cl, tol)
            row["baseline"] = baseline
            entries.append((prov, row, problem, lambda out, p=problem, pv=prov: check_op_output(p, pv, out, tol), cl))
            tags.append(tag)
        _check_then_time(entries, device, timing, say, interleave)
        for (_, row, *_), tag in zip(entries, tags):
            rows.append(row)
            us = f"{row['median_us']:.1f} us" if row.get("median_us") else "-"
            rel = f"rel={row['rel_fro_err']:.1e}" if row.get("rel_fro_err") is not None else ""
            say(f"{tag}: {row['status']} {us} {rel} {row['message'] or ''}".rstrip())
        if on_row is not None and entries:
            on_row(done + rows)
        del problem
    for provs in instances.values():
        for prov in provs:
            prov.clear()
    clear_weight_cache()
    clear_op_caches()
    return rows


# -- output --------------------------------------------------------------------------------
def _fmt(v: Any, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def format_table(rows: list[dict[str, Any]]) -> str:
    """Compact text table: case, proj, provider, us, x vs humming, x vs the row's baseline,
    TB/s, %BW, TFLOP/s, check; then the decode crossover and fp4/fp8 summaries when those
    rows are there (`lowbit.bench.ops.crossover_summary`)."""
    head = ("case", "proj", "provider", "us", "p20-p80", "x hum", "x base", "TB/s", "%BW", "TFLOP/s", "floor us",
            "refcheck")
    lines = []
    for r in rows:
        if r["status"] == "ok":
            check = "ok" if r["rel_fro_err"] is None else f"ok {r['rel_fro_err']:.1e}"
        elif r["status"] == "FAIL":
            check = f"FAIL {r['rel_fro_err']:.1e}" if r.get("rel_fro_err") is not None else "FAIL"
        else:
            check = r["status"]
        spread = (f"{r['p20_us']:.1f}-{r['p80_us']:.1f}" if r.get("p20_us") is not None else "")
        lines.append((
            r["case"], r["projection"], r["provider"], _fmt(r.get("median_us"), ".1f"), spread,
            _fmt(r.get("speedup_vs_humming"), ".2f"), _fmt(r.get("speedup_vs_baseline"), ".2f"),
            _fmt(r.get("tb_per_s"), ".2f"),
            _fmt(None if r.get("bw_fraction") is None else 100 * r["bw_fraction"], ".0f"),
            _fmt(r.get("tflop_per_s"), ".1f"), _fmt(r.get("floor_us"), ".1f"), check,
        ))
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
    right = {3, 4, 5, 6, 7, 8, 9, 10}

    def render(cells: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [render(head), render(tuple("-" * w for w in widths))]
    prev_case = None
    for line in lines:
        if prev_case is not None and line[0] != prev_case:
            out.append("")
        prev_case = line[0]
        out.append(render(line))

    extra = crossover_summary(rows)
    return "\n".join(out + (["", extra] if extra else []))


def write_results(rows: list[dict[str, Any]], out_dir: str | Path, meta: dict[str, Any] | None = None) -> Path:
    """Write ``results.json`` (the list of rows) and ``meta.json`` under `out_dir`; returns the
    results path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(rows, indent=1, default=str) + "\n")
    if meta is not None:
        (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
    return path


# -- no-GPU correctness checks -------------------------------------------------------------
@dataclass
class CpuCheck:
    """A small-shape correctness check runnable without a GPU (Triton interpreter).

    fn returns a list of ``(subcase, passed, detail)``; raising counts as a failure, and
    raising `CheckSkipped` means the thing checked does not exist yet."""

    name: str
    fn: Callable[[], list[tuple[str, bool, str]]]


class CheckSkipped(Exception):
    """Raised by a CPU check whose subject is not implemented yet."""


CPU_CHECKS: list[CpuCheck] = []


def register_cpu_check(name: str) -> Callable[[Callable[[], list[tuple[str, bool, str]]]], Callable]:
    """Decorator: add a check to what ``python -m lowbit bench`` runs without a GPU."""

    def deco(fn: Callable[[], list[tuple[str, bool, str]]]) -> Callable:
        if any(c.name == name for c in CPU_CHECKS):
            raise ValueError(f"CPU check {name!r} registered twice")
        CPU_CHECKS.append(CpuCheck(name, fn))
        return fn

    return deco


def run_cpu_checks(names: Iterable[str] | None = None, progress: Callable[[str], None] | None = _log) -> list[dict[str, Any]]:
    """Run the registered checks (all, or those named); one result dict per subcase:
    ``{"check", "subcase", "status": "ok"|"FAIL"|"skipped", "detail", "seconds"}``."""
    say = progress or (lambda _m: None)
    wanted = set(names) if names else None
    results = []
    for check in CPU_CHECKS:
        if wanted is not None and check.name not in wanted:
            continue
        t0 = time.time()
        try:
            subs = check.fn()
            for sub, ok, detail in subs:
                results.append({"check": check.name, "subcase": sub, "status": "ok" if ok else "FAIL",
                                "detail": detail, "seconds": None})
        except CheckSkipped as exc:
            results.append({"check": check.name, "subcase": "", "status": "skipped", "detail": str(exc), "seconds": None})
        except Exception as exc:  # noqa: BLE001
            results.append({"check": check.name, "subcase": "", "status": "FAIL",
                            "detail": f"{type(exc).__name__}: {exc}"[:300], "seconds": None})
        dt = time.time() - t0
        mine = [r for r in results if r["check"] == check.name]
        mine[-1]["seconds"] = dt
        say(f"check {check.name}: {sum(r['status'] == 'ok' for r in mine)}/{len(mine)} ok ({dt:.1f}s)")
    return results


def format_checks(results: list[dict[str, Any]]) -> str:
    head = ("check", "subcase", "status", "detail")
    lines = [(r["check"], r["subcase"], r["status"], r["detail"]) for r in results]
    widths = [max(len(h), *(len(str(line[i])) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
    widths[3] = min(widths[3], 70)
    fmt = lambda cells: "  ".join(str(c)[:w].ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths))] + [fmt(line) for line in lines])


@register_cpu_check("w4a16-providers")
def _check_providers() -> list[tuple[str, bool, str]]:
    """The harness and the kernels on the CPU: the torch provider and every lowbit W4A16
    kernel that exists (Triton interpreter) vs the FP32 reference, on the smoke cases."""

    out = []
    for name in ("smoke_indexed", "smoke_contiguous", "smoke_masked"):
        case = CASES[name]
        for proj in case.projections:
            problem = build_problem(case, proj.name, "cpu")
            for prov_name in ("torch", "lowbit"):
                prov = PROVIDERS[prov_name]()
                if prov.supports(problem):
                    continue
                prov.prepare(problem)
                ok, rel, cos, msg = refcheck(prov.run(), problem)
                cfg = prov.config()
                what = cfg.get("mode") or (f"block_m={cfg['block_m']}" if "block_m" in cfg else "")
                out.append((f"{name}/{proj.name} {prov_name}({what})", ok, f"rel={rel:.1e} cos={cos:.1e} {msg}".strip()))
    clear_weight_cache()
    return out


def _topk_draws() -> list[tuple[str, torch.Tensor, int, int]]:
    """Small routing draws (label, topk_ids, num_experts, block): decode (T=1), T < block,
    a prime expert count, block 128, and experts left empty by top_k << E."""
    gen = torch.Generator()
    out = []
    for t, k, e, bs in ((1, 8, 48, 16), (5, 2, 7, 64), (37, 8, 48, 32), (64, 4, 13, 128)):
        gen.manual_seed(t * 131 + e)
        ids = torch.rand(t, e, generator=gen).topk(k, dim=-1).indices.to(torch.int32)
        out.append((f"T={t} k={k} E={e} block={bs}", ids, e, bs))
    return out


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and torch.equal(got.cpu(), want.cpu())


@register_cpu_check("routing-triton-vs-ref")
def _check_routing() -> list[tuple[str, bool, str]]:
    """The Triton routing builders (interpreter) equal the PyTorch references bit for bit."""

    out = []
    for label, ids, e, bs in _topk_draws():
        got = routing.moe_align_block_size(ids, bs, e, backend="triton")
        want = routing.moe_align_block_size(ids, bs, e, backend="torch")
        ok = (_same(got.num_tokens_post_padded, want.num_tokens_post_padded)
              and _same(got.sorted_token_ids, want.sorted_token_ids) and _same(got.expert_ids, want.expert_ids))
        out.append((f"moe_align_block_size {label}", ok, ""))
        got_c = routing.build_contiguous(ids, e, backend="triton")
        want_c = routing.build_contiguous(ids, e, backend="torch")
        ok = all(_same(getattr(got_c, f), getattr(want_c, f)) for f in ("m_indices", "row_to_route", "route_to_row", "num_rows"))
        out.append((f"build_contiguous {label}", ok, ""))
        max_m = int(torch.bincount(ids.flatten().long(), minlength=e).max()) + 3
        got_m = routing.build_masked(ids, e, max_m=max_m, backend="triton")
        want_m = routing.build_masked(ids, e, max_m=max_m, backend="torch")
        ok = all(_same(getattr(got_m, f), getattr(want_m, f)) for f in ("masked_m", "row_to_route", "route_to_row"))
        out.append((f"build_masked {label} max_m={max_m}", ok, ""))
    return out


@register_cpu_check("op-families")
def _check_op_families() -> list[tuple[str, bool, str]]:
    """The issue-5/6 op families on tiny shapes (``smoke_*`` op cases): every provider that
    runs without a GPU (lowbit kernels through the interpreter, the torch baselines) against
    its reference, through the same prepare / run / check path the GPU bench takes."""

    out = []
    for case in OP_CASES:
        if not case.smoke:
            continue
        problem = build_op_problem(case, "cpu")
        for cls in op_providers(case.family):
            prov = cls()
            if prov.unavailable_reason() or prov.supports(problem):
                continue
            try:
                prov.prepare(problem)
                ok, rel, cos, msg = check_op_output(problem, prov, prov.run(), REFCHECK_TOL)
                out.append((f"{case.name} {prov.name}", ok, f"rel={rel:.1e} cos={cos:.1e} {msg}".strip()))
            except Exception as exc:  # noqa: BLE001
                out.append((f"{case.name} {prov.name}", False, f"{type(exc).__name__}: {exc}"[:200]))
            finally:
                prov.clear()
    clear_weight_cache()
    clear_op_caches()
    return out
