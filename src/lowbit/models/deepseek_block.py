"""A small DeepSeek-V4-style block with random weights, run through lowbit's kernels or its
FP32 references (seed 004: the ``python model.py`` smoke test, with numerical checks).

One block (one layer) of the residual stream ``x [b, s, hc, dim]`` (bf16, ``hc`` = 4
hyper-connection copies)::

    # attention sub-block
    h, post, comb = hc_pre(x, attn_hc)                  # Sinkhorn mixing (hc_split_sinkhorn)
    h   = rms_norm(h, attn_norm)                        # bf16 [b, s, dim]
    q   = linear(h, wq)      -> [b, s, heads, d]        # FP8 128x128 block-scaled weights
    kv  = rms_norm(linear(h, wkv), kv_norm)             # FP8 weight; one KV row per position
    kv  = act_quant(kv, 32, "ue8m0", inplace=True)      # FP8 quantize-dequantize (KV cache rounding)
    qi, ki = linear(h, wq_idx), linear(h, wk_idx)       # indexer projections (FP8 weights)
    cache.kv[pos], cache.k_idx[pos] = kv, ki            # append to the MQA KV cache
    idx = topk over visible positions of  qi . cache.k_idx   (FP32; -1 where fewer than topk)
    o   = sparse_attn(q, cache.kv, attn_sink, idx)      # keys = values = the cached rows
    a   = linear(o.flatten(-2), wo)                     # FP8 weight
    x   = hc_post(a, x, post, comb)
    # MoE sub-block
    h, post, comb = hc_pre(x, ffn_hc);  h = rms_norm(h, ffn_norm)
    w, e = top-k of softmax(h @ gate^T)  (FP32 router, weights renormalised)
    m   = sum_j w_j * linear(bf16(silu(linear(h, w1[e_j])) * linear(h, w3[e_j])), w2[e_j])
                                                        # MXFP4 experts, FP8 activations in groups of 32
    x   = hc_post(m, x, post, comb)

Hyper-connections, as in DeepSeek V4's ``hc_pre`` / ``hc_post`` (as documented in
`lowbit.reference.sinkhorn`; the RMS-normalised projection of the flattened copies is the
mHC paper's)::

    xf    = x.flatten(copies, dim) in FP32;  mixes = (xf @ hc_fn^T) * rsqrt(mean(xf^2) + eps)
    pre, post, comb = hc_split_sinkhorn(mixes, hc_scale, hc_base, hc, iters=20, eps=1e-6)
    h     = sum_j pre[j] * x[j]                                      (hc_pre -> bf16)
    x'[k] = post[k] * block_out + sum_j comb[j, k] * x[j]            (hc_post -> bf16)

Backends: ``"kernels"`` runs `lowbit.layers.linear.linear` (act_quant + fp8_gemm / fp4_gemm Triton
kernels), `lowbit.kernels.quant.act_quant` (in-place KV rounding),
`lowbit.kernels.attention.sparse_attn.sparse_attn` and `lowbit.kernels.sinkhorn.hc_split_sinkhorn`;
``"reference"`` runs the same dataflow through ``act_quant_ref`` + ``fp8_gemm_ref`` /
``fp4_gemm_ref``, ``sparse_attn_ref`` and ``hc_split_sinkhorn_ref``, with the same quantized
weights and the same rounding points (every GEMM and attention output rounded to bf16, as the
kernels write it). Everything else (norms, hc mixing, indexer scores, router, SiLU) is the same
PyTorch code in both.

Discrete decisions (the indexer's top-k, the router's experts) can be handed from one run to
the other (``decisions=``): two pipelines whose GEMMs differ by bf16 rounding can otherwise
pick different positions / experts at a near tie, which is a legitimate difference, not a
kernel error. A run records its own choice next to the imposed one and the score gap between
them (`StepResult.flip_gap`), so a test can check that any disagreement is a near tie.

Simplifications relative to DeepSeek V4 (all deliberate, for a CPU-sized numerical check):
- one block, tiny dims (dim 256, 8 heads of d 64, 4 experts top-2, intermediate 128); random
  weights; inputs are random embeddings (no vocabulary, no sampling: decode inputs are given);
- attention: plain MQA projections (no MLA low-rank q / kv, no q norm, no RoPE and hence no
  un-rotation of the output, no grouped output projection); one KV cache of every position
  (no sliding window + compressed-KV split, no compression); KV rounding in groups of 32 with
  power-of-two scales (V4: FP8 groups of 64 for the non-RoPE part);
- indexer: one head, bf16 q/k from FP8 linears, plain FP32 dot products (V4: several heads
  with ReLU and learned weights, Hadamard rotation, FP8/FP4 quantized keys);
- router: softmax + top-k in FP32, renormalised (V4: sqrt-softplus scores, bias correction,
  hash routing in the first layers); no shared expert, no SwiGLU clamp;
- hyper-connections: the ``hc_pre`` / ``hc_post`` roles above; the model's first / last layer
  plumbing (expanding the embedding to hc copies, the final ``hc_head`` reduction) is left to
  the driver (copies of the embedding) and to the caller (the block returns the stream).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

__all__ = ["BACKENDS", "BlockConfig", "DeepSeekBlock", "KVCache", "StepResult", "run_prefill_decode"]

BACKENDS = ("kernels", "reference")

_BF16 = torch.bfloat16


@dataclass(frozen=True)
class BlockConfig:
    """Dimensions of the block. GEMM K dims (dim, heads * head_dim, inter) must be multiples
    of 128 (whole act_quant groups); head_dim a multiple of `kv_quant_block`."""

    dim: int = 256
    n_heads: int = 8
    head_dim: int = 64
    index_dim: int = 64
    index_topk: int = 8
    n_experts: int = 4
    n_activated: int = 2
    inter_dim: int = 128
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    norm_eps: float = 1e-6
    scale_fmt: str | None = "ue8m0"  # activation scales of every linear (DeepSeek V4: ue8m0)
    expert_act_block: int = 32  # activation group of the FP4 expert GEMMs
    kv_quant_block: int = 32  # group of the in-place FP8 rounding of the KV rows

    def __post_init__(self):
        for name in ("dim", "inter_dim"):
            if getattr(self, name) % 128:
                raise ValueError(f"BlockConfig.{name}={getattr(self, name)} must be a multiple of 128")
        if (self.n_heads * self.head_dim) % 128:
            raise ValueError("BlockConfig: n_heads * head_dim must be a multiple of 128 (wo's K)")
        if self.head_dim % self.kv_quant_block or self.kv_quant_block not in (32, 128):
            raise ValueError("BlockConfig: kv_quant_block must be 32 or 128 and divide head_dim")
        if not 1 <= self.n_activated <= self.n_experts:
            raise ValueError("BlockConfig: need 1 <= n_activated <= n_experts")
        if self.expert_act_block not in (32, 128):
            raise ValueError("BlockConfig: expert_act_block must be 32 or 128")


@dataclass
class KVCache:
    """Per-sequence MQA cache: ``kv bf16 [b, max_len, head_dim]`` (key = value row per
    position, already FP8-rounded) and the indexer keys ``k_idx bf16 [b, max_len, index_dim]``.
    Rows are written at each token's position; rows never written are zero and never indexed."""

    kv: torch.Tensor
    k_idx: torch.Tensor

    @classmethod
    def empty(cls, cfg: BlockConfig, batch: int, max_len: int, device) -> KVCache:
        return cls(torch.zeros(batch, max_len, cfg.head_dim, dtype=_BF16, device=device),
                   torch.zeros(batch, max_len, cfg.index_dim, dtype=_BF16, device=device))


