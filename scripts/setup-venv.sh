#!/usr/bin/env bash
# Creates the Python virtualenv used by kvd's integration tests, golden-frame
# capture and benchmarks: the real lmcache 0.5.6 client (vLLM MP adapters) and
# the reference `lmcache server` with its valkey adapter, plus pytest and schemathesis
# (which tests kvd's HTTP API against docs/openapi.json: tests/integration/test_openapi.py).
#
# Usage: scripts/setup-venv.sh [VENV_DIR]        (default: <repo>/.venv)
#
# Profiles (env KVD_VENV_PROFILE, or --full / --minimal as first argument):
#   minimal (default)  lmcache==0.5.6 without the dependencies the CPU client
#                      and the reference server never import (triton, cupy,
#                      cuda-python, cufile-python, nvtx,
#                      nvidia-cusolver/-nvtx/-cccl). ~4.8 GB. Runs the test
#                      suite, tools/capture_golden.py and `lmcache server`.
#   full               plain `pip install lmcache==0.5.6` (what a real vLLM
#                      host has). ~6.2 GB.
# Both add valkey-glide-sync, which lmcache's `valkey` adapter imports but does
# not declare (without it `lmcache server` knows no adapter type 'valkey').
#
# Note on size: PyPI's torch wheel for Linux x86_64 is the CUDA build, and
# `import torch` needs its CUDA libraries (cudnn, cublas, nccl, ...: ~2.8 GB)
# even on a machine without a GPU; with only PyPI reachable there is no
# CPU-only torch, so most of the minimal profile is still those libraries.
#
# Idempotent: a stamp file records the pinned set; when it matches and the
# packages import, nothing is done. Needs python3 (3.11 on Debian 12) with the
# venv module (Debian: python3-venv, see scripts/install-deps.sh) and PyPI.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROFILE="${KVD_VENV_PROFILE:-minimal}"
case "${1:-}" in
  --full) PROFILE=full; shift ;;
  --minimal) PROFILE=minimal; shift ;;
  -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
esac
VENV="${1:-$REPO_ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

LMCACHE_VERSION="0.5.6"
TORCH_VERSION="2.15.0"
# lmcache's valkey adapter (v1/storage_backend/valkey/worker_pool.py) imports
# glide_sync (needs >= 2.3.0 for buffer GET; 2.5+ also takes client_info_tag).
GLIDE_VERSION="2.5.3"

# torch 2.15.0's own requirements, minus triton (only torch.compile needs it),
# cuda-bindings and the CUDA libraries its shared objects do not link
# (cusolver is dlopen'ed lazily for CUDA linalg; nvtx, cccl are headers/tools).
TORCH_RUNTIME=(
  "filelock" "typing-extensions>=4.13.0" "sympy>=1.13.3" "networkx>=2.5.1"
  "jinja2" "fsspec>=0.8.5" "setuptools>=77.0.3,<81.0.0"
  "nvidia-cuda-runtime==13.2.86.*" "nvidia-cublas==13.4.1.3.*"
  "nvidia-cufft==12.2.0.57.*" "nvidia-cufile==1.17.1.22.*"
  "nvidia-cusparse==12.7.10.12.*" "nvidia-nvjitlink==13.5.37"
  "nvidia-cuda-nvrtc==13.2.86.*" "nvidia-cuda-cupti==13.2.86.*"
  "nvidia-cudnn-cu13==9.26.0.51" "nvidia-cusparselt-cu13==0.8.1"
  "nvidia-nccl-cu13==2.30.7" "nvidia-nvshmem-cu13==3.7.2"
)
# What the vLLM MP adapters, the CPU SHM path and the engine-driven path
# import (found by importing them in a bare venv), plus the test tools.
SCHEMATHESIS_VERSION="4.32.5"
CLIENT_DEPS=(
  "numpy==2.2.6" "pyzmq==27.3.0" "msgspec==0.23.0" "blake3==1.0.11"
  "numba==0.68.1" "llvmlite==0.50.0" "prometheus_client==0.24.1"
  "psutil" "py-cpuinfo" "pyyaml" "requests" "cachetools" "aiohttp"
  "sortedcontainers" "pytest==9.2.0" "schemathesis==$SCHEMATHESIS_VERSION"
)
# The rest of lmcache 0.5.6's requirements that `lmcache server` imports
# (HTTP frontend, observability, gRPC transport, L2 adapters). transformers:
# the valkey adapter's import of lmcache.v1.storage_backend reaches the
# cachegen serde, which imports it.
SERVER_DEPS=(
  "valkey-glide-sync==$GLIDE_VERSION" "transformers==5.23.0"
  "aiofile" "aiofiles" "awscrt" "cryptography" "fastapi" "httpx"
  "huggingface_hub>=1.5.0" "opentelemetry-api==1.40.0"
  "opentelemetry-sdk==1.40.0" "opentelemetry-exporter-otlp==1.40.0"
  "opentelemetry-exporter-prometheus==0.61b0"
  "grpcio>=1.78.0" "grpcio-observability==1.78.0" "protobuf>=6.31.1,<7"
  "redis" "safetensors" "setuptools_scm>=8" "uvicorn" "httptools"
  "google-api-core" "google-cloud-bigtable"
)

