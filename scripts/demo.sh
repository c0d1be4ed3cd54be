#!/usr/bin/env bash
# The main job on built-in sample data: sets up .venv, generates tar shards and
# HDF5 files, loads them with chute and with the pure-Python loaders, and
# prints the side-by-side tables. Pass --full for the README's sizes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup_env.sh"
cd "$root"
exec "${CHUTE_VENV:-$root/.venv}/bin/python" benchmarks/run_all.py "$@"
