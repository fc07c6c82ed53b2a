"""lowbit's public kernels as PyTorch operators, ``torch.ops.lowbit.*``.

Importing this module registers them (it is not imported by ``import lowbit``; `lowbit.nn`
imports it when a module is traced by ``torch.compile``). Each operator has a fake (meta)
implementation, so ``torch.compile(fullgraph=True)`` traces through it without running a
kernel, and an ``.out`` overload that writes preallocated buffers (``-> ()``: the form
``torch.compile`` functionalizes). Signatures take tensors and ints only: a `W4A16Weight` is
passed as its ``qweight``, ``scales``, ``n`` and ``k``.

==========================  ======================================================================
operator                    wraps
==========================  ======================================================================
``moe_experts``             `lowbit.moe_experts` (routing, both W4A16 GEMMs, SiLU, combine)
``w4a16_indexed``           `lowbit.w4a16_indexed` (one W4A16 GEMM on the indexed layout)
``moe_align_block_size``    `lowbit.routing.moe_align_block_size` (the indexed routing layout)
``act_quant``               `lowbit.kernels.quant.act_quant` (per-group FP8 activations)
``linear``                  `lowbit.linear` (FP8 block / MXFP4 / float weights)
==========================  ======================================================================

Registration is ``torch.library.Library("lowbit", "DEF")`` with ``define`` + ``impl`` +
``register_fake``, not ``torch.library.custom_op``: the dispatcher then calls the Python
kernel directly. CPU, torch 2.13.0, 2026-12-05: 3.4 us
a call for the ``moe_experts`` signature (7 tensors, 4 ints) against 11.5 us through
``custom_op``'s wrapper, 0.7 us for a plain Python call. The kernels are registered under
``CompositeExplicitAutograd``: one implementation for every device (CUDA, and CPU tensors under
the Triton interpreter); none is differentiable.
"""

from __future__ import annotations

import torch

from .formats.w4a16 import LAYOUT_K256_GROUP_NIBBLES, W4A16Weight

__all__ = ["LIBRARY", "OPERATORS", "w4a16_weight"]

#: the operators this module defines (``torch.ops.lowbit.<name>``)
OPERATORS = ("moe_experts", "w4a16_indexed", "moe_align_block_size", "act_quant", "linear")

_KERNEL_KEY = "CompositeExplicitAutograd"

_MOE_ARGS = ("Tensor hidden, Tensor topk_ids, Tensor topk_weights, Tensor w13_qweight, Tensor w13_scales, "
             "int w13_n, int w13_k, Tensor w2_qweight, Tensor w2_scales, int w2_n, int w2_k, str path=\"auto\"")
_INDEXED_ARGS = ("Tensor a, Tensor qweight, Tensor scales, int n, int k, Tensor sorted_token_ids, Tensor expert_ids, "
                 "Tensor num_tokens_post_padded, int top_k, Tensor? topk_weights=None")
_ALIGN_ARGS = "Tensor topk_ids, int block_size, int num_experts, Tensor? expert_map=None"
_QUANT_ARGS = "Tensor x, int block_size=128, str? scale_fmt=None"
_LINEAR_ARGS = "Tensor x, Tensor weight, Tensor? scale=None, int act_block_size=128, str? scale_fmt=None"

_SCHEMAS = {
    "moe_experts": f"({_MOE_ARGS}) -> Tensor",
    "moe_experts.out": f"({_MOE_ARGS}, *, Tensor(a!) out) -> ()",
    "w4a16_indexed": f"({_INDEXED_ARGS}) -> Tensor",
    "w4a16_indexed.out": f"({_INDEXED_ARGS}, *, Tensor(a!) out) -> ()",
    "moe_align_block_size": f"({_ALIGN_ARGS}) -> (Tensor, Tensor, Tensor)",
    "moe_align_block_size.out": (f"({_ALIGN_ARGS}, *, Tensor(a!) sorted_token_ids, Tensor(b!) expert_ids, "
                                 "Tensor(c!) num_tokens_post_padded) -> ()"),
    "act_quant": f"({_QUANT_ARGS}) -> (Tensor, Tensor)",
    "act_quant.out": f"({_QUANT_ARGS}, *, Tensor(a!) out, Tensor(b!) out_scale) -> ()",
    "linear": f"({_LINEAR_ARGS}) -> Tensor",
    "linear.out": f"({_LINEAR_ARGS}, *, Tensor(a!) out) -> ()",
}


