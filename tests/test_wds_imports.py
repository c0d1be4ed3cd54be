"""The modules of chute.wds import one another in one direction: their
imports (type-only ones included) form no circle, none is held off by an
import inside a function, and no module outside a stage's class asks which
kind a stage is. Read from the sources, without importing them."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PACKAGE = "chute.wds"


def package_sources() -> dict[str, Path]:
    """Every module of chute.wds by dotted name (a package by its own name)."""
    spec = importlib.util.find_spec("chute")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations))) / "wds"
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join([PACKAGE, *parts])] = path
    return modules


def imported_modules(node: ast.AST, modules: dict[str, Path]) -> list[str]:
    """The chute.wds modules an import statement loads."""
    out: list[str] = []
    if isinstance(node, ast.Import):
        out = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
        for alias in node.names:
            submodule = f"{node.module}.{alias.name}"
            out.append(submodule if submodule in modules else node.module)
    return [name for name in out if name in modules]


def imports_of(path: Path, modules: dict[str, Path]) -> tuple[set[str], list[str]]:
    """The chute.wds modules `path` imports anywhere (type-only imports
    included), and those it imports inside a function."""
    tree = ast.parse(path.read_text(), str(path))
    everywhere: set[str] = set()
    in_functions: list[str] = []
    for node in ast.walk(tree):
        everywhere.update(imported_modules(node, modules))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                for name in imported_modules(inner, modules):
                    in_functions.append(f"{name} (in {node.name})")
    return everywhere, in_functions


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of `graph`, as the modules along it, or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for target in sorted(graph[module]):
            circle = visit(target)
            if circle is not None:
                return circle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        circle = visit(module)
        if circle is not None:
            return circle
    return None


def test_wds_modules_import_one_another_without_a_circle() -> None:
    modules = package_sources()
    assert {"chute.wds.dataset", "chute.wds.run", "chute.wds.elastic_stream"} <= set(modules)
    graph: dict[str, set[str]] = {}
    late: dict[str, list[str]] = {}
    for name, path in modules.items():
        everywhere, in_functions = imports_of(path, modules)
        graph[name] = everywhere - {name}
        if in_functions:
            late[name] = in_functions
    assert late == {}, "imports inside functions hold off a circle"
    circle = find_circle(graph)
    assert circle is None, " -> ".join(circle or [])


def test_the_circle_finder_finds_one() -> None:
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_only_a_stage_class_knows_its_kind() -> None:
    """No module compares a stage's kind (but the registry of the stage
    classes, which keeps one class per kind): what a kind does is in its
    class."""
    compared: list[str] = []
    for name, path in package_sources().items():
        if name == "chute.stream.stages.base":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(
                    (isinstance(o, ast.Attribute) and o.attr == "kind")
                    or (isinstance(o, ast.Name) and o.id == "kind")
                    for o in operands
                ):
                    compared.append(f"{name}:{node.lineno}")
    assert compared == []