@dataclass
class StepResult:
    """One forward step. ``out``: the residual stream ``bf16 [b, s, hc, dim]``; ``attn`` /
    ``moe``: the two sub-blocks' outputs ``bf16 [b, s, dim]`` (before hc_post); ``topk_idxs``:
    ``int32 [b, s, index_topk]`` used; ``expert_ids`` ``int64 [b*s, n_activated]`` used;
    ``flip_gap``: for the indexer and the router, the largest score by which this run's own
    choice beat an imposed one (0 when nothing was imposed or the choices agree)."""

    out: torch.Tensor
    attn: torch.Tensor
    moe: torch.Tensor
    topk_idxs: torch.Tensor
    expert_ids: torch.Tensor
    flip_gap: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------
# backend primitives


def _linear_ref(x, weight, scale, act_block_size=128, scale_fmt=None):
    """`lowbit.layers.linear.linear`'s dispatch with the FP32 references; output rounded to bf16."""
    from ..layers.linear import weight_kind
    from ..reference import act_quant_ref, fp4_gemm_ref, fp8_gemm_ref

    kind = weight_kind(weight)
    if kind == "torch":
        return F.linear(x, weight)
    lead, k = x.shape[:-1], x.shape[-1]
    x_q, x_s = act_quant_ref(x.reshape(-1, k), block_size=act_block_size if kind == "fp4" else 128,
                             scale_fmt=scale_fmt)
    if kind == "fp4":
        y = fp4_gemm_ref(x_q, x_s, weight, scale, act_block_size)
    else:
        y = fp8_gemm_ref(x_q, x_s, weight, scale)
    return y.to(_BF16).view(*lead, weight.shape[0])


