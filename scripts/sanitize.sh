#!/usr/bin/env bash
# Builds the sanitizer variants of the extension and of the C++ unit tests,
# and runs the unit tests (ctest) and then the native-heavy Python tests
# (marked `native`) under each:
#   asan: Debug, AddressSanitizer + UndefinedBehaviorSanitizer (build/asan)
#   tsan: Debug, ThreadSanitizer (build/tsan)
# Usage: scripts/sanitize.sh [asan|tsan|all|asan-unit|tsan-unit] [extra pytest args...]
# (asan-unit and tsan-unit run the unit tests only).
#
# The host is the ordinary CPython, so the sanitizer runtime must be loaded
# first (LD_PRELOAD). Each variant is staged as its own package directory
# (build/<variant>/pkg/chute: links to python/chute/*.py plus that build's
# _core, and that build's chute_testing beside it in pkg/), so the developer
# build in python/chute is left alone. pytest runs
# with --capture=sys so that a sanitizer report (written to fd 2) is not
# swallowed by fd capture when the process aborts. CHUTE_SANITIZER tells the
# tests which checks mean nothing under a sanitizer (RSS: ASan's quarantine
# keeps freed memory resident on purpose).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
which=${1:-all}
shift || true
python=${PYTHON:-python}
# The Python tests it runs: those marked `native` (pyproject.toml registers
# the marker; a module marks itself with `pytestmark = pytest.mark.native`).
# pytest's "no tests ran" (exit 5) fails the run, so a marker that selects
# nothing is noticed.
tests=("$root/tests" -m native)

build_variant() {  # name sanitizer
  local build=$root/build/$1
  bash "$root/scripts/ensure_system_packages.sh"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCHUTE_SANITIZE="$2" \
    -DCHUTE_BUILD_TESTS=ON -DCHUTE_TESTING_MODULE=ON \
    -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" \
    -DPython_EXECUTABLE="$(command -v "$python")" >/dev/null
  cmake --build "$build" -j "$(nproc)"
  local pkg=$build/pkg/chute
  rm -rf "$build/pkg"
  mkdir -p "$pkg"
  for f in "$root"/python/chute/*.py; do ln -s "$f" "$pkg/"; done
  for d in "$root"/python/chute/*/; do  # subpackages (chute.remote, ...)
    if [ -f "$d/__init__.py" ]; then ln -s "${d%/}" "$pkg/"; fi
  done
  ln -s "$(find "$build" -maxdepth 1 -name '_core*.so' | head -n 1)" "$pkg/"
  ln -s "$(find "$build" -maxdepth 1 -name 'chute_testing*.so' | head -n 1)" "$build/pkg/"
}

# The unit test executables link the sanitizer runtime themselves (no
# LD_PRELOAD), and being plain C++ they also run LeakSanitizer.
unit_asan() {
  (cd "$root/build/asan" &&
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_init_order=1:detect_stack_use_after_return=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --output-on-failure -j "$(nproc)" --timeout 600)
}

unit_tsan() {
  (cd "$root/build/tsan" &&
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --output-on-failure -j "$(nproc)" --timeout 600)
}

run_asan() {
  build_variant asan address
  unit_asan
  # detect_leaks=0: CPython and torch keep interned objects and arenas alive
  # at exit by design, which LeakSanitizer reports as leaks. Everything else
  # (overflows, use-after-free, UB) aborts the run.
  # libstdc++ is preloaded with the runtime: ASan resolves the real
  # __cxa_throw when it starts, and a Python host has not loaded libstdc++
  # yet (every C++ throw then dies in an ASan CHECK).
  # GCC's libasan takes no allocator lock around fork(): a DataLoader worker
  # (torch's or chute's) forked while another thread is inside malloc can
  # wait on that lock forever. tests/conftest.py watches for that under
  # CHUTE_SANITIZER=address: a test still running after
  # CHUTE_SANITIZER_FORK_WATCH_S seconds has such children killed and is
  # reported as skipped, naming them, instead of hanging the run.
  LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)" \
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_init_order=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  CHUTE_SANITIZER=address PYTHONPATH="$root/build/asan/pkg" PYTHONMALLOC=malloc \
    "$python" -m pytest -q -rs -p no:cacheprovider --capture=sys "${tests[@]}" "$@"
}

run_tsan() {
  build_variant tsan thread
  unit_tsan
  # Suppressions: see scripts/tsan.supp for why each entry is there.
  # die_after_fork=0: the tests also run torch DataLoader worker processes
  # (fork after threads exist); the children only run Python, not chute threads.
  # Deselected: tests that run torch DataLoader *worker processes* (and the
  # one that forks them from a process whose chute engine is running). Their
  # forked children start threads after a multi-threaded fork, which TSan
  # does not support (the workers die or hang under it, with or without
  # die_after_fork); chute's own threads are covered by every other test.
  # Also the tests that drive a SIGBUS out of a file mapping: the copy leaves
  # the signal handler with siglongjmp, which TSan does not follow (its
  # "inside a handler" state stays set, so it holds back every later signal —
  # the Ctrl-C tests then hang — and misreports races). ASan runs it.
  LD_PRELOAD="$(gcc -print-file-name=libtsan.so) $(gcc -print-file-name=libstdc++.so)" \
  TSAN_OPTIONS="suppressions=$root/scripts/tsan.supp:halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0:die_after_fork=0" \
  CHUTE_SANITIZER=thread PYTHONPATH="$root/build/tsan/pkg" \
    "$python" -m pytest -q -p no:cacheprovider --capture=sys "${tests[@]}" \
    -k "not torch_dataloader and not users_training_pipeline and not empty_worker and not mapped_range_past_the_end and not torch_workers and not forked_workers_inherit_engines and not npy_cut_while_mapped" "$@"
}

case $which in
  asan) run_asan "$@" ;;
  tsan) run_tsan "$@" ;;
  all) run_asan "$@"; run_tsan "$@" ;;
  asan-unit) build_variant asan address; unit_asan ;;
  tsan-unit) build_variant tsan thread; unit_tsan ;;
  *) echo "usage: $0 [asan|tsan|all|asan-unit|tsan-unit] [pytest args...]" >&2; exit 2 ;;
esac
