"""Numerics policy and data generators shared by the tests, the benchmark and users.

Every kernel is checked against its FP32 reference (`lowbit.reference`) with one of:
- `rel_fro_err` / `assert_close`: relative Frobenius error ``|x - ref|_F / |ref|_F`` against a
  budget derived from the precision (see `TOLERANCES`);
- `cos_diff`: DeepGEMM's ``1 - 2<x, y> / (|x|^2 + |y|^2)``, scale-robust, used for FP8/FP4;
- `assert_bitwise_equal`: exact equality (quantizers, routing), reporting the first mismatch.

Data generators never return zeros and always leave at least one expert with zero tokens,
because unwritten outputs and empty experts are where MoE kernels break.
"""

from __future__ import annotations

import os
import random

import torch

from .runtime.env import interpreter_active

__all__ = [
    "TOLERANCES",
    "rel_fro_err",
    "cos_diff",
    "assert_close",
    "assert_bitwise_equal",
    "fresh_seed",
    "make_generator",
    "random_topk_ids",
    "random_topk_weights",
    "poison_",
    "POISON_BF16",
    "interpreter_active",
]

#: Relative Frobenius budgets by the precision of what is compared.
#: - "bf16_out": an FP32-accumulated result rounded once to BF16: rounding is 2^-9 relative
#:   per element (RMS ~ 2^-9/sqrt(3) ~ 1.1e-3), accumulation-order differences of FP32 sums
#:   are far below that: budget 4e-3.
#: - "bf16_chain": two BF16-rounded GEMMs in a row (MoE block: gate_up -> act -> down): 1e-2.
#: - "fp8_act": activations quantized to E4M3 (3 mantissa bits: 2^-4 relative per element,
#:   RMS ~ 2^-4/sqrt(3)/sqrt(2) for a dot product's partial cancellation) : 5e-2.
#: - "fp32": FP32 math in a different order: 1e-5.
TOLERANCES: dict[str, float] = {
    "fp32": 1e-5,
    "bf16_out": 4e-3,
    "bf16_chain": 1e-2,
    "fp8_act": 5e-2,
}

#: A value no kernel produces from the inputs the tests draw: bf16 -> 2^120 (finite, so
#: poisoned rows show in comparisons instead of turning every norm into inf/NaN).
POISON_BF16 = 1.329228e36


def rel_fro_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``|x - ref|_F / |ref|_F`` in float64 (0 if both are zero; inf on any NaN/inf)."""
    if x.shape != ref.shape:
        raise ValueError(f"shape mismatch: {tuple(x.shape)} vs reference {tuple(ref.shape)}")
    x64, r64 = x.detach().double(), ref.detach().double()
    if not torch.isfinite(x64).all():
        return float("inf")
    den = r64.norm()
    num = (x64 - r64).norm()
    if den == 0:
        return 0.0 if num == 0 else float("inf")
    return float(num / den)


def cos_diff(x: torch.Tensor, ref: torch.Tensor) -> float:
    """DeepGEMM's ``calc_diff``: ``1 - 2<x, y> / (|x|^2 + |y|^2)`` in float64 (0 = identical)."""
    if x.shape != ref.shape:
        raise ValueError(f"shape mismatch: {tuple(x.shape)} vs reference {tuple(ref.shape)}")
    x64, r64 = x.detach().double().flatten(), ref.detach().double().flatten()
    if not torch.isfinite(x64).all():
        return float("inf")
    den = (x64 * x64).sum() + (r64 * r64).sum()
    if den == 0:
        return 0.0
    return float(1 - 2 * (x64 * r64).sum() / den)


def assert_close(x: torch.Tensor, ref: torch.Tensor, tol: float | str = "bf16_out", name: str = "output") -> float:
    """Raise AssertionError (with the error, budget and worst element) unless
    ``rel_fro_err(x, ref) <= tol``; ``tol`` is a number or a `TOLERANCES` key. Returns the error."""
    budget = TOLERANCES[tol] if isinstance(tol, str) else float(tol)
    err = rel_fro_err(x, ref)
    if not err <= budget:
        diff = (x.detach().double() - ref.detach().double()).abs()
        diff = torch.nan_to_num(diff, nan=float("inf"))
        idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)) if diff.numel() else ()
        worst = f"; worst at {idx}: got {float(x[idx])!r}, want {float(ref[idx])!r}" if idx else ""
        raise AssertionError(f"{name}: relative Frobenius error {err:.3e} > budget {budget:.1e}{worst}")
    return err


def assert_bitwise_equal(x: torch.Tensor, ref: torch.Tensor, name: str = "output") -> None:
    """Exact equality of shape, dtype and bits; the message names the first mismatch."""
    if x.shape != ref.shape or x.dtype != ref.dtype:
        raise AssertionError(f"{name}: {x.dtype} {tuple(x.shape)} vs reference {ref.dtype} {tuple(ref.shape)}")
    a, b = x.detach().cpu(), ref.detach().cpu()
    if a.dtype.is_floating_point:
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        a, b = a.view(bits), b.view(bits)
    neq = a != b
    if neq.any():
        first = tuple(int(i) for i in neq.nonzero()[0])
        raise AssertionError(
            f"{name}: {int(neq.sum())} of {neq.numel()} elements differ; first at {first}: "
            f"got {x[first].item()!r}, want {ref[first].item()!r}"
        )


def fresh_seed() -> int:
    """A new seed every run (``LOWBIT_TEST_SEED`` pins it to reproduce a failure)."""
    pinned = os.environ.get("LOWBIT_TEST_SEED")
    return int(pinned) if pinned else random.randrange(2**31)


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def random_topk_ids(
    num_tokens: int,
    top_k: int,
    num_experts: int,
    *,
    generator: torch.Generator,
    empty_experts: int = 1,
    hot_expert: int | None = None,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """``int32 [num_tokens, top_k]`` routing draw: distinct experts per token (as a top-k
    router gives), drawn uniformly from all experts except the last `empty_experts`, which get
    no tokens (at least one, as long as ``num_experts - empty_experts >= top_k``).
    `hot_expert`: every token's first slot goes to that expert (the "all tokens on one
    expert" edge)."""
    if top_k > num_experts:
        raise ValueError(f"top_k={top_k} > num_experts={num_experts}")
    usable = max(num_experts - empty_experts, top_k)
    scores = torch.rand(num_tokens, usable, generator=generator)
    if hot_expert is not None:
        scores[:, hot_expert] = 2.0
    ids = scores.topk(top_k, dim=-1).indices.to(torch.int32)
    return ids.to(device)


def random_topk_weights(num_tokens: int, top_k: int, *, generator: torch.Generator,
                        device: str | torch.device = "cpu") -> torch.Tensor:
    """``float32 [num_tokens, top_k]`` positive routing weights (softmax of random logits)."""
    return torch.randn(num_tokens, top_k, generator=generator).softmax(-1).to(device)


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with a value no kernel produces, so unwritten rows show."""
    if t.dtype.is_floating_point:
        return t.fill_(POISON_BF16 if t.dtype in (torch.bfloat16, torch.float32) else 448.0)
    return t.fill_(-(2**30))
