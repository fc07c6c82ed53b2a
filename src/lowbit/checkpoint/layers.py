"""Which decoder layers of a checkpoint are MoE layers, from its config.

DeepSeek-V3 / Kimi K2 keys: ``num_hidden_layers``, ``n_routed_experts``,
``first_k_dense_replace`` (that many leading dense layers, default 0) and ``moe_layer_freq``
(every that many layers, default 1): layer ``i`` is MoE iff ``i >= first_k_dense_replace``
and ``i % moe_layer_freq == 0``. A multimodal config (Kimi K2.5) nests these in
``text_config``. Without ``n_routed_experts`` the MoE layers are those whose experts the
checkpoint holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

from ..formats.base import FormatError

__all__ = ["LayerPlan", "text_config", "layer_plan"]


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config: ``config["text_config"]`` when the checkpoint nests it
    there (multimodal models such as Kimi K2.5), else `config` itself."""
    nested = config.get("text_config")
    if isinstance(nested, Mapping) and "num_hidden_layers" in nested:
        return nested
    return config


def _int_key(cfg: Mapping[str, Any], key: str, default: int | None, where: str) -> int | None:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FormatError(f"{where}: {key} must be a non-negative integer, got {value!r}")
    return value


@dataclass(frozen=True)
class LayerPlan:
    """The decoder layers: ``moe`` and ``dense`` layer indices (ascending), the layer count
    and the number of routed experts per MoE layer (None when the config does not say).
    Iterating gives every layer index."""

    num_hidden_layers: int
    moe: tuple[int, ...]
    dense: tuple[int, ...]
    num_experts: int | None

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.num_hidden_layers))

    def __len__(self) -> int:
        return self.num_hidden_layers

    def is_moe(self, layer: int) -> bool:
        return layer in self.moe


def layer_plan(cfg: Mapping[str, Any], expert_layers: Iterable[int] = (), where: str = "config.json") -> LayerPlan:
    """The `LayerPlan` of a text config (`text_config`); expert_layers: the layers whose
    routed experts the checkpoint holds (used when the config has no ``n_routed_experts``)."""
    found = sorted(set(expert_layers))
    n_layers = _int_key(cfg, "num_hidden_layers", None, where)
    if n_layers is None:
        if not found:
            raise FormatError(f"{where}: no num_hidden_layers and no expert tensors to infer the layers from")
        n_layers = found[-1] + 1
    n_experts = _int_key(cfg, "n_routed_experts", None, where)
    if n_experts:
        first_dense = _int_key(cfg, "first_k_dense_replace", 0, where)
        freq = _int_key(cfg, "moe_layer_freq", 1, where) or 1
        moe = tuple(i for i in range(n_layers) if i >= first_dense and i % freq == 0)
    else:
        moe = tuple(i for i in found if i < n_layers)
    dense = tuple(i for i in range(n_layers) if i not in set(moe))
    return LayerPlan(n_layers, moe, dense, n_experts or None)
