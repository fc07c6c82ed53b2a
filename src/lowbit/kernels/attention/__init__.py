"""Sparse attention: `sparse_attn` (the op: gather top-k KV rows by index, online softmax with a
per-head sink), `heuristics` (its launch configuration), `tiles` (the tiles the engines are built
for), `portable` (the Triton kernels) and `hopper` (the Gluon sm_90 engine)."""
