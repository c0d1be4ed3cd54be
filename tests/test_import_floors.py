"""chute's packages stand on floors: a module imports only from its own
package or from packages on lower floors, and no modules import one another
in a circle. Every import counts, those inside functions and under
TYPE_CHECKING included. Read from the sources, without importing them."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

# Bottom to top. Packages on one floor do not import each other.
FLOORS: dict[str, int] = {
    "chute._core": 0,
    "chute.common": 1,
    "chute.decoding": 2,
    "chute.gpu": 2,
    "chute.remote": 3,
    "chute.sources": 4,
    "chute.stream": 5,
    "chute.workers": 5,
    "chute.tokenize": 5,
    "chute.loader": 6,
    "chute.datasets": 7,
    "chute.wds": 8,
    "chute.table_streams": 9,
    "chute.frameworks": 9,
    "chute.kinds": 10,
    "chute.cli": 11,
    "chute": 12,
}

# Imports up the floors that compatibility keeps, for the type checker only
# (under TYPE_CHECKING; the value is set from above): chute.wds.ParquetStream
# names chute.table_streams' class, which builds on chute.wds.dataset.
COMPATIBILITY_ALIASES = {("chute.wds", "chute.table_streams.parquet")}

# The compiled extension has no Python source.
COMPILED = {"chute._core"}


def package_sources() -> dict[str, Path]:
    """Every module of chute by dotted name (a package by its own name)."""
    spec = importlib.util.find_spec("chute")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = ["chute", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def package_of(module: str) -> str:
    """The floor-table entry a module belongs to: ``chute.<first part>``, or
    ``chute`` itself for the top package and ``chute.__main__``."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "chute"
    return ".".join(parts[:2])


def imported_modules(node: ast.AST, module: str, known: set[str]) -> list[str]:
    """The chute modules an import statement loads (a name imported from a
    package counts as its submodule when there is one)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        assert node.level == 0, f"{module}: a relative import (chute imports by absolute name)"
        base = node.module or ""
        names = []
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            names.append(submodule if submodule in known else base)
    else:
        return []
    return [name for name in names if name in known]


def import_graph() -> dict[str, set[str]]:
    """Each chute module and the chute modules it imports anywhere."""
    sources = package_sources()
    known = set(sources) | COMPILED
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets.update(imported_modules(node, module, known))
        graph[module] = targets - {module}
    return graph


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
        for target in sorted(graph.get(module, ())):
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


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a package on the same or a higher floor than the importer's."""
    found: list[str] = []
    for module, targets in sorted(graph.items()):
        here = package_of(module)
        for target in sorted(targets):
            there = package_of(target)
            if there == here or (module, target) in COMPATIBILITY_ALIASES:
                continue
            if here not in FLOORS or there not in FLOORS:
                found.append(f"{module} -> {target} (not in the floor table)")
            elif FLOORS[there] >= FLOORS[here]:
                found.append(f"{module} -> {target}")
    return found


def test_every_module_is_in_a_package_of_the_floor_table() -> None:
    unplaced = sorted(m for m in package_sources() if package_of(m) not in FLOORS)
    assert unplaced == []


def test_no_package_imports_one_on_its_floor_or_above() -> None:
    graph = import_graph()
    assert {"chute.wds.dataset", "chute.cli.main"} <= set(graph)
    assert upward_imports(graph) == []


def test_modules_import_one_another_without_a_circle() -> None:
    circle = find_circle(import_graph())
    assert circle is None, " -> ".join(circle or [])


def test_the_checks_find_a_circle_and_an_upward_import() -> None:
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    graph = {"chute.common.errors": {"chute.wds.run"}, "chute.wds.run": {"chute._core"}}
    assert upward_imports(graph) == ["chute.common.errors -> chute.wds.run"]


def test_imports_inside_functions_and_for_type_checking_count() -> None:
    known = {"chute.loader.protocol", "chute.workers.pool", "chute.workers"}
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from chute.workers.pool import WorkerPool\n"
        "def f():\n"
        "    from chute.workers import pool\n"
    )
    found = [t for n in ast.walk(tree) for t in imported_modules(n, "chute.loader.protocol", known)]
    assert found == ["chute.workers.pool", "chute.workers.pool"]


def test_the_stream_pipeline_imports_nothing_inside_a_function() -> None:
    """chute.stream and chute.wds, once held in a circle by imports inside
    functions, import everything they use at the top."""
    sources = package_sources()
    known = set(sources) | COMPILED
    late: list[str] = []
    for name, path in sources.items():
        if package_of(name) not in ("chute.stream", "chute.wds"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    for target in imported_modules(inner, name, known):
                        late.append(f"{name}: {target} (in {node.name})")
    assert late == []


def test_only_a_stage_class_knows_its_kind() -> None:
    """No module compares a stage's kind (but the registry of the stage
    classes, which keeps one class per kind): what a kind does is in its
    class."""
    compared: list[str] = []
    for name, path in package_sources().items():
        if package_of(name) not in ("chute.stream", "chute.wds"):
            continue
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


def test_a_test_file_imports_test_modules_of_its_own_folder_only() -> None:
    # pytest puts a test file's folder on sys.path when it imports the file, so
    # a test module of another folder resolves only when that folder's files
    # happened to be collected first: shared checks go in tests/helpers.py.
    tests = Path(__file__).resolve().parent
    by_name = {p.stem: p.parent for p in tests.rglob("test_*.py")}
    strays = []
    for path in tests.rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                home = by_name.get(name.split(".")[0])
                if home is not None and home != path.parent:
                    strays.append(f"{path.relative_to(tests)} imports {name}")
    assert strays == []


def test_no_test_folder_is_named_as_a_module_the_tests_import() -> None:
    # pytest puts tests/ on sys.path, and a folder there without __init__.py
    # is a namespace package: where the module of that name is missing
    # (Hugging Face's datasets, say), the tests would import the folder.
    tests = Path(__file__).resolve().parent
    imported: set[str] = set()
    for path in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add((node.module or "").split(".")[0])
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "importorskip"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                imported.add(str(node.args[0].value).split(".")[0])
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert sorted(folders & imported) == []


def test_no_two_test_modules_share_a_name() -> None:
    # Test folders have no __init__.py, so pytest imports each module by its
    # file name alone: a second module of the same name fails collection.
    tests = Path(__file__).resolve().parent
    seen: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("*.py")):
        if "runs" in path.parts or "ddp" in path.parts:
            continue  # scripts run as programs, never imported by pytest
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}
