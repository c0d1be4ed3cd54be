#!/usr/bin/env bash
# Runs on the development machine, once before a device call: fills the
# ignored folder .device/ with what scripts/device_check.sh needs on the
# device machine, which has no network:
#   .device/debs/      Debian packages of libjpeg-turbo, libpng, libwebp and zlib (the
#                      headers and libraries the extension builds and runs
#                      against: native-dependencies.txt's `carry` rows),
#                      unpacked there only if its image lacks them;
#   .device/wheels/    webdataset and braceexpand (pure-Python wheels; numpy
#                      and pyyaml, webdataset's other needs, are in the image);
#   .device/python-include/  CPython 3.12's headers, for an image whose
#                      python3 has none;
#   .device/prebuilt/  the extension built here for CPython 3.12 from this
#                      tree, used there only if building there fails;
#   .device/SOURCE.txt the commit and a hash of the native sources, so the
#                      check can tell whether the prebuilt one is stale.
# Then prints the device call to make. Environment: PYTHON (an interpreter
# with pybind11; default python3), PY312 (a CPython 3.12 with its headers;
# default python3.12 on PATH or pyenv's; without one the headers and the
# prebuilt extension are not carried).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dest=.device
python=${PYTHON:-python3}

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
# device-out/: where device_check.sh writes when OUT is unset (a try here).
for ignored in "/$dest/" /device-out/; do
  grep -qxF "$ignored" "$exclude" 2>/dev/null || echo "$ignored" >>"$exclude"
done
rm -rf "$dest"
mkdir -p "$dest/debs" "$dest/wheels"

# The rows of native-dependencies.txt marked `carry`: their -dev packages
# and, since the -dev packages' linker names point into them, their runtime
# packages (of libwebp-dev's, only libwebp's: chute links neither libwebpmux
# nor libwebpdemux). libc6(-dev) is on any machine with a compiler.
mapfile -t packages < <("$python" scripts/native_deps.py debian device=carry
  "$python" scripts/native_deps.py runtime device=carry)
echo "== apt-cache depends (Depends only)"
apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
  --no-replaces --no-enhances "${packages[@]}"
(cd "$dest/debs" && apt-get download "${packages[@]}")

echo "== wheels"
wheel_versions=(webdataset==1.0.2 braceexpand==0.1.7)
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation py --abi none --platform any -d "$dest/wheels" "${wheel_versions[@]}"
for w in "$dest"/wheels/*.whl; do
  echo "$(basename "$w"):"
  unzip -p "$w" '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' | sed 's/^/  /' || true
done

# The hash covers what the extension is built from; device_check.sh computes
# the same over its copy.
source_hash=$(find csrc cmake CMakeLists.txt -type f -print0 | sort -z | xargs -0 sha256sum |
  sha256sum | cut -d' ' -f1)
{
  echo "commit $(git rev-parse HEAD)"
  echo "native_sources_sha256 $source_hash"
  echo "uncommitted_files $(git status --porcelain --untracked-files=no | wc -l)"
} >"$dest/SOURCE.txt"

py312=${PY312:-}
if [[ -z $py312 ]]; then
  # pyenv's shims answer only for its selected version: look in its versions.
  for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
    if "$candidate" -c '' 2>/dev/null; then
      py312=$candidate
      break
    fi
  done
fi
if [[ -n $py312 ]] && "$py312" -c 'import sys; assert sys.version_info[:2] == (3, 12)'; then
  py312=$("$py312" -c 'import sys; print(sys.executable)')
  include=$("$py312" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  echo "== CPython 3.12 headers from $include"
  mkdir -p "$dest/python-include"
  cp -r "$include" "$dest/python-include/python3.12"

  echo "== prebuilt extension (and chute_testing, which the tests import) for CPython 3.12"
  build=$(mktemp -d "${TMPDIR:-/tmp}/chute-prebuilt.XXXXXX")
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHUTE_TESTING_MODULE=ON \
    -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" \
    -DPython_EXECUTABLE="$py312" -DPython_INCLUDE_DIR="$include" >/dev/null
  cmake --build "$build" -j "$(nproc)" --target _core chute_testing
  mkdir -p "$dest/prebuilt"
  cp "$build"/_core*.so "$build"/chute_testing*.so "$dest/prebuilt/"
  rm -rf "$build"
  so=$(ls "$dest"/prebuilt/_core*.so)
  echo "$(basename "$so"): needs $(objdump -p "$so" | awk '/NEEDED/ {printf "%s ", $2}')"
  echo "  newest glibc / libstdc++ symbol versions it needs:" \
    "$(objdump -T "$so" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)" \
    "$(objdump -T "$so" | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -n1)"
else
  echo "== no CPython 3.12 here (set PY312): no headers or prebuilt extension carried"
fi

echo "== newest glibc symbol version each carried library needs"
tmp=$(mktemp -d)
for deb in "$dest"/debs/*.deb; do dpkg-deb -x "$deb" "$tmp"; done
for lib in "$tmp"/usr/lib/x86_64-linux-gnu/*.so.* "$tmp"/lib/x86_64-linux-gnu/*.so.*; do
  [[ -f $lib && ! -L $lib ]] || continue
  echo "  $(basename "$lib"): $(objdump -T "$lib" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)"
done
rm -rf "$tmp"

echo "== sizes"
du -sh "$dest"/*
du -sh "$dest"
echo "working tree that travels (tracked + untracked, not ignored):"
git ls-files -z --cached --others --exclude-standard | du -ch --files0-from=- 2>/dev/null | tail -n1

cat <<'EOF'

== the device call (one run from this checkout, the one the session was
   started in; timeout_s leaves 90 s beyond the script's own 450 s budget):
run(command="bash scripts/device_check.sh", carry=[".device"], timeout_s=540)
What comes back under the reply's files_at: log.txt (everything),
summary.txt (a verdict per step), device.json (bench_device.py's results).
EOF
