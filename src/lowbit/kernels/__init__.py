"""Triton kernels, one module per family (the ``@triton.jit`` body, its launcher, its heuristics).

Importing this package compiles nothing and does not touch CUDA. Set ``TRITON_INTERPRET=1``
before importing it to run the kernels on the CPU through the Triton interpreter.
"""
