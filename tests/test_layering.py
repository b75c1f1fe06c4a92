"""Layering rules of ``trl_ext``, checked on the source (an AST scan; nothing is imported).

(a) No module imports another module's private name (``from X import _name`` where ``_name`` is not a submodule).
    A helper shared inside a package lives under a public name in a private module (``pair/_checks.py: f64``).
(b) The core packages never import the dev assets (the testbed, the real model, the example scripts' support),
    not even lazily inside a function: built-ins reach the core through :mod:`trl_ext.registry`.
(c) No import circles. Every import counts, including those inside functions and under ``TYPE_CHECKING``; ``from
    pkg import name`` is an edge to ``pkg/__init__.py`` unless ``name`` is a submodule (then an edge to it).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "trl_ext"

CORE = ("trl_ext.estimators", "trl_ext.priors", "trl_ext.stats", "trl_ext.measurement", "trl_ext.advise",
        "trl_ext.generation", "trl_ext.trainers")
DEV = ("trl_ext.testbed", "trl_ext.realmodel", "trl_ext.scripts_support")


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module (a package means its __init__)
    name: str | None  # the name imported from ``target`` (None: the module itself)
    line: int


def _inside(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root`` (a package directory)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` reads from."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def import_edges(modules: dict[str, Path]) -> list[Edge]:
    """Every import of one module of ``modules`` by another, wherever it sits in the file."""
    edges = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                edges += [Edge(module, a.name, None, node.lineno) for a in node.names if a.name in modules]
            elif isinstance(node, ast.ImportFrom):
                base = _base(module, is_package, node)
                for a in node.names:
                    if f"{base}.{a.name}" in modules:
                        edges.append(Edge(module, f"{base}.{a.name}", None, node.lineno))
                    elif base in modules:
                        edges.append(Edge(module, base, a.name, node.lineno))
    return edges


def private_imports(edges: list[Edge]) -> list[str]:
    """Rule (a): ``from X import _name`` (single underscore, not a submodule)."""
    return [f"{e.source}:{e.line} imports {e.target}.{e.name}" for e in edges
            if e.name and e.name.startswith("_") and not e.name.startswith("__")]


def core_imports_of_dev(edges: list[Edge], core=CORE, dev=DEV) -> list[str]:
    """Rule (b): a core module importing a dev asset."""
    return [f"{e.source}:{e.line} imports {e.target}" for e in edges
            if _inside(e.source, core) and _inside(e.target, dev)]


def import_cycles(edges: list[Edge]) -> list[list[str]]:
    """Rule (c): the strongly connected components with more than one module (or a module importing itself)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:  # Tarjan; the package is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return import_edges(module_files(ROOT))


def test_no_private_name_is_imported_across_modules(edges):
    assert private_imports(edges) == []


def test_core_never_imports_the_dev_assets(edges):
    assert core_imports_of_dev(edges) == []


def test_no_import_cycles(edges):
    assert import_cycles(edges) == []


def test_the_scanner_finds_each_kind_of_violation(tmp_path):
    """A synthetic package with one violation of each rule (and legal look-alikes the scan must accept)."""
    pkg = tmp_path / "trl_ext"
    files = {
        "__init__.py": "",
        "_io.py": "def helper():\n    pass\n",
        "testbed/__init__.py": "",
        "stats/__init__.py": "from . import _shared\nfrom ._shared import f64\n",
        "stats/_shared.py": "def f64(x):\n    return x\n\ndef _hidden():\n    pass\n",
        "stats/a.py": ("from typing import TYPE_CHECKING\nfrom trl_ext._io import helper\n"
                       "from ._shared import _hidden\nif TYPE_CHECKING:\n    from .b import B\n"),
        "stats/b.py": "class B:\n    pass\n\ndef f():\n    from trl_ext.testbed import x\n    from .a import y\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    found = import_edges(module_files(pkg))
    assert private_imports(found) == ["trl_ext.stats.a:3 imports trl_ext.stats._shared._hidden"]
    assert core_imports_of_dev(found) == ["trl_ext.stats.b:5 imports trl_ext.testbed"]
    assert import_cycles(found) == [["trl_ext.stats.a", "trl_ext.stats.b"]]
