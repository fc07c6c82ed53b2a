"""A checkpoint's quantization scheme, parsed and validated whole before any weight is read.

Three schemes are served, one class each; `parse_scheme` picks by the config:

- `CompressedTensorsInt4`: ``quantization_config.quant_method == "compressed-tensors"``,
  routed experts in a config group of ``pack-quantized`` INT4 group-32 symmetric weights with
  no activation quantization (Kimi K2.x). Fields follow compressed-tensors' schema and
  defaults: a group's ``weights`` are resolved as compressed-tensors resolves them
  (`lowbit.formats.int4.resolve_compressed_tensors_args`), its ``format`` falls back to the
  top-level one, and which group quantizes a module follows compressed-tensors' matching
  (targets and ``ignore`` entries are exact module names, ``re:`` regular expressions matched
  from the start of the name, or module class names, of which only ``Linear`` can be resolved
  without the model: expert projections are linear layers). A scheme with input activation
  quantization (W4A8), a zero point, a transform, sparsity or pruned experts is refused.
- `Fp8Block`: ``quant_method == "fp8"`` with ``weight_block_size [128, 128]`` (DeepSeek-V3;
  DeepSeek-V3.1 / V4 add ``scale_fmt "ue8m0"``): ``weight`` E4M3 with FP32 ``weight_scale_inv``
  (or a ``scale`` tensor, FP32 or E8M0) per 128x128 block; experts may also be MXFP4 (see
  `lowbit.checkpoint.experts`).
- `ModelOptNvfp4`: NVIDIA ModelOpt's ``hf_quant_config.json`` (or ``quant_method
  "modelopt"``) with ``quant_algo "NVFP4"``, group 16, ``exclude_modules`` as glob patterns.

`Unquantized`: no quantization config at all.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Iterable, Mapping

from ..formats.base import FormatError
from ..formats.int4 import INT4_GROUP, check_compressed_tensors_scheme, resolve_compressed_tensors_args

__all__ = [
    "QuantScheme",
    "Unquantized",
    "CompressedTensorsGroup",
    "CompressedTensorsInt4",
    "Fp8Block",
    "ModelOptNvfp4",
    "parse_scheme",
]

CT_METHOD = "compressed-tensors"
CT_PACK_QUANTIZED = "pack-quantized"
FP8_BLOCK = (128, 128)
NVFP4_GROUP = 16


class QuantScheme:
    """A parsed, validated quantization scheme.

    method: the config's quantization method (``"compressed-tensors"``, ``"fp8"``,
    ``"modelopt"`` or ``"none"``); source: where it was read (file and key).
    """

    method: str = "none"
    source: str = ""

    def is_quantized(self, module: str) -> bool:
        """Whether the scheme quantizes the module named `module` (e.g.
        ``"model.layers.1.mlp.experts.0.gate_proj"``)."""
        raise NotImplementedError

    def check_experts(self, modules: Iterable[str]) -> None:
        """Raise `FormatError` unless every routed-expert projection in `modules` is quantized
        in a form lowbit serves."""
        raise NotImplementedError


@dataclass(frozen=True)
class Unquantized(QuantScheme):
    """No quantization config: every weight is stored as it is computed with."""

    method: str = "none"
    source: str = ""

    def is_quantized(self, module: str) -> bool:
        return False

    def check_experts(self, modules: Iterable[str]) -> None:
        return None


# -- compressed-tensors ------------------------------------------------------------------
#: top-level keys of a compressed-tensors quantization_config (the model plus what
#: ``ModelCompressor.update_config`` adds)
_CT_CONFIG_KEYS = {
    "config_groups", "quant_method", "kv_cache_scheme", "format", "quantization_status",
    "global_compression_ratio", "ignore", "moe_sparsity_config", "sparsity_config",
    "transform_config", "version",
}
_CT_GROUP_KEYS = {"targets", "weights", "input_activations", "output_activations", "format"}


def _is_regex(target: str) -> bool:
    return target.startswith("re:")


def _is_class_name(target: str) -> bool:
    """A target that names a module class (``Linear``), not a module (``lm_head``,
    ``model.layers.0.mlp``): compressed-tensors' class names carry no dot and start upper-case."""
    return not _is_regex(target) and "." not in target and target[:1].isupper()


def _name_matches(module: str, target: str) -> bool:
    if _is_regex(target):
        return re.match(target[3:], module) is not None
    return target == module


