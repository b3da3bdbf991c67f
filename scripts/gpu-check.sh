#!/usr/bin/env bash
# gpu-check.sh: kvd's GPU data path on a machine with an NVIDIA GPU, end to end.
#
#   scripts/gpu-check.sh --prepare
#       On a build machine (network, nvcc, kvd's build dependencies): builds kvd with CUDA in
#       build-gpu/ and fills .gpucheck/ (git-ignored through .git/info/exclude) with the kvd
#       binary, the shared libraries it needs beyond glibc, and the pyzmq wheel for
#       Python 3.12. Carry .gpucheck/ to a GPU machine that has no network.
#
#   scripts/gpu-check.sh
#       On the GPU machine: takes kvd from .gpucheck/bin (or builds it with CUDA here when
#       .gpucheck/ is absent and the build dependencies are present), starts it, and runs
#       tools/gpu_harness.py in a separate process: vLLM-shaped KV caches allocated with
#       PyTorch (Llama-style NHD and HND, MiniMax-M3 TP=8 per-rank shapes, each rank in its
#       own process as vLLM's workers), registered through
#       the real lmcache 0.5.6 client if importable, else through the harness's own frames,
#       stored, retrieved into zeroed pages, every byte checked, store / retrieve GB/s printed
#       beside pinned cudaMemcpy D2H / H2D. Before that, kvd-codec-gpu-check compares the
#       CUDA CacheGen decoder with the CPU decoders byte for byte and times its kernel
#       (docs/compression.md), and kvd-blend-gpu-check compares CacheBlend's CUDA scatter +
#       re-RoPE with the CPU scatter byte for byte and times it against a pinned H2D copy of
#       the same bytes (docs/gpu.md). Last, a second kvd with --engine-type blend and
#       tools/blend_server_check.py: CacheBlend through the server (a cos/sin cache in GPU
#       memory, a document found behind another prefix and scattered re-rotated on the GPU by
#       kvd's engine, checked against a float64 rotation). Then one line: VERDICT: PASS or
#       VERDICT: FAIL.
#       Takes about 1-3 minutes on an H200 (hard limit 8); prints progress as it goes.
#
# Environment: KVD_GPU_CHECK_OUT (logs and results; default $OUT, else /tmp/kvd-gpu-check),
# KVD_L1_GB (L1 size, default 12; all of it is pinned), KVD_GPU_CHECK_PORT (default 5590),
# KVD_GPU_CHECK_ARGS (extra tools/gpu_harness.py arguments, e.g. "--chunks 64").
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
CARRY="$ROOT/.gpucheck"
START=$(date +%s)
say() { printf '[gpu-check %4ss] %s\n' "$(( $(date +%s) - START ))" "$*"; }

prepare() {
  set -e
  say "configuring build-gpu/ with CUDA"
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKVD_BUILD_TESTS=OFF -DKVD_CUDA=ON >/dev/null
  grep -q '^CMAKE_CUDA_COMPILER:' build-gpu/CMakeCache.txt || { say "nvcc not found: cannot build the CUDA engine"; exit 1; }
  say "building kvd, kvd-codec-gpu-check and kvd-blend-gpu-check (nvcc is slow on few cores)"
  cmake --build build-gpu -j"$(nproc)" --target kvd kvd-codec-gpu-check kvd-blend-gpu-check
  rm -rf "$CARRY" && mkdir -p "$CARRY/bin" "$CARRY/lib" "$CARRY/wheels"
  cp build-gpu/kvd build-gpu/kvd-codec-gpu-check build-gpu/kvd-blend-gpu-check "$CARRY/bin/"
  # Everything kvd links except glibc itself (the GPU image's glibc is at least as new).
  ldd build-gpu/kvd | awk '/=> \// {print $3}' |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|libutil)\.so|/ld-linux' |
    while read -r lib; do cp -L "$lib" "$CARRY/lib/"; done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$CARRY/wheels" pyzmq==27.3.0
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.gpucheck/' "$exclude" 2>/dev/null || echo '/.gpucheck/' >> "$exclude"
  say "ready: $(du -sh "$CARRY" | cut -f1) in .gpucheck/ (carry it: run(..., carry=[\".gpucheck\"]))"
}

if [ "${1:-}" = "--prepare" ]; then prepare; exit $?; fi

OUTDIR=${KVD_GPU_CHECK_OUT:-${OUT:-/tmp/kvd-gpu-check}}
mkdir -p "$OUTDIR"
PORT=${KVD_GPU_CHECK_PORT:-5590}
HTTP_PORT=$((PORT + 1))
L1_GB=${KVD_L1_GB:-12}
KVD_PID=""
BLEND_PID=""
cleanup() {
  [ -n "$KVD_PID" ] && kill "$KVD_PID" 2>/dev/null && wait "$KVD_PID" 2>/dev/null
  [ -n "$BLEND_PID" ] && kill "$BLEND_PID" 2>/dev/null && wait "$BLEND_PID" 2>/dev/null
}
trap cleanup EXIT

