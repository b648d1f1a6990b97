"""The package's shape, checked from every import statement (at any nesting level) of eagle/ and
kernels/: no import circles, kernels/ are leaves, the algorithm imports nothing of the CPU backend,
and the drafter interface package does not reach up into the heads."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"eagle": ROOT / "eagle", "eagle_kernels": ROOT / "kernels"}  # import name -> folder


def _module_files() -> dict[str, Path]:
    """Every module of the two packages by dotted name (a package by its ``__init__``)."""
    mods = {}
    for name, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([name, *parts])] = path
    return mods


MODULES = _module_files()


def _resolve(name: str) -> str | None:
    """The longest known module a dotted import name falls in (``None``: outside the project)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str) -> set[str]:
    """The project modules ``module`` imports anywhere in its file (functions included)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import sub`` imports the submodule ``pkg.sub`` where there is one
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def _reaches(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in GRAPH[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_scan_sees_nested_and_relative_imports():
    """The scan itself: a function-level relative import and ``from pkg import submodule`` count."""
    assert "eagle.backends.cpu.packed" in GRAPH["eagle.backends.cpu"]  # from .packed import ...
    assert "eagle_kernels.cpu_gemm" in GRAPH["eagle_kernels.cpu_attention"]  # from . import cpu_gemm
    assert "eagle.backends" in GRAPH["eagle.train.common"]  # inside a function


def test_no_import_circles():
    circles = sorted(m for m in MODULES if m in _reaches(m))
    assert not circles, f"modules on an import circle: {circles}"


def test_kernels_are_leaves():
    bad = {m: sorted(t for t in GRAPH[m] if t.split(".")[0] == "eagle") for m in MODULES if m.startswith("eagle_kernels")}
    assert not {m: t for m, t in bad.items() if t}


CPU_BACKEND = ("eagle.backends.cpu", "eagle_kernels.cpu_gemm", "eagle_kernels.cpu_argmax", "eagle_kernels.cpu_attention",
               "eagle_kernels.weightmemo", "eagle_kernels.onednn")
ALGORITHM = ["eagle.tree", "eagle.verify", "eagle.decoder", "eagle.target"] + sorted(m for m in MODULES
                                                                                     if (m == "eagle.draft" or m.startswith("eagle.draft.")))


@pytest.mark.parametrize("module", ALGORITHM)
def test_the_algorithm_imports_nothing_of_the_cpu_backend(module):
    """Directly, at any level of the file: the CPU backend is reached only through eagle.backends'
    name lookup (``make_backend``)."""
    bad = [t for t in GRAPH[module] if t.startswith(CPU_BACKEND)]
    assert not bad


@pytest.mark.parametrize("module", sorted(m for m in MODULES if (m == "eagle.draft" or m.startswith("eagle.draft."))))
def test_the_drafter_interface_does_not_import_the_heads(module):
    assert not [t for t in GRAPH[module] if t.startswith("eagle.heads")]
