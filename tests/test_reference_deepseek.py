"""Tests of the seed-004 compute references: fp8_gemm_ref, fp4_gemm_ref, sparse_attn_ref,
hc_split_sinkhorn_ref.

Each reference is checked against an independent, naive formulation in float64:
- GEMMs: dequantize both operands in full (the `lowbit.formats` routines), one float64
  matmul. The reference sums 32- or 128-long blocks of exact FP8 x FP8 (FP8 x E2M1) products
  in FP32, scales them and adds them into an FP32 sum, so elementwise
  ``|ref - exact| <= (L + nb + 5) * 2^-24 * (|A| @ |B|^T)`` (first-order rounding bound:
  L - 1 roundings inside a block, 2 for the scales, nb for the running sum, 2 for the
  dequantized operands of the float64 side when the scales are not powers of two).
- sparse attention: a dense softmax over all n KV rows, duplicates entering through
  ``log(count)`` and the sink as an explicit extra column, float64.
- Sinkhorn: a scalar-loop float64 transcription of the kernel's steps, plus properties that
  characterise the Sinkhorn limit (doubly stochastic, ``comb = diag(r) S diag(c)``).

Fresh random inputs every run; the seed is in every failure message
(``LOWBIT_TEST_SEED=<seed>`` replays it).
"""

from __future__ import annotations

import math

import pytest
import torch

from lowbit.formats.fp4 import dequantize_mxfp4, quantize_mxfp4
from lowbit.formats.fp8 import (
    dequantize_fp8_blocks,
    dequantize_fp8_groups,
    e8m0_encode,
    quantize_fp8_blocks,
    quantize_fp8_groups,
)
from lowbit.reference.attention import sparse_attn_ref
from lowbit.reference.gemm import fp4_gemm_ref, fp8_gemm_ref
from lowbit.reference.sinkhorn import hc_split_sinkhorn_ref
from lowbit.testing import assert_close, make_generator

U32 = 2.0**-24  # unit roundoff of FP32


