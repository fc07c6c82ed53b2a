"""Per-call host cost of the two ways to register a PyTorch custom op, on the CPU.

    python scripts/probes/op_registration_cost.py [--calls 20000]

Every variant returns ``torch.empty_like`` of its first input (a custom op may not return an
input), so beyond that one allocation the time is the dispatch alone. Two signatures: one
tensor, and the `lowbit.ops.moe_experts` shape of call (seven tensors and four ints).
- ``torch.library.custom_op`` (the decorator: schema inference, a Python wrapper that checks
  and dispatches through ``CustomOpDef``);
- ``torch.library.Library(ns, "DEF")`` + ``define`` + ``impl`` (the dispatcher calls the Python
  kernel directly), the registration `lowbit.ops` uses;
- the plain Python function, for the floor.
Prints the median over five rounds of `calls` calls, in microseconds a call.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _one(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _many(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor, e: torch.Tensor, f: torch.Tensor,
          g: torch.Tensor, n1: int, k1: int, n2: int, k2: int) -> torch.Tensor:
    return torch.empty_like(a)


def _time(fn, args: tuple, calls: int) -> float:
    for _ in range(200):
        fn(*args)
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()

    many_schema = ("(Tensor a, Tensor b, Tensor c, Tensor d, Tensor e, Tensor f, Tensor g, int n1, int k1, "
                   "int n2, int k2) -> Tensor")
    lib = torch.library.Library("regcost_probe", "DEF")
    lib.define("one(Tensor x) -> Tensor")
    lib.impl("one", _one, "CompositeExplicitAutograd")
    lib.define("many" + many_schema)
    lib.impl("many", _many, "CompositeExplicitAutograd")
    one_custom = torch.library.custom_op("regcost_probe::one_custom_op", _one, mutates_args=())
    many_custom = torch.library.custom_op("regcost_probe::many_custom_op", _many, mutates_args=())

    x = torch.zeros(4)
    one_args = (x,)
    many_args = (x,) * 7 + (256, 256, 256, 128)
    rows = [
        ("python function", _one, _many),
        ("Library.define + impl", torch.ops.regcost_probe.one, torch.ops.regcost_probe.many),
        ("torch.library.custom_op", one_custom, many_custom),
    ]
    print(f"torch {torch.__version__}, {args.calls} calls x 5 rounds, median us/call (CPU)")
    print(f"  {'registration':28s} {'1 tensor':>9s} {'7 tensors + 4 ints':>19s}")
    for name, one, many in rows:
        print(f"  {name:28s} {_time(one, one_args, args.calls):9.2f} {_time(many, many_args, args.calls):19.2f}")


if __name__ == "__main__":
    main()