say "machine: $(uname -m), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
  --format=csv,noheader 2>&1 | sed 's/^/[gpu-check] GPU: /' || say "nvidia-smi failed"

# 1. kvd with CUDA: carried, else built here.
if [ -x "$CARRY/bin/kvd" ]; then
  KVD="$CARRY/bin/kvd"
  CODEC_CHECK="$CARRY/bin/kvd-codec-gpu-check"
  BLEND_CHECK="$CARRY/bin/kvd-blend-gpu-check"
  export KVD_LD_PATH="$CARRY/lib"
  say "using the carried kvd ($CARRY/bin/kvd)"
else
  say "no .gpucheck/: building kvd with CUDA here (needs libzmq, spdlog, msgpack-cxx, CLI11, cpp-httplib)"
  if ! { cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DKVD_BUILD_TESTS=OFF -DKVD_CUDA=ON >"$OUTDIR/build.log" 2>&1 &&
         cmake --build build-gpu -j"$(nproc)" --target kvd kvd-codec-gpu-check kvd-blend-gpu-check >>"$OUTDIR/build.log" 2>&1; }; then
    tail -20 "$OUTDIR/build.log"
    echo "VERDICT: FAIL (kvd could not be built here; run scripts/gpu-check.sh --prepare on a build machine and carry .gpucheck/)"
    exit 1
  fi
  KVD="$ROOT/build-gpu/kvd"
  CODEC_CHECK="$ROOT/build-gpu/kvd-codec-gpu-check"
  BLEND_CHECK="$ROOT/build-gpu/kvd-blend-gpu-check"
  export KVD_LD_PATH=""
fi
if ! LD_LIBRARY_PATH="$KVD_LD_PATH" "$KVD" --help >/dev/null 2>"$OUTDIR/kvd-load.log"; then
  cat "$OUTDIR/kvd-load.log"
  echo "VERDICT: FAIL (kvd does not start on this machine: missing libraries? see above)"
  exit 1
fi

# 1b. The CacheGen GPU decoder against the CPU reference (no server needed; ~10 s).
CODEC_RC=0
if [ -x "${CODEC_CHECK:-}" ]; then
  say "CacheGen GPU decoder vs CPU reference"
  LD_LIBRARY_PATH="$KVD_LD_PATH" timeout 120 "$CODEC_CHECK" 2>&1 | tee "$OUTDIR/codec_gpu_check.log"
  CODEC_RC=${PIPESTATUS[0]}
else
  say "kvd-codec-gpu-check missing (rerun --prepare): the codec's GPU decoder is not checked"
  CODEC_RC=1
fi

# 1c. CacheBlend's CUDA scatter + re-RoPE against the CPU scatter, timed against a pinned H2D
# copy of the same bytes (no server needed; ~30 s).
BLEND_RC=0
if [ -x "${BLEND_CHECK:-}" ]; then
  say "CacheBlend GPU scatter + re-RoPE vs CPU scatter"
  LD_LIBRARY_PATH="$KVD_LD_PATH" timeout 90 "$BLEND_CHECK" 2>&1 | tee "$OUTDIR/blend_gpu_check.log"
  BLEND_RC=${PIPESTATUS[0]}
else
  say "kvd-blend-gpu-check missing (rerun --prepare): the blend scatter's kernel is not checked"
  BLEND_RC=1
fi

