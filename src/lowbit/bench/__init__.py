"""Benchmarks of the W4A16 MoE GEMMs against Humming and PyTorch (``python -m lowbit bench``).

- `cases`: the Kimi K2.x scenario registry, routing / data draws, the byte model;
- `providers`: lowbit, humming, torch behind one small interface;
- `timing`: L2-cold CUDA-event timing (median, p20, p80);
- `driver`: refcheck, timing loop, JSON rows, table, and the no-GPU correctness checks;
- `plot`: the PNG (matplotlib, optional).

Importing this package touches no GPU.
"""

from .cases import CASES, DEFAULT_CASE_NAMES, BenchCase, Problem, Projection, build_problem, byte_model, select_cases
from .driver import CPU_CHECKS, ROW_KEYS, collect_env, register_cpu_check, run_bench, run_cpu_checks
from .providers import DEFAULT_PROVIDERS, PROVIDERS, Provider, register_provider
from .timing import Timing, measure

__all__ = [
    "CASES",
    "DEFAULT_CASE_NAMES",
    "BenchCase",
    "Problem",
    "Projection",
    "build_problem",
    "byte_model",
    "select_cases",
    "CPU_CHECKS",
    "ROW_KEYS",
    "collect_env",
    "register_cpu_check",
    "run_bench",
    "run_cpu_checks",
    "DEFAULT_PROVIDERS",
    "PROVIDERS",
    "Provider",
    "register_provider",
    "Timing",
    "measure",
]
