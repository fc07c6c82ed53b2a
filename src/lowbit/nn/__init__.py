"""lowbit as ``torch.nn`` modules.

- `MoEExperts`: the routed experts of one MoE layer on INT4 group-32 weights
  (`lowbit.moe_experts`), with ``from_checkpoint(ckpt, layer, experts=..., device=...)`` and
  ``from_weights(w13, w2)``; its call is a Hugging Face experts module's, so it replaces one.
- `Linear`: `lowbit.linear` over FP8 128x128-block or MXFP4 weights.
- `hf`: swapping a transformers model's experts modules (`replace_experts`) and loading the rest
  of its weights from a checkpoint (`load_dense_weights`).

Eager calls go straight to lowbit's Python entry points; under ``torch.compile`` the modules
call the ``torch.ops.lowbit`` operators (`lowbit.ops`, registered then), which have fake
implementations, so ``fullgraph=True`` traces them. Importing this package imports no kernel.
"""

from . import hf
from .hf import load_dense_weights, replace_experts
from .linear import Linear
from .moe import MoEExperts, remap_expert_ids

__all__ = ["MoEExperts", "Linear", "remap_expert_ids", "replace_experts", "load_dense_weights", "hf"]