STAMP="$VENV/.kvd-venv-stamp"
STAMP_TEXT="lmcache==$LMCACHE_VERSION torch==$TORCH_VERSION valkey-glide-sync==$GLIDE_VERSION pytest schemathesis==$SCHEMATHESIS_VERSION profile=$PROFILE"

log() { printf '[setup-venv %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# pip install with a short progress trace (one line per package); fails when pip fails.
pipi() {
  "${PIP[@]}" install "$@" 2>&1 | {
    grep -E '^(Collecting|Successfully installed|ERROR)' \
      | grep -v "dependency resolver does not currently take into account" \
      | sed 's/^/    /' || true
  }
}

check_venv() {
  # Imports the client adapters and the server CLI module; quiet on success.
  LMCACHE_DISABLE_BANNER=1 LMCACHE_TRACK_USAGE=false PYTHONWARNINGS=ignore \
  "$VENV/bin/python" - >/dev/null 2>&1 <<'EOF'
import torch, zmq, msgspec, pytest, schemathesis
assert torch.zeros(2, dtype=torch.bfloat16).sum().item() == 0
from lmcache.integration.vllm.vllm_multi_process_adapter import (
    LMCacheMPSchedulerAdapter, LMCacheMPWorkerAdapter)
from lmcache.v1.platform.devices.cpu.shm import CpuShmTensorWrapper
import lmcache.v1.multiprocess.server  # reference `lmcache server`
import glide_sync, lmcache.v1.distributed.l2_adapters.valkey_l2_adapter  # its valkey tier
EOF
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ] && [ -x "$VENV/bin/python" ]; then
  if check_venv; then
    log "venv at $VENV is up to date ($STAMP_TEXT); nothing to do"
    exit 0
  fi
  log "stamp present but imports fail; reinstalling"
fi

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "setup-venv: $PYTHON not found (Debian: apt-get install python3 python3-venv)" >&2
  exit 1
fi
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "$PYVER" in
  3.10|3.11|3.12|3.13) ;;
  *) echo "setup-venv: python $PYVER unsupported by lmcache $LMCACHE_VERSION wheels (need 3.10-3.13)" >&2; exit 1 ;;
esac

t0=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv at $VENV with $PYTHON ($PYVER)"
  if ! "$PYTHON" -m venv "$VENV"; then
    echo "setup-venv: '$PYTHON -m venv' failed (Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
fi
rm -f "$STAMP"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
export PIP_PROGRESS_BAR=off

log "upgrading pip"
pipi --upgrade pip

if [ "$PROFILE" = full ]; then
  log "profile full: pip install lmcache==$LMCACHE_VERSION (torch + all CUDA wheels, ~6 GB; slow)"
  pipi "lmcache==$LMCACHE_VERSION" "torch==$TORCH_VERSION" "pytest" \
    "valkey-glide-sync==$GLIDE_VERSION" "schemathesis==$SCHEMATHESIS_VERSION"
elif [ "$PROFILE" = minimal ]; then
  log "profile minimal 1/4: lmcache==$LMCACHE_VERSION and torch==$TORCH_VERSION without their dependencies"
  pipi --no-deps "lmcache==$LMCACHE_VERSION" "torch==$TORCH_VERSION"
  log "profile minimal 2/4: torch runtime libraries (${#TORCH_RUNTIME[@]} packages, ~2.8 GB of CUDA libs; slow)"
  pipi --no-deps "${TORCH_RUNTIME[@]}"
  pipi "${TORCH_RUNTIME[@]:0:7}"
  log "profile minimal 3/4: client-side dependencies (${#CLIENT_DEPS[@]} packages)"
  pipi "${CLIENT_DEPS[@]}"
  log "profile minimal 4/4: reference-server dependencies (${#SERVER_DEPS[@]} packages)"
  pipi "${SERVER_DEPS[@]}"
else
  echo "setup-venv: unknown profile '$PROFILE' (minimal or full)" >&2
  exit 1
fi

log "checking imports (torch CPU tensors, lmcache adapters, lmcache server module)"
if ! check_venv; then
  echo "setup-venv: the venv at $VENV does not import; rerun with KVD_VENV_PROFILE=full" >&2
  LMCACHE_DISABLE_BANNER=1 "$VENV/bin/python" -c 'import lmcache.integration.vllm.vllm_multi_process_adapter, lmcache.v1.multiprocess.server, lmcache.v1.distributed.l2_adapters.valkey_l2_adapter' 2>&1 | tail -5 >&2
  exit 1
fi
echo "$STAMP_TEXT" > "$STAMP"
size="$(du -sh "$VENV" 2>/dev/null | cut -f1)"
log "done in $(( $(date +%s) - t0 ))s: $VENV ($size, $STAMP_TEXT)"