@dataclass(frozen=True)
class CompressedTensorsGroup:
    """One ``config_groups`` entry. weights / input_activations / output_activations: the
    resolved args dicts (None when absent); format: the effective format (the group's, else
    the config's); preset: the preset scheme name when the group is given as a bare target
    list (a compressed-tensors preset, not resolvable without compressed-tensors)."""

    name: str
    targets: tuple[str, ...]
    weights: dict[str, Any] | None
    input_activations: dict[str, Any] | None
    output_activations: dict[str, Any] | None
    format: str | None
    preset: str | None = None

    def refusal(self) -> str | None:
        """Why lowbit cannot serve modules of this group, or None if it can."""
        where = f"config group {self.name!r}"
        if self.preset is not None:
            return (f"{where} names the preset scheme {self.preset!r} (its args are not in the config); "
                    "give the weights args explicitly")
        if self.weights is None:
            return f"{where} has no weights args (weights are not quantized)"
        if self.input_activations is not None:
            ia = self.input_activations
            return (f"{where}: input_activations must be null (W4A16: activations stay BF16), got "
                    f"{ia.get('type')} {ia.get('num_bits')}-bit (a W{self.weights.get('num_bits')}A"
                    f"{ia.get('num_bits')} scheme)")
        if self.output_activations is not None:
            return f"{where}: output_activations must be null"
        if self.format != CT_PACK_QUANTIZED:
            return f"{where}: format must be {CT_PACK_QUANTIZED!r}, got {self.format!r}"
        try:
            check_compressed_tensors_scheme(self.weights, f"{where} weights")
        except FormatError as exc:
            return str(exc)
        return None


@dataclass(frozen=True)
class CompressedTensorsInt4(QuantScheme):
    """compressed-tensors ``pack-quantized`` INT4 group-32 symmetric (module docstring).

    groups: the parsed config groups; ignore: the ``ignore`` entries; format: the top-level
    format; kv_cache_scheme: as given (not used by the expert weights); group_size: 32.
    """

    groups: tuple[CompressedTensorsGroup, ...]
    ignore: tuple[str, ...]
    format: str | None
    kv_cache_scheme: Mapping[str, Any] | None = None
    source: str = ""
    method: str = CT_METHOD
    group_size: int = INT4_GROUP
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def _target_order(self) -> list[tuple[str, CompressedTensorsGroup]]:
        # a target named by two groups belongs to the later one (compressed-tensors keeps one
        # scheme per target); exact names first, then regexes, each sorted, then class names
        owner: dict[str, CompressedTensorsGroup] = {}
        for group in self.groups:
            for target in group.targets:
                owner[target] = group
        named = sorted((t for t in owner if not _is_class_name(t)), key=lambda t: (_is_regex(t), t))
        classes = [t for t in owner if _is_class_name(t)]
        return [(t, owner[t]) for t in named + classes]

    def _ignored(self, module: str) -> bool:
        return any(_name_matches(module, ign) or ign == "Linear" for ign in self.ignore)

    def group_for(self, module: str) -> CompressedTensorsGroup | None:
        """The config group that quantizes the linear layer `module`, or None when no group
        targets it or ``ignore`` excludes it. A module matched only by a class target other
        than ``Linear`` raises `FormatError` (undecidable without the model)."""
        if module in self._cache:
            return self._cache[module]
        found, unknown = None, []
        for target, group in self._target_order:
            if _is_class_name(target):
                if target == "Linear":
                    found = group
                    break
                unknown.append(target)
            elif _name_matches(module, target):
                found = group
                break
        if found is None and unknown:
            raise FormatError(f"{self.source}: cannot tell whether module {module!r} is quantized: it matches no "
                              f"name or regex target, and class target(s) {unknown} need the model's classes")
        if found is not None and self._ignored(module):
            found = None
        self._cache[module] = found
        return found

    def is_quantized(self, module: str) -> bool:
        return self.group_for(module) is not None

    def check_experts(self, modules: Iterable[str]) -> None:
        for module in modules:
            group = self.group_for(module)
            if group is None:
                why = "listed in ignore" if self._ignored(module) else "targeted by no config group"
                raise FormatError(f"{self.source}: routed expert {module!r} is not quantized ({why}); lowbit's "
                                  "expert loader takes INT4 group-32 experts from a compressed-tensors checkpoint")
            refusal = group.refusal()
            if refusal is not None:
                raise FormatError(f"{self.source}: routed expert {module!r}: {refusal}")


def _ct_args(value: Any, where: str) -> dict[str, Any] | None:
    if value is None:
        return None
    return resolve_compressed_tensors_args(value, where)


