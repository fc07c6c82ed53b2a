"""FP8 block (DeepSeek-V3), MXFP4 (DeepSeek-V4) and NVFP4 (NVIDIA ModelOpt) checkpoints, built
by hand from `lowbit.formats` quantizers and safetensors, loaded by `lowbit.checkpoint`, and
checked against the values they were built from and against compressed-tensors' own
decompressors / converters for those formats.

Needs safetensors and compressed-tensors (the ``test`` extra: the CPU tier runs these)."""

import json

import pytest
import torch

pytest.importorskip("safetensors")
pytest.importorskip("compressed_tensors")

import lowbit.checkpoint as lc  # noqa: E402
from lowbit.formats import (  # noqa: E402
    FormatError,
    dequantize_fp8_blocks,
    dequantize_mxfp4,
    dequantize_nvfp4,
    e8m0_decode,
    pack_fp4,
    quantize_fp8_blocks,
    quantize_mxfp4,
    quantize_nvfp4,
    unpack_fp4,
)
from lowbit.testing import assert_bitwise_equal  # noqa: E402

from checkpoint_builders import E, H, I, save_sharded  # noqa: E402

FP8_UE8M0 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "scale_fmt": "ue8m0",
             "weight_block_size": [128, 128]}
FP8_V3 = {k: v for k, v in FP8_UE8M0.items() if k != "scale_fmt"}


def _rand(gen, *shape):
    return torch.randn(*shape, generator=gen) * 0.05


def _shape(role):
    return (I, H) if role != "down" else (H, I)


