"""Loading real checkpoints: a Hugging Face model directory, lazily, shard by shard.

    ckpt = lowbit.checkpoint.open("/models/Kimi-K2-Thinking")
    ckpt.config, ckpt.scheme, ckpt.layers.moe, ckpt.layers.dense
    w13, w2 = ckpt.experts(layer, experts=range(48 * rank, 48 * rank + 48), device="cuda")
    out = lowbit.moe_experts(hidden, topk_ids, topk_weights, w13, w2)
    w, s = ckpt.linear_weight("model.layers.0.self_attn.q_a_proj")   # lowbit.linear(x, w, s)

Formats: compressed-tensors ``pack-quantized`` INT4 group-32 symmetric (Kimi K2.x), DeepSeek
FP8 128x128 block weights (``weight_scale_inv``), DeepSeek-V4 MXFP4 experts and NVIDIA ModelOpt
NVFP4 (`lowbit.checkpoint.experts` has the table). The whole quantization scheme is validated
when the directory is opened (`lowbit.checkpoint.schemes`); a missing shard or tensor, a wrong
dtype or shape, or a truncated shard raises `lowbit.formats.FormatError` naming the file, the
tensor and the field.

Modules: `directory` (the lazy directory / shard reader), `schemes` (quantization schemes),
`layers` (MoE / dense layers from the config), `experts` (assembling a layer's experts),
`progress` (the progress bar), `loader` (`Checkpoint`). Reading tensors needs the
``safetensors`` package (``pip install lowbit[checkpoint]``); ``tqdm`` draws the progress bar
when installed. Neither is imported until a tensor is read.
"""

from .directory import CheckpointDirectory, TensorInfo
from .layers import LayerPlan
from .loader import Checkpoint, open_checkpoint
from .schemes import CompressedTensorsInt4, Fp8Block, ModelOptNvfp4, QuantScheme, Unquantized, parse_scheme

#: ``lowbit.checkpoint.open(path)``: `open_checkpoint`
open = open_checkpoint  # noqa: A001  (the module's entry point, as in ``tarfile.open``)

__all__ = [
    "open",
    "open_checkpoint",
    "Checkpoint",
    "CheckpointDirectory",
    "TensorInfo",
    "LayerPlan",
    "QuantScheme",
    "CompressedTensorsInt4",
    "Fp8Block",
    "ModelOptNvfp4",
    "Unquantized",
    "parse_scheme",
]
