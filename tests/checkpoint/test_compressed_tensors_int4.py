"""compressed-tensors INT4 checkpoints, built by the real compressed-tensors package, loaded by
`lowbit.checkpoint` and compared bit for bit with compressed-tensors' own decompression.

Needs safetensors and compressed-tensors (the ``test`` extra: the CPU tier runs these)."""

import json
import shutil

import pytest
import torch

pytest.importorskip("safetensors")
pytest.importorskip("compressed_tensors")

import lowbit.checkpoint as lc  # noqa: E402
from lowbit.formats import FormatError  # noqa: E402
from lowbit.formats.int4 import Int4G32  # noqa: E402
from lowbit.formats.w4a16 import W4A16Weight, unpack_w4a16  # noqa: E402
from lowbit.testing import assert_bitwise_equal  # noqa: E402

from checkpoint_builders import (  # noqa: E402
    E, H, I, INT4_G32, build_ct_checkpoint, build_model, ct_dequantized, read_config, set_quantization_config,
)

MOE_LAYERS = (1, 2)


@pytest.fixture(scope="module")
def kimi_like(tmp_path_factory):
    """A 3-layer Kimi-K2-shaped checkpoint (layer 0 dense, layers 1-2 MoE with 4 experts),
    Kimi's ignore list, one shard per layer, and compressed-tensors' own decompression of it."""
    path, _ = build_ct_checkpoint(tmp_path_factory.mktemp("ct") / "kimi_like", shards=3)
    return path, ct_dequantized(path)


