"""lowbit: low-bit MoE inference kernels for NVIDIA Hopper, in Triton.

Importing lowbit never initializes CUDA: kernels compile and launch on first call only.
Sub-packages: `formats` (number formats), `routing` (MoE routing layouts),
`reference` (pure-PyTorch FP32 ground truth), `kernels` (Triton), `testing`, `bench`.
"""

__version__ = "0.1.0"

from . import formats  # noqa: E402,F401
from .formats import FormatError  # noqa: E402,F401
