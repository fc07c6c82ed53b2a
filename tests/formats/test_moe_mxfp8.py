"""`lowbit.formats.Mxfp8ExpertWeight` (MXFP8 expert weights prepared for the output-centric
decode, natural and k256-interleaved layouts) and the expert-weight checks, on the CPU."""

import pytest
import torch
import torch.nn.functional as F

from lowbit.formats import (
    FormatError,
    Mxfp8ExpertWeight,
    check_expert_weight_pair,
    get_format,
    pack_mxfp8_experts,
    quantize_mxfp8,
)
from lowbit.formats.moe_mxfp8 import MXFP8_MMA_MAX_E8M0
from lowbit.formats.w4a16 import pack_w4a16

INT4 = get_format("int4_g32")


def test_mxfp8_weight_pack_and_validation(gen):
    x = torch.randn(2, 8, 64, generator=gen)
    codes, scales = quantize_mxfp8(x)
    w = pack_mxfp8_experts(x)
    assert (w.num_experts, w.n, w.k) == (2, 8, 64)
    for other in (pack_mxfp8_experts((codes, scales)), pack_mxfp8_experts(codes, scales),
                  pack_mxfp8_experts(get_format("mxfp8").quantize(x))):
        assert torch.equal(other.codes.view(torch.uint8), w.codes.view(torch.uint8))
        assert torch.equal(other.scales_e8m0, w.scales_e8m0)
    assert torch.equal(w.as_quantized().dequantize(), get_format("mxfp8").dequantize(w.as_quantized()))
    bad = scales.clone()
    bad[0, 0, 0] = 255
    with pytest.raises(FormatError, match="255"):
        Mxfp8ExpertWeight(codes, bad)
    with pytest.raises(FormatError, match="scales"):
        Mxfp8ExpertWeight(codes, scales[..., :1].contiguous())
    with pytest.raises(FormatError, match="uint8"):
        Mxfp8ExpertWeight(codes, scales.float())
    with pytest.raises(FormatError, match=r"float8_e4m3fn \[E, N, K\]"):
        Mxfp8ExpertWeight(codes[0], scales[0])
    with pytest.raises(FormatError, match="multiple of 32"):
        pack_mxfp8_experts(torch.randn(2, 8, 48))
    with pytest.raises(FormatError, match="int4_g32"):
        pack_mxfp8_experts(INT4.quantize(x))
    with pytest.raises(FormatError, match="scales_e8m0"):
        pack_mxfp8_experts(codes)


def test_mxfp8_k256_interleaved_layout(gen):
    """The mma engine's layout: the same codes reordered (word c of a half step holds element c
    of its four groups), K padded to 256, bf16 multipliers 2^(E8M0 - 7); the natural codes and
    the logical tensor come back exactly; scales past 2^7 and a mismatched tensor are refused."""
    x = torch.randn(2, 8, 320, generator=gen) * 3
    nat = pack_mxfp8_experts(x)
    w = pack_mxfp8_experts(x, layout="k256-interleaved")
    assert (w.layout, w.k, tuple(w.codes.shape), tuple(w.mma_scales.shape)) == ("k256-interleaved", 320, (2, 8, 512),
                                                                                 (2, 16, 8))
    assert torch.equal(w.natural_codes().view(torch.uint8), nat.codes.view(torch.uint8))
    assert torch.equal(w.as_quantized().dequantize(), nat.as_quantized().dequantize())
    words = w.codes.view(torch.uint8)
    padded = F.pad(nat.codes.view(torch.uint8), (0, 192))
    for kt, h, c, o in ((0, 0, 0, 0), (0, 1, 5, 3), (1, 0, 31, 2), (1, 1, 17, 1)):
        assert words[1, 3, 256 * kt + 4 * (32 * h + c) + o] == padded[1, 3, 256 * kt + 32 * (4 * h + o) + c]
    want = torch.exp2(nat.scales_e8m0.float() - 7).transpose(1, 2)
    assert torch.equal(w.mma_scales[:, :10].float(), want) and (w.mma_scales[:, 10:] == 0).all()
    assert w.to("cpu").layout == "k256-interleaved"
    codes, scales = quantize_mxfp8(x)
    big = scales.clone()
    big[0, 0, 0] = MXFP8_MMA_MAX_E8M0 + 1
    pack_mxfp8_experts(codes, big)  # the natural layout takes any finite scale
    with pytest.raises(FormatError, match="E8M0 bytes <= 134"):
        pack_mxfp8_experts(codes, big, layout="k256-interleaved")
    with pytest.raises(FormatError, match="layout must be one of"):
        pack_mxfp8_experts(x, layout="tiled")
    with pytest.raises(FormatError, match="mma_scales"):
        Mxfp8ExpertWeight(w.codes, w.scales_e8m0, "k256-interleaved", None)
    with pytest.raises(FormatError, match="mma_scales belong"):
        Mxfp8ExpertWeight(nat.codes, nat.scales_e8m0, "natural", w.mma_scales)


def test_expert_weight_pair_check(gen):
    """(E, H, I) of a matching pair in either format; a pair of other shapes, an odd w13, a
    logical weight and a plain tensor are refused with the argument named."""
    e, h, inter = 3, 64, 32
    q13 = INT4.quantize(torch.randn(e, 2 * inter, h, generator=gen))
    q2 = INT4.quantize(torch.randn(e, h, inter, generator=gen))
    w13, w2 = pack_w4a16(q13), pack_w4a16(q2)
    assert check_expert_weight_pair(w13, w2) == (e, h, inter)
    x13 = pack_mxfp8_experts(torch.randn(e, 2 * inter, h, generator=gen))
    x2 = pack_mxfp8_experts(torch.randn(e, h, inter, generator=gen))
    assert check_expert_weight_pair(x13, x2) == (e, h, inter)
    with pytest.raises(ValueError, match=r"w2 must be \[E, H, I\] = \[3, 64, 32\]"):
        check_expert_weight_pair(w13, w13)
    with pytest.raises(ValueError, match="w13 has N=3 rows"):
        check_expert_weight_pair(pack_mxfp8_experts(torch.randn(e, 3, h, generator=gen)), x2)
    with pytest.raises(FormatError, match="w2: got a logical QuantizedTensor"):
        check_expert_weight_pair(w13, q2)
    with pytest.raises(TypeError, match="w13: expected a W4A16Weight or an Mxfp8ExpertWeight, got Tensor"):
        check_expert_weight_pair(torch.zeros(e, 2 * inter, h), w2)