def _copy(src, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(src, dst)
    return dst


def _ct_w13(ref, layer, e, prefix="model."):
    m = f"{prefix}layers.{layer}.mlp.experts.{e}"
    return torch.cat([ref[f"{m}.gate_proj.weight"], ref[f"{m}.up_proj.weight"]])


def _ct_w2(ref, layer, e, prefix="model."):
    return ref[f"{prefix}layers.{layer}.mlp.experts.{e}.down_proj.weight"]


def _dequantized_bf16(w: W4A16Weight) -> torch.Tensor:
    # lowbit dequantizes in FP32, exactly; compressed-tensors multiplies in BF16 (one rounding of
    # the same exact product), so the BF16 rounding of lowbit's values must equal it bit for bit
    return unpack_w4a16(w).dequantize().to(torch.bfloat16)


# ----------------------------------------------------------------------------------- loading
def test_open_reads_config_scheme_and_layers(kimi_like):
    path, _ = kimi_like
    ckpt = lc.open(path)
    assert ckpt.config["model_type"] == "deepseek_v3"
    assert isinstance(ckpt.scheme, lc.CompressedTensorsInt4) and ckpt.scheme.method == "compressed-tensors"
    assert ckpt.scheme.groups[0].format == "pack-quantized"
    assert ckpt.layers.moe == MOE_LAYERS and ckpt.layers.dense == (0,) and list(ckpt.layers) == [0, 1, 2]
    assert ckpt.expert_format == "int4_g32" and ckpt.num_experts == E


@pytest.mark.parametrize("layer", MOE_LAYERS)
def test_experts_bit_exact_with_compressed_tensors(kimi_like, layer):
    path, ref = kimi_like
    w13, w2 = lc.open(path).experts(layer)
    assert isinstance(w13, W4A16Weight) and (w13.num_experts, w13.n, w13.k, w13.profile) == (E, 2 * I, H, "indexed")
    assert (w2.num_experts, w2.n, w2.k) == (E, H, I)
    d13, d2 = _dequantized_bf16(w13), _dequantized_bf16(w2)
    for e in range(E):
        assert_bitwise_equal(d13[e], _ct_w13(ref, layer, e), f"w13 expert {e}")
        assert_bitwise_equal(d2[e], _ct_w2(ref, layer, e), f"w2 expert {e}")


def test_codes_and_scales_match_compressed_tensors_unpack(kimi_like):
    """The codes are compressed-tensors' own unpacked values + 8, the scales its bf16 scales."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    path, _ = kimi_like
    ckpt = lc.open(path)
    w13, _ = ckpt.experts(2)
    q = unpack_w4a16(w13)
    m = "model.layers.2.mlp.experts.3.up_proj"
    packed, shape = ckpt.tensor(f"{m}.weight_packed"), ckpt.tensor(f"{m}.weight_shape")
    ct_q = unpack_from_int32(packed, 4, torch.Size(shape.tolist()))
    assert_bitwise_equal(q.codes[3, I:].to(torch.int16) - 8, ct_q.to(torch.int16), "codes")
    assert_bitwise_equal(q.scales[3, I:], ckpt.tensor(f"{m}.weight_scale"), "scales")


def test_experts_subset_in_the_order_asked(kimi_like):
    path, ref = kimi_like
    ckpt = lc.open(path)
    ids = [3, 1]
    w13, w2 = ckpt.experts(1, experts=ids)
    assert w13.num_experts == 2 and w2.num_experts == 2
    d13, d2 = _dequantized_bf16(w13), _dequantized_bf16(w2)
    for j, e in enumerate(ids):
        assert_bitwise_equal(d13[j], _ct_w13(ref, 1, e), f"local {j} = expert {e}")
        assert_bitwise_equal(d2[j], _ct_w2(ref, 1, e), f"local {j} = expert {e}")
    w13r, _ = ckpt.experts(1, experts=range(2, 4))
    assert_bitwise_equal(w13r.qweight[0], lc.open(path).experts(1, experts=[2])[0].qweight[0])
    with pytest.raises(ValueError, match="duplicate"):
        ckpt.experts(1, experts=[1, 1])
    with pytest.raises(ValueError, match="out of range"):
        ckpt.experts(1, experts=[E])
    with pytest.raises(TypeError, match="integer"):
        ckpt.experts(1, experts=[0.0])
    with pytest.raises(ValueError, match="dense layer"):
        ckpt.experts(0)


def test_profile_and_moe_experts_run_on_the_loaded_weights(kimi_like, gen):
    """The prepared weights go straight into `moe_experts` (the Triton interpreter on the CPU
    tier) and agree with the FP32 reference on compressed-tensors' dequantized weights."""
    from lowbit import moe_experts
    from lowbit.reference import moe_experts_ref

    path, ref = kimi_like
    ckpt = lc.open(path)
    assert ckpt.experts(1, experts=[0], profile="contiguous")[0].profile == "contiguous"
    w13, w2 = ckpt.experts(1)
    hidden = torch.randn(3, H, generator=gen).to(torch.bfloat16)
    topk_ids = torch.tensor([[0, 3], [2, 1], [3, -1]], dtype=torch.int32)
    topk_weights = torch.rand(3, 2, generator=gen)
    out = moe_experts(hidden, topk_ids, topk_weights, w13, w2)
    r13 = torch.stack([_ct_w13(ref, 1, e) for e in range(E)]).float()
    r2 = torch.stack([_ct_w2(ref, 1, e) for e in range(E)]).float()
    want = moe_experts_ref(hidden, topk_ids, topk_weights, r13, r2, round_intermediate=True)
    err = (out.float() - want).norm() / want.norm()
    assert err < 1e-2, f"rel err {err:.3e}"


def test_explicit_ignore_list_from_the_model(tmp_path):
    """``ModelCompressor.from_pretrained_model`` writes an ignore list of module names (every
    unquantized linear layer): the loader reads it the same way."""
    path, _ = build_ct_checkpoint(tmp_path / "explicit", explicit_ignore=True, layers=2)
    ignore = read_config(path)["quantization_config"]["ignore"]
    assert "model.layers.1.mlp.gate" in ignore and not any(i.startswith("re:") for i in ignore)
    ref = ct_dequantized(path)
    w13, w2 = lc.open(path).experts(1)
    assert_bitwise_equal(_dequantized_bf16(w13)[2], _ct_w13(ref, 1, 2))


def test_ignore_and_targets_decide_as_compressed_tensors_does(kimi_like):
    """For every linear layer of the model, `scheme.is_quantized` equals compressed-tensors'
    own decision (the modules `apply_quantization_config` gave a scheme)."""
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config

    path, _ = kimi_like
    ckpt = lc.open(path)
    model = build_model()
    apply_quantization_config(model, QuantizationConfig.model_validate(read_config(path)["quantization_config"]),
                              show_progress=False)
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) > 20
    for name, m in linears:
        assert ckpt.scheme.is_quantized(name) == hasattr(m, "quantization_scheme"), name
    # the unquantized layers are stored as plain bf16 weights
    assert ckpt.tensor_info("model.layers.1.mlp.shared_experts.up_proj.weight").dtype == torch.bfloat16


def test_ignored_experts_are_refused(tmp_path):
    path, _ = build_ct_checkpoint(tmp_path / "ign", ignore=["lm_head", "re:.*experts.*"], layers=2)
    with pytest.raises(FormatError, match=r"routed expert .*not quantized \(listed in ignore\)"):
        lc.open(path)


def test_untargeted_experts_are_refused(kimi_like, tmp_path):
    path = _copy(kimi_like[0], tmp_path)
    qcfg = read_config(path)["quantization_config"]
    qcfg["config_groups"]["group_0"]["targets"] = ["re:.*self_attn.*"]
    set_quantization_config(path, qcfg)
    with pytest.raises(FormatError, match="targeted by no config group"):
        lc.open(path)