class _Ops:
    """The four backend-specific operations of the block: ``linear``, ``act_quant`` (in-place
    KV rounding), ``sinkhorn``, ``sparse_attn``. `overrides` maps an operation name to the
    other backend, to isolate one kernel's contribution (e.g. ``{"sparse_attn": "reference"}``)."""

    NAMES = ("linear", "act_quant", "sinkhorn", "sparse_attn")

    def __init__(self, backend: str, overrides: dict | None = None):
        overrides = dict(overrides or {})
        for name, be in [("backend", backend), *overrides.items()]:
            if be not in BACKENDS:
                raise ValueError(f"{name}: backend must be one of {BACKENDS}, got {be!r}")
        unknown = set(overrides) - set(self.NAMES)
        if unknown:
            raise ValueError(f"overrides: unknown operations {sorted(unknown)}; known: {self.NAMES}")
        for name in self.NAMES:
            setattr(self, name, self._op(name, overrides.get(name, backend)))

    @staticmethod
    def _op(name: str, backend: str):
        if backend == "kernels":
            if name == "linear":
                from ..layers.linear import linear as op
            elif name == "act_quant":
                from ..kernels.quant import act_quant as op
            elif name == "sinkhorn":
                from ..kernels.sinkhorn import hc_split_sinkhorn as op
            else:
                from ..kernels.attention.sparse_attn import sparse_attn as op
            return op
        from .. import reference as ref

        if name == "sparse_attn":
            return lambda *a, **k: ref.sparse_attn_ref(*a, **k).to(_BF16)
        return {"linear": _linear_ref, "act_quant": ref.act_quant_ref, "sinkhorn": ref.hc_split_sinkhorn_ref}[name]


# ----------------------------------------------------------------------------------------
# shared PyTorch pieces (identical in both backends)


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * w).to(_BF16)


