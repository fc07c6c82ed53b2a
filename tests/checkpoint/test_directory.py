"""The lazy model-directory reader, the layer plan and the progress bar (safetensors only;
the ``checkpoint`` / ``test`` extras: the CPU tier runs these)."""

import io
import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("safetensors")

import lowbit.checkpoint as lc  # noqa: E402
from lowbit.checkpoint.layers import layer_plan, text_config  # noqa: E402
from lowbit.checkpoint.progress import Progress  # noqa: E402
from lowbit.formats import FormatError  # noqa: E402
from lowbit.formats.int4 import Int4G32  # noqa: E402
from lowbit.formats.w4a16 import unpack_w4a16  # noqa: E402
from lowbit.testing import assert_bitwise_equal  # noqa: E402

from checkpoint_builders import E, H, I, model_config  # noqa: E402

CT_INT4 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
           "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 32}}}}


def _int4_tensors(gen, layers=(1,)):
    """compressed-tensors-form experts made by lowbit's own int4_g32 format."""
    fmt, tensors, logical = Int4G32(), {}, {}
    for layer in layers:
        for e in range(E):
            for proj, (n, k) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                q = fmt.quantize(torch.randn(n, k, generator=gen))
                for p, t in fmt.pack(q).items():
                    tensors[f"model.layers.{layer}.mlp.experts.{e}.{proj}.{p}"] = t
                logical[(layer, e, proj)] = q
    return tensors, logical


def _write(path, files: dict[str, dict], config):
    from safetensors.torch import save_file

    path.mkdir()
    for name, tensors in files.items():
        save_file(tensors, str(path / name))
    (path / "config.json").write_text(json.dumps(config))