def test_nested_text_config(kimi_like, tmp_path):
    """A Kimi-K2.5-style config (the language model's keys under text_config)."""
    path = _copy(kimi_like[0], tmp_path)
    cfg = read_config(path)
    qcfg = cfg.pop("quantization_config")
    (path / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "architectures": ["KimiK25"],
                                                   "text_config": cfg, "quantization_config": qcfg}))
    ckpt = lc.open(path)
    assert ckpt.layers.moe == MOE_LAYERS and ckpt.hidden_size == H
    assert ckpt.experts(2, experts=[0])[0].n == 2 * I


# -------------------------------------------------------------------------- refused schemes
def test_w4a8_scheme_is_refused(tmp_path):
    act = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    path, _ = build_ct_checkpoint(tmp_path / "w4a8", input_activations=act, layers=2)
    with pytest.raises(FormatError, match="input_activations must be null.*W4A8"):
        lc.open(path)


def test_asymmetric_scheme_is_refused(tmp_path):
    path, _ = build_ct_checkpoint(tmp_path / "asym", weights={**INT4_G32, "symmetric": False}, layers=2)
    assert "model.layers.1.mlp.experts.0.gate_proj.weight_zero_point" in lc.CheckpointDirectory(path)
    with pytest.raises(FormatError, match="symmetric=False"):
        lc.open(path)
    # a config claiming symmetric over tensors that carry zero points: refused at the tensors
    qcfg = read_config(path)["quantization_config"]
    qcfg["config_groups"]["group_0"]["weights"]["symmetric"] = True
    set_quantization_config(path, qcfg)
    with pytest.raises(FormatError, match="weight_zero_point present.*asymmetric"):
        lc.open(path).experts(1)


def test_asymmetric_tensors_refused_by_the_tensor_level_api(tmp_path):
    """The zero point that compressed-tensors writes reaches `pack_w4a16`,
    `from_compressed_tensors` and the int4_g32 format's `unpack` only to be refused."""
    from lowbit import pack_w4a16
    from lowbit.formats import from_compressed_tensors

    path, _ = build_ct_checkpoint(tmp_path / "asym", weights={**INT4_G32, "symmetric": False}, layers=2)
    d = lc.CheckpointDirectory(path)
    m = "model.layers.1.mlp.experts.0.gate_proj"
    t = d.read([f"{m}.weight_packed", f"{m}.weight_scale", f"{m}.weight_shape", f"{m}.weight_zero_point"])
    state = {k.rsplit(".", 1)[1]: v for k, v in t.items()}
    with pytest.raises(FormatError, match="zero point"):
        pack_w4a16(state["weight_packed"][None], state["weight_scale"][None], zero_point=state["weight_zero_point"])
    with pytest.raises(FormatError, match="zero point"):
        from_compressed_tensors(state["weight_packed"], state["weight_scale"],
                                weight_zero_point=state["weight_zero_point"])
    with pytest.raises(FormatError, match="zero point"):
        Int4G32().unpack(state)


def test_group_128_is_refused(tmp_path):
    path, _ = build_ct_checkpoint(tmp_path / "g128", weights={**INT4_G32, "group_size": 128}, layers=2)
    with pytest.raises(FormatError, match="group_size=128"):
        lc.open(path)


@pytest.mark.parametrize("field, value, match", [
    ("quant_method", "awq", "unsupported quant_method"),
    ("format", "int-quantized", "format must be 'pack-quantized'"),
    ("quantization_status", "frozen", "quantization_status"),
    ("transform_config", {"rotation": {}}, "transform"),
    ("moe_sparsity_config", {"method": "prune", "num_experts": [None, 3, 3]}, "moe_sparsity_config"),
])
def test_whole_scheme_is_checked(kimi_like, tmp_path, field, value, match):
    path = _copy(kimi_like[0], tmp_path)
    qcfg = read_config(path)["quantization_config"]
    qcfg[field] = value
    if field == "format":
        qcfg["config_groups"]["group_0"]["format"] = None
    set_quantization_config(path, qcfg)
    with pytest.raises(FormatError, match=match):
        lc.open(path)


MINIMAL_WEIGHTS = [
    {"num_bits": 4, "group_size": 32},
    {"num_bits": 4, "group_size": 32, "strategy": "GROUP", "type": "INT"},
    {"num_bits": 4, "group_size": 32, "actorder": "weight", "observer": "minmax"},
    {"group_size": 32},
    {"num_bits": 4},
    {"num_bits": 4, "group_size": -1},
    {"num_bits": 4, "group_size": 32, "symmetric": False},
    {"num_bits": 4, "group_size": 32, "type": "float"},
    {"num_bits": 4, "group_size": 32, "dynamic": True},
    {"num_bits": 4, "group_size": 64},
]


