"""Compile tier: every production kernel configuration compiles for sm_90a (no GPU needed),
fits in shared memory, does not spill, and shows the matrix instructions it was written for.
Runs in a subprocess because the interpreter tier replaces JIT functions in this one."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)


def _run(code: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.compile
def test_all_production_configs_compile_for_sm90a():
    reports = _run(
        "import json, dataclasses\n"
        "from lowbit.kernels.compile_tier import run_all, all_configs\n"
        "print(json.dumps([dataclasses.asdict(r) for r in run_all()]))\n"
    )
    assert len(reports) >= 40, "fewer configurations than routing + W4A16 + sparse_attn"
    bad = [r for r in reports if not r["ok"]]
    assert not bad, "\n".join(
        f"{r['name']}: smem={r['shared_bytes']} spill={r['spill_bytes']} missing={r['sass_missing']} "
        f"warnings={r['ptxas_warnings']} {r['error']}" for r in bad)
    for r in reports:
        assert r["shared_bytes"] <= 232448
    _nloop_occupancy_matches_its_table(reports)


def _nloop_occupancy_matches_its_table(reports: list[dict]) -> None:
    """The N-loop heuristics' CTAs an SM (`lowbit.kernels.w4a16.tiles.NLOOP_CTAS_PER_SM`, which sizes its waves) are
    what the compiled tiles' registers and shared memory allow (65,536 registers in units of 8 a
    thread; 228 KB of shared memory, 1 KB of it reserved a CTA)."""
    import re

    from lowbit.kernels.w4a16.tiles import NLOOP_CTAS_PER_SM

    seen = set()
    for r in reports:
        m = re.match(r"w4a16_indexed_sm90_nloop\[BW=\d+,BR=(\d+),w=(\d+),", r["name"])
        if not m:
            continue
        br, warps = int(m[1]), int(m[2])
        by_regs = 65536 // (-(-r["registers"] // 8) * 8 * 32 * warps)
        by_smem = 233472 // (r["shared_bytes"] + 1024)
        assert min(by_regs, by_smem) == NLOOP_CTAS_PER_SM[br], (r["name"], r["registers"], r["shared_bytes"])
        seen.add(br)
    assert seen == set(NLOOP_CTAS_PER_SM), seen


@pytest.mark.compile
def test_compile_checker_sees_matrix_instructions():
    """Self-test of the checker on a bf16 GEMM: HGMMA is found, a wrong expectation is reported."""
    reports = _run(
        "import json, dataclasses\n"
        "import canary_kernels\n"
        "from lowbit.kernels.compile_tier import compile_sm90\n"
        "print(json.dumps([dataclasses.asdict(compile_sm90(c)) for c in canary_kernels.compile_configs()]))\n"
    )
    by = {r["name"]: r for r in reports}
    good, wrong = by["canary_gemm[expect HGMMA]"], by["canary_gemm[expect QGMMA]"]
    assert good["ok"] and good["sass_missing"] == [] and good["shared_bytes"] > 0, good
    assert not wrong["ok"] and wrong["sass_missing"] == ["QGMMA"], wrong
