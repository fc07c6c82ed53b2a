"""Every `from lowbit... import name` in scripts/ resolves against the package as it is, so a
probe or sweep cannot silently rot when the library's internals move."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").rglob("*.py"))


def _lowbit_imports(path: Path) -> list[tuple[str, str | None, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("lowbit"):
            out.extend((node.module, a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.Import):
            out.extend((a.name, None, node.lineno) for a in node.names if a.name.startswith("lowbit"))
    return out


@pytest.mark.parametrize("path", SCRIPTS, ids=[str(p.relative_to(ROOT)) for p in SCRIPTS])
def test_script_imports_resolve(path: Path):
    missing = []
    for mod, name, line in _lowbit_imports(path):
        m = importlib.import_module(mod)
        if name is not None and not hasattr(m, name):
            try:
                importlib.import_module(f"{mod}.{name}")
            except ImportError:
                missing.append(f"line {line}: {mod}.{name}")
    assert not missing, f"{path.relative_to(ROOT)} imports names lowbit no longer has:\n" + "\n".join(missing)
