"""Routed experts of one MoE layer, read expert by expert and assembled for the kernels.

Names (detected from the checkpoint's tensor names, any prefix such as ``model.`` or
``language_model.model.``): ``{prefix}layers.L.{mlp|ffn}.experts.E.{proj}.{param}`` with
``proj`` in ``gate_proj / up_proj / down_proj`` (Hugging Face) or ``w1 / w3 / w2`` (DeepSeek's
own names: w1 gate, w3 up, w2 down).

Stored forms (per expert and projection, a ``[N, K]`` weight: gate / up ``[I, H]``, down
``[H, I]``) and what `load_experts` returns for ``(w13 [E, 2I, H], w2 [E, H, I])``, gate rows
then up rows:

==========  ==================================================  ===========================
format      tensors                                             returned
==========  ==================================================  ===========================
int4_g32    compressed-tensors ``weight_packed`` int32           `W4A16Weight` (pack_w4a16,
            ``[N, K/8]``, ``weight_scale`` bf16 ``[N, K/32]``,   ready for ``moe_experts``)
            ``weight_shape`` int64 ``(N, K)``
mxfp4       ``weight`` int8 / uint8 / float4_e2m1fn_x2           ``QuantizedTensor`` mxfp4:
            ``[N, K/2]`` (element 2j in the low nibble),         codes uint8 ``[E, N, K]``,
            ``scale`` float8_e8m0fnu / uint8 ``[N, K/32]``       scales uint8 E8M0
nvfp4       ModelOpt ``weight`` uint8 ``[N, K/2]``,              ``QuantizedTensor`` nvfp4,
            ``weight_scale`` E4M3 ``[N, K/16]``,                 global_scale FP32
            ``weight_scale_2`` FP32 scalar, ``input_scale``      ``[E, N, 1]`` (each row its
                                                                 projection's weight_scale_2)
fp8_block   ``weight`` E4M3 ``[N, K]``, ``weight_scale_inv``     `Mxfp8ExpertWeight` (exact:
            FP32 (or ``scale`` FP32 / E8M0) per 128x128 block    only power-of-two scales)
==========  ==================================================  ===========================

The DeepSeek-V4 MXFP4 names (``layers.L.ffn.experts.E.w1.weight`` int8 with ``w1.scale``
float8_e8m0fnu) are those of DeepSeek's published V4 checkpoints as third-party tooling lists
them; no such checkpoint was at hand to confirm them.

Every tensor's dtype and shape is checked against the config's ``hidden_size`` /
``moe_intermediate_size`` from the shard headers before any data is read; then experts are
read and converted one at a time on the target device, so the only intermediates are one
expert's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from ..formats.base import FormatError, QuantizedTensor
from ..formats.fp8 import e8m0_decode, e8m0_encode, is_power_of_two
from ..formats.fp4 import unpack_fp4
from ..formats.int4 import INT4_GROUP, from_compressed_tensors
from ..formats.moe_mxfp8 import Mxfp8ExpertWeight
from ..formats.w4a16 import LAYOUT_K256_GROUP_NIBBLES, PACK_K, PROFILES, W4A16Weight, pack_w4a16
from .directory import CheckpointDirectory, TensorInfo, check_tensor
from .progress import Progress

__all__ = ["ExpertNaming", "EXPERT_FORMATS", "detect_expert_naming", "detect_expert_format", "load_experts",
           "expert_ids"]

EXPERT_FORMATS = ("int4_g32", "mxfp4", "nvfp4", "fp8_block", "dense")
ROLES = ("gate", "up", "down")
_PROJ_FAMILIES = {
    "hf": {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"},
    "deepseek": {"gate": "w1", "up": "w3", "down": "w2"},
}
_EXPERT_NAME = re.compile(
    r"^(?P<prefix>(?:.*\.)?)layers\.(?P<layer>\d+)\.(?P<block>mlp|ffn)\.experts\.(?P<expert>\d+)\."
    r"(?P<proj>gate_proj|up_proj|down_proj|w1|w2|w3)\.(?P<param>[A-Za-z0-9_]+)$"
)
_FP4_BYTE_DTYPES = tuple(d for d in (torch.int8, torch.uint8, getattr(torch, "float4_e2m1fn_x2", None)) if d)
_E8M0_DTYPES = tuple(d for d in (getattr(torch, "float8_e8m0fnu", None), torch.uint8) if d)
_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FP8_BLOCK = 128


@dataclass(frozen=True)
class ExpertNaming:
    """How a checkpoint names its routed experts (module docstring). layers: layer -> the
    expert ids present."""

    prefix: str
    block: str
    family: str
    layers: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def module(self, layer: int, expert: int, role: str) -> str:
        return f"{self.prefix}layers.{layer}.{self.block}.experts.{expert}.{_PROJ_FAMILIES[self.family][role]}"

    def modules(self) -> Iterable[str]:
        for layer, ids in self.layers.items():
            for e in ids:
                for role in ROLES:
                    yield self.module(layer, e, role)


def detect_expert_naming(names: Iterable[str]) -> ExpertNaming | None:
    """The routed-expert naming of a checkpoint from its tensor names (None: no experts).
    Where names follow several schemes (an MTP head, a vision tower), the one with the most
    tensors wins."""
    found: dict[tuple[str, str, str], dict[int, set[int]]] = {}
    counts: dict[tuple[str, str, str], int] = {}
    for name in names:
        m = _EXPERT_NAME.match(name)
        if m is None:
            continue
        family = "hf" if m["proj"].endswith("_proj") else "deepseek"
        key = (m["prefix"], m["block"], family)
        found.setdefault(key, {}).setdefault(int(m["layer"]), set()).add(int(m["expert"]))
        counts[key] = counts.get(key, 0) + 1
    if not found:
        return None
    key = max(counts, key=lambda k: (counts[k], k))
    layers = {layer: tuple(sorted(ids)) for layer, ids in sorted(found[key].items())}
    return ExpertNaming(*key, layers=layers)


def detect_expert_format(directory: CheckpointDirectory, naming: ExpertNaming) -> str:
    """One of `EXPERT_FORMATS`, from the tensors of the first expert's gate projection."""
    layer = next(iter(naming.layers))
    module = naming.module(layer, naming.layers[layer][0], "gate")
    has = {p for p in ("weight_packed", "weight", "scale", "weight_scale", "weight_scale_2", "weight_scale_inv")
           if f"{module}.{p}" in directory}
    if "weight_packed" in has:
        return "int4_g32"
    if "weight" not in has:
        raise FormatError(f"{directory.path}: expert {module!r} has neither 'weight' nor 'weight_packed'")
    w = directory.info(f"{module}.weight")
    if w.dtype == torch.float8_e4m3fn:
        return "fp8_block"
    if w.dtype in _FP4_BYTE_DTYPES:
        if "weight_scale_2" in has:
            return "nvfp4"
        if "scale" in has:
            return "mxfp4"
        raise FormatError(f"{w.where()}: a packed 4-bit weight needs 'scale' (MXFP4, E8M0 per 32) or "
                          "'weight_scale' + 'weight_scale_2' (ModelOpt NVFP4)")
    if w.dtype in _FLOAT_DTYPES:
        return "dense"
    raise FormatError(f"{w.where()}: unsupported expert weight dtype {w.dtype_name}")


