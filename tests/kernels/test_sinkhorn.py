"""Triton hc_split_sinkhorn vs `hc_split_sinkhorn_ref` (interpreter on CPU, native on GPU).

Tolerances (max elementwise relative error against the FP32 reference), from measurement and
the operations: both sides compute the same FP32 operations in the same order, the divisions
IEEE-rounded on both. What differs is ``exp`` (numpy / libm under the interpreter, a few ulp;
the GPU's ``ex2.approx`` plus the rounding of ``x * log2(e)``, ~1e-6 relative for logits of
magnitude ~10), FMA contraction of ``x * scale + base`` on the GPU and the order of 4-term
sums. pre / post see one exp: 1 ulp-level (measured <= 2.5e-7 on the interpreter). comb goes
through a softmax and 39 normalizations whose errors partly cancel: measured <= 1.2e-6 on the
interpreter (the FP32 reference itself is ~3e-6 from a float64 evaluation).
On the GPU the rounding of ``x * log2(e)`` before ``ex2.approx`` is relative to the
*argument*: an absolute exponent error of ~|x| * 2^-24, i.e. a relative error of the exp
~|x| * 6e-8. The extreme-logit case feeds |x| up to ~70 (logits x 40 x scale 1.5), so pre /
post are ~4e-6 from that plus 2 ulp of ex2.approx: measured 5.3e-6 on the H200 (2026-11-29):
budget 1e-5.
"""

from __future__ import annotations

import pytest
import torch

from lowbit.kernels import sinkhorn
from lowbit.kernels.sinkhorn import SinkhornConfig, explain_sinkhorn_config, hc_split_sinkhorn, sinkhorn_config
from lowbit.reference.sinkhorn import hc_split_sinkhorn_ref
from lowbit.testing import interpreter_active

#: max elementwise relative error budgets (module docstring)
TOL = {"pre_post": 1e-6, "comb": 4e-6} if interpreter_active() else {"pre_post": 1e-5, "comb": 1e-5}


def _inputs(n_shape, hc, gen, logit_scale=1.0):
    mix_hc = (2 + hc) * hc
    mixes = torch.randn(*n_shape, mix_hc, generator=gen) * logit_scale
    hc_scale = torch.rand(3, generator=gen) + 0.5
    hc_base = torch.randn(mix_hc, generator=gen) * 0.5
    return mixes, hc_scale, hc_base


def _max_rel(x, ref):
    """Max of |x - ref| / (|ref| + 1e-30): relative, except where a saturated sigmoid leaves
    the reference a subnormal and the kernel an exact 0 (exp overflows to inf first)."""
    return float(((x.double() - ref.double()).abs() / (ref.double().abs() + 1e-30)).max())


def _check(mixes, hc_scale, hc_base, hc, device, iters=20, eps=1e-6, config=None):
    pre, post, comb = hc_split_sinkhorn(mixes.to(device), hc_scale.to(device), hc_base.to(device), hc, iters, eps,
                                        config=config)
    pr, qr, cr = hc_split_sinkhorn_ref(mixes, hc_scale, hc_base, hc, iters, eps)
    lead = tuple(mixes.shape[:-1])
    assert pre.shape == post.shape == (*lead, hc) and comb.shape == (*lead, hc, hc)
    assert pre.dtype == post.dtype == comb.dtype == torch.float32
    for name, got, want, tol in (("pre", pre, pr, TOL["pre_post"]), ("post", post, qr, TOL["pre_post"]),
                                 ("comb", comb, cr, TOL["comb"])):
        err = _max_rel(got.cpu(), want)
        assert err <= tol, f"{name}: max relative error {err:.2e} > {tol:.0e} (hc={hc}, config={config})"
    return pre.cpu(), post.cpu(), comb.cpu(), cr


@pytest.mark.parametrize("tokens,warps,n", [(1, 1, 5), (8, 1, 37), (32, 4, 37)],
                         ids=["T1", "T8", "T32"])  # every table row; n odd, last program partial
def test_matches_reference(tokens, warps, n, gen, device):
    mixes, s, b = _inputs((n,), 4, gen, logit_scale=2.0)
    pre, post, comb, cr = _check(mixes, s, b, 4, device, config=SinkhornConfig(tokens, warps))
    eps = 1e-6
    assert ((pre > eps) & (pre < 1 + eps)).all() and ((post > 0) & (post < 2)).all()
    # the last step normalizes columns: each sums to S / (S + eps) = 1 - O(eps)
    assert (comb.sum(-2) - 1).abs().max() <= 4e-6
    # rows: as converged as the reference's
    assert (comb.sum(-1) - cr.sum(-1)).abs().max() <= 1e-5
    assert (comb > 0).all()


def test_well_conditioned_is_doubly_stochastic(gen, device):
    """Small logits: 20 rounds converge, rows and columns both sum to 1 within ~1e-5."""
    mixes, s, b = _inputs((3, 7), 4, gen, logit_scale=0.3)  # 3-D mixes [b, s, 24], as the model passes
    _, _, comb, _ = _check(mixes, s, b * 0.3, 4, device)
    assert (comb.sum(-1) - 1).abs().max() <= 1e-5 and (comb.sum(-2) - 1).abs().max() <= 4e-6


