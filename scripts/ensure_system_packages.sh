#!/usr/bin/env bash
# Makes sure the Debian packages the build needs are there: the codecs'
# headers (the README's prerequisites) and GoogleTest for the C++ unit tests.
# Each is looked for by a header it installs; as root the missing ones are
# installed (the package index is refreshed only if a plain install fails);
# otherwise a missing one is an error that says what to install.
set -euo pipefail
missing=()
need() {  # header package
  local dir
  for dir in /usr/include /usr/local/include; do
    [ -f "$dir/$1" ] && return 0
  done
  missing+=("$2")
}
need jpeglib.h libjpeg62-turbo-dev
need png.h libpng-dev
need zlib.h zlib1g-dev
need webp/decode.h libwebp-dev
need gtest/gtest.h libgtest-dev
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages (the build and the C++ unit tests need them):" >&2
  echo "  sudo apt-get install --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
install_missing() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null
}
if ! install_missing; then
  apt-get update -qq >/dev/null
  install_missing
fi
