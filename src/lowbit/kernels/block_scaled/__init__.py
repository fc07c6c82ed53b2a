"""Block-scaled GEMMs: `fp8` (FP8 x FP8 with 1x128 / 128x128 scales) and `fp4` (FP8 activations x
FP4 weights with E8M0 group-32 scales), the ops; `heuristics` (their launch configurations),
`tiles` (the tiles the engines are built for), `portable` (the Triton kernels), `splitk` (split-K
shared by every engine), `hopper_fp8` / `hopper_fp4` (the Gluon sm_90 engines). FP4 builds on
FP8's operand checks and Gluon GEMM."""
