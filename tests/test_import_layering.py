"""The package's modules form layers: no import cycles, and the light layers (the
wire types, the engine core, the client) load without the heavy stacks.

A cycle makes import order matter and lets a low module reach into a high one;
the client and the protocol are installed by users who have no torch or server.
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import sluiceway

PACKAGE_ROOT = Path(sluiceway.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(path: Path, *, type_checking: bool = True) -> set[str]:
    """Every module name that `path` imports, at any depth (imports inside
    functions included; those under `if TYPE_CHECKING:` only with `type_checking`).
    For `from pkg import name` both `pkg` and `pkg.name` are listed: `name` may be
    a submodule."""
    module = _module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for statement in (child.body if type_checking else []) + child.orelse:
                    visit_one(statement)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
        else:
            visit(node)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return names


def _import_graph(*, type_checking: bool = True) -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE_ROOT.rglob("*.py")}
    return {
        module: {
            name
            for name in _imported_names(path, type_checking=type_checking)
            if name in paths and name != module
        }
        for module, path in paths.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_from_imports_are_resolved():
    graph = _import_graph()
    # `from . import prompts` in api/app.py names the submodule.
    assert "sluiceway.api.pipeline.prompts" in graph["sluiceway.api.app"]
    assert "sluiceway.engine.arrivals" in graph["sluiceway.engine.engine"]


def test_imports_for_type_checking_count_as_edges():
    graph = _import_graph()
    runtime = _import_graph(type_checking=False)
    # api/__init__.py names its entry points for type checkers only (loaded lazily).
    assert "sluiceway.api.app" in graph["sluiceway.api"]
    assert "sluiceway.api.app" not in runtime["sluiceway.api"]


def test_no_module_imports_itself_back_through_others():
    """Counting the imports made for type checking: a cycle there is still two
    modules that each need the other to be read."""
    cycles = _cycles(_import_graph())
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_only_the_app_imports_a_surface_routes_module():
    """A surface's routes are its HTTP endpoints and nothing else reuses them: what
    two surfaces share lives in the pipeline or the plumbing (`api/pipeline`,
    `api/http`), and the app alone assembles the routes."""
    graph = _import_graph()
    routes = {m for m in graph if m.endswith(".routes")}
    assert "sluiceway.api.openai_chat.routes" in routes
    importers = {
        (module, name) for module, names in graph.items() for name in names & routes
    }
    assert {module for module, _ in importers} == {"sluiceway.api.app"}, sorted(importers)


_HEAVY = ("torch", "triton", "transformers", "hypercorn", "quart", "quart_trio", "httptools")


def _loaded_after_import(module: str) -> set[str]:
    probe = (
        "import json, sys\n"
        f"import {module}\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return set(json.loads(out))


def _package_of(module: str) -> set[str]:
    """`module` and every package above it: a.b.c -> {a, a.b, a.b.c}."""
    parts = module.split(".")
    return {".".join(parts[: i + 1]) for i in range(len(parts))}


def _top_levels(loaded: set[str]) -> set[str]:
    return {name.split(".")[0] for name in loaded}


@pytest.mark.parametrize("module", ["sluiceway.protocol", "sluiceway.engine.core"])
def test_the_wire_types_and_the_engine_core_need_no_framework(module):
    loaded = _loaded_after_import(module)
    assert not _top_levels(loaded) & {*_HEAVY, "trio"}
    assert not {m for m in loaded if _package_of(m) & {"sluiceway.api", "sluiceway.runner"}}


def test_the_client_needs_trio_and_nothing_of_the_server():
    loaded = _loaded_after_import("sluiceway.client")
    assert "trio" in loaded
    assert not _top_levels(loaded) & set(_HEAVY)
    server_side = {"sluiceway.api", "sluiceway.runner", "sluiceway.bench", "sluiceway.cli"}
    assert not {m for m in loaded if _package_of(m) & server_side}


# Packages whose `__init__` names what other packages may use (`__all__`): public
# names, and public submodules that may be imported (with whatever lies below them).
CURATED_PACKAGES = ("sluiceway.engine", "sluiceway.protocol", "sluiceway.runner", "sluiceway.transport")


def _private_imports(package: str) -> list[str]:
    """'importer -> target' for each import, by a module outside `package`, of a
    name or submodule of `package` that its `__all__` does not list."""
    public = set(importlib.import_module(package).__all__)
    found = []
    for path in PACKAGE_ROOT.rglob("*.py"):
        module = _module_name(path)
        if module == package or module.startswith(package + "."):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                if node.module == package:
                    targets = [f"{package}.{alias.name}" for alias in node.names]
                else:
                    targets = [node.module]
            else:
                continue
            for target in targets:
                if not target.startswith(package + "."):
                    continue
                first = target[len(package) + 1 :].split(".")[0]
                if first not in public:
                    found.append(f"{module} -> {target}")
    return sorted(found)


@pytest.mark.parametrize("package", CURATED_PACKAGES)
def test_other_packages_use_only_what_a_package_makes_public(package):
    assert _private_imports(package) == []


def test_an_import_of_a_private_module_is_found(monkeypatch):
    engine = importlib.import_module("sluiceway.engine")
    monkeypatch.setattr(engine, "__all__", [m for m in engine.__all__ if m != "outputs"])
    found = _private_imports("sluiceway.engine")
    assert "sluiceway.api.pipeline.request_run -> sluiceway.engine.outputs" in found
