#!/usr/bin/env bash
# Usage: scripts/ensure_system_packages.sh [NEEDED_BY ...]
#
# Makes sure the Debian packages of native-dependencies.txt's rows for
# NEEDED_BY (default: build unit-tests — the codecs' headers, the README's
# prerequisites, and GoogleTest for the C++ unit tests; manylinux_2_28 adds
# the tools of scripts/build_wheel.sh --plat manylinux_2_28) are there. Each
# is looked for by its probe (a header it installs, or a command); as root the
# missing ones are installed (the package index is refreshed only if a plain
# install fails); otherwise a missing one is an error that says what to
# install.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
if [ $# -eq 0 ]; then set -- build unit-tests; fi
missing=()
present() {  # probe
  local dir
  if [[ $1 == cmd:* ]]; then
    command -v "${1#cmd:}" >/dev/null
    return
  fi
  for dir in /usr/include /usr/local/include; do
    [ -f "$dir/$1" ] && return 0
  done
  return 1
}
for needed_by in "$@"; do
  rows=$("$python" "$root/scripts/native_deps.py" --rows "needed_by=$needed_by")
  if [ -z "$rows" ]; then
    echo "native-dependencies.txt has no row needed_by $needed_by" >&2
    exit 2
  fi
  # Columns: name needed_by probe debian ...
  while IFS=$'\t' read -r _ _ probe debian _; do
    present "$probe" || missing+=(${debian//,/ })
  done <<<"$rows"
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages (see native-dependencies.txt):" >&2
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
