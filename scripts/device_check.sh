#!/usr/bin/env bash
# The one command a session with a GPU machine runs there (see
# benchmarks/README.md, "Device check"): scripts/device_prepare.sh fills
# .device/ here first, and the call carries it. Steps: the machine and its
# toolchain; webdataset from the carried wheels; chute's extension built from
# this tree (with the carried libjpeg-turbo/libpng/libwebp/zlib and CPython
# headers where the image lacks them; the carried prebuilt one if the build
# fails); lscpu; the CUDA tests (pinning, the device hand-off); benchmarks/bench_device.py
# (pinned batches from every path, worker processes included; H2D bandwidth;
# the hand-off's copy/step overlap; 1-to-16 scaling of the jpeg, train, eval
# and map jobs, with torch's baselines). Each step has a timeout taken from one budget
# (DEVICE_CHECK_BUDGET_S, 450 s), and a failed step is recorded in
# summary.txt and the next one runs. Everything goes to $OUT (./device-out
# when unset): log.txt, summary.txt, device.json.
# Environment for a try elsewhere: PYTHON (default python3), DEVICE_TMP
# (where the sysroot and wheels are unpacked; default /tmp), BENCH_ARGS
# (extra arguments for bench_device.py, e.g. smaller sizes), DEVICE_FORCE
# (codecs, prebuilt or both: take that fallback even where it is not needed,
# to try it on a machine that has everything).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/device-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
tee_pid=$!
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
force=${DEVICE_FORCE:-}
# cmake, ninja and pybind11 may live beside the interpreter, off the PATH.
PATH=$PATH:$(dirname "$("$python" -c 'import sys; print(sys.executable)')")
cxx=$(command -v c++ || command -v g++ || command -v clang++ || true)
budget=${DEVICE_CHECK_BUDGET_S:-450}
carried=$root/.device
work=${DEVICE_TMP:-/tmp}
sysroot=$work/sysroot
multiarch=x86_64-linux-gnu
summary=$OUT/summary.txt
: >"$summary"
start=$SECONDS

note() { echo "$*" | tee -a "$summary"; }
left() { echo $((budget - (SECONDS - start))); }

# step NAME CAP COMMAND...: COMMAND under a timeout of CAP seconds, or of what
# the budget has left less a reserve for the last steps; its verdict goes to
# summary.txt (its exit status in step_rc) and a failure never ends the script.
step_rc=0
step() {
  local name=$1 cap=$2 limit rc=0 t0=$SECONDS verdict
  shift 2
  limit=$(($(left) - 20))
  if ((limit > cap)); then limit=$cap; fi
  if ((limit < 10)); then
    note "$name: SKIPPED (budget spent)"
    step_rc=-1
    return 0
  fi
  echo "== $name (timeout ${limit}s): $*"
  timeout -k 10 "$limit" "$@" || rc=$?
  step_rc=$rc
  verdict=ok
  if ((rc == 124 || rc == 137)); then
    verdict="TIMED OUT after ${limit}s"
  elif ((rc != 0)); then
    verdict="FAILED rc=$rc"
  fi
  note "$name: $verdict ($((SECONDS - t0)) s)"
}

# compiles TEXT: whether the C++ compiler finds what the text includes.
compiles() { printf '%b\n' "$1" | "$cxx" -fsyntax-only -x c++ - >/dev/null 2>&1; }

# native_deps COLUMN [KEY=VALUE ...]: native-dependencies.txt's values.
native_deps() { "$python" "$root/scripts/native_deps.py" "$@"; }

