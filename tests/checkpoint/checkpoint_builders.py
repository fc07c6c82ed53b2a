"""Real checkpoint directories built at test time.

`build_ct_checkpoint` quantizes random BF16 weights of a small DeepSeek-V3 / Kimi-K2-shaped
model with the real compressed-tensors package (its own quantization config, scale rule,
quantizer, packer and ``ModelCompressor``, which also writes config.json's
quantization_config), and saves it as a sharded Hugging Face directory with safetensors.
`save_sharded` writes hand-built tensors (FP8 / FP4 formats from `lowbit.formats`) the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

H, I, E, DENSE_I, VOCAB = 256, 128, 4, 192, 64
#: Kimi K2's ignore list, in its form: attention, shared experts, dense MLPs, the router, lm_head
KIMI_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
               r"re:.*mlp\.gate$"]
INT4_G32 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}


def model_config(layers: int = 3, first_dense: int = 1, **extra) -> dict:
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": H,
        "moe_intermediate_size": I, "intermediate_size": DENSE_I, "n_routed_experts": E, "n_shared_experts": 1,
        "num_experts_per_tok": 2, "num_hidden_layers": layers, "first_k_dense_replace": first_dense,
        "moe_layer_freq": 1, "vocab_size": VOCAB, "torch_dtype": "bfloat16",
    }
    cfg.update(extra)
    return cfg


def _linear(n_in: int, n_out: int, gen: torch.Generator) -> torch.nn.Linear:
    lin = torch.nn.Linear(n_in, n_out, bias=False)
    lin.weight.data = (torch.randn(n_out, n_in, generator=gen) * 0.05).to(torch.bfloat16)
    return lin


def _mlp(inter: int, gen: torch.Generator) -> torch.nn.Module:
    m = torch.nn.Module()
    m.gate_proj, m.up_proj, m.down_proj = _linear(H, inter, gen), _linear(H, inter, gen), _linear(inter, H, gen)
    return m


def build_model(layers: int = 3, first_dense: int = 1, seed: int = 0) -> torch.nn.Module:
    """A module tree named like DeepseekV3ForCausalLM: ``model.layers.L.{self_attn.q_proj,
    mlp...}``, dense MLPs for the first layers, then router ``mlp.gate``, routed
    ``mlp.experts.E.{gate,up,down}_proj`` and ``mlp.shared_experts``; ``lm_head``."""
    gen = torch.Generator().manual_seed(seed)
    root = torch.nn.Module()
    root.model = torch.nn.Module()
    root.model.embed_tokens = torch.nn.Embedding(VOCAB, H)
    root.model.embed_tokens.weight.data = torch.randn(VOCAB, H, generator=gen).to(torch.bfloat16)
    root.model.layers = torch.nn.ModuleList()
    for layer in range(layers):
        blk = torch.nn.Module()
        blk.self_attn = torch.nn.Module()
        blk.self_attn.q_proj = _linear(H, H, gen)
        if layer < first_dense:
            blk.mlp = _mlp(DENSE_I, gen)
        else:
            blk.mlp = torch.nn.Module()
            blk.mlp.gate = _linear(H, E, gen)
            blk.mlp.experts = torch.nn.ModuleDict({str(e): _mlp(I, gen) for e in range(E)})
            blk.mlp.shared_experts = _mlp(I, gen)
        root.model.layers.append(blk)
    root.lm_head = _linear(H, VOCAB, gen)
    return root


def _calibrate(model: torch.nn.Module) -> None:
    """Min/max weight scales by compressed-tensors' own rule (`calculate_qparams`)."""
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    for _, m in model.named_modules():
        scheme = getattr(m, "quantization_scheme", None)
        if scheme is None or scheme.weights is None:
            continue
        w = m.weight.data
        args = scheme.weights
        g = w.view(w.shape[0], -1, args.group_size) if args.strategy == "group" else w.view(w.shape[0], 1, -1)
        scale, zp = calculate_qparams(g.amin(-1), g.amax(-1), args)
        m.weight_scale.data.copy_(scale.reshape(m.weight_scale.shape))
        if hasattr(m, "weight_zero_point"):
            m.weight_zero_point.data.copy_(zp.reshape(m.weight_zero_point.shape))


def save_sharded(path: Path, tensors: dict[str, torch.Tensor], config: dict, *, shards: int = 2,
                 layer_of=None) -> dict[str, str]:
    """Write `tensors` as ``model-0000k-of-0000n.safetensors`` shards (tensors of layer L in
    shard ``min(L, shards - 1)``, the rest in the first), the index json and config.json.
    Returns the weight map."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)

    def default_layer_of(name: str) -> int:
        parts = name.split(".")
        for a, b in zip(parts, parts[1:]):
            if a == "layers" and b.isdigit():
                return int(b)
        return 0

    layer_of = layer_of or default_layer_of
    files = [f"model-{k + 1:05d}-of-{shards:05d}.safetensors" for k in range(shards)]
    groups: dict[str, dict[str, torch.Tensor]] = {f: {} for f in files}
    weight_map = {}
    for name, t in tensors.items():
        f = files[min(layer_of(name), shards - 1)]
        groups[f][name] = t.contiguous()
        weight_map[name] = f
    for f, group in groups.items():
        save_file(group, str(path / f))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return weight_map


def build_ct_checkpoint(
    path: Path,
    *,
    weights: dict | None = None,
    input_activations: dict | None = None,
    ignore: list[str] | None = None,
    explicit_ignore: bool = False,
    layers: int = 3,
    first_dense: int = 1,
    shards: int = 2,
    seed: int = 0,
) -> tuple[Path, torch.nn.Module]:
    """Quantize `build_model` with compressed-tensors (``pack-quantized``, targets
    ``["Linear"]``, the given weights / input_activations args and ignore list) and save it.
    explicit_ignore: let ``ModelCompressor.from_pretrained_model`` rebuild the config from the
    model (its ignore list then names every unquantized linear layer) instead of saving the
    given config. Returns (path, the compressed model)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )

    model = build_model(layers, first_dense, seed)
    scheme = QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(**(weights or INT4_G32)),
        input_activations=QuantizationArgs(**input_activations) if input_activations else None,
    )
    cfg = QuantizationConfig(config_groups={"group_0": scheme}, ignore=KIMI_IGNORE if ignore is None else ignore,
                             format="pack-quantized")
    apply_quantization_config(model, cfg, show_progress=False)
    _calibrate(model)
    if explicit_ignore:
        compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    else:
        compressor = ModelCompressor(quantization_config=cfg)
    compressor.compress_model(model)
    tensors = {k: v.detach() for k, v in model.state_dict().items()}
    save_sharded(path, tensors, model_config(layers, first_dense), shards=shards)
    compressor.update_config(str(path))
    return path, model


def ct_dequantized(path: Path) -> dict[str, torch.Tensor]:
    """Every weight of the checkpoint at `path` as compressed-tensors' own model-free
    decompression gives it (``CompressedTensorsDequantizer``, reading config.json itself)."""
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import CompressedTensorsDequantizer
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return CompressedTensorsDequantizer(str(path)).process(tensors)


def set_quantization_config(path: Path, qcfg: dict) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"] = qcfg
    (path / "config.json").write_text(json.dumps(cfg, indent=1))


def read_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())
