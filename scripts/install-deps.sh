#!/usr/bin/env bash
# Installs the Debian packages kvd needs to build and test, and only those that are missing.
# Safe to run repeatedly; does nothing when everything is present.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev
  b3sum python3-venv
  clang libclang-rt-14-dev
  libcpp-httplib-dev nlohmann-json3-dev
  libhiredis-dev redis-server redis-tools
  libucx-dev ucx-utils
  chromium
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "kvd: installing missing Debian packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
