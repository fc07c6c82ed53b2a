"""Output-centric MoE decode ("warp decode", seed 001): two kernels organized around outputs.

Semantics (reference: `lowbit.reference.moe_experts_ref(..., round_intermediate=True)`)::

    gate_up:  for each token t, slot j with e = topk_ids[t, j] a local expert (0 <= e < E):
                  g = hidden[t] . W13[e, i, :]          (FP32 accumulation, i < I)
                  u = hidden[t] . W13[e, I + i, :]
                  act[t, j, i] = bf16(SiLU(g) * u)
              act[t, j, :] = 0 for a dropped slot (id -1, or any id outside [0, E))
    down:     out[t, h] = bf16( sum_j topk_weights[t, j] * (act[t, j, :] . W2[e_j, h, :]) )
              over the slots j with a local expert; one FP32 accumulator per output.

``hidden bf16 [M, H]``, ``topk_ids int32 [M, k]``, ``topk_weights fp32 [M, k]`` (used as
given: not renormalized), ``W13 [E, 2I, H]`` (gate rows, then up rows), ``W2 [E, H, I]``;
``act bf16 [M, k, I]``; ``out bf16 [M, H]``. No padding, no scatter, no per-expert buffer, no
separate combine: the routing weight is folded into the down projection's accumulator.
Everything is read on the device (no host readback), so `moe_decode` can be captured in a
CUDA graph and replayed with new ``topk_ids`` / ``topk_weights``.

A token whose top-k lists an expert twice (a top-k router cannot, a hand-built routing can):
**each slot counts**, as in the reference: both slots get the same ``act`` row and the output
gets ``(w_j1 + w_j2) * expert_e(hidden[t])``.

Weight formats (activations stay BF16 throughout, weights are upcast in registers):

- INT4 group-32: a `lowbit.formats.w4a16.W4A16Weight` packed with ``profile="indexed"`` -- the
  very object the indexed W4A16 GEMM takes, so one loaded checkpoint serves both paths. Each
  256-wide K tile is dequantized with `int4_dequant.dequant_pair` (as `w4a16_core` does), so
  the effective weight is ``bf16((q - 8) * s)``, the same as the indexed path's.
- MXFP8: an `Mxfp8ExpertWeight` (E4M3 codes + E8M0 byte per 32, see `pack_mxfp8_experts`).
  ``code * 2**(byte - 127)`` is exact in FP32 (and in BF16, for any scale in 2^-117..2^119).
  Two layouts of the same codes: ``"natural"`` (K order; the fma / dot engines) and
  ``"k256-interleaved"`` (the mma engine's: per 256-wide K step, word c of a half step holds
  element c of its four groups, plus bf16 group multipliers ``2**(byte - 7)``; scales up to 2^7).

Three engines map outputs to programs (`DecodeConfig.engine`; all give the same function up to
FP32 summation order):

- ``"fma"`` -- the seed's warp decode, one output unit per program, CUDA-core math.
  gate_up: a program owns one route (token, slot) x ``block_i`` neurons: ``block_i`` gate rows
  and ``block_i`` up rows stream through it in 256-wide K steps with 16-byte loads (INT4: 128
  bytes a row a step, dequantized a group pair at a time; MXFP8: 256 bytes a row a step, each
  group's sum of exact code x activation products scaled by its power-of-two scale); each
  thread keeps FP32 partial sums of its lanes for both projections, one ``tl.sum`` per row at
  the end (the warp's butterfly reduction). down: a program owns one token x ``block_h``
  output dims and loops over the token's k slots, multiplying each activation chunk by the
  routing weight, into one FP32 accumulator tile.
- ``"dot"`` -- the same outputs, but when several tokens hit one expert its weight rows are
  read once for all of them and the FMAs run on tensor cores (``numerics.dot``, FP32
  accumulation). gate_up: the program of route r is the *owner* of its (expert, neuron block)
  when no earlier route has the same expert; it gathers the routes that share the expert
  (compacted on the device from ``topk_ids``, ``tokens`` at a time) and computes their
  ``[block_i, tokens]`` outputs in one weight pass; the other programs of that expert return
  at once. down: a program owns ``tokens`` consecutive tokens x ``block_h`` output dims and
  visits each distinct expert of those tokens once (in first-occurrence order), folding
  ``sum_j w[t, j] [topk_ids[t, j] == e]`` into the accumulator of token t (INT4 runs the
  W4A16 main loop `w4a16_core.w4a16_tile` there, tokens on the MMA's N side).

- ``"mma"`` -- INT4 and k256-interleaved MXFP8 on sm_90 (Gluon, `moe_decode_sm90`): the dot engine's outputs and
  owner rule, rebuilt to stream weights. Words, scales and activations go through a cp.async
  ring in shared memory (no TMA, one CTA barrier a step), each warp dequantizes its 16 weight
  rows straight into mma.sync A fragments, and at small batches the warps of a program split
  the work instead of the rows (gate_up: K; down: the expert visits), each against its own
  block of MMA columns, summed once at the end. The default for INT4 on sm_90 (`_MMA_SPLITS`)
  and the only engine of the interleaved MXFP8 layout (`_MMA_SPLITS_MXFP8`).

Status (H200, 2026-11-30, ninth session; docs/performance.md): the mma engine's Kimi EP8 INT4
layer takes 84.6 us at one token, 1.14x Humming's indexed layer (96.8 us) and 1.34x lowbit's
(113.4 us), 52% of the 4.50 TB/s read bandwidth on the bytes of the experts hit (the issue-5
target is 85%: missed); 0.97x / 0.91x Humming at 2 / 4 tokens; from 8 tokens lowbit's indexed
path is faster (the crossover). What bounds it: instruction issue (~350 instructions a warp
a 16-row x 256-K step, 2 of them a weight for the dequantization; 0.53-0.56 issued a cycle per
scheduler with 2-3 warps each, ncu). The Triton fma / dot engines (the CPU path, and natural
MXFP8) take 168 / 1287 us at 1 / 32 tokens. MXFP8 (thirteenth session, `decode_mma.py mxfp8`,
same codes): the mma engine on the interleaved layout 124.9 / 329.9 / 532.8 / 1378.4 us at 1 /
4 / 8 / 32 tokens against the Triton engines' 145.2 / 466.1 / 1309.3 / 2629.4 (62% of the read
bandwidth at one token; the issue-5 target, 85%, is missed there too).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl

from ...formats.base import FormatError, QuantizedTensor
from ...formats.fp8 import e8m0_decode
from ...formats.mxfp8 import MXFP8_GROUP, quantize_mxfp8
from ...formats.w4a16 import W4A16Weight
from ...runtime import numerics, overrides
from ..w4a16.int4 import dequant_pair
from ...runtime.device import is_sm90_native, require_sm90
from ..w4a16.portable import w4a16_tile

__all__ = [
    "MXFP8_LAYOUTS",
    "Mxfp8ExpertWeight",
    "pack_mxfp8_experts",
    "DecodeConfig",
    "moe_decode_config",
    "explain_moe_decode_config",
    "moe_decode",
    "moe_decode_gate_up",
    "moe_decode_down",
    "ENV_OVERRIDES",
    "compile_configs",
]

#: Format codes passed to the kernels as the ``FMT`` constexpr.
_FMT_INT4 = 0
_FMT_MXFP8 = 1
#: Routes scanned at once when the gate_up owner looks for routes sharing its expert (the dot and mma engines).
_ROUTE_CHUNK = 64


# =========================================================================== MXFP8 weight
#: `Mxfp8ExpertWeight.layout` values. ``"natural"``: codes ``[E, N, K]`` in K order (the Triton
#: engines and the reference read it). ``"k256-interleaved"``: the mma engine's layout (below).
MXFP8_LAYOUTS = ("natural", "k256-interleaved")
#: The largest E8M0 byte the interleaved layout takes: its bf16 multipliers are ``2**(byte - 7)``
#: (the E4M3 bits land in bf16 as ``code * 2**-120``), whose exponent field ``byte + 120`` must
#: stay below 255: scales up to 2^7, weights up to 448 * 2^7.
MXFP8_MMA_MAX_E8M0 = 134


def _interleave_k256(codes: torch.Tensor) -> torch.Tensor:
    """``e4m3 [E, N, K]`` -> the interleaved ``[E, N, Kp]`` (K zero-padded to a multiple of 256):
    per 256-wide K step, half h and column c (the 32-bit word ``64 kt + 32 h + c``), byte o holds
    K ``256 kt + 32 (4h + o) + c``: element c of each of the half's four groups, so one ``prmt``
    of two K-adjacent words gathers a group's bf16x2 fragment pair (the INT4 indexed profile's
    idea: word j holds element j of every group)."""
    e, n, k = codes.shape
    kp = -(-k // 256) * 256
    b = torch.zeros(e, n, kp, dtype=torch.uint8, device=codes.device)
    b[..., :k] = codes.view(torch.uint8)
    b = b.view(e, n, kp // 256, 2, 4, 32).permute(0, 1, 2, 3, 5, 4).contiguous()
    return b.view(e, n, kp).view(torch.float8_e4m3fn)


def _deinterleave_k256(codes: torch.Tensor, k: int) -> torch.Tensor:
    """The inverse of `_interleave_k256`, cut back to K."""
    e, n, kp = codes.shape
    b = codes.view(torch.uint8).view(e, n, kp // 256, 2, 32, 4).permute(0, 1, 2, 3, 5, 4).contiguous()
    return b.view(e, n, kp)[..., :k].contiguous().view(torch.float8_e4m3fn)


def _mma_multipliers(scales_e8m0: torch.Tensor, kp: int) -> torch.Tensor:
    """bf16 ``[E, Kp/32, N]`` (the INT4 indexed profile's scale layout): ``2**(byte - 7)`` per
    group, 0 for the groups of the K padding. Exact: a power of two in bf16's normal range."""
    e, n, groups = scales_e8m0.shape
    out = torch.zeros(e, kp // 32, n, dtype=torch.bfloat16, device=scales_e8m0.device)
    out[:, :groups] = (e8m0_decode(scales_e8m0) * 2.0**120).to(torch.bfloat16).transpose(1, 2)
    return out


@dataclass(frozen=True)
class Mxfp8ExpertWeight:
    """MXFP8 expert weights as the decode kernels read them.

    codes: ``float8_e4m3fn [E, N, K]`` (K a multiple of 32, contiguous) in the natural layout,
    or ``[E, N, Kp]`` (Kp = K rounded up to 256, zero-padded) in the ``"k256-interleaved"``
    layout of the mma engine (`_interleave_k256`); scales_e8m0: ``uint8 [E, N, K/32]`` (E8M0
    bytes, ``2**(byte - 127)``; 255 = NaN is refused) in both; mma_scales: the interleaved
    layout's bf16 multipliers ``[E, Kp/32, N]`` (`_mma_multipliers`, built by
    `pack_mxfp8_experts`), None for natural. The constructor validates; `pack_mxfp8_experts`
    builds one from real weights or from `lowbit.formats.mxfp8.quantize_mxfp8` output.
    """

    codes: torch.Tensor
    scales_e8m0: torch.Tensor
    layout: str = "natural"
    mma_scales: torch.Tensor | None = None

    def __post_init__(self):
        c, s = self.codes, self.scales_e8m0
        if not isinstance(c, torch.Tensor) or not isinstance(s, torch.Tensor):
            raise FormatError("Mxfp8ExpertWeight: codes and scales_e8m0 must be tensors")
        if c.dtype != torch.float8_e4m3fn or c.dim() != 3:
            raise FormatError(f"Mxfp8ExpertWeight: codes must be float8_e4m3fn [E, N, K], got {c.dtype} {tuple(c.shape)}")
        if s.dtype != torch.uint8:
            raise FormatError(f"Mxfp8ExpertWeight: scales_e8m0 must be uint8 E8M0 bytes, got {s.dtype}")
        if self.layout not in MXFP8_LAYOUTS:
            raise FormatError(f"Mxfp8ExpertWeight: layout must be one of {MXFP8_LAYOUTS}, got {self.layout!r}")
        e, n, kc = c.shape
        k = s.shape[-1] * MXFP8_GROUP if s.dim() == 3 else -1
        if self.layout == "natural":
            if kc % MXFP8_GROUP:
                raise FormatError(f"Mxfp8ExpertWeight: K={kc} is not a multiple of {MXFP8_GROUP}")
            k = kc
        if tuple(s.shape) != (e, n, k // MXFP8_GROUP) or (self.layout != "natural" and kc != -(-k // 256) * 256):
            raise FormatError(f"Mxfp8ExpertWeight: codes {tuple(c.shape)} ({self.layout}) need scales [E, N, K/32] "
                              f"with K = {kc if self.layout == 'natural' else 'codes K - padding < 256'}, got "
                              f"{tuple(s.shape)}")
        if c.device != s.device:
            raise FormatError(f"Mxfp8ExpertWeight: codes on {c.device}, scales on {s.device}")
        if not c.is_contiguous() or not s.is_contiguous():
            raise FormatError("Mxfp8ExpertWeight: codes and scales must be contiguous")
        if s.numel() and bool((s == 255).any()):
            raise FormatError("Mxfp8ExpertWeight: E8M0 scale byte 255 (NaN) in the weight")
        if self.layout == "natural":
            if self.mma_scales is not None:
                raise FormatError("Mxfp8ExpertWeight: mma_scales belong to the k256-interleaved layout")
            return
        if s.numel() and int(s.max()) > MXFP8_MMA_MAX_E8M0:
            raise FormatError(f"Mxfp8ExpertWeight: the k256-interleaved layout takes E8M0 bytes <= "
                              f"{MXFP8_MMA_MAX_E8M0} (scales up to 2^7), got {int(s.max())}")
        m = self.mma_scales
        if (not isinstance(m, torch.Tensor) or m.dtype != torch.bfloat16 or tuple(m.shape) != (e, kc // 32, n)
                or not m.is_contiguous() or m.device != c.device):
            raise FormatError(f"Mxfp8ExpertWeight: the k256-interleaved layout needs mma_scales bf16 "
                              f"[E, Kp/32, N] = {(e, kc // 32, n)} (pack_mxfp8_experts builds them)")

    @property
    def num_experts(self) -> int:
        return self.codes.shape[0]

    @property
    def n(self) -> int:
        return self.codes.shape[1]

    @property
    def k(self) -> int:
        return self.scales_e8m0.shape[2] * MXFP8_GROUP

    def to(self, device: torch.device | str) -> "Mxfp8ExpertWeight":
        m = None if self.mma_scales is None else self.mma_scales.to(device)
        return Mxfp8ExpertWeight(self.codes.to(device), self.scales_e8m0.to(device), self.layout, m)

    def natural_codes(self) -> torch.Tensor:
        """``float8_e4m3fn [E, N, K]`` in K order, whatever the layout."""
        return self.codes if self.layout == "natural" else _deinterleave_k256(self.codes, self.k)

    def as_quantized(self) -> QuantizedTensor:
        """The logical ``mxfp8`` `QuantizedTensor` (what `lowbit.reference` takes)."""
        return QuantizedTensor(self.natural_codes(), self.scales_e8m0, "mxfp8")


def pack_mxfp8_experts(weight, scales_e8m0: torch.Tensor | None = None, *,
                       layout: str = "natural") -> Mxfp8ExpertWeight:
    """Build an `Mxfp8ExpertWeight`.

    weight: real expert weights ``[E, N, K]`` (float32/bf16/fp16; quantized with
    `quantize_mxfp8`); or a ``(codes, scales_e8m0)`` pair as `quantize_mxfp8` returns it; or
    codes ``float8_e4m3fn [E, N, K]`` with `scales_e8m0` ``uint8 [E, N, K/32]``; or a
    `QuantizedTensor` of format ``mxfp8``. layout: ``"natural"`` (every engine) or
    ``"k256-interleaved"`` (the sm_90 mma engine only, its fast path: the same bytes reordered
    once, K padded to 256, plus bf16 group multipliers, 1/16 of the codes' bytes).
    """
    if layout not in MXFP8_LAYOUTS:
        raise FormatError(f"pack_mxfp8_experts: layout must be one of {MXFP8_LAYOUTS}, got {layout!r}")
    if isinstance(weight, QuantizedTensor):
        if weight.fmt != "mxfp8":
            raise FormatError(f"pack_mxfp8_experts takes mxfp8 weights, got format {weight.fmt!r}")
        weight, scales_e8m0 = weight.codes, weight.scales
    elif isinstance(weight, tuple):
        if len(weight) != 2 or scales_e8m0 is not None:
            raise FormatError("pack_mxfp8_experts: give a (codes, scales_e8m0) pair, or codes and scales_e8m0")
        weight, scales_e8m0 = weight
    if not isinstance(weight, torch.Tensor):
        raise FormatError(f"pack_mxfp8_experts: expected a tensor, got {type(weight).__name__}")
    if weight.dtype != torch.float8_e4m3fn:
        if scales_e8m0 is not None:
            raise FormatError(f"pack_mxfp8_experts: codes must be float8_e4m3fn, got {weight.dtype}")
        if weight.dim() != 3:
            raise FormatError(f"pack_mxfp8_experts: expert weights must be [E, N, K], got {tuple(weight.shape)}")
        weight, scales_e8m0 = quantize_mxfp8(weight)
    elif scales_e8m0 is None:
        raise FormatError("pack_mxfp8_experts: float8_e4m3fn codes need their scales_e8m0")
    codes, scales_e8m0 = weight.contiguous(), scales_e8m0.contiguous()
    if layout == "natural":
        return Mxfp8ExpertWeight(codes, scales_e8m0)
    Mxfp8ExpertWeight(codes, scales_e8m0)  # the natural form's checks first
    inter = _interleave_k256(codes)
    return Mxfp8ExpertWeight(inter, scales_e8m0, layout, _mma_multipliers(scales_e8m0, inter.shape[2]))


# =========================================================================== kernels
@triton.jit
def _e8m0_to_fp32(b):
    """E8M0 bytes -> FP32 ``2**(b - 127)`` by building the exponent bits (byte 0 = 2^-127, an
    FP32 subnormal: only mantissa bit 22). Exact on both tiers."""
    bits = b.to(tl.int32) << 23
    bits = tl.where(b == 0, 0x400000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _mxfp8_group(w_rows, s_rows, row_ok, g, K, stride_sg):
    """FP32 ``[R, 32]``: K-group `g` (elements ``32g .. 32g+31``) of the rows, exact; groups
    past K read as 0. w_rows: ``[R, 1]`` pointers to the rows' codes; s_rows: ``[R]`` pointers
    to their scale bytes."""
    ok = row_ok & (g * 32 < K)
    codes = tl.load(w_rows + g * 32 + tl.arange(0, 32)[None, :], mask=ok[:, None], other=0.0)
    scale = _e8m0_to_fp32(tl.load(s_rows + g * stride_sg, mask=ok, other=127))
    return codes.to(tl.float32) * scale[:, None]


@triton.jit
def _mxfp8_step(w_rows, s_rows, row_ok, kt, K, stride_sg, x):
    """FP32 ``[R, 8]``: for each of the 8 K-groups of 256-wide step `kt` (``k = 256kt + 32g + j``),
    ``scale_g * sum_j code[g, j] * x[g, j]`` -- the group sum of exact code x activation
    products, then the power-of-two scale (exact). x: FP32 ``[1, 8, 32]``; groups past K are 0.
    The codes are one 256-byte row segment a row (16-byte loads): the fma engine's MXFP8 step."""
    g = kt * 8 + tl.arange(0, 8)
    ok = row_ok[:, None] & (g * 32 < K)[None, :]
    offs = (g * 32)[:, None] + tl.arange(0, 32)[None, :]
    codes = tl.load(w_rows[:, :, None] + offs[None, :, :], mask=ok[:, :, None], other=0.0)
    part = tl.sum(codes.to(tl.float32) * x, axis=2)
    scale = _e8m0_to_fp32(tl.load(s_rows[:, None] + g[None, :] * stride_sg, mask=ok, other=127))
    return part * scale


@triton.jit
def _load_step(FMT: tl.constexpr, w_rows, row_ok, kt):
    """INT4: the 32 words ``[R, 32]`` of 256-wide K tile `kt` (one 128-byte row segment, read
    with 16-byte loads). MXFP8 reads per group in `_weight_pair`: returns a placeholder."""
    if FMT == 0:
        words = tl.load(w_rows + kt * 32 + tl.arange(0, 32)[None, :], mask=row_ok[:, None], other=0)
    else:
        words = 0
    return words


@triton.jit
def _weight_pair(FMT: tl.constexpr, words, w_rows, s_rows, row_ok, kt, i: tl.constexpr, K, stride_sg,
                 AS_BF16: tl.constexpr):
    """The weights of K-groups ``8kt + i`` and ``8kt + i + 4`` of the rows (``k = 256kt + 32i + j``
    and ``k + 128``): two ``[R, 32]`` tiles. INT4: bf16 ``(q - 8) * s`` from `dequant_pair`.
    MXFP8: exact FP32, or the same values as bf16 (exact) when `AS_BF16`."""
    g_lo = kt * 8 + i
    if FMT == 0:
        s_lo = tl.load(s_rows + g_lo * stride_sg, mask=row_ok, other=0.0)
        s_hi = tl.load(s_rows + (g_lo + 4) * stride_sg, mask=row_ok, other=0.0)
        w_lo, w_hi = dequant_pair(words >> (4 * i), s_lo[:, None], s_hi[:, None])
    else:
        w_lo = _mxfp8_group(w_rows, s_rows, row_ok, g_lo, K, stride_sg)
        w_hi = _mxfp8_group(w_rows, s_rows, row_ok, g_lo + 4, K, stride_sg)
        if AS_BF16:
            w_lo = numerics.to_bf16(w_lo)
            w_hi = numerics.to_bf16(w_hi)
    return w_lo, w_hi


@triton.jit
def _gate_up_kernel(
    x_ptr, ids_ptr, w_ptr, s_ptr, act_ptr,
    num_routes, top_k, num_experts, H, I,
    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_sg, stride_am,
    FMT: tl.constexpr, DOT: tl.constexpr, BLOCK_I: tl.constexpr, TOKENS: tl.constexpr,
    ROUTE_CHUNK: tl.constexpr, LOOP_STAGES: tl.constexpr,
):
    """Grid ``(cdiv(I, BLOCK_I), num_routes)``: program (ib, r) owns act[r, ib-th neuron block]."""
    pid_i = tl.program_id(0)
    r = tl.program_id(1)
    ri = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    i_ok = ri < I
    e = tl.load(ids_ptr + r)
    if (e < 0) | (e >= num_experts):  # dropped slot: its act row is defined as 0
        tl.store(act_ptr + r.to(tl.int64) * stride_am + ri, tl.zeros([BLOCK_I], tl.bfloat16), mask=i_ok)
        return
    e64 = e.to(tl.int64)
    j = tl.arange(0, 32)
    # gate rows ri and up rows I + ri of W13[e]; INT4 scales are [E, Kp/32, N], MXFP8 [E, N, K/32]
    wg_rows = w_ptr + e64 * stride_we + ri[:, None].to(tl.int64) * stride_wn
    wu_rows = w_ptr + e64 * stride_we + (I + ri)[:, None].to(tl.int64) * stride_wn
    sg_rows = s_ptr + e64 * stride_se + ri.to(tl.int64) * stride_sn
    su_rows = s_ptr + e64 * stride_se + (I + ri).to(tl.int64) * stride_sn
    if DOT:
        # Owner rule: the first route with expert e computes every route with expert e.
        earlier = tl.zeros([ROUTE_CHUNK], tl.int32)
        for c in range(0, tl.cdiv(r, ROUTE_CHUNK)):
            rr = c * ROUTE_CHUNK + tl.arange(0, ROUTE_CHUNK)
            earlier += (tl.load(ids_ptr + rr, mask=rr < r, other=-1) == e).to(tl.int32)
        if tl.sum(earlier) > 0:
            return
        members = tl.zeros([ROUTE_CHUNK], tl.int32)
        for c in range(r // ROUTE_CHUNK, tl.cdiv(num_routes, ROUTE_CHUNK)):
            rr = c * ROUTE_CHUNK + tl.arange(0, ROUTE_CHUNK)
            hit = (tl.load(ids_ptr + rr, mask=rr < num_routes, other=-1) == e) & (rr >= r)
            members += hit.to(tl.int32)
        n_members = tl.sum(members)
        cols = tl.arange(0, TOKENS)
        for grp in range(0, tl.cdiv(n_members, TOKENS)):
            # compact the member routes of rank grp*TOKENS .. +TOKENS-1 into `route`
            want = grp * TOKENS + cols
            route = tl.zeros([TOKENS], tl.int32)
            base = tl.sum(tl.zeros([ROUTE_CHUNK], tl.int32))
            for c in range(r // ROUTE_CHUNK, tl.cdiv(num_routes, ROUTE_CHUNK)):
                rr = c * ROUTE_CHUNK + tl.arange(0, ROUTE_CHUNK)
                hit = (tl.load(ids_ptr + rr, mask=rr < num_routes, other=-1) == e) & (rr >= r)
                rank = base + tl.cumsum(hit.to(tl.int32), 0) - 1
                sel = hit[None, :] & (rank[None, :] == want[:, None])
                route += tl.sum(tl.where(sel, rr[None, :], 0), axis=1)
                base += tl.sum(hit.to(tl.int32))
            col_ok = want < n_members
            x_rows = x_ptr + (route // top_k)[:, None].to(tl.int64) * stride_xm + j[None, :]
            acc_g = tl.zeros([BLOCK_I, TOKENS], tl.float32)
            acc_u = tl.zeros([BLOCK_I, TOKENS], tl.float32)
            for kt in range(0, tl.cdiv(H, 256)):
                words_g = _load_step(FMT, wg_rows, i_ok, kt)
                words_u = _load_step(FMT, wu_rows, i_ok, kt)
                for i in tl.static_range(4):
                    g_lo, g_hi = _weight_pair(FMT, words_g, wg_rows, sg_rows, i_ok, kt, i, H, stride_sg, True)
                    u_lo, u_hi = _weight_pair(FMT, words_u, wu_rows, su_rows, i_ok, kt, i, H, stride_sg, True)
                    k_lo = kt * 256 + i * 32
                    k_hi = k_lo + 128
                    # the hidden rows are read once and feed both projections
                    x_lo = tl.load(x_rows + k_lo, mask=col_ok[:, None] & ((k_lo + j) < H)[None, :], other=0.0)
                    x_hi = tl.load(x_rows + k_hi, mask=col_ok[:, None] & ((k_hi + j) < H)[None, :], other=0.0)
                    acc_g = numerics.dot(g_lo, tl.trans(x_lo), acc_g)
                    acc_g = numerics.dot(g_hi, tl.trans(x_hi), acc_g)
                    acc_u = numerics.dot(u_lo, tl.trans(x_lo), acc_u)
                    acc_u = numerics.dot(u_hi, tl.trans(x_hi), acc_u)
            act = numerics.to_bf16(numerics.silu_mul(acc_g, acc_u))
            a = act_ptr + route[None, :].to(tl.int64) * stride_am + ri[:, None]
            tl.store(a, act, mask=i_ok[:, None] & col_ok[None, :])
    else:
        x_row = x_ptr + (r // top_k).to(tl.int64) * stride_xm
        # each thread keeps FP32 partial sums of its lanes (products of upcast weights and bf16
        # activations are exact in FP32); one reduction a row at the end
        if FMT == 0:
            acc_g = tl.zeros([BLOCK_I, 32], tl.float32)
            acc_u = tl.zeros([BLOCK_I, 32], tl.float32)
            for kt in tl.range(0, tl.cdiv(H, 256), num_stages=LOOP_STAGES):
                words_g = _load_step(FMT, wg_rows, i_ok, kt)
                words_u = _load_step(FMT, wu_rows, i_ok, kt)
                for i in tl.static_range(4):
                    g_lo, g_hi = _weight_pair(FMT, words_g, wg_rows, sg_rows, i_ok, kt, i, H, stride_sg, False)
                    u_lo, u_hi = _weight_pair(FMT, words_u, wu_rows, su_rows, i_ok, kt, i, H, stride_sg, False)
                    k_lo = kt * 256 + i * 32
                    k_hi = k_lo + 128
                    x_lo = tl.load(x_row + k_lo + j, mask=(k_lo + j) < H, other=0.0).to(tl.float32)
                    x_hi = tl.load(x_row + k_hi + j, mask=(k_hi + j) < H, other=0.0).to(tl.float32)
                    acc_g += g_lo.to(tl.float32) * x_lo[None, :] + g_hi.to(tl.float32) * x_hi[None, :]
                    acc_u += u_lo.to(tl.float32) * x_lo[None, :] + u_hi.to(tl.float32) * x_hi[None, :]
            g = tl.sum(acc_g, axis=1)
            u = tl.sum(acc_u, axis=1)
        else:
            acc_g = tl.zeros([BLOCK_I, 8], tl.float32)
            acc_u = tl.zeros([BLOCK_I, 8], tl.float32)
            x_offs = tl.arange(0, 8)[:, None] * 32 + j[None, :]
            for kt in tl.range(0, tl.cdiv(H, 256), num_stages=LOOP_STAGES):
                x = tl.load(x_row + kt * 256 + x_offs, mask=(kt * 256 + x_offs) < H, other=0.0).to(tl.float32)
                acc_g += _mxfp8_step(wg_rows, sg_rows, i_ok, kt, H, stride_sg, x[None, :, :])
                acc_u += _mxfp8_step(wu_rows, su_rows, i_ok, kt, H, stride_sg, x[None, :, :])
            g = tl.sum(acc_g, axis=1)
            u = tl.sum(acc_u, axis=1)
        act = numerics.to_bf16(numerics.silu_mul(g, u))
        tl.store(act_ptr + r.to(tl.int64) * stride_am + ri, act, mask=i_ok)


@triton.jit
def _down_kernel(
    act_ptr, ids_ptr, tw_ptr, w_ptr, s_ptr, out_ptr,
    M, top_k, num_experts, H, I,
    stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_sg, stride_om,
    FMT: tl.constexpr, DOT: tl.constexpr, BLOCK_H: tl.constexpr, TOKENS: tl.constexpr,
    TOPK_P2: tl.constexpr, LOOP_STAGES: tl.constexpr,
):
    """Grid ``(cdiv(H, BLOCK_H), M)`` (fma) or ``(cdiv(H, BLOCK_H), cdiv(M, TOKENS))`` (dot)."""
    pid_h = tl.program_id(0)
    pid_t = tl.program_id(1)
    rh = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = rh < H
    j = tl.arange(0, 32)
    if DOT:
        toks = pid_t * TOKENS + tl.arange(0, TOKENS)
        jj = tl.arange(0, TOPK_P2)
        route2 = toks[:, None] * top_k + jj[None, :]  # [TOKENS, TOPK_P2] flat route ids
        slot_ok = (toks < M)[:, None] & (jj < top_k)[None, :]
        ids2 = tl.load(ids_ptr + route2, mask=slot_ok, other=-1)
        ids2 = tl.where((ids2 >= 0) & (ids2 < num_experts), ids2, -1)
        tw2 = tl.load(tw_ptr + route2, mask=slot_ok, other=0.0)
        base = pid_t * TOKENS * top_k
        n_pos = tl.minimum(M - pid_t * TOKENS, TOKENS) * top_k
        acc = tl.zeros([TOKENS, BLOCK_H], tl.float32)
        for p in range(0, n_pos):
            e = tl.load(ids_ptr + base + p)
            # visit each distinct expert of these tokens once: at its first occurrence
            seen = tl.sum(((ids2 == e) & (route2 - base < p)).to(tl.int32))
            if (e >= 0) & (e < num_experts) & (seen == 0):
                match = ids2 == e
                coef = tl.sum(tl.where(match, tw2, 0.0), axis=1)  # every slot with e counts
                slot = tl.min(tl.where(match, jj[None, :], TOPK_P2), axis=1)
                has = slot < TOPK_P2
                a_row = (toks * top_k + tl.where(has, slot, 0)).to(tl.int64)
                e64 = e.to(tl.int64)
                if FMT == 0:  # the W4A16 main loop, tokens on the MMA's N side
                    part = w4a16_tile(act_ptr, a_row, has, stride_am, w_ptr, s_ptr, e64, rh, h_ok,
                                      stride_we, stride_wn, stride_se, stride_sg, I, 0, tl.cdiv(I, 256), TOKENS, BLOCK_H, True)
                else:
                    w_rows = w_ptr + e64 * stride_we + rh[:, None].to(tl.int64) * stride_wn
                    s_rows = s_ptr + e64 * stride_se + rh.to(tl.int64) * stride_sn
                    a_rows = act_ptr + a_row[:, None] * stride_am + j[None, :]
                    part_t = tl.zeros([BLOCK_H, TOKENS], tl.float32)
                    for kt in range(0, tl.cdiv(I, 256)):
                        for i in tl.static_range(4):
                            w_lo, w_hi = _weight_pair(FMT, 0, w_rows, s_rows, h_ok, kt, i, I, stride_sg, True)
                            k_lo = kt * 256 + i * 32
                            k_hi = k_lo + 128
                            a_lo = tl.load(a_rows + k_lo, mask=has[:, None] & ((k_lo + j) < I)[None, :], other=0.0)
                            a_hi = tl.load(a_rows + k_hi, mask=has[:, None] & ((k_hi + j) < I)[None, :], other=0.0)
                            part_t = numerics.dot(w_lo, tl.trans(a_lo), part_t)
                            part_t = numerics.dot(w_hi, tl.trans(a_hi), part_t)
                    part = tl.trans(part_t)
                acc += part * coef[:, None]
        o = out_ptr + toks[:, None].to(tl.int64) * stride_om + rh[None, :]
        tl.store(o, numerics.to_bf16(acc), mask=(toks < M)[:, None] & h_ok[None, :])
    else:
        t = pid_t
        # INT4 accumulates [BLOCK_H, 32] lanes, MXFP8 [BLOCK_H, 8, 32] (one 256-wide step)
        if FMT == 0:
            acc = tl.zeros([BLOCK_H, 32], tl.float32)
        else:
            acc = tl.zeros([BLOCK_H, 8], tl.float32)
        a_offs = tl.arange(0, 8)[:, None] * 32 + j[None, :]
        for slot in range(0, top_k):
            route = t * top_k + slot
            e = tl.load(ids_ptr + route)
            if (e >= 0) & (e < num_experts):
                e64 = e.to(tl.int64)
                rw = tl.load(tw_ptr + route)
                w_rows = w_ptr + e64 * stride_we + rh[:, None].to(tl.int64) * stride_wn
                s_rows = s_ptr + e64 * stride_se + rh.to(tl.int64) * stride_sn
                a_row = act_ptr + route.to(tl.int64) * stride_am
                # the routing weight is folded into the activation, so every expert accumulates
                # into the same FP32 registers: no separate combine
                for kt in tl.range(0, tl.cdiv(I, 256), num_stages=LOOP_STAGES):
                    if FMT == 0:
                        words = _load_step(FMT, w_rows, h_ok, kt)
                        for i in tl.static_range(4):
                            w_lo, w_hi = _weight_pair(FMT, words, w_rows, s_rows, h_ok, kt, i, I, stride_sg, False)
                            k_lo = kt * 256 + i * 32
                            k_hi = k_lo + 128
                            a_lo = tl.load(a_row + k_lo + j, mask=(k_lo + j) < I, other=0.0).to(tl.float32) * rw
                            a_hi = tl.load(a_row + k_hi + j, mask=(k_hi + j) < I, other=0.0).to(tl.float32) * rw
                            acc += w_lo.to(tl.float32) * a_lo[None, :] + w_hi.to(tl.float32) * a_hi[None, :]
                    else:
                        a = tl.load(a_row + kt * 256 + a_offs, mask=(kt * 256 + a_offs) < I, other=0.0).to(tl.float32) * rw
                        acc += _mxfp8_step(w_rows, s_rows, h_ok, kt, I, stride_sg, a[None, :, :])
        if FMT == 0:
            y = tl.sum(acc, axis=1)
        else:
            y = tl.sum(acc, axis=1)
        tl.store(out_ptr + t.to(tl.int64) * stride_om + rh, numerics.to_bf16(y), mask=h_ok)


# =========================================================================== heuristics
@dataclass(frozen=True)
class DecodeConfig:
    """Launch choice of the two decode kernels.

    engine: ``"fma"`` (one route / token per program, CUDA cores), ``"dot"`` (weight rows read
    once for the tokens sharing an expert, tensor cores) or ``"mma"`` (INT4 and k256-interleaved
    MXFP8 on sm_90, Gluon: `moe_decode_sm90`); block_i: gate_up neurons per program (as many gate rows and up rows;
    16 on mma); block_h: down output dims per program (16 on mma); tokens: columns per MMA
    (dot: gate_up routes per weight pass, down tokens per program; mma: split among the
    warps, see split_*), 1 for fma; num_stages: the K loops' pipelining (mma: the cp.async ring).
    """

    engine: str
    block_i: int
    block_h: int
    tokens: int
    num_warps: int
    num_stages: int
    reason: str = ""
    #: mma engine only: warps splitting gate_up's K and down's expert visits (each warp its own
    #: block of ``tokens / split`` MMA columns; `moe_decode_sm90`)
    split_gate_up: int = 1
    split_down: int = 1


#: The engine by expected routes per expert hit, ``M*k / (E * (1 - (1 - k/E)**M))`` (Kimi EP8:
#: 1.00, 1.09, 1.29, 1.74, 2.82, 5.35 at M = 1, 2, 4, 8, 16, 32). The first row that fits.
#: Measured on the H200 (2026-11-29, INT4 Kimi EP8 layer, CUDA-graph replay, L2 flushed;
#: `scripts/config_sweep.py`): M=4 (1.29) fma 530.9 us vs the best dot tile 600.7 us; M=8
#: (1.74) dot 800.3 us vs fma 1003.3 us: the switch sits between. MXFP8 not measured there.
_ENGINES = (
    # (max routes per hit expert, engine, why); the mma engine (INT4 on sm_90) is picked before
    # this table, see `_config_cached`
    (1.5, "fma", "< 1.5 routes per hit expert: little to share, the seed's one-output-per-unit FMA decode "
                 "(H200: fma 531 us vs dot 601 us at Kimi EP8 M=4)"),
    (float("inf"), "dot", "experts shared by several tokens: weight rows read once for all of them "
                          "(H200: dot 800 us vs fma 1003 us at Kimi EP8 M=8)"),
)

#: Tiles per (engine, weight format): (block_i, block_h, num_warps, num_stages, provenance).
#: H200 sweep, 2026-11-29, Kimi EP8 layer (gate_up + down), CUDA-graph replay, L2 flushed:
_TILES = {
    # The fma engine's stages are its K loops' software pipelining (``tl.range(num_stages=)``:
    # cp.async staging of the next steps' words, scales and activations). Stages sweep with the
    # pipelined loops (H200, 2026-11-29 third session, CUDA graph; tiles as below), us at M=1 / M=4:
    #   INT4  fma stages 1 / 2 / 3 / 4: 167.5 / 260.7 / 227.3 / 194.7 (M=1): staging the words
    #         costs more than it hides (the INT4 loop is issue-bound), so INT4 keeps 1.
    #   MXFP8 fma stages 1 / 2 / 3 / 4: 176.3 / 167.5 / 151.2 / 156.0 (M=1), 467.2 / 455.3 /
    #         468.1 / 496.4 (M=4): 3 stages, 1.17x at one token, equal at four.
    # INT4 fma, M=1 / M=2: 64/64/8w 163.7 / 258.7 us; 16/16/4w 169.2 / 291.1; 32/32/4w 186.3 / 277.6
    ("fma", "int4"): (64, 64, 8, 1, "H200 M=1: 163.7 us (16x16 tiles: 169.2; 2-4 stages: 194.7+)"),
    # MXFP8 fma, M=1: 16/16/2w 176.7 us; 32/32/4w 200.5; 64/64/8w 244.4; 16/16/4w 254.5
    ("fma", "mxfp8"): (16, 16, 2, 3, "H200 M=1: 151.2 us with 3 stages (1 stage: 176.3)"),
    # INT4 dot, M=4 / 8 / 32: 64/64/4w/3s 600.7 / 800.3 / 1285.1 us; 64/32/4w/2s 722.8 / 966.0 /
    # 1828.8; 128/64/8w 729.8 / 957.9 / 1744.9; 32/32/4w 834.0 / 1114.9 / 2227.7
    ("dot", "int4"): (64, 64, 4, 3, "H200 M=8: 800.3 us (64x32 2-stage: 966.0)"),
    # MXFP8 dot, M=8: 64/32/4w/2s 1167.6 us; 64/64/4w/3s 1390.3; 32/32 1382.7; 128/64/8w 1703.3
    ("dot", "mxfp8"): (64, 32, 4, 2, "H200 M=8: 1167.6 us (64x64 3-stage: 1390.3)"),
    # mma (`moe_decode_sm90`): 16 neurons / output rows a program; num_stages = the cp.async
    # ring's depth; tokens and the splits come from `_MMA_SPLITS`; num_warps unused
    ("mma", "int4"): (16, 16, 4, 4, "H200 M=1: 89.1 us, M=8: 405.8 (`_MMA_SPLITS`)"),
    # the INT4 tile and splits, not swept for MXFP8 (thirteenth session: `decode_mma.py`)
    ("mma", "mxfp8_k256"): (16, 16, 4, 4, "H200 M=1: 124.9 us, M=8: 532.8, M=16: 833.3 (`_MMA_SPLITS_MXFP8`)"),
}
#: "mxfp8_k256": MXFP8 in the k256-interleaved layout, which only the mma engine reads
_WEIGHT_FORMATS = ("int4", "mxfp8", "mxfp8_k256")
_MMA_FORMATS = ("int4", "mxfp8_k256")

#: The mma engine's MMA columns and warp splits by batch M: (max M, tokens, split_gate_up,
#: split_down). A split of s gives each of s warps ``tokens / s`` columns (gate_up: member routes
#: a pass over the weights, down: tokens a program) and 1/s of the work (gate_up: of K; down: of
#: the expert visits), so small batches still put several warps on each 16-row weight block.
#: H200, 2026-11-30 (ninth session, `scripts/probes/decode_mma.py`, Kimi EP8, CUDA graph, L2
#: flushed, 4 stages), gate_up + down us as (tokens, split_gate_up, split_down):
#:   M=1: (8,2,4) 55.2 + 47.0; (8,4,8) 62.9 + 63.5; (8,8,8) 88.1 + 63.5; (8,4,4) 3 stages 59.2 + 43.7
#:   M=2: (8,2,2) 92.9 + 66.7; (8,4,4) 108.6 + 83.9; (8,8,8) 160.1 + 108.4
#:   M=4: (8,2,1) 155.0 + 159.3; (8,4,2) 181.6 + 109.6; (8,8,4) 301.6 + 125.7
#:   M=8: (8,2,1) 208.8 + 218.8; (8,1,1) 217.0 + 218.7; (8,4,2) 274.9 + 197.1; (16,2,2) 258.0 + 195.0
#:   M=16: (16,2,2) 340.5 + 372.4; (16,1,1) 374.6 + 396.6
#:   M=32: (32,2,2) 408.5 + 923.8; (32,1,1) 418.6 + 1138.0; (16,1,2) 419.0 + 652.3 (down: 8 tokens a
#:   program, so each expert's rows are read by 4 token blocks, and still faster: more programs)
#: Second sweep (same call as the first's layer bench), M=1: (8,1,2) 54.8 + 37.7; (8,2,4) 55.1 +
#: 46.6; 3 stages (8,2,4) 53.6 + 43.3; 5 stages 57.8 + 49.5; (8,2,8) 3 stages 53.8 + 65.5. M=2: (8,2,2)
#: 94.8 + 66.3, (8,2,4) 94.2 + 84.2; M=4: (8,2,2) 157.5 + 110.7, (8,1,2) 166.5 + 110.6.
#: Third sweep, after gate_up moved to one tile a warp (gate rows and up rows in separate warps,
#: 128 registers instead of 216 at split 2, twice the warps an SM), gate_up us: M=1 split 2 51.3,
#: split 1 56.5, split 4 77.8; M=2 split 2 88.7; M=4 split 2 150.8, split 1 151.9; M=8 split 1
#: 207.7, split 2 219.9; M=16 (16 columns) split 1 354.6, split 2 379.2; M=32 split 1 390.2,
#: split 2 468.9. Down (unchanged kernel) keeps two warps a split.
_MMA_SPLITS = (
    (4, 8, 2, 2),
    (8, 8, 1, 2),
    (1 << 30, 16, 1, 2),
)
#: The same table for k256-interleaved MXFP8 (twice the words a step, so a gate_up warp's K
#: chunk already streams enough bytes alone). H200, thirteenth session (`decode_mma.py mxfp8`,
#: same process, gate_up + down us as (tokens, split_gate_up, split_down, stages)): M=1 (8,1,2,4)
#: 75.8 + 49.1, (8,2,2,4) 80.4 + 48.9, (8,2,4,3) 76.2 + 59.8; M=4 (8,1,2,4) 200.9 + 129.0,
#: (8,2,2,4) 217.9 + 127.3, (8,2,2,3) 202.8 + 127.7; M=8 (8,1,2,4) 296.9 + 235.9, (8,2,2,3)
#: 324.8 + 236.2. Second sweep (same session): M=2 (8,1,2,4) 139.2 + 88.3, (8,1,2,3) 137.6 + 88.8;
#: M=16 (8,1,2,4) 381.7 + 451.6, (16,1,2,4) 451.6 + 488.8, (16,2,2,4) 468.2 + 490.8, (16,1,4,4) 456.9
#: + 582.7; M=32 (16,1,1,4) 491.3 + 834.9 (third sweep: 3 stages 473.0 + 800.6), (16,1,2,4) 490.2 +
#: 876.8, (8,1,2,4) 457.9 + 886.8, (32,2,2,4) 564.9 + 1014.0.
_MMA_SPLITS_MXFP8 = (
    (16, 8, 1, 2),
    (1 << 30, 16, 1, 1),
)
_ENV_FIELDS = ("engine", "block_i", "block_h", "tokens", "num_warps", "num_stages", "split_gate_up", "split_down")
#: Environment overrides, each part of the memo key: LOWBIT_DECODE_ENGINE (fma|dot|mma),
#: LOWBIT_DECODE_BLOCK_I, _BLOCK_H, _TOKENS, _NUM_WARPS, _NUM_STAGES, _SPLIT_GATE_UP, _SPLIT_DOWN.
ENV_OVERRIDES = overrides.override_names("DECODE", _ENV_FIELDS)


def _env_key() -> tuple:
    return overrides.env_key("DECODE", _ENV_FIELDS)


def _routes_per_hit_expert(m: int, top_k: int, num_experts: int) -> float:
    hit = num_experts * (1.0 - (1.0 - min(top_k, num_experts) / num_experts) ** m)
    return m * top_k / max(hit, 1.0)


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _validate_config(cfg: DecodeConfig) -> None:
    """The whole constraint set of a configuration (raises ValueError)."""
    if cfg.engine not in ("fma", "dot", "mma"):
        raise ValueError(f"decode engine must be 'fma', 'dot' or 'mma', got {cfg.engine!r}")
    if cfg.engine == "mma":
        gu_cols = min(cfg.tokens, 16)
        if (cfg.block_i != 16 or cfg.block_h != 16 or cfg.tokens not in (8, 16, 32)
                or cfg.split_gate_up not in (1, 2, 4, 8) or gu_cols % cfg.split_gate_up
                or cfg.split_down not in (1, 2, 4, 8) or cfg.tokens % cfg.split_down):
            raise ValueError(f"decode engine 'mma': block_i = block_h = 16, tokens (MMA columns) in (8, 16, 32), "
                             f"split_gate_up / split_down in (1, 2, 4, 8) dividing the columns (gate_up uses "
                             f"min(tokens, 16)), got block_i={cfg.block_i} block_h={cfg.block_h} tokens={cfg.tokens} "
                             f"split_gate_up={cfg.split_gate_up} split_down={cfg.split_down}")
        if cfg.num_stages not in (3, 4, 5, 6, 8):
            raise ValueError(f"decode engine 'mma': num_stages (the cp.async ring) in 3..8, got {cfg.num_stages}")
        return
    for name in ("block_i", "block_h"):
        v = getattr(cfg, name)
        if not _is_pow2(v) or v < 16:
            raise ValueError(f"decode {name}={v}: must be a power of two >= 16")
    if cfg.engine == "dot" and (not _is_pow2(cfg.tokens) or cfg.tokens < 16):
        raise ValueError(f"decode tokens={cfg.tokens}: the dot engine needs a power of two >= 16 (tl.dot's minimum)")
    if cfg.engine == "fma" and cfg.tokens != 1:
        raise ValueError(f"decode tokens={cfg.tokens}: the fma engine computes one route per program (tokens=1)")
    if cfg.num_warps not in (1, 2, 4, 8, 16) or cfg.num_stages < 1:
        raise ValueError(f"decode num_warps={cfg.num_warps} num_stages={cfg.num_stages}")


@lru_cache(maxsize=4096)
def _config_cached(m: int, top_k: int, num_experts: int, hidden: int, inter: int, fmt: str, env: tuple,
                   native: bool = False) -> DecodeConfig:
    if fmt not in _WEIGHT_FORMATS:
        raise ValueError(f"moe_decode weight format must be one of {_WEIGHT_FORMATS}, got {fmt!r}")
    rpe = _routes_per_hit_expert(m, top_k, num_experts)
    env_vals = dict(zip(_ENV_FIELDS, env))
    if env_vals["engine"]:
        engine, why = env_vals["engine"].lower(), f"LOWBIT_DECODE_ENGINE={env_vals['engine']}"
    elif fmt == "mxfp8_k256":
        engine, why = "mma", "k256-interleaved MXFP8: the layout of the mma engine (sm_90), the only one reading it"
    elif native and fmt == "int4":
        engine, why = "mma", ("INT4 on sm_90: the tensor-core engine, faster than fma / dot at every M of 1-32 "
                              "(H200, Kimi EP8: 89 vs 168 us at M=1, 1037 vs 1287 at M=32)")
    else:
        _, engine, why = next(row for row in _ENGINES if rpe <= row[0])
    if (engine, fmt) not in _TILES:
        raise ValueError(f"LOWBIT_DECODE_ENGINE must be 'fma', 'dot' or 'mma' (mma: INT4 or k256-interleaved "
                         f"MXFP8; that layout: mma only), got {env_vals['engine']!r} for {fmt}")
    block_i, block_h, warps, stages, measured = _TILES[engine, fmt]
    # dot: 16 tokens per program covers M <= 16 in one pass over the hit experts; beyond, 32.
    # mma: the down kernel's token block covers M <= 32 in one pass (each expert read once)
    splits = {}
    if engine == "mma":
        table = _MMA_SPLITS if fmt == "int4" else _MMA_SPLITS_MXFP8
        _, tokens, split_gu, split_dn = next(row for row in table if m <= row[0])
        splits = {"split_gate_up": split_gu, "split_down": split_dn}
    else:
        tokens = 1 if engine == "fma" else (16 if m <= 16 else 32)
    cfg = DecodeConfig(engine, block_i, block_h, tokens, warps, stages,
                       f"M={m} k={top_k} E={num_experts}: {rpe:.2f} routes/hit expert: {why}; "
                       f"{fmt} {engine} tile {measured}", **splits)
    # the engine override was applied above (it picks the tile row); the others on top of it
    cfg = overrides.apply_env_overrides(cfg, "DECODE", _ENV_FIELDS[1:])
    _validate_config(cfg)
    return cfg


def moe_decode_config(m: int, top_k: int, num_experts: int, hidden: int, inter: int,
                      fmt: str = "int4", native: bool = False) -> DecodeConfig:
    """The launch configuration for `m` tokens routed top-`top_k` over `num_experts` experts of
    hidden size `hidden` and intermediate size `inter`, weights in `fmt` (``"int4"`` or
    ``"mxfp8"``, or ``"mxfp8_k256"``: MXFP8 in the interleaved layout, mma only); `native`: the data is on an sm_90 GPU with the interpreter off (the Gluon
    ``mma`` engine can run). Memoized per shape and per value of the ``LOWBIT_DECODE_*``
    overrides (`ENV_OVERRIDES`), so the host side costs a dict lookup."""
    return _config_cached(m, top_k, num_experts, hidden, inter, fmt, _env_key(), native)


def explain_moe_decode_config(m: int, top_k: int, num_experts: int, hidden: int, inter: int,
                              fmt: str = "int4", native: bool = True) -> str:
    c = moe_decode_config(m, top_k, num_experts, hidden, inter, fmt, native)
    split = f" split_gate_up={c.split_gate_up} split_down={c.split_down}" if c.engine == "mma" else ""
    return (f"moe_decode {fmt} M={m} k={top_k} E={num_experts} H={hidden} I={inter}: engine={c.engine} "
            f"block_i={c.block_i} block_h={c.block_h} tokens={c.tokens} warps={c.num_warps} "
            f"stages={c.num_stages}{split} -- {c.reason}")


# =========================================================================== launchers
def _weight_args(w, who: str, n: int, k: int):
    """(format code, codes, scales, stride_we, stride_wn, stride_se, stride_sn, stride_sg)."""
    if isinstance(w, W4A16Weight):
        w.check("indexed")
        fmt, codes, scales = _FMT_INT4, w.qweight, w.scales
        # scales [E, Kp/32, N]: rows are contiguous, groups N apart
        s_strides = (scales.stride(0), scales.stride(2), scales.stride(1))
        shape = (w.num_experts, w.n, w.k)
    elif isinstance(w, Mxfp8ExpertWeight):
        # (the k256-interleaved layout passes through: `_pick_config` keeps it on the mma engine)
        fmt, codes, scales = _FMT_MXFP8, w.codes, w.scales_e8m0
        s_strides = (scales.stride(0), scales.stride(1), scales.stride(2))
        shape = (w.num_experts, w.n, w.k)
    elif isinstance(w, QuantizedTensor):
        raise FormatError(f"{who}: got a logical QuantizedTensor ({w.fmt}); prepare it with "
                          "pack_w4a16(..., profile='indexed') (int4_g32) or pack_mxfp8_experts (mxfp8)")
    else:
        raise TypeError(f"{who}: expected a W4A16Weight or an Mxfp8ExpertWeight, got {type(w).__name__}")
    if shape[1:] != (n, k):
        raise ValueError(f"{who}: expected [E, {n}, {k}] expert weights, got {list(shape)}")
    if codes.stride(-1) != 1:
        raise ValueError(f"{who}: weight codes must be contiguous along K")
    return fmt, codes, scales, codes.stride(0), codes.stride(1), *s_strides


def _check_routing(topk_ids, topk_weights, m: int, device) -> int:
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype != torch.int32 or topk_ids.dim() != 2:
        raise TypeError(f"topk_ids must be int32 [M, k], got {getattr(topk_ids, 'dtype', type(topk_ids).__name__)} "
                        f"{tuple(getattr(topk_ids, 'shape', ()))}")
    if topk_ids.shape[0] != m:
        raise ValueError(f"topk_ids has {topk_ids.shape[0]} rows, the activations have M={m}")
    top_k = topk_ids.shape[1]
    if top_k < 1:
        raise ValueError("topk_ids must have at least one slot per token")
    if not topk_ids.is_contiguous():
        raise ValueError("topk_ids must be contiguous")
    if topk_ids.device != device:
        raise ValueError(f"topk_ids is on {topk_ids.device}, the activations on {device}")
    if topk_weights is not None:
        if not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32:
            raise TypeError(f"topk_weights must be float32 [M, k], got {getattr(topk_weights, 'dtype', type(topk_weights).__name__)}")
        if tuple(topk_weights.shape) != tuple(topk_ids.shape):
            raise ValueError(f"topk_weights {tuple(topk_weights.shape)} must match topk_ids {tuple(topk_ids.shape)}")
        if not topk_weights.is_contiguous() or topk_weights.device != device:
            raise ValueError(f"topk_weights must be contiguous and on {device}")
    return top_k


def _check_weights_pair(w13, w2) -> tuple[int, int, int]:
    """(E, H, I) from the two weights, checked against each other."""
    for who, w in (("w13", w13), ("w2", w2)):
        if isinstance(w, QuantizedTensor):
            raise FormatError(f"{who}: got a logical QuantizedTensor ({w.fmt}); prepare it with "
                              "pack_w4a16(..., profile='indexed') (int4_g32) or pack_mxfp8_experts (mxfp8)")
        if not isinstance(w, (W4A16Weight, Mxfp8ExpertWeight)):
            raise TypeError(f"{who}: expected a W4A16Weight or an Mxfp8ExpertWeight, got {type(w).__name__}")
    if w13.n % 2:
        raise ValueError(f"w13 has N={w13.n} rows: must be 2*I (gate rows, then up rows)")
    e, h, inter = w13.num_experts, w13.k, w13.n // 2
    if w2.num_experts != e or (w2.n, w2.k) != (h, inter):
        raise ValueError(f"w2 must be [E, H, I] = [{e}, {h}, {inter}] to match w13 [{e}, {2 * inter}, {h}], "
                         f"got [{w2.num_experts}, {w2.n}, {w2.k}]")
    return e, h, inter


def _weight_format(w) -> str:
    """``"int4"``, ``"mxfp8"`` or ``"mxfp8_k256"`` (the interleaved layout): the heuristics'
    name of a prepared weight's format."""
    if isinstance(w, Mxfp8ExpertWeight):
        return "mxfp8" if w.layout == "natural" else "mxfp8_k256"
    return "int4"


def _pick_config(config, m, top_k, e, h, inter, fmt: str, device) -> DecodeConfig:
    if config is None:
        config = moe_decode_config(m, top_k, e, h, inter, fmt, is_sm90_native(device))
    elif not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
    _validate_config(config)
    if config.engine == "mma":
        if fmt not in _MMA_FORMATS:
            raise ValueError(f"decode engine 'mma' takes INT4 (W4A16Weight) or k256-interleaved MXFP8 weights, got "
                             f"{fmt} (pack_mxfp8_experts(..., layout='k256-interleaved'))")
        require_sm90(device, "moe_decode engine 'mma'")
    elif fmt == "mxfp8_k256":
        raise ValueError(f"decode engine {config.engine!r}: the k256-interleaved MXFP8 layout runs on the mma engine "
                         "only")
    return config


def moe_decode_gate_up(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    w13: W4A16Weight | Mxfp8ExpertWeight,
    *,
    out: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """The gate_up stage: ``act[t, j, i] = bf16(SiLU(hidden[t] . W13[e, i]) * (hidden[t] . W13[e, I+i]))``
    for ``e = topk_ids[t, j]``; 0 for dropped slots (module docstring).

    hidden: ``bf16 [M, H]`` (contiguous along H); topk_ids: ``int32 [M, k]``; w13: ``[E, 2I, H]``
    as a `W4A16Weight` (profile ``"indexed"``) or an `Mxfp8ExpertWeight`; out: optional
    ``bf16 [M, k, I]`` contiguous. Returns ``act bf16 [M, k, I]``.
    """
    if not isinstance(hidden, torch.Tensor) or hidden.dtype != torch.bfloat16 or hidden.dim() != 2:
        raise TypeError(f"hidden must be bf16 [M, H], got {getattr(hidden, 'dtype', type(hidden).__name__)} "
                        f"{tuple(getattr(hidden, 'shape', ()))}")
    if hidden.stride(1) != 1:
        raise ValueError("hidden must be contiguous along H")
    m, h = hidden.shape
    top_k = _check_routing(topk_ids, None, m, hidden.device)
    if isinstance(w13, (W4A16Weight, Mxfp8ExpertWeight)) and w13.n % 2:
        raise ValueError(f"w13 has N={w13.n} rows: must be 2*I (gate rows, then up rows)")
    inter = getattr(w13, "n", 0) // 2
    fmt, codes, scales, swe, swn, sse, ssn, ssg = _weight_args(w13, "w13", 2 * inter, h)
    w_fmt = _weight_format(w13)
    if codes.device != hidden.device:
        raise ValueError(f"w13 is on {codes.device}, hidden on {hidden.device}")
    e = w13.num_experts
    config = _pick_config(config, m, top_k, e, h, inter, w_fmt, hidden.device)
    if out is None:
        out = torch.empty(m, top_k, inter, dtype=torch.bfloat16, device=hidden.device)
    elif (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16
          or tuple(out.shape) != (m, top_k, inter) or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous bf16 [M, k, I] = [{m}, {top_k}, {inter}] tensor, got "
                         f"{getattr(out, 'dtype', None)} {tuple(getattr(out, 'shape', ()))}")
    if m == 0 or inter == 0:
        return out
    if config.engine == "mma":
        from .hopper import gate_up_mma_launch

        gate_up_mma_launch(hidden, topk_ids, w13, out, min(config.tokens, 16), config.split_gate_up, config.num_stages)
        return out
    grid = (triton.cdiv(inter, config.block_i), m * top_k)
    _gate_up_kernel[grid](
        hidden, topk_ids, codes, scales, out,
        m * top_k, top_k, e, h, inter,
        hidden.stride(0), swe, swn, sse, ssn, ssg, inter,
        FMT=fmt, DOT=config.engine == "dot", BLOCK_I=config.block_i, TOKENS=config.tokens,
        ROUTE_CHUNK=_ROUTE_CHUNK, LOOP_STAGES=config.num_stages, num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out


def moe_decode_down(
    act: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w2: W4A16Weight | Mxfp8ExpertWeight,
    *,
    out: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """The down stage with the weighted combine folded in:
    ``out[t] = bf16(sum_j topk_weights[t, j] * act[t, j] @ W2[topk_ids[t, j]]^T)`` over the
    slots with a local expert (module docstring).

    act: ``bf16 [M, k, I]`` contiguous (`moe_decode_gate_up`'s output); topk_ids ``int32 [M, k]``;
    topk_weights ``float32 [M, k]`` (used as given); w2: ``[E, H, I]`` as a `W4A16Weight`
    (profile ``"indexed"``) or an `Mxfp8ExpertWeight`; out: optional ``bf16 [M, H]``
    contiguous along H. Returns ``out``.
    """
    if not isinstance(act, torch.Tensor) or act.dtype != torch.bfloat16 or act.dim() != 3:
        raise TypeError(f"act must be bf16 [M, k, I], got {getattr(act, 'dtype', type(act).__name__)} "
                        f"{tuple(getattr(act, 'shape', ()))}")
    if not act.is_contiguous():
        raise ValueError("act must be contiguous")
    m, k_act, inter = act.shape
    top_k = _check_routing(topk_ids, topk_weights, m, act.device)
    if k_act != top_k:
        raise ValueError(f"act has {k_act} slots per token, topk_ids has k={top_k}")
    h = getattr(w2, "n", 0)
    fmt, codes, scales, swe, swn, sse, ssn, ssg = _weight_args(w2, "w2", h, inter)
    w_fmt = _weight_format(w2)
    if codes.device != act.device:
        raise ValueError(f"w2 is on {codes.device}, act on {act.device}")
    e = w2.num_experts
    config = _pick_config(config, m, top_k, e, h, inter, w_fmt, act.device)
    if out is None:
        out = torch.empty(m, h, dtype=torch.bfloat16, device=act.device)
    elif (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16
          or tuple(out.shape) != (m, h) or out.stride(1) != 1):
        raise ValueError(f"out must be bf16 [M, H] = [{m}, {h}] contiguous along H, got "
                         f"{getattr(out, 'dtype', None)} {tuple(getattr(out, 'shape', ()))}")
    if m == 0 or h == 0:
        return out
    if config.engine == "mma":
        from .hopper import down_mma_launch

        down_mma_launch(act, topk_ids, topk_weights, w2, out, config.tokens, config.split_down, config.num_stages)
        return out
    dot = config.engine == "dot"
    grid = (triton.cdiv(h, config.block_h), triton.cdiv(m, config.tokens) if dot else m)
    _down_kernel[grid](
        act, topk_ids, topk_weights, codes, scales, out,
        m, top_k, e, h, inter,
        inter, swe, swn, sse, ssn, ssg, out.stride(0),
        FMT=fmt, DOT=dot, BLOCK_H=config.block_h, TOKENS=config.tokens,
        TOPK_P2=triton.next_power_of_2(top_k), LOOP_STAGES=config.num_stages, num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out


def moe_decode(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: W4A16Weight | Mxfp8ExpertWeight,
    w2: W4A16Weight | Mxfp8ExpertWeight,
    *,
    out: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """The expert part of a MoE block for decode batches, output-centric (module docstring).

    hidden ``bf16 [M, H]``; topk_ids ``int32 [M, k]`` (``-1`` = dropped slot); topk_weights
    ``float32 [M, k]`` (applied as given); w13 ``[E, 2I, H]`` and w2 ``[E, H, I]``, each a
    `W4A16Weight` (profile ``"indexed"``) or an `Mxfp8ExpertWeight`; out optional
    ``bf16 [M, H]``. Returns ``bf16 [M, H]``. Two launches, no host readback: capturable in a
    CUDA graph.
    """
    _check_weights_pair(w13, w2)
    if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2:
        raise TypeError(f"hidden must be bf16 [M, H], got {type(hidden).__name__} {tuple(getattr(hidden, 'shape', ()))}")
    m = hidden.shape[0]
    top_k = _check_routing(topk_ids, topk_weights, m, hidden.device)
    if config is None:
        config = moe_decode_config(m, top_k, w13.num_experts, w13.k, w13.n // 2, _weight_format(w13),
                                   is_sm90_native(hidden.device))
    act = moe_decode_gate_up(hidden, topk_ids, w13, config=config)
    return moe_decode_down(act, topk_ids, topk_weights, w2, out=out, config=config)


# =========================================================================== compile tier
#: The production shapes the heuristics are enumerated over (Kimi K2.x, SPEC section 5):
#: (name, num_experts, hidden, inter, top_k) and the decode batches.
_PRODUCTION_SHAPES = (("ep8", 48, 7168, 2048, 8), ("tp8", 384, 7168, 256, 8))
_PRODUCTION_BATCHES = tuple(range(1, 65))

_GATE_UP_SIG = {
    "x_ptr": "*bf16", "ids_ptr": "*i32", "w_ptr": None, "s_ptr": None, "act_ptr": "*bf16",
    "num_routes": "i32", "top_k": "i32", "num_experts": "i32", "H": "i32", "I": "i32",
    "stride_xm": "i32", "stride_we": "i64", "stride_wn": "i32", "stride_se": "i32", "stride_sn": "i32",
    "stride_sg": "i32", "stride_am": "i32",
    "FMT": "constexpr", "DOT": "constexpr", "BLOCK_I": "constexpr", "TOKENS": "constexpr", "ROUTE_CHUNK": "constexpr",
    "LOOP_STAGES": "constexpr",
}
_DOWN_SIG = {
    "act_ptr": "*bf16", "ids_ptr": "*i32", "tw_ptr": "*fp32", "w_ptr": None, "s_ptr": None, "out_ptr": "*bf16",
    "M": "i32", "top_k": "i32", "num_experts": "i32", "H": "i32", "I": "i32",
    "stride_am": "i32", "stride_we": "i64", "stride_wn": "i32", "stride_se": "i32", "stride_sn": "i32",
    "stride_sg": "i32", "stride_om": "i32",
    "FMT": "constexpr", "DOT": "constexpr", "BLOCK_H": "constexpr", "TOKENS": "constexpr", "TOPK_P2": "constexpr",
    "LOOP_STAGES": "constexpr",
}
_FMT_PTRS = {_FMT_INT4: ("*i32", "*bf16"), _FMT_MXFP8: ("*fp8e4nv", "*u8")}


def _production_configs() -> list[tuple[str, DecodeConfig]]:
    """Every (format, configuration) `moe_decode_config` picks for the production shapes (no
    overrides)."""
    seen: dict[tuple, tuple[str, DecodeConfig]] = {}
    for _, e, h, inter, k in _PRODUCTION_SHAPES:
        for m in _PRODUCTION_BATCHES:
            for fmt in _WEIGHT_FORMATS:
                c = _config_cached(m, k, e, h, inter, fmt, ("",) * len(ENV_OVERRIDES))
                seen.setdefault((fmt, c.engine, c.block_i, c.block_h, c.tokens, c.num_warps, c.num_stages), (fmt, c))
    return list(seen.values())


def compile_configs():
    """Every kernel configuration the heuristics can pick for the production shapes, in both
    weight formats, for the compile tier."""
    from ..compile_tier import KernelConfig

    out, done = [], set()
    for fname, cfg in _production_configs():
        if cfg.engine == "mma":  # Gluon: `moe_decode_sm90.compile_configs`
            continue
        dot = cfg.engine == "dot"
        fmt = _FMT_INT4 if fname == "int4" else _FMT_MXFP8
        w_t, s_t = _FMT_PTRS[fmt]
        # (stage, kernel, signature, tile tag, tile constexpr, tile, extra constexprs, unaligned ints)
        stages = (
            ("gate_up", _gate_up_kernel, _GATE_UP_SIG, "BI", "BLOCK_I", cfg.block_i, {"ROUTE_CHUNK": _ROUTE_CHUNK},
             ("num_routes", "top_k", "stride_sn")),
            ("down", _down_kernel, _DOWN_SIG, "BH", "BLOCK_H", cfg.block_h, {"TOPK_P2": 8}, ("M", "top_k", "stride_sn")),
        )
        for stage, fn, sig, tag, tile_name, tile, extra, unaligned in stages:
            key = (stage, fmt, cfg.engine, tile, cfg.tokens, cfg.num_warps, cfg.num_stages)
            if key in done:
                continue
            done.add(key)
            # the MMA instruction: wgmma when the weight (M) side is >= 64 rows, mma.sync below
            sass = (("HGMMA",) if tile >= 64 else ("HMMA",)) if dot else ()
            out.append(KernelConfig(
                f"moe_decode_{stage}[{fname},{cfg.engine},{tag}={tile},T={cfg.tokens},w={cfg.num_warps},s={cfg.num_stages}]",
                fn, {**sig, "w_ptr": w_t, "s_ptr": s_t},
                {"FMT": fmt, "DOT": dot, tile_name: tile, "TOKENS": cfg.tokens, "LOOP_STAGES": cfg.num_stages, **extra},
                num_warps=cfg.num_warps, num_stages=cfg.num_stages, expect_sass=sass, unaligned=unaligned))
    return out
