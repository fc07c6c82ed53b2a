"""A Hugging Face model directory read lazily: which shard holds which tensor, each tensor's
dtype and shape from the shard's header, and tensors read one by one by name.

Layout it understands: ``config.json`` (required), optionally ``hf_quant_config.json``
(NVIDIA ModelOpt), and the weights as ``model.safetensors.index.json`` plus the shards it
names, or one or more ``*.safetensors`` files without an index.

Nothing is read before it is needed: a shard's header (its table of tensors) is parsed on the
first access to a tensor it holds, and tensor data is read with ``safetensors.safe_open``
(memory-mapped; only the requested tensor is copied out), never a whole shard. The header is
parsed here rather than by safetensors so that a truncated or corrupt shard, a missing shard
or a missing tensor becomes a `FormatError` naming the file and the tensor, and so that
dtypes and shapes can be checked before any data is read.
"""

from __future__ import annotations

import json
import os
import struct
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..formats.base import FormatError

__all__ = ["CheckpointDirectory", "TensorInfo", "SAFETENSORS_DTYPES", "check_tensor", "read_json"]

INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
MODELOPT_CONFIG_NAME = "hf_quant_config.json"

#: safetensors' dtype names -> torch dtypes (names this torch lacks are left out)
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, attr)
    for name, attr in {
        "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
        "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
        "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
        "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
        "F4": "float4_e2m1fn_x2",
    }.items()
    if hasattr(torch, attr)
}
_ITEM_BITS = {"F64": 64, "I64": 64, "U64": 64, "F32": 32, "I32": 32, "U32": 32, "F16": 16, "BF16": 16,
              "I16": 16, "U16": 16, "I8": 8, "U8": 8, "BOOL": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4}
# a header larger than this is not a safetensors header (the format caps it at 100 MB)
_MAX_HEADER_BYTES = 100_000_000


def read_json(path: Path, what: str) -> dict[str, Any]:
    """Parse a JSON object file; unreadable or malformed -> `FormatError` naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{path}: cannot read the {what}: {exc}") from None
    if not isinstance(data, dict):
        raise FormatError(f"{path}: the {what} must be a JSON object, got {type(data).__name__}")
    return data


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its shard's header describes it.

    dtype: the torch dtype (``None`` if this torch has none for `dtype_name`); shape: the
    torch shape (for ``F4``, two elements a byte, the last dim is the byte count).
    """

    name: str
    file: Path
    dtype_name: str
    dtype: torch.dtype | None
    shape: tuple[int, ...]
    nbytes: int

    def where(self) -> str:
        return f"{self.file}: tensor {self.name!r}"


