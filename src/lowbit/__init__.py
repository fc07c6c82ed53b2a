"""lowbit: low-bit MoE inference kernels for NVIDIA Hopper, in Triton.

Importing lowbit never initializes CUDA and never imports a kernel module: the kernel entry
points below are resolved on first attribute access, so ``TRITON_INTERPRET=1`` can still be
set after ``import lowbit`` (it must be set before the first kernel is touched).

Sub-packages, in import order (each imports only those before it): `runtime` (shared GPU
helpers), `formats` (number formats and prepared weight layouts), `routing` (MoE routing layouts
and their kernels), `reference` (pure-PyTorch FP32 ground truth), `kernels` (a package per
family), `layers` (`moe_experts`, `linear`), `checkpoint` (Hugging Face checkpoints:
``lowbit.checkpoint.open(path)``, imported on first use), `models`, `testing`, `bench` and the CLI.
"""

from importlib import import_module

from ._version import __version__  # noqa: E402

from . import formats  # noqa: E402,F401
from .formats import FormatError  # noqa: E402,F401

#: public name -> (module, attribute), imported lazily
_LAZY = {
    "pack_w4a16": ("lowbit.formats.w4a16", "pack_w4a16"),
    "pack_w4a16_grouped": ("lowbit.formats.w4a16", "pack_w4a16_grouped"),
    "W4A16Weight": ("lowbit.formats.w4a16", "W4A16Weight"),
    "moe_align_block_size": ("lowbit.routing", "moe_align_block_size"),
    "build_contiguous": ("lowbit.routing", "build_contiguous"),
    "build_masked": ("lowbit.routing", "build_masked"),
    "w4a16_indexed": ("lowbit.kernels.w4a16.indexed", "w4a16_indexed"),
    "w4a16_indexed_config": ("lowbit.kernels.w4a16.indexed", "w4a16_indexed_config"),
    "w4a16_contiguous": ("lowbit.kernels.w4a16.grouped", "contiguous"),
    "w4a16_masked": ("lowbit.kernels.w4a16.grouped", "masked"),
    "moe_experts": ("lowbit.layers.moe", "moe_experts"),
    "linear": ("lowbit.layers.linear", "linear"),
}

#: sub-packages imported on first attribute access
_LAZY_SUBMODULES = ("checkpoint",)

__all__ = ["__version__", "formats", "FormatError", *_LAZY_SUBMODULES, *_LAZY]


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        return import_module(f"lowbit.{name}")
    if name in _LAZY:
        mod, attr = _LAZY[name]
        value = getattr(import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lowbit' has no attribute {name!r}")
