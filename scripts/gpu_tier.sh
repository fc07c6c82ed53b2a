#!/usr/bin/env bash
# The H200 tier in one command: install the Humming baseline and lowbit, run the whole test
# suite natively on the GPU, then the default benchmark; logs and results go under $OUT.
# Run it on the GPU machine (docs/gpu.md):  bash scripts/gpu_tier.sh   (the Humming wheel in .whl/)
#
# Knobs (environment):
#   OUT            output folder (default ./gpu_out)
#   STEPS          which steps, default "tests bench"
#   TESTS          pytest targets, default "tests"; PYTEST_ARGS extra pytest arguments (split on
#                  spaces: no quoting); PYTEST_K a -k expression (may contain spaces)
#   BENCH_ARGS     extra `python -m lowbit bench` arguments (e.g. "--cases ep8_indexed_t20")
#   SWEEPS         plans for the "sweeps" step (default scripts/sweeps/*.json; docs/gpu.md)
#   TEST_TIMEOUT / BENCH_TIMEOUT / SWEEP_TIMEOUT   seconds per step (defaults 330 / 240 / 240:
#                  the three fit in a 600 s command limit)
#   LOWBIT_COMMIT  commit id to stamp on the rows (where the tree has no .git)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_out}"
STEPS="${STEPS:-tests bench}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# 1. Humming (optional baseline): the wheel in .whl/, installed beside the image's torch.
if ls .whl/*.whl >/dev/null 2>&1; then
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
        export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "warning: humming wheel did not install: the humming provider will report unavailable"
    fi
else
    echo "warning: no .whl/*.whl: the humming provider will report unavailable"
fi

# 2. lowbit itself, editable, against the image's torch/triton (no dependency resolution).
if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1; then
    echo "warning: pip install -e . failed (see pip.log); falling back to PYTHONPATH=src"
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -m lowbit env | tee "$OUT/env.txt"

# 3. The whole suite natively on the GPU (gpu-marked tests included).
tests_rc="not run"
if [[ " $STEPS " == *" tests "* ]]; then
    echo "== pytest ${TESTS:-tests}"
    # shellcheck disable=SC2086
    timeout "${TEST_TIMEOUT:-330}" python3 -m pytest ${TESTS:-tests} -q -m "gpu or not gpu" -p no:cacheprovider \
        ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-} >"$OUT/pytest.log" 2>&1
    tests_rc=$?
    tail -n 25 "$OUT/pytest.log"
fi

# 4. The benchmark (default: the headline points), results.json + bench.png under $OUT/bench.
bench_rc="not run"
if [[ " $STEPS " == *" bench "* ]]; then
    echo "== python -m lowbit bench ${BENCH_ARGS:-}"
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-240}" python3 -m lowbit bench --out "$OUT/bench" ${BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
    bench_rc=$?
fi

# 5. Configuration sweeps (scripts/config_sweep.py): one summary per plan, rows in sweeps/*.json.
sweep_rc="not run"
if [[ " $STEPS " == *" sweeps "* ]]; then
    mkdir -p "$OUT/sweeps"
    sweep_rc=0
    deadline=$((SECONDS + ${SWEEP_TIMEOUT:-240}))
    for plan in ${SWEEPS:-scripts/sweeps/*.json}; do
        left=$((deadline - SECONDS))
        if (( left <= 5 )); then echo "sweeps: out of time before $plan"; sweep_rc=124; break; fi
        name=$(basename "$plan" .json)
        echo "== sweep $name"
        timeout "$left" python3 scripts/config_sweep.py "$plan" --rep-ms 20 --out "$OUT/sweeps/$name.json" \
            >"$OUT/sweeps/$name.log" 2>&1 || sweep_rc=$?
        sed -n '/== best per case/,$p' "$OUT/sweeps/$name.log"
    done
fi

# 6. Short table last: per-layer (gate_up + down) rows of every case and provider.
echo "== summary: pytest rc=$tests_rc (pytest.log), bench rc=$bench_rc (bench.log, bench/results.json), sweeps rc=$sweep_rc (sweeps/)"
if [[ -f "$OUT/bench/results.json" ]]; then
    python3 - "$OUT/bench/results.json" <<'PY'
import json, sys
from lowbit.bench.driver import format_table
rows = json.load(open(sys.argv[1]))
print(format_table([r for r in rows if r["projection"] in ("sum", "layer", "op") or r["status"] != "ok"]))
PY
fi
[[ "$tests_rc" == 0 || "$tests_rc" == "not run" ]] && [[ "$bench_rc" == 0 || "$bench_rc" == "not run" ]] \
    && [[ "$sweep_rc" == 0 || "$sweep_rc" == "not run" ]]