def expert_ids(experts: Any, num_experts: int | None, present: Sequence[int], layer: int) -> list[int]:
    """The global expert ids asked for, validated: None -> all (``range(num_experts)``, or the
    ones present when the config gives no count); else a sequence / range / 1-D integer tensor of
    distinct ids in ``[0, num_experts)``."""
    if experts is None:
        return list(range(num_experts)) if num_experts else list(present)
    if isinstance(experts, torch.Tensor):
        if experts.dim() != 1 or experts.dtype.is_floating_point or experts.dtype == torch.bool:
            raise TypeError(f"experts must be a 1-D integer tensor, got {experts.dtype} {tuple(experts.shape)}")
        experts = experts.tolist()
    if isinstance(experts, (str, bytes)) or not isinstance(experts, Iterable):
        raise TypeError(f"experts must be None or a sequence of expert ids, got {type(experts).__name__}")
    ids = list(experts)
    for e in ids:
        if not isinstance(e, int) or isinstance(e, bool):
            raise TypeError(f"experts must hold integer ids, got {e!r} ({type(e).__name__})")
    if not ids:
        raise ValueError("experts is empty: ask for at least one expert")
    if len(set(ids)) != len(ids):
        dup = sorted({e for e in ids if ids.count(e) > 1})
        raise ValueError(f"experts has duplicate ids {dup}")
    bound = num_experts if num_experts else None
    bad = [e for e in ids if e < 0 or (bound is not None and e >= bound)]
    if bad:
        raise ValueError(f"layer {layer}: expert ids {bad[:8]} out of range [0, {bound})")
    return ids


