"""Hugging Face ``transformers`` models on lowbit's experts: swap each MoE layer's experts module.

A transformers 5 MoE block (``DeepseekV3MoE``, Kimi K2's architecture) calls its experts as
``self.experts(hidden_states [T, H], top_k_index int64 [T, k], top_k_weights fp32 [T, k])``
after its own router, and adds its shared experts itself. `MoEExperts` takes that call, so
`replace_experts` swaps the experts module and nothing else: the router, the shared experts,
attention and the norms stay the model's.

    model = DeepseekV3ForCausalLM(config)            # or any model with layers.L.mlp.experts
    load_dense_weights(model, ckpt)                  # everything but the routed experts
    replace_experts(model, ckpt, device="cuda")      # the routed experts, INT4, from ckpt

Nothing here imports transformers: the model is walked by module names.
"""

from __future__ import annotations

import re
from typing import Iterable

import torch

from ..formats.base import FormatError
from .moe import MoEExperts

__all__ = ["experts_modules", "replace_experts", "load_dense_weights"]

# ``model.layers.3.mlp.experts``, ``language_model.model.layers.3.mlp.experts``, ``layers.3.ffn.experts``
_EXPERTS_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:mlp|ffn)\.experts$")


def experts_modules(model: torch.nn.Module) -> dict[int, str]:
    """``{layer: module name}`` of every routed-experts module (``...layers.L.mlp.experts``)."""
    found: dict[int, str] = {}
    for name, _ in model.named_modules():
        m = _EXPERTS_NAME.search(name)
        if m:
            layer = int(m.group(1))
            if layer in found:
                raise ValueError(f"two experts modules for layer {layer}: {found[layer]!r} and {name!r}")
            found[layer] = name
    return found


def _set_submodule(root: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent_name, _, attr = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, attr, module)


def _module_device(module: torch.nn.Module) -> torch.device:
    for t in module.parameters():
        return t.device
    for t in module.buffers():
        return t.device
    return torch.device("cpu")


def replace_experts(
    model: torch.nn.Module,
    ckpt,
    *,
    layers: Iterable[int] | None = None,
    experts: Iterable[int] | None = None,
    device: torch.device | str | None = None,
    path: str = "auto",
    progress: bool | None = None,
) -> dict[int, MoEExperts]:
    """Replace the routed-experts module of each MoE layer of `model` by a `MoEExperts`
    loaded from `ckpt` (a `lowbit.checkpoint.Checkpoint` with INT4 group-32 experts).

    layers: the layers to replace (default: every MoE layer of the checkpoint; each must have
    an experts module in `model`); experts: the global expert ids to hold (expert
    parallelism; default all); device: where the weights go (default: the replaced module's
    device, ``cpu`` if it is on ``meta``); path: `lowbit.moe_experts`'s. The old module is
    dropped (its memory freed once nothing else holds it). The replaced module's sizes are
    checked against the checkpoint's. Returns ``{layer: the new module}``."""
    modules = experts_modules(model)
    wanted = list(ckpt.layers.moe) if layers is None else [int(x) for x in layers]
    missing = [x for x in wanted if x not in modules]
    if missing:
        raise ValueError(f"replace_experts: the model has no experts module for layers {missing} "
                         f"(found {sorted(modules)}; the checkpoint's MoE layers are {list(ckpt.layers.moe)})")
    ids = None if experts is None else [int(e) for e in experts]
    out: dict[int, MoEExperts] = {}
    for layer in wanted:
        name = modules[layer]
        old = model.get_submodule(name)
        dev = device
        if dev is None:
            dev = _module_device(old)
            dev = torch.device("cpu") if dev.type == "meta" else dev
        new = MoEExperts.from_checkpoint(ckpt, layer, experts=ids, device=dev, path=path, progress=progress)
        _check_sizes(old, new, name, ckpt.num_experts)
        _set_submodule(model, name, new)
        out[layer] = new
    return out


def _check_sizes(old: torch.nn.Module, new: MoEExperts, name: str, num_experts: int | None) -> None:
    """The sizes the model was built with (transformers' experts attributes, where present)
    must be the checkpoint's."""
    for attr, got in (("hidden_dim", new.hidden_size), ("intermediate_dim", new.intermediate_size),
                      ("num_experts", num_experts)):
        want = getattr(old, attr, None)
        if isinstance(want, int) and got is not None and want != got:
            raise ValueError(f"replace_experts: {name}.{attr} is {want} in the model, {got} in the checkpoint")


def load_dense_weights(model: torch.nn.Module, ckpt, *, strict: bool = True) -> list[str]:
    """Copy every parameter and persistent buffer of `model` that is not a lowbit module's
    from the checkpoint tensor of the same name (``ckpt.tensor``, cast to the model tensor's
    dtype and copied onto its device), skipping routed-experts modules (``layers.L.mlp.experts``:
    `replace_experts` loads those). A tensor tied to one already loaded (a shared embedding)
    is skipped. strict: raise `FormatError` naming the tensors the checkpoint lacks (else
    leave them as they are). Returns the names loaded."""
    skip = tuple(f"{n}." for n in experts_modules(model).values())
    names = set(ckpt.tensor_names())
    loaded, lacking, seen = [], [], set()
    with torch.no_grad():
        for key, t in model.state_dict(keep_vars=True).items():
            if key.startswith(skip):
                continue
            if t.data_ptr() in seen and t.numel():
                continue
            if key not in names:
                lacking.append(key)
                continue
            src = ckpt.tensor(key)
            if tuple(src.shape) != tuple(t.shape):
                raise FormatError(f"{ckpt.tensor_info(key).where()}: shape {tuple(src.shape)}, the model "
                                  f"expects {tuple(t.shape)}")
            t.copy_(src.to(t.dtype))
            seen.add(t.data_ptr())
            loaded.append(key)
    if lacking and strict:
        raise FormatError(f"{ckpt.path}: the checkpoint lacks {len(lacking)} tensors the model has: {lacking[:8]}"
                          f"{' ...' if len(lacking) > 8 else ''}")
    return loaded
