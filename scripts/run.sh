#!/usr/bin/env bash
# Starts kvd with an L1 that fits this machine: a quarter of physical memory (at least
# 1 GiB), unless KVD_L1_SIZE_GB says otherwise. Extra arguments go to `kvd server`.
set -euo pipefail
bin="$1"; shift
if [ -z "${KVD_L1_SIZE_GB:-}" ]; then
  mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
  KVD_L1_SIZE_GB=$(( mem_kb / 1024 / 1024 / 4 ))
  [ "$KVD_L1_SIZE_GB" -ge 1 ] || KVD_L1_SIZE_GB=1
fi
echo "kvd: starting with --l1-size-gb $KVD_L1_SIZE_GB (set KVD_L1_SIZE_GB to change)"
exec "$bin" server --l1-size-gb "$KVD_L1_SIZE_GB" --eviction-policy LRU "$@"
