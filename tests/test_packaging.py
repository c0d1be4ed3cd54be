"""Packaging: the committed stub matches the compiled module, the package ships
its typing markers, and in CI mode (scripts/test.sh sets CHUTE_TEST_INSTALLED)
the suite runs against the installed wheel, not the source tree."""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

import chute
import pytest
from helpers import child_env

ROOT = Path(os.environ.get("CHUTE_SOURCE_ROOT") or Path(__file__).resolve().parent.parent)
PACKAGE = Path(chute.__file__).resolve().parent
INSTALLED = os.environ.get("CHUTE_TEST_INSTALLED") == "1"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gen_stubs() -> ModuleType:
    return _script("gen_stubs")


native_deps = _script("native_deps")
# The libraries the repaired wheel carries, by their file names' stems
# ("libjpeg" of libjpeg.so.62).
BUNDLED = [soname.split(".so")[0] for soname in native_deps.values("soname", wheel="bundled")]


def test_stub_is_up_to_date():
    # Regenerated from the chute._core this suite imports (the wheel in CI).
    generated = _gen_stubs().generate()
    committed = (ROOT / "python" / "chute" / "_core.pyi").read_text(encoding="utf-8")
    assert generated == committed, "python/chute/_core.pyi is stale: run scripts/gen_stubs.py"


def test_stub_covers_every_public_name():
    stub = (ROOT / "python" / "chute" / "_core.pyi").read_text(encoding="utf-8")
    from chute import _core

    for name in dir(_core):
        if not name.startswith("_"):
            assert f"def {name}(" in stub or f"class {name}" in stub, name


def test_package_ships_typing_markers():
    assert (PACKAGE / "py.typed").is_file()
    stub = PACKAGE / "_core.pyi"
    assert stub.is_file()
    assert stub.read_text(encoding="utf-8") == (ROOT / "python/chute/_core.pyi").read_text(
        encoding="utf-8"
    )


def test_test_only_entry_points_stay_out_of_the_package():
    # They live in chute_testing, a module of its own that the wheel does not
    # ship (scripts/test.sh builds it beside the installed wheel).
    import chute_testing
    from chute import _core

    test_only = [name for name in dir(chute_testing) if not name.startswith("_")]
    assert {"resize", "mapped_read", "decode_image", "transform_image", "memcpy_windows"} <= set(
        test_only
    )
    for name in test_only:
        assert not hasattr(_core, name) and not hasattr(_core, "_" + name), name
    testing_file = Path(chute_testing.__file__).resolve()
    assert PACKAGE not in testing_file.parents
    assert not list(PACKAGE.rglob("chute_testing*"))
    # Nor compiled into _core: the error macro records its files' names.
    compiled = Path(_core.__file__).resolve().read_bytes()
    assert b"testing_module.cc" in testing_file.read_bytes()
    assert b"testing_module.cc" not in compiled and b"testing_image.cc" not in compiled


def test_every_core_function_has_a_caller_in_the_package():
    # A function that only tests, benchmarks or fuzzers call belongs in
    # chute_testing. _close_live_engines is registered with atexit by _core.
    from chute import _core

    sources = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    functions = [
        name
        for name in dir(_core)
        if type(getattr(_core, name)).__name__ == "builtin_function_or_method"
    ]
    assert "read_tar_samples" in functions
    unused = [
        name
        for name in functions
        if name != "_close_live_engines" and not re.search(rf"\b{name}\b", sources)
    ]
    assert unused == []


@pytest.mark.skipif(not INSTALLED, reason="CI mode only: the files the wheel installed")
def test_wheel_records_no_test_module():
    from importlib.metadata import files

    installed = [str(f) for f in files("chute") or []]
    assert any(name.startswith("chute/_core") for name in installed), installed
    assert not [name for name in installed if "chute_testing" in name]


@pytest.mark.skipif(not INSTALLED, reason="CI mode only: the wheel scripts/test.sh built")
def test_the_wheel_has_the_platform_it_was_built_for():
    # scripts/test.sh builds the manylinux_2_28 wheel unless told "native";
    # auditwheel tags it only if no symbol needs a newer glibc.
    from importlib.metadata import distribution

    text = distribution("chute").read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
    assert tags and all("-manylinux_" in tag for tag in tags), tags
    plat = os.environ.get("CHUTE_TEST_WHEEL_PLAT", "native")
    if plat != "native":
        assert any(tag.endswith(f"-{plat}_{platform.machine()}") for tag in tags), (plat, tags)