def _parse_compressed_tensors(cfg: Mapping[str, Any], source: str) -> CompressedTensorsInt4:
    unknown = sorted(set(cfg) - _CT_CONFIG_KEYS)
    if unknown:
        raise FormatError(f"{source}: unknown compressed-tensors config key(s) {unknown}")
    status = cfg.get("quantization_status")
    if status is not None and status != "compressed":
        raise FormatError(f"{source}: quantization_status must be 'compressed' (weights stored packed), got {status!r}")
    for key in ("sparsity_config", "transform_config"):
        if cfg.get(key):
            what = "sparse storage" if key == "sparsity_config" else "weight transforms (rotations)"
            raise FormatError(f"{source}: {key} is set ({cfg[key]!r}): {what} change what the stored weights mean, "
                              "and are not supported")
    if cfg.get("moe_sparsity_config") is not None:
        raise FormatError(f"{source}: moe_sparsity_config is set (pruned or merged experts renumber them): "
                          "not supported")
    top_format = cfg.get("format")
    groups_cfg = cfg.get("config_groups")
    if not isinstance(groups_cfg, Mapping) or not groups_cfg:
        raise FormatError(f"{source}: config_groups must be a non-empty object, got {groups_cfg!r}")
    groups = []
    for name, g in groups_cfg.items():
        where = f"{source}: config group {name!r}"
        if isinstance(g, list):  # compressed-tensors: a preset scheme name mapped to its targets
            groups.append(CompressedTensorsGroup(name, tuple(map(str, g)), None, None, None, top_format, preset=name))
            continue
        if not isinstance(g, Mapping):
            raise FormatError(f"{where}: expected an object or a target list, got {type(g).__name__}")
        extra = sorted(set(g) - _CT_GROUP_KEYS)
        if extra:
            raise FormatError(f"{where}: unknown key(s) {extra}; known: {sorted(_CT_GROUP_KEYS)}")
        targets = g.get("targets")
        if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
            raise FormatError(f"{where}: targets must be a list of strings, got {targets!r}")
        groups.append(CompressedTensorsGroup(
            name=name,
            targets=tuple(targets),
            weights=_ct_args(g.get("weights"), f"{where} weights"),
            input_activations=_ct_args(g.get("input_activations"), f"{where} input_activations"),
            output_activations=_ct_args(g.get("output_activations"), f"{where} output_activations"),
            format=g.get("format") or top_format,
        ))
    ignore = cfg.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(t, str) for t in ignore):
        raise FormatError(f"{source}: ignore must be a list of strings, got {ignore!r}")
    for pattern in [t for g in groups for t in g.targets] + ignore:
        if _is_regex(pattern):
            try:
                re.compile(pattern[3:])
            except re.error as exc:
                raise FormatError(f"{source}: bad regular expression {pattern!r}: {exc}") from None
    return CompressedTensorsInt4(tuple(groups), tuple(ignore), top_format, cfg.get("kv_cache_scheme"), source)


# -- DeepSeek FP8 block -------------------------------------------------------------------
_FP8_CONFIG_KEYS = {"quant_method", "fmt", "activation_scheme", "weight_block_size", "scale_fmt",
                    "modules_to_not_convert", "ignored_layers", "dequantize"}


@dataclass(frozen=True)
class Fp8Block(QuantScheme):
    """DeepSeek FP8 128x128 block weights (module docstring).

    block: ``(128, 128)``; scale_fmt: None (FP32 scales) or ``"ue8m0"`` (powers of two);
    not_converted: module-name substrings left unquantized (``modules_to_not_convert``).
    """

    block: tuple[int, int] = FP8_BLOCK
    scale_fmt: str | None = None
    not_converted: tuple[str, ...] = ()
    source: str = ""
    method: str = "fp8"

    def is_quantized(self, module: str) -> bool:
        return not any(key in module for key in self.not_converted)

    def check_experts(self, modules: Iterable[str]) -> None:
        for module in modules:
            if not self.is_quantized(module):
                raise FormatError(f"{self.source}: routed expert {module!r} is in modules_to_not_convert "
                                  "(not quantized): not supported by the expert loader")


def _parse_fp8(cfg: Mapping[str, Any], source: str) -> Fp8Block:
    unknown = sorted(set(cfg) - _FP8_CONFIG_KEYS)
    if unknown:
        raise FormatError(f"{source}: unknown FP8 config key(s) {unknown}; known: {sorted(_FP8_CONFIG_KEYS)}")
    fmt = cfg.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise FormatError(f"{source}: fmt must be 'e4m3', got {fmt!r}")
    act = cfg.get("activation_scheme", "dynamic")
    if act != "dynamic":
        raise FormatError(f"{source}: activation_scheme must be 'dynamic' (per-token-group activation scales "
                          f"computed at run time), got {act!r}")
    block = cfg.get("weight_block_size")
    if block is None or list(block) != list(FP8_BLOCK):
        raise FormatError(f"{source}: weight_block_size must be {list(FP8_BLOCK)} (128x128 block scales), "
                          f"got {block!r}")
    scale_fmt = cfg.get("scale_fmt")
    if scale_fmt not in (None, "ue8m0"):
        raise FormatError(f"{source}: scale_fmt must be null or 'ue8m0', got {scale_fmt!r}")
    keep = list(cfg.get("modules_to_not_convert") or []) + list(cfg.get("ignored_layers") or [])
    if not all(isinstance(k, str) for k in keep):
        raise FormatError(f"{source}: modules_to_not_convert / ignored_layers must be lists of strings")
    return Fp8Block(FP8_BLOCK, scale_fmt, tuple(keep), source)


