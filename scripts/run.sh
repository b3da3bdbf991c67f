#!/usr/bin/env bash
# Starts kvd with an L1 that fits this machine: a quarter of physical memory, and at
# most 90% of what is free in /dev/shm (where L1 lives), unless KVD_L1_SIZE_GB is set.
# Extra arguments go to `kvd server`.
set -euo pipefail
bin="$1"; shift
if [ -z "${KVD_L1_SIZE_GB:-}" ]; then
  mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
  shm_kb=$(df -k --output=avail /dev/shm | tail -1)
  KVD_L1_SIZE_GB=$(awk -v m="$mem_kb" -v s="$shm_kb" 'BEGIN {
    g = m / 4; if (s * 0.9 < g) g = s * 0.9; g = g / 1048576;
    if (g < 0.25) g = 0.25; printf "%.2f", g }')
fi
echo "kvd: starting with --l1-size-gb $KVD_L1_SIZE_GB (set KVD_L1_SIZE_GB to change)"
exec "$bin" server --l1-size-gb "$KVD_L1_SIZE_GB" --eviction-policy LRU "$@"
