"""The package's import graph, read statically (function-level imports count: a lazy import that
dodges a circle is still a circle): no cycle anywhere, layers import only downwards, and kernel
families import each other only where declared."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: layers from the bottom up; a module may import its own layer and those below it
LAYERS = [
    ("lowbit.runtime", "lowbit._version", "lowbit.errors"),
    ("lowbit.formats",),
    ("lowbit.routing.layouts",),
    ("lowbit.reference",),
    ("lowbit.routing",),
    ("lowbit.kernels",),
    ("lowbit.layers",),
    ("lowbit.checkpoint", "lowbit.models"),
    ("lowbit.nn", "lowbit.testing", "lowbit.ops"),
    ("lowbit.integrations", "lowbit.bench"),
    ("lowbit.cli", "lowbit.__main__", "lowbit"),
]

#: kernel families and the other families each may import
FAMILY_USES = {
    "w4a16": set(),
    "moe_decode": {"w4a16"},
    "block_scaled": set(),
    "attention": set(),
}


def module_graph() -> dict[str, set[str]]:
    files = {}
    for f in (SRC / "lowbit").rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = f
    graph: dict[str, set[str]] = {m: set() for m in files}
    for m, f in files.items():
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = m.split(".") if is_pkg else m.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                # `from pkg import sub` depends on pkg.sub, not on pkg's __init__
                subs = [f"{mod}.{a.name}" for a in node.names]
                targets = [s if s in files else mod for s in subs]
            else:
                continue
            for t in targets:
                while t and t not in files:
                    t = t.rpartition(".")[0]
                # a package's __init__ re-exporting its own submodules is not a dependency
                if t and t != m and t.startswith("lowbit") and not (is_pkg and t.startswith(m + ".")):
                    graph[m].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _layer(mod: str) -> int:
    best, rank = -1, None
    for i, names in enumerate(LAYERS):
        for n in names:
            if (mod == n or mod.startswith(n + ".")) and len(n) > best:
                best, rank = len(n), i
    assert rank is not None, f"{mod} belongs to no layer of tests/test_layout.py"
    return rank


def test_no_import_cycle():
    assert _cycles(module_graph()) == []


def test_imports_run_downwards():
    graph = module_graph()
    up = [f"{m} -> {t}" for m, ts in graph.items() for t in ts if _layer(t) > _layer(m)]
    assert up == [], "imports from a lower layer into a higher one:\n" + "\n".join(sorted(up))


def test_families_import_only_declared_families():
    graph = module_graph()
    bad = []
    for m, ts in graph.items():
        parts = m.split(".")
        if len(parts) < 3 or parts[1] != "kernels" or parts[2] not in FAMILY_USES:
            continue
        for t in ts:
            tp = t.split(".")
            if len(tp) >= 3 and tp[1] == "kernels" and tp[2] in FAMILY_USES and tp[2] != parts[2]:
                if tp[2] not in FAMILY_USES[parts[2]]:
                    bad.append(f"{m} -> {t}")
    assert bad == [], "undeclared imports between kernel families:\n" + "\n".join(sorted(bad))


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
