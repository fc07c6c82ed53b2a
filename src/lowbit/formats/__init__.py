"""Number formats (SPEC section 1). Every format is registered in `FORMATS` (see `base`)."""

from .base import FORMATS, Format, FormatError, QuantizedTensor, get_format, register_format
from . import int4  # noqa: F401  (registers int4_g32)
from . import fp8  # noqa: F401  (registers fp8_e4m3_g{128,32}[_ue8m0])
from . import fp4  # noqa: F401  (registers mxfp4, nvfp4)
from . import mxfp8  # noqa: F401  (registers mxfp8)
from .int4 import from_compressed_tensors, check_compressed_tensors_scheme
from .fp8 import (
    dequantize_fp8_blocks,
    dequantize_fp8_groups,
    e8m0_decode,
    e8m0_encode,
    quantize_fp8_blocks,
    quantize_fp8_groups,
    ue8m0_round_up,
)
from .fp4 import (
    dequantize_mxfp4,
    dequantize_nvfp4,
    e2m1_to_float,
    pack_fp4,
    quantize_e2m1,
    quantize_mxfp4,
    quantize_nvfp4,
    unpack_fp4,
)
from .mxfp8 import dequantize_mxfp8, quantize_mxfp8
from .moe_mxfp8 import Mxfp8ExpertWeight, pack_mxfp8_experts
from .experts import check_expert_weight, check_expert_weight_pair

__all__ = [
    "FORMATS",
    "Format",
    "FormatError",
    "QuantizedTensor",
    "get_format",
    "register_format",
    "from_compressed_tensors",
    "check_compressed_tensors_scheme",
    "quantize_fp8_groups",
    "dequantize_fp8_groups",
    "quantize_fp8_blocks",
    "dequantize_fp8_blocks",
    "ue8m0_round_up",
    "e8m0_encode",
    "e8m0_decode",
    "quantize_e2m1",
    "e2m1_to_float",
    "pack_fp4",
    "unpack_fp4",
    "quantize_mxfp4",
    "dequantize_mxfp4",
    "quantize_nvfp4",
    "dequantize_nvfp4",
    "quantize_mxfp8",
    "dequantize_mxfp8",
    "Mxfp8ExpertWeight",
    "pack_mxfp8_experts",
    "check_expert_weight",
    "check_expert_weight_pair",
]