def _rand(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """Random normal data with no zeros (a zero would hide an unwritten output)."""
    x = torch.randn(*shape, generator=gen) * scale
    return torch.where(x == 0, torch.full_like(x, 1e-3), x)


def _check_within_bound(ref: torch.Tensor, exact: torch.Tensor, bound: torch.Tensor, msg: str) -> None:
    err = (ref.double() - exact).abs()
    bad = err > bound
    if bad.any():
        i = tuple(int(v) for v in bad.nonzero()[0])
        raise AssertionError(
            f"{msg}: {int(bad.sum())} elements over the rounding bound; first {i}: "
            f"err {float(err[i]):.3e} > bound {float(bound[i]):.3e}"
        )


# ----------------------------------------------------------------------------------- fp8_gemm


def _fp8_operands(gen, M, N, K, scale_fmt):
    x = _rand(gen, M, K, scale=3.0)
    w = _rand(gen, N, K, scale=0.05)
    a, a_s = quantize_fp8_groups(x, group_size=128, scale_fmt=scale_fmt)
    b, b_s = quantize_fp8_blocks(w, block=128, scale_fmt=scale_fmt)
    return a, a_s, b, b_s


@pytest.mark.parametrize(
    "M,N,K",
    [
        (1, 128, 128),  # M = 1 (decode)
        (5, 256, 384),  # aligned N, K
        (7, 200, 300),  # K % 128 != 0 (ragged last K block), N % 128 != 0
        (33, 67, 129),  # K one past a block, N < 128
        (3, 130, 1000),
    ],
)
@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_fp8_gemm_matches_dequantized_fp64(seed, M, N, K, scale_fmt):
    gen = make_generator(seed)
    a, a_s, b, b_s = _fp8_operands(gen, M, N, K, scale_fmt)
    c = fp8_gemm_ref(a, a_s, b, b_s)
    assert c.dtype == torch.float32 and c.shape == (M, N), f"seed={seed}"
    A = dequantize_fp8_groups(a, a_s, 128).double()
    B = dequantize_fp8_blocks(b, b_s, 128).double()
    exact = A @ B.T
    nb = math.ceil(K / 128)
    bound = (128 + nb + 5) * U32 * (A.abs() @ B.abs().T)
    _check_within_bound(c, exact, bound, f"fp8_gemm_ref M={M} N={N} K={K} {scale_fmt} seed={seed}")


def test_fp8_gemm_block_scales_applied_per_block(seed):
    """One-hot activations pick single weight columns: C[m, n] = a_s * b_s * b[n, k] exactly,
    which pins down the scale indexing (a_s[m, k // 128], b_s[n // 128, k // 128])."""
    gen = make_generator(seed)
    N, K = 300, 384
    b, b_s = quantize_fp8_blocks(_rand(gen, N, K), block=128)
    ks = torch.tensor([0, 127, 128, 300, 383])
    a = torch.zeros(len(ks), K)
    a[torch.arange(len(ks)), ks] = 1.0
    a = a.to(torch.float8_e4m3fn)
    a_s = torch.rand(len(ks), 3, generator=gen) + 0.5
    c = fp8_gemm_ref(a, a_s, b, b_s)
    n = torch.arange(N)
    for m, k in enumerate(ks.tolist()):
        want = a_s[m, k // 128] * b_s[n // 128, k // 128] * b[:, k].float()
        assert torch.equal(c[m], want), f"seed={seed} k={k}"


def test_fp8_gemm_accepts_e8m0_scale_dtypes(seed):
    gen = make_generator(seed)
    a, a_s, b, b_s = _fp8_operands(gen, 4, 160, 256, "ue8m0")
    c = fp8_gemm_ref(a, a_s, b, b_s)
    c_u8 = fp8_gemm_ref(a, e8m0_encode(a_s), b, e8m0_encode(b_s))
    e8 = torch.float8_e8m0fnu
    c_f8 = fp8_gemm_ref(a, e8m0_encode(a_s, e8), b, e8m0_encode(b_s, e8))
    assert torch.equal(c, c_u8) and torch.equal(c, c_f8), f"seed={seed}"


def test_fp8_gemm_bad_inputs():
    a = torch.ones(4, 256).to(torch.float8_e4m3fn)
    b = torch.ones(130, 256).to(torch.float8_e4m3fn)
    a_s, b_s = torch.ones(4, 2), torch.ones(2, 2)
    fp8_gemm_ref(a, a_s, b, b_s)  # the good case runs
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fp8_gemm_ref(a.float(), a_s, b, b_s)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fp8_gemm_ref(a, a_s, b.to(torch.bfloat16), b_s)
    with pytest.raises(ValueError, match="share K"):
        fp8_gemm_ref(a, a_s, b[:, :128], b_s)
    with pytest.raises(ValueError, match="a_s"):
        fp8_gemm_ref(a, torch.ones(4, 1), b, b_s)  # too few K blocks
    with pytest.raises(ValueError, match="b_s"):
        fp8_gemm_ref(a, a_s, b, torch.ones(130, 2))  # per-row, not 128x128 blocks
    with pytest.raises(ValueError, match="b_s"):
        fp8_gemm_ref(a, a_s, b, torch.ones(2, 2).T.contiguous()[:1])
    with pytest.raises(TypeError, match="a_s"):
        fp8_gemm_ref(a, a_s.to(torch.bfloat16), b, b_s)
    with pytest.raises(ValueError, match="2-D"):
        fp8_gemm_ref(a.view(2, 2, 256), a_s, b, b_s)


# ----------------------------------------------------------------------------------- fp4_gemm


@pytest.mark.parametrize(
    "M,N,K,act_block",
    [
        (1, 128, 256, 128),  # M = 1
        (9, 200, 512, 128),  # N % 128 != 0
        (6, 64, 160, 128),  # K % 128 != 0 (last activation block is 32 wide)
        (5, 96, 224, 32),  # 1x32 activation scales
        (17, 33, 32, 32),  # a single K group
    ],
)
@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
def test_fp4_gemm_matches_dequantized_fp64(seed, M, N, K, act_block, scale_fmt):
    gen = make_generator(seed)
    x = _rand(gen, M, K, scale=2.0)
    w = _rand(gen, N, K, scale=0.03)
    a, a_s = quantize_fp8_groups(x, group_size=act_block, scale_fmt=scale_fmt)
    b, b_s = quantize_mxfp4(w, group_size=32)
    assert b.dtype == torch.uint8 and b.shape == (N, K // 2) and b_s.shape == (N, K // 32)
    c = fp4_gemm_ref(a, a_s, b, b_s, act_block_size=act_block)
    assert c.dtype == torch.float32 and c.shape == (M, N), f"seed={seed}"
    A = dequantize_fp8_groups(a, a_s, act_block).double()
    B = dequantize_mxfp4(b, b_s).double()
    exact = A @ B.T
    nb = K // 32
    bound = (32 + nb + 5) * U32 * (A.abs() @ B.abs().T)
    _check_within_bound(c, exact, bound, f"fp4_gemm_ref M={M} N={N} K={K} act={act_block} seed={seed}")


def test_fp4_to_fp8_upcast_is_exact():
    """Every E2M1 value is an E4M3 value: the kernel's FP4 -> FP32 -> FP8 cast loses nothing."""
    from lowbit.formats.fp4 import e2m1_to_float

    vals = e2m1_to_float(torch.arange(16, dtype=torch.uint8))
    assert torch.equal(vals.to(torch.float8_e4m3fn).float(), vals)


def test_fp4_gemm_accepts_storage_dtypes(seed):
    gen = make_generator(seed)
    a, a_s = quantize_fp8_groups(_rand(gen, 3, 128), group_size=128)
    b, b_s = quantize_mxfp4(_rand(gen, 40, 128), group_size=32)
    c = fp4_gemm_ref(a, a_s, b, b_s)
    c2 = fp4_gemm_ref(a, a_s, b.view(torch.float4_e2m1fn_x2), b_s.view(torch.float8_e8m0fnu))
    assert torch.equal(c, c2), f"seed={seed}"


def test_fp4_gemm_bad_inputs():
    a = torch.ones(2, 256).to(torch.float8_e4m3fn)
    a_s = torch.ones(2, 2)
    b = torch.zeros(64, 128, dtype=torch.uint8)
    b_s = torch.full((64, 8), 127, dtype=torch.uint8)
    fp4_gemm_ref(a, a_s, b, b_s)  # the good case runs
    with pytest.raises(TypeError, match="uint8"):
        fp4_gemm_ref(a, a_s, b.to(torch.int32), b_s)
    with pytest.raises(ValueError, match=r"K/2"):
        fp4_gemm_ref(a, a_s, b[:, :64], b_s)  # unpacked width mismatch
    with pytest.raises(ValueError, match="b_s"):
        fp4_gemm_ref(a, a_s, b, b_s[:, :4])  # per-64 instead of per-32
    with pytest.raises(ValueError, match="a_s"):
        fp4_gemm_ref(a, torch.ones(2, 8), b, b_s)  # 1x32 scales given, 1x128 declared
    with pytest.raises(ValueError, match="act_block_size"):
        fp4_gemm_ref(a, a_s, b, b_s, act_block_size=64)
    with pytest.raises(ValueError, match="multiple of 32"):
        fp4_gemm_ref(torch.ones(2, 48).to(torch.float8_e4m3fn), torch.ones(2, 1),
                     torch.zeros(4, 24, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.uint8))
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        fp4_gemm_ref(a.to(torch.bfloat16), a_s, b, b_s)
    with pytest.raises(TypeError, match="b_s"):
        fp4_gemm_ref(a, a_s, b, b_s.to(torch.int32))
    with pytest.raises(ValueError, match="NaN"):
        fp4_gemm_ref(a, a_s, b, torch.full_like(b_s, 255))


# -------------------------------------------------------------------------------- sparse_attn


def _dense_sink_softmax_fp64(q, kv, sink, idxs, scale):
    """Dense formulation: softmax over all n KV rows (row r weighted by how many slots name
    it, via + log(count)) plus one explicit sink column, float64; the sink column is dropped."""
    b, s, h, d = q.shape
    n = kv.shape[1]
    counts = torch.zeros(b, s, n + 1, dtype=torch.float64)
    counts.scatter_add_(2, torch.where(idxs < 0, n, idxs).long(), torch.ones(idxs.shape, dtype=torch.float64))
    counts = counts[..., :n]  # drop the bucket of the -1 slots
    logits = torch.einsum("bshd,bnd->bshn", q.double(), kv.double()) * scale + counts.log()[:, :, None, :]
    sink_col = sink.double().view(1, 1, h, 1).expand(b, s, h, 1)
    p = torch.softmax(torch.cat([logits, sink_col], dim=-1), dim=-1)[..., :n]
    return torch.einsum("bshn,bnd->bshd", p, kv.double())


def _attn_inputs(gen, b, s, h, d, n, topk, p_invalid=0.2):
    q = _rand(gen, b, s, h, d).to(torch.bfloat16)
    kv = _rand(gen, b, n, d).to(torch.bfloat16)
    sink = _rand(gen, h)
    idxs = torch.randint(0, n, (b, s, topk), generator=gen, dtype=torch.int32)
    drop = torch.rand(b, s, topk, generator=gen) < p_invalid
    idxs = torch.where(drop, torch.full_like(idxs, -1), idxs)
    return q, kv, sink, idxs


@pytest.mark.parametrize(
    "b,s,h,d,n,topk",
    [
        (2, 3, 16, 64, 50, 64),  # topk = one kernel block
        (1, 4, 3, 32, 100, 37),  # heads < 16, topk not a multiple of 64
        (2, 2, 1, 16, 9, 130),  # one head, topk > n: many duplicates
        (1, 1, 20, 128, 300, 200),
    ],
)
def test_sparse_attn_matches_dense_fp64(seed, b, s, h, d, n, topk):
    gen = make_generator(seed)
    q, kv, sink, idxs = _attn_inputs(gen, b, s, h, d, n, topk)
    idxs[0, 0, :] = -1  # one all-invalid row
    scale = d**-0.5
    out = sparse_attn_ref(q, kv, sink, idxs, scale)
    assert out.dtype == torch.float32 and out.shape == (b, s, h, d), f"seed={seed}"
    assert torch.isfinite(out).all(), f"seed={seed}"
    want = _dense_sink_softmax_fp64(q, kv, sink, idxs, scale)
    assert_close(out, want, "fp32", name=f"sparse_attn_ref seed={seed}")
    assert torch.equal(out[0, 0], torch.zeros(h, d)), f"seed={seed}: all-invalid row must be exactly 0"


def test_sparse_attn_default_scale_and_int64_idxs(seed):
    gen = make_generator(seed)
    q, kv, sink, idxs = _attn_inputs(gen, 1, 2, 4, 64, 20, 10)
    a = sparse_attn_ref(q, kv, sink, idxs, None)
    b = sparse_attn_ref(q, kv, sink, idxs.long(), 64**-0.5)
    assert torch.equal(a, b), f"seed={seed}"


@pytest.mark.parametrize("sink_value", [float("-inf"), -1e30, 0.0, 1e4])
def test_sparse_attn_all_invalid_rows_are_zero(seed, sink_value):
    gen = make_generator(seed)
    q, kv, _, idxs = _attn_inputs(gen, 2, 3, 5, 32, 12, 7)
    idxs[1] = -1  # the whole second batch element sees nothing
    idxs[0, 2] = -1
    sink = torch.full((5,), sink_value)
    out = sparse_attn_ref(q, kv, sink, idxs, 0.1)
    assert not torch.isnan(out).any(), f"seed={seed}"
    assert torch.equal(out[1], torch.zeros_like(out[1])), f"seed={seed}"
    assert torch.equal(out[0, 2], torch.zeros_like(out[0, 2])), f"seed={seed}"
    empty = sparse_attn_ref(q, kv, sink, idxs[..., :0], 0.1)  # topk = 0
    assert torch.equal(empty, torch.zeros_like(out))


def test_sparse_attn_duplicates_count_twice(seed):
    gen = make_generator(seed)
    h, d = 2, 16
    q = _rand(gen, 1, 1, h, d).to(torch.bfloat16)
    kv = _rand(gen, 1, 6, d).to(torch.bfloat16)
    sink = _rand(gen, h)
    out = sparse_attn_ref(q, kv, sink, torch.tensor([[[4, 1, 4, -1]]], dtype=torch.int32), 0.3)
    z = (q[0, 0].double() @ kv[0].double().T) * 0.3  # [h, 6]
    e4, e1 = z[:, 4].exp(), z[:, 1].exp()
    num = 2 * e4[:, None] * kv[0, 4].double() + e1[:, None] * kv[0, 1].double()
    want = num / (2 * e4 + e1 + sink.double().exp())[:, None]
    assert_close(out[0, 0], want, "fp32", name=f"duplicates seed={seed}")
    # with no sink and one row named twice, the output is that row exactly
    out2 = sparse_attn_ref(q, kv, torch.full((h,), float("-inf")),
                           torch.tensor([[[3, -1, 3]]], dtype=torch.int32), 0.3)
    assert torch.allclose(out2[0, 0], kv[0, 3].float().expand(h, d), rtol=2 * U32, atol=0), f"seed={seed}"


def test_sparse_attn_sink_limits(seed):
    gen = make_generator(seed)
    q, kv, _, idxs = _attn_inputs(gen, 1, 3, 4, 32, 40, 24, p_invalid=0.0)
    huge = sparse_attn_ref(q, kv, torch.full((4,), 1e4), idxs, 0.2)
    assert torch.equal(huge, torch.zeros_like(huge)), f"seed={seed}: a huge sink takes all the mass"
    no_sink = sparse_attn_ref(q, kv, torch.full((4,), float("-inf")), idxs, 0.2)
    tiny_sink = sparse_attn_ref(q, kv, torch.full((4,), -1e30), idxs, 0.2)
    assert torch.equal(no_sink, tiny_sink), f"seed={seed}"
    # -inf sink = plain softmax attention over the gathered rows
    kv_sel = kv[0, idxs[0].long()].double()  # [s, topk, d]
    z = torch.einsum("shd,std->sht", q[0].double(), kv_sel) * 0.2
    want = torch.einsum("sht,std->shd", z.softmax(-1), kv_sel)
    assert_close(no_sink[0], want, "fp32", name=f"no-sink seed={seed}")
    # per-head sink: only the head with the big sink is suppressed
    mixed = sparse_attn_ref(q, kv, torch.tensor([0.0, 1e4, 0.0, float("-inf")]), idxs, 0.2)
    assert torch.equal(mixed[:, :, 1], torch.zeros_like(mixed[:, :, 1]))
    assert torch.equal(mixed[:, :, 3], no_sink[:, :, 3])


def test_sparse_attn_bad_inputs():
    q = torch.ones(1, 2, 4, 16, dtype=torch.bfloat16)
    kv = torch.ones(1, 10, 16, dtype=torch.bfloat16)
    sink = torch.zeros(4)
    idxs = torch.zeros(1, 2, 5, dtype=torch.int32)
    sparse_attn_ref(q, kv, sink, idxs, 0.25)  # the good case runs
    with pytest.raises(TypeError, match="topk_idxs"):
        sparse_attn_ref(q, kv, sink, idxs.float(), 0.25)
    with pytest.raises(TypeError, match="q and kv"):
        sparse_attn_ref(q.to(torch.int32), kv, sink, idxs, 0.25)
    with pytest.raises(ValueError, match="kv"):
        sparse_attn_ref(q, kv[..., :8], sink, idxs, 0.25)  # head dim mismatch
    with pytest.raises(ValueError, match="kv"):
        sparse_attn_ref(q, kv.expand(2, 10, 16), sink, idxs, 0.25)  # batch mismatch
    with pytest.raises(ValueError, match="attn_sink"):
        sparse_attn_ref(q, kv, torch.zeros(16), idxs, 0.25)  # padded sink: the kernel's detail
    with pytest.raises(ValueError, match="topk_idxs"):
        sparse_attn_ref(q, kv, sink, idxs[:, :1], 0.25)
    with pytest.raises(ValueError, match=r"\[-1, n=10\)"):
        sparse_attn_ref(q, kv, sink, torch.full_like(idxs, 10), 0.25)
    with pytest.raises(ValueError, match=r"\[-1, n=10\)"):
        sparse_attn_ref(q, kv, sink, torch.full_like(idxs, -2), 0.25)
    with pytest.raises(ValueError, match="NaN"):
        sparse_attn_ref(q, kv, torch.full((4,), float("nan")), idxs, 0.25)
    with pytest.raises(ValueError, match="q must be"):
        sparse_attn_ref(q[0], kv, sink, idxs, 0.25)


# -------------------------------------------------------------------------- hc_split_sinkhorn


def _sinkhorn_loops_fp64(mix, scale, base, hc, iters, eps):
    """Scalar transcription of the kernel's steps for one token, float64."""
    mix, scale, base = mix.double().tolist(), scale.double().tolist(), base.double().tolist()
    sig = lambda v: 1.0 / (1.0 + math.exp(-v))  # noqa: E731
    pre = [sig(mix[j] * scale[0] + base[j]) + eps for j in range(hc)]
    post = [2.0 * sig(mix[hc + j] * scale[1] + base[hc + j]) for j in range(hc)]
    off = 2 * hc
    c = [[mix[off + j * hc + k] * scale[2] + base[off + j * hc + k] for k in range(hc)] for j in range(hc)]
    for j in range(hc):
        mx = max(c[j])
        e = [math.exp(v - mx) for v in c[j]]
        c[j] = [v / sum(e) + eps for v in e]

    def cols():
        for k in range(hc):
            t = sum(c[j][k] for j in range(hc)) + eps
            for j in range(hc):
                c[j][k] /= t

    def rows():
        for j in range(hc):
            t = sum(c[j]) + eps
            c[j] = [v / t for v in c[j]]

    cols()
    for _ in range(iters - 1):
        rows()
        cols()
    f64 = torch.float64
    return torch.tensor(pre, dtype=f64), torch.tensor(post, dtype=f64), torch.tensor(c, dtype=f64)


def _hc_inputs(gen, lead, hc, logit_scale=0.5):
    """Logits of spread ~0.5-1 (well-conditioned comb: 20 rounds converge to ~1e-6)."""
    mix_hc = (2 + hc) * hc
    mixes = _rand(gen, *lead, mix_hc, scale=logit_scale)
    hc_scale = torch.rand(3, generator=gen) * 0.75 + 0.25
    hc_base = _rand(gen, mix_hc, scale=0.25)
    return mixes, hc_scale, hc_base


@pytest.mark.parametrize("iters", [1, 2, 20])
@pytest.mark.parametrize("hc", [4, 2, 3])
def test_sinkhorn_matches_scalar_loops(seed, iters, hc):
    gen = make_generator(seed)
    mixes, hc_scale, hc_base = _hc_inputs(gen, (5,), hc)
    pre, post, comb = hc_split_sinkhorn_ref(mixes, hc_scale, hc_base, hc_mult=hc, sinkhorn_iters=iters)
    assert pre.shape == (5, hc) and post.shape == (5, hc) and comb.shape == (5, hc, hc)
    for t in range(5):
        p, po, c = _sinkhorn_loops_fp64(mixes[t], hc_scale, hc_base, hc, iters, 1e-6)
        for name, got, want in (("pre", pre[t], p), ("post", post[t], po), ("comb", comb[t], c)):
            assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-7), (
                f"seed={seed} token={t} {name}: {got} vs {want}"
            )


def test_sinkhorn_doubly_stochastic_and_sinkhorn_form(seed):
    """20 iterations reach the Sinkhorn limit: rows and columns sum to 1 (1e-5), and
    comb = diag(r) S diag(c) with S = softmax(L) + eps (the ratio comb / S has rank one)."""
    gen = make_generator(seed)
    hc = 4
    mixes, hc_scale, hc_base = _hc_inputs(gen, (3, 7), hc)
    pre, post, comb = hc_split_sinkhorn_ref(mixes, hc_scale, hc_base)
    assert comb.shape == (3, 7, 4, 4) and pre.shape == (3, 7, 4) and post.shape == (3, 7, 4)
    ones = torch.ones(3, 7, 4)
    assert torch.allclose(comb.sum(-1), ones, atol=1e-5), f"seed={seed}: rows {comb.sum(-1)}"
    assert torch.allclose(comb.sum(-2), ones, atol=1e-5), f"seed={seed}: cols {comb.sum(-2)}"
    assert (comb > 0).all()
    logits = (mixes[..., 2 * hc :].double() * hc_scale[2] + hc_base[2 * hc :]).view(3, 7, hc, hc)
    S = logits.softmax(-1) + 1e-6
    ratio = comb.double() / S
    outer = ratio[..., :, :1] * ratio[..., :1, :] / ratio[..., :1, :1]
    assert torch.allclose(ratio, outer, rtol=1e-5), f"seed={seed}: comb is not diag(r) S diag(c)"
    # pre / post are the plain gates
    assert ((pre > 1e-6 - 1e-12) & (pre <= 1 + 1e-6)).all() and ((post >= 0) & (post <= 2)).all()
    want_pre = torch.sigmoid(mixes[..., :hc].double() * hc_scale[0] + hc_base[:hc]) + 1e-6
    assert torch.allclose(pre.double(), want_pre, rtol=1e-6), f"seed={seed}"


def test_sinkhorn_converges_on_skewed_logits(seed):
    """Sinkhorn-Knopp converges slowly when the softmax rows are skewed (logit spread ~2):
    20 rounds leave row sums off by up to ~5e-2 (columns stay exact, being normalised last).
    More rounds shrink the row error towards the limit."""
    gen = make_generator(seed)
    mixes = _rand(gen, 64, 24, scale=2.0)
    ones3, zeros24 = torch.ones(3), torch.zeros(24)
    row_err = {}
    for iters in (20, 1000):
        _, _, comb = hc_split_sinkhorn_ref(mixes, ones3, zeros24, sinkhorn_iters=iters)
        assert torch.allclose(comb.sum(-2), torch.ones(64, 4), atol=1e-5), f"seed={seed} iters={iters}"
        row_err[iters] = float((comb.sum(-1) - 1).abs().max())
    assert row_err[1000] <= 1e-4, f"seed={seed}: row error {row_err}"
    assert row_err[1000] <= row_err[20], f"seed={seed}: row error {row_err}"


def test_sinkhorn_leading_shapes_agree(seed):
    gen = make_generator(seed)
    mixes, hc_scale, hc_base = _hc_inputs(gen, (2, 3), 4)
    a = hc_split_sinkhorn_ref(mixes, hc_scale, hc_base)
    b = hc_split_sinkhorn_ref(mixes.reshape(6, 24), hc_scale, hc_base)
    for x, y in zip(a, b):
        assert torch.equal(x.reshape(y.shape), y), f"seed={seed}"


def test_sinkhorn_extreme_logits_stay_finite(seed):
    gen = make_generator(seed)
    mixes, hc_scale, hc_base = _hc_inputs(gen, (16,), 4, logit_scale=200.0)
    pre, post, comb = hc_split_sinkhorn_ref(mixes, hc_scale, hc_base)
    for t in (pre, post, comb):
        assert torch.isfinite(t).all(), f"seed={seed}"
    assert (pre >= 1e-6).all() and (pre <= 1 + 1e-6).all() and (post >= 0).all() and (post <= 2).all()
    assert torch.allclose(comb.sum(-2), torch.ones(16, 4), atol=1e-5), f"seed={seed}"


def test_sinkhorn_bad_inputs():
    mixes, hc_scale, hc_base = torch.ones(3, 24), torch.ones(3), torch.zeros(24)
    hc_split_sinkhorn_ref(mixes, hc_scale, hc_base)  # the good case runs
    with pytest.raises(ValueError, match="mixes"):
        hc_split_sinkhorn_ref(torch.ones(3, 20), hc_scale, hc_base)
    with pytest.raises(ValueError, match="hc_scale"):
        hc_split_sinkhorn_ref(mixes, torch.ones(2), hc_base)
    with pytest.raises(ValueError, match="hc_base"):
        hc_split_sinkhorn_ref(mixes, hc_scale, torch.zeros(16))
    with pytest.raises(ValueError, match="mixes"):
        hc_split_sinkhorn_ref(mixes, hc_scale, hc_base, hc_mult=2)  # 24 != (2+2)*2
    with pytest.raises(ValueError, match="sinkhorn_iters"):
        hc_split_sinkhorn_ref(mixes, hc_scale, hc_base, sinkhorn_iters=0)
    with pytest.raises(TypeError, match="mixes"):
        hc_split_sinkhorn_ref(mixes.int(), hc_scale, hc_base)
