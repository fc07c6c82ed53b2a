"""Output-centric MoE decode (warp decode): gate_up and down organized around outputs, the
combine folded into down. Rooms: `op` (the public op: validate, allocate, launch),
`heuristics` (`moe_decode_config`), `tiles` (the tile tables, data), `portable` (the Triton
``fma`` / ``dot`` bodies) and `hopper` (the Gluon ``mma`` engine for sm_90)."""
