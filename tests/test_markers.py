"""scripts/sanitize.sh picks its Python tests by the `native` marker, not by
a list of paths: a module marks itself (``pytestmark = pytest.mark.native``)
and the script runs ``pytest -m native``. Read from the sources, without
importing them."""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(os.environ.get("CHUTE_SOURCE_ROOT") or Path(__file__).resolve().parent.parent)


def is_native_mark(node: ast.AST) -> bool:
    """Whether `node` is ``pytest.mark.native``."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "native"
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
    )


def native_tests() -> list[str]:
    """The modules marked native as a whole, and the functions marked alone
    (as path or path::name)."""
    marked = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "pytestmark"
                for target in node.targets
            ):
                marks = node.value.elts if isinstance(node.value, ast.List) else [node.value]
                if any(is_native_mark(mark) for mark in marks):
                    marked.append(relative)
            elif isinstance(node, ast.FunctionDef | ast.ClassDef) and any(
                is_native_mark(getattr(d, "func", d)) for d in node.decorator_list
            ):
                marked.append(f"{relative}::{node.name}")
    return marked


def test_the_sanitizer_has_tests_to_run():
    marked = native_tests()
    assert marked, "no test is marked native: scripts/sanitize.sh would run none"
    # The engine's own thread and GIL tests are among them.
    assert "tests/native/test_bindings_gil.py" in marked


def test_the_sanitizer_selects_by_the_marker():
    script = (ROOT / "scripts" / "sanitize.sh").read_text(encoding="utf-8")
    assert 'tests=("$root/tests" -m native)' in script
    assert "tests/native/test_" not in script  # no list of paths beside the marker
    # Registered (the suite runs with --strict-markers).
    assert '  "native: ' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


def test_the_conformance_suite_runs_under_the_sanitizers():
    marked = native_tests()
    for module in (
        "tests/conformance/test_kind_epochs.py",
        "tests/conformance/test_kind_lifecycle.py",
    ):
        assert module in marked