def _fp8_checkpoint(path, gen, *, scale_fmt, qcfg):
    """DeepSeek-V3 names: an FP8 attention projection (partial 128 blocks) with FP32
    ``weight_scale_inv``, a BF16 norm, and FP8 experts of layer 1."""
    tensors, src = {}, {}
    w = _rand(gen, 320, 256)  # N not a multiple of 128: a partial block row
    tensors["model.layers.0.self_attn.q_a_proj.weight"], tensors["model.layers.0.self_attn.q_a_proj.weight_scale_inv"] \
        = quantize_fp8_blocks(w)
    tensors["model.layers.0.input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    for e in range(E):
        for role, proj in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            m = f"model.layers.1.mlp.experts.{e}.{proj}"
            codes, scales = quantize_fp8_blocks(_rand(gen, *_shape(role)), scale_fmt=scale_fmt)
            tensors[f"{m}.weight"], tensors[f"{m}.weight_scale_inv"] = codes, scales
            src[(e, role)] = (codes, scales)
    cfg = {"model_type": "deepseek_v3", "hidden_size": H, "moe_intermediate_size": I, "n_routed_experts": E,
           "num_hidden_layers": 2, "first_k_dense_replace": 1, "quantization_config": qcfg}
    save_sharded(path, tensors, cfg)
    return src


def test_fp8_linear_weight_and_compressed_tensors_dequantizer(tmp_path, gen):
    from compressed_tensors.entrypoints.convert.converters.fp8block_dequantizer import FP8BlockDequantizer
    from safetensors.torch import load_file

    path = tmp_path / "v3"
    _fp8_checkpoint(path, gen, scale_fmt=None, qcfg=FP8_V3)
    ckpt = lc.open(path)
    assert isinstance(ckpt.scheme, lc.Fp8Block) and ckpt.scheme.block == (128, 128) and ckpt.scheme.scale_fmt is None
    w, s = ckpt.linear_weight("model.layers.0.self_attn.q_a_proj")
    assert w.dtype == torch.float8_e4m3fn and w.shape == (320, 256)
    assert s.dtype == torch.float32 and s.shape == (3, 2)
    assert_bitwise_equal(ckpt.linear_weight("model.layers.0.self_attn.q_a_proj.weight")[1], s)
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    ref = FP8BlockDequantizer.from_pretrained(str(path)).process(tensors)
    want = ref["model.layers.0.self_attn.q_a_proj.weight"]
    assert_bitwise_equal(dequantize_fp8_blocks(w, s).to(torch.bfloat16), want)
    norm, none = ckpt.linear_weight("model.layers.0.input_layernorm")
    assert none is None and norm.dtype == torch.bfloat16
    with pytest.raises(FormatError, match="missing tensor 'model.layers.0.self_attn.nope.weight'"):
        ckpt.linear_weight("model.layers.0.self_attn.nope")
    # FP32 block scales are not powers of two: no exact MXFP8 form for the expert kernels
    with pytest.raises(FormatError, match="not powers of two"):
        ckpt.experts(1)


def test_fp8_linear_weight_runs_in_linear(tmp_path, gen):
    from lowbit import linear

    path = tmp_path / "v3"
    _fp8_checkpoint(path, gen, scale_fmt=None, qcfg=FP8_V3)
    w, s = lc.open(path).linear_weight("model.layers.0.self_attn.q_a_proj")
    x = torch.randn(2, 256, generator=gen).to(torch.bfloat16)
    y = linear(x, w, s)
    want = x.float() @ dequantize_fp8_blocks(w, s).T
    assert y.shape == (2, 320) and (y.float() - want).norm() / want.norm() < 5e-2


def test_fp8_ue8m0_experts_become_mxfp8_exactly(tmp_path, gen):
    from lowbit.formats import Mxfp8ExpertWeight

    path = tmp_path / "v31"
    src = _fp8_checkpoint(path, gen, scale_fmt="ue8m0", qcfg=FP8_UE8M0)
    w13, w2 = lc.open(path).experts(1, experts=[2, 0])
    assert isinstance(w13, Mxfp8ExpertWeight) and (w13.num_experts, w13.n, w13.k) == (2, 2 * I, H)
    d13, d2 = w13.as_quantized().dequantize(), w2.as_quantized().dequantize()
    for j, e in enumerate([2, 0]):
        want13 = torch.cat([dequantize_fp8_blocks(*src[(e, "gate")]), dequantize_fp8_blocks(*src[(e, "up")])])
        assert_bitwise_equal(d13[j], want13, f"w13 expert {e}")
        assert_bitwise_equal(d2[j], dequantize_fp8_blocks(*src[(e, "down")]), f"w2 expert {e}")
        assert_bitwise_equal(w13.natural_codes()[j, :I], src[(e, "gate")][0], "codes unchanged")


@pytest.mark.parametrize("field, value, match", [
    ("weight_block_size", [1, 128], "weight_block_size"),
    ("activation_scheme", "static", "activation_scheme"),
    ("fmt", "e5m2", "fmt"),
    ("expert_dtype", "fp4", "unknown FP8 config key"),
])
def test_fp8_scheme_fields_are_checked(field, value, match):
    with pytest.raises(FormatError, match=match):
        lc.parse_scheme({**FP8_UE8M0, field: value})


# ------------------------------------------------------------------------ DeepSeek-V4 MXFP4
V4_ROLES = (("gate", "w1"), ("up", "w3"), ("down", "w2"))


def _v4_checkpoint(path, gen):
    """DeepSeek-V4 names: experts ``layers.L.ffn.experts.E.w{1,3,2}.{weight int8, scale
    float8_e8m0fnu}``; an FP8 projection with E8M0 block ``scale``; an MXFP4 projection."""
    tensors, src = {}, {}
    for layer in range(2):
        for e in range(E):
            for role, w in V4_ROLES:
                packed, scales = quantize_mxfp4(_rand(gen, *_shape(role)))
                m = f"layers.{layer}.ffn.experts.{e}.{w}"
                tensors[f"{m}.weight"] = packed.view(torch.int8)
                tensors[f"{m}.scale"] = scales.view(torch.float8_e8m0fnu)
                src[(layer, e, role)] = (unpack_fp4(packed), scales)
    codes, scales = quantize_fp8_blocks(_rand(gen, 256, 256), scale_fmt="ue8m0")
    from lowbit.formats import e8m0_encode

    tensors["layers.0.attn.wq_a.weight"] = codes
    tensors["layers.0.attn.wq_a.scale"] = e8m0_encode(scales).view(torch.float8_e8m0fnu)
    fp4, fp4_s = quantize_mxfp4(_rand(gen, 64, 256))
    tensors["layers.0.attn.wo_b.weight"], tensors["layers.0.attn.wo_b.scale"] = fp4.view(torch.int8), fp4_s.view(
        torch.float8_e8m0fnu)
    tensors["layers.0.ffn.gate.weight"] = _rand(gen, E, H).to(torch.bfloat16)
    cfg = {"model_type": "deepseek_v4", "hidden_size": H, "moe_intermediate_size": I, "n_routed_experts": E,
           "num_hidden_layers": 2, "quantization_config": FP8_UE8M0}
    save_sharded(path, tensors, cfg)
    return src, (codes, scales), (fp4, fp4_s)


def test_deepseek_v4_mxfp4_experts(tmp_path, gen):
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP4A16

    path = tmp_path / "v4"
    src, _, _ = _v4_checkpoint(path, gen)
    ckpt = lc.open(path)
    assert ckpt.expert_format == "mxfp4" and ckpt.layers.moe == (0, 1)
    w13, w2 = ckpt.experts(1, experts=[3, 0, 2])
    assert w13.fmt == "mxfp4" and w13.codes.shape == (3, 2 * I, H) and w2.codes.shape == (3, H, I)
    ct_scheme = QuantizationScheme(targets=["Linear"], **MXFP4A16)
    for j, e in enumerate([3, 0, 2]):
        # codes: exactly those lowbit's quantizer packed (low nibble = even element)
        assert_bitwise_equal(w13.codes[j], torch.cat([src[(1, e, "gate")][0], src[(1, e, "up")][0]]), "w13 codes")
        assert_bitwise_equal(w2.scales[j], src[(1, e, "down")][1], "w2 scales")
        # values: compressed-tensors' own MXFP4 decompression of the stored bytes
        m = f"layers.1.ffn.experts.{e}.w2"
        ct = MXFP4PackedCompressor.decompress(
            {"weight_packed": ckpt.tensor(f"{m}.weight").view(torch.uint8),
             "weight_scale": ckpt.tensor(f"{m}.scale").view(torch.uint8)}, ct_scheme)["weight"]
        assert_bitwise_equal(w2.select(j).dequantize().to(ct.dtype), ct, f"w2 expert {e} vs compressed-tensors")
    assert_bitwise_equal(w13.select(0).dequantize()[:I],
                         dequantize_mxfp4(pack_fp4(src[(1, 3, "gate")][0]), src[(1, 3, "gate")][1]))


def test_deepseek_v4_linear_weights(tmp_path, gen):
    path = tmp_path / "v4"
    _, (codes, scales), (fp4, fp4_s) = _v4_checkpoint(path, gen)
    ckpt = lc.open(path)
    w, s = ckpt.linear_weight("layers.0.attn.wq_a")
    assert_bitwise_equal(w, codes)
    assert_bitwise_equal(s, scales)  # E8M0 bytes decoded to the FP32 powers of two
    w, s = ckpt.linear_weight("layers.0.attn.wo_b")
    assert w.dtype == torch.uint8 and s.dtype == torch.uint8
    assert_bitwise_equal(w, fp4)
    assert_bitwise_equal(e8m0_decode(s), e8m0_decode(fp4_s))


# ------------------------------------------------------------------------ ModelOpt NVFP4
MODELOPT = {"producer": {"name": "modelopt", "version": "0.35.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                             "exclude_modules": ["lm_head", "model.layers.*.self_attn*"]}}
NV_ROLES = (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj"))


def _nvfp4_checkpoint(path, gen, modelopt=MODELOPT):
    tensors, src = {}, {}
    for e in range(E):
        for r, (role, proj) in enumerate(NV_ROLES):
            w = _rand(gen, *_shape(role))
            g = torch.tensor(2.0 ** -(9 + (e + r) % 3))  # a power of two: 1 / g is exact too
            packed, scales, g = quantize_nvfp4(w, global_scale=g)
            m = f"model.layers.1.mlp.experts.{e}.{proj}"
            tensors.update({f"{m}.weight": packed, f"{m}.weight_scale": scales, f"{m}.weight_scale_2": g,
                            f"{m}.input_scale": torch.tensor(0.5)})
            src[(e, role)] = (packed, scales, g)
    tensors["model.layers.1.self_attn.q_proj.weight"] = _rand(gen, H, H).to(torch.bfloat16)
    cfg = {"model_type": "deepseek_v3", "hidden_size": H, "moe_intermediate_size": I, "n_routed_experts": E,
           "num_hidden_layers": 2, "first_k_dense_replace": 1}
    save_sharded(path, tensors, cfg)
    (path / "hf_quant_config.json").write_text(json.dumps(modelopt))
    return src


def test_modelopt_nvfp4_experts_against_compressed_tensors(tmp_path, gen):
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import NVFP4

    path = tmp_path / "nvfp4"
    src = _nvfp4_checkpoint(path, gen)
    ckpt = lc.open(path)
    assert isinstance(ckpt.scheme, lc.ModelOptNvfp4) and ckpt.expert_format == "nvfp4"
    assert not ckpt.scheme.is_quantized("model.layers.1.self_attn.q_proj")
    w13, w2 = ckpt.experts(1)
    assert w13.fmt == "nvfp4" and w13.global_scale.shape == (E, 2 * I, 1)
    d13, d2 = w13.dequantize(), w2.dequantize()
    ct_scheme = QuantizationScheme(targets=["Linear"], **NVFP4)
    for e in range(E):
        gate, up, down = (dequantize_nvfp4(*src[(e, r)]) for r in ("gate", "up", "down"))
        assert_bitwise_equal(d13[e], torch.cat([gate, up]), f"w13 expert {e}")
        assert_bitwise_equal(d2[e], down, f"w2 expert {e}")
        assert_bitwise_equal(w2.select(e).dequantize(), down, "select keeps the per-row global scale")
        # compressed-tensors: ModelOpt tensors converted to its NVFP4 form, then decompressed
        m = f"model.layers.1.mlp.experts.{e}.up_proj"
        raw = {f"{m}.{p}": ckpt.tensor(f"{m}.{p}") for p in ("weight", "weight_scale", "weight_scale_2", "input_scale")}
        conv = ModelOptNvfp4Converter(targets=["Linear"]).process(raw)
        state = {p: conv[f"{m}.{p}"] for p in ("weight_packed", "weight_scale", "weight_global_scale")}
        ct = NVFP4PackedCompressor.decompress(state, ct_scheme)["weight"]
        assert_bitwise_equal(d13[e, I:].to(ct.dtype), ct, f"up expert {e} vs compressed-tensors")


def test_modelopt_nvfp4_nibble_order(tmp_path, gen):
    """Element 2j in the low nibble: the codes read back are the codes packed."""
    path = tmp_path / "nvfp4"
    src = _nvfp4_checkpoint(path, gen)
    w13, _ = lc.open(path).experts(1, experts=[1])
    assert_bitwise_equal(w13.codes[0, :I], unpack_fp4(src[(1, "gate")][0]))
    assert int(w13.codes[0, 0, 0]) == int(src[(1, "gate")][0][0, 0]) & 0xF


def test_modelopt_refusals(tmp_path, gen):
    excl = json.loads(json.dumps(MODELOPT))
    excl["quantization"]["exclude_modules"].append("model.layers.*.mlp.experts.*")
    _nvfp4_checkpoint(tmp_path / "excluded", gen, excl)
    with pytest.raises(FormatError, match="matches exclude_modules"):
        lc.open(tmp_path / "excluded")
    for field, value, match in (("quant_algo", "FP8", "quant_algo"), ("group_size", 32, "group_size")):
        cfg = json.loads(json.dumps(MODELOPT))
        cfg["quantization"][field] = value
        with pytest.raises(FormatError, match=match):
            lc.parse_scheme(None, cfg)
    with pytest.raises(FormatError, match="disagree"):
        lc.parse_scheme({"quant_method": "compressed-tensors"}, MODELOPT)


def test_nvfp4_wrong_global_scale(tmp_path, gen):
    from safetensors.torch import load_file, save_file

    path = tmp_path / "nvfp4"
    _nvfp4_checkpoint(path, gen)
    shard = path / "model-00002-of-00002.safetensors"
    tensors = load_file(str(shard))
    name = "model.layers.1.mlp.experts.2.down_proj.weight_scale_2"
    tensors[name] = torch.tensor([1.0, 2.0])
    save_file(tensors, str(shard))
    with pytest.raises(FormatError, match=rf"{shard.name}: tensor '{name}': weight_scale_2 must be one float32 value"):
        lc.open(path).experts(1)
