"""Benchmark providers: one small class per implementation of the W4A16 MoE GEMM.

A provider is driven in three steps (`lowbit.bench.driver` does this for every problem):

1. ``unavailable_reason()`` / ``supports(problem)``: None when it can run, else why not
   (a provider that cannot run a problem yields no row for it);
2. ``prepare(problem)``: untimed: convert / pack the weight (cached across problems that share
   it), build provider-specific routing, JIT-compile, warm up;
3. ``run()``: the timed call; returns the layout's output ``[out_rows, N]`` (BF16), whose
   routed rows (``problem.route_out``) are checked against the FP32 reference before timing.

Providers:
- ``lowbit``: this package's kernels; yields rows once ``lowbit.kernels`` exposes them
  (see `LowbitProvider.ENTRY_POINTS`).
- ``humming``: the public Humming JIT CUDA library (optional; ``humming-kernels``),
  our baseline, through ``humming.layer.HummingLayer`` with its own heuristic tuning.
- ``torch``: BF16 grouped GEMM on weights dequantized once (``torch._grouped_mm`` when it
  runs, else one ``mm`` per expert), gather and scatter included: what plain PyTorch gives.
"""

from __future__ import annotations

import dataclasses

import importlib
import json
from typing import Any, Callable, ClassVar

import torch

from ..formats import QuantizedTensor, get_format
from .cases import Problem, moe_align_block_size

__all__ = [
    "Provider",
    "PROVIDERS",
    "DEFAULT_PROVIDERS",
    "register_provider",
    "TorchProvider",
    "HummingProvider",
    "LowbitProvider",
    "humming_weight_tensors",
    "contiguous_expert_offsets",
]


class Provider:
    """Base class. Subclasses set `name` and implement `prepare` and `run`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    #: False for a provider whose call syncs with the host (a reference that validates its
    #: input): the bench then times it with eager launches even under ``--cuda-graph`` /
    #: ``--interleave``, and its row's ``cuda_graph`` field says so.
    graph_capturable: ClassVar[bool] = True

    def __init__(self) -> None:
        self._call: Callable[[], torch.Tensor] | None = None

    def unavailable_reason(self) -> str | None:
        """None when the provider can run on this machine, else a one-line reason."""
        return None

    def version(self) -> str | None:
        return None

    def supports(self, problem: Problem) -> str | None:
        """None when `problem` can be run, else a one-line reason (no row is produced)."""
        return None

    def prepare(self, problem: Problem) -> None:
        raise NotImplementedError

    def run(self) -> torch.Tensor:
        """The timed call: the layout's output ``bf16 [out_rows, N]``."""
        if self._call is None:
            raise RuntimeError(f"provider {self.name}: run() before prepare()")
        return self._call()

    def config(self) -> dict[str, Any]:
        """What the provider chose for the last prepared problem (tiles, block size...)."""
        return {}

    def release(self) -> None:
        """Drop per-problem state (weights stay cached until `clear`)."""
        self._call = None

    def clear(self) -> None:
        """Drop everything, weights included."""
        self.release()


PROVIDERS: dict[str, type[Provider]] = {}
DEFAULT_PROVIDERS: tuple[str, ...] = ("lowbit", "humming", "torch")


def register_provider(cls: type[Provider]) -> type[Provider]:
    """Class decorator: make a provider selectable by ``--providers``."""
    if not cls.name or cls.name in PROVIDERS:
        raise ValueError(f"provider name {cls.name!r} empty or registered twice")
    PROVIDERS[cls.name] = cls
    return cls


