"""Sweep launch configurations of any kernel family through its LOWBIT_* overrides (a tuning
aid, not a test).

    python scripts/config_sweep.py PLAN.json [--rep-ms 30] [--out sweep.json]

PLAN.json: a list of ``{"cases": [bench case names], "env": {"LOWBIT_...": "value", ...}}``
(``env`` empty = the heuristic's own choice, the row to beat). Each entry runs
``python -m lowbit bench --providers lowbit --cuda-graph`` in its own process with the overrides
set, so a configuration that faults (Triton has emitted misaligned-address kernels for some
tiles) only loses its own row; the bench's refcheck against the FP32 reference rides along, so
a fast but wrong configuration shows as ``refcheck`` failed. CUDA-graph replay, L2 flushed:
kernel time without host launch cost. Prints one row per (entry, case), best first per case.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile


def run_entry(cases: list[str], env: dict[str, str], rep_ms: float, timeout: float) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "lowbit", "bench", "--providers", "lowbit", "--cuda-graph", "--no-plot",
               "--rep-ms", str(rep_ms), "--warmup-ms", "10", "--out", tmp, "--cases", *cases]
        try:
            proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired:  # a hung kernel (e.g. an mbarrier never completing)
            return [{"case": c, "status": f"timed out after {timeout:.0f} s"} for c in cases]
        path = os.path.join(tmp, "results.json")
        if proc.returncode != 0 or not os.path.exists(path):
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
            return [{"case": c, "status": f"rc={proc.returncode}: {' | '.join(tail)[:160]}"} for c in cases]
        with open(path) as f:
            return [r for r in json.load(f) if r["projection"] in ("layer", "op", "sum")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("plan")
    ap.add_argument("--rep-ms", type=float, default=30.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--entry-timeout", type=float, default=120.0, help="seconds per plan entry (one process)")
    args = ap.parse_args()
    with open(args.plan) as f:
        plan = json.load(f)
    rows = []
    for entry in plan:
        env = {k: str(v) for k, v in entry.get("env", {}).items()}
        tag = " ".join(f"{k.removeprefix('LOWBIT_')}={v}" for k, v in env.items()) or "(heuristic)"
        for r in run_entry(entry["cases"], env, args.rep_ms, args.entry_timeout):
            rows.append({**r, "sweep_env": tag})
            us = r.get("median_us")
            print(f"{r['case']:<28} {tag:<70} {us if us is None else round(us, 1)!s:>9} "
                  f"{r.get('status', '')} {r.get('rel_fro_err', '')}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    print("\n== best per case (status ok)")
    for case in dict.fromkeys(r["case"] for r in rows):
        ok = sorted((r for r in rows if r["case"] == case and r.get("status") == "ok"), key=lambda r: r["median_us"])
        base = next((r for r in ok if r["sweep_env"] == "(heuristic)"), None)
        for r in ok[:3]:
            ratio = f"{base['median_us'] / r['median_us']:.2f}x vs heuristic" if base else ""
            print(f"{case:<28} {r['median_us']:9.1f} us  {100 * (r.get('bw_fraction') or 0):5.1f}% BW  "
                  f"{r.get('tflop_per_s') or 0:7.1f} TFLOP/s  {ratio:<22} {r['sweep_env']}")


if __name__ == "__main__":
    main()
