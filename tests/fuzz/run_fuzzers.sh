#!/usr/bin/env bash
# Runs every kvd libFuzzer target for a fixed time: tests/fuzz/run_fuzzers.sh FUZZ_DIR SECONDS
#
# Each target starts from FUZZ_DIR/seeds/<target> (tests/fuzz/make_seeds.py), the saved
# regressions in tests/fuzz/regressions/<target> and the corpus it grew on earlier runs
# (FUZZ_DIR/corpus/<target>, kept between runs). Limits: 2 GiB RSS, 256 MiB per malloc,
# 64 KiB inputs, 10 s per input. A crash, leak, sanitizer report, timeout or broken invariant
# stops the run with its input in FUZZ_DIR/artifacts/ and a non-zero exit; keep the input in
# tests/fuzz/regressions/<target>/ once fixed (replayed by the fuzz_replay_<target> unit test).
# Targets run side by side, FUZZ_JOBS at a time (default: the number of cores), each for the
# full SECONDS; results print in target order. Leaves nothing in /dev/shm (only the request
# target maps segments, under its own names).
set -uo pipefail
dir="${1:?usage: run_fuzzers.sh FUZZ_DIR SECONDS}"
secs="${2:?usage: run_fuzzers.sh FUZZ_DIR SECONDS}"
jobs="${FUZZ_JOBS:-$(nproc)}"
src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
targets=(request payload descriptor stream cachegen zmtp http_json)
mkdir -p "$dir/artifacts"
trap 'rm -f /dev/shm/kvd_fuzz_kv_*' EXIT
for t in "${targets[@]}"; do
  [ -x "$dir/kvd_fuzz_$t" ] || { echo "fuzz: $dir/kvd_fuzz_$t missing (make fuzz-build)"; exit 1; }
done

# One target: its libFuzzer log in FUZZ_DIR/fuzz_<t>.log, its summary line in .result and
# its exit code in .rc.
run_one() {
  local t="$1" log="$dir/fuzz_$1.log" start rc runs cov corpus
  mkdir -p "$dir/corpus/$t"
  start=$(date +%s)
  "$dir/kvd_fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=256 \
    -max_len=65536 -print_final_stats=1 -artifact_prefix="$dir/artifacts/$t-" \
    "$dir/corpus/$t" "$dir/seeds/$t" "$src/regressions/$t" >"$log" 2>&1
  rc=$?
  runs=$(grep -m1 '^stat::number_of_executed_units' "$log" | awk '{print $2}')
  cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -o 'cov: [0-9]*' | awk '{print $2}')
  corpus=$(find "$dir/corpus/$t" -type f | wc -l)
  if [ $rc -eq 0 ]; then
    printf 'fuzz %-10s ok    %4ss  %9s execs  cov %-6s corpus %s\n' "$t" "$(( $(date +%s) - start ))" \
      "${runs:-?}" "${cov:-?}" "$corpus" >"$dir/fuzz_$t.result"
  else
    { printf 'fuzz %-10s FAIL  (exit %s) — see %s\n' "$t" "$rc" "$log"
      grep -E 'ERROR:|SUMMARY:|invariant violated|Test unit written' "$log" | head -8 | sed 's/^/    /'
    } >"$dir/fuzz_$t.result"
  fi
  echo "$rc" >"$dir/fuzz_$t.rc"
}

for t in "${targets[@]}"; do
  rm -f "$dir/fuzz_$t.result" "$dir/fuzz_$t.rc"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  run_one "$t" &
done
wait

status=0
for t in "${targets[@]}"; do
  cat "$dir/fuzz_$t.result" 2>/dev/null || echo "fuzz $t: no result"
  [ "$(cat "$dir/fuzz_$t.rc" 2>/dev/null)" = 0 ] || status=1
done
exit $status