def w4a16_weight(qweight: torch.Tensor, scales: torch.Tensor, n: int, k: int) -> W4A16Weight:
    """The `W4A16Weight` (profile ``"indexed"``) an operator's tensor arguments describe:
    qweight ``int32 [E, N, Kp/8]``, scales ``bf16 [E, Kp/32, N]``, logical ``[N, K]``."""
    return W4A16Weight(qweight, scales, n, k, LAYOUT_K256_GROUP_NIBBLES, "indexed")


# -- kernels -------------------------------------------------------------------------------
def _moe_experts(hidden, topk_ids, topk_weights, w13_qweight, w13_scales, w13_n, w13_k, w2_qweight, w2_scales,
                 w2_n, w2_k, path="auto"):
    from .layers.moe import moe_experts

    return moe_experts(hidden, topk_ids, topk_weights, w4a16_weight(w13_qweight, w13_scales, w13_n, w13_k),
                       w4a16_weight(w2_qweight, w2_scales, w2_n, w2_k), path=path)


def _moe_experts_out(hidden, topk_ids, topk_weights, w13_qweight, w13_scales, w13_n, w13_k, w2_qweight, w2_scales,
                     w2_n, w2_k, path="auto", *, out):
    from .layers.moe import moe_experts

    moe_experts(hidden, topk_ids, topk_weights, w4a16_weight(w13_qweight, w13_scales, w13_n, w13_k),
                w4a16_weight(w2_qweight, w2_scales, w2_n, w2_k), out=out, path=path)


def _w4a16_indexed(a, qweight, scales, n, k, sorted_token_ids, expert_ids, num_tokens_post_padded, top_k,
                   topk_weights=None):
    from .kernels.w4a16.indexed import w4a16_indexed

    return w4a16_indexed(a, w4a16_weight(qweight, scales, n, k), sorted_token_ids, expert_ids, num_tokens_post_padded,
                         top_k, topk_weights=topk_weights)


def _w4a16_indexed_out(a, qweight, scales, n, k, sorted_token_ids, expert_ids, num_tokens_post_padded, top_k,
                       topk_weights=None, *, out):
    from .kernels.w4a16.indexed import w4a16_indexed

    w4a16_indexed(a, w4a16_weight(qweight, scales, n, k), sorted_token_ids, expert_ids, num_tokens_post_padded,
                  top_k, topk_weights=topk_weights, out=out)


def _moe_align_block_size(topk_ids, block_size, num_experts, expert_map=None):
    from .routing import moe_align_block_size

    r = moe_align_block_size(topk_ids, block_size, num_experts, expert_map)
    return r.sorted_token_ids, r.expert_ids, r.num_tokens_post_padded


def _check_out(name: str, out: torch.Tensor, like: torch.Tensor, who: str) -> None:
    if out.dtype != like.dtype or out.shape != like.shape or out.device != like.device:
        raise ValueError(f"{who}: {name} must be {like.dtype} {tuple(like.shape)} on {like.device}, got "
                         f"{out.dtype} {tuple(out.shape)} on {out.device}")


def _moe_align_block_size_out(topk_ids, block_size, num_experts, expert_map=None, *, sorted_token_ids, expert_ids,
                              num_tokens_post_padded):
    # the routing kernels allocate their buffers: this overload copies into the caller's
    got = _moe_align_block_size(topk_ids, block_size, num_experts, expert_map)
    for name, dst, src in zip(("sorted_token_ids", "expert_ids", "num_tokens_post_padded"),
                              (sorted_token_ids, expert_ids, num_tokens_post_padded), got):
        _check_out(name, dst, src, "moe_align_block_size.out")
        dst.copy_(src)


def _act_quant_fn():
    try:
        from .kernels.quant import act_quant
    except ModuleNotFoundError as exc:  # the Triton quantizer's absence only, as in `lowbit.linear`
        if exc.name != __name__.rsplit(".", 1)[0] + ".kernels.quant":
            raise
        from .reference.quant import act_quant_ref as act_quant
    return act_quant


def _act_quant(x, block_size=128, scale_fmt=None):
    return _act_quant_fn()(x, block_size=block_size, scale_fmt=scale_fmt)


