"""`import lowbit` (and its kernels package) must not initialize CUDA or compile anything."""

import subprocess
import sys

CODE = r"""
import sys
import torch
import lowbit
assert not any(m.startswith("lowbit.kernels.") for m in sys.modules), "import lowbit imported a kernel module"
import lowbit.formats, lowbit.routing, lowbit.reference, lowbit.kernels, lowbit.testing
import lowbit.routing.kernels, lowbit.kernels.w4a16.indexed, lowbit.kernels.w4a16.grouped
assert callable(lowbit.w4a16_indexed) and callable(lowbit.w4a16_masked) and callable(lowbit.pack_w4a16)
assert not torch.cuda.is_initialized(), "import lowbit initialized CUDA"
print("ok")
"""


def test_import_does_not_initialize_cuda():
    res = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_version():
    import lowbit

    assert isinstance(lowbit.__version__, str) and lowbit.__version__.count(".") == 2