# -- NVIDIA ModelOpt NVFP4 ----------------------------------------------------------------
@dataclass(frozen=True)
class ModelOptNvfp4(QuantScheme):
    """NVIDIA ModelOpt NVFP4 (module docstring): ``weight`` uint8 E2M1 pairs, ``weight_scale``
    E4M3 per 16, ``weight_scale_2`` FP32 per tensor (the second-level scale: element =
    e2m1 * weight_scale * weight_scale_2; compressed-tensors stores its reciprocal as
    ``weight_global_scale``), ``input_scale`` FP32 per tensor.

    exclude: glob patterns of unquantized modules; kv_cache_quant_algo: as given;
    producer: the ``producer`` entry.
    """

    exclude: tuple[str, ...] = ()
    group_size: int = NVFP4_GROUP
    kv_cache_quant_algo: str | None = None
    producer: Mapping[str, Any] | None = None
    source: str = ""
    method: str = "modelopt"

    def is_quantized(self, module: str) -> bool:
        return not any(fnmatch.fnmatchcase(module, pat) for pat in self.exclude)

    def check_experts(self, modules: Iterable[str]) -> None:
        for module in modules:
            if not self.is_quantized(module):
                raise FormatError(f"{self.source}: routed expert {module!r} matches exclude_modules (not quantized): "
                                  "not supported by the expert loader")


def _parse_modelopt(quant: Mapping[str, Any], producer: Any, source: str) -> ModelOptNvfp4:
    algo = quant.get("quant_algo")
    if algo != "NVFP4":
        raise FormatError(f"{source}: quant_algo must be 'NVFP4', got {algo!r}")
    group = quant.get("group_size", NVFP4_GROUP)
    if group != NVFP4_GROUP:
        raise FormatError(f"{source}: NVFP4 group_size must be {NVFP4_GROUP}, got {group!r}")
    exclude = quant.get("exclude_modules") or quant.get("ignore") or []
    if not isinstance(exclude, list) or not all(isinstance(t, str) for t in exclude):
        raise FormatError(f"{source}: exclude_modules must be a list of strings, got {exclude!r}")
    return ModelOptNvfp4(tuple(exclude), NVFP4_GROUP, quant.get("kv_cache_quant_algo"),
                         producer if isinstance(producer, Mapping) else None, source)


# -- entry point --------------------------------------------------------------------------
def parse_scheme(
    quantization_config: Mapping[str, Any] | None,
    modelopt_config: Mapping[str, Any] | None = None,
    source: str = "config.json",
    modelopt_source: str = "hf_quant_config.json",
) -> QuantScheme:
    """The scheme of a checkpoint from its ``quantization_config`` (config.json) and its
    ModelOpt ``hf_quant_config.json`` (either may be None). Unsupported or contradictory
    configs raise `FormatError` naming the file and the field."""
    src = f"{source}: quantization_config"
    if modelopt_config is not None:
        quant = modelopt_config.get("quantization")
        if not isinstance(quant, Mapping):
            raise FormatError(f"{modelopt_source}: expected a 'quantization' object, got {quant!r}")
        method = (quantization_config or {}).get("quant_method", "modelopt")
        if method != "modelopt":
            raise FormatError(f"{modelopt_source} (ModelOpt) and {src} (quant_method {method!r}) disagree")
        return _parse_modelopt(quant, modelopt_config.get("producer"), f"{modelopt_source}: quantization")
    if quantization_config is None:
        return Unquantized(source=source)
    if not isinstance(quantization_config, Mapping):
        raise FormatError(f"{src}: expected an object, got {type(quantization_config).__name__}")
    method = quantization_config.get("quant_method")
    if method == CT_METHOD:
        return _parse_compressed_tensors(quantization_config, src)
    if method == "fp8":
        return _parse_fp8(quantization_config, src)
    if method == "modelopt":
        quant = quantization_config.get("quantization", quantization_config)
        return _parse_modelopt(quant, quantization_config.get("producer"), src)
    raise FormatError(f"{src}: unsupported quant_method {method!r}; lowbit reads 'compressed-tensors' "
                      "(pack-quantized INT4 group 32), 'fp8' (128x128 blocks) and ModelOpt NVFP4")
