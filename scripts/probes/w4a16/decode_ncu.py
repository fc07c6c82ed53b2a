"""Run one Kimi W4A16 bench projection through lowbit and Humming a few times each, for ncu --
a probe, not a benchmark.

    ncu --clock-control none --launch-skip 3 --launch-count 1 -k regex:<kernel> \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        python scripts/probes/w4a16/decode_ncu.py [case] [proj] [reps]

Stall reasons and instruction counts of both libraries' kernels (docs/measurements/w4a16.md):

    ncu --clock-control none -k regex:'w4a16_indexed_rs|^humming$' --launch-count 6 \\
        --section SpeedOfLight --section Occupancy --section LaunchStats \\
        --metrics regex:'smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio',\\
    smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active,\\
    sm__inst_executed.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \\
        python scripts/probes/w4a16/decode_ncu.py ep8_indexed_t256 gate_up 3

case: a bench case name (default ep8_indexed_t1), proj: gate_up or down (default gate_up).
Each provider runs `reps` times (default 5) after its untimed prepare, lowbit first; the kernel
names are printed so a regex can pick them.
"""
import sys

import torch

from lowbit.bench.cases import build_problem, select_cases
from lowbit.bench.providers import PROVIDERS

case_name = sys.argv[1] if len(sys.argv) > 1 else "ep8_indexed_t1"
proj = sys.argv[2] if len(sys.argv) > 2 else "gate_up"
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 5
(case,) = select_cases([case_name])
problem = build_problem(case, proj, "cuda")
for name in ("lowbit", "humming"):
    prov = PROVIDERS[name]()
    prov.prepare(problem)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(name)
    for _ in range(reps):
        prov.run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(name, prov.config(), flush=True)
