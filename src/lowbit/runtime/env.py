"""Process-level facts lowbit's dispatch needs, without importing Triton or touching CUDA."""

import os

__all__ = ["interpreter_active"]


def interpreter_active() -> bool:
    """True when Triton kernels run under the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