# -- per-format tensor plans --------------------------------------------------------------
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _params(fmt: str, n: int, k: int) -> list[tuple[str, tuple, tuple | None, bool]]:
    """(param, dtypes, shape, required) of one projection's tensors for a ``[n, k]`` weight."""
    if fmt == "int4_g32":
        return [("weight_packed", (torch.int32,), (n, k // 8), True),
                ("weight_scale", (torch.bfloat16,), (n, k // INT4_GROUP), True),
                ("weight_shape", (torch.int64, torch.int32), (2,), True)]
    if fmt == "mxfp4":
        return [("weight", _FP4_BYTE_DTYPES, (n, k // 2), True), ("scale", _E8M0_DTYPES, (n, k // 32), True)]
    if fmt == "nvfp4":
        return [("weight", (torch.uint8,), (n, k // 2), True),
                ("weight_scale", (torch.float8_e4m3fn,), (n, k // 16), True),
                ("weight_scale_2", (torch.float32,), None, True),
                ("input_scale", (torch.float32,), None, False)]
    if fmt == "fp8_block":
        return [("weight", (torch.float8_e4m3fn,), (n, k), True)]
    raise FormatError(f"no expert loader for format {fmt!r}")


def _fp8_scale_param(directory: CheckpointDirectory, module: str) -> str:
    for p in ("weight_scale_inv", "scale"):
        if f"{module}.{p}" in directory:
            return p
    raise FormatError(f"{directory.index_file or directory.path}: missing tensor {module + '.weight_scale_inv'!r} "
                      "(FP8 block weight without its block scales)")


def _scalar(info: TensorInfo, field_name: str) -> None:
    if info.dtype != torch.float32 or info.shape not in ((), (1,)):
        raise FormatError(f"{info.where()}: {field_name} must be one float32 value, got {info.dtype_name} "
                          f"{list(info.shape)}")


_FORBIDDEN = {"int4_g32": ("weight_zero_point", "weight_g_idx")}


def _plan(directory: CheckpointDirectory, naming: ExpertNaming, fmt: str, layer: int, ids: list[int],
          hidden: int, inter: int) -> list[dict[str, dict[str, str]]]:
    """For each expert, role -> param -> tensor name, every tensor checked (dtype, shape)
    from its shard header."""
    plan = []
    for e in ids:
        roles = {}
        for role in ROLES:
            module = naming.module(layer, e, role)
            n, k = (inter, hidden) if role != "down" else (hidden, inter)
            names = {}
            for p in _FORBIDDEN.get(fmt, ()):
                if f"{module}.{p}" in directory:
                    info = directory.info(f"{module}.{p}")
                    why = ("an asymmetric (zero-point) INT4 weight is not supported" if p == "weight_zero_point"
                           else "activation-reordered groups are not supported")
                    raise FormatError(f"{info.where()}: {p} present: {why}")
            for p, dtypes, shape, required in _params(fmt, n, k):
                name = f"{module}.{p}"
                if not required and name not in directory:
                    continue
                info = directory.info(name)
                if shape is None:
                    _scalar(info, p)
                else:
                    check_tensor(info, p, dtypes, shape)
                names[p] = name
            if fmt == "fp8_block":
                p = _fp8_scale_param(directory, module)
                info = directory.info(f"{module}.{p}")
                dtypes = (torch.float32,) if p == "weight_scale_inv" else (torch.float32, *_E8M0_DTYPES)
                check_tensor(info, p, dtypes, (_cdiv(n, _FP8_BLOCK), _cdiv(k, _FP8_BLOCK)))
                names["block_scale"] = f"{module}.{p}"
            roles[role] = names
        plan.append(roles)
    return plan


# -- per-format conversion of one expert --------------------------------------------------
def _e8m0_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _check_e8m0(scales: torch.Tensor, name: str) -> None:
    if bool((scales == 255).any()):
        raise FormatError(f"tensor {name!r}: E8M0 scale byte 255 (NaN)")


def _int4_projection(t: dict[str, torch.Tensor], names: dict[str, str], n: int, k: int) -> QuantizedTensor:
    ws = [int(v) for v in t["weight_shape"].flatten().tolist()]
    if ws != [n, k]:
        raise FormatError(f"tensor {names['weight_shape']!r}: weight_shape {ws} does not match the expected "
                          f"[N, K] = {[n, k]}")
    try:
        return from_compressed_tensors(t["weight_packed"], t["weight_scale"], t["weight_shape"])
    except FormatError as exc:
        raise FormatError(f"tensor {names['weight_packed']!r}: {exc}") from None


def _fp8_to_mxfp8_scales(block_scale: torch.Tensor, name: str, n: int, k: int) -> torch.Tensor:
    """128x128 block scales ``[ceil(n/128), ceil(k/128)]`` -> E8M0 bytes ``[n, k/32]``: the
    same power of two for every 1x32 group of a block (exact; other scales raise)."""
    s = e8m0_decode(_e8m0_bytes(block_scale)) if block_scale.dtype != torch.float32 else block_scale
    if not bool(is_power_of_two(s).all()):
        bad = s[~is_power_of_two(s)].flatten()[:3].tolist()
        raise FormatError(f"tensor {name!r}: FP8 block scales {bad} are not powers of two, so these experts have "
                          "no exact MXFP8 form (the expert kernels' FP8 format); scale_fmt 'ue8m0' checkpoints "
                          "have one")
    if k % 32:
        raise FormatError(f"tensor {name!r}: K={k} is not a multiple of 32 (MXFP8 groups)")
    rows = s.repeat_interleave(_FP8_BLOCK, dim=0)[:n]
    groups = rows.repeat_interleave(_FP8_BLOCK // 32, dim=1)[:, : k // 32]
    return e8m0_encode(groups.contiguous())


class _Assembler:
    """Output buffers for (w13, w2) on the device, filled one expert at a time."""

    def __init__(self, fmt: str, n_experts: int, hidden: int, inter: int, device, profile: str):
        self.fmt, self.e, self.h, self.i, self.device, self.profile = fmt, n_experts, hidden, inter, device, profile
        self.shapes = {"w13": (2 * inter, hidden), "w2": (hidden, inter)}
        self.bufs: dict[str, dict[str, torch.Tensor]] = {}
        for key, (n, k) in self.shapes.items():
            if fmt == "int4_g32":
                kp = _cdiv(k, PACK_K) * PACK_K
                self.bufs[key] = {"qweight": torch.empty(n_experts, n, kp // 8, dtype=torch.int32, device=device),
                                  "scales": torch.empty(n_experts, kp // INT4_GROUP, n, dtype=torch.bfloat16,
                                                        device=device)}
            elif fmt in ("mxfp4", "nvfp4"):
                g, sdt = (32, torch.uint8) if fmt == "mxfp4" else (16, torch.float8_e4m3fn)
                b = {"codes": torch.empty(n_experts, n, k, dtype=torch.uint8, device=device),
                     "scales": torch.empty(n_experts, n, k // g, dtype=sdt, device=device)}
                if fmt == "nvfp4":
                    b["global_scale"] = torch.empty(n_experts, n, 1, dtype=torch.float32, device=device)
                self.bufs[key] = b
            else:  # fp8_block -> mxfp8
                self.bufs[key] = {"codes": torch.empty(n_experts, n, k, dtype=torch.float8_e4m3fn, device=device),
                                  "scales": torch.empty(n_experts, n, k // 32, dtype=torch.uint8, device=device)}

    def put(self, idx: int, t: dict[str, dict[str, torch.Tensor]], names: dict[str, dict[str, str]]) -> None:
        """Convert expert `idx`'s tensors (role -> param -> tensor) into the buffers."""
        h, i = self.h, self.i
        dims = {"gate": (i, h), "up": (i, h), "down": (h, i)}
        parts = {}
        for role in ROLES:
            n, k = dims[role]
            parts[role] = self._projection(t[role], names[role], n, k)
        for key, roles in (("w13", ("gate", "up")), ("w2", ("down",))):
            joined = {f: torch.cat([parts[r][f] for r in roles], dim=0) for f in parts[roles[0]]}
            self._store(key, idx, joined)

    def _projection(self, t, names, n: int, k: int) -> dict[str, torch.Tensor]:
        fmt = self.fmt
        if fmt == "int4_g32":
            q = _int4_projection(t, names, n, k)
            return {"codes": q.codes, "scales": q.scales}
        if fmt == "mxfp4":
            scales = _e8m0_bytes(t["scale"])
            _check_e8m0(scales, names["scale"])
            return {"codes": unpack_fp4(t["weight"].view(torch.uint8)), "scales": scales}
        if fmt == "nvfp4":
            g = t["weight_scale_2"].reshape(())
            if not (bool(torch.isfinite(g)) and float(g) > 0):
                raise FormatError(f"tensor {names['weight_scale_2']!r}: weight_scale_2 must be positive and finite, "
                                  f"got {float(g)}")
            s = t["weight_scale"]
            if not bool(torch.isfinite(s.float()).all()):
                raise FormatError(f"tensor {names['weight_scale']!r}: weight_scale holds NaN")
            return {"codes": unpack_fp4(t["weight"]), "scales": s, "global_scale": g.expand(n, 1)}
        scales = _fp8_to_mxfp8_scales(t["block_scale"], names["block_scale"], n, k)
        return {"codes": t["weight"], "scales": scales}

    def _store(self, key: str, idx: int, p: dict[str, torch.Tensor]) -> None:
        b = self.bufs[key]
        if self.fmt == "int4_g32":
            w = pack_w4a16(QuantizedTensor(p["codes"][None], p["scales"][None], "int4_g32"), profile=self.profile)
            b["qweight"][idx].copy_(w.qweight[0])
            b["scales"][idx].copy_(w.scales[0])
        else:
            for f, v in p.items():
                b[f][idx].copy_(v)

    def result(self):
        out = []
        for key, (n, k) in self.shapes.items():
            b = self.bufs[key]
            if self.fmt == "int4_g32":
                out.append(W4A16Weight(b["qweight"], b["scales"], n, k, LAYOUT_K256_GROUP_NIBBLES, self.profile))
            elif self.fmt == "mxfp4":
                out.append(QuantizedTensor(b["codes"], b["scales"], "mxfp4"))
            elif self.fmt == "nvfp4":
                out.append(QuantizedTensor(b["codes"], b["scales"], "nvfp4", b["global_scale"]))
            else:
                out.append(Mxfp8ExpertWeight(b["codes"], b["scales"]))
        return tuple(out)


def load_experts(
    directory: CheckpointDirectory,
    naming: ExpertNaming,
    fmt: str,
    layer: int,
    ids: list[int],
    hidden: int,
    inter: int,
    *,
    device: torch.device | str = "cpu",
    profile: str = "indexed",
    progress: bool | None = None,
):
    """``(w13, w2)`` of experts `ids` (in that order) of `layer` (module docstring: formats
    and return types). hidden, inter: H and I; profile: the W4A16 kernel family (int4_g32)."""
    if fmt == "dense":
        raise FormatError(f"{directory.path}: the routed experts are stored unquantized; lowbit's expert kernels take "
                          "INT4 group-32 (compressed-tensors) or MXFP8 weights")
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    device = torch.device(device)
    plan = _plan(directory, naming, fmt, layer, ids, hidden, inter)
    total = sum(directory.info(name).nbytes for roles in plan for names in roles.values() for name in names.values())
    asm = _Assembler(fmt, len(ids), hidden, inter, device, profile)
    with Progress(total, f"layer {layer}: {len(ids)} experts", progress) as bar, torch.no_grad():
        for idx, roles in enumerate(plan):
            flat = [name for names in roles.values() for name in names.values()]
            got = directory.read(flat, device=device, on_bytes=bar.update)
            tensors = {role: {p: got[name] for p, name in names.items()} for role, names in roles.items()}
            asm.put(idx, tensors, roles)
    return asm.result()
