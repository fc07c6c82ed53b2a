"""W4A16 INT4 MoE GEMMs: `indexed` (vLLM's ``moe_align_block_size`` routing) and `grouped`
(contiguous and masked layouts). Rooms: the ops (`indexed`, `grouped`), their `heuristics`, the
`tiles` the engines are compiled for, the portable Triton kernels (`portable`), the INT4
dequantization primitives (`int4`, and `int4_gluon` in Gluon) and the Hopper Gluon engines
(`hopper`)."""
