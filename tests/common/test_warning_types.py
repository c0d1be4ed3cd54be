"""chute's warnings live in one module, with one naming style, and the
names of earlier releases still match what is raised."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import chute
import pytest
from chute.common import warning_types

PACKAGE = Path(chute.__file__).parent


def test_no_module_but_warning_types_defines_a_warning_class() -> None:
    elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "warning_types.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Warning"):
                elsewhere.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert elsewhere == []


def test_every_warning_class_is_exported_under_its_name() -> None:
    classes = {
        name: value
        for name, value in vars(warning_types).items()
        if isinstance(value, type) and issubclass(value, Warning)
    }
    current = {name for name, cls in classes.items() if cls.__name__ == name}
    assert current, "no warning classes found"
    for name in current:
        assert not name.startswith("Chute"), name
        assert getattr(chute, name) is classes[name] and name in chute.__all__


@pytest.mark.parametrize(
    ("old", "new"),
    [("ChuteSlowPathWarning", "SlowPathWarning"), ("ChuteIndexWarning", "IndexNotSavedWarning")],
)
def test_old_names_catch_what_is_raised(old: str, new: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("x", getattr(chute, new), stacklevel=1)
    assert issubclass(caught[0].category, getattr(chute, old))
