#!/usr/bin/env bash
# Usage: scripts/build_manylinux_deps.sh PREFIX
#
# The toolchain and codecs of the manylinux_2_28 wheel (scripts/build_wheel.sh
# --plat manylinux_2_28), built on any Debian/Ubuntu machine without docker:
#   PREFIX/bin/<arch>-linux-gnu2.28-clang, -clang++: `zig cc` / `zig c++`
#       (the ziglang package of $PYTHON) for glibc 2.28, which bring glibc
#       2.28's headers and link stubs, and libc++, linked statically;
#   PREFIX/include, PREFIX/lib: the libraries of native-dependencies.txt that
#       have a Debian source package (its `source` column) — libjpeg-turbo
#       (with its SIMD code: nasm), libpng, libwebp and zlib — built from the
#       newest version of that source package the system's Debian mirror
#       serves (with Debian's patches: its security fixes), with the
#       toolchain above, so none needs a glibc symbol newer than 2.28.
#       zlib is built to link against; the wheel leaves it to the system.
#   PREFIX/SOURCES.txt: the source package versions built and the inputs'
#       hash; a second run with the same inputs reuses PREFIX as it is.
# The source packages come through apt with a list of its own (PREFIX/apt:
# deb-src lines for the system's Debian suites), so the system's apt
# configuration is left as it is. Needs root for nothing, except to install
# nasm and dpkg-dev where they are missing (ensure_system_packages.sh).
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 PREFIX" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
mkdir -p "$1"
prefix=$(cd "$1" && pwd)
arch=$(uname -m)
glibc=2.28
jobs=$(nproc)

inputs_hash=$(cat "$root/native-dependencies.txt" "$0" | sha256sum | cut -d' ' -f1)
if [ -f "$prefix/SOURCES.txt" ] && grep -qx "inputs $inputs_hash" "$prefix/SOURCES.txt"; then
  echo "reusing $prefix (SOURCES.txt matches native-dependencies.txt and this script)"
  exit 0
fi

bash "$root/scripts/ensure_system_packages.sh" manylinux_2_28
if ! "$python" -m ziglang version >/dev/null 2>&1; then
  echo "$python has no ziglang: pip install ziglang" >&2
  exit 1
fi
python_path=$(command -v "$python")
rm -rf "$prefix/bin" "$prefix/include" "$prefix/lib" "$prefix/build" "$prefix/SOURCES.txt"
mkdir -p "$prefix/bin" "$prefix/src" "$prefix/build"

# The compilers. Sanitizers off: zig cc otherwise adds UBSan traps at some
# optimisation levels, and the release build takes its flags from CMake.
for tool in cc c++; do
  name=clang
  [ "$tool" = c++ ] && name=clang++
  cat >"$prefix/bin/$arch-linux-gnu$glibc-$name" <<EOF
#!/bin/sh
exec "$python_path" -m ziglang $tool -target $arch-linux-gnu.$glibc -fno-sanitize=all "\$@"
EOF
  chmod +x "$prefix/bin/$arch-linux-gnu$glibc-$name"
done
cc=$prefix/bin/$arch-linux-gnu$glibc-clang

