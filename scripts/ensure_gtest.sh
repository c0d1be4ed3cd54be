#!/usr/bin/env bash
# Makes sure GoogleTest (Debian's libgtest-dev) is there for the C++ unit
# tests: as root it is installed when missing (the package index is refreshed
# only if a plain install fails); otherwise a missing GoogleTest is an error
# that says what to install.
set -euo pipefail
for header in /usr/include/gtest/gtest.h /usr/local/include/gtest/gtest.h; do
  [ -f "$header" ] && exit 0
done
if [ "$(id -u)" -ne 0 ]; then
  echo "GoogleTest is missing (no /usr/include/gtest/gtest.h); the C++ unit tests need it:" >&2
  echo "  sudo apt-get install --no-install-recommends libgtest-dev" >&2
  exit 1
fi
install_gtest() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libgtest-dev >/dev/null
}
if ! install_gtest; then
  apt-get update -qq >/dev/null
  install_gtest
fi
