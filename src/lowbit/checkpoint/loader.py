"""`Checkpoint`: a Hugging Face model directory opened for lowbit (see the package docstring)."""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch

from ..formats.base import FormatError
from ..formats.fp8 import e8m0_decode
from .directory import CheckpointDirectory, TensorInfo, check_tensor
from .experts import (
    ExpertNaming,
    detect_expert_format,
    detect_expert_naming,
    expert_ids,
    load_experts,
)
from .layers import LayerPlan, layer_plan, text_config
from .schemes import CompressedTensorsInt4, Fp8Block, ModelOptNvfp4, QuantScheme, Unquantized, parse_scheme

__all__ = ["Checkpoint", "open_checkpoint"]

# which stored expert formats each scheme may hold
_SCHEME_EXPERT_FORMATS = {
    CompressedTensorsInt4: ("int4_g32",),
    Fp8Block: ("fp8_block", "mxfp4"),
    ModelOptNvfp4: ("nvfp4",),
    Unquantized: ("dense",),
}
_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FP4_BYTE_DTYPES = tuple(d for d in (torch.int8, torch.uint8, getattr(torch, "float4_e2m1fn_x2", None)) if d)


class Checkpoint:
    """A model directory, its config and quantization scheme validated, tensors read lazily.

    Attributes: ``path``; ``config`` (config.json as a dict); ``text_config`` (the language
    model's part: ``config["text_config"]`` where nested, else ``config``); ``scheme`` (a
    `lowbit.checkpoint.schemes.QuantScheme`); ``layers`` (a `LayerPlan`: ``.moe`` and
    ``.dense`` layer indices); ``expert_format`` (``"int4_g32"``, ``"mxfp4"``, ``"nvfp4"``,
    ``"fp8_block"``, ``"dense"``, or None without routed experts); ``num_experts``,
    ``hidden_size``, ``moe_intermediate_size``; ``progress`` (the default for loads: None =
    a bar when stderr is a terminal, True / False = always / never).
    """

    def __init__(self, path: str | os.PathLike, *, progress: bool | None = None):
        self.directory = CheckpointDirectory(path)
        self.path = self.directory.path
        self.config: dict[str, Any] = self.directory.config
        self.text_config: Mapping[str, Any] = text_config(self.config)
        self.progress = progress
        config_file = str(self.path / "config.json")
        qcfg = self.config.get("quantization_config", self.text_config.get("quantization_config"))
        self.scheme: QuantScheme = parse_scheme(qcfg, self.directory.modelopt_config, config_file,
                                                str(self.path / "hf_quant_config.json"))
        self._naming: ExpertNaming | None = detect_expert_naming(self.directory.names())
        self.layers: LayerPlan = layer_plan(self.text_config, self._naming.layers if self._naming else (),
                                            config_file)
        self.num_experts: int | None = self.layers.num_experts
        self.hidden_size: int | None = self.text_config.get("hidden_size")
        self.moe_intermediate_size: int | None = self.text_config.get("moe_intermediate_size")
        self.expert_format: str | None = None
        if self._naming is not None:
            self.scheme.check_experts(self._naming.modules())
            self.expert_format = detect_expert_format(self.directory, self._naming)
            allowed = _SCHEME_EXPERT_FORMATS[type(self.scheme)]
            if self.expert_format not in allowed:
                raise FormatError(f"{self.path}: the routed experts are stored as {self.expert_format}, which a "
                                  f"{self.scheme.method!r} scheme does not describe (expected {' or '.join(allowed)})")
        elif self.layers.moe:
            raise FormatError(f"{config_file}: the config declares MoE layers {list(self.layers.moe[:4])}..., but "
                              "the checkpoint holds no routed-expert tensors")

    def __repr__(self) -> str:
        return (f"<lowbit Checkpoint {str(self.path)!r} scheme={self.scheme.method} experts={self.expert_format} "
                f"layers={len(self.layers)} moe={len(self.layers.moe)}>")

    # -- tensors --------------------------------------------------------------------------
    def tensor_names(self) -> list[str]:
        """Every tensor name in the checkpoint."""
        return self.directory.names()

    def tensor_info(self, name: str) -> TensorInfo:
        """dtype, shape and shard of tensor `name` (from the shard's header; no data read)."""
        return self.directory.info(name)

    def tensor(self, name: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """Tensor `name` as stored, on `device` (only it is read from its shard)."""
        return self.directory.read([name], device=device)[name]

    # -- routed experts -------------------------------------------------------------------
    def experts(
        self,
        layer: int,
        experts: Any = None,
        device: torch.device | str = "cpu",
        *,
        profile: str = "indexed",
        progress: bool | None = None,
    ):
        """The routed experts of MoE layer `layer`, prepared: ``(w13, w2)``, w13 ``[E, 2I, H]``
        (gate rows, then up rows), w2 ``[E, H, I]``.

        experts: None (all ``num_experts``), or the global expert ids to load, in the order
            wanted (expert parallelism: a rank loads its own; local index j of the result is
            expert ``experts[j]``).
        device: where the weights are built (each expert is converted there).
        profile: the W4A16 kernel family for INT4 weights (``"indexed"`` for `moe_experts`).
        progress: overrides ``self.progress`` for this load.
        Returns, by ``expert_format``: int4_g32 -> two `W4A16Weight` (``moe_experts``-ready);
        fp8_block -> two `Mxfp8ExpertWeight` (``moe_experts``-ready); mxfp4 / nvfp4 -> two
        logical ``QuantizedTensor`` (lowbit has no FP4 expert kernel; nvfp4's global_scale is
        per row, ``[E, N, 1]``). See `lowbit.checkpoint.experts` for the stored forms.
        """
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise TypeError(f"layer must be an int, got {type(layer).__name__}")
        if self._naming is None:
            raise FormatError(f"{self.path}: the checkpoint holds no routed experts")
        if layer not in self._naming.layers:
            kind = "a dense layer" if layer in self.layers.dense else "not a layer with routed experts"
            raise ValueError(f"layer {layer} is {kind} of this checkpoint; MoE layers: "
                             f"{list(self.layers.moe) or list(self._naming.layers)}")
        ids = expert_ids(experts, self.num_experts, self._naming.layers[layer], layer)
        hidden, inter = self._expert_dims(layer)
        return load_experts(self.directory, self._naming, self.expert_format, layer, ids, hidden, inter,
                            device=device, profile=profile,
                            progress=self.progress if progress is None else progress)

    def _expert_dims(self, layer: int) -> tuple[int, int]:
        """(H, I) from the config, or from expert 0's gate weight when the config lacks them."""
        hidden, inter = self.hidden_size, self.moe_intermediate_size
        if isinstance(hidden, int) and isinstance(inter, int):
            return hidden, inter
        module = self._naming.module(layer, self._naming.layers[layer][0], "gate")
        if self.expert_format == "int4_g32":
            ws = self.tensor(f"{module}.weight_shape").flatten().tolist()
            return int(ws[1]), int(ws[0])
        info = self.directory.info(f"{module}.weight")
        n, k = info.shape
        return (k * 2 if self.expert_format in ("mxfp4", "nvfp4") else k), n

    # -- dense linear weights -------------------------------------------------------------
    def linear_weight(self, name: str, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weight of linear layer `name` (a module name, or its ``.weight`` tensor name) in
        the form ``lowbit.linear(x, weight, scale)`` takes:

        - FP8 (``weight`` E4M3 ``[N, K]`` with ``weight_scale_inv``, or ``scale`` FP32 / E8M0,
          per 128x128 block): ``(weight, scale float32 [ceil(N/128), ceil(K/128)])``;
        - MXFP4 (``weight`` int8 / uint8 / float4_e2m1fn_x2 ``[N, K/2]`` with ``scale`` E8M0
          ``[N, K/32]``): ``(weight uint8 [N, K/2], scale uint8 [N, K/32])``;
        - unquantized (bf16 / fp16 / fp32): ``(weight, None)``.
        Other stored forms raise `FormatError`."""
        module = name[: -len(".weight")] if name.endswith(".weight") else name
        wname = f"{module}.weight"
        if wname not in self.directory:
            if f"{module}.weight_packed" in self.directory:
                raise FormatError(f"{self.directory.info(module + '.weight_packed').where()}: a compressed-tensors "
                                  "INT4 weight is not a linear() weight (linear() takes FP8, MXFP4 or float weights)")
            self.directory.file_of(wname)  # raises: missing tensor
        info = self.directory.info(wname)
        if info.dtype in _FLOAT_DTYPES:
            return self.tensor(wname, device), None
        if info.dtype == torch.float8_e4m3fn:
            return self._fp8_linear(module, info, device)
        if info.dtype in _FP4_BYTE_DTYPES:
            return self._fp4_linear(module, info, device)
        raise FormatError(f"{info.where()}: weight dtype {info.dtype_name} is not a linear() weight "
                          "(FP8 E4M3, packed MXFP4 or float)")

    def _fp8_linear(self, module: str, info: TensorInfo, device):
        if len(info.shape) != 2:
            raise FormatError(f"{info.where()}: weight must be 2-D [N, K], got {list(info.shape)}")
        n, k = info.shape
        want = (-(-n // 128), -(-k // 128))
        for p, dtypes in (("weight_scale_inv", (torch.float32,)),
                          ("scale", (torch.float32, torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8)))):
            sname = f"{module}.{p}"
            if sname in self.directory:
                check_tensor(self.directory.info(sname), p, dtypes, want)
                got = self.directory.read([f"{module}.weight", sname], device=device)
                scale = got[sname]
                if scale.dtype != torch.float32:
                    scale = e8m0_decode(scale)
                if not bool(torch.isfinite(scale).all()):
                    raise FormatError(f"{self.directory.info(sname).where()}: {p} holds non-finite scales")
                return got[f"{module}.weight"], scale
        raise FormatError(f"{self.directory.index_file or self.path}: missing tensor {module + '.weight_scale_inv'!r} "
                          "(FP8 weight without its 128x128 block scales)")

    def _fp4_linear(self, module: str, info: TensorInfo, device):
        if len(info.shape) != 2:
            raise FormatError(f"{info.where()}: weight must be 2-D [N, K/2], got {list(info.shape)}")
        n, k_half = info.shape
        sname = f"{module}.scale"
        if sname not in self.directory:
            if f"{module}.weight_scale_2" in self.directory:
                raise FormatError(f"{info.where()}: a ModelOpt NVFP4 weight is not a linear() weight (linear() takes "
                                  "MXFP4: E8M0 scales per 32)")
            self.directory.file_of(sname)
        check_tensor(self.directory.info(sname), "scale", (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8)),
                     (n, k_half * 2 // 32))
        got = self.directory.read([f"{module}.weight", sname], device=device)
        scale = got[sname]
        scale = scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale
        if bool((scale == 255).any()):
            raise FormatError(f"{self.directory.info(sname).where()}: E8M0 scale byte 255 (NaN)")
        return got[f"{module}.weight"].view(torch.uint8), scale


def open_checkpoint(path: str | os.PathLike, *, progress: bool | None = None) -> Checkpoint:
    """Open a Hugging Face model directory (`Checkpoint`): reads config.json (and
    hf_quant_config.json), the safetensors index or shard headers' names, parses and validates
    the quantization scheme against every routed expert; no tensor data is read.
    progress: None (a bar on long loads when stderr is a terminal), True or False."""
    return Checkpoint(path, progress=progress)
