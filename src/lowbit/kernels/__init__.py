"""Triton kernels, a package per family (`w4a16`, `moe_decode`, `block_scaled`, `attention`) and
single-file ops (`quant`, `sinkhorn`, `moe_elementwise`); `compile_tier` builds every production
configuration for sm_90a without a GPU.

Importing this package compiles nothing and does not touch CUDA. Set ``TRITON_INTERPRET=1``
before importing a kernel module to run the kernels on the CPU through the Triton interpreter.
"""
