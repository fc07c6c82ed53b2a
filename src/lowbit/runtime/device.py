"""What every Hopper (Gluon) engine checks before it launches: one place, so the three
launchers (`fp8_gemm`, `w4a16_indexed`, `w4a16_grouped`) refuse the same things the same way."""

from __future__ import annotations

from functools import lru_cache

import torch

from .env import interpreter_active

__all__ = ["H200_NUM_SMS", "is_sm90_native", "num_sms", "require_sm90", "tma_problem"]

#: SMs of the H200 (the first target): what the heuristics size grids for when no CUDA device is
#: visible, or when a rule was measured there.
H200_NUM_SMS = 132


@lru_cache(maxsize=64)
def _device_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def num_sms(device: torch.device) -> int:
    """The SMs a grid on `device` spreads over: the GPU's, or `H200_NUM_SMS` off CUDA (a heuristic's
    answer must not depend on whether a GPU is visible)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return _device_sms(device)
    return H200_NUM_SMS


def is_sm90_native(device: torch.device) -> bool:
    """True when Gluon sm_90 kernels can run on `device`: a CUDA Hopper GPU, interpreter off
    (what a heuristic asks before it picks a Gluon engine by default)."""
    return (not interpreter_active() and device.type == "cuda"
            and torch.cuda.get_device_capability(device)[0] == 9)


def require_sm90(device: torch.device, who: str) -> None:
    """Raise a clear ValueError unless `device` is a CUDA sm_90 GPU and the Triton interpreter
    is off (Gluon kernels run natively only)."""
    if interpreter_active() or device.type != "cuda":
        raise ValueError(f"{who}: engine='gluon' needs a CUDA GPU (Gluon does not run under the Triton "
                         "interpreter; use engine='triton')")
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        raise ValueError(f"{who}: engine='gluon' is the sm_90 (Hopper) kernel, this GPU is sm_{major}{minor}")


def tma_problem(t: torch.Tensor, name: str) -> str | None:
    """None when the 2-D row-major tensor `t` can be TMA-described; else why not (TMA needs a
    contiguous last dimension, a 16-byte aligned base and 16-byte aligned row strides)."""
    if t.stride(1) != 1:
        return f"{name} is not contiguous along its last dimension"
    if t.data_ptr() % 16 or (t.stride(0) * t.element_size()) % 16:
        return f"{name} needs a 16-byte aligned base and row stride for TMA (row stride {t.stride(0)} elements)"
    return None
