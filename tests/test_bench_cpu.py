"""The benchmark driver and CLI without a GPU: case registry, byte model, Humming weight
layout, JSON rows, refcheck failures, timing statistics, and the CLI subcommands."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lowbit.bench import cases as cases_mod
from lowbit.bench.cases import CASES, DEFAULT_CASE_NAMES, build_problem, byte_model, select_cases
from lowbit.bench.driver import ROW_KEYS, format_table, refcheck, run_bench, write_results
from lowbit.bench.providers import (
    PROVIDERS,
    TorchProvider,
    contiguous_expert_offsets,
    humming_weight_tensors,
)
from lowbit.bench.opcases import OpCase
from lowbit.bench.ops import attn_bytes, build_op_problem, decode_bytes, gemm_bytes, quant_bytes
from lowbit.bench.timing import measure, measure_interleaved, quantile
from lowbit.formats import get_format
from lowbit.reference.routing import build_contiguous_ref

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str, env_extra: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)  # the CLI must set it itself on a CPU-only machine
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "lowbit", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout)


# -- registry ------------------------------------------------------------------------------
def test_kimi_shapes_match_the_spec():
    for name, case in CASES.items():
        if isinstance(case, OpCase):
            continue  # the op families: test_op_case_registry
        gate_up, down = case.projections
        assert (gate_up.name, down.name) == ("gate_up", "down"), name
        for p in case.projections:
            assert p.k % 32 == 0 and p.k % 8 == 0, (name, p)
        if case.profile == "ep8":
            assert case.num_experts == 48
            assert (gate_up.n, gate_up.k, down.n, down.k) == (4096, 7168, 7168, 2048)
        if case.profile == "tp8":
            assert case.num_experts == 384
            assert (gate_up.n, gate_up.k, down.n, down.k) == (512, 7168, 7168, 256)
        if case.layout == "indexed":
            # gate_up routes each token top-8; down consumes the 8T routed rows one route each
            assert case.tokens > 0 and down.top_k == 1
            if case.profile != "smoke":
                assert gate_up.top_k == 8
        else:
            assert gate_up.top_k == down.top_k == 1 and case.rows_per_expert > 0
        if case.layout == "contiguous":
            assert case.rows_per_expert % 128 == 0, "contiguous points avoid padding tiles"
        if case.layout == "masked":
            assert case.max_m >= case.masked_jitter[1] * case.rows_per_expert


def test_headline_points_are_the_default_set():
    assert set(DEFAULT_CASE_NAMES) <= set(CASES)
    picked = {c.name: c for c in select_cases(None)}
    assert list(picked) == list(DEFAULT_CASE_NAMES)
    assert picked["ep8_indexed_t256"].nominal_routed_rows == 2048      # "2048 tokens" prefill
    assert picked["ep8_indexed_t1024"].nominal_routed_rows == 8192
    assert picked["tp8_indexed_t1024"].nominal_routed_rows == 8192
    assert picked["tp8_indexed_t8192"].nominal_routed_rows == 65536
    assert picked["ep8_contiguous_128"].rows_per_expert == 128
    assert picked["ep8_masked_32"].rows_per_expert == 32 and picked["ep8_masked_32"].max_m == 256
    ep8_tokens = sorted(c.tokens for c in CASES.values() if c.profile == "ep8" and c.layout == "indexed")
    assert ep8_tokens == [1, 4, 8, 16, 20, 32, 50, 128, 256, 384, 1024]


def test_op_case_registry():
    dec = select_cases(["decode_oc"])
    assert [(c.p["fmt"], c.tokens) for c in dec] == [(f, t) for f in ("int4", "mxfp8") for t in (1, 2, 4, 8, 16, 32)]
    for c in dec:
        assert (c.num_experts, c.p["h"], c.p["inter"], c.p["top_k"]) == (48, 7168, 2048, 8)
        gu, dn = c.projections
        assert (gu.n, gu.k, dn.n, dn.k) == (4096, 7168, 7168, 2048)
    seed = select_cases(["seed004"])
    gemms = {(c.family, c.p["m"], c.p["n"], c.p["k"]) for c in seed if c.family.endswith("gemm")}
    assert gemms == {(op, m, n, k) for op in ("fp8_gemm", "fp4_gemm") for m in (16, 128, 4096)
                     for n, k in ((2304, 5120), (5120, 2304))} | {("fp4_gemm", 64, 2304, 5120),
                                                                ("fp4_gemm", 64, 5120, 2304)}
    fams = {c.family for c in seed}
    assert fams == {"fp8_gemm", "fp4_gemm", "act_quant", "fp4_quant", "sparse_attn", "hc_split_sinkhorn"}
    attn = CASES["sparse_attn_decode"].p
    assert (attn["b"], attn["s"], attn["h"], attn["d"], attn["topk"], attn["n"]) == (64, 1, 64, 512, 2048, 65536)
    assert CASES["act_quant_16384x7168"].bw_tbs == 4.28 and CASES["fp8_gemm_m16_n2304_k5120"].tflops == 1979.0
    # tags pick single ops; "all" has no smoke op case; the default gained two decode points
    assert {c.family for c in select_cases(["fp4_gemm"])} == {"fp4_gemm"}
    assert not any(c.profile == "smoke" for c in select_cases(["all"]))
    assert {"decode_oc_int4_t1", "decode_oc_int4_t32"} <= set(DEFAULT_CASE_NAMES)


def test_op_byte_models_by_hand():
    # decode INT4, 1 token, 8 experts hit: per expert w13 [4096, 7168] + w2 [7168, 2048]
    bm = decode_bytes(fmt="int4", experts_hit=8, tokens=1, h=7168, inter=2048, top_k=8)
    assert bm.weight_bytes == 8 * (4096 * 7168 // 2 + 7168 * 2048 // 2) == 176_160_768
    assert bm.scale_bytes == 8 * (7168 // 32 * 4096 * 2 + 2048 // 32 * 7168 * 2) == 22_020_096
    assert bm.act_bytes == bm.out_bytes == 7168 * 2
    assert 44.0 < bm.floor_us() < 44.1          # the read floor for 1 token (8 experts)
    mx = decode_bytes(fmt="mxfp8", experts_hit=8, tokens=1, h=7168, inter=2048, top_k=8)
    assert mx.weight_bytes == 2 * bm.weight_bytes and mx.scale_bytes == 8 * 3 * 2048 * 7168 // 32
    g = gemm_bytes("fp8_gemm", 4096, 5120, 2304)
    assert (g.weight_bytes, g.act_bytes, g.out_bytes) == (5120 * 2304, 4096 * 2304, 4096 * 5120 * 2)
    assert g.scale_bytes == 4 * (40 * 18 + 4096 * 18) and g.flops == 2 * 4096 * 5120 * 2304
    assert g.floor_us(4.5, 1979.0) == pytest.approx(g.flops / 1979e12 * 1e6)
    f4 = gemm_bytes("fp4_gemm", 16, 2304, 5120)
    assert (f4.weight_bytes, f4.scale_bytes) == (2304 * 2560, 2304 * 160 + 4 * 16 * 40)
    q = quant_bytes("act_quant", 16384, 7168)
    assert (q.act_bytes, q.out_bytes, q.scale_bytes) == (234_881_024, 117_440_512, 4 * 16384 * 56)
    q4 = quant_bytes("fp4_quant", 16384, 7168)
    assert (q4.out_bytes, q4.scale_bytes) == (16384 * 3584, 16384 * 224)
    a = attn_bytes(64, 1, 64, 512, 2048)
    assert a.weight_bytes == 134_217_728                # the gathered KV: 134 MB
    assert a.total_bytes == 134_217_728 + 64 * 2048 * 4 + 2 * 64 * 64 * 512 * 2


def test_op_problem_counts_experts_hit():
    p = build_op_problem(CASES["smoke_decode_oc_int4_t3"], "cpu")
    hit = int(torch.unique(p.inputs["topk_ids"]).numel())
    assert p.experts_hit == hit
    assert p.bytes().weight_bytes == hit * (128 * 256 // 2 + 256 * 64 // 2)
    assert p.reference().shape == (3, 256)
    cases_mod.clear_weight_cache()


def test_run_bench_op_rows(tmp_path):
    # torch baselines only (no interpreter runs here): rows, schema, baseline, table
    rows = run_bench(select_cases(["smoke_act_quant_8x256", "smoke_hc_split_sinkhorn_t37"]), ["torch"],
                     device="cpu", timing={"min_reps": 3}, progress=None)
    assert [(r["case"], r["provider"]) for r in rows] == [("smoke_act_quant_8x256", "torch-ref"),
                                                          ("smoke_hc_split_sinkhorn_t37", "torch-ref")]
    for r in rows:
        assert set(r) == set(ROW_KEYS) and r["status"] == "ok" and r["projection"] == "op"
        assert r["baseline"] == "torch-ref" and r["speedup_vs_baseline"] == pytest.approx(1.0)
    assert rows[0]["message"] == "bit-exact" and rows[0]["bw_fraction"] == pytest.approx(rows[0]["tb_per_s"] / 4.28)
    assert "x base" in format_table(rows)


def test_crossover_summary():
    from lowbit.bench.ops import crossover_summary

    rows = [{"layout": "decode_oc", "status": "ok", "case": f"decode_oc_int4_t{t}", "tokens": t,
             "provider": p, "median_us": us}
            for t, oc, ix in ((1, 50.0, 90.0), (8, 200.0, 210.0), (16, 260.0, 250.0))
            for p, us in (("lowbit", oc), ("lowbit-indexed", ix))]
    text = crossover_summary(rows)
    assert "indexed path first faster at 16 tokens" in text


def test_select_cases_by_glob_tag_and_errors():
    assert [c.name for c in select_cases(["tp8_*"])] == ["tp8_indexed_t1024", "tp8_indexed_t8192"]
    assert all(c.layout == "masked" for c in select_cases(["masked"]))
    both = select_cases(["ep8_masked_32", "ep8_indexed_t20", "ep8_indexed_t20"])
    assert [c.name for c in both] == ["ep8_indexed_t20", "ep8_masked_32"]  # registry order, no duplicates
    assert not any(c.profile == "smoke" for c in select_cases(["all"]))
    with pytest.raises(ValueError, match="no benchmark case matches"):
        select_cases(["nope_*"])


def test_masked_draw_stays_in_the_jitter_band():
    case = CASES["ep8_masked_32"]
    gen = torch.Generator()
    gen.manual_seed(case.seed)
    ids = cases_mod._draw_grouped_ids(case, gen)
    counts = torch.bincount(ids.flatten().long(), minlength=48)
    assert ids.shape[1] == 1 and counts.numel() == 48
    assert int(counts.min()) >= 23 and int(counts.max()) <= 41   # 0.7*32 .. 1.3*32
    assert abs(float(counts.float().mean()) - 32) < 4


@pytest.mark.parametrize("name", ["smoke_indexed", "smoke_contiguous", "smoke_masked"])
def test_problem_route_tables(name):
    case = CASES[name]
    gate_up = build_problem(case, "gate_up", "cpu")
    down = build_problem(case, "down", "cpu")
    for p in (gate_up, down):
        assert p.a.dtype == torch.bfloat16 and p.a.shape[1] == p.proj.k
        assert p.route_out.numel() == p.route_in.numel() == p.route_expert.numel()
        assert bool((p.route_expert[1:] >= p.route_expert[:-1]).all()), "routes sorted by expert"
        assert p.reference().shape == (p.out_rows, p.proj.n)
    if case.layout == "indexed":
        t, k = case.tokens, gate_up.proj.top_k
        assert gate_up.a.shape[0] == t and gate_up.out_rows == t * k
        assert down.a.shape[0] == t * k and down.out_rows == t * k
        # down keeps the gate_up draw: route t*k+j on expert topk_ids[t, j]
        assert torch.equal(down.topk_ids.flatten(), gate_up.topk_ids.flatten())
    elif case.layout == "contiguous":
        assert gate_up.routed_rows == case.num_experts * case.rows_per_expert
        assert bool((gate_up.contiguous.m_indices[: gate_up.routed_rows] >= 0).all()), "no padding inside segments"
    else:
        assert gate_up.out_rows == case.num_experts * case.max_m
        assert int(gate_up.masked.masked_m.sum()) == gate_up.routed_rows
    cases_mod.clear_weight_cache()


# -- byte model ----------------------------------------------------------------------------
def test_byte_model_by_hand_ep8_contiguous_128_gate_up():
    # 48 experts x 128 rows = 6144 rows, N=4096, K=7168, every expert hit
    bm = byte_model(experts_hit=48, n=4096, k=7168, act_rows=6144, routed_rows=6144)
    assert bm.weight_bytes == 48 * 4096 * 7168 // 2 == 704_643_072
    assert bm.scale_bytes == 48 * 4096 * 224 * 2 == 88_080_384
    assert bm.act_bytes == 6144 * 7168 * 2 == 88_080_384
    assert bm.out_bytes == 6144 * 4096 * 2 == 50_331_648
    assert bm.total_bytes == 931_135_488
    assert bm.flops == 2 * 6144 * 4096 * 7168
    # 361 TFLOP at 678 TFLOP/s (532 us) outweighs 931 MB at 4.5 TB/s (207 us): compute floor
    assert bm.floor_us() == pytest.approx(bm.flops / 678e12 * 1e6)
    assert 531 < bm.floor_us() < 533


def test_byte_model_ep8_decode_down_counts_experts_hit_only():
    # EP8 down at T=20: 160 routed rows of K=2048 read once each, 47 experts hit
    bm = byte_model(experts_hit=47, n=7168, k=2048, act_rows=160, routed_rows=160)
    assert bm.weight_bytes == 47 * 7168 * 1024
    assert bm.scale_bytes == 47 * 7168 * 64 * 2
    assert bm.act_bytes == 160 * 2048 * 2 and bm.out_bytes == 160 * 7168 * 2
    assert bm.floor_us() == pytest.approx(bm.total_bytes / 4.5e12 * 1e6)


def test_problem_bytes_use_the_draw():
    p = build_problem(CASES["smoke_indexed"], "gate_up", "cpu")
    bm = p.bytes()
    hit = int(torch.unique(p.topk_ids).numel())
    assert bm.weight_bytes == hit * p.proj.n * p.proj.k // 2
    assert bm.act_bytes == p.case.tokens * p.proj.k * 2          # each token read once, not top_k times
    assert bm.out_bytes == p.case.tokens * p.proj.top_k * p.proj.n * 2
    cases_mod.clear_weight_cache()


# -- Humming adapters (layout only: Humming itself needs the GPU) ----------------------------
def test_humming_weight_tensors_are_unsigned_nibbles_in_order():
    gen = torch.Generator().manual_seed(0)
    w = get_format("int4_g32").quantize(torch.randn(2, 4, 64, generator=gen))
    t = humming_weight_tensors(w)
    assert t["weight"].dtype == torch.int32 and t["weight"].shape == (2, 4, 8)
    assert t["weight_scale"].dtype == torch.bfloat16 and t["weight_scale"].shape == (2, 4, 2)
    words = t["weight"].to(torch.int64) & 0xFFFFFFFF
    for i in range(8):  # element 8j+i sits in bits 4i..4i+3 of word j, as the code q (0..15)
        assert torch.equal((words >> (4 * i)) & 0xF, w.codes[..., i::8].to(torch.int64))


def test_contiguous_expert_offsets():
    ids = torch.tensor([[2], [0], [2], [2], [0]], dtype=torch.int32)  # expert 1 empty
    r = build_contiguous_ref(ids, 3, 3, alignment=4)
    off = contiguous_expert_offsets(r.m_indices, 3, 4)
    assert off.dtype == torch.int64 and off.tolist() == [0, 4, 4, 8]
    with pytest.raises(ValueError, match="expert-ordered"):
        contiguous_expert_offsets(r.m_indices.flip(0), 3, 4)


# -- driver rows ---------------------------------------------------------------------------
class _WrongProvider(TorchProvider):
    """A provider whose answer is 10% off: must be reported FAIL, never timed."""

    name = "wrong"

    def run(self):
        return super().run() * 1.1


class _CrashingProvider(TorchProvider):
    name = "crash"

    def prepare(self, problem):
        raise RuntimeError("boom")


@pytest.fixture
def extra_providers(monkeypatch):
    monkeypatch.setitem(PROVIDERS, "wrong", _WrongProvider)
    monkeypatch.setitem(PROVIDERS, "crash", _CrashingProvider)


def test_run_bench_rows_schema_and_statuses(tmp_path, extra_providers):
    rows = run_bench(select_cases(["smoke_indexed", "smoke_masked"]), ["torch", "wrong", "crash", "humming"],
                     device="cpu", timing={"min_reps": 3}, progress=None)
    # humming is unavailable without a GPU: no rows; 2 cases x (2 projections + sum) x 3 providers
    assert len(rows) == 2 * 3 * 3
    for r in rows:
        assert set(r) == set(ROW_KEYS)
    by = {(r["case"], r["projection"], r["provider"]): r for r in rows}
    ok = by[("smoke_indexed", "gate_up", "torch")]
    assert ok["status"] == "ok" and ok["median_us"] > 0 and ok["rel_fro_err"] < 1e-2
    assert ok["p20_us"] <= ok["median_us"] <= ok["p80_us"]
    assert ok["tb_per_s"] == pytest.approx(ok["total_bytes"] / (ok["median_us"] * 1e-6) / 1e12)
    assert ok["bw_fraction"] == pytest.approx(ok["tb_per_s"] / 4.5)
    assert ok["torch"] == torch.__version__ and ok["date"]
    bad = by[("smoke_indexed", "down", "wrong")]
    assert bad["status"] == "FAIL" and bad["median_us"] is None and bad["rel_fro_err"] > 1e-2
    crashed = by[("smoke_masked", "gate_up", "crash")]
    assert crashed["status"] == "error" and "boom" in crashed["message"]
    total = by[("smoke_masked", "sum", "torch")]
    parts = [by[("smoke_masked", p, "torch")] for p in ("gate_up", "down")]
    assert total["median_us"] == pytest.approx(sum(p["median_us"] for p in parts))
    assert total["total_bytes"] == sum(p["total_bytes"] for p in parts)
    assert by[("smoke_masked", "sum", "wrong")]["status"] == "FAIL"

    path = write_results(rows, tmp_path, {"note": "test"})
    loaded = json.loads(path.read_text())
    assert isinstance(loaded, list) and len(loaded) == len(rows)
    table = format_table(rows)
    assert "FAIL" in table and "smoke_indexed" in table and "refcheck" in table


def test_interleaved_rows_prepare_together_and_release(monkeypatch, extra_providers):
    """`run_bench(interleave=...)`'s bookkeeping, with the CUDA calls replaced: every provider of a
    problem is prepared and checked before any is timed, only the ones that passed are timed
    (together, one `measure_interleaved` call a problem), every one is released after; a timing
    failure marks the timed rows error. On the CPU itself `interleave` is ignored."""
    import types

    from lowbit.bench import driver
    from lowbit.bench.timing import Timing

    events = []

    class Logged(TorchProvider):
        name = "logged"

        def prepare(self, problem):
            events.append(("prepare", self.name))
            super().prepare(problem)

        def release(self):
            events.append(("release", self.name))
            super().release()

    class Logged2(Logged):
        name = "logged2"

    def fake_interleaved(fns, rounds, device):
        events.append(("time", len(fns)))
        assert rounds == 7
        return {k: Timing(10.0 + i, 9.0, 11.0 + i, 8.0, 10.0, rounds, True, True, "cuda_event")
                for i, k in enumerate(fns)}

    monkeypatch.setitem(PROVIDERS, "logged", Logged)
    monkeypatch.setitem(PROVIDERS, "logged2", Logged2)
    monkeypatch.setattr(driver, "measure_interleaved", fake_interleaved)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    cuda = types.SimpleNamespace(type="cuda")
    entries = []
    for name in ("logged", "wrong", "logged2"):
        problem = build_problem(CASES["smoke_indexed"], "gate_up", "cpu")
        row = dict.fromkeys(ROW_KEYS)
        row.update(total_bytes=1000, flops=2000)
        entries.append((PROVIDERS[name](), row, problem, lambda out, p=problem: refcheck(out, p), (4.5, 678.0)))
    driver._check_then_time(entries, cuda, None, lambda m: None, interleave=7)
    assert [e[0] for e in events] == ["prepare", "prepare", "time", "release", "release"], events
    assert events[2] == ("time", 2)  # the provider that failed its check is not timed
    rows = [e[1] for e in entries]
    assert [r["status"] for r in rows] == ["ok", "FAIL", "ok"]
    assert rows[0]["median_us"] == 10.0 and rows[2]["median_us"] == 11.0 and rows[0]["reps"] == 7
    assert rows[0]["tb_per_s"] == pytest.approx(1000 / 10e-6 / 1e12)

    def broken(fns, rounds, device):
        raise RuntimeError("graph capture failed")

    monkeypatch.setattr(driver, "measure_interleaved", broken)
    for _, row, *_ in entries:
        row.update(status=None, median_us=None)
    driver._check_then_time(entries, cuda, None, lambda m: None, interleave=7)
    assert [r["status"] for r in rows] == ["error", "FAIL", "error"]
    assert "graph capture failed" in rows[0]["message"]
    cpu_rows = run_bench(select_cases(["smoke_indexed"]), ["torch"], device="cpu", timing={"min_reps": 3},
                         progress=None, interleave=5)
    assert all(r["status"] == "ok" and r["median_us"] > 0 for r in cpu_rows)
    cases_mod.clear_weight_cache()


def test_providers_that_cannot_be_captured_are_timed_eagerly(monkeypatch, extra_providers):
    """A provider with ``graph_capturable = False`` (the quantizers' torch references sync with
    the host, which CUDA-graph capture refuses) is timed by `measure` with ``cuda_graph=False``
    under ``--cuda-graph`` and under ``--interleave``; the others keep the graph."""
    import types

    from lowbit.bench import driver
    from lowbit.bench.ops import QuantTorchRef
    from lowbit.bench.timing import Timing

    assert QuantTorchRef.graph_capturable is False
    seen = []

    class Eager(TorchProvider):
        name = "eager"
        graph_capturable = False

    def fake_measure(fn, device=None, **kw):
        seen.append(("measure", kw.get("cuda_graph")))
        return Timing(5.0, 4.0, 6.0, 3.0, 5.0, 3, True, bool(kw.get("cuda_graph")), "cuda_event")

    def fake_interleaved(fns, rounds, device):
        seen.append(("interleaved", len(fns)))
        return {k: Timing(7.0, 6.0, 8.0, 5.0, 7.0, rounds, True, True, "cuda_event") for k in fns}

    monkeypatch.setitem(PROVIDERS, "eager", Eager)
    monkeypatch.setattr(driver, "measure", fake_measure)
    monkeypatch.setattr(driver, "measure_interleaved", fake_interleaved)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    cuda = types.SimpleNamespace(type="cuda")

    def entries():
        out = []
        for name in ("eager", "torch"):
            problem = build_problem(CASES["smoke_indexed"], "gate_up", "cpu")
            row = dict.fromkeys(ROW_KEYS)
            row.update(total_bytes=1000, flops=2000)
            out.append((PROVIDERS[name](), row, problem, lambda o, p=problem: refcheck(o, p), (4.5, 678.0)))
        return out

    e = entries()
    driver._check_then_time(e, cuda, {"cuda_graph": True}, lambda m: None)
    assert seen == [("measure", False), ("measure", True)]
    assert [r[1]["cuda_graph"] for r in e] == [False, True]
    seen.clear()
    e = entries()
    driver._check_then_time(e, cuda, {"cuda_graph": True}, lambda m: None, interleave=3)
    assert seen == [("measure", False), ("interleaved", 1)]
    assert [r[1]["status"] for r in e] == ["ok", "ok"] and e[1][1]["median_us"] == 7.0
    cases_mod.clear_weight_cache()


def test_refcheck_rejects_wrong_shape_and_nan():
    p = build_problem(CASES["smoke_masked"], "down", "cpu")
    prov = TorchProvider()
    prov.prepare(p)
    out = prov.run()
    assert refcheck(out, p)[0]
    assert not refcheck(out[:-1], p)[0]
    out[p.route_out[0]] = float("nan")
    assert not refcheck(out, p)[0]
    cases_mod.clear_weight_cache()


def test_plot_when_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib")
    from lowbit.bench.plot import plot_results

    rows = run_bench(select_cases(["smoke_indexed"]), ["torch"], device="cpu", timing={"min_reps": 3}, progress=None)
    assert plot_results(rows, tmp_path / "bench.png").stat().st_size > 0


# -- timing --------------------------------------------------------------------------------
def test_quantiles_and_cpu_timing():
    assert quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert quantile([0.0, 10.0], 0.2) == pytest.approx(2.0)
    t = measure(lambda: torch.ones(8).sum(), device="cpu", min_reps=5)
    assert t.clock == "perf_counter" and t.reps == 5 and t.p20_us <= t.median_us <= t.p80_us
    with pytest.raises(ValueError, match="flush_mode"):
        measure(lambda: None, device="cpu", flush_mode="zero")
    with pytest.raises(ValueError, match="CUDA"):
        measure_interleaved({"a": lambda: None}, device="cpu")


@pytest.mark.gpu
def test_interleaved_timing_orders_by_work():
    """Two graph-captured callables, one doing 8x the other's reads: one sample per round
    each, and the bigger one measured slower."""
    x = torch.randn(1 << 24, device="cuda")
    small, big = x[: 1 << 21], x
    t = measure_interleaved({"small": lambda: small.sum(), "big": lambda: big.sum()}, rounds=20)
    assert set(t) == {"small", "big"} and t["small"].reps == t["big"].reps == 20
    assert t["big"].median_us > 2 * t["small"].median_us and t["big"].cuda_graph and t["big"].l2_flushed


@pytest.mark.gpu
def test_run_bench_interleaved_on_the_gpu():
    """`run_bench(interleave=...)` on the GPU: the providers of each problem timed together
    (CUDA graphs, L2 flushed), each row ok with one sample a round."""
    rows = run_bench(select_cases(["smoke_indexed"]), ["lowbit", "torch"], device="cuda", progress=None,
                     interleave=6)
    timed = [r for r in rows if r["projection"] != "sum"]
    assert len(timed) == 4 and all(r["status"] == "ok" for r in timed), [(r["provider"], r["message"]) for r in timed]
    assert all(r["reps"] == 6 and r["cuda_graph"] and r["l2_flushed"] for r in timed)


# -- CLI -----------------------------------------------------------------------------------
def test_cli_env_and_show_config():
    r = _cli("env", "--json")
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)
    assert env["torch"] == torch.__version__ and "cuda_available" in env and "triton" in env
    r = _cli("show-config")
    assert r.returncode == 0 and "w4a16_indexed" in r.stdout and "block_m=" in r.stdout
    one = ("show-config", "--routes", "8", "--experts", "48", "--n", "4096", "--k", "7168")
    r = _cli(*one)  # one shape, as chosen on sm_90 (register-A Gluon decode) and off it (Triton)
    assert r.returncode == 0 and "engine=gluon_rs" in r.stdout, r.stdout
    r = _cli(*one, "--no-sm90")
    assert r.returncode == 0 and "engine=triton" in r.stdout and "split_k=2" in r.stdout, r.stdout


def test_cli_bench_list():
    r = _cli("bench", "--list")
    assert r.returncode == 0, r.stderr
    for name in DEFAULT_CASE_NAMES:
        assert name in r.stdout
    for name in ("decode_oc_mxfp8_t16", "fp8_gemm_m4096_n5120_k2304", "fp4_gemm_m16_n2304_k5120",
                 "act_quant_16384x7168", "fp4_quant_16384x7168", "sparse_attn_decode", "sparse_attn_prefill",
                 "hc_split_sinkhorn_t16384"):
        assert name in r.stdout


def test_cli_bench_without_gpu_runs_the_checks():
    # CUDA hidden: the plain `bench` takes the no-GPU path on any machine whose numpy the
    # interpreter accepts (the H200 image ships numpy 2.5: there the path is tested by CI)
    from lowbit.cli import interpreter_numpy_problem

    if interpreter_numpy_problem():
        pytest.skip(interpreter_numpy_problem())
    r = _cli("bench", env_extra={"CUDA_VISIBLE_DEVICES": ""}, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Timing needs a CUDA GPU" in r.stdout
    assert "TRITON_INTERPRET=1" in r.stdout
    assert "FAIL" not in r.stdout


def test_imports_do_not_initialize_cuda():
    code = ("import torch, lowbit, lowbit.bench, lowbit.cli, lowbit.bench.plot; "
            "print(torch.cuda.is_initialized())")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_every_tuning_override_is_documented():
    """docs/tuning.md names every LOWBIT_* override a kernel family reads."""
    import pathlib

    from lowbit.cli import _show_config_sections

    doc = (pathlib.Path(__file__).parent.parent / "docs" / "tuning.md").read_text()
    names = [k for _, knobs, _ in _show_config_sections() for k in knobs]
    assert len(names) >= 30
    missing = [k for k in names if k not in doc]
    assert not missing, f"undocumented overrides: {missing}"
