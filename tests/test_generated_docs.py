"""The docs' tables that the engine's tables define are generated from them
(scripts/gen_docs_tables.py): the committed text is what the script writes
from the chute._core this suite imports (the wheel in CI)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from chute import _core
from chute.decoding.extensions import IMAGE_EXTENSIONS, NATIVE_IMAGE_EXTENSIONS

ROOT = Path(os.environ.get("CHUTE_SOURCE_ROOT") or Path(__file__).resolve().parent.parent)


def _generator() -> ModuleType:
    path = ROOT / "scripts" / "gen_docs_tables.py"
    spec = importlib.util.spec_from_file_location("gen_docs_tables", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_tables_are_current():
    stale = [
        str(path.relative_to(ROOT))
        for path, text in _generator().generated().items()
        if path.read_text(encoding="utf-8") != text
    ]
    assert stale == [], f"{stale}: run scripts/gen_docs_tables.py"


def test_a_table_rows_come_from_the_engine():
    text = _generator().image_formats()
    for image_format in _core.image_formats():
        assert f"| {image_format.title} |" in text
    assert "| JPEG | `jpg`, `jpeg` | yes |" in text


def test_a_block_that_was_removed_is_an_error():
    generator = _generator()
    with pytest.raises(ValueError, match="expected one block between"):
        generator.render("no table here\n", "url-schemes")


def test_native_image_extensions_are_the_codec_tables():
    table = {
        extension for image_format in _core.image_formats() for extension in image_format.extensions
    }
    assert table == NATIVE_IMAGE_EXTENSIONS
    assert {"jpg", "jpeg", "png", "webp"} == NATIVE_IMAGE_EXTENSIONS
    # Each is one webdataset hands to its image decoder.
    assert NATIVE_IMAGE_EXTENSIONS <= IMAGE_EXTENSIONS
    assert {f.name for f in _core.image_formats()} == {"jpeg", "png", "webp"}


def _history_has(commits: tuple[str, ...]) -> bool:
    for commit in commits:
        found = subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
            capture_output=True,
        )
        if found.returncode != 0:
            return False
    return True


def test_the_extension_costs_are_counted_from_git():
    spec = importlib.util.spec_from_file_location(
        "extension_costs", ROOT / "scripts" / "extension_costs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    commits = tuple(c for extension in module.EXTENSIONS for c in extension.commits)
    if shutil.which("git") is None or not _history_has(commits):
        pytest.skip("the checkout has no git history to count from")
    text = module.DOC.read_text(encoding="utf-8")
    assert module.render(text) == text, "run scripts/extension_costs.py"
    assert "| WebP | image format | 37dc390 | 27 |" in module.table()
