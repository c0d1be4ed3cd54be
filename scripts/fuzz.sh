#!/usr/bin/env bash
# Runs each atheris harness in fuzz/ for a bounded time.
# Usage: scripts/fuzz.sh [SECONDS_EACH=60] [harness names: tar npy image]
# Seeds are generated into build/fuzz/corpus/<name> (and the corpus grows
# there); crashes are saved to build/fuzz/crashes/<name>/. The native code is
# not libFuzzer-instrumented (atheris gets coverage from the Python layer and
# from the seeds; see fuzz/common.py), so the search is closer to a
# mutation-based smoke test than to coverage-guided C++ fuzzing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
shift || true
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(tar npy image)
python=${PYTHON:-python}
work=$root/build/fuzz
"$python" "$root/fuzz/make_corpus.py" "$work/corpus" >/dev/null
status=0
for name in "${names[@]}"; do
  mkdir -p "$work/crashes/$name"
  echo "== fuzz_$name for ${seconds}s"
  if ! "$python" "$root/fuzz/fuzz_$name.py" -max_total_time="$seconds" -max_len=65536 \
      -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$work/crashes/$name/" "$work/corpus/$name" 2>&1 |
      grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|==|Done|INFO: Loaded|.*(ERROR|Uncaught|Traceback|crash-))"; then
    :
  fi
  if [ -n "$(ls -A "$work/crashes/$name")" ]; then
    echo "!! fuzz_$name found crashes: $work/crashes/$name"
    status=1
  fi
done
exit $status