def test_single_and_split_files_without_index(tmp_path, gen):
    tensors, logical = _int4_tensors(gen)
    cfg = model_config(layers=2, quantization_config=CT_INT4)
    _write(tmp_path / "single", {"model.safetensors": tensors}, cfg)
    names = sorted(tensors)
    half = {n: tensors[n] for n in names[: len(names) // 2]}
    rest = {n: tensors[n] for n in names[len(names) // 2:]}
    _write(tmp_path / "split", {"a.safetensors": half, "b.safetensors": rest}, cfg)
    for d in ("single", "split"):
        ckpt = lc.open(tmp_path / d)
        assert sorted(ckpt.tensor_names()) == names
        w13, w2 = ckpt.experts(1, experts=[2])
        assert_bitwise_equal(unpack_w4a16(w13).codes[0, :I], logical[(1, 2, "gate_proj")].codes)
        assert_bitwise_equal(unpack_w4a16(w2).scales[0], logical[(1, 2, "down_proj")].scales)
    _write(tmp_path / "dup", {"a.safetensors": half, "b.safetensors": {**rest, names[0]: tensors[names[0]]}}, cfg)
    with pytest.raises(FormatError, match="is in both"):
        lc.open(tmp_path / "dup")


def test_directory_errors(tmp_path, gen):
    with pytest.raises(FormatError, match="not a model directory"):
        lc.open(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="no config.json"):
        lc.open(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{not json")
    with pytest.raises(FormatError, match="config.json: cannot read the model config"):
        lc.open(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(FormatError, match="no model.safetensors.index.json and no"):
        lc.open(tmp_path / "empty")
    (tmp_path / "empty" / "model.safetensors").write_bytes(b"\xff" * 12)
    with pytest.raises(FormatError, match="model.safetensors: truncated or not a safetensors file"):
        lc.open(tmp_path / "empty")


def test_tensor_reads_only_what_is_asked(tmp_path, gen):
    tensors, _ = _int4_tensors(gen)
    tensors["lm_head.weight"] = torch.randn(8, H, generator=gen).to(torch.bfloat16)
    _write(tmp_path / "c", {"model.safetensors": tensors}, model_config(layers=2, quantization_config=CT_INT4))
    ckpt = lc.open(tmp_path / "c")
    info = ckpt.tensor_info("lm_head.weight")
    assert info.dtype == torch.bfloat16 and info.shape == (8, H) and info.nbytes == 8 * H * 2
    assert_bitwise_equal(ckpt.tensor("lm_head.weight"), tensors["lm_head.weight"])
    with pytest.raises(FormatError, match="missing tensor 'nope'"):
        ckpt.tensor("nope")


def test_layer_plan_from_config():
    plan = layer_plan({"num_hidden_layers": 61, "n_routed_experts": 384, "first_k_dense_replace": 1,
                       "moe_layer_freq": 1})
    assert plan.moe == tuple(range(1, 61)) and plan.dense == (0,) and plan.num_experts == 384 and len(plan) == 61
    plan = layer_plan({"num_hidden_layers": 6, "n_routed_experts": 8, "first_k_dense_replace": 2, "moe_layer_freq": 2})
    assert plan.moe == (2, 4) and plan.dense == (0, 1, 3, 5) and plan.is_moe(4) and not plan.is_moe(3)
    assert layer_plan({"num_hidden_layers": 4}, expert_layers=[1, 3]).moe == (1, 3)
    nested = {"model_type": "kimi_k25", "text_config": {"num_hidden_layers": 2, "n_routed_experts": 4}}
    assert text_config(nested)["n_routed_experts"] == 4 and text_config({"num_hidden_layers": 1})["num_hidden_layers"]
    with pytest.raises(FormatError, match="first_k_dense_replace"):
        layer_plan({"num_hidden_layers": 4, "n_routed_experts": 4, "first_k_dense_replace": -1})


def test_config_declares_experts_the_checkpoint_lacks(tmp_path, gen):
    _write(tmp_path / "c", {"model.safetensors": {"lm_head.weight": torch.zeros(2, 2)}},
           model_config(layers=2, quantization_config=CT_INT4))
    with pytest.raises(FormatError, match="holds no routed-expert tensors"):
        lc.open(tmp_path / "c")


def test_progress_fallback_line(monkeypatch):
    import lowbit.checkpoint.progress as progress

    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    out = io.StringIO()
    with Progress(3 * 2**20, "layer 1: 4 experts", True, stream=out, use_tqdm=False) as bar:
        for _ in range(3):
            bar.update(2**20)
    assert "layer 1: 4 experts: 3.0/3.0 MiB (100%)" in out.getvalue() and out.getvalue().endswith("\n")
    quiet = io.StringIO()
    with Progress(10, "x", None, stream=quiet, use_tqdm=False) as bar:  # not a terminal: silent
        bar.update(10)
    assert quiet.getvalue() == ""


def test_import_is_light():
    code = ("import sys, lowbit, lowbit.checkpoint as c; c.open; "
            "bad = [m for m in ('safetensors', 'compressed_tensors', 'transformers') if m in sys.modules]; "
            "assert not bad, bad; assert not any(m.startswith('lowbit.kernels.') for m in sys.modules); print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_expert_naming_detection():
    from lowbit.checkpoint.experts import detect_expert_naming

    names = [f"language_model.model.layers.{L}.mlp.experts.{e}.{p}.weight_packed"
             for L in (1, 2) for e in (0, 5) for p in ("gate_proj", "up_proj", "down_proj")]
    names += ["language_model.model.layers.0.mlp.gate_proj.weight", "vision_tower.blocks.0.mlp.fc1.weight"]
    n = detect_expert_naming(names)
    assert (n.prefix, n.block, n.family) == ("language_model.model.", "mlp", "hf")
    assert n.layers == {1: (0, 5), 2: (0, 5)}
    assert n.module(2, 5, "up") == "language_model.model.layers.2.mlp.experts.5.up_proj"
    v4_names = [f"layers.3.ffn.experts.7.{w}.weight" for w in ("w1", "w2", "w3")] + ["mtp.0.ffn.experts.0.w1.weight"]
    v4 = detect_expert_naming(v4_names)
    assert (v4.prefix, v4.block, v4.family, v4.layers) == ("", "ffn", "deepseek", {3: (7,)})
    assert v4.module(3, 7, "up") == "layers.3.ffn.experts.7.w3"
    assert v4.module(3, 7, "down") == "layers.3.ffn.experts.7.w2"
    assert detect_expert_naming(["model.layers.0.mlp.gate_proj.weight"]) is None
