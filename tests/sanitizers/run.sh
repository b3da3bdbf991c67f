#!/usr/bin/env bash
# Runs kvd's tests against a sanitizer build: tests/sanitizers/run.sh asan|tsan BUILD_DIR VENV
#
#   asan  every unit test (ctest) and the interop suite (tests/integration, real lmcache
#         client) against BUILD_DIR/kvd built with ASan + UBSan + LSan (`make test-asan`:
#         -DKVD_FUZZ=ON, which implies them; -DKVD_SANITIZE=ON works too).
#   tsan  the unit tests of the concurrent modules (l1: cache, concurrency; l2: tiers, TierSet
#         store-behind/prefetch/eviction, Redis and Redis Cluster against a real
#         redis-server; server: KvService, sessions, lookups with tiers, liveness, device path,
#         metrics, TaskPool, ZMQ server) and the fuzz
#         replays, and a short TP=8 soak against BUILD_DIR/kvd built with -DKVD_TSAN=ON.
#
# Sanitizer reports of every instrumented process (test binaries and kvd servers the Python
# tests start) go to BUILD_DIR/sanitizer-logs/; any report fails the run and is printed.
# Suppressions (each entry explained) are next to this script.
set -uo pipefail
mode="${1:?usage: run.sh asan|tsan BUILD_DIR VENV}"
dir="$(cd "${2:?build dir}" && pwd)"
venv="${3:?venv}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
logs="$dir/sanitizer-logs"
rm -rf "$logs"
mkdir -p "$logs"
status=0
t0=$(date +%s)

case "$mode" in
  asan)
    export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1"
    export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1"
    export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
    echo "asan: unit tests ($dir)"
    ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" --timeout 600 || status=1
    echo "asan: interop tests against $dir/kvd"
    KVD_TEST_KVD_BIN="$dir/kvd" KVD_BIN="$dir/kvd" KVD_TEST_SANITIZER=asan \
      "$venv/bin/python" -m pytest "$root/tests/integration" -q -p no:cacheprovider || status=1
    ;;
  tsan)
    export TSAN_OPTIONS="log_path=$logs/tsan:halt_on_error=0:second_deadlock_stack=1:suppressions=$here/tsan.supp"
    echo "tsan: l1, l2, server, http, p2p and fuzz-replay unit tests ($dir)"
    # `make test-tsan` builds only l1_tests, l2_tests, server_tests, http_tests, codec_tests,
    # p2p_tests and fuzz_replay_*; ctest lists the other test binaries as *_NOT_BUILT.
    # UCX's memory hooks (libucm: mmap/madvise interposition, installed when libucm loads)
    # crash under ThreadSanitizer when a thread exits; kvd's P2P reads and answers only use
    # memory it registered, so it needs none of the memory events they report.
    export UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none
    ctest --test-dir "$dir" --output-on-failure -j"$(nproc)" --timeout 900 -E '_NOT_BUILT' \
      || status=1
    echo "tsan: short TP=8 soak against $dir/kvd"
    "$venv/bin/python" "$root/tests/soak/soak.py" --kvd "$dir/kvd" --seconds 30 --tsan || status=1
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac

reports=$(find "$logs" -type f -size +0 | sort)
if [ -n "$reports" ]; then
  status=1
  echo "$mode: sanitizer reports:"
  for r in $reports; do echo "---- $r"; head -60 "$r"; done
fi
echo "$mode: $( [ $status -eq 0 ] && echo passed || echo FAILED ) in $(( $(date +%s) - t0 )) s"
exit $status