@pytest.mark.parametrize("weights", MINIMAL_WEIGHTS, ids=lambda w: json.dumps(w, sort_keys=True))
def test_minimal_scheme_dicts_read_as_compressed_tensors_reads_them(weights):
    """Minimal config dicts: compressed-tensors' own models parse them (with its defaults);
    lowbit accepts exactly those it reads as static symmetric INT4 group-32 weight-only."""
    from compressed_tensors.quantization import QuantizationConfig

    qcfg = {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}
    scheme = QuantizationConfig.model_validate(qcfg).config_groups["group_0"]
    w = scheme.weights
    ct_reads_int4_g32 = (w.num_bits == 4 and w.type == "int" and w.symmetric and w.strategy == "group"
                         and w.group_size == 32 and not w.dynamic and scheme.input_activations is None)
    parsed = lc.parse_scheme(qcfg)
    module = "model.layers.1.mlp.experts.0.gate_proj"
    if ct_reads_int4_g32:
        parsed.check_experts([module])
    else:
        with pytest.raises(FormatError):
            parsed.check_experts([module])


def test_minimal_scheme_checkpoint_loads_bit_exact(kimi_like, tmp_path):
    path = _copy(kimi_like[0], tmp_path)
    set_quantization_config(path, {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                   "config_groups": {"g": {"targets": ["re:.*experts.*"],
                                                           "weights": {"num_bits": 4, "group_size": 32}}}})
    w13, _ = lc.open(path).experts(2)
    assert_bitwise_equal(_dequantized_bf16(w13)[1], _ct_w13(kimi_like[1], 2, 1))


# -------------------------------------------------------------------------- broken files
def test_missing_shard(kimi_like, tmp_path):
    path = _copy(kimi_like[0], tmp_path)
    (path / "model-00003-of-00003.safetensors").unlink()
    ckpt = lc.open(path)  # layer 1 lives in the first shard
    ckpt.experts(1, experts=[0])
    with pytest.raises(FormatError, match=r"model-00003-of-00003\.safetensors: missing shard \(needed for tensor "
                                          r"'model\.layers\.2\.mlp\.experts\.0\.gate_proj\.weight_packed'"):
        ckpt.experts(2)


def test_missing_tensor(kimi_like, tmp_path):
    from safetensors.torch import load_file, save_file

    path = _copy(kimi_like[0], tmp_path)
    shard = path / "model-00003-of-00003.safetensors"
    tensors = load_file(str(shard))
    gone = "model.layers.2.mlp.experts.3.up_proj.weight_scale"
    del tensors[gone]
    save_file(tensors, str(shard))
    ckpt = lc.open(path)
    with pytest.raises(FormatError, match=rf"{shard.name}: missing tensor '{gone}'"):
        ckpt.experts(2)
    ckpt.experts(2, experts=[0, 1, 2])  # the others still load
    index = json.loads((path / "model.safetensors.index.json").read_text())
    del index["weight_map"][gone]
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match=rf"missing tensor '{gone}'"):
        lc.open(path).experts(2)


@pytest.mark.parametrize("param, change, match", [
    ("weight_scale", lambda t: t.to(torch.float16), r"weight_scale must be bfloat16, got F16"),
    ("weight_packed", lambda t: t[:, :-1].contiguous(), r"weight_packed must have shape \[128, 32\], got \[128, 31\]"),
    ("weight_packed", lambda t: t.view(torch.float32), r"weight_packed must be int32, got F32"),
    ("weight_shape", lambda t: t + torch.tensor([0, 32]), r"weight_shape \[128, 288\] does not match"),
])
def test_wrong_dtype_or_shape(kimi_like, tmp_path, param, change, match):
    from safetensors.torch import load_file, save_file

    path = _copy(kimi_like[0], tmp_path)
    shard = path / "model-00003-of-00003.safetensors"
    tensors = load_file(str(shard))
    name = f"model.layers.2.mlp.experts.1.gate_proj.{param}"
    tensors[name] = change(tensors[name])
    save_file(tensors, str(shard))
    with pytest.raises(FormatError, match=match) as info:
        lc.open(path).experts(2)
    assert name in str(info.value)


def test_truncated_shard(kimi_like, tmp_path):
    path = _copy(kimi_like[0], tmp_path)
    shard = path / "model-00003-of-00003.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(FormatError, match=rf"{shard.name}: tensor '.*': truncated file"):
        lc.open(path).experts(2)
    shard.write_bytes(data[:20])
    with pytest.raises(FormatError, match=rf"{shard.name}: truncated"):
        lc.open(path).experts(2)


def test_progress_bar_on_request_only(kimi_like, monkeypatch, capsys):
    import lowbit.checkpoint.progress as progress

    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    ckpt = lc.open(kimi_like[0])
    ckpt.experts(1, progress=False)
    assert capsys.readouterr().err == ""
    ckpt.experts(1)  # default: only on a terminal, and pytest's stderr is not one
    assert capsys.readouterr().err == ""
    lc.open(kimi_like[0], progress=True).experts(1)
    assert "layer 1: 4 experts" in capsys.readouterr().err
