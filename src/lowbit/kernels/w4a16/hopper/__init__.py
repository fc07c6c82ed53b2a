"""Hopper (sm_90a) Gluon engines of the W4A16 GEMMs: the dequantization of K step ``k + 1``
overlapped with the tensor-core products of step ``k``.

Every Triton W4A16 kernel compiles to ``wgmma.wait_group 0`` after each K step (Triton retires
a step's wgmma before the next step's dequantization starts), so the CUDA cores and the tensor
cores take turns; Gluon exposes the wait. Per 256-wide K step a STAGES-deep TMA ring brings the
packed words and scales; the weight rows are wgmma's M side.

Engines (`tiles` lists the tiles each is compiled for):

- register-A (``gluon_rs``): the words loaded from the ring straight into wgmma's A-fragment
  layout, dequantized in place (`int4_gluon`'s subnormal form), fed to asynchronous register-A
  wgmmas (`mainloop`): one, two or four warpgroups, the group loop on one warpgroup under a
  register cap, half-row tails, activations refilled by halves;
- warp-specialized register-A (``gluon_ws``, `warp_specialized`): the same arithmetic with a
  producer partition issuing every load;
- shared-memory (``gluon``): dequantized weights stored to shared memory, SS-wgmma; a
  comparison point, not a default.

Modules: `common` (rings, dequantization steps, stores, descriptors), `routed` (the indexed
layout's routing blocks and cp.async gather), `mainloop`, `warp_specialized`, and the kernels
with their launchers and compile-tier configurations: `grouped` (contiguous, masked), `indexed`,
`nloop` (the indexed layout's one-step-K kernel). Gluon does not run under the Triton
interpreter: the portable Triton kernels are the path on the CPU and on other GPUs.
"""
