#!/usr/bin/env bash
# Incremental developer build: compiles the extension into build/dev (or
# $CHUTE_BUILD_DIR) and links it into python/chute so that
# `PYTHONPATH=python pytest` runs against the work tree; the chute_testing
# module that the tests and benchmarks also import (never part of the wheel)
# is linked into python/ beside the package. CI and users install the package
# instead (see README). Pass CHUTE_SANITIZE=address|thread for the sanitizer
# variants.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${CHUTE_BUILD_DIR:-$root/build/dev}
build_type=${CHUTE_BUILD_TYPE:-Release}
python=${PYTHON:-python}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" \
  -DCHUTE_SANITIZE="${CHUTE_SANITIZE:-}" -DCHUTE_TESTING_MODULE=ON \
  -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" \
  -DPython_EXECUTABLE="$(command -v "$python")" >/dev/null
cmake --build "$build" -j "$(nproc)"
so=$(find "$build" -maxdepth 1 -name '_core*.so' | head -n 1)
ln -sf "$so" "$root/python/chute/$(basename "$so")"
testing=$(find "$build" -maxdepth 1 -name 'chute_testing*.so' | head -n 1)
ln -sf "$testing" "$root/python/$(basename "$testing")"
echo "built $so and $testing"