unpack_debs() {
  [[ -d $sysroot ]] && return 0
  local deb
  if ! compgen -G "$carried/debs/*.deb" >/dev/null; then
    note "no carried .debs in $carried/debs"
    return 1
  fi
  mkdir -p "$sysroot"
  for deb in "$carried"/debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$sysroot"
    else
      "$python" - "$deb" "$sysroot" <<'EOF'
import io, sys, tarfile
with open(sys.argv[1], "rb") as deb:
    data = deb.read()
trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
pos = 8  # an ar archive: "!<arch>\n", then 60-byte headers
while pos < len(data):
    name, size = data[pos:pos + 16].decode().strip(), int(data[pos + 48:pos + 58])
    if name.rstrip("/").startswith("data.tar"):
        with tarfile.open(fileobj=io.BytesIO(data[pos + 60:pos + 60 + size])) as tar:
            tar.extractall(sys.argv[2], **trusted)
    pos += 60 + size + size % 2
EOF
    fi
  done
  # Links such as libz.so -> /lib/.../libz.so.1.2.13 must stay in the sysroot.
  local link target
  while IFS= read -r -d '' link; do
    target=$(readlink "$link")
    if [[ $target == /* ]]; then ln -sfn "$sysroot$target" "$link"; fi
  done < <(find "$sysroot" -type l -print0)
  # The runtime libraries alone, not zlib (native-dependencies.txt's rows
  # the wheel bundles): the process's own libz.so.1 stays.
  mkdir -p "$sysroot/runtime"
  local soname
  for soname in $(native_deps soname device=carry wheel=bundled); do
    cp -a "$sysroot/usr/lib/$multiarch/$soname"* "$sysroot/runtime/"
  done
  echo "unpacked the carried packages into $sysroot"
}

source_hash() {
  find csrc cmake CMakeLists.txt -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum |
    sha256sum | cut -d' ' -f1
}

echo "== machine ($(date -u '+%Y-%m-%d %H:%M:%S UTC'))"
uname -a
echo "cores: $(nproc); $(free -g | awk '/^Mem/ {print $2 " GiB memory"}')"
# The CPU's model and flags: the SIMD level the resampler can take here.
lscpu || note "lscpu: not available"
grep PRETTY_NAME /etc/os-release || true
timeout 30 nvidia-smi || note "nvidia-smi: not available"
echo "python: $(command -v "$python") $("$python" -V 2>&1)"
"$python" - <<'EOF' || note "torch: import failed"
import torch
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); cuda available: "
      f"{torch.cuda.is_available()}"
      + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
EOF
"$python" -m pip list 2>/dev/null |
  grep -iE '^(torch|numpy|pillow|pybind11|scikit.build.core|cmake|ninja|pytest|webdataset) ' || true
echo "C++ compiler: ${cxx:-missing}"
for tool in cmake ninja dpkg-deb; do
  echo "$tool: $(command -v $tool || echo missing)"
done
if [[ -f $carried/SOURCE.txt ]]; then
  echo "carried .device/SOURCE.txt:"
  sed 's/^/  /' "$carried/SOURCE.txt"
  echo "  this tree's native_sources_sha256 $(source_hash)"
else
  note "no .device/ carried: run scripts/device_prepare.sh first and carry .device"
fi

echo "== codec headers and libraries"
have_compiler=0
need_sysroot=0
if [[ -n $cxx ]]; then
  export CXX=$cxx
  have_compiler=1
  # The carried libraries' headers (jpeglib.h wants stdio.h before it).
  for header in $(native_deps probe device=carry); do
    if compiles "#include <stdio.h>\n#include <$header>"; then
      echo "found: $header"
    else
      echo "missing: $header"
      need_sysroot=1
    fi
  done
fi
sonames=$(native_deps soname device=carry | sed 's/\./\\./g' | paste -sd '|')
ldconfig -p 2>/dev/null | grep -E "$sonames" || true
if [[ $force == *codecs* ]]; then need_sysroot=1; fi
if ((need_sysroot)); then
  unpack_debs || note "unpacking the carried packages failed"
  export CMAKE_PREFIX_PATH=$sysroot/usr CMAKE_INCLUDE_PATH=$sysroot/usr/include
  export CMAKE_LIBRARY_PATH=$sysroot/usr/lib/$multiarch
  # libjpeg62-turbo-dev keeps jconfig.h in the multiarch folder.
  export CXXFLAGS="${CXXFLAGS:-} -isystem $sysroot/usr/include/$multiarch"
  export LD_LIBRARY_PATH=$sysroot/runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  note "codecs: carried Debian packages ($sysroot)"
fi

echo "== webdataset from the carried wheels"
if compgen -G "$carried/wheels/*.whl" >/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$work/site" "$carried"/wheels/*.whl || note "wheels: pip install failed"
fi
export PYTHONPATH=$root/python:$work/site${PYTHONPATH:+:$PYTHONPATH}
"$python" -c 'import webdataset; print("webdataset", webdataset.__version__, webdataset.__file__)' ||
  note "webdataset: does not import"

# The shards take a minute of one core to write; they are written while the
# extension compiles (only chute's rss.py is needed for that, not _core).
# shellcheck disable=SC2086  # BENCH_ARGS is a list of words
timeout -k 10 240 "$python" benchmarks/bench_device.py --data-only ${BENCH_ARGS:-} \
  >"$work/device-data.log" 2>&1 &
data_pid=$!

echo "== build"
built=""
if [[ $force == *prebuilt* ]]; then
  note "build: skipped (DEVICE_FORCE=$force)"
elif ((have_compiler)) && command -v cmake >/dev/null && command -v ninja >/dev/null; then
  python_include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  if [[ ! -f $python_include/Python.h && -d $carried/python-include/python3.12 ]]; then
    # dev_build.sh configures the same folder again; the cache keeps this.
    note "Python.h: not in $python_include, using the carried CPython 3.12 headers"
    cmake -S "$root" -B "$root/build/dev" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" \
      -DPython_EXECUTABLE="$(command -v "$python")" \
      -DPython_INCLUDE_DIR="$carried/python-include/python3.12" >/dev/null || true
  fi
  step build 240 env PYTHON="$python" bash scripts/dev_build.sh
  if ((step_rc == 0)); then built="source"; fi
fi
if [[ -z $built ]]; then
  suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  prebuilt=$carried/prebuilt/_core$suffix
  if [[ -f $prebuilt ]]; then
    [[ $(source_hash) == $(awk '/native_sources_sha256/ {print $2}' "$carried/SOURCE.txt") ]] ||
      note "WARNING: the prebuilt extension was built from other native sources than this tree's"
    unpack_debs || note "unpacking the carried packages failed"
    export LD_LIBRARY_PATH=$sysroot/runtime${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    rm -f python/chute/_core*.so python/chute_testing*.so
    cp "$prebuilt" python/chute/
    cp "$carried/prebuilt/chute_testing$suffix" python/ || note "no prebuilt chute_testing"
    built="prebuilt"
  else
    note "no prebuilt extension for $suffix in .device/prebuilt"
  fi
fi
if "$python" -c 'import chute._core as c; print("chute._core:", c.__file__)'; then
  note "extension: ${built:-none} (imports)"
else
  note "extension: ${built:-none} (does NOT import)"
fi
ldd python/chute/_core*.so 2>/dev/null | grep -E "$sonames" || true

echo "== CUDA tests"
step pytest 150 "$python" -m pytest -q -p no:cacheprovider -rA \
  tests/gpu/test_pinning.py tests/gpu/test_device.py tests/dataset_kinds/test_splits.py::test_pin_memory_only_with_cuda

echo "== shards for bench_device.py"
data_rc=0
wait "$data_pid" || data_rc=$?
cat "$work/device-data.log"
note "shards: $( ((data_rc == 0)) && echo ok || echo "FAILED rc=$data_rc")"

deadline=$(($(left) - 180))  # bench_auto runs after it
# shellcheck disable=SC2086
step bench_device 400 "$python" benchmarks/bench_device.py --deadline "$deadline" ${BENCH_ARGS:-}
if [[ -f benchmarks/results/device.json ]]; then
  cp benchmarks/results/device.json "$OUT/device.json"
fi

echo "== num_workers=\"auto\" against the best fixed count, on this machine's cores"
if (($(left) > 150)); then
  step bench_auto 120 "$python" benchmarks/bench_auto.py --quick --rounds 2 --name auto-device
  if [[ -f benchmarks/results/auto-device.json ]]; then
    cp benchmarks/results/auto-device.json "$OUT/auto-device.json"
  fi
else
  note "bench_auto: skipped, $(left) s left"
fi
note "total: $((SECONDS - start)) s of the ${budget} s budget"
echo "== summary"
cat "$summary"
# The log's last lines are written before the command returns.
exec >&- 2>&-
wait "$tee_pid" || true