# apt with a list of its own: deb-src for each Debian suite of this release
# that the system's sources name (its codename and codename-*).
apt_dir=$prefix/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}")
"$python" - "$codename" /etc/apt/sources.list /etc/apt/sources.list.d/* >"$apt_dir/sources.list" <<'EOF'
import re, sys
from pathlib import Path

codename, seen = sys.argv[1], set()
def ours(suite: str) -> bool:
    return suite == codename or suite.startswith(codename + "-")
for name in sys.argv[2:]:
    path = Path(name)
    if not path.is_file() or path.suffix not in (".list", ".sources"):
        continue
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix == ".list":  # one-line style: deb [options] uri suite components
        for line in text.splitlines():
            m = re.match(r"\s*deb\s+(\[[^]]*\]\s+)?(\S+)\s+(\S+)\s+(.+)", line)
            if m and ours(m[3]):
                seen.add(f"deb-src {m[1] or ''}{m[2]} {m[3]} {m[4].strip()}")
        continue
    for stanza in re.split(r"\n\s*\n", text):  # deb822 style
        fields = dict(
            (k.strip().lower(), v.strip())
            for k, _, v in (l.partition(":") for l in stanza.splitlines() if not l.startswith("#"))
            if _
        )
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
            continue
        options = f"[signed-by={fields['signed-by']}] " if "signed-by" in fields else ""
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                if ours(suite):
                    seen.add(f"deb-src {options}{uri} {suite} {fields.get('components', 'main')}")
print("\n".join(sorted(seen)))
EOF
if [ ! -s "$apt_dir/sources.list" ]; then
  echo "no Debian '$codename' suites in /etc/apt/sources.list{,.d/}: no source packages" >&2
  exit 1
fi
apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/nonexistent
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o Debug::NoLocking=1
  -o APT::Sandbox::User=root -qq)
apt-get "${apt_opts[@]}" update

# fetch PACKAGE: the newest version of the source package that the mirror
# serves (a version listed in the index may not be served yet), unpacked
# with Debian's patches applied; prints the source tree's path.
fetch() {
  local package=$1 version dir
  mapfile -t versions < <(apt-cache "${apt_opts[@]}" showsrc "$package" |
    awk '/^Version:/ { print $2 }' | sort -u -r -V)
  if [ ${#versions[@]} -eq 0 ]; then
    echo "the Debian mirror lists no source package $package" >&2
    return 1
  fi
  for version in "${versions[@]}"; do
    dir=$prefix/src/$package-$version
    rm -rf "$dir" && mkdir -p "$dir"
    if (cd "$dir" && apt-get "${apt_opts[@]}" source --download-only "$package=$version" \
      >/dev/null 2>&1); then
      # apt checked the files against the signed index; dpkg-source's own
      # check of the .dsc's signature wants the uploaders' keys, which are
      # not installed (its warning goes to the log with the rest).
      if ! (cd "$dir" && dpkg-source -x ./*.dsc tree >"$dir/unpack.log" 2>&1); then
        cat "$dir/unpack.log" >&2
        return 1
      fi
      echo "$package $version" >>"$prefix/SOURCES.txt.new"
      echo "$dir/tree"
      return 0
    fi
    echo "$package $version: not served, trying an older one" >&2
  done
  echo "no version of the source package $package could be fetched" >&2
  return 1
}

# logged LOG COMMAND...: COMMAND's output appended to LOG, shown on failure.
logged() {
  local log=$1
  shift
  if ! "$@" >>"$log" 2>&1; then
    echo "failed: $* -- the last 40 lines of $log:" >&2
    tail -n 40 "$log" >&2
    return 1
  fi
}

cmake_build() {  # name source-tree cmake-options...
  local name=$1 tree=$2 log=$prefix/build/$1.log
  shift 2
  logged "$log" cmake -S "$tree" -B "$prefix/build/$name" -G Ninja -Wno-dev \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc" -DCMAKE_INSTALL_PREFIX="$prefix" \
    -DCMAKE_INSTALL_LIBDIR="$prefix/lib" -DCMAKE_PREFIX_PATH="$prefix" \
    "-DCMAKE_IGNORE_PREFIX_PATH=/usr;/usr/local" -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "$@"
  logged "$log" cmake --build "$prefix/build/$name" -j "$jobs"
  logged "$log" cmake --install "$prefix/build/$name"
}

# One recipe per source package.
build() {  # source-package
  local tree t0=$SECONDS
  tree=$(fetch "$1")
  case $1 in
    zlib)
      # Its own configure script; lld wants symbols its version script names
      # but this build leaves out (the Windows ones) allowed explicitly.
      (cd "$tree" &&
        logged "$prefix/build/zlib.log" env CC="$cc" CFLAGS=-O2 \
          LDSHARED="$cc -shared -Wl,-soname,libz.so.1,--version-script,zlib.map,--undefined-version" \
          ./configure --prefix="$prefix" --libdir="$prefix/lib" &&
        logged "$prefix/build/zlib.log" make -j "$jobs" install) ;;
    libjpeg-turbo)
      cmake_build jpeg "$tree" -DENABLE_STATIC=OFF -DWITH_TURBOJPEG=OFF -DWITH_SIMD=ON \
        -DREQUIRE_SIMD=ON ;;
    libpng1.6)
      cmake_build png "$tree" -DPNG_STATIC=OFF -DPNG_EXECUTABLES=OFF -DPNG_TESTS=OFF \
        -DZLIB_ROOT="$prefix" ;;
    libwebp)
      local off=()
      for tool in ANIM_UTILS CWEBP DWEBP GIF2WEBP IMG2WEBP VWEBP WEBPINFO LIBWEBPMUX WEBPMUX EXTRAS; do
        off+=("-DWEBP_BUILD_$tool=OFF")
      done
      cmake_build webp "$tree" -DBUILD_SHARED_LIBS=ON "${off[@]}" ;;
    *)
      echo "no recipe for the source package $1 in $0" >&2
      return 1 ;;
  esac
  echo "built $1 in $((SECONDS - t0)) s"
}

rm -f "$prefix/SOURCES.txt.new"
mapfile -t sources < <("$python" "$root/scripts/native_deps.py" source)
# zlib first: libpng links it.
for package in $(printf '%s\n' "${sources[@]}" | grep -x zlib || true) \
  $(printf '%s\n' "${sources[@]}" | grep -vx zlib); do
  build "$package"
done

# The point of it all: no library needs a glibc symbol newer than 2.28.
for lib in "$prefix"/lib/*.so.*; do
  [ -L "$lib" ] && continue
  newest=$(objdump -T "$lib" | grep -o 'GLIBC_[0-9.]*' | sort -u -V | tail -n 1)
  if [ "$(printf '%s\n' "GLIBC_$glibc" "$newest" | sort -V | tail -n 1)" != "GLIBC_$glibc" ]; then
    echo "$lib needs $newest, newer than glibc $glibc" >&2
    exit 1
  fi
done
echo "inputs $inputs_hash" >>"$prefix/SOURCES.txt.new"
mv "$prefix/SOURCES.txt.new" "$prefix/SOURCES.txt"
cat "$prefix/SOURCES.txt"