@pytest.mark.skipif(not INSTALLED, reason="CI mode only (scripts/test.sh)")
def test_suite_runs_against_the_installed_package():
    site = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    assert PACKAGE.parent in site, f"chute imported from {PACKAGE}, not site-packages {site}"
    assert ROOT.resolve() not in PACKAGE.parents
    assert not any(Path(p or ".").resolve() == ROOT / "python" for p in sys.path)
    compiled = Path(chute._core.__file__).resolve()  # type: ignore[attr-defined]
    assert compiled.parent == PACKAGE and not compiled.is_symlink()


@pytest.mark.skipif(not INSTALLED, reason="CI mode only: the repaired wheel")
def test_installed_wheel_loads_the_codecs_it_carries():
    # The map of libraries loaded by a process that imports chute alone (this
    # one has Pillow's own copies of the same codecs loaded): the libraries
    # native-dependencies.txt marks bundled come from chute.libs/ beside the
    # package, not the system.
    bundled = (PACKAGE.parent / "chute.libs").resolve()
    assert bundled.is_dir(), f"{bundled} missing: the wheel was not repaired"
    script = "import chute, pathlib; print(pathlib.Path('/proc/self/maps').read_text())"
    maps = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    paths = [line.split()[-1] for line in maps if line.strip()]
    loaded = {Path(p) for p in paths if ".so" in p}
    assert BUNDLED
    for codec in BUNDLED:
        paths = {p for p in loaded if p.name.startswith(codec)}
        assert paths, f"{codec} is not loaded"
        assert all(p.parent.resolve() == bundled for p in paths), paths


@pytest.mark.skipif(not INSTALLED, reason="CI mode only: the console script of the wheel")
def test_console_script():
    script = Path(sys.executable).parent / "chute"
    assert script.is_file()
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "inspect" in proc.stdout and "bench" in proc.stdout


def test_python_dash_m_chute():
    env = child_env()
    proc = subprocess.run(
        [sys.executable, "-m", "chute", "index", "--help"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "PATH" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "chute", "index", "/nonexistent/x.tar"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "no such file" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "chute", "inspect", "/nonexistent/x.tar"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 1 and "no such file" in proc.stdout  # a finding, reported


def test_the_native_dependencies_manifest_is_well_formed():
    rows = native_deps.read()
    assert native_deps.values("name", needed_by="build")
    for row in rows:
        assert row["needed_by"] in ("build", "unit-tests", "manylinux_2_28"), row
        assert row["wheel"] in ("bundled", "system", "-"), row
        assert row["debian"] != "-", row
        if row["needed_by"] == "build":
            # What the extension links: every column says where it comes from.
            assert "-" not in (row["runtime"], row["almalinux"], row["soname"], row["source"])
            assert row["wheel"] != "-" and row["device"] == "carry", row
    with pytest.raises(ValueError, match="no column 'wheels'"):
        native_deps.values("soname", wheels="bundled")
    assert native_deps.main(["soname", "wheel"]) == 2


def test_the_manifest_reads_from_the_command_line():
    script = ROOT / "scripts" / "native_deps.py"
    proc = subprocess.run(
        [sys.executable, str(script), "soname", "wheel=system"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert proc.stdout == "libz.so.1\n"


def test_cibuildwheel_installs_what_the_manifest_lists():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    expected = native_deps.cibuildwheel_before_all()
    lines = [line for line in pyproject.splitlines() if line.startswith("before-all = ")]
    assert lines == [f'before-all = "{expected}"'], (
        "pyproject.toml: before-all is not the manifest's"
    )


def test_the_readme_prerequisites_are_the_manifests():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    prerequisites = readme.split("## The two commands", 1)[1].split("```", 1)[0]
    prerequisites = " ".join(prerequisites.split())
    build = " ".join(native_deps.values("debian", needed_by="build"))
    assert f"`{build}` on Debian" in prerequisites
    for package in native_deps.values("debian", needed_by="unit-tests"):
        assert f"`{package}`" in prerequisites
    assert "native-dependencies.txt" in prerequisites
