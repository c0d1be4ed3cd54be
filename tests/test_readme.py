"""The README's Python snippets run as printed, on generated data laid out
where they look for it."""

from __future__ import annotations

import ast
import glob
import importlib.util
import re
from pathlib import Path

import h5py
import pytest
import webdataset as wds
from chute.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[tuple[int, str]]:
    """(line, code) of every ```python block of the README."""
    text = README.read_text(encoding="utf-8")
    blocks = []
    for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        blocks.append((text.count("\n", 0, match.start()) + 2, match.group(1)))
    return blocks


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the README says to run before its examples: `chute sample-data`."""
    root = tmp_path_factory.mktemp("readme")
    assert main(["sample-data", str(root)]) == 0
    return root


def test_sample_data_is_what_the_readme_reads(layout: Path) -> None:
    text = README.read_text(encoding="utf-8")
    assert "chute sample-data" in text.split("## Use")[1].split("```python")[0]
    assert len(list((layout / "shards").glob("train-*.tar"))) == 128
    first = list(wds.WebDataset(str(layout / "shards/train-000000.tar"), shardshuffle=False))
    assert [s["__key__"] for s in first] == [f"trial{i:05d}" for i in range(12)]
    assert set(first[0]) >= {"jpg", "cls", "nsdgeneral.npy", "trial.npy"}
    with h5py.File(layout / "sessions/s1.h5") as f:
        assert f["betas"].shape == (600, 16)
        assert list(f["coco_ids"][:2]) == [600, 601]
    assert (layout / "data.h5").exists() and (layout / "questions.npy").exists()


def test_the_readme_command_lines_run_on_it(
    layout: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(layout)
    text = README.read_text(encoding="utf-8")
    assert "chute inspect shards/*.tar data.h5" in text
    assert main(["inspect", *sorted(glob.glob("shards/*.tar"))[:2], "data.h5"]) == 0
    assert "data.h5" in capsys.readouterr().out


def test_the_readme_has_the_snippets_this_test_runs() -> None:
    assert len(python_blocks()) >= 3


@pytest.mark.parametrize("line", [line for line, _ in python_blocks()])
def test_readme_snippet_runs(layout: Path, monkeypatch: pytest.MonkeyPatch, line: int) -> None:
    code = dict(python_blocks())[line]
    monkeypatch.chdir(layout)
    namespace: dict[str, object] = {"__name__": "readme"}
    exec(compile(code, f"README.md:{line}", "exec"), namespace)


def test_the_demo_runs_on_the_installed_package_alone() -> None:
    # scripts/demo.sh installs chute as a user does, without chute_testing
    # (the tests' module, which the wheel does not ship).
    benchmarks = README.parent / "benchmarks"
    spec = importlib.util.spec_from_file_location("run_all", benchmarks / "run_all.py")
    assert spec is not None and spec.loader is not None
    run_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_all)
    scripts = [script for script, _ in run_all.DEMO_SCRIPTS]
    assert scripts == ["bench_wds.py", "bench_h5.py"]
    # Each script and the benchmark modules it imports, at any depth; only
    # imports at a module's top level or in a function count as running.
    seen: set[str] = set()
    todo = ["common.py", *scripts]
    while todo:
        script = todo.pop()
        if script in seen:
            continue
        seen.add(script)
        tree = ast.parse((benchmarks / script).read_text(encoding="utf-8"))
        imported = {
            alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
        }
        local = {name for name in imported if (benchmarks / f"{name}.py").exists()}
        todo += [f"{name}.py" for name in local]
        outside_functions = {
            alias.name.split(".")[0]
            for node in tree.body
            if isinstance(node, ast.Import)
            for alias in node.names
        } | {
            (node.module or "").split(".")[0]
            for node in tree.body
            if isinstance(node, ast.ImportFrom)
        }
        assert "chute_testing" not in outside_functions, script
        if script in scripts or script == "common.py":
            assert "chute_testing" not in imported, script
    assert "decode_limit.py" in seen