@pytest.mark.parametrize("hc", [1, 2, 3, 8], ids=lambda h: f"hc{h}")  # 3: padded tile (HCP=4)
def test_other_hc(hc, gen, device):
    mixes, s, b = _inputs((9,), hc, gen)
    _check(mixes, s, b, hc, device, config=SinkhornConfig(8, 1))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")  # interpreter: exp(+big) = inf
def test_iters_eps_and_extreme_logits(gen, device):
    mixes, s, b = _inputs((11,), 4, gen)
    _check(mixes, s, b, 4, device, iters=1)  # softmax + one column normalization
    _check(mixes, s, b, 4, device, iters=3, eps=0.0)
    # saturated sigmoids and a one-hot softmax: finite, no NaN, same as the reference
    big, _, _ = _inputs((11,), 4, gen, logit_scale=40.0)
    pre, post, comb, _ = _check(big, s, b, 4, device)
    assert torch.isfinite(pre).all() and torch.isfinite(post).all() and torch.isfinite(comb).all()


def test_strided_and_empty(gen, device):
    wide = torch.randn(6, 30, generator=gen)
    mixes = wide[:, 3:27]  # row stride 30
    _, s, b = _inputs((1,), 4, gen)
    _check(mixes, s, b, 4, device)
    pre, post, comb = hc_split_sinkhorn(torch.empty(0, 24, device=device), s.to(device), b.to(device))
    assert pre.shape == (0, 4) and comb.shape == (0, 4, 4)


# ----------------------------------------------------------------------------- heuristics
def test_config_table():
    assert sinkhorn_config(1) == sinkhorn_config(1)  # memoized
    assert sinkhorn_config(64).tokens_per_program == 1  # decode batch: one token a program
    assert sinkhorn_config(4096).tokens_per_program == 8
    c = sinkhorn_config(65536)
    assert (c.tokens_per_program, c.num_warps) == (32, 4)
    rows = {(t, w) for _, t, w in sinkhorn.SINKHORN_TABLE}
    for n in (1, 100, 1056, 1057, 8448, 8449, 10**6):
        c = sinkhorn_config(n)
        assert (c.tokens_per_program, c.num_warps) in rows
    names = {c.name for c in sinkhorn.compile_configs()}
    assert names == {f"hc_split_sinkhorn[hc=4,T={t},w={w}]" for t, w in rows}
    assert "tokens_per_program" in explain_sinkhorn_config(20)


def test_config_env_override(monkeypatch):
    monkeypatch.setenv("LOWBIT_SINKHORN_TOKENS_PER_PROGRAM", "16")
    c = sinkhorn_config(10**6)
    assert c.tokens_per_program == 16 and "LOWBIT_SINKHORN_TOKENS_PER_PROGRAM=16" in c.reason
    monkeypatch.setenv("LOWBIT_SINKHORN_TOKENS_PER_PROGRAM", "3")
    with pytest.raises(ValueError, match="power of two"):
        sinkhorn_config(10**6)
    monkeypatch.delenv("LOWBIT_SINKHORN_TOKENS_PER_PROGRAM")
    assert sinkhorn_config(10**6).tokens_per_program == 32


# ----------------------------------------------------------------------------- bad input
def test_bad_input(device):
    m = torch.randn(4, 24, device=device)
    s = torch.rand(3, device=device)
    b = torch.randn(24, device=device)
    type_cases = [
        ((m.double(), s, b), "mixes must be float32"),
        ((m.bfloat16(), s, b), "mixes must be float32"),
        ((m, s.half(), b), "hc_scale must be float32"),
        ((m, s, b.to(torch.int32)), "hc_base must be float32"),
        ((m.tolist(), s, b), "mixes must be a torch.Tensor"),
    ]
    for args, msg in type_cases:
        with pytest.raises(TypeError, match=msg):
            hc_split_sinkhorn(*args)
    value_cases = [
        (dict(mixes=m[:, :20]), r"\[..., 24\]"),
        (dict(hc_scale=s[:2]), r"hc_scale must be \[3\]"),
        (dict(hc_base=b[:23]), r"hc_base must be \[24\]"),
        (dict(hc_mult=3), r"\[..., 15\]"),
        (dict(hc_mult=0), "hc_mult"),
        (dict(hc_mult=17), "hc_mult"),
        (dict(hc_mult=True), "hc_mult"),
        (dict(sinkhorn_iters=0), "sinkhorn_iters"),
        (dict(sinkhorn_iters=2.0), "sinkhorn_iters"),
        (dict(eps=float("nan")), "eps"),
        (dict(config=SinkhornConfig(3, 1)), "power of two"),
        (dict(config=SinkhornConfig(4, 3)), "num_warps"),
    ]
    for kw, msg in value_cases:
        args = dict(mixes=m, hc_scale=s, hc_base=b)
        args.update(kw)
        with pytest.raises(ValueError, match=msg):
            hc_split_sinkhorn(**args)
