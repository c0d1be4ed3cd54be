#!/usr/bin/env bash
# Builds the C++ unit tests (GoogleTest cases in csrc/**/*_test.cc, one
# executable per layer) into build/ctest (or $CHUTE_CTEST_DIR) and runs them
# with ctest. Arguments go to ctest, e.g. `scripts/ctest.sh -R TarStream` or
# `-L hdf5` (each case is labelled with its layer). CHUTE_BUILD_TYPE picks the
# build type (Debug by default). The sanitizer variants run them too:
# scripts/sanitize.sh asan-unit / tsan-unit.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${CHUTE_CTEST_DIR:-$root/build/ctest}
python=${PYTHON:-python}
bash "$root/scripts/ensure_system_packages.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="${CHUTE_BUILD_TYPE:-Debug}" \
  -DCHUTE_BUILD_TESTS=ON \
  -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" \
  -DPython_EXECUTABLE="$(command -v "$python")" >/dev/null
cmake --build "$build" --target chute_unit_tests -j "$(nproc)"
cd "$build"
# --timeout is a hang guard per case (each runs in well under a second).
exec ctest --output-on-failure -j "$(nproc)" --timeout 300 "$@"
