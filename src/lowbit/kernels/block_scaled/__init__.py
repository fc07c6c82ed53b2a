"""Block-scaled GEMMs: `fp8` (FP8 x FP8 with 1x128 / 128x128 scales) and `fp4` (FP8 activations x
FP4 weights with E8M0 group-32 scales). FP4 builds on FP8's split-K and Gluon engine."""