def _select(scores: torch.Tensor, k: int, forced: torch.Tensor | None):
    """Top-``k`` of ``scores [..., n]`` (``-inf`` = not selectable) -> ``int64 [..., k]`` with
    ``-1`` in slots that have no selectable position. With `forced`, returns it instead plus the
    largest gap ``own k-th best - forced score`` over rows where the two sets differ."""
    n = scores.shape[-1]
    kk = min(k, n)
    vals, idx = scores.topk(kk, dim=-1)
    idx = torch.where(torch.isfinite(vals), idx, torch.full_like(idx, -1))
    if kk < k:
        idx = torch.cat([idx, idx.new_full((*idx.shape[:-1], k - kk), -1)], dim=-1)
    if forced is None:
        return idx, 0.0
    forced = forced.to(idx.dtype)
    own_sorted, forced_sorted = idx.sort(-1).values, forced.sort(-1).values
    differ = (own_sorted != forced_sorted).any(-1)
    if not bool(differ.any()):
        return forced, 0.0
    if not torch.equal((forced >= 0).sum(-1), (idx >= 0).sum(-1)):
        return forced, math.inf  # visibility is not score-dependent: the counts must agree
    kth = vals[..., -1:]
    picked = torch.where(forced >= 0, scores.gather(-1, forced.clamp(min=0)), torch.full_like(kth, math.inf))
    if bool((picked == -math.inf).any()):
        return forced, math.inf  # the imposed choice names a position this run cannot see
    gap = (kth - picked.min(-1, keepdim=True).values).clamp(min=0)[differ]
    return forced, float(gap.max()) if gap.numel() else 0.0


# ----------------------------------------------------------------------------------------
# the block


