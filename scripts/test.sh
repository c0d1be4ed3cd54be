#!/usr/bin/env bash
# The test command: sets up .venv with chute installed (not the source tree),
# then runs the suite against the installed package. pytest's "no tests ran"
# (exit 5) is a failure here, not a pass.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup_env.sh"
cd "$root"
set +e
"${CHUTE_VENV:-$root/.venv}/bin/python" -m pytest "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing" >&2
  exit 1
fi
exit "$status"
