"""Programmatic dependent launch (PDL, sm_90+) for the kernel chain of an MoE layer.

A kernel launched with PDL may start while the kernel before it on the stream is still running:
its CTAs are scheduled once every CTA of that kernel has called ``griddepcontrol.launch_dependents``
(or exited), and ``griddepcontrol.wait`` blocks until that kernel has *completed* with its
writes visible. What a chain gains: the launch, the CTA start-up and, where a kernel reads
constant data first, its first weight bytes overlap the previous kernel's tail. At decode,
where each GEMM streams its weights in tens of microseconds, those edges are a few percent
of the layer.

The protocol every lowbit kernel launched with PDL keeps (the kernels take a ``PDL``
constexpr; ``0`` = launched without it, no wait):

- it calls `wait_prior` / `gl_wait_prior` before it reads anything a previous kernel wrote and
  before it writes anything (a predecessor may still read or write it);
- it calls `release_next` / `gl_release_next` only *after* its wait, except a kernel that reads
  nothing before its wait (`moe_elementwise`'s two), which releases first. So, when a kernel
  starts, the kernel two launches before it has completed: data written that far back may be
  read before the wait (the indexed GEMM's ``PDL=2``: the MoE layer's down projection reads its
  routing, built before gate_up, and TMAs its first weight steps, then waits on ``silu_mul``).

A kernel launched without PDL after one that released early simply waits for it to complete
(the stream's usual order). ``LOWBIT_PDL=0`` launches everything without PDL (the kernels'
``PDL=0`` forms), for comparison or to rule it out.
"""

from __future__ import annotations

import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .env import interpreter_active

__all__ = ["ENV", "gl_release_next", "gl_wait_prior", "launch_options", "pdl_enabled", "release_next", "wait_prior"]

ENV = "LOWBIT_PDL"


def pdl_enabled(device: torch.device) -> bool:
    """Whether launches on `device` use PDL: an NVIDIA GPU of compute capability 9.0 or newer
    (not ROCm, whose devices are "cuda" to torch too), the interpreter off, and ``LOWBIT_PDL``
    not ``0`` (read at every launch)."""
    if (interpreter_active() or device.type != "cuda" or torch.version.hip is not None
            or os.environ.get(ENV, "1") == "0"):
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_options(pdl: bool) -> dict:
    """The launch keyword of a PDL launch (``kernel[grid](..., **launch_options(pdl))``); empty
    otherwise, as the interpreter's launcher knows no such option."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def wait_prior():
    """Block until the previous kernel on the stream completed, its writes visible (a no-op
    when this launch is not a dependent one)."""
    gdc_wait()


@triton.jit
def release_next():
    """Let the next kernel (launched with PDL) start once every CTA of this one has called this."""
    gdc_launch_dependents()


@gluon.jit
def gl_wait_prior():
    """`wait_prior` in a Gluon kernel."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def gl_release_next():
    """`release_next` in a Gluon kernel."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)
