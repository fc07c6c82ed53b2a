"""What every kernel family shares, below routing and kernels: process facts (`env`), device
capability checks (`device`), the Triton interpreter's numerics layer (`numerics`), programmatic
dependent launch (`pdl`) and the ``LOWBIT_*`` tuning overrides (`overrides`).

Nothing here imports a kernel family; importing this package touches neither CUDA nor Triton.
"""
