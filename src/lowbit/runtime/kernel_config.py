"""`KernelConfig`: one production configuration of a kernel, as the compile tier builds it.

A leaf, so that every family (routing's kernels included) can list its configurations without
importing the compile tier that builds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["KernelConfig"]


@dataclass(frozen=True)
class KernelConfig:
    """One production configuration of a ``@triton.jit`` kernel.

    signature: Triton type strings per argument (``"*bf16"``, ``"i32"``, ``"constexpr"``).
    constexprs: values of the constexpr arguments.
    expect_sass: SASS mnemonics that must appear (e.g. ``("HGMMA",)``).
    """

    name: str
    fn: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 1
    expect_sass: tuple[str, ...] = ()
    #: PTX substrings that must appear (e.g. ``"wgmma.wait_group.sync.aligned 1"``: an async
    #: wgmma left in flight, which the SASS alone does not show)
    expect_ptx: tuple[str, ...] = ()
    #: integer arguments that are not multiples of 16 in production; every other pointer and
    #: integer is compiled with the 16-divisibility the runtime specializes on (as it does for
    #: torch allocations and Kimi K2.x sizes), which changes vectorization, pipelining and so
    #: the shared memory a launch needs
    unaligned: tuple[str, ...] = ()
    #: stack bytes of register spills tolerated; anything above 0 must cite a measurement
    #: showing the spilling configuration is still the fastest
    max_spill_bytes: int = 0
    #: ptxas performance codes tolerated (e.g. ``"C7515"``: wgmma serialized); like spills, each
    #: must cite a measurement showing the configuration is still worth building
    allowed_ptxas: tuple[str, ...] = ()
    #: ptxas register cap the launcher passes (``maxnreg``), None when it passes none
    maxnreg: int | None = None
