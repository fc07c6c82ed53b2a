"""Sparse attention: `sparse_attn` (gather top-k KV rows by index, online softmax with a per-head
sink), its portable Triton body and the Hopper Gluon engine (`hopper`)."""