class _WeightCache:
    """Provider-side converted weights, keyed by the problem's weight identity. Holds two
    entries: gate_up and down of one profile, which consecutive cases share."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self.items: dict[tuple, Any] = {}

    def get(self, problem: Problem, build: Callable[[], Any], tag: str = "") -> Any:
        w = problem.weight
        key = (w.codes.data_ptr(), tuple(w.codes.shape), w.scales.data_ptr(), tag)
        if key not in self.items:
            while len(self.items) >= self.size:
                self.items.pop(next(iter(self.items)))
            self.items[key] = build()
        return self.items[key]

    def clear(self) -> None:
        self.items.clear()


def _dequantize_bf16(w: QuantizedTensor) -> torch.Tensor:
    """``bf16 [E, N, K]``, one expert at a time to bound the FP32 temporary."""
    fmt = get_format("int4_g32")
    out = torch.empty(w.codes.shape, dtype=torch.bfloat16, device=w.codes.device)
    for e in range(w.codes.shape[0]):
        out[e] = fmt.dequantize(QuantizedTensor(w.codes[e], w.scales[e], w.fmt)).to(torch.bfloat16)
    return out


@register_provider
class TorchProvider(Provider):
    """BF16 grouped GEMM in plain PyTorch: gather routed rows by expert, one grouped GEMM
    (``torch._grouped_mm`` with per-expert row offsets; a loop of ``mm`` if that op is missing
    or refuses the inputs), scatter back to the layout's rows. Dequantization is done once in
    `prepare` (untimed): this is the "BF16 weights" ceiling-ish baseline, reading 4x the bytes."""

    name = "torch"
    description = "BF16 torch._grouped_mm on pre-dequantized weights (gather + GEMM + scatter)"

    def __init__(self) -> None:
        super().__init__()
        self._weights = _WeightCache()
        self.mode = ""

    def version(self) -> str | None:
        return torch.__version__

    def prepare(self, problem: Problem) -> None:
        w_bf16 = self._weights.get(problem, lambda: _dequantize_bf16(problem.weight))
        # [E, K, N] with K contiguous: the "transposed B" layout grouped_mm wants
        w_t = w_bf16.transpose(1, 2)
        counts = torch.bincount(problem.route_expert, minlength=problem.num_experts)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        a, route_in, route_out = problem.a, problem.route_in, problem.route_out
        out_rows, n = problem.out_rows, problem.proj.n

        def grouped() -> torch.Tensor:
            y = torch._grouped_mm(a.index_select(0, route_in), w_t, offs=offs)
            out = torch.empty(out_rows, n, dtype=torch.bfloat16, device=a.device)
            return out.index_copy_(0, route_out, y)

        bounds = [(e, s, s + c) for e, (s, c) in enumerate(zip((offs - counts).tolist(), counts.tolist())) if c]

        def looped() -> torch.Tensor:
            a_sorted = a.index_select(0, route_in)
            y = torch.empty(a_sorted.shape[0], n, dtype=torch.bfloat16, device=a.device)
            for e, s, t in bounds:
                torch.mm(a_sorted[s:t], w_bf16[e].T, out=y[s:t])
            out = torch.empty(out_rows, n, dtype=torch.bfloat16, device=a.device)
            return out.index_copy_(0, route_out, y)

        self._call, self.mode = looped, "mm_loop"
        if hasattr(torch, "_grouped_mm"):
            try:
                grouped()
                self._call, self.mode = grouped, "grouped_mm"
            except (RuntimeError, NotImplementedError, TypeError):
                pass  # e.g. no sm90 kernel for this dtype/stride on this build: keep the loop

    def config(self) -> dict[str, Any]:
        return {"mode": self.mode}

    def clear(self) -> None:
        super().clear()
        self._weights.clear()


# -- Humming -------------------------------------------------------------------------------
_HUMMING_GEMM_TYPE = {"indexed": "indexed", "contiguous": "grouped_contiguous", "masked": "grouped_masked"}


def humming_weight_tensors(w: QuantizedTensor) -> dict[str, torch.Tensor]:
    """Our INT4 group-32 weight as the tensors ``HummingLayer.load_from_tensors`` expects for
    ``weight_config={"dtype": "uint4", "group_size": 32, "scale_dtype": "bfloat16"}``:

    - ``weight``: ``int32 [E, N, K/8]``, the *unsigned* codes q (0..15) packed eight a word,
      element ``8j+i`` in bits ``4i..4i+3`` (Humming's ``pack_weight`` order), i.e. exactly the
      compressed-tensors ``weight_packed`` words; Humming's uint4 without zero point means
      ``(q - 8) * s``, our convention.
    - ``weight_scale``: ``bf16 [E, N, K/32]``, unchanged.
    Packs one expert at a time (the packer's int64 temporary is 8x the codes).
    """
    fmt = get_format("int4_g32")
    e, n, k = w.codes.shape
    packed = torch.empty((e, n, k // 8), dtype=torch.int32, device=w.codes.device)
    for i in range(e):
        packed[i] = fmt.pack(QuantizedTensor(w.codes[i], w.scales[i], w.fmt))["weight_packed"]
    return {"weight": packed, "weight_scale": w.scales.contiguous()}


def contiguous_expert_offsets(m_indices: torch.Tensor, num_experts: int, alignment: int) -> torch.Tensor:
    """Humming's grouped-contiguous ``expert_layout``: ``int64 [E+1]`` first row of each
    expert's segment (and the end of the last), from DeepGEMM-style ``m_indices`` whose
    segments are in expert order, each padded to `alignment` rows. Checks that the segments
    are where the offsets say (host-side, untimed)."""
    m_cpu = m_indices.cpu().long()
    counts = torch.bincount(m_cpu[m_cpu >= 0], minlength=num_experts)
    padded = -(-counts // alignment) * alignment
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(padded, 0)
    for e in range(num_experts):
        s, c = int(offsets[e]), int(counts[e])
        if c and not bool((m_cpu[s: s + c] == e).all()):
            raise ValueError(f"m_indices is not expert-ordered with {alignment}-row segments (expert {e})")
    return offsets.to(m_indices.device)


@register_provider
class HummingProvider(Provider):
    """Humming (``humming-kernels``) through ``HummingLayer``: weights loaded from our codes
    and scales, ``transform()``-ed once per weight; tuning from Humming's own SM90 heuristics
    for the routed row count (``shape_m`` = routed rows, as Humming's tests pass it); the
    indexed routing is built with the heuristic's ``block_shape[0]`` as block size."""

    name = "humming"
    description = "humming.layer.HummingLayer (uint4, group 32, bf16 scales), heuristic tuning"

    def __init__(self) -> None:
        super().__init__()
        self._layers = _WeightCache()
        self._config: dict[str, Any] = {}

    def _import(self):
        humming = importlib.import_module("humming")
        layer_mod = importlib.import_module("humming.layer")
        tune = importlib.import_module("humming.tune")
        return humming, layer_mod, tune

    def unavailable_reason(self) -> str | None:
        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
        try:
            self._import()
        except Exception as exc:  # noqa: BLE001  (any import failure means: not available)
            return f"humming not importable ({type(exc).__name__}: {exc})"
        return None

    def version(self) -> str | None:
        try:
            return str(importlib.import_module("humming").__version__)
        except Exception:  # noqa: BLE001
            return None

    def supports(self, problem: Problem) -> str | None:
        if problem.device.type != "cuda":
            return "needs CUDA tensors"
        return None

    def _build_layer(self, problem: Problem):
        _, layer_mod, _ = self._import()
        e, n, k = problem.weight.codes.shape
        with torch.device(problem.device):
            layer = layer_mod.HummingLayer(
                shape_n=n, shape_k=k, num_experts=e, torch_dtype=torch.bfloat16,
                weight_config={"dtype": "uint4", "group_size": 32, "scale_dtype": "bfloat16"},
            )
        layer.load_from_tensors(humming_weight_tensors(problem.weight))
        layer.transform()
        torch.cuda.synchronize(problem.device)
        return layer

    def prepare(self, problem: Problem) -> None:
        _, _, tune = self._import()
        layer = self._layers.get(problem, lambda: self._build_layer(problem))
        layout = problem.case.layout
        gemm_type = _HUMMING_GEMM_TYPE[layout]
        tuning = tune.get_heuristics_config(layer.humming_config, shape_m=problem.routed_rows, gemm_type=gemm_type)
        tuning_json = json.dumps(tuning)  # strings skip Humming's per-call json.dumps
        compute_json = json.dumps({"gemm_type": gemm_type})
        n = problem.proj.n
        kwargs: dict[str, Any] = {}
        if layout == "indexed":
            block_m = int(tuning["block_shape"][0])
            routing = moe_align_block_size(problem.topk_ids, block_m, problem.num_experts)
            inputs = problem.hidden
            kwargs.update(
                sorted_ids=routing.sorted_token_ids, expert_ids=routing.expert_ids,
                num_tokens_padded=routing.num_tokens_post_padded, top_k=problem.proj.top_k,
            )
            out_rows = inputs.shape[0] * problem.proj.top_k
        elif layout == "contiguous":
            inputs = problem.a
            kwargs["expert_layout"] = contiguous_expert_offsets(
                problem.contiguous.m_indices, problem.num_experts, problem.contiguous.alignment)
            out_rows = inputs.shape[0]
        else:
            inputs = problem.a  # flat [G*max_m, K]: Humming infers max_m = rows / experts
            kwargs["expert_layout"] = problem.masked.masked_m
            out_rows = inputs.shape[0]
        outputs = torch.empty(out_rows, n, dtype=torch.bfloat16, device=problem.device)
        self._config = {"gemm_type": gemm_type, "shape_m": problem.routed_rows,
                        "block_shape": list(tuning.get("block_shape", [])), "tuning": tuning}

        def call() -> torch.Tensor:
            return layer(inputs, outputs=outputs, compute_config=compute_json,
                         tuning_config=tuning_json, **kwargs)

        call()  # JIT-compiles the kernel for this config on first use
        torch.cuda.synchronize(problem.device)
        self._call = call

    def config(self) -> dict[str, Any]:
        return {k: v for k, v in self._config.items() if k != "tuning"} | {
            "tuning": json.loads(json.dumps(self._config.get("tuning", {}), default=str))}

    def clear(self) -> None:
        super().clear()
        self._layers.clear()


# -- lowbit --------------------------------------------------------------------------------
@register_provider
class LowbitProvider(Provider):
    """lowbit's own W4A16 kernels. `ENTRY_POINTS` maps a layout to ``(module, function)``;
    a layout whose function does not exist yet is reported as not supported (no row).

    Weights are prepared once with ``lowbit.formats.w4a16.pack_w4a16(qweight, profile=layout)``.
    - indexed: ``w4a16_indexed(a [T, K], w, sorted_ids, expert_ids, num_tokens_post_padded,
      top_k, out=, config=)``; the routing is built with the kernel's own
      ``w4a16_indexed_config(routes, E, N, K).block_m`` as block size.
    - contiguous: ``fn(a2 [m, K], w, m_indices)``; masked: ``fn(a3, w, masked_m, expected_m)``
      (SPEC section 3a; adjust `_grouped_call` if the landed signatures differ).
    """

    name = "lowbit"
    description = "lowbit Triton W4A16 MoE kernels"

    ENTRY_POINTS: ClassVar[dict[str, tuple[str, str]]] = {
        "indexed": ("lowbit.kernels.w4a16.indexed", "w4a16_indexed"),
        "contiguous": ("lowbit.kernels.w4a16.grouped", "contiguous"),
        "masked": ("lowbit.kernels.w4a16.grouped", "masked"),
    }

    def __init__(self) -> None:
        super().__init__()
        self._packed = _WeightCache(size=4)
        self._config: dict[str, Any] = {}

    def _module(self, layout: str) -> Any | None:
        try:
            return importlib.import_module(self.ENTRY_POINTS[layout][0])
        except ImportError:
            return None

    def _entry(self, layout: str) -> Callable[..., torch.Tensor] | None:
        mod = self._module(layout)
        return None if mod is None else getattr(mod, self.ENTRY_POINTS[layout][1], None)

    def version(self) -> str | None:
        from .._version import __version__  # noqa: PLC0415

        return __version__

    def supports(self, problem: Problem) -> str | None:
        if self._entry(problem.case.layout) is None:
            mod_name, fn_name = self.ENTRY_POINTS[problem.case.layout]
            return f"{mod_name}.{fn_name} not available yet"
        return None

    def prepare(self, problem: Problem) -> None:
        from ..formats.w4a16 import pack_w4a16  # noqa: PLC0415

        layout = problem.case.layout
        fn = self._entry(layout)
        w = self._packed.get(problem, lambda: pack_w4a16(problem.weight, profile=layout), layout)
        if layout == "indexed":
            self._call = self._indexed_call(problem, fn, w)
        else:
            self._call = self._grouped_call(problem, fn, w)
        if problem.device.type == "cuda":
            self._call()  # compile outside the timed region (the interpreter has nothing to warm)
            torch.cuda.synchronize(problem.device)

    def _indexed_call(self, problem: Problem, fn: Callable[..., torch.Tensor], w: Any) -> Callable[[], torch.Tensor]:
        mod = self._module("indexed")
        e, n, k = problem.num_experts, problem.proj.n, problem.proj.k
        cfg = mod.w4a16_indexed_config(problem.routed_rows, e, n, k, gluon=mod.gluon_capable(problem.hidden, w))
        routing = moe_align_block_size(problem.topk_ids, cfg.block_m, e)
        a, top_k = problem.hidden, problem.proj.top_k
        out = torch.empty(a.shape[0] * top_k, n, dtype=torch.bfloat16, device=a.device)
        self._config = dataclasses.asdict(cfg)  # every field (split_k, pregather...) on the row
        sorted_ids, expert_ids, ntpp = routing.sorted_token_ids, routing.expert_ids, routing.num_tokens_post_padded
        return lambda: fn(a, w, sorted_ids, expert_ids, ntpp, top_k, out=out, config=cfg)

    def _grouped_call(self, problem: Problem, fn: Callable[..., torch.Tensor], w: Any) -> Callable[[], torch.Tensor]:
        mod = self._module(problem.case.layout)
        a = problem.a
        mode = problem.case.layout
        g, n, k = problem.num_experts, problem.proj.n, problem.proj.k
        expected_m = problem.expected_m if mode == "masked" else 0
        a2d = a if a.dim() == 2 else a.view(-1, a.shape[-1])
        cfg = mod.w4a16_grouped_config(mode, a2d.shape[0], n, k, g, expected_m, gluon=mod.gluon_capable(a2d, w))
        self._config = dataclasses.asdict(cfg)  # every field (split_k, pregather...) on the row
        if mode == "contiguous":
            m_indices = problem.contiguous.m_indices
            return lambda: fn(a, w, m_indices, config=cfg)
        masked_m = problem.masked.masked_m
        return lambda: fn(a, w, masked_m, expected_m, config=cfg)

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    def clear(self) -> None:
        super().clear()
        self._packed.clear()