# 2. Python: torch from the image; pyzmq from the carried wheel when the image lacks it.
PY=${PYTHON:-python3}
if ! "$PY" -c 'import zmq' 2>/dev/null; then
  if ls "$CARRY"/wheels/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/kvd-gpu-site \
      "$CARRY"/wheels/*.whl && export PYTHONPATH="/tmp/kvd-gpu-site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
if ! "$PY" -c 'import torch, zmq; import msgpack' 2>"$OUTDIR/py.log" &&
   ! "$PY" -c 'import torch, zmq; import msgspec' 2>>"$OUTDIR/py.log"; then
  cat "$OUTDIR/py.log"
  echo "VERDICT: FAIL (python needs torch, pyzmq and msgpack or msgspec)"
  exit 1
fi
say "python: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)')"

# 3. kvd, in its own process.
say "starting kvd: L1 ${L1_GB} GiB (pinned at the first GPU registration), port $PORT"
LD_LIBRARY_PATH="$KVD_LD_PATH" "$KVD" server --host 127.0.0.1 --port "$PORT" --chunk-size 256 \
  --l1-size-gb "$L1_GB" --eviction-policy LRU --max-workers 16 --shm-name "kvd_gpu_check_$$" \
  --http-host 127.0.0.1 --http-port "$HTTP_PORT" --log-level info >"$OUTDIR/kvd.log" 2>&1 &
KVD_PID=$!

# 4. The harness (bounded: the whole check must end within ~8 minutes).
say "running tools/gpu_harness.py"
# shellcheck disable=SC2086
PYTHONUNBUFFERED=1 timeout 420 "$PY" tools/gpu_harness.py --url "tcp://127.0.0.1:$PORT" --device cuda \
  --out "$OUTDIR/gpu_check.json" ${KVD_GPU_CHECK_ARGS:-} 2>&1 | tee "$OUTDIR/harness.log"
rc=${PIPESTATUS[0]}
if ! kill -0 "$KVD_PID" 2>/dev/null; then say "kvd exited during the check"; fi
# lmcache's copy-throughput histograms: a GPU copy is timed on the device (issue 26 item 6).
METRICS_RC=0
"$PY" - "$HTTP_PORT" <<'PYEOF' 2>&1 | tee "$OUTDIR/metrics_check.log" || METRICS_RC=1
import re, sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
bad = []
for way in ("store", "load"):
    counts = [float(m.group(1)) for m in re.finditer(
        r'^lmcache_mp_l0_l1_%s_throughput_GB_per_second_count\{[^}]*device="cuda:[0-9]+"[^}]*\} (\S+)$' % way,
        text, re.M)]
    sums = [float(m.group(1)) for m in re.finditer(
        r'^lmcache_mp_l0_l1_%s_throughput_GB_per_second_sum\{[^}]*device="cuda:[0-9]+"[^}]*\} (\S+)$' % way,
        text, re.M)]
    n = sum(counts)
    mean = sum(sums) / n if n else 0.0
    print(f"l0_l1 {way} throughput histogram, GPU workers: {n:.0f} copies timed, mean {mean:.1f} GB/s")
    if n == 0:
        bad.append(way)
sys.exit(1 if bad else 0)
PYEOF
# 5. CacheBlend through the server on the GPU (issue 24): a second kvd, --engine-type blend.
BLEND_PORT=$((PORT + 2))
say "starting kvd --engine-type blend: L1 2 GiB, port $BLEND_PORT; running tools/blend_server_check.py"
LD_LIBRARY_PATH="$KVD_LD_PATH" "$KVD" server --host 127.0.0.1 --port "$BLEND_PORT" --chunk-size 256 \
  --l1-size-gb 2 --eviction-policy LRU --engine-type blend --shm-name "kvd_gpu_blend_$$" \
  --http-host 127.0.0.1 --http-port $((PORT + 3)) --log-level info >"$OUTDIR/kvd-blend.log" 2>&1 &
BLEND_PID=$!
PYTHONUNBUFFERED=1 timeout 120 "$PY" tools/blend_server_check.py --url "tcp://127.0.0.1:$BLEND_PORT" \
  --device cuda 2>&1 | tee "$OUTDIR/blend_server_check.log"
BLEND_SERVER_RC=${PIPESTATUS[0]}
grep -E 'warn|error' "$OUTDIR/kvd-blend.log" | tail -10
say "kvd log (warnings, errors and engine lines):"
grep -E 'warn|error|cuda engine|CUDA|pinned' "$OUTDIR/kvd.log" | tail -25
if [ "$rc" = 124 ]; then echo "VERDICT: FAIL (harness timed out)"; fi
if ! grep -q '^VERDICT:' "$OUTDIR/harness.log"; then
  echo "VERDICT: FAIL (harness exited with $rc before its verdict)"
  rc=1
fi
if [ "$METRICS_RC" != 0 ]; then
  echo "VERDICT: FAIL (no GPU copy in lmcache's l0_l1 throughput histograms: see $OUTDIR/metrics_check.log)"
  rc=1
fi
if [ "$CODEC_RC" != 0 ]; then
  echo "VERDICT: FAIL (CacheGen GPU decoder: see $OUTDIR/codec_gpu_check.log)"
  rc=1
fi
if [ "$BLEND_RC" != 0 ]; then
  echo "VERDICT: FAIL (CacheBlend GPU scatter: see $OUTDIR/blend_gpu_check.log)"
  rc=1
fi
if [ "$BLEND_SERVER_RC" != 0 ]; then
  echo "VERDICT: FAIL (CacheBlend through the server on the GPU: see $OUTDIR/blend_server_check.log)"
  rc=1
fi
say "done; logs in $OUTDIR"
exit "$rc"
