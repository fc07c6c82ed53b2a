"""Output-centric MoE decode (warp decode): gate_up and down organized around outputs, the
combine folded into down. The op (`op`), its portable Triton bodies and the Hopper mma.sync
engines (`hopper`)."""
