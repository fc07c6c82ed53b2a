"""Layers composed from the kernels: `moe.moe_experts` (the expert part of a MoE block, on the
faster of its two paths for the batch) and `linear.linear` (dispatch on the weight's format)."""
