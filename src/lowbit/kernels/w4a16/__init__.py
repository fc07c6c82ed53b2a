"""W4A16 INT4 MoE GEMMs: `indexed` (vLLM's ``moe_align_block_size`` routing) and `grouped`
(contiguous and masked layouts). Rooms: the ops (`indexed`, `grouped`), their heuristics and tile
tables, the portable Triton bodies (`portable`), the INT4 dequantization primitives (`int4`) and
the Hopper Gluon engines (`hopper`)."""