class _Shard:
    """The parsed header of one ``.safetensors`` file."""

    def __init__(self, path: Path):
        self.path = path
        try:
            size = path.stat().st_size
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    raise FormatError(f"{path}: truncated safetensors file ({size} bytes: no header)")
                (n,) = struct.unpack("<Q", head)
                if n > min(size - 8, _MAX_HEADER_BYTES):
                    raise FormatError(f"{path}: truncated or not a safetensors file (header of {n} bytes declared, "
                                      f"file has {size})")
                raw = f.read(n)
        except OSError as exc:
            raise FormatError(f"{path}: cannot read the shard: {exc}") from None
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FormatError(f"{path}: corrupt safetensors header: {exc}") from None
        if not isinstance(header, dict):
            raise FormatError(f"{path}: corrupt safetensors header (not a JSON object)")
        header.pop("__metadata__", None)
        data_size = size - 8 - n
        self.infos: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            try:
                dtype_name, (start, end) = entry["dtype"], entry["data_offsets"]
                shape = tuple(int(d) for d in entry["shape"])
            except (KeyError, TypeError, ValueError):
                raise FormatError(f"{path}: tensor {name!r}: corrupt header entry {entry!r}") from None
            if end > data_size:
                raise FormatError(f"{path}: tensor {name!r}: truncated file (its data ends at byte {end} of the data "
                                  f"section, the file holds {data_size})")
            if dtype_name == "F4" and shape:  # safetensors counts FP4 elements; torch's x2 dtype counts bytes
                shape = (*shape[:-1], shape[-1] // 2)
            dtype = SAFETENSORS_DTYPES.get(dtype_name)
            self.infos[name] = TensorInfo(name, path, dtype_name, dtype, shape, end - start)


class CheckpointDirectory:
    """The files of a Hugging Face model directory and the map tensor name -> shard.

    path: the directory. config: ``config.json``; modelopt_config: ``hf_quant_config.json``
    or None.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_dir():
            raise FormatError(f"{self.path}: not a model directory")
        config_path = self.path / CONFIG_NAME
        if not config_path.is_file():
            raise FormatError(f"{self.path}: no {CONFIG_NAME}")
        self.config = read_json(config_path, "model config")
        mo = self.path / MODELOPT_CONFIG_NAME
        self.modelopt_config = read_json(mo, "ModelOpt quantization config") if mo.is_file() else None
        self._shards: dict[Path, _Shard] = {}
        index = self.path / INDEX_NAME
        if index.is_file():
            self.index_file: Path | None = index
            weight_map = read_json(index, "safetensors index").get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise FormatError(f"{index}: 'weight_map' must map tensor names to shard file names")
            self._file_of = {name: self.path / file for name, file in weight_map.items()}
        else:
            self.index_file = None
            files = sorted(self.path.glob("*.safetensors"))
            if not files:
                raise FormatError(f"{self.path}: no {INDEX_NAME} and no *.safetensors files")
            self._file_of = {}
            for file in files:
                for name in self._shard(file, None).infos:
                    if name in self._file_of:
                        raise FormatError(f"{self.path}: tensor {name!r} is in both {self._file_of[name].name} and "
                                          f"{file.name}")
                    self._file_of[name] = file

    # -- names and metadata ---------------------------------------------------------------
    def names(self) -> list[str]:
        """Every tensor name the checkpoint declares (index order)."""
        return list(self._file_of)

    def __contains__(self, name: str) -> bool:
        return name in self._file_of

    def file_of(self, name: str) -> Path:
        """The shard that holds `name`; an unknown name raises `FormatError`."""
        try:
            return self._file_of[name]
        except KeyError:
            where = self.index_file or self.path
            raise FormatError(f"{where}: missing tensor {name!r} (not in the checkpoint)") from None

    def _shard(self, file: Path, name: str | None) -> _Shard:
        shard = self._shards.get(file)
        if shard is None:
            if not file.is_file():
                why = f"needed for tensor {name!r}, " if name else ""
                raise FormatError(f"{file}: missing shard ({why}listed in {self.index_file or self.path})")
            shard = self._shards[file] = _Shard(file)
        return shard

    def info(self, name: str) -> TensorInfo:
        """dtype, shape and file of `name` (parses its shard's header on first use)."""
        file = self.file_of(name)
        info = self._shard(file, name).infos.get(name)
        if info is None:
            index = self.index_file.name if self.index_file else "the index"
            raise FormatError(f"{file}: missing tensor {name!r} ({index} places it in this shard, whose header "
                              "does not hold it)")
        return info

    # -- data -----------------------------------------------------------------------------
    def read(
        self,
        names: Iterable[str],
        device: torch.device | str = "cpu",
        on_bytes: Callable[[int], None] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Read tensors by name, each shard opened once; returns ``{name: tensor}`` on `device`.
        on_bytes: called with each tensor's size after it is read (progress)."""
        from safetensors import safe_open  # noqa: PLC0415  (optional dependency)

        names = list(names)
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.info(name).file, []).append(name)
        out: dict[str, torch.Tensor] = {}
        with ExitStack() as stack:
            for file, group in by_file.items():
                try:
                    handle = stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
                except Exception as exc:  # safetensors raises its own error type
                    raise FormatError(f"{file}: cannot open the shard: {exc}") from None
                for name in group:
                    try:
                        t = handle.get_tensor(name)
                    except Exception as exc:
                        raise FormatError(f"{file}: tensor {name!r}: cannot read it: {exc}") from None
                    out[name] = t.to(device) if str(device) != "cpu" else t
                    if on_bytes is not None:
                        on_bytes(self.info(name).nbytes)
        return {name: out[name] for name in names}


def check_tensor(
    info: TensorInfo,
    field: str,
    dtypes: tuple[torch.dtype, ...] | torch.dtype,
    shape: tuple[int, ...] | None = None,
) -> None:
    """Raise `FormatError` unless `info` has one of `dtypes` (and `shape`, when given); the
    message names the file, the tensor and the field."""
    dtypes = dtypes if isinstance(dtypes, tuple) else (dtypes,)
    if info.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise FormatError(f"{info.where()}: {field} must be {want}, got {info.dtype_name}")
    if shape is not None and info.shape != tuple(shape):
        raise FormatError(f"{info.where()}: {field} must have shape {list(shape)}, got {list(info.shape)}")