def _act_quant_out(x, block_size=128, scale_fmt=None, *, out, out_scale):
    y, s = _act_quant(x, block_size, scale_fmt)
    _check_out("out", out, y, "act_quant.out")
    _check_out("out_scale", out_scale, s, "act_quant.out")
    out.copy_(y)
    out_scale.copy_(s)


def _linear(x, weight, scale=None, act_block_size=128, scale_fmt=None):
    from .layers.linear import linear

    return linear(x, weight, scale, act_block_size=act_block_size, scale_fmt=scale_fmt)


def _linear_out(x, weight, scale=None, act_block_size=128, scale_fmt=None, *, out):
    # lowbit.linear allocates its output (the activation quantizer's too): the result is copied
    y = _linear(x, weight, scale, act_block_size, scale_fmt)
    _check_out("out", out, y, "linear.out")
    out.copy_(y)


# -- fake (meta) implementations: shapes and dtypes only ------------------------------------
def _fake_moe_experts(hidden, topk_ids, topk_weights, w13_qweight, w13_scales, w13_n, w13_k, w2_qweight, w2_scales,
                      w2_n, w2_k, path="auto"):
    _fake_check_moe(hidden, topk_ids, w13_k, w2_n)
    return hidden.new_empty(hidden.shape[0], w2_n, dtype=torch.bfloat16)


def _fake_out(*args, **kwargs) -> None:
    """The ``.out`` overloads return nothing and allocate nothing."""
    return None


def _fake_check_moe(hidden, topk_ids, h: int, n: int) -> None:
    if hidden.dim() != 2 or hidden.dtype != torch.bfloat16:
        raise TypeError(f"moe_experts: hidden must be bf16 [M, H], got {hidden.dtype} {tuple(hidden.shape)}")
    if hidden.shape[1] != h:
        raise ValueError(f"moe_experts: hidden has H={hidden.shape[1]}, w13 expects H={h}")
    if topk_ids.dim() != 2 or topk_ids.dtype != torch.int32:
        raise TypeError(f"moe_experts: topk_ids must be int32 [M, k], got {topk_ids.dtype} {tuple(topk_ids.shape)}")


def _fake_w4a16_indexed(a, qweight, scales, n, k, sorted_token_ids, expert_ids, num_tokens_post_padded, top_k,
                        topk_weights=None):
    return a.new_empty(a.shape[0] * top_k, n, dtype=torch.bfloat16)


def _fake_moe_align_block_size(topk_ids, block_size, num_experts, expert_map=None):
    from .routing.layouts import max_num_tokens_padded

    size = max_num_tokens_padded(topk_ids.shape[0] * topk_ids.shape[1], num_experts, block_size)
    new = lambda *shape: topk_ids.new_empty(shape, dtype=torch.int32)  # noqa: E731
    return new(size), new(size // block_size), new(1)


def _fake_act_quant(x, block_size=128, scale_fmt=None):
    return (x.new_empty(x.shape, dtype=torch.float8_e4m3fn),
            x.new_empty((*x.shape[:-1], x.shape[-1] // block_size), dtype=torch.float32))


def _fake_linear(x, weight, scale=None, act_block_size=128, scale_fmt=None):
    from .layers.linear import weight_kind

    dtype = x.dtype if weight_kind(weight) == "torch" else torch.bfloat16
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=dtype)


_IMPLS = {
    "moe_experts": (_moe_experts, _fake_moe_experts),
    "moe_experts.out": (_moe_experts_out, _fake_out),
    "w4a16_indexed": (_w4a16_indexed, _fake_w4a16_indexed),
    "w4a16_indexed.out": (_w4a16_indexed_out, _fake_out),
    "moe_align_block_size": (_moe_align_block_size, _fake_moe_align_block_size),
    "moe_align_block_size.out": (_moe_align_block_size_out, _fake_out),
    "act_quant": (_act_quant, _fake_act_quant),
    "act_quant.out": (_act_quant_out, _fake_out),
    "linear": (_linear, _fake_linear),
    "linear.out": (_linear_out, _fake_out),
}


def _register() -> torch.library.Library:
    lib = torch.library.Library("lowbit", "DEF")
    for name, schema in _SCHEMAS.items():
        lib.define(name + schema)
        kernel, fake = _IMPLS[name]
        lib.impl(name, kernel, _KERNEL_KEY)
        torch.library.register_fake(f"lowbit::{name}", fake, lib=lib)
    return lib


#: the ``lowbit`` operator library (kept alive: dropping it would unregister the operators)
LIBRARY = _register()
