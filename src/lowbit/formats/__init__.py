"""Number formats (SPEC section 1). Every format is registered in `FORMATS` (see `base`)."""

from .base import FORMATS, Format, FormatError, QuantizedTensor, get_format, register_format
from . import int4  # noqa: F401  (registers int4_g32)
from .int4 import from_compressed_tensors, check_compressed_tensors_scheme

__all__ = [
    "FORMATS",
    "Format",
    "FormatError",
    "QuantizedTensor",
    "get_format",
    "register_format",
    "from_compressed_tensors",
    "check_compressed_tensors_scheme",
]