class DeepSeekBlock:
    """Weights of one block (module docstring for the dataflow). FP8 weights are
    ``float8_e4m3fn [N, K]`` with FP32 scales ``[ceil(N/128), ceil(K/128)]``
    (`lowbit.formats.quantize_fp8_blocks`); expert weights are MXFP4 ``uint8 [E, N, K/2]`` with
    E8M0 scales ``uint8 [E, N, K/32]`` (`lowbit.formats.quantize_mxfp4`); the router, norms,
    hc and sink parameters are FP32."""

    def __init__(self, cfg: BlockConfig, params: dict[str, torch.Tensor]):
        self.cfg = cfg
        self.p = params

    @classmethod
    def random(cls, cfg: BlockConfig, generator: torch.Generator, device="cpu") -> DeepSeekBlock:
        """Random weights (scaled so activations stay O(1)), quantized once; both backends read
        these same tensors."""
        from ..formats.fp4 import quantize_mxfp4
        from ..formats.fp8 import quantize_fp8_blocks

        g = generator

        def randn(*shape, std=1.0):
            return torch.randn(*shape, generator=g) * std

        c, p = cfg, {}
        hd = c.n_heads * c.head_dim
        for name, n, k in (("wq", hd, c.dim), ("wkv", c.head_dim, c.dim), ("wo", c.dim, hd),
                           ("wq_idx", c.index_dim, c.dim), ("wk_idx", c.index_dim, c.dim)):
            p[name], p[name + "_s"] = quantize_fp8_blocks(randn(n, k, std=k ** -0.5))
        for name, n, k in (("w1", c.inter_dim, c.dim), ("w3", c.inter_dim, c.dim), ("w2", c.dim, c.inter_dim)):
            p[name], p[name + "_s"] = quantize_mxfp4(randn(c.n_experts, n, k, std=k ** -0.5))
        p["gate"] = randn(c.n_experts, c.dim, std=c.dim ** -0.5)
        for name, n in (("attn_norm", c.dim), ("ffn_norm", c.dim), ("kv_norm", c.head_dim)):
            p[name] = 1.0 + randn(n, std=0.1)
        p["attn_sink"] = randn(c.n_heads, std=0.5)
        mix = (2 + c.hc_mult) * c.hc_mult
        for sub in ("attn", "ffn"):
            p[sub + "_hc_fn"] = randn(mix, c.hc_mult * c.dim, std=(c.hc_mult * c.dim) ** -0.5)
            p[sub + "_hc_scale"] = 0.5 + torch.rand(3, generator=g)
            p[sub + "_hc_base"] = randn(mix, std=0.5)
        return cls(cfg, {k: v.to(device) for k, v in p.items()})

    # -- hyper-connections

    def _hc_pre(self, ops, x, sub):
        """``x bf16 [b, s, hc, dim]`` -> (``h bf16 [b, s, dim]``, ``post fp32 [b, s, hc]``,
        ``comb fp32 [b, s, hc, hc]``)."""
        c, p = self.cfg, self.p
        xf = x.flatten(2).float()
        rsqrt = torch.rsqrt(xf.square().mean(-1, keepdim=True) + c.norm_eps)
        mixes = F.linear(xf, p[sub + "_hc_fn"]) * rsqrt
        pre, post, comb = ops.sinkhorn(mixes, p[sub + "_hc_scale"], p[sub + "_hc_base"], c.hc_mult,
                                       c.hc_sinkhorn_iters, c.hc_eps)
        h = (pre.unsqueeze(-1) * x.float()).sum(dim=2)
        return h.to(_BF16), post, comb

    @staticmethod
    def _hc_post(y, x, post, comb):
        """``x'[k] = post[k] * y + sum_j comb[j, k] * x[j]`` -> bf16 ``[b, s, hc, dim]``."""
        out = post.unsqueeze(-1) * y.float().unsqueeze(-2) + (comb.unsqueeze(-1) * x.float().unsqueeze(-2)).sum(2)
        return out.to(_BF16)

    # -- attention

    def _attention(self, ops, h, cache, pos, valid, forced, gaps):
        c, p = self.cfg, self.p
        b, s, _ = h.shape
        fmt = c.scale_fmt
        q = ops.linear(h, p["wq"], p["wq_s"], scale_fmt=fmt).view(b, s, c.n_heads, c.head_dim)
        kv = _rms_norm(ops.linear(h, p["wkv"], p["wkv_s"], scale_fmt=fmt), p["kv_norm"], c.norm_eps).contiguous()
        ops.act_quant(kv, c.kv_quant_block, fmt, inplace=True)
        q_idx = ops.linear(h, p["wq_idx"], p["wq_idx_s"], scale_fmt=fmt)
        k_idx = ops.linear(h, p["wk_idx"], p["wk_idx_s"], scale_fmt=fmt)

        bi = torch.arange(b, device=h.device).view(b, 1).expand(b, s)
        cache.kv[bi[valid], pos[valid]] = kv[valid]
        cache.k_idx[bi[valid], pos[valid]] = k_idx[valid]

        n = cache.kv.shape[1]
        scores = torch.einsum("bsd,bnd->bsn", q_idx.float(), cache.k_idx.float())
        visible = (torch.arange(n, device=h.device).view(1, 1, n) <= pos.unsqueeze(-1)) & valid.unsqueeze(-1)
        scores = scores.masked_fill(~visible, -math.inf)
        idx, gaps["indexer"] = _select(scores, c.index_topk, forced)
        idx = idx.to(torch.int32).contiguous()

        o = ops.sparse_attn(q.contiguous(), cache.kv, p["attn_sink"], idx, 1.0 / math.sqrt(c.head_dim))
        return ops.linear(o.flatten(2), p["wo"], p["wo_s"], scale_fmt=fmt), idx

    # -- MoE

    def _moe(self, ops, h, forced, gaps):
        c, p = self.cfg, self.p
        lead = h.shape[:-1]
        x = h.reshape(-1, c.dim)
        probs = F.linear(x.float(), p["gate"]).softmax(dim=-1)  # FP32 router
        ids, gaps["router"] = _select(probs, c.n_activated, forced)
        w = probs.gather(-1, ids)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        kw = {"act_block_size": c.expert_act_block, "scale_fmt": c.scale_fmt}
        for e in range(c.n_experts):
            tok, slot = (ids == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            xe = x[tok]
            g = ops.linear(xe, p["w1"][e], p["w1_s"][e], **kw).float()
            u = ops.linear(xe, p["w3"][e], p["w3_s"][e], **kw).float()
            act = (F.silu(g) * u * w[tok, slot, None]).to(_BF16)  # routing weight before w2, as V4
            out.index_add_(0, tok, ops.linear(act, p["w2"][e], p["w2_s"][e], **kw).float())
        return out.to(_BF16).view(*lead, c.dim), ids

    # -- block

    def forward(self, x, cache: KVCache, pos, valid, backend: str = "kernels", decisions: StepResult | None = None,
                overrides: dict | None = None):
        """One step over ``s`` tokens per sequence.

        x: residual stream ``bf16 [b, s, hc, dim]``; cache: `KVCache` (appended in place);
        pos: ``int64 [b, s]`` each token's position; valid: ``bool [b, s]`` (False = padding:
        nothing is cached and its top-k row is all ``-1``); backend: ``"kernels"`` or
        ``"reference"``; decisions: a `StepResult` of the same step whose top-k positions and
        experts are used instead of this run's own (their agreement is in ``flip_gap``);
        overrides: ``{operation: backend}`` for single operations (`_Ops`).
        Returns a `StepResult`.
        """
        ops = _Ops(backend, overrides)
        gaps: dict = {}
        h, post, comb = self._hc_pre(ops, x, "attn")
        a, idx = self._attention(ops, _rms_norm(h, self.p["attn_norm"], self.cfg.norm_eps), cache, pos, valid,
                                 None if decisions is None else decisions.topk_idxs, gaps)
        x = self._hc_post(a, x, post, comb)
        h, post, comb = self._hc_pre(ops, x, "ffn")
        m, ids = self._moe(ops, _rms_norm(h, self.p["ffn_norm"], self.cfg.norm_eps),
                           None if decisions is None else decisions.expert_ids, gaps)
        x = self._hc_post(m, x, post, comb)
        return StepResult(out=x, attn=a, moe=m, topk_idxs=idx, expert_ids=ids, flip_gap=gaps)


def run_prefill_decode(block: DeepSeekBlock, prompt: torch.Tensor, prompt_lens, decode_inputs: torch.Tensor,
                       backend: str = "kernels", decisions: list[StepResult] | None = None,
                       overrides: dict | None = None) -> list[StepResult]:
    """Prefill then decode, as the seed's ``python model.py`` smoke test does.

    prompt: embeddings ``bf16 [b, S, dim]``, right-padded; prompt_lens: ``[b]`` ints in
    ``[0, S]`` (rows at or past a sequence's length are padding); decode_inputs: ``bf16
    [steps, b, dim]``, the embedding each sequence feeds at each decode step (given, not
    sampled: the block has no vocabulary). Sequence ``i`` decodes at positions
    ``prompt_lens[i], prompt_lens[i] + 1, ...``; each token enters as ``hc`` copies of its
    embedding. decisions: the per-step results of another run to take the top-k / experts
    from; overrides: per-operation backends (both as in `DeepSeekBlock.forward`).
    Returns ``1 + steps`` `StepResult`s (prefill first).
    """
    cfg = block.cfg
    b, S, _ = prompt.shape
    steps = decode_inputs.shape[0]
    dev = prompt.device
    lens = torch.as_tensor(prompt_lens, dtype=torch.int64, device=dev)
    cache = KVCache.empty(cfg, b, S + steps, dev)
    hc = cfg.hc_mult
    pos = torch.arange(S, device=dev).view(1, S).expand(b, S)
    results = [block.forward(prompt.unsqueeze(2).expand(b, S, hc, cfg.dim).contiguous(), cache, pos,
                             pos < lens.view(b, 1), backend, None if decisions is None else decisions[0], overrides)]
    ones = torch.ones(b, 1, dtype=torch.bool, device=dev)
    for t in range(steps):
        x = decode_inputs[t].view(b, 1, 1, cfg.dim).expand(b, 1, hc, cfg.dim).contiguous()
        results.append(block.forward(x, cache, (lens + t).view(b, 1), ones, backend,
                                     None if decisions is None else decisions[t + 1], overrides))
    return results
