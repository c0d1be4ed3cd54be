#!/usr/bin/env bash
# Creates (or reuses) the virtual environment .venv and installs chute into
# it: torch first (the pinned CPU build), then the build tools, then the
# package with its test extras; first the system packages the build and the
# C++ unit tests (scripts/ctest.sh) need. Safe to run again; a re-run rebuilds
# chute.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/ensure_system_packages.sh"
venv=${CHUTE_VENV:-$root/.venv}
python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  "${pip[@]}" install torch==2.13.0
fi
"${pip[@]}" install "scikit-build-core>=0.10" "pybind11>=2.12" ninja cmake
"${pip[@]}" install --no-build-isolation -Cbuild-dir="$root/build/release" "$root[test]"
