"""The tensor-level INT4 entry points refuse what they cannot serve (zero points, reordered
groups) and read scheme dicts with compressed-tensors' defaults. No optional package needed."""

import pytest
import torch

from lowbit import pack_w4a16
from lowbit.formats import FormatError, from_compressed_tensors
from lowbit.formats.int4 import (
    Int4G32,
    check_compressed_tensors_scheme,
    pack_int4_words,
    resolve_compressed_tensors_args,
    unpack_int4_words,
)
from lowbit.formats.w4a16 import pack_w4a16_grouped, unpack_w4a16
from lowbit.testing import assert_bitwise_equal

INT4 = Int4G32()


def _packed(gen, n=16, k=64):
    q = INT4.quantize(torch.randn(n, k, generator=gen))
    return q, INT4.pack(q)


def test_zero_point_is_refused_everywhere(gen):
    q, ct = _packed(gen)
    zp = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(FormatError, match="zero point.*asymmetric"):
        pack_w4a16(ct["weight_packed"][None], ct["weight_scale"][None], zero_point=zp)
    with pytest.raises(FormatError, match="zero point"):
        pack_w4a16_grouped(ct["weight_packed"][None], ct["weight_scale"][None], zero_point=zp)
    with pytest.raises(FormatError, match="zero point"):
        from_compressed_tensors(ct["weight_packed"], ct["weight_scale"], weight_zero_point=zp)
    with pytest.raises(FormatError, match="zero point"):
        INT4.unpack({**ct, "weight_zero_point": zp})
    with pytest.raises(FormatError, match="weight_g_idx"):
        INT4.unpack({**ct, "weight_g_idx": torch.zeros(64, dtype=torch.int32)})
    with pytest.raises(FormatError, match="lacks"):
        INT4.unpack({"weight_scale": ct["weight_scale"]})
    # without one, the same tensors are accepted
    assert_bitwise_equal(INT4.unpack(ct).codes, q.codes)


def test_byte_packing_matches_the_word_definition(gen):
    """Element 8j+i in bits 4i..4i+3 of word j, for the byte-view fast path."""
    codes = torch.randint(0, 16, (3, 5, 64), generator=gen, dtype=torch.int64).to(torch.uint8)
    words = pack_int4_words(codes)
    shifts = torch.arange(8, dtype=torch.int64) * 4
    ref = (codes.view(3, 5, 8, 8).to(torch.int64) << shifts).sum(-1)
    ref = torch.where(ref >= 2**31, ref - 2**32, ref).to(torch.int32)
    assert_bitwise_equal(words, ref)
    assert_bitwise_equal(unpack_int4_words(words), codes)
    # the W4A16 tile layout: inside each 256-wide K tile, word j holds code[32i + j] in nibble i
    q = INT4.quantize(torch.randn(2, 8, 320, generator=gen))
    w = pack_w4a16(q)
    padded = torch.nn.functional.pad(q.codes, (0, 512 - 320), value=8).to(torch.int64).view(2, 8, 2, 8, 32)
    tiles = (padded << shifts.view(1, 1, 1, 8, 1)).sum(3)
    tiles = torch.where(tiles >= 2**31, tiles - 2**32, tiles).to(torch.int32).reshape(2, 8, 64)
    assert_bitwise_equal(w.qweight, tiles)
    assert_bitwise_equal(unpack_w4a16(w).codes, q.codes)


def test_scheme_args_take_compressed_tensors_defaults():
    got = resolve_compressed_tensors_args({"num_bits": 4, "group_size": 32})
    assert (got["type"], got["symmetric"], got["strategy"], got["dynamic"]) == ("int", True, "group", False)
    assert resolve_compressed_tensors_args({})["num_bits"] == 8
    assert resolve_compressed_tensors_args({"group_size": -1})["strategy"] == "channel"
    assert resolve_compressed_tensors_args({"num_bits": 4})["strategy"] == "tensor"
    check_compressed_tensors_scheme({"num_bits": 4, "group_size": 32})
    check_compressed_tensors_scheme({"num_bits": 4, "group_size": 32, "type": "INT", "strategy": "Group"})
    for bad, field in [({"group_size": 32}, "num_bits"), ({"num_bits": 4}, "strategy"),
                       ({"num_bits": 4, "group_size": 32, "actorder": "group"}, "actorder"),
                       ({"num_bits": 4, "group_size": 32, "dynamic": True}, "dynamic"),
                       ({"num_bits": 4, "group_size": 32, "scale_dtype": "torch.float16"}, "scale_dtype"),
                       ({"num_bits": 4, "group_size": 32, "zero_point": 8}, "unknown")]:
        with pytest.raises(FormatError, match=field):
            check_compressed_tensors_scheme(bad)
