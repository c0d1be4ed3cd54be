#!/usr/bin/env bash
# Usage: scripts/check_wheel_libs.sh PYTHON
#
# Checks that the chute installed for PYTHON (a repaired wheel's) loads its
# codecs from the copies the wheel carries: each library that
# native-dependencies.txt marks bundled is in chute.libs/, every library there
# is what the extension resolves, nothing is "not found"; then, where this shell
# may make a mount namespace (root and `unshare -m`), it hides the system's
# copies of those libraries from one process tree (/dev/null mounted over
# each) and runs scripts/wheel_smoke.py there, which decodes JPEG, PNG and WebP
# (elsewhere it runs the smoke test beside the system's copies).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=$1
pkg=$("$py" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("chute").origin))')
core=$(ls "$pkg"/_core*.so)
libs="$pkg/../chute.libs"
if [ ! -d "$libs" ]; then
  echo "no chute.libs/ beside $pkg: not a repaired wheel" >&2
  exit 1
fi
# Every library native-dependencies.txt says the wheel bundles is there
# (auditwheel names a copy <lib>-<8 hex digits>.so.<version>).
for soname in $("$py" "$root/scripts/native_deps.py" soname wheel=bundled); do
  if ! compgen -G "$libs/${soname%%.so*}-*.so*" >/dev/null; then
    ls "$libs" >&2
    echo "the wheel does not carry $soname (native-dependencies.txt: bundled)" >&2
    exit 1
  fi
done
deps=$(ldd "$core")
if grep -q "not found" <<<"$deps"; then
  echo "$deps" >&2
  echo "the extension has unresolved libraries" >&2
  exit 1
fi
hidden=()
for bundled in "$libs"/*.so*; do
  name=$(basename "$bundled")
  loaded=$(awk -v n="$name" '$1 == n { print $3 }' <<<"$deps")
  if [ -z "$loaded" ] || [ "$(readlink -f "$loaded")" != "$(readlink -f "$bundled")" ]; then
    echo "$deps" >&2
    echo "the extension does not load its bundled $name" >&2
    exit 1
  fi
  # auditwheel names a copy <lib>-<8 hex digits>.so.<version>; the system's
  # is found by its soname, <lib>.so.<major>.
  soname=$(sed -E 's/^(.*)-[0-9a-f]{8}(\.so\.[0-9]+).*$/\1\2/' <<<"$name")
  # awk reads to the end: leaving early would end ldconfig with SIGPIPE,
  # which pipefail turns into this script's failure.
  system=$(ldconfig -p | awk -v n="$soname" '$1 == n && !found { print $NF; found = 1 }')
  echo "bundled $name (system $soname: ${system:-none})"
  if [ -n "$system" ]; then
    hidden+=("$(readlink -f "$system")")
  fi
done
if [ "$(id -u)" -ne 0 ] || ! unshare -m true 2>/dev/null; then
  echo "system copies not hidden (needs root and unshare -m): the smoke test runs beside them"
  (cd "$(mktemp -d)" && "$py" "$root/scripts/wheel_smoke.py")
  exit 0
fi
# shellcheck disable=SC2016
unshare -m bash -c '
  set -euo pipefail
  for lib in "${@:3}"; do mount --bind /dev/null "$lib"; done
  cd "$(mktemp -d)"
  "$1" "$2"
' _ "$py" "$root/scripts/wheel_smoke.py" "${hidden[@]}"
echo "smoke test passed with the system copies hidden: ${hidden[*]:-none}"
