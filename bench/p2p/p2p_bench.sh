#!/usr/bin/env bash
# P2P load throughput against ucx_perftest on the same transport, in one run (docs/benchmarks.md).
# For each transport (UCX_TLS=tcp, and UCX's own choice), with objects of one MiniMax-M3 chunk
# of one TP=8 rank (11,862,016 bytes):
#   kvd-p2p-bench   kvd's reads (ask + rendezvous answer) between two processes, batches of 8
#   ucx_perftest    ucp_get (one-sided RMA) and ucp_am_bw (active messages) of the same size
# and prints a markdown table with kvd's GB/s as a ratio of each; then kvd's Redis tier
# (kvd-tier-bench: resp tier loads of objects of about the same size from the same local
# redis-server, 8 workers) beside the P2P read over TCP; then the latency a fleet directory
# lookup (one Lua script against a local redis-server) adds to a LOOKUP that misses.
#
#   bench/p2p/p2p_bench.sh [BUILD_DIR] [SECONDS]
set -euo pipefail
build=${1:-build}
seconds=${2:-5}
size=11862016
command -v ucx_perftest >/dev/null || { echo "p2p_bench: ucx_perftest not found (Debian ucx-utils)" >&2; exit 1; }
[ -x "$build/kvd-p2p-bench" ] || { echo "p2p_bench: $build/kvd-p2p-bench not built" >&2; exit 1; }
[ -x "$build/kvd-tier-bench" ] || { echo "p2p_bench: $build/kvd-tier-bench not built" >&2; exit 1; }

# ucx_perftest's bandwidth (MB/s, 10^6 bytes) for test $1 with UCX_TLS=$2 ("" for UCX's choice).
perftest() {
  local test=$1 tls=$2 port log
  port=$(free_port)
  log=$(mktemp)
  local iters=$((seconds * 200))
  if [ -n "$tls" ]; then export UCX_TLS=$tls; else unset UCX_TLS; fi
  ucx_perftest -t "$test" -s "$size" -n "$iters" -p "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 1
  timeout 300 ucx_perftest 127.0.0.1 -t "$test" -s "$size" -n "$iters" -p "$port" >"$log" 2>&1 || true
  wait "$server" 2>/dev/null || true
  unset UCX_TLS
  # The "Final:" row: iterations, latency 50%, avg, overall, bandwidth avg, overall, ...
  awk '/Final:/ {print $7}' "$log"
  rm -f "$log"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
  --logfile /dev/null --dir "$(mktemp -d)"
trap 'redis-cli -p "$redis_port" shutdown nosave >/dev/null 2>&1 || true' EXIT
for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done

echo "| transport | kvd-p2p-bench GB/s | ucp_get GB/s | ucp_am_bw GB/s | kvd / ucp_get | kvd / ucp_am_bw | kvd 4 KiB read µs |"
echo "|---|---|---|---|---|---|---|"
tcp_gbs=""
for tls in tcp ""; do
  json=$("$build/kvd-p2p-bench" --tls "$tls" --object-bytes "$size" --seconds "$seconds")
  kvd=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["gb_per_s"])' "$json")
  if [ -n "$tls" ]; then tcp_gbs=$kvd; fi
  small=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["small_read_us"])' "$json")
  get=$(perftest ucp_get "$tls")
  am=$(perftest ucp_am_bw "$tls")
  python3 - "$tls" "$kvd" "$get" "$am" "$small" <<'EOF'
import sys
tls, kvd, get, am, small = sys.argv[1] or "UCX's choice", float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def gbs(mbs):
    return float(mbs) / 1000 if mbs else float("nan")
g, a = gbs(get), gbs(am)
print(f"| {tls} | {kvd:.2f} | {g:.2f} | {a:.2f} | {kvd / g:.2f} | {kvd / a:.2f} | {float(small):.0f} |")
EOF
done
echo
# kvd's Redis tier on the same redis-server: 24 objects of one M3 rank's chunk (rounded down
# to 4 KiB), stored then loaded by 8 workers.
tier_dir=$(mktemp -d)
tier_json=$("$build/kvd-tier-bench" --dir "$tier_dir" --redis "127.0.0.1:$redis_port" --objects 24 --workers 8)
rm -rf "$tier_dir"
python3 - "$tcp_gbs" "$tier_json" <<'EOF'
import json, sys
p2p = float(sys.argv[1])
rows = {j["what"]: j for j in map(json.loads, (l for l in sys.argv[2].splitlines() if l.startswith("{")))}
resp = rows["kvd_resp_load"]["gb_per_s"]
print("| load path (loopback, one M3 TP=8 rank's chunk per object) | GB/s | P2P / it |")
print("|---|---|---|")
print(f"| P2P read, UCX over TCP (kvd-p2p-bench) | {p2p:.2f} | 1.00 |")
print(f"| Redis tier load, 8 workers (kvd-tier-bench, kvd_resp_load) | {resp:.2f} | {p2p / resp:.2f} |")
EOF
echo
json=$("$build/kvd-p2p-bench" --tls tcp --seconds 1 --redis-port "$redis_port")
python3 - "$json" <<'EOF'
import json, sys
j = json.loads(sys.argv[1])
print("| directory lookup (redis-server, loopback) | 1 key | 128 keys (a 32K-token prompt) |")
print("|---|---|---|")
print(f"| p50 of 500 | {j['directory_lookup_1_us']:.0f} µs | {j['directory_lookup_128_us']:.0f} µs |")
EOF
